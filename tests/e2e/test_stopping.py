"""Signals to a real `fedsketch run` / `deploy`: every Flower and Ray process it started stops with it.

Each command runs as its own process, started the way a user's shell or a
scheduler would, with its output to a file (so its progress comes as plain
lines). Every process it starts inherits a marker of this test's own, which the
code under test knows nothing of: "nothing left" is checked against it. The
signal goes in while round 2 trains (after the line for round 1), and the time
from the signal to the command's exit is bounded by ``EXIT_WITHIN_S``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from experiments.cli import main as fedsketch_main
from experiments.flower.procs import processes_with_env
from experiments.running.stopping import GRACE_S, TOKEN_VAR
from fedsketch.server import runlog

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
MARK = "FEDSKETCH_STOP_TEST_MARK"
EXIT_WITHIN_S = 20.0  # measured 3.3-3.6 s on a busy 2-core machine: stopping waits GRACE_S = 3 s for SIGTERM
RAY = ["gcs_server", "raylet", "ray::ClientAppActor"]
SUPERLINK = ["flower-superlink", "flower-superexec", "flwr run", "flwr-simulation"]
SIMULATION = ["[fedsketch-sim]", *RAY]
"""A first run's processes with ``--backend ray`` and the default runtime: its simulation process is the one the
command forked before its checks (experiments/flower/spare.py, named in ``/proc/PID/comm``), then Ray's."""
PROCESSES = {
    ("ray", "process"): SIMULATION,
    ("inprocess", "process"): SIMULATION[:1],
    ("inprocess", "superlink"): SUPERLINK,
}
"""What each backend and runtime starts."""
DEPLOYMENT = ["flower-superlink", "flower-supernode", "flower-superexec", "flwr run", "flwr-serverapp"]
ROUNDS = 300  # about 0.3 s a round here once started: still training when the signal comes
TINY = [
    "num-clients=20",
    "clients-per-round=10",
    f"num-rounds={ROUNDS}",
    "eval-every=1",
    "sketch-rows=3",
    "sketch-cols=5000",
    "k=2000",
    "lr=0.5",
    'lr-schedule="constant"',
]
TINY_DEPLOY = ["num-rounds=20", "eval-every=1", "local-batch-size=64", "sketch-rows=5", "sketch-cols=2000", "k=500"]


class Command:
    """One ``python -m experiments.cli ...`` process and everything it starts (found by the test's marker)."""

    def __init__(self, tmp: Path, name: str, args: list[str], ignore_sigint: bool = False) -> None:
        self.tmp, self.mark, self.log = tmp, f"{name}-{uuid.uuid4().hex}", tmp / f"{name}.log"
        env = dict(os.environ, PYTHONPATH=str(ROOT), FEDSKETCH_STATE_DIR=str(tmp / "state"), **{MARK: self.mark})
        # A script's ``cmd &`` starts a command with SIGINT ignored: that is how the Ctrl-C went unheard.
        ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if ignore_sigint else None
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "experiments.cli", *args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=ignore,  # noqa: PLW1509
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def processes(self) -> list[int]:
        """Live processes this command started (not the command itself)."""
        return [pid for pid in processes_with_env(MARK, self.mark) if pid != self.proc.pid]

    def wait_for(self, what: str, ready: Callable[[], bool], timeout: float = 480.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            ended = self.proc.poll()
            if ended is not None or time.monotonic() > deadline:
                why = f"exit code {ended}" if ended is not None else f"still running after {timeout:.0f} s"
                running, logs = names(self.processes()), self.logs()
                self.kill()
                pytest.fail(f"waiting for {what}: {why}\n{self.output()[-3000:]}\nits processes:\n{running}\n{logs}")
            time.sleep(0.2)

    def logs(self) -> str:
        """The end of every other log under the test's folder (Flower's, the SuperLink's, each SuperNode's)."""
        tails = []
        for path in sorted(self.tmp.rglob("*.log")):
            if path != self.log:
                tails.append(f"--- {path.relative_to(self.tmp)}\n{path.read_text(errors='replace')[-1500:]}")
        return "\n".join(tails)

    def wait_for_line(self, text: str) -> None:
        self.wait_for(repr(text), lambda: text in self.output())

    def wait_for_training(self, strategy: str) -> None:
        """Until the progress line of a round of ``strategy``: the next round is training."""
        pattern = re.compile(rf"^{strategy} seed 0: round \d+/\d+  (at round \d+: )?acc ", re.MULTILINE)
        self.wait_for(f"{strategy} training", lambda: pattern.search(self.output()) is not None)

    def signal(self, sig: int) -> tuple[int, float]:
        """Send ``sig``; the exit code and the seconds until the command exited."""
        start = time.monotonic()
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=120)
        finally:
            self.kill()
        return code, time.monotonic() - start

    def start_hung_process(self) -> subprocess.Popen[bytes]:
        """A process that carries the command's token (from its record) and ignores SIGTERM, as a hung worker would."""
        records = list((self.tmp / "state" / "invocations").glob(f"{self.proc.pid}-*.json"))
        assert len(records) == 1, records
        token = json.loads(records[0].read_text())["token"]
        env = dict(os.environ, **{MARK: self.mark, TOKEN_VAR: token})
        code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"
        hung = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE)
        assert hung.stdout is not None and hung.stdout.readline() == b"ready\n"
        return hung

    def kill(self) -> None:
        """Whatever is left (only when a test fails)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.processes():
            os.kill(pid, signal.SIGKILL)


def names(pids: list[int]) -> str:
    """Each process's name in brackets, then its command line."""
    found = []
    for pid in pids:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        found.append(f"[{name}] {cmd}")
    return "\n".join(found)


