"""Data that takes its own time to load, loaded once per command and handed to the run's Flower processes.

A user's loader (``dataset = "package.module:function"``) and an ``imagefolder``
(every image decoded) may take minutes, and every Flower process of a run (the
simulation process, Ray's workers, a deployment's ClientApps) would otherwise
load again what the command's checks loaded. So the command loads once
(:func:`read`, timed) and, once its checks have passed, writes the arrays it
got to ``OUT/_inputs/loaded-<name>-<hash>.npz`` (:func:`hand_over`) and names that
folder, with its own process id, in the environment variable :data:`ENV`, which
every process it starts inherits. Such a process reads the file instead of
loading (:func:`load`). The command's own process never reads one: it holds
what it loaded, so a notebook that ran :func:`experiments.api.run` does not
pick up an earlier command's file later. A process that finds no file (another
machine of a Ray cluster, a device of a deployment kit) loads as before.
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedsketch.data import user
from fedsketch.data.checks import as_samples
from fedsketch.data.spec import DataSpec
from fedsketch.settings import entry

INPUTS = "_inputs"
"""The folder under the results folder (``out-dir``) for a command's inputs: data objects and builders the Python
API was handed (:mod:`experiments.api`), and data a command loaded for its Flower processes
(this module)."""
ENV = "FEDSKETCH_LOADED"
"""``PID:FOLDER``: the command (its pid) that handed data over, and the folder it wrote the files to."""
Source = tuple[object, ...]
"""What a load depends on, and nothing else: the loader and the arguments it declares, or the folder."""
_ARRAYS = ("x_train", "y_train", "x_test", "y_test")


@dataclass(frozen=True, eq=False)
class Loaded:
    """One load: float32 samples and int64 labels, as training reads them, and what the load said."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    client_ids: np.ndarray | None
    num_classes: int | None  # the folder's class count; None where the labels or the settings say
    name: str  # where the data came from, as errors name it
    note: str = ""  # what the load skipped, for the command to say
    seconds: float = 0.0  # how long it took


_HELD: dict[Source, Loaded] = {}
"""What this process loaded for its current command (:func:`forget` starts a new one)."""


def handed(spec: DataSpec) -> bool:
    """Whether ``spec``'s data is loaded once per command and handed over: a user's loader or an image folder."""
    return spec.dataset == "imagefolder" or entry.is_reference(spec.dataset)


def holds(spec: DataSpec) -> bool:
    """Whether this process loaded ``spec``'s data for its current command."""
    return source(spec) in _HELD


def source(spec: DataSpec) -> Source:
    """What loading ``spec``'s data depends on: an image folder's root and class count; a loader and the
    arguments it declares (a loader that takes no ``seed`` loads once for every seed)."""
    if spec.dataset == "imagefolder":
        return ("imagefolder", spec.root, spec.num_classes)
    return (spec.dataset, *sorted(user.arguments(spec).items()))


def describe(spec: DataSpec) -> str:
    """What :func:`read` will load, in words: ``mylab.data:load(root='data', seed=0)``, ``imagefolder:ROOT``."""
    if spec.dataset == "imagefolder":
        return f"imagefolder:{spec.root} (decoding every image)"
    arguments = ", ".join(f"{key}={value!r}" for key, value in user.arguments(spec).items())
    return f"{spec.dataset}({arguments})"


def load(spec: DataSpec) -> Loaded:
    """``spec``'s data: what this process holds, else what its command handed over, else :func:`read`."""
    key = source(spec)
    if key in _HELD:
        return _HELD[key]
    received = _received(key)
    return received if received is not None else read(spec)


def read(spec: DataSpec) -> Loaded:
    """Call the loader, or decode the folder, now; the arrays checked as :func:`as_samples` checks them.

    Raises
    ------
    ValueError
        Naming the loader and what it raised or returned, or the array that is not what training reads.
    FileNotFoundError, DataError
        For an image folder: a split missing, a file that is not an image, images of two sizes.
    """
    start = time.perf_counter()
    classes: int | None = None
    note = ""
    if spec.dataset == "imagefolder":
        from fedsketch.data import folder  # torchvision and Pillow, which a device need not have

        x_train, y_train, x_test, y_test, classes, note = folder.load(spec.root, spec.num_classes)
        ids, name = None, f"imagefolder:{spec.root}"
    else:
        x_train, y_train, x_test, y_test, ids = user.load(spec)
        name = spec.dataset
    xtr, ytr = as_samples(x_train, y_train, "train", name)
    xte, yte = as_samples(x_test, y_test, "test", name)
    ids = None if ids is None else np.asarray(ids)
    return Loaded(xtr, ytr, xte, yte, ids, classes, name, note, time.perf_counter() - start)


def hold(spec: DataSpec, loaded: Loaded) -> None:
    """Keep ``loaded`` for this process's current command: :func:`load` returns it, :func:`hand_over` writes it."""
    _HELD[source(spec)] = loaded


def hand_over(out_dir: str | Path) -> list[tuple[str, Path]]:
    """Write every load this process holds for the processes it starts; ``(name, path)`` of each file.

    Called once the command's checks have passed, so a refused command writes nothing. Each file is
    written to a temporary name and renamed, so no reader sees half a file.
    """
    folder = Path(out_dir).resolve() / INPUTS
    written = []
    for key, loaded in _HELD.items():
        path = _path(folder, key)
        arrays = {name: getattr(loaded, name).numpy() for name in _ARRAYS}
        if loaded.client_ids is not None:
            ids = loaded.client_ids
            arrays["client_ids"] = (
                np.unique(ids, return_inverse=True)[1].reshape(ids.shape) if ids.dtype == object else ids
            )
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            classes = np.array(loaded.num_classes or -1)
            np.savez(f, name=np.array(loaded.name), classes=classes, **arrays)  # type: ignore[arg-type]  # numpy's stub
        tmp.replace(path)
        written.append((loaded.name, path))
    if written:
        os.environ[ENV] = f"{os.getpid()}:{folder}"
    return written


def forget() -> None:
    """A new command: nothing loaded yet (this process's own loads, not files other processes may read)."""
    _HELD.clear()


def _received(key: Source) -> Loaded | None:
    """What the command that started this process handed over for ``key``; ``None`` if it is this process
    (it holds its loads) or no file is there."""
    pid, _, folder = os.environ.get(ENV, "").partition(":")
    if not folder or pid == str(os.getpid()):
        return None
    path = _path(Path(folder), key)
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as f:
        x_train, y_train, x_test, y_test = (torch.from_numpy(f[name]) for name in _ARRAYS)
        ids = f["client_ids"] if "client_ids" in f.files else None
        classes, name = int(f["classes"]), str(f["name"])
    return Loaded(x_train, y_train, x_test, y_test, ids, classes if classes >= 0 else None, name)


def _path(folder: Path, key: Source) -> Path:
    """``folder/loaded-<what>-<hash of the key>.npz``: one file per distinct load, rewritten by each command."""
    stem = re.sub(r"[^A-Za-z0-9_.]+", "_", str(key[0]).rsplit("/", 1)[-1]).strip("_.") or "data"
    return folder / f"loaded-{stem}-{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}.npz"
