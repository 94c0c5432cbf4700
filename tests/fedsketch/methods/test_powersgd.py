"""PowerSGD's method binding without Flower: the warm start, both exchanges' halves and the server's step, exactly.

Vogels, Karimireddy and Jaggi, NeurIPS 2019: exchange 1 uploads ``P_i = M_i Q_hat``
with ``M_i = g_i + e_i``; the server orthogonalizes the example-weighted mean of the
``P_i``; exchange 2 uploads ``Q_i = M_i^T P_hat``, the client keeps
``e_i = M_i - P_hat Q_i^T``, and the model moves by momentum SGD on
``P_hat (sum_i w_i Q_i)^T`` and the whole tensors. Each test checks one half
against :mod:`fedsketch.algorithms.powersgd` or a float64 reference computed here,
with settings away from their defaults (rank 3, seed 13, momentum 0.5).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedsketch import wire
from fedsketch.algorithms import powersgd
from fedsketch.compress import derive_seed
from fedsketch.config import RunConfig
from fedsketch.methods import ClientJob, ClientUpdate, Round
from fedsketch.methods import powersgd as method
from fedsketch.methods.method import Query

CPU = torch.device("cpu")
F32 = np.dtype(np.float32)
NO_ANSWER = "round 4: no client answered PowerSGD's second exchange; its matrices are not updated"


def _cfg(**settings: object) -> RunConfig:
    base = {"strategy": "powersgd", "num-clients": 10, "clients-per-round": 3, "model-hidden": 16, "seed": 13}
    return RunConfig.from_mapping({**base, "momentum": 0.5, "powersgd-rank": 3, **settings})


CFG = _cfg()
PLAN = method.plan(CFG)
D = sum(b.size for b in PLAN.blocks)


def _randn(seed: int, n: int = D, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_the_plan_is_the_models_at_the_runs_rank() -> None:
    assert PLAN.blocks[0].rank == 3 and any(b.rank == 0 for b in PLAN.blocks)
    assert method.layout(CFG, D) == {"p": ((PLAN.p_size,), F32), "whole": ((PLAN.whole_size,), F32)}
    assert method.layout(CFG, D, 5) == method.layout(CFG, D)


def test_the_server_starts_at_zero_velocity_and_the_runs_seeded_warm_start() -> None:
    state = method.init(CFG, D, torch.device("meta"))
    assert state.velocity.shape == (D,) and state.velocity.device.type == "meta"
    assert state.velocity.dtype == torch.float32
    assert torch.equal(method.init(CFG, D, CPU).velocity, torch.zeros(D))
    assert torch.equal(state.q, powersgd.initial_q(PLAN, derive_seed(13, 0x9051)))
    assert not torch.equal(state.q, method.init(_cfg(seed=14), D, CPU).q)


def test_every_sampled_client_and_a_new_node_get_the_orthogonalized_warm_start() -> None:
    state = method.PowerSGDState(torch.zeros(D), _randn(3, PLAN.q_size))
    sent = method.requests(state, [4, wire.NEW_CLIENT, 0], CFG, D)
    expected = powersgd.orthogonalize_all(state.q, PLAN, "q").numpy()
    assert list(sent) == [4, wire.NEW_CLIENT, 0]
    assert all(set(r) == {"q"} and np.array_equal(r["q"], expected) for r in sent.values())
    assert method.requests(state, [], CFG, D) == {}


def test_exchange_one_projects_update_plus_error_on_the_warm_start_in_float32() -> None:
    """A float64 error and a float64 warm start are brought to the update's float32."""
    update, error, q64 = _randn(1), _randn(2, dtype=torch.float64), _randn(3, PLAN.q_size, torch.float64)
    job = ClientJob(4, 2, {}, {"error": error}, {"q": q64.numpy()})
    payload, kept = method.encode(update, job, CFG)
    target = update + error.float()
    assert set(payload) == {"p", "whole"} and payload["p"].dtype == payload["whole"].dtype == F32
    assert np.array_equal(payload["p"], powersgd.project(target, q64.float(), PLAN).numpy())
    assert np.array_equal(payload["whole"], powersgd.whole(target, PLAN).numpy())
    assert set(kept) == {"target"} and kept["target"].dtype == torch.float32 and torch.equal(kept["target"], target)
    first, kept = method.encode(update, ClientJob(4, 1, {}, {}, {"q": q64.numpy()}), CFG)  # no error yet
    assert torch.equal(kept["target"], update)
    assert np.array_equal(first["p"], powersgd.project(update, q64.float(), PLAN).numpy())


def test_exchange_two_back_projects_and_keeps_what_was_not_sent() -> None:
    target, p64 = _randn(1), _randn(4, PLAN.p_size, torch.float64)
    out, kept = method.answer({"target": target}, {"p": p64.numpy()}, CFG)
    p_hat = p64.float()
    q = powersgd.back_project(target, p_hat, PLAN)
    assert set(out) == {"q"} and out["q"].dtype == F32 and np.array_equal(out["q"], q.numpy())
    assert kept is not None and set(kept) == {"error"}
    assert torch.equal(kept["error"], powersgd.residual(target, p_hat, q, PLAN))


@pytest.mark.parametrize("state", [{}, {"error": torch.zeros(D)}])
def test_a_client_without_exchange_one_state_cannot_answer(state: dict[str, torch.Tensor]) -> None:
    with pytest.raises(ValueError) as err:
        method.answer(state, {"p": np.zeros(PLAN.p_size, np.float32)}, CFG)
    assert str(err.value) == "no PowerSGD exchange-1 state for this client on this node"


