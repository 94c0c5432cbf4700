"""bridge/runtime/forked.py: what runs in the launcher's forks, run in forks of this process.

The SuperNode's signals: a fork sets the SuperNode's signal handlers as ``run_supernode`` does, then as
Flower's ``start_client_internal`` does, and signals itself. The entry points: a real SuperNode and a real
ClientApp task in a fork, before any SuperLink or SuperNode answers them (slow: each takes seconds). What a
fork ran is credited to its test when mutmut records it (``tests/forked_credit.py``).
"""

from __future__ import annotations

import ctypes
import importlib
import json
import logging
import os
import select
import shutil
import signal
import socket
import sys
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from flwr.supercore.exit import register_signal_handlers
from flwr.supercore.telemetry import EventType

from bridge.runtime import forked, supernode_waits
from experiments.flower.flower_procs import free_port
from tests.forked_credit import Credit


def _in_a_fork(body: Callable[[int], None]) -> tuple[bytes, int]:
    """What ``body(fd)`` wrote to ``fd`` in a fork, and the fork's exit code (its SystemExit's, 0 if none)."""
    read, write = os.pipe()
    credit = Credit()
    pid = os.fork()
    if pid == 0:  # pragma: no cover -- the fork
        os.close(read)
        os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
        code: object = 0
        try:
            body(write)
        except SystemExit as exc:
            code = exc.code
        except BaseException:  # noqa: BLE001
            code = 99
        credit.send()
        os._exit(code if isinstance(code, int) else 98)
    credit.receive()
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read, "rb") as said:
        return said.read(), os.waitstatus_to_exitcode(status)


def _a_supernode_told_twice(fd: int) -> None:
    forked._one_goodbye()
    register_signal_handlers(event_type=EventType.RUN_SUPERNODE_LEAVE, exit_message="leaving")
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # Ctrl-C or ``kill`` of the group: Flower's graceful exit begins
        time.sleep(5)
    finally:  # where Flower's connection says goodbye (DeactivateNode)
        os.kill(os.getpid(), signal.SIGTERM)  # the stopping launcher's own SIGTERM to its SuperNode
        time.sleep(0.05)
        os.write(fd, b"goodbye")


def test_a_second_signal_does_not_cut_the_supernodes_goodbye_short() -> None:
    """Flower puts back the handlers it found; ``SIG_DFL`` there killed the node before it told the SuperLink."""
    assert _in_a_fork(_a_supernode_told_twice) == (b"goodbye", 0)


def _a_supernode_told_before_flower_listens(fd: int) -> None:
    forked._one_goodbye()
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(5)
    os.write(fd, b"went on")


def test_a_signal_before_flowers_handlers_ends_the_fork_at_once() -> None:
    start = time.monotonic()
    assert _in_a_fork(_a_supernode_told_before_flower_listens) == (b"", 128 + signal.SIGINT)
    assert time.monotonic() - start < 4


@dataclass
class Forked:
    """What an entry point did in a fork: its exit code, its name while it ran, what it wrote to the report
    pipe and to its output, and what it saw of this process's state as it exited."""

    code: int
    name: str
    reported: list[dict[str, object]]
    said: str
    at_exit: dict[str, object]


def _at_exit() -> dict[str, object]:
    """In the fork, as it exits: the patches it installed and the packages it still holds."""
    supernode = importlib.import_module(supernode_waits.MODULE) if supernode_waits.MODULE in sys.modules else None
    pulls = getattr(supernode, "pull_objects", None)
    runtime = sys.modules.get("flwr.supernode.runtime.run_clientapp")
    return {
        "clock": type(vars(supernode).get("time")).__name__ if supernode else None,
        "initial_backoff": getattr(pulls, "keywords", {}).get("initial_backoff"),
        "install": getattr(getattr(runtime, "install_from_fab", None), "__qualname__", None),
        "bridge": "bridge" in sys.modules or "bridge.runtime" in sys.modules,
    }


def _entry_point_in_a_fork(tmp_path: Path, entry: Callable[[int], None], run_s: float, until: bytes = b"") -> Forked:
    """``entry(report_fd)`` in a fork with its output to a file; SIGTERM once it has reported ``until`` (or after
    ``run_s``), unless it ended first. The fork's ``os._exit`` first says what :func:`_at_exit` sees."""
    report_r, report_w = os.pipe()
    state_r, state_w = os.pipe()
    credit = Credit()
    output = tmp_path / "output"
    pid = os.fork()
    if pid == 0:  # pragma: no cover -- the fork
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)  # not the handlers of a mutation run's fork server
        os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
        out = os.open(output, os.O_WRONLY | os.O_CREAT, 0o600)
        os.dup2(out, 1)
        os.dup2(out, 2)
        sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 -- not pytest's capture
        for handler in logging.getLogger("flwr").handlers:  # Flower's console handler holds the stream it found
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(sys.stderr)
        real_exit = os._exit

        def say_then_exit(code: int) -> None:
            credit.send()
            os.write(state_w, json.dumps(_at_exit()).encode())
            real_exit(code)

        os._exit = say_then_exit  # type: ignore[assignment]
        try:
            entry(report_w)
        finally:
            real_exit(99)  # an entry point that returned
    os.close(report_w)
    os.close(state_w)
    reported, name, status, deadline = b"", "", None, time.monotonic() + run_s
    while status is None and time.monotonic() < deadline and not (until and until in reported):
        reaped, ended = os.waitpid(pid, os.WNOHANG)
        if reaped:
            status = ended
            break
        name = Path(f"/proc/{pid}/comm").read_text().strip()  # the child: here until it is reaped
        if select.select([report_r], [], [], 0.05)[0]:
            reported += os.read(report_r, 4096)
    if status is None:
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    credit.receive()  # sent as it exited
    with os.fdopen(report_r, "rb") as rest, os.fdopen(state_r, "rb") as state:
        reported += rest.read()
        at_exit = json.loads(state.read() or b"{}")
    lines = [json.loads(line) for line in reported.decode().splitlines()]
    return Forked(os.waitstatus_to_exitcode(status), name, lines, output.read_text(errors="replace"), at_exit)


