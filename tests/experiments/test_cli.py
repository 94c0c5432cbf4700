"""Bad command-line arguments, and an app config that lacks a setting, are refused in one line naming them.

``fedsketch`` (its ``main``, in this process) for counts that must be at least
one and an experiment file that is a folder; the one-process runtime's own
entry point for its usage and wrong arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from experiments import api
from experiments.api import reference
from experiments.cli import _parser, local_deployment, main, simulation_plan
from experiments.deployment.deploy_commands import Deployment
from experiments.flower.one_process import SPARE_LOG
from experiments.running.command_plan import APP_DIR, Plan, run_plan
from fedsketch.server import runlog
from fedsketch.settings.setting import ConfigError
from tests.experiments.tiny import plan_rows, tiny
from tests.streams import held_stdout
from tests.tools.command_doc import main as command_doc


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--supernodes", "0", "--no-plan"], "argument --supernodes: must be at least 1; got 0"),
        (["plan", "--supernodes", "-2"], "argument --supernodes: must be at least 1; got -2"),
        (["deploy", "--supernodes", "0"], "argument --supernodes: must be at least 1; got 0"),
        (["run", "--seeds", "0", "--no-plan"], "argument --seeds: must be at least 1; got 0"),
        (["plan", "--seeds", "-1"], "argument --seeds: must be at least 1; got -1"),
    ],
)
def test_counts_below_one_are_refused_by_name(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        main([*args, "--out", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.splitlines()[-1] == f"fedsketch: error: {message}"
    assert "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_seeds_below_one_in_the_experiment_file_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "zero.toml"
    config.write_text('[run]\nexperiment = "zero"\n\n[compare]\nstrategies = ["fedavg"]\nseeds = 0\n')
    assert main(["plan", str(config), "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"fedsketch: error: {config}: [compare] seeds must be at least 1; got 0"
    for bad in ("0.5", '"x"', "true"):
        config.write_text(f'[run]\nexperiment = "zero"\n\n[compare]\nseeds = {bad}\n')
        assert main(["plan", str(config), "--out", str(tmp_path / "runs")]) == 2
        assert (
            capsys.readouterr()
            .err.strip()
            .endswith(f"[compare] seeds must be a whole number; got {tomllib.loads(f'v = {bad}')['v']!r}")
        )


def test_a_folder_is_no_experiment_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(tmp_path), "--no-plan", "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"fedsketch: error: experiment config {tmp_path} not found (it is a folder)"


def _one_process(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "experiments.flower.one_process", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_the_one_process_runtime_prints_its_usage() -> None:
    """As a program (its refusals: tests/experiments/flower/test_one_process.py)."""
    done = _one_process("--help")
    assert done.returncode == 0
    assert done.stdout.startswith("usage: python -m experiments.flower.one_process APP_DIR RUN_CONFIG")


def test_plan_and_run_refuse_an_app_config_that_lacks_a_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = (APP_DIR / "pyproject.toml").read_text(encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text(text.replace("\nqsgd-levels = 15", ""), encoding="utf-8")
    monkeypatch.setattr("experiments.running.command_plan.APP_DIR", tmp_path)
    for command in (["plan"], ["run", "--no-plan"]):
        assert main([*command, "--out", str(tmp_path / "runs")]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("fedsketch: error: ") and "[tool.flwr.app.config] lacks qsgd-levels" in err, err
    assert not (tmp_path / "runs").exists()


def test_the_python_api_refuses_fewer_than_one_node() -> None:
    from experiments.api import federation

    with pytest.raises(ConfigError, match="supernodes must be at least 1; got 0"):
        federation(0, None)
    assert federation(1, None).num_supernodes == 1


def test_the_command_page_is_current() -> None:
    assert command_doc(["--check"]) == 0, "docs/command.md is out of date: run python -m tests.tools.command_doc"


def test_a_command_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main([])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == "fedsketch: error: the following arguments are required: COMMAND"


@pytest.mark.parametrize("command", [[], ["deploy"]])
def test_the_help_keeps_the_line_breaks_of_its_description(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        main([*command, "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    parser = _parser()
    text = (
        parser.epilog
        if not command
        else next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        .choices[command[0]]
        .description
    )
    assert text and all(line in out.splitlines() for line in text.splitlines())


@pytest.fixture(autouse=True)
def _never_exec(monkeypatch: pytest.MonkeyPatch) -> None:
    """Called as a function, the command goes on in this process: it must never replace or end it (the test
    runner)."""

    def execv(path: str, argv: list[str]) -> None:
        raise AssertionError(f"the command replaced the calling process with {argv}")

    def exit_now(code: int) -> None:
        raise AssertionError(f"the command ended the calling process with exit code {code}")

    monkeypatch.setattr(os, "execv", execv)
    monkeypatch.setattr(os, "_exit", exit_now)


@pytest.mark.slow  # a real Flower run through its processes (seconds)
def test_run_plans_runs_plots_and_reports_then_plot_and_report_read_the_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config, out = tiny(tmp_path), tmp_path / "runs"
    assert main(["run", str(config), "--out", str(out), "--supernodes", "1", "--strategies", "fedavg,fetchsgd"]) == 0
    said = capsys.readouterr().out
    exp = out / "tiny"
    assert said.startswith("fedsketch: ") and "Plan of tiny: 2 run(s)" in said
    for strategy in ("fedavg", "fetchsgd"):
        assert f"{strategy} seed 0: finished  ({exp / strategy})" in said
        assert f"\n{strategy} seed 0: round 2/2  acc " in said  # each run's progress, as it goes
        assert (exp / strategy / "metrics.jsonl").read_text().count("\n") == 2
    assert not [line for line in said.splitlines() if line.startswith(" " * 26)]  # no reason under a finished run
    plots = sorted(exp.glob("*.png"))
    assert len(plots) == 4 and all(f"plot: {p}" in said for p in plots)
    assert f"report: {exp / 'report.md'}\nverdict: At equal total bytes" in said
    assert main(["plot", str(exp)]) == 0
    assert sorted(capsys.readouterr().out.split()) == [str(p) for p in plots]
    assert main(["report", str(exp), "--target", "0.01"]) == 0
    assert capsys.readouterr().out == (exp / "report.md").read_text()
    assert "0.01" in (exp / "report.md").read_text()
    assert main(["report", str(exp), "--target", "1.5"]) == 2
    assert capsys.readouterr().err == "fedsketch: error: target accuracies must be in (0, 1], got [1.5]\n"
    runlog.write_status(exp / "fetchsgd", "interrupted", "SIGINT", 5)  # as if stopped after its second round
    assert main(["plot", str(exp)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "note: fetchsgd: seed 0 interrupted (SIGINT) after round 2 of 5"
    (exp / "fetchsgd" / runlog.STATUS).unlink()
    with (exp / "fedavg" / "flower.log").open("a") as log:  # as an earlier, failed attempt would have left it
        log.write("RuntimeError: an earlier attempt failed\n")
    assert main(["run", str(config), "--out", str(out), "--supernodes", "1", "--no-plan", "--no-plot"]) == 0
    said = capsys.readouterr().out
    assert "Plan of" not in said and "plot:" not in said and "fedavg seed 0: already finished" in said
    assert "an earlier attempt failed" not in said  # only a failed run's outcome gets its log's last error
    assert SPARE_LOG not in (exp / "fedavg" / "flower.log").read_text()  # no spare process in a function call
    assert main(["run", str(config), "--out", str(out), "--supernodes", "1", "--no-plot"]) == 0
    said = capsys.readouterr().out
    assert "Plan of" not in said and "byte plan" not in said  # every run finished: nothing to plan


def test_an_empty_strategies_value_names_none() -> None:
    assert _parser().parse_args(["run", "--strategies", ""]).strategies is None  # the file's [compare] strategies
    assert _parser().parse_args(["run", "--strategies", "fedavg,fetchsgd"]).strategies == ["fedavg", "fetchsgd"]


def test_run_decides_its_runs_and_federation_and_prints_the_plan_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    common = ["run", str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), "--supernodes", "3", "--seeds", "2"]
    plan = simulation_plan(_parser().parse_args([*common, "--backend", "ray", "--runtime", "superlink", "--no-plot"]))
    assert [(run.settings["strategy"], run.settings["seed"]) for run in plan.runs] == [("fedavg", 0), ("fedavg", 1)]
    fed = plan.federation
    assert (fed.num_supernodes, fed.backend, fed.runtime, plan.plot) == (3, "ray", "superlink", False)
    assert "Plan of tiny: 2 run(s)" in capsys.readouterr().out and not (tmp_path / "runs" / "tiny").exists()
    plan = simulation_plan(_parser().parse_args([*common, "--no-plan"]))
    assert (plan.federation.backend, plan.federation.runtime, plan.plot) == ("inprocess", "process", True)
    assert "Plan of" not in capsys.readouterr().out
    with pytest.raises(ConfigError, match="--gpus-per-node must be >= 0; got -0.5"):
        simulation_plan(_parser().parse_args([*common, "--gpus-per-node", "-0.5"]))
    monkeypatch.setenv("FEDSKETCH_PUBLIC_FLOWER", "1")
    plan = simulation_plan(_parser().parse_args(common))
    assert (plan.federation.backend, plan.federation.runtime) == ("ray", "superlink")
    said = capsys.readouterr().out.splitlines()
    assert said[-2] == (
        "fedsketch: on Flower's public API only (FEDSKETCH_PUBLIC_FLOWER is set): each run goes through flwr run "
        "and a SuperLink, on Flower's Ray backend, with Flower's own waits"
    )
    assert said[-1] == (
        "fedsketch: no byte plan: the byte plan runs a round in this process, which needs Flower internals "
        "(bridge/flower.py) (FEDSKETCH_PUBLIC_FLOWER is set)"
    )


def test_the_plan_or_why_there_is_none_is_out_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Printed to a pipe or a file, the plan is flushed at once: the runs that follow take minutes."""
    args = _parser().parse_args(["run", str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), "--supernodes", "1"])
    for public in ("0", "1"):
        monkeypatch.setenv("FEDSKETCH_PUBLIC_FLOWER", public)
        raw = held_stdout(monkeypatch)
        simulation_plan(args)
        said = raw.getvalue().decode()
        assert ("Plan of tiny: 1 run(s)" if public == "0" else "fedsketch: no byte plan: ") in said, said
    monkeypatch.setenv("FEDSKETCH_PUBLIC_FLOWER", "0")
    secure = ["--set", "secure-aggregation=true", "--set", "num-clients=6", "--set", "clients-per-round=6"]
    plans = []
    for nodes in ("2", "3"):  # secure aggregation bills by nodes: the plan is of the nodes the run will have
        raw = held_stdout(monkeypatch)
        run = ["run", str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), "--supernodes", nodes, *secure]
        simulation_plan(_parser().parse_args(run))
        plans.append(plan_rows(raw.getvalue().decode()))
    assert plans[0] != plans[1]


