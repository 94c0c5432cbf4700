"""Participation on the regime map: which method wins at equal total bytes as clients take part more rarely.

FetchSGD's case against local top-k (Rothchild et al., ICML 2020, Sec. 4-5) is
about participation: a client that takes part rarely holds a stale error
memory or none, while FetchSGD keeps momentum and error on the server. The
``participation-<model>-p<times>`` experiments (``experiments/configs/
participation_*.toml``) hold the number of client updates fixed and vary how
often a client takes part (``times``, about ``num-rounds x clients-per-round /
num-clients``). This module reads them and compares every method of a cell
(model, times) at equal total bytes (:mod:`experiments.analysis.equal_bytes`: accuracy
at the cell's budget, bytes to its target).

``python -m experiments.studies.participation RUNS [--out DIR]`` prints the table and
draws ``participation.png`` (one panel per cell: accuracy against total bytes,
mean and min-max band over seeds). docs/regime.md holds the measured map.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import NullFormatter

from experiments.analysis.equal_bytes import Comparison, compare
from experiments.analysis.plots import BytesFormatter, BytesLocator, curve
from experiments.analysis.results import RunGroup, Spread, collect_groups, format_bytes, format_spread
from experiments.studies import map_cli

CELL = re.compile(r"participation-(?P<model>[a-z0-9_]+)-p(?P<times>\d+)(?:-(?P<variant>[a-z0-9]+))?")
VARIANTS = {"init": "downloads from the initial model", "matched": "local top-k at FetchSGD's upload"}
"""What a cell's name suffix means (``participation-text-p1-init``: ``download-from-init`` on)."""
JOINED = {"matched"}
"""Variants whose runs are compared with their base cell's (``participation-text-p1-matched``: local top-k at
a larger k, beside every method of ``participation-text-p1``); their groups are labelled with the variant."""
NAMES = {
    "fetchsgd": "FetchSGD",
    "local_topk errorclient": "local top-k, client error",
    "local_topk errornone": "local top-k, stateless",
    "true_topk": "true top-k",
    "fedavg": "FedAvg",
    "local_topk errorclient matched": "local top-k, client error, FetchSGD's upload",
    "local_topk errornone matched": "local top-k, stateless, FetchSGD's upload",
}
"""Display names of the run groups the participation configs write; others keep their label."""


@dataclass(frozen=True)
class Cell:
    """One model at one participation: every method at the same budget and target."""

    model: str
    times: int
    comparison: Comparison
    groups: tuple[RunGroup, ...]
    variant: str = ""

    @property
    def row(self) -> str:
        """The model, and the variant when there is one: ``text, downloads from the initial model``."""
        return f"{self.model}, {VARIANTS.get(self.variant, self.variant)}" if self.variant else self.model


def collect(root: Path) -> list[Cell]:
    """Every ``participation-<model>-p<times>`` experiment under ``root``, by model, then participation.

    Raises
    ------
    FileNotFoundError
        If ``root`` holds no such experiment with metrics.
    """
    found: dict[tuple[str, int, str], tuple[RunGroup, ...]] = {}
    for folder in sorted(root.iterdir()) if root.is_dir() else []:
        match = CELL.fullmatch(folder.name)
        if match and folder.is_dir():
            try:
                groups = tuple(collect_groups(folder))
            except FileNotFoundError:
                print(f"note: {folder.name} has no metrics yet; left out", file=sys.stderr)
                continue
            found[match["model"], int(match["times"]), match["variant"] or ""] = _finished(groups)
    cells = []
    for (model, times, variant), groups in found.items():
        if variant in JOINED:
            base = found.get((model, times, ""), ())
            groups = base + tuple(replace(g, point=f"{g.point} {variant}".strip()) for g in groups)
        cells.append(Cell(model, times, compare(groups, NAMES), groups, variant))
    if not cells:
        raise FileNotFoundError(f"no participation-<model>-p<times> experiment under {root}")
    return sorted(cells, key=lambda c: (c.model, c.variant, c.times))


