"""One injected fault: an exact text substitution in one file, and the fast tests that must then fail."""

from __future__ import annotations

from dataclasses import dataclass

ROUND = "tests/strategies/test_strategy_round_math.py"
EXACT = "tests/fedsketch/client/test_state_exact.py"
STEP = "tests/fedsketch/algorithms/test_fetchsgd.py"
PATHS = "tests/fedsketch/sketch/test_count_sketch_paths.py tests/fedsketch/sketch/test_count_sketch.py"
MOMENTUM = "tests/fedsketch/training/test_local_momentum.py tests/fedsketch/training/test_batched_local.py"
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
