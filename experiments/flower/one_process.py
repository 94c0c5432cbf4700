"""One run through Flower's simulation runtime in one process: no SuperLink, SuperExec or ``flwr run``.

``flwr run`` against a SuperLink (:func:`experiments.flower.superlink_run.flwr_run`)
starts four Flower processes before round 1: the SuperLink, its SuperExec,
``flwr run`` and the simulation process. Only the last does the work: it calls
Flower's simulation runtime, which runs the ServerApp on one thread and the simulation
engine (link state, message routing, the backend's workers) on others. This
module is that last process alone: it calls the runtime as Flower's simulation process
does (:mod:`bridge.simulation`, which holds the calls to Flower's internals). The round is Flower's, message for
message; what goes is the gRPC hop that submits the run and streams its logs,
the FAB, and three processes (docs/simulation.md, "Start-up" and "Memory").

Run as ``python -m experiments.flower.one_process APP_DIR RUN_CONFIG
NUM_SUPERNODES NUM_CPUS NUM_GPUS BACKEND``; its logs go to standard output.
``fedsketch run`` starts its first run's process earlier, forked from itself
(:func:`start_spare`, :mod:`experiments.flower.spare`).
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from bridge import simulation
from experiments.flower import procs, spare
from experiments.flower.app_files import clientapp_for
from experiments.flower.flower_procs import Child, flower_env, follow, watch
from fedsketch.server import runlog

if TYPE_CHECKING:
    from experiments.flower.federation import Federation

MALLOC = {
    "MALLOC_ARENA_MAX": (2, -8),
    "MALLOC_MMAP_THRESHOLD_": (64 << 20, -3),
    "MALLOC_TRIM_THRESHOLD_": (64 << 30, -1),
    "MALLOC_TOP_PAD_": (64 << 20, -2),
}
"""glibc's malloc settings for the process, each unless the environment sets it (docs/simulation.md, "Memory"),
as ``name: (value, mallopt's parameter for it)``, the parameter for a process already started (the spare):

- two arenas: each thread that allocates (the ServerApp's, the engine's workers) otherwise gets one of
  its own, which keeps what a round's replies freed (the peer job's FedAvg: 872 against 797 MB);
- arrays up to 64 MiB from the heap, never trimmed, 64 MiB added to each growth: what a round's replies
  freed serves the next round's, instead of fresh pages each round (the paper's shape on a GPU, 10 MB
  a client: 6.2 million page faults against 1.6 million, 0.82 against 0.52 s a round)."""
SPARE_LOG = "fedsketch: this simulation process started before its run and imported Flower and the app meanwhile"
"""The first line a spare writes to its run's log (:mod:`experiments.flower.spare`)."""


def process_env(app_dir: Path, flwr_home: Path) -> dict[str, str]:
    """The simulation process's environment: Flower's (:func:`flower_env`), the app first on the path,
    and :data:`MALLOC`'s settings the environment does not set."""
    env = flower_env(flwr_home)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(app_dir), env.get("PYTHONPATH")) if p)
    for name, (value, _) in MALLOC.items():
        env.setdefault(name, str(value))
    return env


def one_process_run(
    app_dir: Path,
    run_config: Path,
    federation: Federation,
    work_dir: Path,
    poll: Callable[[], None] | None = None,
) -> int:
    """:mod:`experiments.flower.one_process` in its own process group, watched as :func:`flwr_run` watches ``flwr run``.

    What it started (Ray's services, with ``backend = "ray"``) carries its
    private ``FLWR_HOME`` and is stopped with it.
    """
    home = work_dir / "flwr-home"
    log = work_dir / "flower.log"
    finished = partial(runlog.server_done, work_dir)
    try:
        child = _from_spare(app_dir, run_config, federation, log, home)
        if child is not None:
            return follow(child, log, finished, poll)
        return watch(_command(app_dir, run_config, federation), process_env(app_dir, home), log, finished, poll)
    finally:
        procs.stop_carrying("FLWR_HOME", str(home), 0.0 if finished() else 5.0)


