"""The models of the FetchSGD experiments, built deterministically from a seed.

- ``mlp``: flatten, two hidden ReLU layers of ``hidden`` units, a linear output;
  the default model for the 60-feature Synthetic(alpha, beta) data.
- ``cnn``: the CNN of FedAvg (McMahan et al., AISTATS 2017, Sec. 3): two 5x5
  convolutions (32 and 64 channels, each followed by 2x2 max pooling), a
  ``hidden``-unit ReLU layer (512 there) and a linear output; 1,663,370
  parameters on 28x28 grayscale digits.
- ``resnet9``: the ResNet-9 FetchSGD trains on CIFAR (Rothchild et al., ICML
  2020, Sec. 5; their ``CommEfficient/models/resnet9.py``), itself the DAWNBench
  network of Page (2018, "How to train your ResNet"): a prep convolution of 64
  channels, layer 1 (128 channels, pooled, plus a residual block), layer 2 (256,
  pooled), layer 3 (512, pooled, plus a residual block), global max pooling, a
  bias-free linear layer and the output scaled by 0.125. About 6.57M parameters
  for 10 classes.
- ``bag``: fastText's classifier (Joulin et al., "Bag of Tricks for Efficient
  Text Classification", EACL 2017): the mean of a document's word embeddings
  (:data:`BAG_DIM` wide, one row per word of :mod:`fedsketch.data.text`'s
  vocabulary) and a linear output; 800,090 parameters for 10 topics, almost
  all of them embedding rows that a batch's gradient touches only where its
  words are. Its input is word ids (float32, read as indices).
- ``resnet18``: torchvision's ``resnet18(weights=None)`` adapted to 32x32 inputs
  as usual for CIFAR: a 3x3 stride-1 stem convolution and no stem max pooling.

Normalization (``norm``, residual networks only; ``mlp`` and ``cnn`` have none):
``batch`` (BatchNorm), ``group`` (GroupNorm with 32 groups, Wu & He, ECCV 2018),
``layer`` (GroupNorm with one group: layer norm over channels and space) or
``none``. ``group`` is the default because batch norm breaks in this setting:

- FetchSGD's clients hold a few images of one or two classes (5 images of one
  class in its CIFAR-10 setup), so batch statistics are computed over a tiny,
  single-class batch: they are noisy, differ from client to client and from the
  statistics seen at evaluation. Hsieh et al. ("The Non-IID Data Quagmire of
  Decentralized Machine Learning", ICML 2020) show batch norm failing under such
  label skew and group norm recovering most of the accuracy.
- Running means and variances are buffers, not parameters: gradients, sketches
  and top-k updates carry parameters only (``fedsketch.model.flat``), so the server's
  model never learns them and evaluates with its initial statistics. The
  command refuses a run whose model has buffers (``experiments/running/preflight.py``);
  ``batch`` stays here for building and measuring such models outside a run.

Group and layer norm normalize each sample on its own, behave identically in
training and evaluation for any batch size and label mix, and have no buffers.
FetchSGD's own ResNet-9 can likewise be built without batch norm (its
``do_batchnorm`` switch).

Parameters are initialised inside a forked RNG seeded with ``seed``, so the same
``(name, input_shape, num_classes, seed, norm, hidden)`` gives bit-identical
parameters in every process, without touching the global RNG.

Your own model: ``name`` may be a reference ``package.module:function``
(:mod:`fedsketch.settings.entry`) to a builder called as ``function(input_shape,
num_classes, seed)`` that returns a ``torch.nn.Module`` of float32 parameters;
it runs inside the same seeded, forked RNG, so a builder that draws from
torch's global RNG is deterministic in ``seed`` too (docs/data.md, "Your own
model and data").
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from fedsketch.data import text
from fedsketch.settings import entry
from fedsketch.settings.declared import choices

MODELS = choices("model")
NORMS = choices("model-norm")
RESNET9_CHANNELS = (64, 128, 256, 512)
RESNET9_OUTPUT_SCALE = 0.125  # FetchSGD's and DAWNBench's final multiplier
GROUPS = 32  # Wu & He's default number of groups
BAG_DIM = 8  # the bag model's embedding width
BAG_INIT = 0.1  # its embeddings start uniform in [-BAG_INIT, BAG_INIT]


def build_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    seed: int = 0,
    norm: str = "group",
    hidden: int = 512,
) -> nn.Module:
    """A fresh model, its parameters a pure function of the arguments.

    Parameters
    ----------
    name
        ``mlp``, ``cnn``, ``resnet9``, ``resnet18`` or ``bag``.
    input_shape
        One sample's shape: ``(features,)`` or ``(C, H, W)``; convolutional
        models need ``(C, H, W)``.
    num_classes
        Output width.
    seed
        Initialization seed (the global RNG is left as it was).
    norm
        ``batch``, ``group``, ``layer`` or ``none``; used by the residual networks.
    hidden
        Hidden width of ``mlp`` and of ``cnn``'s fully connected layer.

    Raises
    ------
    ValueError
        If a name, norm or shape is unknown or does not fit the model.
    """
    if entry.is_reference(name):
        return _user_model(name, tuple(int(s) for s in input_shape), num_classes, seed)
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)} or 'package.module:function'")
    if norm not in NORMS:
        raise ValueError(f"unknown norm {norm!r}; choose one of {', '.join(NORMS)}")
    shape = tuple(int(s) for s in input_shape)
    if not shape or min(shape) < 1:
        raise ValueError(f"input_shape must be a non-empty tuple of positive sizes; got {input_shape}")
    if num_classes < 1 or hidden < 1:
        raise ValueError(f"num_classes and hidden must be >= 1; got {num_classes}, {hidden}")
    if name == "bag" and len(shape) != 1:
        raise ValueError(f"model 'bag' reads documents of word ids, shape (words,); got input shape {shape}")
    if name not in ("mlp", "bag"):
        _check_image_shape(name, shape)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name == "mlp":
            return _mlp(math.prod(shape), hidden, num_classes)
        if name == "cnn":
            return _cnn(shape, hidden, num_classes)
        if name == "bag":
            return Bag(text.VOCAB, BAG_DIM, num_classes)
        if name == "resnet9":
            return ResNet9(shape[0], num_classes, _norm_factory(norm))
        return _resnet18(shape[0], num_classes, norm)


def _user_model(reference: str, shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    """The module a user's builder returns, built in a forked RNG seeded with ``seed``; checked for its type.

    Raises
    ------
    ValueError, TypeError
        One line starting ``setting 'model'``: what the builder raised (with the call), or what it returned wrong.
    """
    builder = entry.load("model", reference)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = builder(shape, num_classes, seed)
        except Exception as exc:  # noqa: BLE001  # whatever the user's builder raises, as one line with its call
            raise ValueError(
                f"setting 'model': {reference} raised {entry.raised(exc)}; "
                f"called with input_shape {shape}, num_classes {num_classes}, seed {seed}"
            ) from None
    if not isinstance(model, nn.Module):
        raise TypeError(f"setting 'model': {reference} returned a {type(model).__name__}, not a torch.nn.Module")
    params = list(model.parameters())
    if not params:
        raise ValueError(f"setting 'model': the module {reference} returned has no parameters to train")
    odd = next(((n, p.dtype) for n, p in model.named_parameters() if p.dtype != torch.float32), None)
    if odd is not None:
        raise ValueError(
            f"setting 'model': parameter {odd[0]!r} of {reference} is {odd[1]}; parameters must be float32"
        )
    return model


class Bag(nn.Module):
    """The mean of the documents' word embeddings, then a linear layer (fastText)."""

    def __init__(self, vocab: int, dim: int, num_classes: int) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab, dim, mode="mean")
        nn.init.uniform_(self.embedding.weight, -BAG_INIT, BAG_INIT)
        self.out = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.embedding(x.long()))


