"""Stopping a command and what it started, on real (small) processes; marking stopped runs.

The same through real Flower and Ray processes is in tests/e2e/test_stopping.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.cli import main as fedsketch_main
from experiments.flower import procs
from experiments.flower.procs import processes_with_env
from experiments.running import runner, stopping
from fedsketch.config import RunConfig
from fedsketch.server import checkpoint, runlog


def _sleeper(token: str, ignore_term: bool = False) -> subprocess.Popen[bytes]:
    """A detached process carrying ``token``, as Flower's SuperExec and Ray's workers are."""
    script = ("trap '' TERM; " if ignore_term else "") + "sleep 60 & wait"
    env = dict(os.environ, **{stopping.TOKEN_VAR: token})
    return subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_signal_stops_every_process_carrying_the_token_and_ends_the_command(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with (
        pytest.raises(stopping.Interrupted) as stopped,
        stopping.Invocation("run", state=tmp_path, grace_s=0.5) as invocation,
    ):
        assert os.environ[stopping.TOKEN_VAR] == invocation.token
        entry = json.loads(next((tmp_path / "invocations").glob("*.json")).read_text())
        assert (entry["token"], entry["pid"]) == (invocation.token, os.getpid())
        polite = subprocess.Popen(["sleep", "60"])  # inherits the token from os.environ
        stubborn = _sleeper(invocation.token, ignore_term=True)  # only SIGKILL stops it
        deadline = time.monotonic() + 10
        while len(processes_with_env(stopping.TOKEN_VAR, invocation.token)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        pytest.fail("SIGTERM did not end the command")
    assert (stopped.value.exit_code, invocation.stopped_by) == (143, stopped.value)
    assert polite.wait(timeout=1) == -signal.SIGTERM
    assert stubborn.wait(timeout=1) == -signal.SIGKILL
    assert not processes_with_env(stopping.TOKEN_VAR, invocation.token)
    assert signal.getsignal(signal.SIGTERM) == before and stopping.TOKEN_VAR not in os.environ
    assert not list((tmp_path / "invocations").glob("*.json"))


def test_the_next_command_stops_what_a_killed_one_left_and_says_so(tmp_path: Path) -> None:
    records = tmp_path / "invocations"
    records.mkdir()
    run = tmp_path / "runs" / "default" / "fetchsgd"
    run.mkdir(parents=True)
    runlog.append_metrics(run, {"round": 3, "strategy": "fetchsgd"})
    left = [_sleeper("fedsketch-killed"), _sleeper("fedsketch-killed")]
    alive = _sleeper("fedsketch-alive")
    try:
        gone = {"token": "fedsketch-killed", "pid": _dead_pid(), "pid-start": 1, "command": "run", "run": [str(run), 9]}
        (records / "killed.json").write_text(json.dumps(gone))
        own = procs.start_time(os.getpid())  # a live command: never touched
        live = {"token": "fedsketch-alive", "pid": os.getpid(), "pid-start": own, "command": "deploy", "run": None}
        (records / "alive.json").write_text(json.dumps(live))
        time.sleep(0.3)
        lines = stopping.reap(records, grace_s=2.0)
        assert len(lines) == 1
        assert lines[0].startswith("fedsketch: stopped 4 processes left by `fedsketch run` (pid ")  # 2 bash + 2 sleep
        assert lines[0].endswith(f"its run {run} is marked interrupted")
        assert [p.wait(timeout=2) for p in left] == [-signal.SIGTERM] * 2
        assert alive.poll() is None and (records / "alive.json").exists() and not (records / "killed.json").exists()
        assert runlog.status_note(runlog.read_status(run) or {}) == "interrupted (killed) after round 3 of 9"
        assert stopping.reap(records) == []  # said once
    finally:
        os.killpg(alive.pid, signal.SIGKILL)
        alive.wait()


def test_sigusr1_skips_the_current_run_at_its_next_poll(tmp_path: Path) -> None:
    polls: list[int] = []
    with stopping.Invocation("run", state=tmp_path) as invocation:
        poll = stopping.checked(lambda: polls.append(1))
        poll()
        invocation.start_run(tmp_path, 10)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.1)
        with pytest.raises(stopping.Skipped):
            poll()
        poll()  # once
    assert polls == [1, 1] and invocation.stopped_by is None


def _experiment(tmp_path: Path, **settings: object) -> runner.Experiment:
    values = {"out-dir": str(tmp_path), "num-rounds": 4, **settings}
    return runner.load_experiment(runner.DEFAULT_CONFIG, values, strategies=["fetchsgd", "fedavg", "true_topk"])


def _rounds(stop_after: dict[str, tuple[int, stopping.Stop]]):  # type: ignore[no-untyped-def]
    """A stand-in for Flower that logs rounds and is stopped where ``stop_after`` says."""

    def execute(cfg: RunConfig, path: Path) -> int:
        runlog.write_config(cfg, path)
        start = len(runlog.read_metrics(path))
        for rnd in range(start + 1, cfg.num_rounds + 1):
            runlog.append_metrics(path, {"round": rnd, "strategy": cfg.strategy})
            if cfg.strategy in stop_after and rnd == stop_after[cfg.strategy][0]:
                raise stop_after[cfg.strategy][1]
        return 0

    return execute


def test_a_skipped_run_is_marked_and_the_next_runs_interrupted_run_ends_the_experiment(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    stops = {"fetchsgd": (2, stopping.Skipped()), "fedavg": (3, stopping.Interrupted(signal.SIGINT))}
    outcomes = [o for _, o in runner.run_all(exp.runs, _rounds(stops))]  # type: ignore[arg-type]
    assert outcomes == [
        "skipped (SIGUSR1) after round 2 of 4",
        "interrupted (SIGINT) after round 3 of 4",
        "not started",
    ]
    fetch, dense = (runlog.run_dir(cfg) for cfg in exp.runs[:2])
    status = runlog.read_status(fetch) or {}
    assert (status["state"], status["cause"], status["round"], status["num-rounds"]) == ("skipped", "SIGUSR1", 2, 4)
    assert [r["round"] for r in runlog.read_metrics(dense)] == [1, 2, 3]
    assert not runlog.run_dir(exp.runs[2]).exists()
    # The next command restarts both from scratch, as it does any unfinished run.
    assert [o for _, o in runner.run_all(exp.runs, _rounds({}))] == ["finished"] * 3  # type: ignore[arg-type]
    assert runlog.read_status(fetch) is None and runlog.read_status(dense) is None
    assert [r["round"] for r in runlog.read_metrics(dense)] == [1, 2, 3, 4]


def test_an_interrupted_run_that_checkpoints_resumes_and_is_no_longer_marked(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, **{"checkpoint-every": 1})
    stops = {"fetchsgd": (2, stopping.Interrupted(signal.SIGTERM))}
    runner.run_all(exp.runs, _rounds(stops))  # type: ignore[arg-type]
    path = runlog.run_dir(exp.runs[0])
    (path / checkpoint.FILE).write_bytes(b"stands for the checkpoint of round 2")
    assert runner.is_resumable(exp.runs[0]) and runlog.read_status(path) is not None
    assert [o for _, o in runner.run_all(exp.runs, _rounds({}))] == ["finished"] * 3  # type: ignore[arg-type]
    assert [r["round"] for r in runlog.read_metrics(path)] == [1, 2, 3, 4]  # resumed: rounds 1-2 kept
    assert runlog.read_status(path) is None


def test_report_and_plot_say_which_runs_were_stopped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = _experiment(tmp_path)
    for cfg in exp.runs[:2]:
        path = runner.prepare(cfg)
        runlog.write_config(cfg, path)
        for rnd in range(1, 3 if cfg.strategy == "fetchsgd" else 5):
            runlog.append_metrics(
                path,
                {
                    "round": rnd,
                    "strategy": cfg.strategy,
                    "seed": 0,
                    "test_accuracy": 0.1 * rnd,
                    "cum_upload_bytes": 10**6 * rnd,
                    "cum_download_bytes": 10**7 * rnd,
                    "cum_dense_upload_bytes": 10**7 * rnd,
                },
            )
    runlog.write_status(runlog.run_dir(exp.runs[0]), "interrupted", "SIGINT", 4)
    exp_dir = tmp_path / "default"
    assert fedsketch_main(["report", str(exp_dir)]) == 0
    markdown = capsys.readouterr().out
    assert "| fetchsgd (stopped early) " in markdown and "| fedavg " in markdown and "fedavg (stopped" not in markdown
    assert "- fetchsgd: seed 0 interrupted (SIGINT) after round 2 of 4" in markdown
    assert "seed 0 interrupted (SIGINT) after round 2 of 4" in (exp_dir / "report.csv").read_text()
    assert fedsketch_main(["plot", str(exp_dir)]) == 0
    assert "fetchsgd: seed 0 interrupted (SIGINT) after round 2 of 4" in capsys.readouterr().out


def test_a_child_that_lost_the_token_is_stopped_with_its_parent() -> None:
    """Ray's processes rename themselves, which can overwrite the environment /proc shows: children count too."""
    token = f"fedsketch-test-{os.getpid()}-{time.monotonic_ns()}"
    code = "import subprocess, time; c = subprocess.Popen(['/bin/sleep', '60'], env={}); print(c.pid, flush=True); time.sleep(60)"
    parent = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, stopping.TOKEN_VAR: token}, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert b"FEDSKETCH" not in Path(f"/proc/{child}/environ").read_bytes()
    assert stopping.stop_token(token, grace_s=0.5) == 2
    assert parent.wait(timeout=5) == -signal.SIGTERM
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1][:3]
