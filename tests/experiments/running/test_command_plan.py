"""``fedsketch run`` validates, then runs its plan in a process that never imports torch.

The plan and its runner: ``experiments/running/command_plan.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from torch import nn

from experiments.cli import main
from experiments.flower import one_process, spare
from experiments.flower.federation import Federation
from experiments.flower.one_process import SPARE_LOG
from experiments.running import command_plan, runner
from experiments.running.command_plan import Plan, PlannedRun
from fedsketch.server import runlog
from tests.experiments.tiny import tiny
from tests.streams import held_stdout

ROOT = Path(__file__).resolve().parents[3]
WATCHING_HALF = [
    "experiments.cli",
    "experiments.running.command_plan",
    "experiments.running.runner",
    "experiments.flower.launch",
    "experiments.running.progress",
    "experiments.running.stopping",
    "experiments.analysis.results",
    "fedsketch.server.runlog",
]


def _experiment(tmp_path: Path) -> runner.Experiment:
    overrides = {"out-dir": str(tmp_path), "num-rounds": 3, "experiment": "plan"}
    config = ROOT / "experiments" / "configs" / "default.toml"
    return runner.load_experiment(config, overrides, seeds=2, strategies=["fetchsgd", "fedavg"])


def test_a_plan_read_back_names_the_same_runs_folders_and_settings(tmp_path: Path) -> None:
    experiment = _experiment(tmp_path)
    federation = Federation(num_supernodes=3, cpus_per_client=1, gpus_per_client=0.5, backend="ray")
    plan = Plan.from_json(Plan.of(experiment.runs, federation, plot=False).to_json())
    assert (plan.federation, plan.plot, len(plan.runs)) == (federation, False, 4)
    for cfg, run in zip(experiment.runs, plan.runs, strict=True):
        assert run.to_mapping() == cfg.to_mapping()
        assert runlog.run_dir(run) == runlog.run_dir(cfg) and runner.describe(run) == runner.describe(cfg)
        assert (run.num_rounds, run.checkpoint_every) == (cfg.num_rounds, cfg.checkpoint_every)
    assert runner.prepare(plan.runs[1]).joinpath("run_config.toml").is_file()
    assert not runner.is_finished(plan.runs[1])


def test_an_unknown_backend_in_a_plan_is_refused() -> None:
    text = Plan((PlannedRun({"experiment": "x"}),), Federation(), plot=True).to_json().replace("inprocess", "threads")
    with pytest.raises(ValueError, match="backend must be one of"):
        Plan.from_json(text)


def test_the_watching_half_imports_no_torch() -> None:
    code = (
        f"import sys\nfor m in {WATCHING_HALF!r}: __import__(m)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:500]


@pytest.mark.slow
def test_run_as_a_program_watches_flower_from_the_same_pid_without_torch(tmp_path: Path) -> None:
    args = [
        "run",
        "--out",
        str(tmp_path),
        "--strategies",
        "fedavg",
        "--no-plot",
        "--set",
        "num-rounds=40",
        "--set",
        "eval-every=1",
        "--set",
        "num-clients=20",
        "--set",
        "clients-per-round=10",
    ]
    log = tmp_path / "cli.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "experiments.cli", *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT
        )
    metrics = tmp_path / "default" / "fedavg" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not (metrics.exists() and metrics.read_text()) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
    finally:
        code = proc.wait(timeout=300)
    assert b"run-plan" in cmdline, (cmdline, log.read_text()[-2000:])
    assert "libtorch" not in maps
    assert code == 0, log.read_text()[-2000:]
    assert "fedavg seed 0: finished" in log.read_text()
    flower_log = (tmp_path / "default" / "fedavg" / "flower.log").read_text(errors="replace")
    assert runlog.SERVER_DONE_LOG in flower_log  # Flower was stopped only once the ServerApp's logs were all in
    assert SPARE_LOG in flower_log  # the simulation process started before the forecast went on across the exec
    plan_file = Path(cmdline[cmdline.index(b"run-plan") + 1].decode())
    assert not plan_file.exists()


def _tiny_plan(tmp_path: Path) -> Plan:
    runs = runner.load_experiment(tiny(tmp_path), {"out-dir": str(tmp_path / "runs")}).runs
    return Plan.of(runs, Federation(num_supernodes=1), plot=False)


@pytest.mark.slow  # a real Flower run through its processes (seconds)
def test_the_second_half_runs_the_plan_file_and_removes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plan.json"
    path.write_text(_tiny_plan(tmp_path).to_json(), encoding="utf-8")
    assert main([command_plan.RUN_PLAN, str(path)]) == 0
    assert not path.exists()
    folder = tmp_path / "runs" / "tiny" / "fedavg"
    assert f"fedavg seed 0: finished  ({folder})" in capsys.readouterr().out
    assert (folder / "metrics.jsonl").read_text().count("\n") == 2
    path.write_text("{", encoding="utf-8")
    with pytest.raises(json.JSONDecodeError):
        command_plan.read_plan(path)
    assert not path.exists()  # removed once read, even when it could not be parsed


def _records_its_command(input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    """A model builder that, in the process the run trains in, notes the commands recorded as running."""
    state = Path(os.environ["FEDSKETCH_STATE_DIR"])
    running = [json.loads(p.read_text())["command"] for p in (state / "invocations").glob("*.json")]
    (state / "running.json").write_text(json.dumps(running))
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))


@pytest.mark.slow  # a real Flower run through its processes (seconds)
def test_a_running_plan_is_recorded_as_fedsketch_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The record names the command to whoever stops what it left after a SIGKILL (stopping.reap)."""
    monkeypatch.setenv("FEDSKETCH_STATE_DIR", str(tmp_path / "state"))
    model = f"{__name__}:{_records_its_command.__name__}"
    overrides = {"out-dir": str(tmp_path / "runs"), "model": model, "num-rounds": 1}
    runs = runner.load_experiment(tiny(tmp_path), overrides).runs
    assert command_plan.run_plan(Plan.of(runs, Federation(num_supernodes=1), plot=False)) == 0
    assert json.loads((tmp_path / "state" / "running.json").read_text()) == ["run"]


