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
(:mod:`fedsketch.compress.server`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from fedsketch.aggregate import weighted_mean
from fedsketch.compress import Compressor, compress_with_feedback, derive_seed, get_compressor, server
from fedsketch.compress.signsgd import majority_vote
from fedsketch.methods.method import ClientJob, Method, Payload, PayloadCheck, Round, State
from fedsketch.setting import Setting

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

QSGD_LEVELS = Setting("qsgd-levels", int, 15, "QSGD's levels s (bit-packed, 8 bits at most)", minimum=1, maximum=255)
LOCAL_TOPK_ERROR = Setting(
    "local-topk-error",
    str,
    "client",
    "`client` (each client keeps the error its top-k left out, Stich et al. 2018) or `none` (stateless: the "
    "top-k of its own update, FetchSGD's local top-k baseline)",
    choices=("client", "none"),
)
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
SIGNSGD_VARIANT = Setting(
    "signsgd-variant",
    str,
    "ef",
    "`ef` (EF-signSGD: scaled signs, client error feedback) or `majority` (sign bits, majority vote)",
    choices=("ef", "majority"),
)
COMMON = ("momentum", "momentum-zeroing", "download-k")
SPARSIFIERS = ("local_topk", "random_k", "gaussiank")


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


UploadFn = Callable[["RunConfig", int], Upload]


def _bucket(cfg: RunConfig) -> int | None:
    return cfg.quantizer_bucket_size or None  # 0: one scale for the whole vector


def _signsgd(cfg: RunConfig, d: int) -> Upload:
    if SIGNSGD_VARIANT.of(cfg) == "majority":
        # A vote needs signs only: one scale for the whole vector (4 bytes), ignored by the server;
        # zeros get a random sign from the client's own seed.
        return Upload(get_compressor("signsgd", d, bucket_size=None, random_zeros=True), False, "client", vote=True)
    return Upload(get_compressor("signsgd", d, bucket_size=_bucket(cfg)), error_feedback=True)


UPLOADS: dict[str, UploadFn] = {
    "local_topk": lambda cfg, d: Upload(get_compressor("topk", d, k=cfg.k), error_feedback=error_feedback(cfg)),
    "random_k": lambda cfg, d: Upload(get_compressor("random_k", d, k=cfg.k), True, seed_scope="round"),
    "gaussiank": lambda cfg, d: Upload(get_compressor("gaussiank", d, k=cfg.k), error_feedback=True),
    "qsgd": lambda cfg, d: Upload(
        get_compressor("qsgd", d, s=QSGD_LEVELS.of(cfg), bucket_size=_bucket(cfg)), False, seed_scope="client"
    ),
    "terngrad": lambda cfg, d: Upload(get_compressor("terngrad", d, bucket_size=_bucket(cfg)), False, "client"),
    "signsgd": _signsgd,
}


@lru_cache(maxsize=32)
def upload(cfg: RunConfig, d: int) -> Upload:
    """The run's upload for vectors of length ``d`` (options checked once)."""
    return UPLOADS[cfg.strategy](cfg, d)


def encode(update: torch.Tensor, job: ClientJob, cfg: RunConfig) -> tuple[Payload, State]:
    """Compress, with error feedback where the method uses it (the error is what the client keeps)."""
    up = upload(cfg, update.numel())
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


def layout(cfg: RunConfig, d: int, server_round: int) -> PayloadCheck:
    """Layouts vary (sparse encodings, Gaussian-k's count): decoding checks them."""
    up = upload(cfg, d)
    seed = up.seed(cfg.seed, server_round)
    return lambda payload: up.compressor.decompress(payload, seed=seed)


@dataclass(frozen=True)
class CompressedState:
    """Momentum velocity and error accumulator (with ``download-k``), and a tally of values sent."""

    server: server.TopkServerState
    tally: torch.Tensor  # float64 [values sent, clients] since the last metrics row (sparsifiers)


def _params(cfg: RunConfig, d: int) -> server.TopkServerParams:
    return server.local_topk(
        d, download_k=cfg.download_k or None, momentum=cfg.momentum, momentum_zeroing=cfg.momentum_zeroing
    )


def init(cfg: RunConfig, d: int, device: torch.device) -> CompressedState:
    """Zero velocity and error; an empty tally."""
    return CompressedState(server.init(_params(cfg, d), device=device), torch.zeros(2, dtype=torch.float64))


def step(state: CompressedState, rnd: Round, cfg: RunConfig) -> tuple[CompressedState, torch.Tensor]:
    """Average (or vote on) the decoded updates, then momentum SGD."""
    decoded = [u.decoded for u in rnd.updates if isinstance(u.decoded, torch.Tensor)]
    if upload(cfg, rnd.d).vote:
        g = majority_vote(decoded)
    else:
        g = weighted_mean(decoded, [float(u.num_examples) for u in rnd.updates])
    tally = state.tally
    if cfg.strategy in SPARSIFIERS:  # how close to k each client lands
        sent = sum(int(u.payload["val"].size) for u in rnd.updates)
        tally = tally + torch.tensor([float(sent), float(len(rnd.updates))], dtype=torch.float64)
    inner, delta = server.step(state.server, g.to(rnd.device), _params(cfg, rnd.d), rnd.lr)
    return CompressedState(inner, tally), delta


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


def error_feedback(cfg: RunConfig) -> bool:
    """Whether clients keep error feedback: the biased compressors (sparsifiers, EF-signSGD), unless told not to."""
    if cfg.strategy == "local_topk":
        return LOCAL_TOPK_ERROR.of(cfg) == "client"
    return cfg.strategy in SPARSIFIERS or (cfg.strategy == "signsgd" and SIGNSGD_VARIANT.of(cfg) == "ef")


def state_vectors(cfg: RunConfig) -> int:
    """The error-feedback memory, where the method keeps one."""
    return 1 if error_feedback(cfg) else 0


def _method(name: str, upload_desc: str, keeps: str, paper: str, **facts: object) -> Method:
    return Method(
        name=name,
        upload=upload_desc,
        client_state=keeps,
        paper=paper,
        encode=encode,
        layout=layout,
        init=init,
        step=step,
        report=report,
        state_vectors=state_vectors,
        **facts,  # type: ignore[arg-type]
    )


METHODS = (
    _method(
        "local_topk",
        "own top-k, values and positions",
        "client: error, d floats; none: none",
        "Stich et al., NeurIPS 2018; Rothchild et al., ICML 2020 (none)",
        settings=(LOCAL_TOPK_ERROR,),
        uses=("k", *COMMON),
        sweep={"k": "k", "local-topk-error": "error"},
    ),
    _method(
        "random_k",
        "k values at coordinates the round shares",
        "error, d floats",
        "Stich et al., NeurIPS 2018",
        uses=("k", *COMMON),
        sweep={"k": "k"},
    ),
    _method(
        "gaussiank",
        "values above a Gaussian-fit threshold",
        "error, d floats",
        "Shi et al., 2019",
        uses=("k", *COMMON),
        sweep={"k": "k"},
    ),
    _method(
        "qsgd",
        "s-level stochastic quantization",
        "none (unbiased)",
        "Alistarh et al., NeurIPS 2017",
        settings=(QSGD_LEVELS,),
        uses=("quantizer-bucket-size", *COMMON),
        sweep={"qsgd-levels": "levels"},
    ),
    _method(
        "terngrad",
        "stochastic ternarization",
        "none (unbiased)",
        "Wen et al., NeurIPS 2017",
        uses=("quantizer-bucket-size", *COMMON),
    ),
    _method(
        "signsgd",
        "scaled signs (ef) or sign bits (majority)",
        "ef: error, d floats; majority: none",
        "Karimireddy et al., ICML 2019; Bernstein et al., ICLR 2019",
        settings=(SIGNSGD_VARIANT,),
        uses=("quantizer-bucket-size", *COMMON),
    ),
)
