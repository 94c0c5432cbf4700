"""The one weighted mean: clients' arrays weighted by their example counts.

FedAvg (McMahan et al., AISTATS 2017) weighs client ``i`` by ``n_i / n``; a
Count Sketch is linear, so FetchSGD (Rothchild et al., ICML 2020) merges
client tables with the same weights. Every method, the server's clipping and
the nodes' secure-aggregation sums use this function, so all weigh clients
alike and add in the same order (client order), which makes runs reproducible.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    for x, w in zip(arrays, weights):
        x = torch.as_tensor(x)
        if x.shape != out.shape:
            raise ValueError(f"arrays have shapes {tuple(out.shape)} and {tuple(x.shape)}")
        out += (w / total) * x.to(out.device)
    return out
