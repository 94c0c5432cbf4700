"""Sketch fidelity: FetchSGD's step next to a dense shadow of the same recurrences.

Rothchild et al., "FetchSGD", ICML 2020, Algorithm 1 keeps momentum ``S_u``
and error ``S_e`` as Count Sketches and applies ``Delta = top-k(unsketch(S_e))``.
How much does sketching cost a round? This module answers it in simulation,
where the server may also see each client's dense update ``g_i``.

The reference is a *dense shadow*: the same linear recurrences run on the
dense vectors, fed with the true aggregate ``g = sum_i w_i g_i`` (the very
weights of the sketch merge), and taking out FetchSGD's own ``Delta`` rather
than its own top-k, so that it follows FetchSGD's trajectory::

    u = rho * u + g
    e = e + lr * u
    Delta_true = top-k(e)            (exact values of e at its k largest |e|)
    take FetchSGD's Delta out of e and u, as the sketch does

With ``lr_placement = "update"`` (the reference code's) the shadow mirrors it:
``e = e + u``, ``Delta_true = lr * top-k(e)``, and what is taken out of ``e``
is the unscaled estimate (:attr:`fetchsgd.FetchSGDUpdate.taken`), exactly as
in the sketch.

Each round then compares FetchSGD's ``Delta`` with ``Delta_true``:

``recall``
    ``|support(Delta) & support(Delta_true)| / k``.
``rel_error``
    ``||Delta - Delta_true|| / ||Delta_true||`` (values and support together).
``state_drift``
    ``||S_e - S(e)||_F / ||S(e before take-out)||_F``: how far the sketched
    error has moved from the sketch of the shadow's.
``topk_mass``
    ``||top-k(e)||^2 / ||e||^2``: how much of the shadow's error its own top-k
    holds. A Count Sketch estimates each coordinate to within about
    ``||e - top-k(e)|| / sqrt(cols)``, so recall needs this near 1; error
    accumulation spreads ``e`` over the coordinates not yet applied, and
    lowers it as a run goes on.

Why this reference: under ``error-feedback = "subtract"`` every operation on
the sketch is linear, ``S_e - S(Delta) = S(e - Delta)`` and likewise for the
momentum, so the sketched state *is* the sketch of the shadow (``state_drift``
is float rounding, ~1e-7) and recall and error measure exactly this round's
unsketching: the top-k of the vector the sketch holds against its estimate.
Under ``"zero-buckets"`` no dense operation matches zeroing whole buckets; the
shadow zeroes ``e`` and ``u`` at Delta's support (Algorithm 1's "zero at the
support") while the sketch also drops the mass of every coordinate sharing
those buckets. ``state_drift`` then grows with that lost mass, and recall and
error measure unsketching and the lost mass together, against the vector
FetchSGD means to hold. (An independent dense top-k run would drift onto
another trajectory and compare two different models after a few rounds.)

Cost: the shadow keeps two float32 vectors of length d on the server (u and
e), and a step makes about four more transient ones plus two sketches of d
coordinates; the caller also holds each client's dense update for the round.
The FetchSGD step itself is :func:`fedsketch.algorithms.fetchsgd.step`,
called unchanged: the diagnostic never changes what is trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from fedsketch.algorithms import fetchsgd
from fedsketch.sketch.count_sketch import CountSketch

TALLY = ("rounds", "recall", "rel_error", "state_drift", "topk_mass")
"""What :attr:`FidelityState.tally` holds, in order: rounds measured, then sums of each figure over them."""


@dataclass(frozen=True)
class FidelityState:
    """FetchSGD's state, its dense shadow, and the figures since the last report.

    The tally lives in the state, not beside it, so that a round that the
    server rolls back (not finite) or a resumed checkpoint leaves it exactly
    as the model and sketches are.
    """

    # FetchSGD's own state, stepped exactly as without the diagnostic
    sketched: fetchsgd.FetchSGDState
    # the dense reference: the momentum u and error e the sketches stand for (float32, length d)
    shadow: fetchsgd.FetchSGDState
    # statistics: float64 sums in the order of TALLY
    tally: torch.Tensor


@dataclass(frozen=True)
class FidelityReport:
    """One round's (or the average of several rounds') comparison; NaN where nothing was measured."""

    recall: float
    rel_error: float
    state_drift: float
    rounds: int
    topk_mass: float = float("nan")


def init(params: fetchsgd.FetchSGDParams, device: torch.device | str | None = None) -> FidelityState:
    """FetchSGD's zero state, a zero shadow and an empty tally."""
    zeros = torch.zeros(params.d, dtype=torch.float32, device=device)
    return FidelityState(
        sketched=fetchsgd.init(params, device),
        shadow=fetchsgd.FetchSGDState(momentum=zeros, error=zeros.clone()),
        tally=torch.zeros(len(TALLY), dtype=torch.float64, device=device),
    )


