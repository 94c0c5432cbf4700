"""How a fedsketch run reaches Flower's simulation runtime: which runtime runs the federation it simulates.

Two runtimes run the same ServerApp and ClientApp through Flower's simulation
runtime, message for message (``tests/bridge/runtime/test_simulation_backend.py`` compares
their runs to the last byte):

- ``process`` (the default): the runtime called in one process,
  :mod:`experiments.flower.one_process`;
- ``superlink``: a private SuperLink and ``flwr run``, as ``flwr run .``
  runs the app, :mod:`experiments.flower.superlink_run`.

Either way the run's process group is stopped when the run ends, fails or is
interrupted, and Flower's logs go to ``flower.log`` in the run's folder.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from experiments.flower.federation import Federation, on_public_flower
from experiments.flower.one_process import one_process_run
from experiments.flower.superlink_run import flwr_run


def simulate(
    app_dir: Path,
    run_config: Path,
    federation: Federation,
    work_dir: Path,
    poll: Callable[[], None] | None = None,
) -> int:
    """Run one run through Flower's simulation runtime, the way ``federation.runtime`` names, in ``work_dir``
    (the run's folder, as :func:`experiments.running.runner.prepare` made it).

    ``poll`` is called about twice a second while the run goes on (progress).
    Returns 0 once the ServerApp has marked the run done in ``work_dir``, else
    the exit code of what ran it. Flower's logs go to ``work_dir/flower.log``.
    """
    federation = on_public_flower(federation)
    if federation.runtime == "superlink":
        return flwr_run(app_dir, run_config, federation, work_dir, poll)
    return one_process_run(app_dir, run_config, federation, work_dir, poll)
