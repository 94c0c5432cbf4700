"""Wait for a round's replies: push once, then pull on a growing schedule until every reply or the timeout.

Flower 1.42's deployment grid (``HttpGrid.send_and_receive``) sleeps 3 s whenever a pull finds a
reply missing, so a round ends up to 3 s after its last reply arrived. :func:`send_and_receive`
keeps Flower's own ``push_messages`` and ``pull_messages`` and replaces only that sleep: the
first wait is ``first_s``, each further one ``factor`` times longer up to ``cap_s``, and the
schedule starts again from ``first_s`` after a pull that brought replies. One pull asks for every
missing reply at once, whatever the number of nodes, so the cap grows with the replies still
missing: a running round costs the SuperLink at most ``1 / cap_s`` pulls and ``ids_per_s`` named
replies a second while no reply arrives (docs/deployed-rounds.md has the figures).
Flower's simulation grid keeps its own fixed ``pull_interval`` (``reply-poll-s``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from flwr.app import Message

from bridge import flower


class PushPull(Protocol):
    """The two calls of ``flwr.serverapp.Grid`` that a wait needs."""

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]: ...

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]: ...


@dataclass(frozen=True)
class PollSchedule:
    """Seconds between pulls: ``first_s``, then ``factor`` times more after each empty pull, at most the cap.

    The cap is ``cap_s``, or longer where a pull names many missing replies: at most ``ids_per_s``
    of them a second (``None``: no such bound) (:meth:`cap_for`).
    """

    first_s: float = 0.01
    factor: float = 1.5
    cap_s: float = 0.05  # bounds how long a round waits after its last reply arrived (plus one pull)
    ids_per_s: float | None = None

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.cap_s or not math.isfinite(self.cap_s):
            raise ValueError(f"poll schedule needs 0 < first_s <= cap_s < inf; got {self.first_s}, {self.cap_s}")
        if not 1.0 <= self.factor < math.inf:
            raise ValueError(f"poll schedule needs a finite factor >= 1; got {self.factor}")
        if self.ids_per_s is not None and not 0 < self.ids_per_s < math.inf:
            raise ValueError(f"poll schedule needs 0 < ids_per_s < inf or None; got {self.ids_per_s}")

    def cap_for(self, missing: int) -> float:
        """The longest wait while ``missing`` replies are still out: ``cap_s``, or what keeps to ``ids_per_s``."""
        return self.cap_s if self.ids_per_s is None else max(self.cap_s, missing / self.ids_per_s)


@dataclass(frozen=True)
class Clock:
    """Where a wait reads the time and how it sleeps."""

    now: Callable[[], float]
    sleep: Callable[[float], None]


WALL_CLOCK = Clock(time.monotonic, time.sleep)
DEPLOYMENT = PollSchedule(ids_per_s=4000.0)
"""A deployed round: 20 pulls a second at most, and at most 4,000 reply ids (64 hexadecimal characters
each, about 256 kB) named a second, which lengthens the cap from 200 missing replies on."""


def delay(schedule: PollSchedule, empty_pulls: int, missing: int = 1) -> float:
    """The wait after ``empty_pulls + 1`` pulls in a row that brought no reply (0: after one, or after replies),
    with ``missing`` replies still out."""
    if empty_pulls < 0:
        raise ValueError(f"empty_pulls must be >= 0; got {empty_pulls}")
    if schedule.factor == 1.0:
        return schedule.first_s
    cap = schedule.cap_for(missing)
    to_cap = math.ceil(math.log(cap / schedule.first_s, schedule.factor))
    return min(cap, schedule.first_s * schedule.factor ** min(empty_pulls, to_cap))


def schedule_for(grid: object) -> PollSchedule:
    """Flower's simulation grid keeps its own interval (a pull there is an in-process lookup); others back off."""
    if flower.simulation_grid(grid):
        interval = grid.pull_interval  # type: ignore[attr-defined]  # the in-memory grid's own
        return PollSchedule(interval, 1.0, interval)
    return DEPLOYMENT


def send_and_receive(
    grid: PushPull,
    messages: Iterable[Message],
    timeout: float | None,
    schedule: PollSchedule | None = None,
    clock: Clock | None = None,
) -> list[Message]:
    """Push ``messages`` once and pull until every reply is in or ``timeout`` seconds passed (``None``: no limit).

    Replies come back in the order they were pulled, as Flower's ``send_and_receive`` returns them;
    a message Flower could not push (its id ``None`` or empty) is not waited for.
    """
    schedule = schedule if schedule is not None else schedule_for(grid)
    clock = clock if clock is not None else WALL_CLOCK
    missing = {mid for mid in grid.push_messages(list(messages)) if mid}
    deadline = None if timeout is None else clock.now() + timeout
    replies: list[Message] = []
    empty = 0
    while missing:
        got = list(grid.pull_messages(sorted(missing)))
        replies.extend(got)
        missing.difference_update(msg.metadata.reply_to_message_id for msg in got)
        empty = 0 if got else empty + 1
        if not missing:
            break
        wait = delay(schedule, max(empty - 1, 0), len(missing))
        if deadline is not None:
            remaining = deadline - clock.now()
            if remaining <= 0:
                break
            wait = min(wait, remaining)
        clock.sleep(wait)
    return replies
