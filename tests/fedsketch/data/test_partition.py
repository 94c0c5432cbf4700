"""Partitioner properties: each sample at most once, no empty client, the configured label skew."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedsketch.data import DataSpec, partition_labels

LABEL_PARTITIONS = ("iid", "dirichlet", "pathological", "shards")


def _labels(n: int, classes: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).permutation(np.arange(n) % classes)


def _entropy(labels: np.ndarray, parts: list[np.ndarray], classes: int) -> float:
    values = []
    for part in parts:
        p = np.bincount(labels[part], minlength=classes) / part.size
        values.append(-(p[p > 0] * np.log(p[p > 0])).sum())
    return float(np.mean(values))


@pytest.mark.parametrize("partition", LABEL_PARTITIONS)
def test_every_sample_exactly_once_and_no_client_empty(partition: str) -> None:
    labels = _labels(1000, 10)
    parts = partition_labels(labels, DataSpec(partition=partition, num_clients=37, alpha=0.3))
    assert len(parts) == 37 and min(part.size for part in parts) >= 1
    assert all(part.dtype == np.int64 for part in parts)
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(1000))


@pytest.mark.parametrize("partition", LABEL_PARTITIONS)
def test_10000_clients_over_50000_samples(partition: str) -> None:
    """FetchSGD's CIFAR scale: 10,000 clients of 5 samples (timings are in the README)."""
    labels = np.repeat(np.arange(10), 5000)
    spec = DataSpec(partition=partition, num_clients=10_000, classes_per_client=1, shards_per_client=1, alpha=0.1)
    parts = partition_labels(labels, spec)
    assert min(part.size for part in parts) >= 1
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(50_000))


