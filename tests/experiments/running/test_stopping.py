"""Stopping a command and what it started, on real (small) processes; marking stopped runs.

The same through real Flower and Ray processes is in tests/e2e/test_stopping.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from experiments.cli import main as fedsketch_main
from experiments.flower import procs
from experiments.flower.procs import processes_with_env
from experiments.running import runner, stopping
from fedsketch.config import RunConfig
from fedsketch.server import checkpoint, runlog
from tests.streams import held_stdout


def _sleeper(token: str, ignore_term: bool = False) -> subprocess.Popen[bytes]:
    """A detached process carrying ``token``, as Flower's SuperExec and Ray's workers are."""
    script = ("trap '' TERM; " if ignore_term else "") + "sleep 60 & wait"
    env = dict(os.environ, **{stopping.TOKEN_VAR: token})
    return subprocess.Popen(["bash", "-c", script], env=env, start_new_session=True)


def _token(name: str) -> str:
    """A token no other test, or test process beside this one, carries: reaping stops every carrier."""
    return f"fedsketch-{name}-{os.getpid()}-{time.monotonic_ns()}"


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_a_signal_stops_every_process_carrying_the_token_and_ends_the_command(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    with (
        pytest.raises(stopping.Interrupted) as stopped,
        stopping.Invocation("run", state=tmp_path, grace_s=0.5) as invocation,
    ):
        assert os.environ[stopping.TOKEN_VAR] == invocation.token
        entry = json.loads(next((tmp_path / "invocations").glob("*.json")).read_text())
        assert (entry["token"], entry["pid"]) == (invocation.token, os.getpid())
        polite = subprocess.Popen(["sleep", "60"])  # inherits the token from os.environ
        stubborn = _sleeper(invocation.token, ignore_term=True)  # only SIGKILL stops it
        deadline = time.monotonic() + 10
        while len(processes_with_env(stopping.TOKEN_VAR, invocation.token)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises before this ends
        pytest.fail("SIGTERM did not end the command")
    assert (stopped.value.exit_code, invocation.stopped_by) == (143, stopped.value)
    assert polite.wait(timeout=1) == -signal.SIGTERM
    assert stubborn.wait(timeout=1) == -signal.SIGKILL
    assert not processes_with_env(stopping.TOKEN_VAR, invocation.token)
    assert signal.getsignal(signal.SIGTERM) == before and stopping.TOKEN_VAR not in os.environ
    assert not list((tmp_path / "invocations").glob("*.json"))


def test_the_next_command_stops_what_a_killed_one_left_and_says_so(tmp_path: Path) -> None:
    records = tmp_path / "invocations"
    records.mkdir()
    run = tmp_path / "runs" / "default" / "fetchsgd"
    run.mkdir(parents=True)
    runlog.append_metrics(run, {"round": 3, "strategy": "fetchsgd"})
    killed, living = _token("killed"), _token("alive")
    left = [_sleeper(killed), _sleeper(killed)]
    alive = _sleeper(living)
    try:
        gone = {"token": killed, "pid": _dead_pid(), "pid-start": 1, "command": "run", "run": [str(run), 9]}
        (records / "killed.json").write_text(json.dumps(gone))
        own = procs.start_time(os.getpid())  # a live command: never touched
        live = {"token": living, "pid": os.getpid(), "pid-start": own, "command": "deploy", "run": None}
        (records / "alive.json").write_text(json.dumps(live))
        time.sleep(0.3)
        lines = stopping.reap(records, grace_s=2.0)
        assert len(lines) == 1
        assert lines[0].startswith("fedsketch: stopped 4 processes left by `fedsketch run` (pid ")  # 2 bash + 2 sleep
        assert lines[0].endswith(f"its run {run} is marked interrupted")
        assert [p.wait(timeout=2) for p in left] == [-signal.SIGTERM] * 2
        assert alive.poll() is None and (records / "alive.json").exists() and not (records / "killed.json").exists()
        assert runlog.status_note(runlog.read_status(run) or {}) == "interrupted (killed) after round 3 of 9"
        assert stopping.reap(records) == []  # said once
    finally:
        os.killpg(alive.pid, signal.SIGKILL)
        alive.wait()


def test_sigusr1_skips_the_current_run_at_its_next_poll(tmp_path: Path) -> None:
    polls: list[int] = []
    with stopping.Invocation("run", state=tmp_path) as invocation:
        poll = stopping.checked(lambda: polls.append(1))
        poll()
        invocation.start_run(tmp_path, 10)
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.1)
        with pytest.raises(stopping.Skipped):
            poll()
        poll()  # once
    assert polls == [1, 1] and invocation.stopped_by is None


def _experiment(tmp_path: Path, **settings: object) -> runner.Experiment:
    values = {"out-dir": str(tmp_path), "num-rounds": 4, **settings}
    return runner.load_experiment(runner.DEFAULT_CONFIG, values, strategies=["fetchsgd", "fedavg", "true_topk"])


def _rounds(stop_after: dict[str, tuple[int, stopping.Stop]]):  # type: ignore[no-untyped-def]
    """A stand-in for Flower that logs rounds and is stopped where ``stop_after`` says."""

    def execute(cfg: RunConfig, path: Path) -> int:
        runlog.write_config(cfg, path)
        start = len(runlog.read_metrics(path))
        for rnd in range(start + 1, cfg.num_rounds + 1):
            runlog.append_metrics(path, {"round": rnd, "strategy": cfg.strategy})
            if cfg.strategy in stop_after and rnd == stop_after[cfg.strategy][0]:
                raise stop_after[cfg.strategy][1]
        return 0

    return execute


def test_a_skipped_run_is_marked_and_the_next_runs_interrupted_run_ends_the_experiment(tmp_path: Path) -> None:
    exp = _experiment(tmp_path)
    stops = {"fetchsgd": (2, stopping.Skipped()), "fedavg": (3, stopping.Interrupted(signal.SIGINT))}
    outcomes = [o for _, o in runner.run_all(exp.runs, _rounds(stops))]  # type: ignore[arg-type]
    assert outcomes == [
        "skipped (SIGUSR1) after round 2 of 4",
        "interrupted (SIGINT) after round 3 of 4",
        "not started",
    ]
    fetch, dense = (runlog.run_dir(cfg) for cfg in exp.runs[:2])
    status = runlog.read_status(fetch) or {}
    assert (status["state"], status["cause"], status["round"], status["num-rounds"]) == ("skipped", "SIGUSR1", 2, 4)
    assert [r["round"] for r in runlog.read_metrics(dense)] == [1, 2, 3]
    assert not runlog.run_dir(exp.runs[2]).exists()
    # The next command restarts both from scratch, as it does any unfinished run.
    assert [o for _, o in runner.run_all(exp.runs, _rounds({}))] == ["finished"] * 3  # type: ignore[arg-type]
    assert runlog.read_status(fetch) is None and runlog.read_status(dense) is None
    assert [r["round"] for r in runlog.read_metrics(dense)] == [1, 2, 3, 4]


def test_an_interrupted_run_that_checkpoints_resumes_and_is_no_longer_marked(tmp_path: Path) -> None:
    exp = _experiment(tmp_path, **{"checkpoint-every": 1})
    stops = {"fetchsgd": (2, stopping.Interrupted(signal.SIGTERM))}
    runner.run_all(exp.runs, _rounds(stops))  # type: ignore[arg-type]
    path = runlog.run_dir(exp.runs[0])
    (path / checkpoint.FILE).write_bytes(b"stands for the checkpoint of round 2")
    assert runner.is_resumable(exp.runs[0]) and runlog.read_status(path) is not None
    assert [o for _, o in runner.run_all(exp.runs, _rounds({}))] == ["finished"] * 3  # type: ignore[arg-type]
    assert [r["round"] for r in runlog.read_metrics(path)] == [1, 2, 3, 4]  # resumed: rounds 1-2 kept
    assert runlog.read_status(path) is None


def test_report_and_plot_say_which_runs_were_stopped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = _experiment(tmp_path)
    for cfg in exp.runs[:2]:
        path = runner.prepare(cfg)
        runlog.write_config(cfg, path)
        for rnd in range(1, 3 if cfg.strategy == "fetchsgd" else 5):
            runlog.append_metrics(
                path,
                {
                    "round": rnd,
                    "strategy": cfg.strategy,
                    "seed": 0,
                    "test_accuracy": 0.1 * rnd,
                    "cum_upload_bytes": 10**6 * rnd,
                    "cum_download_bytes": 10**7 * rnd,
                    "cum_dense_upload_bytes": 10**7 * rnd,
                },
            )
    runlog.write_status(runlog.run_dir(exp.runs[0]), "interrupted", "SIGINT", 4)
    exp_dir = tmp_path / "default"
    assert fedsketch_main(["report", str(exp_dir)]) == 0
    markdown = capsys.readouterr().out
    assert "| fetchsgd (stopped early) " in markdown and "| fedavg " in markdown and "fedavg (stopped" not in markdown
    assert "- fetchsgd: seed 0 interrupted (SIGINT) after round 2 of 4" in markdown
    assert "seed 0 interrupted (SIGINT) after round 2 of 4" in (exp_dir / "report.csv").read_text()
    assert fedsketch_main(["plot", str(exp_dir)]) == 0
    assert "fetchsgd: seed 0 interrupted (SIGINT) after round 2 of 4" in capsys.readouterr().out


def test_a_child_that_lost_the_token_is_stopped_with_its_parent() -> None:
    """Ray's processes rename themselves, which can overwrite the environment /proc shows: children count too."""
    token = _token("test")
    code = "import subprocess, time; c = subprocess.Popen(['/bin/sleep', '60'], env={}); print(c.pid, flush=True); time.sleep(60)"
    parent = subprocess.Popen(
        [sys.executable, "-c", code], env={**os.environ, stopping.TOKEN_VAR: token}, stdout=subprocess.PIPE, text=True
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert b"FEDSKETCH" not in Path(f"/proc/{child}/environ").read_bytes()
    assert stopping.stop_token(token, grace_s=0.5) == 2
    assert parent.wait(timeout=5) == -signal.SIGTERM
    parent.stdout.close()
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1][:3]


