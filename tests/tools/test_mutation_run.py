"""Mutation testing by groups: the groups file, each group's mutmut table, its copy of the project, a real run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.tools import mutation_run as mr

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_groups_name_real_files_and_each_module_once() -> None:
    groups = mr.load_groups()
    modules = [m for g in groups.values() for m in g.modules]
    assert len(modules) == len(set(modules))
    assert {"fedsketch/sketch/count_sketch.py", "strategies/billing.py", "fedsketch/algorithms/fetchsgd.py"} <= set(
        modules
    )


def test_a_group_naming_a_missing_file_or_key_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "groups.toml"
    path.write_text('[g]\nmodules = ["fedsketch/nope.py"]\ntests = ["tests/fedsketch/sketch/test_count_sketch.py"]\n')
    with pytest.raises(ValueError, match=r"group \[g\] names files that do not exist: \['fedsketch/nope.py'\]"):
        mr.load_groups(path, ROOT)
    path.write_text('[g]\nmodules = ["fedsketch/sketch/count_sketch.py"]\n')
    with pytest.raises(
        ValueError,
        match=r"group \[g\] needs 'modules' and 'tests' \(and may say 'children', 'slow', 'own_pids'\); got \['modules'\]",
    ):
        mr.load_groups(path, ROOT)
    path.write_text('[g]\nmodules = []\ntests = ["tests/fedsketch/sketch/test_count_sketch.py"]\n')
    with pytest.raises(ValueError, match="at least one module and one test file"):
        mr.load_groups(path, ROOT)


def test_a_group_may_cap_how_many_of_its_mutants_run_at_once(tmp_path: Path) -> None:
    path = tmp_path / "groups.toml"
    table = 'modules = ["fedsketch/sketch/count_sketch.py"]\ntests = ["tests/fedsketch/sketch/test_count_sketch.py"]\n'
    path.write_text(f"[g]\nchildren = 1\n{table}[h]\n{table}")
    groups = mr.load_groups(path, ROOT)
    assert groups["g"].children == 1 and groups["h"].children is None
    assert mr.load_groups()["processes"].children == 1


def test_a_group_whose_tests_need_real_processes_runs_its_slow_tests_too(tmp_path: Path) -> None:
    path = tmp_path / "groups.toml"
    table = 'modules = ["fedsketch/sketch/count_sketch.py"]\ntests = ["tests/fedsketch/sketch/test_count_sketch.py"]\n'
    path.write_text(f"[g]\nslow = true\n{table}[h]\n{table}")
    groups = mr.load_groups(path, ROOT)
    shared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    assert shared["pytest_add_cli_args"] == ["-p", "no:cacheprovider", "-m", "not slow"]
    assert mr.mutmut_settings(shared, groups["g"])["pytest_add_cli_args"] == ["-p", "no:cacheprovider"]
    assert mr.mutmut_settings(shared, groups["h"])["pytest_add_cli_args"] == shared["pytest_add_cli_args"]
    assert mr.load_groups()["runtime"].slow and not mr.load_groups()["processes"].slow


def test_a_group_whose_mutants_signal_processes_runs_in_a_pid_namespace_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "groups.toml"
    table = 'modules = ["fedsketch/sketch/count_sketch.py"]\ntests = ["tests/fedsketch/sketch/test_count_sketch.py"]\n'
    path.write_text(f"[g]\nown_pids = true\n{table}[h]\n{table}")
    groups = mr.load_groups(path, ROOT)
    assert groups["g"].own_pids and not groups["h"].own_pids and mr.load_groups()["procs"].own_pids
    plain = mr.mutmut_command(2)
    assert plain == ["nice", "-n", "10", sys.executable, "-m", "mutmut", "run", "--max-children", "2"]
    assert mr.mutmut_command(2, own_pids=True) == ["unshare", "--pid", "--fork", "--mount-proc", *plain]
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a PID namespace needs root and unshare")
    code = "import json, os; print(json.dumps([os.getpid(), [p for p in os.listdir('/proc') if p.isdigit()]]))"
    done = subprocess.run([*mr.OWN_PIDS, sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == [1, ["1"]]  # it is the namespace's first process, and sees no other


def test_a_group_table_mutates_its_modules_and_copies_the_other_packages() -> None:
    shared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    group = mr.Group(
        "g", ("strategies/billing.py", "fedsketch/sketch/checks.py"), ("tests/strategies/test_billing.py",)
    )
    settings = mr.mutmut_settings(shared, group)
    assert settings["source_paths"] == ["fedsketch/", "strategies/"]
    assert settings["also_copy"] == ["clients/", "bridge/", "experiments/", "docs/"]
    assert settings["only_mutate"] == ["strategies/billing.py", "fedsketch/sketch/checks.py"]
    assert settings["pytest_add_cli_args_test_selection"] == ["tests/strategies/test_billing.py"]
    assert settings["process_isolation"] == "forkserver"  # the shared settings are kept
    text = mr.with_mutmut_table((ROOT / "pyproject.toml").read_text(), settings)
    data = tomllib.loads(text)
    assert data["tool"]["mutmut"] == settings
    assert data["tool"]["importlinter"] == tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_a_pyproject_whose_mutmut_table_is_missing_or_not_last_is_refused() -> None:
    with pytest.raises(ValueError, match=r"no \[tool.mutmut\] table"):
        mr.with_mutmut_table("[project]\nname = 'x'\n", {"a": "b"})
    with pytest.raises(ValueError, match="not the last table"):
        mr.with_mutmut_table("[x]\n\n[tool.mutmut]\na = 'b'\n\n[tool.other]\nc = 1\n", {"a": "b"})


def test_the_copy_holds_the_project_files_and_the_group_table(tmp_path: Path) -> None:
    group = mr.load_groups()["schedule"]
    copy = mr.prepare(group, ROOT, tmp_path)
    assert (copy / "fedsketch" / "server" / "schedule.py").read_bytes() == (
        ROOT / "fedsketch" / "server" / "schedule.py"
    ).read_bytes()
    assert (copy / "tests" / "fedsketch" / "server" / "test_schedule.py").is_file()
    assert not (copy / ".venv").exists() and not (copy / ".git").exists()
    table = tomllib.loads((copy / "pyproject.toml").read_text())["tool"]["mutmut"]
    assert table["only_mutate"] == ["fedsketch/server/schedule.py"]
    assert mr.prepare(group, ROOT, tmp_path) == copy  # a second prepare starts from a fresh copy


def test_unknown_groups_are_one_line(capsys) -> None:
    assert mr.main(["nope"]) == 2
    assert "unknown group(s) ['nope']; groups: schedule" in capsys.readouterr().err


def test_fewer_than_one_child_is_refused_before_anything_runs(tmp_path: Path, capsys) -> None:
    assert mr.main(["schedule", "--max-children", "0", "--work", str(tmp_path / "w")]) == 2
    assert capsys.readouterr().err == "mutation_run: --max-children must be at least 1; got 0\n"
    assert not (tmp_path / "w").exists()


@pytest.mark.slow
@pytest.mark.skipif(not mr.mutmut_installed(), reason="needs mutmut (pip install -e '.[mutation]')")
def test_a_real_run_of_the_schedule_group_kills_every_mutant(tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.md"
    code = mr.main(["schedule", "--work", str(tmp_path), "--out", str(out), "--min-module", "100"])
    assert code == 0, (tmp_path / "schedule.log").read_text()[-2000:]
    assert (
        "| `fedsketch/server/schedule.py` | 29 | 29 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 100.0% | 100.0% |" in out.read_text()
    )


def test_pyprojects_table_is_the_union_of_the_groups() -> None:
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    groups = mr.load_groups().values()
    assert sorted(table["only_mutate"]) == sorted(m for g in groups for m in g.modules)
    assert set(table["pytest_add_cli_args_test_selection"]) == {t for g in groups for t in g.tests}