def test_deterministic_in_the_seed() -> None:
    labels = _labels(500, 10)
    for partition in LABEL_PARTITIONS:
        spec = DataSpec(partition=partition, num_clients=20)
        first, again = partition_labels(labels, spec), partition_labels(labels, spec)
        other = partition_labels(labels, dataclasses.replace(spec, seed=1))
        assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
        assert not all(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("per_client", [1, 2, 3])
def test_pathological_clients_hold_exactly_n_classes(per_client: int) -> None:
    labels = _labels(2000, 10)
    parts = partition_labels(labels, DataSpec(partition="pathological", num_clients=50, classes_per_client=per_client))
    assert {len(np.unique(labels[part])) for part in parts} == {per_client}
    sizes = [part.size for part in parts]
    assert max(sizes) - min(sizes) <= per_client + 1  # each class is split evenly among its holders


def test_dirichlet_small_alpha_is_more_skewed() -> None:
    labels = _labels(20_000, 10)
    entropy = {
        alpha: _entropy(labels, partition_labels(labels, DataSpec(partition="dirichlet", alpha=alpha)), 10)
        for alpha in (0.05, 0.5, 100.0)
    }
    assert entropy[0.05] < entropy[0.5] < entropy[100.0]
    assert entropy[100.0] > 0.95 * np.log(10)  # nearly IID
    assert entropy[0.05] < 0.5 * np.log(10)


def test_shards_give_each_client_few_classes_and_equal_sizes() -> None:
    labels = _labels(6000, 10)
    parts = partition_labels(labels, DataSpec(partition="shards", num_clients=100, shards_per_client=2))
    assert {part.size for part in parts} == {60}
    assert max(len(np.unique(labels[part])) for part in parts) <= 4  # 2 sorted shards span <= 2 classes each


def test_iid_sizes_differ_by_at_most_one() -> None:
    parts = partition_labels(_labels(1003, 7), DataSpec(partition="iid", num_clients=10))
    assert {part.size for part in parts} == {100, 101}


def test_samples_per_client_caps_each_client() -> None:
    labels = _labels(1000, 10)
    parts = partition_labels(labels, DataSpec(partition="dirichlet", num_clients=20, samples_per_client=7))
    assert max(part.size for part in parts) <= 7
    everything = np.concatenate(parts)
    assert np.unique(everything).size == everything.size  # still at most once


def test_natural_ids_and_subsets() -> None:
    ids = np.array(["b", "a", "c", "a", "b", "c", "d"])
    labels = np.zeros(7, dtype=np.int64)
    parts = partition_labels(labels, DataSpec(num_clients=4), ids)
    assert [p.tolist() for p in parts] == [[1, 3], [0, 4], [2, 5], [6]]  # sorted id order
    subset = partition_labels(labels, DataSpec(num_clients=2, seed=5), ids)
    assert len(subset) == 2 and all(len(set(ids[p])) == 1 for p in subset)
    with pytest.raises(ValueError, match="only 4 distinct"):
        partition_labels(labels, DataSpec(num_clients=5), ids)
    with pytest.raises(ValueError, match="client ids"):
        partition_labels(labels, DataSpec(num_clients=2))


@pytest.mark.parametrize(
    ("spec", "n", "match"),
    [
        (DataSpec(partition="iid", num_clients=11), 10, "from 10 samples"),
        (DataSpec(partition="pathological", classes_per_client=11, num_clients=2), 100, "only 10 classes"),
        (DataSpec(partition="pathological", classes_per_client=2, num_clients=4), 100, "cannot cover"),
        (DataSpec(partition="shards", shards_per_client=3, num_clients=30), 80, "need 90 samples"),
    ],
)
def test_impossible_partitions_say_why(spec: DataSpec, n: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        partition_labels(_labels(n, 10), spec)


def test_pathological_with_a_class_too_small_for_its_holders() -> None:
    labels = np.r_[0, np.ones(39, dtype=np.int64)]  # class 0 has one sample but two holders
    with pytest.raises(ValueError, match="1 of 4 clients without samples"):
        partition_labels(labels, DataSpec(partition="pathological", classes_per_client=1, num_clients=4))


def test_bad_labels_are_rejected() -> None:
    with pytest.raises(ValueError, match="integers"):
        partition_labels(np.zeros(5), DataSpec(partition="iid", num_clients=1))
    with pytest.raises(ValueError, match="1-D"):
        partition_labels(np.zeros((5, 2), dtype=int), DataSpec(partition="iid", num_clients=1))


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 300),
    classes=st.integers(1, 12),
    clients=st.integers(1, 60),
    partition=st.sampled_from(LABEL_PARTITIONS),
    per_client=st.integers(1, 4),
    cap=st.integers(0, 6),
    alpha=st.floats(0.01, 50.0),
    seed=st.integers(0, 2**32),
)
def test_any_valid_split_is_a_partition_or_a_clear_error(
    n: int, classes: int, clients: int, partition: str, per_client: int, cap: int, alpha: float, seed: int
) -> None:
    labels = np.random.default_rng(seed).integers(0, classes, n)
    spec = DataSpec(
        partition=partition,
        num_clients=clients,
        alpha=alpha,
        classes_per_client=per_client,
        shards_per_client=per_client,
        samples_per_client=cap,
        seed=seed,
    )
    try:
        parts = partition_labels(labels, spec)
    except ValueError as err:
        assert str(err)  # an impossible split says why
        return
    everything = np.concatenate(parts)
    assert len(parts) == clients and min(part.size for part in parts) >= 1
    assert np.unique(everything).size == everything.size and everything.min() >= 0 and everything.max() < n
    if cap == 0:
        assert everything.size == n
    else:
        assert max(part.size for part in parts) <= cap
    if partition == "pathological":
        assert max(len(np.unique(labels[part])) for part in parts) <= per_client


def balanced_share(parts: list[np.ndarray], labels: np.ndarray, m: int) -> float:
    """The share of classes (``m`` samples each) that the first of two clients holds 40-60 % of."""
    held = np.bincount(labels[parts[0]], minlength=labels.max() + 1) / m
    return float(np.mean(np.abs(held - 0.5) <= 0.1 + 1e-9))


@pytest.mark.parametrize("alpha", [0.3, 1.0])
def test_dirichlet_splits_each_class_by_a_dirichlet_draw(alpha: float) -> None:
    """The first of two clients holds a Beta(alpha, alpha) share of each class: as often balanced as numpy's draws."""
    m, classes = 20, 3000
    labels = np.repeat(np.arange(classes), m)
    parts = partition_labels(labels, DataSpec(partition="dirichlet", num_clients=2, alpha=alpha, seed=3))
    draws = np.random.default_rng(0).dirichlet([alpha, alpha], 200_000)[:, 0]
    assert balanced_share(parts, labels, m) == pytest.approx(
        np.mean(np.abs(np.rint(draws * m) / m - 0.5) <= 0.1 + 1e-9), abs=0.02
    )


def test_dirichlet_with_a_large_alpha_splits_every_class_evenly() -> None:
    labels = np.repeat(np.arange(50), 40)
    parts = partition_labels(labels, DataSpec(partition="dirichlet", num_clients=2, alpha=1e4))
    held = np.bincount(labels[parts[0]], minlength=50)
    assert held.min() >= 18 and held.max() <= 22


