"""Many Count Sketches at once: the tables of a cohort's updates, each block of buckets hashed once.

FetchSGD's clients (Rothchild et al., ICML 2020) each upload the Count Sketch of their gradient; with
``client-batching`` a node holds a chunk of clients' gradients at once, and on a GPU sketching them one
at a time costs a hash and a few kernel launches per block per client. Here every block's buckets and
signs are computed once and added for all the vectors in one ``index_add_``. The hash functions are
:mod:`fedsketch.sketch.hashing`'s, so each table equals :class:`fedsketch.sketch.count_sketch.CountSketch`'s up to the order of
 float additions (tests/fedsketch/sketch/test_batch.py); what it bought on a GPU: docs/sketch.md.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from fedsketch.sketch.checks import check_finite, sketch_shape
from fedsketch.sketch.hashing import HASH_SPAN, TabulationHash


def sketch_tables(vecs: torch.Tensor, rows: int, cols: int, seed: int) -> torch.Tensor:
    """The float32 ``(n, rows, cols)`` tables of the Count Sketches of the ``n`` rows of ``vecs`` (``n x d``).

    Row ``b`` is ``CountSketch(d, rows, cols, seed).accumulate(vecs[b]).table`` up to the order of float
    additions; each block of buckets is hashed once for all ``n`` vectors (client-batching's encode).

    Raises
    ------
    ValueError
        If ``vecs`` is not a 2-D floating-point tensor, or holds NaN or Inf; and what
        :func:`fedsketch.sketch.checks.sketch_shape` raises for the shape and seed.
    """
    if not isinstance(vecs, torch.Tensor) or vecs.dim() != 2 or not vecs.is_floating_point():
        raise ValueError(f"vecs must be a 2-D floating-point tensor; got {getattr(vecs, 'shape', type(vecs))}")
    n, d = vecs.shape
    d, rows, cols, seed = sketch_shape(d, rows, cols, seed)  # refused as every sketch refuses them
    hashes = TabulationHash.build(seed, d, rows, cols, vecs.device)
    check_finite("vecs", vecs)
    tables = torch.zeros(n, hashes.rows, hashes.cols, device=vecs.device)
    if n:
        _accumulate_batch(tables.view(n, -1), vecs.detach().contiguous(), hashes)
    return tables


BATCH_BLOCK = 1 << 26
"""Values (vectors x rows x coordinates) :func:`sketch_tables` adds in one step: 256 MB of float32."""


def _accumulate_batch(tables: torch.Tensor, vecs: torch.Tensor, hashes: TabulationHash) -> None:
    """``tables[b] += S(vecs[b])`` (flat ``n x rows*cols``) by blocks of whole chunks, each block's buckets
    and signs computed once for all ``n`` vectors (``_hashing.accumulate_dense``'s blocks, batched)."""
    n, C = vecs.shape[0], hashes.chunk
    step = max(1, BATCH_BLOCK // (n * hashes.rows * C))
    span = max(step, HASH_SPAN // step * step)  # chunks hashed at once
    for s0 in range(0, hashes.n_chunks, span):
        offsets, chunk_signs = hashes.block_hash(s0, min(hashes.n_chunks, s0 + span))
        for h0 in range(s0, min(hashes.n_chunks, s0 + span), step):
            h1 = min(hashes.n_chunks, h0 + step)
            piece = vecs[:, h0 * C : h1 * C]
            piece = F.pad(piece, (0, (h1 - h0) * C - piece.shape[1]))  # the last chunk, zero-padded
            signs = chunk_signs[:, h0 - s0 : h1 - s0, None] * hashes.lo_sign
            values = piece.view(n, 1, h1 - h0, C) * signs
            buckets = hashes.window_buckets(offsets[:, h0 - s0 : h1 - s0]).view(-1)
            tables.index_add_(1, buckets, values.view(n, -1).to(tables.dtype))


def host_tables(tables: torch.Tensor) -> torch.Tensor:
    """``tables`` on the host: from a GPU in one copy into page-locked memory, which torch's host cache hands
    back once every view of it is gone, so the next chunk's copy reuses it. Copying each table to fresh
    pageable memory on its own cost about 20 times as long (docs/sketch.md)."""
    if tables.device.type != "cuda":
        return tables.cpu()
    host = torch.empty(tables.shape, dtype=tables.dtype, pin_memory=True)
    return host.copy_(tables)
