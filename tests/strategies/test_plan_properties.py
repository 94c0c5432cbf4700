"""Which clients a round samples, across rounds, on the strategy's real sampling path (``strategies/plan.py``).

Each round draws ``clients-per-round`` distinct clients uniformly, from a
generator seeded by the run seed and the round number: the same round gives
the same cohort, different rounds different ones, and over many rounds every
client is sampled at the rate ``m / N``. The bound on the counts is six
standard deviations of a binomial count (far from a flake at any fixed seed)
and still catches sampling from a subset, with repeats, or reusing cohorts.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import cast

from flwr.serverapp import Grid

from fedsketch.config import RunConfig
from strategies import plan
from tests.federation import TestGrid

N, M, ROUNDS = 20, 5, 2000


def cohorts(cfg: RunConfig, rounds: range, nodes: int = 2) -> dict[int, tuple[int, ...]]:
    """Each round's sampled clients (cohort mode: logical ids; node mode: node ids), as the strategy samples them."""
    grid = cast(Grid, TestGrid(cfg.to_mapping(), num_nodes=nodes))
    out = {}
    for rnd in rounds:
        sent, _ = plan.assign(cfg, rnd, grid, {}, stateful=False)
        out[rnd] = tuple(sorted(c for node, cids in sent.items() for c in (cids or [node])))
    return out


def within_rate(counts: Counter[int], population: list[int], rounds: int, per_round: int) -> list[str]:
    """The clients whose sample counts lie more than six binomial standard deviations from ``rounds m / N``."""
    q = per_round / len(population)
    mean, sd = rounds * q, math.sqrt(rounds * q * (1 - q))
    return [
        f"client {c}: {counts[c]} (expected {mean:.0f} +- {6 * sd:.0f})"
        for c in population
        if abs(counts[c] - mean) > 6 * sd
    ]


def test_a_cohort_is_m_distinct_valid_clients() -> None:
    cfg = RunConfig.from_mapping({"num-clients": N, "clients-per-round": M})
    for rnd, cohort in cohorts(cfg, range(1, 200)).items():
        assert len(set(cohort)) == M and all(0 <= c < N for c in cohort), (rnd, cohort)


def test_the_same_round_gives_the_same_cohort_and_different_rounds_different_ones() -> None:
    cfg = RunConfig.from_mapping({"num-clients": N, "clients-per-round": M, "seed": 7})
    first, again = cohorts(cfg, range(1, 61)), cohorts(cfg, range(1, 61), nodes=3)
    assert first == again  # whatever the number of nodes
    assert all(first[r] != first[r + 1] for r in range(1, 60))
    assert len(set(first.values())) >= 55  # of 15,504 possible cohorts; repeats are rare
    other_seed = cohorts(RunConfig.from_mapping({"num-clients": N, "clients-per-round": M, "seed": 8}), range(1, 61))
    assert sum(first[r] == other_seed[r] for r in first) <= 2


def test_over_many_rounds_every_client_is_sampled_at_the_expected_rate() -> None:
    cfg = RunConfig.from_mapping({"num-clients": N, "clients-per-round": M, "seed": 3})
    sampled = cohorts(cfg, range(1, ROUNDS + 1))
    counts = Counter(c for cohort in sampled.values() for c in cohort)
    assert within_rate(counts, list(range(N)), ROUNDS, M) == []
    assert len(set(sampled.values())) >= 0.8 * ROUNDS


def test_one_client_per_node_samples_the_nodes_at_the_expected_rate() -> None:
    cfg = RunConfig.from_mapping(
        {"num-clients": N, "clients-per-round": M, "client-assignment": "node", "min-nodes": N, "seed": 5}
    )
    sampled = cohorts(cfg, range(1, 801), nodes=N)
    counts = Counter(node for cohort in sampled.values() for node in cohort)
    assert within_rate(counts, list(range(101, 101 + N)), 800, M) == []
    assert all(len(set(c)) == M for c in sampled.values())
    assert all(sampled[r] != sampled[r + 1] for r in range(1, 800)) and sampled == cohorts(cfg, range(1, 801), N)
