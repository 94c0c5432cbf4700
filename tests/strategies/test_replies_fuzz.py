"""Hostile replies against every strategy: no crash, and the model as if they had not been sent.

Each example takes one round of honest replies (from the real ClientApp, run in
this process), corrupts the entries of a few clients (or whole nodes) in one
of many ways, and feeds them to a strategy. A twin strategy gets the honest
replies with those clients' entries removed. The two must end the round with
bit-identical models and states, and every corrupted client must be counted
as a failure of the right kind.
"""

from __future__ import annotations

import copy
import io
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, RecordDict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bridge.flower import task_identity
from bridge.messages import copy_content, model_record
from fedsketch import wire
from fedsketch.config import RunConfig
from fedsketch.methods import NAMES as STRATEGIES
from strategies.server_app import build_strategy
from strategies.strategy import FedSketchStrategy
from tests.federation import TestGrid

TINY = {
    "num-clients": 20,
    "clients-per-round": 6,
    "model-hidden": 16,
    "k": 30,
    "num-rounds": 3,
    "sketch-rows": 3,
    "sketch-cols": 200,
    "min-replies": 1,
}
Mutation = Callable[[RecordDict, int, np.random.Generator, "Honest"], None]


@dataclass(frozen=True)
class Honest:
    """One strategy's config, grid (whose nodes keep client state) and honest round-1 replies."""

    cfg: RunConfig
    grid: TestGrid
    replies: list[Message]
    sent: dict[int, list[int]]
    echo: dict[str, Any]


@cache
def honest(name: str) -> Honest:
    cfg = RunConfig.from_mapping({**TINY, "strategy": name})
    grid = TestGrid(cfg.to_mapping(), num_nodes=2)
    strat = build_strategy(cfg, None)
    with task_identity():
        requests = strat.configure_train(1, model_record(strat.weights.numpy()), ConfigRecord(), grid)
        replies = grid.send_and_receive(requests)
    assert strat.plan is not None
    return Honest(cfg, grid, replies, dict(strat.plan.sent), dict(strat.plan.echo))


# ------------------------------------------------------------------ corruptions of one client's entries
def _record(content: RecordDict, cid: int) -> ArrayRecord:
    return content.array_records[wire.update_key(cid)]


def _first(content: RecordDict, cid: int, kind: str | None = None) -> tuple[str, np.ndarray]:
    """The first array of the client's payload (of float kind, if asked and there is one)."""
    items = [(name, arr.numpy()) for name, arr in _record(content, cid).items()]
    floats = [item for item in items if item[1].dtype.kind == kind]
    return (floats or items)[0]


def _set(content: RecordDict, cid: int, name: str, arr: Array) -> None:
    _record(content, cid)[name] = arr


