"""Through ``fedsketch run`` and Flower's simulation: a client whose data makes its update a million times the
others' is set aside under the defaults, and with ``norm-bound = 0`` the run fails in one line saying why."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from experiments.cli import main as fedsketch_main


def _poisoned(path: Path) -> Path:
    """20 clients of 30 samples (the natural partition); client 0's features a million times the others'."""
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((3, 8)).astype(np.float32) * 2
    y = rng.integers(0, 3, 700)
    x = (centers[y] + rng.standard_normal((700, 8))).astype(np.float32)
    ids = np.arange(600) // 30
    x[:600][ids == 0] *= np.float32(1e6)
    file = path / "poisoned.npz"
    np.savez(file, x_train=x[:600], y_train=y[:600], x_test=x[600:], y_test=y[600:], client_ids=ids)
    return file


@pytest.mark.slow
def test_a_poisoned_client_is_set_aside_and_without_the_bound_the_run_fails_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_leftover_processes: None
) -> None:
    data = _poisoned(tmp_path)
    common = ["run", "--strategies", "fedavg", "--no-plan", "--no-plot", "--out", str(tmp_path)]
    settings = ["dataset=npz", f"data-root={data}", "partition=natural", "num-clients=20", "clients-per-round=10"]
    settings += ["num-rounds=6", "eval-every=3", "model-hidden=16"]
    args = [*common, *(arg for s in settings for arg in ("--set", s))]
    assert fedsketch_main([*args, "--set", "experiment=bounded"]) == 0
    rows = [json.loads(line) for line in (tmp_path / "bounded" / "fedavg" / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["bounded"] for r in rows) >= 1 and np.isfinite(rows[-1]["test_loss"])
    capsys.readouterr()
    assert fedsketch_main([*args, "--set", "experiment=unbounded", "--set", "norm-bound=0"]) == 1
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if "the model is broken" in line]
    assert len(failed) == 1 and "failed" in failed[0] and "norm-bound = 0" in failed[0], out[-2000:]
