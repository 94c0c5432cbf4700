"""Federated datasets: load once, split over clients by label or by natural id.

- :class:`DataSpec`: which dataset and partition (a frozen, hashable value).
- :func:`load_federated`: the dataset a spec describes, cached per process.
- :func:`from_arrays`, :func:`from_idx_files`: bring your own data.
- :func:`partition_labels`: the partitioners (IID, Dirichlet, pathological,
  shards, natural), vectorized in numpy.

The embedded default, ``synthetic``, is FedProx's Synthetic(alpha, beta) (Li et
al., MLSys 2020), generated from the seed: no download. Image sets and FEMNIST
are read from local files; nothing is downloaded at run time unless FEMNIST is
asked for without a local copy.

The names that need torch (the loaders) are imported on first use, so that a
run's settings are parsed and checked without torch (:mod:`fedsketch.config`).
"""

from importlib import import_module
from typing import Any

from fedsketch.data.partition import partition_labels
from fedsketch.data.spec import DATASETS, PARTITIONS, DataSpec, FederatedData
from fedsketch.data.synthetic import generate_synthetic

_WITH_TORCH = {
    "NORMALIZATION": "images",
    "load_idx": "images",
    "load_idx_images": "images",
    "load_idx_labels": "images",
    "normalize": "images",
    "from_arrays": "load",
    "from_idx_files": "load",
    "load_federated": "load",
}

__all__ = [
    "DATASETS",
    "NORMALIZATION",
    "PARTITIONS",
    "DataSpec",
    "FederatedData",
    "from_arrays",
    "from_idx_files",
    "generate_synthetic",
    "load_federated",
    "load_idx",
    "load_idx_images",
    "load_idx_labels",
    "normalize",
    "partition_labels",
]


def __getattr__(name: str) -> Any:
    if name not in _WITH_TORCH:
        raise AttributeError(f"module 'fedsketch.data' has no attribute {name!r}")
    return getattr(import_module(f"fedsketch.data.{_WITH_TORCH[name]}"), name)
