"""Clients vectorized together compute what each computes alone: small, exact (float64) cases.

A tiny MLP (with batch normalization where it matters) and a handful of clients of unequal sizes, so that
clients are grouped by batch shape and chunked: each client's gradient, delta and loss must be its own, in
its own place in the result, and every refusal names what it refuses.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedsketch.model.flat import set_flat
from fedsketch.training.batched import (
    ClientBatch,
    LocalClient,
    _groups,
    functional_copy,
    per_client_gradients,
    per_client_local_training,
)
from fedsketch.training.local import LocalSpec, local_update

EXACT = {"rtol": 1e-10, "atol": 1e-12}
SIZES = [6, 6, 3, 6, 1, 2]
"""With batches of 4: batch lengths 4, 4, 3, 4, 1, 2 (four shapes; chunks of 2 split the first)."""


def _model(norm: bool = False) -> nn.Module:
    torch.manual_seed(5)
    layers = [nn.Linear(5, 6), *([nn.BatchNorm1d(6)] if norm else []), nn.ReLU(), nn.Linear(6, 3)]
    return nn.Sequential(*layers).double()


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _data(sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    return [
        (torch.randn(n, 5, generator=gen, dtype=torch.float64), torch.randint(0, 3, (n,), generator=gen)) for n in sizes
    ]


def _start(model: nn.Module) -> torch.Tensor:
    """A start that is not the initialization."""
    return _flat(model) + 0.05 * torch.randn(
        _flat(model).numel(), generator=torch.Generator().manual_seed(1), dtype=torch.float64
    )


@pytest.mark.parametrize("norm", [False, True], ids=["plain", "batch-norm"])
@pytest.mark.parametrize("max_clients", [2, 6])
def test_vectorized_gradients_are_each_clients_own_in_its_place(norm: bool, max_clients: int) -> None:
    sizes = [4, 4, 2, 4, 3, 2]
    model = _model(norm).train()
    weights = _start(model)
    set_flat(model, weights)
    batches = [ClientBatch(x, y) for x, y in _data(sizes)]
    got = per_client_gradients(functional_copy(model), weights, batches, max_clients)
    assert len(got) == len(batches)
    for b, (grad, loss) in zip(batches, got, strict=True):
        model.zero_grad(set_to_none=True)
        expected_loss = F.cross_entropy(model(b.x), b.y)
        expected_loss.backward()
        expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # type: ignore[union-attr]
        assert grad.dtype == torch.float32 and grad.shape == expected.shape
        torch.testing.assert_close(grad.double(), expected, rtol=1e-5, atol=1e-7)
        assert loss == pytest.approx(float(expected_loss.detach()), rel=1e-12)


def _one_at_a_time(
    model: nn.Module, weights: torch.Tensor, spec: LocalSpec, sizes: list[int]
) -> list[tuple[torch.Tensor, float]]:
    out = []
    for i, (x, y) in enumerate(_data(sizes)):
        result = local_update(model, weights, x, y, spec, torch.Generator().manual_seed(100 + i))
        out.append((result.update, result.loss))
    return out


@pytest.mark.parametrize("momentum", [0.0, 0.9], ids=["plain", "momentum"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.05], ids=["sgd", "weight-decay"])
def test_vectorized_local_steps_are_each_clients_own_local_sgd(momentum: float, weight_decay: float) -> None:
    """Two steps of batches of 4, clients of 6, 3, 2 and 1 samples: every delta and mean loss is the client's own."""
    spec = LocalSpec("delta", batch_size=4, steps=2, lr=0.3, weight_decay=weight_decay, momentum=momentum)
    model = _model()
    weights = _start(model)
    expected = _one_at_a_time(model, weights, spec, SIZES)
    clients = [LocalClient(x, y, torch.Generator().manual_seed(100 + i)) for i, (x, y) in enumerate(_data(SIZES))]
    got = per_client_local_training(functional_copy(model), weights, clients, spec, 2)
    assert len(got) == len(SIZES)
    for (exp, exp_loss), (delta, loss) in zip(expected, got, strict=True):
        assert delta.dtype == torch.float64 and exp.abs().max() > 1e-3
        torch.testing.assert_close(delta, exp, **EXACT)
        assert loss == pytest.approx(exp_loss, rel=1e-12)
    assert not torch.allclose(got[0][0], got[1][0])  # equal sizes, own data: own delta


def test_vectorized_local_steps_of_one_step_each_match_too() -> None:
    spec = LocalSpec("delta", batch_size=4, steps=1, lr=0.3, momentum=0.5)
    model = _model()
    weights = _start(model)
    clients = [LocalClient(x, y, torch.Generator().manual_seed(100 + i)) for i, (x, y) in enumerate(_data(SIZES[:3]))]
    got = per_client_local_training(functional_copy(model), weights, clients, spec, 3)
    for (exp, exp_loss), (delta, loss) in zip(_one_at_a_time(model, weights, spec, SIZES[:3]), got, strict=True):
        torch.testing.assert_close(delta, exp, **EXACT)
        assert loss == pytest.approx(exp_loss, rel=1e-12)


