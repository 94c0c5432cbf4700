"""The setting ``tracking``: each run's metrics rows in TensorBoard event files and an MLflow store, read back
with TensorBoard's own reader and MLflow's own client, never by looking at what the writers were called with."""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import re
import shutil
import time
from contextlib import redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from experiments.analysis import tracking
from experiments.cli import main as fedsketch_main
from experiments.running import runner, stopping
from fedsketch.config import RunConfig
from fedsketch.server import runlog

SHORT = ["--set", "num-rounds=2", "--set", "eval-every=1", "--set", "num-clients=20", "--set", "clients-per-round=4"]


def mlflow_client(tracking_uri: str) -> Any:
    """MLflow's own client (imported here: MLflow takes seconds to import, which every test run would pay)."""
    from mlflow.tracking import MlflowClient as Client

    return Client(tracking_uri=tracking_uri)


def event_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series of the one TensorBoard run in ``folder``, as TensorBoard reads it."""
    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def hparams(folder: Path) -> dict[str, Any]:
    """The hyperparameters TensorBoard's HParams tab reads from the run in ``folder``."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(folder))
    acc.Reload()
    data = plugin_data_pb2.HParamsPluginData.FromString(
        acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    )
    values = data.session_start_info.hparams
    return {key: getattr(v, v.WhichOneof("kind")) for key, v in values.items()}


def mlflow_runs(out: Path, experiment: str) -> list[Any]:
    client = mlflow_client(tracking.mlflow_uri(out))
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else client.search_runs([found.experiment_id])


def expected(rows: list[dict[str, Any]]) -> dict[str, list[tuple[int, float]]]:
    """What each tag must hold: every numeric field at step = round, the byte-stepped accuracy."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for key, value in row.items():
            if key not in ("round", "seed", "unix_time", "strategy"):
                out.setdefault(key, []).append((row["round"], float(value)))
        total = row["cum_upload_bytes"] + row["cum_download_bytes"]
        out.setdefault("cum_total_bytes", []).append((row["round"], float(total)))
        out.setdefault("test_accuracy_by_upload_bytes", []).append((row["cum_upload_bytes"], row["test_accuracy"]))
        out.setdefault("test_accuracy_by_total_bytes", []).append((total, row["test_accuracy"]))
    return out


def _row(rnd: int, strategy: str) -> dict[str, Any]:
    return {
        "round": rnd,
        "strategy": strategy,
        "seed": 0,
        "test_accuracy": 0.1 * rnd + 0.0123456789,
        "cum_upload_bytes": 123_456_789 * rnd,  # beyond float32's exact integers: the byte steps stay exact
        "cum_download_bytes": 1_000 * rnd,
        "clients": 4,
        "wall_s": 1.5 * rnd,
        "unix_time": 1_790_000_000.25 + rnd,
    }


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An MLflow store with its tables made: making them takes seconds, once per new out-dir."""
    folder = tmp_path_factory.mktemp("store")
    mlflow_client(tracking.mlflow_uri(folder)).search_experiments()
    return folder / tracking.MLFLOW_DB


@pytest.fixture
def out(tmp_path: Path, empty_store: Path) -> Path:
    """A results folder whose MLflow store exists but holds no run yet."""
    shutil.copyfile(empty_store, tmp_path / tracking.MLFLOW_DB)
    return tmp_path


def _experiment(out: Path, value: str, strategies: list[str] | None = None) -> runner.Experiment:
    overrides = {"out-dir": str(out), "num-rounds": 2, "tracking": value}
    return runner.load_experiment(runner.DEFAULT_CONFIG, overrides, strategies=strategies or ["fetchsgd"])


def _runs_written_by_hand(cfg: RunConfig, path: Path) -> int:
    """Stands in for Flower: the run's folder as a finished run leaves it."""
    runlog.write_config(cfg, path)
    for rnd in (1, 2):
        runlog.append_metrics(path, _row(rnd, cfg.strategy))
    return 0


