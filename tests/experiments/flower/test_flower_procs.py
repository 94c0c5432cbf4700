"""Starting, watching and stopping processes (experiments/flower/flower_procs.py).

Real processes (Python children in sessions of their own) and real HTTP(S) servers on loopback stand in for
a SuperLink and its health endpoint.
"""

from __future__ import annotations

import http.server
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from experiments.deployment.pki import make_certificates
from experiments.flower import flower_procs, procs
from fedsketch.server import runlog

SLEEP = "import time; time.sleep(10)"
TERM_IGNORED = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(10)"
)


def _start(code: str, children: list[subprocess.Popen[bytes]], session: bool = True) -> subprocess.Popen[bytes]:
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=session, stdout=subprocess.PIPE)
    children.append(child)
    return child


def _ready(child: subprocess.Popen[bytes]) -> None:
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"


def test_a_free_port_is_on_loopback_and_can_be_bound_at_once() -> None:
    port = flower_procs.free_port()
    assert 1024 <= port < 65536
    with socket.create_server(("127.0.0.1", port)) as s:
        assert s.getsockname() == ("127.0.0.1", port)


def test_flowers_environment_is_private_quiet_and_keeps_ray_on_loopback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(flower_procs.LOOPBACK_RAY[0], raising=False)
    monkeypatch.setenv("FEDSKETCH_TEST_KEPT", "1")
    monkeypatch.setenv("PATH", "/usr/bin")
    for name in FLOWER:  # each one set by the function, not inherited
        monkeypatch.delenv(name, raising=False)
    before = dict(os.environ)
    env = flower_procs.flower_env(tmp_path / "home")
    assert dict(os.environ) == before  # a copy: this process's environment is left alone
    assert env["FEDSKETCH_TEST_KEPT"] == "1" and env[flower_procs.LOOPBACK_RAY[0]] == "0"
    assert env["PATH"] == f"{Path(sys.executable).parent}{os.pathsep}/usr/bin"
    assert {k: env[k] for k in FLOWER} == {**FLOWER, "FLWR_HOME": str(tmp_path / "home")}
    monkeypatch.delenv("PATH")
    assert flower_procs.flower_env(tmp_path)["PATH"] == f"{Path(sys.executable).parent}{os.pathsep}"


FLOWER = {
    "FLWR_HOME": "",
    "FLWR_TELEMETRY_ENABLED": "0",
    "FLWR_DISABLE_UPDATE_CHECK": "1",
    "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    "RAY_DEDUP_LOGS": "0",
    "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1",
    "PYTHONUNBUFFERED": "1",
}


