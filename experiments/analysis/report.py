"""An experiment's results as a table: accuracy against the bytes it cost, per run group.

``fedsketch report runs/<experiment>`` writes ``report.md`` and ``report.csv``
in that folder: one row per strategy and sweep point, reduced over seeds (mean,
and min-max where there are several), with what the FetchSGD paper (Rothchild
et al., ICML 2020, Sec. 6) reports: final accuracy, total upload and download
bytes, upload compression against dense float32 uploads, total compression
against uncompressed training (``fedavg``) run in the same experiment, and the
bytes spent until a target accuracy was first reached. A group reaches a
target only when every one of its seeds does, so a lucky seed cannot make a
method look cheaper. The Markdown uses readable units; the CSV has exact numbers.
A run stopped before its last round (``docs/stopping.md``) is reported at the
last round it reached, and both files say so.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from experiments.analysis.equal_bytes import compare
from experiments.analysis.results import (
    DEFAULT_TARGET_FRACTION,
    Reach,
    Spread,
    Summary,
    collect_groups,
    format_bytes,
    format_spread,
    pareto_front,
    reach,
    summarize,
)

REFERENCE = "fedavg"
"""The uncompressed method that total compression is measured against."""


@dataclass(frozen=True)
class ReportRow:
    """One run group's line of the report."""

    summary: Summary
    total_compression: float | None
    """The reference's mean upload + download bytes over this group's; ``None`` without a reference."""
    reaches: tuple[Reach, ...]
    on_front: bool


@dataclass(frozen=True)
class Report:
    """Everything ``report.md`` and ``report.csv`` say."""

    experiment: str
    targets: tuple[float, ...]
    target_note: str
    reference: str | None
    rows: tuple[ReportRow, ...]
    front: tuple[str, ...]
    """Labels of the Pareto front (final accuracy vs total upload bytes), by increasing bytes."""
    verdict: str
    """Who leads at equal total bytes, in one sentence (:meth:`.equal_bytes.Comparison.sentence`)."""


def build_report(experiment_dir: Path, targets: Sequence[float] = ()) -> Report:
    """Summarize every run group under ``experiment_dir``.

    Raises
    ------
    ValueError
        If a target is not in (0, 1].
    FileNotFoundError
        If the folder holds no metrics.
    """
    bad = [t for t in targets if not 0.0 < t <= 1.0]
    if bad:
        raise ValueError(f"target accuracies must be in (0, 1], got {bad}")
    groups = collect_groups(experiment_dir)
    summaries = [summarize(g) for g in groups]
    best = max(summaries, key=lambda s: s.accuracy.mean)
    if targets:
        note = "given on the command line"
    else:
        targets = (round(DEFAULT_TARGET_FRACTION * best.accuracy.mean, 4),)
        note = (
            f"{DEFAULT_TARGET_FRACTION:.0%} of the best final accuracy ({best.group.label}, {best.accuracy.mean:.4f})"
        )
    refs = [s for s in summaries if s.group.strategy == REFERENCE]
    ref_total = refs[0].total.mean if refs else None
    front = pareto_front([(s.upload.mean, s.accuracy.mean) for s in summaries])
    rows = tuple(
        ReportRow(
            summary=s,
            total_compression=ref_total / s.total.mean if ref_total is not None else None,
            reaches=tuple(reach(s, t) for t in targets),
            on_front=i in front,
        )
        for i, s in enumerate(summaries)
    )
    labels = tuple(summaries[i].group.label for i in front)
    reference = refs[0].group.label if refs else None
    verdict = compare(groups).sentence()
    return Report(experiment_dir.name, tuple(targets), note, reference, rows, labels, verdict)


def write_report(experiment_dir: Path, targets: Sequence[float] = ()) -> tuple[Report, str]:
    """Write ``report.md`` and ``report.csv`` into ``experiment_dir``; returns the report and its Markdown."""
    report = build_report(experiment_dir, targets)
    markdown = to_markdown(report)
    (experiment_dir / "report.md").write_text(markdown, encoding="utf-8")
    (experiment_dir / "report.csv").write_text(to_csv(report), encoding="utf-8")
    return report, markdown


