"""What a round does to the model and to the byte counters, for the sketching methods.

FetchSGD (Rothchild et al., ICML 2020) merges the client tables weighted by
examples and makes one step of Algorithm 1; Sketched-SGD (Ivkin et al.,
NeurIPS 2019) applies ``lr`` times the top-k of the example-weighted mean of
the exact values its second exchange collects. Both bill every exchange.

Each run goes through the real ClientApp in process (``experiments/running/inprocess_grid.py``)
with a recorder on the grid; the expected model change is computed from what the
clients actually sent, with the algorithms' public steps, and the expected
bytes from the serialized records. Clients hold unequal amounts of data (the
synthetic set's natural partition, one batch = all of a client's examples), so
uniform weights would show.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bridge.flower import task_identity
from bridge.messages import record_to_payload
from fedsketch import wire
from fedsketch.algorithms import fetchsgd
from fedsketch.compress.sparse import decode_support
from fedsketch.config import RunConfig
from fedsketch.methods.fetchsgd import ERROR_FEEDBACK
from fedsketch.methods.sketched_sgd import CANDIDATE_FACTOR
from strategies.server_app import build_strategy
from strategies.strategy import FedSketchStrategy
from tests.federation import ROUND_SETTINGS as SETTINGS
from tests.federation import Recorder, TestGrid, download_of, sent, upload_of

Run = tuple[FedSketchStrategy, RunConfig, Recorder]


@pytest.fixture(scope="module")
def runs() -> dict[str, Run]:
    """Two rounds of each sketching method, recorded."""
    out = {}
    for strategy in ("fetchsgd", "sketched_sgd"):
        cfg = RunConfig.from_mapping({**SETTINGS, "strategy": strategy})
        strat, recorder = build_strategy(cfg, None), Recorder()
        with task_identity():
            strat.start(TestGrid(cfg.to_mapping(), num_nodes=2, tamper=recorder))  # type: ignore[arg-type]
        out[strategy] = (strat, cfg, recorder)
    return out


def weighted_mean(
    uploads: dict[int, tuple[dict[str, np.ndarray], int]], name: str, examples: dict[int, int]
) -> torch.Tensor:
    """``sum_i (n_i / n) x_i`` of the clients' arrays ``name``, in client order."""
    total = sum(examples[cid] for cid in uploads)
    first = next(iter(uploads.values()))[0][name]
    out = torch.zeros(first.shape, dtype=torch.float32)
    for cid, (payload, _) in uploads.items():
        out += (examples[cid] / total) * torch.from_numpy(payload[name])
    return out


def models(strat: FedSketchStrategy, recorder: Recorder) -> list[torch.Tensor]:
    """The model before each round (as its first request carried it), then the final one."""
    rounds = recorder.rounds()
    first = [rounds[r][0][0][0].content.array_records[wire.MODEL_KEY][wire.WEIGHTS].numpy() for r in sorted(rounds)]
    return [torch.from_numpy(w.copy()) for w in first] + [strat.weights.cpu()]


def test_fetchsgd_steps_on_the_example_weighted_merge_of_the_tables(runs: dict[str, Run]) -> None:
    strat, cfg, recorder = runs["fetchsgd"]
    w = models(strat, recorder)
    params = fetchsgd.FetchSGDParams(
        d=w[0].numel(),
        rows=cfg.sketch_rows,
        cols=cfg.sketch_cols,
        seed=cfg.seed,
        k=cfg.k,
        momentum=cfg.momentum,
        error_feedback=ERROR_FEEDBACK.of(cfg),
        momentum_zeroing=cfg.momentum_zeroing,
    )
    state = fetchsgd.init(params)
    for rnd, [(_, replies)] in sorted(recorder.rounds().items()):
        uploads = sent(replies)
        examples = {cid: n for cid, (_, n) in uploads.items()}
        assert len(uploads) == 4 and len(set(examples.values())) > 1  # unequal weights, or uniform would pass
        state, update = fetchsgd.step(state, weighted_mean(uploads, "table", examples), params, cfg.lr)
        torch.testing.assert_close(w[rnd], w[rnd - 1] - update.dense(params.d), rtol=0, atol=1e-6)
        assert torch.count_nonzero(w[rnd] - w[rnd - 1]) > 0


def test_sketched_sgd_applies_lr_times_the_top_k_of_the_weighted_mean_of_the_exact_values(runs: dict[str, Run]) -> None:
    strat, cfg, recorder = runs["sketched_sgd"]
    w = models(strat, recorder)
    d = w[0].numel()
    for rnd, [(_, first), (queries, second)] in sorted(recorder.rounds().items()):
        tables, answers = sent(first), sent(second)
        examples = {cid: n for cid, (_, n) in tables.items()}  # weights are phase 1's examples
        assert set(answers) == set(tables) and len(set(examples.values())) > 1
        cands = decode_support(record_to_payload(queries[0].content.array_records[wire.QUERY_KEY]), d)
        assert cands.numel() == CANDIDATE_FACTOR.of(cfg) * cfg.k
        exact = weighted_mean(answers, "val", examples)
        top = torch.topk(exact.abs(), cfg.k).indices
        expected = torch.zeros(d)
        expected[cands[top]] = cfg.lr * exact[top]
        assert cfg.lr != 1.0 and float(expected.abs().max()) > 0
        torch.testing.assert_close(w[rnd - 1] - w[rnd], expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("strategy", "exchanges"), [("fetchsgd", 1), ("sketched_sgd", 2)])
def test_every_exchange_is_billed_what_it_carries(runs: dict[str, Run], strategy: str, exchanges: int) -> None:
    strat, _, recorder = runs[strategy]
    rounds = recorder.rounds()
    assert [row["round"] for row in strat.history] == sorted(rounds) == [1, 2]
    for row, rnd in zip(strat.history, sorted(rounds), strict=True):
        assert len(rounds[rnd]) == exchanges
        assert row["upload_bytes"] == sum(upload_of(replies) for _, replies in rounds[rnd])
        assert row["download_bytes"] == sum(download_of(requests) for requests, _ in rounds[rnd])
    if strategy == "sketched_sgd":  # the second round also sends each returning client its pending support
        assert any(key.startswith("request.") for msg in rounds[2][0][0] for key in msg.content)
