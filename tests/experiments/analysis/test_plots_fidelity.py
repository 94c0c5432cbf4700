"""The sketch-fidelity figure: the series are the metrics rows' columns, each panel labelled and scaled, and the
command says what it wrote or, in one line, why it could not."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from PIL import Image

from experiments.analysis import plots_fidelity
from experiments.analysis.plots_fidelity import FIGURE, PANELS, draw, fidelity_series, main, plot_fidelity
from fedsketch.server import runlog

ROWS = [
    {"round": 2, "sketch_recall": 0.5, "sketch_rel_error": 0.75, "test_accuracy": 0.25},
    {"round": 4, "sketch_recall": 1, "sketch_rel_error": True, "test_accuracy": 0.5},
    {"round": 6, "sketch_recall": None, "test_accuracy": 0.625},
]


def _run(tmp_path: Path, rows: list[dict] = ROWS) -> Path:
    run = tmp_path / "fidelity" / "fetchsgd"
    run.mkdir(parents=True)
    for row in rows:
        runlog.append_metrics(run, row)
    return run


def test_the_series_are_the_rows_columns_with_nan_where_a_row_has_no_number(tmp_path: Path) -> None:
    rounds, series = fidelity_series(_run(tmp_path))
    assert rounds.dtype == np.int64 and rounds.tolist() == [2, 4, 6]
    assert list(series) == [name for name, _ in PANELS]
    assert all(values.dtype == np.float64 for values in series.values())
    np.testing.assert_array_equal(series["sketch_recall"], [0.5, 1.0, np.nan])
    np.testing.assert_array_equal(series["sketch_rel_error"], [0.75, np.nan, np.nan])  # True is no number
    np.testing.assert_array_equal(series["test_accuracy"], [0.25, 0.5, 0.625])


def test_a_run_without_rows_or_without_the_diagnostic_is_refused_by_name(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError) as caught:
        fidelity_series(empty)
    assert str(caught.value) == f"{empty} has no metrics.jsonl rows"
    plain = _run(tmp_path, [{"round": 1, "test_accuracy": 0.5}])
    with pytest.raises(ValueError) as caught:
        fidelity_series(plain)
    assert str(caught.value) == f"{plain}: metrics rows have no 'sketch_recall'; run with --set diagnose-sketch=true"


def test_each_panel_draws_its_column_against_rounds_with_its_label_and_scale() -> None:
    rounds = np.array([2, 4])
    series = {
        "sketch_recall": np.array([0.5, 0.9]),
        "sketch_rel_error": np.array([3.0, 2.0]),
        "test_accuracy": np.array([0.1, 0.2]),
    }
    fig = draw("fidelity/fetchsgd", rounds, series)
    try:
        assert tuple(fig.get_size_inches()) == (13.5, 3.8)
        assert fig.get_suptitle() == "fidelity/fetchsgd: sketch fidelity (means since the previous row)"
        axes = fig.get_axes()
        assert [ax.get_position().y0 for ax in axes] == [axes[0].get_position().y0] * 3  # side by side
        assert sorted(ax.get_position().x0 for ax in axes) == [ax.get_position().x0 for ax in axes]
        assert [(ax.get_xlabel(), ax.get_ylabel()) for ax in axes] == [("round", label) for _, label in PANELS]
        for ax, (column, _) in zip(axes, PANELS, strict=True):
            (line,) = ax.get_lines()
            assert line.get_xdata().tolist() == [2, 4] and line.get_ydata().tolist() == series[column].tolist()
            assert line.get_marker() == "."
            grid = ax.xaxis.get_gridlines()[0]
            assert grid.get_visible() and grid.get_alpha() == 0.3
        assert axes[0].get_ylim() == (0.0, 1.02)
        assert axes[1].get_ylim()[0] == 0.0 and axes[1].get_ylim()[1] >= 3.0
    finally:
        plt.close(fig)


def test_the_figure_is_written_beside_the_run_or_where_asked(tmp_path: Path) -> None:
    run = _run(tmp_path)
    plot = plot_fidelity(run)
    assert plot.path == run / FIGURE and plot.rounds.tolist() == [2, 4, 6]
    np.testing.assert_array_equal(plot.series["test_accuracy"], [0.25, 0.5, 0.625])
    with Image.open(plot.path) as image:
        assert image.size == (1620, 456)  # 13.5 x 3.8 inches at 120 dpi
        assert image.info["Title"] == "fidelity/fetchsgd: sketch fidelity (means since the previous row)"
    elsewhere = plot_fidelity(run, tmp_path / "new" / "figures")
    assert elsewhere.path == tmp_path / "new" / "figures" / FIGURE and elsewhere.path.is_file()
    assert plt.get_fignums() == []  # every figure closed


def test_the_command_says_what_it_wrote_or_why_not(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run(tmp_path)
    assert main([str(run), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert out == (
        f"wrote {tmp_path / 'out' / FIGURE} (3 rows; last row: sketch_recall nan, sketch_rel_error nan, "
        "test_accuracy 0.6250)\n"
    )
    assert main([str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path} has no metrics.jsonl rows\n"


def test_the_commands_help_names_it_and_what_it_draws(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("usage: python -m experiments.analysis.plots_fidelity [-h] [--out OUT] run_dir")
    assert plots_fidelity.__doc__ is not None
    assert f"run_dir {plots_fidelity.__doc__.splitlines()[0]} positional arguments:" in out  # its first line only
    assert "run_dir a run folder written with diagnose-sketch, e.g. runs/fidelity/fetchsgd " in out
    assert out.endswith("--out OUT where to write the figure (default: the run folder)")
