"""FetchSGD's server step, as an explicit state transition.

Rothchild et al., "FetchSGD: Communication-Efficient Federated Learning with
Sketching", ICML 2020, Algorithm 1. Clients upload Count Sketches of their
gradients; because sketches are linear, the server keeps momentum and error
accumulation *inside sketch space*:

    S    = sum_i w_i S(g_i)            (merge = weighted sum of tables)
    S_u  = rho * S_u + S               (momentum)
    S_e  = S_e + lr * S_u              (error accumulation)
    Delta = top-k(unsketch(S_e))       (the model update)
    zero S_u and S_e at Delta's support
    w    = w - Delta

All state is on the server, so clients are stateless and may take part once.

Where the learning rate multiplies differs between the paper's sources; both
are offered (``lr_placement``):

``error``
    ``S_e += lr * S_u`` and ``w -= Delta``, as above: Algorithm 1 of the paper
    (line 12, "Error feedback: S_e = eta S_u + S_e").
``update``
    ``S_e += S_u`` and ``w -= lr * Delta``: FetchSGD's reference code
    (github.com/kiddyboots216/CommEfficient, ``fed_aggregator.py``,
    ``_server_helper_sketched``: ``Verror += Vvelocity`` ... ``return update * lr``).

At a constant learning rate the two are the same algorithm (the error sketch
of ``update`` is that of ``error`` divided by lr, so top-k picks the same
coordinates and the applied values agree). Under a schedule they differ:
``error`` weighs each round's momentum by that round's rate, ``update`` applies
today's rate to everything still accumulated, so error left over from early
rounds is applied at a decayed rate.

How the error (and momentum) sketches are "zeroed at Delta's support" differs
between the paper's sources; both are offered as named variants:

``subtract``
    ``S_e -= S(Delta)``: removes exactly what was applied, so error feedback
    conserves mass (applied updates + remaining error = sum of lr * S_u). The
    paper's text and FLSim's implementation. Momentum zeroing subtracts the
    sketch of the momentum's own estimate at Delta's support.
``zero-buckets``
    Zero every bucket that a coordinate of Delta hashes to, in every row. The
    FetchSGD reference code does this; its comment reports that subtraction
    diverged in its experiments. It also discards the mass of the other
    coordinates sharing those buckets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fedsketch.sketch.count_sketch import CountSketch

VARIANTS = ("subtract", "zero-buckets")
LR_PLACEMENTS = ("error", "update")


@dataclass(frozen=True)
class FetchSGDParams:
    """Hyper-parameters fixed for a whole run.

    The sketch seed is fixed for the run (not per round): momentum and error
    accumulate across rounds in one sketch space, so every round's client
    sketches must share its hash functions.
    """

    d: int
    rows: int
    cols: int
    seed: int
    k: int
    momentum: float = 0.9
    error_feedback: str = field(kw_only=True)
    """No default here: the run's setting ``error-feedback`` has the one default (:mod:`fedsketch.methods.fetchsgd`)."""
    momentum_zeroing: bool = True
    lr_placement: str = "error"

    def __post_init__(self) -> None:
        if self.error_feedback not in VARIANTS:
            raise ValueError(f"error_feedback must be one of {VARIANTS}; got {self.error_feedback!r}")
        if self.lr_placement not in LR_PLACEMENTS:
            raise ValueError(f"lr_placement must be one of {LR_PLACEMENTS}; got {self.lr_placement!r}")
        if not 1 <= self.k <= self.d:
            raise ValueError(f"k must be in 1..d={self.d}; got {self.k}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1); got {self.momentum}")

    def empty_sketch(self, device: torch.device | str | None = None) -> CountSketch:
        """A zero sketch with this run's hash functions."""
        return CountSketch(self.d, self.rows, self.cols, seed=self.seed, device=device)


@dataclass(frozen=True)
class FetchSGDState:
    """Momentum S_u and error S_e: ``rows x cols`` sketch tables here; in the fidelity diagnostic's
    dense shadow (:mod:`fedsketch.algorithms.fidelity`), the length-d vectors they stand for."""

    momentum: torch.Tensor
    error: torch.Tensor


@dataclass(frozen=True)
class FetchSGDUpdate:
    """What one step applies, ``w -= dense(indices, values)``, and what it took out of the error accumulator.

    ``taken`` are the unsketched estimates at ``indices``; ``values`` is
    ``taken`` under ``lr_placement = "error"`` and ``lr * taken`` under ``"update"``.
    """

    indices: torch.Tensor
    values: torch.Tensor
    taken: torch.Tensor

    def dense(self, d: int) -> torch.Tensor:
        """The update as a dense vector of length ``d``."""
        out = torch.zeros(d, dtype=self.values.dtype, device=self.values.device)
        out[self.indices] = self.values
        return out


def init(params: FetchSGDParams, device: torch.device | str | None = None) -> FetchSGDState:
    """Zero momentum and error sketches."""
    table = params.empty_sketch(device).table
    return FetchSGDState(momentum=torch.zeros_like(table), error=torch.zeros_like(table))


def lr_factors(lr_placement: str, lr: float) -> tuple[float, float]:
    """Where this round's ``lr`` multiplies: ``(into the error accumulator, onto the applied update)``."""
    return (lr, 1.0) if lr_placement == "error" else (1.0, lr)


def step(
    state: FetchSGDState, merged: torch.Tensor, params: FetchSGDParams, lr: float
) -> tuple[FetchSGDState, FetchSGDUpdate]:
    """One server round of FetchSGD.

    Parameters
    ----------
    state
        Momentum and error sketches from the previous round.
    merged
        The weighted sum of this round's client tables (weights sum to one).
    params
        The run's hyper-parameters.
    lr
        This round's learning rate (schedules are the caller's business).

    Returns
    -------
    The new state and the sparse update to subtract from the model.
    """
    if merged.shape != state.error.shape:
        raise ValueError(f"merged table has shape {tuple(merged.shape)}; expected {tuple(state.error.shape)}")
    into_error, onto_update = lr_factors(params.lr_placement, lr)
    momentum = params.momentum * state.momentum + merged
    error = state.error + into_error * momentum
    error_sketch = CountSketch.from_table(error, params.d, params.seed)
    indices, values = error_sketch.topk(params.k)
    error = _take_out(error_sketch, indices, values, params.error_feedback)
    if params.momentum_zeroing:
        momentum_sketch = CountSketch.from_table(momentum, params.d, params.seed)
        estimate = momentum_sketch.estimate(indices)
        momentum = _take_out(momentum_sketch, indices, estimate, params.error_feedback)
    applied = values if onto_update == 1.0 else onto_update * values
    return FetchSGDState(momentum=momentum, error=error), FetchSGDUpdate(indices, applied, values)


def _take_out(sketch: CountSketch, indices: torch.Tensor, values: torch.Tensor, variant: str) -> torch.Tensor:
    """Remove coordinates ``indices`` (whose estimates are ``values``) from a sketch.

    Returns a new table; the input sketch's table is not modified.
    """
    out = sketch.copy()
    if variant == "subtract":
        out.accumulate_sparse(indices, -values)
    else:
        out.zero_buckets(indices)
    return out.table
