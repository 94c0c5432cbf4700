"""FedProx's Synthetic(alpha, beta): shape, determinism, the natural partition, heterogeneity."""

from __future__ import annotations

import numpy as np
import torch

from fedsketch.data import DataSpec, generate_synthetic, load_federated


def _mean_label_entropy(labels: np.ndarray, parts: tuple[np.ndarray, ...] | list[np.ndarray]) -> float:
    entropies = []
    for part in parts:
        p = np.bincount(labels[part], minlength=10) / part.size
        entropies.append(-(p[p > 0] * np.log(p[p > 0])).sum())
    return float(np.mean(entropies))


def test_default_shapes_and_sizes() -> None:
    data = load_federated(DataSpec())
    assert data.name == "synthetic(0.5,0.5)" and data.num_clients == 100
    assert data.input_shape == (60,) and data.num_classes == 10
    assert data.train_x.dtype == torch.float32 and data.train_y.dtype == torch.int64
    n_train, n_test = data.train_x.shape[0], data.test_x.shape[0]
    assert 15_000 <= n_train <= 60_000
    assert abs(n_test / (n_train + n_test) - 0.2) < 0.01  # LEAF-style held-out 20% of each client
    assert min(part.size for part in data.client_indices) >= 40  # at least 50 samples, 80% train
    # Standardized with the training statistics.
    assert torch.allclose(data.train_x.mean(0), torch.zeros(60), atol=1e-4)
    assert torch.allclose(data.train_x.std(0), torch.ones(60), atol=1e-3)


def test_deterministic_in_the_seed() -> None:
    a, b, c = (generate_synthetic(30, 1.0, 1.0, seed) for seed in (7, 7, 8))
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    assert a.x_train.shape != c.x_train.shape or not np.array_equal(a.x_train, c.x_train)


def test_natural_partition_is_the_generating_client() -> None:
    s = generate_synthetic(20, 0.5, 0.5, 0)
    data = load_federated(DataSpec(num_clients=20))
    for cid, part in enumerate(data.client_indices):
        assert np.all(s.client_train[part] == cid)
    assert sorted(np.concatenate(data.client_indices).tolist()) == list(range(data.train_x.shape[0]))


def test_clients_are_more_label_skewed_than_iid() -> None:
    natural = load_federated(DataSpec(synthetic_alpha=1.0, synthetic_beta=1.0))
    iid = load_federated(DataSpec(synthetic_alpha=1.0, synthetic_beta=1.0, partition="iid"))
    assert torch.equal(natural.train_x, iid.train_x)  # other partitions re-split the same pooled samples
    y = natural.train_y.numpy()
    assert _mean_label_entropy(y, natural.client_indices) < _mean_label_entropy(y, iid.client_indices) - 0.3


def test_a_classifier_can_fit_the_pooled_data() -> None:
    """A sanity check of the labels: softmax regression per client is the generating model."""
    data = load_federated(DataSpec(num_clients=10, synthetic_alpha=0.0, synthetic_beta=0.0))
    gen = torch.Generator().manual_seed(0)
    w = (0.01 * torch.randn(60, 10, generator=gen)).requires_grad_()
    b = torch.zeros(10, requires_grad=True)
    opt = torch.optim.LBFGS([w, b], max_iter=100)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(data.train_x @ w + b, data.train_y)
        loss.backward()
        return loss

    opt.step(closure)
    accuracy = ((data.test_x @ w + b).argmax(1) == data.test_y).float().mean()
    assert accuracy > 0.7
