"""What a logical client keeps between rounds: committed and pending state, in memory or on disk.

A client's memory may change only by what the server applied. A client keeps
what the server has accepted (its committed state) and, beside it, the state
its last upload would lead to (pending, tagged with that round). Its next
request says the last round in which the server applied its upload
(:func:`settle`): if that is the pending round the pending state becomes the
committed one, otherwise it is dropped, as if that round had never sampled it
(a rejected, late or lost reply, a skipped or rolled-back round).

Client state on disk: one file per logical client, for runs whose state outgrows memory.

Local top-k (and the other client-side error-feedback baselines) keep d floats
per client that has taken part; at 10,000 clients that is far more than a
simulation machine's memory (the FetchSGD paper's argument for server-side
state, Rothchild et al., ICML 2020, Sec. 3). With ``client-state = "disk"``
each logical client's state is one ``.npz`` file under the run's folder,
read when the client is sampled and rewritten when it replies, so memory holds
only the clients of the current call. A file is written to a temporary name and
renamed into place: a process killed mid-write leaves the old state whole.
"""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from fedsketch.server.runlog import run_dir

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

State = dict[str, torch.Tensor]

PENDING = "pending."
PENDING_ROUND = "pending-round"


def committed(stored: State) -> State:
    """The state the server has accepted."""
    return {k: v for k, v in stored.items() if not k.startswith(PENDING) and k != PENDING_ROUND}


def pending_round(stored: State) -> int | None:
    """The round of the upload whose state is pending, if any."""
    return int(stored[PENDING_ROUND][0]) if PENDING_ROUND in stored else None


def pending(stored: State, server_round: int) -> State:
    """The state the client's upload of ``server_round`` led to (a second exchange reads it).

    Raises
    ------
    ValueError
        If the client has no upload of that round pending (it did not take part in its first exchange here).
    """
    if pending_round(stored) != server_round:
        raise ValueError(f"this client has no state pending from round {server_round}")
    return {k[len(PENDING) :]: v for k, v in stored.items() if k.startswith(PENDING)}


def settle(stored: State, applied: int | None) -> State:
    """The committed state once the server says ``applied``: the last round it applied this client's upload."""
    if applied is not None and pending_round(stored) == applied:
        return pending(stored, applied)
    return committed(stored)


def with_pending(base: State, new: State, server_round: int) -> State:
    """What to store: the committed ``base`` and, pending from ``server_round``, ``new``."""
    tagged = {PENDING + k: v for k, v in new.items()}
    return {**base, **tagged, PENDING_ROUND: torch.tensor([float(server_round)])}


def state_root(cfg: RunConfig) -> Path:
    """``<run dir>/client-state``: where a run's disk-kept client states live."""
    return run_dir(cfg) / "client-state"


def clear_states(cfg: RunConfig) -> None:
    """Delete every client state kept under the run's folder (before a fresh run, after a finished one)."""
    shutil.rmtree(state_root(cfg), ignore_errors=True)


class DiskStates:
    """The states of the logical clients of one Flower run, one file each under ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, cid: int) -> Path:
        """The file of client ``cid``."""
        return self.root / f"{cid}.npz"

    def load(self, cid: int) -> State:
        """What client ``cid`` kept; ``{}`` if it has not taken part yet.

        Raises
        ------
        ValueError
            If the file exists but cannot be read (naming the file, so it can be removed).
        """
        path = self.path(cid)
        if not path.exists():
            return {}
        try:
            with np.load(path, allow_pickle=False) as arrays:
                return {name: torch.from_numpy(arrays[name].copy()) for name in arrays.files}
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
            raise ValueError(
                f"client {cid}: its state file {path} is unreadable ({exc}); delete it to start this client over"
            ) from None

    def save(self, cid: int, state: State) -> None:
        """Replace client ``cid``'s state, atomically."""
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.path(cid).with_suffix(f".{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            arrays = {name: t.detach().float().cpu().numpy() for name, t in state.items()}
            np.savez(f, allow_pickle=False, **arrays)
        os.replace(tmp, self.path(cid))
