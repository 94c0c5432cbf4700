"""FetchSGD on Flower: clients upload sketches, the server does the rest.

Rothchild et al., ICML 2020. The strategy merges the client tables (a weighted
sum: sketches are linear) and hands them to :mod:`fedsketch.algorithms.fetchsgd`,
which keeps momentum and error in sketch space and returns the top-k update.

With ``diagnose-sketch`` (simulation only) each client also hands over its
dense update in a separate diagnostic record; the server merges those with the
same weights and runs :mod:`fedsketch.algorithms.fidelity`, which makes the
very same FetchSGD step and measures it against a dense shadow of its
recurrences. Metrics rows then carry ``sketch_recall``, ``sketch_rel_error``
and ``sketch_state_drift`` (means since the previous row) and
``diagnostic_bytes``, which is not part of ``upload_bytes``.
"""

from __future__ import annotations

import math
from logging import INFO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.common.logger import log
from torch import nn

from fedsketch import wire
from fedsketch.algorithms import fetchsgd, fidelity
from fedsketch.config import RunConfig
from fedsketch.sketch import CountSketch
from strategies.base import FedSketchStrategy
from strategies.replies import ClientUpdate, PayloadSpec


class FetchSGD(FedSketchStrategy):
    """Server state: the momentum and error sketches (and, when diagnosing, their dense shadow), and the model."""

    state: fetchsgd.FetchSGDState | fidelity.FidelityState

    def __init__(
        self, cfg: RunConfig, model: nn.Module, test_x: torch.Tensor, test_y: torch.Tensor, out_dir: Path | None = None
    ) -> None:
        super().__init__(cfg, model, test_x, test_y, out_dir)
        self.params = fetchsgd.FetchSGDParams(
            d=self.d, rows=cfg.sketch_rows, cols=cfg.sketch_cols, seed=cfg.seed, k=cfg.k,
            momentum=cfg.momentum, error_feedback=cfg.error_feedback, momentum_zeroing=cfg.momentum_zeroing,
        )  # fmt: skip
        if cfg.diagnose_sketch:
            self.state = fidelity.init(self.params, device=self.weights.device)
        else:
            self.state = fetchsgd.init(self.params, device=self.weights.device)

    @property
    def sketched(self) -> fetchsgd.FetchSGDState:
        """FetchSGD's own momentum and error sketches, whether or not the diagnostic runs beside them."""
        return self.state.sketched if isinstance(self.state, fidelity.FidelityState) else self.state

    def payload_spec(self) -> PayloadSpec:
        """One float32 table of the run's sketch shape."""
        return {"table": ((self.cfg.sketch_rows, self.cfg.sketch_cols), np.dtype(np.float32))}

    def diagnostic_spec(self) -> PayloadSpec | None:
        """With ``diagnose-sketch``: the client's dense float32 update, checked like any payload."""
        return {wire.DIAGNOSTIC_UPDATE: ((self.d,), np.dtype(np.float32))} if self.cfg.diagnose_sketch else None

    def round_config(self, server_round: int) -> dict[str, Any]:
        """Every client derives the same hash functions from these."""
        return {"sketch-seed": self.params.seed, "sketch-rows": self.params.rows, "sketch-cols": self.params.cols}

    def update_norm(self, u: ClientUpdate) -> float:
        """The sketch's estimate of the norm of the update it sketches (the server never sees the update)."""
        return CountSketch.from_table(torch.from_numpy(u.payload["table"]), self.d, self.params.seed).l2_estimate()

    def sensitivity_scale(self) -> float:
        """Each row of a table has the sketched vector's norm in expectation: the table, sqrt(rows) times it."""
        return math.sqrt(self.params.rows)

    def apply(self, server_round: int, updates: list[ClientUpdate], weights: torch.Tensor) -> torch.Tensor:
        """Merge the tables weighted by examples, then one FetchSGD step (measured, when diagnosing)."""
        merged = _weighted_sum(updates, "table", self.sketched.error)
        lr = self.lr_at(server_round)
        if isinstance(self.state, fidelity.FidelityState):
            true_mean = _weighted_sum(updates, wire.DIAGNOSTIC_UPDATE, self.state.shadow.error, diagnostic=True)
            self.state, update, _ = fidelity.step(self.state, merged, true_mean, self.params, lr)
        else:
            self.state, update = fetchsgd.step(self.state, merged, self.params, lr)
        return update.dense(self.d)

    def round_metrics(self) -> dict[str, float]:
        """With ``diagnose-sketch``: the sketch's fidelity, averaged over the rounds since the previous row."""
        if not isinstance(self.state, fidelity.FidelityState):
            return {}
        self.state, rep = fidelity.report(self.state)
        return {"sketch_recall": rep.recall, "sketch_rel_error": rep.rel_error,
                "sketch_state_drift": rep.state_drift, "sketch_rounds": rep.rounds}  # fmt: skip

    def summary(self) -> None:
        """Log the run's key settings, and what the diagnostic costs the server."""
        super().summary()
        if self.cfg.diagnose_sketch:
            mib = 8 * self.d / 2**20
            log(INFO, "diagnose-sketch: the dense shadow keeps 2 x d float32 (%.1f MiB) on the server, and each round "
                "holds every client's dense update; none of it is counted as upload", mib)  # fmt: skip


def _weighted_sum(updates: list[ClientUpdate], name: str, like: torch.Tensor, diagnostic: bool = False) -> torch.Tensor:
    """``sum_i (n_i / n) x_i`` over the clients' arrays ``name``, in client order, in ``like``'s dtype and device.

    The sketch merge and the dense reference use this one function, so they
    weigh clients identically.
    """
    total = sum(u.num_examples for u in updates)
    out = torch.zeros_like(like)
    for u in updates:
        arrays = u.diagnostic if diagnostic else u.payload
        if arrays is None:
            raise ValueError(f"client {u.cid} has no diagnostic arrays")
        out += (u.num_examples / total) * torch.from_numpy(arrays[name]).to(out.device)
    return out
