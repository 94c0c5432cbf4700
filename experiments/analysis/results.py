"""An experiment folder's finished metrics, grouped into runs that differ only by seed.

A *run group* is one strategy at one sweep point (``experiments/running/sweep.py``);
its seeds are the folders ``<strategy>[/<point>]`` and ``.../seed<k>`` that
:func:`fedsketch.server.runlog.run_dir` lays out. Plots and the report both read the
folder through :func:`collect_groups` and reduce a group over its seeds the
same way (:func:`summarize`): the mean, and the min-max spread.

The two questions the FetchSGD paper (Rothchild et al., ICML 2020) asks of
such runs are answered here on plain numbers, so they can be tested on
hand-made inputs: how many bytes a run spent before it first reached a target
accuracy (:func:`bytes_to_target`), and which runs no other beats on both
accuracy and upload (:func:`pareto_front`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsketch.server import runlog

Row = dict[str, Any]
SEED_DIR = re.compile(r"seed\d+")


@dataclass(frozen=True)
class RunGroup:
    """One strategy at one sweep point: the metrics rows of each seed, in seed order."""

    strategy: str
    point: str
    """The sweep point's folder name (``rows3-cols5000``); ``""`` when the strategy was not swept."""
    seeds: tuple[tuple[Row, ...], ...]
    stopped: tuple[str, ...] = ()
    """A note per seed stopped before its last round: ``seed 1 interrupted (SIGINT) after round 3 of 50``."""

    @property
    def label(self) -> str:
        """``fetchsgd rows3-cols5000``, or the strategy alone when not swept."""
        return f"{self.strategy} {self.point}" if self.point else self.strategy


@dataclass(frozen=True)
class Spread:
    """A quantity over seeds: mean, min, max."""

    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of ``values`` (at least one)."""
        if not values:
            raise ValueError("a spread needs at least one value")
        return cls(sum(values) / len(values), min(values), max(values))


@dataclass(frozen=True)
class Summary:
    """A run group reduced over its seeds, from each seed's last evaluated round."""

    group: RunGroup
    rounds: Spread
    accuracy: Spread
    upload: Spread
    download: Spread
    total: Spread
    """Upload + download bytes."""
    upload_compression: Spread
    """Dense (uncompressed float32) upload bytes over the bytes actually uploaded."""


def collect_groups(experiment_dir: Path) -> list[RunGroup]:
    """Every run group with metrics under ``experiment_dir``, sorted by strategy, then point (numbers as numbers).

    Raises
    ------
    FileNotFoundError
        If the folder does not exist or holds no metrics.
    """
    if not experiment_dir.is_dir():
        raise FileNotFoundError(f"no experiment folder at {experiment_dir}")
    found: dict[tuple[str, str], list[tuple[Row, ...]]] = {}
    stopped: dict[tuple[str, str], list[str]] = {}
    for metrics in sorted(experiment_dir.rglob("metrics.jsonl")):
        rows = runlog.read_metrics(metrics.parent)
        if not rows:
            continue
        parts = metrics.parent.relative_to(experiment_dir).parts
        if parts and SEED_DIR.fullmatch(parts[-1]):
            parts = parts[:-1]
        key = (rows[0]["strategy"], "/".join(parts[1:]))
        found.setdefault(key, []).append(tuple(rows))
        status = runlog.read_status(metrics.parent)
        if status is not None:
            stopped.setdefault(key, []).append(f"seed {rows[0]['seed']} {runlog.status_note(status)}")
    if not found:
        raise FileNotFoundError(f"no metrics.jsonl under {experiment_dir}")
    groups = sorted(found.items(), key=lambda item: (item[0][0], _natural(item[0][1])))
    return [
        RunGroup(strategy, point, tuple(sorted(seeds, key=_seed)), tuple(sorted(stopped.get((strategy, point), []))))
        for (strategy, point), seeds in groups
    ]


def _seed(rows: tuple[dict[str, Any], ...]) -> int:
    return int(rows[0]["seed"])


