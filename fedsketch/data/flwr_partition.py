"""flwr-datasets' partitioners as ``partition`` choices, for any data set fedsketch reads.

Flower's users split data with flwr-datasets (``FederatedDataset`` and its
partitioners); a run with ``partition = "flwr-dirichlet"`` splits it the same
way, with the same code:

- ``flwr-iid``: ``IidPartitioner`` (contiguous shards of the shuffled data);
- ``flwr-dirichlet``: ``DirichletPartitioner`` (Yurochkin et al., ICML 2019),
  ``alpha = partition-alpha``, flwr-datasets' default ``min_partition_size`` of 10;
- ``flwr-pathological``: ``PathologicalPartitioner`` (McMahan et al., AISTATS 2017),
  ``num_classes_per_partition = classes-per-client``, classes assigned at random;
- ``flwr-shard``: ``ShardPartitioner``, ``num_shards_per_partition = shards-per-client``;
- ``flwr-natural-id``: ``NaturalIdPartitioner`` on the data's own client ids, one
  client per distinct id (``num-clients`` must be that count).

The partitioner runs on an in-memory ``datasets.Dataset`` of the labels (and
client ids) and each sample's row, shuffled first with the run seed as
``FederatedDataset`` shuffles a split; the partitioners with a seed get the run
seed too. What comes back is each sample's client, so the rest of the split
(``samples-per-client``, no client left empty) is :func:`fedsketch.data.partition_labels`'
as for fedsketch's own partitioners. Those are faster (docs/huggingface.md, measured);
these are here to match a Flower app's split exactly.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from fedsketch.data.spec import DataSpec

_LABEL, _ID, _ROW = "label", "client_id", "row"


def owners(y: np.ndarray, spec: DataSpec, client_ids: np.ndarray | None) -> np.ndarray:
    """The client of every sample (-1: none) under the flwr-datasets partitioner ``spec.partition`` names.

    Raises
    ------
    ValueError
        Naming the partition: no client ids for ``flwr-natural-id``, a client count that is not the
        number of distinct ids, or the partitioner's own refusal (too few samples, a failed draw).
    """
    from datasets import Dataset

    n = int(y.shape[0])
    columns: dict[str, Any] = {_LABEL: y, _ROW: np.arange(n, dtype=np.int64)}
    if spec.partition == "flwr-natural-id":
        if client_ids is None:
            raise ValueError(
                "partition 'flwr-natural-id' needs the data's own client ids (an npz's client_ids, a "
                "loader's, the huggingface column named by setting 'hf-client-id'); this data set has none"
            )
        columns[_ID] = np.asarray(client_ids)
    partitioner = _partitioner(spec)
    partitioner.dataset = Dataset.from_dict(columns).shuffle(seed=spec.seed)
    with warnings.catch_warnings():  # pyarrow's deprecation notes on how flwr-datasets sorts, not the user's to act on
        warnings.simplefilter("ignore", FutureWarning)
        return _assign(partitioner, spec, n)


def _assign(partitioner: Any, spec: DataSpec, n: int) -> np.ndarray:
    """Each sample's partition, read off the ``row`` column of every partition the partitioner makes."""
    k = spec.num_clients
    try:
        count = partitioner.num_partitions
        if count != k:
            raise ValueError(
                f"setting 'num-clients' is {k} but the data has {count} distinct client ids, one client each "
                "(partition 'natural' keeps a random subset of them)"
            )
        owner = np.full(n, -1, dtype=np.int64)
        for cid in range(k):
            rows = partitioner.load_partition(cid).with_format("numpy")[:][_ROW]  # one read, not row by row
            owner[np.asarray(rows, dtype=np.int64)] = cid
    except (ValueError, KeyError) as exc:
        raise ValueError(
            f"partition {spec.partition!r} (flwr-datasets' {type(partitioner).__name__}): {_line(exc)}"
        ) from None
    return owner


def _partitioner(spec: DataSpec) -> Any:
    """The flwr-datasets partitioner of ``spec.partition``, configured from the run's settings."""
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        NaturalIdPartitioner,
        PathologicalPartitioner,
        ShardPartitioner,
    )

    k, seed = spec.num_clients, spec.seed
    if spec.partition == "flwr-iid":
        return IidPartitioner(num_partitions=k)
    if spec.partition == "flwr-dirichlet":
        return DirichletPartitioner(num_partitions=k, partition_by=_LABEL, alpha=spec.alpha, seed=seed)
    if spec.partition == "flwr-pathological":
        return PathologicalPartitioner(
            num_partitions=k, partition_by=_LABEL, num_classes_per_partition=spec.classes_per_client, seed=seed
        )
    if spec.partition == "flwr-shard":
        return ShardPartitioner(
            num_partitions=k, partition_by=_LABEL, num_shards_per_partition=spec.shards_per_client, seed=seed
        )
    if spec.partition == "flwr-natural-id":
        return NaturalIdPartitioner(partition_by=_ID)
    raise ValueError(f"unknown partition {spec.partition!r}")  # DataSpec validates; this guards new names


def _line(exc: BaseException) -> str:
    """The exception's message on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__
