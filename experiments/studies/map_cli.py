"""The command line of a map over finished runs (:mod:`~experiments.studies.regime`,
:mod:`~experiments.studies.participation`): read the runs, print the table, draw the figure."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sized
from pathlib import Path
from typing import TypeVar

T = TypeVar("T", bound=Sized)


def run(
    argv: list[str] | None,
    name: str,
    description: str,
    collect: Callable[[Path], T],
    table: Callable[[T], str],
    draw: Callable[[T, Path], Path],
    counted: str,
) -> int:
    """``python -m experiments.analysis.NAME RUNS_DIR [--out DIR]``: 2 when the runs are missing."""
    parser = argparse.ArgumentParser(prog=f"python -m experiments.analysis.{name}", description=description)
    parser.add_argument("runs", type=Path, help=f"the folder holding the {name}-* experiments, e.g. runs")
    parser.add_argument("--out", type=Path, help=f"where to write {name}.png (default: the runs folder)")
    args = parser.parse_args(argv)
    try:
        found = collect(args.runs)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path = draw(found, args.out or args.runs)
    print(table(found))
    print(f"\nwrote {path} ({len(found)} {counted})")
    return 0
