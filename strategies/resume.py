"""Checkpoint and resume for :class:`~strategies.base.FedSketchStrategy` (``checkpoint-every``).

The file format, its checks and the generators live in :mod:`fedsketch.checkpoint`;
this mixin only says which of the strategy's attributes make up its state and
puts them back. Resuming is all or nothing: every piece is read and checked
before the first one is assigned.
"""

from __future__ import annotations

from logging import INFO
from pathlib import Path
from typing import Any

import torch
from flwr.common.logger import log
from torch import nn

from fedsketch import checkpoint, runlog
from fedsketch.checkpoint import Checkpoint, CheckpointError
from fedsketch.config import ConfigError, RunConfig
from fedsketch.flat import set_flat

BOOKS = ("_totals", "_since_row", "_dp_rounds", "_last_loss", "_node_cid", "_homes", "_changed_at", "_synced")
"""The strategy's bookkeeping that a resumed run must continue from (counters, DP rounds, node maps)."""


class Resumable:
    """Mixed into the base strategy: ``_resume`` before the first round, ``_checkpoint`` after each round."""

    cfg: RunConfig
    out_dir: Path | None
    model: nn.Module
    weights: torch.Tensor
    d: int
    _totals: dict[str, int]
    history: list[dict[str, Any]]
    _noise: torch.Generator

    def keeps_client_state(self) -> bool:  # overridden by the strategy
        return False

    def _checkpoint(self, server_round: int, num_rounds: int, elapsed: float) -> None:
        """Save after every ``checkpoint-every``-th round and after the last one."""
        every = self.cfg.checkpoint_every
        if self.out_dir is None or not every or (server_round % every and server_round != num_rounds):
            return
        ckpt = Checkpoint(
            round=server_round, weights=self.weights.detach().cpu(),
            state=checkpoint.state_to_tree(getattr(self, "state", None)),
            books={name: getattr(self, name) for name in BOOKS}, noise=self._noise.get_state(),
            rng=checkpoint.capture_rng(), logs=checkpoint.log_sizes(self.out_dir), elapsed=elapsed,
        )  # fmt: skip
        checkpoint.save(self.out_dir, self.cfg, ckpt)

    def _resume(self) -> tuple[int, float]:
        """Restore the run's last checkpoint, if any; returns the first round to run and the time already spent.

        Raises
        ------
        ConfigError
            If checkpoints are asked for a method whose clients keep state on
            their nodes (a restart would lose it, so the resumed run would differ).
        CheckpointError
            If the checkpoint is corrupt or does not fit this run.
        """
        if self.out_dir is None or not self.cfg.checkpoint_every:
            return 1, 0.0
        if self.keeps_client_state():
            raise ConfigError(
                f"setting 'checkpoint-every' is not available for {self.cfg.strategy} with these settings: "
                "its clients keep state on their nodes, which a restart loses"
            )
        ckpt = checkpoint.load(self.out_dir, self.cfg)
        if ckpt is None:
            checkpoint.rewind_logs(self.out_dir, {})  # a fresh start: no rows from an earlier attempt
            return 1, 0.0
        if ckpt.weights.shape != self.weights.shape:
            raise CheckpointError(f"checkpoint model has {ckpt.weights.numel()} weights; this run's has {self.d}")
        template = getattr(self, "state", None)
        state = checkpoint.state_from_tree(template, ckpt.state)
        if sorted(ckpt.books) != sorted(BOOKS) or ckpt.books["_totals"].keys() != self._totals.keys():
            raise CheckpointError(f"checkpoint bookkeeping has {sorted(ckpt.books)}; expected {sorted(BOOKS)}")
        # Everything is checked: from here on, assign.
        checkpoint.rewind_logs(self.out_dir, ckpt.logs)
        self.weights = ckpt.weights.to(self.weights.device)
        set_flat(self.model, self.weights)
        if template is not None:
            setattr(self, "state", state)  # noqa: B010 (the method's own state type, whichever it is)
        for name, value in ckpt.books.items():
            setattr(self, name, value)
        self._noise.set_state(ckpt.noise)
        checkpoint.restore_rng(ckpt.rng)
        self.history = runlog.read_metrics(self.out_dir)
        log(INFO, "resumed after round %d from %s", ckpt.round, self.out_dir / checkpoint.FILE)
        return ckpt.round + 1, ckpt.elapsed
