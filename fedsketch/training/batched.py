"""Several clients' gradients or local SGD steps in one vectorized call (per-client gradients with ``torch.func``).

FetchSGD's clients each compute one gradient on a handful of samples
(Rothchild et al., ICML 2020: 5 CIFAR images a client). One client at a time,
a GPU runs a 5-image forward and backward pass per kernel launch and sits
mostly idle. ``vmap(grad(loss))`` over a stack of clients runs the whole
stack's passes as one batched computation, yet returns each client's own
gradient of its own mean loss: the math of one client at a time, the
throughput of a large batch. This is the per-sample-gradient technique of
``torch.func`` (Horace He and Richard Zou, functorch) applied per client.

Exactness: in float64 the batched gradients equal the one-at-a-time ones to
rounding (tests/fedsketch/training/test_batched.py); in float32 they differ by rounding only,
which normalization over a few samples can amplify to about 1e-3 relative.
Batch normalization in training mode normalizes each client's batch with its
own statistics, as one client at a time does; its running statistics (not
part of the uploaded vector, see :mod:`fedsketch.model.flat`) are not updated.
Clients are vectorized only with others of the same batch length, so no
client's computation sees padding.

Local training (``client-update = "delta"``, FedAvg's local SGD, McMahan et
al., AISTATS 2017) is vectorized the same way: the clients' parameters are
stacked along a leading client dimension, ``vmap`` computes every client's
gradient on its own batch, and the SGD step updates the stack, ``local-steps``
times. With local momentum (``client-momentum``, PyTorch's SGD: Sutskever et
al., ICML 2013) the momentum buffers are stacked the same way, one row a
client, and start from nothing in every call. Each client draws its batches
from its own generator, step by step, as :func:`~fedsketch.training.local.local_update`
does, so every client sees the same batches in the same order; in float64 its
delta equals the one-at-a-time one to rounding (tests/fedsketch/training/test_batched_local.py,
tests/fedsketch/training/test_local_momentum.py).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, replace_all_batch_norm_modules_, vmap
from torch.nn import functional as F

from fedsketch.training.local import LocalSpec, momentum_step, sample_batch


@dataclass(frozen=True)
class ClientBatch:
    """One client's sampled batch (already on the model's device)."""

    x: torch.Tensor
    y: torch.Tensor


@dataclass(frozen=True)
class LocalClient:
    """One client's whole training data (on any device) and its private generator, for local training."""

    x: torch.Tensor
    y: torch.Tensor
    gen: torch.Generator


