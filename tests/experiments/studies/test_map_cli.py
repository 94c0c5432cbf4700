"""The shared command line of the maps over finished runs (experiments/studies/map_cli.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.studies import map_cli


def _draw(found: list[int], folder: Path) -> Path:
    path = folder / "demo.png"
    path.write_bytes(bytes(found))
    return path


def _collect(runs: Path) -> list[int]:
    if not (runs / "demo-a").exists():
        raise FileNotFoundError(f"no demo-* experiments in {runs}")
    return [1, 2, 3]


def test_it_prints_the_table_and_draws_into_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "demo-a").mkdir()
    out = tmp_path / "figures"
    out.mkdir()
    code = map_cli.run([str(tmp_path), "--out", str(out)], "demo", "d", _collect, lambda f: f"rows {f}", _draw, "runs")
    assert code == 0
    assert (out / "demo.png").read_bytes() == bytes([1, 2, 3])
    assert capsys.readouterr().out == f"rows [1, 2, 3]\n\nwrote {out / 'demo.png'} (3 runs)\n"


def test_without_out_it_draws_into_the_runs_folder(tmp_path: Path) -> None:
    (tmp_path / "demo-a").mkdir()
    assert map_cli.run([str(tmp_path)], "demo", "d", _collect, str, _draw, "runs") == 0
    assert (tmp_path / "demo.png").exists()


def test_missing_runs_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert map_cli.run([str(tmp_path)], "demo", "d", _collect, str, _draw, "runs") == 2
    assert capsys.readouterr().err == f"error: no demo-* experiments in {tmp_path}\n"
