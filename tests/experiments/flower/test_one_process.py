"""The one-process runtime (experiments/flower/one_process.py): its process's environment, its command line, and
real runs through it, in a process of their own, in a spare, and in this process."""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bridge.runtime.simulation_backend import worker_count
from experiments.flower import one_process, procs, spare
from experiments.flower.app_files import INPROCESS_CLIENTAPP
from fedsketch.server import runlog
from tests.conftest import ROOT, environ
from tests.tiny_runs import rounds, tiny_federation, tiny_run


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
    monkeypatch.delenv("PYTHONPATH")
    assert one_process.process_env(tmp_path / "app", tmp_path / "home")["PYTHONPATH"] == str(tmp_path / "app")
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")  # the user's own setting is kept
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    env = one_process.process_env(tmp_path / "app", tmp_path / "home")
    assert env["MALLOC_ARENA_MAX"] == "8" and env["MALLOC_TRIM_THRESHOLD_"] == "0"


def _fresh_pages_over_three_rounds() -> int:
    """Page faults of three rounds of replies in this process, after a first: a node's round on the paper's shape,
    scaled down, 20 tables of 10 MB made into bytes."""

    def round_of_replies() -> None:
        tables = [np.ones(2_500_000, np.float32) for _ in range(20)]
        replies = [b"".join((b"header", t.data)) for t in tables]
        del tables, replies

    # numpy asks for transparent huge pages for its large arrays: how many it gets depends on the machine's free
    # memory at that moment (one fault per 2 MiB), so the count is made with 4 KiB pages only
    multiarray = (np._core if hasattr(np, "_core") else np.core).multiarray  # numpy 2, numpy 1
    hugepages = multiarray._set_madvise_hugepage(False)
    try:
        round_of_replies()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(3):
            round_of_replies()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
    finally:
        multiarray._set_madvise_hugepage(hugepages)


ROUNDS_OF_REPLIES = (
    "from tests.experiments.flower import test_one_process as t; print(t._fresh_pages_over_three_rounds())"
)


