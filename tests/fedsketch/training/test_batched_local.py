"""Local training vectorized across clients equals each client's own local SGD (FedAvg's local steps).

The reference is :func:`fedsketch.training.local.local_update`, one client at a time,
each client with its own generator; the vectorized path is
:func:`fedsketch.training.batched.per_client_local_training`, fed fresh generators of the
same seeds. In float64 the two agree to rounding, so the tolerance is tight:
any change of batch, order, step, learning rate or momentum shows. Local
momentum (``client-momentum``) keeps one buffer a client, stacked along the
client dimension; its cases check that no client's buffer leaks into another's
and that each client's starts afresh (tests/fedsketch/training/test_local_momentum.py checks
one client's momentum steps against ``torch.optim.SGD``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from bridge.flower import task_identity
from fedsketch.client.cohort import run_cohort
from fedsketch.compress.common import payload_nbytes
from fedsketch.config import RunConfig
from fedsketch.data.run import load_data
from fedsketch.methods import ClientJob
from fedsketch.model.flat import get_flat
from fedsketch.model.models import build_model
from fedsketch.task import make_model
from fedsketch.training.batched import LocalClient, functional_copy, per_client_local_training
from fedsketch.training.local import LocalSpec, local_update
from strategies.server_app import build_strategy
from tests.federation import TestGrid

SIZES = [12, 12, 5, 8, 3, 12, 20, 5, 1]
"""Batch 8: five clients draw 8 of theirs each step (n > 8, or n = 8: all), the others use all 5, 3 or 1 every step."""
SHAPES = {"mlp": (6,), "cnn": (2, 8, 8), "resnet9": (3, 8, 8)}
TIGHT = {"rtol": 1e-10, "atol": 1e-12}


def client_data(shape: tuple[int, ...], sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(n, *shape, generator=gen, dtype=torch.float64) for n in sizes]
    return [(x, torch.randint(0, 4, (len(x),), generator=gen)) for x in xs]


def layout(payload: dict[str, np.ndarray]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    return {k: (a.shape, a.dtype) for k, a in payload.items()}


def seeded(i: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 + i)


def compare(
    name: str, spec: LocalSpec, norm: str = "group", max_clients: int = 3, sizes: list[int] = SIZES
) -> list[torch.Tensor]:
    """Assert the vectorized deltas and losses equal one client at a time; return the deltas."""
    model = build_model(name, SHAPES[name], 4, seed=1, norm=norm, hidden=16).double()
    noise = torch.randn(get_flat(model).numel(), generator=seeded(-1), dtype=torch.float64)
    weights = get_flat(model).double() + 0.01 * noise  # a start that is not the initialization
    data = client_data(SHAPES[name], sizes)
    expected = [local_update(model, weights, x, y, spec, seeded(i)) for i, (x, y) in enumerate(data)]
    clients = [LocalClient(x, y, seeded(i)) for i, (x, y) in enumerate(data)]
    got = per_client_local_training(functional_copy(model), weights, clients, spec, max_clients)
    assert len(got) == len(sizes)
    for exp, (delta, loss) in zip(expected, got, strict=True):
        assert delta.dtype == exp.update.dtype == torch.float64 and exp.update.abs().max() > 0
        torch.testing.assert_close(delta, exp.update, **TIGHT)
        assert loss == pytest.approx(exp.loss, rel=1e-12)
    return [delta for delta, _ in got]


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05], ids=["sgd", "weight-decay"])
@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["plain", "momentum"])
def test_vectorized_local_training_equals_one_client_at_a_time(name: str, weight_decay: float, momentum: float) -> None:
    """Unequal clients (four batch shapes, chunks of 3), 4 steps of 8, plain SGD or with weight decay, with or
    without local momentum."""
    spec = LocalSpec("delta", batch_size=8, steps=4, lr=0.1, weight_decay=weight_decay, momentum=momentum)
    deltas = compare(name, spec)
    assert not torch.allclose(deltas[0], deltas[1])  # same size, own data and batches: own delta


@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["sgd", "momentum"])
def test_one_client_per_call_and_all_at_once_agree(momentum: float) -> None:
    """The chunking does not matter: max_clients 1 and 9 give the same deltas (equal rows, not one broadcast)."""
    spec = LocalSpec("delta", batch_size=8, steps=3, lr=0.2, weight_decay=0.01, momentum=momentum)
    one, all_ = compare("mlp", spec, max_clients=1), compare("mlp", spec, max_clients=len(SIZES))
    for a, b in zip(one, all_, strict=True):
        torch.testing.assert_close(a, b, **TIGHT)


@pytest.mark.slow  # ResNet-9 in float64: a few seconds a norm
@pytest.mark.parametrize("norm", ["group", "batch"])
def test_vectorized_local_training_with_normalization(norm: str) -> None:
    """GroupNorm, and batch norm, which normalizes each client's batch by its own statistics at every step."""
    sizes = SIZES[:-1] if norm == "batch" else SIZES  # batch norm cannot train on one sample, either way
    compare("resnet9", LocalSpec("delta", batch_size=8, steps=2, lr=0.05, weight_decay=0.01), norm=norm, sizes=sizes)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_clients_whose_data_is_on_the_cpu_train_on_the_gpu_as_on_the_cpu() -> None:
    """A cohort's data stays on the host; each step's batches go to the weights' device (the GPU) and the deltas
    come back there, equal to the CPU's to float32 rounding."""
    spec = LocalSpec("delta", batch_size=8, steps=3, lr=0.1, weight_decay=0.01, momentum=0.9)
    model = build_model("mlp", SHAPES["mlp"], 4, seed=1, hidden=16)
    weights = get_flat(model) + 0.01
    data = [(x.float(), y) for x, y in client_data(SHAPES["mlp"], SIZES)]
    on = {
        device: per_client_local_training(
            functional_copy(model).to(device),
            weights.to(device),
            [LocalClient(x, y, seeded(i)) for i, (x, y) in enumerate(data)],
            spec,
            max_clients=3,
        )
        for device in ("cpu", "cuda")
    }
    for (gpu, gpu_loss), (cpu, cpu_loss) in zip(on["cuda"], on["cpu"], strict=True):
        assert gpu.is_cuda
        torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-3, atol=1e-5)
        assert gpu_loss == pytest.approx(cpu_loss, rel=1e-4)


