"""Server learning-rate schedules, as pure functions of the round.

FetchSGD's experiments (Rothchild et al., ICML 2020, Sec. 6) train with a
decaying learning rate; a decay also removes most of the round-to-round jitter
of the final accuracy, which matters when two methods are compared on it.
"""

from __future__ import annotations

import math

from fedsketch.settings.declared import choices

SCHEDULES = choices("lr-schedule")


def lr_at(schedule: str, base_lr: float, server_round: int, num_rounds: int) -> float:
    """The learning rate of round ``server_round`` (1-based) out of ``num_rounds``.

    ``constant``: ``base_lr``. ``linear``: from ``base_lr`` down to ``base_lr / num_rounds``.
    ``cosine``: half a cosine from ``base_lr`` towards 0 (never exactly 0 before the end).

    Raises
    ------
    ValueError
        For an unknown schedule or a round outside ``1..num_rounds``.
    """
    if not 1 <= server_round <= num_rounds:
        raise ValueError(f"round {server_round} is outside 1..{num_rounds}")
    progress = (server_round - 1) / num_rounds
    if schedule == "constant":
        return base_lr
    if schedule == "linear":
        return base_lr * (1.0 - progress)
    if schedule == "cosine":
        return base_lr * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr schedule {schedule!r}; expected constant, linear or cosine")
