"""Split a dataset's training samples over clients by their labels.

The partitions of the federated-learning literature, each vectorized in numpy:

- ``iid``: a uniformly random split into sizes that differ by at most one.
- ``dirichlet``: for every class, the share of each client is drawn from
  Dir(alpha); small alpha gives a few clients most of a class (Yurochkin et al.,
  ICML 2019; the "noniid-labeldir" of Li et al., ICDE 2022; flwr-datasets'
  ``DirichletPartitioner``).
- ``pathological``: every client holds exactly ``classes_per_client`` classes
  and each class is split evenly among its holders (McMahan et al., AISTATS 2017;
  FetchSGD's CIFAR setup uses one class per client).
- ``shards``: sort by label, cut into ``num_clients * shards_per_client`` equal
  shards, deal each client ``shards_per_client`` at random (McMahan et al. 2017).
- ``natural``: the data's own client ids (the writer in FEMNIST).
- ``flwr-*``: flwr-datasets' partitioners, as a Flower app would split the data
  (:mod:`fedsketch.data.flwr_partition`).

Each partitioner computes one owner per sample (``-1``: unassigned), so every
sample goes to at most one client by construction. Why not flwr-datasets'
partitioners, measured: docs/data.md.
"""

from __future__ import annotations

import numpy as np

from fedsketch.data import flwr_partition
from fedsketch.data.spec import FLWR_PARTITIONS, DataSpec

_STREAM = 0x9A47  # keeps the partition's random stream apart from the generator's


def partition_labels(labels: np.ndarray, spec: DataSpec, client_ids: np.ndarray | None = None) -> list[np.ndarray]:
    """One sorted int64 index array per client, as ``spec`` configures.

    Parameters
    ----------
    labels
        Integer label of every training sample, shape ``(N,)``.
    spec
        ``partition``, ``num_clients``, ``alpha``, ``classes_per_client``,
        ``shards_per_client``, ``samples_per_client`` and ``seed`` are used.
    client_ids
        The data's own client of every sample (any sortable ids); needed by
        ``natural`` only. With more distinct ids than ``num_clients``, a random
        subset of ``num_clients`` of them is kept (as LEAF samples users).

    Raises
    ------
    ValueError
        If the labels or ids are malformed, or the partition cannot give every
        client at least one sample.
    """
    y = _as_labels(labels)
    k = spec.num_clients
    rng = np.random.default_rng([spec.seed, _STREAM])
    owner = _owners(y, spec, client_ids, rng)
    if spec.samples_per_client:
        owner = _cap(owner, spec.samples_per_client, rng)
    parts = _group(owner, k)
    empty = [cid for cid, part in enumerate(parts) if part.size == 0]
    if empty:
        raise ValueError(
            f"partition {spec.partition!r} leaves {len(empty)} of {k} clients without samples "
            f"(first: {empty[:5]}); use fewer clients or more classes/shards per client"
        )
    return parts


