"""A misspelt setting is answered with the keys it may mean: by its words as well as by its spelling."""

from __future__ import annotations

import pytest

from fedsketch.config import ConfigError, RunConfig


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("num-rows", "(did you mean 'sketch-rows' or 'num-rounds'?)"),  # by meaning first, then by spelling
        ("columns", "(did you mean 'sketch-cols'?)"),  # no key is spelt so: the setting's meaning says "columns"
        ("sketch-colz", "(did you mean 'sketch-cols'?)"),  # "sketch" is in three keys: too common to point at one
        ("classes_per_client", "(did you mean 'classes-per-client'?)"),
        ("rounds", "(did you mean 'num-rounds'?)"),
        ("candidate", "(did you mean 'candidate-factor'?)"),  # a method's own setting
    ],
)
def test_an_unknown_setting_suggests_what_it_may_mean(key: str, hint: str) -> None:
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_mapping({key: 1})
    assert str(caught.value) == f"unknown setting '{key}' {hint}"


def test_a_key_that_means_nothing_known_gets_no_guess() -> None:
    with pytest.raises(ConfigError) as caught:
        RunConfig.from_mapping({"zzz": 1})
    assert str(caught.value) == "unknown setting 'zzz'"
