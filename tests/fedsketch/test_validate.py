"""The checks that need the model's size: k against d, the clients' kept state against memory or disk."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest

from fedsketch import validate
from fedsketch.config import TABLE, ConfigError, RunConfig
from fedsketch.settings.declared import DECLARATIONS


def test_noise_and_secure_sums_are_offered_with_exactly_the_methods_whose_uploads_add_up() -> None:
    linear = [m.name for m in DECLARATIONS.values() if m.linear]
    assert linear == ["fedadam", "fedavg", "fetchsgd", "true_topk"]
    for m in DECLARATIONS.values():
        settings = {"strategy": m.name, "secure-aggregation": True}
        if m.linear:
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
    ({"clip-norm": float("nan")}, "setting 'clip-norm' must be >= 0; got nan"),
    ({"synthetic-alpha": -1.0}, "setting 'synthetic-alpha' must be >= 0; got -1.0"),
    ({"synthetic-beta": float("nan")}, "setting 'synthetic-beta' must be >= 0; got nan"),
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
    """No declared method is both (PowerSGD and Sketched-SGD keep state, refused first): a declaration made so."""
    stateless = replace(DECLARATIONS["powersgd"], keeps_state=False)
    validate._privacy(RunConfig.from_mapping({"clip-norm": 0.5}), DECLARATIONS["fetchsgd"])
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
