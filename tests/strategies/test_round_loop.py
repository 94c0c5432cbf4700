"""The round loop (:meth:`FedSketchStrategy.start`): which rounds are evaluated, where a run starts, when it is broken."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode

from bridge import messages
from bridge.flower import task_identity
from fedsketch import wire
from fedsketch.config import RunConfig
from fedsketch.data.run import load_data
from fedsketch.server import checkpoint, runlog
from fedsketch.server.privacy import privacy_metrics
from strategies import resume
from strategies.replies import COUNTED_AS
from strategies.server_app import build_strategy
from strategies.strategy import DIVERGED_LOSS, FedSketchStrategy
from tests.federation import ROUND_SETTINGS, SMALL_SKETCH_RUN, Recorder, TestGrid, download_of, sent, upload_of

SETTINGS = {"strategy": "fedavg", "num-clients": 8, "clients-per-round": 4, "model-hidden": 8, "num-rounds": 5}


def strategy(out: Path | None = None, **settings: object) -> FedSketchStrategy:
    return build_strategy(RunConfig.from_mapping({**SETTINGS, **settings}), out)


def start(strat: FedSketchStrategy, grid_late: dict[int, int] | None = None, **kwargs: object) -> np.ndarray:
    with task_identity():
        grid = TestGrid(strat.cfg.to_mapping(), num_nodes=2, late=grid_late)
        result = strat.start(grid, **kwargs)  # type: ignore[arg-type]
    return result.arrays["w"].numpy()


def test_every_nth_round_and_the_last_one_are_evaluated(tmp_path: Path) -> None:
    strat = strategy(tmp_path, **{"eval-every": 2})
    final = start(strat)
    rows = runlog.read_metrics(tmp_path)
    assert [row["round"] for row in rows] == [2, 4, 5]
    assert [row["round"] for row in strat.history] == [2, 4, 5]
    assert [len(rows)] == [len(runlog.read_metrics(tmp_path, runlog.ROUNDS)) - 2]  # every round has its line
    assert np.array_equal(final, strat.weights.numpy())


def test_a_run_starts_from_the_arrays_it_is_given_for_the_rounds_it_is_told(tmp_path: Path) -> None:
    given = torch.linspace(-0.1, 0.1, strategy().d)
    told = strategy(tmp_path / "told")
    final = start(told, initial_arrays=messages.model_record(given.numpy()), num_rounds=1)
    by_hand = strategy(tmp_path / "by-hand", **{"num-rounds": 1})
    by_hand.set_weights(given.clone())
    assert np.array_equal(final, start(by_hand))
    assert not np.array_equal(final, given.numpy())  # the round was applied
    assert [row["round"] for row in runlog.read_metrics(tmp_path / "told")] == [1]  # its last round
    untouched = strategy()
    assert np.array_equal(start(untouched, initial_arrays=messages.model_record(given.numpy()), num_rounds=0), given)
    assert torch.equal(untouched.weights, given) and untouched.history == []


def test_a_run_without_a_folder_writes_nothing_and_keeps_its_history(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    strat = strategy(None, **{"num-rounds": 2, "eval-every": 1})
    start(strat)
    assert [row["round"] for row in strat.history] == [1, 2] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bound", [0.0, 1.0])
def test_a_run_whose_last_loss_is_past_the_divergence_bar_says_why_its_model_is_broken(bound: float) -> None:
    strat = strategy(**{"norm-bound": bound})
    assert strat.broken() is None  # no rows yet
    strat.history = [{"round": 2, "test_loss": 1e9}, {"round": 4, "test_loss": DIVERGED_LOSS}]
    assert strat.broken() is None  # at the bar: not past it
    strat.history.append({"round": 6, "test_loss": 2.5e6, "skipped_rounds": 3})
    why = strat.broken()
    hint = "; with norm-bound = 0 one client's upload can wreck it"
    assert why == "the model is broken: its test loss is 2.5e+06 at round 6, 3 rounds not applied since the row " + (
        "before (see rounds.jsonl)" + (hint if bound == 0 else "")
    )
    strat.history.append({"round": 7, "test_loss": float("inf")})
    assert strat.broken() == (
        "the model is broken: its test loss is inf at round 7, 0 rounds not applied since the row before "
        "(see rounds.jsonl)" + (hint if bound == 0 else "")
    )


def test_a_broken_model_is_logged_at_the_end_of_the_run(caplog: pytest.LogCaptureFixture) -> None:
    strat = strategy(**{"num-rounds": 1, "lr": 1e12})
    with caplog.at_level(logging.WARNING, logger="flwr"):
        start(strat)
    assert strat.broken() is not None and strat.broken() in [record.getMessage() for record in caplog.records]


def test_each_row_is_logged_with_its_accuracy_loss_and_bytes(caplog: pytest.LogCaptureFixture) -> None:
    strat = strategy(**{"num-rounds": 1})
    with caplog.at_level(logging.INFO, logger="flwr"):
        start(strat)
    (row,) = strat.history
    logged = [record.getMessage() for record in caplog.records]
    assert (
        f"round 1: accuracy {row['test_accuracy']:.4f}, loss {row['test_loss']:.4f}, "
        f"up {row['cum_upload_bytes']} B, down {row['cum_download_bytes']} B"
    ) in logged
    assert f"fedavg: d={strat.d}, 4 of 8 a round, 1 rounds" in logged


def test_aggregating_a_round_that_was_not_configured_is_refused() -> None:
    strat = strategy()
    with pytest.raises(RuntimeError, match=r"^round 1 was not configured by this strategy \(configure_train first\)$"):
        strat.aggregate_train(1, [])
    strat.plan_round(1, ConfigRecord(), TestGrid(strat.cfg.to_mapping(), num_nodes=2))
    with pytest.raises(RuntimeError, match=r"^round 2 was not configured by this strategy \(configure_train first\)$"):
        strat.aggregate_train(2, [])
    assert list(strat.configure_evaluate(1, ArrayRecord(), ConfigRecord(), None)) == []  # type: ignore[arg-type]
    assert strat.aggregate_evaluate(1, []) is None


@pytest.mark.parametrize("name", ["sketched_sgd", "powersgd"])
def test_both_exchanges_of_a_two_exchange_round_are_made_and_billed_what_they_carry(name: str) -> None:
    """Sketched-SGD and PowerSGD ask the round's clients a second time (:meth:`FedSketchStrategy._ask`)."""
    cfg = RunConfig.from_mapping({**ROUND_SETTINGS, "strategy": name})
    strat, recorder = build_strategy(cfg, None), Recorder()
    with task_identity():
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=2, tamper=recorder))  # type: ignore[arg-type]
    for row, (first, second) in zip(strat.history, recorder.rounds().values(), strict=True):
        assert row["upload_bytes"] == upload_of(first[1]) + upload_of(second[1])
        assert row["download_bytes"] == download_of(first[0]) + download_of(second[0])
        assert {m.metadata.dst_node_id for m in second[0]} <= {m.metadata.dst_node_id for m in first[0]}
        assert row["clients"] == cfg.clients_per_round and row["failures"] == 0
    second_round = recorder.rounds()[2][0][0]  # a returning client's pending support, PowerSGD's warm start
    assert any(key.startswith("request.") for msg in second_round for key in msg.content)


