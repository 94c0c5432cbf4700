"""The SuperNode's waits: back off after a reply, Flower's 3 s when idle (bridge/runtime/supernode_waits.py)."""

from __future__ import annotations

import importlib
import time

import pytest

from bridge.runtime import supernode_waits
from bridge.runtime.supernode_waits import Backoff, BackoffClock


def _waits(backoff: Backoff, total_s: float) -> list[float]:
    """The waits of the asks made within ``total_s`` seconds of a reply (each ask itself taken as instant)."""
    out: list[float] = []
    wait = backoff.first
    while sum(out) + wait <= total_s:
        out.append(wait)
        wait = backoff.after(wait)
    return out


def _uninstall() -> None:
    """Flower's own clock and push again."""
    names = vars(importlib.import_module(supernode_waits.MODULE))
    if isinstance(names.get("time"), BackoffClock):
        names["time"], names["_push_messages"] = time, names["_push_messages"].__wrapped__


def _clock(backoff: Backoff) -> tuple[BackoffClock, list[float]]:
    slept: list[float] = []
    return BackoffClock(backoff, slept.append), slept


def test_idle_asks_wait_flowers_3_s_until_the_first_reply() -> None:
    clock, slept = _clock(Backoff(first=0.02, factor=1.5))
    for _ in range(3):
        clock.sleep(supernode_waits.IDLE_S)
    assert slept == [3.0, 3.0, 3.0]


def test_after_a_reply_the_asks_back_off_up_to_3_s_and_start_over_at_the_next_reply() -> None:
    clock, slept = _clock(Backoff(first=0.02, factor=2.0))
    clock.replied()
    for _ in range(10):
        clock.sleep(supernode_waits.IDLE_S)
    assert slept == [0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 3.0, 3.0]
    clock.replied()
    clock.sleep(supernode_waits.IDLE_S)
    assert slept[-1] == 0.02


def test_local_looks_take_10_ms_and_other_waits_are_kept() -> None:
    clock, slept = _clock(Backoff())
    clock.sleep(supernode_waits.LOCAL_S)
    clock.sleep(1.25)
    assert slept == [supernode_waits.LOCAL_POLL_S, 1.25]
    assert clock.monotonic is time.monotonic  # everything else is the time module's


def test_the_waits_within_a_span() -> None:
    assert _waits(Backoff(first=0.5, factor=2.0, cap=3.0), 10.0) == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert len(_waits(Backoff(), 10.0)) == 13  # docs/deployment.md: asks in the 10 s after a reply
    assert _waits(Backoff(), 0.01) == []


def test_install_patches_flowers_supernode_loop_and_keeps_its_push() -> None:
    module = importlib.import_module(supernode_waits.MODULE)
    push = module._push_messages
    try:
        clock = supernode_waits.install(Backoff(first=0.05))
        assert module.time is clock and clock.backoff == Backoff(first=0.05)
        assert module._push_messages is not push and module._push_messages.__wrapped__ is push
        slept: list[float] = []
        clock._sleep = slept.append  # type: ignore[method-assign]
        with pytest.raises(TypeError):  # Flower's push, given nothing to push, after the clock heard of the reply
            module._push_messages()
        clock.sleep(supernode_waits.IDLE_S)
        assert slept == [0.05]  # the next ask comes soon
    finally:
        _uninstall()
    assert module.time is time and module._push_messages is push
    try:
        assert supernode_waits.install().backoff == Backoff()
    finally:
        _uninstall()


def test_install_refuses_a_loop_it_does_not_know(monkeypatch: pytest.MonkeyPatch) -> None:
    module = importlib.import_module(supernode_waits.MODULE)
    monkeypatch.delattr(module, "time")
    with pytest.raises(RuntimeError, match="has not the loop this patch expects"):
        supernode_waits.install()
    monkeypatch.undo()
    monkeypatch.delattr(module, "_push_messages")
    with pytest.raises(RuntimeError, match="has not the loop this patch expects"):
        supernode_waits.install()


def test_a_deployment_refuses_an_unknown_choice_of_waits() -> None:
    from experiments.deployment.deploy_commands import Deployment

    assert Deployment(1, supernode_waits="flower").supernode_waits == "flower"
    with pytest.raises(ValueError, match="^--supernode-waits must be one of backoff, flower; got 'sometimes'$"):
        Deployment(1, supernode_waits="sometimes")
