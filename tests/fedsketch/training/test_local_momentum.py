"""Local momentum (``client-momentum``): one client's steps are ``torch.optim.SGD(momentum=m)``'s, and momentum 0 is
plain SGD, the same floats as before the setting existed.

PyTorch's SGD with dampening 0 and no Nesterov (Sutskever et al., ICML 2013), as FedAvg's local training uses it
(McMahan et al., AISTATS 2017). Clients are stateless: the buffer lives through one client's steps in one round, so
two clients run through the same scratch model must each match a fresh optimizer. The vectorized path is checked
against this one in tests/fedsketch/training/test_batched_local.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedsketch.client.cohort import run_cohort
from fedsketch.config import ConfigError, RunConfig
from fedsketch.data.run import load_data
from fedsketch.methods import ClientJob
from fedsketch.model.flat import get_flat, set_flat
from fedsketch.model.models import build_model
from fedsketch.task import local_spec, make_model
from fedsketch.training.local import LocalSpec, local_update, sample_batch

EXACT = {"rtol": 1e-12, "atol": 1e-14}


def _model(name: str, dtype: torch.dtype) -> nn.Module:
    shape = (6,) if name == "mlp" else (2, 8, 8)
    return build_model(name, shape, 4, seed=1, norm="group", hidden=16).to(dtype)


def _flat(model: nn.Module) -> torch.Tensor:
    """The parameters as one vector in the model's dtype (``get_flat`` gives float32)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _clients(name: str, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Two clients of unequal size: 19 samples (batches of 8 drawn) and 5 (all of them every step)."""
    shape = (6,) if name == "mlp" else (2, 8, 8)
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(n, *shape, generator=gen, dtype=dtype), torch.randint(0, 4, (n,), generator=gen)) for n in (19, 5)
    ]


def _torch_sgd(
    name: str, start: torch.Tensor, x: torch.Tensor, y: torch.Tensor, spec: LocalSpec, seed: int
) -> torch.Tensor:
    """``start - w_end`` after ``spec.steps`` of a fresh ``torch.optim.SGD`` on the batches ``local_update`` draws."""
    model = _model(name, start.dtype)
    set_flat(model, start)
    sgd = torch.optim.SGD(
        model.parameters(), lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay, foreach=False
    )
    gen = torch.Generator().manual_seed(seed)
    for _ in range(spec.steps):
        xb, yb = sample_batch(x, y, spec.batch_size, gen)
        sgd.zero_grad()
        F.cross_entropy(model(xb), yb).backward()
        sgd.step()
    return start - _flat(model)


@pytest.mark.parametrize("name", ["mlp", "cnn"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05], ids=["sgd", "weight-decay"])
@pytest.mark.parametrize("momentum", [0.5, 0.9])
def test_local_momentum_is_torch_sgd_with_momentum(name: str, weight_decay: float, momentum: float) -> None:
    """float64, 5 steps, two clients one after the other through one scratch model: each equals a fresh optimizer."""
    spec = LocalSpec("delta", batch_size=8, steps=5, lr=0.1, weight_decay=weight_decay, momentum=momentum)
    scratch = _model(name, torch.float64)
    start = _flat(scratch)
    plain = LocalSpec("delta", batch_size=8, steps=5, lr=0.1, weight_decay=weight_decay)
    for i, (x, y) in enumerate(_clients(name, torch.float64)):
        result = local_update(scratch, start, x, y, spec, torch.Generator().manual_seed(100 + i))
        expected = _torch_sgd(name, start, x, y, spec, 100 + i)
        assert result.update.dtype == torch.float64
        torch.testing.assert_close(result.update, expected, **EXACT)
        without = local_update(scratch, start, x, y, plain, torch.Generator().manual_seed(100 + i)).update
        assert (result.update - without).norm() > 0.1 * without.norm()  # the momentum shows


