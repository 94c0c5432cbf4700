"""What a user watching sees: plain progress lines off a terminal, readable ticks on byte axes."""

from __future__ import annotations

import io
import itertools
import os
import re
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import Progress, TaskID

from experiments.analysis.plots import PARETO, BytesFormatter, BytesLocator, plot_experiment
from experiments.analysis.results import format_bytes
from experiments.running.progress import LineProgress, RunWatcher, make_progress, note, time_left
from experiments.running.progress import clock as progress_clock
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


def test_time_left_is_the_pace_from_the_first_to_the_last_stamp_times_the_rounds_to_go() -> None:
    assert time_left([(2, 100.0), (4, 110.0)], 10) == 30.0  # 5 s a round, 6 rounds to go
    assert time_left([(2, 100.0), (3, 104.0), (4, 110.0)], 10) == 30.0  # the ends, not the last step
    assert time_left([(2, 0.0), (5, 3.0), (5, 9.0)], 8) == 9.0
    assert time_left([(2, 100.0), (4, 110.0)], 3) == 0.0  # past its last round: nothing left
    assert time_left([(4, 100.0), (4, 101.0), (6, 110.0)], 10) == 20.0
    for too_few in ([], [(3, 100.0)], [(3, 100.0), (3, 105.0)]):
        assert time_left(too_few, 10) is None


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0:00:00"), (125.9, "0:02:05"), (3600, "1:00:00"), (7199, "1:59:59")]
)
def test_the_clock_reads_hours_minutes_seconds(seconds: float, text: str) -> None:
    assert progress_clock(seconds) == text


def test_each_run_gets_its_own_line_and_a_line_every_round_of_a_short_run() -> None:
    out, clock = io.StringIO(), Clock()
    progress = LineProgress(out, clock=clock)
    assert (progress.add_task("a", total=5), progress.add_task("b", total=5)) == (0, 1)
    for rnd in range(1, 6):
        progress.update(TaskID(1), completed=rnd)
    progress.print("a note")
    assert out.getvalue().splitlines() == [
        "a: ",
        "b: ",
        *(f"b: round {r}/5    elapsed 0:00:00" for r in range(1, 6)),
        "a note",
    ]


def test_a_line_comes_exactly_30_seconds_after_the_last() -> None:
    out, clock = io.StringIO(), Clock()
    progress = LineProgress(out, clock=clock)
    task = progress.add_task("a", total=100)
    progress.update(task, completed=1)
    clock.now += 30.0
    progress.update(task, completed=2)
    assert out.getvalue().splitlines()[-1] == "a: round 2/100    elapsed 0:00:30"


def test_each_line_reaches_a_block_buffered_stream_at_once() -> None:
    raw = io.BytesIO()
    progress = LineProgress(io.TextIOWrapper(raw, encoding="utf-8"), clock=Clock())
    task = progress.add_task("a", total=2, status="starting")
    assert raw.getvalue() == b"a: starting\n"
    progress.update(task, completed=1)
    assert raw.getvalue().endswith(b"a: round 1/2    elapsed 0:00:00\n")
    note(progress, "said")
    assert raw.getvalue().endswith(b"said\n")


def test_off_a_terminal_the_lines_go_to_the_stream_given_or_standard_output() -> None:
    out = io.StringIO()
    given, default = make_progress(out), make_progress()
    assert isinstance(given, LineProgress) and given.stream is out
    assert isinstance(default, LineProgress) and default.stream is sys.stdout


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_live_line_shows_the_run_its_bar_rounds_status_and_time() -> None:
    live = make_progress(Terminal())
    assert isinstance(live, Progress)
    live.add_task("fetchsgd seed 0", total=10, status="acc 0.500")
    live.update(TaskID(0), completed=3)
    shown = Console(file=io.StringIO(), width=120, force_terminal=True, color_system="standard")
    shown.print(live.make_tasks_table(live.tasks))
    text = shown.file.getvalue()  # type: ignore[attr-defined]
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert re.fullmatch(r"fetchsgd seed 0 [━╺]+ +3/10 acc 0\.500 0:00:0\d\s*", plain), plain
    assert "\x1b[1mfetchsgd seed 0" in text  # the run's name in bold


def test_a_note_above_the_live_display_is_printed_as_is() -> None:
    live = Progress(console=Console(file=io.StringIO(), width=120, force_terminal=True, color_system="standard"))
    note(live, "[bold]k[/bold] = 12 at round 3")
    assert live.console.file.getvalue() == "[bold]k[/bold] = 12 at round 3\n"  # type: ignore[attr-defined]


def _round_rows(path: Path, *rows: dict) -> None:
    for row in rows:
        runlog.append_metrics(path, row, runlog.ROUNDS)


def test_the_watcher_says_once_that_a_run_resumes_and_starts_with_flower(tmp_path: Path) -> None:
    out = io.StringIO()
    watcher = RunWatcher(LineProgress(out), "fetchsgd seed 0", tmp_path, num_rounds=10)
    runlog.mark_resumed(tmp_path, 3)
    watcher()
    watcher()
    assert out.getvalue().splitlines() == [
        "fetchsgd seed 0: starting Flower...",
        "fetchsgd seed 0: resuming after round 3 (its checkpoint)",
    ]


def test_the_watcher_moves_with_rounds_not_yet_evaluated_and_estimates_from_this_commands_rounds(
    tmp_path: Path,
) -> None:
    out = io.StringIO()
    watcher = RunWatcher(LineProgress(out), "a", tmp_path, num_rounds=10, started=0.5)
    _round_rows(tmp_path, {"round": 1}, {"round": 2, "unix_time": 0.5}, {"round": 3, "unix_time": 20.5})
    _round_rows(tmp_path, {"round": 4, "unix_time": 30.5})
    watcher()
    line = out.getvalue().splitlines()[-1]
    assert re.fullmatch(r"a: round 4/10  about 0:01:30 left \(estimate\)  elapsed 0:00:0\d", line), line


def test_the_last_round_is_shown_once_it_is_evaluated(tmp_path: Path) -> None:
    out = io.StringIO()
    watcher = RunWatcher(LineProgress(out), "a", tmp_path, num_rounds=3)
    _round_rows(tmp_path, {"round": 1}, {"round": 2}, {"round": 3})
    runlog.append_metrics(tmp_path, {"round": 2, "test_accuracy": 0.5, "cum_upload_bytes": 1, "cum_download_bytes": 2})
    watcher()
    assert out.getvalue().splitlines()[-1].startswith("a: round 2/3  acc 0.500  up 1 B  down 2 B  elapsed")
    one = io.StringIO()
    single = RunWatcher(LineProgress(one), "b", tmp_path / "one", num_rounds=1)
    (tmp_path / "one").mkdir()
    _round_rows(tmp_path / "one", {"round": 1})
    single()
    assert one.getvalue().splitlines() == ["b: starting Flower..."]  # its only round ended, not yet evaluated