def _check_image_shape(name: str, shape: tuple[int, ...]) -> None:
    smallest = {"cnn": 4, "resnet9": 8, "resnet18": 8}[name]  # sides left after the model's poolings
    if len(shape) != 3 or min(shape[1:]) < smallest:
        raise ValueError(f"model {name!r} needs images (C, H, W) with H, W >= {smallest}; got {shape}")


def _mlp(features: int, hidden: int, num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


def _cnn(shape: tuple[int, ...], hidden: int, num_classes: int) -> nn.Module:
    channels, height, width = shape
    return nn.Sequential(
        nn.Conv2d(channels, 32, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, kernel_size=5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64 * (height // 4) * (width // 4), hidden),
        nn.ReLU(),
        nn.Linear(hidden, num_classes),
    )


def _norm_factory(norm: str) -> Callable[[int], nn.Module]:
    """A constructor ``channels -> normalization layer`` for ``norm``."""
    if norm == "batch":
        return nn.BatchNorm2d
    if norm == "group":
        return lambda channels: nn.GroupNorm(math.gcd(GROUPS, channels), channels)
    if norm == "layer":
        return lambda channels: nn.GroupNorm(1, channels)
    return lambda channels: nn.Identity()


class _ConvBlock(nn.Sequential):
    """3x3 convolution (no bias), normalization, ReLU, optional 2x2 max pooling."""

    def __init__(self, c_in: int, c_out: int, norm: Callable[[int], nn.Module], pool: bool = False) -> None:
        layers = [
            nn.Conv2d(c_in, c_out, kernel_size=3, padding=1, bias=False),
            norm(c_out),
            nn.ReLU(inplace=True),
        ]
        super().__init__(*layers, *([nn.MaxPool2d(2)] if pool else []))


class _Residual(nn.Module):
    """``x + relu(block(block(x)))``, as in FetchSGD's ResNet-9."""

    def __init__(self, channels: int, norm: Callable[[int], nn.Module]) -> None:
        super().__init__()
        self.res1 = _ConvBlock(channels, channels, norm)
        self.res2 = _ConvBlock(channels, channels, norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.res2(self.res1(x)))


class ResNet9(nn.Module):
    """FetchSGD's ResNet-9 (see the module docstring), for any ``(C, H, W)`` with H, W >= 8.

    The original pools the final 4x4 map of a 32x32 input with ``MaxPool2d(4)``;
    global max pooling is the same there and also fits other input sizes.
    """

    def __init__(self, in_channels: int, num_classes: int, norm: Callable[[int], nn.Module]) -> None:
        super().__init__()
        prep, c1, c2, c3 = RESNET9_CHANNELS
        self.prep = _ConvBlock(in_channels, prep, norm)
        self.layer1 = nn.Sequential(_ConvBlock(prep, c1, norm, pool=True), _Residual(c1, norm))
        self.layer2 = _ConvBlock(c1, c2, norm, pool=True)
        self.layer3 = nn.Sequential(_ConvBlock(c2, c3, norm, pool=True), _Residual(c3, norm))
        self.linear = nn.Linear(c3, num_classes, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layer3(self.layer2(self.layer1(self.prep(x))))
        out = F.adaptive_max_pool2d(out, 1).flatten(1)
        return self.linear(out) * RESNET9_OUTPUT_SCALE


def _resnet18(in_channels: int, num_classes: int, norm: str) -> nn.Module:
    # Imported here: only resnet18 needs torchvision, and a device's ClientApp
    # (docs/deployed-rounds.md) should not load it for the other models.
    from torchvision.models import resnet18

    model = resnet18(weights=None, num_classes=num_classes, norm_layer=_norm_factory(norm))
    # The CIFAR stem: a 7x7 stride-2 convolution and a max pooling would leave an
    # 8x8 map after the stem; a 3x3 stride-1 convolution keeps 32x32.
    model.conv1 = nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    nn.init.kaiming_normal_(model.conv1.weight, mode="fan_out", nonlinearity="relu")  # torchvision's own init
    model.maxpool = nn.Identity()
    return model
