"""The CUDA-only mutants (``[needs_cuda]`` of ``mutation_equivalents.toml``), checked on a machine with a GPU.

mutmut cannot decide them on a CPU (docs/mutation.md). ``prepare``, wherever mutmut is installed, writes a copy of
the project whose modules that hold a listed mutant are mutmut's mutated copies, and mutmut's package beside it
(the copy's mutants need only that package; the GPU machine has no network). ``check``, run in that copy on the
GPU machine, runs the selected tests once each to record which mutated functions each reaches (mutmut's own
``stats`` switch), then each listed mutant against the tests that reach its function, in the order given, until
one fails (killed) or ends after ``--limit`` seconds (timeout); it prints one row per module and writes each
mutant's outcome to a JSON file, which ``mutation_report --cuda FILE`` counts in place of "needs CUDA".

    python -m tests.tools.cuda_mutants prepare mutants-work/cuda
    cd mutants-work/cuda/tree && PYTHONPATH=../site python -m tests.tools.cuda_mutants check \\
        --out ../outcomes.json -- -m gpu tests/fedsketch      # on the GPU machine

``--names`` checks other mutants than the listed ones (a rehearsal on a CPU: killed ones and an equivalent one,
against the tests mutmut ran them with).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from tests.tools import mutation_report, mutation_run

CAUGHT_BY_LIMIT = "the test ran past the limit"


def module_of(name: str) -> str:
    """``fedsketch.sketch.batch.x_host_tables__mutmut_2`` -> ``fedsketch/sketch/batch.py``."""
    return function_of(name).rpartition(".")[0].replace(".", "/") + ".py"


def function_of(name: str) -> str:
    """The function a mutant changes, as mutmut's ``stats`` switch records it."""
    return name.rsplit("__mutmut_", 1)[0]


def prepare(out: Path, names: list[str], root: Path = mutation_run.ROOT) -> Path:
    """``out/tree``: the project with every module that holds one of ``names`` mutated; ``out/site``: mutmut."""
    import mutmut
    from mutmut.mutation.file_mutation import mutate_file_contents

    tree = out / "tree"
    if out.exists():
        shutil.rmtree(out)
    for name in mutation_run.project_files(root):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, tree / name)
    for module in sorted({module_of(n) for n in names}):
        mutated = mutate_file_contents(module, (root / module).read_text())
        made = {f"{module.removesuffix('.py').replace('/', '.')}.{m}" for m in mutated.mutant_names}
        stale = sorted(n for n in names if module_of(n) == module and n not in made)
        if stale:
            raise ValueError(f"{module}: today's source makes no mutant named {stale} (the list is out of date)")
        (tree / module).write_text(mutated.code)
    shutil.copytree(Path(mutmut.__file__).parent, out / "site" / "mutmut", ignore=shutil.ignore_patterns("__pycache__"))
    dist = importlib.metadata.distribution("mutmut")
    info = Path(str(dist.locate_file(next(f for f in dist.files or [] if f.name == "METADATA")))).parent
    shutil.copytree(info, out / "site" / info.name)  # mutmut's __init__ reads its version from it
    return tree


class _Limit(Exception):
    pass


def _on_alarm(signum: int, frame: object) -> None:
    raise _Limit(CAUGHT_BY_LIMIT)


