"""The paper-shape benchmark (experiments/bench/bench_paper.py): its stand-in data, its runs, and its table."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from experiments.bench import bench_paper
from fedsketch.data.run import load_data


def test_the_standin_has_cifars_shape_and_every_client_gets_five_images_of_one_class(tmp_path: Path) -> None:
    arrays = bench_paper.standin(500, 100, seed=3)
    assert arrays["x_train"].shape == (500, 3, 32, 32) and arrays["x_train"].dtype == np.float32
    assert np.bincount(arrays["y_train"]).tolist() == [50] * 10
    # the classes differ by their templates: far more than what the noise leaves in a mean of 50 images (~0.16)
    means = np.stack([arrays["x_train"][arrays["y_train"] == c].mean(0) for c in range(10)])
    assert min(float(np.abs(means[a] - means[b]).mean()) for a in range(10) for b in range(a)) > 0.4
    np.testing.assert_array_equal(bench_paper.standin(500, 100, seed=3)["x_test"], arrays["x_test"])

    cfg = bench_paper.paper_config(bench_paper.write_standin(tmp_path, 100, 5), 2, 0, tmp_path, small=True)
    cfg = type(cfg).from_mapping({**cfg.to_mapping(), "num-clients": 100})
    data = load_data(cfg)
    assert len(data.client_indices) == 100
    for cid in range(100):
        _, y = data.client_data(cid)
        assert len(y) == 5 and len(set(y.tolist())) == 1


def test_the_paper_config_is_issue_17s_run() -> None:
    cfg = bench_paper.paper_config(Path("x.npz"), 2400, 100, Path("out"))
    assert (cfg.num_clients, cfg.clients_per_round, cfg.samples_per_client, cfg.classes_per_client) == (
        10000,
        100,
        5,
        1,
    )
    assert (cfg.model, cfg.model_norm, cfg.sketch_rows, cfg.sketch_cols, cfg.k) == (
        "resnet9",
        "group",
        5,
        500000,
        50000,
    )
    assert (cfg.eval_every, cfg.client_batching, cfg.strategy) == (100, 100, "fetchsgd")


@pytest.mark.slow
def test_the_small_benchmark_runs_both_sides_and_prints_their_rows(capsys: pytest.CaptureFixture[str]) -> None:
    bench_paper.main(["--small", "--rounds", "2", "--batching", "4"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith(("| loop", "| Flower"))]
    assert [r.split("|")[1].strip() for r in rows] == ["loop, client-batching 4", "Flower, client-batching 4"]
    for r in rows:
        clients_per_s = float(r.split("|")[3].replace(",", ""))
        assert clients_per_s > 0
    assert rows[0].split("|")[4].strip() == "1.00"  # the loop against itself
    assert "200 clients of 5 generated 32x32x3 images" in out