def _updates() -> list[ClientUpdate]:
    """Clients 2, 0 and 5 with 1, 3 and 6 examples."""
    return [
        ClientUpdate(
            cid,
            {"p": _randn(10 + cid, PLAN.p_size).numpy(), "whole": _randn(20 + cid, PLAN.whole_size).numpy()},
            n,
            0.0,
            0,
        )
        for cid, n in ((2, 1), (0, 3), (5, 6))
    ]


def _mean64(arrays: list[np.ndarray], weights: list[int]) -> torch.Tensor:
    return torch.stack([torch.from_numpy(a).double() * w for a, w in zip(arrays, weights, strict=True)]).sum(0) / sum(
        weights
    )


def test_the_question_is_the_orthogonalized_weighted_mean_of_the_ps() -> None:
    updates = _updates()
    state = method.init(CFG, D, CPU)
    query = method.ask(state, Round(4, 0.25, updates, D, CPU), CFG)
    weights = [u.num_examples for u in updates]
    p_mean = _mean64([u.payload["p"] for u in updates], weights)
    p_hat = powersgd.orthogonalize_all(p_mean, PLAN, "p")
    assert query.cids == (2, 0, 5) and query.layout == {"q": ((PLAN.q_size,), F32)}
    assert set(query.payload) == {"p"} and query.payload["p"].dtype == F32
    assert set(query.carry) == {"p_hat", "whole"}
    np.testing.assert_allclose(query.payload["p"], p_hat.numpy(), rtol=0, atol=1e-5)
    assert np.array_equal(query.payload["p"], query.carry["p_hat"].numpy())
    whole = _mean64([u.payload["whole"] for u in updates], weights)
    torch.testing.assert_close(query.carry["whole"].double(), whole, rtol=1e-6, atol=1e-7)


def test_the_step_applies_p_hat_times_the_answers_weighted_mean_q_with_momentum() -> None:
    """Answers from clients 0 and 5 weigh 3 and 6 (their uploads' examples, not the answers'); client 9 was
    not asked and its answer is ignored; the mean Q is the next warm start."""
    updates = _updates()
    state = method.PowerSGDState(_randn(30), _randn(31, PLAN.q_size))
    rnd = Round(4, 0.25, updates, D, CPU)
    query = method.ask(state, rnd, CFG)
    qs = {cid: _randn(40 + cid, PLAN.q_size).numpy() for cid in (0, 5, 9)}
    answers = tuple(ClientUpdate(cid, {"q": qs[cid]}, 0, 0.0, 0) for cid in (0, 5, 9))
    new, delta = method.step(state, replace(rnd, query=query, answers=answers), CFG)
    q = _mean64([qs[0], qs[5]], [3, 6])
    g = powersgd.expand(query.carry["p_hat"].double(), q, query.carry["whole"].double(), PLAN, D)
    velocity = 0.5 * state.velocity.double() + g
    torch.testing.assert_close(new.q.double(), q, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(new.velocity.double(), velocity, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(delta.double(), 0.25 * velocity, rtol=1e-5, atol=1e-6)


def test_without_answers_the_matrices_stay_and_the_warm_start_is_kept(caplog: pytest.LogCaptureFixture) -> None:
    updates = _updates()
    state = method.PowerSGDState(_randn(30), _randn(31, PLAN.q_size))
    rnd = Round(4, 0.25, updates, D, CPU)
    query = method.ask(state, rnd, CFG)
    lost = (ClientUpdate(9, {"q": _randn(49, PLAN.q_size).numpy()}, 7, 0.0, 0),)  # not asked: no answer counts
    with caplog.at_level(logging.WARNING, logger="flwr"):
        new, delta = method.step(state, replace(rnd, query=query, answers=lost), CFG)
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [("flwr", logging.WARNING, NO_ANSWER)]
    assert new.q is state.q
    g = powersgd.expand(query.carry["p_hat"], torch.zeros(PLAN.q_size), query.carry["whole"], PLAN, D)
    assert torch.equal(delta, 0.25 * (0.5 * state.velocity + g))
    for b in PLAN.blocks:  # compressed blocks move by momentum alone
        if b.rank:
            part = slice(b.start, b.start + b.size)
            assert torch.equal(delta[part], 0.25 * 0.5 * state.velocity[part])


def test_the_step_needs_its_query() -> None:
    with pytest.raises(ValueError) as err:
        method.step(method.init(CFG, D, CPU), Round(4, 0.25, _updates(), D, CPU), CFG)
    assert str(err.value) == "PowerSGD's step needs its query and the answers (Server.ask)"


def test_the_update_lands_on_the_rounds_device() -> None:
    """The factors and answers arrive on the CPU; the velocity lives on the round's device (meta here)."""
    meta = torch.device("meta")
    state = method.PowerSGDState(torch.zeros(D, device=meta), _randn(31, PLAN.q_size))
    carry = {"p_hat": _randn(32, PLAN.p_size), "whole": _randn(33, PLAN.whole_size)}
    query = Query((0,), {}, {}, carry)
    answers = (ClientUpdate(0, {"q": _randn(40, PLAN.q_size).numpy()}, 0, 0.0, 0),)
    rnd = Round(4, 0.25, [ClientUpdate(0, {}, 3, 0.0, 0)], D, meta, query, answers)
    new, delta = method.step(state, rnd, CFG)
    assert delta.device.type == new.velocity.device.type == "meta" and delta.shape == (D,)
