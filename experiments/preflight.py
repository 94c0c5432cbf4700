"""Checks that need the model, run before any Flower process starts.

Settings that do not fit the model (``k`` above the number of parameters,
client state above ``max-client-state-mb``) would otherwise surface only inside
the ServerApp, after Flower has started, as a traceback in ``flower.log``.
Here the model is built from the dataset's known input shape, without loading
any data, so the check is cheap even for datasets that take minutes to load.
"""

from __future__ import annotations

from collections.abc import Iterable

from fedsketch.config import RunConfig, check_against_model
from fedsketch.data.registry import DATASETS
from fedsketch.models import build_model

SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    name: (info.input_shape, info.num_classes)
    for name, info in DATASETS.items()
    if info.input_shape is not None and info.num_classes is not None
}
"""Input shape and number of classes of each dataset whose shape is fixed (``npz`` is the user's)."""


def model_size(cfg: RunConfig) -> int | None:
    """The number of parameters of the run's model; ``None`` if the data must be read to know it."""
    if cfg.dataset not in SHAPES:
        return None
    shape, classes = SHAPES[cfg.dataset]
    model = build_model(cfg.model, shape, classes, seed=cfg.seed, norm=cfg.model_norm, hidden=cfg.model_hidden)
    return sum(p.numel() for p in model.parameters())


def check_runs(runs: Iterable[RunConfig]) -> None:
    """Every run's model-dependent checks (one model build per distinct model).

    Raises
    ------
    ConfigError
        The first run whose settings do not fit its model, naming the setting.
    """
    sizes: dict[tuple[str, str, int, str], int | None] = {}
    for cfg in runs:
        key = (cfg.dataset, cfg.model, cfg.model_hidden, cfg.model_norm)
        if key not in sizes:
            sizes[key] = model_size(cfg)
        d = sizes[key]
        if d is not None:
            check_against_model(cfg, d)
