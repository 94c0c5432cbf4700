"""Per-module report of a mutmut run: killed, survived, timed out, and the score.

mutmut writes each mutated file's results to ``mutants/<file>.meta`` (a JSON object whose
``exit_code_by_key`` maps every mutant to the exit code of the tests run against it). This
reads those files, sets aside the survivors listed in ``mutation_equivalents.toml`` and prints
one row per module and a total (docs/mutation.md):

    env -u PYTHONPATH mutmut run --max-children 1
    python -m tests.tools.mutation_report                    # the table
    python -m tests.tools.mutation_report --out report.md --survivors
    python -m tests.tools.mutation_report --min-module 90 --min-total 95  # exit 1 below
    python -m tests.tools.mutation_report --mutants A/mutants --mutants B/mutants   # several runs

``python -m tests.tools.mutation_run`` runs mutmut group by group and ends with this report.

The score is killed / (killed + survived), as the mutation-testing literature defines it:
equivalent mutants are excluded, mutants no selected test reaches count as survived, and
timeouts (a mutant that made a test hang) count as killed. The CUDA-only mutants count as
survived in the score; the score "on a CPU" leaves them out, as a machine without CUDA cannot
tell them apart (the tests marked ``gpu`` check them where a GPU is present); ``--cuda FILE``, the outcomes
``python -m tests.tools.cuda_mutants check`` wrote on a GPU, counts them as they came out there.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

EQUIVALENTS = Path(__file__).with_name("mutation_equivalents.toml")

KILLED = "killed"
SURVIVED = "survived"
TIMEOUT = "timeout"
NO_TESTS = "no tests"
NOT_CHECKED = "not checked"
EQUIVALENT = "equivalent"
NEEDS_CUDA = "needs CUDA"
OTHER = "other"

_BY_EXIT_CODE: dict[int | None, str] = {
    1: KILLED,
    3: KILLED,  # pytest's internal error: the mutant broke the test run
    37: KILLED,  # caught by mutmut's type check
    0: SURVIVED,
    5: NO_TESTS,
    33: NO_TESTS,
    None: NOT_CHECKED,
    36: TIMEOUT,
    24: TIMEOUT,
    -24: TIMEOUT,
    152: TIMEOUT,
    255: TIMEOUT,
}
COLUMNS = (KILLED, TIMEOUT, SURVIVED, NO_TESTS, EQUIVALENT, NEEDS_CUDA, NOT_CHECKED, OTHER)
CAUGHT = (KILLED, TIMEOUT)  # a timeout is a mutant that made a test hang
MISSED = (SURVIVED, NO_TESTS, NEEDS_CUDA)  # no test run here failed


@dataclass
class Tally:
    """Mutants of one module by outcome, and the survivors' names."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COLUMNS, 0))
    survivors: list[str] = field(default_factory=list)

    @property
    def mutants(self) -> int:
        return sum(self.counts.values())

    @property
    def score(self) -> float | None:
        """killed / (killed + survived); timeouts are kills, unreached and CUDA-only survive."""
        caught = sum(self.counts[c] for c in CAUGHT)
        missed = sum(self.counts[c] for c in MISSED)
        return caught / (caught + missed) if caught + missed else None

    @property
    def cpu_score(self) -> float | None:
        """The score without the CUDA-only mutants, which a CPU cannot decide."""
        caught = sum(self.counts[c] for c in CAUGHT)
        missed = sum(self.counts[c] for c in MISSED if c != NEEDS_CUDA)
        return caught / (caught + missed) if caught + missed else None

    def add(self, other: Tally) -> None:
        for key, value in other.counts.items():
            self.counts[key] += value
        self.survivors += other.survivors


def total(modules: Mapping[str, Tally]) -> Tally:
    """Every module's tally added up."""
    out = Tally()
    for module in modules.values():
        out.add(module)
    return out


@dataclass(frozen=True)
class Listed:
    """The survivors set aside: equivalent ones, and those only a CUDA device tells apart."""

    equivalent: Mapping[str, str]
    needs_cuda: Mapping[str, str]


def load_listed(path: Path = EQUIVALENTS) -> Listed:
    data = tomllib.loads(path.read_text())
    unknown = set(data) - {"equivalent", "needs_cuda"}
    if unknown:
        raise ValueError(f"{path}: unknown section(s) {sorted(unknown)}; expected [equivalent] and [needs_cuda]")
    return Listed(data.get("equivalent", {}), data.get("needs_cuda", {}))


