"""The run config: one flat, typed set of settings that rejects mistakes by name."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from fedsketch.config import ConfigError, RunConfig
from fedsketch.fit import check_against_model
from fedsketch.settings.setting import Setting

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_app_config_lists_every_setting_with_its_default() -> None:
    """`flwr run --run-config` only overrides keys that exist in pyproject: keep them equal."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        app_config = tomllib.load(f)["tool"]["flwr"]["app"]["config"]
    assert app_config == RunConfig().to_mapping()


def test_round_trip_through_kebab_case() -> None:
    cfg = RunConfig.from_mapping({"sketch-cols": 123, "lr": 1, "momentum-zeroing": False})
    assert (cfg.sketch_cols, cfg.lr, cfg.momentum_zeroing) == (123, 1.0, False)
    assert RunConfig.from_mapping(cfg.to_mapping()) == cfg


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"sketch-colz": 5}, r"unknown setting 'sketch-colz' \(did you mean 'sketch-cols'\?\)"),
        ({"sketch-rows": "5"}, "setting 'sketch-rows' must be of type int"),
        ({"sketch-rows": 0}, "setting 'sketch-rows' must be > 0"),
        ({"k": -3}, "setting 'k' must be > 0"),
        ({"lr": True}, "setting 'lr' must be of type float"),
        ({"momentum": 1.0}, r"setting 'momentum' must be in \[0, 1\)"),
        ({"strategy": "fetch"}, "setting 'strategy' must be one of"),
        ({"error-feedback": "zero"}, "setting 'error-feedback' must be one of"),
        ({"lr-placement": "momentum"}, "setting 'lr-placement' must be one of error, update"),
        ({"clients-per-round": 500}, "exceeds 'num-clients'"),
        ({"reply-poll-s": 0.0}, "setting 'reply-poll-s' must be > 0"),
    ],
)
def test_bad_settings_name_the_key(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RunConfig.from_mapping(values)


def test_k_larger_than_model_is_refused_before_training() -> None:
    with pytest.raises(ConfigError, match=r"setting 'k' \(5000\) exceeds the model's 100 parameters"):
        check_against_model(RunConfig(k=5000), d=100)


def test_the_settings_table_and_the_fields_agree_in_keys_and_types() -> None:
    """fedsketch/settings/settings.toml holds each field's default: one entry a field, of the field's type."""
    from dataclasses import fields
    from typing import get_type_hints

    from fedsketch.config import TABLE, field_keys

    hints = get_type_hints(RunConfig)
    assert set(TABLE) == set(field_keys())
    for key, name in field_keys().items():
        assert type(TABLE[key]["default"]) is hints[name], f"{key}: {TABLE[key]['default']!r} is not {hints[name]}"
        assert TABLE[key]["doc"]
    assert {f.name for f in fields(RunConfig)} - {"extras"} == set(field_keys().values())


@pytest.mark.parametrize(
    ("bounds", "value", "message"),
    [
        ({"minimum": 1, "maximum": 255}, 0, "must be in 1..255; got 0"),
        ({"minimum": 1, "maximum": 255}, 256, "must be in 1..255; got 256"),
        ({"minimum": 0.0}, -0.5, "must be >= 0.0; got -0.5"),
        ({"maximum": 1.0}, 1.5, "must be <= 1.0; got 1.5"),
        ({"maximum": 1.0}, float("nan"), "must be <= 1.0; got nan"),
        ({"minimum": 0.0}, float("nan"), "must be >= 0.0; got nan"),
        ({"minimum": 0.0, "maximum": 1.0}, float("nan"), "must be in 0.0..1.0; got nan"),
    ],
)
def test_a_method_settings_bounds_refuse_values_outside_them(bounds: dict, value: float, message: str) -> None:
    """Either bound alone, or both; NaN lies in no range."""
    setting = Setting("x-key", type(value), value, "a bounded setting", **bounds)
    with pytest.raises(ConfigError, match=re.escape(f"setting 'x-key' {message}")):
        setting.check(value)
    inside = bounds.get("minimum", bounds.get("maximum"))
    assert setting.check(inside) == inside


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"partition": "dirichlet", "classes-per-client": 3},
            "(3) is read only by partition 'pathological'; partition is 'dirichlet', which",
        ),
        (
            {"partition": "natural", "partition-alpha": 0.3},
            "'partition-alpha' (0.3) is read only by partition 'dirichlet'",
        ),
        ({"partition": "iid", "shards-per-client": 4}, "'shards-per-client' (4) is read only by partition 'shards'"),
    ],
)
def test_a_partitioners_setting_under_another_partition_is_refused_not_ignored(
    settings: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        RunConfig.from_mapping(settings)


def test_a_partitioners_settings_are_taken_by_their_own_partition() -> None:
    assert RunConfig.from_mapping({"partition": "dirichlet", "partition-alpha": 0.3}).partition_alpha == 0.3
    assert RunConfig.from_mapping({"partition": "pathological", "classes-per-client": 3}).classes_per_client == 3
    assert RunConfig.from_mapping({"partition": "shards", "shards-per-client": 4}).shards_per_client == 4
    assert RunConfig.from_mapping({"partition": "iid", "classes-per-client": 2}).partition == "iid"  # its default
