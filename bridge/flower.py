"""Flower beyond its public API: which versions fedsketch's uses of it were tested on, and a switch to do without.

fedsketch reaches past Flower's public API (``flwr.app``, ``flwr.clientapp``, ``flwr.serverapp``) in this
package only (an import-linter contract in pyproject.toml keeps it so): the simulation runtime called in
one process (:mod:`bridge.simulation`), the in-process backend and the device launcher
(:mod:`bridge.runtime`), shorter waits (:mod:`bridge.runtime.supernode_waits`,
:mod:`bridge.runtime.object_pulls`, :func:`simulation_grid`), the byte sizes of Flower's objects and the
copies a receiver gets (:mod:`bridge.messages`), secure aggregation's legacy API (:mod:`bridge.legacy`),
a FAB's file filter (:func:`fab_filter`) and a task's identity outside a running app (:func:`task_identity`).

Each was written against the Flower versions in :data:`TESTED`. On any other version, or with
:data:`SWITCH` set, fedsketch runs on Flower's public API only (:func:`internals` is False): runs go
through ``flwr run`` and a SuperLink on Flower's Ray backend with Flower's own waits, and what needs an
internal (the byte plan's round in one process, secure aggregation, the device launcher) says so in one
line instead of starting (docs/flower.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

TESTED = ("1.42.0",)
"""The Flower versions every use of an internal here was tested on."""
SWITCH = "FEDSKETCH_PUBLIC_FLOWER"
"""Set (to anything but ``0`` or empty) to run on Flower's public API only, whatever its version."""


def flower_version() -> str:
    """The installed Flower's version (``""`` if it is not installed)."""
    try:
        return version("flwr")
    except PackageNotFoundError:
        return ""


def internals() -> bool:
    """Whether fedsketch may use the internals of the installed Flower: a tested version, and the switch unset."""
    return not public_only_reason()


def public_only_reason() -> str:
    """Why fedsketch runs on Flower's public API only (``""`` when it does not)."""
    if os.environ.get(SWITCH, "") not in ("", "0"):
        return f"{SWITCH} is set"
    found = flower_version()
    if found not in TESTED:
        return f"Flower {found or '(not installed)'} is not one fedsketch was tested on ({', '.join(TESTED)})"
    return ""


def refuse_without_internals(what: str) -> None:
    """Refuse ``what`` in one line where fedsketch runs on Flower's public API only.

    Raises
    ------
    RuntimeError
        ``<what> needs Flower internals, and fedsketch runs on Flower's public API only: <why>``.
    """
    why = public_only_reason()
    if why:
        raise RuntimeError(f"{what} needs Flower internals, and fedsketch runs on Flower's public API only: {why}")


def simulation_grid(grid: object) -> bool:
    """Whether ``grid`` is Flower's in-memory simulation grid (a pull there is an in-process lookup)."""
    if not internals():
        return False
    from flwr.superlink.grid import InMemoryGrid

    return isinstance(grid, InMemoryGrid)


@contextmanager
def task_identity(run_id: int = 1) -> Iterator[None]:
    """Let this process build instruction messages, as a ServerApp task could (``fedsketch plan``'s round)."""
    refuse_without_internals("a round in this process (the byte plan)")
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, 0, 0
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def fab_filter() -> Callable[..., Any] | None:
    """Flower's filter of the files ``flwr run DIR`` ships (``flwr.cli.utils.filter_paths_for_publish``);
    ``None`` without internals, or on a Flower without it."""
    if not internals():
        return None
    try:
        from flwr.cli.utils import filter_paths_for_publish
    except ImportError:
        return None
    return filter_paths_for_publish


def gitignore_spec(app_dir: Any) -> Any | None:
    """The app's ``.gitignore`` as Flower's FAB filter reads it (a pathspec); ``None`` where it cannot be read so."""
    if not internals():
        return None
    try:
        from flwr.cli.utils import build_pathspec, load_gitignore_patterns
    except ImportError:
        return None
    return build_pathspec(load_gitignore_patterns(app_dir / ".gitignore"))