def outcome(exit_code: int | None, name: str, listed: Listed, on_gpu: Mapping[str, str] | None = None) -> str:
    """A mutant's column; ``on_gpu``: the outcomes of the CUDA-only mutants on a GPU (:mod:`tests.tools.cuda_mutants`)."""
    status = _BY_EXIT_CODE.get(exit_code, OTHER)
    if status in (SURVIVED, NO_TESTS) and name in listed.equivalent:
        return EQUIVALENT
    if status in (SURVIVED, NO_TESTS) and name in listed.needs_cuda:
        return (on_gpu or {}).get(name, NEEDS_CUDA)
    return status


def tally(
    mutants_dir: Path, listed: Listed, on_gpu: Mapping[str, str] | None = None
) -> tuple[dict[str, Tally], list[str]]:
    """Each module's tally, and the mutants listed as equivalent that were killed (the list is stale)."""
    metas = sorted(mutants_dir.rglob("*.py.meta"))
    if not metas:
        raise FileNotFoundError(f"no mutmut results under {mutants_dir} (run `mutmut run` first)")
    modules: dict[str, Tally] = {}
    stale: list[str] = []
    for meta in metas:
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        if not codes:
            continue
        module = modules.setdefault(meta.relative_to(mutants_dir).as_posix().removesuffix(".meta"), Tally())
        for name, code in codes.items():
            status = outcome(code, name, listed, on_gpu)
            module.counts[status] += 1
            if status in MISSED:
                module.survivors.append(name)
            if status == KILLED and name in listed.equivalent:
                stale.append(name)
    return modules, stale


def tally_all(
    dirs: Iterable[Path], listed: Listed, on_gpu: Mapping[str, str] | None = None
) -> tuple[dict[str, Tally], list[str]]:
    """:func:`tally` over several runs' folders (one per group of modules), merged by module."""
    modules: dict[str, Tally] = {}
    stale: list[str] = []
    for folder in dirs:
        found, old = tally(folder, listed, on_gpu)
        for name, module in found.items():
            modules.setdefault(name, Tally()).add(module)
        stale += old
    return modules, stale


def _percent(score: float | None) -> str:
    return "n/a" if score is None else f"{100 * score:.1f}%"


def table(modules: Mapping[str, Tally]) -> list[str]:
    header = ["module", "mutants", *COLUMNS, "score", "on a CPU"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += [_row(f"`{name}`", module) for name, module in sorted(modules.items())]
    lines.append(_row("**all**", total(modules)))
    return lines


def _row(label: str, module: Tally) -> str:
    counts = (str(module.counts[c]) for c in COLUMNS)
    cells = [label, str(module.mutants), *counts, _percent(module.score), _percent(module.cpu_score)]
    return "| " + " | ".join(cells) + " |"


def below(modules: Mapping[str, Tally], min_module: float, min_total: float) -> list[str]:
    """The goals missed, one line each: a module under ``min_module`` %, the total under ``min_total`` %."""
    missed = [
        f"{name}: {_percent(m.score)} < {min_module}%"
        for name, m in sorted(modules.items())
        if m.score is not None and 100 * m.score < min_module
    ]
    score = total(modules).score
    if score is not None and 100 * score < min_total:
        missed.append(f"all modules: {_percent(score)} < {min_total}%")
    return missed


def report(modules: Mapping[str, Tally], stale: Iterable[str], survivors: bool) -> str:
    lines = table(modules)
    if survivors:
        lines += ["", "Survivors (`mutmut show NAME` prints each change):", ""]
        lines += [f"- `{name}`" for m in modules.values() for name in m.survivors]
    stale = list(stale)
    if stale:
        lines += ["", "Listed as equivalent but killed (remove them from the list):", ""]
        lines += [f"- `{name}`" for name in stale]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutants", type=Path, action="append", help="mutmut's folder (repeat for several runs)")
    parser.add_argument("--equivalents", type=Path, default=EQUIVALENTS)
    parser.add_argument("--cuda", type=Path, help="the CUDA-only mutants' outcomes on a GPU (cuda_mutants check)")
    parser.add_argument("--out", type=Path, help="also write the report to this file")
    parser.add_argument("--survivors", action="store_true", help="list every survivor by name")
    parser.add_argument("--min-module", type=float, default=0.0, help="exit 1 if a module scores under this %%")
    parser.add_argument("--min-total", type=float, default=0.0, help="exit 1 if all modules score under this %%")
    args = parser.parse_args(argv)
    try:
        on_gpu = json.loads(args.cuda.read_text()) if args.cuda else None
        modules, stale = tally_all(args.mutants or [Path("mutants")], load_listed(args.equivalents), on_gpu)
    except (OSError, ValueError, KeyError, tomllib.TOMLDecodeError) as err:
        print(f"mutation_report: {err}", file=sys.stderr)
        return 2
    text = report(modules, stale, args.survivors)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    missed = below(modules, args.min_module, args.min_total)
    for line in missed:
        print(f"below the goal: {line}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
