"""A run's metrics rows, also in TensorBoard event files and an MLflow store: the setting ``tracking``.

Researchers keep runs where they already look. With ``tracking = "tensorboard"``,
``"mlflow"`` or ``"both"``, each run (one strategy, one seed, one sweep point)
becomes

- a TensorBoard run, ``<out-dir>/tensorboard/<experiment>/<strategy>[/<point>]/seed<k>``:
  its settings as hyperparameters (the HParams tab) and every metrics row as
  scalars (``tensorboard --logdir <out-dir>/tensorboard``);
- an MLflow run named like the progress line (``fetchsgd seed 0``) in the MLflow
  experiment of the same name, in the SQLite store ``<out-dir>/mlflow.db``: its
  settings as parameters, every metrics row as metrics
  (``mlflow ui --backend-store-uri sqlite:///<out-dir>/mlflow.db``). MLflow's file
  store is in maintenance mode (MLflow 3 refuses it unless told otherwise);
  SQLite is its recommended local store, one file, offline.

Every numeric field of a row is logged at ``step = round``, with
``cum_total_bytes`` (upload + download) beside the cumulative upload; TensorBoard
can only plot against the step, so ``test_accuracy`` is also logged at
``step = cum_upload_bytes`` and ``step = cum_total_bytes`` (tags
``test_accuracy_by_upload_bytes``, ``test_accuracy_by_total_bytes``), in both
stores alike. Values and times are the row's own (``unix_time``).

Written by the command's own process from the run's ``metrics.jsonl`` when the
run has ended (finished, failed, or skipped; not when the whole command was
interrupted), so Flower's processes need nothing new. A run written again
replaces what it had written. A run already finished is written if it is not
there yet: turning ``tracking`` on for a finished experiment writes it without
redoing any run (:data:`fedsketch.server.runlog.OUTPUT_ONLY`).
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedsketch.server import runlog
from fedsketch.server.runlog import RunSpec
from fedsketch.settings.setting import ConfigError

SINKS = {"none": (), "tensorboard": ("tensorboard",), "mlflow": ("mlflow",), "both": ("tensorboard", "mlflow")}
"""The stores each value of the setting names."""
INSTALL = "pip install 'fedsketch[tracking]'"
NOT_LOGGED = {"round", "seed", "unix_time"}
"""Row fields that are the step, the run, or the time rather than measurements."""
BY_BYTES = {"test_accuracy_by_upload_bytes": "cum_upload_bytes", "test_accuracy_by_total_bytes": "cum_total_bytes"}
"""Accuracy again, with a byte count as its step: TensorBoard plots only against the step."""
MLFLOW_DB = "mlflow.db"
STATUS = {"finished": "FINISHED", "already finished": "FINISHED", "skipped": "KILLED", "interrupted": "KILLED"}
"""MLflow's status of a run by how the outcome :func:`experiments.running.runner.run_all` gives it begins
(else FAILED)."""


def sinks(cfg: RunSpec) -> tuple[str, ...]:
    """The stores the run's setting ``tracking`` names (none for a run config written before the setting)."""
    return SINKS[str(cfg.to_mapping().get("tracking", "none"))]


def check(runs: Iterable[RunSpec]) -> None:
    """Refuse, before anything starts, a ``tracking`` whose package is not installed.

    Raises
    ------
    ConfigError
        One line naming the setting, the package and how to install it.
    """
    for cfg in runs:
        for sink in sinks(cfg):
            if importlib.util.find_spec(sink) is None:
                raise ConfigError(
                    f"setting 'tracking' is {cfg.to_mapping()['tracking']!r} but {sink} is not installed: {INSTALL}"
                )


def refuse_in_kit(runs: Iterable[RunSpec]) -> None:
    """A deployment kit's runs are started by ``flwr run`` on the server, where no fedsketch command watches them
    end: ``tracking`` would be ignored there, so it is refused.

    Raises
    ------
    ConfigError
        Naming the setting, and what to do instead.
    """
    for cfg in runs:
        if sinks(cfg):
            raise ConfigError(
                f"setting 'tracking' ({cfg.to_mapping()['tracking']!r}) is written by fedsketch run and deploy as "
                "each run ends; a kit's runs are started by flwr run on the server, which would ignore it: leave it "
                "out of the kit"
            )


def series(rows: list[dict[str, Any]]) -> list[tuple[str, int, float, float]]:
    """``(tag, step, value, unix time)`` of every value the stores get from ``rows``, row by row."""
    out: list[tuple[str, int, float, float]] = []
    for row in rows:
        values = {k: v for k, v in row.items() if k not in NOT_LOGGED and _number(v)}
        values["cum_total_bytes"] = row["cum_upload_bytes"] + row["cum_download_bytes"]
        time = float(row.get("unix_time", 0.0))
        out.extend((tag, int(row["round"]), float(value), time) for tag, value in sorted(values.items()))
        out.extend((tag, int(values[step]), float(row["test_accuracy"]), time) for tag, step in BY_BYTES.items())
    return out


