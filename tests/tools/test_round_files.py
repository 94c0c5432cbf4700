"""docs/architecture.md's list of the files one FetchSGD round passes through is the traced one.

:mod:`tests.tools.round_files` runs the default job's FetchSGD through a
real Flower simulation and records every product function called during round
2; the architecture page's table must name exactly those files, and its count
must be their number.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"
SECTION = "## One FetchSGD round, file by file"


def documented() -> tuple[set[str], int]:
    """The files the section's table names, and the count its text gives."""
    text = PAGE.read_text(encoding="utf-8")
    body = text[text.index(SECTION) + len(SECTION) :].split("\n## ", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("| ") and not line.startswith("| #")]
    files = {path for row in rows for path in re.findall(r"`([\w/]+\.py)`", row)}
    count = re.search(r"the table names (\d+) product files", body)
    assert count is not None, "the section no longer says how many files its table names"
    return files, int(count.group(1))


def run_tool(*settings: str) -> subprocess.CompletedProcess[str]:
    """The tool, in a fresh process, on the CPU (the page's round) with ``settings`` on top."""
    command = [sys.executable, "-m", "tests.tools.round_files", "--json", "--set", "device=cpu", *settings]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)


def traced(*settings: str) -> dict[str, dict[str, int]]:
    """The files round 2 passed through, and the lines of the functions it called, per file."""
    out = run_tool(*settings)
    assert out.returncode == 0, out.stderr[-3000:]
    found: dict[str, dict[str, int]] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.slow
def test_the_architecture_page_names_every_file_a_fetchsgd_round_passes_through_and_no_other() -> None:
    found = traced()
    files = found["files"]
    listed, count = documented()
    assert sorted(set(files) - listed) == [], "files the round runs that the table does not name"
    assert sorted(listed - set(files)) == [], "files the table names that the round does not run"
    assert count == len(files)
    for core in ("strategies/strategy.py", "fedsketch/methods/fetchsgd.py", "fedsketch/sketch/count_sketch.py"):
        assert files[core] > 0
    for path, lines in found["called_lines"].items():  # the functions called lie within their files
        assert 0 < lines < len((ROOT / path).read_text(encoding="utf-8").splitlines())


@pytest.mark.slow
def test_settings_that_add_files_to_a_round_are_seen_by_the_trace() -> None:
    files = traced("download=sparse", "client-assignment=node")["files"]
    assert "fedsketch/server/ledger.py" in files and "fedsketch/compress/sparse.py" in files
    assert set(documented()[0]) <= set(files)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "message"),
    [("strategy=nosuch", "nosuch"), ("num-rounds=1", "never started round 2")],
    ids=["unknown-method", "no-round-2"],
)
def test_a_bad_setting_or_a_run_without_round_2_is_one_clear_line(setting: str, message: str) -> None:
    out = run_tool(setting)
    assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr
