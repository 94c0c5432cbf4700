"""Sweeps, plots and the report, end to end on a tiny sweep run by the real runner and real strategies.

Each run goes through :func:`experiments.running.runner.run_all` as ``fedsketch run`` does;
only Flower's transport is replaced: the run config is read back from the
``run_config.toml`` the runner wrote, and the ServerApp's strategy is driven
with the real ClientApp in process (``experiments.running.inprocess_grid.InProcessGrid``). Every
number the figures and the report show is then recomputed here from the
``metrics.jsonl`` files, independently of ``experiments/analysis/results.py``.
"""

from __future__ import annotations

import csv
import itertools
import json
import tomllib
from pathlib import Path
from typing import cast

import numpy as np
import pytest
from flwr.serverapp import Grid

from bridge.flower import task_identity
from experiments.analysis.plots import PARETO, plot_experiment
from experiments.analysis.report import write_report
from experiments.analysis.results import RunGroup, bytes_to_target, pareto_front, reach, summarize
from experiments.cli import main as fedsketch_main
from experiments.running import runner
from fedsketch.config import ConfigError, RunConfig
from fedsketch.server import runlog
from strategies.server_app import build_strategy
from tests.federation import TestGrid

SWEEP = """
[run]
experiment = "tiny"
num-clients = 12
clients-per-round = 4
model-hidden = 16
num-rounds = 4
eval-every = 2
local-batch-size = 16
sketch-rows = 3
k = 100
lr = 0.3

[compare]
strategies = ["fetchsgd", "fedavg", "true_topk"]
seeds = 2

[strategy.fedavg]
lr = 0.1

[sweep]
sketch-cols = [100, 300]
k = [20, 60]
"""
GROUPS = {  # run group label -> its folder (seed 0; seed 1 is <folder>/seed1)
    **{f"fetchsgd cols{c}-k{k}": f"fetchsgd/cols{c}-k{k}" for c, k in itertools.product((100, 300), (20, 60))},
    "true_topk k20": "true_topk/k20",
    "true_topk k60": "true_topk/k60",
    "fedavg": "fedavg",
}


def _in_process(cfg: RunConfig, path: Path) -> int:
    """What the ServerApp does with the run config the runner wrote, minus Flower's transport."""
    with open(path / "run_config.toml", "rb") as f:
        read_back = RunConfig.from_mapping(tomllib.load(f))
    assert read_back == cfg
    strategy = build_strategy(read_back, runlog.run_dir(read_back))
    with task_identity():
        strategy.start(cast(Grid, TestGrid(read_back.to_mapping(), num_nodes=2)))  # the part of Grid used
    return 0


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> tuple[runner.Experiment, Path]:
    """The tiny sweep, run once for the whole module: 7 run groups x 2 seeds."""
    tmp = tmp_path_factory.mktemp("sweep")
    (tmp / "sweep.toml").write_text(SWEEP, encoding="utf-8")
    experiment = runner.load_experiment(tmp / "sweep.toml", {"out-dir": str(tmp / "runs")})
    outcomes = runner.run_all(experiment.runs, _in_process)
    assert [o for _, o in outcomes] == ["finished"] * 14
    return experiment, tmp / "runs" / "tiny"


def _seed_rows(exp_dir: Path) -> dict[str, list[list[dict]]]:
    """Run group label -> the metrics rows of seed 0 and seed 1, read straight from the files."""
    out = {}
    for label, folder in GROUPS.items():
        files = [exp_dir / folder / "metrics.jsonl", exp_dir / folder / "seed1" / "metrics.jsonl"]
        out[label] = [[json.loads(line) for line in f.read_text().splitlines()] for f in files]
    return out


def _front(points: dict[str, tuple[float, float]]) -> set[str]:
    """Brute force: the labels whose (bytes, accuracy) no other point beats on one and matches on the other."""
    return {
        a
        for a, (ba, ya) in points.items()
        if not any(bb <= ba and yb >= ya and (bb, yb) != (ba, ya) for bb, yb in points.values())
    }


