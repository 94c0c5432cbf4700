"""The checks of a run's settings that need the model's size d, made once it is built, before any training.

What the settings alone decide is checked when they are parsed (:mod:`fedsketch.validate`, without
the methods' math); what depends on d is checked here, with the method's own limits
(:attr:`fedsketch.methods.method.Method.check`) and its clients' kept state.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from fedsketch import sketch_regime
from fedsketch.methods import get_method
from fedsketch.settings.setting import ConfigError

if TYPE_CHECKING:
    from fedsketch.config import RunConfig


def check_against_model(cfg: RunConfig, d: int) -> None:
    """Checks that need the model size ``d``; run before any training.

    Raises
    ------
    ConfigError
        If ``k`` or ``download-k`` exceeds the number of parameters, if the sketch has fewer columns than ``k``
        (:func:`fedsketch.sketch_regime.refuse`; checked here, on each run an experiment makes, rather than on the
        tables it is made of), if the method's own limits are not met (e.g. Sketched-SGD's
        ``candidate-factor * k``), or if the clients' kept state would exceed ``max-client-state-mb`` (or, with
        ``client-state = "disk"``, the free disk space).
    """
    method = get_method(cfg.strategy)
    if method.reads("k") and cfg.k > d:
        raise ConfigError(f"setting 'k' ({cfg.k}) exceeds the model's {d} parameters")
    if cfg.download_k > d:
        raise ConfigError(f"setting 'download-k' ({cfg.download_k}) exceeds the model's {d} parameters")
    sketch_regime.refuse(cfg)
    method.check(cfg, d)
    need, what = client_state_bytes(cfg, d), describe_client_state(cfg, d)
    if cfg.client_state == "disk":
        _check_disk(cfg, need, what)
    elif need > cfg.max_client_state_mb * 2**20:
        raise ConfigError(
            f"{what}, above setting 'max-client-state-mb' ({cfg.max_client_state_mb}); lower 'num-clients', "
            "or raise 'max-client-state-mb' if the machine has the memory, or keep it on disk: client-state = 'disk'"
        )


def client_state_bytes(cfg: RunConfig, d: int) -> int:
    """Worst-case bytes of client state over the whole run: every client has taken part.

    A client keeps its committed state and, until it learns whether its last upload was applied,
    the pending one (:mod:`fedsketch.client.state`): twice the method's vectors.
    """
    return 2 * 4 * d * cfg.num_clients * get_method(cfg.strategy).client.state_vectors(cfg)


def describe_client_state(cfg: RunConfig, d: int) -> str:
    """The estimate of :func:`client_state_bytes` in words, for error messages and logs."""
    vectors = get_method(cfg.strategy).client.state_vectors(cfg)
    return (
        f"{cfg.strategy} keeps {vectors} float32 vector(s) of d={d:,} per client, committed and pending: "
        f"{cfg.num_clients:,} clients x {8 * d * vectors / 2**20:,.1f} MiB = {client_state_bytes(cfg, d) / 2**30:,.2f} "
        "GiB of client state"
    )


def _check_disk(cfg: RunConfig, need: int, what: str) -> None:
    """With ``client-state = "disk"``, the clients' state must fit on the out-dir's file system."""
    root = Path(cfg.out_dir).resolve()
    while not root.exists():
        root = root.parent
    free = shutil.disk_usage(root).free
    if need > free:
        raise ConfigError(
            f"{what}, more than the {free / 2**30:,.2f} GiB free under {root} (setting 'client-state' = 'disk')"
        )
