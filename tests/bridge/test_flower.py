"""fedsketch on Flower's public API only (bridge/flower.py's switch): the same rows as with its internals.

With ``FEDSKETCH_PUBLIC_FLOWER`` set, a run goes through ``flwr run`` and a SuperLink on Flower's Ray backend
with Flower's own waits; the default job's metrics rows are the same to the byte and the digit.
"""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import pytest

from bridge import flower
from experiments.cli import main as fedsketch_main

TIMING = ("wall_s", "unix_time")


def _rows(folder: Path) -> list[dict[str, object]]:
    lines = (folder / "default" / "fetchsgd" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING} for line in lines]


def test_the_switch_and_an_untested_flower_mean_public_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(flower.SWITCH, raising=False)
    assert flower.internals() == (flower.flower_version() in flower.TESTED)
    monkeypatch.setenv(flower.SWITCH, "1")
    assert not flower.internals() and flower.public_only_reason() == f"{flower.SWITCH} is set"
    refused = pytest.raises(
        RuntimeError, match="needs Flower internals, and fedsketch runs on Flower's public API only"
    )
    with refused, flower.task_identity():
        pass
    monkeypatch.setenv(flower.SWITCH, "0")
    assert flower.internals() == (flower.flower_version() in flower.TESTED)


def test_an_untested_or_missing_flower_is_named_with_the_versions_tested(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(flower.SWITCH, raising=False)
    monkeypatch.setattr(flower, "TESTED", ("0.1.0", "0.2.0"))
    reason = f"Flower {flower.flower_version()} is not one fedsketch was tested on (0.1.0, 0.2.0)"
    assert flower.public_only_reason() == reason and not flower.internals()
    assert flower.fab_filter() is None and flower.gitignore_spec(Path(".")) is None
    assert not flower.simulation_grid(object())

    def missing(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(flower, "version", missing)
    assert flower.flower_version() == ""
    assert flower.public_only_reason() == "Flower (not installed) is not one fedsketch was tested on (0.1.0, 0.2.0)"


def test_only_flowers_in_memory_grid_is_the_simulations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.superlink.federation import NoOpFederationManager
    from flwr.superlink.grid import InMemoryGrid

    monkeypatch.delenv(flower.SWITCH, raising=False)
    if not flower.internals():
        pytest.skip(flower.public_only_reason())
    state = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    assert flower.simulation_grid(InMemoryGrid(state)) and not flower.simulation_grid(object())
    assert flower.fab_filter() is not None
    (tmp_path / ".gitignore").write_text("secret.txt\n")
    spec = flower.gitignore_spec(tmp_path)  # the app's own .gitignore, as Flower's FAB filter reads it
    assert spec.match_file("secret.txt") and not spec.match_file("task.py")


def test_a_task_identity_is_lent_and_given_back(monkeypatch: pytest.MonkeyPatch) -> None:
    from flwr.supercore.task_identity import TaskIdentity

    monkeypatch.delenv(flower.SWITCH, raising=False)
    if not flower.internals():
        pytest.skip(flower.public_only_reason())
    before = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    with flower.task_identity(run_id=7):
        assert (TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id) == (7, 0, 0)
    assert (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id) == before


@pytest.mark.slow
def test_the_default_jobs_rows_are_the_same_on_flowers_public_api_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_leftover_processes: None
) -> None:
    args = ["run", "--strategies", "fetchsgd", "--no-plot", "--set", "num-rounds=4", "--set", "eval-every=2"]
    assert fedsketch_main([*args, "--out", str(tmp_path / "internals")]) == 0
    monkeypatch.setenv(flower.SWITCH, "1")
    capsys.readouterr()
    assert fedsketch_main([*args, "--out", str(tmp_path / "public")]) == 0
    said = capsys.readouterr().out
    assert "on Flower's public API only" in said and "no byte plan" in said
    log = (tmp_path / "public" / "default" / "fetchsgd" / "flower.log").read_text(encoding="utf-8")
    assert "Starting Flower SuperLink" in log and "/ray/" in log  # flwr run, a SuperLink, Ray
    assert _rows(tmp_path / "public") == _rows(tmp_path / "internals")
    assert [r["round"] for r in _rows(tmp_path / "public")] == [2, 4]
