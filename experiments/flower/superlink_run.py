"""One run through Flower's simulation runtime the way ``flwr run`` runs it: a private SuperLink, then ``flwr run``.

``flwr run`` with the default ``local`` connection starts a detached SuperLink
on fixed ports that outlives the run (Flower 1.41 and 1.42). Instead, each
run here gets its own ``FLWR_HOME``, its own SuperLink on a free loopback port
started in its own process group, and a connection in ``config.toml`` that
points at it; when the run ends (or fails, or is interrupted) the whole process
group is stopped. Flower's logs go to ``flower.log`` in the run's folder, not
to the terminal. ``fedsketch run --runtime superlink`` takes this path; the
default calls the same simulation runtime in one process
(:mod:`experiments.flower.one_process`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from experiments.flower import procs
from experiments.flower.app_files import clientapp_for, staged_app
from experiments.flower.flower_procs import bin_path, flower_env, free_port, stop_group, wait_healthy, watch
from fedsketch.server import runlog

if TYPE_CHECKING:
    from experiments.flower.federation import Federation

CONNECTION = "fedsketch-sim"


def connection_toml(federation: Federation, address: str) -> str:
    """The connection block for ``$FLWR_HOME/config.toml``."""
    return (
        f'[superlink]\ndefault = "{CONNECTION}"\n\n'
        f'[superlink.{CONNECTION}]\naddress = "{address}"\ninsecure = true\n\n'
        f"[superlink.{CONNECTION}.options]\nnum-supernodes = {federation.num_supernodes}\n\n"
        f"[superlink.{CONNECTION}.options.backend.client-resources]\n"
        f"num-cpus = {federation.cpus_per_client}\nnum-gpus = {federation.gpus_per_client}\n"
    )


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
    (flwr_home / "config.toml").write_text(connection_toml(federation, f"127.0.0.1:{port}"), encoding="utf-8")
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
    (:func:`fedsketch.server.runlog.mark_server_done`: everything the run keeps is
    written), Flower's processes are stopped at once rather than left to their
    own teardown. Returns 0 then, else the exit code of ``flwr run``. The app
    is submitted from a copy of its own files (:func:`stage_app`), which for
    the in-process backend names its own ClientApp (:func:`~experiments.flower.app_files.clientapp_for`).
    """
    log_file = work_dir / "flower.log"
    finished = partial(runlog.server_done, work_dir)
    home = work_dir / "flwr-home"
    clientapp = clientapp_for(federation.backend)
    with (
        simulation_superlink(home, federation, log_file, finished) as (env, healthy),
        staged_app(app_dir, work_dir, clientapp) as staged,
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
    return watch(cmd, env, log_file, finished, poll)
