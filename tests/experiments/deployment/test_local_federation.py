"""A SuperLink and SuperNodes on this machine (``experiments/deployment/deploy.py``): what a LocalFederation
starts, asks and stops, and ``fedsketch deploy``'s runs on one, with real Flower processes on loopback. Where a
SuperLink would only say no, none is started: Flower's own ``flwr`` meets no SuperLink."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bridge.messages import client_metrics, payload_to_record, wire_bytes
from experiments.cli import main as fedsketch_main
from experiments.deployment import deploy
from experiments.deployment.deploy import TAG, Deployment, LocalFederation
from experiments.deployment.deploy_commands import CONNECTION, DATABASE, connection_toml
from experiments.flower import procs
from experiments.flower.app_files import STAGED
from experiments.running import stopping
from fedsketch.server import runlog
from tests.experiments.tiny import tiny
from tests.listening import ListeningWatch, off_loopback

ECHO = Path(__file__).resolve().parents[2] / "bridge" / "runtime" / "echo_app"  # a Flower app of two files
STANDIN = f"""#!/bin/sh
# a device's python that only says how it was started
printf '%s\\n' "$@" > "$0-$(basename "$FLWR_HOME").args"
printf '%s\\n' "$PATH" "$FLWR_HOME" "${TAG}" > "$0-$(basename "$FLWR_HOME").env"
echo started
echo and on stderr >&2
exit 3
"""


def _device_bin(folder: Path) -> Path:
    """A device environment's ``bin/`` whose ``python`` is a stand-in that records its arguments and exits 3."""
    folder.mkdir(parents=True)
    python = folder / "python"
    python.write_text(STANDIN, encoding="utf-8")
    python.chmod(0o755)
    return folder


def test_a_federation_knows_its_address_files_and_environment_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    fed = LocalFederation(Deployment(2), Path("fed"), device_bin=tmp_path / "bin")
    assert (fed.deployment, fed.work_dir, fed.device_bin) == (Deployment(2), Path("fed"), tmp_path / "bin")
    assert fed.address == f"127.0.0.1:{fed.port}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", fed.port))  # free
    assert fed.env["FLWR_HOME"] == str(Path("fed") / "flwr-home") and fed.env["FLWR_TELEMETRY_ENABLED"] == "0"
    assert fed.env[TAG] == str(tmp_path / "fed")  # resolved: the processes are found by it from anywhere
    assert fed.database == Path("fed") / DATABASE
    assert (fed.certs, fed.keys, fed.procs) == (None, {}, {})
    assert fed.log("supernode-1") == Path("fed") / "logs" / "supernode-1.log"
    assert not (tmp_path / "fed").exists()  # nothing started, nothing written


def test_a_supernode_starts_from_the_devices_environment_with_its_partition_and_own_home(tmp_path: Path) -> None:
    fed = LocalFederation(Deployment(2), tmp_path / "fed", device_bin=_device_bin(tmp_path / "bin"))
    fed.log("x").parent.mkdir(parents=True)
    proc = fed.start_supernode(1)
    assert proc.wait(timeout=30) == 3 and fed.procs == {"supernode-1": proc}
    home = tmp_path / "fed" / "nodes" / "node-1"
    args = (tmp_path / "bin" / "python-node-1.args").read_text().splitlines()
    assert args[:2] == ["-m", "bridge.runtime.launcher"] and args[args.index("--superlink") + 1] == fed.address
    assert "--insecure" in args and "--auth-supernode-private-key" not in args
    assert args[args.index("--port") + 1].isdigit() and args[args.index("--supernode-waits") + 1] == "backoff"
    assert args[args.index("--node-config") + 1] == "partition-id=1 num-partitions=2"
    path, flwr_home, tag = (tmp_path / "bin" / "python-node-1.env").read_text().splitlines()
    assert path == os.pathsep.join([str(tmp_path / "bin"), fed.env["PATH"]])
    assert (flwr_home, tag) == (str(home), fed.env[TAG])
    assert fed.log("supernode-1").read_text() == "started\nand on stderr\n"  # both streams, in order
    with pytest.raises(RuntimeError, match=r"^supernode-1 exited with code 3; see .*/fed/logs/supernode-1\.log$"):
        fed.wait_online(1)  # at once: an exited SuperNode is not waited for


