"""Experiment files: expansion into runs, validation before anything starts, skipping finished runs."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from experiments.running import runner
from fedsketch.config import ConfigError, RunConfig
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


def _default(tmp_path: Path, **overrides: object) -> RunConfig:
    settings = {"out-dir": str(tmp_path), "num-rounds": 2, **overrides}
    return runner.load_experiment(runner.DEFAULT_CONFIG, settings, strategies=["fetchsgd"]).runs[0]


def test_an_experiment_file_that_is_not_there_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as caught:
        runner.load_experiment(tmp_path / "none.toml")
    assert str(caught.value) == f"experiment config {tmp_path / 'none.toml'} not found"
    with pytest.raises(FileNotFoundError) as caught:
        runner.load_experiment(tmp_path)
    assert str(caught.value) == f"experiment config {tmp_path} not found (it is a folder)"


def test_a_value_may_hold_an_equals_sign() -> None:
    assert runner.parse_overrides(["experiment=a=b"]) == {"experiment": "a=b"}


def test_without_compare_the_run_tables_strategy_runs_with_the_seeds_asked_for(tmp_path: Path) -> None:
    path = _write(tmp_path, "[run]\nstrategy = 'fedavg'\n")
    assert [(r.strategy, r.seed) for r in runner.load_experiment(path).runs] == [("fedavg", 0)]
    assert [r.seed for r in runner.load_experiment(path, seeds=3).runs] == [0, 1, 2]
    two = _write(tmp_path, "[compare]\nseeds = 2\n")
    assert [(r.strategy, r.seed) for r in runner.load_experiment(two, seeds=1).runs] == [("fetchsgd", 0)]


@pytest.mark.parametrize(
    ("seeds", "file", "message"),
    [
        (True, "", "seeds must be a whole number; got True"),
        ("two", "", "seeds must be a whole number; got 'two'"),
        (0, "", "seeds must be at least 1; got 0"),
        (None, "[compare]\nseeds = 1.5\n", "{path}: [compare] seeds must be a whole number; got 1.5"),
        (None, "[compare]\nseeds = 0\n", "{path}: [compare] seeds must be at least 1; got 0"),
    ],
    ids=["bool", "string", "zero", "file float", "file zero"],
)
def test_a_seed_count_that_is_not_a_whole_number_of_one_or_more_is_refused_naming_where_it_came_from(
    tmp_path: Path, seeds: object, file: str, message: str
) -> None:
    path = _write(tmp_path, file)
    with pytest.raises(ConfigError) as caught:
        runner.load_experiment(path, seeds=seeds)  # type: ignore[arg-type]  # what a notebook may pass
    assert str(caught.value) == message.format(path=path)


def test_a_strategy_table_is_checked_against_the_settings_its_runs_will_have(tmp_path: Path) -> None:
    """The command line reaches the tables of the strategies run now; the file's [run] reaches every table."""
    path = _write(tmp_path, "[run]\nnum-clients = 50\n[strategy.fedavg]\nclients-per-round = 80\n")
    with pytest.raises(ConfigError, match=r"'clients-per-round' \(80\) exceeds 'num-clients' \(50\)"):
        runner.load_experiment(path, strategies=["fetchsgd"])  # fedavg's table is checked though not run
    (run,) = runner.load_experiment(path, {"num-clients": 200}, strategies=["fedavg"]).runs
    assert (run.num_clients, run.clients_per_round) == (200, 80)
    with pytest.raises(ConfigError, match=r"'clients-per-round' \(80\) exceeds 'num-clients' \(50\)"):
        runner.load_experiment(path, {"num-clients": 200}, strategies=["fetchsgd"])  # not fedavg's runs


SWEPT = "[run]\nnum-rounds = 2\n[compare]\nstrategies = ['fetchsgd', 'fedavg']\n[sweep]\nk = [20, 30]\nsketch-cols = [300]\n"


def test_a_sweep_gives_each_point_its_own_experiment_name_and_runs(tmp_path: Path) -> None:
    runs = runner.load_experiment(_write(tmp_path, SWEPT), seeds=2).runs
    named = [(r.strategy, r.experiment, r.k, r.sketch_cols, r.seed) for r in runs]
    assert named == [
        ("fetchsgd", "default/k20-cols300", 20, 300, 0),
        ("fetchsgd", "default/k20-cols300", 20, 300, 1),
        ("fetchsgd", "default/k30-cols300", 30, 300, 0),
        ("fetchsgd", "default/k30-cols300", 30, 300, 1),
        ("fedavg", "default", runs[-1].k, runs[-1].sketch_cols, 0),
        ("fedavg", "default", runs[-1].k, runs[-1].sketch_cols, 1),
    ]
    assert runner.describe(runs[1]) == "fetchsgd k20-cols300 seed 1" and runner.describe(runs[-1]) == "fedavg seed 1"


