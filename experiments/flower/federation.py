"""The federation a fedsketch run simulates: how many nodes, each node's CPUs and GPU share, and what runs its ClientApp calls.

Plain values, importable without Flower or torch: a command's plan
(:mod:`experiments.running.command_plan`) holds one, and
:mod:`experiments.flower.launch` hands it to the runtime that runs it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

BACKENDS = ("inprocess", "ray")
"""What can run a simulation's ClientApp calls (:class:`Federation`'s ``backend``)."""
RUNTIMES = ("process", "superlink")
"""How a run reaches Flower's simulation runtime (:class:`Federation`'s ``runtime``)."""


@dataclass(frozen=True)
class Federation:
    """The simulated federation's resources, and what runs its ClientApp calls.

    ``backend`` is ``"inprocess"`` (the simulation process runs them on
    Flower's worker threads, :mod:`bridge.runtime.simulation_backend`) or ``"ray"``
    (Flower's own backend: Ray actors, on this machine or a Ray cluster).
    ``runtime`` is ``"process"`` (Flower's simulation runtime called in one
    process, :mod:`experiments.flower.one_process`) or ``"superlink"`` (a
    private SuperLink and ``flwr run``, :func:`experiments.flower.superlink_run.flwr_run`).
    """

    num_supernodes: int = 2
    cpus_per_client: int = 1
    gpus_per_client: float = 0.0
    backend: str = "inprocess"
    runtime: str = "process"

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}")
        if self.runtime not in RUNTIMES:
            raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}; got {self.runtime!r}")


def on_public_flower(federation: Federation) -> Federation:
    """``federation`` as it runs where fedsketch may not use Flower's internals (:func:`bridge.flower.internals`):
    through ``flwr run`` and a SuperLink (``superlink``) on Flower's Ray backend; unchanged where it may."""
    from bridge import flower

    if flower.internals():
        return federation
    return replace(federation, runtime="superlink", backend="ray")


def cpus_per_node(num_supernodes: int, cores: int | None = None) -> int:
    """Each simulated node's CPUs (Ray's ``num-cpus`` per ClientApp worker): the machine's cores split evenly.

    Flower's Ray backend starts as many ClientApp workers as the machine's
    CPUs hold at ``num-cpus`` each, whatever the number of nodes, and a node's
    message runs on one worker at a time. At one CPU each, every core beyond
    the number of nodes starts a worker that idles or, taking a later round's
    message, loads its own copy of torch, the ClientApp and the data. Split
    evenly, there is one worker per node (fewer when nodes outnumber cores).
    One worker per node uses less memory at the same speed (measured in
    docs/changelog.md).
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
        return min(1.0, visible_gpus / num_supernodes)
    if requested < 0:
        raise ValueError(f"--gpus-per-node must be >= 0; got {requested}")
    if requested > 0 and visible_gpus == 0:
        raise ValueError(f"--gpus-per-node {requested} asks for a GPU share, but no CUDA GPU is visible here")
    return requested


def check_device(device: str, federation: Federation) -> None:
    """Refuse a ``device`` setting that the Ray backend's ClientApp workers cannot have.

    Ray gives each worker its GPU share by setting ``CUDA_VISIBLE_DEVICES`` to the GPU it placed the worker on
    (to nothing for a share of 0), so a worker sees that GPU alone, as ``cuda:0``. The in-process backend runs
    every client in the simulation process, which sees what the command sees.

    Raises
    ------
    ValueError
        For ``cuda:N`` with N > 0, or a CUDA device with no GPU share, under the Ray backend.
    """
    if federation.backend != "ray" or not device.startswith("cuda"):
        return
    if federation.gpus_per_client == 0:
        raise ValueError(
            f"setting 'device' is {device!r} but the Ray backend's workers get no GPU share (--gpus-per-node 0), "
            "and Ray hides every GPU from them; give them a share or use device = 'auto'"
        )
    if device not in ("cuda", "cuda:0"):
        raise ValueError(
            f"setting 'device' is {device!r} but under the Ray backend each ClientApp worker sees only the GPU Ray "
            "placed it on, as cuda:0; choose the GPUs with CUDA_VISIBLE_DEVICES on the command and set "
            "device = 'cuda'"
        )