def test_a_second_exchange_needs_a_round_in_progress() -> None:
    strat = strategy(strategy="sketched_sgd", k=30)
    with pytest.raises(RuntimeError, match="^a second exchange needs a round in progress$"):
        strat._ask([], None)  # type: ignore[arg-type]


def test_each_row_carries_the_privacy_spent_so_far_the_methods_figures_and_the_training_loss() -> None:
    dp = strategy(**{"num-rounds": 2, "eval-every": 1, "clip-norm": 1.0, "dp-noise-multiplier": 1.0})
    start(dp)
    assert [{k: row[k] for k in privacy_metrics(dp.cfg, 1)} for row in dp.history] == [
        privacy_metrics(dp.cfg, 1),
        privacy_metrics(dp.cfg, 2),
    ]
    assert all(0 < row["train_loss"] < 10 for row in dp.history)
    topk = strategy(**{"strategy": "local_topk", "k": 20, "num-rounds": 1})
    start(topk)
    assert (topk.history[0]["values_per_client"], topk.history[0]["values_over_k"]) == (20, 1.0)


class SecondExchangeLate(TestGrid):
    """Node 101 answers every second exchange 50 pulls late: past the timeout, not past a wait without one."""

    __test__ = False
    pushes = 0

    def replies(self, requests: list[Message], received: list[Message]) -> list[Message]:
        self.pushes += 1
        self.late = {101: 50} if self.pushes % 2 == 0 else {}
        return super().replies(requests, received)