def test_commands_record_their_tokens_where_the_user_keeps_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(stopping.STATE_VAR, str(tmp_path / "mine"))
    assert stopping.state_dir() == tmp_path / "mine"
    monkeypatch.setenv(stopping.STATE_VAR, "")  # set but empty: as if unset
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert stopping.state_dir() == tmp_path / "xdg" / "fedsketch"
    monkeypatch.delenv("XDG_STATE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert stopping.state_dir() == tmp_path / "home" / ".local" / "state" / "fedsketch"


def test_a_stop_names_its_signal_and_a_finished_run_is_not_marked(tmp_path: Path) -> None:
    assert (str(stopping.Interrupted(signal.SIGINT)), stopping.Interrupted(signal.SIGINT).exit_code) == ("SIGINT", 130)
    stop = stopping.Interrupted(signal.SIGTERM)
    assert stopping.record(tmp_path, 4, stop) == "interrupted (SIGTERM) after round 0 of 4"
    for rnd in range(1, 5):
        runlog.append_metrics(tmp_path, {"round": rnd})
    assert stopping.record(tmp_path, 4, stop) == "finished"
    assert stopping.record(tmp_path, 5, stop) == "interrupted (SIGTERM) after round 4 of 5"
    (tmp_path / "none").mkdir()
    assert stopping.record(tmp_path / "none", 1, stop) == "interrupted (SIGTERM) after round 0 of 1"


def test_the_record_of_a_command_killed_outright_lets_the_next_one_clean_up(tmp_path: Path) -> None:
    """What :class:`stopping.Invocation` records is what :func:`stopping.reap` needs once its command is gone."""
    run = tmp_path / "runs" / "fetchsgd"
    run.mkdir(parents=True)
    runlog.append_metrics(run, {"round": 2})
    with stopping.Invocation("deploy", state=tmp_path / "new" / "state", grace_s=0.5) as invocation:
        stopping.note_run(run, 9)
        carrying = _sleeper(invocation.token)  # started by the command: carries its token
        forked = _sleeper(_token("another"))  # forked before the command had a token: tracked by pid
        invocation.track(forked.pid)
        entry = json.loads(invocation.entry.read_text(encoding="utf-8"))
        assert invocation.entry.name == f"{os.getpid()}-{invocation.token.rsplit('-', 1)[1]}.json"
        assert (entry["command"], entry["run"], entry["pid"]) == ("deploy", [str(run), 9], os.getpid())
        gone = tmp_path / "records"
        gone.mkdir()
        dead = _dead_pid()
        (gone / "gone.json").write_text(json.dumps({**entry, "pid": dead}), encoding="utf-8")
        time.sleep(0.3)
        said = (
            f"fedsketch: stopped 4 processes left by `fedsketch deploy` (pid {dead}), which ended without stopping "
            f"them; its run {run} is marked interrupted"
        )
        assert stopping.reap(gone, grace_s=0.5) == [said]
        assert carrying.wait(timeout=2) == -signal.SIGTERM and forked.wait(timeout=2) == -signal.SIGTERM
    assert runlog.status_note(runlog.read_status(run) or {}) == "interrupted (killed) after round 2 of 9"


def test_leaving_stops_what_the_command_started_and_restores_what_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(stopping.TOKEN_VAR, "outer")  # a command run from within another one's process
    before = signal.getsignal(signal.SIGINT)
    with stopping.Invocation("run", state=tmp_path, grace_s=0.3) as invocation:
        assert os.environ[stopping.TOKEN_VAR] == invocation.token
        polite = subprocess.Popen(["sleep", "60"])
        stubborn = _sleeper(invocation.token, ignore_term=True)
        forked = _sleeper(_token("another"))
        invocation.track(forked.pid)
        time.sleep(0.3)
        invocation.entry.unlink()  # its record removed by hand, its token from the environment: leaving still works
        del os.environ[stopping.TOKEN_VAR]
        start = time.monotonic()
    assert time.monotonic() - start < 2.9  # its own grace, not the default's 3 s
    assert (polite.wait(timeout=1), forked.wait(timeout=1), stubborn.wait(timeout=1)) == (
        -signal.SIGTERM,
        -signal.SIGTERM,
        -signal.SIGKILL,
    )
    assert os.environ[stopping.TOKEN_VAR] == "outer" and signal.getsignal(signal.SIGINT) == before
    stopping.note_run(tmp_path, 3)  # no command now: nothing to note
    assert not (tmp_path / "invocations").exists() or not list((tmp_path / "invocations").iterdir())


def test_a_signal_stops_the_processes_before_the_command_unwinds(tmp_path: Path) -> None:
    with stopping.Invocation("run", state=tmp_path, grace_s=0.3) as invocation:
        polite = subprocess.Popen(["sleep", "60"])
        stubborn = _sleeper(invocation.token, ignore_term=True)
        forked = _sleeper(_token("another"))
        invocation.track(forked.pid)
        time.sleep(0.3)
        start = time.monotonic()
        with pytest.raises(stopping.Interrupted):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        assert time.monotonic() - start < 2.9
        assert (polite.poll(), forked.poll(), stubborn.poll()) == (-signal.SIGTERM, -signal.SIGTERM, -signal.SIGKILL)


def test_a_second_signal_kills_everything_at_once_and_marks_the_run(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    with stopping.Invocation("run", state=tmp_path, grace_s=5.0) as invocation:
        invocation.stopped_by = stopping.Interrupted(signal.SIGINT)
        invocation.entry.unlink()  # removed by hand: forcing still works
        assert invocation._force() == 130  # no run yet: nothing to mark
        invocation._save()
        run = tmp_path / "run"
        run.mkdir()
        runlog.append_metrics(run, {"round": 2})
        stopping.note_run(run, 9)
        polite = subprocess.Popen(["sleep", "60"])
        forked = _sleeper(_token("another"))
        invocation.track(forked.pid)
        time.sleep(0.3)
        start = time.monotonic()
        assert invocation._force() == 130
        assert time.monotonic() - start < 2.9  # at once, not after the grace
        assert (polite.wait(timeout=1), forked.wait(timeout=1)) == (-signal.SIGKILL, -signal.SIGKILL)
        assert runlog.status_note(runlog.read_status(run) or {}) == "interrupted (SIGINT) after round 2 of 9"
        assert not invocation.entry.exists()
    assert capfd.readouterr().err.count("fedsketch: forced: every process it started was killed\n") == 2


def test_a_skip_asked_for_between_runs_is_dropped_and_one_during_a_run_named(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    poll = stopping.checked(lambda: None)
    with stopping.Invocation("run", state=tmp_path) as invocation:
        assert signal.getsignal(signal.SIGUSR1) == invocation._on_skip  # else the signal would end the tests
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.1)
        invocation.start_run(tmp_path, 10)
        poll()  # asked for before this run started
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(0.1)
        with pytest.raises(stopping.Skipped) as skipped:
            poll()
    assert str(skipped.value) == "SIGUSR1"
    assert capfd.readouterr().err.count("fedsketch: SIGUSR1: skipping the current run\n") == 2


def test_a_hangup_ignored_under_nohup_stays_ignored(tmp_path: Path) -> None:
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with stopping.Invocation("run", state=tmp_path):
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        with stopping.Invocation("run", state=tmp_path) as invocation:
            assert signal.getsignal(signal.SIGHUP) == invocation._on_stop
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_command_run_off_the_main_thread_installs_no_handlers(tmp_path: Path) -> None:
    """A notebook's background thread: Python allows signal handlers only in the main thread."""
    before, raised = signal.getsignal(signal.SIGTERM), []

    def command() -> None:
        try:
            with stopping.Invocation("run", state=tmp_path):
                assert signal.getsignal(signal.SIGTERM) == before
        except BaseException as exc:  # noqa: BLE001  # reported to the test's thread
            raised.append(exc)

    thread = threading.Thread(target=command)
    thread.start()
    thread.join(timeout=10)
    assert raised == []


def test_entering_says_at_once_what_a_dead_command_left_and_stops_it_within_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = tmp_path / "invocations"
    records.mkdir()
    killed = _token("killed")
    stubborn = _sleeper(killed, ignore_term=True)
    dead = _dead_pid()
    gone = {"token": killed, "pid": dead, "pid-start": 1, "command": "run", "run": None}
    (records / "killed.json").write_text(json.dumps(gone))
    time.sleep(0.3)
    raw = held_stdout(monkeypatch)
    start = time.monotonic()
    with stopping.Invocation("run", state=tmp_path, grace_s=0.3):
        assert time.monotonic() - start < 2.9
        assert raw.getvalue().decode() == (
            f"fedsketch: stopped 2 processes left by `fedsketch run` (pid {dead}), which ended without stopping them\n"
        )
    assert stubborn.wait(timeout=1) == -signal.SIGKILL


def test_the_commands_record_names_the_run_it_is_in(tmp_path: Path) -> None:
    """So that the next command marks the run a SIGKILL ended (:func:`stopping.reap`)."""
    exp = _experiment(tmp_path / "runs")
    named = []

    def execute(cfg: RunConfig, path: Path) -> int:
        named.append(json.loads(invocation.entry.read_text(encoding="utf-8"))["run"])
        return _rounds({})(cfg, path)

    with stopping.Invocation("run", state=tmp_path) as invocation:
        runner.run_all(exp.runs, execute)
    assert named == [[str(runlog.run_dir(cfg)), 4] for cfg in exp.runs]


def test_a_second_signal_exits_at_once_with_the_first_ones_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exits: list[int] = []

    def exit_now(code: int) -> None:  # os._exit would end the tests' own process
        exits.append(code)
        raise SystemExit(code)

    monkeypatch.setattr(os, "_exit", exit_now)
    with stopping.Invocation("run", state=tmp_path) as invocation:
        with pytest.raises(stopping.Interrupted):
            invocation._on_stop(signal.SIGTERM, None)
        with pytest.raises(SystemExit):
            invocation._on_stop(signal.SIGINT, None)
    assert exits == [143]


def test_reaping_passes_over_a_half_written_record_and_leaves_finished_or_marked_runs_as_they_are(
    tmp_path: Path,
) -> None:
    records = tmp_path / "invocations"
    records.mkdir()
    (records / "a-half.json").write_text('{"token": "fedsketch-', encoding="utf-8")  # killed while writing it
    runs = {}
    for name, rounds in (("finished", 4), ("marked", 2), ("open", 2)):
        runs[name] = tmp_path / name
        runs[name].mkdir()
        for rnd in range(1, rounds + 1):
            runlog.append_metrics(runs[name], {"round": rnd})
    runlog.write_status(runs["marked"], "skipped", "SIGUSR1", 4)
    for name, path in runs.items():
        gone = {
            "token": _token(name),
            "pid": _dead_pid(),
            "pid-start": 1,
            "command": "run",
            "run": [str(path), 4],
        }
        (records / f"b-{name}.json").write_text(json.dumps(gone), encoding="utf-8")
    lines = stopping.reap(records, grace_s=0.1)
    assert len(lines) == 1 and lines[0].endswith(f"; its run {runs['open']} is marked interrupted")
    assert runlog.read_status(runs["finished"]) is None
    assert runlog.status_note(runlog.read_status(runs["marked"]) or {}) == "skipped (SIGUSR1) after round 2 of 4"
    assert not list(records.iterdir())  # every record read is gone, the half-written one too


def test_a_token_removed_from_the_environment_inside_the_command_is_no_error_when_it_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(stopping.TOKEN_VAR, raising=False)
    with stopping.Invocation("run", state=tmp_path):
        del os.environ[stopping.TOKEN_VAR]
    assert stopping.TOKEN_VAR not in os.environ
