"""bench_peer's tables: medians, same-run ratios to pfl, what the sketch costs, and memory by kind of process."""

from __future__ import annotations

import statistics
from typing import Literal, NotRequired, TypedDict

from experiments.bench.proctree import TreeSampler

Measure = Literal["round_s", "total_s", "first_round_s", "peak_mb"]


class Run(TypedDict):
    """One run of one side: seconds a round (median), the whole command, until round 1 ended; memory; accuracy."""

    round_s: float
    total_s: float
    first_round_s: float
    peak_mb: float
    accuracy: float
    tree: NotRequired[TreeSampler]  # its process tree's memory, by kind of process (for --breakdown)


RATIO_KEYS: tuple[Measure, ...] = ("round_s", "total_s", "peak_mb")


def print_table(results: dict[str, list[Run]]) -> None:
    """Medians over runs, and each run's ratio to the pfl run of the same round of the alternation."""
    print("| | seconds a round (median) | whole command | round 1 done after | peak PSS, whole tree | final accuracy |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    keys: tuple[Measure, ...] = ("round_s", "total_s", "first_round_s", "peak_mb")
    for name, runs in results.items():
        med = {k: statistics.median(float(r[k]) for r in runs) for k in keys}
        accs = sorted({f"{float(r['accuracy']):.4f}" for r in runs})
        print(
            f"| {name} | {med['round_s']:.3f} | {med['total_s']:.1f} s | {med['first_round_s']:.1f} s "
            f"| {med['peak_mb']:,.0f} MB | {', '.join(accs)} |"
        )
    print("\nSame-run ratios to pfl (each run against the pfl run beside it): median (min-max), then run by run:")
    print("| | seconds a round | whole command | peak PSS |")
    print("| --- | ---: | ---: | ---: |")
    for name, runs in results.items():
        if name != "pfl":
            print(f"| {name} | " + " | ".join(_ratios(runs, results["pfl"], k) for k in RATIO_KEYS) + " |")
    fedavg = next((name for name in results if name.startswith("fedsketch FedAvg")), None)
    fetchsgd = next((name for name in results if name.startswith("fedsketch FetchSGD")), None)
    if fedavg and fetchsgd:
        print(f"\nWhat the sketch costs: {fetchsgd} against {fedavg}, same runs:")
        print("| | seconds a round | whole command | peak PSS |")
        print("| --- | ---: | ---: | ---: |")
        print(
            "| FetchSGD / FedAvg | "
            + " | ".join(_ratios(results[fetchsgd], results[fedavg], k) for k in RATIO_KEYS)
            + " |"
        )


def _ratios(runs: list[Run], against: list[Run], key: Measure) -> str:
    """``median (min-max): r1, r2, ...`` of each run's ``key`` over the run of ``against`` beside it."""
    ratios = [float(r[key]) / float(a[key]) for r, a in zip(runs, against, strict=True)]
    each = ", ".join(f"{x:.2f}" for x in ratios)
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}): {each}"


def print_breakdown(results: dict[str, list[Run]]) -> None:
    """PSS by kind of process at the tree's peak, and when each kind first appeared (last run of each side)."""
    for name, runs in results.items():
        tree = runs[-1]["tree"]
        assert isinstance(tree, TreeSampler)
        print(f"\n{name}: peak {tree.peak_mb:,.0f} MB PSS")
        print("| process | PSS at the peak | of it anonymous | file-backed | shared memory | first seen after |")
        print("| --- | ---: | ---: | ---: | ---: | ---: |")
        for role in sorted(tree.first_seen, key=tree.first_seen.__getitem__):
            pss, anon, file, shmem = tree.at_peak.get(role, [0.0] * 4)
            print(
                f"| {role} | {pss:,.0f} MB | {anon:,.0f} MB | {file:,.0f} MB | {shmem:,.0f} MB "
                f"| {tree.first_seen[role]:.1f} s |"
            )
