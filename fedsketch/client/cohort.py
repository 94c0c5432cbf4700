"""Run a cohort of logical clients in one process call.

Large-client simulation pays a framework cost per call (a Ray round trip under
Flower's Ray backend: docs/flower.md); running the round's clients for one node in
one call pays it once.
Each logical client stays exact: its own data, its own RNG stream, its own
payload, its own failure (an exception in one client is reported for that
client only and the others go on).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from fedsketch import wire
from fedsketch.config import RunConfig
from fedsketch.data.run import load_data
from fedsketch.data.spec import FederatedData
from fedsketch.methods import ClientJob, Payload, State, get_method
from fedsketch.task import local_spec, make_model
from fedsketch.training.batched import (
    ClientBatch,
    LocalClient,
    functional_copy,
    per_client_gradients,
    per_client_local_training,
)
from fedsketch.training.local import LocalResult, client_generator, local_update, require_examples, sample_batch

LOG = logging.getLogger(__name__)

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


_THREAD = threading.local()
_BUILD = threading.RLock()  # building a model seeds torch's global generator (inside fork_rng): one at a time
_KEPT = 4  # models kept per thread (the most recent configs)


def _per_thread(kind: str, cfg: RunConfig, build: Callable[[], nn.Module]) -> nn.Module:
    """A module cached per thread and config: one thread's clients overwrite its weights while another's train.

    A simulation process whose ClientApp calls run on several threads
    (``bridge/runtime/simulation_backend.py``) gives each thread its own; a process
    with one thread has one, as before.
    """
    cache: dict[tuple[str, RunConfig], nn.Module] = _THREAD.__dict__.setdefault("models", {})
    key = (kind, cfg)
    if key not in cache:
        with _BUILD:
            cache[key] = build()
        while len(cache) > _KEPT:
            del cache[next(iter(cache))]
    return cache[key]


def _scratch_model(cfg: RunConfig) -> nn.Module:
    """One reusable module per thread and config: clients overwrite its weights."""
    return _per_thread("scratch", cfg, lambda: make_model(cfg, load_data(cfg)))


def _vectorizable_model(cfg: RunConfig) -> nn.Module:
    """The scratch model as :mod:`fedsketch.training.batched` runs it (batch norm without running statistics)."""
    return _per_thread("vectorizable", cfg, lambda: functional_copy(_scratch_model(cfg)))


@dataclass(frozen=True)
class _Local:
    """A client's local result (or why it has none) and the seconds it took."""

    result: LocalResult | None
    seconds: float = 0.0  # none charged to a client without a result
    error: str | None = None


def run_cohort(cfg: RunConfig, weights: np.ndarray, jobs: list[ClientJob]) -> list[ClientOutcome]:
    """Compute every listed client's payload from the global ``weights``, in the jobs' order."""
    model = _scratch_model(cfg)
    w = torch.as_tensor(weights, dtype=torch.float32).to(next(model.parameters()).device)
    outcomes: list[ClientOutcome] = []
    # A chunk's updates are all held until encoded: one client at a time, or client-batching at a time.
    step = max(cfg.client_batching, 1)
    for chunk in (jobs[i : i + step] for i in range(0, len(jobs), step)):
        cids = [job.cid for job in chunk]
        if cfg.client_batching:
            local = _vectorized_results(cfg, w, cids, chunk[0].server_round)
            outcomes.extend(_finish_chunk(cfg, chunk, local))
        else:
            local = {job.cid: _one_result(cfg, model, w, job.cid, job.server_round) for job in chunk}
            outcomes.extend(_finish(cfg, job, local[job.cid]) for job in chunk)
    return outcomes


def _finish_chunk(cfg: RunConfig, jobs: list[ClientJob], local: dict[int, _Local]) -> list[ClientOutcome]:
    """A vectorized chunk's payloads: in one call where the method encodes many at once, each client
    charged an equal share of it; one at a time otherwise, or should that call fail (so a failure
    stays with the client that caused it)."""
    encoded = _encode_together(cfg, jobs, local)
    return [
        _outcome(cfg, job.cid, *encoded[job.cid]) if job.cid in encoded else _finish(cfg, job, local[job.cid])
        for job in jobs
    ]


def _encode_together(
    cfg: RunConfig, jobs: list[ClientJob], local: dict[int, _Local]
) -> dict[int, tuple[LocalResult, Payload, State, float]]:
    """Per client with a result: its result, payload, new state and seconds, from one ``encode_many`` call;
    empty where the method has none, fewer than two clients have a result, or the call fails."""
    encode_many = get_method(cfg.strategy).client.encode_many
    ready = {job.cid: (job, result) for job in jobs if (result := local[job.cid].result) is not None}
    if encode_many is None or len(ready) < 2 or cfg.diagnose_sketch:
        return {}
    start = time.perf_counter()
    try:
        encoded = encode_many([r.update for _, r in ready.values()], [job for job, _ in ready.values()], cfg)
    except Exception as exc:  # noqa: BLE001 -- one at a time instead: each failure its client's own
        LOG.warning(
            "client-batching: the batched encode failed (%s: %s); one client at a time", type(exc).__name__, exc
        )
        return {}
    share = (time.perf_counter() - start) / len(ready)
    return {
        cid: (result, payload, state, local[cid].seconds + share)
        for (cid, (_, result)), (payload, state) in zip(ready.items(), encoded, strict=True)
    }


def _finish(cfg: RunConfig, job: ClientJob, local: _Local) -> ClientOutcome:
    """Encode one client's update into its payload (and state); a failure is this client's alone."""
    start = time.perf_counter()
    result = local.result
    if result is None:
        return ClientOutcome(job.cid, None, error=local.error)
    try:
        payload, state = get_method(cfg.strategy).client.encode(result.update, job, cfg)
    except Exception as exc:  # noqa: BLE001 -- one client's failure must not sink the cohort
        return ClientOutcome(job.cid, None, error=f"{type(exc).__name__}: {exc}")
    return _outcome(cfg, job.cid, result, payload, state, local.seconds + time.perf_counter() - start)


