"""Sketch fidelity (``diagnose-sketch``): measured beside FetchSGD, never changing it, never counted as upload.

The diagnostic runs FetchSGD's step unchanged and a dense shadow of its
recurrences (see :mod:`fedsketch.algorithms.fidelity`). These tests check that
training and upload bytes are bit-identical with it on and off, that its bytes
are counted apart, that a sketch able to recover exactly scores recall 1 and
error 0 while a tiny one does not, that the shadow is the sketch's preimage
under the ``subtract`` variant, that malformed diagnostic arrays are rejected
like any payload, that the plot draws the metrics rows, and that it is refused
where it does not apply.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Message

from bridge.flower import task_identity
from bridge.messages import payload_to_record, wire_bytes
from experiments.analysis.plots_fidelity import FIGURE, plot_fidelity
from fedsketch import wire
from fedsketch.algorithms import fetchsgd, fidelity
from fedsketch.config import ConfigError, RunConfig
from fedsketch.methods import fetchsgd as fetchsgd_method
from fedsketch.server import checkpoint
from strategies.server_app import build_strategy
from strategies.strategy import FedSketchStrategy
from tests.federation import SMALL_SKETCH_RUN, TestGrid

SETTINGS = {**SMALL_SKETCH_RUN, "num-rounds": 6, "eval-every": 2}
TIMING = ("wall_s", "unix_time")


def run(out: Path, settings: dict[str, Any], tamper: Any = None) -> tuple[FedSketchStrategy, list[dict[str, Any]]]:
    """A FetchSGD run in process through the real ClientApp; returns the strategy and its metrics rows."""
    cfg = RunConfig.from_mapping({**SETTINGS, **settings})
    strat = build_strategy(cfg, out)
    assert strat.cfg.strategy == "fetchsgd"
    with task_identity():
        strat.start(TestGrid(cfg.to_mapping(), num_nodes=2, tamper=tamper))  # type: ignore[arg-type]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return strat, rows


@pytest.fixture(scope="module")
def on_and_off(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, tuple[FedSketchStrategy, list[dict[str, Any]]]]:
    base = tmp_path_factory.mktemp("fidelity")
    return {on: run(base / str(on), {"diagnose-sketch": on}) for on in (False, True)}


def test_the_fetchsgd_step_is_bit_identical_with_the_diagnostic_on_and_off(on_and_off: Any) -> None:
    (off, off_rows), (on, on_rows) = on_and_off[False], on_and_off[True]
    assert torch.equal(off.weights, on.weights)
    assert isinstance(on.state, fidelity.FidelityState) and isinstance(off.state, fetchsgd.FetchSGDState)
    assert torch.equal(off.state.momentum, on.state.sketched.momentum) and torch.equal(
        off.state.error, on.state.sketched.error
    )
    extra = (
        "diagnostic_bytes",
        "cum_diagnostic_bytes",
        "sketch_recall",
        "sketch_rel_error",
        "sketch_state_drift",
        "sketch_topk_mass",
        "sketch_rounds",
    )
    assert [{k: v for k, v in r.items() if k not in (*TIMING, *extra)} for r in on_rows] == [
        {k: v for k, v in r.items() if k not in TIMING} for r in off_rows
    ]
    assert not set(extra) & set(off_rows[0])


def test_diagnostic_bytes_are_counted_apart_from_upload(on_and_off: Any) -> None:
    (_, off_rows), (on, on_rows) = on_and_off[False], on_and_off[True]
    assert [r["upload_bytes"] for r in on_rows] == [r["upload_bytes"] for r in off_rows]
    per_client = wire_bytes(payload_to_record({wire.DIAGNOSTIC_UPDATE: np.zeros(on.d, np.float32)}))
    assert per_client > 4 * on.d
    assert [r["diagnostic_bytes"] for r in on_rows] == [r["clients"] * per_client for r in on_rows]
    assert on_rows[-1]["cum_diagnostic_bytes"] == sum(r["diagnostic_bytes"] for r in on_rows) > 0
    assert on_rows[-1]["cum_diagnostic_bytes"] > on_rows[-1]["cum_upload_bytes"]  # dense vs a 3 x 400 table


def test_the_plot_draws_the_metrics_rows(on_and_off: Any, tmp_path: Path) -> None:
    on, rows = on_and_off[True]
    assert on.out_dir is not None
    plot = plot_fidelity(on.out_dir, tmp_path)
    assert plot.path == tmp_path / FIGURE and plot.path.stat().st_size > 0
    assert plot.rounds.tolist() == [r["round"] for r in rows] == [2, 4, 6]
    for name in ("sketch_recall", "sketch_rel_error", "test_accuracy"):
        np.testing.assert_array_equal(plot.series[name], [r[name] for r in rows])
    assert all(r["sketch_rounds"] == 2 for r in rows)
    with pytest.raises(ValueError, match="diagnose-sketch"):
        plot_fidelity(on_and_off[False][0].out_dir, tmp_path)


@pytest.mark.parametrize("placement", fetchsgd.LR_PLACEMENTS)
def test_a_sketch_that_recovers_exactly_has_recall_one_and_no_error(tmp_path: Path, placement: str) -> None:
    # d = 1,418 coordinates in 5 rows of 50,000 buckets: a coordinate shares a bucket in a row with
    # probability ~3%, so the median of its 5 rows is exact; so is the merge, bucket by bucket. Under a
    # decaying learning rate the two lr placements train differently; the shadow must follow either.
    strat, rows = run(
        tmp_path,
        {
            "diagnose-sketch": True,
            "sketch-rows": 5,
            "sketch-cols": 50_000,
            "error-feedback": "subtract",
            "lr-schedule": "linear",
            "lr-placement": placement,
        },
    )
    assert fetchsgd_method.params(strat.cfg, strat.d).lr_placement == placement
    assert all(0.0 < r["sketch_topk_mass"] <= 1.0 for r in rows)
    assert [r["sketch_recall"] for r in rows] == [1.0] * len(rows)
    assert max(r["sketch_rel_error"] for r in rows) < 1e-6
    assert max(r["sketch_state_drift"] for r in rows) < 1e-5


def test_a_tiny_sketch_misses_part_of_the_true_top_k(tmp_path: Path) -> None:
    _, rows = run(tmp_path, {"diagnose-sketch": True, "sketch-rows": 1, "sketch-cols": 40})  # the fewest: k
    assert all(r["sketch_recall"] < 1.0 for r in rows)
    assert min(r["sketch_rel_error"] for r in rows) > 0.1


@pytest.mark.parametrize("placement", fetchsgd.LR_PLACEMENTS)
@pytest.mark.parametrize("variant", ["subtract", "zero-buckets"])
def test_the_shadow_is_what_the_sketch_holds_under_subtract_only(variant: str, placement: str) -> None:
    """Under ``subtract`` every sketch operation is linear: the error sketch is the sketch of the shadow's error."""
    d = 3_000
    params = fetchsgd.FetchSGDParams(
        d=d, rows=3, cols=300, seed=4, k=60, momentum=0.9, error_feedback=variant, lr_placement=placement
    )
    gen = torch.Generator().manual_seed(5)
    state = fidelity.init(params)
    reports = []
    for t in range(5):
        g = torch.randn(d, generator=gen) * (torch.rand(d, generator=gen) < 0.2)
        merged = params.empty_sketch().accumulate(g).table.clone()
        state, _, rep = fidelity.step(state, merged, g, params, lr=0.1 * (1 - t / 5))
        reports.append(rep)
    assert all(r.recall < 1.0 for r in reports)  # the sketch is too small to recover exactly
    if variant == "subtract":
        assert max(r.state_drift for r in reports) < 1e-5
        sketched_error = params.empty_sketch().accumulate(state.shadow.error).table
        torch.testing.assert_close(state.sketched.error, sketched_error, rtol=1e-4, atol=1e-5)
    else:  # zeroing whole buckets also drops the mass of the coordinates that share them
        assert reports[-1].state_drift > 0.1
    state, mean = fidelity.report(state)
    assert mean.rounds == 5 and mean.recall == pytest.approx(np.mean([r.recall for r in reports]))
    assert fidelity.report(state)[1].rounds == 0  # a report empties the tally


