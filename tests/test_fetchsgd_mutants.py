"""FetchSGD's server step against a float64 reference written out by hand, and its edges.

Rothchild et al., ICML 2020, Algorithm 1, on a sketch with no collisions (``d <= cols``, one
chunk): every estimate is exact, so each round is the dense algorithm, to the bit in float64.
Each test pins a behaviour of :mod:`fedsketch.algorithms.fetchsgd` that tests/fedsketch/algorithms/test_fetchsgd.py
passes through without checking (docs/mutation.md, the algorithms' section).
"""

from __future__ import annotations

import pytest
import torch

from fedsketch import CountSketch
from fedsketch.algorithms import fetchsgd

D, K, RHO = 6, 2, 0.5
LRS = (2.0, 0.5, 0.25, 2.0)  # lr = 2 first: the update placement must multiply by it, once
F64 = torch.float64


def _params(variant: str, placement: str, zeroing: bool) -> fetchsgd.FetchSGDParams:
    return fetchsgd.FetchSGDParams(
        d=D,
        rows=3,
        cols=D,
        seed=7,
        k=K,
        momentum=RHO,
        error_feedback=variant,
        momentum_zeroing=zeroing,
        lr_placement=placement,
    )


def _sketch64(vec: torch.Tensor, params: fetchsgd.FetchSGDParams) -> torch.Tensor:
    return CountSketch(D, params.rows, params.cols, seed=params.seed, dtype=F64).accumulate(vec).table


def _no_collisions(params: fetchsgd.FetchSGDParams) -> bool:
    """Each row puts the D coordinates in D distinct buckets (so every estimate is exact)."""
    units = torch.stack([_sketch64(torch.eye(D, dtype=F64)[j], params) for j in range(D)])
    return bool(torch.all((units != 0).sum(dim=0) <= 1)) and bool(torch.all((units != 0).sum(dim=2) == 1))


@pytest.mark.parametrize("zeroing", [True, False])
@pytest.mark.parametrize("placement", fetchsgd.LR_PLACEMENTS)
@pytest.mark.parametrize("variant", fetchsgd.VARIANTS)
def test_each_round_is_algorithm_1_to_the_bit_in_float64(variant: str, placement: str, zeroing: bool) -> None:
    """u = rho u + g;  e += a u;  Delta = the k largest |e|;  e, and u (zeroing), set to 0 there;
    ``a = lr`` and ``w -= Delta`` (error placement) or ``a = 1`` and ``w -= lr Delta`` (update placement).

    The float64 values are not float32 numbers, so the update's dense vector must keep float64;
    the input state is left as it was.
    """
    params = _params(variant, placement, zeroing)
    assert _no_collisions(params)
    gen = torch.Generator().manual_seed(11)
    zeros = torch.zeros(params.rows, params.cols, dtype=F64)
    state = fetchsgd.FetchSGDState(momentum=zeros, error=zeros.clone())
    u, e = torch.zeros(D, dtype=F64), torch.zeros(D, dtype=F64)
    for lr in LRS:
        g = torch.randn(D, dtype=F64, generator=gen)
        u = RHO * u + g
        e = e + (lr if placement == "error" else 1.0) * u
        top = torch.topk(e.abs(), K).indices
        taken = e[top].clone()
        applied = taken if placement == "error" else lr * taken
        e[top] = 0.0
        if zeroing:
            u[top] = 0.0
        before = (state.momentum.clone(), state.error.clone())
        new, update = fetchsgd.step(state, _sketch64(g, params), params, lr)
        assert torch.equal(state.momentum, before[0]) and torch.equal(state.error, before[1])
        order = torch.argsort(update.indices)
        assert torch.equal(update.indices[order], top.sort().values)
        assert torch.equal(update.taken[order], taken[top.argsort()])
        assert torch.equal(update.values[order], applied[top.argsort()])
        dense = torch.zeros(D, dtype=F64)
        dense[top] = applied
        assert update.dense(D).dtype == F64 and torch.equal(update.dense(D), dense)
        assert torch.equal(new.error, _sketch64(e, params)) and torch.equal(new.momentum, _sketch64(u, params))
        state = new