def test_rows_reach_both_stores_with_their_values_and_byte_steps(out: Path) -> None:
    exp = _experiment(out, "both", ["fetchsgd", "fedavg"])
    assert [o for _, o in runner.run_all(exp.runs, _runs_written_by_hand)] == ["finished", "finished"]
    for cfg in exp.runs:
        rows = runlog.read_metrics(runlog.run_dir(cfg))
        want = expected(rows)
        got = event_scalars(tracking.tensorboard_dir(cfg))
        assert sorted(got) == sorted(want)
        for tag, points in want.items():  # TensorBoard keeps float32 values; steps are int64
            assert got[tag] == [(step, float(np.float32(value))) for step, value in points], tag
        assert hparams(tracking.tensorboard_dir(cfg)) == {k: v for k, v in cfg.to_mapping().items() if k != "tracking"}
        (run,) = [r for r in mlflow_runs(out, "default") if r.info.run_name == runner.describe(cfg)]
        assert run.info.status == "FINISHED"
        assert run.data.params == {k: str(v) for k, v in cfg.to_mapping().items() if k != "tracking"}
        client = mlflow_client(tracking.mlflow_uri(out))
        for tag, points in want.items():  # MLflow keeps doubles: exactly the rows' values
            history = client.get_metric_history(run.info.run_id, tag)
            assert [(m.step, m.value) for m in history] == points, tag
        times = [m.timestamp for m in client.get_metric_history(run.info.run_id, "test_accuracy")]
        assert times == [int(r["unix_time"] * 1000) for r in rows]


def test_turning_tracking_on_writes_finished_runs_without_redoing_them(tmp_path: Path, empty_store: Path) -> None:
    calls: list[str] = []

    def flower(cfg: RunConfig, path: Path) -> int:
        calls.append(cfg.strategy)
        return _runs_written_by_hand(cfg, path)

    assert [o for _, o in runner.run_all(_experiment(tmp_path, "none").runs, flower)] == ["finished"]
    assert not (tmp_path / "tensorboard").exists() and not (tmp_path / tracking.MLFLOW_DB).exists()
    shutil.copyfile(empty_store, tmp_path / tracking.MLFLOW_DB)  # the store's tables, made once per module
    exp = _experiment(tmp_path, "both")
    assert [o for _, o in runner.run_all(exp.runs, flower)] == ["already finished"]
    assert calls == ["fetchsgd"]  # not redone
    assert event_scalars(tracking.tensorboard_dir(exp.runs[0]))["test_accuracy"][-1][0] == 2
    (first,) = mlflow_runs(tmp_path, "default")
    runner.run_all(exp.runs, flower)  # already there: not written again
    assert [r.info.run_id for r in mlflow_runs(tmp_path, "default")] == [first.info.run_id]


def test_a_run_redone_replaces_what_it_wrote(out: Path) -> None:
    exp = _experiment(out, "both")
    runner.run_all(exp.runs, _runs_written_by_hand)
    (old,) = mlflow_runs(out, "default")
    path = runlog.run_dir(exp.runs[0])
    (path / "metrics.jsonl").write_text(json.dumps(_row(1, "fetchsgd")) + "\n")  # stopped after round 1: redone
    assert [o for _, o in runner.run_all(exp.runs, _runs_written_by_hand)] == ["finished"]
    (new,) = mlflow_runs(out, "default")  # the earlier one is deleted, not kept beside it
    assert new.info.run_id != old.info.run_id
    assert len(list(tracking.tensorboard_dir(exp.runs[0]).glob("events.out.tfevents.*"))) == 1
    assert [s for s, _ in event_scalars(tracking.tensorboard_dir(exp.runs[0]))["test_accuracy"]] == [1, 2]


def test_a_failed_run_is_marked_failed_and_tracking_none_writes_nothing(out: Path) -> None:
    def fails_after_round_1(cfg: RunConfig, path: Path) -> int:
        runlog.write_config(cfg, path)
        runlog.append_metrics(path, _row(1, cfg.strategy))
        return 1

    (outcome,) = [o for _, o in runner.run_all(_experiment(out, "mlflow").runs, fails_after_round_1)]
    assert outcome.startswith("failed")
    (run,) = mlflow_runs(out, "default")
    assert run.info.status == "FAILED" and not (out / "tensorboard").exists()


