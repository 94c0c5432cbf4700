"""Bad command-line arguments, and an app config that lacks a setting, are refused in one line naming them.

``fedsketch`` (its ``main``, in this process) for counts that must be at least
one and an experiment file that is a folder; the one-process runtime's own
entry point for its usage and wrong arguments.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.flower.app_files import check_app_config
from experiments.running.command_plan import APP_DIR
from fedsketch.config import RunConfig
from fedsketch.settings.setting import ConfigError


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
    done = _one_process("--help")
    assert done.returncode == 0
    assert done.stdout.startswith("usage: python -m experiments.flower.one_process APP_DIR RUN_CONFIG")


@pytest.mark.parametrize("args", [("app",), ("app", "run.toml", "two", "1", "0", "inprocess")])
def test_the_one_process_runtime_refuses_bad_arguments_with_its_usage(args: tuple[str, ...]) -> None:
    done = _one_process(*args)
    assert done.returncode == 2
    assert done.stderr.startswith("usage: python -m experiments.flower.one_process")
    assert "Traceback" not in done.stderr


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


def test_a_setting_missing_from_the_apps_config_is_named_before_anything_starts(tmp_path: Path) -> None:
    """Flower would refuse it inside its own process; the check names it, and a key no setting declares."""
    keys = RunConfig().to_mapping()
    check_app_config(APP_DIR, keys)  # the app's own table is complete
    text = (APP_DIR / "pyproject.toml").read_text(encoding="utf-8")
    (tmp_path / "pyproject.toml").write_text(text.replace("\nqsgd-levels = ", "\nunknown-levels = "), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"\[tool.flwr.app.config\] lacks qsgd-levels; every setting needs a line"):
        check_app_config(tmp_path, keys)
    with pytest.raises(ConfigError, match=r"lists unknown-levels, which no setting declares"):
        check_app_config(tmp_path, [key for key in keys if key != "qsgd-levels"])


def test_the_python_api_refuses_fewer_than_one_node() -> None:
    from experiments.api import federation

    with pytest.raises(ConfigError, match="supernodes must be at least 1; got 0"):
        federation(0, None)
    assert federation(1, None).num_supernodes == 1
