"""The one weighted mean: clients' arrays weighted by their example counts.

FedAvg (McMahan et al., AISTATS 2017) weighs client ``i`` by ``n_i / n``; a
Count Sketch is linear, so FetchSGD (Rothchild et al., ICML 2020) merges
client tables with the same weights. Every method, the server's clipping and
the nodes' secure-aggregation sums use this function, so all weigh clients
alike and add in the same order (client order), which makes runs reproducible.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch


def weighted_mean(
    arrays: Sequence[torch.Tensor | np.ndarray], weights: Sequence[float], like: torch.Tensor | None = None
) -> torch.Tensor:
    """``sum_i (w_i / sum w) x_i``, added in order, in ``like``'s dtype and device (else the first array's).

    Raises
    ------
    ValueError
        If there are no arrays, a weight per array is missing, the weights are
        negative, not finite or sum to zero, or the arrays' shapes differ.
    """
    if not arrays or len(weights) != len(arrays):
        raise ValueError(f"need one weight per array and at least one array; got {len(weights)} and {len(arrays)}")
    if any(not np.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError(f"weights must be finite, >= 0 and not all zero; got {list(weights)[:8]}")
    first = torch.as_tensor(arrays[0])
    out = torch.zeros_like(like if like is not None else first)
    total = sum(weights)
    for x, w in zip(_on_device(_same_shape(arrays, out.shape), out.device), weights, strict=True):
        out += (w / total) * x
    return out


def _same_shape(arrays: Iterable[torch.Tensor | np.ndarray], shape: torch.Size) -> Iterator[torch.Tensor]:
    """Each array as a tensor, refused unless it has ``shape``."""
    for x in arrays:
        x = torch.as_tensor(x)
        if x.shape != shape:
            raise ValueError(f"arrays have shapes {tuple(shape)} and {tuple(x.shape)}")
        yield x


def _on_device(tensors: Iterable[torch.Tensor], device: torch.device) -> Iterator[torch.Tensor]:
    """Each tensor on ``device``, in order. A host tensor bound for a GPU is copied into one of two page-locked
    buffers in turn and sent from there without waiting, so the next one is copied while it travels; from
    pageable memory the driver copies through its own staging buffer and waits, about four times slower
    (docs/measurements/2026-11-26-h200-paper-shape.md). A buffer is refilled only once its last copy to the
    GPU is done."""
    slots: dict[int, tuple[torch.Tensor, torch.cuda.Event]] = {}
    for i, x in enumerate(tensors):
        if device.type != "cuda" or x.device.type != "cpu":
            yield x.to(device)
            continue
        slot = slots.get(i % 2)
        if slot is None or slot[0].dtype != x.dtype:  # every tensor has the mean's shape (_same_shape)
            slot = slots[i % 2] = (torch.empty(x.shape, dtype=x.dtype, pin_memory=True), torch.cuda.Event())
        buffer, sent = slot
        sent.synchronize()  # its last copy to the GPU is done (at once when never recorded)
        buffer.copy_(x)
        on_gpu = buffer.to(device, non_blocking=True)
        sent.record()
        yield on_gpu
