"""Plots of convergence against communication, one line per run group (strategy and sweep point).

Accuracy against rounds, against cumulative upload bytes, and against
cumulative total (upload + download) bytes, bytes on a log axis. With several
seeds the line is the mean and the band the min-max spread. A fourth figure
puts each run group's final accuracy against its total upload bytes and draws
the Pareto front through the groups that no other beats on both. Figure files
are named after what they show.

Every figure comes back as a :class:`Plot` holding the numbers it draws, so a
test can check the series rather than the pixels. Byte axes are labelled in
decimal units (``200 MB``, ``1 GB``) with at least three ticks however narrow
their range (:class:`BytesLocator`). A run group with a seed stopped before its
last round (``docs/stopping.md``) says so in the legend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.axis import Axis
from matplotlib.font_manager import FontProperties
from matplotlib.ticker import Formatter, Locator, MaxNLocator, NullFormatter

from experiments.analysis.results import Row, RunGroup, collect_groups, format_bytes, pareto_front, summarize

AXES: dict[str, tuple[Callable[[Row], float], str, bool]] = {
    "rounds": (lambda r: r["round"], "round", False),
    "upload_bytes": (lambda r: r["cum_upload_bytes"], "cumulative upload bytes", True),
    "total_bytes": (
        lambda r: r["cum_upload_bytes"] + r["cum_download_bytes"],
        "cumulative upload + download bytes",
        True,
    ),
}
PARETO = "accuracy_vs_upload_bytes_pareto"


@dataclass(frozen=True)
class Curve:
    """Test accuracy (mean and min-max over seeds) at each ``x``."""

    x: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray


@dataclass(frozen=True)
class Plot:
    """One figure file and the data drawn in it, keyed by run group label."""

    path: Path
    curves: dict[str, Curve]
    front: tuple[str, ...] = field(default=())
    """The Pareto figure's front, by increasing bytes; empty for the other figures."""
    xticks: tuple[str, ...] = field(default=())
    """The x axis's labelled ticks, left to right, as drawn."""


def curve(group: RunGroup, axis: str) -> Curve:
    """``x`` (mean over seeds) and accuracy over the evaluated rounds all seeds share."""
    get_x = AXES[axis][0]
    n = min(len(rows) for rows in group.seeds)
    xs = np.array([[get_x(r) for r in rows[:n]] for rows in group.seeds], dtype=np.float64)
    ys = np.array([[r["test_accuracy"] for r in rows[:n]] for rows in group.seeds], dtype=np.float64)
    return Curve(xs.mean(axis=0), ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0))


def final_points(groups: list[RunGroup]) -> tuple[dict[str, Curve], tuple[str, ...]]:
    """Each group's final accuracy against its mean total upload bytes (one-point curves), and the Pareto front."""
    summaries = [summarize(g) for g in groups]
    points = {
        s.group.label: Curve(
            np.array([s.upload.mean]),
            np.array([s.accuracy.mean]),
            np.array([s.accuracy.low]),
            np.array([s.accuracy.high]),
        )
        for s in summaries
    }
    front = pareto_front([(s.upload.mean, s.accuracy.mean) for s in summaries])
    return points, tuple(summaries[i].group.label for i in front)


def plot_experiment(experiment_dir: Path, out_dir: Path | None = None) -> list[Plot]:
    """Write the three convergence figures and the Pareto figure; returns them with their data."""
    groups = collect_groups(experiment_dir)
    out_dir = out_dir or experiment_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = []
    for axis, (_, label, log_x) in AXES.items():
        curves = {g.label: curve(g, axis) for g in groups}
        seeds = {g.label: len(g.seeds) for g in groups}
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        stopped = {g.label: ", stopped early" if g.stopped else "" for g in groups}
        for name, c in curves.items():
            n = seeds[name]
            ax.plot(c.x, c.mean, marker=".", label=f"{name} ({n} seed{'s' if n > 1 else ''}{stopped[name]})")
            if seeds[name] > 1:
                ax.fill_between(c.x, c.low, c.high, alpha=0.2)
        _finish(ax, f"{experiment_dir.name}: test accuracy vs {label}", label, "test accuracy", log_x)
        plots.append(Plot(_save(fig, out_dir / f"accuracy_vs_{axis}.png"), curves, xticks=_xticks(ax)))
    plots.append(_plot_pareto(groups, experiment_dir.name, out_dir))
    return plots


