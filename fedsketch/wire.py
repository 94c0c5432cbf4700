"""The message layout, defined once for clients and strategies.

A request to a node carries the global model and the round's config. In
simulation one Flower node runs a *cohort* of logical clients per call (so
Flower's per-call overhead is paid once per cohort, not once per client); each
logical client still gets its own reply entries, bytes and failure:

request  ``model``            ArrayRecord  {"w": float32[d]}, or instead ``catch-up``
                                           (a sparse payload, ``download = "sparse"`` with
                                           one client per node: see strategies/billing.py)
         ``config``           ConfigRecord {"server-round", "cids", ...}
         ``request.<cid>``    ArrayRecord  arrays for one client only (optional,
                                           e.g. Sketched-SGD's pending support)
         ``request.new``      ArrayRecord  with one client per node, arrays for a node's
                                           client the server cannot name yet (its first
                                           contact, e.g. PowerSGD's warm start)
reply    ``update.<cid>``     ArrayRecord  the client's payload (method-specific)
         ``metrics.<cid>``    MetricRecord {"num-examples", "loss", "compute-s"}, plus
                                           the method's round settings it was sent
                                           (e.g. the sketch's seed and shape)
         ``failure.<cid>``    ConfigRecord {"reason"} instead of the two above
         ``merged``           ArrayRecord  with ``merge-uploads`` (simulation), instead of
                                           every ``update.<cid>``: their example-weighted mean
         ``merged-metrics``   MetricRecord {"num-examples", "clipped"} of that mean; each
                                           ``metrics.<cid>`` then adds "upload-bytes", and a
                                           ``rejected.<cid>`` ConfigRecord {"reason"} stands for
                                           an upload the node's checks refused (fedsketch/client/uploads.py)
         ``diagnostic.<cid>`` ArrayRecord  {"update": float32[d]}, only with
                                           ``diagnose-sketch`` (simulation): the dense
                                           update the payload encodes; not
                                           communication, never counted as upload

A second exchange within a round (Sketched-SGD's query, ``"phase"`` 2 in the
config) carries ``query`` (ArrayRecord, shared by the node's clients) instead
of the model; replies have the same layout. A client that keeps state between
rounds (error feedback) keeps it in its node's ``Context.state`` under
``state.<cid>``, an ArrayRecord of float32 vectors.

A payload is a ``dict[str, numpy.ndarray]`` of plain arrays. Nothing here knows
Flower: :mod:`bridge.messages` turns these names into records for both sides.
A config's values are read with :func:`config_int`, :func:`config_ints` and
:func:`config_float`, which check the value's type and name the key of a wrong one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeGuard

MODEL_KEY = "model"
CATCH_UP_KEY = "catch-up"  # instead of the model: the coordinates changed since BASE_ROUND (a device that kept it)
BASE_ROUND = "base-round"
MODEL_CRC = "model-crc"  # echoed by a device that caught up: the CRC-32 of the model it trained on
WEIGHTS = "w"
CONFIG_KEY = "config"

ROUND = "server-round"
CIDS = "cids"
SETTLED = "settled"  # per listed client: the last round its upload was applied (-1: none), for clients with state
LR = "lr"
PHASE = "phase"
QUERY_KEY = "query"

NUM_EXAMPLES = "num-examples"
LOSS = "loss"
COMPUTE_S = "compute-s"
REASON = "reason"
MERGED_KEY = "merged"
MERGED_METRICS = "merged-metrics"
UPLOAD_BYTES = "upload-bytes"  # in a merged reply: what the client's own upload record would have serialized to
CLIPPED = "clipped"
KIND = "kind"  # in a ``rejected.<cid>`` record: "bounded" where the norm bound set the upload aside

_UPDATE = "update."
_METRICS = "metrics."
_FAILURE = "failure."
_REJECTED = "rejected."
_REQUEST = "request."
_STATE = "state."
_DIAGNOSTIC = "diagnostic."
DIAGNOSTIC_UPDATE = "update"
_NEW = "new"

NEW_CLIENT = -1
"""The id of a client the server cannot name yet. With one client per node (deployment) a node's client is its
``partition-id``, which the server learns from the node's first reply; until then what a method sends a client it
has not heard from travels under ``request.new``, and the node's client takes it as its own."""


def config_int(config: Mapping[str, object], key: str, default: int | None = None) -> int:
    """``config[key]``, an int (``default`` where the key is absent).

    Raises
    ------
    ValueError
        Naming the key, if it is absent and there is no default, or holds anything but an int.
    """
    value = config.get(key, default)
    if value is None:
        raise ValueError(f"config has no '{key}'")
    if not _is_int(value):
        raise ValueError(f"config '{key}' must be an int; got {_shown(value)}")
    return int(value)


def config_ints(config: Mapping[str, object], key: str) -> list[int]:
    """``config[key]``, a list of ints (``[]`` where the key is absent).

    Raises
    ------
    ValueError
        Naming the key, if it holds anything but a list of ints.
    """
    value = config.get(key, [])
    if not isinstance(value, list) or not all(map(_is_int, value)):
        raise ValueError(f"config '{key}' must be a list of ints; got {_shown(value)}")
    return [int(v) for v in value]


def config_float(config: Mapping[str, object], key: str, default: float) -> float:
    """``config[key]``, a number (``default`` where the key is absent or None).

    Raises
    ------
    ValueError
        Naming the key, if it holds anything but an int or a float.
    """
    value = config.get(key)
    if value is None:
        return default
    if not _is_number(value):
        raise ValueError(f"config '{key}' must be a number; got {_shown(value)}")
    return float(value)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)  # a bool is no count, round or client id


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _shown(value: object) -> str:
    return f"{type(value).__name__} {repr(value)[:60]}"


def update_key(cid: int) -> str:
    """Record key of logical client ``cid``'s payload."""
    return f"{_UPDATE}{cid}"


def metrics_key(cid: int) -> str:
    """Record key of logical client ``cid``'s metrics."""
    return f"{_METRICS}{cid}"


def failure_key(cid: int) -> str:
    """Record key of logical client ``cid``'s failure reason."""
    return f"{_FAILURE}{cid}"


def rejected_key(cid: int) -> str:
    """Record key of the reason a node's checks refused logical client ``cid``'s upload (merged replies)."""
    return f"{_REJECTED}{cid}"


def diagnostic_key(cid: int) -> str:
    """Record key of logical client ``cid``'s diagnostic arrays (simulation only, not an upload)."""
    return f"{_DIAGNOSTIC}{cid}"


def request_key(cid: int) -> str:
    """Record key of the arrays a request carries for logical client ``cid`` alone (``request.new``: NEW_CLIENT)."""
    return f"{_REQUEST}{_NEW if cid == NEW_CLIENT else cid}"


def request_cid(key: str) -> int | None:
    """``"request.17" -> 17``, ``"request.new" -> NEW_CLIENT``; ``None`` for any other key."""
    tail = key[len(_REQUEST) :] if key.startswith(_REQUEST) else ""
    if tail == _NEW:
        return NEW_CLIENT
    return int(tail) if tail.isdigit() else None


def state_key(cid: int) -> str:
    """Key of logical client ``cid``'s state in its node's ``Context.state``."""
    return f"{_STATE}{cid}"


def parse_cid(key: str) -> tuple[str, int] | None:
    """``"update.17" -> ("update", 17)``; ``None`` for a key of no known kind."""
    for prefix in (_UPDATE, _METRICS, _FAILURE, _REJECTED):
        if key.startswith(prefix):
            tail = key[len(prefix) :]
            if tail.isdigit():
                return prefix[:-1], int(tail)
    return None