def _npy(header: dict[str, Any], body: bytes) -> bytes:
    """An .npy file with this header (magic included) and body."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + body


def drop_update(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    del c[wire.update_key(cid)]


def drop_metrics(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    del c[wire.metrics_key(cid)]


def extra_array(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    _set(c, cid, "evil", Array(np.zeros(3, np.float32)))


def renamed_array(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    name, _ = _first(c, cid)
    record = _record(c, cid)
    record[name + "_"] = record[name]
    del record[name]


def random_shape(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    name, arr = _first(c, cid)
    shape = tuple(int(n) for n in rng.integers(0, 50, size=int(rng.integers(0, 4))))
    if shape == arr.shape:
        shape = (*shape, 2)
    _set(c, cid, name, Array(rng.standard_normal(shape).astype(arr.dtype)))


def wrong_dtype(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    name, arr = _first(c, cid)
    kinds = [np.float64, np.float16, np.int32, np.int64, np.uint8, np.bool_, np.complex64]
    new = np.dtype(kinds[int(rng.integers(len(kinds)))])
    new = new if new != arr.dtype else np.dtype(np.complex64)
    _set(c, cid, name, Array(arr.astype(new)))


def non_finite(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    name, arr = _first(c, cid, "f")
    if arr.dtype.kind != "f":
        arr = arr.astype(np.float32)  # a non-float array turned float is a wrong dtype on top
    arr = arr.copy()
    arr.reshape(-1)[int(rng.integers(max(arr.size, 1)))] = [np.nan, np.inf, -np.inf][int(rng.integers(3))]
    _set(c, cid, name, Array(arr))


def huge_values(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    name, arr = _first(c, cid, "f")
    arr = arr.astype(np.float32) if arr.dtype.kind != "f" else arr.copy()
    magnitude = float(10 ** rng.uniform(20.5, 38.5)) if arr.dtype != np.float16 else 6e4
    arr.reshape(-1)[int(rng.integers(max(arr.size, 1)))] = magnitude * (1 if rng.random() < 0.5 else -1)
    if arr.dtype == np.float16 or not np.isfinite(arr).all():
        arr = arr.astype(np.float64)
        arr.reshape(-1)[0] = 1e30
    _set(c, cid, name, Array(arr))


def bad_num_examples(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    values: list[Any] = [0, -5, 2**40, 10**6, 1.5, [1, 2], 64.0]
    c.metric_records[wire.metrics_key(cid)][wire.NUM_EXAMPLES] = values[int(rng.integers(len(values)))]


def no_num_examples(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    del c.metric_records[wire.metrics_key(cid)][wire.NUM_EXAMPLES]


def bad_loss(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    c.metric_records[wire.metrics_key(cid)][wire.LOSS] = [1.0, 2.0]


def bad_echo(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    """A table built with other hash functions (or a client that does not say which)."""
    metrics = c.metric_records[wire.metrics_key(cid)]
    key = sorted(h.echo)[int(rng.integers(len(h.echo)))] if h.echo else "sketch-seed"
    choice = int(rng.integers(3))
    if not h.echo:  # nothing to echo: fall back to another corruption
        drop_update(c, cid, rng, h)
    elif choice == 0:
        metrics[key] = int(h.echo[key]) + 1
    elif choice == 1:
        del metrics[key]
    else:
        metrics[key] = float(h.echo[key])


def garbage_bytes(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    name, arr = _first(c, cid)
    data = rng.integers(0, 256, size=int(rng.integers(0, 3000)), dtype=np.uint8).tobytes()
    _set(c, cid, name, Array(str(arr.dtype), tuple(arr.shape), "numpy.ndarray", data))


def header_claims_huge(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    """np.load would allocate what the header claims (terabytes) before reading the 16 bytes there are."""
    name, arr = _first(c, cid)
    shape = (10**12,) if rng.random() < 0.5 else tuple(arr.shape)
    declared = shape if rng.random() < 0.5 else tuple(arr.shape)
    header = {"descr": "<f8", "fortran_order": False, "shape": (10**12,)}
    _set(c, cid, name, Array("float64", declared, "numpy.ndarray", _npy(header, b"\0" * 16)))


def declared_mismatch(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    """Metadata says the right shape, the bytes hold another."""
    name, arr = _first(c, cid)
    inner = Array(np.zeros((arr.size + 3,), arr.dtype))
    _set(c, cid, name, Array(str(arr.dtype), tuple(arr.shape), "numpy.ndarray", inner.data))


def truncated(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    name, arr = _first(c, cid)
    good = Array(arr)
    cut = int(rng.integers(1, max(2, min(len(good.data), 200))))
    _set(c, cid, name, Array(good.dtype, tuple(good.shape), good.stype, good.data[:-cut]))


def odd_layout(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    """Fortran order, big-endian, object dtype, npy version 3, or not numpy at all."""
    name, arr = _first(c, cid)
    shape, n = tuple(arr.shape), arr.size
    body = arr.astype(arr.dtype.newbyteorder(">")).tobytes() if arr.dtype.itemsize > 1 else arr.tobytes()
    variants = [
        ({"descr": arr.dtype.newbyteorder(">").str, "fortran_order": False, "shape": shape}, body, str(arr.dtype)),
        ({"descr": "|O", "fortran_order": False, "shape": shape}, b"\0" * 8 * n, "object"),
        ({"descr": "|O", "fortran_order": False, "shape": shape}, b"\0" * 8 * n, str(arr.dtype)),
        ({"descr": arr.dtype.str, "fortran_order": True, "shape": shape}, arr.tobytes(), str(arr.dtype)),
        ({"descr": [("a", "<f4")], "fortran_order": False, "shape": shape}, b"\0" * 4 * n, str(arr.dtype)),
    ]
    first = 0 if arr.dtype.itemsize > 1 else 1  # one-byte types have no byte order to get wrong
    header, data, dtype = variants[int(rng.integers(first, len(variants)))]
    if rng.random() < 0.15:
        _set(c, cid, name, Array(str(arr.dtype), shape, "torch.Tensor", Array(arr).data))
    elif rng.random() < 0.15:
        _set(c, cid, name, Array(str(arr.dtype), shape, "numpy.ndarray", b"\x93NUMPY\x03\x00" + b"\0" * 64))
    else:
        _set(c, cid, name, Array(dtype, shape, "numpy.ndarray", _npy(header, data)))


def oversized(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    name, arr = _first(c, cid)
    big = np.zeros(max(arr.size, 1) * 3 + 200_000, arr.dtype)
    _set(c, cid, name, Array(big))


def many_arrays(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    for i in range(40):
        _set(c, cid, f"x{i}", Array(np.zeros(1, np.uint8)))


def wrong_record_type(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    del c[wire.update_key(cid)]
    c[wire.update_key(cid)] = ConfigRecord({"table": b"\0" * 16})


def client_failure(c: RecordDict, cid: int, rng: np.random.Generator, h: Honest) -> None:
    """The client's own code raised: counted as an error, not a rejection."""
    del c[wire.update_key(cid)]
    del c[wire.metrics_key(cid)]
    c[wire.failure_key(cid)] = ConfigRecord({wire.REASON: "RuntimeError: out of memory"})