def test_every_sweep_point_has_its_own_folder_and_finished_runs_are_not_redone(
    finished: tuple[runner.Experiment, Path],
) -> None:
    experiment, exp_dir = finished
    assert sorted(runner.describe(cfg) for cfg in experiment.runs)[:2] == [
        "fedavg seed 0",
        "fedavg seed 1",
    ]
    for label, folder in GROUPS.items():
        for seed, path in enumerate((exp_dir / folder, exp_dir / folder / "seed1")):
            config = json.loads((path / "config.json").read_text())
            assert (config["seed"], config["strategy"]) == (seed, label.split()[0])
            if label.startswith("fetchsgd"):  # the swept values are the ones the run used
                assert f"cols{config['sketch-cols']}-k{config['k']}" == folder.split("/")[1]
            assert runlog.read_metrics(path)[-1]["round"] == 4
    rows = _seed_rows(exp_dir)
    upload = {label: seeds[0][-1]["cum_upload_bytes"] for label, seeds in rows.items()}
    assert upload["fetchsgd cols100-k20"] < upload["fetchsgd cols300-k20"] < upload["fedavg"]
    assert upload["true_topk k20"] == upload["true_topk k60"] == upload["fedavg"]  # dense uploads
    assert [o for _, o in runner.run_all(experiment.runs, _in_process)] == ["already finished"] * 14


def test_figures_hold_one_series_per_run_group_as_recomputed_from_the_metrics(
    finished: tuple[runner.Experiment, Path],
) -> None:
    _, exp_dir = finished
    rows = _seed_rows(exp_dir)
    plots = {p.path.name: p for p in plot_experiment(exp_dir)}
    names = ["accuracy_vs_rounds.png", "accuracy_vs_upload_bytes.png", "accuracy_vs_total_bytes.png", f"{PARETO}.png"]
    assert sorted(plots) == sorted(names)
    assert all((exp_dir / name).stat().st_size > 0 for name in names)
    x_of = {
        "accuracy_vs_rounds.png": lambda r: r["round"],
        "accuracy_vs_upload_bytes.png": lambda r: r["cum_upload_bytes"],
        "accuracy_vs_total_bytes.png": lambda r: r["cum_upload_bytes"] + r["cum_download_bytes"],
    }
    for name, get_x in x_of.items():
        assert set(plots[name].curves) == set(GROUPS)
        for label, seeds in rows.items():
            acc = np.array([[r["test_accuracy"] for r in s] for s in seeds])
            c = plots[name].curves[label]
            np.testing.assert_allclose(c.x, np.mean([[get_x(r) for r in s] for s in seeds], axis=0))
            np.testing.assert_allclose(c.mean, acc.mean(axis=0))
            np.testing.assert_allclose(c.low, acc.min(axis=0))
            np.testing.assert_allclose(c.high, acc.max(axis=0))
    pareto = plots[f"{PARETO}.png"]
    finals = {
        label: (np.mean([s[-1]["cum_upload_bytes"] for s in seeds]), np.mean([s[-1]["test_accuracy"] for s in seeds]))
        for label, seeds in rows.items()
    }
    assert set(pareto.curves) == set(finals)
    for label, c in pareto.curves.items():
        assert (float(c.x[0]), float(c.mean[0])) == pytest.approx(finals[label])
    assert set(pareto.front) == _front(finals)
    assert [finals[label][0] for label in pareto.front] == sorted(finals[label][0] for label in pareto.front)