@pytest.mark.parametrize("max_clients", [0, -1])
def test_a_max_clients_below_one_is_refused_with_its_value(max_clients: int) -> None:
    model = functional_copy(_model())
    spec = LocalSpec("delta", batch_size=4)
    batch = ClientBatch(*_data([2])[0])
    with pytest.raises(ValueError, match=rf"^max_clients must be > 0; got {max_clients}$"):
        per_client_gradients(model, _flat(model), [batch], max_clients)
    with pytest.raises(ValueError, match=rf"^max_clients must be > 0; got {max_clients}$"):
        per_client_local_training(
            model, _flat(model), [LocalClient(*_data([2])[0], torch.Generator())], spec, max_clients
        )


def test_one_client_at_a_time_is_a_valid_max_clients() -> None:
    model = functional_copy(_model())
    batches = [ClientBatch(x, y) for x, y in _data([2, 3])]
    assert len(per_client_gradients(model, _flat(model), batches, 1)) == 2


def test_an_empty_client_is_refused_by_its_index() -> None:
    model = functional_copy(_model())
    (x, y), empty = _data([2])[0], _data([0])[0]
    spec = LocalSpec("delta", batch_size=4)
    with pytest.raises(ValueError, match="^batch 1 is empty$"):
        per_client_gradients(model, _flat(model), [ClientBatch(x, y), ClientBatch(*empty)], 4)
    clients = [LocalClient(x, y, torch.Generator()), LocalClient(*empty, torch.Generator())]
    with pytest.raises(ValueError, match="^client 1 has no training examples$"):
        per_client_local_training(model, _flat(model), clients, spec, 4)
    one = [LocalClient(*_data([1])[0], torch.Generator())]  # one sample is enough
    assert len(per_client_local_training(model, _flat(model), one, spec, 4)) == 1


def test_a_flat_vector_of_the_wrong_shape_is_refused_with_both_shapes() -> None:
    model = functional_copy(_model())
    d = _flat(model).numel()
    batch = [ClientBatch(*_data([2])[0])]
    for weights in (torch.zeros(1, d, dtype=torch.float64), torch.zeros(d + 1, dtype=torch.float64)):
        with pytest.raises(ValueError) as caught:
            per_client_gradients(model, weights, batch, 2)
        assert str(caught.value) == f"flat vector has shape {tuple(weights.shape)}; the model needs ({d},)"


@pytest.mark.parametrize("max_clients", [1, 2, 3, 7])
def test_clients_are_chunked_by_shape_at_most_max_clients_each_once(max_clients: int) -> None:
    """Equal shapes only share a chunk, none holds more than ``max_clients``, and every client is in one."""
    shapes = [((n, 5), (n,)) for n in [4, 4, 2, 4, 3, 2, 4, 4]]
    chunks = _groups(shapes, max_clients)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(len(shapes)))
    for chunk in chunks:
        assert 1 <= len(chunk) <= max_clients and len({shapes[i] for i in chunk}) == 1
    assert len(chunks) == sum(-(-count // max_clients) for count in (5, 2, 1))  # as few as the bound allows
    assert _groups([((4, 5), (4,)), ((4, 5), (3,))], 2) == [[0], [1]]  # labels' shape counts too


def test_a_vectorizable_copy_trains_and_leaves_the_model_as_it_was() -> None:
    """The copy is in training mode without running statistics; the model keeps its mode and its statistics."""
    model = _model(norm=True).eval()
    copy = functional_copy(model)
    assert copy is not model and copy.training and not model.training
    assert model[1].track_running_stats and not copy[1].track_running_stats
    before = model[1].running_mean.clone()  # type: ignore[union-attr]
    weights = _flat(model)
    per_client_gradients(copy, weights, [ClientBatch(*_data([4])[0])], 1)
    assert torch.equal(model[1].running_mean, before)  # type: ignore[arg-type]


def test_clients_whose_samples_differ_in_shape_are_vectorized_apart() -> None:
    """A model that takes samples of any length (adaptive pooling): 5- and 7-feature clients each get their own."""
    torch.manual_seed(2)
    model = nn.Sequential(nn.Unflatten(1, (1, -1)), nn.AdaptiveAvgPool1d(2), nn.Flatten(), nn.Linear(2, 3)).double()
    gen = torch.Generator().manual_seed(4)
    data = [
        (torch.randn(3, f, generator=gen, dtype=torch.float64), torch.randint(0, 3, (3,), generator=gen))
        for f in (5, 7)
    ]
    weights = _flat(model)
    spec = LocalSpec("delta", batch_size=4, steps=1, lr=0.3)
    clients = [LocalClient(x, y, torch.Generator()) for x, y in data]
    deltas = per_client_local_training(functional_copy(model), weights, clients, spec, 2)
    grads = per_client_gradients(functional_copy(model), weights, [ClientBatch(x, y) for x, y in data], 2)
    for (x, y), (delta, _), (grad, _) in zip(data, deltas, grads, strict=True):
        expected = local_update(model, weights, x, y, spec, torch.Generator()).update
        torch.testing.assert_close(delta, expected, **EXACT)
        torch.testing.assert_close(grad.double(), expected / 0.3, rtol=1e-5, atol=1e-7)