def test_a_missing_package_is_refused_before_anything_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else find_spec(name, *a))
    args = ["plan", "--out", str(tmp_path), "--set", "tracking=both"]
    assert fedsketch_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "fedsketch: error: setting 'tracking' is 'both' but mlflow is not installed: pip install 'fedsketch[tracking]'"
    )
    assert fedsketch_main(["plan", "--out", str(tmp_path), *SHORT, "--set", "tracking=tensorboard"]) == 0
    assert not any(tmp_path.iterdir())


def test_a_deployment_kit_refuses_tracking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A kit's runs are started by flwr run on the server: nothing there would write the stores."""
    kit = tmp_path / "kit"
    args = ["deploy", "--kit", str(kit), "--server", "127.0.0.1", "--supernodes", "2"]
    assert fedsketch_main([*args, "--set", "tracking=tensorboard"]) == 2
    assert capsys.readouterr().err.strip() == (
        "fedsketch: error: setting 'tracking' ('tensorboard') is written by fedsketch run and deploy as each run "
        "ends; a kit's runs are started by flwr run on the server, which would ignore it: leave it out of the kit"
    )
    assert not kit.exists()


@pytest.mark.slow
def test_a_two_round_run_writes_what_metrics_jsonl_holds(tmp_path: Path, no_leftover_processes: None) -> None:
    """Real Flower, real writers, read back by TensorBoard's and MLflow's own readers."""
    args = ["run", "--strategies", "fetchsgd", "--no-plot", "--out", str(tmp_path), *SHORT, "--set", "tracking=both"]
    assert fedsketch_main(args) == 0
    cfg = runner.load_experiment(
        runner.DEFAULT_CONFIG,
        {**runner.parse_overrides(SHORT[1::2]), "out-dir": str(tmp_path), "tracking": "both"},
        strategies=["fetchsgd"],
    ).runs[0]
    rows = runlog.read_metrics(runlog.run_dir(cfg))
    assert [r["round"] for r in rows] == [1, 2]
    (event_file,) = tracking.tensorboard_dir(cfg).glob("events.out.tfevents.*")
    got = event_scalars(event_file.parent)
    want = expected(rows)
    assert {tag: got[tag] for tag in want} == {
        tag: [(step, float(np.float32(value))) for step, value in points] for tag, points in want.items()
    }
    (run,) = mlflow_runs(tmp_path, "default")
    assert (run.info.run_name, run.info.status) == ("fetchsgd seed 0", "FINISHED")
    assert run.data.params["k"] == str(cfg.k) and run.data.params["num-rounds"] == "2"
    client = mlflow_client(tracking.mlflow_uri(tmp_path))
    for tag, points in want.items():
        assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag)] == points, tag


def test_a_skipped_run_is_tracked_as_killed_and_the_next_run_goes_on(out: Path) -> None:
    def skips_fetchsgd(cfg: RunConfig, path: Path) -> int:
        runlog.write_config(cfg, path)
        runlog.append_metrics(path, _row(1, cfg.strategy))
        if cfg.strategy == "fetchsgd":
            raise stopping.Skipped(stopping.SKIP_SIGNAL.name)
        runlog.append_metrics(path, _row(2, cfg.strategy))
        return 0

    outcomes = [o for _, o in runner.run_all(_experiment(out, "mlflow", ["fetchsgd", "fedavg"]).runs, skips_fetchsgd)]
    assert outcomes == ["skipped (SIGUSR1) after round 1 of 2", "finished"]
    status = {r.info.run_name: r.info.status for r in mlflow_runs(out, "default")}
    assert status == {"fetchsgd seed 0": "KILLED", "fedavg seed 0": "FINISHED"}


