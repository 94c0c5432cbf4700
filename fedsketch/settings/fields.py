"""The fields of a run's settings, typed, each with its default and meaning from settings.toml.

:class:`fedsketch.config.RunConfig` adds parsing and the checks (:mod:`fedsketch.validate`) to
them; the checks read the fields through this class, so neither module imports the other in a
circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedsketch.settings.declared import TABLE


def _s(key: str) -> Any:
    """The field of setting ``key``: its default and its line in docs/settings.md, from the table."""
    # left unmutated: called at import, before mutation testing can switch a mutant on (tests/fedsketch/test_validate.py)
    return field(default=TABLE[key]["default"], metadata={"doc": TABLE[key]["doc"]})  # pragma: no mutate


@dataclass(frozen=True)
class Fields:
    """Every setting of one run (one strategy, one seed), unchecked; defaults are the embedded default job's data.

    :class:`fedsketch.config.RunConfig` is these fields parsed and checked: build that one.
    """

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
