"""The ``device`` setting: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``, checked against the GPUs a process sees.

``cuda:N`` is the N-th GPU this process sees, counted after ``CUDA_VISIBLE_DEVICES`` (PyTorch's numbering):
with ``CUDA_VISIBLE_DEVICES=2,3``, ``cuda:1`` is the machine's GPU 3. The command checks the setting against
its own process before anything starts (:func:`check`), so a run asking for a GPU the machine does not show
is refused in one line instead of failing inside Flower.
"""

from __future__ import annotations

import os
import re

NAMES = ("auto", "cpu", "cuda")
_CUDA_INDEX = re.compile(r"cuda:(\d+)")


def valid(name: str) -> bool:
    """Whether ``name`` is a value the setting takes: one of :data:`NAMES` or ``cuda:N``."""
    return name in NAMES or _CUDA_INDEX.fullmatch(name) is not None


def check(name: str, visible: int) -> None:
    """Refuse a CUDA device that a process seeing ``visible`` GPUs does not have.

    Raises
    ------
    ValueError
        Naming the setting, the device and the GPUs visible.
    """
    if not name.startswith("cuda"):
        return
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = "CUDA_VISIBLE_DEVICES unset" if env is None else f"CUDA_VISIBLE_DEVICES={env!r}"
    if visible == 0:
        raise ValueError(
            f"setting 'device' is {name!r} but this machine shows no CUDA GPU to PyTorch ({shown}); "
            "use device = 'auto' (the GPU when there is one) or 'cpu'"
        )
    match = _CUDA_INDEX.fullmatch(name)
    if match and int(match.group(1)) >= visible:
        raise ValueError(
            f"setting 'device' is {name!r} but PyTorch sees {visible} CUDA GPU(s), cuda:0 to cuda:{visible - 1} "
            f"({shown}; cuda:N counts the visible ones)"
        )
