"""Shorter retries when Flower pulls a message's parts before they have all reached the SuperLink.

A Flower message travels as a message and its objects (the arrays and records
inside it), pushed one after the other. The receiver learns of the message as
soon as the message itself is in, and then pulls each object
(``flwr.supercore.inflatable.inflatable_utils.pull_objects``, 1.41 and 1.42);
an object not there yet is asked for again after 1 s, then 2, 4 and up to 10 s.
A deployed ServerApp that pulls while a device is still uploading its reply
therefore ends its round about a second late, and the sooner it pulls
(:mod:`strategies.waiting`) the more often that happens: on loopback with one
SuperNode, three rounds in nine (docs/deployed-rounds.md, "A reply pulled before
all of it has arrived").

:func:`install` gives one Flower module (the deployed grid's, or the
SuperNode's) the same function with a shorter first retry, doubling up to
:data:`CAP_S`; nothing else changes, and a module whose ``pull_objects`` is not
Flower's is refused. The ServerApp installs it in a deployment unless
``object-retry-s = 0``; the launcher's SuperNode with its backoff waits.
Importing this module changes nothing.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

GRID = "flwr.superlink.grid.http_grid"
SUPERNODE = "flwr.supernode.start_client_internal"
CAP_S = 0.25
"""The longest wait between asks for one object: each costs the SuperLink one ``PullObject`` request."""


def _flower_pull_objects() -> Callable[..., dict[str, bytes]]:
    from flwr.supercore.inflatable import inflatable_utils

    return inflatable_utils.pull_objects


def install(module: str, first_s: float) -> None:
    """``module``'s ``pull_objects`` retries after ``first_s`` seconds, doubling up to :data:`CAP_S`.

    Raises
    ------
    ValueError
        If ``first_s`` is not in (0, CAP_S].
    RuntimeError
        If ``module``'s ``pull_objects`` is neither Flower's nor one this function installed.
    """
    if not 0 < first_s <= CAP_S:
        raise ValueError(f"object-retry-s must be in (0, {CAP_S}] (0: Flower's own retries); got {first_s}")
    target = importlib.import_module(module)
    flower = _flower_pull_objects()
    current = getattr(target, "pull_objects", None)
    if current is not flower and getattr(current, "func", None) is not flower:
        raise RuntimeError(f"{module}.pull_objects is not Flower's pull_objects; this Flower is not the one expected")
    setattr(target, "pull_objects", functools.partial(flower, initial_backoff=first_s, backoff_cap=CAP_S))  # noqa: B010
