"""The checks that need the model's size: k against d, the clients' kept state against memory or disk."""

from __future__ import annotations

import re
import shutil
from dataclasses import fields, replace
from pathlib import Path

import pytest

from fedsketch import validate
from fedsketch.config import TABLE, ConfigError, RunConfig
from fedsketch.methods import METHODS, get_method
from fedsketch.validate import against_model, client_state_bytes, describe_client_state

TOPK = {"strategy": "local_topk", "num-clients": 16, "clients-per-round": 4, "k": 10, "sketch-cols": 40}
"""local_topk keeps one error vector a client (two with the pending one)."""


def test_the_clients_state_is_two_float32_vectors_of_d_per_vector_kept_for_every_client() -> None:
    cfg = RunConfig.from_mapping(TOPK)
    assert client_state_bytes(cfg, 1_000) == 2 * 4 * 1_000 * 16
    sketched = RunConfig.from_mapping({**TOPK, "strategy": "sketched_sgd"})
    assert client_state_bytes(sketched, 1_000) == 2 * 2 * 4 * 1_000 * 16  # its two vectors a client
    assert client_state_bytes(RunConfig.from_mapping({**TOPK, "strategy": "fetchsgd"}), 1_000) == 0


def test_the_state_reads_per_client_and_in_all() -> None:
    cfg = RunConfig.from_mapping({**TOPK, "num-clients": 300})
    assert describe_client_state(cfg, 2_000_000) == (
        "local_topk keeps 1 float32 vector(s) of d=2,000,000 per client, committed and pending: "
        "300 clients x 15.3 MiB = 4.47 GiB of client state"
    )


def test_k_and_download_k_may_reach_the_models_size_but_not_pass_it() -> None:
    against_model(RunConfig.from_mapping({**TOPK, "k": 50, "sketch-cols": 200}), 50)
    with pytest.raises(ConfigError, match=r"^setting 'k' \(51\) exceeds the model's 50 parameters$"):
        against_model(RunConfig.from_mapping({**TOPK, "k": 51, "sketch-cols": 204}), 50)
    against_model(RunConfig.from_mapping({**TOPK, "download-k": 50}), 50)
    with pytest.raises(ConfigError, match=r"^setting 'download-k' \(51\) exceeds the model's 50 parameters$"):
        against_model(RunConfig.from_mapping({**TOPK, "download-k": 51}), 50)


def test_the_state_in_memory_may_fill_max_client_state_mb_but_not_pass_it() -> None:
    cfg = RunConfig.from_mapping({**TOPK, "max-client-state-mb": 1})
    against_model(cfg, 8_192)  # 16 clients x 2 x 4 x 8,192 B: exactly 1 MiB
    with pytest.raises(ConfigError) as caught:
        against_model(cfg, 8_193)
    assert str(caught.value) == (
        f"{describe_client_state(cfg, 8_193)}, above setting 'max-client-state-mb' (1); lower 'num-clients', "
        "or raise 'max-client-state-mb' if the machine has the memory, or keep it on disk: client-state = 'disk'"
    )


def test_the_state_on_disk_is_held_to_the_free_space_of_the_out_dirs_file_system(tmp_path: Path) -> None:
    out = tmp_path / "not" / "yet"
    cfg = RunConfig.from_mapping({**TOPK, "client-state": "disk", "max-client-state-mb": 1, "out-dir": str(out)})
    against_model(cfg, 8_193)  # above the memory limit: on disk it does not apply
    free = shutil.disk_usage(tmp_path).free
    d = free // (2 * 4 * 16) + 1
    with pytest.raises(ConfigError) as caught:
        against_model(RunConfig.from_mapping({**TOPK, "k": 10, "client-state": "disk", "out-dir": str(out)}), d)
    what = re.escape(describe_client_state(cfg, d))
    said = re.fullmatch(
        rf"{what}, more than the ([\d,.]+) GiB free under {re.escape(str(tmp_path))} \(setting 'client-state' = 'disk'\)",
        str(caught.value),
    )
    assert said is not None
    assert abs(float(said.group(1).replace(",", "")) - free / 2**30) < 0.05  # as free as it was a moment ago