@pytest.mark.slow  # a real Flower run through its processes (seconds)
def test_a_checkpoint_of_other_settings_is_refused_or_with_restart_deleted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, out = tiny(tmp_path), tmp_path / "runs"
    args = ["run", str(config), "--out", str(out), "--supernodes", "1", "--no-plan", "--no-plot"]
    assert main([*args, "--set", "checkpoint-every=1", "--set", "num-rounds=1"]) == 0
    capsys.readouterr()
    assert main([*args, "--set", "checkpoint-every=1", "--set", "client-lr=0.2"]) == 2
    assert "--restart" in capsys.readouterr().err
    assert main([*args, "--set", "checkpoint-every=1", "--set", "client-lr=0.2", "--restart"]) == 0
    said = capsys.readouterr().out
    assert "byte plan" not in said and "Plan of" not in said  # --no-plan
    folder = out / "tiny" / "fedavg"
    assert f"fedsketch: deleted {folder} (--restart): its checkpoint was of other settings\n" in said
    assert (folder / "metrics.jsonl").read_text().count("\n") == 2


def test_report_of_a_folder_without_runs_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedsketch: error: ") and err.count("\n") == 1 and str(tmp_path) in err


def test_a_kit_is_written_for_the_experiments_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config, kit = tiny(tmp_path), tmp_path / "kit"
    args = ["deploy", str(config), "--kit", str(kit), "--supernodes", "2", "--set", "num-rounds=3", "--out", "results"]
    assert (
        main([*args, "--server", "10.1.2.3", "--port", "9100", "--strategies", "fedavg,fetchsgd", "--seeds", "2"]) == 0
    )
    said = capsys.readouterr().out
    assert said.startswith(f"fedsketch deployment kit in {kit}: 1 SuperLink at 10.1.2.3:9100, 2 SuperNode(s)")
    assert said == (kit / "INSTRUCTIONS.txt").read_text() + "\n"
    configs = sorted(p.name for p in (kit / "admin").glob("run_config*.toml"))
    assert configs == [
        "run_config.fedavg.seed1.toml",
        "run_config.fetchsgd.seed1.toml",
        "run_config.fetchsgd.toml",
        "run_config.toml",
    ]
    first = tomllib.loads((kit / "admin" / "run_config.toml").read_text())
    assert (first["experiment"], first["num-rounds"], first["num-clients"], first["out-dir"]) == (
        "tiny-kit",
        3,
        2,
        "results",
    )
    assert sorted(p.name for p in (kit / "devices").iterdir()) == ["node-0", "node-1"]
    assert main([*args, "--server", "10.1.2.3"]) == 2  # the kit's folder holds a kit now
    assert (
        capsys.readouterr().err
        == f"fedsketch: error: {kit} already holds a kit; choose an empty folder (keys are never overwritten)\n"
    )
    assert main(["deploy", "--kit", str(tmp_path / "other")]) == 2
    err = capsys.readouterr().err
    assert err == "fedsketch: error: --kit needs --server HOST: the address devices use to reach the SuperLink\n"
    assert not (tmp_path / "other").exists()


