"""``fedsketch``'s own names, imported from their homes when first asked for (``fedsketch/__init__.py``)."""

from __future__ import annotations

import importlib

import pytest

import fedsketch

HOMES = {"settings.setting": ["ConfigError"], "config": ["RunConfig"], "sketch.count_sketch": ["CountSketch"]}


def test_each_exported_name_is_its_homes_object() -> None:
    assert sorted(name for names in HOMES.values() for name in names) == sorted(fedsketch.__all__)
    for home, names in HOMES.items():
        module = importlib.import_module(f"fedsketch.{home}")
        assert [getattr(fedsketch, name) is getattr(module, name) for name in names] == [True] * len(names)


def test_a_name_the_package_lacks_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match=r"^module 'fedsketch' has no attribute 'topk'$"):
        fedsketch.topk  # noqa: B018
    assert not hasattr(fedsketch, "CountSketches")
