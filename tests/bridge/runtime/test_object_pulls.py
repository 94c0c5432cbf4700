"""Shorter retries for a message's parts not yet at the SuperLink (bridge/runtime/object_pulls.py).

The retries are Flower's own ``pull_objects``, run here on an object that is missing for its first
two asks: with Flower's waits that takes about 3 s (1 s, then 2 s), installed about 0.03 s.
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Iterator

import pytest
from flwr.supercore.inflatable import inflatable_utils
from flwr.supercore.inflatable.inflatable_utils import ObjectUnavailableError

from bridge.runtime import object_pulls
from fedsketch.config import ConfigError, RunConfig
from tests.bridge.runtime import pulls


@pytest.fixture(params=[object_pulls.GRID, object_pulls.SUPERNODE])
def module(request: pytest.FixtureRequest) -> Iterator[str]:
    name = str(request.param)
    yield name
    pulls.uninstall(name)


def _missing_twice() -> tuple[list[float], object]:
    asks: list[float] = []

    def pull(object_id: str) -> bytes:
        asks.append(time.monotonic())
        if len(asks) <= 2:
            raise ObjectUnavailableError(object_id)
        return b"content"

    return asks, pull


def test_install_shortens_the_retries_of_flowers_own_pull_objects(module: str) -> None:
    assert pulls.first_retry_s(module) == pulls.FLOWER_FIRST_S
    object_pulls.install(module, 0.01)
    installed = importlib.import_module(module).pull_objects
    assert isinstance(installed, functools.partial) and installed.func is inflatable_utils.pull_objects
    assert installed.keywords == {"initial_backoff": 0.01, "backoff_cap": object_pulls.CAP_S}
    assert pulls.first_retry_s(module) == 0.01
    asks, pull = _missing_twice()
    assert installed(["a" * 64], pull) == {"a" * 64: b"content"}
    assert len(asks) == 3 and asks[-1] - asks[0] < 0.5  # Flower's own: 1 s, then 2 s
    object_pulls.install(module, 0.02)  # installing again replaces, never stacks
    assert importlib.import_module(module).pull_objects.keywords["initial_backoff"] == 0.02
    pulls.uninstall(module)
    assert importlib.import_module(module).pull_objects is inflatable_utils.pull_objects


def test_install_refuses_a_pull_objects_it_does_not_know(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    monkeypatch.setattr(importlib.import_module(module), "pull_objects", lambda *a, **k: {})
    with pytest.raises(RuntimeError, match="is not Flower's pull_objects"):
        object_pulls.install(module, 0.01)
    with pytest.raises(RuntimeError, match=r"^json.pull_objects is not Flower's pull_objects; this Flower is not"):
        object_pulls.install("json", 0.01)  # a module without one


def test_the_longest_first_wait_is_allowed() -> None:
    try:
        object_pulls.install(object_pulls.GRID, object_pulls.CAP_S)
        assert pulls.first_retry_s(object_pulls.GRID) == object_pulls.CAP_S
    finally:
        pulls.uninstall(object_pulls.GRID)


@pytest.mark.parametrize("first", [0.0, -0.01, object_pulls.CAP_S * 2])
def test_install_refuses_a_first_wait_out_of_range(first: float) -> None:
    with pytest.raises(ValueError, match="object-retry-s must be in"):
        object_pulls.install(object_pulls.GRID, first)


@pytest.mark.parametrize("value", [-0.01, 0.3])
def test_the_setting_is_checked_with_its_name(value: float) -> None:
    with pytest.raises(ConfigError, match="object-retry-s"):
        RunConfig.from_mapping({"object-retry-s": value})


def test_the_serverapp_installs_it_only_in_a_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.grid import InMemoryGrid

    from strategies.server_app import retry_objects_sooner

    sim = InMemoryGrid(LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()))
    try:
        retry_objects_sooner(sim, 0.01)
        assert pulls.first_retry_s(object_pulls.GRID) == pulls.FLOWER_FIRST_S
        retry_objects_sooner(object(), 0.0)  # type: ignore[arg-type]  # any grid that is not the simulation's
        assert pulls.first_retry_s(object_pulls.GRID) == pulls.FLOWER_FIRST_S
        retry_objects_sooner(object(), 0.01)  # type: ignore[arg-type]
        assert pulls.first_retry_s(object_pulls.GRID) == 0.01
    finally:
        pulls.uninstall(object_pulls.GRID)
