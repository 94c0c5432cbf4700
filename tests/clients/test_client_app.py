"""The ClientApp, sent real Flower messages in-process: each listed client gets its reply entries, its kept state
changes only by what the server applied, and a request it cannot serve fails its clients with a clear reason."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict

from bridge import messages
from bridge.flower import task_identity
from clients.client_app import ContextStates, run_config, train
from clients.kept_model import initial_weights
from fedsketch import wire
from fedsketch.algorithms.powersgd import initial_q
from fedsketch.client import state as client_state
from fedsketch.client.state import DiskStates, state_root
from fedsketch.compress.sparse import encode_support
from fedsketch.config import RunConfig
from fedsketch.methods.powersgd import Q_STREAM, plan

TINY = {"num-clients": 6, "clients-per-round": 2, "model-hidden": 8, "k": 10, "sketch-rows": 3, "sketch-cols": 50}


def _cfg(**settings: Any) -> RunConfig:
    return RunConfig.from_mapping({**TINY, **settings})


def _context(cfg: RunConfig, partition: int = 0, run_id: int = 1) -> Context:
    return Context(
        run_id=run_id,
        node_id=101,
        node_config={"partition-id": partition},
        state=RecordDict(),
        run_config=cfg.to_mapping(),
    )


def _send(context: Context, content: RecordDict) -> RecordDict:
    with task_identity():
        msg = Message(content, dst_node_id=context.node_id, message_type="train")
    reply = train(msg, context)
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id
    return reply.content


def _model(cfg: RunConfig) -> np.ndarray:
    return initial_weights(cfg)


def _request(
    cfg: RunConfig, server_round: int, cids: list[int], extras: dict[int, Any] | None = None, **config: Any
) -> RecordDict:
    extras = {cid: messages.payload_to_record(p) for cid, p in (extras or {}).items()}
    return messages.train_request(
        messages.model_record(_model(cfg)), {wire.ROUND: server_round, **config}, cids, extras
    )


def _reasons(content: RecordDict) -> dict[int, str]:
    return {
        int(key.split(".")[1]): str(record[wire.REASON])  # type: ignore[index]
        for key, record in content.items()
        if key.startswith("failure.")
    }


def _updated(content: RecordDict) -> list[int]:
    return sorted(int(key.split(".")[1]) for key in content if key.startswith("update."))


def test_the_run_config_is_the_contexts() -> None:
    cfg = _cfg(strategy="fedavg", lr=0.25)
    assert run_config(_context(cfg)) == cfg and run_config(_context(cfg)).lr == 0.25


def test_a_cohort_node_replies_for_each_listed_client_with_the_round_settings_it_was_sent() -> None:
    cfg = _cfg(strategy="fetchsgd")
    sent = {"sketch-seed": 9, "sketch-rows": 3, "sketch-cols": 50}
    content = _send(_context(cfg, partition=5), _request(cfg, 2, [0, 3], **sent))
    assert list(content) == [wire.update_key(0), wire.metrics_key(0), wire.update_key(3), wire.metrics_key(3)]
    for cid in (0, 3):
        metrics = dict(content[wire.metrics_key(cid)])
        assert {k: metrics[k] for k in sent} == sent and metrics[wire.NUM_EXAMPLES] > 0
        table = messages.record_to_payload(content[wire.update_key(cid)])["table"]  # type: ignore[arg-type]
        assert table.shape == (3, 50)


def test_a_deployed_node_runs_its_own_partition() -> None:
    cfg = _cfg(strategy="fedavg")
    content = _send(_context(cfg, partition=4), _request(cfg, 1, []))
    assert _updated(content) == [4] and not _reasons(content)


def _q(cfg: RunConfig) -> dict[str, np.ndarray]:
    return {"q": initial_q(plan(cfg), 1234 ^ Q_STREAM).numpy()}


def test_a_deployed_node_takes_the_arrays_for_a_client_not_yet_named_as_its_own() -> None:
    cfg = _cfg(strategy="powersgd")
    own = _send(_context(cfg, partition=2), _request(cfg, 1, [], {wire.NEW_CLIENT: _q(cfg)}))
    named = _send(_context(cfg, partition=2), _request(cfg, 1, [], {2: _q(cfg)}))
    assert _updated(own) == _updated(named) == [2]
    bare = _send(_context(cfg, partition=2), _request(cfg, 1, []))  # sent nothing: its arrays are none
    assert _reasons(bare) == {2: "KeyError: 'q'"}
    cohort = _send(_context(cfg), _request(cfg, 1, [1, 2], {wire.NEW_CLIENT: _q(cfg), 2: _q(cfg)}))
    assert _updated(cohort) == [2] and list(_reasons(cohort)) == [1]  # a listed client takes only its own
    assert "'q'" in _reasons(cohort)[1]


def _stored(context: Context, cid: int) -> client_state.State:
    return ContextStates(context).load(cid)


def _same(a: client_state.State, b: client_state.State) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_clients_new_state_counts_only_once_the_server_says_it_applied_that_round() -> None:
    cfg = _cfg(strategy="local_topk")
    context = _context(cfg)
    _send(context, _request(cfg, 1, [0, 1, 2]))
    after_one = {cid: _stored(context, cid) for cid in (0, 1, 2)}
    assert all(client_state.pending_round(s) == 1 and not client_state.committed(s) for s in after_one.values())
    _send(context, _request(cfg, 3, [0, 1, 2], **{wire.SETTLED: [1, -1, 0]}))
    assert _same(client_state.committed(_stored(context, 0)), client_state.pending(after_one[0], 1))
    assert client_state.committed(_stored(context, 1)) == {} == client_state.committed(_stored(context, 2))
    assert all(client_state.pending_round(_stored(context, cid)) == 3 for cid in (0, 1, 2))


def test_a_kept_state_reads_back_as_float32_tensors() -> None:
    context = _context(_cfg())
    states = ContextStates(context)
    states.save(3, {"error": torch.arange(4, dtype=torch.float64), "m": torch.ones(2, dtype=torch.float16)})
    got = states.load(3)
    assert got.keys() == {"error", "m"} and all(t.dtype == torch.float32 for t in got.values())
    assert torch.equal(got["error"], torch.arange(4.0)) and torch.equal(got["m"], torch.ones(2))
    assert states.load(4) == {} and list(context.state) == [wire.state_key(3)]


def test_with_client_state_on_disk_each_flower_run_keeps_its_clients_files(tmp_path: Path) -> None:
    cfg = _cfg(strategy="local_topk", **{"client-state": "disk", "out-dir": str(tmp_path)})
    first, second = _context(cfg, run_id=7), _context(cfg, run_id=8)
    _send(first, _request(cfg, 1, [0, 1]))
    _send(second, _request(cfg, 1, [1]))
    root = state_root(cfg)
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*.npz")) == [
        "run-7/0.npz",
        "run-7/1.npz",
        "run-8/1.npz",
    ]
    assert len(first.state) == 0  # nothing kept in memory
    assert client_state.pending_round(DiskStates(root / "run-7").load(0)) == 1


def test_a_client_whose_kept_state_is_unreadable_fails_alone_naming_the_file(tmp_path: Path) -> None:
    cfg = _cfg(strategy="local_topk", **{"client-state": "disk", "out-dir": str(tmp_path)})
    context = _context(cfg, run_id=2)
    broken = DiskStates(state_root(cfg) / "run-2").path(1)
    broken.parent.mkdir(parents=True)
    broken.write_bytes(b"not a zip file")
    content = _send(context, _request(cfg, 1, [0, 1, 4]))
    assert _updated(content) == [0, 4] and list(_reasons(content)) == [1]
    assert f"client 1: its state file {broken} is unreadable" in _reasons(content)[1]


def _query(cfg: RunConfig, server_round: int, cids: list[int], query: dict[str, np.ndarray]) -> RecordDict:
    config = {wire.ROUND: server_round, wire.PHASE: 2}
    return messages.query_request(messages.payload_to_record(query), config, cids)


def test_a_second_exchange_answers_from_this_rounds_pending_state_and_a_client_without_one_fails() -> None:
    cfg = _cfg(strategy="sketched_sgd")
    context = _context(cfg)
    _send(context, _request(cfg, 2, [0, 1], **{"sketch-seed": 0, "sketch-rows": 3, "sketch-cols": 50}))
    before = _stored(context, 0)
    d = _model(cfg).size
    content = _send(context, _query(cfg, 2, [0, 1, 3], encode_support(np.array([1, 5, 8]), d)))
    assert _updated(content) == [0, 1]
    assert _reasons(content) == {3: "this client has no state pending from round 2"}
    answer = messages.record_to_payload(content[wire.update_key(0)])["val"]  # type: ignore[arg-type]
    np.testing.assert_array_equal(answer, client_state.pending(before, 2)["error"][[1, 5, 8]].numpy())
    late = _send(context, _query(cfg, 3, [0], encode_support(np.array([1]), d)))
    assert _reasons(late) == {0: "this client has no state pending from round 3"}


def test_a_second_exchanges_new_state_replaces_the_pending_one_beside_the_committed_one() -> None:
    cfg = _cfg(strategy="powersgd")
    context = _context(cfg)
    _send(context, _request(cfg, 1, [0], {0: _q(cfg)}))
    _send(context, _request(cfg, 2, [0], {0: _q(cfg)}, **{wire.SETTLED: [1]}))
    committed = client_state.committed(_stored(context, 0))
    assert list(committed) == ["target", "num-examples"]
    p = np.zeros(plan(cfg).p_size, np.float32)
    _send(context, _query(cfg, 2, [0], {"p": p}))
    after = _stored(context, 0)
    assert _same(client_state.committed(after), committed)
    assert list(client_state.pending(after, 2)) == ["error", "num-examples"]


def test_a_model_of_the_wrong_size_fails_each_client_with_a_clear_reason() -> None:
    cfg = _cfg(strategy="fedavg")
    d = _model(cfg).size
    content = messages.train_request(messages.model_record(np.zeros(d + 1)), {wire.ROUND: 1}, [0, 2], {})
    reasons = _reasons(_send(_context(cfg), content))
    assert reasons == dict.fromkeys([0, 2], f"ValueError: flat vector has shape ({d + 1},); the model needs ({d},)")


def test_a_request_without_a_model_is_refused_before_any_training() -> None:
    cfg = _cfg(strategy="fedavg")
    content = RecordDict({wire.CONFIG_KEY: ConfigRecord({wire.ROUND: 1, wire.CIDS: [0]})})
    with pytest.raises(ValueError, match=re.escape("request has no 'model' record with array 'w'")):
        _send(_context(cfg), content)


def test_a_node_merges_its_cohorts_uploads_only_when_it_has_a_model_to_train() -> None:
    cfg = _cfg(strategy="fedavg", **{"merge-uploads": True})
    merged = _send(_context(cfg), _request(cfg, 1, [0, 1]))
    assert wire.MERGED_KEY in merged and _updated(merged) == []
    catch_up = messages.payload_to_record({"idx": np.array([0], np.int64), "val": np.ones(1, np.float32)})
    content = messages.train_request(catch_up, {wire.ROUND: 2, wire.BASE_ROUND: 1}, [0, 1], {}, key=wire.CATCH_UP_KEY)
    failed = _send(_context(cfg), content)
    assert wire.MERGED_KEY not in failed
    assert set(_reasons(failed)) == {0, 1} and "no kept model" in _reasons(failed)[0]
