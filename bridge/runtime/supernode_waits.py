"""Shorter waits in Flower's SuperNode loop, so that a deployed round does not idle for 3 s.

Flower's SuperNode (``flwr/supernode/start_client_internal.py``, 1.41 and 1.42) asks
the SuperLink for a message; after an ask that finds none it sleeps 3 s, and it
looks for its ClientApp's reply every 0.5 s. It asks right after sending a reply,
before the server can have stepped and pushed the next round, so every round with
one SuperNode waited about 3 s on top of the device's time (docs/deployed-rounds.md).

:func:`install` gives that module a clock whose ``sleep`` backs off instead: after
the node sent a reply, the asks wait ``first``, then ``factor`` times the wait
before, up to Flower's own 3 s, so an idle node asks as often as Flower's does. The
0.5 s looks at the node's own state (no request to the SuperLink) wait 10 ms.
Every other use of the clock is the real one. The launcher installs it in its
SuperNode unless told ``--supernode-waits flower`` (:mod:`bridge.runtime.launcher`);
importing this module changes nothing.
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MODULE = "flwr.supernode.start_client_internal"
IDLE_S = 3.0
"""Flower's sleep after an ask that found no message (1.41, 1.42)."""
LOCAL_S = 0.5
"""Flower's sleep between looks at the node's own state: the ClientApp's reply, an object's content."""
LOCAL_POLL_S = 0.01
CHOICES = ("backoff", "flower")


def check_choice(choice: str) -> None:
    """Refuse a ``--supernode-waits`` value other than :data:`CHOICES`."""
    if choice not in CHOICES:
        raise ValueError(f"--supernode-waits must be one of {', '.join(CHOICES)}; got {choice!r}")


@dataclass(frozen=True)
class Backoff:
    """The asks' waits after a reply: ``first``, then ``factor`` times the one before, at most ``cap``."""

    first: float = 0.02
    factor: float = 1.5
    cap: float = IDLE_S

    def after(self, wait: float) -> float:
        """The wait that follows ``wait``."""
        return min(self.cap, wait * self.factor)


class BackoffClock:
    """Stands in for the ``time`` module in Flower's SuperNode loop: ``sleep`` backs off, the rest is ``time``'s."""

    def __init__(self, backoff: Backoff, sleep: Callable[[float], None] = time.sleep) -> None:
        self.backoff = backoff
        self._sleep = sleep
        self._next = backoff.cap  # until the first reply: Flower's own interval

    def sleep(self, seconds: float) -> None:
        """Flower's 3 s idle wait backs off; its 0.5 s local looks take 10 ms; other waits are kept."""
        if seconds == IDLE_S:
            wait, self._next = self._next, self.backoff.after(self._next)
        elif seconds == LOCAL_S:
            wait = LOCAL_POLL_S
        else:
            wait = seconds
        self._sleep(wait)

    def replied(self) -> None:
        """The node is sending a reply: the next message comes soon, so ask soon."""
        self._next = self.backoff.first

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def install(backoff: Backoff | None = None) -> BackoffClock:
    """Give Flower's SuperNode loop a :class:`BackoffClock`; refuse a Flower whose loop is not the one described.

    Raises
    ------
    RuntimeError
        If the module has no ``time`` or ``_push_messages`` to replace (another Flower version).
    """
    module = importlib.import_module(MODULE)
    push = getattr(module, "_push_messages", None)
    if getattr(module, "time", None) is not time or push is None:
        raise RuntimeError(f"{MODULE} has not the loop this patch expects (Flower 1.41 or 1.42); run without it")
    clock = BackoffClock(backoff or Backoff())
    names = vars(module)  # the loop reads both as module globals
    names["time"], names["_push_messages"] = clock, _after_reply(push, clock)
    return clock


def _after_reply(push: Callable[..., None], clock: BackoffClock) -> Callable[..., None]:
    @functools.wraps(push)  # keeps ``push`` as ``__wrapped__``
    def push_then_ask_soon(*args: Any, **kwargs: Any) -> None:
        clock.replied()
        push(*args, **kwargs)

    return push_then_ask_soon