def test_a_second_exchange_waits_the_round_timeout_and_no_longer() -> None:
    cfg = RunConfig.from_mapping({**ROUND_SETTINGS, "strategy": "sketched_sgd", "num-rounds": 1, "round-timeout": 0.2})
    strat = build_strategy(cfg, None)
    grid = SecondExchangeLate(cfg.to_mapping(), num_nodes=2)
    with task_identity():
        strat.start(grid)
    (row,) = strat.history
    assert row["timeouts"] > 0 and row["clients"] == cfg.clients_per_round  # late in the second exchange only


def without_node_101(requests: list[Message], replies: list[Message]) -> list[Message]:
    return [m for m in replies if m.metadata.src_node_id != 101]


def test_a_round_is_aggregated_into_the_new_model_or_not_applied_with_its_counts_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Flower's API: ``aggregate_train`` returns the new model and the training loss, or nothing and the counts."""
    strat = strategy(tmp_path, **{"min-replies": 3})
    for server_round, tamper in ((1, None), (2, without_node_101)):
        grid = TestGrid(strat.cfg.to_mapping(), num_nodes=2, tamper=tamper)
        arrays = messages.model_record(strat.weights.numpy())
        with task_identity(), caplog.at_level(logging.WARNING, logger="flwr"):
            replies = grid.send_and_receive(list(strat.configure_train(server_round, arrays, ConfigRecord(), grid)))
            got = strat.aggregate_train(server_round, replies)
        if server_round == 1:
            assert np.array_equal(got[0]["w"].numpy(), strat.weights.numpy())  # type: ignore[index]
            assert got[1] == MetricRecord({"train-loss": strat.books.last_loss})
            assert not np.array_equal(strat.weights.numpy(), arrays["w"].numpy())
    answered = 4 - len(strat.plan.sent.get(101, []))  # type: ignore[union-attr]
    assert got == (None, MetricRecord({"clients": answered, "failures": 4 - answered}))
    why = f"round 2 not applied: {answered} valid replies < min-replies 3"
    assert why in [record.getMessage() for record in caplog.records]
    lines = runlog.read_metrics(tmp_path, runlog.ROUNDS)
    assert [(line["round"], line["applied"]) for line in lines] == [(1, True), (2, False)]


def second_exchange_node_left() -> Callable[[list[Message], list[Message]], list[Message]]:
    """A tamper: the SuperLink answers every second exchange for node 101 with an error of its own (it left)."""
    pushes = []

    def tamper(requests: list[Message], replies: list[Message]) -> list[Message]:
        pushes.append(len(requests))
        request = next((m for m in requests if m.metadata.dst_node_id == 101), None)
        if len(pushes) % 2 or request is None:
            return replies
        error = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Error: Node Unavailable"), reply_to=request)
        error.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
        return [error, *(m for m in replies if m.metadata.src_node_id != 101)]

    return tamper


def test_a_node_that_leaves_before_the_second_exchange_is_its_own_client_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = RunConfig.from_mapping({**ROUND_SETTINGS, "strategy": "sketched_sgd", "num-rounds": 1})
    strat = build_strategy(cfg, None)
    with task_identity(), caplog.at_level(logging.WARNING, logger="flwr"):
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=2, tamper=second_exchange_node_left()))
    (row,) = strat.history
    assert row["client_errors"] > 0 and row["timeouts"] == 0
    assert "node 101 error: Error: Node Unavailable" in caplog.text and "not asked" not in caplog.text


