"""Models: output shapes, parameter counts, determinism across processes, every norm option."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fedsketch.model.models import MODELS, NORMS, build_model

ROOT = Path(__file__).resolve().parents[3]
SHAPES = {"mlp": (60,), "cnn": (1, 28, 28), "resnet9": (3, 32, 32), "resnet18": (3, 32, 32), "bag": (20,)}


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_parameter_counts() -> None:
    assert _count(build_model("mlp", (60,), 10)) == 60 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10
    assert _count(build_model("cnn", (1, 28, 28), 10)) == 1_663_370  # FedAvg's CNN, as McMahan et al. report
    # ResNet-9: convolutions 6,563,520 + linear 5,120 + two affine parameters per normalized channel (2,240 channels).
    assert _count(build_model("resnet9", (3, 32, 32), 10, norm="none")) == 6_568_640
    assert _count(build_model("resnet9", (3, 32, 32), 10)) == 6_568_640 + 2 * 2240
    assert _count(build_model("resnet18", (3, 32, 32), 10)) == 11_173_962  # the usual CIFAR ResNet-18 count


@pytest.mark.parametrize("name", MODELS)
def test_output_shape(name: str) -> None:
    model = build_model(name, SHAPES[name], 7)
    x = torch.randint(0, 1000, (3, *SHAPES[name])).float() if name == "bag" else torch.randn(3, *SHAPES[name])
    assert model(x).shape == (3, 7)


@pytest.mark.parametrize("name", ["resnet9", "resnet18"])
@pytest.mark.parametrize("norm", NORMS)
def test_each_norm_trains_on_a_batch_of_two(name: str, norm: str) -> None:
    model = build_model(name, SHAPES[name], 10, norm=norm)
    model.train()
    loss = nn.functional.cross_entropy(model(torch.randn(2, *SHAPES[name])), torch.tensor([1, 2]))
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    has_buffers = any(True for _ in model.buffers())
    assert has_buffers == (norm == "batch")  # group, layer and none keep no running statistics


def test_same_seed_same_parameters_other_seed_not() -> None:
    state = torch.random.get_rng_state()
    a, b = build_model("cnn", (1, 28, 28), 10, seed=3), build_model("cnn", (1, 28, 28), 10, seed=3)
    assert torch.equal(_flat(a), _flat(b))
    assert not torch.equal(_flat(a), _flat(build_model("cnn", (1, 28, 28), 10, seed=4)))
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is untouched


@pytest.mark.slow  # a fresh Python importing torch
def test_same_parameters_in_another_process() -> None:
    code = (
        "import hashlib, torch; from fedsketch.model.models import build_model; torch.manual_seed(123); "
        "m = build_model('cnn', (1, 28, 28), 10, seed=5); "
        "print(hashlib.sha256(torch.cat([p.detach().reshape(-1) for p in m.parameters()]).numpy().tobytes()).hexdigest())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    here = _flat(build_model("cnn", (1, 28, 28), 10, seed=5))
    assert out.stdout.strip() == hashlib.sha256(here.numpy().tobytes()).hexdigest()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "vgg"}, "unknown model"),
        ({"norm": "instance"}, "unknown norm"),
        ({"name": "cnn", "input_shape": (60,)}, r"\(C, H, W\)"),
        ({"name": "resnet9", "input_shape": (3, 4, 4)}, "H, W >= 8"),
        ({"num_classes": 0}, "num_classes"),
    ],
    ids=["model", "norm", "cnn-shape", "resnet9-size", "classes"],  # plain ids: mutmut selects tests by id
)
def test_bad_arguments_say_why(kwargs: dict, match: str) -> None:
    args = {"name": "mlp", "input_shape": (60,), "num_classes": 10} | kwargs
    with pytest.raises(ValueError, match=match):
        build_model(args.pop("name"), args.pop("input_shape"), args.pop("num_classes"), **args)


# Builders of a user's own model, by reference (``package.module:function``) -------------------------------
def echo_builder(shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    model = nn.Linear(shape[-1], num_classes)
    model.called = (shape, num_classes, seed, float(torch.rand(1)))  # type: ignore[assignment]
    return model


def raising_builder(shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    raise RuntimeError("no such layer")


def number_builder(shape: tuple[int, ...], num_classes: int, seed: int) -> int:
    return 3


def empty_builder(shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    return nn.ReLU()


def double_builder(shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    return nn.Linear(2, 2).double()


HERE = "tests.fedsketch.model.test_models"


def test_a_users_builder_is_called_with_plain_values_in_a_forked_rng_of_the_seed() -> None:
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    model = build_model(f"{HERE}:echo_builder", [1, 2, np.int64(3)], 4, seed=7)  # type: ignore[arg-type]
    assert torch.equal(torch.rand(1), before)  # the global RNG is as it was
    shape, classes, seed, drawn = model.called  # type: ignore[misc]
    assert (shape, classes, seed) == ((1, 2, 3), 4, 7) and all(type(s) is int for s in shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        nn.Linear(3, 4)  # what the builder draws first
        assert drawn == float(torch.rand(1))
    assert build_model(f"{HERE}:echo_builder", (3,), 2).called[2] == 0  # type: ignore[index]  # the default seed


@pytest.mark.parametrize(
    ("builder", "error", "message"),
    [
        ("raising_builder", ValueError, f"setting 'model': {HERE}:raising_builder raised RuntimeError: no such layer"),
        ("number_builder", TypeError, f"setting 'model': {HERE}:number_builder returned a int, not a torch.nn.Module"),
        (
            "empty_builder",
            ValueError,
            f"setting 'model': the module {HERE}:empty_builder returned has no parameters to train",
        ),
        (
            "double_builder",
            ValueError,
            f"setting 'model': parameter 'weight' of {HERE}:double_builder is torch.float64; parameters must be float32",
        ),
    ],
)
def test_a_users_builder_that_fails_is_named_in_one_line(builder: str, error: type, message: str) -> None:
    with pytest.raises(error) as refused:
        build_model(f"{HERE}:{builder}", (1, 2), 3, seed=5)
    assert str(refused.value).startswith(message)
    if builder == "raising_builder":
        assert str(refused.value).endswith("called with input_shape (1, 2), num_classes 3, seed 5")


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (("vgg", (3,), 2), {}, f"unknown model 'vgg'; choose one of {', '.join(MODELS)} or 'package.module:function'"),
        (("mlp", (3,), 2), {"norm": "instance"}, f"unknown norm 'instance'; choose one of {', '.join(NORMS)}"),
        (("mlp", (0, 3), 2), {}, "input_shape must be a non-empty tuple of positive sizes; got (0, 3)"),
        (("mlp", (), 2), {}, "input_shape must be a non-empty tuple of positive sizes; got ()"),
        (("mlp", (3,), 0), {}, "num_classes and hidden must be >= 1; got 0, 512"),
        (("mlp", (3,), 2), {"hidden": 0}, "num_classes and hidden must be >= 1; got 2, 0"),
        (
            ("bag", (1, 28, 28), 10),
            {},
            "model 'bag' reads documents of word ids, shape (words,); got input shape (1, 28, 28)",
        ),
        (("cnn", (1, 3, 4), 10), {}, "model 'cnn' needs images (C, H, W) with H, W >= 4; got (1, 3, 4)"),
        (("resnet18", (3, 8, 7), 10), {}, "model 'resnet18' needs images (C, H, W) with H, W >= 8; got (3, 8, 7)"),
        (("resnet9", (3, 7, 8), 10), {}, "model 'resnet9' needs images (C, H, W) with H, W >= 8; got (3, 7, 8)"),
    ],
    ids=["model", "norm", "zero-side", "no-shape", "classes", "hidden", "bag", "cnn", "resnet18", "resnet9"],
)
def test_each_impossible_model_is_refused_in_one_line(args: tuple, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError) as refused:
        build_model(*args, **kwargs)
    assert str(refused.value) == message


def test_the_smallest_models_and_images_each_model_takes_are_built() -> None:
    assert _count(build_model("mlp", (3,), 1, hidden=1)) == 3 + 1 + 1 + 1 + 1 + 1
    assert build_model("cnn", (1, 4, 4), 2, hidden=3)(torch.zeros(1, 1, 4, 4)).shape == (1, 2)
    for name in ("resnet9", "resnet18"):
        assert build_model(name, (3, 8, 8), 2, norm="none")(torch.zeros(1, 3, 8, 8)).shape == (1, 2)


def _kinds(model: nn.Module) -> list[str]:
    return [type(m).__name__ for m in model.children()]


def test_the_mlp_and_the_cnn_are_their_papers_layers() -> None:
    assert _kinds(build_model("mlp", (60,), 10)) == ["Flatten", "Linear", "ReLU", "Linear", "ReLU", "Linear"]
    cnn = build_model("cnn", (1, 28, 28), 10)
    assert _kinds(cnn) == [
        "Conv2d",
        "ReLU",
        "MaxPool2d",
        "Conv2d",
        "ReLU",
        "MaxPool2d",
        "Flatten",
        "Linear",
        "ReLU",
        "Linear",
    ]
    assert [(m.kernel_size, m.padding) for m in cnn if isinstance(m, nn.Conv2d)] == [((5, 5), (2, 2))] * 2


def _sides(model: nn.Module, names: list[str], x: torch.Tensor) -> list[tuple[int, ...]]:
    """The output shape of each named submodule on input ``x``."""
    seen: dict[str, tuple[int, ...]] = {}
    for name in names:
        model.get_submodule(name).register_forward_hook(
            lambda m, i, o, name=name: seen.__setitem__(name, tuple(o.shape))
        )
    model(x)
    return [seen[name] for name in names]


def test_resnet9_halves_the_map_in_each_of_its_three_layers_and_scales_its_output() -> None:
    model = build_model("resnet9", (3, 32, 32), 10, norm="none")
    x = torch.randn(2, 3, 32, 32)
    assert _sides(model, ["prep", "layer1", "layer2", "layer3"], x) == [
        (2, 64, 32, 32),
        (2, 128, 16, 16),
        (2, 256, 8, 8),
        (2, 512, 4, 4),
    ]
    features = {}
    model.linear.register_forward_hook(lambda m, i, o: features.__setitem__("out", o))
    assert torch.equal(model(x), features["out"] * 0.125)
    block = model.layer1[1]
    y = torch.randn(1, 128, 4, 4)
    assert torch.equal(block(y), y + torch.relu(block.res2(block.res1(y))))


def test_resnet18_keeps_a_32x32_map_through_its_stem() -> None:
    model = build_model("resnet18", (3, 32, 32), 10, norm="none", seed=1)
    assert _sides(model, ["conv1", "layer1", "layer4"], torch.randn(1, 3, 32, 32)) == [
        (1, 64, 32, 32),
        (1, 64, 32, 32),
        (1, 512, 4, 4),
    ]
    std = float(model.conv1.weight.detach().std())  # Kaiming normal by fan-out (64 x 3 x 3): sqrt(2 / 576) = 0.059
    assert abs(std - (2 / 576) ** 0.5) < 0.006


@pytest.mark.parametrize(("norm", "groups"), [("group", [32, 32, 32, 32]), ("layer", [1, 1, 1, 1])])
def test_group_and_layer_norm_take_their_groups(norm: str, groups: list[int]) -> None:
    model = build_model("resnet9", (3, 8, 8), 10, norm=norm)
    found = [m.num_groups for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert found[:4] == groups and len(found) == 8
    from fedsketch.model.models import _norm_factory

    assert _norm_factory("group")(48).num_groups == 16  # gcd(32, 48)


def test_the_bag_model_starts_with_small_embeddings_of_both_signs() -> None:
    weights = build_model("bag", (20,), 10).embedding.weight
    assert float(weights.abs().max()) <= 0.1 and float(weights.min()) < -0.09 and float(weights.max()) > 0.09


def test_a_builder_that_cannot_be_found_is_named_as_the_model_setting() -> None:
    with pytest.raises(ValueError, match=rf"^setting 'model': module '{HERE}' \(.*\) has no 'nothing'$"):
        build_model(f"{HERE}:nothing", (3,), 2)
