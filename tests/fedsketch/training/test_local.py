"""A client's local steps are plain SGD: the same floats as ``torch.optim.SGD`` on the same batches."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedsketch.model.flat import get_flat, set_flat
from fedsketch.training.local import LocalSpec, client_generator, local_update, sample_batch


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


class _WithUnused(nn.Module):
    """A tiny MLP whose first parameter the loss never reaches (its gradient stays None)."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = nn.Parameter(torch.ones(3, dtype=torch.float64))
        self.body = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _tiny() -> nn.Module:
    torch.manual_seed(11)
    return _WithUnused()


def _data(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(n)
    return torch.randn(n, 5, generator=gen, dtype=torch.float64), torch.randint(0, 3, (n,), generator=gen)


def _flat64(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


EXACT = {"rtol": 1e-12, "atol": 1e-14}


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05], ids=["sgd", "weight-decay"])
@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["plain", "momentum"])
def test_local_steps_are_torch_sgd_step_for_step_and_leave_an_unreached_parameter_alone(
    steps: int, weight_decay: float, momentum: float
) -> None:
    """float64, a client of 10 examples drawing 4 a step: the delta, the mean loss and the count are torch's."""
    spec = LocalSpec("delta", batch_size=4, steps=steps, lr=0.2, weight_decay=weight_decay, momentum=momentum)
    x, y = _data(10)
    scratch = _tiny()
    start = _flat64(scratch) + 0.01
    result = local_update(scratch, start, x, y, spec, torch.Generator().manual_seed(2))

    reference = _tiny()
    set_flat(reference, start)
    sgd = torch.optim.SGD(reference.parameters(), lr=0.2, momentum=momentum, weight_decay=weight_decay, foreach=False)
    gen, losses = torch.Generator().manual_seed(2), []
    for _ in range(steps):
        xb, yb = sample_batch(x, y, 4, gen)
        sgd.zero_grad()
        loss = F.cross_entropy(reference(xb), yb)
        loss.backward()
        sgd.step()
        losses.append(float(loss.detach()))
    expected = start - _flat64(reference)
    torch.testing.assert_close(result.update, expected, **EXACT)
    assert torch.equal(result.update[:3], torch.zeros(3, dtype=torch.float64))  # the unreached parameter
    assert result.loss == pytest.approx(sum(losses) / steps, rel=1e-12)
    assert result.num_examples == 10


@pytest.mark.parametrize(("n", "batch"), [(10, 4), (4, 4), (3, 4)])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05], ids=["sgd", "weight-decay"])
def test_a_gradient_client_uploads_its_batch_gradient_and_counts_its_batch(
    n: int, batch: int, weight_decay: float
) -> None:
    """``"gradient"`` mode: the gradient of the drawn batch's mean loss (plus ``weight_decay * w``), no step taken."""
    x, y = _data(n)
    scratch = _tiny()
    start = _flat64(scratch) - 0.02
    spec = LocalSpec("gradient", batch_size=batch, lr=0.5, weight_decay=weight_decay)
    result = local_update(scratch, start, x, y, spec, torch.Generator().manual_seed(9))

    reference = _tiny()
    set_flat(reference, start)
    xb, yb = sample_batch(x, y, batch, torch.Generator().manual_seed(9))
    loss = F.cross_entropy(reference(xb), yb)
    grads = torch.autograd.grad(loss, list(reference.parameters())[1:])
    expected = torch.cat([torch.zeros(3, dtype=torch.float64), *(g.reshape(-1) for g in grads)])
    # the gradient comes back in float32 (the upload's dtype): float32 rounding
    torch.testing.assert_close(result.update.double(), expected + weight_decay * start, rtol=1e-6, atol=1e-7)
    assert result.num_examples == min(n, batch)
    assert result.loss == pytest.approx(float(loss.detach()), rel=1e-12)


def test_a_batch_is_drawn_without_replacement_from_the_clients_generator() -> None:
    """More samples than the batch: the first ``batch_size`` of a permutation the client's generator draws."""
    x, y = torch.arange(10.0).reshape(10, 1), torch.arange(10) + 100
    xb, yb = sample_batch(x, y, 4, torch.Generator().manual_seed(3))
    order = torch.randperm(10, generator=torch.Generator().manual_seed(3))[:4]
    assert torch.equal(xb[:, 0].long(), order) and torch.equal(yb, order + 100)


@pytest.mark.parametrize("n", [4, 2])
def test_a_client_with_at_most_a_batch_uses_all_its_samples_in_order_and_draws_nothing(n: int) -> None:
    x, y = torch.arange(float(n)).reshape(n, 1), torch.arange(n)
    gen = torch.Generator().manual_seed(3)
    before = gen.get_state()
    xb, yb = sample_batch(x, y, 4, gen)
    assert torch.equal(xb, x) and torch.equal(yb, y)
    assert torch.equal(gen.get_state(), before)


@pytest.mark.parametrize("mode", ["gradient", "delta"])
def test_a_client_without_examples_is_refused_by_name_and_one_example_is_enough(mode: str) -> None:
    spec = LocalSpec(mode, batch_size=4, steps=2)
    with pytest.raises(ValueError, match="^client has no training examples$"):
        local_update(_tiny(), _flat64(_tiny()), *_data(0), spec, torch.Generator())
    result = local_update(_tiny(), _flat64(_tiny()), *_data(1), spec, torch.Generator())
    assert result.num_examples == 1 and result.update.abs().max() > 0


@pytest.mark.parametrize("momentum", [0.0, 1e-9, 0.5, 0.999])
def test_local_momentum_in_zero_to_one_is_accepted(momentum: float) -> None:
    assert LocalSpec("delta", momentum=momentum).momentum == momentum


@pytest.mark.parametrize("momentum", [1.0, 1.5, -1e-9, float("nan")])
def test_local_momentum_outside_zero_to_one_is_refused_with_its_value(momentum: float) -> None:
    with pytest.raises(ValueError) as caught:
        LocalSpec("delta", momentum=momentum)
    assert str(caught.value) == f"local momentum must be in [0, 1); got {momentum}"


def test_local_momentum_without_local_steps_is_refused_with_the_mode() -> None:
    assert LocalSpec("gradient", momentum=0.0).mode == "gradient"
    with pytest.raises(ValueError) as caught:
        LocalSpec("gradient", momentum=0.5)
    assert str(caught.value) == "local momentum needs mode 'delta' (local SGD steps); got mode 'gradient'"


def test_a_clients_generator_is_its_own_and_fixed_by_seed_round_and_id() -> None:
    """The stream a logical client draws is pinned (published runs reproduce), and differs with each of the three."""
    assert client_generator(3, 2, 5).initial_seed() == 3000110000368
    seeds = {client_generator(*key).initial_seed() for key in [(3, 2, 5), (4, 2, 5), (3, 3, 5), (3, 2, 6), (3, 5, 2)]}
    assert len(seeds) == 5
    first = torch.randperm(50, generator=client_generator(3, 2, 5))
    assert torch.equal(first, torch.randperm(50, generator=client_generator(3, 2, 5)))


@pytest.mark.parametrize(("seed", "expected"), [(2**31 - 1, 7738644073588893738), (4167600000, 17232617427947286541)])
def test_any_run_seed_gives_each_client_a_generator(seed: int, expected: int) -> None:
    """A large run seed's mix is reduced to the range torch seeds take, rather than failing every client."""
    assert client_generator(seed, 4, 9).initial_seed() == expected
