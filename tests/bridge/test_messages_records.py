"""Reading a message's records: the same records as Flower's typed views, and no reference cycle holding the message.

Flower's ``RecordDict.array_records`` (and ``metric_records``,
``config_records``) returns a view that references its RecordDict and a bound
method of itself, so a message read through one stays in memory, arrays and
all, until the cyclic collector runs. ``bridge.messages.records_of`` reads the
records into plain dicts instead; these tests run a real round with the cyclic
collector off and check that every request and reply is freed as soon as the
last reference to it goes.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from bridge.flower import task_identity
from bridge.messages import model_record, payload_to_record, records_of, typed_record
from fedsketch.config import RunConfig
from strategies.server_app import build_strategy
from tests.federation import TestGrid

TINY = {
    "num-clients": 12,
    "clients-per-round": 6,
    "model-hidden": 16,
    "k": 30,
    "num-rounds": 2,
    "sketch-rows": 3,
    "sketch-cols": 200,
}


@pytest.fixture
def no_cyclic_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _mixed() -> RecordDict:
    return RecordDict(
        {
            "a": payload_to_record({"x": np.arange(4, dtype=np.float32)}),
            "m": MetricRecord({"n": 3}),
            "c": ConfigRecord({"r": "why"}),
            "b": payload_to_record({"y": np.ones(2, np.float32)}),
        }
    )


def test_records_of_holds_what_flowers_views_hold() -> None:
    content = _mixed()
    found = records_of(content)
    assert found.arrays == dict(content.array_records)
    assert found.metrics == dict(content.metric_records)
    assert found.configs == dict(content.config_records)
    assert list(found.arrays) == ["a", "b"]
    assert typed_record(content, "a", ArrayRecord) is content["a"]
    assert typed_record(content, "c", ConfigRecord) is content["c"]
    assert typed_record(content, "m", ArrayRecord) is None and typed_record(content, "missing", ArrayRecord) is None


def test_reading_a_message_leaves_it_to_plain_reference_counting(no_cyclic_collector: None) -> None:
    content = _mixed()
    alive = weakref.ref(content)
    records_of(content)
    del content
    assert alive() is None
    content = _mixed()
    alive = weakref.ref(content)
    _ = content.array_records  # Flower's view: the cycle the code avoids
    del content, _
    assert alive() is not None  # held until the cyclic collector runs
    gc.collect()
    assert alive() is None


@pytest.mark.parametrize("strategy", ["fedavg", "fetchsgd"])
def test_a_rounds_requests_and_replies_are_freed_when_the_round_is_done(
    strategy: str, no_cyclic_collector: None
) -> None:
    cfg = RunConfig.from_mapping({**TINY, "strategy": strategy})
    grid = TestGrid(cfg.to_mapping(), num_nodes=2)
    strat = build_strategy(cfg, None)
    with task_identity():
        requests = list(strat.configure_train(1, model_record(strat.weights.numpy()), ConfigRecord(), grid))
        sent = [weakref.ref(r.content) for r in requests]
        replies = list(grid.send_and_receive(requests))  # the real ClientApp reads each request
        got = [weakref.ref(r.content) for r in replies]
        strat.aggregate_train(1, replies)  # the strategy reads each reply
    assert len(got) == 2 and strat.books.totals["upload"] > 0
    del requests, replies
    assert [ref() is None for ref in sent + got] == [True] * 4


@pytest.mark.parametrize("strategy", ["fedavg", "fetchsgd"])
def test_the_strategy_takes_each_clients_arrays_out_of_its_reply_as_it_reads_them(strategy: str) -> None:
    """The caller keeps a round's replies until the round ends; their arrays (a copy is decoded) need not stay."""
    cfg = RunConfig.from_mapping({**TINY, "strategy": strategy})
    grid = TestGrid(cfg.to_mapping(), num_nodes=2)
    strat = build_strategy(cfg, None)
    with task_identity():
        requests = list(strat.configure_train(1, model_record(strat.weights.numpy()), ConfigRecord(), grid))
        replies = list(grid.send_and_receive(requests))
        held = [len(records_of(r.content).arrays) for r in replies]
        before = strat.books.totals["upload"]
        strat.aggregate_train(1, replies)
    assert sum(held) == cfg.clients_per_round  # one array record per client came back
    assert strat.books.totals["upload"] > before and strat.books.totals["clients"] == cfg.clients_per_round
    assert [records_of(r.content).arrays for r in replies] == [{}, {}]  # and none is left once read
    assert all(records_of(r.content).metrics for r in replies)  # the rest of each reply is untouched
