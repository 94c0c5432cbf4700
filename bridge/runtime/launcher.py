"""A device's ClientApp launcher: import once, fork a child per round.

The client of FetchSGD (Rothchild et al., ICML 2020) does milliseconds of work a
round: one gradient and one Count Sketch. Flower's SuperNode (1.41, 1.42), in its default
``--isolation subprocess``, starts a fresh ``flwr-clientapp`` process for every message, which
imports torch and Flower again (most of a round's seconds and memory: docs/deployed-rounds.md).

Started with ``--isolation process``, the SuperNode leaves that launching to a
process of the operator's choice that asks its Runtime API for work
(``AcquireTask``, as ``flower-superexec`` does) and is handed a token per task.
This launcher is that process. It imports Flower, forks the SuperNode (Flower's
own ``flower-supernode`` entry point, sharing those pages), imports torch, numpy
and Flower's ClientApp runtime once, and for every token forks a child that
runs Flower's own :func:`flwr.supernode.runtime.run_clientapp`: the child pulls
the message, installs the run's FAB, loads the ClientApp named in its
``pyproject.toml`` (the same ``clients.client_app:app`` that simulation runs),
replies and exits. A round costs a fork instead of an import.

The child forgets this package (``clients``) before loading the app, so the
run's FAB, not the copy installed on the device, supplies the ClientApp's
code; a FAB already extracted by an earlier task (same SHA-256) is not
extracted again. Runtime dependency installation stays off. The processes are
named ``flower-supernode`` and ``flwr-clientapp`` (``ps -o comm``); they die
with the launcher (a parent-death signal), so a killed launcher leaves no
SuperNode that looks alive and never answers.

It prints ``launcher ready`` once the SuperLink has accepted its SuperNode
(:mod:`bridge.runtime.supernode_child`), ``waiting for the SuperLink at ...`` while the
SuperNode still retries, what may be wrong after a few failed attempts (a plain-text device
against a TLS SuperLink is named: :mod:`bridge.runtime.link_probe`), and, when the SuperNode
exits before that (a key the SuperLink refuses, one it cannot read), what its exit code most
likely means; the launcher then exits with it, so a supervisor (systemd) restarts both. A
SuperNode that exits once it had joined (its SuperLink restarted and no longer knows it, or
refuses it for a while) is started again by the launcher, after a wait that doubles up to a
minute. After a reply, its SuperNode soon asks for the next message
(:mod:`bridge.runtime.supernode_waits`) and it for the next task; a task that the
SuperNode left behind (a message of a run that ended) is ended when the next one comes.

Usage (``docs/deployed-rounds.md``, "A device's cost per round")::

    python -m bridge.runtime.launcher [--port 9094] [--poll-s 0.2] [--supernode-waits backoff] -- flower-supernode ...
"""

from __future__ import annotations

import gc
import importlib
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from bridge.runtime.forked import die_with_parent, limit_malloc_arenas, run_task
from bridge.runtime.joining import KEY_INVALID, Joining, exit_hint
from bridge.runtime.launcher_options import LauncherOptions, parse, supernode_argv
from bridge.runtime.supernode_child import Restarts, SuperNodeChild
from bridge.runtime.supernode_waits import Backoff

if TYPE_CHECKING:
    from flwr.supercore.runtime import RuntimeHttpClient

__all__ = ["Launcher", "LauncherOptions", "main", "preload", "supernode_argv"]  # the options live beside

STOP_GRACE_S = 10.0
STALE_CHECK_S = 1.0  # while a task runs, how often to ask whether the SuperNode has moved on to another


def preload(modules: Sequence[str]) -> None:
    """Import ``modules`` now, then move every object to the GC's permanent generation.

    Frozen objects are never scanned by the collector, so a child's collections
    do not write to (and copy) the pages it shares with the launcher.
    """
    for name in modules:
        importlib.import_module(name)
    gc.collect()
    gc.freeze()


