"""Sketched-SGD on Flower, with its second exchange inside the round.

Ivkin et al., NeurIPS 2019 (:mod:`fedsketch.algorithms.sketched_sgd`). Phase 1:
clients upload the sketch of their accumulated error ``v_i``; the server
merges the tables and picks ``P * k`` candidates. Phase 2 (:meth:`exchange`):
the same clients upload ``v_i`` at the candidates; the server applies the
top-k of the exact weighted sums. Both exchanges count in the bytes. Clients
learn the update's support, where they zero ``u_i`` and ``v_i``, in their next
round's request.
"""

from __future__ import annotations

from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.common.logger import log
from torch import nn

from fedsketch.algorithms import sketched_sgd
from fedsketch.compress.sparse import encode_support
from fedsketch.config import RunConfig
from strategies.base import FedSketchStrategy
from strategies.replies import ClientUpdate, PayloadSpec


class SketchedSGD(FedSketchStrategy):
    """Server state: each client's pending support, and the model."""

    def __init__(
        self, cfg: RunConfig, model: nn.Module, test_x: torch.Tensor, test_y: torch.Tensor, out_dir: Path | None = None
    ) -> None:
        super().__init__(cfg, model, test_x, test_y, out_dir)
        self.params = sketched_sgd.SketchedSGDParams(
            d=self.d, rows=cfg.sketch_rows, cols=cfg.sketch_cols, seed=cfg.seed, k=cfg.k,
            candidate_factor=cfg.candidate_factor, momentum=cfg.momentum,
        )  # fmt: skip
        self.state = sketched_sgd.ServerState()

    def keeps_client_state(self) -> bool:
        """Momentum and error accumulation live on the clients."""
        return True

    def payload_spec(self) -> PayloadSpec:
        """Phase 1: one float32 table of the run's sketch shape."""
        return {"table": ((self.params.rows, self.params.cols), np.dtype(np.float32))}

    def round_config(self, server_round: int) -> dict[str, Any]:
        """Every client derives the same hash functions from these."""
        return {"sketch-seed": self.params.seed, "sketch-rows": self.params.rows, "sketch-cols": self.params.cols}

    def request_payloads(self, server_round: int, cids: list[int]) -> dict[int, dict[str, np.ndarray]]:
        """Each returning client's pending support, to zero before it accumulates again."""
        pending = self.state.pending
        return {cid: encode_support(pending[cid].cpu(), self.d) for cid in cids if cid in pending}

    def apply(self, server_round: int, updates: list[ClientUpdate], weights: torch.Tensor) -> torch.Tensor:
        """Merge the tables, query the candidates' exact values, apply the top-k of their sums."""
        total = sum(u.num_examples for u in updates)
        merged = sum((u.num_examples / total) * torch.from_numpy(u.payload["table"]) for u in updates)
        cands = sketched_sgd.candidates(torch.as_tensor(merged), self.params)
        spec: PayloadSpec = {"val": ((cands.numel(),), np.dtype(np.float32))}
        got = self.exchange(server_round, updates, encode_support(cands, self.d), {}, spec)
        examples = {u.cid: u.num_examples for u in updates}
        answered = [a for a in got.updates if a.cid in examples]
        exact = torch.zeros(cands.numel())
        if answered:
            norm = sum(examples[a.cid] for a in answered)
            for a in answered:
                exact += (examples[a.cid] / norm) * torch.from_numpy(a.payload["val"])
        else:
            log(WARNING, "round %d: no client answered the second phase; model not updated", server_round)
        sketched = [u.cid for u in updates]
        self.state, idx, vals = sketched_sgd.server_step(
            self.state, self.params, cands, exact, sketched, [a.cid for a in answered]
        )
        delta = torch.zeros(self.d, device=self.weights.device)
        delta[idx.to(delta.device)] = self.lr_at(server_round) * vals.to(delta.device)
        return delta
