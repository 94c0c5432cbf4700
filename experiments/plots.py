"""Plots of convergence against communication, one line per run group (strategy and sweep point).

Accuracy against rounds, against cumulative upload bytes, and against
cumulative total (upload + download) bytes, bytes on a log axis. With several
seeds the line is the mean and the band the min-max spread. A fourth figure
puts each run group's final accuracy against its total upload bytes and draws
the Pareto front through the groups that no other beats on both. Figure files
are named after what they show.

Every figure comes back as a :class:`Plot` holding the numbers it draws, so a
test can check the series rather than the pixels.
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
from matplotlib.ticker import NullFormatter

from experiments.results import Row, RunGroup, collect_groups, pareto_front, summarize

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
        for name, c in curves.items():
            ax.plot(c.x, c.mean, marker=".", label=f"{name} ({seeds[name]} seed{'s' if seeds[name] > 1 else ''})")
            if seeds[name] > 1:
                ax.fill_between(c.x, c.low, c.high, alpha=0.2)
        _finish(ax, f"{experiment_dir.name}: test accuracy vs {label}", label, "test accuracy", log_x)
        plots.append(Plot(_save(fig, out_dir / f"accuracy_vs_{axis}.png"), curves))
    plots.append(_plot_pareto(groups, experiment_dir.name, out_dir))
    return plots


def _plot_pareto(groups: list[RunGroup], title: str, out_dir: Path) -> Plot:
    points, front = final_points(groups)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, p in points.items():
        err = np.array([p.mean - p.low, p.high - p.mean])
        ax.errorbar(p.x, p.mean, yerr=err, fmt="o", capsize=3, label=name)
    ax.plot(
        [float(points[n].x[0]) for n in front],
        [float(points[n].mean[0]) for n in front],
        color="black", linestyle="--", linewidth=1, label="Pareto front",
    )  # fmt: skip
    _finish(ax, f"{title}: final accuracy vs total upload bytes", "total upload bytes", "final test accuracy", True)
    return Plot(_save(fig, out_dir / f"{PARETO}.png"), points, front)


def _finish(ax: Axes, title: str, xlabel: str, ylabel: str, log_x: bool) -> None:
    if log_x:
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # labelled minor ticks overlap when the range is narrow
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
