"""FedProx's Synthetic(alpha, beta): shape, determinism, the natural partition, heterogeneity."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedsketch.data import DataSpec, generate_synthetic, load_federated
from fedsketch.data.synthetic import MAX_SAMPLES, MIN_SAMPLES, client_sizes


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


def test_client_sizes_follow_fedprox_lognormal_law_capped() -> None:
    """floor(LogNormal(4, 2)) + 50, at most 2,000: the 16th, 50th and 84th percentiles above 50 are e^2, e^4, e^6."""
    sizes = client_sizes(40_000, np.random.default_rng(3))
    assert sizes.dtype == np.int64 and sizes.min() >= MIN_SAMPLES and sizes.max() == MAX_SAMPLES
    uncapped = np.percentile(sizes - MIN_SAMPLES, [16, 50, 84])
    np.testing.assert_allclose(uncapped, np.exp([2.0, 4.0, 6.0]), rtol=0.08)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 0.5, 0.5, 0), "num_clients must be >= 1; got 0"),
        ((3, -1.0, 0.5, 0), "alpha and beta are standard deviations and must be >= 0; got -1.0, 0.5"),
        ((3, 0.5, -0.1, 0), "alpha and beta are standard deviations and must be >= 0; got 0.5, -0.1"),
        ((3, float("nan"), 0.5, 0), "alpha and beta are standard deviations and must be >= 0; got nan, 0.5"),
        ((3, 0.5, 0.5, -2), "seed must be >= 0; got -2"),
    ],
)
def test_impossible_generator_arguments_are_refused_naming_them(args: tuple, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        generate_synthetic(*args)
    assert str(refused.value) == message


def test_a_client_is_asked_for_by_its_int_id_in_range() -> None:
    data = load_federated(DataSpec(num_clients=5))
    for cid in (0, np.int64(4)):
        x, y = data.client_data(cid)  # type: ignore[arg-type]
        assert torch.equal(y, data.train_y[torch.from_numpy(data.client_indices[int(cid)])]) and len(x) == len(y)
    for cid, kind in ((True, "bool"), (1.0, "float"), ("2", "str")):
        with pytest.raises(TypeError, match=f"^client id must be an int; got {kind}$"):
            data.client_data(cid)  # type: ignore[arg-type]
    for cid in (-1, 5):
        with pytest.raises(
            ValueError, match=rf"^client id {cid} out of range: synthetic\(0.5,0.5\) has 5 clients \(0..4\)$"
        ):
            data.client_data(cid)


def _fedprox_law(num_clients: int, alpha: float, beta: float, seed: int) -> tuple[np.ndarray, ...]:
    """Synthetic(alpha, beta) by the module's law, one client and one sample at a time, from the same stream."""
    rng = np.random.default_rng([seed, 0x5D47])
    sizes = np.minimum(np.floor(rng.lognormal(4.0, 2.0, size=num_clients)).astype(np.int64) + 50, 2000)
    u = rng.normal(0.0, alpha, size=num_clients)  # u_k ~ N(0, alpha^2)
    big_b = rng.normal(0.0, beta, size=num_clients)  # B_k ~ N(0, beta^2)
    v = np.stack([rng.normal(big_b[k], 1.0, size=60) for k in range(num_clients)]).astype(np.float32)  # N(B_k, 1)
    w = np.stack([rng.normal(u[k], 1.0, size=(60, 10)) for k in range(num_clients)])  # W_k ~ N(u_k, 1)
    b = np.stack([rng.normal(u[k], 1.0, size=10) for k in range(num_clients)])  # b_k ~ N(u_k, 1)
    sd = np.array([j**-0.6 for j in range(1, 61)], dtype=np.float32)  # Sigma_jj = j^-1.2
    xs, ys, test = [], [], []
    for k in range(num_clients):
        xk = v[k] + rng.standard_normal((sizes[k], 60), dtype=np.float32) * sd  # x ~ N(v_k, Sigma)
        xs.append(xk)
        ys.append(np.array([np.argmax(np.einsum("f,fc->c", x, w[k]) + b[k]) for x in xk]))
        test.append(np.arange(sizes[k]) >= sizes[k] - int(0.2 * sizes[k]))  # the last 20% held out
    x, y, held = np.concatenate(xs), np.concatenate(ys), np.concatenate(test)
    client = np.repeat(np.arange(num_clients), sizes)
    train = x[~held].astype(np.float64)
    mean, std = train.mean(axis=0), train.std(axis=0)
    x = ((x - mean.astype(np.float32)) / std.astype(np.float32)).astype(np.float32)
    return x[~held], y[~held], client[~held], x[held], y[held]


@pytest.mark.parametrize(
    ("num_clients", "alpha", "beta", "seed"), [(7, 0.5, 0.5, 0), (5, 1.0, 2.0, 3), (4, 0.0, 0.0, 9)]
)
def test_the_generator_draws_fedprox_law(num_clients: int, alpha: float, beta: float, seed: int) -> None:
    got = generate_synthetic(num_clients, alpha, beta, seed)
    want = _fedprox_law(num_clients, alpha, beta, seed)
    for name, mine, law in zip(
        ("x_train", "y_train", "client_train", "x_test", "y_test"), dataclasses.astuple(got), want, strict=True
    ):
        assert mine.dtype == (np.float32 if name.startswith("x") else np.int64), name
        np.testing.assert_array_equal(mine, law, err_msg=name)  # to the last bit
