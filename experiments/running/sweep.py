"""Sweeps: a grid of compression settings, each grid point its own run and its own folder.

An experiment file's ``[sweep]`` table lists values for some settings, the way
the FetchSGD paper (Rothchild et al., ICML 2020, Sec. 6) traces accuracy
against upload by varying the sketch size and k::

    [sweep]
    sketch-rows = [3, 5]
    sketch-cols = [2000, 5000, 10000]
    k = [500, 1000]

Each strategy runs once per point of the cartesian product of the keys that
apply to it (each method's record says which of its settings change what it
uploads: :attr:`fedsketch.methods.Method.sweep`), and once, unswept, if none does: above,
FetchSGD runs 2 x 3 x 2 = 12 points, true top-k 2 (``k`` only), FedAvg one.
A point's folder is named after its values (``fetchsgd/rows3-cols5000-k1000``)
and holds its seeds as an unswept run does. A swept value replaces the one in
``[run]`` and in ``[strategy.NAME]``. Only settings that change what a method
uploads can be swept: sweeping ``lr`` would also give the uncompressed
reference several points, and the report compares every run with one.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fedsketch.config import ConfigError
from fedsketch.methods import METHODS


@dataclass(frozen=True)
class SweepKey:
    """A setting a sweep may vary."""

    short: str
    """Its part of a point's folder name: ``cols`` in ``rows3-cols5000``."""
    strategies: tuple[str, ...]
    """The strategies that use the setting; the others run once, unswept."""


def sweep_keys() -> dict[str, SweepKey]:
    """Every sweepable setting, from the methods' records (a key has one short name across methods)."""
    keys: dict[str, SweepKey] = {}
    for method in METHODS:
        for key, short in method.sweep.items():
            known = keys.get(key, SweepKey(short, ()))
            if known.short != short:
                raise ValueError(f"sweep key {key!r} is named {known.short!r} and {short!r} by different methods")
            keys[key] = SweepKey(short, (*known.strategies, method.name))
    return keys


SWEEP_KEYS = sweep_keys()

Sweep = dict[str, tuple[Any, ...]]
"""Swept key -> its values, in the order the file lists them."""


def parse_sweep(table: Mapping[str, Any], source: str) -> Sweep:
    """Check a ``[sweep]`` table: known keys, each with a non-empty list of distinct values.

    The values' types and ranges are checked later, run by run, by
    :class:`fedsketch.config.RunConfig`.

    Raises
    ------
    ConfigError
        Naming the key that cannot be swept, or whose values are not a list of distinct values.
    """
    sweep: Sweep = {}
    for key, values in table.items():
        if key not in SWEEP_KEYS:
            raise ConfigError(
                f"{source}: [sweep] key {key!r} cannot be swept; sweepable keys: {', '.join(sorted(SWEEP_KEYS))}"
            )
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{source}: [sweep] key {key!r} must be a non-empty list of values, got {values!r}")
        if len(set(map(repr, values))) != len(values):
            raise ConfigError(f"{source}: [sweep] key {key!r} lists a value twice: {values!r}")
        sweep[key] = tuple(values)
    return sweep


def check_applies(sweep: Sweep, strategies: Sequence[str], source: str) -> None:
    """Every swept key is used by at least one of ``strategies`` (else the sweep would be silently ignored).

    Raises
    ------
    ConfigError
        Naming the key and the strategies that would use it.
    """
    for key in sweep:
        users = SWEEP_KEYS[key].strategies
        if not set(users) & set(strategies):
            raise ConfigError(
                f"{source}: [sweep] key {key!r} is used only by {', '.join(users)}, none of which the experiment runs"
            )


def points(sweep: Sweep, strategy: str) -> list[dict[str, Any]]:
    """The settings of every point ``strategy`` runs at: ``[{}]`` when no swept key applies to it."""
    keys = [key for key in sweep if strategy in SWEEP_KEYS[key].strategies]
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*(sweep[key] for key in keys))]


def point_name(point: Mapping[str, Any]) -> str:
    """A point's folder name, e.g. ``rows3-cols5000-k1000``; ``""`` for the empty point."""
    return "-".join(f"{SWEEP_KEYS[key].short}{value}" for key, value in point.items())
