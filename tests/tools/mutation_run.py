"""Mutation testing by groups: each group's modules mutated by mutmut against its own tests (slow ones too if ``slow``).

mutmut runs, for each mutant, the selected tests that reach the mutated function; a group names
the few test files that exercise its modules (``mutation_groups.toml``), so a module's mutants never
wait on the tests of another. Each group runs in its own copy of the project (``WORK/GROUP``: the
files git tracks, and untracked ones it does not ignore), whose ``[tool.mutmut]`` table is
``pyproject.toml``'s with the group's modules and tests; then one report covers every group
(:mod:`tests.tools.mutation_report`). docs/mutation.md has the figures.

    python -m tests.tools.mutation_run --list
    python -m tests.tools.mutation_run                        # every group, one after another
    python -m tests.tools.mutation_run sketch billing --work /tmp/mutation
    python -m tests.tools.mutation_run --max-children 2         # every core of a 2-core machine
    python -m tests.tools.mutation_run --report-only --min-module 90 --min-total 95
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.tools import mutation_report

ROOT = Path(__file__).resolve().parents[2]
GROUPS = Path(__file__).with_name("mutation_groups.toml")
PACKAGES = ("fedsketch/", "strategies/", "clients/", "bridge/", "experiments/")
PAGES = "docs/"  # copied too: some tests check a page against the code (test_forecast reads regime.md)


@dataclass(frozen=True)
class Group:
    """Modules mutated together, and the test files run against them."""

    name: str
    modules: tuple[str, ...]
    tests: tuple[str, ...]
    children: int | None = None
    """At most this many mutants at once, whatever ``--max-children`` says (``children = N`` in its table)."""
    slow: bool = False
    """Whether its tests marked ``slow`` (real processes, out of the fast tier) run too (``slow = true``)."""
    own_pids: bool = False
    """Whether mutmut runs in a PID namespace of its own (``own_pids = true``; Linux, as root): a mutant that
    signals every process it can find reaches only the run's own."""


def load_groups(path: Path = GROUPS, root: Path = ROOT) -> dict[str, Group]:
    """The groups of ``path``; a module or test file that does not exist is an error naming it."""
    groups: dict[str, Group] = {}
    for name, table in tomllib.loads(path.read_text()).items():
        if set(table) - {"children", "slow", "own_pids"} != {"modules", "tests"}:
            raise ValueError(
                f"{path}: group [{name}] needs 'modules' and 'tests' (and may say 'children', 'slow', 'own_pids'); "
                f"got {sorted(table)}"
            )
        group = Group(
            name,
            tuple(table["modules"]),
            tuple(table["tests"]),
            table.get("children"),
            table.get("slow", False),
            table.get("own_pids", False),
        )
        missing = [f for f in group.modules + group.tests if not (root / f).is_file()]
        if missing:
            raise ValueError(f"{path}: group [{name}] names files that do not exist: {missing}")
        if not group.modules or not group.tests:
            raise ValueError(f"{path}: group [{name}] needs at least one module and one test file")
        groups[name] = group
    return groups


def mutmut_settings(shared: dict[str, Any], group: Group) -> dict[str, Any]:
    """``[tool.mutmut]`` for one group: the shared settings, its modules and tests, the other packages copied."""
    sources = [p for p in PACKAGES if any(m.startswith(p) for m in group.modules)]
    args = list(shared.get("pytest_add_cli_args", []))
    if group.slow and "not slow" in args:  # its "-m" goes with it
        at = args.index("not slow")
        args[at - 1 : at + 1] = []
    return {
        **shared,
        "pytest_add_cli_args": args,
        "source_paths": sources,
        "only_mutate": list(group.modules),
        "also_copy": [*(p for p in PACKAGES if p not in sources), PAGES],
        "pytest_add_cli_args_test_selection": list(group.tests),
    }