def _outcome(
    cfg: RunConfig, cid: int, result: LocalResult, payload: Payload, state: State, seconds: float
) -> ClientOutcome:
    """A client's outcome from its local result and its encoded payload and new state."""
    if state:
        state = {**state, EXAMPLES: torch.tensor([float(result.num_examples)])}
    diagnostic = _dense_copy(result.update) if cfg.diagnose_sketch else None
    return ClientOutcome(
        cid, payload, result.num_examples, result.loss, seconds, state=state or None, diagnostic=diagnostic
    )


def _dense_copy(update: torch.Tensor) -> Payload:
    """The dense update itself, for ``diagnose-sketch``: the server's exact reference (a copy nothing can change)."""
    return {wire.DIAGNOSTIC_UPDATE: update.detach().to("cpu", torch.float32).numpy().copy()}


def _one_result(cfg: RunConfig, model: nn.Module, w: torch.Tensor, cid: int, server_round: int) -> _Local:
    """One client's local computation on its own, failures caught (they are this client's alone)."""
    start = time.perf_counter()
    try:
        x, y = load_data(cfg).client_data(cid)
        result = local_update(model, w, x, y, local_spec(cfg), client_generator(cfg.seed, server_round, cid))
    except Exception as exc:  # noqa: BLE001 -- one client's failure must not sink the cohort
        return _Local(None, error=f"{type(exc).__name__}: {exc}")
    return _Local(result, time.perf_counter() - start)


def _vectorized_results(cfg: RunConfig, w: torch.Tensor, cids: list[int], server_round: int) -> dict[int, _Local]:
    """The clients' local results ``client-batching`` at a time (:mod:`fedsketch.training.batched`).

    Each client samples its batches with its own generator, exactly as
    :func:`~fedsketch.training.local.local_update` does. Should the vectorized call
    fail, every client is computed on its own (with a fresh generator), so a
    failure stays with the client that caused it. Each client is charged an
    equal share of the call.
    """
    start = time.perf_counter()
    clients, local = _client_data(load_data(cfg), cids, cfg, server_round)
    ready = list(clients)
    if not ready:  # every client of the chunk failed before training
        return local
    try:
        results = _vectorized(cfg, w, [clients[c] for c in ready])
    except Exception as exc:  # noqa: BLE001 -- fall back to one client at a time, failures and all
        LOG.warning(
            "client-batching: the vectorized call failed (%s: %s); its clients run one at a time",
            type(exc).__name__,
            exc,
        )
        return {**local, **{c: _one_result(cfg, _scratch_model(cfg), w, c, server_round) for c in ready}}
    share = (time.perf_counter() - start) / len(ready)
    local.update({cid: _Local(result, share) for cid, result in zip(ready, results, strict=True)})
    return local


def _vectorized(cfg: RunConfig, w: torch.Tensor, clients: list[LocalClient]) -> list[LocalResult]:
    """One gradient a client, or ``local-steps`` SGD steps a client, vectorized across clients."""
    spec, model = local_spec(cfg), _vectorizable_model(cfg)
    if spec.mode == "delta":
        deltas = per_client_local_training(model, w, clients, spec, cfg.client_batching)
        return [LocalResult(delta, len(c.x), loss) for c, (delta, loss) in zip(clients, deltas, strict=True)]
    drawn = [sample_batch(c.x, c.y, spec.batch_size, c.gen) for c in clients]
    batches = [ClientBatch(x.to(w.device), y.to(w.device)) for x, y in drawn]
    grads = per_client_gradients(model, w, batches, cfg.client_batching)
    return [
        LocalResult(grad + spec.weight_decay * w if spec.weight_decay else grad, len(b.y), loss)
        for b, (grad, loss) in zip(batches, grads, strict=True)
    ]


def _client_data(
    data: FederatedData, cids: list[int], cfg: RunConfig, server_round: int
) -> tuple[dict[int, LocalClient], dict[int, _Local]]:
    """Each client's data and generator, or its failure (no data, bad id)."""
    clients, failed = {}, {}
    for cid in cids:
        try:
            x, y = data.client_data(cid)
            require_examples(x)
        except Exception as exc:  # noqa: BLE001 -- this client only
            failed[cid] = _Local(None, error=f"{type(exc).__name__}: {exc}")
            continue
        clients[cid] = LocalClient(x, y, client_generator(cfg.seed, server_round, cid))
    return clients, failed


def answer_queries(cfg: RunConfig, jobs: list[ClientJob], query: Payload) -> list[ClientOutcome]:
    """A second exchange: each client answers ``query`` from its kept state (Sketched-SGD's exact values)."""
    answer = get_method(cfg.strategy).client.answer
    outcomes = []
    for job in jobs:
        start = time.perf_counter()
        try:
            if answer is None:
                raise ValueError(f"strategy {cfg.strategy} has no second exchange")
            payload, state = answer(job.state, query, cfg)
        except Exception as exc:  # noqa: BLE001 -- as above: this client only
            outcomes.append(ClientOutcome(job.cid, None, error=f"{type(exc).__name__}: {exc}"))
            continue
        examples = int(job.state[EXAMPLES][0]) if EXAMPLES in job.state else 1
        if state is not None:
            state = {**state, EXAMPLES: job.state[EXAMPLES]} if EXAMPLES in job.state else state
        elapsed = time.perf_counter() - start
        outcomes.append(ClientOutcome(job.cid, payload, examples, float("nan"), elapsed, state=state))
    return outcomes