@pytest.mark.parametrize("seed", range(5))
def test_dirichlet_with_a_vanishing_alpha_gives_each_class_whole_to_one_client(seed: int) -> None:
    """Every gamma draw underflows to 0: the split is Dir's limit, one vertex per class."""
    labels = np.repeat(np.arange(6), 30)
    parts = partition_labels(labels, DataSpec(partition="dirichlet", num_clients=3, alpha=1e-9, seed=seed))
    owner = np.empty(labels.size, dtype=np.int64)
    for cid, part in enumerate(parts):
        owner[part] = cid
    for cls in range(6):  # whole, but for the single samples handed to clients left empty
        assert np.bincount(owner[labels == cls], minlength=3).max() >= 30 - 2


def test_dirichlet_leaves_no_client_empty_over_many_seeds_and_ties_give_at_random() -> None:
    """Two classes of two samples, three clients, alpha ~ 0: each class lands whole on a client, and a client left
    empty gets one sample from a largest client, ties broken at random; so each client ends with two samples in a
    third of the seeds (giving in client-id order, the first client would keep two in a ninth)."""
    labels = np.array([0, 0, 1, 1])
    keeps = np.zeros(3)
    for seed in range(300):
        parts = partition_labels(labels, DataSpec(partition="dirichlet", num_clients=3, alpha=1e-9, seed=seed))
        sizes = np.array([part.size for part in parts])
        assert sizes.min() == 1 and sizes.sum() == 4
        keeps += sizes == 2
    assert keeps / 300 == pytest.approx([1 / 3] * 3, abs=0.08)


def test_every_clients_indices_are_sorted() -> None:
    labels = _labels(20_000, 10)
    for partition in LABEL_PARTITIONS:
        for part in partition_labels(labels, DataSpec(partition=partition, num_clients=5, alpha=0.5)):
            assert np.all(np.diff(part) > 0), partition


def test_the_boundaries_of_what_a_partition_can_give() -> None:
    """As many samples as clients, one sample, shards of one sample, classes held exactly once or by everyone."""
    assert [p.tolist() for p in partition_labels(np.array([4]), DataSpec(partition="iid", num_clients=1))] == [[0]]
    parts = partition_labels(_labels(9, 3), DataSpec(partition="iid", num_clients=9))
    assert sorted(p.tolist() for p in parts) == [[i] for i in range(9)]
    parts = partition_labels(_labels(12, 3), DataSpec(partition="shards", num_clients=4, shards_per_client=3))
    assert [p.size for p in parts] == [3, 3, 3, 3]
    labels = _labels(100, 10)
    once = partition_labels(labels, DataSpec(partition="pathological", num_clients=5, classes_per_client=2))
    assert sorted(c for p in once for c in set(labels[p].tolist())) == list(range(10))  # each class held once
    everyone = partition_labels(labels, DataSpec(partition="pathological", num_clients=3, classes_per_client=10))
    assert all(set(labels[p].tolist()) == set(range(10)) for p in everyone)


def test_refusals_name_the_problem_in_full() -> None:
    labels = np.zeros(4, dtype=np.int64)
    with pytest.raises(ValueError, match=r"^labels must be a non-empty 1-D array; got shape \(0,\)$"):
        partition_labels(np.zeros(0, dtype=np.int64), DataSpec(partition="iid", num_clients=1))
    with pytest.raises(ValueError) as err:
        partition_labels(labels, DataSpec(partition="natural", num_clients=1))
    assert str(err.value) == (
        "partition 'natural' needs the data's own client ids; this dataset has none, "
        "choose iid, dirichlet, pathological or shards"
    )
    with pytest.raises(ValueError, match=r"^client_ids has shape \(3,\); expected one id per sample \(4,\)$"):
        partition_labels(labels, DataSpec(partition="natural", num_clients=1), np.array([1, 2, 3]))
    tiny = np.r_[0, np.ones(99, dtype=np.int64)]  # class 0: one sample for its eight holders
    with pytest.raises(ValueError, match=r"^partition 'pathological' leaves 7 of 16 clients without samples \(first: "):
        partition_labels(tiny, DataSpec(partition="pathological", classes_per_client=1, num_clients=16))
    try:
        partition_labels(tiny, DataSpec(partition="pathological", classes_per_client=1, num_clients=16))
    except ValueError as error:
        first = str(error).split("(first: ")[1].split(")")[0]
        assert len(json.loads(first)) == 5
