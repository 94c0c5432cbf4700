"""Waiting for replies: the poll schedule's properties, and the wait over the in-process federation.

The in-process grid (``experiments/running/inprocess_grid.py``) runs the real ClientApp when a request is
pushed and hands each reply out from a given pull on; its waits pass on its own clock, so these
tests count pulls and seconds of that clock exactly, and never time the machine.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Message
from flwr.server.superlink.linkstate import LinkStateFactory
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.superlink.federation import NoOpFederationManager
from flwr.superlink.grid import InMemoryGrid

from bridge.flower import task_identity
from bridge.messages import model_record
from fedsketch.config import RunConfig
from strategies import waiting
from strategies.server_app import build_strategy, poll_replies_sooner
from strategies.waiting import DEPLOYMENT, WALL_CLOCK, PollSchedule, delay
from tests.federation import TestGrid

TINY = {
    "num-clients": 4,
    "clients-per-round": 4,
    "model-hidden": 8,
    "k": 20,
    "num-rounds": 2,
    "sketch-rows": 3,
    "sketch-cols": 100,
    "eval-every": 1,
}
EXACT = PollSchedule(first_s=2.0**-6, factor=2.0, cap_s=0.25)  # powers of two: the clock's sums are exact


def pulls_within(schedule: PollSchedule, timeout: float, missing: int = 1) -> int:
    """The pulls a wait of ``timeout`` seconds makes when none of ``missing`` replies ever comes and a pull
    takes no time.

    One pull right after the push, one after each wait, the last at the timeout itself.
    """
    pulls, waited = 1, 0.0
    while waited < timeout:
        waited += delay(schedule, pulls - 1, missing)
        pulls += 1
    return pulls


def _requests(grid: TestGrid) -> list[Message]:
    cfg = RunConfig.from_mapping(TINY)
    strat = build_strategy(cfg, None)
    return list(strat.configure_train(1, model_record(strat.weights.numpy()), ConfigRecord(), grid))


def _grid(**kwargs: object) -> TestGrid:
    return TestGrid(RunConfig.from_mapping(TINY).to_mapping(), num_nodes=2, **kwargs)  # type: ignore[arg-type]


def test_the_schedule_starts_soon_grows_by_its_factor_and_stops_at_its_cap() -> None:
    waits = [delay(DEPLOYMENT, n) for n in range(200)]
    assert waits[0] == DEPLOYMENT.first_s <= 0.02
    assert all(a <= b for a, b in itertools.pairwise(waits))
    assert max(waits) == waits[-1] == DEPLOYMENT.cap_s <= 0.3
    growing = [w for w in waits if w < DEPLOYMENT.cap_s]
    assert all(b == pytest.approx(a * DEPLOYMENT.factor) for a, b in itertools.pairwise(growing))
    assert delay(DEPLOYMENT, 10**9) == DEPLOYMENT.cap_s  # no overflow however long the wait
    assert [delay(EXACT, n) for n in range(6)] == [1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 4]
    assert {delay(PollSchedule(0.005, 1.0, 0.005), n) for n in range(50)} == {0.005}


def test_the_pulls_over_a_timeout_are_bounded_by_the_cap() -> None:
    """A wait with no reply pulls at most once per ``cap_s`` once the schedule has reached it."""
    growing = sum(1 for n in range(100) if delay(DEPLOYMENT, n) < DEPLOYMENT.cap_s)
    for timeout in (0.0, 0.3, 10.0, 600.0):
        pulls = pulls_within(DEPLOYMENT, timeout)
        assert timeout / DEPLOYMENT.cap_s <= pulls <= timeout / DEPLOYMENT.cap_s + growing + 2
    assert pulls_within(EXACT, 2.0) == 13  # 1 + 4 growing waits (15/64 s) + 8 capped ones (the last cut to 1/64 s)


@pytest.mark.parametrize("missing", [1, 200, 1_000, 10_000])
def test_a_deployed_round_names_at_most_ids_per_s_replies_a_second_however_many_are_missing(missing: int) -> None:
    """The cap stays ``cap_s`` up to ``cap_s * ids_per_s`` missing replies, then grows with them."""
    ids_per_s = DEPLOYMENT.ids_per_s
    assert ids_per_s is not None
    cap = DEPLOYMENT.cap_for(missing)
    assert cap == max(DEPLOYMENT.cap_s, missing / ids_per_s)
    assert delay(DEPLOYMENT, 10**6, missing) == cap
    timeout = 600.0
    pulls = pulls_within(DEPLOYMENT, timeout, missing)
    growing = sum(1 for n in range(200) if delay(DEPLOYMENT, n, missing) < cap)
    assert pulls <= timeout / cap + growing + 2
    assert (pulls - growing - 2) * missing / timeout <= ids_per_s  # the capped pulls keep to the bound


def test_the_cap_for_one_missing_reply_is_cap_s_and_without_a_bound_never_grows() -> None:
    assert DEPLOYMENT.cap_for(1) == DEPLOYMENT.cap_s <= 0.05
    assert DEPLOYMENT.cap_for(1_000) == pytest.approx(0.25)
    assert EXACT.cap_for(10**6) == EXACT.cap_s


def test_a_wait_with_many_replies_missing_backs_off_to_the_longer_cap() -> None:
    """A round of 1,000 nodes that sends nothing: the waits grow to 1,000 / ids_per_s, not to cap_s."""
    many = PollSchedule(first_s=2.0**-6, factor=2.0, cap_s=2.0**-4, ids_per_s=1000 / 0.25)
    assert [delay(many, n, 1_000) for n in range(6)] == [1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 4]
    assert [delay(many, n, 1) for n in range(4)] == [1 / 64, 1 / 32, 1 / 16, 1 / 16]


@pytest.mark.parametrize(
    ("first", "factor", "cap"), [(0.0, 1.5, 1.0), (0.5, 1.5, 0.1), (0.01, 0.9, 1.0), (0.01, 1.5, float("inf"))]
)
def test_a_schedule_that_cannot_work_is_refused(first: float, factor: float, cap: float) -> None:
    with pytest.raises(ValueError, match="poll schedule needs"):
        PollSchedule(first, factor, cap)


def test_a_schedule_with_a_bound_that_cannot_work_is_refused() -> None:
    for bad in (0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="ids_per_s"):
            PollSchedule(ids_per_s=bad)


def test_simulation_keeps_its_fixed_interval_and_other_grids_back_off() -> None:
    state = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory())
    sim = InMemoryGrid(state_factory=state)
    poll_replies_sooner(sim, RunConfig().reply_poll_s)
    assert waiting.schedule_for(sim) == PollSchedule(0.005, 1.0, 0.005)  # never a wait beyond reply-poll-s
    assert waiting.schedule_for(_grid()) == DEPLOYMENT


def test_late_replies_are_all_returned_and_the_schedule_restarts_when_replies_come() -> None:
    grid = _grid(late={101: 1, 102: 6})
    with task_identity():
        requests = _requests(grid)
        replies = waiting.send_and_receive(grid, requests, timeout=60.0, schedule=EXACT, clock=grid.clock)
    assert sorted(r.metadata.src_node_id for r in replies) == [101, 102]
    assert not any(r.has_error() for r in replies)
    assert grid.pulls == 6  # the sixth pull brought the last reply; none after it
    # 101's reply came with the first pull: the waits start from first_s again, then grow
    assert grid.time.waits == [1 / 64, 1 / 64, 1 / 32, 1 / 16, 1 / 8]


def test_replies_already_there_take_one_pull_and_no_wait() -> None:
    grid = _grid()
    with task_identity():
        replies = waiting.send_and_receive(grid, _requests(grid), timeout=60.0, clock=grid.clock)
    assert len(replies) == 2 and grid.pulls == 1 and grid.time.waits == []


def test_a_missing_reply_times_out_after_exactly_the_timeout_with_the_others_returned() -> None:
    grid = _grid(late={102: 10**9})
    with task_identity():
        replies = waiting.send_and_receive(grid, _requests(grid), timeout=2.0, schedule=EXACT, clock=grid.clock)
    assert [r.metadata.src_node_id for r in replies] == [101]
    assert grid.time.now_s == 2.0 and sum(grid.time.waits) == 2.0
    assert max(grid.time.waits) == EXACT.cap_s


def test_no_reply_at_all_costs_the_bounded_number_of_pulls() -> None:
    grid = _grid(tamper=lambda requests, replies: [])
    with task_identity():
        assert waiting.send_and_receive(grid, _requests(grid), timeout=2.0, schedule=EXACT, clock=grid.clock) == []
    assert grid.pulls == pulls_within(EXACT, 2.0) and grid.time.now_s == 2.0


def test_on_the_wall_clock_a_timeout_ends_the_wait_with_no_more_pulls_than_the_schedule_allows() -> None:
    grid = _grid(tamper=lambda requests, replies: [])
    with task_identity():
        assert waiting.send_and_receive(grid, _requests(grid), timeout=0.3, clock=WALL_CLOCK) == []
    assert 2 <= grid.pulls <= pulls_within(DEPLOYMENT, 0.3)


def test_a_round_with_a_late_node_counts_every_client_and_pulls_until_its_reply(tmp_path: Path) -> None:
    cfg = RunConfig.from_mapping(TINY)
    grid = _grid(late={102: 4})
    with task_identity():
        build_strategy(cfg, tmp_path).start(grid)  # type: ignore[arg-type]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["clients"], r["timeouts"]) for r in rows] == [(4, 0), (4, 0)]
    assert grid.pulls == 2 * 4


BOUNDED = PollSchedule(first_s=2.0**-6, factor=2.0, cap_s=2.0**-4, ids_per_s=16.0)
"""Its cap doubles from one missing reply to two (1/16 s, then 2/16 s): the waits tell how many were counted."""


def test_a_schedule_takes_any_finite_factor_and_any_positive_bound() -> None:
    with pytest.raises(ValueError, match=r"poll schedule needs a finite factor >= 1; got inf"):
        PollSchedule(factor=float("inf"))
    assert PollSchedule(ids_per_s=0.5).cap_for(1) == 2.0  # a bound under one id a second is a bound too
    with pytest.raises(ValueError, match=r"empty_pulls must be >= 0; got -1"):
        delay(EXACT, -1)


def test_one_missing_reply_is_what_a_delay_and_a_pull_count_assume_unless_told() -> None:
    assert delay(BOUNDED, 10) == delay(BOUNDED, 10, 1) == 1 / 16 < delay(BOUNDED, 10, 2) == 1 / 8
    assert pulls_within(BOUNDED, 2.0) == pulls_within(BOUNDED, 2.0, 1) > pulls_within(BOUNDED, 2.0, 2)


def test_the_first_pull_is_at_the_push_and_the_last_at_the_timeout() -> None:
    assert pulls_within(EXACT, 0.0) == 1  # no time: the pull right after the push, and no wait
    assert pulls_within(EXACT, 1 / 64) == 2  # one wait of first_s reaches the timeout: one more pull
    assert pulls_within(EXACT, 3 / 64) == 3


class _Recording:
    """A grid that records the ids each pull asks for."""

    def __init__(self, grid: TestGrid) -> None:
        self.grid, self.asked, self.sent = grid, [], {}

    def push_messages(self, messages):  # type: ignore[no-untyped-def]
        messages = list(messages)
        ids = self.grid.push_messages(messages)
        self.sent = {m.metadata.dst_node_id: mid for m, mid in zip(messages, ids, strict=True)}
        return ids

    def pull_messages(self, message_ids):  # type: ignore[no-untyped-def]
        self.asked.append(list(message_ids))
        return self.grid.pull_messages(self.asked[-1])


def test_each_pull_asks_for_exactly_the_replies_still_missing_and_no_timeout_waits_for_all() -> None:
    grid = _grid(late={101: 2, 102: 5})
    with task_identity():
        requests = _requests(grid)
        recording = _Recording(grid)
        replies = waiting.send_and_receive(recording, requests, timeout=None, schedule=EXACT, clock=grid.clock)
    ids, by_node = sorted(recording.sent.values()), recording.sent
    assert sorted(r.metadata.src_node_id for r in replies) == [101, 102]
    assert recording.asked == [ids, ids, [by_node[102]], [by_node[102]], [by_node[102]]]


def test_a_wait_counts_every_missing_reply_toward_its_cap() -> None:
    """Two replies missing: the waits grow to 2 / ids_per_s, not to the one-reply cap."""
    grid = _grid(tamper=lambda requests, replies: [])
    with task_identity():
        waiting.send_and_receive(grid, _requests(grid), timeout=1.0, schedule=BOUNDED, clock=grid.clock)
    assert max(grid.time.waits) == 1 / 8


class _SimulationGrid(_Recording, InMemoryGrid):
    """Flower's simulation grid as the wait sees it (its type and interval), replying as ``grid`` does."""

    def __init__(self, grid: TestGrid, interval: float) -> None:  # no LinkState: the replies are grid's
        super().__init__(grid)
        self.pull_interval = interval


def test_without_a_schedule_a_wait_on_the_simulation_grid_keeps_its_interval() -> None:
    grid = _grid(late={102: 4})
    with task_identity():
        requests = _requests(grid)
        waiting.send_and_receive(_SimulationGrid(grid, 0.005), requests, timeout=60.0, clock=grid.clock)
    assert grid.time.waits == [0.005, 0.005, 0.005]
