"""``fedsketch``'s own names, imported from their homes when first asked for (``fedsketch/__init__.py``)."""

from __future__ import annotations

import importlib

import pytest

import fedsketch


@pytest.mark.parametrize("name", fedsketch.__all__)
def test_each_exported_name_is_its_homes_object(name: str) -> None:
    homes = {"ConfigError": "fedsketch.settings.setting", "RunConfig": "fedsketch.config"}
    home = homes.get(name, "fedsketch.sketch.count_sketch")
    assert getattr(fedsketch, name) is getattr(importlib.import_module(home), name)


def test_a_name_the_package_lacks_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match=r"^module 'fedsketch' has no attribute 'topk'$"):
        fedsketch.topk  # noqa: B018
    assert not hasattr(fedsketch, "CountSketches")
