"""Run outputs a user can look at: ``config.json`` and ``metrics.jsonl``.

One JSON object per evaluated round, appended and flushed as the run goes, so
an interrupted run keeps every round it finished. ``rounds.jsonl`` has one
line per round on who answered, who failed (timeouts, client errors, rejected
replies) and whether the round's update was applied.

A sweep point of an experiment runs with ``experiment = "NAME/POINT"`` (e.g.
``"default/rows3-cols5000"``, see ``experiments/sweep.py``): the ServerApp
learns where to write only from the run config, and the run config has no
other free-form field that a sweep could name itself in. Its folder is
``<out-dir>/NAME/<strategy>/POINT``, beside the strategy's other points.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fedsketch.config import RunConfig

ROUNDS = "rounds.jsonl"
POINT_SEP = "/"
"""Separates an experiment's name from a sweep point's in ``RunConfig.experiment``."""


def experiment_name(cfg: RunConfig) -> str:
    """The experiment's own name, without the sweep point."""
    return cfg.experiment.partition(POINT_SEP)[0]


def sweep_point(cfg: RunConfig) -> str:
    """The sweep point's name (e.g. ``rows3-cols5000``); ``""`` for a run that is not part of a sweep."""
    return cfg.experiment.partition(POINT_SEP)[2]


def experiment_dir(cfg: RunConfig) -> Path:
    """``<out-dir>/<experiment>``: the folder of every run of the experiment, and of its plots and report."""
    return Path(cfg.out_dir) / experiment_name(cfg)


def run_dir(cfg: RunConfig) -> Path:
    """``<out-dir>/<experiment>/<strategy>[/<sweep point>]``, plus ``seed<k>`` when the seed is not 0."""
    path = experiment_dir(cfg) / cfg.strategy
    if sweep_point(cfg):
        path = path / sweep_point(cfg)
    return path / f"seed{cfg.seed}" if cfg.seed else path


def write_config(cfg: RunConfig, path: Path) -> None:
    """Write ``config.json`` atomically."""
    path.mkdir(parents=True, exist_ok=True)
    _atomic_write(path / "config.json", json.dumps(cfg.to_mapping(), indent=2, sort_keys=True) + "\n")


def append_metrics(path: Path, row: dict[str, Any], name: str = "metrics.jsonl") -> None:
    """Append one row to ``metrics.jsonl`` (or another log, e.g. :data:`ROUNDS`) and flush it to disk."""
    with open(path / name, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every row of ``metrics.jsonl`` (empty when the run has none yet)."""
    file = path / "metrics.jsonl"
    if not file.exists():
        return []
    with open(file, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _atomic_write(file: Path, text: str) -> None:
    tmp = file.with_suffix(file.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, file)
