"""Methods at equal total bytes (experiments/analysis/equal_bytes.py), on run folders written here."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.analysis import equal_bytes
from experiments.analysis.results import collect_groups
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
    with pytest.raises(ValueError, match="no run groups"):
        equal_bytes.compare([])
