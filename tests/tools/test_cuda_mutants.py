"""tests/tools/cuda_mutants.py: mutmut's mutants of real modules, switched on one by one in a real pytest session.

On a CPU the listed CUDA-only mutants cannot be told apart, so these tests check the mechanism on mutants of the
learning-rate schedule, whose tests run in about a second: a mutant the selected tests catch is killed, one they
miss survives, one no selected test reaches has no tests, and one whose test runs past the limit timed out.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.tools import cuda_mutants, mutation_report
from tests.tools.mutation_run import mutmut_installed

needs_mutmut = pytest.mark.skipif(not mutmut_installed(), reason="needs mutmut (pip install -e '.[mutation]')")

SCHEDULE = "fedsketch.server.schedule.x_lr_at__mutmut_"
CAUGHT_BY_CONSTANT = SCHEDULE + "1"  # caught by the constant schedule's tests
MISSED_BY_CONSTANT = SCHEDULE + "13"  # in the cosine branch, which those tests never take
UNREACHED = "fedsketch.methods.dense.x_layout__mutmut_1"


def test_a_mutants_module_and_function_are_read_from_its_name() -> None:
    assert cuda_mutants.module_of(CAUGHT_BY_CONSTANT) == "fedsketch/server/schedule.py"
    assert cuda_mutants.function_of(CAUGHT_BY_CONSTANT) == "fedsketch.server.schedule.x_lr_at"
    method = "strategies.strategy.xǁFedSketchStrategyǁ__init____mutmut_26"
    assert cuda_mutants.module_of(method) == "strategies/strategy.py"
    assert cuda_mutants.function_of(method) == "strategies.strategy.xǁFedSketchStrategyǁ__init__"


@needs_mutmut
@pytest.mark.slow  # mutmut writes the mutants (10 s for the list), or a pytest session runs in a copy
def test_every_listed_cuda_mutant_is_made_from_todays_source(tmp_path: Path) -> None:
    names = sorted(mutation_report.load_listed().needs_cuda)
    tree = cuda_mutants.prepare(tmp_path / "cuda", names)
    assert "_mutmut_orig" in (tree / "fedsketch/sketch/batch.py").read_text()
    assert (tmp_path / "cuda/site/mutmut/mutation/trampoline.py").is_file()
    beside = {d.metadata["Name"] for d in importlib.metadata.distributions(path=[str(tmp_path / "cuda/site")])}
    assert beside == {"mutmut"}  # where mutmut is not installed, its __init__ finds its version there
    assert "_mutmut_orig" not in (tree / "fedsketch/sketch/hashing.py").read_text()  # no listed mutant there


@needs_mutmut
def test_a_name_todays_source_does_not_make_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"fedsketch/server/schedule.py: .*x_lr_at__mutmut_9999.*out of date"):
        cuda_mutants.prepare(tmp_path / "cuda", [CAUGHT_BY_CONSTANT, SCHEDULE + "9999"])


def _check(tmp_path: Path, names: list[str], *args: str, fails: bool = False) -> tuple[int, dict[str, str], str]:
    """``check`` run as on the GPU machine, in a prepared copy (``fails``: with a test there that always fails)."""
    tree = cuda_mutants.prepare(tmp_path / "cuda", names)
    if fails:
        (tree / "tests/test_fails.py").write_text("def test_fails_constant() -> None:\n    assert False\n")
    out = tmp_path / "outcomes.json"
    run = subprocess.run(
        [sys.executable, "-m", "tests.tools.cuda_mutants", "check", "--names", *names, "--out", str(out), *args],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "cuda" / "site")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return run.returncode, json.loads(out.read_text()) if out.exists() else {}, run.stdout + run.stderr


CONSTANT = ("tests/fedsketch/server/test_schedule.py", "-k", "constant")


@needs_mutmut
@pytest.mark.slow  # mutmut writes the mutants (10 s for the list), or a pytest session runs in a copy
def test_each_mutant_is_killed_missed_or_unreached_by_the_tests_selected(tmp_path: Path) -> None:
    names = [CAUGHT_BY_CONSTANT, MISSED_BY_CONSTANT, UNREACHED]
    code, outcomes, said = _check(tmp_path, names, "--", *CONSTANT)
    assert outcomes == {
        CAUGHT_BY_CONSTANT: mutation_report.KILLED,
        MISSED_BY_CONSTANT: mutation_report.SURVIVED,
        UNREACHED: mutation_report.NO_TESTS,
    }, said
    assert (
        code == 1 and "| `fedsketch/server/schedule.py` | 2 | 1 | 0 | 1 | 0 | 0 | 0 | 0 | 0 | 50.0% | 50.0% |" in said
    )
    assert "3 mutants in" in said and "2 not caught" in said


@needs_mutmut
@pytest.mark.slow  # mutmut writes the mutants (10 s for the list), or a pytest session runs in a copy
def test_a_test_that_runs_past_the_limit_with_a_mutant_times_it_out(tmp_path: Path) -> None:
    code, outcomes, said = _check(tmp_path, [MISSED_BY_CONSTANT], "--limit", "0.0001", "--", *CONSTANT)
    assert (code, outcomes) == (0, {MISSED_BY_CONSTANT: mutation_report.TIMEOUT}), said


@needs_mutmut
@pytest.mark.slow  # mutmut writes the mutants (10 s for the list), or a pytest session runs in a copy
def test_no_mutant_is_tried_when_a_selected_test_fails_without_one(tmp_path: Path) -> None:
    code, outcomes, said = _check(tmp_path, [CAUGHT_BY_CONSTANT], "--", *CONSTANT, "tests/test_fails.py", fails=True)
    assert code == 2 and outcomes == {} and "tests/test_fails.py::test_fails_constant" in said, said


@pytest.mark.skipif(torch.cuda.is_available(), reason="here the listed mutants can be checked")
def test_without_a_gpu_the_listed_mutants_are_not_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert cuda_mutants.main(["check"]) == 2
    assert capsys.readouterr().err == (
        "cuda_mutants: no CUDA device here; the listed mutants need one (--names checks others)\n"
    )
