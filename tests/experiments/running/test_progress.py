"""What a user watching sees: plain progress lines off a terminal, readable ticks on byte axes."""

from __future__ import annotations

import io
import itertools
import os
import re
from pathlib import Path

import pytest
from rich.progress import Progress

from experiments.analysis.plots import PARETO, BytesFormatter, BytesLocator, plot_experiment
from experiments.analysis.results import format_bytes
from experiments.running.progress import LineProgress, RunWatcher, make_progress
from fedsketch.server import runlog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_off_a_terminal_a_line_when_a_run_starts_then_every_tenth_of_its_rounds() -> None:
    out, clock = io.StringIO(), Clock()
    assert isinstance(make_progress(out), LineProgress)
    progress = LineProgress(out, clock=clock)
    task = progress.add_task("fetchsgd seed 0", total=200, status="starting Flower...")
    for rnd in range(1, 201):
        clock.now += 0.5
        progress.update(task, completed=rnd, status=f"acc 0.{rnd:03d}")
        progress.update(task, completed=rnd, status=f"acc 0.{rnd:03d}")  # polled again, no new round: no line
    lines = out.getvalue().splitlines()
    assert lines[0] == "fetchsgd seed 0: starting Flower..."
    shown = [int(line.split("round ")[1].split("/")[0]) for line in lines[1:]]
    assert shown == [1, *range(21, 201, 20), 200]
    assert lines[-1] == "fetchsgd seed 0: round 200/200  acc 0.200  elapsed 0:01:40"


def test_a_slow_run_gets_a_line_at_least_every_30_seconds() -> None:
    out, clock = io.StringIO(), Clock()
    progress = LineProgress(out, clock=clock)
    task = progress.add_task("fedavg seed 0", total=100)
    for rnd in range(1, 5):
        clock.now += 31.0
        progress.update(task, completed=rnd, status="")
    assert len(out.getvalue().splitlines()) == 1 + 4


def test_on_a_terminal_the_live_display_is_kept() -> None:
    leader, follower = os.openpty()
    with open(follower, "w") as tty:
        assert isinstance(make_progress(tty), Progress)
    os.close(leader)


def test_the_watcher_reads_the_metrics_file_into_lines_in_decimal_units(tmp_path: Path) -> None:
    out = io.StringIO()
    watcher = RunWatcher(LineProgress(out), "fetchsgd seed 0", tmp_path, num_rounds=2)
    watcher()  # no metrics yet
    runlog.append_metrics(
        tmp_path, {"round": 1, "test_accuracy": 0.5, "cum_upload_bytes": 1_190_000, "cum_download_bytes": 2_400_000_000}
    )
    watcher()
    assert out.getvalue().splitlines()[1].startswith("fetchsgd seed 0: round 1/2  acc 0.500  up 1.19 MB  down 2.4 GB")


def test_a_line_for_a_later_round_says_which_round_its_accuracy_and_bytes_are_from(tmp_path: Path) -> None:
    out = io.StringIO()
    watcher = RunWatcher(LineProgress(out), "fetchsgd seed 0", tmp_path, num_rounds=30)
    row = {"round": 5, "test_accuracy": 0.5723, "cum_upload_bytes": 1_740_000, "cum_download_bytes": 3_400_000}
    runlog.append_metrics(tmp_path, row)
    for rnd in range(1, 11):
        runlog.append_metrics(tmp_path, {"round": rnd, "unix_time": 0.0}, runlog.ROUNDS)
    watcher()
    line = out.getvalue().splitlines()[1]
    assert line.startswith("fetchsgd seed 0: round 10/30  at round 5: acc 0.572  up 1.74 MB  down 3.4 MB  elapsed")


@pytest.mark.parametrize(
    ("n", "text"), [(512, "512 B"), (1_000, "1 kB"), (250_000, "250 kB"), (1_190_000, "1.19 MB"), (2e9, "2 GB")]
)
def test_bytes_read_in_decimal_units(n: float, text: str) -> None:
    assert format_bytes(n) == text


def test_neighbouring_tick_labels_never_read_the_same() -> None:
    assert BytesFormatter().format_ticks([2.400e9, 2.402e9, 2.404e9]) == ["2.4 GB", "2.402 GB", "2.404 GB"]


def _metrics(exp_dir: Path, strategy: str, upload: float, download: float) -> None:
    path = exp_dir / strategy
    path.mkdir(parents=True)
    for rnd in range(1, 6):
        runlog.append_metrics(
            path,
            {
                "round": rnd,
                "strategy": strategy,
                "seed": 0,
                "test_accuracy": 0.1 * rnd,
                "cum_upload_bytes": upload * rnd,
                "cum_download_bytes": download * rnd,
                "cum_dense_upload_bytes": 1.2e6 * 10 * rnd,
            },
        )


def _values(labels: tuple[str, ...]) -> list[float]:
    scale = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
    return [float(number) * scale[unit] for number, unit in (label.split() for label in labels)]


def test_byte_axes_have_at_least_three_labelled_ticks_in_mb_and_gb(tmp_path: Path) -> None:
    """The default job's ranges: the total-bytes and Pareto figures used to show one labelled tick."""
    _metrics(tmp_path, "fetchsgd", upload=1.1e6, download=24e6)  # a sketch up, the dense model down, 10 clients
    _metrics(tmp_path, "fedavg", upload=12e6, download=24e6)
    plots = {p.path.stem: p for p in plot_experiment(tmp_path)}
    for name in ("accuracy_vs_upload_bytes", "accuracy_vs_total_bytes", PARETO):
        ticks = plots[name].xticks
        assert len(ticks) >= 3, (name, ticks)
        assert all(re.fullmatch(r"[\d.]+ (kB|MB|GB)", t) for t in ticks), (name, ticks)
        assert _values(ticks) == sorted(set(_values(ticks))), (name, ticks)


@pytest.mark.parametrize(("low", "high"), [(6.5e6, 10.5e6), (55e6, 95e6), (1.2e9, 3.9e9), (2e5, 9e7)])
@pytest.mark.parametrize("width", [2.5, 6.0])
def test_byte_tick_labels_never_overlap_on_a_narrow_axis(low: float, high: float, width: float) -> None:
    """Digit steps crowd toward a decade's top on a log axis; drawn, no two labels touch, and two at least show."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(width, 2.0), dpi=100)
    try:
        ax.set_xscale("log")
        ax.set_xlim(low, high)
        ax.xaxis.set_major_locator(BytesLocator())
        ax.xaxis.set_major_formatter(BytesFormatter())
        fig.canvas.draw()
        boxes = sorted(
            (label.get_window_extent() for label in ax.get_xticklabels() if label.get_text()), key=lambda b: b.x0
        )
        assert len(boxes) >= 2, [label.get_text() for label in ax.get_xticklabels()]
        for left, right in itertools.pairwise(boxes):
            assert left.x1 < right.x0, [label.get_text() for label in ax.get_xticklabels()]
    finally:
        plt.close(fig)
