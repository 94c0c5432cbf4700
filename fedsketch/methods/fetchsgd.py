"""FetchSGD: clients upload Count Sketches; the server keeps momentum and error in sketch space.

Rothchild, Panda, Ullah, Ivkin, Stoica, Braverman, Gonzalez and Arora,
"FetchSGD: Communication-Efficient Federated Learning with Sketching", ICML 2020.
A client sketches its gradient (:class:`fedsketch.sketch.count_sketch.CountSketch`); sketches
are linear, so the server merges the round's tables by a weighted sum and runs
Algorithm 1 (:mod:`fedsketch.algorithms.fetchsgd`). All state is on the server:
clients are stateless. With ``diagnose-sketch`` (simulation only) clients also
hand over their dense update and the server measures the step against a dense
shadow (:mod:`fedsketch.algorithms.fidelity`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch

from fedsketch import wire
from fedsketch.algorithms import fetchsgd, fidelity
from fedsketch.algorithms.aggregate import weighted_mean
from fedsketch.methods.method import (
    Client,
    ClientJob,
    ClientUpdate,
    Method,
    Payload,
    PayloadSpec,
    Privacy,
    Round,
    Server,
    State,
    Wire,
)
from fedsketch.settings.declared import DECLARATIONS
from fedsketch.sketch.batch import host_tables, sketch_tables
from fedsketch.sketch.count_sketch import CountSketch

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

ERROR_FEEDBACK, LR_PLACEMENT = DECLARATIONS["fetchsgd"].settings

State_ = fetchsgd.FetchSGDState | fidelity.FidelityState
S = TypeVar("S", fetchsgd.FetchSGDState, fidelity.FidelityState)


def params(cfg: RunConfig, d: int) -> fetchsgd.FetchSGDParams:
    """The run's FetchSGD hyper-parameters; the sketch's hash seed is the run seed."""
    return fetchsgd.FetchSGDParams(
        d=d,
        rows=cfg.sketch_rows,
        cols=cfg.sketch_cols,
        seed=cfg.seed,
        k=cfg.k,
        momentum=cfg.momentum,
        error_feedback=ERROR_FEEDBACK.of(cfg),
        momentum_zeroing=cfg.momentum_zeroing,
        lr_placement=LR_PLACEMENT.of(cfg),
    )


def round_config(cfg: RunConfig) -> dict[str, int]:
    """Every client derives the same hash functions from these (and echoes them back)."""
    return {"sketch-seed": cfg.seed, "sketch-rows": cfg.sketch_rows, "sketch-cols": cfg.sketch_cols}


def encode(update: torch.Tensor, job: ClientJob, cfg: RunConfig) -> tuple[Payload, State]:
    """The ``rows x cols`` table of the update's Count Sketch; no state."""
    rc = job.round_config
    sketch = CountSketch(
        update.numel(), rc["sketch-rows"], rc["sketch-cols"], seed=rc["sketch-seed"], device=update.device
    )
    sketch.accumulate(update)
    return {"table": sketch.table.cpu().numpy()}, {}


def encode_many(updates: list[torch.Tensor], jobs: list[ClientJob], cfg: RunConfig) -> list[tuple[Payload, State]]:
    """:func:`encode` for a chunk of clients: on a GPU their tables at once (:func:`encode_together`); on a
    CPU one client at a time (its windowed loops are its fast path, and the sums are the same)."""
    rc = jobs[0].round_config
    if updates[0].device.type == "cpu" or any(job.round_config != rc for job in jobs):
        return [encode(update, job, cfg) for update, job in zip(updates, jobs, strict=True)]
    return encode_together(updates, rc)


def encode_together(updates: list[torch.Tensor], rc: Mapping[str, int]) -> list[tuple[Payload, State]]:
    """Each update's table under one round config, sketched together (:func:`sketch_tables`) and copied to
    the host at once (:func:`host_tables`); each payload is a view of that copy."""
    tables = sketch_tables(torch.stack(updates), rc["sketch-rows"], rc["sketch-cols"], rc["sketch-seed"])
    return [({"table": table.numpy()}, {}) for table in host_tables(tables)]


def layout(cfg: RunConfig, d: int, server_round: int = 0) -> PayloadSpec:
    """One float32 table of the run's sketch shape."""
    return {"table": ((cfg.sketch_rows, cfg.sketch_cols), np.dtype(np.float32))}


