"""flwr-datasets' partitioners as ``partition`` choices (``fedsketch/data/flwr_partition.py``): the split a
Flower app gets with the run's seed, every refusal in one line naming the partition.

A Hugging Face folder's splits under these partitioners: ``tests/fedsketch/data/test_huggingface.py``.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from datasets import Dataset

from fedsketch.data.flwr_partition import _line, _partitioner, owners
from fedsketch.data.spec import DataSpec

LABELS = np.arange(103, dtype=np.int64) % 10  # 103 samples of ten classes


def flower_split(partitioner: object, seed: int, n: int) -> list[list[int]]:
    """Each partition's rows as a Flower app reads them: the data shuffled with the seed, then split."""
    data = Dataset.from_dict({"label": LABELS[:n], "row": np.arange(n)}).shuffle(seed=seed)
    partitioner.dataset = data  # type: ignore[attr-defined]
    return [sorted(partitioner.load_partition(i)["row"]) for i in range(partitioner.num_partitions)]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("partition", "settings", "flower"),
    [
        ("flwr-pathological", {"classes_per_client": 3}, "PathologicalPartitioner"),
        ("flwr-shard", {"shards_per_client": 2}, "ShardPartitioner"),
    ],
)
@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.filterwarnings(
    "ignore:Classes.*will NOT be used:UserWarning", "ignore::FutureWarning"
)  # Flower's own, here
def test_the_split_is_the_one_a_flower_app_gets_with_the_run_seed(
    partition: str, settings: dict[str, int], flower: str, seed: int
) -> None:
    import flwr_datasets.partitioner as fp

    spec = DataSpec(partition=partition, num_clients=5, seed=seed, **settings)  # type: ignore[arg-type]
    got = owners(LABELS, spec, None)
    key = "num_classes_per_partition" if "classes_per_client" in settings else "num_shards_per_partition"
    reference = getattr(fp, flower)(
        num_partitions=5, partition_by="label", seed=seed, **{key: next(iter(settings.values()))}
    )
    assert [np.flatnonzero(got == c).tolist() for c in range(5)] == flower_split(reference, seed, LABELS.size)


def test_a_sample_no_partition_takes_belongs_to_no_client() -> None:
    got = owners(LABELS, DataSpec(partition="flwr-shard", num_clients=5, shards_per_client=2), None)
    assert got.dtype == np.int64 and (got == -1).sum() == 3  # 10 shards of 10 samples: 3 left over
    assert sorted(np.bincount(got[got >= 0]).tolist()) == [20] * 5


def test_unused_classes_are_still_reported_by_flwr_datasets() -> None:
    with pytest.warns(UserWarning, match="will NOT be used"):
        owners(LABELS, DataSpec(partition="flwr-pathological", num_clients=2, classes_per_client=1), None)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # pyarrow's notes on how flwr-datasets sorts stay quiet
        owners(LABELS, DataSpec(partition="flwr-dirichlet", num_clients=2), None)


def test_a_natural_id_split_needs_ids_and_one_client_per_id() -> None:
    spec = DataSpec(partition="flwr-natural-id", num_clients=3)
    with pytest.raises(ValueError) as refused:
        owners(LABELS, spec, None)
    assert str(refused.value) == (
        "partition 'flwr-natural-id' needs the data's own client ids (an npz's client_ids, a loader's, the "
        "huggingface column named by setting 'hf-client-id'); this data set has none"
    )
    ids = np.arange(103) % 4
    with pytest.raises(ValueError) as refused:
        owners(LABELS, spec, ids)
    assert str(refused.value) == (
        "partition 'flwr-natural-id' (flwr-datasets' NaturalIdPartitioner): setting 'num-clients' is 3 but the "
        "data has 4 distinct client ids, one client each (partition 'natural' keeps a random subset of them)"
    )
    assert owners(LABELS, DataSpec(partition="flwr-natural-id", num_clients=4), ids).tolist() == ids.tolist()


def test_an_unknown_flwr_partition_is_named_and_a_message_is_one_line() -> None:
    with pytest.raises(ValueError, match=r"^unknown partition 'flwr-new'$"):
        _partitioner(SimpleNamespace(partition="flwr-new", num_clients=2, seed=0))  # type: ignore[arg-type]
    assert _line(ValueError("two\n  lines")) == "two lines"
    assert _line(KeyError()) == "KeyError"
