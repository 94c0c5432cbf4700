"""Run a cohort of logical clients in one process call.

Large-client simulation pays a framework cost per call (Flower's Ray round trip
is 15-20 ms); running the round's clients for one node in one call pays it once.
Each logical client stays exact: its own data, its own RNG stream, its own
payload, its own failure (an exception in one client is reported for that
client only and the others go on).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import nn

from fedsketch.client_side import ClientInput, Payload, RoundInfo, State, answer_query, diagnostic_payload, encode
from fedsketch.config import RunConfig
from fedsketch.local import client_generator, local_update
from fedsketch.task import client_options, load_data, local_spec, make_model

EXAMPLES = "num-examples"
"""A stateful client also remembers its last example count, which a second phase repeats."""


@dataclass(frozen=True)
class ClientOutcome:
    """One logical client's result: a payload and metrics, or a failure reason."""

    cid: int
    payload: Payload | None
    num_examples: int = 0
    loss: float = float("nan")
    compute_s: float = 0.0
    error: str | None = None
    state: State | None = None  # replaces what the client keeps; None leaves it as it was
    diagnostic: Payload | None = None  # with diagnose-sketch: the dense update (not an upload)


@lru_cache(maxsize=4)
def _scratch_model(cfg: RunConfig) -> nn.Module:
    """One reusable module per process and config: clients overwrite its weights."""
    return make_model(cfg, load_data(cfg))


def run_cohort(
    cfg: RunConfig,
    weights: np.ndarray,
    cids: list[int],
    info: RoundInfo,
    states: dict[int, State] | None = None,
    requests: dict[int, Payload] | None = None,
) -> list[ClientOutcome]:
    """Compute every listed client's payload from the global ``weights``.

    ``states`` holds what stateful clients kept from their last round and
    ``requests`` the arrays the server sent to one client alone; a client
    missing from either gets ``{}``.
    """
    states, requests = states or {}, requests or {}
    data = load_data(cfg)
    model = _scratch_model(cfg)
    device = next(model.parameters()).device
    w = torch.as_tensor(weights, dtype=torch.float32).to(device)
    spec, opts = local_spec(cfg), client_options(cfg)
    outcomes = []
    for cid in cids:
        start = time.perf_counter()
        try:
            x, y = data.client_data(cid)
            result = local_update(model, w, x, y, spec, client_generator(cfg.seed, info.server_round, cid))
            job = ClientInput(cid, info, states.get(cid, {}), requests.get(cid, {}))
            payload, state = encode(opts, result.update, job)
        except Exception as exc:  # noqa: BLE001 -- one client's failure must not sink the cohort
            outcomes.append(ClientOutcome(cid, None, error=f"{type(exc).__name__}: {exc}"))
            continue
        elapsed = time.perf_counter() - start
        if state:
            state = {**state, EXAMPLES: torch.tensor([float(result.num_examples)])}
        diagnostic = diagnostic_payload(result.update) if cfg.diagnose_sketch else None
        outcomes.append(
            ClientOutcome(
                cid, payload, result.num_examples, result.loss, elapsed, state=state or None, diagnostic=diagnostic
            )
        )
    return outcomes


def answer_queries(cids: list[int], states: dict[int, State], query: Payload) -> list[ClientOutcome]:
    """A second phase: each client answers ``query`` from its kept state (Sketched-SGD's exact values)."""
    outcomes = []
    for cid in cids:
        start = time.perf_counter()
        state = states.get(cid, {})
        try:
            payload = answer_query(state, query)
        except Exception as exc:  # noqa: BLE001 -- as above: this client only
            outcomes.append(ClientOutcome(cid, None, error=f"{type(exc).__name__}: {exc}"))
            continue
        examples = int(state[EXAMPLES][0]) if EXAMPLES in state else 1
        outcomes.append(ClientOutcome(cid, payload, examples, float("nan"), time.perf_counter() - start))
    return outcomes
