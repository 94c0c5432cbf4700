"""Every check a run config must pass, made once, before any training.

:class:`fedsketch.config.RunConfig` calls :func:`check` on construction;
what needs the model's size is checked once it is built
(:mod:`fedsketch.fit`). What a method allows is read from its
declaration in plain data (:mod:`fedsketch.settings.declared`), never from its
math: whether its uploads add up (differential privacy, secure aggregation),
whether they can be clipped, which settings it reads, whether its clients keep
state (memory, checkpoints). Nothing here imports torch. Every refusal names
the setting and says why.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from fedsketch.data import registry
from fedsketch.data.registry import NAMES as DATASETS
from fedsketch.data.spec import HF_DEFAULTS, PARTITIONS, check_huggingface
from fedsketch.settings import device, entry
from fedsketch.settings.declared import DECLARATIONS, STRATEGIES, Declaration, choices
from fedsketch.settings.setting import ConfigError

if TYPE_CHECKING:
    from fedsketch.settings.fields import Fields

FIXED = (
    "model",
    "model-norm",
    "client-update",
    "client-state",
    "client-assignment",
    "download",
    "lr-schedule",
    "tracking",
)
"""The settings whose choices fedsketch/settings/settings.toml lists."""
CHOICES: dict[str, tuple[str, ...]] = {
    "strategy": STRATEGIES,
    "dataset": DATASETS,
    "partition": PARTITIONS,
    **{key.replace("-", "_"): choices(key) for key in FIXED},
}
POSITIVE = (
    "num_rounds",
    "num_clients",
    "clients_per_round",
    "eval_every",
    "model_hidden",
    "local_batch_size",
    "local_steps",
    "sketch_rows",
    "sketch_cols",
    "k",
    "min_replies",
    "min_nodes",
    "max_client_state_mb",
    "lr",
    "client_lr",
    "partition_alpha",
    "round_timeout",
    "reply_poll_s",
)
NON_NEGATIVE = (
    "seed",
    "samples_per_client",
    "weight_decay",
    "synthetic_devices",
    "quantizer_bucket_size",
    "download_k",
    "client_batching",
    "clip_norm",
    "norm_bound",
    "dp_noise_multiplier",
    "checkpoint_every",
    "num_classes",
    "synthetic_alpha",
    "synthetic_beta",
)


def check(cfg: Fields) -> None:
    """Every check that needs only the config.

    Raises
    ------
    ConfigError
        The first setting out of range or not allowed together with the others.
    """
    _choices(cfg)
    method = DECLARATIONS[cfg.strategy]
    _ranges(cfg)
    _model_fits_data(cfg)
    _partition_reads(cfg)
    _huggingface(cfg)
    _privacy(cfg, method)
    _download(cfg, method)
    _runtime(cfg, method)
    _diagnostics(cfg, method)


def _key(name: str) -> str:
    return name.replace("_", "-")


REFERABLE = ("model", "dataset")
"""The settings that may name the user's own code instead of a built-in (:mod:`fedsketch.settings.entry`)."""


def _choices(cfg: Fields) -> None:
    for name, allowed in CHOICES.items():
        value = getattr(cfg, name)
        if name in REFERABLE and entry.is_reference(value):
            reason = entry.check_syntax(name, value)
            if reason:
                raise ConfigError(reason)
            continue
        if value not in allowed:
            more = " or 'package.module:function'" if name in REFERABLE else ""
            raise ConfigError(f"setting '{_key(name)}' must be one of {', '.join(allowed)}{more}; got {value!r}")
    if not device.valid(cfg.device):
        raise ConfigError(f"setting 'device' must be one of {', '.join(device.NAMES)} or 'cuda:N'; got {cfg.device!r}")


