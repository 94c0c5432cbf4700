"""A cohort's clients, run in one call, are each their own: examples, loss, payload, state and failure.

Direct calls of :func:`run_cohort` and :func:`answer_queries` on the synthetic data set (six clients, a tiny
MLP), one client at a time and vectorized, checked against each client's own :func:`local_update`.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fedsketch import wire
from fedsketch.client import cohort
from fedsketch.client.cohort import (
    EXAMPLES,
    ClientOutcome,
    _scratch_model,
    _vectorizable_model,
    answer_queries,
    run_cohort,
)
from fedsketch.compress.sparse import encode_support
from fedsketch.config import RunConfig
from fedsketch.data.run import load_data
from fedsketch.methods import ClientJob
from fedsketch.methods.fetchsgd import encode as sketch_encode
from fedsketch.model.flat import get_flat
from fedsketch.task import local_spec, make_model
from fedsketch.training.local import LocalResult, client_generator, local_update

BASE: dict[str, Any] = {"num-clients": 6, "clients-per-round": 3, "model-hidden": 8, "local-batch-size": 100}
"""Clients of 121, 101, 64, 87, 780 and 78 samples: batch lengths 100, 100, 64, 87, 100 and 78."""
DELTA = {**BASE, "strategy": "fedavg", "client-update": "delta", "local-steps": 2, "client-lr": 0.1}
SKETCH = {"sketch-seed": 3, "sketch-rows": 3, "sketch-cols": 50}
CIDS = [0, 2, 5, 1, 3]
BAD = "ValueError: client id 99 out of range: synthetic(0.5,0.5) has 6 clients (0..5)"


def _cfg(settings: dict[str, Any], batching: int = 0, **more: Any) -> RunConfig:
    return RunConfig.from_mapping({**settings, "client-batching": batching, **more})


def _weights(cfg: RunConfig) -> np.ndarray:
    d = get_flat(make_model(cfg, load_data(cfg))).numel()
    return np.random.default_rng(0).normal(0, 0.1, d).astype(np.float32)


def _own(cfg: RunConfig, weights: np.ndarray, cid: int, server_round: int = 2) -> LocalResult:
    """The client's own local result, computed alone on a fresh model."""
    x, y = load_data(cfg).client_data(cid)
    model = make_model(cfg, load_data(cfg))
    gen = client_generator(cfg.seed, server_round, cid)
    return local_update(model, torch.from_numpy(weights), x, y, local_spec(cfg), gen)


def _timed(cfg: RunConfig, weights: np.ndarray, jobs: list[ClientJob]) -> tuple[list[ClientOutcome], float]:
    start = time.perf_counter()
    outcomes = run_cohort(cfg, weights, jobs)
    return outcomes, time.perf_counter() - start


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "fedsketch.client.cohort" and r.levelno == logging.WARNING
    ]


def _check_seconds(outcomes: list[ClientOutcome], wall: float) -> None:
    """Each client is charged some time, and the charges add up to at most the call's."""
    charged = [o.compute_s for o in outcomes if o.error is None]
    assert all(s > 0 for s in charged) and sum(charged) <= wall


