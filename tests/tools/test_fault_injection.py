"""The fault-injection list still describes the code (``tests/tools/fault_injection.py``).

Each fault is an exact snippet of today's code and its broken replacement; a
refactor that moves or rewrites a snippet must update the list, or the script
would test nothing. This checks the list without running the faults (that
takes minutes: run the script).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.tools.fault_injection import FAULTS, Fault, FaultListError, apply, check_list, copy_tracked

ROOT = Path(__file__).resolve().parents[2]


def test_every_snippet_matches_the_code_exactly_once() -> None:
    problems = check_list(FAULTS)
    assert not problems, "update tests/tools/fault_injection.py:\n" + "\n".join(problems)


def test_the_issue_s_faults_are_all_listed() -> None:
    """Faults (a)-(h) of issue 19, section 3, each by its letter."""
    letters = {f.name.split("-")[0] for f in FAULTS if f.name[1:2] == "-"}
    assert letters == set("abcdefgh")
    assert all(f.tests and f.what for f in FAULTS)


def test_a_stale_snippet_is_refused_with_the_file_and_count(tmp_path: Path) -> None:
    target = tmp_path / "fedsketch" / "sketch" / "count_sketch.py"
    target.parent.mkdir(parents=True)
    shutil.copy(ROOT / "fedsketch" / "sketch" / "count_sketch.py", target)
    gone = Fault(
        "stale",
        "fedsketch/sketch/count_sketch.py",
        "no such line",
        "x",
        ("tests/fedsketch/sketch/test_count_sketch.py",),
    )
    with pytest.raises(
        FaultListError,
        match=r"fault stale: the snippet 'no such line' occurs 0 times in fedsketch/sketch/count_sketch.py",
    ):
        apply(gone, tmp_path)
    twice = Fault(
        "twice",
        "fedsketch/sketch/count_sketch.py",
        "return self",
        "return None",
        ("tests/fedsketch/sketch/test_count_sketch.py",),
    )
    with pytest.raises(FaultListError, match=r"occurs \d+ times"):
        apply(twice, tmp_path)
    missing = Fault("missing", "fedsketch/gone.py", "a", "b", ("tests/fedsketch/sketch/test_count_sketch.py",))
    assert check_list([missing, missing]) == [
        "duplicate fault name missing",
        "fault missing: snippet occurs 0 times in fedsketch/gone.py (expected once)",
        "fault missing: snippet occurs 0 times in fedsketch/gone.py (expected once)",
    ]


def test_a_fault_changes_its_snippet_and_nothing_else(tmp_path: Path) -> None:
    fault = next(f for f in FAULTS if f.name.startswith("h-"))
    copy_tracked(ROOT, tmp_path)
    before = (tmp_path / fault.path).read_text()
    apply(fault, tmp_path)
    after = (tmp_path / fault.path).read_text()
    assert after == before.replace(fault.old, fault.new) != before
    assert (tmp_path / "pyproject.toml").read_text() == (ROOT / "pyproject.toml").read_text()