@pytest.mark.parametrize(
    ("extra", "overrides", "message"),
    [
        ("[sweep]\nqsgd-levels = [3]\n", {}, "{path}: [sweep] key 'qsgd-levels' is used only by qsgd, none of which"),
        ("[sweep]\nkk = [3]\n", {}, "{path}: [sweep] key 'kk' cannot be swept"),
        (
            "[sweep]\nk = [20, 30]\n",
            {"k": 40},
            "{path}: ['k'] swept in [sweep] and also set on the command line; drop one",
        ),
        ("[run]\nexperiment = 'a/b'\n[sweep]\nk = [20]\n", {}, "experiment name 'a/b' must not contain '/'"),
    ],
    ids=["no strategy", "unknown", "also set", "experiment name"],
)
def test_a_sweep_that_cannot_run_is_refused_naming_the_file(
    tmp_path: Path, extra: str, overrides: dict, message: str
) -> None:
    path = _write(tmp_path, extra)
    with pytest.raises(ConfigError) as caught:
        runner.load_experiment(path, overrides)
    assert str(caught.value).startswith(message.format(path=path)), caught.value


def test_a_checkpoint_of_other_settings_is_refused_or_deleted_only_when_told(tmp_path: Path) -> None:
    same, other = _default(tmp_path / "a"), _default(tmp_path / "b")
    for cfg in (same, other):
        path = runner.prepare(cfg)
        runlog.write_config(cfg, path)
        (path / runlog.CHECKPOINT).write_bytes(b"after round 1")
    changed = RunConfig.from_mapping({"lr": 0.5, "k": 60}, base=other)
    plain = _default(tmp_path / "c")
    runlog.write_config(RunConfig.from_mapping({"lr": 0.5}, base=plain), runner.prepare(plain))  # no checkpoint
    with pytest.raises(ConfigError) as caught:
        runner.check_resumes([same, plain, changed])
    assert str(caught.value) == (
        f"{runlog.run_dir(changed)} holds a checkpoint of a run with other settings ('k' 3000 -> 60; 'lr' 0.3 -> 0.5): "
        "set them back to resume it, choose another --out, or add --restart to delete it and start over"
    )
    assert runner.check_resumes([same, plain, changed], restart=True) == [changed]
    assert not runlog.run_dir(changed).exists() and (runlog.run_dir(same) / runlog.CHECKPOINT).exists()
    assert runner.check_resumes([same, plain, changed]) == []


def test_the_run_config_flower_reads_holds_every_setting(tmp_path: Path) -> None:
    cfg = RunConfig.from_mapping({"experiment": "tab\there", "secure-aggregation": True}, base=_default(tmp_path))
    path = runner.prepare(cfg)
    written = tomllib.loads((path / "run_config.toml").read_text(encoding="utf-8"))
    assert written == cfg.to_mapping() and written["secure-aggregation"] is True and written["diagnose-sketch"] is False
    assert runner.run_config_toml(cfg).count("\n") == len(cfg.to_mapping())


def test_each_run_ends_with_what_happened_to_it(tmp_path: Path) -> None:
    runs = [_default(tmp_path, seed=s) for s in range(4)]

    def execute(cfg: RunConfig, path: Path) -> int:
        runlog.write_config(cfg, path)
        rounds = {0: 2, 1: 1, 2: 0, 3: 2}[cfg.seed]
        for rnd in range(1, rounds + 1):
            runlog.append_metrics(path, {"round": rnd, "strategy": cfg.strategy})
        if cfg.seed == 3:
            runlog.mark_server_done(path, cfg.num_rounds, broken="the model holds NaN")
        return 3 if cfg.seed == 2 else 0

    assert [outcome for _, outcome in runner.run_all(runs, execute)] == [
        "finished",
        "failed: stopped before its last round (Flower exited 0)",
        "failed (exit code 3)",
        "failed: the model holds NaN",
    ]
