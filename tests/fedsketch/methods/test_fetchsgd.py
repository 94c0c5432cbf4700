"""FetchSGD's method binding without Flower: the client's table, the round settings, the server's merge and step.

Rothchild et al., ICML 2020: a Count Sketch is linear, so the example-weighted
mean of the clients' tables is the sketch of the example-weighted mean of their
gradients, and the server's step on the merged table is Algorithm 1's step on
that sketch. Every test here compares with a sketch built directly from the
gradients and with the algorithm's own step, with settings away from their
defaults so that a setting dropped on the way shows.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from fedsketch import wire
from fedsketch.algorithms import fetchsgd, fidelity
from fedsketch.config import RunConfig
from fedsketch.methods import ClientJob, ClientUpdate, Round
from fedsketch.methods import fetchsgd as method
from fedsketch.sketch.count_sketch import CountSketch

D = 3_000
SETTINGS = {
    "strategy": "fetchsgd",
    "seed": 13,
    "sketch-rows": 4,
    "sketch-cols": 150,
    "k": 25,
    "momentum": 0.5,
    "momentum-zeroing": False,
    "error-feedback": "subtract",
    "lr-placement": "update",
}


SHADOW_3_MIB = (
    "diagnose-sketch: the dense shadow keeps 2 x d float32 (3.0 MiB) on the server, and each round holds "
    "every client's dense update; none of it is counted as upload"
)


def _cfg(**settings: object) -> RunConfig:
    return RunConfig.from_mapping({**SETTINGS, **settings})


def _gradient(seed: int, d: int = D) -> torch.Tensor:
    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


def _sketch(vec: torch.Tensor, rows: int = 4, cols: int = 150, seed: int = 13) -> torch.Tensor:
    return CountSketch(vec.numel(), rows, cols, seed=seed).accumulate(vec).table.clone()


def test_the_run_settings_reach_the_algorithm() -> None:
    assert method.params(_cfg(), D) == fetchsgd.FetchSGDParams(
        d=D,
        rows=4,
        cols=150,
        seed=13,
        k=25,
        momentum=0.5,
        error_feedback="subtract",
        momentum_zeroing=False,
        lr_placement="update",
    )


def test_the_round_settings_are_the_sketch_the_clients_must_share() -> None:
    assert method.round_config(_cfg()) == {"sketch-seed": 13, "sketch-rows": 4, "sketch-cols": 150}


def test_a_client_sketches_with_the_round_settings_not_its_own() -> None:
    """A client whose own config is stale still uploads the sketch the server's round settings describe."""
    g = _gradient(1)
    stale = _cfg(seed=2, **{"sketch-rows": 3, "sketch-cols": 99})
    job = ClientJob(5, 1, method.round_config(_cfg()))
    payload, state = method.encode(g, job, stale)
    assert set(payload) == {"table"} and state == {}
    assert payload["table"].dtype == np.float32 and payload["table"].shape == (4, 150)
    assert np.array_equal(payload["table"], _sketch(g).numpy())


def test_the_layout_and_the_diagnostic_arrays() -> None:
    assert method.layout(_cfg(), D) == {"table": ((4, 150), np.dtype(np.float32))}
    assert method.diagnostic(_cfg(), D) is None
    assert method.diagnostic(_cfg(**{"diagnose-sketch": True}), D) == {
        wire.DIAGNOSTIC_UPDATE: ((D,), np.dtype(np.float32))
    }


def test_the_server_state_starts_at_zero_on_the_given_device() -> None:
    state = method.init(_cfg(), D, torch.device("meta"))
    assert isinstance(state, fetchsgd.FetchSGDState)
    assert state.error.shape == state.momentum.shape == (4, 150) and state.error.device.type == "meta"
    zero = method.init(_cfg(), D, torch.device("cpu"))
    assert isinstance(zero, fetchsgd.FetchSGDState)
    assert torch.equal(zero.error, torch.zeros(4, 150)) and torch.equal(zero.momentum, torch.zeros(4, 150))


