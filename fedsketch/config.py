"""One flat, typed run configuration, parsed once at the edge.

Every setting a run needs is a field of :class:`RunConfig`. Outside Python the
keys are kebab-case (``sketch-cols``), exactly as in ``[tool.flwr.app.config]``
of ``pyproject.toml`` and in the experiment TOML files; inside they are
snake_case attributes. Parsing rejects unknown keys, wrong types and values out
of range with a message that names the key, before any training starts, so a
typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_type_hints

from fedsketch.download import MODES as DOWNLOAD_MODES
from fedsketch.methods import client_state_bytes, describe_client_state

STRATEGIES = (
    "fetchsgd",
    "fedavg",
    "true_topk",
    "local_topk",
    "random_k",
    "gaussiank",
    "qsgd",
    "terngrad",
    "signsgd",
    "sketched_sgd",
)
DATASETS = ("synthetic", "mnist", "fashion_mnist", "cifar10", "cifar100", "femnist", "npz")
PARTITIONS = ("natural", "iid", "dirichlet", "pathological", "shards")
MODELS = ("mlp", "cnn", "resnet9", "resnet18")
NORMS = ("batch", "group", "layer", "none")
LR_SCHEDULES = ("constant", "linear", "cosine")
ERROR_FEEDBACK = ("subtract", "zero-buckets")
CLIENT_UPDATES = ("gradient", "delta")
ASSIGNMENTS = ("cohort", "node")
DEVICES = ("auto", "cpu", "cuda")
SIGNSGD_VARIANTS = ("ef", "majority")
CLIENT_STATES = ("memory", "disk")


class ConfigError(ValueError):
    """A setting is unknown, of the wrong type, or out of range."""


@dataclass(frozen=True)
class RunConfig:
    """Every setting of one run (one strategy, one seed).

    Field names map to kebab-case keys (``sketch_cols`` <-> ``sketch-cols``).
    Defaults are the embedded default job: FetchSGD on FedProx's
    Synthetic(0.5, 0.5) with 100 clients and a 300k-parameter MLP.
    """

    # --- what runs
    experiment: str = "default"
    strategy: str = "fetchsgd"
    seed: int = 0
    num_rounds: int = 60
    num_clients: int = 100
    clients_per_round: int = 10
    eval_every: int = 5
    out_dir: str = "runs"
    # --- data
    dataset: str = "synthetic"
    data_root: str = ""
    partition: str = "natural"
    partition_alpha: float = 0.5
    classes_per_client: int = 2
    shards_per_client: int = 2
    samples_per_client: int = 0
    synthetic_alpha: float = 0.5
    synthetic_beta: float = 0.5
    synthetic_devices: int = 0
    # --- model
    model: str = "mlp"
    model_hidden: int = 512
    model_norm: str = "group"
    # --- client computation
    client_update: str = "gradient"
    local_batch_size: int = 64
    local_steps: int = 1
    # With client-update "gradient": up to this many clients' gradients in one vectorized call
    # (fedsketch/batched.py; for GPUs); 0: one client at a time.
    client_batching: int = 0
    client_lr: float = 0.1
    weight_decay: float = 0.0
    # --- server optimizer
    lr: float = 0.1
    lr_schedule: str = "constant"
    momentum: float = 0.9
    # --- FetchSGD (and the sparsifying baselines' k)
    sketch_rows: int = 5
    sketch_cols: int = 10_000
    k: int = 5_000
    error_feedback: str = "zero-buckets"
    momentum_zeroing: bool = True
    # --- baselines (see fedsketch/methods.py)
    qsgd_levels: int = 15
    quantizer_bucket_size: int = 512
    signsgd_variant: str = "ef"
    candidate_factor: int = 3
    max_client_state_mb: int = 4096
    # Where clients with error feedback keep it: "memory" (their node's Flower Context.state) or
    # "disk" (one file per client under the run's folder; fedsketch/client_state.py).
    client_state: str = "memory"
    download: str = "dense"  # "sparse": returning clients get only what changed (fedsketch/download.py)
    # Compressed-upload baselines: send back only the top-k of the server's update, keeping the rest
    # in a server-side error accumulator (0: the whole averaged update).
    download_k: int = 0
    # --- runtime
    client_assignment: str = "cohort"
    min_nodes: int = 1
    device: str = "auto"
    round_timeout: float = 600.0
    reply_poll_s: float = 0.005  # simulation: seconds between the ServerApp's looks for replies
    min_replies: int = 1
    # --- robustness and privacy (see strategies/guard.py, fedsketch/privacy.py)
    clip_norm: float = 0.0  # 0: off; else each client's update is scaled to at most this L2 norm
    dp_noise_multiplier: float = 0.0  # 0: off; else Gaussian noise of this many clip-norms on the sum
    dp_delta: float = 1e-5
    checkpoint_every: int = 0  # 0: off; else save a checkpoint every N rounds (and resume from it)
    secure_aggregation: bool = False  # SecAgg+: the server learns only the sum of the uploads
    # --- diagnostics (simulation only; see fedsketch/algorithms/fidelity.py)
    diagnose_sketch: bool = False  # clients also hand over their dense update; the server measures the sketch's error

    def __post_init__(self) -> None:
        _check_choices(self)
        _check_ranges(self)
        _check_privacy(self)
        _check_download(self)
        _check_diagnostics(self)
        _check_batching(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], base: RunConfig | None = None) -> RunConfig:
        """Parse kebab-case keys (as in TOML and Flower's run config) over ``base``.

        Raises
        ------
        ConfigError
            For an unknown key (with the closest known one), a value of the wrong
            type, or a value out of range.
        """
        base = base if base is not None else cls()
        hints = get_type_hints(cls)
        known = {f.name.replace("_", "-"): f.name for f in fields(cls)}
        updates: dict[str, Any] = {}
        for key, value in values.items():
            if key not in known:
                near = difflib.get_close_matches(key, list(known), n=1)
                hint = f" (did you mean '{near[0]}'?)" if near else ""
                raise ConfigError(f"unknown setting '{key}'{hint}")
            name = known[key]
            updates[name] = _coerce(key, value, hints[name])
        return dataclasses.replace(base, **updates)

    def to_mapping(self) -> dict[str, Any]:
        """The kebab-case mapping that :meth:`from_mapping` reads back."""
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)}


def _coerce(key: str, value: Any, kind: Any) -> Any:
    """Check one value against its field's type; ints are accepted for floats."""
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is str and isinstance(value, str):
        return value
    raise ConfigError(f"setting '{key}' must be of type {kind.__name__}, got {type(value).__name__} {value!r}")


def _check_choices(cfg: RunConfig) -> None:
    choices = {
        "strategy": STRATEGIES,
        "dataset": DATASETS,
        "partition": PARTITIONS,
        "model": MODELS,
        "model_norm": NORMS,
        "error_feedback": ERROR_FEEDBACK,
        "client_update": CLIENT_UPDATES,
        "client_state": CLIENT_STATES,
        "client_assignment": ASSIGNMENTS,
        "device": DEVICES,
        "lr_schedule": LR_SCHEDULES,
        "signsgd_variant": SIGNSGD_VARIANTS,
        "download": DOWNLOAD_MODES,
    }
    for name, allowed in choices.items():
        value = getattr(cfg, name)
        if value not in allowed:
            key = name.replace("_", "-")
            raise ConfigError(f"setting '{key}' must be one of {', '.join(allowed)}; got {value!r}")


def _check_ranges(cfg: RunConfig) -> None:
    positive = (
        "num_rounds", "num_clients", "clients_per_round", "eval_every", "model_hidden",
        "local_batch_size", "local_steps", "sketch_rows", "sketch_cols", "k", "min_replies", "min_nodes",
        "candidate_factor", "max_client_state_mb",
    )  # fmt: skip
    for name in positive:
        if getattr(cfg, name) <= 0:
            raise ConfigError(f"setting '{name.replace('_', '-')}' must be > 0; got {getattr(cfg, name)}")
    non_negative = (
        "seed", "samples_per_client", "weight_decay", "synthetic_devices", "quantizer_bucket_size", "download_k",
        "client_batching",
    )  # fmt: skip
    for name in non_negative:
        if getattr(cfg, name) < 0:
            raise ConfigError(f"setting '{name.replace('_', '-')}' must be >= 0; got {getattr(cfg, name)}")
    for name in ("lr", "client_lr", "partition_alpha", "round_timeout", "reply_poll_s"):
        if not getattr(cfg, name) > 0:
            raise ConfigError(f"setting '{name.replace('_', '-')}' must be > 0; got {getattr(cfg, name)}")
    if not 0.0 <= cfg.momentum < 1.0:
        raise ConfigError(f"setting 'momentum' must be in [0, 1); got {cfg.momentum}")
    if not 1 <= cfg.qsgd_levels <= 255:  # levels are bit-packed, 8 bits at most
        raise ConfigError(f"setting 'qsgd-levels' must be in 1..255; got {cfg.qsgd_levels}")
    if cfg.clients_per_round > cfg.num_clients:
        raise ConfigError(
            f"setting 'clients-per-round' ({cfg.clients_per_round}) exceeds 'num-clients' ({cfg.num_clients})"
        )
    if cfg.min_replies > cfg.clients_per_round:
        raise ConfigError(
            f"setting 'min-replies' ({cfg.min_replies}) exceeds 'clients-per-round' ({cfg.clients_per_round})"
        )


LINEAR_STRATEGIES = ("fetchsgd", "fedavg", "true_topk")
"""Methods whose uploads add up linearly: noise on their sum is noise on the update, and a secure sum
is all the server needs."""


def _check_privacy(cfg: RunConfig) -> None:
    for name in ("clip_norm", "dp_noise_multiplier", "checkpoint_every"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"setting '{name.replace('_', '-')}' must be >= 0; got {getattr(cfg, name)}")
    if not 0.0 < cfg.dp_delta < 1.0:
        raise ConfigError(f"setting 'dp-delta' must be in (0, 1); got {cfg.dp_delta}")
    if cfg.clip_norm > 0 and cfg.strategy == "sketched_sgd":
        raise ConfigError(
            "setting 'clip-norm' is not available for sketched_sgd: its second exchange sends exact values "
            "that would have to be scaled like the sketch"
        )
    if cfg.dp_noise_multiplier > 0:
        if cfg.strategy not in LINEAR_STRATEGIES:
            raise ConfigError(
                f"setting 'dp-noise-multiplier' needs a strategy whose uploads add up linearly "
                f"({', '.join(LINEAR_STRATEGIES)}); got {cfg.strategy!r}"
            )
        if cfg.clip_norm <= 0:
            raise ConfigError("setting 'dp-noise-multiplier' needs 'clip-norm' > 0: noise is scaled to the clip norm")
    if cfg.secure_aggregation:
        if cfg.strategy not in LINEAR_STRATEGIES:
            raise ConfigError(
                f"setting 'secure-aggregation' needs a strategy whose uploads add up linearly "
                f"({', '.join(LINEAR_STRATEGIES)}); got {cfg.strategy!r}"
            )
        if cfg.dp_noise_multiplier > 0:
            raise ConfigError(
                "settings 'secure-aggregation' and 'dp-noise-multiplier' are not combined: DP clips and weighs "
                "single clients on the server, which secure aggregation hides from it"
            )


COMPRESSED_UPLOADS = ("local_topk", "random_k", "gaussiank", "qsgd", "terngrad", "signsgd")
"""Methods whose server averages compressed client updates into a dense step (``download-k`` applies)."""


def _check_download(cfg: RunConfig) -> None:
    if cfg.download_k > 0 and cfg.strategy not in COMPRESSED_UPLOADS:
        raise ConfigError(
            f"setting 'download-k' applies to the compressed-upload baselines ({', '.join(COMPRESSED_UPLOADS)}); "
            f"got strategy {cfg.strategy!r}, whose server update is "
            + ("already k-sparse (setting 'k')" if cfg.strategy != "fedavg" else "dense by definition")
        )
    if cfg.download != "sparse":
        return
    if cfg.client_assignment != "cohort":
        raise ConfigError(
            "setting 'download' = 'sparse' needs 'client-assignment' = 'cohort': a SuperNode would have to keep "
            "the model it last received, and this ClientApp keeps none (it is stateless)"
        )
    if cfg.secure_aggregation:
        raise ConfigError(
            "settings 'download' = 'sparse' and 'secure-aggregation' are not combined: the SecAgg+ round sends "
            "the dense model and counts what it sends"
        )


def _check_batching(cfg: RunConfig) -> None:
    """``client-batching`` vectorizes one gradient a client; local SGD steps are sequential by nature."""
    if cfg.client_batching and cfg.client_update != "gradient":
        raise ConfigError(
            f"setting 'client-batching' ({cfg.client_batching}) needs 'client-update' = 'gradient' (one gradient a "
            f"client); got {cfg.client_update!r}. Set client-batching = 0 for local training steps"
        )


def _check_diagnostics(cfg: RunConfig) -> None:
    """``diagnose-sketch`` has every client send its dense update too: only where that is harmless and meaningful."""
    if not cfg.diagnose_sketch:
        return
    if cfg.strategy != "fetchsgd":
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


def check_against_model(cfg: RunConfig, d: int) -> None:
    """Checks that need the model size ``d``; run before any training.

    Raises
    ------
    ConfigError
        If ``k``, ``download-k`` (or Sketched-SGD's ``candidate-factor * k``) exceeds the number
        of parameters, or if the clients' error-feedback state would exceed
        ``max-client-state-mb`` (see :func:`fedsketch.methods.client_state_bytes`).
    """
    if cfg.k > d:
        raise ConfigError(f"setting 'k' ({cfg.k}) exceeds the model's {d} parameters")
    if cfg.download_k > d:
        raise ConfigError(f"setting 'download-k' ({cfg.download_k}) exceeds the model's {d} parameters")
    if cfg.strategy == "sketched_sgd" and cfg.candidate_factor * cfg.k > d:
        raise ConfigError(
            f"setting 'candidate-factor' x 'k' ({cfg.candidate_factor} x {cfg.k}) exceeds the model's {d} parameters"
        )
    need = client_state_bytes(cfg.strategy, d, cfg.num_clients, cfg.momentum, cfg.signsgd_variant)
    what = describe_client_state(cfg.strategy, d, cfg.num_clients, cfg.momentum, cfg.signsgd_variant)
    if cfg.client_state == "disk":
        _check_disk(cfg, need, what)
    elif need > cfg.max_client_state_mb * 2**20:
        raise ConfigError(
            f"{what}, above setting 'max-client-state-mb' ({cfg.max_client_state_mb}); lower 'num-clients', "
            "or raise 'max-client-state-mb' if the machine has the memory, or keep it on disk: client-state = 'disk'"
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
