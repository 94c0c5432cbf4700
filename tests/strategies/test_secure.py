"""SecAgg+ with FetchSGD: the securely aggregated sum equals the plain one within quantization error."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Context, Message

from bridge.flower import task_identity
from bridge.legacy import Code, compat, ndarrays_to_parameters, parameters_to_ndarrays
from bridge.messages import delivered, wire_bytes
from clients.secure import FITINS_CONFIG, is_secure, secure_train
from fedsketch import wire
from fedsketch.client.cohort import run_cohort
from fedsketch.config import ConfigError, RunConfig
from fedsketch.methods import ClientJob, ClientUpdate, Round, received_round_config
from fedsketch.methods.fetchsgd import sketch_norm
from strategies.secure import checked_mean, quantization_error
from strategies.server_app import build_strategy
from strategies.strategy import FedSketchStrategy
from tests.federation import Recorder, TestGrid

SETTINGS = {
    "num-clients": 20,
    "clients-per-round": 6,
    "model-hidden": 16,
    "k": 30,
    "sketch-rows": 3,
    "sketch-cols": 400,
    "num-rounds": 1,
    "eval-every": 1,
}


def one_round(cfg: RunConfig, out: Path, nodes: int) -> tuple[FedSketchStrategy, list[ClientUpdate], dict[str, Any]]:
    """Run one round; return the strategy, the updates its step received, and the metrics row."""
    strat = build_strategy(cfg, out)
    seen: list[ClientUpdate] = []
    step = strat.method.server.step

    def recording(state: object, rnd: Round, cfg: RunConfig) -> tuple[object, torch.Tensor]:
        seen.extend(rnd.updates)
        return step(state, rnd, cfg)

    strat.method = dataclasses.replace(strat.method, server=dataclasses.replace(strat.method.server, step=recording))
    with task_identity():
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=nodes))
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return strat, seen, row


@pytest.mark.parametrize(("strategy", "nodes"), [("fetchsgd", 3), ("fetchsgd", 2), ("fedavg", 3)])
def test_secure_sum_equals_the_plain_sum_within_quantization_error(tmp_path: Path, strategy: str, nodes: int) -> None:
    cfg = RunConfig.from_mapping({**SETTINGS, "strategy": strategy})
    plain, updates, plain_row = one_round(cfg, tmp_path / "plain", nodes)
    secure, (mean,), row = one_round(
        RunConfig.from_mapping({"secure-aggregation": True}, base=cfg), tmp_path / "secure", nodes
    )
    name = "table" if strategy == "fetchsgd" else "update"
    total = sum(u.num_examples for u in updates)
    exact = sum(u.payload[name].astype(np.float64) * (u.num_examples / total) for u in updates)
    # Each node's weight is its examples over max_weight (= batch x the largest cohort).
    per_node = {}
    for u in updates:
        per_node[u.node] = per_node.get(u.node, 0) + u.num_examples
    max_weight = cfg.local_batch_size * -(-cfg.clients_per_round // nodes)
    bound = quantization_error(nodes, sum(per_node.values()) / max_weight)
    error = np.abs(mean.payload[name].astype(np.float64) - exact)
    assert 0 < error.max() <= bound + 1e-6 * np.abs(exact).max()
    assert (row["clients"], row["failures"]) == (plain_row["clients"], 0) == (6, 0)
    torch.testing.assert_close(secure.weights, plain.weights, atol=1e-4, rtol=0)


def test_secure_aggregation_costs_bytes_and_says_how_many(tmp_path: Path) -> None:
    """One client per node: the protocol's keys, shares and 64-bit masked integers cost more than float32 tables."""
    cfg = RunConfig.from_mapping({**SETTINGS, "clients-per-round": 4, "sketch-cols": 4000})
    _, _, plain = one_round(cfg, tmp_path / "plain", nodes=4)
    _, _, secure = one_round(RunConfig.from_mapping({"secure-aggregation": True}, base=cfg), tmp_path / "secure", 4)
    assert secure["upload_bytes"] > plain["upload_bytes"]
    assert secure["download_bytes"] > 0 and secure["clients"] == 4


