"""SIGKILL a real Flower run mid-way, start it again with another round timeout: it ends as an uninterrupted run does.

Both runs go through `fedsketch run` (Flower's simulation runtime in one process, whose ServerApp is
killed with everything else after round 5; checkpoints every 2 rounds). The second start changes
`round-timeout`, a setting that may change between runs: it resumes after round 4 and says so on
its console. The comparison is exact: the final model bit for bit (from each run's last
checkpoint) and every metrics row but its clock fields, so it also checks that two real Flower
runs of the same config and seed are deterministic on the CPU.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from experiments.flower import procs
from fedsketch.config import RunConfig
from fedsketch.server import checkpoint

pytestmark = pytest.mark.slow
FEDSKETCH = str(Path(sys.executable).parent / "fedsketch")
SETTINGS = [
    "num-clients=20",
    "clients-per-round=10",
    "num-rounds=6",
    "eval-every=1",
    "checkpoint-every=2",
    "sketch-rows=3",
    "sketch-cols=5000",
    "k=2000",
    "lr=0.5",
    "lr-schedule=linear",
    "experiment=resume",
]
CLOCK = ("wall_s", "unix_time")


def command(out: Path, *changed: str) -> list[str]:
    args = [FEDSKETCH, "run", "--out", str(out), "--strategies", "fetchsgd", "--no-plot", "--no-plan"]
    for pair in [*SETTINGS, *changed]:
        args += ["--set", pair]
    return args


def run_dir(out: Path) -> Path:
    return out / "resume" / "fetchsgd"


def rows(path: Path, name: str) -> list[dict[str, Any]]:
    lines = (path / name).read_text().splitlines() if (path / name).exists() else []
    return [{k: v for k, v in json.loads(line).items() if k not in CLOCK} for line in lines]


def final_weights(path: Path) -> torch.Tensor:
    cfg = RunConfig.from_mapping(json.loads((path / "config.json").read_text()))
    ckpt = checkpoint.load(path, cfg)
    assert ckpt is not None and ckpt.round == cfg.num_rounds
    return ckpt.weights


def kill_everything(proc: subprocess.Popen[bytes], flwr_home: Path) -> None:
    """SIGKILL, no grace: the CLI's group, then every process of the run's private Flower home and every
    process the CLI started.

    Ray's agents rename themselves and no longer show ``FLWR_HOME`` in ``/proc``: they are found
    as children of the raylet before it goes (:func:`experiments.flower.procs.carrying`). The
    simulation process the CLI forked before its run (experiments/flower/spare.py) carries the CLI's
    environment, not the run's: it is found as the CLI's child.
    """
    seen: procs.Seen = {pid: procs.start_time(pid) for pid in procs.descendants({proc.pid})}
    procs.carrying("FLWR_HOME", str(flwr_home), seen)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    for _ in range(3):  # Ray may still be spawning workers
        for pid in procs.carrying("FLWR_HOME", str(flwr_home), seen):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(1.0)


def test_a_run_killed_mid_way_resumes_to_the_uninterrupted_result(tmp_path: Path, no_leftover_processes: None) -> None:
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    done = subprocess.run(command(whole), capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    proc = subprocess.Popen(command(cut), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline, path = time.monotonic() + 600, run_dir(cut)
    try:  # after round 5 has ended (its line in rounds.jsonl), before round 6 does: the last checkpoint is round 4's
        while time.monotonic() < deadline and proc.poll() is None and len(rows(path, "rounds.jsonl")) < 5:
            time.sleep(0.01)
    finally:
        for pid in [proc.pid, *procs.descendants({proc.pid})]:  # halted at once; then killed, with all they started
            os.kill(pid, signal.SIGSTOP)
        ended = len(rows(path, "rounds.jsonl"))
        kill_everything(proc, path / "flwr-home")
    assert ended == 5, f"the run was not caught after round 5 ({ended} rounds ended)"

    again = subprocess.run(command(cut, "round-timeout=300"), capture_output=True, text=True, timeout=600, check=False)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    said = [line for line in again.stdout.splitlines() if "resuming" in line]
    print(f"rerun with round-timeout=300, console: {said}")
    assert said == ["fetchsgd seed 0: resuming after round 4 (its checkpoint)"]
    assert "resuming after round 4 from" in (path / "flower.log").read_text(errors="replace")
    assert json.loads((path / "config.json").read_text())["round-timeout"] == 300
    assert torch.equal(final_weights(path), final_weights(run_dir(whole)))
    assert rows(path, "metrics.jsonl") == rows(run_dir(whole), "metrics.jsonl")
    assert rows(path, "rounds.jsonl") == rows(run_dir(whole), "rounds.jsonl")
    assert [r["round"] for r in rows(path, "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
