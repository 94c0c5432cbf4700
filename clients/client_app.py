"""The ClientApp: receive the model, compute, reply with payloads.

A message names the logical clients to run (a cohort, in simulation); an empty
list means "you are one client": the node's ``partition-id`` (deployment).
Most methods are stateless; those whose clients keep error feedback (or
Sketched-SGD's momentum) keep it per logical client in this node's
``Context.state`` (the server sends a client to the same node every round). A
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


def _load_state(context: Context, cid: int) -> State:
    record = context.state.array_records.get(wire.state_key(cid))
    return {} if record is None else {name: torch.from_numpy(arr) for name, arr in record_to_payload(record).items()}


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
    states = {cid: _load_state(context, cid) for cid in cids}
    if int(config.get(wire.PHASE, 1)) == 2:  # type: ignore[arg-type]
        query = record_to_payload(msg.content.array_records[wire.QUERY_KEY])
        outcomes = answer_queries(cids, states, query)
    else:
        info = _round_info(config)
        outcomes = run_cohort(cfg, weights_from(msg.content), cids, info, states, _requests(msg.content, cids))
    echo = {key: int(config[key]) for key in wire.ECHO_KEYS if key in config}  # type: ignore[arg-type]
    content = RecordDict()
    for out in outcomes:
        if out.state is not None:
            kept = {name: t.detach().float().cpu().numpy() for name, t in out.state.items()}
            context.state[wire.state_key(out.cid)] = payload_to_record(kept)
        if out.payload is None:
            content[wire.failure_key(out.cid)] = failure_record(out.error or "unknown error")
            continue
        content[wire.update_key(out.cid)] = payload_to_record(out.payload)
        content[wire.metrics_key(out.cid)] = client_metrics(out.num_examples, out.loss, out.compute_s, echo)
        if out.diagnostic is not None:  # diagnose-sketch: a separate record, never counted as upload
            content[wire.diagnostic_key(out.cid)] = payload_to_record(out.diagnostic)
    return Message(content=content, reply_to=msg)
