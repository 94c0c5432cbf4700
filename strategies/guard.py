"""What one client can do to the model: the norm bound, clipping, and client-level DP on the sum.

The norm bound (``norm-bound``, on by default) sets aside any upload whose norm is more than that many times
the median of the round's uploads: one client that sends its update scaled by 10^6 no longer wrecks the
model (docs/trust.md). It needs no scale of its own, and an honest round seldom reaches it (docs/trust.md
gives how often on the default job).

Both act on validated :class:`~fedsketch.methods.ClientUpdate` values before a
method's ``step`` sees them, so the methods stay unaware of them.

Clipping (``clip-norm`` C) scales each client's update to L2 norm at most C.
What "norm" means is the method's (:attr:`fedsketch.methods.method.Privacy.norm`): the
dense update's for uncompressed uploads, the decoded vector's for compressed
ones, and for FetchSGD the Count Sketch's own estimate of the norm of the
vector it sketches (the median of its rows' norms), since the server never
sees that vector.

Differential privacy (``dp-noise-multiplier`` sigma, :mod:`fedsketch.server.privacy`)
needs the sensitivity of what is released, the *sum* of uploads, bounded
exactly rather than estimated: each upload's arrays are clipped to Frobenius
norm ``C * s`` (``s = sqrt(rows)`` for a sketch, whose every row has the
norm of the sketched vector in expectation; ``s = 1`` for a dense vector), the
sum gets ``N(0, (sigma C s)^2)`` per entry, and is divided by the number of
clients sampled per round (a fixed denominator: dividing by the number that
answered would leak it). Clients are weighted equally, not by examples, for
the same reason. The noise comes from a generator seeded from the operating
system, never from the run seed, which anyone holding the config knows.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Callable, Mapping

import numpy as np
import torch

from fedsketch.client.uploads import clip_payload
from fedsketch.config import RunConfig
from fedsketch.methods import ClientUpdate, Method
from fedsketch.methods.method import payload_norm
from fedsketch.server.privacy import clip_factor


def noise_generator() -> torch.Generator:
    """The DP noise's generator, seeded from the operating system (never the run seed, which anyone may know)."""
    gen = torch.Generator()
    gen.manual_seed(secrets.randbits(63))
    return gen


@dataclasses.dataclass(frozen=True)
class Screened:
    """The updates a method's step gets, how many were scaled down to the bound, whether noise was released."""

    updates: list[ClientUpdate]
    clipped: int = 0
    noised: bool = False  # one noisy sum released: one more round for the privacy budget


def screen(cfg: RunConfig, method: Method, noise: torch.Generator, d: int, updates: list[ClientUpdate]) -> Screened:
    """Clipping, or clipping and noise on the sum (one update of weight 1), as the run asks."""
    if cfg.dp_noise_multiplier > 0:
        bound = cfg.clip_norm * method.privacy.sensitivity(cfg)
        clipped = sum(payload_norm(u) > bound for u in updates)
        mean = noisy_mean(updates, bound, cfg.dp_noise_multiplier, cfg.clients_per_round, noise)
        return Screened([mean], int(clipped), noised=True)
    if cfg.clip_norm > 0 and method.privacy.norm is not None:
        norm_of = method.privacy.norm
        return Screened(*clip_updates(updates, cfg.clip_norm, lambda u: norm_of(u, cfg, d), scale_payload))
    return Screened(updates)


def clip_updates(
    updates: list[ClientUpdate],
    bound: float,
    norm_of: Callable[[ClientUpdate], float],
    scale: Callable[[ClientUpdate, float], ClientUpdate],
) -> tuple[list[ClientUpdate], int]:
    """Each update scaled to ``norm_of(u) <= bound``; also returns how many had to be scaled."""
    out, clipped = [], 0
    for u in updates:
        factor = clip_factor(norm_of(u), bound)
        if factor < 1.0:
            u, clipped = scale(u, factor), clipped + 1
        out.append(u)
    return out, clipped


def scale_payload(u: ClientUpdate, factor: float) -> ClientUpdate:
    """The update with every float array (and a decoded tensor and diagnostic arrays, if any) times ``factor``.

    A diagnostic dense update is scaled with its sketch, so that it stays the vector the sketch encodes.
    """
    decoded = u.decoded * factor if isinstance(u.decoded, torch.Tensor) else u.decoded
    diagnostic = clip_payload(u.diagnostic, factor) if u.diagnostic is not None else None
    return dataclasses.replace(u, payload=clip_payload(u.payload, factor), decoded=decoded, diagnostic=diagnostic)


def noisy_mean(
    updates: list[ClientUpdate], bound: float, noise_multiplier: float, expected: int, generator: torch.Generator
) -> ClientUpdate:
    """``(sum of clipped payloads + N(0, (noise_multiplier * bound)^2)) / expected``, as one update.

    ``bound`` is the sensitivity: every payload is first clipped to Frobenius
    norm ``bound`` (:func:`payload_norm`). The result has weight 1 so that a
    method's example-weighted mean of it is itself.
    """
    clipped, _ = clip_updates(updates, bound, payload_norm, scale_payload)
    std = noise_multiplier * bound
    payload = {}
    for name, arr in clipped[0].payload.items():
        total = torch.zeros(arr.shape, dtype=torch.float64)
        for u in clipped:
            total += torch.from_numpy(u.payload[name]).double()
        noise = torch.normal(0.0, std, size=arr.shape, generator=generator, dtype=torch.float64)
        payload[name] = ((total + noise) / expected).numpy().astype(arr.dtype)
    losses = [u.loss for u in updates if u.loss == u.loss]
    return ClientUpdate(
        cid=-1,
        payload=payload,
        num_examples=1,
        loss=float(np.mean(losses)) if losses else float("nan"),
        upload_bytes=sum(u.upload_bytes for u in updates),
    )


def all_finite(value: object) -> bool:
    """Whether every tensor in ``value`` (a tensor, a dataclass or mapping of them, or None) is finite."""
    if isinstance(value, torch.Tensor):
        return bool(torch.isfinite(value).all()) if value.is_floating_point() else True
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return all(all_finite(getattr(value, f.name)) for f in dataclasses.fields(value))
    if isinstance(value, Mapping):
        return all(all_finite(v) for v in value.values())
    return True