def test_nodes_clip_their_own_clients(tmp_path: Path) -> None:
    """The server cannot clip what it cannot see: with clip-norm, each node clips its clients before summing."""
    cfg = RunConfig.from_mapping(
        {**SETTINGS, "strategy": "fedavg", "lr": 1.0, "momentum": 0.0, "clip-norm": 0.01, "secure-aggregation": True}
    )
    strat, (mean,), _ = one_round(cfg, tmp_path, nodes=3)
    slack = np.sqrt(strat.d) * quantization_error(3, 0.5)  # the total weight is at least half here
    assert np.linalg.norm(mean.payload["update"]) <= 0.01 + slack
    _, (unclipped,), _ = one_round(RunConfig.from_mapping({"clip-norm": 0.0}, base=cfg), tmp_path / "free", nodes=3)
    assert np.linalg.norm(unclipped.payload["update"]) > 0.1


def test_a_round_the_protocol_cannot_run_is_not_applied_and_says_why(tmp_path: Path) -> None:
    """SecAgg+ needs two nodes at least: with one, the round halts and the model stays as it was."""
    cfg = RunConfig.from_mapping({**SETTINGS, "secure-aggregation": True})
    strat = build_strategy(cfg, tmp_path)
    before = strat.weights.clone()
    with task_identity():
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=1))
    (line,) = (tmp_path / "rounds.jsonl").read_text().splitlines()
    record = json.loads(line)
    assert not record["applied"] and "protocol halted" in record["reason"] and record["clients"] == 0
    assert torch.equal(strat.weights, before)


