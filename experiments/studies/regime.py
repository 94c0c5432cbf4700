"""The regime map: where FetchSGD's sketch finds the true top-k, and what missing it costs in accuracy.

FetchSGD (Rothchild et al., ICML 2020) applies the top-k of an unsketched
Count Sketch; it stands for true top-k with error accumulation only where the
sketch recovers that top-k. This script reads the ``regime-*`` experiments
(``experiments/configs/regime_*.toml``, run with ``diagnose-sketch``) and draws
one figure, ``regime.png``:

(a) the sketch's recall of the true top-k support (``sketch_recall``, averaged
    over the run) against columns per recovered coordinate, ``cols / k``, one
    colour per model, solid for k = 1% of d, dashed for 0.1%;
(b) the final accuracy of FetchSGD minus that of true top-k at the same k, in
    points, on the same axes;
(c) recall against rows at a fixed k;
(d) recall over the rounds of one run per model, where the average comes from.

It also prints the numbers as a Markdown table. The points come back with the
figure, so a test can check them rather than the pixels.

    python -m experiments.studies.regime runs [--out docs]
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from experiments.studies import map_cli
from fedsketch.server import runlog

FIGURE = "regime.png"
PREFIX = "regime-"


@dataclass(frozen=True)
class Run:
    """One finished run of a regime experiment: its settings and what it measured."""

    experiment: str
    strategy: str
    settings: dict[str, Any]
    d: int
    """The model's size, from its dense upload bytes (within 0.1%: each upload carries a few hundred header bytes)."""
    rounds: np.ndarray
    recall: np.ndarray
    """``sketch_recall`` of each metrics row (NaN without the diagnostic)."""
    weights: np.ndarray
    """``sketch_rounds`` of each row: how many rounds each recall averages."""
    accuracy: float
    upload_compression: float

    @property
    def k(self) -> int:
        return int(self.settings["k"])

    @property
    def model(self) -> str:
        """``mlp 0.30M (synthetic)``: the model family, its size, and the data."""
        return f"{self.settings['model']} {self.d / 1e6:.2f}M ({self.settings['dataset']})"

    @property
    def mean_recall(self) -> float:
        """Recall averaged over every measured round of the run."""
        ok = np.isfinite(self.recall) & (self.weights > 0)
        return float(np.average(self.recall[ok], weights=self.weights[ok])) if ok.any() else float("nan")


@dataclass(frozen=True)
class Point:
    """A FetchSGD run next to true top-k at the same k (same experiment)."""

    run: Run
    topk_accuracy: float | None

    @property
    def cols_per_k(self) -> float:
        return int(self.run.settings["sketch-cols"]) / self.run.k

    @property
    def k_fraction(self) -> float:
        return self.run.k / self.run.d

    @property
    def gap(self) -> float | None:
        """FetchSGD's final accuracy minus true top-k's, in points; None without a true top-k run."""
        return None if self.topk_accuracy is None else 100 * (self.run.accuracy - self.topk_accuracy)


def read_run(folder: Path, experiment: str) -> Run | None:
    """A run folder's config and metrics; None if it has no metrics yet."""
    rows = runlog.read_metrics(folder)
    if not rows or not (folder / "config.json").is_file():
        return None
    settings = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    clients = sum(int(r["clients"]) for r in rows)
    dense = sum(int(r["dense_upload_bytes"]) for r in rows)
    last = rows[-1]
    return Run(
        experiment=experiment,
        strategy=str(settings["strategy"]),
        settings=settings,
        d=round(dense / max(clients, 1) / 4),
        rounds=np.array([r["round"] for r in rows]),
        recall=np.array([_number(r.get("sketch_recall")) for r in rows]),
        weights=np.array([_number(r.get("sketch_rounds")) for r in rows]),
        accuracy=float(last["test_accuracy"]),
        upload_compression=last["cum_dense_upload_bytes"] / last["cum_upload_bytes"],
    )


def collect(root: Path) -> list[Point]:
    """Every FetchSGD run under ``root/regime-*``, each with true top-k's accuracy at its k when there is one.

    Raises
    ------
    FileNotFoundError
        If no regime experiment with finished FetchSGD runs is under ``root``.
    """
    runs = [
        run
        for exp in sorted(root.glob(PREFIX + "*"))
        for metrics in sorted(exp.rglob("metrics.jsonl"))
        if (run := read_run(metrics.parent, exp.name)) is not None
    ]
    topk = {(r.experiment, r.k): r.accuracy for r in runs if r.strategy == "true_topk"}
    points = [Point(r, topk.get((r.experiment, r.k))) for r in runs if r.strategy == "fetchsgd"]
    if not points:
        raise FileNotFoundError(f"no finished FetchSGD runs under {root}/{PREFIX}*")
    return points


