"""The process table read from /proc (experiments/flower/procs.py): real processes started and stopped here.

Each test starts its own sleepers with a variable of its own (a token no other process carries) and stops
them before it ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from experiments.flower import procs

KEY = "FEDSKETCH_TEST_TOKEN"
TICKS = os.sysconf("SC_CLK_TCK")


def _token() -> str:
    return uuid.uuid4().hex


def _python(code: str, token: str | None, children: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != KEY}
    if token is not None:
        env[KEY] = token
    child = subprocess.Popen([sys.executable, "-c", code], env=env)
    children.append(child)
    return child


SLEEP = "import time; time.sleep(10)"


def _wait_for(found: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not found() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.02)


def test_a_process_is_found_by_the_whole_value_of_its_variable_and_never_this_one(started) -> None:
    token = _token()
    carrier = _python(SLEEP, token, started)
    _python(SLEEP, token + "x", started)  # the value only begins the same
    _python(SLEEP, None, started)
    assert procs.processes_with_env(KEY, token) == [carrier.pid]
    assert procs.processes_with_env(KEY, token[:-1]) == []
    mine = next(iter(os.environ.items()))  # this process has it too, as the children do
    assert carrier.pid in procs.processes_with_env(*mine) and os.getpid() not in procs.processes_with_env(*mine)


def test_a_start_time_is_when_the_process_started_and_none_once_it_has_ended(started) -> None:
    child = _python(SLEEP, None, started)
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    began = procs.start_time(child.pid)
    assert began is not None and abs(began / TICKS - uptime) < 5.0
    assert procs.start_time(child.pid) == began and procs.start_time(os.getpid()) <= began
    child.kill()
    _wait_for(lambda: procs.start_time(child.pid) is None)  # a zombie until reaped: ended all the same
    assert child.poll() is None or child.returncode is not None
    assert procs.start_time(child.pid) is None
    child.wait(timeout=10)
    assert procs.start_time(child.pid) is None and procs.parent(child.pid) is None


def test_a_parent_and_the_descendants_follow_the_parent_pids_roots_excluded(started) -> None:
    tree = _python(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import subprocess, sys, time; "
        'subprocess.Popen([sys.executable, "-c", "import time; time.sleep(10)"]); time.sleep(10)\'])\n'
        "time.sleep(10)",
        None,
        started,
    )
    _wait_for(lambda: len(procs.descendants({tree.pid})) == 2)
    below = procs.descendants({tree.pid})
    assert len(below) == 2 and tree.pid not in below
    (child,) = [pid for pid in below if procs.parent(pid) == tree.pid]
    (grandchild,) = below - {child}
    assert procs.parent(tree.pid) == os.getpid() and procs.parent(grandchild) == child
    assert procs.descendants({child}) == {grandchild}
    assert procs.descendants({tree.pid, child}) == {grandchild}  # a root below another root is still a root
    assert procs.descendants({grandchild}) == set()
    assert {tree.pid, child, grandchild} <= procs.descendants({os.getpid()})


def test_carrying_finds_the_carriers_and_with_seen_their_children_and_keeps_them(started) -> None:
    token = _token()
    parent = _python(
        "import os, subprocess, sys, time\n"
        f"env = {{k: v for k, v in os.environ.items() if k != {KEY!r}}}\n"
        f"subprocess.Popen([sys.executable, '-c', {SLEEP!r}], env=env)\n"
        "time.sleep(10)",
        token,
        started,
    )
    _wait_for(lambda: len(procs.descendants({parent.pid})) == 1)
    (child,) = procs.descendants({parent.pid})
    assert procs.carrying(KEY, token) == [parent.pid]  # without ``seen``: the carriers alone
    seen: procs.Seen = {}
    assert procs.carrying(KEY, token, seen) == sorted([parent.pid, child])
    assert seen == {parent.pid: procs.start_time(parent.pid), child: procs.start_time(child)}
    os.kill(child, signal.SIGKILL)  # the parent's child: reaped by nobody, a zombie, not carried
    _wait_for(lambda: procs.start_time(child) is None)
    assert procs.carrying(KEY, token, seen) == [parent.pid]


def test_seen_keeps_a_process_that_lost_its_variable_but_not_a_reused_pid_or_this_one(started) -> None:
    token = _token()
    other = _python(SLEEP, None, started)
    began = procs.start_time(other.pid)
    assert began is not None
    assert procs.carrying(KEY, token, {other.pid: began}) == [other.pid]  # found once: kept
    assert procs.carrying(KEY, token, {other.pid: began + 1}) == []  # another process under that pid
    assert procs.carrying(KEY, token, {other.pid: None}) == []
    mine = procs.carrying(KEY, token, {os.getpid(): procs.start_time(os.getpid())})
    assert os.getpid() not in mine and other.pid in mine  # this process's children, never itself
    assert procs.carrying(KEY, token, {}) == []


TERM_WRITES = (
    "import signal, sys, time\n"
    "def bye(*_):\n"
    "    open(sys.argv[1], 'w').write('term')\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "time.sleep(10)"
)
TERM_IGNORED = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(10)"


def _started_with(
    code: str, token: str, *args: str, children: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    env = {**os.environ, KEY: token}
    child = subprocess.Popen([sys.executable, "-c", code, *args], env=env)
    children.append(child)
    _wait_for(lambda: _term_handled(child.pid), timeout=60.0)  # then it runs, and carries the token
    assert _term_handled(child.pid), "the child did not install its SIGTERM handler within 60 s"
    return child


def _term_handled(pid: int) -> bool:
    """Whether ``pid`` catches or ignores SIGTERM yet (``SigCgt``, ``SigIgn`` in ``/proc/PID/status``): a child
    on a busy machine may take longer than any fixed wait to install its handler."""
    masks = dict(line.split(":\t") for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
    return bool((int(masks["SigCgt"], 16) | int(masks["SigIgn"], 16)) & (1 << (signal.SIGTERM - 1)))


def test_stopping_terms_first_kills_what_stays_after_the_grace_and_counts_them(started, tmp_path: Path) -> None:
    token = _token()
    polite = _started_with(TERM_WRITES, token, str(tmp_path / "term"), children=started)
    stubborn = _started_with(TERM_IGNORED, token, children=started)
    began = time.monotonic()
    assert procs.stop_carrying(KEY, token, grace_s=0.6) == 2
    took = time.monotonic() - began
    assert (tmp_path / "term").read_text() == "term"  # SIGTERM came first and was heard
    assert polite.wait(timeout=10) == 0 and stubborn.wait(timeout=10) == -signal.SIGKILL
    assert 0.55 <= took < 1.5  # the stubborn one had its grace, then no more: SIGKILL, looked at 0.1 s later
    assert procs.carrying(KEY, token) == []


def test_stopping_with_sigkill_first_ends_everything_at_once(started, tmp_path: Path) -> None:
    token = _token()
    polite = _started_with(TERM_WRITES, token, str(tmp_path / "term"), children=started)
    began = time.monotonic()
    assert procs.stop_carrying(KEY, token, grace_s=30.0, first=signal.SIGKILL) == 1
    assert time.monotonic() - began < 1.0 and polite.wait(timeout=10) == -signal.SIGKILL
    assert not (tmp_path / "term").exists()


def test_stopping_also_stops_what_was_seen_before_and_nothing_when_none_is_left(started) -> None:
    token = _token()
    other = _python(TERM_IGNORED, None, started)
    _wait_for(lambda: procs.start_time(other.pid) is not None and _term_handled(other.pid))
    seen: procs.Seen = {other.pid: procs.start_time(other.pid)}
    assert procs.stop_carrying(KEY, token, grace_s=0.5, seen=seen) == 1
    assert other.wait(timeout=10) == -signal.SIGKILL
    assert procs.stop_carrying(KEY, _token(), grace_s=30.0) == 0  # none: no wait either


def test_a_name_with_parentheses_does_not_shift_the_fields_after_it(started) -> None:
    """``/proc/PID/stat`` puts the name in parentheses, and a name may hold them too: the fields follow the last."""
    named = "import ctypes, time; ctypes.CDLL(None).prctl(15, b'a) b) c', 0, 0, 0); time.sleep(10)"  # PR_SET_NAME
    child = _python(named, None, started)
    _wait_for(lambda: Path(f"/proc/{child.pid}/comm").read_text().strip() == "a) b) c")
    assert Path(f"/proc/{child.pid}/comm").read_text().strip() == "a) b) c"
    assert procs.parent(child.pid) == os.getpid()
    began = procs.start_time(child.pid)
    assert began is not None and abs(began / TICKS - float(Path("/proc/uptime").read_text().split()[0])) < 5.0


TERM_ENDS_SOON = "import signal, sys, time; signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(10)"


def test_stopping_sees_within_a_tenth_of_a_second_that_all_have_ended(started) -> None:
    token = _token()
    _started_with(TERM_ENDS_SOON, token, children=started)
    began = time.monotonic()
    assert procs.stop_carrying(KEY, token, grace_s=5.0) == 1
    assert time.monotonic() - began < 0.6


SPAWNS_AS_IT_DIES = (
    "import os, signal, subprocess, sys, time\n"
    "def bye(*_):\n"
    "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(10)'], start_new_session=True)\n"
    "    os._exit(0)\n"
    "signal.signal(signal.SIGTERM, bye)\n"
    "time.sleep(10)"
)


def test_stopping_also_stops_what_a_dying_carrier_starts_once_its_parent_is_gone(started) -> None:
    """The new one carries the variable and no parent that was seen: only its variable finds it."""
    token = _token()
    parent = _started_with(SPAWNS_AS_IT_DIES, token, children=started)
    assert procs.stop_carrying(KEY, token, grace_s=0.5) >= 1
    assert parent.wait(timeout=10) == 0
    assert procs.carrying(KEY, token) == []  # the orphan too


HOLDS_MEMORY = (
    "import signal, time; held = bytearray(1 << 30); signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(10)"
)


def test_stopping_returns_once_the_kernel_has_ended_what_it_killed(started) -> None:
    """A process that holds 1 GiB takes a while to end after SIGKILL (0.2 s and more here): until it has, it is
    still found, and stopping waits for it."""
    token = _token()
    holder = _started_with(HOLDS_MEMORY, token, children=started)
    assert procs.stop_carrying(KEY, token, grace_s=0.1) == 1
    assert procs.start_time(holder.pid) is None  # ended (a zombie until waited for), not ending
    assert holder.wait(timeout=10) == -signal.SIGKILL
