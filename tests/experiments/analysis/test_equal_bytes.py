"""Methods at equal total bytes (experiments/analysis/equal_bytes.py), on run folders written here."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from experiments.analysis import equal_bytes
from experiments.analysis.results import RunGroup, Spread, collect_groups
from tests.run_folders import MB, two_methods, write_seed


def test_budget_is_the_smallest_total_and_accuracy_is_read_within_it(tmp_path: Path) -> None:
    cmp = equal_bytes.compare(collect_groups(two_methods(tmp_path)), {"fetchsgd": "FetchSGD"})
    assert cmp.budget == 122 * MB  # local top-k's whole run, the smallest of any seed
    fetch, local = cmp.entries
    assert (fetch.name, local.name) == ("FetchSGD", "local_topk errornone")
    assert fetch.at_budget.low == pytest.approx(0.3) and fetch.at_budget.high == pytest.approx(0.32)
    assert local.at_budget.mean == pytest.approx(0.71)
    assert cmp.best_at_budget() is local and cmp.separated()


def test_target_is_ninety_percent_of_the_best_final_and_needs_every_seed(tmp_path: Path) -> None:
    cmp = equal_bytes.compare(collect_groups(two_methods(tmp_path)))
    assert cmp.target == pytest.approx(0.9 * 0.91)
    fetch, local = cmp.entries
    assert fetch.to_target is not None and fetch.to_target.mean == 300 * MB
    assert local.to_target is None  # 0.72 never reaches 0.819
    assert cmp.fewest_to_target() is fetch


def test_the_sentence_names_the_leader_and_fetchsgd(tmp_path: Path) -> None:
    cmp = equal_bytes.compare(collect_groups(two_methods(tmp_path)), {"fetchsgd": "FetchSGD"})
    assert cmp.sentence() == (
        "At equal total bytes (122 MB up + down, the smallest run's spend) local_topk errornone leads with 0.7100 "
        "against FetchSGD's 0.3100; FetchSGD reaches 0.8190 (90% of the best final) on the fewest bytes (300 MB; "
        "no other method reaches it)."
    )


def _three(root: Path, fedavg: list[tuple[int, int, float]]) -> str:
    """FetchSGD ahead of local top-k at 20 + 20 MB, FedAvg's curve as given; the sentence."""
    write_seed(root / "a" / "seed0", "fetchsgd", 0, [(10, 10, 0.45), (20, 20, 0.9)])
    write_seed(root / "c" / "seed0", "local_topk", 0, [(10, 10, 0.4), (20, 20, 0.8)])
    write_seed(root / "b" / "seed0", "fedavg", 0, fedavg)
    return equal_bytes.compare(collect_groups(root)).sentence()


def test_where_fetchsgd_is_ahead_the_sentence_names_the_runner_up(tmp_path: Path) -> None:
    """The next best at the budget, and the next fewest bytes to the target (or that no other reaches it)."""
    sentence = _three(tmp_path / "none", [(10, 10, 0.35), (20, 20, 0.7)])
    assert "fetchsgd leads with 0.9000 against local_topk's 0.8000;" in sentence
    assert "on the fewest bytes (40 MB; no other method reaches it)." in sentence
    sentence = _three(tmp_path / "fedavg", [(10, 10, 0.35), (20, 20, 0.7), (30, 30, 0.85)])
    assert "fetchsgd reaches 0.8100 (90% of the best final) on the fewest bytes (40 MB; fedavg: 60 MB)." in sentence


def test_accuracy_at_a_budget_below_every_round_is_zero() -> None:
    rows = [{"cum_upload_bytes": 5, "cum_download_bytes": 5, "test_accuracy": 0.5}]
    assert equal_bytes.accuracy_at(rows, 9) == 0.0
    assert equal_bytes.accuracy_at(rows, 10) == 0.5


def test_overlapping_bands_are_not_called_separated(tmp_path: Path) -> None:
    for seed, acc in ((0, 0.5), (1, 0.7)):
        write_seed(tmp_path / "a" / f"seed{seed}", "fetchsgd", seed, [(10, 10, acc)])
        write_seed(tmp_path / "b" / f"seed{seed}", "fedavg", seed, [(10, 10, acc - 0.05)])
    cmp = equal_bytes.compare(collect_groups(tmp_path))
    assert cmp.best_at_budget().strategy == "fetchsgd" and not cmp.separated()
    assert "leads with 0.6000 against fedavg's 0.5500 (seed bands overlap with fedavg's);" in cmp.sentence()


