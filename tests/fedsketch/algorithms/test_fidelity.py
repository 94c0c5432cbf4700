"""The sketch-fidelity shadow against a float64 reference written out, to the bit.

Rothchild et al., ICML 2020, Algorithm 1 on the sketches; :mod:`fedsketch.algorithms.fidelity`
runs the same recurrences densely beside it (``u = rho u + g``, ``e += a u``) and compares
FetchSGD's ``Delta`` with ``top-k(e)``. With integer gradients and powers of two for ``rho`` and
``lr`` every value here is exact in float32, so the shadow, its figures and the tally are checked
for equality with the reference, on a sketch whose buckets collide (d = 8 in 3 x 4).
"""

from __future__ import annotations

import math

import pytest
import torch

from fedsketch.algorithms import fetchsgd, fidelity
from fedsketch.sketch.count_sketch import CountSketch

D, ROWS, COLS, SEED, K, RHO = 8, 3, 4, 3, 2, 0.5
F64 = torch.float64
GRADS = (  # no tie at the k-th largest |e| in any round of any variant
    [6.0, -2.0, 3.0, 5.0, 2.0, 6.0, -7.0, -7.0],
    [-7.0, -1.0, -4.0, 7.0, -5.0, 7.0, -6.0, -3.0],
    [-3.0, -6.0, -3.0, -1.0, -3.0, 7.0, 2.0, -5.0],
)
LRS = (2.0, 0.5, 0.25)  # lr = 2 first: the update placement scales the compared top-k by it


def _params(variant: str, placement: str = "error", zeroing: bool = True, d: int = D) -> fetchsgd.FetchSGDParams:
    return fetchsgd.FetchSGDParams(
        d=d,
        rows=ROWS,
        cols=COLS,
        seed=SEED,
        k=K,
        momentum=RHO,
        error_feedback=variant,
        momentum_zeroing=zeroing,
        lr_placement=placement,
    )


def _sketch64(vec: torch.Tensor) -> torch.Tensor:
    return CountSketch(D, ROWS, COLS, seed=SEED, dtype=F64).accumulate(vec.double()).table


def _merged(g: torch.Tensor) -> torch.Tensor:
    return CountSketch(D, ROWS, COLS, seed=SEED).accumulate(g.float()).table.clone()


def _norm(vec: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(vec.double()))


@pytest.mark.parametrize("zeroing", [True, False])
@pytest.mark.parametrize("placement", fetchsgd.LR_PLACEMENTS)
@pytest.mark.parametrize("variant", fetchsgd.VARIANTS)
def test_each_round_is_the_dense_recurrence_and_its_figures_to_the_bit(
    variant: str, placement: str, zeroing: bool
) -> None:
    """u = rho u + g; e += a u; compared: b top-k(e); then FetchSGD's Delta taken out of e (and u).

    ``a = lr, b = 1`` (error placement) or ``a = 1, b = lr`` (update placement). ``subtract`` takes
    ``update.taken`` out of ``e`` and the momentum sketch's estimates out of ``u``; ``zero-buckets``
    zeroes both at Delta's support.
    """
    params = _params(variant, placement, zeroing)
    state = fidelity.init(params)
    u, e = torch.zeros(D, dtype=F64), torch.zeros(D, dtype=F64)
    tally = [0.0] * len(fidelity.TALLY)
    for g_list, lr in zip(GRADS, LRS, strict=True):
        g = torch.tensor(g_list, dtype=F64)
        a, b = (lr, 1.0) if placement == "error" else (1.0, lr)
        u = RHO * u + g
        e = e + a * u
        ranked = torch.sort(e.abs(), descending=True, stable=True)
        assert ranked.values[K - 1] > ranked.values[K]  # no tie decides the true support
        support = ranked.indices[:K]
        truth = torch.zeros(D, dtype=F64)
        truth[support] = b * e[support]
        sketched_before = state.sketched
        new, update, rep = fidelity.step(state, _merged(g), g, params, lr)  # a float64 mean: kept float32
        want_sketched, want_update = fetchsgd.step(sketched_before, _merged(g), params, lr)
        assert torch.equal(update.indices, want_update.indices) and torch.equal(update.values, want_update.values)
        assert torch.equal(new.sketched.error, want_sketched.error)
        assert torch.equal(new.sketched.momentum, want_sketched.momentum)
        found = set(update.indices.tolist())
        recall = len(found & set(support.tolist())) / K
        rel_error = _norm(update.dense(D).double() - truth) / _norm(truth)
        squares = e.square()
        mass = float(torch.topk(squares, K).values.sum()) / float(squares.sum())
        before = _norm(_sketch64(e))
        idx = update.indices
        if variant == "subtract":
            u_before = u.clone()
            e[idx] -= update.taken.double()
            if zeroing:
                u[idx] -= CountSketch(D, ROWS, COLS, seed=SEED, dtype=F64).accumulate(u_before).estimate(idx)
        else:
            e[idx] = 0.0
            if zeroing:
                u[idx] = 0.0
        drift = _norm(new.sketched.error.double() - _sketch64(e)) / before
        assert (rep.recall, rep.rel_error, rep.state_drift, rep.rounds, rep.topk_mass) == (
            recall,
            rel_error,
            drift,
            1,
            mass,
        )
        if variant == "subtract":
            assert drift == 0.0  # every operation is linear and exact here: the sketch is the shadow's
        assert new.shadow.momentum.dtype == new.shadow.error.dtype == torch.float32
        assert torch.equal(new.shadow.momentum, u.float()) and torch.equal(new.shadow.error, e.float())
        tally = [t + x for t, x in zip(tally, [1.0, recall, rel_error, drift, mass], strict=True)]
        assert new.tally.dtype == F64 and new.tally.tolist() == tally
        state = new
    if variant == "zero-buckets":
        assert drift > 0.0  # the colliding coordinates' mass went with the zeroed buckets
    emptied, mean = fidelity.report(state)
    assert (mean.rounds, mean.recall, mean.rel_error, mean.state_drift, mean.topk_mass) == (
        3,
        tally[1] / 3,
        tally[2] / 3,
        tally[3] / 3,
        tally[4] / 3,
    )
    assert type(mean.rounds) is int
    assert emptied.tally.dtype == F64 and emptied.tally.tolist() == [0.0] * 5
    assert emptied.sketched is state.sketched and emptied.shadow is state.shadow


def test_the_state_starts_at_zero_in_float32_with_a_float64_tally_on_the_device_asked_for() -> None:
    params = _params("subtract")
    for device in ("cpu", "meta"):
        state = fidelity.init(params, device)
        tensors = [state.shadow.momentum, state.shadow.error, state.sketched.momentum, state.sketched.error]
        assert all(t.device.type == device for t in [*tensors, state.tally])
        assert state.shadow.momentum.shape == state.shadow.error.shape == (D,)
        assert state.sketched.momentum.shape == state.sketched.error.shape == (ROWS, COLS)
        assert state.shadow.momentum.dtype == state.shadow.error.dtype == torch.float32
        assert state.tally.shape == (5,) and state.tally.dtype == F64
    state = fidelity.init(params)
    assert all(not torch.any(t) for t in [state.shadow.momentum, state.shadow.error, state.tally])
    state.shadow.error.add_(1.0)  # the two vectors are two buffers: writing one leaves the other
    assert not torch.any(state.shadow.momentum)
    assert fidelity.TALLY == ("rounds", "recall", "rel_error", "state_drift", "topk_mass")


def test_the_shadow_is_float32_whatever_the_default_dtype() -> None:
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        state = fidelity.init(_params("subtract"))
    finally:
        torch.set_default_dtype(saved)
    assert state.shadow.momentum.dtype == state.shadow.error.dtype == torch.float32
    assert state.tally.dtype == F64


def test_a_true_mean_of_another_length_is_refused_with_both_shapes() -> None:
    params = _params("subtract")
    with pytest.raises(ValueError) as err:
        fidelity.step(fidelity.init(params), _merged(torch.zeros(D)), torch.zeros(D - 1), params, 1.0)
    assert str(err.value) == "true mean has shape (7,); expected (8,)"
    with pytest.raises(ValueError) as err:
        fidelity.step(fidelity.init(params), _merged(torch.zeros(D)), torch.zeros(2, D), params, 1.0)
    assert str(err.value) == "true mean has shape (2, 8); expected (8,)"


def test_a_round_with_nothing_to_measure_reports_nan_and_leaves_the_tally() -> None:
    params = _params("subtract")
    state = fidelity.init(params)
    zero = torch.zeros(D)
    state, _, rep = fidelity.step(state, _merged(zero), zero, params, 1.0)
    assert math.isnan(rep.recall) and math.isnan(rep.rel_error) and math.isnan(rep.topk_mass)
    assert (rep.state_drift, rep.rounds) == (0.0, 1)  # a zero sketch against a zero sketch: no drift
    assert state.tally.tolist() == [0.0] * 5
    g = torch.tensor(GRADS[0])
    state, _, rep = fidelity.step(state, _merged(g), g, params, 1.0)
    assert state.tally.tolist() == [1.0, rep.recall, rep.rel_error, rep.state_drift, rep.topk_mass]
    _, mean = fidelity.report(state)
    assert (mean.rounds, mean.recall) == (1, rep.recall)


