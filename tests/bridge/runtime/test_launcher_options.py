"""The launcher's command line (bridge/runtime/launcher_options.py): its options, their bounds, and the SuperNode's
command it completes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bridge.runtime.launcher_options import DEFAULT_PRELOAD, LauncherOptions, parse, supernode_argv

ROOT = Path(__file__).resolve().parents[3]


def test_the_launcher_runs_the_supernode_with_process_isolation_on_its_port() -> None:
    argv = supernode_argv(["flower-supernode", "--insecure", "--superlink", "h:1"], LauncherOptions(port=9200))
    assert argv == [
        "flower-supernode",
        "--insecure",
        "--superlink",
        "h:1",
        "--isolation",
        "process",
        "--host",
        "127.0.0.1",
        "--port",
        "9200",
    ]


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ([], "flower-supernode --superlink"),
        (["flwr-clientapp"], "flower-supernode --superlink"),
        (["flower-supernode", "--port", "9"], "remove ['--port']"),
        (["flower-supernode", "--isolation=subprocess"], "remove ['--isolation=subprocess']"),
    ],
)
def test_a_command_the_launcher_cannot_run_is_refused_with_the_reason(command: list[str], reason: str) -> None:
    with pytest.raises(ValueError, match=reason.replace("[", r"\[").replace("]", r"\]")):
        supernode_argv(command, LauncherOptions())
    done = subprocess.run(
        [sys.executable, "-m", "bridge.runtime.launcher", "--", *command],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and reason in done.stderr and "Traceback" not in done.stderr


def test_bad_launcher_options_are_refused() -> None:
    with pytest.raises(ValueError, match="--poll-s"):
        LauncherOptions(poll_s=0)
    with pytest.raises(ValueError, match="--port"):
        LauncherOptions(port=70000)


def test_the_bounds_of_the_port_and_the_poll_are_allowed_and_no_further() -> None:
    for port, poll_s in ((1, 0.01), (65535, 60.0)):
        assert LauncherOptions(port=port, poll_s=poll_s).runtime_address == f"127.0.0.1:{port}"
    for port in (0, 65536):
        with pytest.raises(ValueError, match=rf"^--port must be a TCP port \(1-65535\); got {port}$"):
            LauncherOptions(port=port)
    for poll_s in (0.0099, 60.01):
        with pytest.raises(ValueError, match=rf"^--poll-s must be between 0.01 and 60 seconds; got {poll_s}$"):
            LauncherOptions(poll_s=poll_s)


def test_a_refused_command_says_exactly_what_to_give() -> None:
    with pytest.raises(ValueError) as missing:
        supernode_argv([], LauncherOptions())
    assert (
        str(missing.value) == "give the SuperNode's command after '--': -- flower-supernode --superlink HOST:PORT ..."
    )
    with pytest.raises(ValueError) as owned:
        supernode_argv(["flower-supernode", "--host=0.0.0.0"], LauncherOptions())
    assert str(owned.value) == (
        "the launcher sets --isolation, --host, --port on the SuperNode itself; remove ['--host=0.0.0.0']"
    )


def test_the_command_line_gives_the_options_and_the_supernodes_command() -> None:
    options, supernode = parse(
        [
            "--port",
            "9300",
            "--poll-s",
            "0.5",
            "--preload",
            "numpy,,torch",
            "--supernode-waits",
            "flower",
            "--",
            "flower-supernode",
            "--insecure",
        ]
    )
    assert options == LauncherOptions(port=9300, poll_s=0.5, preload=("numpy", "torch"), supernode_waits="flower")
    assert supernode == [
        "flower-supernode",
        "--insecure",
        "--isolation",
        "process",
        "--host",
        "127.0.0.1",
        "--port",
        "9300",
    ]
    options, _ = parse(["--", "/usr/bin/flower-supernode"])
    assert options == LauncherOptions() and options.preload == DEFAULT_PRELOAD


def test_a_bad_command_line_exits_2_with_the_usage_and_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as bad:
        parse(["--poll-s", "0", "--", "flower-supernode"])
    assert bad.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m bridge.runtime.launcher [-h] [--port PORT] [--poll-s POLL_S]")
    assert err.endswith("error: --poll-s must be between 0.01 and 60 seconds; got 0.0\n")


def test_the_help_says_what_the_launcher_does_and_adds(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["--help"])
    assert " ".join(capsys.readouterr().out.split()) == (
        "usage: python -m bridge.runtime.launcher [-h] [--port PORT] [--poll-s POLL_S] [--preload PRELOAD] "
        "[--supernode-waits SUPERNODE_WAITS] Start a Flower SuperNode with a pre-warmed ClientApp launcher (one fork "
        "per task). options: -h, --help show this help message and exit --port PORT the SuperNode's Runtime API port "
        "--poll-s POLL_S at most this many seconds between asks for a task --preload PRELOAD modules to import once, "
        "comma-separated --supernode-waits SUPERNODE_WAITS backoff (ask soon after a reply) or flower Everything after "
        "'--' is the SuperNode's command; the launcher adds --isolation process --host 127.0.0.1 --port PORT to it."
    )
