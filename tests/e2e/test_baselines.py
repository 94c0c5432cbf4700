"""Every strategy through a real Flower simulation: two rounds each, bytes equal to what was serialized."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from bridge.messages import client_metrics, model_record, payload_to_record, wire_bytes
from experiments.cli import main as fedsketch_main
from fedsketch.config import RunConfig
from fedsketch.data.run import load_data
from fedsketch.methods import NAMES as STRATEGIES
from fedsketch.methods import get_method
from fedsketch.model.flat import num_params
from fedsketch.task import make_model
from strategies.plan import sample_clients
from tests.method_helpers import encode, second_exchange_upload

pytestmark = pytest.mark.slow

RUN = """
[run]
experiment = "all"
dataset = "synthetic"
model = "mlp"
model-hidden = 64
num-clients = 12
clients-per-round = 6
num-rounds = 2
eval-every = 1
sketch-rows = 3
sketch-cols = 1000
k = 200
candidate-factor = 2

[strategy.local_topk]
client-state = "disk"
"""


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


def _expected_upload(cfg: RunConfig) -> int:
    """Sum over rounds and sampled clients of the serialized payload and metrics records.

    The payload's layout (and so its size) depends only on the method and d,
    not on the values, for every method but Gaussian-k (checked separately).
    """
    data = load_data(cfg)
    d = num_params(make_model(cfg, data))
    echo = get_method(cfg.strategy).wire.round_config(cfg)  # what a client echoes: the sketch's seed and shape, if any
    method = get_method(cfg.strategy)
    request = method.server.requests(method.server.init(cfg, d, torch.device("cpu")), [0], cfg, d).get(0)
    payload, _ = encode(cfg, torch.randn(d), request=request)
    second = second_exchange_upload(cfg, d, lambda answer: wire_bytes(payload_to_record(answer)))
    total = 0
    for rnd in range(1, cfg.num_rounds + 1):
        for cid in sample_clients(cfg.seed, rnd, cfg.num_clients, cfg.clients_per_round):
            n = min(len(data.client_data(cid)[0]), cfg.local_batch_size)
            total += wire_bytes(payload_to_record(payload))
            total += wire_bytes(client_metrics(n, 0.5, 0.1, echo))
            if second:  # the method's second exchange: its answer and a metrics record without the echo
                total += second + wire_bytes(client_metrics(n, 0.5, 0.1))
    return total


def test_every_strategy_runs_two_rounds_through_flower_and_counts_serialized_bytes(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    config = tmp_path / "all.toml"
    config.write_text(RUN, encoding="utf-8")
    args = ["run", str(config), "--out", str(tmp_path), "--strategies", ",".join(STRATEGIES)]
    assert fedsketch_main(args) == 0
    base = RunConfig.from_mapping({"out-dir": str(tmp_path), **_run_table(config)})
    dense = None
    for name in STRATEGIES:
        cfg = RunConfig.from_mapping({"strategy": name}, base=base)
        rows = _rows(tmp_path / "all" / name)
        assert [r["round"] for r in rows] == [1, 2], name
        assert sum(r["clients"] for r in rows) == 12 and sum(r["failures"] for r in rows) == 0, name
        assert all(np.isfinite(r["test_loss"]) for r in rows), name
        up = rows[-1]["cum_upload_bytes"]
        if name == "gaussiank":  # its count varies: at most k values a client, as local top-k sends
            assert 0 < rows[-1]["values_over_k"] <= 1
            assert 0 < up <= _expected_upload(RunConfig.from_mapping({"strategy": "local_topk"}, base=cfg))
        else:
            assert up == _expected_upload(cfg), name
        if name == "fedavg":
            dense = rows[-1]["cum_download_bytes"]
    d = num_params(make_model(base, load_data(base)))
    assert dense is not None and dense > 12 * wire_bytes(model_record(np.zeros(d, np.float32)))
    sketched = _rows(tmp_path / "all" / "sketched_sgd")
    assert sketched[-1]["cum_download_bytes"] > dense  # the queries and pending supports are charged too
    assert (tmp_path / "all" / "accuracy_vs_upload_bytes.png").stat().st_size > 0
    # local_topk kept its clients' state on disk, and the ServerApp removed it when the run ended
    assert json.loads((tmp_path / "all" / "local_topk" / "config.json").read_text())["client-state"] == "disk"
    assert (tmp_path / "all" / "local_topk").is_dir() and not (
        tmp_path / "all" / "local_topk" / "client-state"
    ).exists()


def _run_table(path: Path) -> dict[str, object]:
    with open(path, "rb") as f:
        return dict(tomllib.load(f)["run"])
