"""The Flower ServerApp: parse the run config once, build the strategy, run it."""

from __future__ import annotations

from logging import INFO, getLogger
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from bridge import flower
from bridge.runtime import object_pulls
from fedsketch.client.state import clear_states
from fedsketch.config import RunConfig
from fedsketch.data.run import load_data
from fedsketch.fit import check_against_model
from fedsketch.model.flat import num_params
from fedsketch.server import runlog
from fedsketch.task import make_model
from strategies.limits import quiet_read_only_views
from strategies.strategy import FedSketchStrategy

log = getLogger("flwr").log  # Flower's own logger: the lines go where Flower's go (flower.log)


def build_strategy(cfg: RunConfig, out_dir: Path | None) -> FedSketchStrategy:
    """The strategy for ``cfg.strategy`` with its model and the server's test set.

    Raises
    ------
    ConfigError
        If a setting does not fit the model (e.g. ``k`` larger than ``d``).
    """
    data = load_data(cfg)
    model = make_model(cfg, data)
    check_against_model(cfg, num_params(model))
    # A gradient covers one local batch; a delta covers the client's data: no more than the largest partition.
    biggest = max(len(idx) for idx in data.client_indices) if cfg.client_update == "delta" else None
    return FedSketchStrategy(cfg, model, data.test_x, data.test_y, out_dir, max_examples=biggest)


def poll_replies_sooner(grid: Grid, interval_s: float) -> None:
    """Set the in-memory simulation grid's sleep between pulls for replies (``reply-poll-s``).

    Flower's simulation grid sleeps ``pull_interval`` (0.1 s) whenever a pull
    finds replies missing, so every exchange ends on average 0.05 s after its
    last reply arrived (docs/simulation.md). A pull is a lookup in the in-process link state,
    so polling sooner costs next to nothing. Deployment grids are left alone.
    """
    if flower.simulation_grid(grid):
        grid.pull_interval = interval_s  # type: ignore[attr-defined]  # the in-memory grid's own


def retry_objects_sooner(grid: Grid, first_s: float) -> None:
    """In a deployment, ask again for a reply's missing parts after ``first_s`` seconds (``object-retry-s``),
    not Flower's 1 s (:mod:`bridge.runtime.object_pulls`); 0, or the simulation's grid, leaves Flower's own."""
    if first_s > 0 and flower.internals() and not flower.simulation_grid(grid):
        object_pulls.install(object_pulls.GRID, first_s)


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Entry point for ``flwr run``."""
    cfg = RunConfig.from_mapping(context.run_config)
    quiet_read_only_views()
    poll_replies_sooner(grid, cfg.reply_poll_s)
    retry_objects_sooner(grid, cfg.object_retry_s)
    out_dir = runlog.run_dir(cfg)
    strategy = build_strategy(cfg, out_dir)
    if cfg.client_state == "disk":  # a fresh run; no earlier run's states left on this disk
        clear_states(cfg)
    strategy.start(grid)
    if cfg.client_state == "disk":  # of no use once the run has ended (and possibly gigabytes)
        clear_states(cfg)
    log(INFO, runlog.SERVER_DONE_LOG)
    runlog.mark_server_done(out_dir, cfg.num_rounds, strategy.broken())
