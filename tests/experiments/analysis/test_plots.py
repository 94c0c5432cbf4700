"""An experiment's figures (experiments/analysis/plots.py), read back from the drawn matplotlib objects.

Run folders are written here by hand with random curves over several seeds; every line, band,
point, label and tick a figure draws is compared with what the metrics rows say, recomputed here
with numpy.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.image import imread
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from experiments.analysis.plots import (
    AXES,
    PARETO,
    BytesFormatter,
    BytesLocator,
    Plot,
    _finish,
    _plot_pareto,
    _xticks,
    curve,
    final_points,
    plot_experiment,
)
from experiments.analysis.results import RunGroup, collect_groups, format_bytes
from fedsketch.server import runlog
from tests import run_folders

Rows = list[dict[str, Any]]
UNITS = {"B": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
GROUPS = [("fedavg", ""), ("fetchsgd", "cols27"), ("fetchsgd", "cols100"), ("true_topk", "k20")]
"""Run groups in the order figures list them: by strategy, then sweep point with numbers as numbers."""
X_OF: dict[str, Callable[[dict[str, Any]], float]] = {
    "rounds": lambda r: r["round"],
    "upload_bytes": lambda r: r["cum_upload_bytes"],
    "total_bytes": lambda r: r["cum_upload_bytes"] + r["cum_download_bytes"],
}
X_LABELS = {
    "rounds": "round",
    "upload_bytes": "cumulative upload bytes",
    "total_bytes": "cumulative upload + download bytes",
}


def _label(strategy: str, point: str) -> str:
    return f"{strategy} {point}" if point else strategy


def _rows(rng: np.random.Generator, strategy: str, seed: int, n: int, scale: float, spread: float) -> Rows:
    """One seed's evaluated rounds: cumulative bytes that grow by up to ``spread`` times, accuracy that wanders."""
    up = scale * np.cumsum(rng.uniform(1.0, spread, size=n))
    down = scale * np.cumsum(rng.uniform(1.0, 2 * spread, size=n))
    return [
        {
            "round": 3 * (i + 1),
            "strategy": strategy,
            "seed": seed,
            "test_accuracy": round(float(rng.random()), 4),
            "cum_upload_bytes": int(up[i]),
            "cum_download_bytes": int(down[i]),
            "cum_dense_upload_bytes": int(10 * up[i]),
        }
        for i in range(n)
    ]


