"""The ClientApp: receive the model, compute, reply with payloads.

A message names the logical clients to run (a cohort, in simulation); an empty
list means "you are one client": the node's ``partition-id`` (deployment).
What a client computes and uploads is its method's (:mod:`fedsketch.methods`),
run by :mod:`fedsketch.client.cohort`; this module is Flower plumbing. Methods whose
clients keep state (error feedback, Sketched-SGD's momentum) keep it per
logical client in this node's ``Context.state`` (the server sends a client to
the same node every round), or with ``client-state = "disk"`` in one file per
client; a new state stays pending until the server says it applied the upload
that led to it (:mod:`fedsketch.client.state`). A phase-2 message is a second exchange
(Sketched-SGD's query): no training, each client answers from its kept state.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from flwr.app import ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from bridge import messages
from clients import kept_model
from clients.merged import merged_reply
from clients.secure import is_secure, secure_aggregation_mod, secure_train
from fedsketch import wire
from fedsketch.client import state as client_state
from fedsketch.client.cohort import ClientOutcome, answer_queries, run_cohort
from fedsketch.client.state import DiskStates, state_root
from fedsketch.client.uploads import mergeable
from fedsketch.config import RunConfig
from fedsketch.methods import ClientJob, State, received_round_config

app = ClientApp(mods=[secure_aggregation_mod])


@lru_cache(maxsize=8)
def _parse(items: tuple[tuple[str, object], ...]) -> RunConfig:
    return RunConfig.from_mapping(dict(items))


def run_config(context: Context) -> RunConfig:
    """The run's config, parsed once per process."""
    return _parse(tuple(sorted(context.run_config.items())))


class ContextStates:
    """Client states in the node's ``Context.state`` (Flower keeps it with the node between messages)."""

    def __init__(self, context: Context) -> None:
        self.context = context

    def load(self, cid: int) -> State:
        """What client ``cid`` kept ({} the first time)."""
        record = messages.typed_record(self.context.state, wire.state_key(cid), ArrayRecord)
        return {} if record is None else {k: torch.from_numpy(a) for k, a in messages.record_to_payload(record).items()}

    def save(self, cid: int, state: State) -> None:
        """Replace what client ``cid`` keeps."""
        kept = {name: t.detach().float().cpu().numpy() for name, t in state.items()}
        self.context.state[wire.state_key(cid)] = messages.payload_to_record(kept)


def _store(cfg: RunConfig, context: Context) -> ContextStates | DiskStates:
    if cfg.client_state == "disk":  # one folder per Flower run: a new run never sees an old run's state
        return DiskStates(state_root(cfg) / f"run-{context.run_id}")
    return ContextStates(context)


def _settled(request: messages.Request, cids: list[int]) -> dict[int, int]:
    """Per client, the last round the server applied its upload (as the request says; absent: unknown)."""
    rounds = wire.config_ints(request.config, wire.SETTLED)
    return {cid: r for cid, r in zip(cids, rounds) if r >= 0}


def _jobs(
    store: ContextStates | DiskStates, request: messages.Request, cids: list[int], round_config: dict[str, int]
) -> tuple[list[ClientJob], dict[int, State], dict[int, str]]:
    """Each client's job and the committed state its new state will sit beside, or why it cannot run.

    A first exchange starts from the client's settled state; a second exchange
    reads what this round's first exchange left pending. A client whose kept
    state cannot be read, or who has nothing pending for a second exchange, fails alone.
    A node that is one client and was sent no arrays under its id takes those
    for a client the server cannot name yet (``wire.NEW_CLIENT``) as its own.
    """
    settled = _settled(request, cids)
    own = {} if request.cids else request.extras.get(wire.NEW_CLIENT, {})  # a node the server has not heard from
    jobs, bases, failed = [], {}, {}
    for cid in cids:
        try:
            stored = store.load(cid)
            if request.phase == 2:
                state, bases[cid] = client_state.pending(stored, request.server_round), client_state.committed(stored)
            else:
                state = bases[cid] = client_state.settle(stored, settled.get(cid))
        except ValueError as exc:
            failed[cid] = str(exc)
            continue
        jobs.append(ClientJob(cid, request.server_round, round_config, state, request.extras.get(cid, own)))
    return jobs, bases, failed


def _train(
    cfg: RunConfig, request: messages.Request, context: Context, jobs: list[ClientJob], echo: dict[str, int]
) -> tuple[list[ClientOutcome], dict[str, int], int]:
    """A first exchange: the model (kept and caught up, on a device with sparse downloads), then the cohort;
    also the model's size (0 where there is none)."""
    try:
        initial = (lambda: kept_model.initial_weights(cfg)) if cfg.download_from_init else None
        weights = kept_model.weights_for(request, context, initial)
    except ValueError as exc:
        return [ClientOutcome(job.cid, None, error=str(exc)) for job in jobs], echo, 0
    if cfg.download == "sparse" and cfg.client_assignment == "node":
        kept_model.keep(context, weights, request.server_round)
        echo = {**echo, wire.MODEL_CRC: messages.model_crc(weights)}
    return run_cohort(cfg, weights, jobs), echo, weights.size


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Run the requested logical clients and reply with one entry per client."""
    cfg = run_config(context)
    if is_secure(msg):  # SecAgg+'s masking stage: see clients/secure.py
        return secure_train(msg, context, cfg)
    request = messages.read_request(msg.content)
    cids = request.cids or [int(context.node_config["partition-id"])]
    echo = received_round_config(cfg, request.config)
    store = _store(cfg, context)
    jobs, bases, unreadable = _jobs(store, request, cids, echo)
    d = 0
    if request.phase == 2:
        outcomes = answer_queries(cfg, jobs, request.query or {})
    else:
        outcomes, echo, d = _train(cfg, request, context, jobs, echo)
    content = RecordDict()
    for cid, reason in unreadable.items():
        messages.add_failure(content, cid, reason)
    if d and request.cids and mergeable(cfg):  # a simulated node's cohort of clients without state
        merged_reply(cfg, content, outcomes, echo, d, request.server_round)
        return Message(content=content, reply_to=msg)
    outcomes.reverse()
    while outcomes:  # each client's arrays are let go once the reply holds their bytes
        out = outcomes.pop()
        if out.state is not None:  # pending until the server says it applied this round's upload
            store.save(out.cid, client_state.with_pending(bases[out.cid], out.state, request.server_round))
        if out.payload is None:
            messages.add_failure(content, out.cid, out.error)
            continue
        metrics = messages.client_metrics(out.num_examples, out.loss, out.compute_s, echo)
        messages.add_update(content, out.cid, out.payload, metrics, out.diagnostic)
    return Message(content=content, reply_to=msg)