def test_with_one_seed_a_tie_names_the_run_it_ties_with_and_no_seed_bands(tmp_path: Path) -> None:
    write_seed(tmp_path / "a" / "seed0", "fetchsgd", 0, [(10, 10, 0.7)])
    write_seed(tmp_path / "b" / "seed0", "fedavg", 0, [(10, 10, 0.7)])
    write_seed(tmp_path / "c" / "seed0", "local_topk", 0, [(10, 10, 0.6)])
    sentence = equal_bytes.compare(collect_groups(tmp_path)).sentence()
    assert "fedavg leads with 0.7000 against fetchsgd's 0.7000 (tied with fetchsgd);" in sentence, sentence
    assert "seed bands" not in sentence
    ahead = equal_bytes.compare(collect_groups(tmp_path / "c") + collect_groups(tmp_path / "a")).sentence()
    assert "fetchsgd leads with 0.7000 against local_topk's 0.6000;" in ahead, ahead  # one seed, no tie: nothing


def test_a_method_reaches_the_target_only_if_every_seed_does(tmp_path: Path) -> None:
    write_seed(tmp_path / "a" / "seed0", "fetchsgd", 0, [(10, 10, 1.0)])
    write_seed(tmp_path / "b" / "seed0", "fedavg", 0, [(10, 10, 0.95)])
    write_seed(tmp_path / "b" / "seed1", "fedavg", 1, [(10, 10, 0.5)])
    cmp = equal_bytes.compare(collect_groups(tmp_path))
    fedavg = next(e for e in cmp.entries if e.strategy == "fedavg")
    assert fedavg.seeds == 2 and fedavg.to_target is None


def test_nothing_to_compare_is_an_error() -> None:
    with pytest.raises(ValueError, match="^nothing to compare: no run groups$"):
        equal_bytes.compare([])


def _curve(rng: np.random.Generator, strategy: str, seed: int) -> list[dict]:
    """Evaluated rounds with growing cumulative bytes and an accuracy that wanders."""
    n = int(rng.integers(1, 6))
    up, down = np.cumsum(rng.integers(1, 10**6, size=n)), np.cumsum(rng.integers(1, 10**6, size=n))
    return [
        {
            "round": i + 1,
            "strategy": strategy,
            "seed": seed,
            "test_accuracy": round(float(rng.random()), 2),
            "cum_upload_bytes": int(up[i]),
            "cum_download_bytes": int(down[i]),
            "cum_dense_upload_bytes": int(10 * up[i]),
        }
        for i in range(n)
    ]


def _at(rows: list[dict], budget: float) -> float:
    """Reference: the accuracy of the last row spending at most the budget, 0 before the first."""
    totals = np.array([r["cum_upload_bytes"] + r["cum_download_bytes"] for r in rows])
    within = np.flatnonzero(totals <= budget)
    return float(rows[int(within[-1])]["test_accuracy"]) if within.size else 0.0


def _spread(values: list[float]) -> tuple[float, float, float]:
    return float(np.mean(values)), float(np.min(values)), float(np.max(values))


@pytest.mark.parametrize("seed", range(6))
def test_every_entry_is_read_at_the_smallest_spend_and_ninety_percent_of_the_best_final(seed: int) -> None:
    rng = np.random.default_rng(seed)
    strategies = ["fetchsgd", "fedavg", "local_topk", "true_topk"][: int(rng.integers(1, 5))]
    groups = [
        RunGroup(s, "", tuple(tuple(_curve(rng, s, k)) for k in range(int(rng.integers(1, 4))))) for s in strategies
    ]
    cmp = equal_bytes.compare(groups, {"fedavg": "FedAvg"})
    final = {g.strategy: [rows[-1] for rows in g.seeds] for g in groups}
    assert cmp.budget == min(r["cum_upload_bytes"] + r["cum_download_bytes"] for rs in final.values() for r in rs)
    assert cmp.target == pytest.approx(0.9 * max(np.mean([r["test_accuracy"] for r in rs]) for rs in final.values()))
    for g, e in zip(groups, cmp.entries, strict=True):
        assert (e.name, e.strategy, e.seeds) == (
            "FedAvg" if g.strategy == "fedavg" else g.strategy,
            g.strategy,
            len(g.seeds),
        )
        assert _spread_of(e.final) == pytest.approx(_spread([r["test_accuracy"] for r in final[g.strategy]]))
        totals = [r["cum_upload_bytes"] + r["cum_download_bytes"] for r in final[g.strategy]]
        assert _spread_of(e.total) == pytest.approx(_spread(totals))
        assert _spread_of(e.at_budget) == pytest.approx(_spread([_at(list(rows), cmp.budget) for rows in g.seeds]))
        reached = [next((r for r in rows if r["test_accuracy"] >= cmp.target), None) for rows in g.seeds]
        if None in reached:
            assert e.to_target is None
        else:
            spent = [r["cum_upload_bytes"] + r["cum_download_bytes"] for r in reached if r]
            assert e.to_target is not None and _spread_of(e.to_target) == pytest.approx(_spread(spent))
    means = [e.at_budget.mean for e in cmp.entries]
    assert cmp.best_at_budget() is cmp.entries[means.index(max(means))]  # the first listed on a tie
    assert cmp.separated() == all(
        cmp.best_at_budget().at_budget.low > e.at_budget.high for e in cmp.entries if e is not cmp.best_at_budget()
    )


