"""The model's parameter shapes without its weights, and without the data where the data set's shape is fixed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedsketch.config import RunConfig
from fedsketch.data import load_federated
from fedsketch.data.run import load_data
from fedsketch.model.build import build, fixed_input, model_shapes
from fedsketch.model.models import build_model
from fedsketch.task import make_model


@pytest.mark.parametrize(
    ("dataset", "model"),
    [("cifar10", "resnet9"), ("cifar10", "resnet18"), ("mnist", "cnn"), ("mnist", "mlp"), ("synthetic_text", "bag")],
)
def test_fixed_shapes_read_no_data(dataset: str, model: str) -> None:
    cfg = RunConfig.from_mapping({"dataset": dataset, "model": model})
    before = load_federated.cache_info()
    shapes = model_shapes(cfg)
    assert load_federated.cache_info() == before  # nothing was loaded, not even from the cache
    assert fixed_input(cfg) is not None
    assert all(all(n > 0 for n in shape) for shape in shapes)


def _npz(path: Path, shape: tuple[int, ...]) -> Path:
    rng = np.random.default_rng(0)
    arrays = {"x_train": (40, *shape), "x_test": (10, *shape)}
    data = {k: rng.standard_normal(v).astype(np.float32) for k, v in arrays.items()}
    np.savez(path, **data, y_train=np.arange(40) % 3, y_test=np.arange(10) % 3)  # type: ignore[arg-type]
    return path


@pytest.mark.parametrize(("model", "shape"), [("mlp", (7,)), ("cnn", (1, 28, 28))])
def test_a_data_set_known_only_from_its_files_is_read_and_the_shapes_are_the_built_models(
    tmp_path: Path, model: str, shape: tuple[int, ...]
) -> None:
    cfg = RunConfig.from_mapping(
        {
            "dataset": "npz",
            "data-root": str(_npz(tmp_path / "d.npz", shape)),
            "model": model,
            "num-clients": 4,
            "clients-per-round": 2,
            "model-hidden": 5,
            "partition": "iid",
        }
    )
    assert fixed_input(cfg) is None
    built = make_model(cfg, load_data(cfg))
    assert model_shapes(cfg) == tuple(tuple(p.shape) for p in built.parameters())


def test_a_users_model_or_data_set_has_no_fixed_input() -> None:
    assert (
        fixed_input(
            RunConfig.from_mapping({"dataset": "mnist", "model": "tests.fedsketch.model.test_models:echo_builder"})
        )
        is None
    )
    assert fixed_input(RunConfig.from_mapping({"dataset": "tests.example.mylab.data:load", "model": "mlp"})) is None
    assert fixed_input(RunConfig.from_mapping({"dataset": "npz", "data-root": "x.npz"})) is None
    assert fixed_input(RunConfig.from_mapping({"dataset": "cifar100", "model": "resnet9"})) == ((3, 32, 32), 100)


def test_the_runs_model_takes_its_seed_norm_and_width_from_the_settings() -> None:
    cfg = RunConfig.from_mapping({"model": "mlp", "seed": 3, "model-hidden": 7})
    built = build(cfg, (60,), 10)
    want = build_model("mlp", (60,), 10, seed=3, hidden=7)
    assert all(torch.equal(a, b) for a, b in zip(built.parameters(), want.parameters(), strict=True))
    cfg = RunConfig.from_mapping({"model": "resnet9", "model-norm": "layer", "dataset": "cifar10"})
    assert {m.num_groups for m in build(cfg, (3, 8, 8), 10).modules() if isinstance(m, nn.GroupNorm)} == {1}
