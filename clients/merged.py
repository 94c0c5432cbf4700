"""A node's merged reply: its cohort's linear uploads as one mean, each client still judged and billed alone.

With ``merge-uploads`` (:func:`fedsketch.client.uploads.mergeable`) a simulated node does not copy each
client's upload into its reply. It judges each upload with the server's own checks, clips it as the
server would (``clip-norm``), and replies with

- ``metrics.<cid>``: the client's metrics, as unmerged, plus ``upload-bytes``: the serialized size of
  the upload record it would have sent (:func:`bridge.messages.payload_bytes`), which the server bills;
- ``failure.<cid>`` for a client whose own code failed, ``rejected.<cid>`` for one whose upload the
  checks refused, with the bytes its upload and metrics records would have cost (the server counts it
  as rejected and bills it, as it would have);
- ``merged`` (arrays) and ``merged-metrics``: the example-weighted mean of the accepted uploads, their
  total examples and how many were clipped.
"""

from __future__ import annotations

from flwr.app import MetricRecord, RecordDict

from bridge import messages
from fedsketch import wire
from fedsketch.client.cohort import ClientOutcome
from fedsketch.client.uploads import check_upload, clip_payload, merge, set_aside
from fedsketch.config import RunConfig
from fedsketch.methods import ClientUpdate, get_method
from fedsketch.server.privacy import clip_factor
from fedsketch.task import resolve_device


def merged_reply(
    cfg: RunConfig, content: RecordDict, outcomes: list[ClientOutcome], echo: dict[str, int], d: int, server_round: int
) -> None:
    """Add every outcome's entries and the merged mean of the accepted uploads to ``content``."""
    method = get_method(cfg.strategy)
    spec = method.wire.layout(cfg, d, server_round)
    assert isinstance(spec, dict)  # mergeable(cfg) holds: a fixed layout
    checked, sent = [], {}
    for out in outcomes:
        if out.payload is None:
            messages.add_failure(content, out.cid, out.error)
            continue
        metrics = messages.client_metrics(out.num_examples, out.loss, out.compute_s, echo)
        sent[out.cid] = (metrics, messages.payload_bytes(out.payload))
        try:
            check_upload(out.payload, spec)
        except ValueError as exc:  # sent, so billed: its upload and metrics records
            messages.add_rejection(content, out.cid, str(exc), sum(_billed(*sent[out.cid])))
            continue
        checked.append(ClientUpdate(out.cid, out.payload, out.num_examples, out.loss, 0))
    kept, aside = set_aside(cfg, d, checked, "its cohort's")
    for cid, why in aside.items():
        messages.add_rejection(content, cid, why, sum(_billed(*sent[cid])), kind="bounded")
    accepted, weights, clipped = [], [], 0
    for u in kept:
        payload, factor = u.payload, _clip(cfg, u, d)
        if factor < 1.0:
            payload, clipped = clip_payload(payload, factor), clipped + 1
        metrics, billed = sent[u.cid]
        content[wire.metrics_key(u.cid)] = MetricRecord({**metrics, wire.UPLOAD_BYTES: billed})
        accepted.append(payload)
        weights.append(u.num_examples)
    if accepted:
        content[wire.MERGED_KEY] = messages.payload_to_record(
            merge(accepted, weights, spec, resolve_device(cfg.device))
        )
        content[wire.MERGED_METRICS] = MetricRecord({wire.NUM_EXAMPLES: sum(weights), wire.CLIPPED: clipped})


def _billed(metrics: MetricRecord, upload: int) -> tuple[int, int]:
    """What a client whose upload the node refused sent: its upload's and its metrics record's bytes."""
    return upload, messages.wire_bytes(metrics)


def _clip(cfg: RunConfig, update: ClientUpdate, d: int) -> float:
    """``clip-norm``'s factor for this upload, by the norm the server would use (1.0: none)."""
    norm_of = get_method(cfg.strategy).privacy.norm
    if cfg.clip_norm <= 0 or norm_of is None:
        return 1.0
    return clip_factor(norm_of(update, cfg, d), cfg.clip_norm)
