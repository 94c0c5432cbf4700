"""The participation map's reader, table and figure, on run folders written here.

The code: ``experiments/studies/participation.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.studies import participation
from tests.run_folders import two_methods, write_seed


@pytest.fixture()
def runs(tmp_path: Path) -> Path:
    two_methods(tmp_path / "participation-text-p1")
    write_seed(tmp_path / "participation-text-p25" / "fedavg", "fedavg", 0, [(100, 100, 0.8)])
    write_seed(tmp_path / "regime-mlp" / "fetchsgd", "fetchsgd", 0, [(1, 1, 0.1)])  # not a participation cell
    return tmp_path


def test_cells_are_found_by_name_and_ordered(runs: Path) -> None:
    cells = participation.collect(runs)
    assert [(c.model, c.times) for c in cells] == [("text", 1), ("text", 25)]
    assert [e.name for e in cells[0].comparison.entries] == ["FetchSGD", "local top-k, stateless"]


def test_table_and_figure(runs: Path, tmp_path: Path) -> None:
    cells = participation.collect(runs)
    text = participation.table(cells)
    assert "| text | ~1x | FetchSGD | 2 | 0.9100 (0.9000-0.9200) | 300 MB | 0.3100 (0.3000-0.3200) | 300 MB |" in text
    assert "| text | ~1x | 122 MB | 0.8190 | local top-k, stateless | FetchSGD |" in text
    path = participation.draw(cells, tmp_path / "fig")
    assert path.name == "participation.png" and path.stat().st_size > 10_000


def test_cli_without_cells_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert participation.main([str(tmp_path)]) == 2
    assert "no participation-<model>-p<times> experiment" in capsys.readouterr().err


def test_a_variant_cell_is_its_own_row(runs: Path) -> None:
    two_methods(runs / "participation-text-p1-init")
    cells = participation.collect(runs)
    assert [(c.row, c.times) for c in cells] == [
        ("text", 1),
        ("text", 25),
        ("text, downloads from the initial model", 1),
    ]
    assert "| text, downloads from the initial model | ~1x | FetchSGD |" in participation.table(cells)


def test_a_cell_without_metrics_yet_is_left_out(runs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (runs / "participation-text-p5" / "fetchsgd").mkdir(parents=True)
    assert [(c.model, c.times) for c in participation.collect(runs)] == [("text", 1), ("text", 25)]
    assert "participation-text-p5 has no metrics yet" in capsys.readouterr().err


def test_a_seed_still_running_is_left_out(runs: Path) -> None:
    write_seed(runs / "participation-text-p1" / "fetchsgd" / "seed2", "fetchsgd", 2, [(50, 50, 0.1)])  # round 5 of 15
    fetch = participation.collect(runs)[0].comparison.entries[0]
    assert fetch.name == "FetchSGD" and fetch.seeds == 2


def test_a_joined_variant_is_compared_beside_its_base_cell(runs: Path) -> None:
    """``-matched`` runs (local top-k at a larger k) join every method of their base cell, labelled apart."""
    write_seed(runs / "participation-text-p1-matched" / "local_topk" / "errornone", "local_topk", 0, [(200, 200, 0.95)])
    cells = participation.collect(runs)
    joined = next(c for c in cells if c.variant == "matched")
    assert [e.name for e in joined.comparison.entries] == [
        "FetchSGD",
        "local top-k, stateless",
        "local top-k, stateless, FetchSGD's upload",
    ]
    assert joined.comparison.target == pytest.approx(0.9 * 0.95)  # the joined run sets the cell's target
    assert next(c for c in cells if c.variant == "" and c.times == 1).comparison.target < joined.comparison.target