def _owners(y: np.ndarray, spec: DataSpec, client_ids: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
    """The client of every sample under ``spec.partition`` (-1: unassigned)."""
    n, k = y.shape[0], spec.num_clients
    if spec.partition in FLWR_PARTITIONS:
        return flwr_partition.owners(y, spec, client_ids)
    if spec.partition == "natural":
        return _natural(y, client_ids, k, rng)
    if n < k:
        raise ValueError(f"cannot give {k} clients a sample each from {n} samples; use fewer clients")
    if spec.partition == "iid":
        return _iid(n, k, rng)
    if spec.partition == "dirichlet":
        return _fill_empty(_dirichlet(y, k, spec.alpha, rng), k, rng)
    if spec.partition == "pathological":
        return _pathological(y, k, spec.classes_per_client, rng)
    if spec.partition == "shards":
        return _shards(y, k, spec.shards_per_client, rng)
    raise ValueError(f"unknown partition {spec.partition!r}")  # DataSpec validates; this guards new names


def _as_labels(labels: np.ndarray) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or y.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array; got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be integers; got dtype {y.dtype}")
    return y.astype(np.int64, copy=False)


def _class_order(y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sample indices grouped by class (random order inside a class), class ids, class sizes."""
    _, cls = np.unique(y, return_inverse=True)
    perm = rng.permutation(y.shape[0])
    order = perm[np.argsort(cls[perm], kind="stable")]
    return order, cls[order], np.bincount(cls)


def _natural(y: np.ndarray, client_ids: np.ndarray | None, k: int, rng: np.random.Generator) -> np.ndarray:
    if client_ids is None:
        raise ValueError(
            "partition 'natural' needs the data's own client ids; this dataset has none, "
            "choose iid, dirichlet, pathological or shards"
        )
    ids = np.asarray(client_ids)
    if ids.shape != y.shape:
        raise ValueError(f"client_ids has shape {ids.shape}; expected one id per sample {y.shape}")
    # Sorted unique ids, as flwr-datasets' NaturalIdPartitioner numbers them.
    _, group = np.unique(ids, return_inverse=True)
    groups = int(group.max()) + 1
    if k > groups:
        raise ValueError(f"setting 'num-clients' is {k} but the data has only {groups} distinct client ids")
    chosen = np.arange(groups) if k == groups else np.sort(rng.choice(groups, size=k, replace=False))
    client_of_group = np.full(groups, -1, dtype=np.int64)
    client_of_group[chosen] = np.arange(k)
    return client_of_group[group.reshape(-1)]


def _iid(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    owner = np.empty(n, dtype=np.int64)
    owner[rng.permutation(n)] = np.arange(n, dtype=np.int64) * k // n
    return owner


def _dirichlet(y: np.ndarray, k: int, alpha: float, rng: np.random.Generator) -> np.ndarray:
    order, _, sizes = _class_order(y, rng)
    owner = np.empty(y.shape[0], dtype=np.int64)
    start = 0
    for m in sizes:
        share = rng.gamma(alpha, size=k)  # normalized gammas are Dir(alpha, ..., alpha)
        if not share.sum() > 0:  # tiny alpha can underflow every gamma: Dir's limit is one vertex
            share[rng.integers(k)] = 1.0
        cuts = np.rint(np.cumsum(share) / share.sum() * m).astype(np.int64)
        counts = np.diff(cuts, prepend=0)
        owner[order[start : start + m]] = np.repeat(np.arange(k), counts)
        start += m
    return owner


def _fill_empty(owner: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """Move one sample to every empty client, taken from the largest clients.

    Dirichlet draws leave clients empty when samples are few per client. Taking
    the samples that sit highest above a water level (each client keeps at least
    one) changes the drawn split as little as possible.
    """
    sizes = np.bincount(owner, minlength=k)
    empty = np.flatnonzero(sizes == 0)
    if empty.size == 0:
        return owner
    n = int(owner.shape[0])
    order = np.lexsort((rng.random(size=n), owner))
    starts = np.cumsum(sizes) - sizes
    rank = np.arange(n) - starts[owner[order]]  # 0 marks the sample each client keeps
    # Highest rank first, ties at random: the largest clients give first.
    donors = order[np.argsort(-(rank + rng.random(n)), kind="stable")[: empty.size]]
    owner = owner.copy()
    owner[donors] = rng.permutation(empty)
    return owner


def _pathological(y: np.ndarray, k: int, per_client: int, rng: np.random.Generator) -> np.ndarray:
    order, cls, sizes = _class_order(y, rng)
    c = sizes.shape[0]
    if per_client > c:
        raise ValueError(f"setting 'classes-per-client' is {per_client} but the data has only {c} classes")
    if k * per_client < c:
        raise ValueError(
            f"settings 'num-clients' ({k}) x 'classes-per-client' ({per_client}) cannot cover all {c} classes"
        )
    # Clients come in blocks of c; in each block, a fresh random order of the
    # classes is read in windows of per_client consecutive positions, so a block
    # of c clients holds every class exactly per_client times.
    blocks = -(-k // c)
    perms = rng.permuted(np.tile(np.arange(c), (blocks, 1)), axis=1)
    client = np.arange(k)
    pos = (client[:, None] % c * per_client + np.arange(per_client)) % c
    slot_class = perms[client[:, None] // c, pos].ravel()
    slot_client = np.repeat(client, per_client)
    slots = np.argsort(slot_class, kind="stable")
    holders = np.bincount(slot_class, minlength=c)
    first_slot = np.cumsum(holders) - holders
    first_sample = np.cumsum(sizes) - sizes
    rank = np.arange(y.shape[0]) - first_sample[cls]
    within = rank * holders[cls] // sizes[cls]  # even split of a class among its holders
    owner = np.empty(y.shape[0], dtype=np.int64)
    owner[order] = slot_client[slots[first_slot[cls] + within]]
    return owner


def _shards(y: np.ndarray, k: int, per_client: int, rng: np.random.Generator) -> np.ndarray:
    n, total = y.shape[0], k * per_client
    if n < total:
        raise ValueError(
            f"settings 'num-clients' ({k}) x 'shards-per-client' ({per_client}) need {total} samples; the data has {n}"
        )
    order, _, _ = _class_order(y, rng)
    shard = np.arange(n, dtype=np.int64) * total // n
    shard_owner = rng.permutation(total) // per_client
    owner = np.empty(n, dtype=np.int64)
    owner[order] = shard_owner[shard]
    return owner


def _cap(owner: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
    """Keep at most ``cap`` random samples per client; the rest become unassigned."""
    order = np.lexsort((rng.random(size=int(owner.shape[0])), owner))
    sorted_owner = owner[order]
    is_start = np.r_[True, sorted_owner[1:] != sorted_owner[:-1]]
    start = np.maximum.accumulate(np.where(is_start, np.arange(owner.shape[0]), 0))
    drop = order[(np.arange(owner.shape[0]) - start >= cap) & (sorted_owner >= 0)]
    owner = owner.copy()
    owner[drop] = -1
    return owner


def _group(owner: np.ndarray, k: int) -> list[np.ndarray]:
    """Index arrays per client from the owner of every sample (sorted, -1 dropped)."""
    order = np.argsort(owner, kind="stable").astype(np.int64)
    unassigned = int(np.count_nonzero(owner < 0))
    sizes = np.bincount(owner[owner >= 0], minlength=k)
    return np.split(order[unassigned:], np.cumsum(sizes)[:-1])
