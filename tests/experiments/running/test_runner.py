"""Experiment files: expansion into runs, validation before anything starts, skipping finished runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from experiments.running import runner
from fedsketch.config import ConfigError
from fedsketch.server import checkpoint, runlog


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_default_config_is_valid_and_compares_fetchsgd_with_local_topk_and_fedavg() -> None:
    exp = runner.load_experiment(runner.DEFAULT_CONFIG)
    assert [r.strategy for r in exp.runs] == ["fetchsgd", "local_topk", "fedavg"]
    fetch, local, dense = exp.runs
    assert (fetch.lr, local.lr, dense.lr, local.k) == (0.3, 0.1, 0.1, 17_000)


def test_strategies_times_seeds_with_per_strategy_and_command_line_overrides(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
[run]
num-rounds = 7
lr = 0.5
[compare]
strategies = ["fetchsgd", "fedavg"]
seeds = 2
[strategy.fedavg]
lr = 0.05
""",
    )
    exp = runner.load_experiment(path, overrides=runner.parse_overrides(["num-rounds=3", "k=10"]))
    assert [(r.strategy, r.seed, r.num_rounds, r.lr, r.k) for r in exp.runs] == [
        ("fetchsgd", 0, 3, 0.5, 10),
        ("fetchsgd", 1, 3, 0.5, 10),
        ("fedavg", 0, 3, 0.05, 10),
        ("fedavg", 1, 3, 0.05, 10),
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[run]\nsketch-colz = 3\n", "unknown setting 'sketch-colz'"),
        ("[runs]\n", r"unknown table\(s\) \['runs'\]"),
        ("[compare]\nstrategy = ['fedavg']\n", r"unknown key\(s\) \['strategy'\] in \[compare\]"),
        ("[strategy.fedavg]\nlr = 'fast'\n", "setting 'lr' must be of type float"),
        ("[compare]\nstrategies = ['fetchsgd', 'fedsgd']\n", "setting 'strategy' must be one of"),
    ],
)
def test_mistakes_stop_before_any_run(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        runner.load_experiment(_write(tmp_path, text))


def test_overrides_parse_toml_values_and_bare_words() -> None:
    assert runner.parse_overrides(["k=5", "lr=0.5", "dataset=mnist", "momentum-zeroing=false"]) == {
        "k": 5,
        "lr": 0.5,
        "dataset": "mnist",
        "momentum-zeroing": False,
    }
    with pytest.raises(ConfigError, match="not of the form key=value"):
        runner.parse_overrides(["k"])


def test_finished_runs_are_skipped_and_unfinished_ones_restarted(tmp_path: Path) -> None:
    exp = runner.load_experiment(
        runner.DEFAULT_CONFIG, {"out-dir": str(tmp_path), "num-rounds": 2}, strategies=["fetchsgd", "fedavg"]
    )
    calls: list[str] = []

    def fake_flower(cfg, path):  # type: ignore[no-untyped-def]
        calls.append(cfg.strategy)
        runlog.write_config(cfg, path)
        for rnd in (1, 2):
            runlog.append_metrics(path, {"round": rnd, "strategy": cfg.strategy})
        return 0

    assert [o for _, o in runner.run_all(exp.runs, fake_flower)] == ["finished", "finished"]
    assert [o for _, o in runner.run_all(exp.runs, fake_flower)] == ["already finished", "already finished"]
    fedavg_dir = runlog.run_dir(exp.runs[1])
    (fedavg_dir / "metrics.jsonl").write_text(json.dumps({"round": 1}) + "\n")  # interrupted after round 1
    assert [o for _, o in runner.run_all(exp.runs, fake_flower)] == ["already finished", "finished"]
    assert calls == ["fetchsgd", "fedavg", "fedavg"]
    assert len(runlog.read_metrics(fedavg_dir)) == 2


def test_a_run_that_starts_again_does_not_inherit_the_last_attempts_server_done_mark(tmp_path: Path) -> None:
    """The launcher stops Flower as soon as the mark appears: a stale one would end the new attempt at once."""
    overrides = {"out-dir": str(tmp_path), "num-rounds": 2, "checkpoint-every": 1}
    cfg = runner.load_experiment(runner.DEFAULT_CONFIG, overrides, strategies=["fetchsgd"]).runs[0]
    path = runner.prepare(cfg)
    runlog.write_config(cfg, path)
    runlog.append_metrics(path, {"round": 1, "strategy": cfg.strategy})
    (path / checkpoint.FILE).write_bytes(b"a checkpoint after round 1")
    runlog.mark_server_done(path, cfg.num_rounds)
    assert runlog.server_done(path)
    assert json.loads((path / runlog.SERVER_DONE).read_text())["round"] == 1
    assert runner.is_resumable(cfg)  # its folder is kept: the mark must go by itself
    assert not runlog.server_done(runner.prepare(cfg))
