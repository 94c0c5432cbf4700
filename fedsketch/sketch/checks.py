"""The checks a Count Sketch makes of what it is given: sizes, seeds, tables, vectors and indices.

:class:`fedsketch.sketch.count_sketch.CountSketch` (FetchSGD, Rothchild et al., ICML 2020)
validates every argument before it touches its table: a bad one is refused
with one error that names it, never cast or clipped silently.
"""

from __future__ import annotations

import operator

import torch

from fedsketch.sketch.hashing import MAX_COLS, SERIAL_OP

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def int_arg(name: str, value: object, low: int = 1) -> int:
    """An int of at least ``low`` (numpy ints too; bool refused: ``True`` is not a size)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int; got {type(value).__name__}")
    number = operator.index(value)
    if number < low:
        raise ValueError(f"{name} must be {'positive' if low == 1 else 'non-negative'}; got {number}")
    return number


def sketch_shape(d: object, rows: object, cols: object, seed: object) -> tuple[int, int, int, int]:
    """``(d, rows, cols, seed)`` as ints, if a sketch can have them: positive sizes, at most 2**30
    columns, a seed in ``[0, 2**64)`` (it is mixed as a 64-bit integer)."""
    d, rows, cols, seed = int_arg("d", d), int_arg("rows", rows), int_arg("cols", cols), int_arg("seed", seed, 0)
    if cols > MAX_COLS:
        raise ValueError(f"cols must be at most 2**30; got {cols}")
    if seed >= 2**64:
        raise ValueError(f"seed must be below 2**64 (it is mixed as a 64-bit integer); got {seed}")
    return d, rows, cols, seed


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether tensors on ``a`` and ``b`` share a device: one named without an index (``cuda``) is
    that type's current one (``cuda:0``, where tensors made on ``cuda`` land)."""
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        return torch.empty(0, device=a).device == torch.empty(0, device=b).device
    return a.index == b.index


def check_finite(name: str, tensor: torch.Tensor) -> None:
    """Refuse NaN and Inf without a d-sized temporary in the common case.

    Finite sums prove every entry finite; only a non-finite sum (which overflow
    of huge finite values can also cause) pays for the exact check. On a CPU the
    sums go piece by piece, each small enough to run without thread hand-offs.
    """
    flat = tensor.reshape(-1)
    step = SERIAL_OP if tensor.device.type == "cpu" else max(1, flat.numel())
    sums = torch.stack([piece.sum() for piece in flat.split(step)]) if flat.numel() else flat
    if not torch.isfinite(sums).all() and not torch.isfinite(flat).all():
        raise ValueError(f"{name} contains NaN or Inf")


def check_table(table: torch.Tensor) -> None:
    """Refuse a received table unless it is a finite 2-D (rows x cols) tensor of one of :data:`DTYPES`."""
    if not isinstance(table, torch.Tensor):
        raise TypeError(f"table must be a torch.Tensor; got {type(table).__name__}")
    if table.dim() != 2:
        raise ValueError(f"table must be 2-D (rows x cols); got shape {tuple(table.shape)}")
    if table.dtype not in DTYPES:
        raise TypeError(f"table must be a floating-point tensor of {DTYPES}; got {table.dtype}")
    check_finite("table", table)


def check_vector(name: str, vec: torch.Tensor, length: int, device: torch.device) -> torch.Tensor:
    """``vec`` detached, if it is a finite flat float tensor of ``length`` on the sketch's ``device``."""
    if not isinstance(vec, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor; got {type(vec).__name__}")
    if vec.dim() != 1:
        raise ValueError(f"{name} must be a flat 1-D tensor; got shape {tuple(vec.shape)}")
    if vec.numel() != length:
        raise ValueError(f"{name} has length {vec.numel()}; expected {length}")
    if not vec.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor; got {vec.dtype}")
    if not same_device(vec.device, device):
        raise ValueError(f"{name} is on {vec.device} but the sketch is on {device}")
    check_finite(name, vec)
    return vec.detach()


def check_indices(indices: torch.Tensor, d: int, device: torch.device) -> torch.Tensor:
    """``indices`` as int64, if they are a 1-D integer tensor of coordinates in ``[0, d)`` on ``device``."""
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"indices must be a torch.Tensor; got {type(indices).__name__}")
    if indices.is_floating_point() or indices.is_complex() or indices.dtype == torch.bool:
        raise TypeError(f"indices must be an integer tensor; got {indices.dtype}")
    if indices.dim() != 1:
        raise ValueError(f"indices must be 1-D; got shape {tuple(indices.shape)}")
    if not same_device(indices.device, device):
        raise ValueError(f"indices are on {indices.device} but the sketch is on {device}")
    indices = indices.long()
    if indices.numel():
        low, high = (int(v) for v in torch.aminmax(indices))
        if low < 0 or high >= d:
            raise ValueError(f"indices must be in [0, d={d}); got range [{low}, {high}]")
    return indices