@pytest.mark.slow  # flwr's command: about 2 s
def test_with_authentication_a_supernode_uses_a_key_given_as_it_is_else_registers_one(tmp_path: Path) -> None:
    dep = Deployment(2, tls=True, auth=True, supernode_waits="flower")
    fed = LocalFederation(dep, tmp_path / "fed", device_bin=_device_bin(tmp_path / "b"))
    fed.log("x").parent.mkdir(parents=True)
    fed.start_supernode(0, key=tmp_path / "own.pem").wait(timeout=30)
    args = (tmp_path / "b" / "python-node-0.args").read_text().splitlines()
    assert args[args.index("--auth-supernode-private-key") + 1] == str(tmp_path / "own.pem") and fed.keys == {}
    assert args[args.index("--supernode-waits") + 1] == "flower"  # the deployment's, not the default
    # No SuperLink answers here: the registration fails and says which key, and no key is kept.
    with pytest.raises(RuntimeError, match=r"^flwr supernode register .*/fed/keys/node-1\.pub failed \(1\): ") as error:
        fed.start_supernode(1)
    assert "Flower configuration not found" in str(error.value) and "Error" in str(error.value)  # its output, errors
    assert fed.keys == {} and list(fed.procs) == ["supernode-0"]
    assert (tmp_path / "fed" / "keys" / "node-1.pub").exists()


@pytest.mark.slow  # flwr's command: about 2 s
def test_a_flwr_command_that_fails_names_itself_its_code_and_what_it_said(tmp_path: Path) -> None:
    fed = LocalFederation(Deployment(1), tmp_path / "fed")
    with pytest.raises(RuntimeError, match=r"^flwr ls fedsketch-deploy failed \(1\): ") as error:
        fed.flwr("ls", CONNECTION)
    said = str(error.value)  # what it printed, then its errors
    assert said.index("Flower configuration not found") < said.index("An unexpected error occurred")


def test_a_finished_run_never_runs_again_on_a_federation(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=f"^{tmp_path}: a finished run would run again$"):
        deploy._nothing_to_run(None, tmp_path)  # type: ignore[arg-type]


@pytest.mark.slow  # flwr's command: about 2 s
def test_a_run_is_polled_every_half_second_and_once_after_and_its_flwr_run_stops_with_the_poll(
    tmp_path: Path,
) -> None:
    fed = LocalFederation(Deployment(1), tmp_path / "fed")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.toml").write_text("rounds = 1\n")
    polls: list[tuple[float, bool]] = []
    leads: set[bool] = set()  # whether flwr run leads a session of its own (Ctrl-C in the terminal is not for it)

    def poll() -> None:
        polls.append((time.monotonic(), (run_dir / STAGED).exists()))
        for pid in procs.carrying(TAG, fed.env[TAG]):
            try:
                leads.add(os.getsid(pid) == pid)
            except ProcessLookupError:
                continue

    code = fed.run(ECHO, run_dir / "run.toml", run_dir / "flower.log", poll=poll)
    said = (run_dir / "flower.log").read_text()
    assert code == 1 and said.index("Flower configuration") < said.index("An unexpected error")  # stdout, stderr
    assert leads == {True}
    staged = [exists for _, exists in polls]
    assert staged[-1] is False and all(staged[:-1])  # the last poll after the app's copy is gone
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(polls[:-1])]
    assert len(gaps) >= 2 and all(0.45 < gap < 1.2 for gap in gaps), gaps

    def stop() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        fed.run(ECHO, run_dir / "run.toml", run_dir / "flower.log", poll=stop, poll_s=30.0)
    assert procs.carrying(TAG, fed.env[TAG]) == [] and not (run_dir / STAGED).exists()


def _sleeper(ignore_term: bool) -> list[str]:
    """A process that says when it got SIGTERM, and, with ``ignore_term``, goes on."""
    handler = "lambda *_: print(time.monotonic(), flush=True)" if ignore_term else "signal.SIG_DFL"
    code = f"import signal, time; signal.signal(signal.SIGTERM, {handler}); print('ready', flush=True); time.sleep(60)"
    return ["python", "-c", code]


def _ready(log: Path) -> None:
    deadline = time.monotonic() + 30
    while "ready" not in log.read_text():
        assert time.monotonic() < deadline, log
        time.sleep(0.02)