def test_plan_refuses_on_flowers_public_api_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FEDSKETCH_PUBLIC_FLOWER", "1")
    assert main(["plan"]) == 2
    assert capsys.readouterr().out == (
        "fedsketch: error: the byte plan runs a round in this process, which needs Flower internals "
        "(bridge/flower.py), and runs on Flower's public API only: FEDSKETCH_PUBLIC_FLOWER is set\n"
    )


def test_plan_prints_what_each_run_will_send_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), "--strategies", "fedavg,fetchsgd"]
    assert main([*args, "--supernodes", "1", "--seeds", "2", "--set", "num-rounds=3"]) == 0
    said = capsys.readouterr().out
    assert said.startswith("fedsketch: ") and "Plan of tiny: 4 run(s)" in said and "round 1 x num-rounds (3)" in said
    assert "fetchsgd seed 1 " in said and not (tmp_path / "runs").exists()
    secure = ["--set", "secure-aggregation=true", "--set", "num-clients=6", "--set", "clients-per-round=6"]
    assert main([*args[:-1], "fedavg", *secure, "--supernodes", "3"]) == 0
    three = plan_rows(capsys.readouterr().out)
    assert main([*args[:-1], "fedavg", *secure, "--supernodes", "2"]) == 0
    assert plan_rows(capsys.readouterr().out) != three  # secure aggregation bills by nodes
    loader = ["--set", 'dataset="tests.experiments.test_api:_loader"', "--set", 'partition="iid"']
    assert main([*args, *loader]) == 0  # a user's data, loaded for the checks, is handed to no process
    assert "Plan of tiny: 2 run(s)" in capsys.readouterr().out and not (tmp_path / "runs").exists()


