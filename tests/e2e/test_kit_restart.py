"""The kit's SuperLink killed mid-run and started again with the kit's own command: nothing to register again.

The steps are docs/deployment.md's "Try the kit on one machine" (:mod:`test_docs_deployment` reads and runs
them), with the run config's rounds raised and a checkpoint every 2 rounds, as an operator edits its lines.
The SuperLink keeps its state in the kit's ``server/superlink.db``: killed with SIGKILL while the run goes on
(its SuperExec, then its ServerApp, exit once they see it gone: Flower 1.42), it is started again with the same
block; both devices carry on without being registered again, and the same ``flwr run`` resumes the run after
its last checkpoint, with both devices in every round (a device that meets a message of the run that ended
gets a task that Flower's SuperNode keeps after dropping the message: the launcher must not wait on it).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_docs_deployment import DOC, TAG, Step, _environment, _stop, _wait_ready, steps

pytestmark = pytest.mark.slow


def _flwr(env: dict[str, str], kit: Path, *command: str) -> dict[str, Any]:
    """``flwr COMMAND fedsketch-deploy --format json`` from the kit's admin folder ({} while nothing answers)."""
    done = subprocess.run(
        ["flwr", *command, "fedsketch-deploy", "--format", "json"],
        env={**env, "FLWR_HOME": str(kit / "admin")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return dict(json.loads(done.stdout[done.stdout.find("{") :] or "{}"))


def _online(env: dict[str, str], kit: Path) -> list[int]:
    """The node ids the kit's SuperLink reports online ([] while it does not answer)."""
    nodes = _flwr(env, kit, "supernode", "list").get("nodes", [])
    return sorted(int(n["node-id"]) for n in nodes if n["status"] == "online")


def test_the_kits_superlink_restarted_with_its_command_keeps_its_devices_and_the_run_finishes(tmp_path: Path) -> None:
    page = {step.name: step for step in steps(DOC.read_text(encoding="utf-8"))}
    env, kit = _environment(tmp_path), tmp_path / "fedsketch-kit"
    started: list[tuple[Step, subprocess.Popen[bytes], Path]] = []

    def bash(step: Step, log: Path) -> subprocess.Popen[bytes]:
        with open(log, "wb") as out:
            script = page["settings"].code + step.code
            return subprocess.Popen(
                ["bash", "-euc", script],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def start(step: Step, log: Path) -> subprocess.Popen[bytes]:
        proc = bash(step, log)
        started.append((step, proc, log))
        _wait_ready(step, proc, log, timeout=180.0)
        return proc

    run_dir = kit / "runs" / "default-kit" / "fetchsgd"
    try:
        assert bash(page["kit"], tmp_path / "kit.log").wait(timeout=300) == 0, (tmp_path / "kit.log").read_text()
        settings = kit / "admin" / "run_config.toml"
        lines = settings.read_text().replace("num-rounds = 2\n", "num-rounds = 6\n")
        lines = lines.replace("round-timeout = 600.0\n", "round-timeout = 60.0\n")  # a round left waiting fails soon
        settings.write_text(lines.replace("checkpoint-every = 5\n", "checkpoint-every = 2\n"))
        link = start(page["superlink"], tmp_path / "superlink.log")
        assert bash(page["register"], tmp_path / "register.log").wait(timeout=300) == 0
        for name in ("device-0", "device-1"):
            start(page[name], tmp_path / f"{name}.log")
        nodes = _online(env, kit)
        assert len(nodes) == 2
        first = bash(page["run"], tmp_path / "run-1.log")
        started.append((page["run"], first, tmp_path / "run-1.log"))
        while first.poll() is None and not ((run_dir / "checkpoint.pt").exists() and _rows(run_dir) >= 3):
            time.sleep(0.05)
        link.kill()  # the SuperLink crashes while round 3 or 4 goes on (bash runs the page's block by exec)
        link.wait()  # and is reaped at once, as init does on a server: what it started sees it gone
        killed, ended = time.monotonic(), _rows(run_dir, "rounds.jsonl")
        assert first.wait(timeout=60) != 0  # `flwr run --stream` loses its SuperLink
        link = start(page["superlink"], tmp_path / "superlink-again.log")  # the kit's own command, again
        while _online(env, kit) != nodes and time.monotonic() - killed < 120:
            time.sleep(1.0)
        back = time.monotonic() - killed
        assert _online(env, kit) == nodes  # the same devices, with no key registered again
        again = bash(page["run"], tmp_path / "run-2.log")
        started.append((page["run"], again, tmp_path / "run-2.log"))
        assert again.wait(timeout=300) == 0, (tmp_path / "run-2.log").read_text()[-3000:]
    finally:
        left = _stop(started, env[TAG])
    resumed = [line for line in (tmp_path / "run-2.log").read_text().splitlines() if "resuming after round" in line]
    rows = [json.loads(line)["round"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    devices = [(tmp_path / f"device-{i}.log").read_text(errors="replace") for i in (0, 1)]
    print(f"SuperLink killed after {ended} rounds; both devices online again {back:.1f} s after the kill; {resumed}")
    assert not left, f"processes outlived Ctrl-C: {left}"
    assert resumed and rows == [1, 2, 3, 4, 5, 6]
    rounds = [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]
    assert [r["clients"] for r in rounds] == [2] * 6  # both devices in every round, before and after the restart
    assert all("Failed to activate" not in log for log in devices)
    for log in devices:  # a device that met a message of the ended run had its task left behind ended
        if "is not in `RUNNING` status. Ignoring message" in log:
            assert "launcher: a new task came while task(s)" in log


def _rows(run_dir: Path, name: str = "metrics.jsonl") -> int:
    path = run_dir / name
    return len(path.read_text().splitlines()) if path.exists() else 0