def record(cfg: RunSpec, name: str, outcome: str) -> None:
    """Write the run ``name`` (``fetchsgd seed 0``) to the stores its ``tracking`` names, once it has ended as
    ``outcome``; say where.

    A run already finished is written only where it is not yet. A store that cannot be written
    is reported in one line; the experiment goes on.
    """
    stores = sinks(cfg)
    rows = runlog.read_metrics(runlog.run_dir(cfg)) if stores else []
    if not rows:
        return
    written = []
    for sink in stores:
        try:
            if sink == "tensorboard":
                where = _tensorboard(cfg, rows, outcome)
            else:
                where = _mlflow(cfg, name, rows, outcome)
        except Exception as exc:  # noqa: BLE001  # a store that fails must not stop the experiment
            print(f"tracking: {sink} not written for {name}: {type(exc).__name__}: {exc}", flush=True)
            continue
        if where:
            written.append(where)
    if written:
        print(f"tracking: {name} -> {', '.join(written)}", flush=True)


def tensorboard_dir(cfg: RunSpec) -> Path:
    """``<out-dir>/tensorboard/<experiment>/<strategy>[/<point>]/seed<k>``: one TensorBoard run."""
    path = Path(cfg.out_dir) / "tensorboard" / runlog.experiment_name(cfg) / cfg.strategy
    return (path / runlog.sweep_point(cfg) if runlog.sweep_point(cfg) else path) / f"seed{cfg.seed}"


def mlflow_uri(out_dir: str | Path) -> str:
    """The MLflow tracking URI of the store under ``out_dir``."""
    return f"sqlite:///{(Path(out_dir) / MLFLOW_DB).resolve()}"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _tensorboard(cfg: RunSpec, rows: list[dict[str, Any]], outcome: str) -> str:
    """The run's event file, written anew; its settings as hyperparameters (TensorBoard's HParams)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams.summary_v2 import hparams_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    path = tensorboard_dir(cfg)
    if outcome == "already finished" and path.is_dir() and any(path.glob("events.out.tfevents.*")):
        return ""
    shutil.rmtree(path, ignore_errors=True)
    start = float(rows[0].get("unix_time", 0.0)) - float(rows[0].get("wall_s", 0.0))
    writer = EventFileWriter(str(path))
    try:
        settings = {key: value for key, value in cfg.to_mapping().items() if key not in runlog.OUTPUT_ONLY}
        writer.add_event(Event(wall_time=start, step=0, summary=hparams_pb(settings, start_time_secs=start)))
        for tag, step, value, time in series(rows):
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
            writer.add_event(Event(wall_time=time, step=step, summary=summary))
    finally:
        writer.close()
    return str(path)


def _mlflow(cfg: RunSpec, name: str, rows: list[dict[str, Any]], outcome: str) -> str:
    """The run in the MLflow store of its out-dir, replacing the one written before for the same folder."""
    from mlflow.entities import Metric, Param
    from mlflow.tracking import MlflowClient

    for logger in ("mlflow", "alembic"):  # the store's schema set-up logs at INFO on first use
        logging.getLogger(logger).setLevel(logging.WARNING)

    client = MlflowClient(tracking_uri=mlflow_uri(cfg.out_dir))
    experiment = client.get_experiment_by_name(runlog.experiment_name(cfg))
    experiment_id = (
        experiment.experiment_id
        if experiment is not None
        else client.create_experiment(
            runlog.experiment_name(cfg), artifact_location=(Path(cfg.out_dir).resolve() / "mlartifacts").as_uri()
        )
    )
    folder = str(runlog.run_dir(cfg).resolve())
    named = client.search_runs([experiment_id], filter_string=f"attributes.run_name = '{name}'")
    earlier = [run for run in named if run.data.tags.get("fedsketch.run_dir") == folder]  # the folder: any characters
    if outcome == "already finished" and earlier:
        return ""
    for run in earlier:
        client.delete_run(run.info.run_id)
    start = int((float(rows[0].get("unix_time", 0.0)) - float(rows[0].get("wall_s", 0.0))) * 1000)
    tags = {"fedsketch.run_dir": folder, "fedsketch.strategy": cfg.strategy, "fedsketch.seed": str(cfg.seed)}
    run = client.create_run(experiment_id, start_time=start, tags=tags, run_name=name)
    settings = cfg.to_mapping()
    params = [Param(key, str(value)) for key, value in sorted(settings.items()) if key not in runlog.OUTPUT_ONLY]
    metrics = [Metric(tag, value, int(time * 1000), step) for tag, step, value, time in series(rows)]
    for i in range(0, len(params), 100):  # a batch holds at most 100 parameters and 1,000 values in all
        client.log_batch(run.info.run_id, params=params[i : i + 100])
    for i in range(0, len(metrics), 1000):
        client.log_batch(run.info.run_id, metrics=metrics[i : i + 1000])
    end = int(float(rows[-1].get("unix_time", 0.0)) * 1000)
    status = next((s for prefix, s in STATUS.items() if outcome.startswith(prefix)), "FAILED")
    client.set_terminated(run.info.run_id, status=status, end_time=end)
    return f"{mlflow_uri(cfg.out_dir)} (run {run.info.run_id})"