def test_a_secure_rounds_row_is_what_the_nodes_reported(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One node is asked for a client it cannot compute: the row counts that client as an error, the others as
    contributors, the training loss is the mean of the nodes' own, and the sum stands for its clients' dense
    uploads."""
    cfg = RunConfig.from_mapping({**SETTINGS, "secure-aggregation": True})
    strat, recorder = build_strategy(cfg, tmp_path), Recorder()

    def one_client_unknown(msg: Message) -> Message:
        config = msg.content.config_records.get(FITINS_CONFIG)
        if config is not None and msg.metadata.dst_node_id == 101:
            config[wire.CIDS] = [999, *wire.config_ints(config, wire.CIDS)[1:]]
        return msg

    with task_identity(), caplog.at_level(logging.WARNING, logger="flwr"):
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=3, tamper=recorder, deliver=one_client_unknown))
    assert not [m for m in caplog.messages if "exceeds the specified max_weight" in m]  # no node's weight overflows
    reported = [dict(r) for _, replies in recorder.exchanges for c in replies for r in c.config_records.values()]
    reported = [r for r in reported if "loss" in r]
    assert sorted(r["failed"] for r in reported) == [0, 0, 1]
    (row,) = strat.history
    assert (row["clients"], row["client_errors"], row["failures"]) == (5, 1, 1)
    assert sum(r["clients"] for r in reported) == 5 and row["train_loss"] == float(
        np.mean([r["loss"] for r in reported])
    )
    assert row["dense_upload_bytes"] == 5 * strat.dense_bytes
    (line,) = [json.loads(x) for x in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert (line["applied"], line["reason"], line["clients"], line["client_errors"]) == (True, "", 5, 1)


def test_a_sum_is_checked_against_an_exact_layout_only() -> None:
    """A decoder checks one client's encoding; a sum of encodings is refused, with the reason, not decoded."""
    mean = [np.ones(3)]
    payload, why = checked_mean(mean, {"update": ((3,), np.dtype(np.float32))})
    assert payload is not None and payload["update"].dtype == np.float32 and why == ""
    assert checked_mean(mean, lambda p: p) == (
        None,
        "the method's layout is a decoder, not exact shapes: a sum cannot be checked against it",
    )


SPEC = {"b": ((2,), np.dtype(np.float16)), "a": ((3,), np.dtype(np.float32))}


@pytest.mark.parametrize(
    ("mean", "why"),
    [
        (None, "the protocol halted (too few nodes answered)"),
        ([np.ones(3)], "arrays of shapes [(3,)]; expected [(3,), (2,)]"),
        ([np.ones(3), np.ones(2), np.ones(1)], "arrays of shapes [(3,), (2,), (1,)]; expected [(3,), (2,)]"),
        ([np.ones(2), np.ones(3)], "arrays of shapes [(2,), (3,)]; expected [(3,), (2,)]"),
        ([np.ones(3), np.array([1.0, np.inf])], "NaN or Inf in the sum"),
        ([np.array([np.nan, 0, 0]), np.ones(2)], "NaN or Inf in the sum"),
    ],
)
def test_a_sum_of_another_layout_or_not_finite_is_refused_with_the_reason(mean: Any, why: str) -> None:
    assert checked_mean(mean, SPEC) == (None, why)


def test_a_sum_takes_the_layouts_names_in_order_and_its_dtypes() -> None:
    payload, why = checked_mean([np.arange(3.0), np.array([0.5, -2.0])], SPEC)
    assert why == "" and payload is not None and list(payload) == ["a", "b"]
    assert payload["a"].dtype == np.float32 and payload["b"].dtype == np.float16
    assert payload["a"].tolist() == [0.0, 1.0, 2.0] and payload["b"].tolist() == [0.5, -2.0]


def test_the_error_bound_is_one_quantization_level_per_node_over_the_total_weight() -> None:
    level = 2 * 8.0 / 2**22
    assert quantization_error(1, 1.0) == level
    assert quantization_error(3, 0.5) == pytest.approx(3 * level / 0.5, rel=1e-12)


def test_secure_aggregation_is_refused_where_it_cannot_work() -> None:
    with pytest.raises(ConfigError, match="add up linearly"):
        RunConfig.from_mapping({"strategy": "qsgd", "secure-aggregation": True})
    with pytest.raises(ConfigError, match="not combined"):
        RunConfig.from_mapping({"secure-aggregation": True, "clip-norm": 1.0, "dp-noise-multiplier": 1.0})


def secure_strategy(**settings: object) -> FedSketchStrategy:
    return build_strategy(
        RunConfig.from_mapping({**SETTINGS, "strategy": "fedavg", "secure-aggregation": True, **settings}), None
    )


def test_a_secure_round_that_halts_counts_every_client_it_did_not_hear_from() -> None:
    """SecAgg+ needs two nodes: with one, the round halts, and its clients count as timeouts."""
    strat = secure_strategy(**{"num-rounds": 1})
    with task_identity():
        strat.start(TestGrid(strat.cfg.to_mapping(), num_nodes=1))
    (row,) = strat.history
    assert (row["timeouts"], row["clients"], row["skipped_rounds"]) == (strat.cfg.clients_per_round, 0, 1)


def test_a_secure_round_that_halts_mid_way_is_billed_what_it_sent_and_counts_each_silent_client() -> None:
    """Two of three nodes, one client each, fall silent after the keys: the protocol halts; what its stages
    serialized is billed, and each of the three clients counts as one timeout."""
    exchanges: list[tuple[list[Message], list[Message]]] = []

    def silent_after_keys(requests: list[Message], replies: list[Message]) -> list[Message]:
        kept = replies if not exchanges else [m for m in replies if m.metadata.src_node_id == 101]
        exchanges.append((requests, kept))
        return kept

    strat = secure_strategy(**{"num-rounds": 1, "clients-per-round": 3, "round-timeout": 0.2})
    with task_identity():
        strat.start(TestGrid(strat.cfg.to_mapping(), num_nodes=3, tamper=silent_after_keys))
    (row,) = strat.history
    assert (row["timeouts"], row["clients"], row["skipped_rounds"]) == (3, 0, 1)
    assert row["download_bytes"] == sum(wire_bytes(m.content) for requests, _ in exchanges for m in requests) > 0
    assert row["upload_bytes"] == sum(wire_bytes(m.content) for _, replies in exchanges for m in replies) > 0


def test_a_node_silent_in_the_last_secure_stage_is_waited_for_until_the_timeout() -> None:
    """SecAgg+'s last stage collects the shares that unmask the sum: a node silent there is waited for only until
    the round's timeout, and its masked upload is still unmasked from the others' shares."""
    stages: list[int] = []

    def silent_at_unmask(requests: list[Message], replies: list[Message]) -> list[Message]:
        stages.append(len(requests))
        return [m for m in replies if m.metadata.src_node_id != 101] if len(stages) == 4 else replies

    strat = secure_strategy(**{"num-rounds": 1, "clients-per-round": 6, "round-timeout": 0.2})
    with task_identity():
        strat.start(TestGrid(strat.cfg.to_mapping(), num_nodes=3, tamper=silent_at_unmask))
    (row,) = strat.history
    assert len(stages) == 4 and (row["clients"], row["skipped_rounds"]) == (6, 0)


def test_a_secure_rounds_bytes_are_what_its_four_stages_serialize() -> None:
    """Keys, shares, masked uploads and unmasking: every request and reply of the protocol is billed."""
    exchanges: list[tuple[list[Message], list[Message]]] = []

    def record(requests: list[Message], replies: list[Message]) -> list[Message]:
        exchanges.append((requests, replies))
        return replies

    strat = secure_strategy()
    with task_identity():
        strat.start(TestGrid(strat.cfg.to_mapping(), num_nodes=3, tamper=record))
    (row,) = strat.history
    assert len(exchanges) == 4
    assert row["download_bytes"] == sum(wire_bytes(m.content) for requests, _ in exchanges for m in requests)
    assert row["upload_bytes"] == sum(wire_bytes(m.content) for _, replies in exchanges for m in replies)


@pytest.mark.slow
def test_secure_fetchsgd_trains_through_a_real_flower_simulation(tmp_path: Path, no_leftover_processes: None) -> None:
    """Flower's own SecAgg+ mod and workflow, over the simulation runtime's transport."""
    from experiments.cli import main as fedsketch_main

    args = ["run", "--out", str(tmp_path), "--strategies", "fetchsgd", "--supernodes", "3", "--no-plot"]
    for pair in [
        "num-clients=20",
        "clients-per-round=6",
        "num-rounds=3",
        "eval-every=1",
        "sketch-rows=3",
        "sketch-cols=5000",
        "k=2000",
        "lr=0.5",
        "experiment=secure",
        "secure-aggregation=true",
    ]:
        args += ["--set", pair]
    assert fedsketch_main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "secure" / "fetchsgd" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["round"], r["clients"], r["failures"]) for r in rows] == [(1, 6, 0), (2, 6, 0), (3, 6, 0)]
    assert rows[-1]["test_loss"] < rows[0]["test_loss"]


