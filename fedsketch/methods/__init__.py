"""Every method fedsketch runs, in one registry.

Each method is one :class:`~fedsketch.methods.method.Method` record, defined in
its own module beside its math: FetchSGD (Rothchild et al., ICML 2020), the
uncompressed and true top-k references, the compressed-upload baselines and
Sketched-SGD (Ivkin et al., NeurIPS 2019). The client's encoder, the server's
step, sweeps and the documentation tables read this registry; parsing and
checking a run's settings read what each method is in plain data instead
(:mod:`fedsketch.settings.declared`), without importing it. Adding a method is
its table in a .toml file beside its module and a module of this package with
its record: the registry finds every ``METHOD`` (or ``METHODS``) its modules
define (see docs/extending.md).
"""

from __future__ import annotations

import difflib
import importlib
import pkgutil
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fedsketch import wire
from fedsketch.methods.method import ClientJob, ClientUpdate, Method, Payload, PayloadCheck, PayloadSpec, Round, State
from fedsketch.settings.declared import STRATEGIES
from fedsketch.settings.setting import ConfigError

if TYPE_CHECKING:
    from fedsketch.config import RunConfig


def _discover() -> tuple[Method, ...]:
    """Every :class:`Method` record the package's modules define (``METHOD`` or ``METHODS``), by name.

    Raises
    ------
    ValueError
        If two records share a name, or the records and the .toml files' declarations name different methods.
    """
    found: list[Method] = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        one = getattr(module, "METHOD", None)
        found.extend(getattr(module, "METHODS", (one,) if one is not None else ()))
    names = [m.name for m in found]
    if len(set(names)) != len(names):
        raise ValueError(f"two methods share a name: {sorted(n for n in set(names) if names.count(n) > 1)}")
    if sorted(names) != sorted(STRATEGIES):
        raise ValueError(
            f"the methods' .toml files declare {sorted(STRATEGIES)} but the modules define {sorted(names)}"
        )
    return tuple(sorted(found, key=lambda m: m.name))


METHODS: tuple[Method, ...] = _discover()
REGISTRY: dict[str, Method] = {m.name: m for m in METHODS}
NAMES: tuple[str, ...] = tuple(REGISTRY)


def get_method(name: str) -> Method:
    """The method called ``name``.

    Raises
    ------
    ConfigError
        For an unknown name, with the closest known one.
    """
    if name not in REGISTRY:
        near = difflib.get_close_matches(name, NAMES, n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise ConfigError(f"unknown strategy {name!r}{hint}; known: {', '.join(NAMES)}")
    return REGISTRY[name]


def received_round_config(cfg: RunConfig, config: Mapping[str, object]) -> dict[str, int]:
    """The method's round settings (:attr:`~fedsketch.methods.method.Wire.round_config`'s keys) as a round's config gives them.

    A client uses these, not its own run config, and echoes them back, so the
    server can refuse a reply made with other settings (a stale client).
    """
    keys = get_method(cfg.strategy).wire.round_config(cfg)
    return {key: wire.config_int(config, key) for key in keys if key in config}


__all__ = [
    "METHODS",
    "NAMES",
    "REGISTRY",
    "ClientJob",
    "ClientUpdate",
    "Method",
    "Payload",
    "PayloadCheck",
    "PayloadSpec",
    "Round",
    "State",
    "get_method",
    "received_round_config",
]
