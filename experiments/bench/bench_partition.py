"""Partitioning 50,000 labels over many clients: fedsketch's numpy partitioners against flwr-datasets'.

Both sides are timed in the same run (the machines are shared and noisy), and
the table prints the ratio. flwr-datasets builds one ``datasets.Dataset`` per
client, which is why fedsketch partitions label arrays directly (see README,
"Why these libraries").

    python -m experiments.bench.bench_partition [--clients 10000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from fedsketch.data import DataSpec, partition_labels

if TYPE_CHECKING:
    from flwr_datasets.partitioner import Partitioner  # flwr-datasets ships no type information: Any to mypy


def _ours(labels: np.ndarray, spec: DataSpec) -> tuple[float, int]:
    best, assigned = float("inf"), 0
    for _ in range(3):
        start = time.perf_counter()
        parts = partition_labels(labels, spec, None)
        best = min(best, time.perf_counter() - start)
        assigned = int(sum(p.size for p in parts))
    return best, assigned


def _flwr(labels: np.ndarray, make: Callable[[], Partitioner], clients: int) -> tuple[float, int]:
    from datasets import Dataset

    partitioner = make()
    partitioner.dataset = Dataset.from_dict({"label": labels})
    start = time.perf_counter()
    load = partitioner.load_partition
    assigned = sum(len(load(i)) for i in range(clients))
    return time.perf_counter() - start, assigned


def main() -> None:
    """Print one row per partition: both times, the ratio, samples assigned."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    args = parser.parse_args()
    from flwr_datasets.partitioner import (
        DirichletPartitioner,
        IidPartitioner,
        PathologicalPartitioner,
        ShardPartitioner,
    )

    k = args.clients
    labels = np.repeat(np.arange(10), 5_000)
    cases = [
        ("iid", DataSpec(partition="iid", num_clients=k), lambda: IidPartitioner(num_partitions=k)),
        (
            "dirichlet(0.5)",
            DataSpec(partition="dirichlet", alpha=0.5, num_clients=k),
            lambda: DirichletPartitioner(
                num_partitions=k, partition_by="label", alpha=0.5, min_partition_size=0, seed=0
            ),
        ),
        (
            "pathological(2)",
            DataSpec(partition="pathological", classes_per_client=2, num_clients=k),
            lambda: PathologicalPartitioner(
                num_partitions=k, partition_by="label", num_classes_per_partition=2, seed=0
            ),
        ),
        (
            "shards(2)",
            DataSpec(partition="shards", shards_per_client=2, num_clients=k),
            lambda: ShardPartitioner(num_partitions=k, partition_by="label", num_shards_per_partition=2, seed=0),
        ),
    ]
    print(f"{k:,} clients, 50,000 labels, 10 classes")
    print("| partition | fedsketch (best of 3) | flwr-datasets (all partitions) | ratio | assigned (ours / flwr) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, spec, make in cases:
        ours_s, ours_n = _ours(labels, spec)
        flwr_s, flwr_n = _flwr(labels, make, k)
        print(
            f"| {name} | {ours_s * 1e3:.1f} ms | {flwr_s:.2f} s | {flwr_s / ours_s:.0f}x | {ours_n:,} / {flwr_n:,} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