def draw(points: list[Point], out_dir: Path) -> Path:
    """The four panels into ``out_dir/regime.png``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.8))
    models = sorted({p.run.model for p in points})
    colours = {m: f"C{i}" for i, m in enumerate(models)}
    three = [p for p in points if int(p.run.settings["sketch-rows"]) == 3]
    for model in models:
        for frac, style in ((0.01, "-"), (0.001, "--")):
            line = sorted(
                (p for p in three if p.run.model == model and _near(p.k_fraction, frac)), key=lambda p: p.cols_per_k
            )
            if not line:
                continue
            xs = [p.cols_per_k for p in line]
            label = f"{model}, k = {frac:.1%} of d"
            axes[0].plot(xs, [p.run.mean_recall for p in line], style, marker="o", color=colours[model], label=label)
            for p in line:
                axes[0].annotate(
                    f"{p.run.upload_compression:.0f}x",
                    (p.cols_per_k, p.run.mean_recall),
                    fontsize=7,
                    textcoords="offset points",
                    xytext=(4, 3),
                )
            gaps = [(p.cols_per_k, p.gap) for p in line if p.gap is not None]
            if gaps:
                axes[1].plot(*zip(*gaps, strict=True), style, marker="o", color=colours[model], label=label)
    _rows_panel(axes[2], points, colours)
    _rounds_panel(axes[3], points, colours)
    axes[0].axhline(0.5, color="grey", lw=0.8, ls=":")
    axes[1].axhline(0.0, color="grey", lw=0.8, ls=":")
    for ax, title in zip(
        axes[:2],
        (
            "(a) recall of the true top-k, mean over the run (labels: upload compression)",
            "(b) final accuracy: FetchSGD - true top-k (points)",
        ),
        strict=True,
    ):
        ax.set_xscale("log")
        ax.set_xlabel("sketch columns per k (3 rows)")
        ax.set_title(title, fontsize=9)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylim(0, 1.02)
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Where FetchSGD's sketch finds the true top-k (zero-buckets, diagnose-sketch)")
    fig.tight_layout()
    path = out_dir / FIGURE
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _rows_panel(ax: Any, points: list[Point], colours: dict[str, str]) -> None:
    """Recall against rows, one line per (model, k, cols) measured at more than one row count."""
    lines: dict[tuple[str, int, int], list[Point]] = {}
    for p in points:
        lines.setdefault((p.run.model, p.run.k, int(p.run.settings["sketch-cols"])), []).append(p)
    for (model, k, cols), line in sorted(lines.items()):
        if len(line) < 2:
            continue
        line.sort(key=lambda p: int(p.run.settings["sketch-rows"]))
        rows = [int(p.run.settings["sketch-rows"]) for p in line]
        ax.plot(
            rows,
            [p.run.mean_recall for p in line],
            marker="o",
            color=colours[model],
            ls="-" if cols / k > 5 else "--",
            label=f"{model}, k {k:,}, {cols:,} cols",
        )
    ax.set_xlabel("sketch rows")
    ax.set_ylim(0, 1.02)
    ax.set_title("(c) recall against rows", fontsize=9)
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:
        ax.text(
            0.5,
            0.5,
            "no run measured at\nmore than one row count",
            ha="center",
            va="center",
            transform=ax.transAxes,
            fontsize=9,
            color="grey",
        )


def _rounds_panel(ax: Any, points: list[Point], colours: dict[str, str]) -> None:
    """Recall over rounds: per model, the 3-row run at k = 1% of d with the most columns per k up to 10."""
    for model in sorted(colours):
        pick = [
            p
            for p in points
            if p.run.model == model
            and int(p.run.settings["sketch-rows"]) == 3
            and _near(p.k_fraction, 0.01)
            and p.cols_per_k <= 10
        ]
        if pick:
            p = max(pick, key=lambda q: q.cols_per_k)
            ax.plot(
                p.run.rounds,
                p.run.recall,
                marker=".",
                color=colours[model],
                label=f"{model}, {p.cols_per_k:.0f} cols per k",
            )
    ax.set_xlabel("round")
    ax.set_ylim(0, 1.02)
    ax.set_title("(d) recall over the run (k = 1% of d; mean since the previous row)", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)


def table(points: list[Point]) -> str:
    """The figure's numbers as Markdown, one row per FetchSGD run."""
    header = (
        "| experiment | model | k (of d) | rows x cols | cols per k | upload compression | recall, mean"
        " | recall, last row | FetchSGD acc. | true top-k acc. | gap (points) |"
    )
    lines = [header, "|" + "---|" * 11]
    for p in sorted(points, key=_order):
        s = p.run.settings
        topk = "" if p.topk_accuracy is None else f"{p.topk_accuracy:.4f}"
        gap = "" if p.gap is None else f"{p.gap:+.1f}"
        lines.append(
            f"| {p.run.experiment} | {p.run.model} | {p.run.k:,} ({p.k_fraction:.2%}) | {s['sketch-rows']} x {int(s['sketch-cols']):,} "
            f"| {p.cols_per_k:g} | {p.run.upload_compression:.1f}x | {p.run.mean_recall:.3f} | {p.run.recall[-1]:.3f} "
            f"| {p.run.accuracy:.4f} | {topk} | {gap} |"
        )
    return "\n".join(lines)


def _order(p: Point) -> tuple[str, str, int, int, float]:
    return p.run.experiment, p.run.model, p.run.k, int(p.run.settings["sketch-rows"]), p.cols_per_k


def _near(value: float, target: float) -> bool:
    return abs(value / target - 1) < 0.2


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else float("nan")


def main(argv: list[str] | None = None) -> int:
    """``python -m experiments.studies.regime RUNS_DIR [--out DIR]``."""
    return map_cli.run(argv, "regime", __doc__.split("\n")[0], collect, table, draw, "FetchSGD runs")


if __name__ == "__main__":
    sys.exit(main())
