"""Failures are counted per round by kind; a round below min-replies is not applied, and says so."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ConfigRecord, Error, Message
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from bridge.flower import task_identity
from experiments.analysis.results import failed_replies
from fedsketch import wire
from fedsketch.config import RunConfig
from fedsketch.data import FederatedData
from strategies.plan import sample_clients
from strategies.server_app import build_strategy
from tests.federation import TestGrid

SETTINGS = {
    "num-clients": 20,
    "clients-per-round": 6,
    "model-hidden": 16,
    "k": 30,
    "sketch-rows": 3,
    "sketch-cols": 400,
    "num-rounds": 4,
    "eval-every": 1,
    "min-replies": 3,
    "round-timeout": 0.5,  # the strategy waits on the wall clock: node 101's silence in round 2 lasts this long
}


def tamper(requests: list[Message], replies: list[Message]) -> list[Message]:
    """Round 2: node 101 is silent. Round 3: it crashes and one client of 102 raises. Round 4: a NaN."""
    rnd = int(requests[0].content.config_records[wire.CONFIG_KEY][wire.ROUND])  # type: ignore[arg-type]
    by_node = {msg.metadata.src_node_id: msg for msg in replies}
    if rnd == 2:
        del by_node[101]
    elif rnd == 3:
        request = next(m for m in requests if m.metadata.dst_node_id == 101)
        by_node[101] = Message(Error(code=1, reason="ClientApp raised MemoryError"), reply_to=request)
        content = by_node[102].content
        cid = int(next(iter(content.array_records)).split(".")[1])
        del content[wire.update_key(cid)], content[wire.metrics_key(cid)]
        content[wire.failure_key(cid)] = ConfigRecord({wire.REASON: "RuntimeError: CUDA out of memory"})
    elif rnd == 4:
        record = next(iter(by_node[102].content.array_records.values()))
        table = record["table"].numpy().copy()
        table[0, 0] = np.nan
        record["table"] = Array(table)
    return list(by_node.values())


def test_failures_are_counted_per_round_and_a_short_round_is_not_applied(tmp_path: Path) -> None:
    cfg = RunConfig.from_mapping(SETTINGS)
    strat = build_strategy(cfg, tmp_path)
    started = time.time()
    with task_identity():
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=2, tamper=tamper))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    # each round's end, before its evaluation (a metrics row stamps the evaluation's end)
    ends = [r["unix_time"] for r in rounds]
    assert started <= ends[0] and ends == sorted(ends) and ends[-1] <= time.time()
    assert all(end <= row["unix_time"] for end, row in zip(ends, rows, strict=True))
    counts = [(r["clients"], r["timeouts"], r["client_errors"], r["rejected"], r["skipped_rounds"]) for r in rows]
    assert counts == [(6, 0, 0, 0, 0), (3, 3, 0, 0, 0), (2, 0, 4, 0, 1), (5, 0, 0, 1, 0)]
    assert [r["applied"] for r in rounds] == [True, True, False, True]
    assert "2 valid replies < min-replies 3" in rounds[2]["reason"]
    assert [r["sampled"] for r in rounds] == [6] * 4
    # round 3 changed nothing: the model evaluates exactly as after round 2
    assert (rows[2]["test_loss"], rows[2]["test_accuracy"]) == (rows[1]["test_loss"], rows[1]["test_accuracy"])
    assert rows[3]["test_loss"] != rows[2]["test_loss"]
    # the first reason of each round with failures, and the command's one-line summary of the run
    assert "first_failure" not in rounds[0]
    assert "CUDA out of memory" in rounds[2]["first_failure"] or "MemoryError" in rounds[2]["first_failure"]
    assert "NaN or Inf" in rounds[3]["first_failure"]
    summary = failed_replies(tmp_path)
    assert summary.startswith("8 client replies failed (1 rejected, 4 client errors, 3 timeouts); first, in round ")
    assert summary.split("first, in round ")[1].startswith("2: client "), summary


def test_a_real_client_exception_is_its_own_failure_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client whose data cannot be read fails alone; the other clients of its cohort are used."""
    cfg = RunConfig.from_mapping({**SETTINGS, "num-rounds": 1})
    victim = sample_clients(cfg.seed, 1, cfg.num_clients, cfg.clients_per_round)[0]
    original = FederatedData.client_data

    def client_data(self: FederatedData, cid: int) -> object:
        if cid == victim:
            raise OSError("disk read failed")
        return original(self, cid)

    monkeypatch.setattr(FederatedData, "client_data", client_data)
    strat = build_strategy(cfg, tmp_path)
    with task_identity():
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=2))
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert (row["clients"], row["client_errors"], row["skipped_rounds"]) == (5, 1, 0)
    (line,) = (tmp_path / "rounds.jsonl").read_text().splitlines()
    assert json.loads(line)["applied"] is True


@pytest.mark.parametrize("assignment", ["node", "cohort"])
def test_a_node_that_left_is_its_own_client_error_not_a_timeout(
    tmp_path: Path, assignment: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The SuperLink answers for a node that left with an error of its own: its source is the SuperLink (node 1).

    Only the id of the request it replies to says which node it stands for.
    """
    settings = {**SETTINGS, "num-rounds": 1, "min-replies": 1, "client-assignment": assignment}
    if assignment == "node":
        settings.update({"num-clients": 2, "clients-per-round": 2, "min-nodes": 2})
    cfg = RunConfig.from_mapping(settings)

    def node_left(requests: list[Message], replies: list[Message]) -> list[Message]:
        request = next(m for m in requests if m.metadata.dst_node_id == 101)
        error = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Error: Node Unavailable"), reply_to=request)
        error.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
        return [error, *(m for m in replies if m.metadata.src_node_id != 101)]

    strat = build_strategy(cfg, tmp_path)
    with task_identity(), caplog.at_level(logging.WARNING, logger="flwr"):
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=2, tamper=node_left))
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    lost = 1 if assignment == "node" else 3  # node 101's clients
    assert (row["clients"], row["client_errors"], row["timeouts"]) == (cfg.clients_per_round - lost, lost, 0)
    assert "node 101 error: Error: Node Unavailable" in caplog.text
    assert "not asked" not in caplog.text