def test_bad_arguments_are_named() -> None:
    model = functional_copy(build_model("mlp", (4,), 3, hidden=8))
    spec = LocalSpec("delta", batch_size=4, steps=2)
    empty = LocalClient(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), seeded(0))
    with pytest.raises(ValueError, match="client 0 has no training examples"):
        per_client_local_training(model, get_flat(model), [empty], spec, max_clients=4)
    with pytest.raises(ValueError, match="max_clients must be > 0"):
        per_client_local_training(model, get_flat(model), [], spec, max_clients=0)


FEDAVG = {"strategy": "fedavg", "client-update": "delta", "local-steps": 3, "local-batch-size": 96, "client-lr": 0.1}
FEDAVG |= {"weight-decay": 1e-3, "num-clients": 12, "clients-per-round": 6, "model-hidden": 16, "num-rounds": 3}
FEDAVG |= {"eval-every": 1}  # the natural partition: clients of unequal sizes


def test_a_vectorized_cohort_sends_the_same_payloads_as_one_client_at_a_time() -> None:
    """run_cohort both ways, FedAvg with 3 local steps: equal shapes and bytes, deltas equal to float32 rounding.

    The float32 tolerance: the vectorized matrix products sum in another order
    than one client's, a few ulps a step; three steps of an MLP without
    normalization keep it near 1e-6 of the largest coordinate.
    """
    cids = [0, 3, 7, 11, 5, 99]  # 99 does not exist: that client fails alone, with the same reason both ways
    seq_cfg = RunConfig.from_mapping(FEDAVG)
    vec_cfg = RunConfig.from_mapping({**FEDAVG, "client-batching": 4})
    sizes = [len(load_data(seq_cfg).client_data(c)[1]) for c in cids[:-1]]
    assert len({min(n, 96) for n in sizes}) == 4, sizes  # four batch shapes: some clients hold fewer than 96
    d = get_flat(make_model(seq_cfg, load_data(seq_cfg))).numel()
    weights = np.random.default_rng(0).normal(0, 0.1, d).astype(np.float32)
    jobs = [ClientJob(cid, 2, {}) for cid in cids]
    seq, vec = run_cohort(seq_cfg, weights, jobs), run_cohort(vec_cfg, weights, jobs)
    assert [o.cid for o in vec] == cids and [o.error is None for o in vec] == [True] * 5 + [False]
    assert vec[-1].error == seq[-1].error and "99" in str(vec[-1].error)
    for s, v, n in zip(seq, vec, sizes):  # the failed client is left out by zip
        assert v.num_examples == s.num_examples == n
        assert s.payload is not None and v.payload is not None
        assert layout(v.payload) == layout(s.payload)
        assert payload_nbytes(v.payload) == payload_nbytes(s.payload)
        scale = float(np.abs(s.payload["update"]).max())
        np.testing.assert_allclose(v.payload["update"], s.payload["update"], rtol=1e-5, atol=1e-6 * scale)
        assert v.loss == pytest.approx(s.loss, rel=1e-5)
    assert not np.allclose(vec[0].payload["update"], vec[1].payload["update"])  # type: ignore[index]


def test_a_fedavg_run_with_client_batching_matches_one_client_at_a_time(tmp_path: Path) -> None:
    """FedAvg with local steps through the strategy and the real ClientApp: the same bytes and curve, to rounding."""
    rows = {}
    for batching in (0, 4):
        cfg = RunConfig.from_mapping({**FEDAVG, "client-batching": batching})
        out = tmp_path / str(batching)
        with task_identity():
            build_strategy(cfg, out).start(TestGrid(cfg.to_mapping(), num_nodes=2))
        rows[batching] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows[0]) == FEDAVG["num-rounds"]
    for a, b in zip(rows[0], rows[4], strict=True):
        for key in ("cum_upload_bytes", "cum_download_bytes", "clients"):
            assert a[key] == b[key], key
        assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-5)
    assert rows[0][-1]["test_loss"] < rows[0][0]["test_loss"]  # it trained


def test_client_batching_is_accepted_with_local_steps() -> None:
    cfg = RunConfig.from_mapping({"client-batching": 8, "client-update": "delta", "local-steps": 5})
    assert (cfg.client_batching, cfg.client_update) == (8, "delta")
