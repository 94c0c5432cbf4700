"""The client side of SecAgg+ (``secure-aggregation``; the server side is ``strategies/secure.py``).

Flower's ``secaggplus_mod`` runs the protocol's key and share stages by itself;
at the masking stage it calls the app, which answers here in the legacy
``FitRes`` layout the mod reads: one node's example-weighted mean of its
clients' payloads and their total number of examples. The mod then weights,
quantizes and masks it, and uploads only the masked integers.

Because the server never sees single clients, a node clips its own clients
(``clip-norm``, on the norm the method's server would use: the sketch's
estimate for FetchSGD) before summing them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MessageType

from bridge.messages import records_of, typed_record
from fedsketch import wire
from fedsketch.algorithms.aggregate import weighted_mean
from fedsketch.client.cohort import ClientOutcome, run_cohort
from fedsketch.config import RunConfig
from fedsketch.methods import ClientJob, ClientUpdate, get_method, received_round_config
from fedsketch.server.privacy import clip_factor

FITINS_CONFIG, FITINS_PARAMETERS = "fitins.config", "fitins.parameters"


def secure_aggregation_mod(msg: Message, context: Context, call_next: Callable[[Message, Context], Message]) -> Message:
    """Messages of the SecAgg+ protocol go through Flower's mod (runs with ``secure-aggregation`` only); all
    others straight to the app."""
    if msg.metadata.message_type != MessageType.TRAIN or not context.run_config.get("secure-aggregation"):
        return call_next(msg, context)
    from bridge import legacy

    if typed_record(msg.content, legacy.RECORD_KEY_CONFIGS, ConfigRecord) is None:  # one lookup a message
        return call_next(msg, context)
    return legacy.secaggplus_mod(msg, context, call_next)


def is_secure(msg: Message) -> bool:
    """Whether a train message is SecAgg+'s masking stage (the legacy FitIns layout)."""
    return typed_record(msg.content, FITINS_CONFIG, ConfigRecord) is not None


def secure_train(msg: Message, context: Context, cfg: RunConfig) -> Message:
    """Run the node's clients; reply with their weighted mean and example count as a FitRes.

    Raises
    ------
    RuntimeError
        If none of the node's clients produced an update (the node then drops
        out of the round, which SecAgg+ tolerates down to its threshold).
    """
    from bridge.legacy import Code, FitRes, Status, compat, ndarrays_to_parameters, parameters_to_ndarrays

    found = records_of(msg.content)
    config, record = found.configs[FITINS_CONFIG], found.arrays[FITINS_PARAMETERS]
    weights = parameters_to_ndarrays(compat.arrayrecord_to_parameters(record, keep_input=True))[0]
    cids = wire.config_ints(config, wire.CIDS) or [int(context.node_config["partition-id"])]
    round_config, server_round = received_round_config(cfg, config), wire.config_int(config, wire.ROUND)
    jobs = [ClientJob(cid, server_round, round_config) for cid in cids]
    outcomes = run_cohort(cfg, weights, jobs)
    done = [out for out in outcomes if out.payload is not None]
    if not done:
        raise RuntimeError(f"no client of this node produced an update: {[o.error for o in outcomes][:3]}")
    total = sum(out.num_examples for out in done)
    names = sorted(done[0].payload or {})  # every outcome in done has a payload
    clipped = [_clipped(out, cfg, weights.size) for out in done]
    examples = [out.num_examples for out in done]
    mean = [weighted_mean([c[name] for c in clipped], examples).numpy() for name in names]
    losses = [out.loss for out in done if out.loss == out.loss]
    metrics: dict[str, bool | bytes | float | int | str] = {
        "clients": len(done),
        "failed": len(outcomes) - len(done),
        "loss": float(np.mean(losses)) if losses else float("nan"),
    }
    parameters = ndarrays_to_parameters([np.asarray(m, np.float32) for m in mean])
    fitres = FitRes(Status(Code.OK, ""), parameters, total, metrics)
    return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)


def _clipped(out: ClientOutcome, cfg: RunConfig, d: int) -> dict[str, np.ndarray]:
    """The client's payload in float64, scaled to norm ``clip-norm`` if above it, by the norm the server would use."""
    payload = {name: np.asarray(arr, np.float64) for name, arr in (out.payload or {}).items()}
    norm_of = get_method(cfg.strategy).privacy.norm
    if cfg.clip_norm <= 0 or norm_of is None:
        return payload
    update = ClientUpdate(out.cid, out.payload or {}, out.num_examples, out.loss, 0)
    factor = clip_factor(norm_of(update, cfg, d), cfg.clip_norm)
    return {name: arr * factor for name, arr in payload.items()}