def _from_spare(app_dir: Path, run_config: Path, federation: Federation, log: Path, home: Path) -> Child | None:
    """The waiting spare, given this run, if one was started for this app and backend and takes it; else ``None``."""
    ready = spare.take(spare_key(app_dir, federation.backend))
    if ready is None:
        return None
    order = {
        "run_config": str(run_config),
        "log_file": str(log),
        "environ": process_env(app_dir, home),  # what a process started for the run would get
        "nodes": str(federation.num_supernodes),
        "cpus": str(federation.cpus_per_client),
        "gpus": str(federation.gpus_per_client),
    }
    try:
        return ready.give(order)
    except OSError:  # it ended between the look and the order: start one afresh
        ready.release()
        return None


def _command(app_dir: Path, run_config: Path, federation: Federation) -> list[str]:
    return [
        sys.executable,
        "-m",
        "experiments.flower.one_process",
        str(app_dir),
        str(run_config),
        str(federation.num_supernodes),
        str(federation.cpus_per_client),
        str(federation.gpus_per_client),
        federation.backend,
    ]


def spare_key(app_dir: Path, backend: str) -> list[str]:
    """What a run must share with a spare to take it: the app, and the backend whose ClientApp it imported."""
    return [str(app_dir), backend]


def start_spare(app_dir: Path, backend: str) -> None:
    """Fork a spare simulation process for ``backend``'s runs of ``app_dir`` (:mod:`experiments.flower.spare`)."""
    import torch  # noqa: F401 -- before the fork: its pages stay shared with the spare

    spare.start(spare_key(app_dir, backend), partial(_warm_up, app_dir, backend), partial(_serve, app_dir, backend))


def _warm_up(app_dir: Path, backend: str) -> None:
    """In the spare: this process's environment as :func:`process_env` gives a started one, and the imports
    :func:`simulate` will make (Flower's simulation runtime, the ServerApp's and ClientApp's modules)."""
    set_malloc(os.environ)
    os.environ.update(process_env(app_dir, Path(tempfile.gettempdir())))  # the run's own FLWR_HOME comes with it
    sys.path.insert(0, str(app_dir))
    simulation.preload()
    for component in simulation.components(app_dir, clientapp_for(backend)):
        importlib.import_module(component.split(":")[0])


def set_malloc(environ: Mapping[str, str]) -> None:
    """:data:`MALLOC`'s settings that ``environ`` does not set, through ``mallopt``: glibc read the variables
    as this process started, before it was a simulation process. ``mallopt`` takes a C ``int``: a value past it
    is given as -1, which glibc reads unsigned, the largest (64 GiB of trim threshold and that: never trimmed)."""
    libc = ctypes.CDLL(None)
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    for name, (value, param) in MALLOC.items():
        if name not in environ:
            libc.mallopt(param, value if value < 2**31 else -1)


def _serve(app_dir: Path, backend: str, order: spare.Order) -> None:
    """In the spare: the run it was given, as :func:`main` runs one (its standard output is line-buffered)."""
    os.environ.update(order["environ"])
    print(SPARE_LOG)
    args = [str(app_dir), order["run_config"], order["nodes"], order["cpus"], order["gpus"], backend]
    if main(args) != 0:
        raise ValueError(f"a spare was given a run it cannot read: {args}")


USAGE = "usage: python -m experiments.flower.one_process APP_DIR RUN_CONFIG NUM_SUPERNODES NUM_CPUS NUM_GPUS BACKEND"


def main(argv: list[str]) -> int:
    """Run one run from the command line; ``-h`` prints the usage, bad arguments exit 2 with it."""
    if argv[:1] in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    try:
        app_dir, run_config, nodes, cpus, gpus, backend = argv
        counts = int(nodes), int(cpus), float(gpus)
    except ValueError:
        print(f"{USAGE}\n(six arguments; NUM_SUPERNODES and NUM_CPUS integers, NUM_GPUS a number)", file=sys.stderr)
        return 2
    simulation.simulate(Path(app_dir), Path(run_config), *counts, clientapp_for(backend))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
