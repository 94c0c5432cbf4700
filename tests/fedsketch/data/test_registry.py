"""The dataset table: a fixed data set's classes by name; one known only from its files is refused by name."""

from __future__ import annotations

import pytest

from fedsketch.data import registry


def test_fixed_data_sets_give_their_classes() -> None:
    assert [registry.num_classes(name) for name in ("synthetic", "mnist", "cifar100", "femnist")] == [10, 10, 100, 62]


@pytest.mark.parametrize("name", ["npz", "imagefolder", "huggingface"])
def test_a_data_set_whose_classes_are_in_its_files_is_refused_by_name(name: str) -> None:
    with pytest.raises(ValueError) as caught:
        registry.num_classes(name)
    assert str(caught.value) == f"dataset {name!r} has no fixed number of classes: read it from the data"
