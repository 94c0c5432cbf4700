"""The mutation report counts mutmut's own result files per module and scores them.

The files are written in mutmut 3's format (``mutants/<file>.meta``, a JSON object whose
``exit_code_by_key`` maps each mutant to the exit code of its tests).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tools import mutation_report as mr

LISTED = """
[equivalent]
"pkg.a.x_f__mutmut_3" = "no observable change"
"pkg.a.x_f__mutmut_9" = "listed, but a test kills it"
[needs_cuda]
"pkg.b.x_g__mutmut_1" = "only a CUDA tensor shows it"
"""


def _meta(root: Path, name: str, codes: dict[str, int | None]) -> None:
    path = root / "mutants" / f"{name}.meta"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes, "durations_by_key": {}}))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    a = {f"pkg.a.x_f__mutmut_{i}": 1 for i in range(1, 9)}
    a |= {"pkg.a.x_f__mutmut_3": 0, "pkg.a.x_f__mutmut_4": 0, "pkg.a.x_f__mutmut_5": 36, "pkg.a.x_f__mutmut_9": 1}
    _meta(tmp_path, "pkg/a.py", a)
    _meta(tmp_path, "pkg/b.py", {"pkg.b.x_g__mutmut_1": 0, "pkg.b.x_g__mutmut_2": 33, "pkg.b.x_g__mutmut_3": 3})
    _meta(tmp_path, "pkg/empty.py", {})
    (tmp_path / "listed.toml").write_text(LISTED)
    return tmp_path


def test_each_module_is_tallied_by_outcome(run: Path) -> None:
    modules, stale = mr.tally(run / "mutants", mr.load_listed(run / "listed.toml"))
    assert sorted(modules) == ["pkg/a.py", "pkg/b.py"]  # a file with no mutants has no row
    a, b = modules["pkg/a.py"].counts, modules["pkg/b.py"].counts
    assert (a["killed"], a["timeout"], a["survived"], a["equivalent"]) == (6, 1, 1, 1)
    assert (b["killed"], b["survived"], b["no tests"], b["needs CUDA"]) == (1, 0, 1, 1)
    assert modules["pkg/a.py"].mutants == 9 and modules["pkg/b.py"].mutants == 3
    assert modules["pkg/a.py"].survivors == ["pkg.a.x_f__mutmut_4"]
    assert modules["pkg/b.py"].survivors == ["pkg.b.x_g__mutmut_1", "pkg.b.x_g__mutmut_2"]
    assert stale == ["pkg.a.x_f__mutmut_9"]


def test_the_score_excludes_equivalents_and_counts_unreached_and_cuda_only_as_survived(run: Path) -> None:
    modules, _ = mr.tally(run / "mutants", mr.load_listed(run / "listed.toml"))
    assert modules["pkg/a.py"].score == 7 / 8  # 6 killed + 1 timeout over 8: the equivalent is out
    assert modules["pkg/b.py"].score == 1 / 3
    assert modules["pkg/b.py"].cpu_score == 1 / 2  # the CUDA-only mutant left out on a CPU
    assert modules["pkg/a.py"].cpu_score == 7 / 8 and mr.Tally().cpu_score is None
    text = mr.report(modules, [], survivors=False)
    assert "| `pkg/a.py` | 9 | 6 | 1 | 1 | 0 | 1 | 0 | 0 | 0 | 87.5% | 87.5% |" in text
    assert "| `pkg/b.py` | 3 | 1 | 0 | 0 | 1 | 0 | 1 | 0 | 0 | 33.3% | 50.0% |" in text
    assert "| **all** | 12 | 7 | 1 | 1 | 1 | 1 | 1 | 0 | 0 | 72.7% | 80.0% |" in text


def test_the_command_writes_the_report_and_fails_below_the_goals(run: Path, capsys) -> None:
    args = ["--mutants", str(run / "mutants"), "--equivalents", str(run / "listed.toml")]
    out = run / "report.md"
    assert mr.main([*args, "--out", str(out), "--survivors"]) == 0
    text = out.read_text()
    assert "- `pkg.b.x_g__mutmut_2`" in text and "remove them from the list" in text
    assert mr.main([*args, "--min-module", "50", "--min-total", "70"]) == 1
    err = capsys.readouterr().err
    assert "below the goal: pkg/b.py: 33.3% < 50.0%" in err and "all modules" not in err
    assert mr.main([*args, "--min-module", "30", "--min-total", "80"]) == 1
    assert "below the goal: all modules: 72.7% < 80.0%" in capsys.readouterr().err
    assert mr.main([*args, "--min-module", "30", "--min-total", "72"]) == 0


def test_missing_results_and_a_bad_list_are_one_line_each(tmp_path: Path, capsys) -> None:
    assert mr.main(["--mutants", str(tmp_path / "nowhere")]) == 2
    assert "no mutmut results under" in capsys.readouterr().err
    _meta(tmp_path, "m.py", {"m.x__mutmut_1": 1})
    (tmp_path / "bad.toml").write_text("[equivalents]\n")
    assert mr.main(["--mutants", str(tmp_path / "mutants"), "--equivalents", str(tmp_path / "bad.toml")]) == 2
    assert "unknown section(s) ['equivalents']" in capsys.readouterr().err


def test_the_shipped_list_gives_a_reason_for_every_mutant() -> None:
    listed = mr.load_listed()
    for name, reason in {**listed.equivalent, **listed.needs_cuda}.items():
        assert "__mutmut_" in name and len(reason) > 20, name
    assert not set(listed.equivalent) & set(listed.needs_cuda)


def test_a_listed_mutant_that_no_test_reaches_is_still_set_aside() -> None:
    listed = mr.Listed({"m.x__mutmut_1": "why"}, {"m.x__mutmut_2": "why"})
    assert mr.outcome(33, "m.x__mutmut_1", listed) == "equivalent"
    assert mr.outcome(5, "m.x__mutmut_2", listed) == "needs CUDA"
    assert mr.outcome(1, "m.x__mutmut_1", listed) == "killed"
    assert mr.outcome(None, "m.x__mutmut_1", listed) == "not checked"
    assert mr.outcome(-11, "m.x__mutmut_3", listed) == "other"


def test_a_module_exactly_at_the_goal_meets_it(run: Path) -> None:
    args = ["--mutants", str(run / "mutants"), "--equivalents", str(run / "listed.toml")]
    (run / "mutants" / "pkg" / "b.py.meta").unlink()  # module a alone: 87.5%
    assert mr.main([*args, "--min-module", "87.5", "--min-total", "87.5"]) == 0
    assert mr.main([*args, "--min-module", "87.6"]) == 1


def test_the_cuda_only_mutants_outcomes_on_a_gpu_take_their_place(run: Path) -> None:
    """``--cuda FILE``: what ``cuda_mutants check`` found on a GPU; a mutant it did not try stays "needs CUDA"."""
    listed = mr.load_listed(run / "listed.toml")
    modules, _ = mr.tally(run / "mutants", listed, {"pkg.b.x_g__mutmut_1": mr.KILLED})
    b = modules["pkg/b.py"]
    assert (b.counts["killed"], b.counts["needs CUDA"], b.score) == (2, 0, 2 / 3)
    modules, _ = mr.tally(run / "mutants", listed, {"pkg.b.x_g__mutmut_1": mr.SURVIVED})
    assert modules["pkg/b.py"].counts["survived"] == 1 and modules["pkg/b.py"].cpu_score == 1 / 3
    modules, _ = mr.tally(run / "mutants", listed, {"pkg.a.x_f__mutmut_4": mr.KILLED})  # not listed: mutmut's word
    assert modules["pkg/a.py"].counts["survived"] == 1
    on_gpu = run / "cuda.json"
    on_gpu.write_text(json.dumps({"pkg.b.x_g__mutmut_1": mr.TIMEOUT}))
    args = ["--mutants", str(run / "mutants"), "--equivalents", str(run / "listed.toml"), "--cuda", str(on_gpu)]
    assert mr.main([*args, "--min-module", "66"]) == 0  # 1 killed + 1 timeout of 3
    assert mr.main([*args, "--min-module", "67"]) == 1
