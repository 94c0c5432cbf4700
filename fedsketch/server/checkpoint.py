"""Save a run's server side every N rounds, atomically, and resume from it exactly.

A checkpoint holds everything the rest of a run depends on: the model, the
method's state (e.g. FetchSGD's momentum and error sketches), the strategy's
bookkeeping (byte and failure counters, rounds of DP noise released), the
generators (the DP noise's, and the global Python, numpy and torch ones), how
far ``metrics.jsonl`` and ``rounds.jsonl`` had got, and a fingerprint of every
setting that changes results. Clients are stateless for the methods that may
checkpoint, and each derives its randomness from ``(seed, round, client)``, so
a resumed run computes the very rounds an uninterrupted one would.

The file is written to a temporary name, flushed to disk and renamed over the
old one (``os.replace`` is atomic on POSIX and Windows), so a kill at any
moment leaves either the old checkpoint or the new one, never a torn file. It
starts with a magic line and the SHA-256 of its body; the body is read with
``torch.load(weights_only=True)``, which builds tensors and plain containers
only, never arbitrary objects. A checkpoint that is corrupt, of another
format, or written by a run with other settings is refused with a
:class:`CheckpointError` that says why, before anything is restored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from fedsketch.server import resumable, runlog
from fedsketch.server.books import Books
from fedsketch.server.ledger import DownloadLedger

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

FILE = runlog.CHECKPOINT
LOGS = ("metrics.jsonl", "rounds.jsonl")
MAGIC = b"fedsketch-checkpoint\n"
VERSION = 2  # 2: the books are one dataclass (fedsketch.server.books)


class CheckpointError(RuntimeError):
    """A checkpoint that must not be resumed from (corrupt, foreign, or of another config)."""


@dataclass(frozen=True)
class Checkpoint:
    """The server side of a run after round ``round``."""

    round: int
    weights: torch.Tensor
    state: Any  # the method's state as plain containers of tensors (see :func:`state_to_tree`)
    books: dict[str, Any]  # the run's books (:class:`fedsketch.server.books.Books`) as plain values
    noise: torch.Tensor  # the DP noise generator's state
    rng: dict[str, Any]  # the global generators (see :func:`capture_rng`)
    logs: dict[str, int]  # byte size of each of LOGS when the checkpoint was taken
    elapsed: float  # seconds of run time before this checkpoint


def fingerprint(cfg: RunConfig) -> dict[str, Any]:
    """The settings a checkpoint must agree with to be resumed (all but :data:`fedsketch.server.resumable.RUNTIME_KEYS`)."""
    return resumable.fingerprint(cfg.to_mapping())


def save(run_dir: Path, cfg: RunConfig, ckpt: Checkpoint) -> Path:
    """Write ``run_dir/checkpoint.pt`` atomically; returns its path."""
    body = io.BytesIO()
    tree = {"version": VERSION, "config": fingerprint(cfg), **dataclasses.asdict(ckpt)}
    torch.save(tree, body)
    data = body.getvalue()
    path = run_dir / FILE
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC + hashlib.sha256(data).digest() + data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(run_dir)
    return path


def load(run_dir: Path, cfg: RunConfig) -> Checkpoint | None:
    """The checkpoint in ``run_dir``, checked against ``cfg``; ``None`` if there is none.

    Raises
    ------
    CheckpointError
        If the file is not a fedsketch checkpoint, fails its checksum, cannot
        be read, has another format version, was written with other settings,
        or if a log is shorter than when it was taken.
    """
    path = run_dir / FILE
    if not path.exists():
        return None
    refuse = f"refusing to resume from {path}"
    raw = path.read_bytes()
    if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + 32:
        raise CheckpointError(f"{refuse}: it is not a fedsketch checkpoint (bad header). Delete it to start over.")
    digest, data = raw[len(MAGIC) : len(MAGIC) + 32], raw[len(MAGIC) + 32 :]
    if hashlib.sha256(data).digest() != digest:
        raise CheckpointError(
            f"{refuse}: it is corrupt (checksum mismatch: truncated or modified). Delete it to start over."
        )
    try:
        tree = torch.load(io.BytesIO(data), weights_only=True)
        version, saved = tree.pop("version"), tree.pop("config")
        ckpt = Checkpoint(**tree)
    except Exception as exc:  # noqa: BLE001 -- a file with a valid checksum but another layout
        raise CheckpointError(f"{refuse}: it cannot be read ({type(exc).__name__}: {exc})") from None
    if version != VERSION:
        raise CheckpointError(f"{refuse}: it has format version {version}; this fedsketch reads {VERSION}")
    _check_same_settings(refuse, saved, fingerprint(cfg))
    for name, size in ckpt.logs.items():
        have = (run_dir / name).stat().st_size if (run_dir / name).exists() else 0
        if have < size:
            raise CheckpointError(
                f"{refuse}: {name} has {have} bytes, fewer than the {size} it had at round "
                f"{ckpt.round} (was it edited?)"
            )
    return ckpt


def _check_same_settings(refuse: str, saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    differ = resumable.differences(saved, current)
    if differ:
        raise CheckpointError(
            f"{refuse}: it was written by a run with other settings ({resumable.describe(differ)}). "
            "Use another out-dir, or delete the checkpoint to start over."
        )


def log_sizes(run_dir: Path) -> dict[str, int]:
    """The current byte size of each of :data:`LOGS` (0 if absent)."""
    return {name: (run_dir / name).stat().st_size if (run_dir / name).exists() else 0 for name in LOGS}


def rewind_logs(run_dir: Path, sizes: Mapping[str, int]) -> None:
    """Cut each of :data:`LOGS` back to ``sizes`` (0 where not given): rows after a checkpoint are redone."""
    for name in LOGS:
        file = run_dir / name
        if file.exists():
            with open(file, "r+b") as f:
                f.truncate(sizes.get(name, 0))
                f.flush()
                os.fsync(f.fileno())


# ------------------------------------------------------------------------------------------ state trees
def state_to_tree(state: object) -> object:
    """A method's state (dataclasses and mappings of tensors) as plain dicts of CPU tensors."""
    if isinstance(state, torch.Tensor):
        return state.detach().cpu().clone()
    if dataclasses.is_dataclass(state) and not isinstance(state, type):
        return {f.name: state_to_tree(getattr(state, f.name)) for f in dataclasses.fields(state)}
    if isinstance(state, Mapping):
        return {key: state_to_tree(value) for key, value in state.items()}
    if state is None or isinstance(state, (bool, int, float, str)):
        return state
    raise TypeError(f"cannot checkpoint a state holding {type(state).__name__}")


