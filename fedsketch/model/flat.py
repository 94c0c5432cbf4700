"""Flattening a model's parameters to one 1-D vector and writing it back.

Sketches and compressors work on flat vectors and know nothing of models; this
module is the single place where the two meet. The order is
``model.parameters()`` order, which is deterministic for a given architecture,
so a flat vector means the same thing on every party that built the same model.
Buffers (batch-norm running statistics) are not part of the vector: they are
not trained by gradients and stay with whoever holds the module.
"""

from __future__ import annotations

import torch
from torch import nn


def num_params(model: nn.Module) -> int:
    """Number of trainable scalars, the ``d`` of every sketch and compressor."""
    return sum(p.numel() for p in model.parameters())


def get_flat(model: nn.Module) -> torch.Tensor:
    """A new float32 1-D tensor with all parameters, on the model's device."""
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


def set_flat(model: nn.Module, flat: torch.Tensor) -> None:
    """Write ``flat`` into the model's parameters in place.

    Raises
    ------
    ValueError
        If ``flat`` is not 1-D of the model's length.
    """
    d = num_params(model)
    if flat.dim() != 1 or flat.numel() != d:
        raise ValueError(f"flat vector has shape {tuple(flat.shape)}; the model needs ({d},)")
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(flat[offset : offset + n].view_as(p))
            offset += n


def get_flat_grad(model: nn.Module) -> torch.Tensor:
    """The parameters' ``.grad`` as one float32 vector (zeros where a grad is None)."""
    parts = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in model.parameters()]
    return torch.cat(parts)
