"""bridge/runtime/launcher.py: the SuperNode under a warm launcher that forks a ClientApp per message."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from experiments.deployment.deploy import TAG, Deployment, LocalFederation, node_settings
from experiments.deployment.deploy_commands import superlink_command, supernode_command
from experiments.deployment.pki import make_certificates
from experiments.flower.flower_procs import bin_path, flower_env, free_port, stop_group, wait_healthy_tls
from experiments.flower.procs import stop_carrying

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_each_round_runs_the_runs_own_clientapp_code_in_a_fork(tmp_path: Path) -> None:
    """The FAB's code, not the copy the launcher was started from, answers; no flower-superexec runs."""
    app = tmp_path / "app"
    for part in ("clients", "fedsketch", "strategies", "experiments"):
        shutil.copytree(ROOT / part, app / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", app / "pyproject.toml")
    with open(app / "clients" / "client_app.py", "a", encoding="utf-8") as f:
        f.write('\nimport os as _os, pathlib as _p\n_p.Path(_os.environ["FLWR_HOME"], "from-the-fab").touch()\n')
    settings = {**node_settings(1), "num-rounds": 2, "eval-every": 2, "out-dir": str(tmp_path / "runs")}
    (tmp_path / "run.toml").write_text("".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in settings.items()))
    with LocalFederation(Deployment(1), tmp_path / "fed") as fed:
        launcher = fed.procs["supernode-0"]
        assert fed.run(app, tmp_path / "run.toml", tmp_path / "flower.log") == 0
        log = fed.log("supernode-0").read_text(errors="replace")
        assert launcher.poll() is None  # the launcher outlives its tasks
    assert (tmp_path / "fed" / "nodes" / "node-0" / "from-the-fab").exists()
    assert "launcher ready" in log and log.count("Sent successfully") == 2
    assert "Starting Flower SuperExec" not in log  # Flower's per-message launcher never started


@pytest.mark.slow
def test_the_launcher_says_ready_only_once_the_superlink_has_accepted_its_supernode(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    """Started before its SuperLink, the device says it waits for it; ready comes once the SuperNode has joined."""
    port, tag = free_port(), {TAG: str(tmp_path)}
    node_cmd = supernode_command(f"127.0.0.1:{port}", free_port(), 0, 1, None, None)
    log = tmp_path / "device.log"
    device = _start_device(node_cmd, log, tmp_path, tag)
    link: subprocess.Popen[bytes] | None = None
    try:
        _wait_for(log, f"launcher: waiting for the SuperLink at 127.0.0.1:{port}", device)
        assert "launcher ready" not in log.read_text()
        with open(tmp_path / "superlink.log", "wb") as out:
            link = subprocess.Popen(
                [bin_path("flower-superlink"), *superlink_command(port, None, auth=False)[1:]],
                cwd=tmp_path,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**flower_env(tmp_path / "link"), **tag},
            )
        _wait_for(log, f"connected to the SuperLink at 127.0.0.1:{port}", device)
        ready = next(line for line in log.read_text().splitlines() if line.startswith("launcher ready"))
        assert re.match(r"launcher ready: SuperNode \d+ connected", ready), ready
    finally:
        for proc in (device, link):
            if proc is not None:
                stop_group(proc)
        stop_carrying(TAG, str(tmp_path), 5.0)


def _start_device(node_cmd: list[str], log: Path, tmp_path: Path, tag: dict[str, str]) -> subprocess.Popen[bytes]:
    """The device's launcher and SuperNode (``node_cmd`` run by this Python), its output in ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, *node_cmd[1:]],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**flower_env(tmp_path / "node"), **tag},
            start_new_session=True,
        )


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float = 120.0, count: int = 1) -> None:
    deadline = time.monotonic() + timeout
    while log.read_text(errors="replace").count(text) < count:
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no {text!r} (exit code {proc.poll()}):\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.5)


@pytest.mark.slow
def test_a_runtime_port_taken_is_one_line_saying_what_to_do(tmp_path: Path, no_leftover_processes: None) -> None:
    """Another process holds the device's local Runtime API port: Flower's error, the launcher's advice, no traceback."""
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    node_cmd = supernode_command(f"127.0.0.1:{free_port()}", taken, 0, 1, None, None)
    try:
        done = subprocess.run(
            [sys.executable, *node_cmd[1:]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**flower_env(tmp_path / "node"), TAG: str(tmp_path)},
            start_new_session=True,
        )
    finally:
        holder.close()
        stop_carrying(TAG, str(tmp_path), 5.0)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out
    assert "Traceback" not in out, out
    assert "launcher: SuperNode Runtime HTTP API failed to start. Another process may hold its port" in out, out