MUTATIONS: list[Mutation] = [
    drop_update,
    drop_metrics,
    extra_array,
    renamed_array,
    random_shape,
    wrong_dtype,
    non_finite,
    huge_values,
    bad_num_examples,
    no_num_examples,
    bad_loss,
    bad_echo,
    garbage_bytes,
    header_claims_huge,
    declared_mismatch,
    truncated,
    odd_layout,
    oversized,
    many_arrays,
    wrong_record_type,
    client_failure,
]
NODE_ATTACKS = ("node_error", "no_reply", "unknown_node", "second_reply")


# ---------------------------------------------------------------------------------------- the property
def _remove(content: RecordDict, cid: int) -> None:
    for key in (wire.update_key(cid), wire.metrics_key(cid)):
        if key in content:
            del content[key]


def _clone(msg: Message, src: int | None = None) -> Message:
    meta = copy.deepcopy(msg.metadata)
    if src is not None:
        meta.__dict__["_src_node_id"] = src
    return Message(content=copy_content(msg.content), metadata=meta)


def _round(strat: FedSketchStrategy, h: Honest, replies: list[Message]) -> None:
    """One round on a copy of the honest grid: a second exchange (PowerSGD) uses, and changes, the nodes' state."""
    with task_identity():
        grid = copy.deepcopy(h.grid)
        strat.configure_train(1, model_record(strat.weights.numpy()), ConfigRecord(), grid)
        strat.aggregate_train(1, replies)


def _states_equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if hasattr(a, "__dataclass_fields__"):
        return all(_states_equal(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__)  # type: ignore[attr-defined]
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_states_equal(a[k], b[k]) for k in a)
    return a == b


