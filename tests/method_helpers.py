"""Driving a method's client and server sides by hand, as the ClientApp and the strategy would."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from fedsketch.config import RunConfig
from fedsketch.methods import ClientJob, ClientUpdate, Payload, State, compressed, get_method
from fedsketch.methods.method import Ask, Query, Round, server_step

PARTS = {  # each compressed method's record part, by name
    "local_topk": compressed.LOCAL_TOPK,
    "random_k": compressed.RANDOM_K,
    "gaussiank": compressed.GAUSSIANK,
    "qsgd": compressed.QSGD,
    "terngrad": compressed.TERNGRAD,
    "signsgd": compressed.SIGNSGD,
}


def job(
    cfg: RunConfig, cid: int = 0, server_round: int = 1, state: State | None = None, request: Payload | None = None
) -> ClientJob:
    """One client's job with the round settings the server would send."""
    return ClientJob(cid, server_round, get_method(cfg.strategy).wire.round_config(cfg), state or {}, request or {})


def encode(cfg: RunConfig, update: torch.Tensor, **kwargs: object) -> tuple[Payload, State]:
    """What a client of ``cfg.strategy`` uploads for ``update`` (and keeps)."""
    return get_method(cfg.strategy).client.encode(update, job(cfg, **kwargs), cfg)  # type: ignore[arg-type]


def step(strat: object, updates: list[ClientUpdate], server_round: int = 1, ask: Ask | None = None) -> torch.Tensor:
    """One server step of a strategy's method on these updates; the strategy keeps the new state."""
    rnd = Round(server_round, strat.lr_at(server_round), updates, strat.d, strat.weights.device)  # type: ignore[attr-defined]
    state, delta, _ = server_step(strat.method, strat.state, rnd, strat.cfg, ask)  # type: ignore[attr-defined]
    strat.values = replace(strat.values, state=state)  # type: ignore[attr-defined]
    return delta


def second_exchange_upload(cfg: RunConfig, d: int, upload_bytes: Callable[[Payload], int]) -> int:
    """What one client uploads in its method's second exchange (0 without one), by running one step.

    Three clients encode Gaussian updates; the step's exchange is answered from
    their kept states; ``upload_bytes`` prices one answer as the wire would.
    """
    method = get_method(cfg.strategy)
    if method.client.answer is None:
        return 0
    answer = method.client.answer
    state = method.server.init(cfg, d, torch.device("cpu"))
    requests = method.server.requests(state, [0, 1, 2], cfg, d)
    gen = torch.Generator().manual_seed(0)
    kept, updates = {}, []
    for cid in range(3):
        payload, kept[cid] = encode(cfg, torch.randn(d, generator=gen), cid=cid, request=requests.get(cid))
        updates.append(ClientUpdate(cid, payload, 10, 0.0, 0))
    sizes: list[int] = []

    def ask(asked: list[ClientUpdate], query: Query) -> list[ClientUpdate]:
        answers = [answer(kept[u.cid], query.payload, cfg)[0] for u in asked]
        sizes.extend(upload_bytes(a) for a in answers)
        return [ClientUpdate(u.cid, a, u.num_examples, 0.0, 0) for u, a in zip(asked, answers)]

    server_step(method, state, Round(1, 0.1, updates, d, torch.device("cpu")), cfg, ask)
    if len(set(sizes)) != 1:
        raise ValueError(f"{cfg.strategy}: second-exchange answers of different sizes {sizes}")
    return sizes[0]