def _program(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """``fedsketch ARGS`` as its console script runs it, writing to ``command.log``."""
    log = (tmp_path / "command.log").open("w")
    command = [sys.executable, "-c", "import sys; from experiments.cli import main; sys.exit(main())", *args]
    return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True)


def _notes_whether_it_is_tracked(input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    """A model builder that notes, where it runs, whether the running command tracks this process by its pid."""
    state = Path(os.environ["FEDSKETCH_STATE_DIR"])
    also = [json.loads(p.read_text())["also"] for p in (state / "invocations").glob("*.json")]
    state.mkdir(parents=True, exist_ok=True)  # before the command runs: its checks build the model too
    with (state / "tracked.txt").open("a") as f:
        f.write(f"{os.getpid()} {any(str(os.getpid()) in pids for pids in also)}\n")
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))


@pytest.mark.slow  # a real Flower run through its processes (seconds)
def test_run_as_the_program_hands_its_plan_and_spare_process_to_its_second_half(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same pid validates, execs ``run-plan`` and runs the first run in the spare simulation process, which
    it tracks by its pid: the spare was forked before the command's token existed, and is stopped with it."""
    assert main(["run", str(tmp_path / "missing.toml"), "--no-plan"]) == 2  # the command, in this process too
    here = ["run", str(tiny(tmp_path)), "--out", str(tmp_path / "here"), "--supernodes", "1", "--no-plan", "--no-plot"]
    assert main(here) == 0  # and its second half: no spare process to track in a function call
    capsys.readouterr()
    out, state = tmp_path / "runs", tmp_path / "state"
    monkeypatch.setenv("FEDSKETCH_STATE_DIR", str(state))
    model = f'model="{__name__}:{_notes_whether_it_is_tracked.__name__}"'
    args = ["run", str(tiny(tmp_path)), "--out", str(out), "--supernodes", "1", "--no-plot", "--set", model]
    proc = _program(tmp_path, *args)
    assert proc.wait(timeout=300) == 0, (tmp_path / "command.log").read_text()[-3000:]
    said = (tmp_path / "command.log").read_text()
    assert "Plan of tiny: 1 run(s)" in said and f"fedavg seed 0: finished  ({out / 'tiny' / 'fedavg'})" in said
    assert SPARE_LOG in (out / "tiny" / "fedavg" / "flower.log").read_text()
    assert (state / "tracked.txt").read_text().splitlines()[-1].endswith(" True")  # the run's process: the spare


@pytest.mark.slow  # a real Flower run through its processes (seconds)
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_program_stopped_by_a_signal_exits_with_its_code(
    tmp_path: Path, signum: int, code: int, capsys: pytest.CaptureFixture[str], no_leftover_processes: None
) -> None:
    """Its Flower process signals the command once (a model builder that does so where it runs there)."""
    pid_file = tmp_path / "command.pid"

    def stops_the_command(input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
        command = int(pid_file.read_text()) if pid_file.exists() else os.getpid()
        if os.getpid() != command:
            try:
                (pid_file.parent / "signalled").touch(exist_ok=False)  # once: a second signal would force
                os.kill(command, signum)
            except FileExistsError:
                pass
        return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))

    builder = reference(stops_the_command, tmp_path)
    assert main(["run", str(tmp_path / "missing.toml"), "--no-plan"]) == 2  # the command, in this process too
    capsys.readouterr()
    args = ["run", str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), "--supernodes", "1", "--no-plan"]
    proc = _program(tmp_path, *args, "--set", f'model="{builder}"', "--set", "num-rounds=50")
    pid_file.write_text(str(proc.pid))
    assert proc.wait(timeout=300) == code, (tmp_path / "command.log").read_text()[-3000:]
    said = (tmp_path / "command.log").read_text()
    assert f"fedsketch: stopped by {signal.Signals(signum).name}" in said


