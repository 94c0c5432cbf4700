"""What one client computes on its own data: the update it would upload.

FetchSGD's clients (Rothchild et al., ICML 2020, Algorithm 1) compute one
gradient on a local batch: ``client_update = "gradient"``. The ``"delta"`` mode
runs ``local_steps`` SGD steps and returns ``w_start - w_end`` (FedAvg's local
training, McMahan et al. 2017), optionally with heavy-ball momentum
(``client_momentum``: PyTorch's SGD, Sutskever et al., ICML 2013) whose buffer
lives through one client's steps only. Either way the result is a *descent
direction*: the server subtracts ``lr`` times (a compressed version of) its mean.

Randomness (which samples form a batch) comes from a generator seeded by
``(run seed, round, client id)``, so a logical client computes the same update
whichever process or node runs it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from fedsketch.model.flat import get_flat_grad, set_flat


@dataclass(frozen=True)
class LocalSpec:
    """How a client trains (a typed slice of the run config).

    ``momentum``: local heavy-ball momentum in ``"delta"`` mode (0: plain SGD), see :func:`momentum_step`.
    """

    mode: str = "gradient"
    batch_size: int = 64
    steps: int = 1
    lr: float = 0.1
    weight_decay: float = 0.0
    momentum: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"local momentum must be in [0, 1); got {self.momentum}")
        if self.momentum and self.mode != "delta":
            raise ValueError(f"local momentum needs mode 'delta' (local SGD steps); got mode {self.mode!r}")


@dataclass(frozen=True)
class LocalResult:
    """A client's update (descent direction), its example count and mean loss."""

    update: torch.Tensor
    num_examples: int
    loss: float


def client_generator(seed: int, server_round: int, cid: int) -> torch.Generator:
    """The private RNG of one logical client in one round (never the global RNG)."""
    gen = torch.Generator()
    # Python ints do not overflow; the mix is reduced mod 2**64, the range manual_seed takes (any run seed works).
    gen.manual_seed(((seed * 1_000_003 + server_round) * 1_000_033 + cid) % 2**64)
    return gen


def local_update(
    model: nn.Module,
    weights: torch.Tensor,
    x: torch.Tensor,
    y: torch.Tensor,
    spec: LocalSpec,
    gen: torch.Generator,
) -> LocalResult:
    """Compute one client's update starting from the global ``weights``.

    ``model`` is a scratch module: its parameters are overwritten.
    """
    require_examples(x)
    set_flat(model, weights)
    model.train()
    if spec.mode == "gradient":
        loss = _gradient_step(model, x, y, spec, gen)
        update = get_flat_grad(model)
        if spec.weight_decay:
            update = update + spec.weight_decay * weights
        return LocalResult(update, min(len(x), spec.batch_size), loss)
    losses = []
    buffers: list[torch.Tensor | None] = [None] * len(list(model.parameters()))  # this client's, this round's
    for _ in range(spec.steps):
        losses.append(_gradient_step(model, x, y, spec, gen))
        if spec.momentum:
            _momentum_sgd_step(model, spec, buffers)
        else:
            _sgd_step(model, spec.lr, spec.weight_decay)
    # A new tensor in the model's dtype (float32 in a run; float64 in the exactness tests): the update is written
    # into it, sparing a client's worth of fresh memory.
    end = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return LocalResult(torch.sub(weights.to(end.dtype), end, out=end), len(x), sum(losses) / len(losses))


@torch.no_grad()
def _sgd_step(model: nn.Module, lr: float, weight_decay: float) -> None:
    """``p -= lr * (grad + weight_decay * p)``; without weight decay, ``p -= lr * grad`` in place (the same
    floats: ``grad + 0 * p`` is ``grad``), which spares two temporaries per parameter and step."""
    for p in model.parameters():
        if p.grad is None:
            continue
        if weight_decay:
            p.add_(p.grad + weight_decay * p, alpha=-lr)
        else:
            p.add_(p.grad, alpha=-lr)


def momentum_step(
    p: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor | None, spec: LocalSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGD step with heavy-ball momentum, out of place: ``(new p, new buffer)``.

    PyTorch's ``torch.optim.SGD`` (dampening 0, no Nesterov; Sutskever et al., ICML 2013), as FedAvg's local
    training uses it (McMahan et al., AISTATS 2017): ``g = grad + wd * p``; ``b = g`` at the first step (``buf``
    None), else ``b = momentum * b + g``; ``p - lr * b``. The vectorized path (:mod:`fedsketch.training.batched`) calls it
    on stacked tensors with a leading client dimension, so both paths compute the same floats.
    """
    g = grad + spec.weight_decay * p if spec.weight_decay else grad
    b = g if buf is None else torch.add(buf * spec.momentum, g)
    return torch.add(p, b, alpha=-spec.lr), b


@torch.no_grad()
def _momentum_sgd_step(model: nn.Module, spec: LocalSpec, buffers: list[torch.Tensor | None]) -> None:
    """:func:`momentum_step` on each parameter in place; ``buffers`` (one per parameter) carry to the next step."""
    for i, p in enumerate(model.parameters()):
        if p.grad is None:
            continue
        new_p, buffers[i] = momentum_step(p, p.grad.clone(), buffers[i], spec)
        p.copy_(new_p)


def require_examples(x: torch.Tensor) -> None:
    """A client with no samples has no update to compute: say so, by name."""
    if len(x) == 0:
        raise ValueError("client has no training examples")


def sample_batch(
    x: torch.Tensor, y: torch.Tensor, batch_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch one SGD step uses: all samples, or ``batch_size`` of them drawn without replacement."""
    if len(x) > batch_size:
        idx = torch.randperm(len(x), generator=gen)[:batch_size]
        x, y = x[idx], y[idx]
    return x, y


def _gradient_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, spec: LocalSpec, gen: torch.Generator) -> float:
    """Zero grads, then backprop the loss of one sampled batch; returns the loss."""
    device = next(model.parameters()).device
    x, y = sample_batch(x, y, spec.batch_size, gen)
    model.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x.to(device)), y.to(device))
    loss.backward()
    return float(loss.detach())
