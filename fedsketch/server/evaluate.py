"""Server-side evaluation of the global model on the held-out test set."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024) -> tuple[float, float]:
    """Return ``(accuracy, mean cross-entropy loss)`` of ``model`` on ``(x, y)``."""
    if len(x) == 0:
        raise ValueError("empty test set")
    model.eval()
    device = next(model.parameters()).device
    correct, loss_sum = 0, 0.0
    with torch.no_grad():  # a block, not a decorator: mutmut leaves decorated functions unmutated
        for start in range(0, len(x), batch_size):
            xb = x[start : start + batch_size].to(device)
            yb = y[start : start + batch_size].to(device)
            logits = model(xb)
            loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(dim=1) == yb).sum())
    return correct / len(x), loss_sum / len(x)