def test_ray_is_left_as_the_user_set_it_or_to_the_cluster_it_joins(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    name = flower_procs.LOOPBACK_RAY[0]
    monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert name not in flower_procs.flower_env(tmp_path)
    monkeypatch.setenv("RAY_ADDRESS", "")  # set but empty: no cluster
    assert flower_procs.flower_env(tmp_path)[name] == "0"
    monkeypatch.setenv(name, "1")
    assert flower_procs.flower_env(tmp_path)[name] == "1"


def test_a_script_beside_the_interpreter_is_found_there_and_python_is_this_interpreter() -> None:
    here = Path(sys.executable).parent
    script = next(p.name for p in sorted(here.iterdir()) if p.name not in ("python", "python3") and p.is_file())
    assert flower_procs.bin_path(script) == str(here / script)
    assert flower_procs.bin_path("no-such-script-anywhere") == "no-such-script-anywhere"
    assert flower_procs.program("python") == sys.executable
    assert flower_procs.program(script) == str(here / script)
    assert flower_procs.program("no-such-script-anywhere") == "no-such-script-anywhere"


def test_python_is_this_interpreter_whatever_its_name(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    interpreter = tmp_path / "bin" / "python3.11"  # no ``python`` beside it
    interpreter.parent.mkdir()
    interpreter.touch()
    monkeypatch.setattr(sys, "executable", str(interpreter))
    assert flower_procs.program("python") == str(interpreter) and flower_procs.bin_path("python") == "python"


def test_stopping_a_group_terms_it_and_kills_what_stays_after_the_grace(started) -> None:
    leader = _start(
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"member = subprocess.Popen([sys.executable, '-c', {SLEEP!r}])\n"
        "print(member.pid, flush=True)\n"
        "time.sleep(10)",
        started,
    )
    assert leader.stdout is not None
    member = int(leader.stdout.readline())
    began = time.monotonic()
    flower_procs.stop_group(leader, grace_s=1.0)
    took = time.monotonic() - began
    assert leader.returncode == -signal.SIGKILL and 0.9 <= took < 4.0
    _gone(member)  # the whole group, not the leader alone


def _gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while procs.start_time(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert procs.start_time(pid) is None


def test_a_group_that_ends_on_sigterm_is_not_waited_for_nor_killed(started) -> None:
    leader = _start("import time; print('ready', flush=True); time.sleep(10)", started)
    _ready(leader)
    began = time.monotonic()
    flower_procs.stop_group(leader, grace_s=20.0)
    assert leader.returncode == -signal.SIGTERM and time.monotonic() - began < 5.0


def test_a_child_not_yet_leading_its_group_is_stopped_itself_and_an_ended_one_is_left(started) -> None:
    child = _start(TERM_IGNORED, started, session=False)
    _ready(child)
    flower_procs.stop_group(child, grace_s=0.3)
    assert child.returncode == -signal.SIGKILL
    flower_procs.stop_group(child, grace_s=30.0)  # gone and reaped: nothing to do, no error
    flower_procs.signal_group(child, signal.SIGTERM)


class Reaped:
    """An ended and reaped child whose pid the system has given to another process (``pid``)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, 0

    def poll(self) -> int:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0


def test_a_reaped_child_is_not_signalled_by_a_pid_that_is_another_process_now(started) -> None:
    for session in (False, True):  # the pid taken by a process, or by a process that leads its own group
        bystander = _start("import time; print('ready', flush=True); time.sleep(10)", started, session=session)
        _ready(bystander)
        flower_procs.stop_group(Reaped(bystander.pid), grace_s=0.1)
        time.sleep(0.2)
        assert bystander.poll() is None


def test_a_signal_reaches_the_group_of_a_process_started_in_its_own_session(started) -> None:
    leader = _start("import time; print('ready', flush=True); time.sleep(10)", started)
    _ready(leader)
    flower_procs.signal_group(leader, signal.SIGUSR1)
    assert leader.wait(timeout=10) == -signal.SIGUSR1  # the signal sent, not another


@contextmanager
def _health(status: dict[str, int], tls: ssl.SSLContext | None = None) -> Iterator[int]:
    """An HTTP(S) server on loopback answering ``/health`` with ``status["code"]`` (404 elsewhere); its port."""

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status["code"] if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _later(seconds: float, action: object) -> threading.Timer:
    timer = threading.Timer(seconds, action)  # type: ignore[arg-type]
    timer.start()
    return timer


def test_a_superlink_is_healthy_once_its_endpoint_answers_2xx(started, tmp_path: Path) -> None:
    alive = _start(SLEEP, started)
    status = {"code": 503}
    with _health(status) as port:
        _later(0.2, lambda: status.update(code=200))
        began = time.monotonic()
        flower_procs.wait_healthy(port, alive, timeout=20.0, log_file=tmp_path / "log")
        assert 0.15 <= time.monotonic() - began < 1.0  # looked again every few hundredths of a second


def test_a_superlink_that_never_answers_2xx_is_reported_with_its_log(started, tmp_path: Path) -> None:
    alive = _start(SLEEP, started)
    with _health({"code": 503}) as port:
        began = time.monotonic()
        with pytest.raises(RuntimeError) as failed:
            flower_procs.wait_healthy(port, alive, timeout=0.6, log_file=tmp_path / "log")
        assert 0.6 <= time.monotonic() - began < 3.0
    assert str(failed.value) == f"flower-superlink did not start within 1 s; see {tmp_path / 'log'}"
    with _health({"code": 200}) as port:  # a 404 from another path is no answer either
        pass
    with pytest.raises(RuntimeError, match="did not start within 0 s"):
        flower_procs.wait_healthy(port, alive, timeout=0.3, log_file=tmp_path / "log")  # nothing listens now


def test_a_superlink_that_takes_its_requests_but_never_replies_is_given_up_on(started, tmp_path: Path) -> None:
    alive = _start(SLEEP, started)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # connections complete, nothing is read or written
        _later(3.0, silent.close)  # a look that would wait for ever is reset then
        port = silent.getsockname()[1]
        began = time.monotonic()
        with pytest.raises(RuntimeError, match="did not start"):
            flower_procs.wait_healthy(port, alive, timeout=0.3, log_file=tmp_path / "log")
        assert time.monotonic() - began < 1.3  # each look waits half a second at most
    with socket.create_server(("127.0.0.1", 0)) as silent:
        _later(3.0, silent.close)
        began = time.monotonic()
        with pytest.raises(RuntimeError, match="did not answer"):
            flower_procs.wait_healthy_tls(f"127.0.0.1:{silent.getsockname()[1]}", None, alive, tmp_path / "l", 0.3)
        assert time.monotonic() - began < 1.3


def test_a_superlink_that_exited_is_reported_at_once_with_its_code(tmp_path: Path) -> None:
    ended = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    ended.wait(timeout=30)
    with _health({"code": 200}) as port:
        with pytest.raises(RuntimeError) as failed:
            flower_procs.wait_healthy(port, ended, timeout=20.0, log_file=tmp_path / "log")
        assert str(failed.value) == f"flower-superlink exited with code 3; see {tmp_path / 'log'}"
        with pytest.raises(RuntimeError, match=r"^flower-superlink exited with code 3; see .*log$"):
            flower_procs.wait_healthy_tls(f"127.0.0.1:{port}", None, ended, tmp_path / "log", 20.0)


def _tls(folder: Path) -> tuple[ssl.SSLContext, Path]:
    certs = make_certificates(folder)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(certs.server_cert, certs.server_key)
    return context, certs.ca_cert


def test_a_tls_superlink_is_healthy_when_its_certificate_verifies_against_the_ca(started, tmp_path: Path) -> None:
    alive = _start(SLEEP, started)
    context, ca = _tls(tmp_path / "pki")
    _, other_ca = _tls(tmp_path / "other")
    status = {"code": 503}
    with _health(status, context) as port:
        address = f"127.0.0.1:{port}"
        _later(0.1, lambda: status.update(code=200))
        began = time.monotonic()
        flower_procs.wait_healthy_tls(address, ca, alive, tmp_path / "log", timeout=20.0)
        assert time.monotonic() - began < 1.0
        with pytest.raises(RuntimeError) as failed:  # a certificate the CA did not sign
            flower_procs.wait_healthy_tls(address, other_ca, alive, tmp_path / "log", timeout=0.5)
        assert str(failed.value) == (
            f"flower-superlink did not answer at https://{address}/health within 0 s; see {tmp_path / 'log'}"
        )
        with pytest.raises(RuntimeError, match=f"at http://{address}/health within 0 s"):  # plain text to TLS
            flower_procs.wait_healthy_tls(address, None, alive, tmp_path / "log", timeout=0.4)
    with _health({"code": 200}) as port:
        flower_procs.wait_healthy_tls(f"127.0.0.1:{port}", None, alive, tmp_path / "log", timeout=20.0)


PRINT_THEN_EXIT = "import sys; print('out', flush=True); print('err', file=sys.stderr, flush=True); sys.exit(3)"


def test_a_watched_process_that_ends_gives_its_code_and_its_output_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "flower.log"
    log.write_text("before\n")
    polls: list[float] = []
    code = flower_procs.watch(
        [sys.executable, "-c", PRINT_THEN_EXIT], dict(os.environ), log, lambda: False, lambda: polls.append(1)
    )
    assert code == 3 and log.read_text() == "before\nout\nerr\n" and len(polls) >= 2


SESSION = (
    "import os; print(os.environ['FEDSKETCH_TEST_GIVEN'], os.getsid(0) == os.getpid(), flush=True); "
    "print(os.environ['FEDSKETCH_SERVER_DONE'], flush=True); import time; time.sleep(10)"
)


def test_a_watched_process_gets_the_environment_given_and_a_session_of_its_own(tmp_path: Path) -> None:
    log = tmp_path / "flower.log"
    env = {**os.environ, "FEDSKETCH_TEST_GIVEN": "given", "FEDSKETCH_SERVER_DONE": runlog.SERVER_DONE_LOG}
    began = time.monotonic()
    assert flower_procs.watch([sys.executable, "-c", SESSION], env, log, lambda: "given" in log.read_text(), None) == 0
    assert log.read_text() == f"given True\n{runlog.SERVER_DONE_LOG}\n" and time.monotonic() - began < 5.0


def test_a_watched_run_marked_done_returns_0_once_its_last_line_is_in_and_stops_the_process(
    started, tmp_path: Path
) -> None:
    log = tmp_path / "flower.log"
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import time; time.sleep(0.4); print({runlog.SERVER_DONE_LOG!r}, flush=True); time.sleep(10)",
        ],
        stdout=log.open("ab"),
        start_new_session=True,
    )
    started.append(leader)
    marked = threading.Event()
    _later(0.2, marked.set)
    finished, polls = [], []

    def done() -> bool:
        finished.append(1)
        return marked.is_set()

    began = time.monotonic()
    assert flower_procs.follow(leader, log, done, lambda: polls.append(1)) == 0
    took = time.monotonic() - began
    assert leader.returncode == -signal.SIGTERM and runlog.SERVER_DONE_LOG in log.read_text()
    assert 0.35 <= took < 1.0  # waited for the line (0.4 s), looking often, not for the grace (3 s)
    assert len(polls) == (len(finished) + 4) // 5 + 1  # every fifth look, and once more at the end


def test_a_run_marked_done_whose_last_line_never_comes_is_stopped_after_the_grace(
    started, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(flower_procs, "LOGS_GRACE_S", 0.8)
    log = tmp_path / "flower.log"
    log.write_text("")
    leader = _start(SLEEP, started)
    began = time.monotonic()
    assert flower_procs.follow(leader, log, lambda: True, None) == 0
    assert 0.8 <= time.monotonic() - began < 2.5 and leader.returncode == -signal.SIGTERM


def test_a_run_marked_done_whose_process_ends_is_not_waited_for(started, tmp_path: Path) -> None:
    log = tmp_path / "flower.log"
    log.write_text("")
    leader = _start("import time; time.sleep(0.3)", started)
    began = time.monotonic()
    assert flower_procs.follow(leader, log, lambda: True, None) == 0
    assert time.monotonic() - began < 1.5 and leader.returncode == 0


def test_a_run_that_ends_by_itself_gives_its_code_and_is_polled_once_more(started, tmp_path: Path) -> None:
    log = tmp_path / "flower.log"
    log.write_text("")
    leader = _start("import time; time.sleep(0.3)", started)
    polls: list[int] = []
    assert flower_procs.follow(leader, log, lambda: False, lambda: polls.append(1)) == 0 and leader.returncode == 0
    assert len(polls) >= 2


def test_progress_is_polled_at_every_fifth_look_and_at_the_end(started, tmp_path: Path) -> None:
    log = tmp_path / "flower.log"
    log.write_text(runlog.SERVER_DONE_LOG + "\n")
    leader = _start(SLEEP, started)
    looks, polls = [], []

    def done() -> bool:
        looks.append(1)
        return len(looks) == 6

    assert flower_procs.follow(leader, log, done, lambda: polls.append(len(looks))) == 0
    assert polls == [0, 5, 6]  # before looks 1 and 6, and once the run is done


def test_a_watched_process_is_looked_at_ten_times_a_second(started, tmp_path: Path) -> None:
    log = tmp_path / "flower.log"
    log.write_text(runlog.SERVER_DONE_LOG + "\n")
    leader = _start(SLEEP, started)
    marked = threading.Event()
    _later(0.2, marked.set)
    began = time.monotonic()
    assert flower_procs.follow(leader, log, marked.is_set, None) == 0
    assert time.monotonic() - began < 0.9