def test_noise_and_secure_sums_are_offered_with_exactly_the_methods_whose_uploads_add_up() -> None:
    linear = [m.name for m in METHODS if m.privacy.linear]
    assert linear == ["fedadam", "fedavg", "fetchsgd", "true_topk"]
    for m in METHODS:
        settings = {"strategy": m.name, "secure-aggregation": True}
        if m.privacy.linear:
            RunConfig.from_mapping(settings)
            continue
        with pytest.raises(ConfigError) as caught:
            RunConfig.from_mapping(settings)
        assert str(caught.value) == (
            "setting 'secure-aggregation' needs a strategy whose uploads add up linearly "
            f"(fedadam, fedavg, fetchsgd, true_topk); got {m.name!r}"
        )


def test_every_fields_default_and_meaning_are_the_settings_tables() -> None:
    """``RunConfig``'s fields are built at import from fedsketch/settings/settings.toml (mutation testing cannot
    switch that on: this test holds the property)."""
    for f in fields(RunConfig):
        key = f.name.replace("_", "-")
        if key in TABLE:
            assert (f.default, f.metadata["doc"]) == (TABLE[key]["default"], TABLE[key]["doc"]), key
    assert {f.name.replace("_", "-") for f in fields(RunConfig)} >= set(TABLE)