def test_a_merged_reply_to_the_second_exchange_is_refused_for_each_client_it_names(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Merging is for a round's first uploads (``merge-uploads``): an answer to Sketched-SGD's query comes per client."""
    exchanges = []

    def merged_answers(requests: list[Message], replies: list[Message]) -> list[Message]:
        exchanges.append(requests)
        if len(exchanges) == 2:  # the query's answers, each node's marked as merged
            for reply in replies:
                reply.content[wire.MERGED_METRICS] = MetricRecord({wire.NUM_EXAMPLES: 1})
        return replies

    cfg = RunConfig.from_mapping({**ROUND_SETTINGS, "strategy": "sketched_sgd", "num-rounds": 1})
    strat = build_strategy(cfg, None)
    with task_identity(), caplog.at_level(logging.WARNING, logger="flwr"):
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=2, tamper=merged_answers))  # type: ignore[arg-type]
    asked = sorted(cid for cids in strat.plan.sent.values() for cid in cids)  # type: ignore[union-attr]
    refused = sorted(int(m.split()[1]) for m in caplog.messages if m.endswith(" rejected: merged reply refused"))
    assert refused == asked and len(asked) == cfg.clients_per_round == strat.history[-1]["rejected"]
    assert "round 1: no client answered the second phase; model not updated" in caplog.messages


def test_a_resumed_run_counts_the_time_already_spent_and_saves_its_last_round(tmp_path: Path) -> None:
    """The clock of a resumed run goes on from its checkpoint; the last round is saved whatever the interval."""
    strat = strategy(tmp_path, **{"num-rounds": 3, "eval-every": 1, "checkpoint-every": 2})
    resume.checkpoint_round(strat.cfg, tmp_path, 1, 1000.0, replace(strat.values, server_round=1))  # as a last round
    start(strat)
    assert [row["round"] for row in strat.history] == [2, 3]
    assert all(1000.0 <= row["wall_s"] < 1100.0 for row in strat.history)
    saved = checkpoint.load(tmp_path, strat.cfg)
    assert saved is not None and saved.round == 3 and strat.history[-1]["wall_s"] <= saved.elapsed < 1100.0
    assert json.loads((tmp_path / "config.json").read_text()) == json.loads(json.dumps(strat.cfg.to_mapping()))


def test_the_first_exchange_waits_the_round_timeout_and_no_longer() -> None:
    strat = strategy(**{"num-rounds": 1, "round-timeout": 0.2})
    grid = TestGrid(strat.cfg.to_mapping(), num_nodes=2, late={101: 50})
    with task_identity():
        strat.start(grid)
    (row,) = strat.history
    assert row["timeouts"] > 0 and row["clients"] + row["timeouts"] == 4


def test_clients_that_keep_state_are_told_the_last_round_their_upload_was_applied() -> None:
    """Local top-k clients keep their error: each request names, per client, the round whose upload counts."""
    cfg = RunConfig.from_mapping({**ROUND_SETTINGS, "strategy": "local_topk", "num-clients": 6, "num-rounds": 3})
    strat, recorder = build_strategy(cfg, None), Recorder()
    with task_identity():
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=2, tamper=recorder))  # type: ignore[arg-type]
    applied: dict[int, int] = {}
    told: list[int] = []
    for rnd, ((requests, replies),) in sorted(recorder.rounds().items()):
        for msg in requests:
            config = msg.content.config_records[wire.CONFIG_KEY]
            told += wire.config_ints(config, wire.SETTLED)
            assert told[-len(wire.config_ints(config, wire.CIDS)) :] == [
                applied.get(cid, -1) for cid in wire.config_ints(config, wire.CIDS)
            ]
        applied |= dict.fromkeys(sent(replies), rnd)  # every round is applied here
    assert {1, 2} <= set(told) and -1 in told  # returning clients and new ones were both asked


def test_a_node_naming_its_own_client_outside_the_run_is_rejected() -> None:
    """One client per node: a node names its client, and only an id below num-clients is one of the run's."""

    def names_client_7(requests: list[Message], replies: list[Message]) -> list[Message]:
        content = next(m for m in replies if m.metadata.src_node_id == 101).content
        (cid,) = {parsed[1] for key in content if (parsed := wire.parse_cid(key)) is not None}
        content[wire.update_key(7)], content[wire.metrics_key(7)] = (
            content[wire.update_key(cid)],
            content[wire.metrics_key(cid)],
        )
        del content[wire.update_key(cid)], content[wire.metrics_key(cid)]
        return replies

    strat = strategy(
        **{"num-rounds": 1, "num-clients": 2, "clients-per-round": 2, "min-nodes": 2, "client-assignment": "node"}
    )
    with task_identity():
        strat.start(TestGrid(strat.cfg.to_mapping(), num_nodes=2, tamper=names_client_7))
    (row,) = strat.history
    assert (row["rejected"], row["clients"]) == (1, 1)


def test_a_dp_runs_noise_is_its_own_and_moves_on_each_round() -> None:
    """The noise comes from the run's own generator, whose state each round moves on (and a checkpoint saves)."""
    settings = {"num-rounds": 2, "clip-norm": 1.0, "dp-noise-multiplier": 1.0}
    noise = torch.Generator().manual_seed(7).get_state()  # the run's noise is secret: fix it to compare two runs
    first, second = strategy(**settings), strategy(**settings)
    first.values, second.values = replace(first.values, noise=noise), replace(second.values, noise=noise.clone())
    start(first)
    torch.rand(5)  # the global generator moves on between the runs: no effect on the run's noise
    start(second)
    assert torch.equal(first.weights, second.weights)
    assert not torch.equal(first.values.noise, noise) and torch.equal(first.values.noise, second.values.noise)


def test_a_random_k_round_decodes_each_upload_with_that_rounds_coordinates() -> None:
    """Random-k sends values only: the server draws the round's coordinates from the seed and the round."""
    strat = strategy(**{"strategy": "random_k", "k": 20, "num-rounds": 2, "eval-every": 1})
    start(strat)
    assert [(row["clients"], row["rejected"], row["skipped_rounds"]) for row in strat.history] == [(4, 0, 0)] * 2


def test_a_fetchsgd_round_with_the_sketch_diagnosed_reads_each_clients_dense_update() -> None:
    strat = strategy(**{"strategy": "fetchsgd", "k": 20, "num-rounds": 1, "diagnose-sketch": True})
    start(strat)
    (row,) = strat.history
    assert (row["clients"], row["rejected"], row["sketch_rounds"]) == (4, 0, 1)
    assert 0 <= row["sketch_recall"] <= 1


def test_an_upload_set_aside_by_the_norm_bound_names_its_client(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client scaling its update by 10^6 is set aside (``norm-bound``): the round's line names it."""
    hostile: list[int] = []

    def scaled(requests: list[Message], replies: list[Message]) -> list[Message]:
        content = next(m for m in replies if m.metadata.src_node_id == 101).content
        key = min(k for k in content.array_records if wire.parse_cid(k) is not None)
        hostile.append(wire.parse_cid(key)[1])  # type: ignore[index]
        content[key]["update"] = Array(content[key]["update"].numpy() * np.float32(1e6))
        return replies

    strat = strategy(tmp_path, **{"num-rounds": 1})
    with task_identity(), caplog.at_level(logging.WARNING, logger="flwr"):
        strat.start(TestGrid(strat.cfg.to_mapping(), num_nodes=2, tamper=scaled))
    (row,) = strat.history
    (line,) = runlog.read_metrics(tmp_path, runlog.ROUNDS)
    assert (row["bounded"], row["clients"]) == (1, 3)
    assert line["first_failure"].startswith(f"client {hostile[0]}: ")
    why = line["first_failure"].split(": ", 1)[1]
    assert f"client {hostile[0]} {COUNTED_AS['bounded']}: {why}" in [r.getMessage() for r in caplog.records]


def test_a_timeout_given_to_the_run_is_each_exchanges_wait() -> None:
    """Flower's ``Strategy.start`` takes a timeout: it replaces the setting ``round-timeout``."""
    strat = strategy(**{"num-rounds": 1, "round-timeout": 300})
    start(strat, grid_late={101: 50}, timeout=0.2)
    (row,) = strat.history
    assert row["timeouts"] > 0 and row["clients"] + row["timeouts"] == 4


def huge(requests: list[Message], replies: list[Message]) -> list[Message]:
    """Every value of every client's upload set to +-9e19 by its sign: within the replies' limit of 1e20, past
    float32's range once squared (FedAdam's second moment with beta2 = 0)."""
    for reply in replies:
        for name, record in messages.records_of(reply.content).arrays.items():
            if (parsed := wire.parse_cid(name)) is not None and parsed[0] == "update":
                for key, array in list(record.items()):
                    record[key] = Array((np.sign(array.numpy()) * 9e19).astype(np.float32))
    return replies


@pytest.mark.parametrize(
    ("settings", "tamper"),
    [
        ({"strategy": "fedavg", "lr": 1e300}, None),
        ({"strategy": "fedadam", "norm-bound": 0.0, "fedadam-beta2": 0.0}, huge),
    ],
    ids=["update", "state"],
)
def test_a_round_whose_update_or_state_is_not_finite_is_rolled_back_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, settings: dict[str, object], tamper: object
) -> None:
    strat = strategy(tmp_path, **{"num-rounds": 1, "eval-every": 1, **settings})
    weights, state = strat.weights.clone(), strat.state
    with task_identity(), caplog.at_level(logging.WARNING, logger="flwr"):
        strat.start(TestGrid(strat.cfg.to_mapping(), num_nodes=2, tamper=tamper))  # type: ignore[arg-type]
    why = "the update is not finite (huge client values?); state rolled back"
    assert f"round 1 not applied: {why}" in caplog.messages
    (line,) = runlog.read_metrics(tmp_path, runlog.ROUNDS)
    assert (line["round"], line["applied"], line["reason"], line["clients"]) == (1, False, why, 4)
    assert torch.equal(strat.weights, weights) and strat.state is state
    assert strat.history[-1]["skipped_rounds"] == 1 and np.isfinite(strat.history[-1]["test_loss"])


def test_uploads_clipped_on_the_nodes_that_merged_them_are_counted_as_the_servers_own() -> None:
    base = {"num-rounds": 1, "eval-every": 1, "clip-norm": 1e-6}  # every update is longer: each is clipped
    alone, merged = strategy(**base), strategy(**{**base, "merge-uploads": True})
    start(alone)
    start(merged)
    assert alone.history[0]["clipped"] == merged.history[0]["clipped"] == alone.cfg.clients_per_round


def test_a_client_that_does_not_answer_the_second_exchange_is_not_told_its_state_was_applied() -> None:
    """PowerSGD commits a client's new state only once it answered (``commit = "answer"``)."""
    dropped: list[int] = []

    def one_answer_lost(requests: list[Message], replies: list[Message]) -> list[Message]:
        if any(wire.QUERY_KEY in m.content for m in requests):  # the second exchange
            for reply in replies:
                cids = [p[1] for key in reply.content if (p := wire.parse_cid(key)) is not None and p[0] == "update"]
                if cids and not dropped:
                    dropped.append(cids[0])
                    del reply.content[wire.update_key(cids[0])], reply.content[wire.metrics_key(cids[0])]
                    reply.content[wire.failure_key(cids[0])] = ConfigRecord({wire.REASON: "left"})
        return replies

    strat = strategy(**{"strategy": "powersgd", "num-rounds": 1, "eval-every": 1})
    with task_identity():
        strat.start(TestGrid(strat.cfg.to_mapping(), num_nodes=2, tamper=one_answer_lost))  # type: ignore[arg-type]
    asked = sorted(cid for cids in strat.plan.sent.values() for cid in cids)  # type: ignore[union-attr]
    assert dropped and strat.history[0]["skipped_rounds"] == 0
    assert sorted(strat.books.applied) == sorted(set(asked) - set(dropped))


def test_a_round_whose_clients_all_report_no_loss_is_applied_with_no_train_loss() -> None:
    def no_loss(requests: list[Message], replies: list[Message]) -> list[Message]:
        for reply in replies:
            for name, record in messages.records_of(reply.content).metrics.items():
                if (parsed := wire.parse_cid(name)) is not None and parsed[0] == "metrics" and wire.LOSS in record:
                    record[wire.LOSS] = float("nan")
        return replies

    strat = strategy(**{"num-rounds": 1, "eval-every": 1})
    before = strat.weights.clone()
    with task_identity():
        strat.start(TestGrid(strat.cfg.to_mapping(), num_nodes=2, tamper=no_loss))  # type: ignore[arg-type]
    (row,) = strat.history
    assert row["skipped_rounds"] == 0 and not torch.equal(strat.weights, before)
    assert np.isnan(row["train_loss"]) and np.isnan(strat.books.last_loss)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("given", [False, True], ids=["own", "given"])
def test_a_round_on_a_gpu_steps_the_model_where_it_lives(given: bool) -> None:
    """With weights handed in (Flower's initial arrays, on the host) as with the strategy's own."""
    strat = strategy(**{"num-rounds": 1, "eval-every": 1, "device": "cuda"})
    before = strat.weights.clone() + (0.01 if given else 0.0)
    start(strat, initial_arrays=messages.model_record(before.cpu().numpy()) if given else None)
    assert strat.weights.is_cuda and strat.history[0]["skipped_rounds"] == 0
    assert not torch.equal(strat.weights, before)


def test_a_reply_may_count_one_local_batch_or_with_local_steps_the_largest_partition() -> None:
    grad, delta = strategy(), strategy(**{"client-update": "delta"})
    assert grad.max_examples == grad.cfg.local_batch_size
    biggest = max(len(idx) for idx in load_data(delta.cfg).client_indices)
    assert delta.max_examples == biggest != grad.cfg.local_batch_size
    unbounded = FedSketchStrategy(delta.cfg, delta.model, delta.test_x, delta.test_y)
    assert unbounded.max_examples == 2**31 - 1


def test_the_dense_bytes_are_what_a_dense_clients_update_serializes_to() -> None:
    strat, recorder = strategy(**{"num-rounds": 1, "eval-every": 1}), Recorder()
    with task_identity():
        strat.start(TestGrid(strat.cfg.to_mapping(), num_nodes=2, tamper=recorder))  # type: ignore[arg-type]
    ((_, replies),) = recorder.rounds()[1]
    payloads = [payload for payload, _ in sent(replies).values()]
    assert {messages.wire_bytes(messages.payload_to_record(p)) for p in payloads} == {strat.dense_bytes}
    assert strat.history[0]["dense_upload_bytes"] == strat.dense_bytes * strat.cfg.clients_per_round


def test_a_deployments_missing_nodes_are_counted_in_each_rounds_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = {"num-rounds": 2, "num-clients": 3, "clients-per-round": 2, "min-nodes": 2, "client-assignment": "node"}
    strat = strategy(tmp_path, **settings)
    with task_identity(), caplog.at_level(logging.WARNING, logger="flwr"):
        strat.start(TestGrid(strat.cfg.to_mapping(), num_nodes=2))  # type: ignore[arg-type]
    lines = runlog.read_metrics(tmp_path, runlog.ROUNDS)
    assert [(line["round"], line["missing_nodes"], line["clients"]) for line in lines] == [(1, 1, 2), (2, 1, 2)]
    said = [m for m in caplog.messages if "nodes missing" in m]
    assert said == [f"round {r}: 1 of the 3 nodes missing; going on with 2" for r in (1, 2)]


def test_each_request_carries_its_rounds_learning_rate() -> None:
    strat, recorder = strategy(**{"num-rounds": 3, "lr-schedule": "cosine"}), Recorder()
    with task_identity():
        strat.start(TestGrid(strat.cfg.to_mapping(), num_nodes=2, tamper=recorder))  # type: ignore[arg-type]
    for rnd, ((requests, _),) in recorder.rounds().items():
        rates = {float(m.content.config_records[wire.CONFIG_KEY][wire.LR]) for m in requests}  # type: ignore[arg-type]
        assert rates == {strat.lr_at(rnd)}
    assert len({strat.lr_at(r) for r in (1, 2, 3)}) == 3


def test_each_row_reports_the_sketch_diagnostic_of_its_own_rounds_only() -> None:
    strat = strategy(
        **{**SMALL_SKETCH_RUN, "strategy": "fetchsgd", "num-rounds": 3, "eval-every": 1, "diagnose-sketch": True}
    )
    start(strat)
    assert [row["sketch_rounds"] for row in strat.history] == [1, 1, 1]


def test_a_timeout_given_to_start_bounds_each_exchange_in_place_of_the_round_timeout() -> None:
    strat = strategy(**{"num-rounds": 1, "round-timeout": 120.0})
    grid = TestGrid(strat.cfg.to_mapping(), num_nodes=2, late={101: 50})
    with task_identity():
        strat.start(grid, timeout=0.2)  # type: ignore[arg-type]
    (row,) = strat.history
    assert row["timeouts"] > 0 and row["clients"] + row["timeouts"] == 4