def test_report_numbers_equal_those_recomputed_from_the_metrics(finished: tuple[runner.Experiment, Path]) -> None:
    _, exp_dir = finished
    rows = _seed_rows(exp_dir)
    reached = sorted(r["test_accuracy"] for seeds in rows.values() for s in seeds for r in s)[len(GROUPS)]
    targets = [round(reached, 4), 1.0]  # one some runs reach, one none does
    report, markdown = write_report(exp_dir, targets)
    assert (exp_dir / "report.md").read_text() == markdown
    with open(exp_dir / "report.csv", newline="") as f:
        table = {row["run"]: row for row in csv.DictReader(f)}
    assert set(table) == set(GROUPS)
    fedavg_total = np.mean([s[-1]["cum_upload_bytes"] + s[-1]["cum_download_bytes"] for s in rows["fedavg"]])
    for label, seeds in rows.items():
        row, last = table[label], [s[-1] for s in seeds]
        for column, values in {
            "final_accuracy": [r["test_accuracy"] for r in last],
            "upload_bytes": [r["cum_upload_bytes"] for r in last],
            "download_bytes": [r["cum_download_bytes"] for r in last],
            "upload_compression": [r["cum_dense_upload_bytes"] / r["cum_upload_bytes"] for r in last],
        }.items():
            got = [float(row[f"{column}_{stat}"]) for stat in ("mean", "min", "max")]
            assert got == pytest.approx([np.mean(values), min(values), max(values)]), (label, column)
        totals = [r["cum_upload_bytes"] + r["cum_download_bytes"] for r in last]
        assert float(row["total_compression_vs_fedavg"]) == pytest.approx(fedavg_total / np.mean(totals))
        first = [next((r for r in s if r["test_accuracy"] >= targets[0]), None) for s in seeds]
        assert int(row[f"seeds_reaching_{targets[0]:g}"]) == sum(r is not None for r in first)
        if all(r is not None for r in first):
            ups = [r["cum_upload_bytes"] for r in first if r is not None]
            assert float(row[f"upload_bytes_to_{targets[0]:g}_min"]) == min(ups)
            assert float(row[f"upload_bytes_to_{targets[0]:g}_mean"]) == pytest.approx(np.mean(ups))
        else:
            assert row[f"upload_bytes_to_{targets[0]:g}_mean"] == ""
            assert f"not reached ({sum(r is not None for r in first)}/2 seeds)" in markdown
        assert row["upload_bytes_to_1_mean"] == row["total_bytes_to_1_mean"] == ""
        assert row["seeds_reaching_1"] == "0"
    finals = {
        label: (float(table[label]["upload_bytes_mean"]), float(table[label]["final_accuracy_mean"])) for label in table
    }
    assert {label for label in table if table[label]["pareto_front"] == "True"} == _front(finals) == set(report.front)
    listed = markdown.split("## Pareto front")[1]
    assert [line.split(". ", 1)[1].split(":")[0] for line in listed.splitlines() if line[:1].isdigit()] == list(
        report.front
    )


def test_report_command_prints_the_markdown_with_the_default_target_stated(
    finished: tuple[runner.Experiment, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, exp_dir = finished
    assert fedsketch_main(["report", str(exp_dir)]) == 0
    printed = capsys.readouterr().out
    best = max(np.mean([s[-1]["test_accuracy"] for s in seeds]) for seeds in _seed_rows(exp_dir).values())
    assert f"Target accuracy {round(0.9 * best, 4):g}: 90% of the best final accuracy" in printed
    assert printed == (exp_dir / "report.md").read_text()
    assert fedsketch_main(["report", str(exp_dir), "--target", "1.5"]) == 2
    assert "target accuracies must be in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("sweep", "message"),
    [
        ("sketch-colz = [100]", r"\[sweep\] key 'sketch-colz' cannot be swept; sweepable keys: candidate-factor, k,"),
        ("lr = [0.1, 0.3]", r"\[sweep\] key 'lr' cannot be swept"),
        ("k = 20", r"\[sweep\] key 'k' must be a non-empty list"),
        ("k = [20, 20]", r"\[sweep\] key 'k' lists a value twice"),
        (
            "qsgd-levels = [3, 7]",
            r"\[sweep\] key 'qsgd-levels' is used only by qsgd, none of which the experiment runs",
        ),
        ("k = [20, 'many']", "setting 'k' must be of type int"),
    ],
)
def test_sweep_mistakes_are_refused_before_any_run(tmp_path: Path, sweep: str, message: str) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.split("[sweep]")[0] + "[sweep]\n" + sweep + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        runner.load_experiment(path, {"out-dir": str(tmp_path)})
    assert not (tmp_path / "tiny").exists()


def test_an_experiment_name_cannot_pose_as_a_sweep_point(tmp_path: Path) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP.replace('"tiny"', '"tiny/cols100-k20"'), encoding="utf-8")
    with pytest.raises(ConfigError, match="experiment name 'tiny/cols100-k20' must not contain '/'"):
        runner.load_experiment(path)


