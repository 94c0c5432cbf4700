"""Run outputs a user can look at: ``config.json`` and ``metrics.jsonl``.

One JSON object per evaluated round, appended and flushed as the run goes, so
an interrupted run keeps every round it finished. ``rounds.jsonl`` has one
line per round on who answered, who failed (timeouts, client errors, rejected
replies) and whether the round's update was applied.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fedsketch.config import RunConfig

ROUNDS = "rounds.jsonl"


def run_dir(cfg: RunConfig) -> Path:
    """``<out-dir>/<experiment>/<strategy>``, plus ``seed<k>`` when the seed is not 0."""
    path = Path(cfg.out_dir) / cfg.experiment / cfg.strategy
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
