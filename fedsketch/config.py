"""One flat, typed run configuration, parsed once at the edge.

Every setting a run needs is a field of :class:`RunConfig` or a
:class:`~fedsketch.settings.setting.Setting` that a method declares in its own module
(QSGD's levels, Sketched-SGD's candidate factor). Outside Python the keys are
kebab-case (``sketch-cols``), exactly as in ``[tool.flwr.app.config]`` of
``pyproject.toml`` and in experiment files. Parsing rejects unknown keys, wrong
types and values out of range with a message that names the key, before any
training starts (:mod:`fedsketch.validate`). docs/settings.md is generated
from the fields' docs (``python -m tests.tools.settings_doc``).
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from fedsketch import validate
from fedsketch.methods import METHODS
from fedsketch.settings import suggest
from fedsketch.settings.setting import ConfigError, Setting, coerce, parse_extras

DECLARED: dict[str, Setting[Any]] = {s.key: s for m in METHODS for s in m.settings}
"""The settings methods declare in their own modules, by key."""

__all__ = ["DECLARED", "ConfigError", "RunConfig", "check_against_model"]


TABLE: dict[str, dict[str, Any]] = tomllib.loads(
    (Path(__file__).parent / "settings" / "settings.toml").read_text("utf-8")
)
"""Every field's default and meaning, by key (fedsketch/settings/settings.toml)."""


def _s(key: str) -> Any:
    """The field of setting ``key``: its default and its line in docs/settings.md, from the table."""
    # left unmutated: called at import, before mutation testing can switch a mutant on (tests/fedsketch/test_validate.py)
    return field(default=TABLE[key]["default"], metadata={"doc": TABLE[key]["doc"]})  # pragma: no mutate


@dataclass(frozen=True)
class RunConfig:
    """Every setting of one run (one strategy, one seed); defaults are the embedded default job's data."""

    # --- what runs
    experiment: str = _s("experiment")
    strategy: str = _s("strategy")
    seed: int = _s("seed")
    num_rounds: int = _s("num-rounds")
    num_clients: int = _s("num-clients")
    clients_per_round: int = _s("clients-per-round")
    eval_every: int = _s("eval-every")
    out_dir: str = _s("out-dir")
    tracking: str = _s("tracking")
    # --- data (docs/data.md)
    dataset: str = _s("dataset")
    data_root: str = _s("data-root")
    hf_features: str = _s("hf-features")
    hf_label: str = _s("hf-label")
    hf_client_id: str = _s("hf-client-id")
    hf_train_split: str = _s("hf-train-split")
    hf_test_split: str = _s("hf-test-split")
    hf_test_fraction: float = _s("hf-test-fraction")
    partition: str = _s("partition")
    partition_alpha: float = _s("partition-alpha")
    classes_per_client: int = _s("classes-per-client")
    shards_per_client: int = _s("shards-per-client")
    samples_per_client: int = _s("samples-per-client")
    synthetic_alpha: float = _s("synthetic-alpha")
    synthetic_beta: float = _s("synthetic-beta")
    synthetic_devices: int = _s("synthetic-devices")
    num_classes: int = _s("num-classes")
    # --- model
    model: str = _s("model")
    model_hidden: int = _s("model-hidden")
    model_norm: str = _s("model-norm")
    # --- client computation
    client_update: str = _s("client-update")
    local_batch_size: int = _s("local-batch-size")
    local_steps: int = _s("local-steps")
    client_batching: int = _s("client-batching")
    client_lr: float = _s("client-lr")
    weight_decay: float = _s("weight-decay")
    client_momentum: float = _s("client-momentum")
    # --- server optimizer
    lr: float = _s("lr")
    lr_schedule: str = _s("lr-schedule")
    momentum: float = _s("momentum")
    # --- sketches and k
    sketch_rows: int = _s("sketch-rows")
    sketch_cols: int = _s("sketch-cols")
    k: int = _s("k")
    quantizer_bucket_size: int = _s("quantizer-bucket-size")
    max_client_state_mb: int = _s("max-client-state-mb")
    client_state: str = _s("client-state")
    download: str = _s("download")
    download_from_init: bool = _s("download-from-init")
    download_k: int = _s("download-k")
    # --- runtime
    client_assignment: str = _s("client-assignment")
    min_nodes: int = _s("min-nodes")
    device: str = _s("device")
    round_timeout: float = _s("round-timeout")
    reply_poll_s: float = _s("reply-poll-s")
    object_retry_s: float = _s("object-retry-s")
    min_replies: int = _s("min-replies")
    # --- robustness and privacy (docs/trust.md)
    norm_bound: float = _s("norm-bound")
    clip_norm: float = _s("clip-norm")
    dp_noise_multiplier: float = _s("dp-noise-multiplier")
    dp_delta: float = _s("dp-delta")
    checkpoint_every: int = _s("checkpoint-every")
    # --- switches
    momentum_zeroing: bool = _s("momentum-zeroing")
    secure_aggregation: bool = _s("secure-aggregation")
    merge_uploads: bool = _s("merge-uploads")
    diagnose_sketch: bool = _s("diagnose-sketch")
    # --- the settings methods declare (see DECLARED), as (key, value) pairs in key order
    extras: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        unknown = sorted(set(dict(self.extras)) - set(DECLARED))
        if unknown:
            raise ConfigError(f"unknown setting '{unknown[0]}'")
        object.__setattr__(self, "extras", parse_extras(DECLARED, dict(self.extras)))
        validate.check(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], base: RunConfig | None = None) -> RunConfig:
        """Parse kebab-case keys (as in TOML and Flower's run config) over ``base``.

        Raises
        ------
        ConfigError
            For an unknown key (with the known ones it may mean, :mod:`fedsketch.settings.suggest`), a value of the wrong
            type, or a value out of range.
        """
        base = base if base is not None else cls()
        hints = get_type_hints(cls)
        known = field_keys()
        updates: dict[str, Any] = {}
        extras = dict(base.extras)
        for key, value in values.items():
            if key in DECLARED:
                extras[key] = DECLARED[key].check(value)
            elif key in known:
                updates[known[key]] = coerce(key, value, hints[known[key]])
            else:
                meanings = {**{k: TABLE[k]["doc"] for k in known}, **{k: s.doc for k, s in DECLARED.items()}}
                raise ConfigError(f"unknown setting '{key}'{suggest.hint(key, meanings)}")
        return dataclasses.replace(base, **updates, extras=tuple(sorted(extras.items())))

    def to_mapping(self) -> dict[str, Any]:
        """The kebab-case mapping that :meth:`from_mapping` reads back (declared settings included)."""
        out = {key: getattr(self, name) for key, name in field_keys().items()}
        return {**out, **dict(self.extras)}


def field_keys() -> dict[str, str]:
    """Kebab-case key -> field name, for every field but ``extras``."""
    return {f.name.replace("_", "-"): f.name for f in fields(RunConfig) if f.name != "extras"}


def check_against_model(cfg: RunConfig, d: int) -> None:
    """Checks that need the model size ``d``; run before any training (see :func:`fedsketch.validate.against_model`)."""
    validate.against_model(cfg, d)
