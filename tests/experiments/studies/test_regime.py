"""The regime map's reader and figure (experiments/studies/regime.py), on run folders written here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from experiments.studies import regime

D = 100_000


def write_run(folder: Path, settings: dict[str, Any], recalls: list[tuple[float, int]], accuracy: float) -> None:
    """A finished run: config.json and one metrics row per (recall, rounds it averages)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model": "mlp", "dataset": "synthetic", **settings}))
    rows, clients, done = [], 10, 0
    for recall, rounds in recalls:
        done += rounds
        row = {
            "round": done,
            "strategy": settings["strategy"],
            "seed": 0,
            "test_accuracy": accuracy,
            "clients": clients * rounds,
            "dense_upload_bytes": 4 * D * clients * rounds + 64 * clients * rounds,
            "cum_dense_upload_bytes": 4 * D * clients * done,
            "cum_upload_bytes": 4 * D * clients * done // 11,
        }
        if settings["strategy"] == "fetchsgd":
            row |= {"sketch_recall": recall, "sketch_rounds": rounds}
        rows.append(row)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture()
def runs(tmp_path: Path) -> Path:
    exp = tmp_path / "regime-a"
    for cols in (3_000, 10_000):
        write_run(
            exp / "fetchsgd" / f"cols{cols}-k1000",
            {"strategy": "fetchsgd", "k": 1000, "sketch-rows": 3, "sketch-cols": cols},
            [(0.9, 5), (0.3, 15)],
            accuracy=0.70,
        )
    write_run(exp / "true_topk" / "k1000", {"strategy": "true_topk", "k": 1000}, [(0.0, 20)], accuracy=0.75)
    write_run(
        tmp_path / "regime-b" / "fetchsgd" / "rows1-cols3000",
        {"strategy": "fetchsgd", "k": 1000, "sketch-rows": 1, "sketch-cols": 3000},
        [(0.1, 20)],
        accuracy=0.6,
    )
    write_run(
        tmp_path / "other" / "fetchsgd",
        {"strategy": "fetchsgd", "k": 5, "sketch-rows": 3, "sketch-cols": 5},
        [(1.0, 1)],
        accuracy=0.1,
    )
    return tmp_path


def test_points_pair_fetchsgd_with_true_topk_at_the_same_k(runs: Path) -> None:
    points = regime.collect(runs)
    assert len(points) == 3  # the experiment not named regime-* is left out
    a = sorted((p for p in points if p.run.experiment == "regime-a"), key=lambda p: p.cols_per_k)
    assert [p.cols_per_k for p in a] == [3.0, 10.0]
    assert a[0].run.d == pytest.approx(D, rel=1e-3) and a[0].k_fraction == pytest.approx(0.01, rel=1e-3)
    assert a[0].run.mean_recall == pytest.approx((0.9 * 5 + 0.3 * 15) / 20)  # weighted by the rounds each row averages
    assert a[0].gap == pytest.approx(-5.0) and a[0].run.upload_compression == pytest.approx(11, rel=1e-3)
    (b,) = (p for p in points if p.run.experiment == "regime-b")
    assert b.topk_accuracy is None and b.gap is None  # no true top-k run in its experiment


def test_the_figure_and_table_are_written(runs: Path, tmp_path: Path) -> None:
    points = regime.collect(runs)
    path = regime.draw(points, tmp_path / "out")
    assert path.name == regime.FIGURE and path.stat().st_size > 10_000
    table = regime.table(points)
    assert (
        "| regime-a | mlp 0.10M (synthetic) | 1,000 (1.00%) | 3 x 3,000 | 3 | 11.0x | 0.450 | 0.300 | 0.7000 | 0.7500 | -5.0 |"
        in table
    )


def test_no_regime_runs_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert regime.main([str(tmp_path)]) == 2
    assert f"no finished FetchSGD runs under {tmp_path}/regime-*" in capsys.readouterr().err
