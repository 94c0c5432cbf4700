"""fedsketch on Flower's public API only (bridge/flower.py's switch): the same rows as with its internals.

With ``FEDSKETCH_PUBLIC_FLOWER`` set, a run goes through ``flwr run`` and a SuperLink on Flower's Ray backend
with Flower's own waits; the default job's metrics rows are the same to the byte and the digit.
"""

from __future__ import annotations

import json
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
