"""FetchSGD's server step: its properties, then a float64 reference written out by hand, and its edges.

Rothchild et al., ICML 2020, Algorithm 1. The reference runs on a sketch with no collisions
(``d <= cols``, one chunk): every estimate is exact, so each round is the dense algorithm, to the bit
in float64. Those tests pin what the property tests pass through without checking (docs/mutation.md,
the algorithms' section).
"""

from __future__ import annotations

import pytest
import torch

from fedsketch import CountSketch
from fedsketch.algorithms import fetchsgd, momentum_sgd
from fedsketch.algorithms import topk_sgd as server


def _sketch_table(vec: torch.Tensor, params: fetchsgd.FetchSGDParams) -> torch.Tensor:
    return params.empty_sketch().accumulate(vec).table.clone()


def test_with_exact_recovery_and_k_equal_d_fetchsgd_is_sgd_with_momentum() -> None:
    d, lr, rho = 40, 0.1, 0.9
    params = fetchsgd.FetchSGDParams(
        d=d, rows=5, cols=200_000, seed=3, k=d, momentum=rho, error_feedback="subtract", momentum_zeroing=False
    )
    gen = torch.Generator().manual_seed(0)
    state, ref = fetchsgd.init(params), momentum_sgd.init(d)
    w_sketch, w_ref = torch.zeros(d), torch.zeros(d)
    for _ in range(6):
        g = torch.randn(d, generator=gen)
        state, update = fetchsgd.step(state, _sketch_table(g, params), params, lr)
        ref, delta = momentum_sgd.step(ref, g, lr, rho)
        w_sketch -= update.dense(d)
        w_ref -= delta
    torch.testing.assert_close(w_sketch, w_ref, rtol=1e-5, atol=1e-6)


