"""PowerSGD: clients send rank-r factors of their weight matrices, in two exchanges a round.

Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient
Compression for Distributed Optimization", NeurIPS 2019 (the math:
:mod:`fedsketch.algorithms.powersgd`). Exchange 1: with the model, every client
gets the warm-start ``Q_hat`` and uploads ``P_i = M_i Q_hat`` per matrix, and
its vectors whole; the server orthogonalizes the weighted mean of the ``P_i``.
Exchange 2: the same clients get ``P_hat`` and upload ``Q_i = M_i^T P_hat``;
the server's update is ``P_hat (sum_i w_i Q_i)^T`` per matrix, applied with
momentum SGD like every baseline. Both exchanges are billed both ways.

Where the state lives. The warm start ``Q`` is the same for every client and
each client takes part rarely, so the server keeps it (it is last round's mean
``Q``, which it already has) and sends it with the model: clients need not
remember it. Error feedback is per client, as in the paper: a client keeps
``e_i = M_i - P_hat Q_i^T``, what of its own corrected update ``M_i = g_i + e_i``
was not transmitted; summed over a round's clients these are exactly the
paper's ``M - M_hat``. Between the exchanges it holds ``M_i`` as its pending
state (:mod:`fedsketch.client.state`); its new error counts only once it has
answered the second exchange of a round the server applied.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedsketch.algorithms import momentum_sgd, powersgd
from fedsketch.algorithms.aggregate import weighted_mean
from fedsketch.compress import derive_seed
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
from fedsketch.model.build import model_shapes
from fedsketch.settings.declared import DECLARATIONS

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

(RANK,) = DECLARATIONS["powersgd"].settings
Q_STREAM = 0x9051  # the private seed stream of the first round's Q


@lru_cache(maxsize=8)
def plan(cfg: RunConfig) -> powersgd.Plan:
    """Which slices of the flat parameters are compressed, at the run's rank (from the model's shapes)."""
    return powersgd.plan(list(model_shapes(cfg)), RANK.of(cfg))


def encode(update: torch.Tensor, job: ClientJob, cfg: RunConfig) -> tuple[Payload, State]:
    """Exchange 1: ``P_i`` of ``M_i = g_i + e_i`` for every matrix, and the vectors whole; keep ``M_i``."""
    p = plan(cfg)
    target = update.detach().float() + job.state.get("error", torch.zeros_like(update)).to(update)
    q_hat = torch.from_numpy(job.request["q"]).to(update)
    payload = {"p": powersgd.project(target, q_hat, p).cpu().numpy(), "whole": powersgd.whole(target, p).cpu().numpy()}
    return payload, {"target": target}


def answer(state: State, query: Payload, cfg: RunConfig) -> tuple[Payload, State]:
    """Exchange 2: ``Q_i = M_i^T P_hat``; the client keeps ``e_i = M_i - P_hat Q_i^T``.

    Raises
    ------
    ValueError
        If this client kept no ``M_i`` (it did not take part in exchange 1 here).
    """
    if "target" not in state:
        raise ValueError("no PowerSGD exchange-1 state for this client on this node")
    p, target = plan(cfg), state["target"]
    p_hat = torch.from_numpy(query["p"]).to(target)
    q = powersgd.back_project(target, p_hat, p)
    return {"q": q.cpu().numpy()}, {"error": powersgd.residual(target, p_hat, q, p)}


def layout(cfg: RunConfig, d: int, server_round: int = 0) -> PayloadSpec:
    """Exchange 1: every P factor, then every whole tensor, as two float32 vectors."""
    p = plan(cfg)
    return {"p": ((p.p_size,), np.dtype(np.float32)), "whole": ((p.whole_size,), np.dtype(np.float32))}


@dataclass(frozen=True)
class PowerSGDState:
    """The server's momentum velocity, and the warm start: the last round's mean Q."""

    velocity: torch.Tensor
    q: torch.Tensor


def init(cfg: RunConfig, d: int, device: torch.device) -> PowerSGDState:
    """Zero velocity; a seeded random Q for the first round."""
    return PowerSGDState(torch.zeros(d, device=device), powersgd.initial_q(plan(cfg), derive_seed(cfg.seed, Q_STREAM)))


def requests(state: PowerSGDState, cids: list[int], cfg: RunConfig, d: int) -> dict[int, Payload]:
    """Every sampled client gets the orthogonalized warm start with the model, a node not yet named
    (``wire.NEW_CLIENT``) too: the warm start is the same for every client."""
    q_hat = powersgd.orthogonalize_all(state.q, plan(cfg), "q").cpu().numpy()
    return {cid: {"q": q_hat} for cid in cids}


def ask(state: PowerSGDState, rnd: Round, cfg: RunConfig) -> Query:
    """Exchange 2's question: the orthogonalized weighted mean of the P's, ``P_hat``, to every client."""
    p, weights = plan(cfg), [u.num_examples for u in rnd.updates]
    p_hat = powersgd.orthogonalize_all(weighted_mean([u.payload["p"] for u in rnd.updates], weights), p, "p")
    whole = weighted_mean([u.payload["whole"] for u in rnd.updates], weights)
    spec: PayloadSpec = {"q": ((p.q_size,), np.dtype(np.float32))}
    carry = {"p_hat": p_hat, "whole": whole}
    return Query(tuple(u.cid for u in rnd.updates), {"p": p_hat.numpy()}, spec, carry)


def step(state: PowerSGDState, rnd: Round, cfg: RunConfig) -> tuple[PowerSGDState, torch.Tensor]:
    """Apply ``P_hat Q^T`` (Q: the answers' weighted mean) and the whole tensors with momentum SGD.

    Raises
    ------
    ValueError
        If the round carries no query (:func:`~fedsketch.methods.method.server_step` asks it).
    """
    if rnd.query is None:
        raise ValueError("PowerSGD's step needs its query and the answers (Server.ask)")
    p, carry = plan(cfg), rnd.query.carry
    examples = {u.cid: u.num_examples for u in rnd.updates}
    answered = [a for a in rnd.answers if a.cid in examples]
    q = state.q
    if answered:
        q = weighted_mean([a.payload["q"] for a in answered], [examples[a.cid] for a in answered])
    else:
        logging.getLogger("flwr").warning(
            "round %d: no client answered PowerSGD's second exchange; its matrices are not updated", rnd.server_round
        )
    g = powersgd.expand(carry["p_hat"], q if answered else torch.zeros_like(q), carry["whole"], p, rnd.d)
    velocity, delta = momentum_sgd.step(
        momentum_sgd.MomentumState(state.velocity), g.to(rnd.device), rnd.lr, cfg.momentum
    )
    return PowerSGDState(velocity.velocity, q), delta


METHOD = Method(
    DECLARATIONS["powersgd"],
    client=Client(encode, answer, state_vectors=lambda cfg: 1, commit="answer"),
    server=Server(init, step, ask=ask, requests=requests),
    wire=Wire(layout),
    privacy=Privacy(norm=None),
)