def check_attack(name: str, attacks: list[tuple[int, int, int]], node_attack: tuple[int, int] | None) -> None:
    h = honest(name)
    slots = [(node, cid) for node, cids in h.sent.items() for cid in cids]
    hostile = {msg.metadata.src_node_id: _clone(msg) for msg in h.replies}
    clean = {msg.metadata.src_node_id: _clone(msg) for msg in h.replies}
    rng = np.random.default_rng([len(attacks), *(a for t in attacks for a in t)])
    hit: set[int] = set()
    for slot, which, seed in attacks:
        node, cid = slots[slot % len(slots)]
        if cid in hit:
            continue
        MUTATIONS[which % len(MUTATIONS)](hostile[node].content, cid, np.random.default_rng(seed), h)
        _remove(clean[node].content, cid)
        hit.add(cid)
    extra: list[Message] = []
    if node_attack is not None:
        kind, node_index = NODE_ATTACKS[node_attack[0]], node_attack[1] % len(h.sent)
        node = sorted(h.sent)[node_index]
        request = Message(content=RecordDict(), metadata=copy.deepcopy(h.replies[0].metadata))
        request.metadata.__dict__.update(_src_node_id=0, _dst_node_id=node)
        if kind in ("node_error", "no_reply"):
            for cid in h.sent[node]:
                _remove(clean[node].content, cid)
                hit.add(cid)
            if kind == "node_error":
                hostile[node] = Message(Error(code=0, reason="ClientApp crashed"), reply_to=request)
            else:
                del hostile[node]
        else:  # a node not asked, or a second reply from one that was: both ignored
            extra.append(_clone(hostile[node], src=999 if kind == "unknown_node" else None))
            if kind == "second_reply":
                bad = _clone(next(m for m in h.replies if m.metadata.src_node_id == node))
                for cid in h.sent[node]:
                    huge_values(bad.content, cid, rng, h)
                extra.append(bad)
    attacked, reference = build_strategy(h.cfg, None), build_strategy(h.cfg, None)
    _round(attacked, h, [*hostile.values(), *extra])  # hostile first: a second reply must not override
    _round(reference, h, list(clean.values()))
    assert torch.equal(attacked.weights, reference.weights)
    assert _states_equal(getattr(attacked, "state", None), getattr(reference, "state", None))
    assert attacked.books.totals["failures"] == len(hit) == reference.books.totals["failures"]
    assert attacked.books.totals["clients"] == len(slots) - len(hit)


ATTACKS = st.lists(
    st.tuples(st.integers(0, 63), st.integers(0, len(MUTATIONS) - 1), st.integers(0, 2**32 - 1)),
    min_size=1,
    max_size=4,
)
NODE = st.none() | st.tuples(st.integers(0, len(NODE_ATTACKS) - 1), st.integers(0, 7))


@pytest.mark.slow  # 40 rounds a method, tens of seconds for all (each corruption alone: the test below, fast)
@pytest.mark.parametrize("name", STRATEGIES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(attacks=ATTACKS, node_attack=NODE)
def test_hostile_replies_change_nothing_but_their_own_absence(
    name: str, attacks: list[tuple[int, int, int]], node_attack: tuple[int, int] | None
) -> None:
    check_attack(name, attacks, node_attack)


@pytest.mark.parametrize("name", ["fetchsgd", "fedavg", "qsgd"])
@pytest.mark.parametrize("which", range(len(MUTATIONS)))
def test_every_corruption_is_refused(name: str, which: int) -> None:
    """Each corruption on its own, on half the round's clients (the other half moves the model)."""
    check_attack(name, [(slot, which, 7 + slot) for slot in range(0, TINY["clients-per-round"], 2)], None)


def test_a_node_that_names_a_client_not_its_own_is_refused() -> None:
    """One client per node: a node names its client; out of range, several, or taken ids are refused."""
    cfg = RunConfig.from_mapping({**TINY, "client-assignment": "node", "clients-per-round": 2})
    grid = TestGrid(cfg.to_mapping(), num_nodes=3)
    strat = build_strategy(cfg, None)
    with task_identity():
        requests = strat.configure_train(1, model_record(strat.weights.numpy()), ConfigRecord(), grid)
        replies = grid.send_and_receive(requests)
    first, second = replies
    cid = wire.parse_cid(next(iter(first.content.array_records)))[1]  # type: ignore[index]
    own = wire.parse_cid(next(iter(second.content.array_records)))[1]  # type: ignore[index]
    for key in (wire.update_key(own), wire.metrics_key(own)):  # the second node claims the first one's client
        second.content[key.replace(str(own), str(cid))] = second.content[key]
        del second.content[key]
    w0 = strat.weights.clone()
    strat.aggregate_train(1, [first, second])
    assert strat.books.totals["clients"] == 1 and strat.books.totals["rejected"] == 1
    assert not torch.equal(strat.weights, w0)
