"""The spare simulation process's side after the fork (:mod:`experiments.flower.spare`), run only there."""

from __future__ import annotations

import ctypes
import json
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn, TextIO

NAME = "fedsketch-sim"
"""The spare's process name (``/proc/PID/comm``, what ``ps`` and ``pgrep`` show); its command line is the command's."""
PR_SET_NAME = 15
Order = dict[str, Any]
"""What a spare is given: the run's settings file, log file, environment and federation."""


def be_the_spare(read_fd: int, write_fd: int, warm_up: Callable[[], None], serve: Callable[[Order], None]) -> NoReturn:
    """The forked child: a session of its own, no output until its run names a log; never returns to the command."""
    code = 1
    try:
        os.close(write_fd)
        os.setsid()
        ctypes.CDLL(None).prctl(PR_SET_NAME, NAME.encode())  # PR_SET_NAME reads no further argument
        quiet = os.open(os.devnull, os.O_RDWR)
        for fd in (1, 2):
            os.dup2(quiet, fd)
        os.close(quiet)
        before = {id(sys.stdout), id(sys.stderr)}
        # one line-buffered stream for both: descriptors 1 and 2 go to one file, /dev/null and then the run's log
        sys.stdout = sys.stderr = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115 -- for the process's life
        _log_to_the_new_stream(before, sys.stdout)
        warm_up()
        line = _read_line(read_fd)
        if line.strip():
            order: Order = json.loads(line)
            log = os.open(order["log_file"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
            serve(order)
        code = 0
    except BaseException:  # noqa: BLE001 -- reported to the run's log (or nowhere before it); never the command's
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _log_to_the_new_stream(before: set[int], stream: TextIO) -> None:
    """Point every logging handler that wrote to the command's ``sys.stdout`` or ``sys.stderr`` (``before``: their
    ids) at ``stream``, this process's own, which its run's log then receives."""
    loggers = [
        logging.getLogger(),
        *(x for x in logging.Logger.manager.loggerDict.values() if isinstance(x, logging.Logger)),
    ]
    for handler in (h for logger in loggers for h in logger.handlers):
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in before:
            handler.setStream(stream)


def _read_line(fd: int) -> str:
    """One line from ``fd``, or what came before its end."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode()