def _supernode(link: int, port: int, report: bool = True, backoff: bool = True) -> Callable[[int], None]:
    argv = ["flower-supernode", "--insecure", "--isolation", "process", "--superlink", f"127.0.0.1:{link}"]
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    return lambda fd: forked.run_supernode(argv, fd if report else None, backoff=backoff)


@pytest.mark.slow
def test_a_supernode_reports_each_failed_attempt_to_join_and_leaves_on_sigterm(tmp_path: Path) -> None:
    """Nothing at the SuperLink's address: the launcher hears of each attempt; its SIGTERM ends the node at once."""
    done = _entry_point_in_a_fork(tmp_path, _supernode(free_port(), free_port()), 20, until=b'{"retry": true}')
    assert done.name == "flower-supernod"  # what ps shows: the kernel keeps 15 characters
    assert done.reported and all(line == {"retry": True} for line in done.reported)
    assert done.code == 0 and "SuperNode terminated gracefully" in done.said
    assert (done.at_exit["clock"], done.at_exit["initial_backoff"]) == ("BackoffClock", forked.OBJECT_RETRY_S)
    assert done.at_exit["bridge"] and done.at_exit["install"] in (None, "install_from_fab")  # a task's patch only


@pytest.mark.slow
def test_without_backoff_or_a_report_pipe_the_supernode_is_flowers_own(tmp_path: Path) -> None:
    done = _entry_point_in_a_fork(tmp_path, _supernode(free_port(), free_port(), False, False), 1.5)
    assert done.reported == [] and done.code == 0
    assert done.at_exit["clock"] == "module" and done.at_exit["initial_backoff"] is None