def _plot_pareto(groups: list[RunGroup], title: str, out_dir: Path) -> Plot:
    points, front = final_points(groups)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    stopped = {g.label for g in groups if g.stopped}
    for name, p in points.items():
        err = np.array([p.mean - p.low, p.high - p.mean])
        ax.errorbar(p.x, p.mean, yerr=err, fmt="o", capsize=3, label=name + (" (stopped early)" * (name in stopped)))
    ax.plot(
        [float(points[n].x[0]) for n in front],
        [float(points[n].mean[0]) for n in front],
        color="black",
        linestyle="--",
        linewidth=1,
        label="Pareto front",
    )
    _finish(ax, f"{title}: final accuracy vs total upload bytes", "total upload bytes", "final test accuracy", True)
    return Plot(_save(fig, out_dir / f"{PARETO}.png"), points, front, _xticks(ax))


def _finish(ax: Axes, title: str, xlabel: str, ylabel: str, log_x: bool) -> None:
    if log_x:
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(BytesLocator())
        ax.xaxis.set_major_formatter(BytesFormatter())
        ax.xaxis.set_minor_formatter(NullFormatter())  # labelled minor ticks overlap when the range is narrow
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title if len(title) <= 55 else title.replace(": ", ":\n", 1))  # a long one is cut off by the edge
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def _xticks(ax: Axes) -> tuple[str, ...]:
    """The labelled major ticks inside the x axis's view (the figure was drawn by ``savefig``); closes the figure."""
    low, high = sorted(ax.get_xlim())
    ticks = tuple(t.label1.get_text() for t in ax.xaxis.get_major_ticks() if low <= t.get_loc() <= high)
    plt.close(ax.get_figure(root=True))
    return tuple(t for t in ticks if t)


class BytesLocator(Locator):
    """Major ticks on a log axis of bytes: at least three candidates in view, at most a dozen, thinned
    on screen so that no two labels touch.

    Decades where the axis spans several (every other one beyond a dozen);
    else 1-2-5 steps (100 MB, 200 MB, 500 MB, 1 GB); else every digit (200,
    300, 400 MB); else, for a range within one digit step, evenly spaced ticks.
    """

    def __call__(self) -> list[float]:
        if self.axis is None:
            return []
        low, high = self.axis.get_view_interval()
        return self.spaced(self.tick_values(low, high))

    def spaced(self, ticks: list[float]) -> list[float]:
        """``ticks`` thinned from the left so that neighbours' labels do not touch on a horizontal axis.

        On a log axis the digit steps crowd toward a decade's top (7, 8, 9, 10 MB); a label
        (``70 MB``) is taken as six characters of the tick font wide.
        """
        axis = self.axis
        if not isinstance(axis, Axis) or axis.axes is None or axis is not axis.axes.xaxis or len(ticks) < 2:
            return ticks
        axes = axis.axes
        size = FontProperties(size=matplotlib.rcParams["xtick.labelsize"]).get_size_in_points()
        need = 3.6 * size * axes.figure.dpi / 72
        place = [axes.transData.transform((t, 1.0))[0] for t in ticks]
        kept = [0]
        for i in range(1, len(ticks)):
            if place[i] - place[kept[-1]] >= need:
                kept.append(i)
        return [ticks[i] for i in kept]

    def tick_values(self, vmin: float, vmax: float) -> list[float]:
        low, high = sorted((max(vmin, 1e-300), max(vmax, 1e-300)))
        decades = range(int(np.floor(np.log10(low))), int(np.ceil(np.log10(high))) + 1)
        for subs in ((1,), (1, 2, 5), tuple(range(1, 10))):
            ticks = [float(s * 10.0**e) for e in decades for s in subs if low <= s * 10.0**e <= high]
            if len(ticks) >= 3:
                return ticks[:: -(-len(ticks) // 12)]
        return [float(t) for t in MaxNLocator(nbins=4).tick_values(low, high) if low <= t <= high]


class BytesFormatter(Formatter):
    """``200 MB``, ``1 GB``: three significant digits, more where neighbouring ticks would read the same."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return format_bytes(x)

    def format_ticks(self, values: list[float]) -> list[str]:
        for digits in (3, 4, 5, 6):
            labels = [format_bytes(v, digits) for v in values]
            if len(set(labels)) == len(labels):
                break
        return labels