def step(
    state: FidelityState, merged: torch.Tensor, true_mean: torch.Tensor, params: fetchsgd.FetchSGDParams, lr: float
) -> tuple[FidelityState, fetchsgd.FetchSGDUpdate, FidelityReport]:
    """One FetchSGD round and its comparison with the dense shadow.

    Parameters
    ----------
    state
        The previous round's state.
    merged
        The weighted sum of this round's client tables, as FetchSGD gets it.
    true_mean
        The same weighted sum of the clients' dense updates (float32, length d).
    params, lr
        As for :func:`fetchsgd.step`.

    Returns
    -------
    The new state, FetchSGD's update (what the model applies) and this round's report.
    """
    if true_mean.shape != (params.d,):
        raise ValueError(f"true mean has shape {tuple(true_mean.shape)}; expected ({params.d},)")
    sketched, update = fetchsgd.step(state.sketched, merged, params, lr)
    into_error, onto_update = fetchsgd.lr_factors(params.lr_placement, lr)
    u = params.momentum * state.shadow.momentum + true_mean.to(state.shadow.momentum)
    e = state.shadow.error + into_error * u
    recall, rel_error = compare(update, e if onto_update == 1.0 else onto_update * e, params.k)
    mass = topk_mass(e, params.k)
    before = _sketch_norm(e, params)
    u, e = _take_out(u, e, update, state.sketched.momentum, merged, params)
    drift = _relative(float(torch.linalg.vector_norm((sketched.error - _sketch(e, params)).double())), before)
    report = FidelityReport(recall, rel_error, drift, 1, mass)
    figures = [1.0, recall, rel_error, drift, mass]
    measured = figures if all(math.isfinite(x) for x in figures) else [0.0] * len(TALLY)
    tally = state.tally + torch.tensor(measured, dtype=torch.float64, device=state.tally.device)
    return FidelityState(sketched, fetchsgd.FetchSGDState(momentum=u, error=e), tally), update, report


def compare(update: fetchsgd.FetchSGDUpdate, error: torch.Tensor, k: int) -> tuple[float, float]:
    """Recall of the true top-k support and the relative L2 error of ``update`` against ``top-k(error)``.

    The true top-k is by magnitude, as :func:`fedsketch.algorithms.topk_sgd.step`
    takes it, and holds only nonzero coordinates: where ``error`` has fewer
    than ``k`` (sparse gradients, early rounds) recall is over those it has,
    not over zeros a tie-break happens to pick. Recall and the relative error
    are NaN when the error is zero.
    """
    support = torch.topk(error.abs(), k, sorted=False).indices
    support = support[error[support] != 0]
    truth = torch.zeros(error.numel(), dtype=torch.float64, device=error.device)
    truth[support] = error[support].double()
    found = torch.zeros(error.numel(), dtype=torch.bool, device=error.device)
    found[update.indices] = True
    recall = float(found[support].sum()) / support.numel() if support.numel() else float("nan")
    diff = update.dense(error.numel()).double() - truth
    norm = float(torch.linalg.vector_norm(truth))
    return recall, float(torch.linalg.vector_norm(diff)) / norm if norm > 0 else float("nan")


def topk_mass(error: torch.Tensor, k: int) -> float:
    """``||top-k(error)||^2 / ||error||^2`` (NaN for a zero vector)."""
    squares = error.double().square()
    total = float(squares.sum())
    return float(torch.topk(squares, k, sorted=False).values.sum()) / total if total > 0 else float("nan")


def report(state: FidelityState) -> tuple[FidelityState, FidelityReport]:
    """The average of the rounds tallied since the last report, and the state with the tally emptied."""
    rounds, *totals = state.tally.tolist()
    recall, rel_error, drift, mass = (total / rounds if rounds else float("nan") for total in totals)
    emptied = replace(state, tally=torch.zeros_like(state.tally))
    return emptied, FidelityReport(recall, rel_error, drift, int(rounds), mass)


def _take_out(
    u: torch.Tensor,
    e: torch.Tensor,
    update: fetchsgd.FetchSGDUpdate,
    momentum_before: torch.Tensor,
    merged: torch.Tensor,
    params: fetchsgd.FetchSGDParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Remove FetchSGD's ``Delta`` from the shadow as its variant removes it from the sketches.

    ``subtract``: ``e -=`` what the step took out of the error sketch
    (``Delta``, or ``Delta / lr`` under ``lr_placement = "update"``) and
    ``u -=`` the momentum sketch's own estimates at Delta's support (what
    ``S_u -= S(estimate)`` removes), so the shadow stays the preimage of the
    sketches. ``zero-buckets``: zero ``e`` and
    ``u`` at the support.
    """
    e, u = e.clone(), u.clone()
    idx = update.indices
    if params.error_feedback == "subtract":
        e[idx] -= update.taken.to(e)
    else:
        e[idx] = 0.0
    if params.momentum_zeroing:
        if params.error_feedback == "subtract":
            table = params.momentum * momentum_before + merged  # the sketched momentum before take-out, as in step
            u[idx] -= CountSketch.from_table(table, params.d, params.seed).estimate(idx).to(u)
        else:
            u[idx] = 0.0
    return u, e


def _sketch(vec: torch.Tensor, params: fetchsgd.FetchSGDParams) -> torch.Tensor:
    return params.empty_sketch(vec.device).accumulate(vec).table


def _sketch_norm(vec: torch.Tensor, params: fetchsgd.FetchSGDParams) -> float:
    return float(torch.linalg.vector_norm(_sketch(vec, params).double()))


def _relative(diff: float, ref: float) -> float:
    """``diff / ref``; 0 when both are 0, NaN when only ``ref`` is."""
    if ref > 0:
        return diff / ref
    return 0.0 if diff == 0 else float("nan")
