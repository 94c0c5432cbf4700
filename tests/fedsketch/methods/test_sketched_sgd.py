"""Sketched-SGD's method binding without Flower: both phases' halves, the pending supports and the step, exactly.

Ivkin et al., NeurIPS 2019: a client zeroes ``u_i`` and ``v_i`` at its pending
support, accumulates ``u_i = rho u_i + g_i``, ``v_i += u_i`` and uploads the
sketch of ``v_i``; the server merges the example-weighted tables, asks for
``v_i`` at the ``P k`` largest estimates and applies the top-k of the answers'
example-weighted mean. Each test checks one half against a reference computed
here, with settings away from their defaults (k = 3, P = 2, momentum 0.5).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedsketch.algorithms import sketched_sgd
from fedsketch.compress.sparse import decode_support, encode_support
from fedsketch.config import RunConfig
from fedsketch.methods import ClientJob, ClientUpdate, Round
from fedsketch.methods import sketched_sgd as method
from fedsketch.settings.setting import ConfigError
from fedsketch.sketch.count_sketch import CountSketch

D = 60
CPU = torch.device("cpu")
SETTINGS = {
    "strategy": "sketched_sgd",
    "seed": 13,
    "sketch-rows": 5,
    "sketch-cols": 400,
    "k": 3,
    "candidate-factor": 2,
    "momentum": 0.5,
}
NO_ANSWER = "round 4: no client answered the second phase; model not updated"


def _cfg(**settings: object) -> RunConfig:
    return RunConfig.from_mapping({**SETTINGS, **settings})


def _randn(seed: int, n: int = D) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def _table(vec: torch.Tensor, rows: int = 5, cols: int = 400, seed: int = 13) -> np.ndarray:
    return CountSketch(D, rows, cols, seed=seed).accumulate(vec).table.numpy()


def test_the_run_settings_or_the_rounds_reach_the_algorithm() -> None:
    assert method.params(_cfg(), D) == sketched_sgd.SketchedSGDParams(D, 5, 400, 13, 3, 2, 0.5)
    rc = {"sketch-rows": 3, "sketch-cols": 77, "sketch-seed": 9}
    assert method.params(_cfg(), D, rc) == sketched_sgd.SketchedSGDParams(D, 3, 77, 9, 3, 2, 0.5)


def test_a_client_zeroes_its_pending_support_accumulates_and_sketches_with_the_rounds_settings() -> None:
    error, momentum, g = _randn(1), _randn(2), _randn(3)
    rc = {"sketch-rows": 3, "sketch-cols": 77, "sketch-seed": 9}  # the server's, not the client's stale config
    job = ClientJob(4, 2, rc, {"error": error, "momentum": momentum}, encode_support(torch.tensor([1, 5]), D))
    payload, kept = method.encode(g, job, _cfg(**{"sketch-rows": 4}))
    u, v = momentum.clone(), error.clone()
    u[[1, 5]] = 0.0
    v[[1, 5]] = 0.0
    u = 0.5 * u + g
    v = v + u
    assert set(kept) == {"error", "momentum"}
    assert torch.equal(kept["momentum"], u) and torch.equal(kept["error"], v)
    assert set(payload) == {"table"} and payload["table"].dtype == np.float32
    assert np.array_equal(payload["table"], _table(v, 3, 77, 9))


def test_a_client_without_momentum_keeps_only_its_error_and_nothing_pending_zeroes_nothing() -> None:
    error, g = _randn(1), _randn(3)
    cfg = _cfg(momentum=0.0)
    rc = method.round_config(cfg)
    payload, kept = method.encode(g, ClientJob(4, 2, rc, {"error": error}), cfg)
    assert set(kept) == {"error"} and torch.equal(kept["error"], error + g)
    assert np.array_equal(payload["table"], _table(error + g))
    first, kept = method.encode(g, ClientJob(4, 1, rc), _cfg())  # first time, with momentum: u = v = g
    assert torch.equal(kept["error"], g) and torch.equal(kept["momentum"], g)
    assert np.array_equal(first["table"], _table(g))


def test_a_kept_state_is_brought_to_the_updates_device() -> None:
    error, momentum = _randn(1), _randn(2)
    meta = torch.device("meta")
    state = method._client_state({"error": error, "momentum": momentum}, meta)
    assert state is not None and state.momentum is not None
    assert state.error.device.type == state.momentum.device.type == "meta"
    plain = method._client_state({"error": error}, CPU)
    assert plain is not None and plain.momentum is None and torch.equal(plain.error, error)
    assert method._client_state({}, CPU) is None and method._client_state({"momentum": momentum}, CPU) is None


def test_phase_two_answers_the_exact_float32_values_at_the_candidates() -> None:
    error = _randn(1).double()
    out, kept = method.answer({"error": error}, encode_support(torch.tensor([0, 7, 59]), D), _cfg())
    assert kept is None and set(out) == {"val"} and out["val"].dtype == np.float32
    assert np.array_equal(out["val"], error[[0, 7, 59]].float().numpy())


@pytest.mark.parametrize("state", [{}, {"momentum": torch.zeros(D)}])
def test_a_client_without_phase_one_state_cannot_answer(state: dict[str, torch.Tensor]) -> None:
    with pytest.raises(ValueError) as err:
        method.answer(state, encode_support(torch.tensor([1]), D), _cfg())
    assert str(err.value) == "no Sketched-SGD state for this client on this node"


def test_the_server_starts_with_nothing_pending_and_sends_each_returning_client_its_support() -> None:
    assert method.init(_cfg(), D, CPU) == sketched_sgd.ServerState() and not method.init(_cfg(), D, CPU).pending
    state = sketched_sgd.ServerState({1: torch.tensor([3, 7]), 4: torch.tensor([0, 59])})
    sent = method.requests(state, [4, 2, 1], _cfg(), D)
    assert list(sent) == [4, 1]
    assert torch.equal(decode_support(sent[4], D), torch.tensor([0, 59]))
    assert torch.equal(decode_support(sent[1], D), torch.tensor([3, 7]))
    assert all(set(p) == set(encode_support(torch.tensor([3, 7]), D)) for p in sent.values())


HEAVY_A, HEAVY_B = [2, 11, 20, 33, 41, 50], [5, 17, 26, 38, 44, 57]


def _updates() -> list[ClientUpdate]:
    """Client 5 (6 examples) is heavy at A, client 2 (1 example) three times heavier at B, client 0 (3) small:
    weighted by examples the candidates are A; unweighted they would be B."""
    vecs = {2: 0.01 * _randn(20), 0: 0.01 * _randn(21), 5: 0.01 * _randn(22)}
    vecs[5][HEAVY_A] += 10.0
    vecs[2][HEAVY_B] += 30.0
    return [ClientUpdate(cid, {"table": _table(vecs[cid])}, n, 0.0, 0) for cid, n in ((2, 1), (0, 3), (5, 6))]


def test_the_question_is_the_p_k_largest_estimates_of_the_weighted_merge() -> None:
    updates = _updates()
    query = method.ask(method.init(_cfg(), D, CPU), Round(4, 0.25, updates, D, CPU), _cfg())
    merged = torch.stack([torch.from_numpy(u.payload["table"]).double() * u.num_examples for u in updates]).sum(0) / 10
    expected = sketched_sgd.candidates(merged.float(), method.params(_cfg(), D))
    assert expected.tolist() == HEAVY_A
    assert query.cids == (2, 0, 5) and query.layout == {"val": ((6,), np.dtype(np.float32))}
    assert set(query.carry) == {"candidates"} and torch.equal(query.carry["candidates"], expected)
    assert set(query.payload) == set(encode_support(expected, D))
    assert torch.equal(decode_support(query.payload, D), expected)


def _answered_round(answers: dict[int, np.ndarray]) -> Round:
    updates = _updates()
    query = method.ask(method.init(_cfg(), D, CPU), Round(4, 0.25, updates, D, CPU), _cfg())
    replies = tuple(ClientUpdate(cid, {"val": val}, 0, 0.0, 0) for cid, val in answers.items())
    return Round(4, 0.25, updates, D, CPU, query, replies)


def test_the_step_applies_the_top_k_of_the_answers_weighted_mean() -> None:
    """Clients 0 and 5 answer (weights 3 and 6, their uploads' examples); client 9 was not asked. Client 2
    sketched and did not answer: its old support is dropped; client 7 did not take part: its support stays."""
    vals = {
        0: np.array([4.0, -9.0, 2.0, 0.5, 4.0, 0.0], np.float32),
        5: np.array([1.0, 3.0, -2.0, 0.5, -4.0, 6.0], np.float32),
    }
    rnd = _answered_round({**vals, 9: np.full(6, 100.0, np.float32)})
    old = sketched_sgd.ServerState({2: torch.tensor([1]), 7: torch.tensor([4, 8]), 0: torch.tensor([9])})
    state, delta = method.step(old, rnd, _cfg())
    exact = (3 * torch.from_numpy(vals[0]).double() + 6 * torch.from_numpy(vals[5]).double()) / 9
    # exact = [2, -1, -2/3, 0.5, -4/3, 4]: the top 3 magnitudes are candidates 5, 0 and 4
    cands = torch.tensor(HEAVY_A)
    expected = torch.zeros(D, dtype=torch.float64)
    expected[cands[[5, 0, 4]]] = 0.25 * exact[[5, 0, 4]]
    torch.testing.assert_close(delta.double(), expected, rtol=1e-6, atol=0)
    assert delta.dtype == torch.float32 and set(state.pending) == {7, 0, 5}
    assert torch.equal(state.pending[7], torch.tensor([4, 8]))
    assert sorted(state.pending[0].tolist()) == sorted(state.pending[5].tolist()) == [2, 41, 50]


def test_without_answers_the_model_stays_and_no_support_is_pending(caplog: pytest.LogCaptureFixture) -> None:
    rnd = _answered_round({9: np.full(6, 100.0, np.float32)})
    old = sketched_sgd.ServerState({2: torch.tensor([1]), 7: torch.tensor([4, 8])})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        state, delta = method.step(old, rnd, _cfg())
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [("flwr", logging.WARNING, NO_ANSWER)]
    assert torch.equal(delta, torch.zeros(D)) and set(state.pending) == {7}


def test_the_update_is_on_the_rounds_device() -> None:
    rnd = _answered_round({0: np.ones(6, np.float32)})
    _, delta = method.step(sketched_sgd.ServerState(), replace(rnd, device=torch.device("meta")), _cfg())
    assert delta.device.type == "meta" and delta.shape == (D,)


def test_the_step_needs_its_query() -> None:
    with pytest.raises(ValueError) as err:
        method.step(sketched_sgd.ServerState(), Round(4, 0.25, _updates(), D, CPU), _cfg())
    assert str(err.value) == "Sketched-SGD's step needs its query and the answers (Server.ask)"


def test_the_candidates_must_fit_the_model() -> None:
    method.check(_cfg(k=4), 8)  # 2 x 4 = 8 candidates: every parameter
    with pytest.raises(ConfigError) as err:
        method.check(_cfg(k=4), 7)
    assert str(err.value) == "setting 'candidate-factor' x 'k' (2 x 4) exceeds the model's 7 parameters"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_round_applies_cpu_candidates_and_a_cuda_client_zeroes_its_cpu_support() -> None:
    """The server's candidates and exact values are on the CPU, the round's update on CUDA; a client's update
    on CUDA meets its support decoded on the CPU. Both give what the CPU gives."""
    rnd = _answered_round({0: np.arange(6, dtype=np.float32)})
    _, on_cpu = method.step(sketched_sgd.ServerState(), rnd, _cfg())
    _, on_cuda = method.step(sketched_sgd.ServerState(), replace(rnd, device=torch.device("cuda")), _cfg())
    assert on_cuda.device.type == "cuda" and torch.equal(on_cuda.cpu(), on_cpu)
    error, momentum, g = _randn(1), _randn(2), _randn(3)
    rc, support = method.round_config(_cfg()), encode_support(torch.tensor([1, 5]), D)
    cpu_payload, cpu_kept = method.encode(
        g, ClientJob(4, 2, rc, {"error": error, "momentum": momentum}, support), _cfg()
    )
    payload, kept = method.encode(
        g.cuda(), ClientJob(4, 2, rc, {"error": error, "momentum": momentum}, support), _cfg()
    )
    assert kept["error"].device.type == kept["momentum"].device.type == "cuda"
    assert torch.equal(kept["error"].cpu(), cpu_kept["error"]) and torch.equal(
        kept["momentum"].cpu(), cpu_kept["momentum"]
    )
    np.testing.assert_allclose(payload["table"], cpu_payload["table"], rtol=1e-5, atol=1e-5)
