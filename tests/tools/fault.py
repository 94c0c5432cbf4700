"""One injected fault: an exact text substitution in one file, and the fast tests that must then fail."""

from __future__ import annotations

from dataclasses import dataclass

ROUND = "tests/test_round_math.py"
EXACT = "tests/test_client_state_exact.py"
STEP = "tests/test_fetchsgd.py"
PATHS = "tests/test_sketch_paths.py tests/test_sketch.py"
MOMENTUM = "tests/test_client_momentum.py tests/test_batched_local.py"
"""The fast test files that several faults name."""


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
