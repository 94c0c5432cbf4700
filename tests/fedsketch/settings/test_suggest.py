"""A misspelt setting is answered with the keys it may mean: by its words as well as by its spelling."""

from __future__ import annotations

import pytest

from fedsketch.config import ConfigError, RunConfig
from fedsketch.settings import suggest


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


def test_words_are_lower_case_runs_of_two_letters_with_a_plural_s_dropped_past_three_letters() -> None:
    assert suggest._words("Sketch-ROWS, k x2 gas bus is") == {"sketch", "row", "gas", "bus", "is"}


def test_a_key_scores_by_the_rare_words_it_shares_names_counting_twice_its_meaning() -> None:
    known = {
        "alpha-rows": "rows of the table",
        "beta-cols": "columns of the table",
        "gamma": "how many rows to keep",  # "rows" in its meaning only: half of a name's weight
    }
    assert suggest.by_meaning("rows", known) == "alpha-rows"
    assert suggest.by_meaning("table", known) is None  # 0.5 / 2 a key: below the floor
    assert suggest.by_meaning("keep", known) == "gamma"  # one word of one meaning: 0.5, at the floor
    assert suggest.by_meaning("nothing-here", known) is None
    assert suggest.by_meaning("rows", {}) is None
    assert suggest.by_meaning("num", {"x-num": "", "y-num": "", "z-num": ""}) is None  # 1/3 each: too common


def test_a_meaning_never_outweighs_a_name_and_ties_go_to_the_shorter_key() -> None:
    known = {"lr": "the server's learning rate, also called the step", "step-size": "the local step"}
    assert suggest.by_meaning("step", known) == "step-size"  # a name's word (1/1) over a meaning's (0.5/2)
    tie = {"long-rate": "", "rate": ""}
    assert suggest.by_meaning("rate", tie) == "rate"
    assert suggest.by_meaning("rates", {"rate-x": "", "rate-yy": ""}) == "rate-x"