def state_from_tree(template: object, tree: object, where: str = "state") -> object:
    """Rebuild a state like ``template`` (this run's, freshly initialized) from a saved tree.

    Raises
    ------
    CheckpointError
        If the tree's structure, shapes or dtypes differ from the template's.
    """
    if isinstance(template, torch.Tensor):
        if not isinstance(tree, torch.Tensor) or tree.shape != template.shape or tree.dtype != template.dtype:
            got = f"{tree.dtype}{list(tree.shape)}" if isinstance(tree, torch.Tensor) else type(tree).__name__
            raise CheckpointError(f"checkpoint {where} is {got}; this run's is {template.dtype}{list(template.shape)}")
        return tree.to(template.device)
    if dataclasses.is_dataclass(template) and not isinstance(template, type):
        names = [f.name for f in dataclasses.fields(template)]
        if not isinstance(tree, dict) or sorted(tree) != sorted(names):
            raise CheckpointError(f"checkpoint {where} has fields {_keys(tree)}; this run's has {sorted(names)}")
        values = {name: state_from_tree(getattr(template, name), tree[name], f"{where}.{name}") for name in names}
        return dataclasses.replace(template, **values)
    if isinstance(template, Mapping):  # keys vary between runs (e.g. per client): check the values' kind
        if not isinstance(tree, dict) or not all(isinstance(v, torch.Tensor) for v in tree.values()):
            raise CheckpointError(f"checkpoint {where} is not a mapping of tensors")
        return dict(tree)
    if type(tree) is not type(template):
        raise CheckpointError(f"checkpoint {where} is {type(tree).__name__}; this run's is {type(template).__name__}")
    return tree


def books_to_tree(books: Books) -> dict[str, Any]:
    """The books as plain values (the ledger as a dict of its tensor and map)."""
    tree = {f.name: getattr(books, f.name) for f in dataclasses.fields(books)}
    ledger = books.ledger
    return {**tree, "ledger": {"changed_at": ledger.changed_at.detach().cpu().clone(), "synced": dict(ledger.synced)}}


def books_from_tree(template: Books, tree: object) -> Books:
    """Books from a saved tree, checked against this run's (fields, counters, the ledger's size).

    Raises
    ------
    CheckpointError
        If the saved books have other fields or counters, or a ledger of another size.
    """
    names = sorted(f.name for f in dataclasses.fields(template))
    if not isinstance(tree, dict) or sorted(tree) != names:
        raise CheckpointError(f"checkpoint books have fields {_keys(tree)}; expected {names}")
    if sorted(tree["totals"]) != sorted(template.totals) or sorted(tree["since_row"]) != sorted(template.since_row):
        raise CheckpointError(f"checkpoint counters are {sorted(tree['totals'])}; expected {sorted(template.totals)}")
    ledger = tree["ledger"]
    if not isinstance(ledger, dict) or sorted(ledger) != ["changed_at", "synced"]:
        raise CheckpointError(f"checkpoint download ledger has fields {_keys(ledger)}")
    changed_at = state_from_tree(template.ledger.changed_at, ledger["changed_at"], "books.ledger.changed_at")
    values = {**tree, "ledger": DownloadLedger(cast(torch.Tensor, changed_at), dict(ledger["synced"]))}
    return Books(**values)


def _keys(tree: object) -> list[str] | str:
    return sorted(map(str, tree)) if isinstance(tree, dict) else type(tree).__name__


# ------------------------------------------------------------------------------------------ generators
def capture_rng() -> dict[str, Any]:
    """The global Python, numpy and torch (CPU and CUDA) generator states, as plain values."""
    state = cast(tuple[str, np.ndarray, int, int, float], np.random.get_state(legacy=True))
    kind, keys, pos, has_gauss, gauss = state
    out: dict[str, Any] = {
        "python": json.dumps(random.getstate()),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def restore_rng(state: Mapping[str, Any]) -> None:
    """Set the global generators to a :func:`capture_rng` result."""
    version, internal, gauss = json.loads(state["python"])
    random.setstate((version, tuple(internal), gauss))
    npy = state["numpy"]
    np.random.set_state(
        (npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"], npy["gauss"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    """Make a rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
