"""How well the sketch recovers FetchSGD's update, over rounds, next to test accuracy.

Reads a run folder's ``metrics.jsonl`` written with ``diagnose-sketch = true``
(see :mod:`fedsketch.algorithms.fidelity`): the recall of the true top-k
support by FetchSGD's unsketched top-k, the relative L2 error of its update
against the true top-k, and test accuracy, one panel each, against rounds.
The figure comes back with the numbers it draws, so a test can check the
series rather than the pixels.

    python -m experiments.analysis.plots_fidelity runs/<experiment>/fetchsgd [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from fedsketch.server import runlog

FIGURE = "sketch_fidelity_vs_rounds.png"
PANELS = (
    ("sketch_recall", "recall of the true top-k support"),
    ("sketch_rel_error", "||Delta - true top-k|| / ||true top-k||"),
    ("test_accuracy", "test accuracy"),
)


@dataclass(frozen=True)
class FidelityPlot:
    """The figure file and its series: ``rounds`` and one array per column of :data:`PANELS`."""

    path: Path
    rounds: np.ndarray
    series: dict[str, np.ndarray]


def fidelity_series(run_dir: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Rounds and the :data:`PANELS` columns of the run's metrics rows (NaN where a row has no value).

    Raises
    ------
    ValueError
        If the run has no metrics rows, or none with the diagnostic (it did not run with ``diagnose-sketch``).
    """
    rows = runlog.read_metrics(run_dir)
    if not rows:
        raise ValueError(f"{run_dir} has no metrics.jsonl rows")
    if not any("sketch_recall" in row for row in rows):
        raise ValueError(f"{run_dir}: metrics rows have no 'sketch_recall'; run with --set diagnose-sketch=true")
    rounds = np.array([row["round"] for row in rows], dtype=np.int64)
    series = {name: np.array([_number(row.get(name)) for row in rows], dtype=np.float64) for name, _ in PANELS}
    return rounds, series


def plot_fidelity(run_dir: Path, out_dir: Path | None = None) -> FidelityPlot:
    """Draw recall, relative error and test accuracy against rounds into ``FIGURE``; returns the data drawn."""
    rounds, series = fidelity_series(run_dir)
    out_dir = out_dir or run_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    fig = draw(f"{run_dir.parent.name}/{run_dir.name}", rounds, series)
    path = out_dir / FIGURE
    fig.savefig(path, dpi=120, metadata={"Title": fig.get_suptitle()})  # what an image viewer names it
    plt.close(fig)
    return FidelityPlot(path, rounds, series)


def draw(name: str, rounds: np.ndarray, series: dict[str, np.ndarray]) -> Figure:
    """The figure of run ``name``: one panel a column of :data:`PANELS`, against rounds (the caller closes it)."""
    fig, axes = plt.subplots(1, len(PANELS), figsize=(13.5, 3.8))
    for ax, (column, label) in zip(axes, PANELS, strict=True):
        ax.plot(rounds, series[column], marker=".")
        ax.set_xlabel("round")
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylim(0.0, 1.02)
    axes[1].set_ylim(bottom=0.0)
    fig.suptitle(f"{name}: sketch fidelity (means since the previous row)")
    fig.tight_layout()
    return fig


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.analysis.plots_fidelity RUN_DIR [--out DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m experiments.analysis.plots_fidelity", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "run_dir", type=Path, help="a run folder written with diagnose-sketch, e.g. runs/fidelity/fetchsgd"
    )
    parser.add_argument("--out", type=Path, help="where to write the figure (default: the run folder)")
    args = parser.parse_args(argv)
    try:
        plot = plot_fidelity(args.run_dir, args.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    last = {name: values[-1] for name, values in plot.series.items()}
    print(
        f"wrote {plot.path} ({len(plot.rounds)} rows; last row: "
        + ", ".join(f"{name} {value:.4f}" for name, value in last.items())
        + ")"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
