"""Exact top-k sparsification by magnitude.

Keeps the ``k`` coordinates of largest absolute value (Aji & Heafield, EMNLP
2017; Stich et al., "Sparsified SGD with Memory", NeurIPS 2018). FetchSGD
(Rothchild et al., ICML 2020, Sec. 6) compares against it twice: *local top-k*,
where each client uploads the top-k of its own (error-corrected) update, and
*true top-k*, where the server takes the top-k of the aggregated dense updates
(:mod:`fedsketch.algorithms.topk_sgd`).

Top-k is biased (it drops the small coordinates every time), so it is used
with error feedback (:mod:`fedsketch.compress.error_feedback`).

Payload: a sparse payload (:mod:`fedsketch.compress.sparse`) with ``k`` values.
"""

from __future__ import annotations

import torch

from fedsketch.compress.common import Payload, check_d, check_int, check_vector
from fedsketch.compress.sparse import decode_sparse, encode_sparse


def topk(vec: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(indices, values)`` of the ``k`` largest-magnitude coordinates of ``vec``.

    Indices are int64 in no particular order; values are ``vec[indices]``, on
    ``vec``'s device. Ties are broken by ``torch.topk``.

    Raises
    ------
    ValueError
        If ``vec`` is not a 1-D float vector or ``k`` is not in ``[1, len(vec)]``.
    """
    vec = check_vector(vec)
    k = check_int("k", k, 1, vec.numel())
    indices = torch.topk(vec.abs(), k, sorted=False).indices
    return indices, vec[indices]


def compress(vec: torch.Tensor, *, k: int, varint: bool = False) -> Payload:
    """Sparse payload of the top-k coordinates of ``vec`` (``varint``: see sparse)."""
    indices, values = topk(vec, k)
    return encode_sparse(indices, values, vec.numel(), varint=varint)


def decompress(payload: Payload, d: int) -> torch.Tensor:
    """The dense float32 vector (zeros off the support)."""
    return decode_sparse(payload, check_d(d))
