"""Flower's simulation runtime called in this process, as Flower's own simulation process calls it.

``flwr run`` against a SuperLink starts four processes; the last, the simulation process, calls
``flwr.simulation.run_simulation._run_simulation`` (1.42), which runs the ServerApp on one thread and the
simulation engine on others. :func:`simulate` is that call, with the app's config fused with the run's
overrides as that process fuses them (``get_fused_config_from_dir``); the rest of that process
(its environment, being watched and stopped) is :mod:`experiments.flower.one_process`'s.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from bridge.flower import refuse_without_internals


def overrides(run_config: Path) -> dict[str, Any]:
    """The run's settings file (``run_config.toml``, flat keys), as ``flwr run --run-config`` reads it."""
    with open(run_config, "rb") as f:
        return tomllib.load(f)


def components(app_dir: Path, clientapp: str | None = None) -> tuple[str, str]:
    """The ServerApp and ClientApp components the app's ``pyproject.toml`` names, read as Flower's simulation
    process reads them; ``clientapp`` in place of the app's own where given."""
    refuse_without_internals("Flower's simulation runtime in one process")
    from flwr.common.config import get_project_config

    named = get_project_config(app_dir)["tool"]["flwr"]["app"]["components"]
    return named["serverapp"], clientapp or named["clientapp"]


def simulate(
    app_dir: Path, run_config: Path, num_supernodes: int, num_cpus: int, num_gpus: float, clientapp: str | None
) -> None:
    """Run the app's ServerApp and ClientApp (``clientapp`` in place of the app's) through Flower's simulation
    runtime in this process."""
    refuse_without_internals("Flower's simulation runtime in one process")
    from flwr.app import Context, RecordDict
    from flwr.common.config import get_fused_config_from_dir
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.simulation.run_simulation import _run_simulation
    from flwr.supercore.constant import NOOP_FEDERATION_ID
    from flwr.supercore.run import Run
    from flwr.supercore.task_identity import TaskIdentity
    from flwr.supercore.telemetry import EventType

    serverapp, client = components(app_dir, clientapp)
    run = Run.create_empty(run_id=1)
    run.override_config = overrides(run_config)
    run.primary_task_id = 1
    run.federation_id = NOOP_FEDERATION_ID
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run.run_id, SUPERLINK_NODE_ID
    context = Context(
        run_id=run.run_id,
        node_id=0,
        node_config={},
        state=RecordDict(),
        run_config=get_fused_config_from_dir(app_dir, run.override_config),
    )
    _run_simulation(
        server_app_attr=serverapp,
        client_app_attr=client,
        num_supernodes=num_supernodes,
        backend_config={"client_resources": {"num_cpus": num_cpus, "num_gpus": num_gpus}},
        app_dir=str(app_dir),
        run=run,
        server_app_context=context,
        is_app=True,
        exit_event=EventType.FLWR_SIMULATION_RUN_LEAVE,
    )


def preload() -> None:
    """Import Flower's simulation runtime now (a spare process does, before its run is known)."""
    import importlib

    importlib.import_module("flwr.simulation.run_simulation")