def run_args(
    out: Path, experiment: str, strategies: str, command: str = "run", backend: str = "ray", runtime: str = "process"
) -> list[str]:
    """Ray by default: its renamed processes are the hardest to stop."""
    args = [command, "--out", str(out), "--strategies", strategies, "--no-plot"]
    if command == "deploy":
        args += ["--supernodes", "2"]
    else:
        args += ["--backend", backend, "--runtime", runtime]
    for pair in [*(TINY if command == "run" else TINY_DEPLOY), f"experiment={experiment}"]:
        args += ["--set", pair]
    return args


def stopped(path: Path) -> tuple[str, str, list[int]]:
    """The run's status (state, cause) and the rounds its metrics hold."""
    status = runlog.read_status(path) or {"state": None, "cause": None, "round": None}
    rounds = [row["round"] for row in runlog.read_metrics(path)]
    assert status["round"] == rounds[-1], (status, rounds)
    return status["state"], status["cause"], rounds


def report(capsys: pytest.CaptureFixture[str], exp_dir: Path) -> str:
    capsys.readouterr()
    assert fedsketch_main(["report", str(exp_dir)]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(("backend", "runtime"), list(PROCESSES))
def test_ctrl_c_stops_the_run_every_process_and_every_later_run(
    tmp_path: Path, no_leftover_processes: None, capsys: pytest.CaptureFixture[str], backend: str, runtime: str
) -> None:
    args = run_args(tmp_path / "runs", "stop", "fetchsgd,fedavg", backend=backend, runtime=runtime)
    cmd = Command(tmp_path, "sigint", args, ignore_sigint=True)
    cmd.wait_for_training("fetchsgd")
    running = names(cmd.processes())
    assert all(name in running for name in PROCESSES[backend, runtime]), running
    code, seconds = cmd.signal(signal.SIGINT)
    with capsys.disabled():
        print(f"\nSIGINT to fedsketch run ({backend}, {runtime}): exit code {code} after {seconds:.2f} s")
    assert (code, cmd.processes()) == (130, []), cmd.output()[-3000:]
    assert seconds < EXIT_WITHIN_S
    state, cause, rounds = stopped(tmp_path / "runs" / "stop" / "fetchsgd")
    assert (state, cause) == ("interrupted", "SIGINT")
    assert rounds == list(range(1, len(rounds) + 1)) and rounds[-1] < ROUNDS
    assert not (tmp_path / "runs" / "stop" / "fedavg").exists()
    out = cmd.output()
    assert f"fetchsgd seed 0: interrupted (SIGINT) after round {rounds[-1]} of {ROUNDS}" in out
    assert "fedavg seed 0: not started" in out
    note = f"seed 0 interrupted (SIGINT) after round {rounds[-1]} of {ROUNDS}"
    assert note in report(capsys, tmp_path / "runs" / "stop")
    assert not list((tmp_path / "state" / "invocations").glob("*"))


def test_after_a_sigkill_the_next_run_stops_the_leftovers_and_itself_stops_on_sigterm(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    killed = Command(tmp_path, "killed", run_args(tmp_path / "runs", "killed", "fetchsgd"))
    killed.wait_for_training("fetchsgd")
    killed.proc.kill()
    killed.proc.wait()
    time.sleep(1.0)
    left = killed.processes()
    assert all(name in names(left) for name in SIMULATION), names(left)  # the issue: all of it goes on

    after = Command(tmp_path, "after", run_args(tmp_path / "runs", "after", "fedavg"))
    after.wait_for_line(f"left by `fedsketch run` (pid {killed.proc.pid}), which ended without stopping them")
    assert killed.processes() == []
    line = next(line for line in after.output().splitlines() if "left by" in line)
    assert int(line.split()[2]) >= len(SIMULATION), line  # "fedsketch: stopped N processes left by ..."
    state, cause, rounds = stopped(tmp_path / "runs" / "killed" / "fetchsgd")
    assert (state, cause) == ("interrupted", "killed") and rounds[-1] >= 1

    after.wait_for_training("fedavg")
    code, seconds = after.signal(signal.SIGTERM)
    print(f"\nSIGTERM to fedsketch run: exit code {code} after {seconds:.2f} s; leftovers: {line}")
    assert (code, after.processes()) == (143, []), after.output()[-3000:]
    assert seconds < EXIT_WITHIN_S
    assert stopped(tmp_path / "runs" / "after" / "fedavg")[:2] == ("interrupted", "SIGTERM")


def test_sigusr1_skips_one_strategy_and_a_second_ctrl_c_forces_the_stop(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    cmd = Command(tmp_path, "skip", run_args(tmp_path / "runs", "skip", "fetchsgd,fedavg"))
    cmd.wait_for_training("fetchsgd")
    cmd.proc.send_signal(signal.SIGUSR1)
    cmd.wait_for_training("fedavg")
    fetch = tmp_path / "runs" / "skip" / "fetchsgd"
    assert stopped(fetch)[:2] == ("skipped", "SIGUSR1")
    assert processes_with_env("FLWR_HOME", str(fetch / "flwr-home")) == []  # the skipped run's Flower and Ray
    hung = cmd.start_hung_process()  # so the first Ctrl-C must wait out the grace period
    cmd.proc.send_signal(signal.SIGINT)
    cmd.wait_for_line("SIGINT: stopping every process this command started (again to force)")
    code, seconds = cmd.signal(signal.SIGINT)
    print(f"\nSIGINT twice to fedsketch run: exit code {code} after {seconds:.2f} s")
    assert hung.wait(timeout=10) == -signal.SIGKILL
    assert hung.stdout is not None
    hung.stdout.close()
    assert (code, cmd.processes()) == (130, []), cmd.output()[-3000:]
    assert seconds < GRACE_S  # forced: it did not wait for the hung process
    assert "forced: every process it started was killed" in cmd.output()
    assert stopped(tmp_path / "runs" / "skip" / "fedavg")[:2] == ("interrupted", "SIGINT")


def test_deploy_skips_a_strategy_on_sigusr1_and_stops_every_supernode_on_ctrl_c(
    tmp_path: Path, no_leftover_processes: None, capsys: pytest.CaptureFixture[str]
) -> None:
    cmd = Command(tmp_path, "deploy", run_args(tmp_path / "runs", "dstop", "fetchsgd,fedavg", "deploy"))
    cmd.wait_for_training("fetchsgd")
    running = names(cmd.processes())
    assert all(name in running for name in DEPLOYMENT), running
    cmd.proc.send_signal(signal.SIGUSR1)
    cmd.wait_for_training("fedavg")  # the skipped run's ServerApp no longer holds the nodes
    assert stopped(tmp_path / "runs" / "dstop" / "fetchsgd")[:2] == ("skipped", "SIGUSR1")
    assert "restarted the 2 SuperNodes for the next run" in cmd.output()  # none holds a message of fetchsgd's
    assert sum("flwr-serverapp" in line for line in names(cmd.processes()).splitlines()) == 1
    code, seconds = cmd.signal(signal.SIGINT)
    with capsys.disabled():
        print(f"\nSIGINT to fedsketch deploy: exit code {code} after {seconds:.2f} s")
    assert (code, cmd.processes()) == (130, []), cmd.output()[-3000:]
    assert seconds < EXIT_WITHIN_S
    assert stopped(tmp_path / "runs" / "dstop" / "fedavg")[:2] == ("interrupted", "SIGINT")
    assert "interrupted (SIGINT)" in report(capsys, tmp_path / "runs" / "dstop")


def test_after_a_sigkill_of_deploy_the_next_deploy_stops_the_supernodes_and_itself_stops_on_sigterm(
    tmp_path: Path, no_leftover_processes: None
) -> None:
    killed = Command(tmp_path, "killed", run_args(tmp_path / "runs", "dkilled", "fetchsgd", "deploy"))
    killed.wait_for_training("fetchsgd")
    killed.proc.kill()
    killed.proc.wait()
    time.sleep(1.0)
    assert all(name in names(killed.processes()) for name in ["flower-superlink", "flower-supernode"])

    after = Command(tmp_path, "after", run_args(tmp_path / "runs", "dafter", "fedavg", "deploy"))
    after.wait_for_line(f"left by `fedsketch deploy` (pid {killed.proc.pid}), which ended without stopping them")
    assert killed.processes() == []
    assert stopped(tmp_path / "runs" / "dkilled" / "fetchsgd")[:2] == ("interrupted", "killed")
    after.wait_for_training("fedavg")
    code, seconds = after.signal(signal.SIGTERM)
    print(f"\nSIGTERM to fedsketch deploy: exit code {code} after {seconds:.2f} s")
    assert (code, after.processes()) == (143, []), after.output()[-3000:]
    assert seconds < EXIT_WITHIN_S
    assert json.loads((tmp_path / "runs" / "dafter" / "fedavg" / runlog.STATUS).read_text())["cause"] == "SIGTERM"
