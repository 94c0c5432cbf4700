"""The fast path (one node runs a cohort of logical clients per call) equals one client per call.

Large-client simulation runs many logical clients in one ClientApp call so
that Flower's per-call cost is paid per node, not per client. Each logical
client must stay exact: its own data, batches, sketch, bytes and state. Here
the same run goes once with every sampled client on one node (the whole
cohort in one call) and once with as many nodes as sampled clients (one
client per call); metrics rows, billed bytes and the final model must be
identical. Only the bytes that crossed the wire differ: one model per message.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Message

from bridge.flower import task_identity
from fedsketch import wire
from fedsketch.config import RunConfig
from strategies.server_app import build_strategy
from tests.federation import SMALL_SKETCH_RUN, TestGrid

SETTINGS = {**SMALL_SKETCH_RUN, "num-rounds": 6, "eval-every": 2}
TIMING = ("wall_s", "unix_time")
SENT = ("download_sent_bytes", "cum_download_sent_bytes")  # one model per message: depends on the messages


def billed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in SENT} for r in rows]


def run(tmp_path: Path, settings: dict[str, Any], nodes: int) -> tuple[list[dict[str, Any]], torch.Tensor, int]:
    """Metrics rows (timing removed), final weights, and the most clients any one message carried."""
    cfg = RunConfig.from_mapping({**SETTINGS, **settings})
    out = tmp_path / f"nodes{nodes}"
    strat = build_strategy(cfg, out)
    widest = 0

    def watch(requests: list[Message], replies: list[Message]) -> list[Message]:
        nonlocal widest
        for msg in requests:
            widest = max(widest, len(msg.content.config_records[wire.CONFIG_KEY][wire.CIDS]))  # type: ignore[arg-type]
        return replies

    with task_identity():
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=nodes, tamper=watch, shuffle_seed=nodes))
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in rows], strat.weights, widest


@pytest.mark.parametrize(
    "settings",
    [{}, {"strategy": "local_topk", "k": 500}, {"strategy": "sketched_sgd", "momentum": 0.0}, {"download": "sparse"}],
    ids=["fetchsgd", "local_topk", "sketched_sgd", "sparse-download"],
)
def test_a_cohort_per_call_gives_the_same_run_as_one_client_per_call(tmp_path: Path, settings: dict[str, Any]) -> None:
    cohort_rows, cohort_w, cohort_width = run(tmp_path, settings, nodes=1)
    single_rows, single_w, single_width = run(tmp_path, settings, nodes=SETTINGS["num-clients"])
    assert (cohort_width, single_width) == (SETTINGS["clients-per-round"], 1)  # the two paths really differ
    assert billed(cohort_rows) == billed(single_rows)
    assert all(c["download_sent_bytes"] < s["download_sent_bytes"] for c, s in zip(cohort_rows, single_rows))
    if "download" not in settings:  # one client per message: billed as sent
        assert all(s["download_sent_bytes"] == s["download_bytes"] for s in single_rows)
    assert torch.equal(cohort_w, single_w)
    assert cohort_rows[-1]["cum_upload_bytes"] > 0 and cohort_rows[-1]["clients"] == 2 * SETTINGS["clients-per-round"]