def _interrupted() -> tuple[Any, ...]:
    """A user's data loader stopped by Ctrl-C while the command checks the runs."""
    raise KeyboardInterrupt


@pytest.mark.slow  # a real Flower run through its processes (seconds)
def test_a_command_stopped_in_this_process_returns_its_code_and_this_process_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Called as a function (not the program), a stopped command returns 130 / 143 and never exits the caller."""
    loader = ["--set", f'dataset="{__name__}:{_interrupted.__name__}"', "--set", 'partition="iid"']
    assert main(["run", str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), *loader]) == 130  # nothing started
    command = os.getpid()

    def stops_the_command(input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
        try:
            if os.getpid() != command:  # in the run's Flower process, once: a second signal would force
                (tmp_path / "signalled").touch(exist_ok=False)
                os.kill(command, signal.SIGINT)
        except FileExistsError:
            pass
        return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))

    builder = reference(stops_the_command, tmp_path)
    args = ["run", str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), "--supernodes", "1", "--no-plan"]
    assert main([*args, "--set", f'model="{builder}"', "--set", "num-rounds=50"]) == 130
    assert "fedsketch: stopped by SIGINT" in capsys.readouterr().out


def _deploy(*args: str) -> argparse.Namespace:
    return _parser().parse_args(["deploy", *args])


def test_deploy_decides_what_to_start_and_checks_every_run_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    common = [str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), "--supernodes", "3", "--set", "num-rounds=4"]
    args = [*common, "--tls", "--auth", "--isolation", "subprocess", "--strategies", "fedavg,fetchsgd", "--seeds", "2"]
    deployment, runs = local_deployment(_deploy(*args))
    assert deployment == Deployment(3, tls=True, auth=True, isolation="subprocess")
    assert [(cfg.strategy, cfg.seed, cfg.num_rounds, cfg.num_clients) for cfg in runs] == [
        ("fedavg", 0, 4, 3),
        ("fedavg", 1, 4, 3),
        ("fetchsgd", 0, 4, 3),
        ("fetchsgd", 1, 4, 3),
    ]
    assert {(cfg.out_dir, cfg.experiment) for cfg in runs} == {(str(tmp_path / "runs"), "tiny")}
    said = capsys.readouterr().out
    assert said.splitlines()[-1] == (
        "deployment settings: client-assignment=node num-clients=3 clients-per-round=3 min-nodes=2 "
        "checkpoint-every=5 (fedavg, fetchsgd) (change with --set)"
    )
    assert local_deployment(_deploy(*common))[0] == Deployment(3)  # the launcher, no TLS, unless asked
    folder = runlog.run_dir(runs[0])  # a checkpoint of another run of fedavg seed 0 lies in its folder
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**runs[0].to_mapping(), "client-lr": 0.5}))
    (folder / runlog.CHECKPOINT).write_bytes(b"after round 1")
    with pytest.raises(ConfigError, match="holds a checkpoint of a run with other settings"):
        local_deployment(_deploy(*args))
    capsys.readouterr()
    local_deployment(_deploy(*args, "--restart"))
    assert f"fedsketch: deleted {folder} (--restart)" in capsys.readouterr().out and not folder.exists()
    monkeypatch.setenv("FEDSKETCH_PUBLIC_FLOWER", "1")
    assert local_deployment(_deploy(*common))[0].isolation == "subprocess"
    assert "fedsketch: SuperNodes run Flower's own isolation, not the launcher" in capsys.readouterr().out


@pytest.mark.slow  # a real Flower run through its processes (seconds)
def test_a_deployment_whose_runs_are_all_finished_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), "--supernodes", "2", "--strategies", "fedavg"]
    _, runs = local_deployment(_deploy(*args))
    assert run_plan(Plan.of(runs, api.federation(2, None), plot=False)) == 0  # run here, on the simulation
    capsys.readouterr()
    exp = tmp_path / "runs" / "tiny"
    assert main(["deploy", *args, "--no-plot"]) == 0
    said = capsys.readouterr().out
    assert "every run is finished: no SuperLink or SuperNode (2) started\n" in said
    assert f"fedavg seed 0: already finished  ({exp / 'fedavg'})" in said
    assert not (exp / "deployment").exists() and not list(exp.glob("*.png"))
    assert main(["deploy", *args]) == 0
    assert len(list(exp.glob("*.png"))) == 4 and f"report: {exp / 'report.md'}" in capsys.readouterr().out


def test_a_kit_may_ask_for_a_gpu_this_machine_lacks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The devices run the kit's runs: their device is theirs to have, not this machine's."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    args = ["deploy", str(tiny(tmp_path)), "--kit", str(tmp_path / "kit"), "--server", "10.0.0.1"]
    with pytest.raises(SystemExit):
        main([*args, "--port", "eighty"])
    assert "argument --port: invalid int value: 'eighty'" in capsys.readouterr().err
    assert main([*args, "--set", 'device="cuda"']) == 0, capsys.readouterr().err
    assert tomllib.loads((tmp_path / "kit" / "admin" / "run_config.toml").read_text())["device"] == "cuda"
    assert main(["run", str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), "--set", 'device="cuda"']) == 2
    assert "cuda" in capsys.readouterr().err  # here it is refused


def test_what_the_user_sets_for_a_deployment_wins_and_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    common = [str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), "--supernodes", "3"]
    _, runs = local_deployment(_deploy(*common, "--set", "min-nodes=3", "--set", "checkpoint-every=2"))
    assert capsys.readouterr().out.splitlines()[-1] == (
        "deployment settings: client-assignment=node num-clients=3 clients-per-round=3 min-nodes=3 (change with --set)"
    )
    assert [(cfg.min_nodes, cfg.checkpoint_every) for cfg in runs] == [(3, 2)]
    _, runs = local_deployment(_deploy(*common, "--set", "checkpoint-every=0", "--strategies", "local_topk,fedavg"))
    assert [(cfg.strategy, cfg.checkpoint_every) for cfg in runs] == [("local_topk", 0), ("fedavg", 0)]
    _, runs = local_deployment(_deploy(*common, "--strategies", "local_topk,fedavg"))
    assert [(cfg.strategy, cfg.checkpoint_every) for cfg in runs] == [("local_topk", 0), ("fedavg", 5)]  # state: none
    assert "checkpoint-every=5 (fedavg)" in capsys.readouterr().out