def _plain_sgd_before(
    model: nn.Module, start: torch.Tensor, x: torch.Tensor, y: torch.Tensor, spec: LocalSpec, seed: int
) -> torch.Tensor:
    """Local SGD as fedsketch computed it before ``client-momentum`` existed, written out."""
    set_flat(model, start)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(spec.steps):
        xb, yb = sample_batch(x, y, spec.batch_size, gen)
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(xb), yb).backward()
        with torch.no_grad():
            for p in model.parameters():
                if spec.weight_decay:
                    p.add_(p.grad + spec.weight_decay * p, alpha=-spec.lr)
                else:
                    p.add_(p.grad, alpha=-spec.lr)
    end = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return start - end


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05], ids=["sgd", "weight-decay"])
def test_momentum_zero_is_plain_sgd_bit_for_bit(dtype: torch.dtype, weight_decay: float) -> None:
    spec = LocalSpec("delta", batch_size=8, steps=4, lr=0.1, weight_decay=weight_decay, momentum=0.0)
    scratch = _model("mlp", dtype)
    start = _flat(scratch)
    for i, (x, y) in enumerate(_clients("mlp", dtype)):
        got = local_update(scratch, start, x, y, spec, torch.Generator().manual_seed(7 + i)).update
        assert torch.equal(got, _plain_sgd_before(_model("mlp", dtype), start, x, y, spec, 7 + i))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"client-update": "delta", "client-momentum": 1.0}, r"setting 'client-momentum' must be in \[0, 1\); got 1.0"),
        ({"client-update": "delta", "client-momentum": -0.1}, r"setting 'client-momentum' must be in \[0, 1\)"),
        ({"client-update": "delta", "client-momentum": float("nan")}, r"setting 'client-momentum' must be in \[0, 1\)"),
        ({"client-momentum": 0.9}, "setting 'client-momentum' needs 'client-update' = 'delta'"),
    ],
)
def test_bad_client_momentum_is_refused_by_name(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_mapping(values)


def test_local_spec_refuses_momentum_it_cannot_use() -> None:
    with pytest.raises(ValueError, match=r"local momentum must be in \[0, 1\); got 1.5"):
        LocalSpec("delta", momentum=1.5)
    with pytest.raises(ValueError, match="local momentum needs mode 'delta'"):
        LocalSpec("gradient", momentum=0.9)


FEDAVG = {"strategy": "fedavg", "client-update": "delta", "local-steps": 3, "local-batch-size": 96, "client-lr": 0.1}
FEDAVG |= {"weight-decay": 1e-3, "num-clients": 12, "clients-per-round": 6, "model-hidden": 16}


def test_the_setting_reaches_both_cohort_paths() -> None:
    """run_cohort with client-momentum, one at a time and vectorized: equal to float32 rounding, unlike no momentum."""
    cfg = RunConfig.from_mapping({**FEDAVG, "client-momentum": 0.9})
    assert local_spec(cfg).momentum == 0.9 and local_spec(RunConfig()).momentum == 0.0
    vec_cfg = RunConfig.from_mapping({**FEDAVG, "client-momentum": 0.9, "client-batching": 4})
    d = get_flat(make_model(cfg, load_data(cfg))).numel()
    weights = np.random.default_rng(0).normal(0, 0.1, d).astype(np.float32)
    jobs = [ClientJob(cid, 2, {}) for cid in (0, 3, 7, 11)]
    seq, vec = run_cohort(cfg, weights, jobs), run_cohort(vec_cfg, weights, jobs)
    plain = run_cohort(RunConfig.from_mapping(FEDAVG), weights, jobs)
    for s, v, p in zip(seq, vec, plain, strict=True):
        assert s.payload is not None and v.payload is not None and p.payload is not None
        scale = float(np.abs(s.payload["update"]).max())
        np.testing.assert_allclose(v.payload["update"], s.payload["update"], rtol=1e-5, atol=1e-6 * scale)
        assert not np.allclose(s.payload["update"], p.payload["update"], atol=1e-3 * scale)
