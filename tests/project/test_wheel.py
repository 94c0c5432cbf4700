"""The wheel holds what users run: the packages the command, the API and the Flower apps import, and no
benchmark, test or development tool; its Python stays within the size the project allows itself."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # pip builds the wheel in a process of its own: about 4 s

ROOT = Path(__file__).resolve().parents[2]
# A ratchet, not the goal: 20,078 lines shipped on 2026-12-01 (issue 48 asks for 16,000); lower it as code goes.
PRODUCT_LINES = 20_078
"""The most lines of Python the wheel may ship: a ratchet, lowered as code goes (the goal: 16,000)."""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(ROOT), "-w", str(out)]
    subprocess.run(cmd, check=True, cwd=out, capture_output=True)
    return zipfile.ZipFile(next(out.glob("fedsketch-*.whl")))


def test_the_wheel_holds_no_benchmark_test_or_tool(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("fedsketch-")}
    assert tops == {"fedsketch", "strategies", "clients", "bridge", "experiments"}
    assert not [
        n for n in names if n.startswith(("experiments/bench/", "experiments/studies/", "tests/")) or "/tools/" in n
    ]
    assert "fedsketch/settings/settings.toml" in names and "experiments/configs/default.toml" in names
    declared = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "fedsketch" / "methods").glob("*.toml"))
    assert declared and set(declared) <= set(names)  # the methods' declarations, read by path


def test_the_wheel_ships_at_most_the_product_lines_allowed(wheel: zipfile.ZipFile) -> None:
    lines = sum(wheel.read(n).count(b"\n") for n in wheel.namelist() if n.endswith(".py"))
    assert lines <= PRODUCT_LINES, f"the wheel ships {lines:,} lines of Python; at most {PRODUCT_LINES:,}"