def test_a_report_of_no_rounds_is_nan_and_of_some_the_mean_of_each_figure() -> None:
    state = fidelity.init(_params("subtract"))
    emptied, mean = fidelity.report(state)
    assert mean.rounds == 0 and all(
        math.isnan(x) for x in (mean.recall, mean.rel_error, mean.state_drift, mean.topk_mass)
    )
    tallied = fidelity.FidelityState(state.sketched, state.shadow, torch.tensor([2.0, 1.5, 0.5, 0.25, 1.0], dtype=F64))
    emptied, mean = fidelity.report(tallied)
    assert mean == fidelity.FidelityReport(recall=0.75, rel_error=0.25, state_drift=0.125, rounds=2, topk_mass=0.5)
    assert emptied.tally.dtype == F64 and emptied.tally.tolist() == [0.0] * 5
    assert tallied.tally.tolist() == [2.0, 1.5, 0.5, 0.25, 1.0]  # the state reported is left as it was
    assert math.isnan(fidelity.FidelityReport(1.0, 0.0, 0.0, 1).topk_mass)


def test_compare_is_recall_over_the_nonzero_top_k_and_the_relative_l2_error() -> None:
    error = torch.tensor([3.0, -4.0, 0.0, 1.0])
    update = fetchsgd.FetchSGDUpdate(torch.tensor([3, 1]), torch.tensor([2.0, -4.0]), torch.tensor([2.0, -4.0]))
    recall, rel_error = fidelity.compare(update, error, 2)
    assert recall == 0.5 and rel_error == math.sqrt(13.0) / 5.0  # diff (-3, 0, 0, 2) against truth (3, -4)
    exact = fetchsgd.FetchSGDUpdate(torch.tensor([1, 0]), torch.tensor([-4.0, 3.0]), torch.tensor([-4.0, 3.0]))
    assert fidelity.compare(exact, error, 2) == (1.0, 0.0)
    third = torch.tensor([0.0, 1 / 3, 0.0], dtype=torch.float32)
    none = fetchsgd.FetchSGDUpdate(torch.tensor([0]), torch.tensor([0.0]), torch.tensor([0.0]))
    assert fidelity.compare(none, third, 1) == (0.0, 1.0)
    sparse = torch.zeros(10)
    sparse[[2, 7]] = torch.tensor([5.0, -1.0])
    three = fetchsgd.FetchSGDUpdate(
        torch.tensor([2, 4, 5]), torch.tensor([5.0, 1.0, 1.0]), torch.tensor([5.0, 1.0, 1.0])
    )
    recall, rel_error = fidelity.compare(three, sparse, 3)  # two nonzeros: recall over them, not a zero's tie-break
    assert recall == 0.5 and rel_error == math.sqrt(3.0) / math.sqrt(26.0)
    unit = torch.tensor([0.0, 1.0, -0.5])  # a true coordinate of exactly 1 counts like any other
    assert fidelity.compare(fetchsgd.FetchSGDUpdate(torch.tensor([1]), torch.ones(1), torch.ones(1)), unit, 1) == (
        1.0,
        0.0,
    )
    nothing = fidelity.compare(three, torch.zeros(10), 3)
    assert math.isnan(nothing[0]) and math.isnan(nothing[1])


def test_topk_mass_is_the_float64_share_of_the_squares_in_the_top_k() -> None:
    error = torch.tensor([3.0, -4.0, 0.0, 1.0, -1.0, 0.0])
    assert fidelity.topk_mass(error, 2) == 25.0 / 27.0
    assert fidelity.topk_mass(error, 1) == 16.0 / 27.0
    tenths = torch.tensor([0.1, -0.2, 0.3], dtype=torch.float32)
    squares = [float(x) ** 2 for x in tenths.double()]
    assert fidelity.topk_mass(tenths, 1) == squares[2] / float(torch.tensor(squares, dtype=F64).sum())
    assert math.isnan(fidelity.topk_mass(torch.zeros(5), 2))


def test_relative_is_zero_for_nothing_against_nothing_and_nan_against_nothing() -> None:
    assert fidelity._relative(1.0, 4.0) == 0.25
    assert fidelity._relative(0.0, 4.0) == 0.0
    assert fidelity._relative(0.125, 0.5) == 0.25  # a reference below 1 divides too
    assert fidelity._relative(0.0, 0.0) == 0.0
    assert math.isnan(fidelity._relative(2.0, 0.0))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_round_is_measured_on_cuda() -> None:
    params = _params("subtract")
    state = fidelity.init(params, "cuda")
    g = torch.tensor(GRADS[0])
    merged = CountSketch(D, ROWS, COLS, seed=SEED, device="cuda").accumulate(g.cuda()).table.clone()
    state, _, rep = fidelity.step(state, merged, g.cuda(), params, 1.0)
    assert state.tally.device.type == "cuda" and state.shadow.error.device.type == "cuda"
    assert rep.recall == fidelity.step(fidelity.init(params), _merged(g), g, params, 1.0)[2].recall
    assert fidelity.report(state)[0].tally.device.type == "cuda"
