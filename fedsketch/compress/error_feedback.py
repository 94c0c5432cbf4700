"""Error feedback, written once for every compressor.

Stich, Cordonnier and Jaggi, "Sparsified SGD with Memory", NeurIPS 2018, and
Karimireddy, Rebjock, Stich and Jaggi, "Error Feedback Fixes SignSGD and other
Gradient Compression Schemes", ICML 2019 (Algorithm 2, EF-SGD). A biased
compressor (top-k, Gaussian-k, scaled sign, unscaled random-k) adds what it did
not send last time to what it compresses this time:

    target    = update + error
    payload   = compress(target)
    new_error = target - decompress(payload)

The compressor is passed as two functions of one argument (bind its options and
seed first), so this is the only place the three lines exist. Why, and what it
conserves: docs/methods.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedsketch.compress.common import Payload, check_vector


def compress_with_feedback(
    update: torch.Tensor,
    error: torch.Tensor | None,
    compress_fn: Callable[[torch.Tensor], Payload],
    decompress_fn: Callable[[Payload], torch.Tensor],
) -> tuple[Payload, torch.Tensor]:
    """Compress ``update + error``; return the payload and the error to carry over.

    Parameters
    ----------
    update
        This round's 1-D float update.
    error
        The error carried from the previous round, or ``None`` for zero (first round).
    compress_fn, decompress_fn
        The compressor; ``decompress_fn(compress_fn(x))`` is what the receiver
        reconstructs from ``x``.

    Returns
    -------
    The payload to send and the new error, a float32 tensor on ``update``'s device.

    Raises
    ------
    ValueError
        If ``error`` does not have ``update``'s shape.
    """
    update = check_vector(update)
    if error is not None and error.shape != update.shape:
        raise ValueError(f"error has shape {tuple(error.shape)}; update has {tuple(update.shape)}")
    target = update if error is None else update + error.to(device=update.device, dtype=torch.float32)
    payload = compress_fn(target)
    new_error = target - decompress_fn(payload).to(target.device)
    return payload, new_error