class Switch:
    """A pytest plugin that replaces the test loop: record what each test reaches, then try every mutant."""

    def __init__(self, names: list[str], limit_s: float, out: Path) -> None:
        self.names, self.limit_s, self.out = names, limit_s, out
        self.outcomes: dict[str, str] = {}
        self.broken: list[str] = []
        self.broke_cuda: str | None = None

    def _run(self, item: Any, mutant: str) -> tuple[bool, bool]:
        """Whether ``item`` failed with ``mutant`` switched on, and whether it ran past the limit."""
        from _pytest.runner import runtestprotocol

        os.environ["MUTANT_UNDER_TEST"] = mutant
        signal.signal(signal.SIGALRM, _on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 0 if mutant == "stats" else self.limit_s)  # 0: no limit
        try:
            reports = runtestprotocol(item, nextitem=None, log=False)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            os.environ.pop("MUTANT_UNDER_TEST", None)
        failed = [r for r in reports if r.failed]
        return bool(failed), any(CAUGHT_BY_LIMIT in str(r.longrepr) for r in failed)

    def pytest_runtestloop(self, session: Any) -> bool:
        from mutmut.state import state

        reach: dict[str, list[Any]] = {}
        for item in session.items:
            state()._stats.clear()
            failed, _ = self._run(item, "stats")
            if failed:
                self.broken.append(item.nodeid)
            for function in state()._stats:
                reach.setdefault(function, []).append(item)
        if self.broken:
            return True
        for name in self.names:
            self.outcomes[name] = (
                mutation_report.NO_TESTS if function_of(name) not in reach else mutation_report.SURVIVED
            )
            for item in reach.get(function_of(name), []):
                failed, late = self._run(item, name)
                if failed:
                    self.outcomes[name] = mutation_report.TIMEOUT if late else mutation_report.KILLED
                    break
            self.save()  # a run stopped by its time limit keeps what it decided
            if self.outcomes[name] != mutation_report.SURVIVED and not _cuda_works():
                self.broke_cuda = name  # every later test would fail too: stop, and say where
                break
        return True

    def save(self) -> None:
        self.out.write_text(json.dumps(self.outcomes, indent=1, sort_keys=True) + "\n")


def _cuda_works() -> bool:
    """Whether the process can still use its GPU (a device-side assert leaves every later CUDA call failing)."""
    import torch

    if not torch.cuda.is_available():
        return True
    try:
        return torch.ones(1, device="cuda").add_(1).item() == 2.0
    except RuntimeError:
        return False


def tallies(outcomes: dict[str, str]) -> dict[str, mutation_report.Tally]:
    """The outcomes counted per module, as :mod:`tests.tools.mutation_report` counts mutmut's."""
    modules: dict[str, mutation_report.Tally] = {}
    for name, found in outcomes.items():
        modules.setdefault(module_of(name), mutation_report.Tally()).counts[found] += 1
    return modules


def check(names: list[str], pytest_args: list[str], limit_s: float, out: Path) -> int:
    import pytest

    switch = Switch(names, limit_s, out)
    start = time.monotonic()
    pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:randomly", *pytest_args], plugins=[switch])
    if switch.broken:
        print("cuda_mutants: these tests fail without a mutant, so no mutant was tried:", *switch.broken, sep="\n  ")
        return 2
    if switch.broke_cuda:
        left = names[names.index(switch.broke_cuda) + 1 :]
        print(
            f"cuda_mutants: the GPU is unusable after {switch.broke_cuda}; {len(left)} left untried (rerun with --names)"
        )
    print("\n".join(mutation_report.table(tallies(switch.outcomes))))
    missed = sorted(n for n, o in switch.outcomes.items() if o not in mutation_report.CAUGHT)
    print(f"{len(names)} mutants in {time.monotonic() - start:.0f} s; {len(missed)} not caught (listed in {out})")
    switch.save()
    return 1 if missed or switch.broke_cuda else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["prepare", "check"])
    parser.add_argument("folder", type=Path, nargs="?", default=Path("mutants-work/cuda"), help="prepare: where to")
    parser.add_argument("--names", nargs="+", help="these mutants, not the [needs_cuda] list")
    parser.add_argument("--limit", type=float, default=120.0, help="check: seconds a test may run with a mutant")
    parser.add_argument("--out", type=Path, default=Path("cuda-mutants.json"), help="check: the outcomes' file")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    pytest_args = argv[cut + 1 :] or ["-m", "gpu", "tests"]  # after --, pytest's arguments
    names = args.names or sorted(mutation_report.load_listed().needs_cuda)
    if args.action == "prepare":
        try:
            tree = prepare(args.folder, names)
        except ValueError as err:
            print(f"cuda_mutants: {err}", file=sys.stderr)
            return 2
        print(f"{len(names)} mutants in {len({module_of(n) for n in names})} modules: {tree}")
        return 0
    import torch

    if not args.names and not torch.cuda.is_available():
        print("cuda_mutants: no CUDA device here; the listed mutants need one (--names checks others)", file=sys.stderr)
        return 2
    return check(names, pytest_args, args.limit, args.out)


if __name__ == "__main__":
    sys.exit(main())