@pytest.mark.parametrize("batching", [0, 2, 4])
@pytest.mark.parametrize("mode", ["delta", "gradient"])
def test_each_client_of_a_cohort_uploads_its_own_update_count_and_loss(
    batching: int, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Dense uploads (fedavg), one at a time or vectorized in chunks: each payload is the client's own update."""
    cfg = _cfg({**DELTA, "client-update": mode, "weight-decay": 0.01}, batching)
    weights = _weights(cfg)
    with caplog.at_level(logging.WARNING):
        outcomes, wall = _timed(cfg, weights, [ClientJob(cid, 2) for cid in CIDS])
    assert _warnings(caplog) == []  # nothing fell back
    assert [o.cid for o in outcomes] == CIDS
    for o in outcomes:
        own = _own(cfg, weights, o.cid)
        assert o.error is None and o.payload is not None and o.state is None and o.diagnostic is None
        n = len(load_data(cfg).client_data(o.cid)[1])
        assert o.num_examples == own.num_examples == (n if mode == "delta" else min(n, 100))
        tol = {"rtol": 0, "atol": 0} if not batching else {"rtol": 1e-4, "atol": 1e-6}
        np.testing.assert_allclose(o.payload["update"], own.update.numpy(), **tol)
        assert o.loss == pytest.approx(own.loss, rel=1e-5 if batching else 0)
    _check_seconds(outcomes, wall)


@pytest.mark.parametrize(
    ("settings", "batching", "charged"),
    [
        (DELTA, 0, [2.0] * 5),
        ({**BASE, "strategy": "fetchsgd", "sketch-rows": 3, "sketch-cols": 50}, 4, [0.5] * 4 + [2.0]),
    ],
    ids=["one-at-a-time", "chunks-of-4"],
)
def test_each_client_is_charged_its_training_and_its_encoding(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any], batching: int, charged: list[float]
) -> None:
    """On a clock that ticks once per reading: a client computed alone is charged one tick for its training and
    one for its encoding; a chunk computed together (vectorized training, one ``encode_many``) shares each
    call's tick equally. The fifth client is a chunk of one: alone."""
    ticks = itertools.count()
    monkeypatch.setattr(cohort, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    cfg = _cfg(settings, batching)
    outcomes = run_cohort(cfg, _weights(cfg), [ClientJob(cid, 2, SKETCH) for cid in CIDS])
    assert [o.error for o in outcomes] == [None] * 5 and [o.compute_s for o in outcomes] == charged


def test_a_cohort_computes_in_float32_whatever_the_weights_it_is_handed() -> None:
    """Weights handed over as float64 (a user's own arrays) give the same float32 uploads as float32 weights."""
    cfg = _cfg({**DELTA, "client-update": "gradient", "weight-decay": 0.01})
    weights = _weights(cfg)
    jobs = [ClientJob(cid, 2) for cid in CIDS]
    single, double = run_cohort(cfg, weights, jobs), run_cohort(cfg, weights.astype(np.float64), jobs)
    for a, b in zip(single, double, strict=True):
        assert a.payload is not None and b.payload is not None and b.payload["update"].dtype == np.float32
        assert np.array_equal(a.payload["update"], b.payload["update"]) and a.loss == b.loss


@pytest.mark.parametrize("batching", [0, 3])
def test_a_client_that_cannot_load_fails_alone_and_by_name(batching: int) -> None:
    cfg = _cfg(DELTA, batching)
    weights = _weights(cfg)
    good = run_cohort(cfg, weights, [ClientJob(cid, 2) for cid in (0, 5)])
    outcomes = run_cohort(cfg, weights, [ClientJob(cid, 2) for cid in (0, 99, 5)])
    assert [o.cid for o in outcomes] == [0, 99, 5]
    failed = outcomes[1]
    assert (failed.error, failed.payload, failed.num_examples, failed.state) == (BAD, None, 0, None)
    assert math.isnan(failed.loss) and failed.compute_s == 0.0
    for o, g in zip([outcomes[0], outcomes[2]], good, strict=True):
        assert o.error is None and o.num_examples == g.num_examples and o.loss == g.loss
        np.testing.assert_array_equal(o.payload["update"], g.payload["update"])  # type: ignore[index]


def test_a_cohort_of_only_failed_clients_reports_each() -> None:
    cfg = _cfg(DELTA, 2)
    outcomes = run_cohort(cfg, _weights(cfg), [ClientJob(99, 2), ClientJob(-1, 2)])
    assert [o.error for o in outcomes] == [BAD, BAD.replace("99", "-1")]


@pytest.mark.parametrize("batching", [0, 2])
def test_a_client_whose_encode_fails_fails_alone_and_the_others_send_their_sketches(
    batching: int, caplog: pytest.LogCaptureFixture
) -> None:
    """FetchSGD: two clients' round configs lack the sketch's width; the others' tables are their own updates'.

    In chunks of 2, (0, 2) are encoded together, which fails and is said once, then one at a time; (5, 1) together;
    3, alone in its chunk, is encoded on its own: its failure is no batch's.
    """
    cfg = _cfg(BASE, batching)
    weights = _weights(cfg)
    broken = {k: v for k, v in SKETCH.items() if k != "sketch-cols"}
    cids = [0, 2, 5, 1, 3]
    jobs = [ClientJob(cid, 2, broken if cid in (2, 3) else SKETCH) for cid in cids]
    with caplog.at_level(logging.WARNING):
        outcomes, wall = _timed(cfg, weights, jobs)
    fallback = "client-batching: the batched encode failed (KeyError: 'sketch-cols'); one client at a time"
    assert _warnings(caplog) == ([fallback] if batching else [])
    assert [o.cid for o in outcomes] == cids
    for o in outcomes:
        if o.cid in (2, 3):
            assert (o.error, o.payload, o.num_examples) == ("KeyError: 'sketch-cols'", None, 0)
            continue
        own = _own(cfg, weights, o.cid)
        table = sketch_encode(own.update, ClientJob(o.cid, 2, SKETCH), cfg)[0]["table"]
        assert o.error is None and o.payload is not None and o.payload["table"].shape == (3, 50)
        np.testing.assert_allclose(o.payload["table"], table, rtol=1e-4, atol=1e-6)
        assert o.num_examples == own.num_examples and o.state is None
    _check_seconds(outcomes, wall)


@pytest.mark.parametrize("batching", [0, 2])
def test_a_vectorized_chunk_encodes_each_clients_own_sketch(batching: int, caplog: pytest.LogCaptureFixture) -> None:
    """Two or more clients of a chunk encoded together: each table is its own update's, charged its share."""
    cfg = _cfg(BASE, batching)
    weights = _weights(cfg)
    jobs = [ClientJob(cid, 2, SKETCH) for cid in CIDS]
    with caplog.at_level(logging.WARNING):
        outcomes, wall = _timed(cfg, weights, jobs)
    assert _warnings(caplog) == []
    for o in outcomes:
        own = _own(cfg, weights, o.cid)
        table = sketch_encode(own.update, ClientJob(o.cid, 2, SKETCH), cfg)[0]["table"]
        np.testing.assert_allclose(o.payload["table"], table, rtol=1e-4, atol=1e-6)  # type: ignore[index]
        assert o.num_examples == own.num_examples
    assert not np.allclose(outcomes[0].payload["table"], outcomes[1].payload["table"])  # type: ignore[index]
    _check_seconds(outcomes, wall)


@pytest.mark.parametrize("batching", [0, 2])
def test_with_diagnose_sketch_each_client_sends_its_own_dense_update_beside_its_sketch(batching: int) -> None:
    cfg = _cfg(BASE, batching, **{"diagnose-sketch": True})
    weights = _weights(cfg)
    outcomes = run_cohort(cfg, weights, [ClientJob(cid, 2, SKETCH) for cid in CIDS[:3]])
    for o in outcomes:
        own = _own(cfg, weights, o.cid)
        assert o.diagnostic is not None and set(o.diagnostic) == {wire.DIAGNOSTIC_UPDATE}
        dense = o.diagnostic[wire.DIAGNOSTIC_UPDATE]
        assert dense.dtype == np.float32
        np.testing.assert_allclose(dense, own.update.numpy(), rtol=1e-4, atol=1e-6)
        table = sketch_encode(own.update, ClientJob(o.cid, 2, SKETCH), cfg)[0]["table"]
        np.testing.assert_allclose(o.payload["table"], table, rtol=1e-4, atol=1e-6)  # type: ignore[index]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("batching", [0, 2])
@pytest.mark.parametrize("mode", ["delta", "gradient"])
def test_a_cohort_on_a_gpu_sends_what_it_sends_from_the_cpu(
    batching: int, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """On a GPU every client trains there, one at a time or vectorized (nothing falls back), and sends the CPU's
    sketch and, with diagnose-sketch, its dense update as a host array, to float rounding."""
    settings = {**BASE, "client-update": mode, "local-steps": 2, "weight-decay": 0.01, "diagnose-sketch": True}
    cpu, gpu = _cfg(settings, batching), _cfg(settings, batching, device="cuda")
    weights = _weights(cpu)
    jobs = [ClientJob(cid, 2, SKETCH) for cid in CIDS[:3]]
    with caplog.at_level(logging.WARNING):
        on_gpu = run_cohort(gpu, weights, jobs)
    assert _warnings(caplog) == []
    for o, c in zip(on_gpu, run_cohort(cpu, weights, jobs), strict=True):
        assert o.error is None and o.payload is not None and o.diagnostic is not None
        assert o.num_examples == c.num_examples
        np.testing.assert_allclose(o.payload["table"], c.payload["table"], rtol=1e-3, atol=1e-5)  # type: ignore[index]
        dense = o.diagnostic[wire.DIAGNOSTIC_UPDATE]
        np.testing.assert_allclose(dense, c.diagnostic[wire.DIAGNOSTIC_UPDATE], rtol=1e-3, atol=1e-5)  # type: ignore[index]


SKETCHED = {**BASE, "strategy": "sketched_sgd", "momentum": 0.0, "k": 5}


@pytest.mark.parametrize("batching", [0, 2])
def test_a_stateful_client_keeps_its_own_state_and_example_count_and_answers_from_it(batching: int) -> None:
    """Sketched-SGD: phase 1 keeps each client's error and count; phase 2 answers from that client's error."""
    cfg = _cfg(SKETCHED, batching)
    weights = _weights(cfg)
    first = run_cohort(cfg, weights, [ClientJob(cid, 2, SKETCH) for cid in (0, 2, 5)])
    d = weights.size
    for o in first:
        own = _own(cfg, weights, o.cid)
        assert o.state is not None and set(o.state) == {"error", EXAMPLES}
        assert torch.equal(o.state[EXAMPLES], torch.tensor([float(own.num_examples)]))
        assert o.num_examples == own.num_examples
    support = torch.tensor([1, 7, 40, d - 1])
    jobs = [ClientJob(o.cid, 2, SKETCH, state=o.state) for o in first]  # type: ignore[arg-type]
    jobs.insert(1, ClientJob(4, 2, SKETCH, state={}))  # kept nothing on this node: fails alone
    start = time.perf_counter()
    answers = answer_queries(cfg, jobs, encode_support(support, d))
    wall = time.perf_counter() - start
    assert [a.cid for a in answers] == [0, 4, 2, 5]
    assert sum(a.compute_s for a in answers) <= wall
    assert answers[1].payload is None
    assert answers[1].error == "ValueError: no Sketched-SGD state for this client on this node"
    for a, o in zip([answers[0], *answers[2:]], first, strict=True):
        assert a.error is None and a.payload is not None and a.state is None
        np.testing.assert_array_equal(a.payload["val"], o.state["error"][support].numpy())  # type: ignore[index]
        assert a.num_examples == o.num_examples and math.isnan(a.loss) and a.compute_s > 0


def test_an_answer_that_keeps_state_keeps_the_example_count_and_a_state_without_one_counts_one() -> None:
    """PowerSGD's second exchange replaces the kept state: the remembered count rides along when there is one."""
    from fedsketch.methods.powersgd import plan

    cfg = _cfg({**BASE, "strategy": "powersgd"})
    d = _weights(cfg).size
    query = {"p": np.ones(plan(cfg).p_size, dtype=np.float32)}
    target = torch.linspace(-1, 1, d)
    jobs = [
        ClientJob(0, 2, state={"target": target, EXAMPLES: torch.tensor([37.0])}),
        ClientJob(1, 2, state={"target": 2 * target}),
    ]
    answers = answer_queries(cfg, jobs, query)
    assert [a.num_examples for a in answers] == [37, 1]
    assert answers[0].state is not None and set(answers[0].state) == {"error", EXAMPLES}
    assert torch.equal(answers[0].state[EXAMPLES], torch.tensor([37.0]))
    assert answers[1].state is not None and set(answers[1].state) == {"error"}
    np.testing.assert_allclose(answers[1].payload["q"], 2 * answers[0].payload["q"], rtol=1e-5)  # type: ignore[index]


def test_a_method_without_a_second_exchange_refuses_each_query_by_name() -> None:
    cfg = _cfg(DELTA)
    answers = answer_queries(cfg, [ClientJob(0, 2), ClientJob(3, 2)], {})
    assert [(a.cid, a.payload, a.error) for a in answers] == [
        (c, None, "ValueError: strategy fedavg has no second exchange") for c in (0, 3)
    ]


def test_a_thread_reuses_its_models_per_config_and_keeps_the_four_latest() -> None:
    """One scratch model per thread and config (another thread builds its own); a fifth config evicts the oldest."""
    cfgs = [_cfg(BASE, **{"sketch-cols": 50 + i}) for i in range(6)]

    def other_thread() -> Any:
        box: list[Any] = []
        worker = threading.Thread(target=lambda: box.append(_scratch_model(cfgs[0])))
        worker.start()
        worker.join()
        return box[0]

    first = _scratch_model(cfgs[0])
    assert _scratch_model(cfgs[0]) is first and other_thread() is not first
    vectorizable = _vectorizable_model(cfgs[0])
    assert vectorizable is not first and _vectorizable_model(cfgs[0]) is vectorizable
    for cfg in cfgs[1:3]:
        _scratch_model(cfg)
    assert _scratch_model(cfgs[0]) is first  # four kept: first, its vectorizable copy, and two more
    _scratch_model(cfgs[3])
    assert _scratch_model(cfgs[0]) is not first


class _CheckedMLP(nn.Module):
    """A user's model that checks its input in Python: it runs one client at a time, and ``vmap`` cannot run it."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(features, 8), nn.ReLU(), nn.Linear(8, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.isfinite(x).all():
            raise ValueError("input is not finite")
        return self.body(x)


def checked_mlp(input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    return _CheckedMLP(int(np.prod(input_shape)), num_classes)


@pytest.mark.parametrize("mode", ["delta", "gradient"])
def test_a_model_vmap_cannot_run_falls_back_to_one_client_at_a_time(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The vectorized call fails for the whole chunk; every client is then computed alone, failures its own."""
    settings = {**DELTA, "client-update": mode, "model": f"{__name__}:checked_mlp"}
    seq, vec = _cfg(settings), _cfg(settings, 3)
    weights = _weights(seq)
    jobs = [ClientJob(cid, 2) for cid in (0, 99, 2, 5)]
    with caplog.at_level(logging.WARNING):
        outcomes, wall = _timed(vec, weights, jobs)
    warnings = _warnings(caplog)
    assert len(warnings) == 2  # one a chunk: (0, 99, 2), then (5,)
    for warning in warnings:
        assert warning.startswith("client-batching: the vectorized call failed (RuntimeError: vmap: ")
        assert warning.endswith("); its clients run one at a time")
    expected = run_cohort(seq, weights, jobs)
    assert [o.cid for o in outcomes] == [0, 99, 2, 5] and outcomes[1].error == BAD
    for o, e in zip(outcomes, expected, strict=True):
        assert (o.error, o.num_examples) == (e.error, e.num_examples)
        assert o.loss == e.loss or math.isnan(o.loss) and math.isnan(e.loss)
        if e.payload is not None:
            np.testing.assert_array_equal(o.payload["update"], e.payload["update"])  # type: ignore[index]
    _check_seconds(outcomes, wall)