class Launcher:
    """The SuperNode child, the task children, and the loop that hands tokens to forks."""

    def __init__(self, options: LauncherOptions, command: list[str]) -> None:
        self.options = options
        self.node = SuperNodeChild(command, options.supernode_waits == "backoff", options.port, _fork)
        self.restarts = Restarts()
        self.tasks: set[int] = set()
        self.stopping = False
        self._asked = 0.0  # when the launcher last asked the SuperNode for a task (monotonic clock)

    @property
    def returncode(self) -> int | None:
        """The SuperNode's exit code, once it has ended."""
        return self.node.returncode

    def supernode_alive(self) -> bool:
        """Whether the SuperNode still runs."""
        return self.node.alive()

    def waiting(self) -> bool:
        """Neither stopped by a signal nor left without its SuperNode."""
        return not self.stopping and self.supernode_alive()

    def serve(self) -> int:
        """Fork a child per task (asking 10 ms after one starts or ends, then backing off to ``poll_s``); start the
        SuperNode again whenever it exits (:meth:`rejoin`)."""
        client = self._runtime_client()
        backoff, wait = Backoff(first=0.01, cap=self.options.poll_s), self.options.poll_s
        try:
            while not self.stopping:
                if not self.supernode_alive():
                    if not self.rejoin():
                        break
                    wait = backoff.first
                    continue
                if self.tasks and not self._reap():  # a task just ended: its reply is out, the next message comes soon
                    wait = backoff.first
                if self._ask_now() and (token := self._acquire(client)) is not None:
                    self._end_stale_tasks()
                    self.tasks.add(_fork(run_task, token, self.options.runtime_address, on_parent_death=signal.SIGKILL))
                    wait = backoff.first
                    continue
                time.sleep(wait)
                wait = backoff.after(wait)
        finally:
            client.close()
            self.stop()
        return abs(self.returncode or 0)

    def rejoin(self) -> bool:
        """Start the SuperNode again after it exited (its SuperLink restarted, refused it, or it gave up), after a
        wait that doubles on each try; ``False`` when stopped meanwhile or the node's key cannot be read."""
        self._end_tasks()  # they talked to the SuperNode that is gone
        wait, superlink = self.restarts.next(), self.node.superlink
        print(
            f"launcher: the SuperNode exited with code {self.returncode}; starting it again in {wait:.0f} s to "
            f"rejoin the SuperLink at {superlink}",
            flush=True,
        )
        deadline = time.monotonic() + wait
        while not self.stopping and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.stopping:
            return False
        self.node.start()
        joining = self.node.join(self.waiting)
        if joining.node is None:
            hint = exit_hint(joining, superlink)
            if hint:
                print(
                    f"launcher: the SuperNode gave up with Flower's exit code {joining.flower_exit}: {hint}", flush=True
                )
            return joining.flower_exit != KEY_INVALID
        self.restarts.joined()
        print(f"launcher ready: SuperNode {joining.node} connected to the SuperLink at {superlink} again", flush=True)
        return True

    def _ask_now(self) -> bool:
        """Whether to ask for a task: at once when none runs, at most once a :data:`STALE_CHECK_S` while one does."""
        if self.tasks and time.monotonic() - self._asked < STALE_CHECK_S:
            return False
        self._asked = time.monotonic()
        return True

    def _end_stale_tasks(self) -> None:
        """A new task while one still runs: the SuperNode (one message at a time) gave up on the running one's message.

        Flower 1.42's SuperNode creates a task for a message before it knows that the message's run has ended (a
        SuperLink restarted under a run, say), then drops the message but not the task; that task's ClientApp waits
        for the message's content for up to two hours (Flower's ``PULL_MAX_TIME``). Ended, it stops blocking the
        device's next rounds.
        """
        if self.tasks:
            print(f"launcher: a new task came while task(s) {sorted(self.tasks)} still ran; ending them", flush=True)
            self._end_tasks()

    def stop(self) -> None:
        """SIGTERM the SuperNode and the running tasks; SIGKILL what is left after a grace period."""
        self.stopping = True
        self._end_tasks(include_supernode=True)

    def _end_tasks(self, include_supernode: bool = False) -> None:
        """SIGTERM the running tasks (and the SuperNode); SIGKILL what is left after a grace period."""
        supernode = [self.node.pid] if include_supernode and self.supernode_alive() else []
        pids = [p for p in (*self.tasks, *supernode) if _signal(p, signal.SIGTERM)]
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and ((supernode and self.supernode_alive()) or self._reap()):
            time.sleep(0.1)
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        while supernode and self.supernode_alive():
            time.sleep(0.05)
        self._reap()

    def _runtime_client(self) -> RuntimeHttpClient:
        """One try an ask, no retry invoker (Flower's retries forever): the loop asks again, or ends with the
        SuperNode."""
        from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor
        from flwr.supercore.runtime import RuntimeHttpClient

        return RuntimeHttpClient.from_server_address(
            server_address=self.options.runtime_address,
            insecure=True,
            root_certificates=None,
            interceptors=[RuntimeVersionHttpInterceptor(component_name="SuperExec")],
        )

    def _acquire(self, client: RuntimeHttpClient) -> str | None:
        import httpx
        from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=E0611
        from flwr.supercore.constant import TaskType

        try:
            reply = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP]))
        except httpx.HTTPError:  # the SuperNode is busy or gone: the loop looks again
            return None
        return str(reply.token) if reply.HasField("task") and reply.token else None

    def _reap(self) -> bool:
        """Collect finished task children; whether any is still running."""
        for pid in list(self.tasks):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                self.tasks.discard(pid)
        return bool(self.tasks)


