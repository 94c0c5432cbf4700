"""The method records and the registry, exactly: found by name once each, dense uploads and their mean, server_step.

Each test states a property of :mod:`fedsketch.methods` (the registry), :mod:`fedsketch.methods.method`
(the records' defaults and :func:`~fedsketch.methods.method.server_step`), :mod:`fedsketch.methods.dense`
and :mod:`fedsketch.methods.fedadam`, with float64 references computed here (docs/mutation.md).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from fedsketch import methods
from fedsketch.config import RunConfig
from fedsketch.methods import NAMES, REGISTRY, dense, get_method, received_round_config
from fedsketch.methods import fedadam as fedadam_method
from fedsketch.methods.method import (
    Client,
    ClientJob,
    ClientUpdate,
    Declaration,
    Docs,
    Method,
    Privacy,
    Query,
    Round,
    Server,
    Wire,
    no_check,
    no_diagnostic,
    no_report,
    no_requests,
    no_round_config,
    payload_norm,
    server_step,
    stateless,
    unit_sensitivity,
    update_norm,
)
from fedsketch.settings.setting import ConfigError

CPU = torch.device("cpu")


def _cfg(**extra: object) -> RunConfig:
    return RunConfig.from_mapping({"num-clients": 10, "clients-per-round": 3, **extra})


def _dense_round(d: int = 5, lr: float = 0.1) -> Round:
    g = torch.Generator().manual_seed(3)
    updates = [
        ClientUpdate(cid, {"update": torch.randn(d, generator=g).numpy()}, n, 0.0, 0)
        for cid, n in ((0, 3), (1, 1), (2, 6))
    ]
    return Round(1, lr, updates, d, CPU)


def _mean64(rnd: Round) -> torch.Tensor:
    total = sum(u.num_examples for u in rnd.updates)
    return sum(torch.from_numpy(u.payload["update"]).double() * u.num_examples for u in rnd.updates) / total


# --- the registry ---------------------------------------------------------------------------------------


def test_discovery_finds_every_record_once_sorted_by_name() -> None:
    found = methods._discover()
    assert tuple(m.name for m in found) == NAMES == tuple(sorted(NAMES))
    assert len(set(NAMES)) == len(NAMES)
    # a module's METHODS (dense: two records) and a module's METHOD (fedadam) are both found
    assert {"fedavg", "true_topk", "fedadam", "fetchsgd"} <= set(NAMES)
    assert REGISTRY["fedavg"] is dense.FEDAVG and REGISTRY["fedadam"] is fedadam_method.METHOD


def _extra_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(body)
    monkeypatch.setattr(methods, "__path__", [*methods.__path__, str(tmp_path)])


def test_discovery_refuses_two_records_of_one_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _extra_module(tmp_path, monkeypatch, "zz_copy", "from fedsketch.methods.dense import FEDAVG as METHOD\n")
    with pytest.raises(ValueError) as err:
        methods._discover()
    assert str(err.value) == "two methods share a name: ['fedavg']"


def test_discovery_skips_a_module_without_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _extra_module(tmp_path, monkeypatch, "zz_helper", "X = 1\n")
    assert tuple(m.name for m in methods._discover()) == NAMES


def test_a_known_name_is_its_record_and_an_unknown_one_is_refused_with_a_hint() -> None:
    assert all(get_method(name) is REGISTRY[name] and get_method(name).name == name for name in NAMES)
    known = ", ".join(NAMES)
    with pytest.raises(ConfigError) as err:
        get_method("fedavgg")
    assert str(err.value) == f"unknown strategy 'fedavgg' (did you mean 'fedavg'?); known: {known}"
    with pytest.raises(ConfigError) as err:
        get_method("qqqq")
    assert str(err.value) == f"unknown strategy 'qqqq'; known: {known}"


def test_the_received_round_config_is_the_methods_keys_present_in_the_config() -> None:
    cfg = _cfg(strategy="fetchsgd")
    config = {"sketch-seed": 7, "sketch-rows": 3, "other": 9}
    assert received_round_config(cfg, config) == {"sketch-seed": 7, "sketch-rows": 3}
    assert received_round_config(_cfg(strategy="fedavg"), config) == {}


# --- the records' defaults (docs/extending.md) -------------------------------------------------------------


def test_the_default_parts_do_nothing_and_count_one() -> None:
    cfg = _cfg()
    state = object()
    assert stateless(cfg) == 0
    assert unit_sensitivity(cfg) == 1.0
    assert no_round_config(cfg) == {}
    assert no_requests(state, [0, 1], cfg, 4) == {}
    reported = no_report(state, cfg)
    assert reported[0] is state and reported[1] == {}
    assert no_diagnostic(cfg, 4) is None
    assert no_check(cfg, 4) is None


def test_payload_norm_adds_float_arrays_in_float64_and_skips_the_rest() -> None:
    big = np.array([3e20, 4e20], dtype=np.float32)  # squares overflow float32
    u = ClientUpdate(0, {"a": big, "b": np.array([12.0], dtype=np.float64), "i": np.array([100], np.int64)}, 1, 0, 0)
    expected = math.sqrt(float(big.astype(np.float64)[0]) ** 2 + float(big.astype(np.float64)[1]) ** 2 + 144.0)
    assert payload_norm(u) == pytest.approx(expected, rel=1e-12)
    assert payload_norm(ClientUpdate(0, {"i": np.array([5], np.int32)}, 1, 0, 0)) == 0.0


def test_update_norm_is_the_decoded_vectors_in_float64_else_the_payloads() -> None:
    cfg = _cfg()
    decoded = torch.tensor([3e20, 4e20], dtype=torch.float32)
    with_vector = ClientUpdate(0, {"a": np.array([1.0], np.float32)}, 1, 0, 0, decoded=decoded)
    assert update_norm(with_vector, cfg, 2) == pytest.approx(float(decoded.double().norm()), rel=1e-12)
    assert math.isfinite(update_norm(with_vector, cfg, 2))
    plain = ClientUpdate(0, {"a": np.array([3.0, 4.0], np.float32)}, 1, 0, 0, decoded=np.zeros(2))
    assert update_norm(plain, cfg, 2) == 5.0


def test_a_method_reads_its_shared_keys_and_its_own_settings() -> None:
    m = fedadam_method.METHOD
    assert m.reads("momentum") and m.reads("fedadam-beta2") and m.reads("fedadam-tau")
    assert not m.reads("k") and not m.reads("sketch-cols")


# --- dense uploads --------------------------------------------------------------------------------------


def test_a_dense_upload_is_the_float32_update_and_keeps_nothing() -> None:
    cfg = _cfg()
    assert dense.layout(cfg, 7) == {"update": ((7,), np.dtype(np.float32))}
    assert dense.layout(cfg, 7, 4) == {"update": ((7,), np.dtype(np.float32))}
    update = torch.tensor([1.5, -2.0, 0.25])
    payload, kept = dense.encode(update, ClientJob(0, 1), cfg)
    assert kept == {} and set(payload) == {"update"}
    assert payload["update"].dtype == np.float32 and payload["update"].tolist() == [1.5, -2.0, 0.25]


def test_the_dense_mean_is_weighted_by_examples() -> None:
    rnd = _dense_round()
    mean = dense.mean_update(rnd)
    assert mean.shape == (rnd.d,) and mean.dtype == torch.float32
    torch.testing.assert_close(mean.double(), _mean64(rnd), rtol=1e-6, atol=1e-7)


def test_fedavg_is_momentum_sgd_on_the_mean() -> None:
    cfg = _cfg(strategy="fedavg", momentum=0.5)
    rnd = _dense_round(lr=0.1)
    state = dense.fedavg_init(cfg, rnd.d, CPU)
    assert torch.equal(state.velocity, torch.zeros(rnd.d))
    g = _mean64(rnd)
    state, delta = dense.fedavg_step(state, rnd, cfg)
    torch.testing.assert_close(delta.double(), 0.1 * g, rtol=1e-6, atol=1e-7)
    state, delta = dense.fedavg_step(state, rnd, cfg)
    torch.testing.assert_close(delta.double(), 0.1 * (0.5 * g + g), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("zeroing", [True, False])
def test_true_topk_sends_k_coordinates_of_the_accumulated_error(zeroing: bool) -> None:
    cfg = _cfg(strategy="true_topk", k=2, momentum=0.5, **{"momentum-zeroing": zeroing})
    rnd = _dense_round(d=6, lr=0.1)
    state = dense.topk_init(cfg, rnd.d, CPU)
    assert torch.equal(state.momentum, torch.zeros(6)) and torch.equal(state.error, torch.zeros(6))
    g = _mean64(rnd)
    u, e = torch.zeros(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
    for _ in range(3):
        u = 0.5 * u + g
        e = e + 0.1 * u
        support = torch.topk(e.abs(), 2).indices
        want = torch.zeros_like(e)
        want[support] = e[support]
        e = e - want
        if zeroing:
            u[support] = 0.0
        state, delta = dense.topk_step(state, rnd, cfg)
        assert int((delta != 0).sum()) == 2
        torch.testing.assert_close(delta.double(), want, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(state.momentum.double(), u, rtol=1e-5, atol=1e-7)


def test_fedadam_is_adam_on_the_mean_with_its_own_settings() -> None:
    cfg = _cfg(strategy="fedadam", momentum=0.9, **{"fedadam-beta2": 0.5, "fedadam-tau": 0.25})
    rnd = _dense_round(lr=0.1)
    state = fedadam_method.init(cfg, rnd.d, CPU)
    assert torch.equal(state.m, torch.zeros(rnd.d)) and torch.equal(state.v, torch.zeros(rnd.d))
    g = _mean64(rnd)
    m, v = torch.zeros_like(g), torch.zeros_like(g)
    for _ in range(2):
        m = 0.9 * m + 0.1 * g
        v = 0.5 * v + 0.5 * g * g
        state, delta = fedadam_method.step(state, rnd, cfg)
        torch.testing.assert_close(delta.double(), 0.1 * m / (v.sqrt() + 0.25), rtol=1e-5, atol=1e-7)


def test_states_and_the_mean_live_on_the_devices_given() -> None:
    """The meta device stands for an accelerator: tensors made on the CPU would show here."""
    meta = torch.device("meta")
    cfg = _cfg(k=2)
    assert dense.fedavg_init(cfg, 4, meta).velocity.device == meta
    topk = dense.topk_init(cfg, 4, meta)
    assert topk.momentum.device == meta and topk.error.device == meta
    adam = fedadam_method.init(cfg, 4, meta)
    assert adam.m.device == meta and adam.v.device == meta
    rnd = _dense_round(d=4)
    mean = dense.mean_update(Round(1, 0.1, rnd.updates, 4, meta))
    assert mean.device == meta and mean.shape == (4,) and mean.dtype == torch.float32


# --- server_step ----------------------------------------------------------------------------------------


def _never(asked: list[ClientUpdate], query: Query) -> list[ClientUpdate]:
    raise AssertionError("a method without a second exchange was asked")


def test_a_method_without_a_second_exchange_is_never_asked() -> None:
    cfg = _cfg(strategy="fedavg", momentum=0.0)
    rnd = _dense_round()
    state0 = dense.FEDAVG.server.init(cfg, rnd.d, CPU)
    for ask in (None, _never):
        state, delta, seen = server_step(dense.FEDAVG, state0, rnd, cfg, ask)
        assert seen is rnd and seen.query is None and seen.answers == ()
        torch.testing.assert_close(delta.double(), 0.1 * _mean64(rnd), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(state.velocity.double(), _mean64(rnd), rtol=1e-6, atol=1e-7)


def _two_exchange(asked_log: list[tuple[object, Round, RunConfig]]) -> Method:
    """A method that asks clients 2 and 0 for one number each; its step returns their sum, the query's carry added."""

    def ask(state: object, rnd: Round, cfg: RunConfig) -> Query:
        asked_log.append((state, rnd, cfg))
        return Query((2, 0), {"q": np.array([1.0], np.float32)}, {}, {"c": torch.tensor([100.0])})

    def step(state: int, rnd: Round, cfg: RunConfig) -> tuple[int, torch.Tensor]:
        assert rnd.query is not None
        total = sum(float(a.payload["x"][0]) for a in rnd.answers) + float(rnd.query.carry["c"][0])
        return state + 1, torch.tensor([total])

    return Method(
        Declaration("twox", Docs("x", "none", "-"), False, True, False, (), (), {}),
        client=Client(dense.encode, answer=lambda s, p, c: ({}, None)),
        server=Server(lambda cfg, d, dev: 0, step, ask=ask),
        wire=Wire(dense.layout),
        privacy=Privacy(),
    )


