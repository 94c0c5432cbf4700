"""What each method's client puts on the wire, given its update (and, for some, its memory).

FetchSGD (Rothchild et al., ICML 2020) uploads the Count Sketch table of the
update; uncompressed methods upload the dense float32 vector; the compressed
baselines upload what their compressor makes of it (:mod:`fedsketch.methods`),
with client-side error feedback where their papers use it; Sketched-SGD
(Ivkin et al., NeurIPS 2019) uploads a sketch of its accumulated error, then
exact values on request (:func:`answer_query`). Payloads are plain numpy
arrays (see :mod:`fedsketch.wire`); state is a dict of float32 tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from fedsketch.algorithms import sketched_sgd
from fedsketch.compress import compress_with_feedback
from fedsketch.compress.sparse import decode_support
from fedsketch.methods import MethodOptions, upload_for
from fedsketch.sketch import CountSketch

Payload = dict[str, np.ndarray]
State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class RoundInfo:
    """What a client learns from the round's config besides the model."""

    server_round: int
    sketch_seed: int
    sketch_rows: int
    sketch_cols: int


@dataclass(frozen=True)
class ClientOptions:
    """Run-level settings of a client's upload (a typed slice of the run config)."""

    strategy: str
    seed: int = 0
    method: MethodOptions = field(default_factory=lambda: MethodOptions(k=1))
    momentum: float = 0.0  # Sketched-SGD's local momentum; the others keep momentum on the server
    candidate_factor: int = 1


@dataclass(frozen=True)
class ClientInput:
    """One logical client's inputs besides its update."""

    cid: int
    info: RoundInfo
    state: State = field(default_factory=dict)  # what it kept from its last round ({} the first time)
    request: Payload = field(default_factory=dict)  # arrays the server sent to it alone


Encoder = Callable[[torch.Tensor, ClientInput, ClientOptions], tuple[Payload, State]]


def sketch_payload(update: torch.Tensor, job: ClientInput, opts: ClientOptions) -> tuple[Payload, State]:
    """FetchSGD: the ``rows x cols`` table of the update's Count Sketch; no state."""
    info = job.info
    sketch = CountSketch(
        update.numel(), info.sketch_rows, info.sketch_cols, seed=info.sketch_seed, device=update.device
    )
    sketch.accumulate(update)
    return {"table": sketch.table.cpu().numpy()}, {}


def diagnostic_payload(update: torch.Tensor) -> Payload:
    """The dense update itself, for ``diagnose-sketch`` (simulation only): the server's exact reference.

    A copy, so that nothing the client does afterwards can change it.
    """
    return {"update": update.detach().to("cpu", torch.float32).numpy().copy()}


def compressed_payload(update: torch.Tensor, job: ClientInput, opts: ClientOptions) -> tuple[Payload, State]:
    """A dense, sparsifying or quantizing baseline: compress, with error feedback where the method uses it."""
    upload = upload_for(opts.strategy, update.numel(), opts.method)
    seed = upload.seed(opts.seed, job.info.server_round, job.cid)
    if not upload.error_feedback:
        return upload.compressor.compress(update, seed=seed), {}
    payload, error = compress_with_feedback(
        update,
        job.state.get("error"),
        lambda vec: upload.compressor.compress(vec, seed=seed),
        lambda sent: upload.compressor.decompress(sent, seed=seed),
    )
    return payload, {"error": error}


def sketched_sgd_params(d: int, info: RoundInfo, opts: ClientOptions) -> sketched_sgd.SketchedSGDParams:
    """Sketched-SGD's parameters as a client sees them."""
    return sketched_sgd.SketchedSGDParams(
        d=d, rows=info.sketch_rows, cols=info.sketch_cols, seed=info.sketch_seed, k=opts.method.k,
        candidate_factor=opts.candidate_factor, momentum=opts.momentum,
    )  # fmt: skip


def sketched_sgd_payload(update: torch.Tensor, job: ClientInput, opts: ClientOptions) -> tuple[Payload, State]:
    """Sketched-SGD phase 1: zero at the pending support, accumulate, upload the sketch of ``v_i``."""
    params = sketched_sgd_params(update.numel(), job.info, opts)
    applied = decode_support(job.request, params.d).to(update.device) if job.request else None
    state, table = sketched_sgd.client_step(_sketched_state(job.state, update.device), update, params, applied)
    kept = {"error": state.error} if state.momentum is None else {"error": state.error, "momentum": state.momentum}
    return {"table": table.cpu().numpy()}, kept


def answer_query(state: State, query: Payload) -> Payload:
    """Sketched-SGD phase 2: the exact values of ``v_i`` at the queried coordinates.

    Raises
    ------
    ValueError
        If this client kept no error vector (it did not take part in phase 1 here).
    """
    if "error" not in state:
        raise ValueError("no Sketched-SGD state for this client on this node")
    error = state["error"]
    values = sketched_sgd.client_answer(sketched_sgd.ClientState(error=error), decode_support(query, error.numel()))
    return {"val": values.detach().float().cpu().numpy()}


def _sketched_state(state: State, device: torch.device) -> sketched_sgd.ClientState | None:
    if "error" not in state:
        return None
    momentum = state.get("momentum")
    return sketched_sgd.ClientState(
        error=state["error"].to(device), momentum=momentum.to(device) if momentum is not None else None
    )


ENCODERS: dict[str, Encoder] = {
    "fetchsgd": sketch_payload,
    "sketched_sgd": sketched_sgd_payload,
    **dict.fromkeys(
        ("fedavg", "true_topk", "local_topk", "random_k", "gaussiank", "qsgd", "terngrad", "signsgd"),
        compressed_payload,
    ),
}


def encode(opts: ClientOptions, update: torch.Tensor, job: ClientInput) -> tuple[Payload, State]:
    """The payload a client of ``opts.strategy`` uploads for ``update``, and the state it keeps."""
    try:
        encoder = ENCODERS[opts.strategy]
    except KeyError:
        raise ValueError(f"no client encoder for strategy {opts.strategy!r}; known: {sorted(ENCODERS)}") from None
    return encoder(update, job, opts)