def _top_k_of(table: torch.Tensor, params: fetchsgd.FetchSGDParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest |estimates| of a table (ties: smaller index) and its estimates of all coordinates."""
    estimates = CountSketch.from_table(table, params.d, params.seed).estimate()
    return torch.sort(estimates.abs(), descending=True, stable=True).indices[: params.k], estimates


def test_subtract_variant_conserves_mass_in_sketch_space() -> None:
    """Applied updates + remaining error == sum over rounds of lr * momentum (sketched).

    That identity holds for any choice of coordinates, so each round's update
    is also checked to be the top-k of the error sketch's estimates.
    """
    d, lr = 5_000, 0.05
    params = fetchsgd.FetchSGDParams(d=d, rows=5, cols=500, seed=1, k=50, momentum=0.9, error_feedback="subtract")
    gen = torch.Generator().manual_seed(1)
    state = fetchsgd.init(params)
    applied, lr_momentum = torch.zeros(d), torch.zeros_like(state.error)
    for _ in range(5):
        merged = _sketch_table(torch.randn(d, generator=gen), params)
        lr_momentum += lr * (params.momentum * state.momentum + merged)
        top, estimates = _top_k_of(state.error + lr * (params.momentum * state.momentum + merged), params)
        state, update = fetchsgd.step(state, merged, params, lr)
        assert torch.equal(update.indices, top) and torch.equal(update.values, estimates[top])
        applied += update.dense(d)
    torch.testing.assert_close(_sketch_table(applied, params) + state.error, lr_momentum, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", fetchsgd.VARIANTS)
def test_with_exact_recovery_and_k_below_d_fetchsgd_is_true_top_k(variant: str) -> None:
    """d within one chunk (no collisions) and k < d: FetchSGD is the true top-k server, round for round.

    With exact estimates both variants take out exactly Delta, so error
    carried over from earlier rounds and momentum zeroed at Delta's support
    decide which coordinates later rounds apply.
    """
    d, k, lr, rho = 2_000, 40, 0.1, 0.9
    params = fetchsgd.FetchSGDParams(d=d, rows=3, cols=d, seed=6, k=k, momentum=rho, error_feedback=variant)
    reference = server.true_topk(d, k, momentum=rho, momentum_zeroing=True)
    state, ref = fetchsgd.init(params), server.init(reference)
    gen = torch.Generator().manual_seed(6)
    carried = 0
    for _ in range(8):
        g = torch.randn(d, generator=gen) * (1 + 3 * (torch.rand(d, generator=gen) < 0.05))
        fresh = torch.topk((rho * ref.momentum + g).abs(), k).indices.sort().values
        state, update = fetchsgd.step(state, _sketch_table(g, params), params, lr)
        ref, delta = server.step(ref, g, reference, lr)
        support = torch.nonzero(delta).view(-1)
        assert torch.equal(update.indices.sort().values, support)
        torch.testing.assert_close(update.dense(d), delta, rtol=1e-6, atol=1e-7)
        carried += int(not torch.equal(fresh, support))
    assert carried >= 4  # the error carried over changes what most rounds apply


def _taken_out(
    table: torch.Tensor, indices: torch.Tensor, values: torch.Tensor, params: fetchsgd.FetchSGDParams
) -> torch.Tensor:
    """Algorithm 1's "zero at the support", in the named variant, written out with the public sketch API."""
    sketch = CountSketch.from_table(table, params.d, params.seed)
    if params.error_feedback == "subtract":
        return sketch.accumulate_sparse(indices, -values).table
    return sketch.zero_buckets(indices).table


@pytest.mark.parametrize("variant", fetchsgd.VARIANTS)
def test_on_a_colliding_sketch_each_round_follows_algorithm_1(variant: str) -> None:
    """A 3 x 500 sketch of d = 6,000 (estimates are off) and k = 60, over six rounds:

    S_u = rho S_u + S;  S_e += lr S_u;  Delta = top-k of S_e's estimates;
    Delta taken out of S_e, and S_u's own estimates at Delta's support out of S_u.
    """
    d, lr, rho = 6_000, 0.1, 0.9
    params = fetchsgd.FetchSGDParams(d=d, rows=3, cols=500, seed=5, k=60, momentum=rho, error_feedback=variant)
    gen = torch.Generator().manual_seed(5)
    state = fetchsgd.init(params)
    for rnd in range(6):
        g = torch.randn(d, generator=gen) * (torch.rand(d, generator=gen) < 0.3)
        merged = _sketch_table(g, params)
        if rnd == 0:
            assert not torch.allclose(CountSketch.from_table(merged, d, 5).estimate(), g)  # lossy indeed
        u = rho * state.momentum + merged
        e = state.error + lr * u
        top, estimates = _top_k_of(e, params)
        state, update = fetchsgd.step(state, merged, params, lr)
        assert torch.equal(update.indices, top) and torch.equal(update.values, estimates[top])
        u_at_top = CountSketch.from_table(u, d, 5).estimate(top)
        torch.testing.assert_close(state.error, _taken_out(e, top, estimates[top], params), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(state.momentum, _taken_out(u, top, u_at_top, params), rtol=1e-6, atol=1e-6)
        assert torch.count_nonzero(state.error) > 0 and torch.count_nonzero(state.momentum) > 0


def test_zero_buckets_variant_zeroes_every_touched_bucket() -> None:
    d = 2_000
    params = fetchsgd.FetchSGDParams(d=d, rows=3, cols=300, seed=2, k=20, error_feedback="zero-buckets")
    merged = _sketch_table(torch.randn(d, generator=torch.Generator().manual_seed(2)), params)
    state, update = fetchsgd.step(fetchsgd.init(params), merged, params, lr=1.0)
    touched = CountSketch(d, 3, 300, seed=2)
    touched.accumulate_sparse(update.indices, torch.ones(len(update.indices)))
    mask = touched.table != 0
    assert mask.any()
    assert torch.all(state.error[mask] == 0) and torch.all(state.momentum[mask] == 0)
    assert torch.any(state.error[~mask] != 0)


def test_update_is_the_top_k_of_the_error_estimate() -> None:
    d = 1_000
    params = fetchsgd.FetchSGDParams(d=d, rows=5, cols=100_000, seed=0, k=10, momentum=0.0, error_feedback="subtract")
    vec = torch.zeros(d)
    vec[torch.arange(0, 100, 10)] = torch.arange(1.0, 11.0)
    vec[500] = 0.5
    _, update = fetchsgd.step(fetchsgd.init(params), _sketch_table(vec, params), params, lr=1.0)
    assert sorted(update.indices.tolist()) == list(range(0, 100, 10))
    torch.testing.assert_close(update.dense(d), torch.where(vec >= 1, vec, torch.zeros(d)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k must be in 1..d"),
        ({"error_feedback": "zero"}, "error_feedback must be one of"),
        ({"momentum": 1.5}, r"momentum must be in \[0, 1\)"),
    ],
)
def test_bad_parameters_are_refused(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"d": 10, "rows": 3, "cols": 10, "seed": 0, "k": 5, "error_feedback": "subtract"}
    with pytest.raises(ValueError, match=message):
        fetchsgd.FetchSGDParams(**{**base, **kwargs})  # type: ignore[arg-type]


def test_merged_table_of_the_wrong_shape_is_refused() -> None:
    params = fetchsgd.FetchSGDParams(d=10, rows=3, cols=10, seed=0, k=5, error_feedback="subtract")
    with pytest.raises(ValueError, match=r"merged table has shape \(3, 11\)"):
        fetchsgd.step(fetchsgd.init(params), torch.zeros(3, 11), params, lr=0.1)


def _run_placements(variant: str, lrs: list[float]) -> dict[str, list[fetchsgd.FetchSGDUpdate]]:
    """The updates of both learning-rate placements on the same merged tables, round by round."""
    d = 3_000
    out = {}
    for placement in fetchsgd.LR_PLACEMENTS:
        # 3 x 200 buckets for 3,000 coordinates: estimates are far from exact, so agreement is not trivial
        params = fetchsgd.FetchSGDParams(
            d=d, rows=3, cols=200, seed=6, k=30, error_feedback=variant, lr_placement=placement
        )
        gen = torch.Generator().manual_seed(6)
        state, updates = fetchsgd.init(params), []
        for lr in lrs:
            state, update = fetchsgd.step(state, _sketch_table(torch.randn(d, generator=gen), params), params, lr)
            updates.append(update)
        out[placement] = updates
    return out


@pytest.mark.parametrize("variant", fetchsgd.VARIANTS)
def test_the_lr_placements_agree_at_a_constant_rate(variant: str) -> None:
    """``S_e += lr S_u`` (the paper) and ``S_e += S_u; w -= lr Delta`` (the reference code) agree at a fixed lr."""
    runs = _run_placements(variant, [0.05] * 8)
    for error, update in zip(runs["error"], runs["update"], strict=True):
        assert torch.equal(error.indices.sort().values, update.indices.sort().values)
        torch.testing.assert_close(error.dense(3_000), update.dense(3_000), rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(update.values, 0.05 * update.taken)


@pytest.mark.parametrize("variant", fetchsgd.VARIANTS)
def test_the_lr_placements_differ_under_a_schedule(variant: str) -> None:
    runs = _run_placements(variant, [0.1 * (1 - t / 8) for t in range(8)])
    gaps = [
        float((e.dense(3_000) - u.dense(3_000)).norm() / e.dense(3_000).norm())
        for e, u in zip(runs["error"], runs["update"], strict=True)
    ]
    assert gaps[0] < 1e-5  # nothing accumulated yet: the first round is the same
    assert max(gaps[1:]) > 0.05


def test_under_update_placement_leftover_error_is_applied_at_todays_rate() -> None:
    """k = 1, no momentum, exact recovery: round 1 leaves 2.0 in the error, round 2 (no gradient) applies it."""
    out = {}
    for placement in fetchsgd.LR_PLACEMENTS:
        params = fetchsgd.FetchSGDParams(
            d=2, rows=5, cols=1_000, seed=0, k=1, momentum=0.0, error_feedback="subtract", lr_placement=placement
        )
        first_table = _sketch_table(torch.tensor([3.0, 2.0]), params)
        state, first = fetchsgd.step(fetchsgd.init(params), first_table, params, 1.0)
        state, second = fetchsgd.step(state, _sketch_table(torch.zeros(2), params), params, 0.5)
        assert first.dense(2).tolist() == [3.0, 0.0]
        out[placement] = second.dense(2).tolist()
    assert out == {"error": [0.0, 2.0], "update": [0.0, 1.0]}


def test_the_error_feedback_variant_has_no_default_of_its_own() -> None:
    """The run's setting ``error-feedback`` holds the one default; the algorithm's parameters must be told."""
    with pytest.raises(TypeError, match="error_feedback"):
        fetchsgd.FetchSGDParams(d=10, rows=3, cols=10, seed=0, k=5)  # type: ignore[call-arg]


# against a float64 reference, and the edges -----------------------------------------------------------------


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
