"""Which settings a resumed run may change, and which differences keep it from resuming.

A checkpoint (:mod:`fedsketch.server.checkpoint`) lets a run resume exactly: the resumed rounds compute what an
uninterrupted run would. Settings that change only where or how the run executes, or which rounds are
evaluated, leave that intact and may change between the two (:data:`RUNTIME_KEYS`); any other difference
means another run. Plain values only (no torch): the command checks a run's folder before it starts
anything (:func:`experiments.running.runner.check_resumes`), the ServerApp again before it restores.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RUNTIME_KEYS = (
    "out-dir",
    "checkpoint-every",
    "round-timeout",
    "reply-poll-s",
    "object-retry-s",
    "min-nodes",
    "device",
    "client-state",
    "eval-every",
    "tracking",
)
"""Settings that change where or how a run executes, which rounds are evaluated, or where its rows are also
written, not what it computes (evaluation draws no randomness and changes no state that training reads): a
resume may change them, and a finished run is not redone for them."""


def fingerprint(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings a resumed run must agree with (all but :data:`RUNTIME_KEYS`)."""
    return {key: value for key, value in settings.items() if key not in RUNTIME_KEYS}


def differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, current value)`` for each setting outside :data:`RUNTIME_KEYS` that differs, sorted
    by key (``"(unset)"`` for a key one side lacks)."""
    old, new = fingerprint(saved), fingerprint(current)
    return [
        (key, old.get(key, "(unset)"), new.get(key, "(unset)"))
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]


def describe(found: list[tuple[str, Any, Any]], limit: int = 6) -> str:
    """``'lr' 0.1 -> 0.2; 'k' 5 -> 6``: the first ``limit`` differences."""
    return "; ".join(f"'{key}' {old!r} -> {new!r}" for key, old, new in found[:limit])
