"""Client-level differential privacy: clipping, and the privacy budget of Gaussian noise.

DP-FedAvg (McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private
Recurrent Language Models", ICLR 2018): each sampled client's update is scaled
to L2 norm at most ``C``, the server adds ``N(0, (sigma C)^2)`` to every
coordinate of their *sum* and divides by the expected number of clients. One
round is then the sampled Gaussian mechanism with sampling rate ``q`` and noise
multiplier ``sigma``; its Renyi-DP (Mironov, Talwar and Zhang, "Renyi
Differential Privacy of the Sampled Gaussian Mechanism", 2019, Sec. 3.3) adds up
over rounds, and converts to ``(epsilon, delta)``-DP with Mironov's
"Renyi Differential Privacy" (CSF 2017), Proposition 3:
``epsilon = min over orders a of  RDP(a) + log(1/delta) / (a - 1)``.

Orders here are integers, where the RDP of the sampled Gaussian has an exact
finite form; restricting the minimum to them can only overstate epsilon
slightly, never understate it. The analysis assumes each client is sampled
independently with probability ``q`` (Poisson sampling); fedsketch samples a
fixed ``m`` of ``N`` clients without replacement and reports ``q = m / N``, the
approximation used by most federated DP reports (TensorFlow Federated,
Opacus's federated examples).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

ORDERS: tuple[int, ...] = (*range(2, 65), 80, 96, 128, 160, 192, 256, 384, 512)


def clip_factor(norm: float, bound: float) -> float:
    """The factor that scales a vector of L2 norm ``norm`` to at most ``bound`` (1.0 if it already is)."""
    if not norm > bound:  # also for norm == 0 and NaN-free inputs below the bound
        return 1.0
    return bound / norm


def rdp_sampled_gaussian(q: float, noise_multiplier: float, order: int) -> float:
    """Renyi-DP at integer ``order >= 2`` of one round of the sampled Gaussian mechanism.

    With ``A = sum_k binom(a, k) (1 - q)^(a - k) q^k exp((k^2 - k) / (2 sigma^2))``
    (Mironov, Talwar and Zhang 2019, Eq. (4) for integer orders), the RDP is
    ``log(A) / (a - 1)``; with ``q = 1`` it is the Gaussian mechanism's
    ``a / (2 sigma^2)``. Computed in log space (no overflow for large orders).
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"sampling rate must be in [0, 1]; got {q}")
    if not noise_multiplier > 0:
        raise ValueError(f"noise multiplier must be > 0; got {noise_multiplier}")
    if isinstance(order, bool) or not isinstance(order, int) or order < 2:
        raise ValueError(f"order must be an int >= 2; got {order!r}")
    if q == 0.0:
        return 0.0
    if q == 1.0:
        return order / (2 * noise_multiplier**2)
    terms = [
        _log_binom(order, k) + (order - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * noise_multiplier**2)
        for k in range(order + 1)
    ]
    return _logsumexp(terms) / (order - 1)


def epsilon(
    q: float, noise_multiplier: float, rounds: int, delta: float, orders: Sequence[int] = ORDERS
) -> tuple[float, int]:
    """``(epsilon, best order)`` after ``rounds`` rounds, at ``delta``.

    Returns ``(0.0, orders[0])`` for zero rounds and ``(inf, ...)`` when the
    noise is too small for any order to give a finite bound.
    """
    if rounds < 0 or not 0.0 < delta < 1.0:
        raise ValueError(f"need rounds >= 0 and delta in (0, 1); got {rounds}, {delta}")
    if rounds == 0:
        return 0.0, orders[0]
    best = (math.inf, orders[0])
    for order in orders:
        eps = rounds * rdp_sampled_gaussian(q, noise_multiplier, order) + math.log(1 / delta) / (order - 1)
        best = min(best, (eps, order))
    return best


def _log_binom(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def privacy_metrics(cfg: RunConfig, rounds: int) -> dict[str, float]:
    """The privacy budget spent after ``rounds`` noisy rounds, for a metrics row; empty when DP is off."""
    if cfg.dp_noise_multiplier <= 0:
        return {}
    q = cfg.clients_per_round / cfg.num_clients
    eps, order = epsilon(q, cfg.dp_noise_multiplier, rounds, cfg.dp_delta)
    return {
        "dp_epsilon": eps,
        "dp_delta": cfg.dp_delta,
        "dp_noise_multiplier": cfg.dp_noise_multiplier,
        "dp_sampling_rate": q,
        "dp_rounds": rounds,
        "dp_order": order,
    }
