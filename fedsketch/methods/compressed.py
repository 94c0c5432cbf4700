"""The compressed-upload baselines: clients compress their update, the server averages and steps.

FetchSGD (Rothchild et al., ICML 2020, Sec. 6) is compared with sparsifiers
(local top-k and random-k, Stich et al., NeurIPS 2018; Gaussian-k, Shi et al.,
2019) and quantizers (QSGD, Alistarh et al., NeurIPS 2017; TernGrad, Wen et al.,
NeurIPS 2017; signSGD with error feedback, Karimireddy et al., ICML 2019, or by
majority vote, Bernstein et al., ICLR 2019). Each is a compressor from
:mod:`fedsketch.compress`, client-side error feedback where its paper uses it
(local top-k also without, as FetchSGD compares it: ``local-topk-error``), and
one server step: the example-weighted mean of the decoded uploads (or the
vote), then momentum SGD, sparsified to ``download-k`` coordinates if asked
(:mod:`fedsketch.algorithms.topk_sgd`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from fedsketch.algorithms import topk_sgd
from fedsketch.algorithms.aggregate import weighted_mean
from fedsketch.compress import Compressor, compress_with_feedback, derive_seed, registry
from fedsketch.compress.signsgd import majority_vote
from fedsketch.methods.method import (
    Client,
    ClientJob,
    Method,
    Payload,
    PayloadCheck,
    Round,
    Server,
    State,
    Wire,
)
from fedsketch.settings.declared import DECLARATIONS

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

(QSGD_LEVELS,) = DECLARATIONS["qsgd"].settings
(LOCAL_TOPK_ERROR,) = DECLARATIONS["local_topk"].settings
"""Local top-k's client memory, two named variants.

``client``: the client compresses ``update + error`` and keeps what its top-k
left out (Stich, Cordonnier and Jaggi, "Sparsified SGD with Memory", NeurIPS
2018; top-k itself: Aji and Heafield, EMNLP 2017). ``none``: the client sends
the top-k of its own update and keeps nothing, as FetchSGD's comparison runs
local top-k under sparse participation, where a client takes part too rarely to
carry an error (Rothchild et al., ICML 2020, Sec. 4-5; their CommEfficient code,
``fed_worker.py``, local top-k with ``error_type = "none"``; its ``"virtual"``
error lives on the server). The server step is the same either way.
"""
(SIGNSGD_VARIANT,) = DECLARATIONS["signsgd"].settings


@dataclass(frozen=True)
class Upload:
    """One method's compressor and how it is used.

    ``seed_scope``: ``"round"`` draws from a seed every client of the round and
    the server derive alike (random-k's coordinates, so values travel without
    positions); ``"client"`` from a seed private to the client and round
    (stochastic rounding: the server never needs it); ``"none"``: deterministic.
    """

    compressor: Compressor
    error_feedback: bool
    seed_scope: str = "none"
    vote: bool = False  # signSGD's majority vote instead of the mean

    def seed(self, run_seed: int, server_round: int, cid: int | None = None) -> int | None:
        """The compressor's seed; ``None`` where it needs none (or, on the server, for private seeds)."""
        if self.seed_scope == "round":
            return derive_seed(run_seed, server_round)
        if self.seed_scope == "client" and cid is not None:
            return derive_seed(run_seed, server_round, cid)
        return None


@dataclass(frozen=True)
class Compressed:
    """One compressed-upload method's own parts: its upload for a run, and whether it keeps client error.

    ``make(cfg, d, feedback)`` builds the run's :class:`Upload`; ``feedback(cfg)`` says
    whether clients keep error feedback (the biased compressors); ``sparsifier``: the
    server tallies the values each client sent against ``k``.
    """

    make: Callable[[RunConfig, int, bool], Upload]
    feedback: Callable[[RunConfig], bool]
    sparsifier: bool = False

    @lru_cache(maxsize=32)  # noqa: B019 -- six module-level records that live as long as the process
    def upload(self, cfg: RunConfig, d: int) -> Upload:
        """The run's upload for vectors of length ``d`` (options checked once)."""
        return self.make(cfg, d, self.feedback(cfg))

    def encode(self, update: torch.Tensor, job: ClientJob, cfg: RunConfig) -> tuple[Payload, State]:
        """Compress, with error feedback where the method uses it (the error is what the client keeps)."""
        up = self.upload(cfg, update.numel())
        seed = up.seed(cfg.seed, job.server_round, job.cid)
        if not up.error_feedback:
            return up.compressor.compress(update, seed=seed), {}
        payload, error = compress_with_feedback(
            update,
            job.state.get("error"),
            lambda vec: up.compressor.compress(vec, seed=seed),
            lambda sent: up.compressor.decompress(sent, seed=seed),
        )
        return payload, {"error": error}

    def layout(self, cfg: RunConfig, d: int, server_round: int) -> PayloadCheck:
        """Layouts vary (sparse encodings, Gaussian-k's count): decoding checks them."""
        up = self.upload(cfg, d)
        seed = up.seed(cfg.seed, server_round)
        return lambda payload: up.compressor.decompress(payload, seed=seed)

    def step(self, state: CompressedState, rnd: Round, cfg: RunConfig) -> tuple[CompressedState, torch.Tensor]:
        """Average (or vote on) the decoded updates, then momentum SGD."""
        decoded = [u.decoded for u in rnd.updates if isinstance(u.decoded, torch.Tensor)]
        if self.upload(cfg, rnd.d).vote:
            g = majority_vote(decoded)
        else:
            g = weighted_mean(decoded, [float(u.num_examples) for u in rnd.updates])
        tally = state.tally
        if self.sparsifier:  # how close to k each client lands
            sent = sum(int(u.payload["val"].size) for u in rnd.updates)
            tally = tally + torch.tensor([float(sent), float(len(rnd.updates))], dtype=torch.float64)
        inner, delta = topk_sgd.step(state.server, g.to(rnd.device), _params(cfg, rnd.d), rnd.lr)
        return CompressedState(inner, tally), delta

    def state_vectors(self, cfg: RunConfig) -> int:
        """The error-feedback memory, where the method keeps one."""
        return 1 if self.feedback(cfg) else 0


