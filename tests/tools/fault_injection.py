"""Fault injection: break the math on purpose, and check that the fast tests notice.

A test that cannot fail is a defect. Each fault below is one exact text
substitution in one file (a dropped learning rate, uniform instead of example
weights, an off-by-one in the sketch's direct window path, ...), the kind of
slip that leaves FetchSGD (Rothchild et al., ICML 2020) or Sketched-SGD (Ivkin
et al., NeurIPS 2019) running and plausible-looking but wrong. For each, the
script copies the repository's tracked files (as they are in the working tree)
into a temporary folder, applies the fault there, and runs the fast tests named
for it::

    python -m pytest -q -x -m "not slow" <tests>      (PYTHONPATH = the copy)

It prints one line per fault (caught or missed, the first failing test, the
seconds it took) and exits non-zero if any fault is missed. A first line runs
all the named tests on the unmodified copy: they must pass, or "caught" means
nothing. A snippet that no longer matches exactly once is an error, so a
refactor that moves code is told to update this list
(``tests/tools/test_fault_injection.py`` checks that on every fast run). The list: :mod:`tests.tools.fault_list`.

    python -m tests.tools.fault_injection               # every fault
    python -m tests.tools.fault_injection --only f-window-off-by-one b-sketched-lr
    python -m tests.tools.fault_injection --list
    python -m tests.tools.fault_injection --every       # no -x: list every test each fault fails
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.tools.fault import Fault, FaultListError
from tests.tools.fault_list import FAULTS

ROOT = Path(__file__).resolve().parents[2]
PYTEST = ("-m", "pytest", "-q", "-m", "not slow", "-p", "no:cacheprovider")
TIMEOUT_S = 900
TIMED_OUT = 124


@dataclass(frozen=True)
class Outcome:
    """What the named tests did on one (faulty or clean) copy."""

    name: str
    verdict: str  # "caught", "missed", "passed" (the clean copy), "FAILED" (the clean copy), "error"
    test: str
    seconds: float


def apply(fault: Fault, root: Path) -> None:
    """Apply ``fault`` to the tree at ``root``; :class:`FaultListError` unless ``old`` occurs exactly once."""
    target = root / fault.path
    if not target.is_file():
        raise FaultListError(f"fault {fault.name}: {fault.path} does not exist")
    text = target.read_text()
    count = text.count(fault.old)
    if count != 1:
        raise FaultListError(
            f"fault {fault.name}: the snippet {fault.old!r} occurs {count} times in {fault.path} (expected once); "
            "update the fault list (tests/tools/fault_list.py, fault_list_math.py) to the current code"
        )
    target.write_text(text.replace(fault.old, fault.new))


def check_list(faults: Sequence[Fault], root: Path = ROOT) -> list[str]:
    """Every problem with the list against the code at ``root``: stale snippets, missing test files, duplicates."""
    problems = []
    names = [f.name for f in faults]
    problems += [f"duplicate fault name {n}" for n in sorted({n for n in names if names.count(n) > 1})]
    for fault in faults:
        if fault.old == fault.new:
            problems.append(f"fault {fault.name} changes nothing")
        target = root / fault.path
        count = target.read_text().count(fault.old) if target.is_file() else 0
        if count != 1:
            problems.append(f"fault {fault.name}: snippet occurs {count} times in {fault.path} (expected once)")
        for test in fault.tests:
            if not (root / test.split("::")[0]).is_file():
                problems.append(f"fault {fault.name}: test file {test.split('::')[0]} does not exist")
    return problems


def copy_tracked(src: Path, dst: Path) -> None:
    """Copy the files git tracks under ``src`` (their working-tree contents) to ``dst``."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=src, capture_output=True, check=True).stdout
    for rel in filter(None, listed.decode().split("\0")):
        source = src / rel
        if source.is_file():  # tracked but deleted in the working tree: skip
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dst / rel)