@pytest.mark.slow
def test_a_supernode_whose_runtime_port_is_taken_says_how_to_start_on_a_free_one(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        done = _entry_point_in_a_fork(tmp_path, _supernode(free_port(), taken.getsockname()[1]), 20)
    assert done.code == 1 and "Traceback" not in done.said
    assert done.said.endswith(
        "launcher: SuperNode Runtime HTTP API failed to start. Another process may hold its port: start the device "
        "on a free one (supernode.sh: FEDSKETCH_RUNTIME_PORT; the launcher: --port).\n"
    )


@pytest.mark.slow
def test_a_supernode_refused_by_flower_exits_with_flowers_code(tmp_path: Path) -> None:
    bad = ["flower-supernode", "--no-such-flag"]
    done = _entry_point_in_a_fork(tmp_path, lambda fd: forked.run_supernode(bad, fd), 20)
    assert done.code == 2 and "unrecognized arguments: --no-such-flag" in done.said


@pytest.mark.slow
def test_a_supernode_that_fails_otherwise_leaves_its_traceback_and_exits_1(tmp_path: Path) -> None:
    done = _entry_point_in_a_fork(tmp_path, lambda fd: forked.run_supernode(None, fd), 20)  # type: ignore[arg-type]
    assert done.code == 1 and "Traceback" in done.said and "launcher:" not in done.said


@pytest.mark.slow
def test_a_task_runs_flowers_clientapp_from_the_fabs_code_and_installs_each_fab_once(tmp_path: Path) -> None:
    """No SuperNode answers: Flower's task retries until SIGTERM stops it; the package it came from is forgotten."""
    done = _entry_point_in_a_fork(tmp_path, lambda fd: forked.run_task("token", f"127.0.0.1:{free_port()}"), 2)
    assert done.name == "flwr-clientapp" and done.code == 0
    assert "Connection attempt failed" in done.said and "Task stopped." in done.said
    install = str(done.at_exit["install"])  # under mutmut, install_once is a copy of the function by another name
    assert "install_once" in install and install.endswith(".<locals>.install_from_fab") and not done.at_exit["bridge"]


def test_the_code_of_an_exit_is_its_number_1_for_a_message_and_0_for_none() -> None:
    assert [forked._exit_code(SystemExit(c)) for c in (3, 0, "refused", None)] == [3, 0, 1, 0]


def test_forgetting_a_package_drops_it_and_its_modules_only() -> None:
    names = ["fedsketch_gone", "fedsketch_gone.inner", "fedsketch_gone_not"]
    for name in names:
        sys.modules[name] = types.ModuleType(name)
    try:
        forked._forget_package("fedsketch_gone")
        assert [name in sys.modules for name in names] == [False, False, True]
    finally:
        for name in names:
            sys.modules.pop(name, None)


def test_a_fab_is_extracted_once_for_the_same_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    calls: list[bytes] = []

    def flower_install(fab: bytes, install_dir: Path | None = None, skip_prompt: bool = False) -> Path:
        calls.append(fab)
        (folder := tmp_path / f"app-{len(calls)}").mkdir()
        return folder

    install = forked.install_once(flower_install)
    first = install(b"fab one", skip_prompt=True)
    assert install(b"fab one", skip_prompt=True) == first and calls == [b"fab one"]
    assert install(b"fab two", skip_prompt=True) != first and len(calls) == 2
    shutil.rmtree(first)  # removed from disk: extracted again
    assert install(b"fab one", skip_prompt=True).is_dir() and len(calls) == 3


def _in_a_grandchild(told_its_parent: bool, sig: signal.Signals) -> bytes:
    """What a fork of a fork says when told to die with its parent by ``sig``: "armed" once told, then the signal
    it gets. Told its parent's pid, its parent ends once it is armed; told another pid, the parent waits for it."""
    said_r, said_w = os.pipe()
    armed_r, armed_w = os.pipe()
    credit = Credit()
    parent = os.fork()
    if parent == 0:  # pragma: no cover -- the fork, then its fork
        try:
            for forwarded in (signal.SIGINT, signal.SIGTERM):
                signal.signal(forwarded, signal.SIG_DFL)
            me = os.getpid()
            if (grandchild := os.fork()) == 0:
                try:

                    def got(signum: int, frame: object) -> None:
                        credit.send()  # in die_with_parent's own call when told another pid
                        os.write(said_w, str(signum).encode())
                        os._exit(0)

                    signal.signal(sig, got)
                    forked.die_with_parent(me if told_its_parent else me + 100_000, sig)
                    credit.send()
                    os.write(said_w, b"armed ")
                    os.write(armed_w, b"x")
                    time.sleep(30)
                finally:
                    os._exit(1)
            os.close(armed_w)
            if told_its_parent:
                os.read(armed_r, 1)  # then end: the kernel signals the grandchild
            else:
                os.waitpid(grandchild, 0)
        finally:
            os._exit(0)
    os.close(said_w)
    os.close(armed_w)
    credit.receive()
    os.waitpid(parent, 0)
    with os.fdopen(said_r, "rb") as said:  # its end: the grandchild and its parent are gone
        return said.read() if select.select([said], [], [], 10)[0] else b"(still running)"


def test_a_fork_told_to_die_with_its_parent_gets_the_signal_when_the_parent_dies() -> None:
    assert _in_a_grandchild(True, signal.SIGUSR1) == f"armed {int(signal.SIGUSR1)}".encode()


def test_a_fork_told_another_pid_than_its_parents_takes_it_as_gone_and_gets_the_signal_at_once() -> None:
    assert _in_a_grandchild(False, signal.SIGUSR2) == str(int(signal.SIGUSR2)).encode()


def _heaps(libc: ctypes.CDLL, path: Path) -> int:
    """The arenas glibc's malloc holds now, as ``malloc_info`` lists them."""
    report = ctypes.c_void_p(libc.fopen(str(path).encode(), b"w"))
    libc.malloc_info(0, report)
    libc.fclose(report)
    return path.read_bytes().count(b"<heap nr=")


def _new_heaps_for_four_threads(tmp_path: Path, more: int | None) -> int:
    """In a fork: how many arenas four threads that each allocate add, with the limit ``more`` above the arenas
    the fork holds already (the process it is forked from may have made some: mutmut's does)."""

    def four_threads(fd: int) -> None:
        libc = ctypes.CDLL(None)
        libc.malloc.restype = libc.fopen.restype = ctypes.c_void_p
        before = _heaps(libc, tmp_path / "before.xml")
        if more is not None:
            forked.limit_malloc_arenas(before + more)
        together = threading.Barrier(5)
        threads = [threading.Thread(target=lambda: (together.wait(), libc.malloc(100_000))) for _ in range(4)]
        for thread in threads:
            thread.start()
        together.wait()
        for thread in threads:
            thread.join()
        os.write(fd, str(_heaps(libc, tmp_path / "after.xml") - before).encode())

    said, code = _in_a_fork(four_threads)
    assert code == 0, said
    return int(said)


def test_a_limit_on_mallocs_arenas_holds_for_every_thread_of_the_process(tmp_path: Path) -> None:
    assert _new_heaps_for_four_threads(tmp_path, None) >= 1  # glibc's own: an arena a thread, up to 8 a core
    assert [_new_heaps_for_four_threads(tmp_path, n) for n in (0, 1)] == [0, 1]
