"""The compressed-upload baselines on Flower: records in, fedsketch math, records out.

``true_topk`` (Rothchild et al., ICML 2020, Sec. 6): clients upload dense
updates and the server takes the top-k of their momentum-accumulated mean with
error feedback (:func:`fedsketch.compress.server.true_topk`), the upper bound of
sparsification. Every other baseline (:mod:`fedsketch.methods`) has its clients
upload a compressed update; the server decodes each payload while validating
it, averages them by examples (signSGD's ``majority`` variant takes the vote
instead, Bernstein et al., ICLR 2019) and applies momentum SGD
(:func:`fedsketch.compress.server.step`). With ``download-k`` the server
sends back only the top-k of its accumulated update and keeps the rest in a
server-side error accumulator (top-k on the download, as in Rothchild et al.'s
local top-k baseline), so ``download = "sparse"`` charges returning clients
for k coordinates a round instead of the union of every client's support.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedsketch.compress import server
from fedsketch.compress.signsgd import majority_vote
from fedsketch.config import RunConfig
from fedsketch.methods import SPARSIFIERS, upload_for
from fedsketch.task import method_options
from strategies.base import FedSketchStrategy
from strategies.fedavg import weighted_mean
from strategies.replies import ClientUpdate, PayloadCheck, PayloadSpec


class TrueTopK(FedSketchStrategy):
    """Server state: momentum and error, both dense, and the model."""

    def __init__(
        self, cfg: RunConfig, model: nn.Module, test_x: torch.Tensor, test_y: torch.Tensor, out_dir: Path | None = None
    ) -> None:
        super().__init__(cfg, model, test_x, test_y, out_dir)
        self.params = server.true_topk(self.d, cfg.k, momentum=cfg.momentum, momentum_zeroing=cfg.momentum_zeroing)
        self.state = server.init(self.params, device=self.weights.device)

    def payload_spec(self) -> PayloadSpec:
        """One dense float32 vector."""
        return {"update": ((self.d,), np.dtype(np.float32))}

    def apply(self, server_round: int, updates: list[ClientUpdate], weights: torch.Tensor) -> torch.Tensor:
        """Weighted mean of the dense updates, then the top-k step with error accumulation."""
        mean = weighted_mean(updates, "update", self.weights.device)
        self.state, delta = server.step(self.state, mean, self.params, self.lr_at(server_round))
        return delta


class CompressedUpload(FedSketchStrategy):
    """``local_topk``, ``random_k``, ``gaussiank``, ``qsgd``, ``terngrad``, ``signsgd``.

    Server state: the momentum velocity, the error accumulator (with
    ``download-k``; zero otherwise) and the model. Clients of the methods
    with error feedback keep it themselves (see :meth:`keeps_client_state`).
    """

    def __init__(
        self, cfg: RunConfig, model: nn.Module, test_x: torch.Tensor, test_y: torch.Tensor, out_dir: Path | None = None
    ) -> None:
        super().__init__(cfg, model, test_x, test_y, out_dir)
        self.upload = upload_for(cfg.strategy, self.d, method_options(cfg))
        self.vote = cfg.strategy == "signsgd" and cfg.signsgd_variant == "majority"
        self.params = server.local_topk(
            self.d, download_k=cfg.download_k or None, momentum=cfg.momentum, momentum_zeroing=cfg.momentum_zeroing
        )
        self.state = server.init(self.params, device=self.weights.device)
        self._values_sent: list[int] = []  # per client, for sparsifiers: how close to k they land

    def keeps_client_state(self) -> bool:
        """Error feedback lives on the clients."""
        return self.upload.error_feedback

    def payload_spec(self) -> PayloadCheck:
        """Layouts vary (sparse encodings, Gaussian-k's count): decode to check."""
        return self._decode

    def _decode(self, payload: dict[str, np.ndarray]) -> torch.Tensor:
        seed = self.upload.seed(self.cfg.seed, self.current_round)
        return self.upload.compressor.decompress(payload, seed=seed)

    def apply(self, server_round: int, updates: list[ClientUpdate], weights: torch.Tensor) -> torch.Tensor:
        """Average (or vote on) the decoded updates, then momentum SGD."""
        decoded = [u.decoded for u in updates if isinstance(u.decoded, torch.Tensor)]
        if self.vote:
            g = majority_vote(decoded)
        else:
            g = server.weighted_mean(decoded, [float(u.num_examples) for u in updates])
        if self.cfg.strategy in SPARSIFIERS:
            self._values_sent.extend(int(u.payload["val"].size) for u in updates)
        self.state, delta = server.step(self.state, g.to(self.weights.device), self.params, self.lr_at(server_round))
        return delta

    def round_metrics(self) -> dict[str, float]:
        """For sparsifiers: mean coordinates sent per client since the last row, and its ratio to k."""
        if not self._values_sent:
            return {}
        mean = float(np.mean(self._values_sent))
        self._values_sent = []
        return {"values_per_client": mean, "values_over_k": mean / self.cfg.k}