def test_a_diagnosed_server_state_holds_a_dense_shadow_and_says_what_it_costs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    d = 3 * 2**17  # 8 d bytes = 3 MiB
    with caplog.at_level(logging.INFO, logger="flwr"):
        state = method.init(_cfg(**{"diagnose-sketch": True}), d, torch.device("meta"))
    assert isinstance(state, fidelity.FidelityState)
    assert state.sketched.error.shape == (4, 150) and state.shadow.error.shape == (d,)
    assert state.sketched.error.device.type == state.shadow.error.device.type == "meta"
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [("flwr", logging.INFO, SHADOW_3_MIB)]


def _updates(cfg: RunConfig, diagnose: bool = False) -> tuple[list[ClientUpdate], torch.Tensor]:
    """Three clients with 1, 3 and 6 examples; their uploads and the example-weighted mean of their gradients.

    Ten coordinates in a hundred are large in every gradient, so the sketch finds some of the true top-k, not all.
    """
    heavy = torch.zeros(D)
    heavy[::100][:10] = 20.0
    grads = [_gradient(10 + cid) * (1 + cid) + heavy for cid in range(3)]
    examples = [1, 3, 6]
    updates = []
    for cid, (g, n) in enumerate(zip(grads, examples, strict=True)):
        payload, _ = method.encode(g, ClientJob(cid, 1, method.round_config(cfg)), cfg)
        extra = {wire.DIAGNOSTIC_UPDATE: g.numpy()} if diagnose else None
        updates.append(ClientUpdate(cid, payload, n, 0.0, 0, diagnostic=extra))
    mean = sum((n / 10) * g.double() for g, n in zip(grads, examples, strict=True))
    return updates, mean.float()


