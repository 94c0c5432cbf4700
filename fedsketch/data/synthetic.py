"""FedProx's Synthetic(alpha, beta): heterogeneous clients generated from a seed.

Li et al., "Federated Optimization in Heterogeneous Networks" (MLSys 2020),
Sec. 5.1, following its reference generator (``generate_niid.py``, which LEAF's
``synthetic`` set follows). Client ``k`` has its own softmax-regression model
and feature distribution: ``u_k ~ N(0, alpha^2)``, ``W_k ~ N(u_k, 1)`` (60 x 10),
``b_k ~ N(u_k, 1)``, ``B_k ~ N(0, beta^2)``, ``v_k ~ N(B_k, 1)``,
``x ~ N(v_k, Sigma)`` with ``Sigma_jj = j^-1.2``, ``y = argmax(W_k^T x + b_k)``;
``alpha`` and ``beta`` are standard deviations, as in the reference code.
Samples per client: ``floor(LogNormal(4, 2)) + 50``, capped at 2,000; 20% of
each client's samples are held out for the test set (LEAF style), and features
are standardized with the training set's statistics. Sizes and reasons:
docs/data.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NUM_FEATURES = 60
NUM_CLASSES = 10
TEST_FRACTION = 0.2
MIN_SAMPLES = 50
MAX_SAMPLES = 2000
_STREAM = 0x5D47  # keeps the generator's random stream apart from the partition's


@dataclass(frozen=True)
class SyntheticSplit:
    """Generated samples: standardized float32 features, int64 labels and the generating client."""

    x_train: np.ndarray
    y_train: np.ndarray
    client_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


def client_sizes(num_clients: int, rng: np.random.Generator) -> np.ndarray:
    """Samples per client: ``min(floor(LogNormal(4, 2)) + 50, 2000)`` (FedProx's law, capped)."""
    sizes = rng.lognormal(4.0, 2.0, size=num_clients).astype(np.int64) + MIN_SAMPLES
    return np.minimum(sizes, MAX_SAMPLES)


def generate_synthetic(num_clients: int, alpha: float, beta: float, seed: int) -> SyntheticSplit:
    """Generate Synthetic(alpha, beta) for ``num_clients`` clients, deterministically in ``seed``.

    Raises
    ------
    ValueError
        If ``num_clients < 1``, ``alpha`` or ``beta`` is negative, or ``seed`` is negative.
    """
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1; got {num_clients}")
    if not (alpha >= 0 and beta >= 0):
        raise ValueError(f"alpha and beta are standard deviations and must be >= 0; got {alpha}, {beta}")
    if seed < 0:
        raise ValueError(f"seed must be >= 0; got {seed}")
    rng = np.random.default_rng([seed, _STREAM])
    sizes = client_sizes(num_clients, rng)
    u = rng.normal(0.0, alpha, size=num_clients)
    big_b = rng.normal(0.0, beta, size=num_clients)
    v = rng.normal(big_b[:, None], 1.0, size=(num_clients, NUM_FEATURES)).astype(np.float32)
    w = rng.normal(u[:, None, None], 1.0, size=(num_clients, NUM_FEATURES, NUM_CLASSES))
    b = rng.normal(u[:, None], 1.0, size=(num_clients, NUM_CLASSES))
    scale = (np.arange(1, NUM_FEATURES + 1, dtype=np.float64) ** -0.6).astype(np.float32)  # sqrt(Sigma_jj)
    client = np.repeat(np.arange(num_clients, dtype=np.int64), sizes)
    x = np.empty((client.shape[0], NUM_FEATURES), dtype=np.float32)
    y = np.empty(client.shape[0], dtype=np.int64)
    test = np.zeros(client.shape[0], dtype=bool)
    moments = np.zeros((2, NUM_FEATURES))  # training sum and sum of squares, in float64
    start = 0
    for k, m in enumerate(sizes):  # one client at a time keeps temporaries small
        xk = v[k] + rng.standard_normal((m, NUM_FEATURES), dtype=np.float32) * scale
        # einsum, not ``@``: a BLAS call per client is pathologically slow when the
        # BLAS thread pool competes with other processes (Ray workers) for two cores.
        y[start : start + m] = np.argmax(np.einsum("mf,fc->mc", xk, w[k]) + b[k], axis=1)
        x[start : start + m] = xk
        # A client's samples are i.i.d., so its last 20% are a random held-out part.
        n_train = m - int(TEST_FRACTION * m)
        test[start + n_train : start + m] = True
        kept = xk[:n_train].astype(np.float64)
        moments += (kept.sum(axis=0), (kept**2).sum(axis=0))
        start += m
    n_train_total = client.shape[0] - int(test.sum())
    mean = moments[0] / n_train_total
    std = np.sqrt(np.maximum(moments[1] / n_train_total - mean**2, 0.0))
    x -= mean.astype(np.float32)
    x /= np.where(std > 0, std, 1.0).astype(np.float32)
    return SyntheticSplit(x[~test], y[~test], client[~test], x[test], y[test])