@dataclass(frozen=True)
class CompressedState:
    """Momentum velocity and error accumulator (with ``download-k``), and a tally of values sent."""

    server: topk_sgd.TopkServerState
    tally: torch.Tensor  # float64 [values sent, clients] since the last metrics row (sparsifiers)


def _params(cfg: RunConfig, d: int) -> topk_sgd.TopkServerParams:
    return topk_sgd.local_topk(
        d, download_k=cfg.download_k or None, momentum=cfg.momentum, momentum_zeroing=cfg.momentum_zeroing
    )


def init(cfg: RunConfig, d: int, device: torch.device) -> CompressedState:
    """Zero velocity and error; an empty tally."""
    return CompressedState(topk_sgd.init(_params(cfg, d), device=device), torch.zeros(2, dtype=torch.float64))


def report(state: CompressedState, cfg: RunConfig) -> tuple[CompressedState, dict[str, float]]:
    """For sparsifiers: mean coordinates sent per client since the last row, and its ratio to k."""
    sent, clients = state.tally.tolist()
    if not clients:
        return state, {}
    mean = sent / clients
    return CompressedState(state.server, torch.zeros_like(state.tally)), {
        "values_per_client": mean,
        "values_over_k": mean / cfg.k,
    }


def _bucket(cfg: RunConfig) -> int | None:
    return cfg.quantizer_bucket_size or None  # 0: one scale for the whole vector


def _always(cfg: RunConfig) -> bool:
    return True


def _never(cfg: RunConfig) -> bool:
    return False


LOCAL_TOPK = Compressed(
    lambda cfg, d, ef: Upload(registry.topk_compressor(d, k=cfg.k), ef),
    lambda cfg: LOCAL_TOPK_ERROR.of(cfg) == "client",
    sparsifier=True,
)
RANDOM_K = Compressed(
    lambda cfg, d, ef: Upload(registry.random_k_compressor(d, k=cfg.k), ef, "round"), _always, sparsifier=True
)
GAUSSIANK = Compressed(
    lambda cfg, d, ef: Upload(registry.gaussiank_compressor(d, k=cfg.k), ef), _always, sparsifier=True
)
QSGD = Compressed(
    lambda cfg, d, ef: Upload(
        registry.qsgd_compressor(d, s=QSGD_LEVELS.of(cfg), bucket_size=_bucket(cfg)), ef, "client"
    ),
    _never,
)
TERNGRAD = Compressed(
    lambda cfg, d, ef: Upload(registry.terngrad_compressor(d, bucket_size=_bucket(cfg)), ef, "client"), _never
)


def _signsgd(cfg: RunConfig, d: int, ef: bool) -> Upload:
    if not ef:  # majority vote: signs only, one scale for the whole vector (4 bytes), ignored by the server;
        # zeros get a random sign from the client's own seed
        return Upload(registry.signsgd_compressor(d, bucket_size=None, random_zeros=True), False, "client", vote=True)
    return Upload(registry.signsgd_compressor(d, bucket_size=_bucket(cfg)), True)


SIGNSGD = Compressed(_signsgd, lambda cfg: SIGNSGD_VARIANT.of(cfg) == "ef")


def _method(name: str, parts: Compressed) -> Method:
    return Method(
        DECLARATIONS[name],
        client=Client(parts.encode, state_vectors=parts.state_vectors),
        server=Server(init, parts.step, report=report),
        wire=Wire(parts.layout),
    )


METHODS = (
    _method("local_topk", LOCAL_TOPK),
    _method("random_k", RANDOM_K),
    _method("gaussiank", GAUSSIANK),
    _method("qsgd", QSGD),
    _method("terngrad", TERNGRAD),
    _method("signsgd", SIGNSGD),
)
