"""Sketched-SGD: clients keep momentum and error, upload a sketch, then exact values on request.

Ivkin, Rothchild, Ullah, Braverman, Stoica and Arora, "Communication-efficient
Distributed SGD with Sketching", NeurIPS 2019 (:mod:`fedsketch.algorithms.sketched_sgd`).
Phase 1: clients upload the sketch of their accumulated error ``v_i``; the
server merges the tables and picks ``P * k`` candidates. Phase 2 (the round's
second exchange): the same clients upload ``v_i`` at the candidates; the server
applies the top-k of the exact weighted sums. Both exchanges count in the
bytes. A client learns the update's support, where it zeroes ``u_i`` and
``v_i``, in its next round's request.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedsketch.algorithms import sketched_sgd
from fedsketch.algorithms.aggregate import weighted_mean
from fedsketch.compress.sparse import decode_support, encode_support
from fedsketch.methods.fetchsgd import layout, round_config
from fedsketch.methods.method import (
    Client,
    ClientJob,
    Method,
    Payload,
    PayloadSpec,
    Privacy,
    Query,
    Round,
    Server,
    State,
    Wire,
)
from fedsketch.settings.declared import DECLARATIONS
from fedsketch.settings.setting import ConfigError

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

(CANDIDATE_FACTOR,) = DECLARATIONS["sketched_sgd"].settings


def params(cfg: RunConfig, d: int, rc: dict[str, int] | None = None) -> sketched_sgd.SketchedSGDParams:
    """The run's parameters; a client takes the sketch's seed and shape from the round's config ``rc``."""
    rc = rc if rc is not None else round_config(cfg)
    return sketched_sgd.SketchedSGDParams(
        d=d,
        rows=rc["sketch-rows"],
        cols=rc["sketch-cols"],
        seed=rc["sketch-seed"],
        k=cfg.k,
        candidate_factor=CANDIDATE_FACTOR.of(cfg),
        momentum=cfg.momentum,
    )


def encode(update: torch.Tensor, job: ClientJob, cfg: RunConfig) -> tuple[Payload, State]:
    """Phase 1: zero at the pending support, accumulate, upload the sketch of ``v_i``."""
    p = params(cfg, update.numel(), dict(job.round_config))
    applied = decode_support(job.request, p.d).to(update.device) if job.request else None
    state, table = sketched_sgd.client_step(_client_state(job.state, update.device), update, p, applied)
    kept = {"error": state.error} if state.momentum is None else {"error": state.error, "momentum": state.momentum}
    return {"table": table.cpu().numpy()}, kept


def answer(state: State, query: Payload, cfg: RunConfig) -> tuple[Payload, State | None]:
    """Phase 2: the exact values of ``v_i`` at the queried coordinates.

    Raises
    ------
    ValueError
        If this client kept no error vector (it did not take part in phase 1 here).
    """
    if "error" not in state:
        raise ValueError("no Sketched-SGD state for this client on this node")
    error = state["error"]
    values = sketched_sgd.client_answer(sketched_sgd.ClientState(error=error), decode_support(query, error.numel()))
    return {"val": values.detach().float().cpu().numpy()}, None


def _client_state(state: State, device: torch.device) -> sketched_sgd.ClientState | None:
    if "error" not in state:
        return None
    momentum = state.get("momentum")
    return sketched_sgd.ClientState(
        error=state["error"].to(device), momentum=momentum.to(device) if momentum is not None else None
    )


def init(cfg: RunConfig, d: int, device: torch.device) -> sketched_sgd.ServerState:
    """No pending supports yet."""
    return sketched_sgd.ServerState()


def requests(state: sketched_sgd.ServerState, cids: list[int], cfg: RunConfig, d: int) -> dict[int, Payload]:
    """Each returning client's pending support, to zero before it accumulates again."""
    return {cid: encode_support(state.pending[cid].cpu(), d) for cid in cids if cid in state.pending}


def ask(state: sketched_sgd.ServerState, rnd: Round, cfg: RunConfig) -> Query:
    """Phase 2's question: merge the tables and ask every client for ``v_i`` at the ``P k`` candidates."""
    p = params(cfg, rnd.d)
    merged = weighted_mean([u.payload["table"] for u in rnd.updates], [u.num_examples for u in rnd.updates])
    cands = sketched_sgd.candidates(merged, p)
    spec: PayloadSpec = {"val": ((cands.numel(),), np.dtype(np.float32))}
    return Query(tuple(u.cid for u in rnd.updates), encode_support(cands, rnd.d), spec, {"candidates": cands})


def step(state: sketched_sgd.ServerState, rnd: Round, cfg: RunConfig) -> tuple[sketched_sgd.ServerState, torch.Tensor]:
    """Apply the top-k of the answers' weighted mean at the candidates (none answered: the model stays).

    Raises
    ------
    ValueError
        If the round carries no query (:func:`~fedsketch.methods.method.server_step` asks it).
    """
    if rnd.query is None:
        raise ValueError("Sketched-SGD's step needs its query and the answers (Server.ask)")
    p, cands = params(cfg, rnd.d), rnd.query.carry["candidates"]
    examples = {u.cid: u.num_examples for u in rnd.updates}
    answered = [a for a in rnd.answers if a.cid in examples]
    exact = torch.zeros(cands.numel())
    if answered:
        exact = weighted_mean([a.payload["val"] for a in answered], [examples[a.cid] for a in answered], exact)
    else:
        logging.getLogger("flwr").warning(
            "round %d: no client answered the second phase; model not updated", rnd.server_round
        )
    sketched = [u.cid for u in rnd.updates]
    state, idx, vals = sketched_sgd.server_step(state, p, cands, exact, sketched, [a.cid for a in answered])
    delta = torch.zeros(rnd.d, device=rnd.device)
    delta[idx.to(delta.device)] = rnd.lr * vals.to(delta.device)
    return state, delta


def check(cfg: RunConfig, d: int) -> None:
    """The candidates must fit the model.

    Raises
    ------
    ConfigError
        If ``candidate-factor * k`` exceeds the number of parameters.
    """
    factor = CANDIDATE_FACTOR.of(cfg)
    if factor * cfg.k > d:
        raise ConfigError(f"setting 'candidate-factor' x 'k' ({factor} x {cfg.k}) exceeds the model's {d} parameters")


METHOD = Method(
    DECLARATIONS["sketched_sgd"],
    client=Client(encode, answer, state_vectors=lambda cfg: 2 if cfg.momentum > 0 else 1),
    server=Server(init, step, ask=ask, requests=requests),
    wire=Wire(layout, round_config),
    privacy=Privacy(norm=None),
    check=check,
)
