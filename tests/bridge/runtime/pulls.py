"""What the tests of bridge/runtime/object_pulls.py read and undo: the first retry installed, and Flower's own."""

from __future__ import annotations

import functools
import importlib

from bridge.runtime import object_pulls

FLOWER_FIRST_S = 1.0
"""Flower's first wait before asking again for an object that was not there (``PULL_INITIAL_BACKOFF``)."""


def uninstall(module: str) -> None:
    """Flower's own ``pull_objects`` in ``module`` again."""
    setattr(importlib.import_module(module), "pull_objects", object_pulls._flower_pull_objects())  # noqa: B010


def first_retry_s(module: str) -> float:
    """The first wait before ``module`` asks again for an object: Flower's, or the one installed."""
    current = importlib.import_module(module).pull_objects
    if isinstance(current, functools.partial):
        return float(current.keywords["initial_backoff"])
    return FLOWER_FIRST_S