def _fork(target: Callable[..., NoReturn], *args: object, on_parent_death: int = signal.SIGTERM) -> int:
    """Run ``target(*args)`` in a forked child (which must end in ``os._exit``); returns its pid.

    The child gets ``on_parent_death`` when the launcher dies: SIGTERM lets a SuperNode say goodbye to its
    SuperLink; a task has nobody to tell and gets SIGKILL."""
    sys.stdout.flush()
    sys.stderr.flush()
    launcher = os.getpid()
    pid = os.fork()
    if pid == 0:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        die_with_parent(launcher, on_parent_death)  # no SuperNode or task outlives a killed launcher
        target(*args)
    return pid


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except ProcessLookupError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Start the SuperNode, warm up, and serve its tasks; returns the SuperNode's exit code."""
    options, command = parse(sys.argv[1:] if argv is None else argv)
    start = time.perf_counter()
    limit_malloc_arenas(2)
    # numpy's OpenBLAS would start a thread pool at import: fork with no threads running (torch does the math).
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # The SuperNode is a fork too, made once Flower is imported: it shares those pages with us.
    importlib.import_module("flwr.supernode.cli.flower_supernode")
    gc.collect()
    gc.freeze()
    launcher = Launcher(options, command)
    launcher.node.start()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stopper(launcher))
    try:
        preload(options.preload)
    except ImportError as exc:
        launcher.stop()
        sys.exit(f"cannot preload {exc.name!r}: {exc}")
    warm_s, superlink = time.perf_counter() - start, launcher.node.superlink
    joining = launcher.node.join(launcher.waiting)
    if joining.node is None:  # the SuperNode exited (refused, its Runtime API port taken, ...), or we were stopped
        return _stopped_before_ready(launcher, superlink, joining)
    print(
        f"launcher ready: SuperNode {joining.node} connected to the SuperLink at {superlink}; {len(options.preload)} "
        f"modules imported in {warm_s:.1f} s; one fork per ClientApp task from {options.runtime_address}",
        flush=True,
    )
    return launcher.serve()


def _stopped_before_ready(launcher: Launcher, superlink: str, joining: Joining) -> int:
    """Stop everything; say what the way the SuperNode gave up most likely means; our exit code."""
    launcher.stop()
    hint = exit_hint(joining, superlink)
    if hint:
        print(
            f"launcher: the SuperNode gave up with Flower's exit code {joining.flower_exit}: {hint}",
            file=sys.stderr,
            flush=True,
        )
    return abs(launcher.returncode or 0)  # a Flower exit code of 100 or more is Flower's exit 1


def _stopper(launcher: Launcher) -> Callable[[int, FrameType | None], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        launcher.stopping = True

    return handler


if __name__ == "__main__":
    sys.exit(main())
