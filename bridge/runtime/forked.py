"""What runs in the launcher's forks (:mod:`bridge.runtime.launcher`): the SuperNode, and one ClientApp task each.

Each entry point ends in ``os._exit``: a fork never returns into the
launcher's loop, and never runs the exit handlers it inherited. The task runs
Flower's own ``run_clientapp`` (the ClientApp is the FAB's, as in Flower), after
forgetting this package so that the FAB's copy of ``clients`` is imported
rather than the one the launcher started from. The device's rounds compute
FetchSGD's (Rothchild et al., ICML 2020) client update, or any other method's.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from bridge.runtime import object_pulls, supernode_waits
from bridge.runtime.joining import report_joining

OBJECT_RETRY_S = 0.01
"""The SuperNode's first wait before asking again for a part of the server's message not yet at the SuperLink."""


def run_supernode(argv: list[str], report_fd: int | None = None, backoff: bool = False) -> NoReturn:
    """In the forked child: Flower's ``flower-supernode`` entry point, on ``argv``.

    With ``report_fd``, whether the SuperLink accepted the node is written there (:mod:`bridge.runtime.joining`);
    with ``backoff``, the SuperNode asks for its next message soon after a reply (:mod:`bridge.runtime.supernode_waits`)
    and for a message's missing parts after :data:`OBJECT_RETRY_S` (:mod:`bridge.runtime.object_pulls`).
    """
    _name_process("flower-supernode")
    code = 1
    try:
        from flwr.supernode.cli.flower_supernode import flower_supernode

        if report_fd is not None:
            report_joining(report_fd)
        if backoff:
            supernode_waits.install()
            object_pulls.install(object_pulls.SUPERNODE, OBJECT_RETRY_S)
        _one_goodbye()
        sys.argv = argv
        flower_supernode()
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except RuntimeError as exc:
        if "failed to start" not in str(exc):
            traceback.print_exc()
        else:  # Flower's own line above names the address; say what to do, without a traceback
            print(
                f"launcher: {exc} Another process may hold its port: start the device on a free one "
                "(supernode.sh: FEDSKETCH_RUNTIME_PORT; the launcher: --port).",
                file=sys.stderr,
                flush=True,
            )
    except BaseException:  # noqa: BLE001 -- report and exit; never return into the launcher
        traceback.print_exc()
    _exit(code)


def _one_goodbye() -> None:
    """Let the SuperNode's first SIGINT, SIGTERM or SIGQUIT end in its goodbye to the SuperLink, whatever follows.

    Flower's SuperNode (1.41, 1.42) exits gracefully on the first of these signals, which tells the SuperLink
    that it leaves (``DeactivateNode``), and puts back the handlers it found for any later one. Those were
    ``SIG_DFL``: the SIGTERM that the stopping launcher sends right after a Ctrl-C or a ``kill`` of the group
    killed the node before its goodbye, and the SuperLink kept it online until its heartbeat lapsed (up to
    60 s). The handlers it finds are now these: until Flower's exit has begun a signal ends the fork at
    once; after, it is ignored (the launcher SIGKILLs a node still there :data:`bridge.runtime.launcher.STOP_GRACE_S` later).
    """
    from flwr.supercore.exit import add_exit_handler

    leaving: list[bool] = []
    add_exit_handler(lambda: leaving.append(True), run_before_force_exit=True)

    def handler(signum: int, frame: object) -> None:
        if not leaving:
            raise SystemExit(128 + signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT):
        signal.signal(sig, handler)


def run_task(token: str, runtime_address: str) -> NoReturn:
    """In the forked child: run one ClientApp task through Flower's runtime, then exit."""
    _name_process("flwr-clientapp")
    code = 1
    try:
        _forget_package((__package__ or "clients").split(".")[0])
        from flwr.supernode.runtime import run_clientapp as runtime

        if hasattr(runtime, "install_from_fab"):  # Flower 1.41's and 1.42's name; without it, Flower's own behaviour
            runtime.install_from_fab = install_once(runtime.install_from_fab)
        runtime.run_clientapp(
            runtime_address, token, insecure=True, parent_pid=os.getppid(), runtime_dependency_install=False
        )
        code = 0
    except SystemExit as exc:  # run_clientapp ends with flwr_exit, i.e. sys.exit
        code = _exit_code(exc)
    except BaseException:  # noqa: BLE001 -- report and exit; never return into the launcher's loop
        traceback.print_exc()
    _exit(code)


def install_once(install: Callable[..., Path]) -> Callable[..., Path]:
    """Flower's ``install_from_fab``, skipped for a FAB (same SHA-256) that an earlier task installed.

    Flower extracts and verifies the run's FAB on every message (timed in docs/deployed-rounds.md);
    the installed folder's path is kept in ``$FLWR_HOME/launcher/<sha256>``.
    """
    from flwr.supercore.utils import get_flwr_home

    def install_from_fab(fab_file: bytes | Path, install_dir: Path | None = None, skip_prompt: bool = False) -> Path:
        if not isinstance(fab_file, bytes) or install_dir is not None:
            return install(fab_file, install_dir, skip_prompt)
        marker = get_flwr_home() / "launcher" / hashlib.sha256(fab_file).hexdigest()
        if marker.is_file() and (path := Path(marker.read_text(encoding="utf-8"))).is_dir():
            return path
        path = install(fab_file, install_dir, skip_prompt)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(str(path), encoding="utf-8")
        return path

    return install_from_fab


def _exit_code(exc: SystemExit) -> int:
    return exc.code if isinstance(exc.code, int) else int(exc.code is not None)


def _exit(code: int) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


PR_SET_PDEATHSIG = 1  # Linux prctl option: the signal this process gets when its parent dies
PR_SET_NAME = 15  # Linux prctl option: the process's name


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """In a fork of ``parent`` (the launcher): have the kernel send ``sig`` when the launcher dies, even by SIGKILL.

    A SuperNode left behind by a killed launcher would stay registered and never answer, and every later round
    would wait for it (the out-of-memory killer picks the launcher, the largest process on a device). SIGTERM
    lets Flower's SuperNode say goodbye to the SuperLink, which then drops it at once. Linux only; elsewhere a
    no-op. A launcher that died before the call is seen by the parent pid having changed.
    """
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(sig))  # reads no further argument
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


def limit_malloc_arenas(count: int) -> None:
    """Cap glibc's malloc arenas (``M_ARENA_MAX``) for us and every fork.

    Each thread (torch's, Flower's heartbeat) may otherwise get an arena of its
    own, which a round leaves partly used.
    """
    try:
        ctypes.CDLL(None).mallopt(-8, count)  # M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def _name_process(name: str) -> None:
    """Set the process name ``ps`` and ``pgrep`` show (Linux; the kernel keeps 15 characters)."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode())  # reads no further argument
    except (OSError, AttributeError):
        pass


def _forget_package(package: str) -> None:
    """Drop ``package`` from ``sys.modules`` so the FAB's copy of it is imported instead."""
    for name in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[name]