def _node_request(tmp_path: Path, settings: dict[str, Any]) -> tuple[RunConfig, Message, Context]:
    """The masking stage's request as node 101 received it in a real secure round, and that node's context."""
    cfg = RunConfig.from_mapping({**SETTINGS, "secure-aggregation": True, **settings})
    seen: list[Message] = []

    def keep(msg: Message) -> Message:
        if msg.metadata.dst_node_id == 101 and is_secure(msg):
            seen.append(delivered(msg))
        return msg

    grid = TestGrid(cfg.to_mapping(), num_nodes=3, deliver=keep)
    with task_identity():
        build_strategy(cfg, tmp_path).start(grid)
    return cfg, seen[0], grid.contexts[101]


def _reply(reply: Message) -> tuple[list[np.ndarray], Any]:
    fitres = compat.recorddict_to_fitres(reply.content, keep_input=True)
    return parameters_to_ndarrays(fitres.parameters), fitres


def test_a_nodes_reply_is_its_clients_example_weighted_mean_summed_in_float64(tmp_path: Path) -> None:
    cfg, request, context = _node_request(tmp_path, {"clients-per-round": 12, "strategy": "fedavg"})
    config = request.content.config_records[FITINS_CONFIG]
    cids = wire.config_ints(config, wire.CIDS)
    weights = parameters_to_ndarrays(
        compat.arrayrecord_to_parameters(request.content.array_records["fitins.parameters"], keep_input=True)
    )[0]
    with task_identity():
        arrays, fitres = _reply(secure_train(request, context, cfg))
    outcomes = run_cohort(cfg, weights, [ClientJob(c, 1, received_round_config(cfg, config)) for c in cids])
    total = sum(out.num_examples for out in outcomes)
    exact = sum(out.payload["update"].astype(np.float64) * (out.num_examples / total) for out in outcomes)
    assert len(cids) == 4 and len(arrays) == 1 and arrays[0].dtype == np.float32
    assert np.array_equal(arrays[0], exact.astype(np.float32))
    assert (fitres.status.code, fitres.status.message, fitres.num_examples) == (Code.OK, "", total)
    assert fitres.metrics == {"clients": 4, "failed": 0, "loss": float(np.mean([o.loss for o in outcomes]))}