def test_the_merged_table_is_the_sketch_of_the_example_weighted_mean() -> None:
    """Two rounds: the state and the update are Algorithm 1's on the sketch of the weighted mean gradient."""
    cfg = _cfg()
    p = method.params(cfg, D)
    state, want = method.init(cfg, D, torch.device("cpu")), fetchsgd.init(p)
    for rnd, lr in ((1, 0.3), (2, 0.7)):
        updates, mean = _updates(cfg)
        state, delta = method.step(state, Round(rnd, lr, updates, D, torch.device("cpu")), cfg)
        assert isinstance(state, fetchsgd.FetchSGDState)
        want, update = fetchsgd.step(want, _sketch(mean), p, lr)
        assert delta.shape == (D,) and torch.count_nonzero(delta) == 25
        torch.testing.assert_close(delta, update.dense(D), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(state.error, want.error, rtol=1e-4, atol=1e-4)  # sums in another order
        torch.testing.assert_close(state.momentum, want.momentum, rtol=1e-4, atol=1e-4)


def test_the_merge_is_made_in_the_state_dtype() -> None:
    """Tables that arrive as float64 (a secure-aggregation sum, say) are merged into the float32 state's dtype."""
    cfg = _cfg()
    updates, _ = _updates(cfg)
    wide = [replace(u, payload={"table": u.payload["table"].astype(np.float64)}) for u in updates]
    cpu = torch.device("cpu")
    state, delta = method.step(method.init(cfg, D, cpu), Round(1, 0.3, wide, D, cpu), cfg)
    assert isinstance(state, fetchsgd.FetchSGDState)
    assert state.error.dtype == state.momentum.dtype == delta.dtype == torch.float32


def test_a_diagnosed_step_is_the_same_step_measured_against_the_weighted_mean() -> None:
    cfg = _cfg(**{"diagnose-sketch": True})
    p = method.params(cfg, D)
    state, want = method.init(cfg, D, torch.device("cpu")), fidelity.init(p)
    updates, mean = _updates(cfg, diagnose=True)
    state, delta = method.step(state, Round(1, 0.3, updates, D, torch.device("cpu")), cfg)
    assert isinstance(state, fidelity.FidelityState)
    want, update, _ = fidelity.step(want, _sketch(mean), mean, p, 0.3)
    torch.testing.assert_close(delta, update.dense(D), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state.shadow.error, want.shadow.error, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state.sketched.error, want.sketched.error, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state.tally, want.tally, rtol=1e-4, atol=1e-6)
    state, row = method.report(state, cfg)
    _, rep = fidelity.report(want)
    assert row == {
        "sketch_recall": pytest.approx(rep.recall),
        "sketch_rel_error": pytest.approx(rep.rel_error),
        "sketch_state_drift": pytest.approx(rep.state_drift, abs=1e-6),  # float32 noise: about 1e-7
        "sketch_topk_mass": pytest.approx(rep.topk_mass),
        "sketch_rounds": 1,
    }
    assert 0 < row["sketch_recall"] < 1 and row["sketch_rel_error"] > 0
    assert isinstance(state, fidelity.FidelityState)
    assert torch.equal(state.tally, torch.zeros(len(fidelity.TALLY), dtype=torch.float64))  # the tally is emptied


def test_a_diagnosed_step_refuses_a_client_without_its_dense_update() -> None:
    cfg = _cfg(**{"diagnose-sketch": True})
    updates, _ = _updates(cfg, diagnose=True)
    updates[1] = ClientUpdate(1, updates[1].payload, 3, 0.0, 0)
    with pytest.raises(ValueError, match=r"^client 1 has no diagnostic arrays$"):
        method.step(method.init(cfg, D, torch.device("cpu")), Round(1, 0.3, updates, D, torch.device("cpu")), cfg)


def test_without_the_diagnostic_the_report_is_empty() -> None:
    cfg = _cfg()
    state = method.init(cfg, D, torch.device("cpu"))
    assert method.report(state, cfg) == (state, {})


def test_the_setting_not_the_states_type_picks_the_step_and_a_state_of_the_other_setting_is_refused() -> None:
    """``diagnose-sketch`` decides which step runs; a state made under the other setting is refused by name
    (step and report alike), never stepped as if it were the run's."""
    plain_cfg, diagnosed_cfg = _cfg(), _cfg(**{"diagnose-sketch": True})
    plain, diagnosed = (
        method.init(plain_cfg, D, torch.device("cpu")),
        method.init(diagnosed_cfg, D, torch.device("cpu")),
    )
    updates, _ = _updates(diagnosed_cfg, diagnose=True)
    rnd = Round(1, 0.3, updates, D, torch.device("cpu"))
    with pytest.raises(
        TypeError,
        match=r"^diagnose-sketch is true, so FetchSGD's server state should be a "
        r"FidelityState; got a FetchSGDState \(a state made under the other setting\)$",
    ):
        method.step(plain, rnd, diagnosed_cfg)
    with pytest.raises(
        TypeError, match=r"^diagnose-sketch is false, .* should be a FetchSGDState; got a FidelityState"
    ):
        method.step(diagnosed, rnd, plain_cfg)
    with pytest.raises(TypeError, match=r"should be a FidelityState; got a FetchSGDState"):
        method.report(plain, diagnosed_cfg)
    assert method.report(diagnosed, plain_cfg) == (diagnosed, {})  # no diagnostic asked for: nothing to report


def test_the_clipping_norm_is_the_tables_estimate_and_the_sensitivity_sqrt_rows() -> None:
    cfg = _cfg(**{"sketch-rows": 9, "sketch-cols": 2_000})
    g = _gradient(7)
    payload, _ = method.encode(g, ClientJob(0, 1, method.round_config(cfg)), cfg)
    want = CountSketch.from_table(torch.from_numpy(payload["table"]), D, 13).l2_estimate()
    assert method.sketch_norm(payload, D, 13) == want
    assert method.norm(ClientUpdate(0, payload, 4, 0.0, 0), cfg, D) == want
    assert want == pytest.approx(float(g.norm()), rel=0.1)
    assert method.sensitivity(cfg) == 3.0 and method.sensitivity(_cfg()) == 2.0
    assert math.sqrt(cfg.sketch_rows) == 3.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_client_on_cuda_sketches_on_its_own_device() -> None:
    """The client's sketch lives where its update does: a CPU sketch refuses a CUDA vector."""
    g = _gradient(1)
    payload, _ = method.encode(g.cuda(), ClientJob(0, 1, method.round_config(_cfg())), _cfg())
    torch.testing.assert_close(torch.from_numpy(payload["table"]), _sketch(g), rtol=1e-5, atol=1e-5)