@dataclass(frozen=True)
class ManySettings:
    """A run spec (runlog.RunSpec) with more settings than one MLflow batch takes (100)."""

    out_dir: str
    experiment: str = "default"
    strategy: str = "fetchsgd"
    seed: int = 3
    num_rounds: int = 130
    checkpoint_every: int = 0

    def to_mapping(self) -> dict[str, Any]:
        return {"tracking": "both", **{f"setting-{i:03d}": i for i in range(150)}}


def _raw_events(folder: Path) -> list[Any]:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    (path,) = folder.glob("events.out.tfevents.*")
    return list(EventFileLoader(str(path)).Load())


def test_a_long_run_reaches_both_stores_whole_with_its_times_tags_and_settings(
    out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = ManySettings(str(out))
    folder = runlog.run_dir(spec)
    folder.mkdir(parents=True)
    rows = [_row(rnd, "fetchsgd") for rnd in range(1, 131)]  # 8 values a row: 1,040, two MLflow batches
    for row in rows:
        runlog.append_metrics(folder, row)
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.NOTSET)
    tracking.record(spec, "fetchsgd seed 3", "finished")
    (run,) = mlflow_runs(out, "default")
    board = tracking.tensorboard_dir(spec)
    assert (
        capsys.readouterr().out
        == f"tracking: fetchsgd seed 3 -> {board}, {tracking.mlflow_uri(out)} (run {run.info.run_id})\n"
    )
    assert [logging.getLogger(name).level for name in ("mlflow", "alembic")] == [logging.WARNING] * 2
    start = rows[0]["unix_time"] - rows[0]["wall_s"]
    assert (run.info.start_time, run.info.end_time) == (int(start * 1000), int(rows[-1]["unix_time"] * 1000))
    assert run.info.status == "FINISHED" and run.data.params == {f"setting-{i:03d}": str(i) for i in range(150)}
    assert {k: v for k, v in run.data.tags.items() if k.startswith("fedsketch.")} == {
        "fedsketch.run_dir": str(folder.resolve()),
        "fedsketch.strategy": "fetchsgd",
        "fedsketch.seed": "3",
    }
    client = mlflow_client(tracking.mlflow_uri(out))
    assert client.get_experiment_by_name("default").artifact_location == (out.resolve() / "mlartifacts").as_uri()
    for tag, points in expected(rows).items():
        assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, tag)] == points, tag
    events = _raw_events(board)
    hparams_event = next(e for e in events if e.summary.value and e.summary.value[0].tag.startswith("_hparams_"))
    assert (hparams_event.step, hparams_event.wall_time) == (0, start)
    scalars = [
        (v.tag, e.step, e.wall_time) for e in events for v in e.summary.value if not v.tag.startswith("_hparams_")
    ]
    assert scalars == [(tag, step, time) for tag, step, _, time in tracking.series(rows)]
    assert hparams(board)["setting-149"] == 149.0
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = hparams_event.summary.value[0].metadata.plugin_data.content
    assert plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.start_time_secs == start


