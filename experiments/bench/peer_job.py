"""The peer job's file and command line, shared by its two stand-alone sides (``peer_pfl.py``, ``peer_floor.py``).

``bench_peer`` writes the job once (an ``.npz``: the data, each training sample's client and the
initial weights) and runs each side on it with the same options. This module needs only numpy and
torch, so it loads in pfl-research's own environment too.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Job:
    """The job's arrays as tensors, each client's sample indices, and the initial weights in order."""

    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    users: list[torch.Tensor]
    params: list[np.ndarray]

    @property
    def classes(self) -> int:
        return int(max(self.y.max(), self.y_test.max())) + 1


def parser(description: str) -> argparse.ArgumentParser:
    """The options both sides take (``bench_peer.run_script`` passes them)."""
    out = argparse.ArgumentParser(description=description)
    out.add_argument("job", help=".npz from bench_peer: x_train, y_train, x_test, y_test, client_ids, param_*")
    out.add_argument("--rounds", type=int, default=30)
    out.add_argument("--per-round", type=int, default=100)
    out.add_argument("--local-steps", type=int, default=5)
    out.add_argument("--batch-size", type=int, default=64)
    out.add_argument("--client-lr", type=float, default=0.1)
    out.add_argument("--hidden", type=int, default=512)
    out.add_argument("--seed", type=int, default=0)
    return out


def load(path: str) -> Job:
    """Read the job's ``.npz``; client ``c``'s samples are those whose ``client_ids`` entry is ``c``."""
    with np.load(path) as f:
        arrays = {key: f[key] for key in f.files}
    owner = arrays["client_ids"]
    order = np.argsort(owner, kind="stable")
    bounds = np.searchsorted(owner[order], np.arange(int(owner.max()) + 2))
    return Job(
        x=torch.from_numpy(arrays["x_train"]),
        y=torch.from_numpy(arrays["y_train"]),
        x_test=torch.from_numpy(arrays["x_test"]),
        y_test=torch.from_numpy(arrays["y_test"]),
        users=[torch.from_numpy(order[bounds[c] : bounds[c + 1]]) for c in range(len(bounds) - 1)],
        params=[arrays[key] for key in sorted(k for k in arrays if k.startswith("param_"))],
    )


def cohort(seed: int, rnd: int, num_clients: int, per_round: int) -> list[int]:
    """Round ``rnd``'s clients, sorted: fedsketch's sampling (``strategies/plan.py``)."""
    rng = np.random.default_rng([seed, rnd])
    return sorted(int(c) for c in rng.choice(num_clients, size=per_round, replace=False))


def client_seed(seed: int, rnd: int, cid: int) -> int:
    """The seed of a client's batches in round ``rnd``: ``fedsketch.training.local.client_generator``'s."""
    return (seed * 1_000_003 + rnd) * 1_000_033 + cid
