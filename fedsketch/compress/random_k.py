"""Random-k sparsification with coordinates drawn from a shared seed.

Keeps ``k`` coordinates chosen uniformly without replacement (Stich et al.,
"Sparsified SGD with Memory", NeurIPS 2018; Wangni et al., NeurIPS 2018), a
FetchSGD baseline (Rothchild et al., ICML 2020). The coordinates are a pure
function of ``(seed, d, k)``, drawn on the CPU with a private generator (CPU
and CUDA streams differ): the server draws them itself, so the client sends
only the values. ``rescale=True`` multiplies them by ``d / k`` (unbiased);
without it random-k is biased and belongs under error feedback.

Payload: ``val: float32[k]`` (values at the sorted drawn coordinates).
"""

from __future__ import annotations

import numpy as np
import torch

from fedsketch.compress.common import (
    Payload,
    check_d,
    check_int,
    check_seed,
    check_vector,
    generator,
)

METHOD = "random_k"


def coordinates(d: int, k: int, seed: int) -> torch.Tensor:
    """The ``k`` sorted int64 coordinates (CPU) that ``seed`` selects out of ``d``.

    O(d) time and memory (a full permutation), the same on every machine.
    """
    d = check_d(d)
    k = check_int("k", k, 1, d)
    seed = check_seed(seed, METHOD)
    perm = torch.randperm(d, generator=generator(seed, "cpu"))
    return torch.sort(perm[:k]).values


def compress(vec: torch.Tensor, *, k: int, seed: int, rescale: bool = False) -> Payload:
    """Values of ``vec`` at :func:`coordinates` ``(d, k, seed)``, times ``d / k`` if ``rescale``."""
    vec = check_vector(vec)
    d = vec.numel()
    idx = coordinates(d, k, seed).to(vec.device)
    values = vec[idx]
    if rescale:
        values = values * (d / k)
    return {"val": values.cpu().numpy().astype(np.float32)}


def decompress(payload: Payload, d: int, *, seed: int) -> torch.Tensor:
    """The dense float32 vector: the values at the seed's coordinates, zeros elsewhere.

    ``k`` is the number of values; the rescaling, if any, was applied by the sender.
    """
    d = check_d(d)
    val = np.asarray(payload.get("val"))
    if val.dtype != np.float32 or val.ndim != 1 or not 1 <= val.size <= d:
        raise ValueError(f"random_k payload 'val' must be float32[k], 1 <= k <= {d}; got {val.dtype}{list(val.shape)}")
    out = torch.zeros(d, dtype=torch.float32)
    out[coordinates(d, val.size, seed)] = torch.from_numpy(val.copy())
    return out