def test_the_diagnosed_state_survives_a_checkpoint(on_and_off: Any) -> None:
    on, _ = on_and_off[True]
    tree = checkpoint.state_to_tree(on.state)
    back = checkpoint.state_from_tree(on.method.server.init(on.cfg, on.d, on.weights.device), tree)
    assert isinstance(back, fidelity.FidelityState) and isinstance(on.state, fidelity.FidelityState)
    assert torch.equal(back.shadow.error, on.state.shadow.error) and torch.equal(
        back.sketched.error, on.state.sketched.error
    )


def test_malformed_diagnostic_arrays_are_rejected_and_the_round_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spoiled: list[int] = []

    def spoil(requests: list[Message], replies: list[Message]) -> list[Message]:
        if spoiled:
            return replies
        lists = [m.content.config_records[wire.CONFIG_KEY][wire.CIDS] for m in requests]
        cids = sorted(int(c) for group in lists for c in group)  # type: ignore[union-attr]
        bad = {
            cids[0]: {wire.DIAGNOSTIC_UPDATE: np.full(1418, np.nan, np.float32)},
            cids[1]: {wire.DIAGNOSTIC_UPDATE: np.zeros(1417, np.float32)},
            cids[2]: None,
        }
        for reply in replies:
            for cid, payload in bad.items():
                if wire.diagnostic_key(cid) in reply.content.array_records:
                    del reply.content[wire.diagnostic_key(cid)]
                    if payload is not None:
                        reply.content[wire.diagnostic_key(cid)] = payload_to_record(payload)
        spoiled.extend(bad)
        return replies

    with caplog.at_level(logging.WARNING):
        strat, rows = run(tmp_path, {"diagnose-sketch": True, "num-rounds": 2}, tamper=spoil)
    assert strat.d == 1418
    first = json.loads((tmp_path / "rounds.jsonl").read_text().splitlines()[0])
    assert (first["rejected"], first["clients"], first["applied"]) == (3, 1, True)
    assert rows[-1]["rejected"] == 3 and rows[-1]["sketch_rounds"] == 2
    logged = caplog.text
    assert f"client {spoiled[0]} rejected: diagnostic: array 'update' has NaN or Inf" in logged
    assert (
        f"client {spoiled[1]} rejected: diagnostic: array 'update' is float32[1417]; expected float32[1418]" in logged
    )
    assert f"client {spoiled[2]} rejected: reply has no diagnostic arrays" in logged


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"strategy": "fedavg"}, "'diagnose-sketch' is only for strategy fetchsgd"),
        ({"client-assignment": "node"}, "'diagnose-sketch' needs 'client-assignment' = 'cohort'"),
        ({"secure-aggregation": True}, "'diagnose-sketch' and 'secure-aggregation' are not combined"),
        ({"clip-norm": 1.0, "dp-noise-multiplier": 1.0}, "'diagnose-sketch' and 'dp-noise-multiplier'"),
    ],
)
def test_the_diagnostic_is_refused_where_it_does_not_apply(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_mapping({"diagnose-sketch": True, **settings})


def test_topk_mass_is_the_share_of_the_squared_norm_in_the_top_k() -> None:
    error = torch.tensor([3.0, -4.0, 0.0, 1.0, -1.0, 0.0])
    assert fidelity.topk_mass(error, 2) == pytest.approx(25 / 27)
    assert fidelity.topk_mass(error, 4) == 1.0
    assert np.isnan(fidelity.topk_mass(torch.zeros(5), 2))


def test_recall_counts_only_the_nonzero_part_of_a_sparse_error() -> None:
    # The error has 3 nonzeros and k = 5: the true top-k is those 3, not 2 zeros a tie-break picks.
    error = torch.zeros(100)
    error[[4, 50, 90]] = torch.tensor([3.0, -2.0, 1.0])
    found_all = fetchsgd.FetchSGDUpdate(torch.tensor([4, 50, 90, 7, 8]), torch.ones(5), torch.ones(5))
    found_two = fetchsgd.FetchSGDUpdate(torch.tensor([4, 50, 1, 2, 3]), torch.ones(5), torch.ones(5))
    assert fidelity.compare(found_all, error, k=5)[0] == 1.0
    assert fidelity.compare(found_two, error, k=5)[0] == pytest.approx(2 / 3)
    assert np.isnan(fidelity.compare(found_all, torch.zeros(100), k=5)[0])
