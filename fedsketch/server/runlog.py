"""Run outputs a user can look at: ``config.json`` and ``metrics.jsonl``.

One JSON object per evaluated round, appended and flushed as the run goes, so
an interrupted run keeps every round it finished. ``rounds.jsonl`` has one
line per round on who answered, who failed (timeouts, client errors, rejected
replies), whether the round's update was applied, and when the round ended
(``unix_time``, before its evaluation). ``status.json`` marks a
run that was stopped before its last round (interrupted, or skipped on
request; see ``docs/stopping.md``); a finished run has none.

A sweep point of an experiment runs with ``experiment = "NAME/POINT"`` (e.g.
``"default/rows3-cols5000"``, see ``experiments/running/sweep.py``): the ServerApp
learns where to write only from the run config, and the run config has no
other free-form field that a sweep could name itself in. Its folder is
``<out-dir>/NAME/<strategy>/POINT``, beside the strategy's other points.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from fedsketch.config import RunConfig
    from fedsketch.server.books import Books

ROUNDS = "rounds.jsonl"
STATUS = "status.json"
RESUMED = "resumed.json"
"""Written by the ServerApp when it resumes the run from its checkpoint: after which round (:func:`mark_resumed`)."""
SERVER_DONE = "server_done.json"
"""Written by the ServerApp as its last act: everything the run keeps is on disk (see :func:`mark_server_done`)."""
SERVER_DONE_LOG = "fedsketch: the ServerApp has finished"
"""The ServerApp's last log line, logged just before :func:`mark_server_done`: the launcher waits for it in
``flower.log`` (Flower streams the ServerApp's logs with a lag of up to about 0.7 s) before stopping Flower."""
POINT_SEP = "/"
"""Separates an experiment's name from a sweep point's in ``RunConfig.experiment``."""

OUTPUT_ONLY = ("tracking",)
"""Settings that only add places a run's rows are also written, never change what it computes: a finished run is
not redone, nor a checkpoint refused, when they change."""

CHECKPOINT = "checkpoint.pt"
"""A checkpointing run's last checkpoint, in its folder (:mod:`fedsketch.server.checkpoint`)."""


class RunSpec(Protocol):
    """What the run folders need of a run: a :class:`~fedsketch.config.RunConfig`, or its saved settings
    (:class:`experiments.running.command_plan.PlannedRun`, which needs no torch)."""

    @property
    def experiment(self) -> str: ...
    @property
    def out_dir(self) -> str: ...
    @property
    def strategy(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def num_rounds(self) -> int: ...
    @property
    def checkpoint_every(self) -> int: ...
    def to_mapping(self) -> dict[str, Any]: ...


def experiment_name(cfg: RunSpec) -> str:
    """The experiment's own name, without the sweep point."""
    return cfg.experiment.partition(POINT_SEP)[0]


def sweep_point(cfg: RunSpec) -> str:
    """The sweep point's name (e.g. ``rows3-cols5000``); ``""`` for a run that is not part of a sweep."""
    return cfg.experiment.partition(POINT_SEP)[2]


def experiment_dir(cfg: RunSpec) -> Path:
    """``<out-dir>/<experiment>``: the folder of every run of the experiment, and of its plots and report."""
    return Path(cfg.out_dir) / experiment_name(cfg)


def run_dir(cfg: RunSpec) -> Path:
    """``<out-dir>/<experiment>/<strategy>[/<sweep point>]``, plus ``seed<k>`` when the seed is not 0."""
    path = experiment_dir(cfg) / cfg.strategy
    if sweep_point(cfg):
        path = path / sweep_point(cfg)
    return path / f"seed{cfg.seed}" if cfg.seed else path


def write_config(cfg: RunConfig, path: Path) -> None:
    """Write ``config.json`` atomically."""
    path.mkdir(parents=True, exist_ok=True)
    _atomic_write(path / "config.json", json.dumps(cfg.to_mapping(), indent=2, sort_keys=True) + "\n")


def append_metrics(path: Path, row: dict[str, Any], name: str = "metrics.jsonl") -> None:
    """Append one row to ``metrics.jsonl`` (or another log, e.g. :data:`ROUNDS`) and flush it to disk."""
    with open(path / name, "a", encoding="utf-8") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


ROW_COUNTS = (
    "clients",
    "failures",
    "timeouts",
    "client_errors",
    "rejected",
    "skipped_rounds",
    "clipped",
    "bounded",
    "sparse_downloads",
)
"""Counts a metrics row reports since the previous row."""


def metrics_row(
    cfg: RunConfig, server_round: int, accuracy: float, loss: float, books: Books, wall_s: float
) -> dict[str, Any]:
    """One evaluated round's row: accuracy, bytes and counts since the previous row (``books.next_row()`` begins
    the next one).

    Bytes since the previous row add up to the cumulative ones. ``download_bytes`` is what each client
    is billed (a message to it alone); ``download_sent_bytes`` what the round's messages serialized
    (in simulation one message carries a node's cohort). ``diagnostic_bytes``
    (``diagnose-sketch``) are what clients handed over for the diagnostic only, never upload.
    """
    since, total = books.since_row, books.totals
    row: dict[str, Any] = {
        "round": server_round,
        "strategy": cfg.strategy,
        "seed": cfg.seed,
        "test_accuracy": accuracy,
        "test_loss": loss,
        "train_loss": books.last_loss,
        "upload_bytes": since["upload"],
        "download_bytes": since["download"],
        "dense_upload_bytes": since["dense"],
        "cum_upload_bytes": total["upload"],
        "cum_download_bytes": total["download"],
        "cum_dense_upload_bytes": total["dense"],
        **{key: since[key] for key in ROW_COUNTS},
        "download_sent_bytes": since["download_sent"],
        "cum_download_sent_bytes": total["download_sent"],
    }
    if cfg.diagnose_sketch:
        row.update(diagnostic_bytes=since["diagnostic"], cum_diagnostic_bytes=total["diagnostic"])
    return {**row, "wall_s": round(wall_s, 3), "unix_time": round(time.time(), 3)}


def read_metrics(path: Path, name: str = "metrics.jsonl") -> list[dict[str, Any]]:
    """Every row of ``metrics.jsonl`` (or another log, e.g. :data:`ROUNDS`; empty when the run has none yet)."""
    file = path / name
    if not file.exists():
        return []
    with open(file, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_status(path: Path, state: str, cause: str, num_rounds: int) -> dict[str, Any]:
    """Mark the run in ``path`` as stopped early (``state``: ``interrupted`` or ``skipped``) and by what.

    The last round its metrics reached is recorded beside the planned ``num_rounds``.
    """
    rows = read_metrics(path)
    status = {
        "state": state,
        "cause": cause,
        "round": rows[-1]["round"] if rows else 0,
        "num-rounds": num_rounds,
        "unix-time": time.time(),
    }
    _atomic_write(path / STATUS, json.dumps(status, indent=2, sort_keys=True) + "\n")
    return status


def read_status(path: Path) -> dict[str, Any] | None:
    """The run's ``status.json``; ``None`` when it has none (finished, or still running)."""
    try:
        return dict(json.loads((path / STATUS).read_text(encoding="utf-8")))
    except FileNotFoundError:
        return None


def clear_status(path: Path) -> None:
    """Forget that the run was stopped, resumed, or that its server finished (it is about to run again)."""
    for name in (STATUS, SERVER_DONE, RESUMED):
        (path / name).unlink(missing_ok=True)


def mark_resumed(path: Path, server_round: int) -> None:
    """The ServerApp resumes the run in ``path`` after ``server_round`` (its checkpoint's round)."""
    _atomic_write(path / RESUMED, json.dumps({"round": server_round, "unix-time": time.time()}) + "\n")


def resumed_after(path: Path) -> int | None:
    """The round after which the ServerApp resumed the run in ``path``; ``None`` if it started afresh (or not yet)."""
    try:
        return int(json.loads((path / RESUMED).read_text(encoding="utf-8"))["round"])
    except (FileNotFoundError, ValueError, KeyError):
        return None


def mark_server_done(path: Path, num_rounds: int, broken: str | None = None) -> None:
    """The ServerApp's last act: its metrics, checkpoint and client-state clean-up are all done.

    The launcher then stops Flower's processes at once instead of waiting for
    the simulation's own teardown (stopping Ray's actors and services, returning
    the logs: 4-5 s a run on a 2-core machine), which keeps nothing the run needs.
    """
    rows = read_metrics(path)
    done = {"round": rows[-1]["round"] if rows else 0, "num-rounds": num_rounds, "unix-time": time.time()}
    if broken:  # the run ends, but with a model of no use: the command says why and fails
        done["broken"] = broken
    _atomic_write(path / SERVER_DONE, json.dumps(done, sort_keys=True) + "\n")


def server_done(path: Path) -> bool:
    """Whether the ServerApp of the run in ``path`` has finished (:func:`mark_server_done`)."""
    return (path / SERVER_DONE).exists()


def broken(path: Path) -> str | None:
    """Why the run in ``path`` ended with a model of no use, as its ServerApp said (:func:`mark_server_done`)."""
    try:
        return json.loads((path / SERVER_DONE).read_text(encoding="utf-8")).get("broken")
    except (OSError, ValueError):
        return None


def status_note(status: dict[str, Any]) -> str:
    """``interrupted (SIGINT) after round 12 of 50``."""
    return f"{status['state']} ({status['cause']}) after round {status['round']} of {status['num-rounds']}"


def _atomic_write(file: Path, text: str) -> None:
    tmp = file.with_suffix(file.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, file)