def _experiment(
    root: Path, rng: np.random.Generator, seeds: list[int], spread: float, stopped: set[str]
) -> dict[str, list[Rows]]:
    """Run folders laid out as ``runlog.run_dir`` does, written in reverse; a seed's rows may be fewer than another's.

    The last seed of each group in ``stopped`` was stopped early. Returns each group's rows by seed.
    """
    want: dict[str, list[Rows]] = {}
    for (strategy, point), count in reversed(list(zip(GROUPS, seeds, strict=True))):
        base = root / strategy / point if point else root / strategy
        scale = 10 ** rng.uniform(4, 8)
        for seed in reversed(range(count)):
            folder = base / f"seed{seed}" if seed else base
            folder.mkdir(parents=True, exist_ok=True)
            rows = _rows(rng, strategy, seed, int(rng.integers(2, 6)), scale, spread)
            (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            if _label(strategy, point) in stopped and seed == count - 1:
                runlog.write_status(folder, "interrupted", "SIGINT", 60)
            want.setdefault(_label(strategy, point), []).insert(0, rows)
    return {_label(*group): want[_label(*group)] for group in GROUPS}


def _shared(seeds: list[Rows]) -> list[Rows]:
    n = min(len(rows) for rows in seeds)
    return [rows[:n] for rows in seeds]


def _value(text: str) -> float:
    number, unit = text.split(" ")
    return float(number) * UNITS[unit]


@dataclass
class Drawn:
    """An experiment's rows, what ``plot_experiment`` returned and the figures it drew, by file stem."""

    name: str
    rows: dict[str, list[Rows]]
    stopped: set[str]
    plots: dict[str, Plot]
    figures: dict[str, Figure]
    out: Path
    open_after: list[int]


def _draw(
    root: Path, name: str, seeds: list[int], stopped: set[str], spread: float, pareto_only: bool = False
) -> Drawn:
    experiment = root / name
    rows = _experiment(experiment, np.random.default_rng(len(name)), seeds, spread, stopped)
    out = root / "figures" / "png"
    figures: list[Figure] = []
    save = Figure.savefig

    def record(self: Figure, *args: Any, **kwargs: Any) -> None:
        figures.append(self)
        save(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Figure, "savefig", record)
        if pareto_only:
            out.mkdir(parents=True)
            plots = [_plot_pareto(collect_groups(experiment), name, out)]
        else:
            plots = plot_experiment(experiment, out)
    open_after = plt.get_fignums()
    by_stem = {p.path.stem: p for p in plots}
    assert len(figures) == len(plots) == len(by_stem)
    return Drawn(name, rows, stopped, by_stem, dict(zip(by_stem, figures, strict=True)), out, open_after)


def _axes(figure: Figure) -> Axes:
    (ax,) = figure.axes
    return ax


def _legend(ax: Axes) -> list[str]:
    legend = ax.get_legend()
    assert legend is not None
    return [t.get_text() for t in legend.get_texts()]


def _each_convergence_figure_draws_every_groups_mean_over_the_rounds_all_its_seeds_reached(drawn: Drawn) -> None:
    assert set(drawn.plots) == {f"accuracy_vs_{axis}" for axis in AXES} | {PARETO}
    for axis, get_x in X_OF.items():
        ax = _axes(drawn.figures[f"accuracy_vs_{axis}"])
        lines = ax.get_lines()
        assert [line.get_label().split(" (")[0] for line in lines] == list(drawn.rows)
        bands = iter(c for c in ax.collections if isinstance(c, PolyCollection))
        for line, (label, seeds) in zip(lines, drawn.rows.items(), strict=True):
            shared = _shared(seeds)
            x = np.mean([[get_x(r) for r in rows] for rows in shared], axis=0)
            acc = np.array([[r["test_accuracy"] for r in rows] for rows in shared])
            np.testing.assert_allclose(line.get_xdata(), x, rtol=1e-12)
            np.testing.assert_allclose(line.get_ydata(), acc.mean(axis=0), rtol=1e-12)
            assert line.get_marker() == "."
            c = drawn.plots[f"accuracy_vs_{axis}"].curves[label]
            np.testing.assert_allclose(c.x, x, rtol=1e-12)
            np.testing.assert_allclose((c.mean, c.low, c.high), (acc.mean(0), acc.min(0), acc.max(0)), rtol=1e-12)
            if len(seeds) > 1:  # the min-max band, at the same x
                band = next(bands)
                corners = sorted({(float(a), float(b)) for a, b in band.get_paths()[0].vertices})
                want = sorted(zip([*x, *x], [*acc.min(0), *acc.max(0)], strict=True))
                assert np.allclose(corners, want, rtol=1e-12), (label, corners, want)
                assert band.get_alpha() == 0.2
        assert next(bands, None) is None  # no band for a single seed
        assert drawn.plots[f"accuracy_vs_{axis}"].front == ()


def _a_legend_names_each_group_with_its_seeds_and_whether_one_stopped_early(drawn: Drawn) -> None:
    want = []
    for label, seeds in drawn.rows.items():
        n = len(seeds)
        want.append(f"{label} ({n} seed{'s' if n > 1 else ''}{', stopped early' if label in drawn.stopped else ''})")
    for axis in AXES:
        ax = _axes(drawn.figures[f"accuracy_vs_{axis}"])
        assert _legend(ax) == want
        assert ax.get_legend().get_texts()[0].get_fontsize() == pytest.approx(plt.rcParams["font.size"] * 0.833, 0.01)


def _the_pareto_legend_names_each_group_and_whether_one_stopped_early(drawn: Drawn) -> None:
    pareto = [f"{label}{' (stopped early)' if label in drawn.stopped else ''}" for label in drawn.rows]
    assert _legend(_axes(drawn.figures[PARETO])) == ["Pareto front", *pareto]


def _the_pareto_figure_puts_each_groups_final_accuracy_band_at_its_mean_upload(drawn: Drawn) -> None:
    ax = _axes(drawn.figures[PARETO])
    finals = run_folders.finals(drawn.rows)
    bars = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert [bar.get_label().split(" (")[0] for bar in bars] == list(drawn.rows)
    for bar, (label, seeds) in zip(bars, drawn.rows.items(), strict=True):
        point, caps, (segments,) = bar.lines
        last = [rows[-1]["test_accuracy"] for rows in seeds]
        assert isinstance(point, Line2D) and isinstance(segments, LineCollection)
        assert (float(point.get_xdata()[0]), float(point.get_ydata()[0])) == pytest.approx(finals[label], rel=1e-12)
        (segment,) = segments.get_segments()
        assert [*segment.flat] == pytest.approx([finals[label][0], min(last), finals[label][0], max(last)])
        assert point.get_marker() == "o" and point.get_linestyle() == "None"
        assert [cap.get_markersize() for cap in caps] == [6.0, 6.0]  # caps 3 points wide each side
        c = drawn.plots[PARETO].curves[label]
        assert [*c.x, *c.mean] == pytest.approx(finals[label], rel=1e-12)
        assert (c.low.tolist(), c.high.tolist()) == ([min(last)], [max(last)])


def _the_pareto_front_joins_the_undominated_groups_by_increasing_upload(drawn: Drawn) -> None:
    finals = run_folders.finals(drawn.rows)
    front = run_folders.front(finals)
    assert list(drawn.plots[PARETO].front) == front
    (line,) = [line for line in _axes(drawn.figures[PARETO]).get_lines() if line.get_label() == "Pareto front"]
    assert [*line.get_xdata(), *line.get_ydata()] == pytest.approx([finals[f][i] for i in (0, 1) for f in front])
    assert (line.get_color(), line.get_linestyle(), line.get_linewidth()) == ("black", "--", 1.0)


def _axes_say_what_they_show_and_bytes_are_on_a_log_axis(drawn: Drawn) -> None:
    for axis, xlabel in X_LABELS.items():
        ax = _axes(drawn.figures[f"accuracy_vs_{axis}"])
        assert (ax.get_xlabel(), ax.get_ylabel()) == (xlabel, "test accuracy")
        assert ax.get_title().replace(":\n", ": ") == f"{drawn.name}: test accuracy vs {xlabel}"
        assert ax.get_xscale() == ("linear" if axis == "rounds" else "log")
        assert ax.get_yscale() == "linear"


def _the_pareto_axes_say_what_they_show_on_a_log_axis(drawn: Drawn) -> None:
    ax = _axes(drawn.figures[PARETO])
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("total upload bytes", "final test accuracy")
    assert ax.get_title().replace(":\n", ": ") == f"{drawn.name}: final accuracy vs total upload bytes"
    assert ax.get_xscale() == "log"


def _a_title_longer_than_55_characters_breaks_once_after_the_experiments_name(drawn: Drawn) -> None:
    for stem, figure in drawn.figures.items():
        title = _axes(figure).get_title()
        whole = title.replace(":\n", ": ")
        assert title == (whole if len(whole) <= 55 else whole.replace(": ", ":\n")), stem


@pytest.mark.filterwarnings("ignore:No artists with labels found")
@pytest.mark.parametrize(
    ("title", "shown"),
    [
        ("x" * 53 + ": ", "x" * 53 + ": "),
        ("x" * 52 + ": y", "x" * 52 + ": y"),
        ("x" * 53 + ": y", "x" * 53 + ":\ny"),
        ("a: b: " + "x" * 60, "a:\nb: " + "x" * 60),
    ],
)
def test_a_long_title_breaks_at_its_first_colon_only(title: str, shown: str) -> None:
    fig, ax = plt.subplots()
    try:
        _finish(ax, title, "round", "test accuracy", False)
        assert ax.get_title() == shown
    finally:
        plt.close(fig)


def _byte_axes_label_major_ticks_in_decimal_units_and_no_minor_ones(drawn: Drawn) -> None:
    for stem in (stem for stem in drawn.figures if stem != "accuracy_vs_rounds"):
        ax = _axes(drawn.figures[stem])
        assert isinstance(ax.xaxis.get_major_locator(), BytesLocator)
        assert isinstance(ax.xaxis.get_major_formatter(), BytesFormatter)
        assert isinstance(ax.xaxis.get_minor_formatter(), NullFormatter)
        low, high = sorted(ax.get_xlim())
        ticks = [t for t in ax.xaxis.get_major_ticks() if low <= t.get_loc() <= high]
        labels = [t.label1.get_text() for t in ticks]
        assert drawn.plots[stem].xticks == tuple(labels), stem
        assert len(labels) >= 3, (stem, labels)
        for tick, label in zip(ticks, labels, strict=True):
            assert re.fullmatch(r"\d+(\.\d+)? (B|kB|MB|GB|TB)", label), (stem, label)
            assert _value(label) == pytest.approx(tick.get_loc(), rel=5e-3), (stem, label)
        assert [_value(t) for t in labels] == sorted({_value(t) for t in labels})
        assert {t.label1.get_text() for t in ax.xaxis.get_minor_ticks()} <= {""}


def _the_rounds_axis_keeps_matplotlibs_numbers(drawn: Drawn) -> None:
    ax = _axes(drawn.figures["accuracy_vs_rounds"])
    low, high = sorted(ax.get_xlim())
    labels = [t.label1.get_text() for t in ax.xaxis.get_major_ticks() if low <= t.get_loc() <= high]
    assert drawn.plots["accuracy_vs_rounds"].xticks == tuple(label for label in labels if label)
    assert all(re.fullmatch(r"[\d.]+", t.replace("\u2212", "-")) for t in labels)


def _each_figure_is_a_png_named_after_what_it_shows_and_closed_once_written(drawn: Drawn) -> None:
    assert drawn.open_after == []
    for stem, plot in drawn.plots.items():
        assert plot.path == drawn.out / f"{stem}.png"
        assert imread(plot.path).shape[:2] == (504, 768)  # 6.4 x 4.2 inches at 120 dots per inch
        assert tuple(drawn.figures[stem].get_size_inches()) == (6.4, 4.2)
        ax = _axes(drawn.figures[stem])
        assert [line.get_visible() for line in ax.get_xgridlines()] == [True] * len(ax.get_xgridlines())
        assert ax.get_xgridlines()[0].get_alpha() == 0.3


def _the_axes_fill_the_figure_up_to_their_labels(drawn: Drawn) -> None:
    for stem, figure in drawn.figures.items():
        ax = _axes(figure)
        renderer = FigureCanvasAgg(figure).get_renderer()  # the figure was closed: a canvas to measure with
        box = ax.get_tightbbox(renderer)
        assert box is not None
        width, height = figure.bbox.width, figure.bbox.height
        assert 0 <= box.x0 < 0.05 * width and 0.95 * width < box.x1 <= width, stem
        assert 0 <= box.y0 < 0.05 * height and 0.95 * height < box.y1 <= height, stem


def _group(rng: np.random.Generator, seeds: int, point: str = "") -> RunGroup:
    scale = 10 ** rng.uniform(3, 9)
    runs = [tuple(_rows(rng, "m", s, int(rng.integers(1, 6)), scale, 20.0)) for s in range(seeds)]
    return RunGroup("m", point, tuple(runs))


@pytest.mark.parametrize("seed", range(6))
def test_a_curve_is_the_seeds_mean_x_and_accuracy_band_over_their_shared_rounds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    group = _group(rng, 1 + seed % 4)
    shared = _shared([list(rows) for rows in group.seeds])
    acc = np.array([[r["test_accuracy"] for r in rows] for rows in shared])
    for axis, get_x in X_OF.items():
        c = curve(group, axis)
        assert c.x.tolist() == pytest.approx(np.mean([[get_x(r) for r in rows] for rows in shared], axis=0).tolist())
        assert c.mean.tolist() == pytest.approx(acc.mean(axis=0).tolist())
        assert (c.low.tolist(), c.high.tolist()) == (acc.min(axis=0).tolist(), acc.max(axis=0).tolist())


@pytest.mark.parametrize("seed", range(6))
def test_final_points_are_each_groups_mean_upload_and_accuracy_band_with_the_front(seed: int) -> None:
    rng = np.random.default_rng(seed)
    groups = [_group(rng, k, f"p{i}") for i, k in enumerate((1, 2, 3, 2, 1))]
    want = {g.label: [list(rows) for rows in g.seeds] for g in groups}
    points, front = final_points(groups)
    finals = run_folders.finals(want)
    assert list(points) == list(want)
    for label, p in points.items():
        last = [rows[-1]["test_accuracy"] for rows in want[label]]
        assert [*p.x, *p.mean] == pytest.approx(finals[label])
        assert (p.low.tolist(), p.high.tolist()) == ([min(last)], [max(last)])
    assert list(front) == run_folders.front(finals)


def test_a_locator_on_no_axis_places_no_ticks() -> None:
    assert BytesLocator()() == []


@pytest.fixture
def axes() -> Iterator[Axes]:
    fig, ax = plt.subplots(figsize=(2.5, 4.2), dpi=100)
    yield ax
    plt.close(fig)


def test_a_vertical_byte_axis_keeps_every_tick(axes: Axes) -> None:
    """Only a horizontal axis is thinned: stacked labels do not overlap. The same range across is thinned."""
    for axis, scale, limits in (
        (axes.xaxis, axes.set_xscale, axes.set_xlim),
        (axes.yaxis, axes.set_yscale, axes.set_ylim),
    ):
        scale("log")
        limits(6.5e6, 10.5e6)
        axis.set_major_locator(BytesLocator())
    across, up = axes.xaxis.get_major_locator()(), axes.yaxis.get_major_locator()()
    assert up == BytesLocator().tick_values(6.5e6, 10.5e6) == [7e6, 8e6, 9e6, 1e7]
    assert len(across) < len(up)


def test_a_locator_off_any_axes_places_every_candidate() -> None:
    """As matplotlib uses one on a dummy axis (outside a figure): nothing to measure labels against."""
    locator = BytesLocator()
    locator.create_dummy_axis()
    assert locator.axis is not None
    locator.axis.set_view_interval(6.5e6, 10.5e6)
    assert locator() == [7e6, 8e6, 9e6, 1e7]


def _kept(ticks: list[float], labelsize: float | str = "medium") -> list[float]:
    """The ticks a locator keeps on a 640-pixel axis of one data unit a pixel, at 100 dots per inch."""
    with plt.rc_context({"xtick.labelsize": labelsize}):
        fig = plt.figure(figsize=(6.4, 2.0), dpi=100)
        try:
            ax = fig.add_axes((0.0, 0.2, 1.0, 0.7))
            ax.set_xlim(0, 640)
            locator = BytesLocator()
            ax.xaxis.set_major_locator(locator)
            return locator.spaced(ticks)
        finally:
            plt.close(fig)


@pytest.mark.parametrize(
    ("labelsize", "kept"),
    [("medium", [100.0, 150.5, 260.0]), (20.0, [100.0, 200.1])],
)
def test_a_tick_is_kept_six_label_characters_from_the_last_kept_one(labelsize: float | str, kept: list[float]) -> None:
    """Six characters of 0.6 em: 50 pixels for 10-point labels at 100 dots per inch, 100 for 20-point ones."""
    assert _kept([100.0, 150.5, 200.1, 260.0], labelsize) == kept


def test_of_two_ticks_whose_labels_would_touch_the_first_is_kept() -> None:
    assert _kept([100.0, 120.0]) == [100.0]
    assert _kept([100.0, 151.0]) == [100.0, 151.0]
    assert _kept([100.0]) == [100.0]


@pytest.mark.parametrize("n", [0, 512, 2.5e6, 1.19e9, 3e12])
def test_a_single_byte_value_reads_in_decimal_units(n: float) -> None:
    """As the cursor's position is shown: three significant digits, like every other byte figure."""
    assert BytesFormatter()(n) == format_bytes(n)


@pytest.mark.parametrize(
    ("ticks", "labels"),
    [
        ([1e6, 2e6, 5e6], ["1 MB", "2 MB", "5 MB"]),
        ([1.234e6, 5.678e6], ["1.23 MB", "5.68 MB"]),
        ([2.4e9, 2.402e9], ["2.4 GB", "2.402 GB"]),
        ([1.23412e6, 1.23456e6], ["1.234 MB", "1.235 MB"]),
        ([1.23412e6, 1.23421e6], ["1.2341 MB", "1.2342 MB"]),
        ([1.234112e6, 1.234121e6], ["1.23411 MB", "1.23412 MB"]),
        ([1.2341111e6, 1.2341112e6], ["1.23411 MB", "1.23411 MB"]),
    ],
)
def test_neighbouring_tick_labels_take_as_few_digits_as_tell_them_apart(ticks: list[float], labels: list[str]) -> None:
    """Three significant digits, up to six where neighbours would read the same; beyond six they may."""
    assert BytesFormatter().format_ticks(ticks) == labels


def _candidates(low: float, high: float, digits: tuple[int, ...]) -> list[float]:
    return [float(d * 10.0**e) for e in range(-3, 30) for d in digits if low <= d * 10.0**e <= high]


@pytest.mark.parametrize("seed", range(6))
def test_byte_ticks_are_decades_else_1_2_5_else_digits_else_even_steps_three_to_a_dozen(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(40):
        low = float(10 ** rng.uniform(-3, 12))  # below a byte too: ticks stay in the range
        high = low * float(10 ** rng.choice([rng.uniform(0.001, 0.3), rng.uniform(0.3, 1.5), rng.uniform(1.5, 15)]))
        ticks = BytesLocator().tick_values(high, low) if rng.random() < 0.5 else BytesLocator().tick_values(low, high)
        assert ticks == sorted(set(ticks)) and all(low <= t <= high for t in ticks), (low, high, ticks)
        assert 3 <= len(ticks) <= 12 or len(_candidates(low, high, tuple(range(1, 10)))) < 3, (low, high, ticks)
        for digits in ((1,), (1, 2, 5), tuple(range(1, 10))):
            every = _candidates(low, high, digits)
            if len(every) >= 3:  # the fewest digits that give three ticks, thinned evenly to at most a dozen
                assert ticks == every[:: -(-len(every) // 12)], (low, high, digits, ticks)
                break
        else:  # within one digit step: matplotlib's even steps, inside the range
            steps = np.diff(ticks)
            assert len(ticks) >= 2 and np.allclose(steps, steps[0]), (low, high, ticks)
            assert len(ticks) <= 5


@pytest.mark.parametrize(
    ("low", "high", "ticks"),
    [(1.05e6, 1.95e6, [1.25e6, 1.5e6, 1.75e6]), (1.2e6, 1.8e6, [1.2e6, 1.35e6, 1.5e6, 1.65e6, 1.8e6])],
)
def test_within_one_digit_step_byte_ticks_are_four_even_steps_edges_included(
    low: float, high: float, ticks: list[float]
) -> None:
    assert BytesLocator().tick_values(low, high) == ticks


def test_byte_ticks_of_a_range_reaching_zero_start_at_the_smallest_positive_decade() -> None:
    ticks = BytesLocator().tick_values(0.0, 5e3)
    assert ticks[0] == 1e-300 and ticks[-1] <= 5e3 and len(ticks) <= 12


@pytest.mark.filterwarnings("error")  # matplotlib warns of a grid both off and styled, for one
@pytest.mark.parametrize("log_x", [True, False])
def test_a_finished_axes_is_titled_labelled_gridded_and_logged_for_bytes(log_x: bool) -> None:
    fig, ax = plt.subplots()
    try:
        ax.plot([1e6, 3e6, 9e6], [0.1, 0.2, 0.4], label="fetchsgd (1 seed)")
        _finish(ax, "exp: accuracy", "bytes", "test accuracy", log_x)
        assert (ax.get_title(), ax.get_xlabel(), ax.get_ylabel()) == ("exp: accuracy", "bytes", "test accuracy")
        assert ax.get_xscale() == ("log" if log_x else "linear")
        assert isinstance(ax.xaxis.get_major_locator(), BytesLocator) is log_x
        assert isinstance(ax.xaxis.get_major_formatter(), BytesFormatter) is log_x
        assert isinstance(ax.xaxis.get_minor_formatter(), NullFormatter)  # labelled minor ticks overlap
        grid = [*ax.get_xgridlines(), *ax.get_ygridlines()]
        assert grid and all(line.get_visible() and line.get_alpha() == 0.3 for line in grid)
        assert _legend(ax) == ["fetchsgd (1 seed)"]
        assert ax.get_legend().get_texts()[0].get_fontsize() == pytest.approx(plt.rcParams["font.size"] * 0.833, 0.01)
    finally:
        plt.close(fig)


def test_the_listed_ticks_are_the_labelled_ones_in_view_edges_included_and_the_figure_closed() -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot([1e6, 1e9], [0.1, 0.2], label="fedavg")
    _finish(ax, "t", "bytes", "accuracy", True)
    ax.set_xlim(1e6, 1e9)
    fig.canvas.draw()
    other = plt.figure()  # the current figure now, and left open
    try:
        assert _xticks(ax) == ("1 MB", "10 MB", "100 MB", "1 GB")
        assert fig.number not in plt.get_fignums() and other.number in plt.get_fignums()
    finally:
        plt.close(other)


def test_the_pareto_figure_draws_what_the_final_rows_say(tmp_path: Path) -> None:
    """The Pareto figure alone, for one more draw of seeds: one group per seed count, one stopped early."""
    drawn = _draw(tmp_path, "pareto", [3, 1, 2, 1], {"fedavg"}, spread=5.0, pareto_only=True)
    _the_pareto_legend_names_each_group_and_whether_one_stopped_early(drawn)
    _the_pareto_figure_puts_each_groups_final_accuracy_band_at_its_mean_upload(drawn)
    _the_pareto_front_joins_the_undominated_groups_by_increasing_upload(drawn)
    _the_pareto_axes_say_what_they_show_on_a_log_axis(drawn)
    _byte_axes_label_major_ticks_in_decimal_units_and_no_minor_ones(drawn)
    _each_figure_is_a_png_named_after_what_it_shows_and_closed_once_written(drawn)


def test_every_figure_draws_what_the_metrics_rows_say(tmp_path: Path) -> None:
    """Groups of 1 to 3 seeds over bytes spanning decades, two stopped early; figures written to a new folder.

    The name makes the Pareto figure's title 55 characters long, the upload figures' longer. One
    drawing is checked part by part: mutation testing credits a test only with the code it runs itself.
    """
    stopped = {"fetchsgd cols27", "fetchsgd cols100"}
    drawn = _draw(tmp_path, "a-seventeen-chars", [2, 1, 3, 2], stopped, spread=30.0)
    _each_convergence_figure_draws_every_groups_mean_over_the_rounds_all_its_seeds_reached(drawn)
    _a_legend_names_each_group_with_its_seeds_and_whether_one_stopped_early(drawn)
    _the_pareto_legend_names_each_group_and_whether_one_stopped_early(drawn)
    _the_pareto_figure_puts_each_groups_final_accuracy_band_at_its_mean_upload(drawn)
    _the_pareto_front_joins_the_undominated_groups_by_increasing_upload(drawn)
    _axes_say_what_they_show_and_bytes_are_on_a_log_axis(drawn)
    _the_pareto_axes_say_what_they_show_on_a_log_axis(drawn)
    _a_title_longer_than_55_characters_breaks_once_after_the_experiments_name(drawn)
    _byte_axes_label_major_ticks_in_decimal_units_and_no_minor_ones(drawn)
    _the_rounds_axis_keeps_matplotlibs_numbers(drawn)
    _each_figure_is_a_png_named_after_what_it_shows_and_closed_once_written(drawn)
    _the_axes_fill_the_figure_up_to_their_labels(drawn)