@pytest.mark.slow
def test_closing_sigterms_all_at_once_kills_those_left_after_5_s_then_what_carries_its_tag_after_5_s_more(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    fed = LocalFederation(Deployment(1), tmp_path / "fed")
    fed.log("x").parent.mkdir(parents=True)
    ends = fed._spawn("ends", _sleeper(False), fed.env)
    stubborn = [fed._spawn(f"stubborn-{i}", _sleeper(True), fed.env) for i in range(2)]
    out = tmp_path / "detached.log"
    with open(out, "wb") as log:  # started by one of them, say: in no group of the federation's, carrying its tag
        detached = subprocess.Popen(_sleeper(True), env=fed.env, stdout=log, executable=sys.executable)
    for name in ("ends", "stubborn-0", "stubborn-1"):
        _ready(fed.log(name))
    _ready(out)
    start = time.monotonic()
    fed.close()
    took = time.monotonic() - start
    assert (ends.returncode, stubborn[0].returncode, stubborn[1].returncode, detached.wait(5)) == (-15, -9, -9, -9)
    termed = [float(fed.log(f"stubborn-{i}").read_text().split()[1]) - start for i in range(2)]
    assert max(termed) < 0.5, termed  # all at once
    detached_termed = float(out.read_text().split()[1]) - start
    assert 4.9 < detached_termed < 5.8, detached_termed  # the group's: 5 s, and none more for the second
    assert 4.9 < took - detached_termed < 5.8, (took, detached_termed)  # the tag's: 5 s more
    assert fed.procs == {}
    start = time.monotonic()
    fed.close()  # twice: nothing left to stop
    assert time.monotonic() - start < 1.0


@pytest.mark.slow
def test_waiting_for_supernodes_of_a_superlink_that_does_not_answer_asks_three_times_a_query_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fed = LocalFederation(Deployment(1), tmp_path / "fed")
    Path(fed.env["FLWR_HOME"]).mkdir(parents=True)
    (Path(fed.env["FLWR_HOME"]) / "config.toml").write_text(connection_toml(fed.address, None))
    sleeps: list[float] = []
    monkeypatch.setattr(deploy, "time", types.SimpleNamespace(sleep=sleeps.append, monotonic=time.monotonic))
    start = time.monotonic()
    with pytest.raises(RuntimeError) as error:
        fed.wait_online(1, timeout=0.5)
    logs = tmp_path / "fed" / "logs"
    said = re.fullmatch(
        rf"0 of 1 SuperNodes online after 0 s \(last query: flwr supernode list failed: (.*)\); logs in {logs}",
        str(error.value),
        re.DOTALL,
    )
    assert said and "'success': False" in said[1] and "Connection to the SuperLink is unavailable" in said[1]
    assert sleeps == [1.0, 2.0, 1.0]  # three queries 1 s and 2 s apart, then the wait's own second
    assert time.monotonic() - start > 0.5


@pytest.mark.slow
def test_a_superlink_that_exits_at_once_is_said_with_its_log_and_nothing_is_left(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    fed = LocalFederation(Deployment(1), tmp_path / "fed")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", fed.port))
        taken.listen()
        with pytest.raises(RuntimeError) as said, fed:
            pass
    log = fed.log("superlink")
    assert re.fullmatch(rf"flower-superlink exited with code \d+; see {re.escape(str(log))}", str(said.value))
    assert "address already in use" in log.read_text()
    assert procs.carrying(TAG, str(fed.work_dir.resolve())) == []


@pytest.mark.slow
def test_restarting_after_a_supernode_lost_power_waits_until_the_superlink_has_dropped_it(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    """A SuperNode gone without its goodbye stays online on the SuperLink until its heartbeat lapses (up to
    2 x 30 s): the restart waits for that, so the next run samples no node that will never answer; the next
    run goes to its end on the new node, and its exit code is ``flwr run``'s, 0. A wait for more nodes than there
    are, every query answered, says how many are online and nothing of a failed query."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.toml").write_text("rounds = 1\n")
    with LocalFederation(Deployment(1), tmp_path / "fed") as fed:
        (old,) = fed.online_nodes()
        node = fed.procs["supernode-0"]
        os.killpg(node.pid, signal.SIGKILL)  # its launcher, SuperNode and tasks at once: no goodbye
        node.wait()
        assert fed.online_nodes() == [old]
        start = time.monotonic()
        fed.restart_supernodes()
        waited = time.monotonic() - start
        (new,) = fed.online_nodes()
        code = fed.run(ECHO, run_dir / "run.toml", run_dir / "flower.log")
        with pytest.raises(RuntimeError) as short:
            fed.wait_online(2, timeout=1.0)
    print(f"restart after a SuperNode lost power: {waited:.1f} s (node {old} dropped, node {new} online)")
    assert new != old and waited > 1.0, (old, new, waited)
    answers = re.findall(r"answers (\[.*\])", (run_dir / "flower.log").read_text())
    assert code == 0 and len(answers) == 1 and len(json.loads(answers[0])) == 1, answers
    assert str(short.value) == f"1 of 2 SuperNodes online after 1 s; logs in {tmp_path / 'fed' / 'logs'}"


def _commands(federation: Path) -> list[str]:
    """The command lines of the federation's processes."""
    found = []
    for pid in procs.carrying(TAG, str(federation.resolve())):
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue
    return found


def _wait_started(log: Path) -> float:
    """Wait (up to 300 s) until ``log``, a run's ``flower.log``, says the SuperLink has the run; returns the
    deadline."""
    deadline = time.monotonic() + 300
    while not (log.exists() and "Successfully started run" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return deadline


def _skip_once_started(run: Path, federation: Path, supernodes: int) -> dict[str, Any]:
    """SIGUSR1 to this process once the SuperLink has ``run`` (seconds before its rounds end: a run that ended is
    not stopped), with the SuperLink's command line then and a stray process of node 0 started; once every
    SuperNode is ready again, how many ServerApps run on the federation and the stray's exit code."""
    seen: dict[str, Any] = {}

    def restarted() -> bool:
        logs = [federation / "logs" / f"supernode-{i}.log" for i in range(supernodes)]
        return all(log.read_text().count("launcher ready") == 2 for log in logs)

    def watch() -> None:
        deadline = _wait_started(run / "flower.log")
        seen["superlink"] = [cmd for cmd in _commands(federation) if "flower-superlink" in cmd]
        # what node 0 started and lost track of: in a session of its own, with only the node's home in common
        env = {k: v for k, v in os.environ.items() if k != TAG} | {"FLWR_HOME": str(federation / "nodes" / "node-0")}
        stray = subprocess.Popen(["sleep", "120"], env=env, start_new_session=True)
        os.kill(os.getpid(), signal.SIGUSR1)
        while not restarted() and time.monotonic() < deadline:
            time.sleep(0.1)
        seen["serverapps"] = sum("flwr-serverapp" in cmd for cmd in _commands(federation))
        seen["stray_code"] = stray.poll()
        stray.kill()  # left by a restart that missed it: not left after the test either
        stray.wait()

    threading.Thread(target=watch, daemon=True).start()
    return seen


def _assert_sketch_uploads(cum_upload_bytes: int, replies: int, shape: tuple[int, int]) -> None:
    """Each FetchSGD reply is its sketch's table plus a metrics record of a few dozen bytes whose exact size
    depends on its values (protobuf varints)."""
    table = wire_bytes(payload_to_record({"table": np.zeros(shape, np.float32)}))
    metrics = wire_bytes(client_metrics(64, 0.5, 0.1))
    assert table >= 128 + 4 * shape[0] * shape[1]  # at least the .npy bytes of the table
    assert replies * table < cum_upload_bytes <= replies * (table + 2 * metrics)


@pytest.mark.slow
def test_deploying_two_runs_with_tls_and_auth_the_second_skipped_on_sigusr1_stops_it_alone_and_restarts_the_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_leftover_processes: None
) -> None:
    """``fedsketch deploy`` as a user runs it: one client per SuperNode, every port on loopback; the second run,
    skipped, is stopped on the SuperLink (the finished first is not asked to stop) and the SuperNodes start again
    (none keeps a message of the skipped run)."""
    args = ["deploy", str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), "--supernodes", "2", "--tls", "--auth"]
    args += ["--strategies", "fetchsgd,fedavg", "--set", "num-rounds=3", "--set", "lr=0.2"]
    exp = tmp_path / "runs" / "tiny"
    fed = exp / "deployment"
    (fed / "logs").mkdir(parents=True)
    for stale in (DATABASE, f"{DATABASE}-wal", f"{DATABASE}-shm"):  # a former federation's: its nodes are not these
        (fed / stale).write_bytes(b"not a database")
    (fed / "flwr-home").mkdir()
    (fed / "flwr-home" / "config.toml").write_text("# a former federation's connection")
    seen = _skip_once_started(exp / "fedavg", fed, supernodes=2)
    with ListeningWatch((TAG, str(fed))) as ports:
        assert fedsketch_main(args) == 0
    said = capsys.readouterr().out
    assert len(ports.sockets) >= 3 and not off_loopback(ports.sockets), ports.sockets  # SuperLink, Runtime APIs
    assert f"starting a SuperLink and 2 SuperNodes; logs in {fed / 'logs'}\n" in said
    restart = re.search(r"^fedsketch: restarted the 2 SuperNodes for the next run \((\d+\.\d) s\)$", said, re.MULTILINE)
    assert restart and float(restart[1]) < 60, said
    assert re.search(r"fedavg seed 0: skipped \(SIGUSR1\) ", said) and "may still hold" not in said, said
    assert (runlog.read_status(exp / "fedavg") or {}).get("state") == "skipped"
    assert f"fetchsgd seed 0: finished  ({exp / 'fetchsgd'})" in said and "fetchsgd seed 0: round 3/3" in said
    assert f"report: {exp / 'report.md'}\n" in said and (exp / "report.md").exists()  # and the plots, of exp
    rows = runlog.read_metrics(exp / "fetchsgd")
    assert [(r["round"], r["clients"], r["failures"]) for r in rows] == [(1, 2, 0), (2, 2, 0), (3, 2, 0)]
    assert rows[-1]["test_loss"] < rows[0]["test_loss"]
    _assert_sketch_uploads(rows[-1]["cum_upload_bytes"], replies=6, shape=(1, 50))
    assert rows[-1]["cum_dense_upload_bytes"] > max(6 * 4 * 1418, 5 * rows[-1]["cum_upload_bytes"])  # d = 1,418
    assert seen["serverapps"] == 0  # the skipped run's ServerApp was stopped
    assert seen["stray_code"] == -signal.SIGTERM  # stopped with node 0, not left to the next run
    assert len(seen["superlink"]) == 1 and "--enable-supernode-auth" in seen["superlink"][0]
    link_log = (fed / "logs" / "superlink.log").read_text()
    assert "Uvicorn running on https://127.0.0.1" in link_log
    for i in range(2):  # each SuperNode started twice, with its registered key and the federation's CA
        log = (fed / "logs" / f"supernode-{i}.log").read_text()
        assert log.count("launcher ready") == 2, log
        assert (fed / "keys" / f"node-{i}.pub").exists()
    certs = fed / "certs"
    home = fed / "flwr-home" / "config.toml"
    assert home.read_text() == connection_toml(re.search(r"127\.0\.0\.1:\d+", home.read_text())[0], certs / "ca.crt")
    assert (fed / DATABASE).read_bytes()[:15] == b"SQLite format 3"
    assert procs.carrying(TAG, str(fed.resolve())) == []


@pytest.mark.slow
def test_a_run_skipped_after_its_superlink_died_says_the_federation_may_still_hold_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_leftover_processes: None
) -> None:
    args = ["deploy", str(tiny(tmp_path)), "--out", str(tmp_path / "runs"), "--supernodes", "1", "--no-plot"]
    fed = tmp_path / "runs" / "tiny" / "deployment"
    log = tmp_path / "runs" / "tiny" / "fedavg" / "flower.log"

    commands: list[str] = []

    def kill_the_superlink_then_skip() -> None:
        _wait_started(log)
        records = stopping.state_dir().glob("invocations/*.json")  # this worker's commands
        commands.extend(json.loads(path.read_text())["command"] for path in records)
        for pid in procs.carrying(TAG, str(fed.resolve())):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "flower-superlin":  # the kernel keeps 15 characters
                os.kill(pid, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGUSR1)

    threading.Thread(target=kill_the_superlink_then_skip, daemon=True).start()
    assert fedsketch_main([*args, "--set", "num-rounds=50"]) == 0
    said = capsys.readouterr().out
    assert "fedsketch: the skipped run may still hold the SuperLink or a SuperNode: flwr ls failed: {" in said, said
    assert "restarted the" not in said and re.search(r"fedavg seed 0: skipped \(SIGUSR1\) ", said), said
    assert commands == ["deploy"]  # named so to whoever stops what it left after a SIGKILL (stopping.reap)
    assert procs.carrying(TAG, str(fed.resolve())) == []