def _ranges(cfg: Fields) -> None:
    for name in POSITIVE:
        if not getattr(cfg, name) > 0:  # NaN is refused too
            raise ConfigError(f"setting '{_key(name)}' must be > 0; got {getattr(cfg, name)}")
    for name in NON_NEGATIVE:
        if not getattr(cfg, name) >= 0:
            raise ConfigError(f"setting '{_key(name)}' must be >= 0; got {getattr(cfg, name)}")
    if not 0.0 <= cfg.object_retry_s <= 0.25:
        raise ConfigError(
            f"setting 'object-retry-s' must be in [0, 0.25] (0: Flower's own retries); got {cfg.object_retry_s}"
        )
    if not 0.0 <= cfg.momentum < 1.0:
        raise ConfigError(f"setting 'momentum' must be in [0, 1); got {cfg.momentum}")
    if not 0.0 <= cfg.client_momentum < 1.0:
        raise ConfigError(f"setting 'client-momentum' must be in [0, 1); got {cfg.client_momentum}")
    if cfg.client_momentum and cfg.client_update != "delta":
        raise ConfigError(
            f"setting 'client-momentum' needs 'client-update' = 'delta' (local SGD steps); got "
            f"'client-update' = {cfg.client_update!r}, one gradient a client, which has no local steps to carry it"
        )
    if not 0.0 < cfg.dp_delta < 1.0:
        raise ConfigError(f"setting 'dp-delta' must be in (0, 1); got {cfg.dp_delta}")
    if cfg.clients_per_round > cfg.num_clients:
        raise ConfigError(
            f"setting 'clients-per-round' ({cfg.clients_per_round}) exceeds 'num-clients' ({cfg.num_clients})"
        )
    if cfg.min_replies > cfg.clients_per_round:
        raise ConfigError(
            f"setting 'min-replies' ({cfg.min_replies}) exceeds 'clients-per-round' ({cfg.clients_per_round})"
        )


READ_BY = {
    "partition_alpha": ("dirichlet", "flwr-dirichlet"),
    "classes_per_client": ("pathological", "flwr-pathological"),
    "shards_per_client": ("shards", "flwr-shard"),
}
"""The partitioners' own settings, and the partitions that read each (fedsketch's, flwr-datasets')."""


def _partition_reads(cfg: Fields) -> None:
    """A partitioner's own setting changed from its default is refused under another partition (never ignored)."""
    defaults = {f.name: f.default for f in fields(cfg)}
    for name, (partition, flwr) in READ_BY.items():
        if cfg.partition not in (partition, flwr) and getattr(cfg, name) != defaults[name]:
            raise ConfigError(
                f"setting '{_key(name)}' ({getattr(cfg, name)}) is read only by partition '{partition}'; "
                f"partition is '{cfg.partition}', which would ignore it ('{flwr}' reads it too)"
            )
    if cfg.partition == "natural" and cfg.synthetic_devices not in (0, cfg.num_clients):
        raise ConfigError(
            f"setting 'synthetic-devices' ({cfg.synthetic_devices}) differs from 'num-clients' ({cfg.num_clients}): "
            "partition 'natural' gives each client one generating device; choose another partition or set 0"
        )


def _huggingface(cfg: Fields) -> None:
    """The ``hf-*`` settings (:func:`fedsketch.data.spec.check_huggingface`)."""
    try:
        check_huggingface(cfg.dataset, {name: getattr(cfg, name) for name in HF_DEFAULTS})
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _model_fits_data(cfg: Fields) -> None:
    """A dataset that names its model (word ids: ``synthetic_text`` and ``bag``) goes with that model only;
    a dataset of fixed classes takes no other ``num-classes``."""
    fixed = registry.DATASETS[cfg.dataset].num_classes if cfg.dataset in registry.DATASETS else None
    if cfg.num_classes and fixed is not None and cfg.num_classes != fixed:
        raise ConfigError(f"setting 'num-classes' is {cfg.num_classes} but dataset {cfg.dataset!r} has {fixed} classes")
    for dataset, info in registry.DATASETS.items():
        if info.model and (cfg.dataset == dataset) != (cfg.model == info.model):
            raise ConfigError(
                f"setting 'model' ({cfg.model!r}) does not fit 'dataset' ({cfg.dataset!r}): dataset {dataset!r} is "
                f"read by model {info.model!r} only, and that model reads no other dataset"
            )


def _linear() -> str:
    return ", ".join(m.name for m in DECLARATIONS.values() if m.linear)


