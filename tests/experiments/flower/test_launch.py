"""Which runtime runs a simulated federation (experiments/flower/launch.py): a real run through each."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.flower import launch
from tests.conftest import ROOT
from tests.tiny_runs import rounds, tiny_federation, tiny_run


@pytest.mark.slow  # Flower's processes on loopback
@pytest.mark.parametrize("runtime", ["process", "superlink"])
def test_the_federation_names_the_runtime_that_runs_it(tmp_path: Path, runtime: str, homes: list[Path]) -> None:
    """Only the ``superlink`` runtime writes a connection to a SuperLink; both run the run, polling meanwhile."""
    path = tiny_run(tmp_path / "runs", **{"num-rounds": 1})
    homes.append(path / "flwr-home")
    polls: list[None] = []
    fed = tiny_federation(runtime=runtime)
    assert launch.simulate(ROOT, path / "run_config.toml", fed, path, lambda: polls.append(None)) == 0
    assert rounds(path) == [1] and polls
    assert (path / "flwr-home" / "config.toml").exists() is (runtime == "superlink")
