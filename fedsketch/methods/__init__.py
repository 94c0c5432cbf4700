"""Every method fedsketch runs, in one registry.

Each method is one :class:`~fedsketch.methods.method.Method` record, defined in
its own module beside its math: FetchSGD (Rothchild et al., ICML 2020), the
uncompressed and true top-k references, the compressed-upload baselines and
Sketched-SGD (Ivkin et al., NeurIPS 2019). The run config's strategy choices,
the settings a method declares, sweeps, the client's encoder, the server's
step and the documentation tables all read this registry; adding a method is
a module with its record and one line below (see docs/extending.md).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from fedsketch.methods import compressed, dense, fetchsgd, powersgd, sketched_sgd
from fedsketch.methods.method import ClientJob, ClientUpdate, Method, Payload, PayloadCheck, PayloadSpec, Round, State
from fedsketch.setting import ConfigError

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

METHODS: tuple[Method, ...] = (
    fetchsgd.METHOD,
    dense.FEDAVG,
    dense.TRUE_TOPK,
    *compressed.METHODS,
    sketched_sgd.METHOD,
    powersgd.METHOD,
)
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
    """The method's round settings (:attr:`Method.round_config`'s keys) as a round's config gives them.

    A client uses these, not its own run config, and echoes them back, so the
    server can refuse a reply made with other settings (a stale client).
    """
    keys = get_method(cfg.strategy).round_config(cfg)
    return {key: int(config[key]) for key in keys if key in config}  # type: ignore[call-overload]


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