WHY = "this model cannot be built " + "because " * 80  # longer than the 500 characters a reason line shows


def _unbuildable(input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    raise RuntimeError(WHY)


@pytest.mark.slow  # a real Flower run through its processes (seconds)
def test_a_failed_run_makes_the_command_exit_1_and_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    overrides = {"out-dir": str(tmp_path / "runs"), "model": f"{__name__}:{_unbuildable.__name__}", "num-rounds": 1}
    runs = runner.load_experiment(tiny(tmp_path), overrides).runs
    assert command_plan.run_plan(Plan.of(runs, Federation(num_supernodes=1), plot=False)) == 1
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("fedavg seed 0: failed"))
    reason = lines[at + 1]  # under the outcome, indented past its label, cut at 500 characters
    assert reason.startswith(" " * 26) and len(reason) == 26 + 500 and "this model cannot be built" in reason


@pytest.mark.slow  # a real Flower run through its processes (seconds)
def test_the_first_half_flushes_and_execs_the_second_on_a_plan_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line it execs runs the plan (here as a child process)."""
    raw = held_stdout(monkeypatch)
    monkeypatch.setenv(spare.ENV, "[1, 2, []]")  # a stale description: no spare waits, so none is handed over
    calls: list[list[str]] = []

    def execv(path: str, argv: list[str]) -> None:
        calls.append([path, *argv])
        raise SystemExit(0)

    monkeypatch.setattr(os, "execv", execv)
    print("validated", end="")
    plan = _tiny_plan(tmp_path)
    with pytest.raises(SystemExit):
        command_plan.exec_run_plan(plan)
    assert raw.getvalue() == b"validated" and spare.ENV not in os.environ
    (path, *argv) = calls[0]
    assert path == argv[0] == sys.executable
    assert argv[1:5] == ["-c", command_plan._ENTRY, str(command_plan.APP_DIR), command_plan.RUN_PLAN]
    plan_file = Path(argv[5])
    assert plan_file.name.startswith("fedsketch-plan-") and plan_file.suffix == ".json"
    assert Plan.from_json(plan_file.read_text(encoding="utf-8")) == plan
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "fedavg seed 0: finished" in done.stdout and not plan_file.exists()
    assert (tmp_path / "runs" / "tiny" / "fedavg" / "metrics.jsonl").read_text().count("\n") == 2


def test_a_spare_simulation_process_is_started_only_for_runs_through_one_process() -> None:
    try:
        command_plan.start_spare(None, "superlink")
        assert spare.waiting_pid() is None
        command_plan.start_spare(None, "process")
        assert spare.waiting_pid() is not None
        assert spare.take(one_process.spare_key(command_plan.APP_DIR, "ray")) is None  # started for inprocess
        command_plan.start_spare("ray", "process")
        taken = spare.take(one_process.spare_key(command_plan.APP_DIR, "ray"))
        assert taken is not None
        taken.release()
    finally:
        spare.release()