def run_tests(tree: Path, tests: Sequence[str], every: bool = False) -> tuple[int, str]:
    """Run the fast tests ``tests`` inside ``tree``; the exit code and the first failing test (all, if ``every``)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, *PYTEST, *([] if every else ["-x"]), *tests]
    try:
        done = subprocess.run(
            command, cwd=tree, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return TIMED_OUT, f"timed out after {TIMEOUT_S} s"
    if done.returncode < 0:  # killed by a signal: a fault can make torch crash (two threads on one model)
        return done.returncode, f"the tests crashed ({signal.Signals(-done.returncode).name})"
    found = re.findall(r"^(?:FAILED|ERROR) (\S+)", done.stdout, re.MULTILINE)
    if found:
        return done.returncode, " ".join(found if every else found[:1])
    tail = done.stdout.strip().splitlines()[-1:] or done.stderr.strip().splitlines()[-1:] or [""]
    return done.returncode, tail[0][:100]


def run_fault(fault: Fault | None, tests: Sequence[str], src: Path = ROOT, every: bool = False) -> Outcome:
    """Copy the repository, apply ``fault`` (none: the clean copy) and run ``tests`` there."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fedsketch-fault-") as tmp:
        tree = Path(tmp)
        copy_tracked(src, tree)
        if fault is not None:
            apply(fault, tree)
        code, test = run_tests(tree, tests, every)
    seconds = time.perf_counter() - start
    if fault is None:
        return Outcome("(none: the code as it is)", "passed" if code == 0 else "FAILED", test, seconds)
    # pytest exits 1 when tests failed, and a crash under the fault (a signal) is noticed too; 0 means
    # the fault went unnoticed; anything else (collection error, unknown test id, time-out) is not a
    # test catching the math.
    verdict = "caught" if code == 1 or code < 0 else {0: "missed"}.get(code, "error")
    return Outcome(fault.name, verdict, test if code != 0 else "", seconds)


def table_row(outcome: Outcome, width: int) -> str:
    """One aligned line of the report: fault, result, seconds, first failing test."""
    return f"{outcome.name:<{width}}  {outcome.verdict:<7}  {outcome.seconds:>7.1f}  {outcome.test or '-'}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these faults")
    parser.add_argument("--list", action="store_true", help="list the faults and exit")
    parser.add_argument("--every", action="store_true", help="run all the named tests and list every failure")
    args = parser.parse_args(argv)
    problems = check_list(FAULTS)
    if problems:
        print("the fault list does not match the code:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    chosen = [f for f in FAULTS if not args.only or f.name in args.only]
    unknown = sorted(set(args.only or ()) - {f.name for f in FAULTS})
    if unknown or not chosen:
        print(f"unknown fault names {unknown}; --list shows them", file=sys.stderr)
        return 2
    if args.list:
        for f in chosen:
            print(f"{f.name:<30} {f.path:<38} {f.what}")
        return 0
    all_tests = list(dict.fromkeys(t for f in chosen for t in f.tests))
    width = max(len("(none: the code as it is)"), *(len(f.name) for f in chosen))
    failing = "failing tests" if args.every else "first failing test"
    print(f"{'fault':<{width}}  {'result':<7}  {'seconds':>7}  {failing}", flush=True)
    outcomes = [run_fault(None, all_tests)]
    print(table_row(outcomes[0], width), flush=True)
    if outcomes[0].verdict != "passed":
        print("the tests fail on the unmodified code: fix that first", file=sys.stderr)
        return 1
    for fault in chosen:
        outcomes.append(run_fault(fault, fault.tests, every=args.every))
        print(table_row(outcomes[-1], width), flush=True)
    missed = [o.name for o in outcomes[1:] if o.verdict != "caught"]
    print(
        f"\n{len(chosen) - len(missed)} of {len(chosen)} faults caught" + (f"; not caught: {missed}" if missed else "")
    )
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