def _finished(groups: tuple[RunGroup, ...]) -> tuple[RunGroup, ...]:
    """Each group's seeds that reached its last round: a seed still running beside finished ones is left out."""
    out = []
    for g in groups:
        last = max(rows[-1]["round"] for rows in g.seeds)
        out.append(replace(g, seeds=tuple(rows for rows in g.seeds if rows[-1]["round"] == last)))
    return tuple(out)


def _accuracy(s: Spread) -> str:
    return format_spread(s, "{:.4f}".format)


def table(cells: Sequence[Cell]) -> str:
    """One markdown row per method and cell, then one verdict line per cell."""
    lines = [
        "| model | takes part | method | seeds | final accuracy | up + down | accuracy at the budget | up + down to target |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        for e in c.comparison.entries:
            reach = format_bytes(e.to_target.mean) if e.to_target else "not reached"
            lines.append(
                f"| {c.row} | ~{c.times}x | {e.name} | {e.seeds} | {_accuracy(e.final)} | {format_bytes(e.total.mean)} "
                f"| {_accuracy(e.at_budget)} | {reach} |"
            )
    lines += [
        "",
        "| model | takes part | budget | target | best at the budget | fewest bytes to target |",
        "|---|---:|---:|---:|---|---|",
    ]
    for c in cells:
        cmp = c.comparison
        best, fastest = cmp.best_at_budget(), cmp.fewest_to_target()
        margin = cmp.margin()
        lines.append(
            f"| {c.row} | ~{c.times}x | {format_bytes(cmp.budget)} | {cmp.target:.4f} | {best.name}{margin} "
            f"| {fastest.name if fastest else 'none'} |"
        )
    return "\n".join(lines)


def draw(cells: Sequence[Cell], out_dir: Path) -> Path:
    """One panel per cell (models as rows, participation as columns): accuracy against total bytes."""
    models = sorted({c.row for c in cells})
    times = sorted({c.times for c in cells})
    fig, axes = plt.subplots(len(models), len(times), figsize=(4.2 * len(times), 3.4 * len(models)), squeeze=False)
    colours = {name: f"C{i}" for i, name in enumerate(NAMES.values())}
    for c in cells:
        ax = axes[models.index(c.row)][times.index(c.times)]
        for g, e in zip(c.groups, c.comparison.entries, strict=True):
            line = curve(g, "total_bytes")
            colour = colours.setdefault(e.name, f"C{len(colours)}")
            ax.plot(line.x, line.mean, color=colour, label=e.name, linewidth=1.4)
            ax.fill_between(line.x, line.low, line.high, color=colour, alpha=0.2)
        ax.axvline(c.comparison.budget, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(BytesLocator())
        ax.xaxis.set_major_formatter(BytesFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{c.row}, each client ~{c.times}x", fontsize="small")
        ax.grid(True, alpha=0.3)
    used = {(models.index(c.row), times.index(c.times)) for c in cells}
    for i, row in enumerate(axes):
        for j, ax in enumerate(row):
            ax.set_visible((i, j) in used)  # a row with fewer cells (a variant) leaves its other panels empty
    for ax in axes[-1]:
        ax.set_xlabel("upload + download bytes")
    for row in axes:
        row[0].set_ylabel("test accuracy")
    legend: dict[str, Any] = {}  # every method of every panel, once (a joined variant adds its own)
    for ax in axes.flat:
        legend.update(dict(zip(*reversed(ax.get_legend_handles_labels()), strict=True)))
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(4, len(legend)), fontsize="small")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "participation.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.studies.participation RUNS_DIR [--out DIR]``."""
    return map_cli.run(argv, "participation", __doc__.split("\n")[0], collect, table, draw, "cells")


if __name__ == "__main__":
    sys.exit(main())