@pytest.mark.slow
def test_a_plain_text_device_against_a_tls_superlink_is_told_so_within_30_s(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    """The SuperLink closes the connection without a word and logs nothing; Flower's SuperNode retries for ever."""
    port, tag = free_port(), {TAG: str(tmp_path)}
    certs = make_certificates(tmp_path / "certs")
    link: subprocess.Popen[bytes] | None = None
    device: subprocess.Popen[bytes] | None = None
    log = tmp_path / "device.log"
    try:
        with open(tmp_path / "superlink.log", "wb") as out:
            link = subprocess.Popen(
                [bin_path("flower-superlink"), *superlink_command(port, certs, auth=False)[1:]],
                cwd=tmp_path,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**flower_env(tmp_path / "link"), **tag},
            )
        wait_healthy_tls(f"127.0.0.1:{port}", certs.ca_cert, link, tmp_path / "superlink.log", timeout=60.0)
        node_cmd = supernode_command(f"127.0.0.1:{port}", free_port(), 0, 1, None, None)  # --insecure: plain text
        device = _start_device(node_cmd, log, tmp_path, tag)
        started = time.monotonic()
        _wait_for(log, "Is the SuperLink using TLS? It is", device, timeout=60.0)
        took = time.monotonic() - started
    finally:
        for proc in (device, link):
            if proc is not None:
                stop_group(proc)
        stop_carrying(TAG, str(tmp_path), 5.0)
    hint = next(line for line in log.read_text().splitlines() if "Is the SuperLink using TLS?" in line)
    print(f"after {took:.1f} s: {hint}")
    assert took < 30.0
    assert f"attempts to reach the SuperLink at 127.0.0.1:{port} failed" in hint
    assert "this device connects in plain text (--insecure): give the SuperNode the CA certificate" in hint
    assert "launcher ready" not in log.read_text()


@pytest.mark.slow
def test_a_device_whose_superlink_restarted_without_its_state_rejoins_by_itself(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    """A SuperLink that keeps its state in memory forgets the node; Flower's SuperNode then exits 0 (a 401 on its
    heartbeat). The launcher starts it again after a wait, and it joins the new SuperLink as a new node."""
    port, tag = free_port(), {TAG: str(tmp_path)}
    link_cmd = [bin_path("flower-superlink"), *superlink_command(port, None, auth=False)[1:]]
    link_env = {**flower_env(tmp_path / "link"), **tag}
    node_cmd = supernode_command(f"127.0.0.1:{port}", free_port(), 0, 1, None, None)
    log, device = tmp_path / "device.log", None

    def superlink(name: str) -> subprocess.Popen[bytes]:
        with open(tmp_path / name, "wb") as out:
            return subprocess.Popen(
                link_cmd, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=link_env
            )

    link = superlink("superlink.log")
    try:
        device = _start_device(node_cmd, log, tmp_path, tag)
        _wait_for(log, "launcher ready", device)
        link.kill()
        link.wait()
        link = superlink("superlink-again.log")  # in memory: it knows no node
        started = time.monotonic()
        _wait_for(log, "connected to the SuperLink at", device, timeout=120.0, count=2)
        took = time.monotonic() - started
    finally:
        for proc in (device, link):
            if proc is not None:
                stop_group(proc)
        stop_carrying(TAG, str(tmp_path), 5.0)
    lines = [line for line in log.read_text().splitlines() if line.startswith("launcher")]
    print(f"rejoined {took:.1f} s after the SuperLink started again: {lines[-2:]}")
    assert re.search(r"the SuperNode exited with code \d+; starting it again in 2 s", "\n".join(lines))
    assert re.match(r"launcher ready: SuperNode \d+ connected to the SuperLink at 127\.0\.0\.1:\d+ again", lines[-1])