def _natural(name: str) -> list[int | str]:
    """Sort key that puts ``cols3000`` before ``cols27000``: digit runs compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def summarize(group: RunGroup) -> Summary:
    """Final accuracy, bytes and upload compression of each seed, as spreads over the seeds."""
    last = [rows[-1] for rows in group.seeds]
    return Summary(
        group=group,
        rounds=Spread.of([r["round"] for r in last]),
        accuracy=Spread.of([r["test_accuracy"] for r in last]),
        upload=Spread.of([r["cum_upload_bytes"] for r in last]),
        download=Spread.of([r["cum_download_bytes"] for r in last]),
        total=Spread.of([r["cum_upload_bytes"] + r["cum_download_bytes"] for r in last]),
        upload_compression=Spread.of([r["cum_dense_upload_bytes"] / r["cum_upload_bytes"] for r in last]),
    )


def bytes_to_target(rows: Sequence[Row], target: float) -> tuple[int, int] | None:
    """``(upload, upload + download)`` cumulative bytes at the first evaluated round whose accuracy reaches ``target``.

    ``None`` if no evaluated round reaches it. Only evaluated rounds count: a
    run may have passed the target between two evaluations, so the bytes are
    an upper bound at the resolution of ``eval-every``.
    """
    for row in rows:
        if row["test_accuracy"] >= target:
            return int(row["cum_upload_bytes"]), int(row["cum_upload_bytes"] + row["cum_download_bytes"])
    return None


DEFAULT_TARGET_FRACTION = 0.9
"""Without a target given: this fraction of the best final (mean) accuracy among the runs compared."""


@dataclass(frozen=True)
class Reach:
    """Bytes a run group spent until it first reached one target accuracy."""

    target: float
    seeds_reached: int
    upload: Spread | None
    """``None`` unless every seed reached the target."""
    total: Spread | None


def reach(summary: Summary, target: float) -> Reach:
    """Bytes to ``target`` of each seed, as a spread when every seed reached it."""
    hits = [bytes_to_target(rows, target) for rows in summary.group.seeds]
    got = [h for h in hits if h is not None]
    if len(got) < len(hits):
        return Reach(target, len(got), None, None)
    return Reach(target, len(got), Spread.of([h[0] for h in got]), Spread.of([h[1] for h in got]))


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the ``(bytes, accuracy)`` points that no other point dominates, by increasing bytes.

    A point is dominated when another has at least its accuracy for at most its
    bytes, and is strictly better in one of the two. Identical points do not
    dominate each other: both are on the front.
    """

    def dominated(i: int) -> bool:
        b_i, a_i = points[i]
        return any(b <= b_i and a >= a_i and (b < b_i or a > a_i) for b, a in points)

    return sorted((i for i in range(len(points)) if not dominated(i)), key=lambda i: (points[i][0], -points[i][1]))


def format_bytes(n: float, digits: int = 3) -> str:
    """Decimal units, ``digits`` significant digits: ``1.19 MB``, ``250 kB``, ``2 GB``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}g} {unit}"
    return f"{n:.0f} B"


def format_spread(spread: Spread, fmt: Callable[[float], str]) -> str:
    """``mean (low-high)``, each through ``fmt``; the mean alone when the seeds agree."""
    if spread.low == spread.high:
        return fmt(spread.mean)
    return f"{fmt(spread.mean)} ({fmt(spread.low)}-{fmt(spread.high)})"


_ERROR = re.compile(r"^(?:[\w.]+\.)?(\w*(?:Error|Exception))\b: (.+)$")


def failed_replies(run_dir: Path) -> str:
    """How many clients of a run failed to contribute, by kind, and the first reason: one line, or ""."""
    rows = runlog.read_metrics(run_dir, runlog.ROUNDS)
    counts = {kind: sum(int(row.get(kind, 0)) for row in rows) for kind in ("rejected", "client_errors", "timeouts")}
    if not any(counts.values()):
        return ""
    first = next(((row["round"], row["first_failure"]) for row in rows if row.get("first_failure")), None)
    kinds = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in counts.items() if n)
    return f"{sum(counts.values())} client replies failed ({kinds})" + (
        f"; first, in round {first[0]}: {first[1]}" if first else ""
    )


def failure_reason(run_dir: Path) -> str:
    """The last exception a failed run's ``flower.log`` records (``""`` if none)."""
    log = run_dir / "flower.log"
    if not log.is_file():
        return ""
    reason = ""
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        match = _ERROR.match(line.strip())
        if match:
            reason = f"{match.group(1)}: {match.group(2)}"
    return reason
