"""Run one fedsketch run through Flower's simulation runtime, and clean up.

``flwr run`` with the default ``local`` connection starts a detached SuperLink
on fixed ports that outlives the run (Flower 1.41 and 1.42). Instead, each
run here gets its own ``FLWR_HOME``, its own SuperLink on a free loopback port
started in its own process group, and a connection in ``config.toml`` that
points at it; when the run ends (or fails, or is interrupted) the whole process
group is stopped. Flower's logs go to ``flower.log`` in the run's folder, not
to the terminal.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from experiments.flower import procs
from experiments.flower.flower_procs import bin_path, flower_env, free_port, stop_group, wait_healthy
from fedsketch import runlog

CONNECTION = "fedsketch-sim"
BACKENDS = ("inprocess", "ray")
"""What can run a simulation's ClientApp calls (:class:`Federation`'s ``backend``)."""
INPROCESS_CLIENTAPP = "clients.runtime.inprocess_app:app"
"""The ClientApp component an in-process simulation is staged with: importing it installs the backend."""
COMPONENT = re.compile(r'^clientapp = "[^"]*"$', re.MULTILINE)
"""The ClientApp's line in the app's ``[tool.flwr.app.components]``."""


@dataclass(frozen=True)
class Federation:
    """The simulated federation's resources, and what runs its ClientApp calls.

    ``backend`` is ``"inprocess"`` (the simulation process runs them on
    Flower's worker threads, :mod:`clients.runtime.simulation_backend`) or ``"ray"``
    (Flower's own backend: Ray actors, on this machine or a Ray cluster).
    """

    num_supernodes: int = 2
    cpus_per_client: int = 1
    gpus_per_client: float = 0.0
    backend: str = "inprocess"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}")

    def toml(self, address: str) -> str:
        """The connection block for ``$FLWR_HOME/config.toml``."""
        return (
            f'[superlink]\ndefault = "{CONNECTION}"\n\n'
            f'[superlink.{CONNECTION}]\naddress = "{address}"\ninsecure = true\n\n'
            f"[superlink.{CONNECTION}.options]\nnum-supernodes = {self.num_supernodes}\n\n"
            f"[superlink.{CONNECTION}.options.backend.client-resources]\n"
            f"num-cpus = {self.cpus_per_client}\nnum-gpus = {self.gpus_per_client}\n"
        )


def cpus_per_node(num_supernodes: int, cores: int | None = None) -> int:
    """Each simulated node's CPUs (Ray's ``num-cpus`` per ClientApp worker): the machine's cores split evenly.

    Flower's Ray backend starts as many ClientApp workers as the machine's
    CPUs hold at ``num-cpus`` each, whatever the number of nodes, and a node's
    message runs on one worker at a time. At one CPU each, every core beyond
    the number of nodes starts a worker that idles or, taking a later round's
    message, loads its own copy of torch, the ClientApp and the data. Split
    evenly, there is one worker per node (fewer when nodes outnumber cores).
    Measured on a 2-core machine with one node: 2,883 MB for the whole tree
    against 2,991 MB with two workers, at the same speed (docs/changelog.md).
    Ray 2.55 leaves a worker's thread count to torch (all cores).
    """
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    return max(1, cores // num_supernodes)


def default_backend(environ: Mapping[str, str] | None = None) -> str:
    """``ray`` when ``RAY_ADDRESS`` names a Ray cluster to join (a run over several machines), else ``inprocess``."""
    return "ray" if (os.environ if environ is None else environ).get("RAY_ADDRESS") else "inprocess"


def gpus_per_node(num_supernodes: int, requested: float | None, visible_gpus: int) -> float:
    """Each simulated node's share of the GPUs (Ray's ``num-gpus`` per ClientApp worker).

    Ray hides every GPU from a worker that asks for none (it sets
    ``CUDA_VISIBLE_DEVICES`` empty), so on a GPU machine a share of 0 would
    quietly train every client on the CPU. Unless told otherwise, the nodes
    split the visible GPUs evenly: with one GPU and 4 nodes, 0.25 each, and all
    four nodes' workers share the one GPU.

    Raises
    ------
    ValueError
        If ``requested`` is negative, or positive with no GPU visible (Ray would
        wait forever for a GPU to place the workers on).
    """
    if requested is None:
        return 0.0 if visible_gpus == 0 else min(1.0, visible_gpus / num_supernodes)
    if requested < 0:
        raise ValueError(f"--gpus-per-node must be >= 0; got {requested}")
    if requested > 0 and visible_gpus == 0:
        raise ValueError(f"--gpus-per-node {requested} asks for a GPU share, but no CUDA GPU is visible here")
    return requested


def stage_app(app_dir: Path, dest: Path, clientapp: str | None = None) -> Path:
    """The files of ``app_dir`` that Flower puts in the app's FAB, copied to ``dest`` (emptied first);
    ``clientapp``: the ClientApp component the copy names instead of the app's own.

    ``flwr run DIR`` reads every file below DIR before it drops those that
    ``.gitignore`` and its own rules exclude (``collect_files`` in
    ``flwr/cli/utils.py``): with the virtual environment inside the project
    folder, as the README's set-up makes it, 44,000 files and 2.1 s on a 2-core
    machine before every run. This walk skips the folders ``.gitignore``
    excludes, then applies Flower's own filter, so the FAB holds the same files.
    Where Flower's filter cannot be imported, ``app_dir`` itself is returned.

    Raises
    ------
    ValueError
        If ``dest`` is ``app_dir`` or holds it (emptying it would delete the app).
    """
    if app_dir.resolve().is_relative_to(dest.resolve()):
        raise ValueError(f"cannot stage the app {app_dir} into {dest}: it would be deleted first")
    try:
        from flwr.cli.utils import build_pathspec, filter_paths_for_publish, load_gitignore_patterns
    except ImportError:  # a Flower without these helpers: let `flwr run` walk the folder itself
        return app_dir
    ignored = build_pathspec(load_gitignore_patterns(app_dir / ".gitignore"))
    files: dict[str, Path] = {}
    for folder, dirs, names in os.walk(app_dir, followlinks=False):
        rel = Path(folder).relative_to(app_dir)
        dirs[:] = [d for d in dirs if not ignored.match_file(f"{(rel / d).as_posix()}/")]
        for name in names:
            path = Path(folder) / name
            if not path.is_symlink():
                files[(rel / name).as_posix()] = path
    shutil.rmtree(dest, ignore_errors=True)
    for rel_path, source in filter_paths_for_publish(files).items():
        target = dest / rel_path
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(source, bytes):
            target.write_bytes(source)
        else:
            shutil.copyfile(source, target)
    if clientapp is not None:
        pyproject = dest / "pyproject.toml"
        text, found = COMPONENT.subn(f'clientapp = "{clientapp}"', pyproject.read_text(encoding="utf-8"))
        if found != 1:
            raise ValueError(f"{app_dir / 'pyproject.toml'} names no one clientapp component to replace")
        pyproject.write_text(text, encoding="utf-8")
    return dest


@contextmanager
def staged_app(app_dir: Path, clientapp: str | None = None) -> Iterator[Path]:
    """:func:`stage_app` into a temporary folder, deleted on the way out (the FAB is built at submission)."""
    with tempfile.TemporaryDirectory(prefix="fedsketch-app-") as tmp:
        yield stage_app(app_dir, Path(tmp) / "app", clientapp)


@contextmanager
def simulation_superlink(
    flwr_home: Path, federation: Federation, log_file: Path, finished: Callable[[], bool] = lambda: False
) -> Iterator[tuple[dict[str, str], Callable[[], None]]]:
    """A private simulation SuperLink; yields the environment for ``flwr`` commands, and a function that waits
    until it answers (other work can go on while it starts).

    On the way out every process of it is stopped: SIGTERM, then SIGKILL after
    5 s; or SIGKILL at once when ``finished()`` says the run kept all it needs
    (the SuperLink's own shutdown took 0.6 s here, for nothing the run keeps).
    """
    flwr_home.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (flwr_home / "config.toml").write_text(federation.toml(f"127.0.0.1:{port}"), encoding="utf-8")
    env = flower_env(flwr_home)
    cmd = [
        bin_path("flower-superlink"),
        "--insecure",
        "--simulation",
        "--disable-runtime-dependency-installation",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield env, partial(wait_healthy, port, proc, 60.0, log_file)
    finally:  # what runs now, found before the SuperLink goes: Ray's agents lose their parent with it
        seen: procs.Seen = {}
        procs.carrying("FLWR_HOME", str(flwr_home), seen)
        grace_s = 0.0 if finished() else 5.0
        stop_group(proc, grace_s)
        procs.stop_carrying("FLWR_HOME", str(flwr_home), grace_s, seen=seen)


LOGS_GRACE_S = 3.0
"""How long a finished run waits for the ServerApp's last log line to reach ``flower.log``."""


def flwr_run(
    app_dir: Path,
    run_config: Path,
    federation: Federation,
    work_dir: Path,
    poll: Callable[[], None] | None = None,
) -> int:
    """``flwr run APP --run-config FILE --stream`` against a private SuperLink.

    ``poll`` is called about twice a second while the run goes on (progress).
    Once the ServerApp has marked the run done in ``work_dir``
    (:func:`fedsketch.runlog.mark_server_done`: everything the run keeps is
    written), Flower's processes are stopped at once rather than left to their
    own teardown. Returns 0 then, else the exit code of ``flwr run``. The app
    is submitted from a copy of its own files (:func:`stage_app`), which for
    the in-process backend names :data:`INPROCESS_CLIENTAPP` as its ClientApp.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    log_file = work_dir / "flower.log"
    finished = partial(runlog.server_done, work_dir)
    home = work_dir / "flwr-home"
    clientapp = INPROCESS_CLIENTAPP if federation.backend == "inprocess" else None
    with (
        simulation_superlink(home, federation, log_file, finished) as (env, healthy),
        staged_app(app_dir, clientapp) as staged,
    ):
        healthy()  # the app was staged while the SuperLink started
        return _flwr_run(staged, run_config, env, log_file, finished, poll)


def _flwr_run(
    app_dir: Path,
    run_config: Path,
    env: dict[str, str],
    log_file: Path,
    finished: Callable[[], bool],
    poll: Callable[[], None] | None,
) -> int:
    """``flwr run`` of the staged app until it ends or the ServerApp has marked the run done."""
    cmd = [bin_path("flwr"), "run", str(app_dir), CONNECTION, "--stream", "--run-config", str(run_config)]
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    done = False
    try:
        for tick in itertools.count():
            if proc.poll() is not None or done:
                break
            if poll is not None and tick % 5 == 0:
                poll()
            time.sleep(0.1)
            done = finished()
        if done:
            _wait_for_line(log_file, runlog.SERVER_DONE_LOG, LOGS_GRACE_S, proc)
    finally:
        stop_group(proc)
    if poll is not None:
        poll()
    return 0 if done else int(proc.returncode or 0)


def _wait_for_line(log_file: Path, line: str, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    """Until ``line`` is in ``log_file`` (the ServerApp's logs have all been streamed), ``proc`` ends, or a timeout."""
    deadline = time.monotonic() + timeout_s
    needle = line.encode()
    while time.monotonic() < deadline and proc.poll() is None and needle not in log_file.read_bytes():
        time.sleep(0.05)