def functional_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` that ``vmap`` can run in training mode.

    Batch-norm layers stop tracking running statistics (an in-place update of
    a shared buffer cannot be vectorized); their output in training mode,
    normalized by the batch's own statistics, is unchanged.
    """
    clone = copy.deepcopy(model)
    replace_all_batch_norm_modules_(clone)
    return clone.train()


def per_client_gradients(
    model: nn.Module, weights: torch.Tensor, batches: list[ClientBatch], max_clients: int
) -> list[tuple[torch.Tensor, float]]:
    """Each client's flat gradient of its mean cross-entropy at ``weights``, and its loss.

    ``model`` is a :func:`functional_copy` (its parameters are not read: the
    flat ``weights`` are). Clients are grouped by batch shape and vectorized
    ``max_clients`` at a time, which bounds memory at ``max_clients`` gradients.
    The result is in the order of ``batches``.

    Raises
    ------
    ValueError
        If ``max_clients`` is not positive or a batch is empty.
    """
    _check(max_clients, [len(b.x) for b in batches], "batch {} is empty")
    params = _unflatten(model, weights)
    results: list[tuple[torch.Tensor, float] | None] = [None] * len(batches)
    shapes = [(tuple(b.x.shape), tuple(b.y.shape)) for b in batches]
    for group in _groups(shapes, max_clients):
        xs = torch.stack([batches[i].x for i in group])
        ys = torch.stack([batches[i].y for i in group])
        grads, losses = _vectorized(model, params, xs, ys)
        for row, i in enumerate(group):
            results[i] = (grads[row], float(losses[row]))
    return [r for r in results if r is not None]


def per_client_local_training(
    model: nn.Module, weights: torch.Tensor, clients: list[LocalClient], spec: LocalSpec, max_clients: int
) -> list[tuple[torch.Tensor, float]]:
    """Each client's delta ``weights - w_end`` after ``spec.steps`` SGD steps (with ``spec.momentum``, momentum SGD:
    :func:`~fedsketch.training.local.momentum_step`), and its mean loss over the steps.

    The vectorized :func:`~fedsketch.training.local.local_update` in ``"delta"`` mode:
    ``model`` is a :func:`functional_copy`; every step, each client draws a
    batch of ``min(len(x), spec.batch_size)`` samples with its own generator
    (:func:`~fedsketch.training.local.sample_batch`), so a client's batch length is the
    same at every step and clients are grouped by it, ``max_clients`` at a
    time. Deltas are in the model's dtype, in the order of ``clients``.

    Raises
    ------
    ValueError
        If ``max_clients`` is not positive or a client has no samples.
    """
    _check(max_clients, [len(c.x) for c in clients], "client {} has no training examples")
    start = _unflatten(model, weights)
    results: list[tuple[torch.Tensor, float] | None] = [None] * len(clients)
    shapes = [((min(len(c.x), spec.batch_size), *c.x.shape[1:]), tuple(c.y.shape[1:])) for c in clients]
    for group in _groups(shapes, max_clients):
        ends, losses = _train_stacked(model, start, [clients[i] for i in group], spec)
        deltas = torch.sub(weights.to(ends.dtype), ends, out=ends)  # in place, as local_update does
        for row, i in enumerate(group):
            steps = [float(step[row]) for step in losses]
            results[i] = (deltas[row], sum(steps) / len(steps))  # the loss as local_update averages it
    return [r for r in results if r is not None]


def _train_stacked(
    model: nn.Module, start: dict[str, torch.Tensor], group: list[LocalClient], spec: LocalSpec
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``(len(group), d)`` flat end weights and each step's ``len(group)`` losses."""
    device = next(iter(start.values())).device
    step = vmap(grad_and_value(_client_loss(model)))
    params = {name: p.expand(len(group), *p.shape) for name, p in start.items()}  # one start, not copied
    buffers: dict[str, torch.Tensor] = {}  # momentum, one row a client of this group; none before the first step
    losses = []
    for _ in range(spec.steps):
        drawn = [sample_batch(c.x, c.y, spec.batch_size, c.gen) for c in group]
        xs = torch.stack([x for x, _ in drawn]).to(device)
        ys = torch.stack([y for _, y in drawn]).to(device)
        grads, values = step(params, xs, ys)
        if spec.momentum:
            stepped = {name: momentum_step(p, grads[name], buffers.get(name), spec) for name, p in params.items()}
            params = {name: p for name, (p, _) in stepped.items()}
            buffers = {name: b for name, (_, b) in stepped.items()}
        else:
            params = {name: _sgd(p, grads[name], spec) for name, p in params.items()}
        losses.append(values.detach())
    return torch.cat([p.reshape(len(group), -1) for p in params.values()], dim=1), losses


def _sgd(p: torch.Tensor, grad: torch.Tensor, spec: LocalSpec) -> torch.Tensor:
    """The step of :func:`fedsketch.training.local._sgd_step`, written out of place: the same floats."""
    if spec.weight_decay:
        return torch.add(p, grad + spec.weight_decay * p, alpha=-spec.lr)
    return torch.add(p, grad, alpha=-spec.lr)


def _check(max_clients: int, sizes: list[int], empty: str) -> None:
    """A positive ``max_clients`` and no client without samples (``empty`` names the first, by index)."""
    if max_clients <= 0:
        raise ValueError(f"max_clients must be > 0; got {max_clients}")
    for i, size in enumerate(sizes):
        if size == 0:
            raise ValueError(empty.format(i))


def _groups(shapes: list[tuple[tuple[int, ...], tuple[int, ...]]], max_clients: int) -> list[list[int]]:
    """Indices of equal ``shapes`` (a client's ``x`` and ``y`` batch shapes), in chunks of at most ``max_clients``."""
    by_shape: dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]] = {}
    for i, shape in enumerate(shapes):
        by_shape.setdefault(shape, []).append(i)
    return [idx[s : s + max_clients] for idx in by_shape.values() for s in range(0, len(idx), max_clients)]


def _unflatten(model: nn.Module, weights: torch.Tensor) -> dict[str, torch.Tensor]:
    """``weights`` as named parameter views, in :mod:`fedsketch.model.flat` order."""
    d = sum(p.numel() for p in model.parameters())
    if weights.dim() != 1 or weights.numel() != d:
        raise ValueError(f"flat vector has shape {tuple(weights.shape)}; the model needs ({d},)")
    params, offset = {}, 0
    for name, p in model.named_parameters():
        params[name] = weights[offset : offset + p.numel()].view_as(p).to(p.dtype)
        offset += p.numel()
    return params


def _vectorized(
    model: nn.Module, params: dict[str, torch.Tensor], xs: torch.Tensor, ys: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(len(xs), d)`` flat gradients and ``len(xs)`` losses, one row a client."""
    grads, losses = vmap(grad_and_value(_client_loss(model)), in_dims=(None, 0, 0))(params, xs, ys)
    flat = torch.cat([grads[name].reshape(len(xs), -1).float() for name in params], dim=1)
    return flat, losses.detach()


def _client_loss(model: nn.Module) -> Callable[[dict[str, torch.Tensor], torch.Tensor, torch.Tensor], torch.Tensor]:
    """One client's mean cross-entropy as a function of named parameters (``model``'s buffers as they are)."""
    buffers = dict(model.named_buffers())

    def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(functional_call(model, (p, buffers), (x,)), y)

    return loss
