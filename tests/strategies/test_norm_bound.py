"""One hostile client cannot wreck the model under the defaults: ``norm-bound`` sets its upload aside.

A client that sends its update scaled by 10^6 is set aside each round it does (counted as ``bounded``):
the run moves exactly as the same run where that client never answered; with the bound off the model
breaks, and the run says so (``strategy.broken()``, which the command turns into a failed run and exit 1).
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from flwr.app import Array, ConfigRecord, Message
from flwr.serverapp import Grid

from bridge.flower import task_identity
from bridge.messages import records_of
from fedsketch.client.uploads import beyond_bound
from fedsketch.config import RunConfig
from fedsketch.server import runlog
from strategies.server_app import build_strategy
from strategies.strategy import FedSketchStrategy
from tests.federation import TestGrid

HOSTILE = 3  # the client id that scales its uploads
SETTINGS = {
    "num-clients": 30,
    "clients-per-round": 10,
    "model-hidden": 32,
    "num-rounds": 8,
    "eval-every": 4,
    "k": 300,
    "sketch-cols": 1000,
}


def test_the_bound_is_relative_to_the_median() -> None:
    assert beyond_bound([1.0, 2.0, 3.0, 40.0], 10.0) == [False, False, False, True]  # median 2.5: 25 is the bound
    assert beyond_bound([1.0, 2.0, 3.0, 25.0], 10.0) == [False] * 4  # at the bound is within it
    assert beyond_bound([1.0, 2.0, 30.0], 10.0) == [False, False, True]  # odd count: the middle one
    assert beyond_bound([0.0, 0.0, 5.0], 10.0) == [False] * 3  # a zero median bounds nothing
    assert beyond_bound([1.0, 1e9], 0.0) == [False, False]  # 0: off
    assert beyond_bound([], 10.0) == []


def scaled(requests: list[Message], replies: list[Message]) -> list[Message]:
    """Client HOSTILE's upload, every float array times 10^6 (finite: it passes every check but the bound)."""
    for reply in replies:
        record = records_of(reply.content).arrays.get(f"update.{HOSTILE}")
        for name, array in list(record.items()) if record is not None else []:
            values = array.numpy()
            if values.dtype.kind == "f":
                record[name] = Array(values * np.float32(1e6))
    return replies


def run(settings: dict[str, Any], tamper: Any = None) -> FedSketchStrategy:
    cfg = RunConfig.from_mapping({**SETTINGS, **settings})
    strat = build_strategy(cfg, None)
    with task_identity():
        strat.start(cast(Grid, TestGrid(cfg.to_mapping(), num_nodes=2, tamper=tamper)))
    return strat


def silent(requests: list[Message], replies: list[Message]) -> list[Message]:
    """Client HOSTILE answers with a failure instead of its upload: the same round without its contribution."""
    for reply in replies:
        content = reply.content
        if f"update.{HOSTILE}" in content:
            del content[f"update.{HOSTILE}"], content[f"metrics.{HOSTILE}"]
            content[f"failure.{HOSTILE}"] = ConfigRecord({"reason": "left out"})
    return replies


@pytest.mark.parametrize("strategy", ["fetchsgd", "fedavg", "local_topk"])
def test_a_client_scaling_its_update_by_a_million_weighs_what_a_silent_one_does_under_the_defaults(
    strategy: str,
) -> None:
    attacked, without = run({"strategy": strategy}, scaled), run({"strategy": strategy}, silent)
    assert sum(r["bounded"] for r in attacked.history) == sum(r["client_errors"] for r in without.history) >= 1
    assert torch.equal(attacked.weights, without.weights)  # set aside: it moved the model not at all
    assert [r["test_accuracy"] for r in attacked.history] == [r["test_accuracy"] for r in without.history]
    assert attacked.broken() is None and sum(r["bounded"] for r in run({"strategy": strategy}).history) == 0


def test_with_the_bound_off_the_same_client_breaks_the_model_and_the_run_says_so(tmp_path: Path) -> None:
    strat = run({"strategy": "fedavg", "norm-bound": 0.0}, scaled)
    why = strat.broken()
    assert why is not None and "the model is broken" in why and "norm-bound = 0" in why
    assert not math.isfinite(strat.history[-1]["test_loss"])
    runlog.mark_server_done(tmp_path, 8, why)
    assert runlog.broken(tmp_path) == why


def test_a_node_that_merges_sets_the_same_upload_aside_as_the_server(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 6)).astype(np.float32)
    y = (np.arange(40) % 2).astype(np.int64)
    x[:4] *= np.float32(1e6)  # the first client's data: its gradient a million times the others'
    np.savez(tmp_path / "d.npz", x_train=x, y_train=y, x_test=x[4:12], y_test=y[4:12])
    base = {
        **SETTINGS,
        "strategy": "fedavg",
        "dataset": "npz",
        "data-root": str(tmp_path / "d.npz"),
        "partition": "iid",
        "num-clients": 10,
        "clients-per-round": 10,
        "local-batch-size": 4,
        "num-rounds": 1,
        "eval-every": 1,
    }
    alone, merged = run(base), run({**base, "merge-uploads": True})
    assert alone.history[0]["bounded"] == merged.history[0]["bounded"] == 1
    assert alone.history[0]["upload_bytes"] == merged.history[0]["upload_bytes"]
    assert alone.history[0]["clients"] == merged.history[0]["clients"] == 9


def test_the_bound_is_a_setting_with_a_default(tmp_path: Path) -> None:
    assert RunConfig().norm_bound == 10.0
    with pytest.raises(Exception, match="norm-bound"):
        RunConfig.from_mapping({"norm-bound": -1.0})
    strat = run({"strategy": "fetchsgd", "num-rounds": 4})
    assert strat.broken() is None and all("bounded" in r for r in strat.history)
    line = strat.history[-1]
    assert line["round"] == 4 and line["bounded"] == 0


def test_an_upload_set_aside_is_logged_and_recorded_under_its_own_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = RunConfig.from_mapping({**SETTINGS, "strategy": "fedavg"})
    strat = build_strategy(cfg, tmp_path)
    with task_identity(), caplog.at_level(logging.WARNING, logger="flwr"):
        strat.start(cast(Grid, TestGrid(cfg.to_mapping(), num_nodes=2, tamper=scaled)))
    prefix = f"client {HOSTILE} set aside by the norm bound: "
    whys = [m.removeprefix(prefix) for m in caplog.messages if m.startswith(prefix)]
    bounded = [line for line in runlog.read_metrics(tmp_path, runlog.ROUNDS) if line["bounded"]]
    assert len(whys) == len(bounded) == sum(line["bounded"] for line in bounded) >= 1
    assert all(re.fullmatch(r"upload norm \S+ is beyond norm-bound 10 x the round's median \S+", why) for why in whys)
    assert [line["first_failure"] for line in bounded] == [f"client {HOSTILE}: {why}" for why in whys]