@pytest.mark.parametrize("variant", fetchsgd.VARIANTS)
def test_on_a_colliding_sketch_each_variant_takes_out_what_its_source_says(variant: str) -> None:
    """d = 8 in 3 x 4 buckets, integer updates, lr and rho powers of two: every table entry is exact in float64.

    ``subtract`` (the paper, FLSim): ``S_e -= S(Delta)`` and ``S_u -= S(u's estimates at Delta's support)``.
    ``zero-buckets`` (the reference code): every bucket a coordinate of Delta hashes to is zeroed, in
    both tables, and the other coordinates' mass in those buckets goes with it.
    """
    d, rows, cols, k, lr = 8, 3, 4, 2, 0.5
    params = fetchsgd.FetchSGDParams(d=d, rows=rows, cols=cols, seed=3, k=k, momentum=RHO, error_feedback=variant)

    def sketch(vec: torch.Tensor) -> torch.Tensor:
        return CountSketch(d, rows, cols, seed=3, dtype=F64).accumulate(vec).table

    zeros = torch.zeros(rows, cols, dtype=F64)
    state = fetchsgd.FetchSGDState(momentum=zeros, error=zeros.clone())
    grads = ([8.0, -1.0, 2.0, 0.0, 3.0, -5.0, 1.0, 4.0], [-2.0, 6.0, 1.0, -3.0, 0.0, 2.0, 7.0, -1.0])
    for g in grads:
        merged = sketch(torch.tensor(g, dtype=F64))
        u = RHO * state.momentum + merged
        e = state.error + lr * u
        estimates = CountSketch.from_table(e, d, 3).estimate()
        ranked = torch.sort(estimates.abs(), descending=True, stable=True)
        assert ranked.values[k - 1] > ranked.values[k]  # no tie decides the support
        top = ranked.indices[:k].sort().values
        touched = sum(sketch(torch.eye(d, dtype=F64)[j]).abs() for j in top.tolist()) != 0
        state, update = fetchsgd.step(state, merged, params, lr)
        assert torch.equal(update.indices.sort().values, top)
        assert torch.equal(update.dense(d)[top], estimates[top]) and torch.count_nonzero(update.dense(d)) == k
        if variant == "subtract":
            u_at_top = torch.zeros(d, dtype=F64)
            u_at_top[top] = CountSketch.from_table(u, d, 3).estimate(top)
            assert torch.equal(state.error, e - sketch(update.dense(d)))
            assert torch.equal(state.momentum, u - sketch(u_at_top))
            assert torch.any(state.error[touched] != 0)  # the colliding coordinates' mass stays
        else:
            assert torch.equal(state.error, torch.where(touched, 0.0, e))
            assert torch.equal(state.momentum, torch.where(touched, 0.0, u))


def test_the_update_placement_applies_lr_once_and_the_error_placement_not_again() -> None:
    """One round from zero, no momentum: the error placement applies ``lr g`` at the top, the update placement too."""
    g = torch.tensor([0.0, 3.0, 0.0, -1.0, 0.5, 0.0], dtype=F64)
    for placement in fetchsgd.LR_PLACEMENTS:
        params = fetchsgd.FetchSGDParams(
            d=D, rows=3, cols=D, seed=7, k=1, momentum=0.0, error_feedback="subtract", lr_placement=placement
        )
        zeros = torch.zeros(3, D, dtype=F64)
        for lr in (1.0, 2.0, 3.0):
            _, update = fetchsgd.step(fetchsgd.FetchSGDState(zeros, zeros), _sketch64(g, params), params, lr)
            assert update.indices.tolist() == [1] and update.values.tolist() == [3.0 * lr]
            assert update.taken.tolist() == [3.0 * lr if placement == "error" else 3.0]


def test_the_state_and_the_dense_update_live_on_the_device_asked_for() -> None:
    """The meta device holds no memory and is not the CPU: the device argument must be passed on."""
    params = _params("subtract", "error", True)
    state = fetchsgd.init(params, "meta")
    assert state.momentum.device.type == state.error.device.type == "meta"
    assert state.momentum.shape == state.error.shape == (3, D)
    assert params.empty_sketch("meta").table.device.type == "meta"
    assert fetchsgd.init(params).error.device.type == "cpu"
    meta = torch.device("meta")
    values = torch.zeros(2, dtype=F64, device=meta)
    update = fetchsgd.FetchSGDUpdate(torch.tensor([1, 4], device=meta), values, values)
    dense = update.dense(D)
    assert dense.device.type == "meta" and dense.dtype == F64 and dense.shape == (D,)


def test_momentum_below_one_is_accepted_and_one_is_refused_with_its_message() -> None:
    assert _params("subtract", "error", True).momentum == RHO
    base = {"d": D, "rows": 3, "cols": D, "seed": 0, "k": K, "error_feedback": "subtract"}
    assert fetchsgd.FetchSGDParams(**base, momentum=0.0).momentum == 0.0  # type: ignore[arg-type]
    assert fetchsgd.FetchSGDParams(**base, momentum=1 - 2**-20).momentum == 1 - 2**-20  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^momentum must be in \[0, 1\); got 1\.0$"):
        fetchsgd.FetchSGDParams(**base, momentum=1.0)  # type: ignore[arg-type]


def test_an_unknown_lr_placement_is_refused_by_name() -> None:
    message = r"^lr_placement must be one of \('error', 'update'\); got 'server'$"
    with pytest.raises(ValueError, match=message):
        fetchsgd.FetchSGDParams(d=D, rows=3, cols=D, seed=0, k=K, error_feedback="subtract", lr_placement="server")
