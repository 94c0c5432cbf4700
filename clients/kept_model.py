"""A deployed device's copy of the model, so that it is sent only what changed (``download = "sparse"``).

With one client per node (deployment) and sparse downloads, a device keeps the
model it last received in its node's ``Context.state``; the server then sends
it the new values of every coordinate changed since the round it last synced
(:func:`strategies.billing.catch_up`) instead of the whole model, and bills it
exactly that message. The device echoes the CRC-32 of the model it trained on
and the server rejects a mismatch, so a catch-up that went wrong costs one
round of that client, never a wrong update. With ``download-from-init`` a
device that never took part rebuilds the initial model from the run's seed and
is sent what changed since round 1, which it applies to that rebuilt model. A
device whose build differs (another torch on another platform) fails the CRC
check each time it is sampled as a newcomer (the server logs both CRCs): every
device must build the same initial model, or the run must leave the setting off.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np
from flwr.app import Array, ArrayRecord, Context

from bridge.messages import Request, typed_record
from fedsketch.compress.common import Payload
from fedsketch.compress.sparse import decode_sparse_pairs
from fedsketch.config import RunConfig
from fedsketch.data.run import load_data
from fedsketch.model.flat import get_flat
from fedsketch.server.ledger import INITIAL
from fedsketch.task import make_model

KEPT = "kept-model"


def weights_for(request: Request, context: Context, initial: Callable[[], np.ndarray] | None = None) -> np.ndarray:
    """This round's model: as sent, or the kept one (or, from round 1, ``initial()``) caught up.

    Raises
    ------
    ValueError
        If the request is a catch-up and the device kept no model, or one older
        than the catch-up's base round (it lost its state): the server sends the
        whole model next time.
    """
    if request.catch_up is None:
        if request.weights is None:
            raise ValueError("request carries neither the model nor a catch-up")
        return request.weights
    if initial is not None and request.base_round == INITIAL:  # the rebuilt initial model, never a kept one
        return apply_catch_up(initial(), request.catch_up)
    record = typed_record(context.state, KEPT, ArrayRecord)
    if record is None:
        raise ValueError("no kept model to catch up from (the device lost its state); the whole model comes next")
    kept_round = int(record["round"].numpy()[0])
    if kept_round < request.base_round:
        raise ValueError(
            f"the kept model is from round {kept_round}; the catch-up starts at round {request.base_round}"
        )
    return apply_catch_up(record["w"].numpy(), request.catch_up)


def apply_catch_up(weights: np.ndarray, payload: Payload) -> np.ndarray:
    """Overwrite the changed coordinates of the model the device kept (returns a new array)."""
    idx, val = decode_sparse_pairs(payload, weights.size)
    out = np.array(weights, dtype=np.float32, copy=True)
    out[idx.numpy()] = val.numpy()
    return out


def keep(context: Context, weights: np.ndarray, server_round: int) -> None:
    """Keep this round's model for the next catch-up."""
    round_tag = np.array([server_round], dtype=np.int64)
    context.state[KEPT] = ArrayRecord(
        {"w": Array(np.ascontiguousarray(weights, np.float32)), "round": Array(round_tag)}
    )


@lru_cache(maxsize=2)
def initial_weights(cfg: RunConfig) -> np.ndarray:
    """The run's initial model, flat float32, built from its seed as the server builds it (once per process)."""
    weights = get_flat(make_model(cfg, load_data(cfg))).detach().cpu().numpy().astype(np.float32)
    weights.setflags(write=False)
    return weights
