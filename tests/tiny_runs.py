"""A tiny run's folder and settings file, as ``fedsketch run`` prepares them, for the tests of the runtimes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from experiments.flower.federation import Federation
from experiments.running import runner
from fedsketch.config import RunConfig

TINY = {"num-clients": 4, "clients-per-round": 2, "num-rounds": 2, "eval-every": 1, "model-hidden": 16, "k": 50}


def tiny_run(out: Path, **changes: object) -> Path:
    """The folder of a tiny run writing below ``out`` (its ``run_config.toml`` in it)."""
    return runner.prepare(RunConfig.from_mapping({**TINY, "out-dir": str(out), **changes}))


def tiny_federation(**changes: object) -> Federation:
    """Two simulated nodes of one CPU each, the in-process backend (``changes`` replace fields)."""
    return dataclasses.replace(Federation(num_supernodes=2, cpus_per_client=1, backend="inprocess"), **changes)


def rounds(path: Path) -> list[int]:
    """The rounds of the metrics rows the run in ``path`` wrote that every sampled client replied to, unrefused."""
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    every = TINY["clients-per-round"]
    return [r["round"] for r in rows if r["clients"] == every and r["client_errors"] == r["rejected"] == 0]