def _privacy(cfg: Fields, method: Declaration) -> None:
    if cfg.clip_norm > 0 and method.keeps_state_with(cfg):
        raise ConfigError(
            f"setting 'clip-norm' is not available for {method.name} with these settings: its clients keep error "
            "feedback, and a clipped upload would leave their memory out of step with what the server applied"
        )
    if cfg.clip_norm > 0 and not method.clip:
        raise ConfigError(
            f"setting 'clip-norm' is not available for {method.name}: its upload is not one vector the server "
            "could scale (its second exchange sends values computed from the first)"
        )
    if cfg.dp_noise_multiplier > 0:
        if not method.linear:
            raise ConfigError(
                f"setting 'dp-noise-multiplier' needs a strategy whose uploads add up linearly ({_linear()}); "
                f"got {cfg.strategy!r}"
            )
        if cfg.clip_norm <= 0:
            raise ConfigError("setting 'dp-noise-multiplier' needs 'clip-norm' > 0: noise is scaled to the clip norm")
    if cfg.secure_aggregation:
        if not method.linear:
            raise ConfigError(
                f"setting 'secure-aggregation' needs a strategy whose uploads add up linearly ({_linear()}); "
                f"got {cfg.strategy!r}"
            )
        if cfg.dp_noise_multiplier > 0:
            raise ConfigError(
                "settings 'secure-aggregation' and 'dp-noise-multiplier' are not combined: DP clips and weighs "
                "single clients on the server, which secure aggregation hides from it"
            )


def _download(cfg: Fields, method: Declaration) -> None:
    if cfg.download_k > 0 and not method.reads("download-k"):
        users = ", ".join(m.name for m in DECLARATIONS.values() if m.reads("download-k"))
        raise ConfigError(
            f"setting 'download-k' applies to the compressed-upload baselines ({users}); got strategy "
            f"{cfg.strategy!r}, whose server update is "
            + ("already k-sparse (setting 'k')" if method.reads("k") else "dense by definition")
        )
    if cfg.download_from_init and cfg.download != "sparse":
        raise ConfigError(
            f"setting 'download-from-init' needs 'download' = 'sparse' (a catch-up from the initial model); "
            f"got 'download' = {cfg.download!r}"
        )
    if cfg.download == "sparse" and cfg.secure_aggregation:
        raise ConfigError(
            "settings 'download' = 'sparse' and 'secure-aggregation' are not combined: the SecAgg+ round sends "
            "the dense model and counts what it sends"
        )


def _runtime(cfg: Fields, method: Declaration) -> None:
    """A restart loses state kept on the nodes."""
    if cfg.checkpoint_every and method.keeps_state_with(cfg):
        raise ConfigError(
            f"setting 'checkpoint-every' is not available for {cfg.strategy} with these settings: "
            "its clients keep state on their nodes, which a restart loses"
        )


def _diagnostics(cfg: Fields, method: Declaration) -> None:
    """``diagnose-sketch`` has every client send its dense update too: only where that is harmless and meaningful."""
    if not cfg.diagnose_sketch:
        return
    if not method.reads("diagnose-sketch"):
        raise ConfigError(
            f"setting 'diagnose-sketch' is only for strategy fetchsgd (it compares FetchSGD's sketched top-k with "
            f"the true one); got {cfg.strategy!r}"
        )
    if cfg.client_assignment != "cohort":
        raise ConfigError(
            "setting 'diagnose-sketch' needs 'client-assignment' = 'cohort' (simulation): it has every client send "
            "its dense update as well, which a deployment exists to avoid"
        )
    if cfg.secure_aggregation:
        raise ConfigError(
            "settings 'diagnose-sketch' and 'secure-aggregation' are not combined: the diagnostic shows the server "
            "each client's dense update, which secure aggregation exists to hide"
        )
    if cfg.dp_noise_multiplier > 0:
        raise ConfigError(
            "settings 'diagnose-sketch' and 'dp-noise-multiplier' are not combined: the noise goes into the sketches "
            "only, so the dense reference would have no counterpart of it"
        )
