"""Sparse download through a real deployment on loopback: devices keep their model and get only what changed.

Three SuperNodes, two sampled a round, so devices skip rounds and must catch up
over several rounds. Each reply echoes the CRC-32 of the model its device
trained on and the server rejects a mismatch: no rejection means every device's
model equalled the server's, bit for bit, every round. (Which devices a round
samples depends on the SuperNodes' ids, which are new every deployment, so the
bytes are compared with what the same messages would weigh with the whole model,
not with a second deployment.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bridge.messages import model_record, wire_bytes
from experiments.cli import main as fedsketch_main
from fedsketch.config import RunConfig
from fedsketch.data.run import load_data
from fedsketch.model.flat import num_params
from fedsketch.task import make_model

pytestmark = pytest.mark.slow

JOB = {
    "num-rounds": 4,
    "eval-every": 1,
    "clients-per-round": 2,
    "min-nodes": 3,
    "sketch-rows": 5,
    "sketch-cols": 2000,
    "k": 500,
    "lr": 0.2,
    "round-timeout": 120.0,
}


def _deploy(out: Path, download: str) -> list[dict[str, Any]]:
    args = ["deploy", "--out", str(out), "--supernodes", "3", "--strategies", "fetchsgd", "--no-plot"]
    for key, value in {**JOB, "download": download, "experiment": download}.items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    assert fedsketch_main(args) == 0
    run = out / download / "fetchsgd"
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_devices_that_skip_rounds_catch_up_to_the_servers_model_bit_for_bit(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    rows = _deploy(tmp_path, "sparse")
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert sum(r["rejected"] + r["client_errors"] + r["timeouts"] for r in rows) == 0  # every CRC matched
    caught_up = sum(r["sparse_downloads"] for r in rows)
    assert caught_up > 0
    cfg = RunConfig.from_mapping({**JOB, "client-assignment": "node", "num-clients": 3})
    model = wire_bytes(model_record(np.zeros(num_params(make_model(cfg, load_data(cfg))), np.float32)))
    sent = rows[-1]["cum_download_bytes"]
    assert sent == rows[-1]["cum_download_sent_bytes"]  # one client a message: billed as sent
    assert sent < model * sum(r["clients"] for r in rows) - caught_up * model // 2  # catch-ups far below the model
