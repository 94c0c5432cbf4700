"""The server learning-rate schedule, by its documented end points (``fedsketch/server/schedule.py``).

Every schedule starts at ``lr`` in round 1. In the last round of ``num-rounds``:
``constant`` is still ``lr``, ``linear`` has come down to ``lr / num-rounds``, and
``cosine`` is half a cosine from ``lr`` towards 0, one step short of it:
``lr (1 - cos(pi / n)) / 2``, above 0. There is no warm-up. The rates a run's
clients receive are these, round by round.
"""

from __future__ import annotations

import itertools
import math
from typing import cast

import pytest
from flwr.app import Message
from flwr.serverapp import Grid

from bridge.flower import task_identity
from fedsketch import wire
from fedsketch.config import RunConfig
from fedsketch.server.schedule import SCHEDULES, lr_at
from strategies.server_app import build_strategy
from tests.federation import TestGrid

ROUNDS = (1, 2, 3, 7, 250)
BASE = 0.3


def last_rate(schedule: str, n: int) -> float:
    """The documented rate of round ``n`` of ``n``."""
    return {"constant": BASE, "linear": BASE / n, "cosine": BASE * (1.0 - math.cos(math.pi / n)) / 2}[schedule]


@pytest.mark.parametrize("n", ROUNDS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_first_round_gives_the_base_rate_and_the_last_the_documented_one(schedule: str, n: int) -> None:
    assert lr_at(schedule, BASE, 1, n) == BASE
    assert lr_at(schedule, BASE, n, n) == pytest.approx(last_rate(schedule, n), rel=1e-12, abs=0)


@pytest.mark.parametrize("n", ROUNDS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_the_rate_never_rises_and_stays_above_zero(schedule: str, n: int) -> None:
    rates = [lr_at(schedule, BASE, r, n) for r in range(1, n + 1)]
    assert all(later <= earlier for earlier, later in itertools.pairwise(rates))
    assert min(rates) > 0
    if schedule != "constant" and n > 1:
        assert rates[-1] < rates[0]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_a_round_outside_the_run_is_refused(schedule: str) -> None:
    for bad in (0, 6):
        with pytest.raises(ValueError, match=f"round {bad} is outside 1..5"):
            lr_at(schedule, BASE, bad, 5)


def test_the_rates_the_clients_receive_are_the_schedules_round_by_round() -> None:
    cfg = RunConfig.from_mapping(
        {
            "strategy": "fedavg",
            "num-clients": 4,
            "clients-per-round": 2,
            "model-hidden": 8,
            "num-rounds": 4,
            "eval-every": 4,
            "lr": BASE,
            "lr-schedule": "linear",
        }
    )
    seen: dict[int, float] = {}

    def deliver(msg: Message) -> Message:
        config = msg.content.config_records[wire.CONFIG_KEY]
        seen[int(config[wire.ROUND])] = float(config["lr"])  # type: ignore[arg-type]
        return msg

    strat = build_strategy(cfg, None)
    with task_identity():
        strat.start(cast(Grid, TestGrid(cfg.to_mapping(), num_nodes=2, deliver=deliver)))
    assert seen == pytest.approx({1: BASE, 2: 0.75 * BASE, 3: 0.5 * BASE, 4: 0.25 * BASE}, rel=1e-12)


def test_an_unknown_schedule_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown lr schedule 'step'; expected constant, linear or cosine"):
        lr_at("step", BASE, 1, 5)