def test_a_node_whose_clients_all_fail_raises_with_the_first_three_reasons(tmp_path: Path) -> None:
    cfg, request, context = _node_request(tmp_path, {"clients-per-round": 12})
    request.content.config_records[FITINS_CONFIG][wire.CIDS] = [997, 998, 999, 1000]
    reasons = ", ".join(
        f"'ValueError: client id {c} out of range: synthetic(0.5,0.5) has 20 clients (0..19)'" for c in (997, 998, 999)
    )
    with task_identity(), pytest.raises(RuntimeError) as raised:
        secure_train(request, context, cfg)
    assert str(raised.value) == f"no client of this node produced an update: [{reasons}]"


def test_a_node_whose_clients_losses_are_not_finite_reports_nan(tmp_path: Path) -> None:
    cfg, request, context = _node_request(tmp_path, {"strategy": "fedavg"})
    record = request.content.array_records["fitins.parameters"]
    weights = parameters_to_ndarrays(compat.arrayrecord_to_parameters(record, keep_input=True))[0]
    nan = compat.parameters_to_arrayrecord(ndarrays_to_parameters([np.full_like(weights, np.nan)]), keep_input=True)
    request.content.array_records["fitins.parameters"] = nan
    with task_identity():
        _, fitres = _reply(secure_train(request, context, cfg))
    assert fitres.metrics["clients"] == 2 and math.isnan(fitres.metrics["loss"])


def test_in_a_deployment_each_node_trains_its_own_partition_securely(tmp_path: Path) -> None:
    """One client per SuperNode: the server names no client, each node is the client of its ``partition-id``."""
    settings = {**SETTINGS, "strategy": "fedavg", "client-assignment": "node", "num-clients": 3, "clients-per-round": 3}
    _, updates, _ = one_round(RunConfig.from_mapping(settings), tmp_path / "plain", nodes=3)
    cfg = RunConfig.from_mapping({**settings, "secure-aggregation": True})
    _, (mean,), row = one_round(cfg, tmp_path / "secure", nodes=3)
    assert (row["clients"], row["failures"]) == (3, 0)
    total = sum(u.num_examples for u in updates)
    exact = sum(u.payload["update"].astype(np.float64) * (u.num_examples / total) for u in updates)
    bound = quantization_error(3, total / cfg.local_batch_size)
    assert np.abs(mean.payload["update"] - exact).max() <= bound + 1e-6 * np.abs(exact).max()


def test_fetchsgd_nodes_clip_by_the_norm_their_sketches_estimate(tmp_path: Path) -> None:
    cfg = RunConfig.from_mapping({**SETTINGS, "clip-norm": 0.01, "secure-aggregation": True})
    strat, (clipped,), _ = one_round(cfg, tmp_path, nodes=3)
    _, (free,), _ = one_round(RunConfig.from_mapping({"clip-norm": 0.0}, base=cfg), tmp_path / "free", nodes=3)
    estimate = sketch_norm(clipped.payload, strat.d, cfg.seed)
    assert estimate <= 0.01 + np.sqrt(clipped.payload["table"].size) * quantization_error(3, 0.5)
    assert sketch_norm(free.payload, strat.d, cfg.seed) > 10 * estimate
