"""Sketched-SGD's two phases: their properties, bounds and messages, and where a client's tables live.

Ivkin et al., NeurIPS 2019, Algorithm 2. The second part (bounds and messages, a client without
momentum, where a client's tables live) pins what the property tests pass through
without checking (docs/mutation.md, the algorithms' section).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from fedsketch import CountSketch
from fedsketch.algorithms import sketched_sgd
from fedsketch.compress.sparse import encode_support
from fedsketch.config import RunConfig
from fedsketch.methods import ClientJob, ClientUpdate, Round
from fedsketch.methods.sketched_sgd import METHOD, answer

D = 2_000


def params(k: int = 20, cols: int = 100_000, momentum: float = 0.0) -> sketched_sgd.SketchedSGDParams:
    return sketched_sgd.SketchedSGDParams(d=D, rows=5, cols=cols, seed=4, k=k, candidate_factor=3, momentum=momentum)


def grads(n: int, seed: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(D, generator=gen) * (torch.rand(D, generator=gen) < 0.05) for _ in range(n)]


def test_second_phase_returns_the_exact_values_of_the_clients_error() -> None:
    """Whatever the sketch estimates, phase 2 reads ``v_i`` itself, bit for bit."""
    cfg = RunConfig.from_mapping({"strategy": "sketched_sgd", "k": 10, "momentum": 0.9, "candidate-factor": 3})
    rc = {"sketch-seed": 4, "sketch-rows": 3, "sketch-cols": 50}  # a poor sketch on purpose
    g = grads(1, 0)[0]
    _, state = METHOD.client.encode(g, ClientJob(0, 1, rc), cfg)
    cands = torch.tensor([3, 17, 999, 1500])
    values, _ = answer(state, encode_support(cands, D), cfg)
    assert torch.equal(torch.from_numpy(values["val"]), state["error"][cands])
    assert torch.equal(state["error"], g)  # first round, zero momentum before: v = u = g


def test_candidates_contain_the_true_top_k_and_the_update_is_exact() -> None:
    """With a sketch large enough, the top-k of the exact sums is the top-k of sum_i p_i v_i."""
    p = params()
    clients = grads(4, 1)
    states, tables = [], []
    for g in clients:
        state, table = sketched_sgd.client_step(None, g, p)
        states.append(state)
        tables.append(table)
    merged = sum(0.25 * t for t in tables)
    cands = sketched_sgd.candidates(torch.as_tensor(merged), p)
    assert cands.numel() == 60 and torch.equal(cands, torch.sort(cands).values)
    exact = sum(0.25 * sketched_sgd.client_answer(s, cands) for s in states)
    _, idx, vals = sketched_sgd.server_step(sketched_sgd.ServerState(), p, cands, torch.as_tensor(exact), [], [])
    truth = sum(0.25 * g for g in clients)
    top = torch.topk(truth.abs(), p.k).indices
    assert set(idx.tolist()) == set(top.tolist())
    torch.testing.assert_close(vals, truth[idx], rtol=0, atol=1e-6)


def test_error_accumulation_conserves_mass_over_rounds() -> None:
    """Every client takes part: applied updates plus the clients' remaining error equal the sum of updates.

    That holds whichever coordinates are applied, so each round's update is also
    checked to be the top-k of the exact sums among the P * k largest estimates.
    """
    p = params(k=15, cols=500)  # a small sketch: candidates are approximate, conservation still exact
    server = sketched_sgd.ServerState()
    states: dict[int, sketched_sgd.ClientState | None] = dict.fromkeys(range(3))
    applied, total = torch.zeros(D, dtype=torch.float64), torch.zeros(D, dtype=torch.float64)
    for rnd in range(6):
        tables = []
        for cid, g in enumerate(grads(3, 10 + rnd)):
            pending = server.pending.get(cid)
            states[cid], table = sketched_sgd.client_step(states[cid], g, p, pending)
            tables.append(table)
            total += g.double() / 3
        merged = torch.as_tensor(sum(t / 3 for t in tables))
        cands = sketched_sgd.candidates(merged, p)
        estimates = CountSketch.from_table(merged, D, p.seed).estimate()
        largest = torch.sort(estimates.abs(), descending=True, stable=True).indices[: p.num_candidates]
        assert torch.equal(cands, largest.sort().values)
        exact = torch.as_tensor(sum(sketched_sgd.client_answer(s, cands) / 3 for s in states.values() if s is not None))
        server, idx, vals = sketched_sgd.server_step(server, p, cands, exact, [0, 1, 2], [0, 1, 2])
        top = torch.topk(exact.abs(), p.k).indices
        assert torch.equal(idx.sort().values, cands[top].sort().values)
        assert sorted(vals.tolist()) == sorted(exact[top].tolist())
        applied[idx] += vals.double()
    remaining = torch.zeros(D, dtype=torch.float64)
    for cid, s in states.items():
        assert s is not None
        error = s.error.clone()
        error[server.pending[cid]] = 0.0  # what each client zeroes when it next takes part
        remaining += error.double() / 3
    torch.testing.assert_close(applied + remaining, total, rtol=0, atol=1e-5)


def test_pending_support_is_zeroed_before_accumulating_momentum_and_error() -> None:
    p = params(momentum=0.5)
    g = torch.ones(D)
    state, _ = sketched_sgd.client_step(None, g, p)
    applied = torch.tensor([0, 5])
    state, _ = sketched_sgd.client_step(state, g, p, applied)
    assert state.momentum is not None
    assert state.momentum[0] == 1.0 and state.momentum[1] == 1.5  # zeroed then 0.5 * 0 + 1, vs 0.5 * 1 + 1
    assert state.error[5] == 1.0 and state.error[6] == 2.5  # zeroed then + u, vs 1 + 1.5


def test_server_keeps_pending_supports_per_client() -> None:
    p = params(k=2)
    old = sketched_sgd.ServerState(pending={1: torch.tensor([7]), 2: torch.tensor([8])})
    cands = torch.tensor([1, 4, 9])
    state, idx, vals = sketched_sgd.server_step(old, p, cands, torch.tensor([0.5, -3.0, 2.0]), [1, 3], [3])
    assert sorted(idx.tolist()) == [4, 9] and sorted(vals.tolist()) == [-3.0, 2.0]
    assert set(state.pending) == {2, 3}  # 1 applied its old support and did not answer; 3 answered
    assert torch.equal(state.pending[2], torch.tensor([8]))


def test_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="candidate_factor \\* k must be in 1..d=2000"):
        sketched_sgd.SketchedSGDParams(d=D, rows=5, cols=10, seed=0, k=1000, candidate_factor=3)
    with pytest.raises(ValueError, match="no Sketched-SGD state"):
        answer({}, encode_support(torch.tensor([1]), D), RunConfig.from_mapping({"strategy": "sketched_sgd"}))


def test_the_methods_two_halves_run_without_a_round_loop() -> None:
    """``ask`` names every client and the candidates; ``step`` applies the top-k of the answering clients'
    example-weighted mean of ``v_i`` there, and leaves pending supports only for the clients that answered."""
    cfg = RunConfig.from_mapping(
        {"strategy": "sketched_sgd", "k": 10, "momentum": 0.0, "sketch-rows": 5, "sketch-cols": 20_000}
    )
    rc = METHOD.wire.round_config(cfg)
    kept, updates = {}, []
    for cid, (g, n) in enumerate(zip(grads(3, 7), (10, 30, 20))):
        payload, kept[cid] = METHOD.client.encode(g, ClientJob(cid, 1, rc), cfg)
        updates.append(ClientUpdate(cid, payload, n, 0.0, 0))
    rnd = Round(1, 0.5, updates, D, torch.device("cpu"))
    state = METHOD.server.init(cfg, D, torch.device("cpu"))
    assert METHOD.server.ask is not None
    query = METHOD.server.ask(state, rnd, cfg)
    cands = query.carry["candidates"]
    assert query.cids == (0, 1, 2) and query.layout == {"val": ((cands.numel(),), np.dtype(np.float32))}
    answers = tuple(ClientUpdate(c, answer(kept[c], query.payload, cfg)[0], 0, 0.0, 0) for c in (0, 2))  # 1 is lost
    state, delta = METHOD.server.step(state, replace(rnd, query=query, answers=answers), cfg)
    exact = (10 * kept[0]["error"][cands] + 20 * kept[2]["error"][cands]) / 30
    top = torch.topk(exact.abs(), 10).indices
    expected = torch.zeros(D)
    expected[cands[top]] = 0.5 * exact[top]
    torch.testing.assert_close(delta, expected, rtol=1e-6, atol=1e-7)
    assert set(state.pending) == {0, 2} and torch.equal(state.pending[0].sort().values, cands[top].sort().values)
    with pytest.raises(ValueError, match="needs its query"):
        METHOD.server.step(state, rnd, cfg)


# bounds and messages, a client without momentum, where the tables live --------------------------------------


D_SMALL = 12


def _params(k: int, factor: int, momentum: float = 0.0) -> sketched_sgd.SketchedSGDParams:
    return sketched_sgd.SketchedSGDParams(
        d=D_SMALL, rows=3, cols=D_SMALL, seed=1, k=k, candidate_factor=factor, momentum=momentum
    )


def test_k_and_the_candidates_may_be_1_or_d() -> None:
    assert _params(1, 1).num_candidates == 1
    assert _params(D_SMALL, 1).num_candidates == D_SMALL
    assert _params(4, 3).num_candidates == D_SMALL


@pytest.mark.parametrize(
    ("k", "factor", "message"),
    [
        (0, 3, rf"^k must be in 1\.\.d={D_SMALL}; got 0$"),
        (D_SMALL + 1, 1, rf"^k must be in 1\.\.d={D_SMALL}; got {D_SMALL + 1}$"),
        (5, 3, rf"^candidate_factor \* k must be in 1\.\.d={D_SMALL}; got 15$"),
        (1, 0, rf"^candidate_factor \* k must be in 1\.\.d={D_SMALL}; got 0$"),
    ],
)
def test_out_of_range_sizes_are_refused_with_their_message(k: int, factor: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _params(k, factor)


def test_momentum_below_one_is_accepted_and_one_or_more_refused_with_its_message() -> None:
    assert _params(1, 1, momentum=1 - 2**-20).momentum == 1 - 2**-20
    for rho in (1.0, 1.5):
        with pytest.raises(ValueError, match=rf"^momentum must be in \[0, 1\); got {rho}$"):
            _params(1, 1, momentum=rho)


def test_a_client_without_momentum_keeps_none_and_accumulates_the_raw_updates() -> None:
    """``momentum = 0``: the client keeps no ``u_i`` (ClientState's documented None) and ``v_i`` sums the updates."""
    p = _params(2, 2)
    g = torch.arange(1.0, D_SMALL + 1)
    state, _ = sketched_sgd.client_step(None, g, p)
    assert state.momentum is None and torch.equal(state.error, g)
    state, _ = sketched_sgd.client_step(state, g, p, torch.tensor([0, 3]))
    assert state.momentum is None
    expected = 2 * g
    expected[[0, 3]] = g[[0, 3]]
    assert torch.equal(state.error, expected)
    with_momentum, _ = sketched_sgd.client_step(None, g, _params(2, 2, momentum=0.5))
    assert with_momentum.momentum is not None and torch.equal(with_momentum.momentum, g)


def test_exact_values_of_the_wrong_shape_are_refused_with_both_shapes() -> None:
    cands = torch.tensor([1, 4, 9])
    with pytest.raises(ValueError, match=r"^exact values have shape \(2,\); candidates \(3,\)$"):
        sketched_sgd.server_step(sketched_sgd.ServerState(), _params(2, 1), cands, torch.zeros(2), [], [])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_client_on_cuda_sketches_on_cuda_and_answers_cuda_candidates_from_a_cpu_state() -> None:
    p = _params(2, 2, momentum=0.5)
    g = torch.arange(1.0, D_SMALL + 1, device="cuda")
    state, table = sketched_sgd.client_step(None, g, p)
    assert table.device.type == state.error.device.type == "cuda"
    cpu_state, cpu_table = sketched_sgd.client_step(None, g.cpu(), p)
    assert torch.equal(table.cpu(), cpu_table)
    values = sketched_sgd.client_answer(cpu_state, torch.tensor([0, 5], device="cuda"))
    assert values.device.type == "cpu" and values.tolist() == [1.0, 6.0]