def diagnostic(cfg: RunConfig, d: int) -> PayloadSpec | None:
    """With ``diagnose-sketch``: the client's dense float32 update, checked like any payload."""
    return {wire.DIAGNOSTIC_UPDATE: ((d,), np.dtype(np.float32))} if cfg.diagnose_sketch else None


def init(cfg: RunConfig, d: int, device: torch.device) -> State_:
    """Zero momentum and error sketches (and, when diagnosing, a zero dense shadow)."""
    if not cfg.diagnose_sketch:
        return fetchsgd.init(params(cfg, d), device=device)
    logging.getLogger("flwr").info(
        "diagnose-sketch: the dense shadow keeps 2 x d float32 (%.1f MiB) on the server, and each round holds "
        "every client's dense update; none of it is counted as upload",
        8 * d / 2**20,
    )
    return fidelity.init(params(cfg, d), device=device)


def step(state: State_, rnd: Round, cfg: RunConfig) -> tuple[State_, torch.Tensor]:
    """Merge the tables weighted by examples, then one FetchSGD step; with ``diagnose-sketch``, the same
    step measured against its dense shadow (:func:`fidelity.step`)."""
    p = params(cfg, rnd.d)
    if cfg.diagnose_sketch:
        measured = _state(fidelity.FidelityState, state, cfg)
        dense = [_diagnostic_update(u) for u in rnd.updates]
        true_mean = weighted_mean(dense, [u.num_examples for u in rnd.updates], like=measured.shadow.error)
        measured, update, _ = fidelity.step(measured, _merge(rnd, measured.sketched), true_mean, p, rnd.lr)
        return measured, update.dense(rnd.d)
    plain = _state(fetchsgd.FetchSGDState, state, cfg)
    plain, update = fetchsgd.step(plain, _merge(rnd, plain), p, rnd.lr)
    return plain, update.dense(rnd.d)


def _merge(rnd: Round, sketched: fetchsgd.FetchSGDState) -> torch.Tensor:
    """The round's tables, weighted by examples, in the sketches' dtype and on their device."""
    return weighted_mean(
        [u.payload["table"] for u in rnd.updates], [u.num_examples for u in rnd.updates], like=sketched.error
    )


def _state(kind: type[S], state: State_, cfg: RunConfig) -> S:
    """``state`` as the run's setting says it is: with ``diagnose-sketch`` a :class:`fidelity.FidelityState`
    (the sketches and their dense shadow), else the sketches alone; refused, naming both, otherwise."""
    if not isinstance(state, kind):
        raise TypeError(
            f"diagnose-sketch is {str(cfg.diagnose_sketch).lower()}, so FetchSGD's server state should be a "
            f"{kind.__name__}; got a {type(state).__name__} (a state made under the other setting)"
        )
    return state


def _diagnostic_update(u: ClientUpdate) -> np.ndarray:
    if u.diagnostic is None:
        raise ValueError(f"client {u.cid} has no diagnostic arrays")
    return u.diagnostic[wire.DIAGNOSTIC_UPDATE]


def sketch_norm(payload: Payload, d: int, seed: int) -> float:
    """The sketch's estimate of the norm of the vector it sketches (the median of its rows' norms)."""
    return CountSketch.from_table(torch.from_numpy(payload["table"]), d, seed).l2_estimate()


def norm(u: ClientUpdate, cfg: RunConfig, d: int) -> float:
    """``clip-norm`` bounds the sketched update's norm, as its sketch estimates it: the server never sees it."""
    return sketch_norm(u.payload, d, cfg.seed)


def sensitivity(cfg: RunConfig) -> float:
    """Each row of a table has the sketched vector's norm in expectation: the table, sqrt(rows) times it."""
    return math.sqrt(cfg.sketch_rows)


def report(state: State_, cfg: RunConfig) -> tuple[State_, dict[str, float]]:
    """With ``diagnose-sketch``: the sketch's fidelity, averaged over the rounds since the previous row."""
    if not cfg.diagnose_sketch:
        return state, {}
    state, rep = fidelity.report(_state(fidelity.FidelityState, state, cfg))
    return state, {
        "sketch_recall": rep.recall,
        "sketch_rel_error": rep.rel_error,
        "sketch_state_drift": rep.state_drift,
        "sketch_topk_mass": rep.topk_mass,
        "sketch_rounds": rep.rounds,
    }


METHOD = Method(
    DECLARATIONS["fetchsgd"],
    client=Client(encode, encode_many=encode_many),
    server=Server(init, step, report=report),
    wire=Wire(layout, round_config, diagnostic),
    privacy=Privacy(norm=norm, sensitivity=sensitivity),
)
