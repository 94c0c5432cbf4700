"""One injected fault: an exact text substitution in one file, and the fast tests that must then fail."""

from __future__ import annotations

from dataclasses import dataclass


class FaultListError(ValueError):
    """A fault's snippet does not match the code exactly once: the list needs updating."""


@dataclass(frozen=True)
class Fault:
    """Replace ``old`` by ``new`` in ``path`` (relative to the repository); ``tests`` must then fail."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str = ""


def fault(name: str, path: str, old: str, new: str, tests: str, what: str) -> Fault:
    return Fault(name, path, old, new, tuple(tests.split()), what)
