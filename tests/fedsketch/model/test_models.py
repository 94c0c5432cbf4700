"""Models: output shapes, parameter counts, determinism across processes, every norm option."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

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