def test_a_run_already_written_is_left_as_it_is_and_a_run_redone_is_written_anew(
    out: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exp = _experiment(out, "both")
    runner.run_all(exp.runs, _runs_written_by_hand)
    board = tracking.tensorboard_dir(exp.runs[0])
    (first,) = board.glob("events.out.tfevents.*")
    capsys.readouterr()
    tracking.record(exp.runs[0], "fetchsgd seed 0", "already finished")
    assert capsys.readouterr().out == "" and list(board.glob("events.out.tfevents.*")) == [first]
    path = runlog.run_dir(exp.runs[0])
    (path / "metrics.jsonl").write_text(
        "".join(json.dumps({**_row(r, "fetchsgd"), "clients": 9}) + "\n" for r in (1, 2))
    )
    tracking.record(exp.runs[0], "fetchsgd seed 0", "finished")
    assert [v for _, v in event_scalars(board)["clients"]] == [9.0, 9.0]


def test_a_store_that_cannot_be_written_is_said_in_one_line_and_the_other_is_still_written(out: Path) -> None:
    exp = _experiment(out, "both")
    runlog.write_config(exp.runs[0], runner.prepare(exp.runs[0]))
    runlog.append_metrics(runlog.run_dir(exp.runs[0]), _row(1, "fetchsgd"))
    (out / "tensorboard").write_text("a file where the folder would go", encoding="utf-8")
    raw = io.BytesIO()
    with redirect_stdout(io.TextIOWrapper(raw, encoding="utf-8")):  # held until flushed, as in a pipe
        tracking.record(exp.runs[0], "fetchsgd seed 0", "finished")
        said = raw.getvalue().decode().splitlines()
    assert re.fullmatch(
        r"tracking: tensorboard not written for fetchsgd seed 0: (FileExistsError|NotADirectoryError): .*", said[0]
    ), said
    assert said[1].startswith(f"tracking: fetchsgd seed 0 -> {tracking.mlflow_uri(out)} (run ") and len(said) == 2
    only = RunConfig.from_mapping({"tracking": "tensorboard"}, base=exp.runs[0])
    raw = io.BytesIO()
    with redirect_stdout(io.TextIOWrapper(raw, encoding="utf-8")):
        tracking.record(only, "fetchsgd seed 0", "finished")
        assert raw.getvalue().decode().startswith("tracking: tensorboard not written for fetchsgd seed 0: ")


def test_where_each_run_goes_and_what_is_logged_of_a_row(tmp_path: Path) -> None:
    point = RunConfig.from_mapping({"out-dir": str(tmp_path), "experiment": "default/k20-cols300", "seed": 2})
    assert (
        tracking.tensorboard_dir(point) == tmp_path / "tensorboard" / "default" / "fetchsgd" / "k20-cols300" / "seed2"
    )
    plain = RunConfig.from_mapping({"out-dir": str(tmp_path)})
    assert tracking.tensorboard_dir(plain) == tmp_path / "tensorboard" / "default" / "fetchsgd" / "seed0"
    assert tracking.sinks(replace(ManySettings(str(tmp_path)))) == ("tensorboard", "mlflow")
    untracked = type("Old", (), {"to_mapping": lambda self: {"lr": 0.1}})()  # a run config older than the setting
    assert tracking.sinks(untracked) == ()
    tracking.record(plain, "fetchsgd seed 0", "finished")  # tracking none: its folder is not even read
    row = {"round": 3, "test_accuracy": 0.5, "cum_upload_bytes": 10, "cum_download_bytes": 5, "ok": True}
    assert tracking.series([row]) == [
        ("cum_download_bytes", 3, 5.0, 0.0),
        ("cum_total_bytes", 3, 15.0, 0.0),
        ("cum_upload_bytes", 3, 10.0, 0.0),
        ("test_accuracy", 3, 0.5, 0.0),
        ("test_accuracy_by_upload_bytes", 10, 0.5, 0.0),
        ("test_accuracy_by_total_bytes", 15, 0.5, 0.0),
    ]


def test_rows_without_times_start_both_stores_at_zero(out: Path) -> None:
    """A metrics file from before rows carried their time (``unix_time``, ``wall_s``)."""
    exp = _experiment(out, "both")
    runlog.write_config(exp.runs[0], runner.prepare(exp.runs[0]))
    for rnd in (1, 2):
        row = {k: v for k, v in _row(rnd, "fetchsgd").items() if k not in ("unix_time", "wall_s")}
        runlog.append_metrics(runlog.run_dir(exp.runs[0]), row)
    before = int(time.time() * 1000)
    tracking.record(exp.runs[0], "fetchsgd seed 0", "finished")
    events = _raw_events(tracking.tensorboard_dir(exp.runs[0]))
    assert {e.wall_time for e in events if e.summary.value} == {0.0}
    (run,) = mlflow_runs(out, "default")
    assert run.info.start_time >= before and run.info.end_time >= before  # MLflow takes a time of 0 as now
