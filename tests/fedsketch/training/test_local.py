"""A client's local steps are plain SGD: the same floats as ``torch.optim.SGD`` on the same batches."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedsketch.model.flat import get_flat, set_flat
from fedsketch.training.local import LocalSpec, local_update, sample_batch


def _model() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 4))


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_delta_steps_are_torch_sgd(weight_decay: float) -> None:
    spec = LocalSpec(mode="delta", batch_size=8, steps=4, lr=0.3, weight_decay=weight_decay)
    x, y = torch.randn(30, 12), torch.randint(0, 4, (30,))
    model = _model()
    start = get_flat(model).clone()
    result = local_update(model, start, x, y, spec, torch.Generator().manual_seed(5))

    reference = _model()
    set_flat(reference, start)
    sgd = torch.optim.SGD(reference.parameters(), lr=spec.lr, weight_decay=weight_decay, foreach=False)
    gen = torch.Generator().manual_seed(5)
    for _ in range(spec.steps):
        xb, yb = sample_batch(x, y, spec.batch_size, gen)
        sgd.zero_grad()
        F.cross_entropy(reference(xb), yb).backward()
        sgd.step()
    expected = start - get_flat(reference)
    if weight_decay:  # torch folds the decay in as grad.add(p, alpha=wd): the same sum, rounded once less
        torch.testing.assert_close(result.update, expected, rtol=1e-5, atol=1e-7)
    else:
        assert torch.equal(result.update, expected)
    assert result.num_examples == 30