REFUSALS = [
    (
        {"model": "pkg.mod:build", "client-update": "adam"},  # a model reference does not end the checks
        "setting 'client-update' must be one of gradient, delta; got 'adam'",
    ),
    (
        {"hf-label": "x"},
        "setting 'hf-label' ('x') is read only by dataset 'huggingface'; dataset is 'synthetic', which would ignore it",
    ),
    (
        {"dataset": "huggingface", "data-root": "x", "hf-test-fraction": 1.0},
        "setting 'hf-test-fraction' must be in [0, 1) (0: off); got 1.0",
    ),
    (
        {"dataset": "synthetic_text"},
        (
            "setting 'model' ('mlp') does not fit 'dataset' ('synthetic_text'): dataset 'synthetic_text' is read by "
            "model 'bag' only, and that model reads no other dataset"
        ),
    ),
    (
        {"strategy": "fetchsgdd"},
        "setting 'strategy' must be one of fedadam, fedavg, fetchsgd, gaussiank, local_topk, powersgd, qsgd, random_k, signsgd, sketched_sgd, terngrad, true_topk; got 'fetchsgdd'",
    ),
    (
        {"partition": "zipf"},
        "setting 'partition' must be one of natural, iid, dirichlet, pathological, shards, flwr-iid, flwr-dirichlet, flwr-pathological, flwr-shard, flwr-natural-id; got 'zipf'",
    ),
    (
        {"model": "resnet1000"},
        "setting 'model' must be one of mlp, cnn, resnet9, resnet18, bag or 'package.module:function'; got 'resnet1000'",
    ),
    ({"model": "mylab:"}, "setting 'model': 'mylab:' is not a reference of the form 'package.module:function'"),
    (
        {"dataset": "nope.pkl.x"},
        "setting 'dataset' must be one of synthetic, synthetic_text, mnist, mnist_t10k, fashion_mnist, cifar10, cifar100, femnist, npz, imagefolder, huggingface or 'package.module:function'; got 'nope.pkl.x'",
    ),
    (
        {"dataset": "my lab:load"},
        "setting 'dataset': 'my lab:load' is not a reference of the form 'package.module:function'",
    ),
    ({"device": "tpu"}, "setting 'device' must be one of auto, cpu, cuda or 'cuda:N'; got 'tpu'"),
    ({"client-update": "adam"}, "setting 'client-update' must be one of gradient, delta; got 'adam'"),
    ({"num-rounds": 0}, "setting 'num-rounds' must be > 0; got 0"),
    ({"k": -3}, "setting 'k' must be > 0; got -3"),
    ({"seed": -1}, "setting 'seed' must be >= 0; got -1"),
    ({"clip-norm": -0.5}, "setting 'clip-norm' must be >= 0; got -0.5"),
    ({"lr": 0.0}, "setting 'lr' must be > 0; got 0.0"),
    ({"client-lr": -1.0}, "setting 'client-lr' must be > 0; got -1.0"),
    ({"partition-alpha": 0.0, "partition": "dirichlet"}, "setting 'partition-alpha' must be > 0; got 0.0"),
    ({"round-timeout": 0.0}, "setting 'round-timeout' must be > 0; got 0.0"),
    ({"reply-poll-s": 0.0}, "setting 'reply-poll-s' must be > 0; got 0.0"),
    ({"object-retry-s": 0.3}, "setting 'object-retry-s' must be in [0, 0.25] (0: Flower's own retries); got 0.3"),
    ({"object-retry-s": -0.1}, "setting 'object-retry-s' must be in [0, 0.25] (0: Flower's own retries); got -0.1"),
    ({"momentum": 1.0}, "setting 'momentum' must be in [0, 1); got 1.0"),
    ({"momentum": -0.1}, "setting 'momentum' must be in [0, 1); got -0.1"),
    ({"client-momentum": 1.0, "client-update": "delta"}, "setting 'client-momentum' must be in [0, 1); got 1.0"),
    (
        {"client-momentum": 0.5},
        "setting 'client-momentum' needs 'client-update' = 'delta' (local SGD steps); got 'client-update' = 'gradient', one gradient a client, which has no local steps to carry it",
    ),
    ({"dp-delta": 1.0}, "setting 'dp-delta' must be in (0, 1); got 1.0"),
    ({"dp-delta": 0.0}, "setting 'dp-delta' must be in (0, 1); got 0.0"),
    ({"clients-per-round": 11, "num-clients": 10}, "setting 'clients-per-round' (11) exceeds 'num-clients' (10)"),
    ({"min-replies": 11, "clients-per-round": 10}, "setting 'min-replies' (11) exceeds 'clients-per-round' (10)"),
    (
        {"partition-alpha": 0.3, "partition": "iid"},
        "setting 'partition-alpha' (0.3) is read only by partition 'dirichlet'; partition is 'iid', which would ignore it ('flwr-dirichlet' reads it too)",
    ),
    (
        {"classes-per-client": 3, "partition": "dirichlet"},
        "setting 'classes-per-client' (3) is read only by partition 'pathological'; partition is 'dirichlet', which would ignore it ('flwr-pathological' reads it too)",
    ),
    (
        {"shards-per-client": 3, "partition": "iid"},
        "setting 'shards-per-client' (3) is read only by partition 'shards'; partition is 'iid', which would ignore it ('flwr-shard' reads it too)",
    ),
    (
        {"partition": "natural", "synthetic-devices": 7},
        "setting 'synthetic-devices' (7) differs from 'num-clients' (100): partition 'natural' gives each client one generating device; choose another partition or set 0",
    ),
    ({"num-classes": 7, "dataset": "mnist"}, "setting 'num-classes' is 7 but dataset 'mnist' has 10 classes"),
    (
        {"clip-norm": 1.0, "strategy": "local_topk"},
        "setting 'clip-norm' is not available for local_topk with these settings: its clients keep error feedback, and a clipped upload would leave their memory out of step with what the server applied",
    ),
    (
        {"clip-norm": 1.0, "strategy": "powersgd"},
        "setting 'clip-norm' is not available for powersgd with these settings: its clients keep error feedback, and a clipped upload would leave their memory out of step with what the server applied",
    ),
    (
        {"dp-noise-multiplier": 1.0, "strategy": "qsgd"},
        "setting 'dp-noise-multiplier' needs a strategy whose uploads add up linearly (fedadam, fedavg, fetchsgd, true_topk); got 'qsgd'",
    ),
    (
        {"dp-noise-multiplier": 1.0},
        "setting 'dp-noise-multiplier' needs 'clip-norm' > 0: noise is scaled to the clip norm",
    ),
    (
        {"secure-aggregation": True, "dp-noise-multiplier": 1.0, "clip-norm": 1.0},
        "settings 'secure-aggregation' and 'dp-noise-multiplier' are not combined: DP clips and weighs single clients on the server, which secure aggregation hides from it",
    ),
    (
        {"download-k": 5, "strategy": "fetchsgd"},
        "setting 'download-k' applies to the compressed-upload baselines (gaussiank, local_topk, qsgd, random_k, signsgd, terngrad); got strategy 'fetchsgd', whose server update is already k-sparse (setting 'k')",
    ),
    (
        {"download-k": 5, "strategy": "fedavg"},
        "setting 'download-k' applies to the compressed-upload baselines (gaussiank, local_topk, qsgd, random_k, signsgd, terngrad); got strategy 'fedavg', whose server update is dense by definition",
    ),
    (
        {"download-from-init": True},
        "setting 'download-from-init' needs 'download' = 'sparse' (a catch-up from the initial model); got 'download' = 'dense'",
    ),
    (
        {"download": "sparse", "secure-aggregation": True},
        "settings 'download' = 'sparse' and 'secure-aggregation' are not combined: the SecAgg+ round sends the dense model and counts what it sends",
    ),
    (
        {"checkpoint-every": 2, "strategy": "local_topk"},
        "setting 'checkpoint-every' is not available for local_topk with these settings: its clients keep state on their nodes, which a restart loses",
    ),
    (
        {"diagnose-sketch": True, "strategy": "fedavg"},
        "setting 'diagnose-sketch' is only for strategy fetchsgd (it compares FetchSGD's sketched top-k with the true one); got 'fedavg'",
    ),
    (
        {"diagnose-sketch": True, "client-assignment": "node"},
        "setting 'diagnose-sketch' needs 'client-assignment' = 'cohort' (simulation): it has every client send its dense update as well, which a deployment exists to avoid",
    ),
    (
        {"diagnose-sketch": True, "secure-aggregation": True},
        "settings 'diagnose-sketch' and 'secure-aggregation' are not combined: the diagnostic shows the server each client's dense update, which secure aggregation exists to hide",
    ),
    (
        {"diagnose-sketch": True, "dp-noise-multiplier": 1.0, "clip-norm": 1.0},
        "settings 'diagnose-sketch' and 'dp-noise-multiplier' are not combined: the noise goes into the sketches only, so the dense reference would have no counterpart of it",
    ),
]


