"""The one-process runtime's pieces that need no Flower run (the runs themselves: tests/bridge/runtime/test_simulation_backend.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge import simulation
from experiments.flower import one_process
from experiments.flower.app_files import clientapp_for


def test_the_run_config_file_is_read_as_flwr_run_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "run_config.toml"
    path.write_text('strategy = "fedavg"\nnum-rounds = 3\nlr = 0.5\nflag = true\n', encoding="utf-8")
    assert simulation.overrides(path) == {"strategy": "fedavg", "num-rounds": 3, "lr": 0.5, "flag": True}


def test_the_process_gets_the_app_first_on_its_path_and_the_malloc_settings_unless_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in one_process.MALLOC:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = one_process.process_env(tmp_path / "app", tmp_path / "home")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "app"), "/elsewhere"]
    assert env["MALLOC_ARENA_MAX"] == "2" and env["MALLOC_MMAP_THRESHOLD_"] == str(64 * 2**20)
    assert env["MALLOC_TRIM_THRESHOLD_"] == str(64 * 2**30) and env["MALLOC_TOP_PAD_"] == str(64 * 2**20)
    assert env["FLWR_HOME"] == str(tmp_path / "home") and env["FLWR_TELEMETRY_ENABLED"] == "0"
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")  # the user's own setting is kept
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    env = one_process.process_env(tmp_path / "app", tmp_path / "home")
    assert env["MALLOC_ARENA_MAX"] == "8" and env["MALLOC_TRIM_THRESHOLD_"] == "0"


ROUNDS_OF_REPLIES = """
import resource, sys
import numpy as np
if sys.argv[1] == "mallopt":
    from experiments.flower.one_process import set_malloc
    set_malloc({})
def round_of_replies():  # a node's round on the paper's shape, scaled down: 20 tables of 10 MB made into bytes
    tables = [np.ones(2_500_000, np.float32) for _ in range(20)]
    replies = [b"".join((b"header", t.data)) for t in tables]
    del tables, replies
round_of_replies()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
    round_of_replies()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.slow  # three fresh Pythons importing torch
def test_the_malloc_settings_let_a_round_reuse_what_the_last_one_freed(tmp_path: Path) -> None:
    """Three rounds of 10 MB arrays after a first: fresh pages each round under glibc's defaults, and the
    pages the first round freed with :data:`one_process.MALLOC`, set by the environment or by ``mallopt``."""
    root = Path(__file__).resolve().parents[3]
    bare = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    bare["PYTHONPATH"] = str(root)

    def faults(env: dict[str, str], how: str) -> int:
        out = subprocess.run(
            [sys.executable, "-c", ROUNDS_OF_REPLIES, how], env=env, capture_output=True, text=True, check=True
        )
        return int(out.stdout)

    default = faults(bare, "env")
    assert default > 20 * 2_000  # fresh pages for at least a round: about 2,440 a table (here every round)
    assert faults(one_process.process_env(root, tmp_path), "env") < default / 10
    assert faults(bare, "mallopt") < default / 10


def test_each_backend_runs_the_components_the_app_names_and_the_clientapp_a_staged_app_names(
    tmp_path: Path,
) -> None:
    from experiments.flower.app_files import INPROCESS_CLIENTAPP, stage_app

    root = Path(__file__).resolve().parents[3]
    assert simulation.components(root, clientapp_for("ray")) == ("strategies.server_app:app", "clients.client_app:app")
    assert simulation.components(root, clientapp_for("inprocess")) == ("strategies.server_app:app", INPROCESS_CLIENTAPP)
    staged = stage_app(root, tmp_path / "app", INPROCESS_CLIENTAPP)  # what --runtime superlink submits
    assert simulation.components(staged, clientapp_for("ray")) == simulation.components(
        root, clientapp_for("inprocess")
    )