def test_a_key_both_swept_and_set_on_the_command_line_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP, encoding="utf-8")
    assert fedsketch_main(["run", str(path), "--out", str(tmp_path), "--set", "k=30"]) == 2
    assert "['k'] swept in [sweep] and also set on the command line" in capsys.readouterr().err
    assert not (tmp_path / "tiny").exists()


def test_without_a_sweep_the_layout_is_unchanged() -> None:
    exp = runner.load_experiment(runner.DEFAULT_CONFIG, {"out-dir": "runs", "num-rounds": 2}, seeds=2)
    assert [str(runlog.run_dir(cfg)) for cfg in exp.runs] == [
        "runs/default/fetchsgd",
        "runs/default/fetchsgd/seed1",
        "runs/default/local_topk",
        "runs/default/local_topk/seed1",
        "runs/default/fedavg",
        "runs/default/fedavg/seed1",
    ]


def test_pareto_front_on_hand_made_points() -> None:
    points = [(100, 0.5), (200, 0.7), (150, 0.4), (200, 0.6), (300, 0.7), (50, 0.5), (400, 0.9)]
    assert pareto_front(points) == [5, 1, 6]  # by increasing bytes
    assert pareto_front([(1, 0.5), (1, 0.5), (2, 0.4)]) == [0, 1]  # equal points do not dominate each other
    assert pareto_front([(10, 0.3)]) == [0]
    assert pareto_front([]) == []


def _rows(acc: list[float], up: int = 10, down: int = 5) -> list[dict]:
    return [
        {
            "round": i,
            "strategy": "x",
            "seed": 0,
            "test_accuracy": a,
            "cum_upload_bytes": up * i,
            "cum_download_bytes": down * i,
            "cum_dense_upload_bytes": 4 * up * i,
        }
        for i, a in enumerate(acc, 1)
    ]


def test_bytes_to_target_takes_the_first_evaluated_round_that_reaches_it() -> None:
    rows = _rows([0.3, 0.6, 0.5, 0.8])
    assert bytes_to_target(rows, 0.55) == (20, 30)
    assert bytes_to_target(rows, 0.6) == (20, 30)  # reaching counts
    assert bytes_to_target(rows, 0.7) == (40, 60)  # not the later dip, not the first round above an earlier one
    assert bytes_to_target(rows, 0.81) is None
    assert bytes_to_target([], 0.1) is None


def test_a_run_group_reaches_a_target_only_if_every_seed_does() -> None:
    both = RunGroup("x", "", (tuple(_rows([0.5, 0.7])), tuple(_rows([0.7, 0.7], up=40))))
    got = reach(summarize(both), 0.6)
    assert got.seeds_reached == 2 and got.upload is not None and got.total is not None
    assert (got.upload.mean, got.upload.low, got.upload.high) == (30, 20, 40)  # round 2 of seed 0, round 1 of seed 1
    assert (got.total.low, got.total.high) == (30, 45)
    missed = reach(summarize(RunGroup("x", "", (tuple(_rows([0.5, 0.7])), tuple(_rows([0.5, 0.5]))))), 0.6)
    assert (missed.seeds_reached, missed.upload, missed.total) == (1, None, None)
    assert summarize(both).upload_compression.mean == 4.0
