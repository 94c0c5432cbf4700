"""A data set from the user's own loader, named ``package.module:function`` in the ``dataset`` setting.

The loader is called with the keyword arguments it declares among ``root``
(the ``data-root`` setting) and ``seed`` (the run seed), and returns either

- a mapping with ``x_train``, ``y_train``, ``x_test``, ``y_test`` and, for the
  natural partition, ``client_ids`` (the keys of an ``npz`` file), or a tuple
  of those four (or five) arrays, in that order; or
- a pair ``(train, test)`` of ``torch.utils.data.Dataset`` of ``(sample, label)``.

Arrays are numpy arrays or tensors, samples already normalized (float), labels
integers in ``[0, num-classes)``: the contract of :func:`fedsketch.data.from_arrays`,
which checks it. The command calls the loader once and hands what it returned to the run's
Flower processes (:mod:`fedsketch.data.handoff`).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from torch.utils.data import Dataset

from fedsketch.data.spec import DataSpec
from fedsketch.settings import entry

KEYS = ("x_train", "y_train", "x_test", "y_test")


def load(spec: DataSpec) -> tuple[Any, Any, Any, Any, Any]:
    """``x_train, y_train, x_test, y_test, client_ids`` (ids possibly None) from the loader ``spec.dataset`` names.

    Raises
    ------
    ValueError
        If the loader cannot be imported, fails, or returns something else than the contract above.
    """
    loader = entry.load("dataset", spec.dataset)
    try:
        result = loader(**arguments(spec))
    except Exception as exc:  # noqa: BLE001  # whatever the user's loader raises, as one line with its place
        raise ValueError(f"setting 'dataset': {spec.dataset} raised {entry.raised(exc)}") from None
    return unpack(result, spec.dataset)


def arguments(spec: DataSpec) -> dict[str, Any]:
    """The keyword arguments the loader ``spec.dataset`` names is called with: those it declares of ``root`` and
    ``seed``.

    Raises
    ------
    ValueError
        If the loader cannot be imported.
    """
    declared = inspect.signature(entry.load("dataset", spec.dataset)).parameters
    return {name: value for name, value in (("root", spec.root), ("seed", spec.seed)) if name in declared}


def unpack(result: Any, source: str) -> tuple[Any, Any, Any, Any, Any]:
    """A loader's (or the Python API's) data in one shape: four arrays (or Datasets and Nones) and the client ids."""
    if isinstance(result, Mapping):
        missing = [key for key in KEYS if key not in result]
        if missing:
            raise ValueError(f"{source} returned a mapping without {missing}; it has {sorted(result)}")
        return (*(result[key] for key in KEYS), result.get("client_ids"))
    if isinstance(result, tuple | list):
        if len(result) == 2 and all(isinstance(part, Dataset) for part in result):
            return result[0], None, result[1], None, None
        if len(result) in (4, 5):
            return (*result[:4], result[4] if len(result) == 5 else None)
    raise ValueError(
        f"{source} returned a {type(result).__name__}; expected a mapping of {', '.join(KEYS)} (and client_ids), "
        "a tuple of those arrays, or a pair (train, test) of torch Datasets"
    )
