"""A model's parameters as one flat vector (``fedsketch/model/flat.py``): written and read back in order."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedsketch.model.flat import get_flat, get_flat_grad, num_params, set_flat


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))  # four tensors: 12, 4, 8, 2 scalars


def test_a_vector_written_into_the_model_is_read_back_tensor_by_tensor() -> None:
    net = model()
    flat = torch.arange(26, dtype=torch.float32)
    set_flat(net, flat)
    assert num_params(net) == 26 and torch.equal(get_flat(net), flat)
    tensors = list(net.parameters())
    assert torch.equal(tensors[1], torch.arange(12, 16, dtype=torch.float32))  # the first layer's bias
    assert torch.equal(tensors[3], torch.tensor([24.0, 25.0]))


@pytest.mark.parametrize("shape", [(25,), (27,), (2, 13)])
def test_a_vector_of_another_shape_is_refused_and_the_model_left_as_it_was(shape: tuple[int, ...]) -> None:
    net = model()
    before = get_flat(net)
    with pytest.raises(ValueError) as refused:
        set_flat(net, torch.zeros(shape))
    assert str(refused.value) == f"flat vector has shape {shape}; the model needs (26,)"
    assert torch.equal(get_flat(net), before)


def test_a_missing_gradient_reads_as_zeros() -> None:
    net = model()
    set_flat(net, torch.ones(26))  # every unit active: no gradient is zero by chance of the initial weights
    net(torch.ones(1, 3)).sum().backward()
    net[2].bias.grad = None
    grad = get_flat_grad(net)
    assert grad.shape == (26,) and torch.equal(grad[24:], torch.zeros(2)) and grad[:12].abs().sum() > 0