def to_markdown(report: Report) -> str:
    """The report as Markdown: how to read it, the table, the Pareto front."""
    header = [
        "run",
        "seeds",
        "rounds",
        "final accuracy",
        "upload",
        "download",
        "upload compression",
        f"total compression vs {report.reference or REFERENCE}",
    ]
    for t in report.targets:
        header += [f"upload to {t:g}", f"up+down to {t:g}"]
    lines = [f"# {report.experiment}", "", *_intro(report), "", "| " + " | ".join(header) + " |"]
    lines.append("|" + "---|" * len(header))
    lines += ["| " + " | ".join(_markdown_cells(row)) + " |" for row in report.rows]
    stopped = [f"- {row.summary.group.label}: {note}" for row in report.rows for note in row.summary.group.stopped]
    if stopped:
        lines += ["", "## Stopped before their last round", ""]
        lines += ["Their rows above are from the last round they reached.", "", *stopped]
    lines += ["", "## At equal total bytes", "", report.verdict]
    lines += ["", "## Pareto front: final accuracy vs total upload bytes", ""]
    lines += ["No other run group has at least its accuracy for at most its upload bytes (and is better in one).", ""]
    on_front = {row.summary.group.label: row.summary for row in report.rows if row.on_front}
    for i, label in enumerate(report.front, 1):
        upload, accuracy = on_front[label].upload.mean, on_front[label].accuracy.mean
        lines.append(f"{i}. {label}: {format_bytes(upload)} uploaded, final accuracy {accuracy:.4f}")
    return "\n".join(lines) + "\n"


def _intro(report: Report) -> list[str]:
    """How to read the table, and where its target came from."""
    ref = report.reference or REFERENCE
    total = f"{ref}'s upload + download bytes over the run's" if report.reference else f"no {ref} run to compare with"
    targets = ", ".join(f"{t:g}" for t in report.targets)
    return [
        "One row per strategy and sweep point; with several seeds, mean (min-max). Bytes are totals over the run;",
        "`*` marks the Pareto front of final accuracy against upload bytes.",
        f"Upload compression: dense float32 upload bytes over the bytes uploaded. Total compression: {total}.",
        f"Target accuracy {targets}: {report.target_note}. Bytes to a target are those spent until the first",
        "evaluated round that reached it; a run group reaches it only if every seed does.",
    ]


def to_csv(report: Report) -> str:
    """The report as CSV, exact numbers, one row per run group."""
    spreads = ["final_accuracy", "upload_bytes", "download_bytes", "upload_compression"]
    header = ["run", "strategy", "sweep_point", "seeds", "rounds"]
    header += [f"{name}_{stat}" for name in spreads for stat in ("mean", "min", "max")]
    header += [f"total_compression_vs_{report.reference or REFERENCE}", "pareto_front", "stopped"]
    for t in report.targets:
        header += [f"{kind}_bytes_to_{t:g}_{stat}" for kind in ("upload", "total") for stat in ("mean", "min", "max")]
        header.append(f"seeds_reaching_{t:g}")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for row in report.rows:
        s = row.summary
        cells: list[object] = [s.group.label, s.group.strategy, s.group.point, len(s.group.seeds), int(s.rounds.low)]
        for spread in (s.accuracy, s.upload, s.download, s.upload_compression):
            cells += _csv_spread(spread)
        cells += ["" if row.total_compression is None else row.total_compression, row.on_front]
        cells.append("; ".join(s.group.stopped))
        for r in row.reaches:
            cells += [*_csv_spread(r.upload), *_csv_spread(r.total), r.seeds_reached]
        writer.writerow(cells)
    return out.getvalue()


def _csv_spread(spread: Spread | None) -> list[object]:
    return ["", "", ""] if spread is None else [spread.mean, spread.low, spread.high]


def _markdown_cells(row: ReportRow) -> list[str]:
    s = row.summary
    cells = [
        s.group.label + (" (stopped early)" if s.group.stopped else "") + (" *" if row.on_front else ""),
        str(len(s.group.seeds)),
        format_spread(s.rounds, "{:.0f}".format),
        format_spread(s.accuracy, "{:.4f}".format),
        format_spread(s.upload, format_bytes),
        format_spread(s.download, format_bytes),
        format_spread(s.upload_compression, "{:.1f}x".format),
        "" if row.total_compression is None else f"{row.total_compression:.1f}x",
    ]
    for r in row.reaches:
        missed = f"not reached ({r.seeds_reached}/{len(s.group.seeds)} seeds)"
        cells += [format_spread(r.upload, format_bytes) if r.upload else missed]
        cells += [format_spread(r.total, format_bytes) if r.total else missed]
    return cells