def _toml_value(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return str(value)


def with_mutmut_table(pyproject: str, settings: dict[str, Any]) -> str:
    """``pyproject``'s text with its ``[tool.mutmut]`` table (the file's last) replaced by ``settings``."""
    head, sep, tail = pyproject.partition("\n[tool.mutmut]\n")
    if not sep:
        raise ValueError("pyproject.toml has no [tool.mutmut] table")
    if any(line.startswith("[") for line in tail.splitlines()):
        raise ValueError("[tool.mutmut] is not the last table of pyproject.toml")
    body = "".join(f"{key} = {_toml_value(value)}\n" for key, value in settings.items())
    return f"{head}\n[tool.mutmut]\n{body}"


def project_files(root: Path) -> list[str]:
    """The files git tracks, and the untracked ones it does not ignore (new tests, before a commit)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root,
        check=True,
        capture_output=True,
    ).stdout
    return sorted({f for f in out.decode().split("\0") if f and (root / f).is_file()})


def prepare(group: Group, root: Path, work: Path) -> Path:
    """A fresh copy of the project for ``group``, its ``[tool.mutmut]`` set; returns the copy's root."""
    copy = work / group.name
    if copy.exists():
        shutil.rmtree(copy)
    for name in project_files(root):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, copy / name)
    pyproject = (root / "pyproject.toml").read_text()
    shared = tomllib.loads(pyproject)["tool"]["mutmut"]
    (copy / "pyproject.toml").write_text(with_mutmut_table(pyproject, mutmut_settings(shared, group)))
    return copy


def mutmut_installed() -> bool:
    """Whether ``python -m mutmut`` can run here (the ``mutation`` extra)."""
    return importlib.util.find_spec("mutmut") is not None


OWN_PIDS = ["unshare", "--pid", "--fork", "--mount-proc"]
"""A new PID namespace and its own ``/proc``: what runs in it sees and signals only the processes started in it."""


def mutmut_command(children: int, own_pids: bool = False) -> list[str]:
    """``mutmut run --max-children CHILDREN``, niced, in a PID namespace of its own with ``own_pids``."""
    cmd = ["nice", "-n", "10", sys.executable, "-m", "mutmut", "run", "--max-children", str(children)]
    return [*OWN_PIDS, *cmd] if own_pids else cmd


def run_group(copy: Path, log: Path, children: int = 1, own_pids: bool = False) -> tuple[int, float]:
    """:func:`mutmut_command` in ``copy`` (no PYTHONPATH, torch on one thread a child: each child has its core); its
    exit code and wall seconds."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    with log.open("wb") as out:
        cmd = mutmut_command(children, own_pids)
        code = subprocess.run(cmd, check=False, cwd=copy, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    return code, time.monotonic() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", nargs="*", help="groups to run (default: all)")
    parser.add_argument("--work", type=Path, default=ROOT / "mutants-work", help="where the copies go")
    parser.add_argument("--list", action="store_true", help="print the groups and exit")
    parser.add_argument("--report-only", action="store_true", help="report the copies' last results, run nothing")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument("--max-children", type=int, default=1, help="mutants tested at once (one core each)")
    parser.add_argument("--min-module", type=float, default=0.0)
    parser.add_argument("--min-total", type=float, default=0.0)
    args = parser.parse_args(argv)
    try:
        groups = load_groups()
    except (OSError, ValueError, tomllib.TOMLDecodeError) as err:
        print(f"mutation_run: {err}", file=sys.stderr)
        return 2
    if args.max_children < 1:
        print(f"mutation_run: --max-children must be at least 1; got {args.max_children}", file=sys.stderr)
        return 2
    unknown = [g for g in args.groups if g not in groups]
    if unknown:
        print(f"mutation_run: unknown group(s) {unknown}; groups: {', '.join(groups)}", file=sys.stderr)
        return 2
    chosen = [groups[g] for g in args.groups] if args.groups else list(groups.values())
    if args.list:
        for g in chosen:
            print(f"{g.name}: {', '.join(g.modules)}  <-  {len(g.tests)} test files")
        return 0
    if not args.report_only and not mutmut_installed():
        print("mutation_run: mutmut is not installed here (pip install mutmut==3.8.1)", file=sys.stderr)
        return 2
    args.work.mkdir(parents=True, exist_ok=True)
    for g in [] if args.report_only else chosen:
        copy = prepare(g, ROOT, args.work)
        children = min(args.max_children, g.children or args.max_children)
        code, wall = run_group(copy, args.work / f"{g.name}.log", children, g.own_pids)
        print(f"{g.name}: mutmut exit {code} after {wall:.0f} s (log: {args.work / f'{g.name}.log'})", flush=True)
    report = [arg for g in chosen for arg in ("--mutants", str(args.work / g.name / "mutants"))]
    extra = ["--out", str(args.out)] if args.out else []
    goals = ["--min-module", str(args.min_module), "--min-total", str(args.min_total)]
    return mutation_report.main([*report, "--survivors", *extra, *goals])


if __name__ == "__main__":
    sys.exit(main())
