"""A method's own setting: its value coerced to its type, checked against its choices and bounds, by name."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pytest

from fedsketch.settings.setting import ConfigError, Setting, coerce, parse_extras

LEVELS = Setting("qsgd-levels", int, 16, "levels", minimum=1, maximum=255)
RATE = Setting("rate", float, 0.5, "a rate", minimum=0.0)
CAP = Setting("cap", float, 1.0, "a cap", maximum=1.0)
MODE = Setting("mode", str, "a", "a mode", choices=("a", "b"))
FLAG = Setting("flag", bool, False, "a flag")


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        (bool, True, True),
        (bool, False, False),
        (int, 3, 3),
        (int, -2, -2),
        (float, 2, 2.0),
        (float, 0.25, 0.25),
        (str, "x", "x"),
    ],
)
def test_a_value_of_the_settings_type_is_taken_ints_as_floats(kind: type, value: Any, expected: Any) -> None:
    got = coerce("key", value, kind)
    assert got == expected and type(got) is kind


@pytest.mark.parametrize(
    ("kind", "value"),
    [
        (bool, 1),
        (bool, "true"),
        (int, True),
        (int, 2.0),
        (int, "3"),
        (float, False),
        (float, "0.5"),
        (str, 3),
        (str, None),
    ],
)
def test_a_value_of_another_type_is_refused_naming_key_type_and_value(kind: type, value: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        coerce("some-key", value, kind)
    assert str(caught.value) == (
        f"setting 'some-key' must be of type {kind.__name__}, got {type(value).__name__} {value!r}"
    )


def test_a_value_in_range_is_returned_as_the_settings_type() -> None:
    assert LEVELS.check(1) == 1 and LEVELS.check(255) == 255
    assert RATE.check(0) == 0.0 and type(RATE.check(0)) is float
    assert CAP.check(1.0) == 1.0 and CAP.check(-5) == -5.0
    assert MODE.check("b") == "b" and FLAG.check(True) is True


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        (LEVELS, 0, "setting 'qsgd-levels' must be in 1..255; got 0"),
        (LEVELS, 256, "setting 'qsgd-levels' must be in 1..255; got 256"),
        (RATE, -0.5, "setting 'rate' must be >= 0.0; got -0.5"),
        (RATE, math.nan, "setting 'rate' must be >= 0.0; got nan"),
        (CAP, 1.5, "setting 'cap' must be <= 1.0; got 1.5"),
        (CAP, math.nan, "setting 'cap' must be <= 1.0; got nan"),
        (MODE, "c", "setting 'mode' must be one of a, b; got 'c'"),
    ],
)
def test_a_value_out_of_range_or_choices_is_refused_with_the_range(setting: Setting, value: Any, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        setting.check(value)
    assert str(caught.value) == message


def test_a_value_of_another_type_is_refused_by_the_settings_key() -> None:
    with pytest.raises(ConfigError, match=r"^setting 'qsgd-levels' must be of type int, got str '3'$"):
        LEVELS.check("3")


def test_the_bounds_read_as_the_range_they_allow() -> None:
    assert LEVELS.bounds() == "in 1..255"
    assert RATE.bounds() == ">= 0.0"
    assert CAP.bounds() == "<= 1.0"


@dataclass(frozen=True)
class _Cfg:
    extras: tuple[tuple[str, Any], ...]


def test_a_setting_reads_its_own_value_from_a_config_or_its_default() -> None:
    cfg = _Cfg((("qsgd-levels", 4), ("rate", 0.1)))
    assert LEVELS.of(cfg) == 4 and RATE.of(cfg) == 0.1
    assert CAP.of(cfg) == 1.0 and MODE.of(_Cfg(())) == "a"


def test_parsing_gives_every_declared_setting_checked_in_key_order_with_defaults() -> None:
    declared = {s.key: s for s in (RATE, LEVELS, MODE)}
    assert parse_extras(declared, {"qsgd-levels": 8, "other": 1}) == (
        ("mode", "a"),
        ("qsgd-levels", 8),
        ("rate", 0.5),
    )
    with pytest.raises(ConfigError, match=r"^setting 'qsgd-levels' must be in 1..255; got 999$"):
        parse_extras(declared, {"qsgd-levels": 999})
    assert parse_extras({}, {"anything": 1}) == ()