@pytest.mark.parametrize(("settings", "message"), REFUSALS)
def test_every_refusal_names_the_setting_its_value_and_why(settings: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_mapping(settings)
    assert str(caught.value) == message


def test_a_methods_own_setting_is_kept_and_an_unknown_one_refused_by_its_first_name() -> None:
    assert dict(RunConfig.from_mapping({"strategy": "qsgd", "qsgd-levels": 3}).extras)["qsgd-levels"] == 3
    with pytest.raises(ConfigError, match=r"^unknown setting 'aaa'$"):
        RunConfig(extras=(("zzz", 1), ("aaa", 2)))


@pytest.mark.parametrize(
    "settings",
    [
        {"object-retry-s": 0.0},
        {"object-retry-s": 0.25},
        {"client-momentum": 0.5, "client-update": "delta"},
        {"min-replies": 10, "clients-per-round": 10},
        {"dataset": "pkg.mod:load", "num-classes": 7},  # a loader of the user's: any class count
    ],
)
def test_the_edges_of_each_range_are_allowed(settings: dict[str, object]) -> None:
    RunConfig.from_mapping(settings)


def test_clipping_is_refused_for_a_stateless_method_whose_upload_is_not_one_vector() -> None:
    """No registered method is both (PowerSGD and Sketched-SGD keep state, refused first): a record made so."""
    powersgd = get_method("powersgd")
    stateless = replace(powersgd, client=replace(powersgd.client, state_vectors=lambda cfg: 0))
    validate._privacy(RunConfig.from_mapping({"clip-norm": 0.5}), get_method("fetchsgd"))
    with pytest.raises(ConfigError) as caught:
        validate._privacy(RunConfig.from_mapping({"clip-norm": 0.5}), stateless)
    assert str(caught.value) == (
        "setting 'clip-norm' is not available for powersgd: its upload is not one vector the server could scale "
        "(its second exchange sends values computed from the first)"
    )


def test_download_settings_are_allowed_where_they_apply() -> None:
    RunConfig.from_mapping({"download": "sparse", "download-from-init": True})
    with pytest.raises(ConfigError, match=r"^setting 'download-k' applies to the compressed-upload baselines"):
        RunConfig.from_mapping({"download-k": 1})
