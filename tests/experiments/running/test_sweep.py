"""A [sweep] table: which keys can be swept and by whom, what it refuses, and the points each strategy runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from experiments.running import sweep
from fedsketch.config import ConfigError
from fedsketch.methods import METHODS


def test_each_sweepable_key_names_every_method_that_sweeps_it_under_one_short_name() -> None:
    keys = sweep.sweep_keys()
    assert set(keys) == {key for method in METHODS for key in method.sweep}
    for key, found in keys.items():
        assert found.strategies == tuple(m.name for m in METHODS if key in m.sweep)
        assert {m.sweep[key] for m in METHODS if key in m.sweep} == {found.short}
    assert keys["sketch-cols"] == sweep.SweepKey("cols", ("fetchsgd", "sketched_sgd"))


def test_two_methods_naming_one_key_differently_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    one, other = SimpleNamespace(name="a", sweep={"k": "k"}), SimpleNamespace(name="b", sweep={"k": "topk"})
    monkeypatch.setattr(sweep, "METHODS", [one, other])
    with pytest.raises(ValueError) as caught:
        sweep.sweep_keys()
    assert str(caught.value) == "sweep key 'k' is named 'k' and 'topk' by different methods"


def test_a_sweep_table_is_kept_in_its_order_as_tuples() -> None:
    assert sweep.parse_sweep({"sketch-cols": [300, 100], "k": [20]}, "x.toml") == {
        "sketch-cols": (300, 100),
        "k": (20,),
    }
    assert sweep.parse_sweep({}, "x.toml") == {}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            {"lr": [0.1]},
            "x.toml: [sweep] key 'lr' cannot be swept; sweepable keys: " + ", ".join(sorted(sweep.SWEEP_KEYS)),
        ),
        ({"k": 20}, "x.toml: [sweep] key 'k' must be a non-empty list of values, got 20"),
        ({"k": []}, "x.toml: [sweep] key 'k' must be a non-empty list of values, got []"),
        ({"k": [20, 30, 20]}, "x.toml: [sweep] key 'k' lists a value twice: [20, 30, 20]"),
    ],
    ids=["not sweepable", "not a list", "empty", "twice"],
)
def test_a_sweep_table_that_cannot_run_is_refused_naming_the_key(table: dict, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        sweep.parse_sweep(table, "x.toml")
    assert str(caught.value) == message


def test_a_key_none_of_the_strategies_sweeps_is_refused() -> None:
    grid = {"k": (20,), "qsgd-levels": (3, 7)}
    sweep.check_applies({"k": (20,)}, ["fedavg", "fetchsgd"], "x.toml")
    with pytest.raises(ConfigError) as caught:
        sweep.check_applies(grid, ["fetchsgd", "true_topk"], "x.toml")
    assert (
        str(caught.value) == "x.toml: [sweep] key 'qsgd-levels' is used only by qsgd, none of which the experiment runs"
    )
    with pytest.raises(ConfigError, match=r"key 'sketch-cols' is used only by fetchsgd, sketched_sgd, none of which"):
        sweep.check_applies({"sketch-cols": (300,)}, ["fedavg"], "x.toml")


def test_each_strategy_runs_the_product_of_the_keys_it_sweeps() -> None:
    grid = {"sketch-rows": (3, 5), "k": (20, 40), "qsgd-levels": (3,)}
    assert sweep.points(grid, "fetchsgd") == [
        {"sketch-rows": 3, "k": 20},
        {"sketch-rows": 3, "k": 40},
        {"sketch-rows": 5, "k": 20},
        {"sketch-rows": 5, "k": 40},
    ]
    assert sweep.points(grid, "true_topk") == [{"k": 20}, {"k": 40}]
    assert sweep.points(grid, "fedavg") == [{}]


def test_a_points_folder_is_named_after_its_values() -> None:
    assert sweep.point_name({"sketch-rows": 3, "sketch-cols": 5000, "k": 1000}) == "rows3-cols5000-k1000"
    assert sweep.point_name({}) == ""
