"""Checkpoint and resume: a run interrupted and resumed ends exactly as an uninterrupted one."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Message

from bridge.flower import task_identity
from fedsketch.config import ConfigError, RunConfig
from fedsketch.server import checkpoint
from fedsketch.server.checkpoint import CheckpointError
from strategies.server_app import build_strategy
from strategies.strategy import FedSketchStrategy
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
    "checkpoint-every": 2,
    "lr-schedule": "linear",
}
CLOCK = ("wall_s", "unix_time")


class Crash(Exception):
    """Stands for the server process dying."""


def run(cfg: RunConfig, out: Path, crash_in_round: int | None = None, noise_seed: int = 7) -> FedSketchStrategy:
    def tamper(requests: list[Message], replies: list[Message]) -> list[Message]:
        rnd = int(requests[0].content.config_records["config"]["server-round"])  # type: ignore[arg-type]
        if rnd == crash_in_round:
            raise Crash
        return replies

    strat = build_strategy(cfg, out)
    fixed = torch.Generator().manual_seed(noise_seed)  # DP runs draw secret noise; fix it to compare two runs
    strat.values = replace(strat.values, noise=fixed.get_state())
    with task_identity():
        strat.start(TestGrid(cfg.to_mapping(), tamper=tamper))
    return strat


def rows(path: Path, name: str = "metrics.jsonl") -> list[dict[str, Any]]:
    lines = (path / name).read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in CLOCK} for line in lines]


@pytest.mark.parametrize(
    "settings",
    [
        {"download": "sparse"},
        {"strategy": "fedavg"},
        {"clip-norm": 0.5, "dp-noise-multiplier": 0.3},
        {"strategy": "local_topk", "local-topk-error": "none"},  # clients keep nothing a restart could lose
    ],
)
def test_an_interrupted_run_resumes_to_the_same_model_and_metrics(tmp_path: Path, settings: dict[str, Any]) -> None:
    cfg = RunConfig.from_mapping({**SETTINGS, **settings})
    whole = run(cfg, tmp_path / "whole")
    with pytest.raises(Crash):
        run(cfg, tmp_path / "cut", crash_in_round=4)  # checkpoint after round 2; round 3 is logged, then lost
    assert len(rows(tmp_path / "cut")) == 3
    resumed = run(cfg, tmp_path / "cut", noise_seed=99)  # the saved noise state wins over this seed
    assert torch.equal(resumed.weights, whole.weights)
    for field in ("momentum", "error", "velocity"):
        if hasattr(whole.state, field):
            assert torch.equal(getattr(resumed.state, field), getattr(whole.state, field))
    assert rows(tmp_path / "cut") == rows(tmp_path / "whole")
    assert rows(tmp_path / "cut", "rounds.jsonl") == rows(tmp_path / "whole", "rounds.jsonl")


def test_a_corrupt_checkpoint_is_refused_and_nothing_is_loaded(tmp_path: Path) -> None:
    cfg = RunConfig.from_mapping({**SETTINGS, "num-rounds": 2})
    run(cfg, tmp_path)
    file = tmp_path / checkpoint.FILE
    good = file.read_bytes()
    for bad, message in [
        (good[:-100], "corrupt"),
        (good[:-1] + bytes([good[-1] ^ 1]), "corrupt"),
        (b"PK\x03\x04" + good, "not a fedsketch checkpoint"),
        (b"", "not a fedsketch checkpoint"),
    ]:
        file.write_bytes(bad)
        strat = build_strategy(cfg, tmp_path)
        before = strat.weights.clone()
        with pytest.raises(CheckpointError, match=message), task_identity():
            strat.start(TestGrid(cfg.to_mapping()))
        assert torch.equal(strat.weights, before)


def test_a_checkpoint_of_other_settings_is_refused_but_runtime_settings_may_change(tmp_path: Path) -> None:
    cfg = RunConfig.from_mapping({**SETTINGS, "num-rounds": 2})
    run(cfg, tmp_path)
    other = RunConfig.from_mapping({"lr": 0.2, "sketch-cols": 500}, base=cfg)
    with pytest.raises(CheckpointError, match=r"'lr' 0.1 -> 0.2; 'sketch-cols' 400 -> 500"):
        checkpoint.load(tmp_path, other)
    assert checkpoint.load(tmp_path, RunConfig.from_mapping({"round-timeout": 5.0}, base=cfg)) is not None


def test_a_checkpoint_survives_a_crash_while_the_next_one_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = RunConfig.from_mapping({**SETTINGS, "num-rounds": 2})
    first = run(cfg, tmp_path)
    ckpt = checkpoint.load(tmp_path, cfg)
    assert ckpt is not None and ckpt.round == 2

    def torn(src: object, dst: object) -> None:
        raise OSError("killed before the rename")

    monkeypatch.setattr(os, "replace", torn)
    with pytest.raises(OSError, match="killed"):
        checkpoint.save(tmp_path, cfg, checkpoint.Checkpoint(**{**ckpt.__dict__, "round": 3}))
    monkeypatch.undo()
    again = checkpoint.load(tmp_path, cfg)
    assert again is not None and again.round == 2 and torch.equal(again.weights, first.weights.cpu())


def test_edited_logs_and_stateful_clients_are_refused(tmp_path: Path) -> None:
    cfg = RunConfig.from_mapping({**SETTINGS, "num-rounds": 2})
    run(cfg, tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(CheckpointError, match="metrics.jsonl has 0 bytes"):
        checkpoint.load(tmp_path, cfg)
    with pytest.raises(ConfigError, match="clients keep state on their nodes"):  # refused before any training
        RunConfig.from_mapping({**SETTINGS, "strategy": "local_topk"})


def test_the_same_run_started_again_without_checkpoints_logs_only_its_own_rounds(tmp_path: Path) -> None:
    """As when an operator repeats the same ``flwr run``: one row per round, not the earlier run's rows too."""
    cfg = RunConfig.from_mapping({**SETTINGS, "num-rounds": 2, "checkpoint-every": 0})
    with pytest.raises(Crash):
        run(cfg, tmp_path, crash_in_round=2)  # an earlier attempt left round 1's rows
    run(cfg, tmp_path)
    run(cfg, tmp_path)
    assert [r["round"] for r in rows(tmp_path)] == [1, 2]
    assert [r["round"] for r in rows(tmp_path, "rounds.jsonl")] == [1, 2]
