"""The ClientApp: receive the model, compute, reply with payloads.

A message names the logical clients to run (a cohort, in simulation); an empty
list means "you are one client": the node's ``partition-id`` (deployment).
Most methods are stateless; those whose clients keep error feedback (or
Sketched-SGD's momentum) keep it per logical client in this node's
``Context.state`` (the server sends a client to the same node every round), or
with ``client-state = "disk"`` in one file per client (:mod:`fedsketch.client_state`). A
``phase`` 2 message is Sketched-SGD's query: no training, each client answers
from its kept state.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from clients.secure import FITINS_CONFIG, is_secure, secure_aggregation_mod, secure_train
from fedsketch import wire
from fedsketch.client_side import Payload, RoundInfo, State
from fedsketch.client_state import DiskStates, state_root
from fedsketch.cohort import answer_queries, run_cohort
from fedsketch.config import RunConfig
from strategies.records import client_metrics, failure_record, payload_to_record, record_to_payload, weights_from

app = ClientApp(mods=[secure_aggregation_mod])


@lru_cache(maxsize=8)
def _parse(items: tuple[tuple[str, object], ...]) -> RunConfig:
    return RunConfig.from_mapping(dict(items))


def _round_info(config: ConfigRecord) -> RoundInfo:
    return RoundInfo(
        server_round=int(config[wire.ROUND]),  # type: ignore[arg-type]
        sketch_seed=int(config.get("sketch-seed", 0)),  # type: ignore[arg-type]
        sketch_rows=int(config.get("sketch-rows", 1)),  # type: ignore[arg-type]
        sketch_cols=int(config.get("sketch-cols", 1)),  # type: ignore[arg-type]
    )


class _ContextStates:
    """Client states in the node's ``Context.state`` (Flower keeps it with the node between messages)."""

    def __init__(self, context: Context) -> None:
        self.context = context

    def load(self, cid: int) -> State:
        record = self.context.state.array_records.get(wire.state_key(cid))
        return {} if record is None else {k: torch.from_numpy(arr) for k, arr in record_to_payload(record).items()}

    def save(self, cid: int, state: State) -> None:
        kept = {name: t.detach().float().cpu().numpy() for name, t in state.items()}
        self.context.state[wire.state_key(cid)] = payload_to_record(kept)


def _store(cfg: RunConfig, context: Context) -> _ContextStates | DiskStates:
    if cfg.client_state == "disk":  # one folder per Flower run: a new run never sees an old run's state
        return DiskStates(state_root(cfg) / f"run-{context.run_id}")
    return _ContextStates(context)


def _load_states(store: _ContextStates | DiskStates, cids: list[int]) -> tuple[dict[int, State], dict[int, str]]:
    """Each client's kept state, or why it cannot be read (that client fails alone)."""
    states, unreadable = {}, {}
    for cid in cids:
        try:
            states[cid] = store.load(cid)
        except ValueError as exc:
            unreadable[cid] = str(exc)
    return states, unreadable


def _requests(content: RecordDict, cids: list[int]) -> dict[int, Payload]:
    records = content.array_records
    return {cid: record_to_payload(records[wire.request_key(cid)]) for cid in cids if wire.request_key(cid) in records}


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Run the requested logical clients and reply with one entry per client."""
    cfg = _parse(tuple(sorted(context.run_config.items())))
    if is_secure(msg):  # SecAgg+'s masking stage: see clients/secure.py
        return secure_train(msg, context, cfg, _round_info(msg.content.config_records[FITINS_CONFIG]))
    config = msg.content.config_records[wire.CONFIG_KEY]
    cids = [int(c) for c in config.get(wire.CIDS, [])]  # type: ignore[union-attr]
    if not cids:
        cids = [int(context.node_config["partition-id"])]
    store = _store(cfg, context)
    states, unreadable = _load_states(store, cids)
    cids = [cid for cid in cids if cid in states]
    if int(config.get(wire.PHASE, 1)) == 2:  # type: ignore[arg-type]
        query = record_to_payload(msg.content.array_records[wire.QUERY_KEY])
        outcomes = answer_queries(cids, states, query)
    else:
        info = _round_info(config)
        outcomes = run_cohort(cfg, weights_from(msg.content), cids, info, states, _requests(msg.content, cids))
    echo = {key: int(config[key]) for key in wire.ECHO_KEYS if key in config}  # type: ignore[arg-type]
    content = RecordDict()
    for cid, reason in unreadable.items():
        content[wire.failure_key(cid)] = failure_record(reason)
    for out in outcomes:
        if out.state is not None:
            store.save(out.cid, out.state)
        if out.payload is None:
            content[wire.failure_key(out.cid)] = failure_record(out.error or "unknown error")
            continue
        content[wire.update_key(out.cid)] = payload_to_record(out.payload)
        content[wire.metrics_key(out.cid)] = client_metrics(out.num_examples, out.loss, out.compute_s, echo)
        if out.diagnostic is not None:  # diagnose-sketch: a separate record, never counted as upload
            content[wire.diagnostic_key(out.cid)] = payload_to_record(out.diagnostic)
    return Message(content=content, reply_to=msg)
