"""Real data: the published MNIST test split, read where it lies (never copied into the project).

8,000 images go to 100 clients of 2 classes each (pathological), 2,000 are held
out. FetchSGD reaching 90% on them, and centralized and FedAvg training
learning, prove that the IDX reader, the normalization, the partition, the
client update and the server's sketch step fit together on real images.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from fedsketch.algorithms import fetchsgd
from fedsketch.data import (
    DataSpec,
    FederatedData,
    from_idx_files,
    load_federated,
    load_idx_images,
    load_idx_labels,
)
from fedsketch.model.flat import get_flat, set_flat
from fedsketch.model.models import build_model
from fedsketch.sketch.count_sketch import CountSketch
from fedsketch.training.local import LocalSpec, client_generator, local_update


def _mnist_dir() -> Path:
    """``$FEDSKETCH_MNIST_DIR``, else ``../shared/data/mnist`` beside the checkout, else /work's."""
    candidates = [Path(p) for p in [os.environ.get("FEDSKETCH_MNIST_DIR", "")] if p]
    candidates += [
        Path(__file__).resolve().parents[4] / "shared" / "data" / "mnist",
        Path("/work/shared/data/mnist"),
    ]
    return next(
        (c for c in candidates if (c / "t10k-labels-idx1-ubyte.gz").exists()),
        candidates[0],
    )


MNIST_DIR = _mnist_dir()
IMAGES = MNIST_DIR / "t10k-images-idx3-ubyte.gz"
LABELS = MNIST_DIR / "t10k-labels-idx1-ubyte.gz"

pytestmark = pytest.mark.skipif(
    not (IMAGES.is_file() and LABELS.is_file()),
    reason=f"the MNIST test split is not at {MNIST_DIR} (t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz)",
)


@pytest.fixture(scope="module")
def mnist() -> FederatedData:
    spec = DataSpec(dataset="mnist", partition="pathological", classes_per_client=2, num_clients=100)
    return from_idx_files(str(IMAGES), str(LABELS), spec, holdout=2000)


def test_the_mnist_t10k_dataset_is_this_split(mnist: FederatedData) -> None:
    """``dataset = "mnist_t10k"`` (what run configs name) holds out the same 2,000 images as the fixture."""
    spec = DataSpec(
        dataset="mnist_t10k", root=str(MNIST_DIR), partition="pathological", classes_per_client=2, num_clients=100
    )
    data = load_federated(spec)
    assert torch.equal(data.test_x, mnist.test_x) and torch.equal(data.train_y, mnist.train_y)


def _accuracy(model: nn.Module, data: FederatedData) -> float:
    model.eval()
    with torch.no_grad():
        return float((model(data.test_x).argmax(1) == data.test_y).float().mean())


def test_reads_the_published_files(mnist: FederatedData) -> None:
    images, labels = load_idx_images(IMAGES), load_idx_labels(LABELS)
    assert images.shape == (10_000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [
        980,
        1135,
        1032,
        1010,
        982,
        892,
        958,
        1028,
        974,
        1009,
    ]
    assert mnist.train_x.shape == (8000, 1, 28, 28) and mnist.test_x.shape == (
        2000,
        1,
        28,
        28,
    )
    assert abs(float(mnist.train_x.mean())) < 0.05 and abs(float(mnist.train_x.std()) - 1) < 0.05
    assert max(len(np.unique(mnist.train_y.numpy()[p])) for p in mnist.client_indices) == 2


def test_centralized_mlp_learns(mnist: FederatedData) -> None:
    """One epoch of SGD over every client's data: the loader and normalization are right."""
    x = torch.cat([mnist.client_data(c)[0] for c in range(mnist.num_clients)])
    y = torch.cat([mnist.client_data(c)[1] for c in range(mnist.num_clients)])
    model = build_model("mlp", mnist.input_shape, mnist.num_classes, hidden=200)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    order = torch.randperm(y.shape[0], generator=torch.Generator().manual_seed(0))
    model.train()
    for batch in order.split(64):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        opt.step()
    assert _accuracy(model, mnist) >= 0.9


@pytest.mark.slow  # trains on real images for tens of seconds
def test_fedavg_on_two_class_clients_learns(mnist: FederatedData) -> None:
    """FedAvg (McMahan et al. 2017): 20 of 100 two-class clients a round, 2 local epochs."""
    model = build_model("mlp", mnist.input_shape, mnist.num_classes, hidden=200)
    weights = parameters_to_vector(model.parameters()).detach()
    rng, gen = np.random.default_rng(0), torch.Generator().manual_seed(0)
    for _ in range(40):
        total, count = torch.zeros_like(weights), 0
        for cid in rng.choice(mnist.num_clients, size=20, replace=False):
            x, y = mnist.client_data(int(cid))
            vector_to_parameters(weights, model.parameters())
            opt = torch.optim.SGD(model.parameters(), lr=0.05)
            model.train()
            for _ in range(2):
                for batch in torch.randperm(y.shape[0], generator=gen).split(10):
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
                    opt.step()
            total += y.shape[0] * parameters_to_vector(model.parameters()).detach()
            count += y.shape[0]
        weights = total / count
    vector_to_parameters(weights, model.parameters())
    assert _accuracy(model, mnist) >= 0.85


@pytest.mark.slow  # trains on real images for tens of seconds
def test_fetchsgd_on_two_class_clients_reaches_90_percent(mnist: FederatedData) -> None:
    """FetchSGD (Rothchild et al. 2020): 10 of 100 two-class clients a round each upload the 3 x 10,000
    sketch of one gradient (6.6x smaller than the 199,210-parameter MLP); 200 rounds, server momentum
    0.9, zero-buckets error feedback, k = 1,000, linearly decaying lr. Measured: 0.941."""
    model = build_model("mlp", mnist.input_shape, mnist.num_classes, hidden=200)
    w = get_flat(model)
    params = fetchsgd.FetchSGDParams(
        d=w.numel(), rows=3, cols=10_000, seed=0, k=1_000, momentum=0.9, error_feedback="zero-buckets"
    )
    state = fetchsgd.init(params)
    local = LocalSpec(mode="gradient", batch_size=32)
    rounds = 200
    for rnd in range(1, rounds + 1):
        merged, total = CountSketch(params.d, params.rows, params.cols, seed=params.seed), 0
        for cid in np.random.default_rng([0, rnd]).choice(mnist.num_clients, size=10, replace=False):
            x, y = mnist.client_data(int(cid))
            result = local_update(model, w, x, y, local, client_generator(0, rnd, int(cid)))
            sketch = CountSketch(params.d, params.rows, params.cols, seed=params.seed)  # what a client uploads
            sketch.accumulate(result.update)
            merged += sketch * result.num_examples
            total += result.num_examples
        state, update = fetchsgd.step(state, merged.table / total, params, 0.3 * (1 - (rnd - 1) / rounds))
        w = w - update.dense(params.d)
    set_flat(model, w)
    assert _accuracy(model, mnist) >= 0.9
