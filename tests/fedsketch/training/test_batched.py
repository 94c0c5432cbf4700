"""Several clients' gradients in one vectorized call equal one client at a time."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from bridge.flower import task_identity
from fedsketch.client.cohort import run_cohort
from fedsketch.config import ConfigError, RunConfig
from fedsketch.data.run import load_data
from fedsketch.methods import ClientJob
from fedsketch.model.flat import get_flat, get_flat_grad
from fedsketch.model.models import build_model
from fedsketch.task import make_model
from fedsketch.training.batched import ClientBatch, functional_copy, per_client_gradients
from strategies.server_app import build_strategy
from tests.federation import TestGrid

SETTINGS = {
    "num-clients": 12,
    "clients-per-round": 6,
    "model-hidden": 16,
    "k": 40,
    "sketch-rows": 3,
    "sketch-cols": 400,
    "num-rounds": 4,
    "eval-every": 1,
    "local-batch-size": 8,
}


def one_at_a_time(model: torch.nn.Module, batches: list[ClientBatch]) -> list[tuple[torch.Tensor, float]]:
    out = []
    for b in batches:
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(b.x), b.y)
        loss.backward()
        out.append((get_flat_grad(model).double(), float(loss.detach())))
    return out


@pytest.mark.slow  # ResNet-9 in float64: about 10 s a norm
@pytest.mark.parametrize("norm", ["batch", "group", "none"])
def test_vectorized_gradients_equal_one_client_at_a_time_in_float64(norm: str) -> None:
    """The math is the same: in float64 only rounding separates the two (ResNet-9, every norm)."""
    model = build_model("resnet9", (3, 8, 8), 10, seed=3, norm=norm).double().train()
    gen = torch.Generator().manual_seed(0)
    sizes = [5, 5, 3, 5, 3, 5, 2]  # three shapes: clients are grouped by batch length, in chunks of 2
    batches = [
        ClientBatch(
            torch.randn(n, 3, 8, 8, generator=gen, dtype=torch.float64), torch.randint(0, 10, (n,), generator=gen)
        )
        for n in sizes
    ]
    expected = one_at_a_time(model, batches)
    got = per_client_gradients(functional_copy(model), get_flat(model).double(), batches, max_clients=2)
    assert len(got) == len(sizes)
    for (g_exp, l_exp), (g, loss) in zip(expected, got, strict=True):
        assert g.shape == g_exp.shape and g_exp.abs().max() > 0
        torch.testing.assert_close(g.double(), g_exp, rtol=0, atol=1e-6 * float(g_exp.abs().max()))
        assert loss == pytest.approx(l_exp, rel=1e-12)
    # Distinct clients get distinct gradients (a broadcast of one client's would pass the shapes).
    assert not torch.allclose(got[0][0], got[1][0])


def test_bad_arguments_are_named() -> None:
    model = functional_copy(build_model("mlp", (4,), 3, hidden=8))
    batch = ClientBatch(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long))
    with pytest.raises(ValueError, match="batch 0 is empty"):
        per_client_gradients(model, get_flat(model), [batch], max_clients=4)
    with pytest.raises(ValueError, match="max_clients must be > 0"):
        per_client_gradients(model, get_flat(model), [], max_clients=0)
    with pytest.raises(ValueError, match="the model needs"):
        per_client_gradients(model, torch.zeros(3), [], max_clients=1)


def test_a_vectorized_cohort_gives_each_client_its_own_payload_and_failure() -> None:
    """Same clients through run_cohort both ways: same examples and errors, payloads equal to float32 rounding."""
    cids = [0, 3, 7, 11, 99]  # 99 does not exist: that client fails alone, with the same reason both ways
    seq_cfg = RunConfig.from_mapping({**SETTINGS, "weight-decay": 1e-3})
    vec_cfg = RunConfig.from_mapping({**SETTINGS, "weight-decay": 1e-3, "client-batching": 3})
    d = get_flat(make_model(seq_cfg, load_data(seq_cfg))).numel()
    weights = np.random.default_rng(0).normal(0, 0.1, d).astype(np.float32)
    jobs = [ClientJob(cid, 2, {"sketch-seed": 0, "sketch-rows": 3, "sketch-cols": 400}) for cid in cids]
    seq, vec = run_cohort(seq_cfg, weights, jobs), run_cohort(vec_cfg, weights, jobs)
    assert [o.cid for o in vec] == cids
    assert [o.error is None for o in vec] == [True, True, True, True, False]
    assert vec[-1].error == seq[-1].error and "99" in str(vec[-1].error)
    for s, v in zip(seq[:-1], vec[:-1], strict=True):
        assert v.num_examples == s.num_examples > 0
        assert v.loss == pytest.approx(s.loss, rel=1e-5)
        np.testing.assert_allclose(v.payload["table"], s.payload["table"], rtol=1e-4, atol=1e-6)  # type: ignore[index]
    assert not np.allclose(vec[0].payload["table"], vec[1].payload["table"])  # type: ignore[index]


def test_a_run_with_client_batching_matches_one_client_at_a_time(tmp_path: Path) -> None:
    """FetchSGD through the strategy and the real ClientApp: the same curve and bytes, to rounding."""
    rows = {}
    for batching in (0, 4):
        cfg = RunConfig.from_mapping({**SETTINGS, "client-batching": batching})
        out = tmp_path / str(batching)
        with task_identity():
            build_strategy(cfg, out).start(TestGrid(cfg.to_mapping(), num_nodes=2))
        rows[batching] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows[0]) == SETTINGS["num-rounds"]
    for a, b in zip(rows[0], rows[4], strict=True):
        assert (a["cum_upload_bytes"], a["cum_download_bytes"], a["clients"]) == (
            b["cum_upload_bytes"],
            b["cum_download_bytes"],
            b["clients"],
        )
        assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-4)
        assert abs(b["test_accuracy"] - a["test_accuracy"]) <= 0.01
    assert rows[0][-1]["test_loss"] < rows[0][0]["test_loss"]  # it trained


def test_client_batching_must_not_be_negative() -> None:
    with pytest.raises(ConfigError, match="'client-batching' must be >= 0"):
        RunConfig.from_mapping({"client-batching": -1})
