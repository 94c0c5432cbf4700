"""Upload compressors for the FetchSGD baselines (their server steps: :mod:`fedsketch.algorithms.topk_sgd`).

Everything works on flat 1-D float32 tensors of length ``d`` (a model's
flattened update, see :mod:`fedsketch.model.flat`). A compressor turns one into a
*payload*, a ``dict[str, numpy.ndarray]`` of plain arrays that goes on the wire
as is, and back. Modules, one per method and each citing its paper:

- :mod:`~fedsketch.compress.identity` (``"none"``), :mod:`~fedsketch.compress.topk`,
  :mod:`~fedsketch.compress.random_k`, :mod:`~fedsketch.compress.gaussiank`,
  :mod:`~fedsketch.compress.qsgd`, :mod:`~fedsketch.compress.terngrad`,
  :mod:`~fedsketch.compress.signsgd`: pure ``compress`` / ``decompress`` pairs;
- :mod:`~fedsketch.compress.sparse` and :mod:`~fedsketch.compress.bits`: how
  positions and few-bit levels are laid out in bytes;
- :mod:`~fedsketch.compress.error_feedback`: error feedback, written once;
- :mod:`~fedsketch.compress.registry`: every compressor by name.

Nothing here imports Flower.
"""

from __future__ import annotations

from fedsketch.compress.bits import pack_bits, unpack_bits
from fedsketch.compress.common import Payload, derive_seed, payload_nbytes
from fedsketch.compress.error_feedback import compress_with_feedback
from fedsketch.compress.registry import COMPRESSORS, Compressor, get_compressor
from fedsketch.compress.sparse import (
    decode_sparse,
    decode_sparse_pairs,
    encode_sparse,
    sparse_count,
)

__all__ = [
    "COMPRESSORS",
    "Compressor",
    "Payload",
    "compress_with_feedback",
    "decode_sparse",
    "decode_sparse_pairs",
    "derive_seed",
    "encode_sparse",
    "get_compressor",
    "pack_bits",
    "payload_nbytes",
    "sparse_count",
    "unpack_bits",
]