def _spread_of(s: Spread) -> tuple[float, float, float]:
    return s.mean, s.low, s.high


def _entry(
    name: str, at_budget: tuple[float, float, float], to_target: float | None, seeds: int = 2
) -> equal_bytes.Entry:
    band = Spread(*at_budget)
    reached = None if to_target is None else Spread(to_target, to_target, to_target)
    return equal_bytes.Entry(name, name, seeds, band, Spread(1.0, 1.0, 1.0), band, reached)


def test_ties_go_to_the_first_listed_and_every_overlapping_band_is_named() -> None:
    entries = (
        _entry("a", (0.5, 0.4, 0.6), 3e6),
        _entry("b", (0.5, 0.45, 0.55), 2e6),
        _entry("c", (0.3, 0.2, 0.4), 2e6),
        _entry("d", (0.35, 0.3, 0.39), None),
    )
    cmp = equal_bytes.Comparison(1e6, 0.5, entries)
    assert cmp.best_at_budget() is entries[0] and cmp.fewest_to_target() is entries[1]
    assert cmp.level_with_leader() == [entries[1], entries[2]]  # c's high touches a's low: not ahead on every seed
    assert cmp.margin() == " (seed bands overlap with b, c)" and not cmp.separated()
    assert equal_bytes.Comparison(1e6, 0.5, entries[2:]).fewest_to_target() is entries[2]
    assert equal_bytes.Comparison(1e6, 0.5, entries[3:]).fewest_to_target() is None
    one = equal_bytes.Comparison(1e6, 0.5, (_entry("a", (0.5,) * 3, None, 1), _entry("b", (0.5,) * 3, None, 1)))
    assert one.margin() == " (tied with b)"
    mixed = equal_bytes.Comparison(1e6, 0.5, (_entry("a", (0.5,) * 3, None, 1), _entry("b", (0.5, 0.4, 0.6), None)))
    assert mixed.margin() == " (seed bands overlap with b's)"


def test_a_lone_method_is_measured_against_no_one() -> None:
    alone = equal_bytes.Comparison(2e6, 0.45, (_entry("fetchsgd", (0.5, 0.5, 0.5), 1e6),))
    assert alone.sentence() == (
        "At equal total bytes (2 MB up + down, the smallest run's spend) fetchsgd leads with 0.5000; "
        "fetchsgd reaches 0.4500 (90% of the best final) on the fewest bytes (1 MB)."
    )
    assert alone.margin() == "" and alone.separated()


def test_the_sentence_against_fetchsgd_when_it_does_not_reach_the_target() -> None:
    entries = (_entry("fedavg", (0.6, 0.6, 0.6), 4e6), _entry("fetchsgd", (0.4, 0.4, 0.4), None))
    entries += (_entry("local_topk", (0.5, 0.5, 0.5), 3e6),)
    assert equal_bytes.Comparison(5e6, 0.55, entries).sentence() == (
        "At equal total bytes (5 MB up + down, the smallest run's spend) fedavg leads with 0.6000 against "
        "fetchsgd's 0.4000; local_topk reaches 0.5500 (90% of the best final) on the fewest bytes (3 MB; "
        "fetchsgd: not reached)."
    )
    nobody = equal_bytes.Comparison(5e6, 0.95, (_entry("fedavg", (0.6,) * 3, None), entries[1]))
    assert nobody.sentence().endswith("; no method reaches 0.9500 (90% of the best final) on every seed.")
    rest = equal_bytes.Comparison(5e6, 0.55, (entries[0], entries[2]))
    assert rest.sentence().endswith(
        "local_topk reaches 0.5500 (90% of the best final) on the fewest bytes (3 MB; fedavg: 4 MB)."
    )


def test_without_fetchsgd_the_sentence_names_the_next_fewest_bytes_to_the_target() -> None:
    entries = tuple(_entry(n, (0.5, 0.5, 0.5), b) for n, b in (("a", 1e6), ("b", 3e6), ("c", 2e6), ("d", None)))
    assert equal_bytes.Comparison(5e6, 0.45, entries).sentence().endswith("on the fewest bytes (1 MB; c: 2 MB).")
