"""``fedsketch.data``'s names: the loaders (torch) imported when first asked for (``fedsketch/data/__init__.py``)."""

from __future__ import annotations

import importlib

import pytest

import fedsketch.data

HOMES = {
    "partition": ["partition_labels"],
    "spec": ["DATASETS", "PARTITIONS", "DataSpec", "FederatedData"],
    "synthetic": ["generate_synthetic"],
    "images": ["NORMALIZATION", "load_idx", "load_idx_images", "load_idx_labels", "normalize"],
    "load": ["from_arrays", "from_idx_files", "load_federated"],
}


def test_each_exported_name_is_its_homes_object() -> None:
    assert sorted(name for names in HOMES.values() for name in names) == sorted(fedsketch.data.__all__)
    for home, names in HOMES.items():
        module = importlib.import_module(f"fedsketch.data.{home}")
        assert [getattr(fedsketch.data, name) is getattr(module, name) for name in names] == [True] * len(names)


def test_a_name_the_package_lacks_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match=r"^module 'fedsketch\.data' has no attribute 'load_mnist'$"):
        fedsketch.data.load_mnist  # noqa: B018
    assert not hasattr(fedsketch.data, "spec_of")
