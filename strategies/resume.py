"""Checkpoint and resume a run's server side (``checkpoint-every``).

A checkpoint holds exactly the strategy's value
(:class:`strategies.values.ServerValues`: the weights, the method's state, the
books and the DP noise's generator state), with the global generators and how
far the logs had got. The file format and its checks live in
:mod:`fedsketch.server.checkpoint`. The strategy hands its value over and takes back a
:class:`Resumed`; this module never sees the strategy. Resuming is all or nothing: every piece is read and
checked before the first one is assigned. A checkpoint in the run's folder is
resumed even when ``checkpoint-every`` is now 0, and refused, never deleted, when the
run's settings differ beyond those a resume may change (:mod:`fedsketch.server.resumable`).
Methods whose clients keep state cannot checkpoint (the config check refuses them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from logging import INFO, getLogger
from pathlib import Path
from typing import Any

from fedsketch.config import RunConfig
from fedsketch.server import checkpoint, runlog
from fedsketch.server.checkpoint import Checkpoint, CheckpointError
from strategies.values import ServerValues

log = getLogger("flwr").log  # Flower's own logger: the lines go where Flower's go (flower.log)


@dataclass(frozen=True)
class Resumed:
    """Where a run goes on: its first round, the time already spent, and what to restore (``None``: a fresh start)."""

    first_round: int = 1
    elapsed: float = 0.0
    values: ServerValues | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # the ``metrics.jsonl`` rows already written


def checkpoint_round(
    cfg: RunConfig, out_dir: Path | None, num_rounds: int, elapsed: float, saved: ServerValues
) -> None:
    """Save after every ``checkpoint-every``-th round and after the last one (``saved.server_round``)."""
    server_round, every = saved.server_round, cfg.checkpoint_every
    if out_dir is None or not every or (server_round % every and server_round != num_rounds):
        return
    ckpt = Checkpoint(
        round=server_round,
        weights=saved.weights.detach().cpu(),
        state=checkpoint.state_to_tree(saved.state),
        books=checkpoint.books_to_tree(saved.books),
        noise=saved.noise,
        rng=checkpoint.capture_rng(),
        logs=checkpoint.log_sizes(out_dir),
        elapsed=elapsed,
    )
    checkpoint.save(out_dir, cfg, ckpt)


def restore(cfg: RunConfig, out_dir: Path | None, current: ServerValues) -> Resumed:
    """The run's last checkpoint, if any, checked against ``current`` (the strategy's fresh values).

    The logs are rewound to the checkpoint and the global generators restored;
    the strategy assigns the rest.

    Raises
    ------
    CheckpointError
        If the checkpoint is corrupt or does not fit this run.
    """
    if out_dir is None:
        return Resumed()
    ckpt = checkpoint.load(out_dir, cfg)  # even with checkpoint-every now 0: never throw an earlier run's work away
    if ckpt is None:  # a fresh start: no rows from an earlier attempt or run (e.g. the same `flwr run` again)
        checkpoint.rewind_logs(out_dir, {})
        return Resumed()
    if ckpt.weights.shape != current.weights.shape:
        raise CheckpointError(
            f"checkpoint model has {ckpt.weights.numel()} weights; this run's has {current.weights.numel()}"
        )
    state = checkpoint.state_from_tree(current.state, ckpt.state)
    books = checkpoint.books_from_tree(current.books, ckpt.books)
    # Everything is checked: from here on, restore.
    checkpoint.rewind_logs(out_dir, ckpt.logs)
    checkpoint.restore_rng(ckpt.rng)
    values = ServerValues(ckpt.weights.to(current.weights.device), state, books, ckpt.noise, ckpt.round)
    log(INFO, "resuming after round %d from %s", ckpt.round, out_dir / checkpoint.FILE)
    runlog.mark_resumed(out_dir, ckpt.round)  # the command that started the run says so on its console
    return Resumed(ckpt.round + 1, ckpt.elapsed, values, runlog.read_metrics(out_dir))
