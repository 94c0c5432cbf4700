"""Checkpoint and resume a run's server side (``checkpoint-every``).

A checkpoint holds exactly the strategy's values: the weights, the method's
state and the books (:class:`fedsketch.books.Books`), with the DP noise's and
the global generators and how far the logs had got. The file format and its
checks live in :mod:`fedsketch.checkpoint`. Resuming is all or nothing: every
piece is read and checked before the first one is assigned. Methods whose
clients keep state cannot checkpoint (the config check refuses them).
"""

from __future__ import annotations

from logging import INFO
from typing import TYPE_CHECKING

from flwr.common.logger import log

from fedsketch import checkpoint, runlog
from fedsketch.checkpoint import Checkpoint, CheckpointError

if TYPE_CHECKING:
    from strategies.strategy import FedSketchStrategy


def checkpoint_round(s: FedSketchStrategy, server_round: int, num_rounds: int, elapsed: float) -> None:
    """Save after every ``checkpoint-every``-th round and after the last one."""
    every = s.cfg.checkpoint_every
    if s.out_dir is None or not every or (server_round % every and server_round != num_rounds):
        return
    ckpt = Checkpoint(
        round=server_round, weights=s.weights.detach().cpu(), state=checkpoint.state_to_tree(s.state),
        books=checkpoint.books_to_tree(s.books), noise=s.noise.get_state(), rng=checkpoint.capture_rng(),
        logs=checkpoint.log_sizes(s.out_dir), elapsed=elapsed,
    )  # fmt: skip
    checkpoint.save(s.out_dir, s.cfg, ckpt)


def restore(s: FedSketchStrategy) -> tuple[int, float]:
    """Restore the run's last checkpoint, if any; returns the first round to run and the time already spent.

    Raises
    ------
    CheckpointError
        If the checkpoint is corrupt or does not fit this run.
    """
    if s.out_dir is None:
        return 1, 0.0
    ckpt = checkpoint.load(s.out_dir, s.cfg) if s.cfg.checkpoint_every else None
    if ckpt is None:  # a fresh start: no rows from an earlier attempt or run (e.g. the same `flwr run` again)
        checkpoint.rewind_logs(s.out_dir, {})
        return 1, 0.0
    if ckpt.weights.shape != s.weights.shape:
        raise CheckpointError(f"checkpoint model has {ckpt.weights.numel()} weights; this run's has {s.d}")
    state = checkpoint.state_from_tree(s.state, ckpt.state)
    books = checkpoint.books_from_tree(s.books, ckpt.books)
    # Everything is checked: from here on, assign.
    checkpoint.rewind_logs(s.out_dir, ckpt.logs)
    s.set_weights(ckpt.weights.to(s.weights.device))
    s.state, s.books = state, books
    s.noise.set_state(ckpt.noise)
    checkpoint.restore_rng(ckpt.rng)
    s.history = runlog.read_metrics(s.out_dir)
    log(INFO, "resumed after round %d from %s", ckpt.round, s.out_dir / checkpoint.FILE)
    return ckpt.round + 1, ckpt.elapsed
