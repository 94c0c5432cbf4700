"""The launcher's command line: its own options, and the SuperNode's command after ``--``.

``python -m bridge.runtime.launcher [--port 9094] [--poll-s 0.2] [--preload M,...] [--supernode-waits backoff]
-- flower-supernode ...`` (:mod:`bridge.runtime.launcher`). The launcher owns the SuperNode's
``--isolation``, ``--host`` and ``--port``: process isolation, and its Runtime API on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bridge.runtime.supernode_waits import check_choice

# What fedsketch's ClientApp imports from outside the project: loaded once, shared by every child.
DEFAULT_PRELOAD = (
    "numpy",
    "torch",
    "flwr.supernode.runtime.run_clientapp",
    "flwr.clientapp",
    "flwr.client.mod",
    "flwr.compat.common.recorddict_compat",
)
DEFAULT_PORT = 9094  # flower-supernode's default Runtime API port
OWNED_FLAGS = ("--isolation", "--host", "--port")  # the launcher sets these on the SuperNode


@dataclass(frozen=True)
class LauncherOptions:
    """How the launcher reaches its SuperNode and what it loads before the first fork."""

    port: int = DEFAULT_PORT
    poll_s: float = 0.2
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    supernode_waits: str = "backoff"  # supernode_waits.CHOICES: "flower" keeps Flower's 3 s idle wait

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ValueError(f"--port must be a TCP port (1-65535); got {self.port}")
        if not 0.01 <= self.poll_s <= 60:
            raise ValueError(f"--poll-s must be between 0.01 and 60 seconds; got {self.poll_s}")
        check_choice(self.supernode_waits)

    @property
    def runtime_address(self) -> str:
        """The SuperNode's Runtime API, on loopback only: it hands out tasks to whoever asks."""
        return f"127.0.0.1:{self.port}"


def supernode_argv(supernode: Sequence[str], options: LauncherOptions) -> list[str]:
    """The SuperNode's command line, with process isolation and its Runtime API on ``options.port``.

    Raises
    ------
    ValueError
        If the command is not ``flower-supernode ...``, or it sets a flag the launcher owns.
    """
    if not supernode or Path(supernode[0]).name != "flower-supernode":
        raise ValueError("give the SuperNode's command after '--': -- flower-supernode --superlink HOST:PORT ...")
    owned = [arg for arg in supernode if arg.split("=")[0] in OWNED_FLAGS]
    if owned:
        raise ValueError(f"the launcher sets {', '.join(OWNED_FLAGS)} on the SuperNode itself; remove {owned}")
    return [*supernode, "--isolation", "process", "--host", "127.0.0.1", "--port", str(options.port)]


def parse(argv: Sequence[str]) -> tuple[LauncherOptions, list[str]]:
    """The launcher's options and the SuperNode's command line; a bad one exits 2 with the usage and the reason."""
    parser = argparse.ArgumentParser(
        prog="python -m bridge.runtime.launcher",
        description="Start a Flower SuperNode with a pre-warmed ClientApp launcher (one fork per task).",
        epilog="Everything after '--' is the SuperNode's command; the launcher adds --isolation process "
        "--host 127.0.0.1 --port PORT to it.",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="the SuperNode's Runtime API port")
    parser.add_argument("--poll-s", type=float, default=0.2, help="at most this many seconds between asks for a task")
    parser.add_argument("--preload", default=",".join(DEFAULT_PRELOAD), help="modules to import once, comma-separated")
    parser.add_argument("--supernode-waits", default="backoff", help="backoff (ask soon after a reply) or flower")
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    ns = parser.parse_args(argv[:cut])
    try:
        options = LauncherOptions(ns.port, ns.poll_s, tuple(m for m in ns.preload.split(",") if m), ns.supernode_waits)
        return options, supernode_argv(argv[cut + 1 :], options)
    except ValueError as exc:
        parser.error(str(exc))