def test_server_step_asks_the_query_and_passes_only_the_asked_clients_answers() -> None:
    log: list[tuple[object, Round, RunConfig]] = []
    method = _two_exchange(log)
    rnd = Round(1, 0.1, [ClientUpdate(cid, {}, 1, 0.0, 0) for cid in range(4)], 1, CPU)
    asked: list[tuple[list[int], Query]] = []

    def ask(first: list[ClientUpdate], query: Query) -> list[ClientUpdate]:
        asked.append(([u.cid for u in first], query))
        # an answer from client 3, who was not asked, must be dropped
        return [ClientUpdate(cid, {"x": np.array([10.0**cid])}, 1, 0.0, 0) for cid in (0, 2, 3)]

    cfg = _cfg()
    state, delta, seen = server_step(method, 5, rnd, cfg, ask)
    assert log == [(5, rnd, cfg)] and len(asked) == 1
    assert asked[0][0] == [0, 2] and asked[0][1] is seen.query
    assert seen.query is not None and seen.query.cids == (2, 0)
    assert [a.cid for a in seen.answers] == [0, 2] and isinstance(seen.answers, tuple)
    assert seen.updates == rnd.updates and seen.lr == rnd.lr
    assert state == 6 and delta.tolist() == [1.0 + 100.0 + 100.0]


def test_server_step_refuses_a_second_exchange_without_ask() -> None:
    log: list[tuple[object, Round, RunConfig]] = []
    rnd = Round(1, 0.1, [ClientUpdate(0, {}, 1, 0.0, 0)], 1, CPU)
    with pytest.raises(ValueError) as err:
        server_step(_two_exchange(log), 0, rnd, _cfg())
    assert str(err.value) == "twox's step needs the round's second exchange" and log == []
