"""Plots of convergence against communication, one line per strategy.

Accuracy against rounds, against cumulative upload bytes, and against
cumulative total (upload + download) bytes, bytes on a log axis. With several
seeds the line is the mean and the band the min-max spread. Figure files are
named after what they show.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from fedsketch import runlog

Row = dict[str, Any]

AXES: dict[str, tuple[Callable[[Row], float], str, bool]] = {
    "rounds": (lambda r: r["round"], "round", False),
    "upload_bytes": (lambda r: r["cum_upload_bytes"], "cumulative upload bytes", True),
    "total_bytes": (
        lambda r: r["cum_upload_bytes"] + r["cum_download_bytes"],
        "cumulative upload + download bytes",
        True,
    ),
}


def collect_runs(experiment_dir: Path) -> dict[str, list[list[dict[str, Any]]]]:
    """``{strategy: [rows of seed 0, rows of seed 1, ...]}`` for every run found."""
    if not experiment_dir.is_dir():
        raise FileNotFoundError(f"no experiment folder at {experiment_dir}")
    out: dict[str, list[list[dict[str, Any]]]] = defaultdict(list)
    for metrics in sorted(experiment_dir.rglob("metrics.jsonl")):
        rows = runlog.read_metrics(metrics.parent)
        if rows:
            out[rows[0]["strategy"]].append(rows)
    if not out:
        raise FileNotFoundError(f"no metrics.jsonl under {experiment_dir}")
    return dict(out)


def series(runs: list[list[dict[str, Any]]], axis: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x, mean, low, high)`` of test accuracy over the rounds all seeds share."""
    get_x = AXES[axis][0]
    n = min(len(rows) for rows in runs)
    xs = np.array([[get_x(r) for r in rows[:n]] for rows in runs], dtype=np.float64)
    ys = np.array([[r["test_accuracy"] for r in rows[:n]] for rows in runs], dtype=np.float64)
    return xs.mean(axis=0), ys.mean(axis=0), ys.min(axis=0), ys.max(axis=0)


def plot_experiment(experiment_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Write one PNG per x-axis; returns their paths."""
    runs = collect_runs(experiment_dir)
    out_dir = out_dir or experiment_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for axis, (_, label, log_x) in AXES.items():
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for strategy, seeds in sorted(runs.items()):
            x, mean, low, high = series(seeds, axis)
            ax.plot(x, mean, marker=".", label=f"{strategy} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})")
            if len(seeds) > 1:
                ax.fill_between(x, low, high, alpha=0.2)
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.set_ylabel("test accuracy")
        ax.set_title(f"{experiment_dir.name}: test accuracy vs {label}")
        ax.grid(True, alpha=0.3)
        ax.legend()
        path = out_dir / f"accuracy_vs_{axis}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)
    return written