def _bare_environ() -> dict[str, str]:
    """This environment without glibc's malloc variables, the project importable."""
    return {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | {"PYTHONPATH": str(ROOT)}


def _fresh_pages_in_a_fresh_python(env: dict[str, str], first: str = "") -> int:
    """:func:`_fresh_pages_over_three_rounds` in a Python of its own with ``env``, after the code ``first``."""
    code = first + ROUNDS_OF_REPLIES
    return int(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout)


@pytest.mark.slow  # two fresh Pythons importing torch
def test_the_malloc_settings_let_a_round_reuse_what_the_last_one_freed(tmp_path: Path) -> None:
    """Fresh pages each round under glibc's defaults, and the pages the first round freed with
    :data:`one_process.MALLOC` in the environment (through ``mallopt``: the next test)."""
    default = _fresh_pages_in_a_fresh_python(_bare_environ())
    assert default > 20 * 2_000  # fresh pages for at least a round: about 2,440 a table (here every round)
    assert _fresh_pages_in_a_fresh_python(one_process.process_env(ROOT, tmp_path)) < default / 10


@pytest.mark.slow  # a fresh Python importing torch
def test_a_started_process_gets_the_malloc_settings_its_environment_lacks_through_mallopt() -> None:
    """As in a spare: nothing where the environment sets each (in a fresh Python under glibc's defaults, fresh pages
    every round, about 2,440 a table), then all four where it sets none (in this process: the first round's pages
    serve the next three). A worker of the whole suite counted anything from 293,040 to 0 fresh pages under the
    defaults: its heap keeps what earlier tests freed, and malloc serves a large array from it before it maps one."""
    set_in_environ = "from experiments.flower import one_process as o; o.set_malloc(dict.fromkeys(o.MALLOC, 'set')); "
    assert _fresh_pages_in_a_fresh_python(_bare_environ(), set_in_environ) > 10 * 2_000
    one_process.set_malloc({})
    assert _fresh_pages_over_three_rounds() < 2_000
    assert _mapped_by_an_array_of(2**30) >= 2**30  # over 64 MiB: mapped, not kept on the heap


class _MallInfo(ctypes.Structure):
    """glibc's ``struct mallinfo2``."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in [
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        ]
    ]


def _mapped_by_an_array_of(size: int) -> int:
    """Bytes glibc mapped for an array of ``size`` bytes, never touched (no memory used)."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo
    before = libc.mallinfo2().hblkhd
    array = np.empty(size, np.uint8)
    mapped = libc.mallinfo2().hblkhd - before
    del array
    return mapped


def test_the_command_line_prints_its_usage_and_refuses_bad_arguments_with_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert one_process.main(["-h"]) == 0 and capsys.readouterr().out == one_process.USAGE + "\n"
    assert one_process.main(["--help"]) == 0 and capsys.readouterr().out == one_process.USAGE + "\n"
    assert one_process.main(["-h", "app"]) == 0 and capsys.readouterr().out == one_process.USAGE + "\n"
    for args in (["app"], ["app", "run.toml", "two", "1", "0", "inprocess"], ["a", "r", "2", "1.5", "0", "inprocess"]):
        assert one_process.main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith(one_process.USAGE + "\n(six arguments;") and "NUM_GPUS a number" in err


def test_the_command_line_runs_the_run_it_names_in_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    path = tiny_run(tmp_path / "runs")
    assert one_process.main([str(ROOT), str(path / "run_config.toml"), "2", "2", "0", "inprocess"]) == 0
    assert rounds(path) == [1, 2] and f"{worker_count(2)} at once" in caplog.text and "(no Ray)" in caplog.text


@pytest.mark.slow  # a run in a process of its own
def test_a_run_goes_in_a_process_of_its_own_with_its_environment_and_logs_to_its_folder(
    tmp_path: Path, homes: list[Path]
) -> None:
    """Not to a spare started for another backend (let go); the run's process carries the environment
    :func:`one_process.process_env` gives; ``poll`` is called while it goes on; it is gone, and its log in the
    run's folder, once the run has returned 0."""
    path = tiny_run(tmp_path / "runs")
    home = path / "flwr-home"
    homes.append(home)
    other = _spare_for("ray")
    seen: list[dict[str, str]] = []

    def poll() -> None:
        for pid in procs.processes_with_env("FLWR_HOME", str(home)):
            entries = environ(pid)  # None: it ended since
            if entries is not None:
                seen.append(dict(e.decode().split("=", 1) for e in entries if b"=" in e))

    try:
        assert one_process.one_process_run(ROOT, path / "run_config.toml", tiny_federation(), path, poll) == 0
    finally:
        spare.release()
    assert other.child.wait(timeout=10) is not None and not (path / "order.json").exists()
    assert seen, "no process of the run was seen while it ran"
    assert seen[0] == one_process.process_env(ROOT, home)  # the whole environment a process of the run gets
    assert rounds(path) == [1, 2] and runlog.SERVER_DONE_LOG in (path / "flower.log").read_text()
    assert one_process.SPARE_LOG not in (path / "flower.log").read_text()
    assert not procs.processes_with_env("FLWR_HOME", str(home))


LEFTOVER = """
import pathlib, signal, sys, time
def leave(*_):  # two seconds to end: killed at once, it leaves no file
    time.sleep(2)
    pathlib.Path(sys.argv[1]).write_text("ended")
    sys.exit(0)
signal.signal(signal.SIGTERM, leave)
print(flush=True)
time.sleep(60)
"""
"""A process a run left behind, which takes two seconds to end on SIGTERM, then writes the file it is given."""


def _spare_run(order: spare.Order) -> None:
    """A spare's run: the order written beside its log, a process of the run left behind (:data:`LEFTOVER`, in a
    session of its own) and, below a folder named ``done``, the run marked done; then it waits to be stopped."""
    log = Path(order["log_file"])
    log.with_name("order.json").write_text(json.dumps(order))
    env = {**os.environ, "FLWR_HOME": order["environ"]["FLWR_HOME"]}
    ended = str(log.with_name("ended"))
    left = subprocess.Popen(
        [sys.executable, "-c", LEFTOVER, ended], env=env, stdout=subprocess.PIPE, start_new_session=True
    )
    assert left.stdout is not None and left.stdout.readline()  # its SIGTERM handler is in place
    if "done" in log.parts:
        print(runlog.SERVER_DONE_LOG, flush=True)
        runlog.mark_server_done(log.parent, 0)
        time.sleep(60)


def _spare_for(backend: str) -> spare.Spare:
    spare.start(one_process.spare_key(ROOT, backend), lambda: None, _spare_run)
    waiting = spare._waiting
    assert waiting is not None
    return waiting


@pytest.mark.slow  # processes forked and started
@pytest.mark.parametrize("done", ["done", "not-done"])
def test_a_run_goes_to_the_spare_started_for_it_with_what_a_process_would_get_and_its_leftovers_are_stopped(
    tmp_path: Path, done: str, homes: list[Path]
) -> None:
    """The spare started for the run's app and backend gets the run's settings and the environment a fresh
    process would; when it is stopped, what the run left is stopped too: killed at once once the run is
    done (it keeps nothing the run needs), given time to end on SIGTERM otherwise."""
    path = tiny_run(tmp_path / done)
    home = path / "flwr-home"
    homes.append(home)
    waiting = _spare_for("inprocess")
    fed = tiny_federation(num_supernodes=3, cpus_per_client=2)
    polls: list[None] = []
    try:
        code = one_process.one_process_run(ROOT, path / "run_config.toml", fed, path, lambda: polls.append(None))
        assert code == 0 and polls and waiting.child.poll() is not None
        assert not procs.processes_with_env("FLWR_HOME", str(home))
    finally:
        spare.release()
    assert (path / "ended").exists() is (done == "not-done")
    assert json.loads((path / "order.json").read_text()) == {
        "run_config": str(path / "run_config.toml"),
        "log_file": str(path / "flower.log"),
        "environ": one_process.process_env(ROOT, home),
        "nodes": "3",
        "cpus": "2",
        "gpus": "0.0",
    }


@pytest.mark.slow  # a run in a process of its own
def test_a_spare_that_ended_before_its_run_came_is_let_go_and_the_run_starts_a_process(
    tmp_path: Path, homes: list[Path]
) -> None:
    path = tiny_run(tmp_path / "runs", **{"num-rounds": 1})
    homes.append(path / "flwr-home")
    waiting = _spare_for("inprocess")
    os.kill(waiting.child.pid, signal.SIGKILL)
    waiting.child.wait(timeout=10)
    try:
        assert one_process.one_process_run(ROOT, path / "run_config.toml", tiny_federation(), path) == 0
    finally:
        spare.release()
    assert spare._waiting is None and rounds(path) == [1] and not (path / "order.json").exists()


def test_a_spare_warms_up_as_a_started_process_and_serves_its_run_in_its_own_process(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What ``start_spare`` forks, called here: the warm-up gives this process the environment and path a
    started one gets and imports the backend's ClientApp, and the run given to it runs here, with that ClientApp
    (its first log line says it came to a spare)."""
    started: list[tuple[list[str], Callable[[], None], Callable[[spare.Order], None]]] = []
    monkeypatch.setattr(spare, "start", lambda key, warm_up, serve: started.append((key, warm_up, serve)))
    monkeypatch.setattr(sys, "path", ["/first", *sys.path])
    for name in one_process.MALLOC:  # set: the warm-up calls no mallopt in the test's process
        monkeypatch.setenv(name, os.environ.get(name, str(one_process.MALLOC[name][0])))
    inprocess_app = INPROCESS_CLIENTAPP.split(":")[0]
    monkeypatch.delitem(sys.modules, inprocess_app, raising=False)
    one_process.start_spare(ROOT, "inprocess")
    ((key, warm_up, serve),) = started
    assert key == one_process.spare_key(ROOT, "inprocess") == [str(ROOT), "inprocess"]
    warm_up()
    assert sys.path[:2] == [str(ROOT), "/first"] and os.environ["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT)
    assert os.environ["FLWR_HOME"] == tempfile.gettempdir() and os.environ["FLWR_TELEMETRY_ENABLED"] == "0"
    assert inprocess_app in sys.modules
    del sys.modules[inprocess_app]  # the run imports it again
    path = tiny_run(tmp_path / "runs", **{"num-rounds": 1})
    home = str(path / "flwr-home")
    order = {"run_config": str(path / "run_config.toml"), "environ": {"FLWR_HOME": home}, "nodes": "2"}
    serve({**order, "cpus": "2", "gpus": "0"})
    assert os.environ["FLWR_HOME"] == home and rounds(path) == [1] and inprocess_app in sys.modules
    assert capsys.readouterr().out.startswith(one_process.SPARE_LOG + "\n")
    assert f"{worker_count(2)} at once" in caplog.text
    with pytest.raises(ValueError, match="a spare was given a run it cannot read"):
        serve({**order, "cpus": "two", "gpus": "0"})
