"""Stochastic compressors: unbiased over many seeds; exact payload bytes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedsketch.compress import (
    get_compressor,
    payload_nbytes,
    qsgd,
    random_k,
    signsgd,
    terngrad,
)

SEEDS = 2000
Z = 5.0  # per-coordinate z-score bound; with d = 40 coordinates, P(fail) < 40 * 6e-7


def sample_mean(comp_name: str, x: torch.Tensor, **options: object) -> torch.Tensor:
    comp = get_compressor(comp_name, x.numel(), **options)
    total = torch.zeros_like(x, dtype=torch.float64)
    for seed in range(SEEDS):
        total += comp.decompress(comp.compress(x, seed=seed), seed=seed).double()
    return total / SEEDS


def assert_unbiased(mean: torch.Tensor, x: torch.Tensor, std: torch.Tensor) -> None:
    """|mean - x| <= Z * std / sqrt(N) per coordinate (CLT), plus float32 slack."""
    tol = Z * std.double() / math.sqrt(SEEDS) + 1e-6 * x.abs().max().double()
    excess = (mean - x.double()).abs() - tol
    assert float(excess.max()) <= 0.0, f"worst coordinate off by {float(excess.max())} beyond tolerance"


def vector(d: int = 40, seed: int = 0) -> torch.Tensor:
    return torch.randn(d, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("bucket_size", [None, 16])
def test_qsgd_is_unbiased(bucket_size: int | None) -> None:
    x, s = vector(), 4
    rows = x.reshape(1, -1) if bucket_size is None else torch.nn.functional.pad(x, (0, 8)).reshape(-1, 16)
    norms = rows.norm(dim=1, keepdim=True).expand_as(rows).reshape(-1)[: x.numel()]
    r = x.abs() / norms * s
    p = r - r.floor()
    std = norms / s * torch.sqrt(p * (1 - p))  # one sample: (norm/s) * Bernoulli(p)
    mean = sample_mean("qsgd", x, s=s, bucket_size=bucket_size)
    assert_unbiased(mean, x, std)
    # The tolerance is tight enough to see the bias of deterministic rounding.
    nearest = torch.sign(x) * norms * torch.round(r) / s
    assert float(((nearest - x).abs() - Z * std / math.sqrt(SEEDS)).max()) > 0


def test_terngrad_is_unbiased() -> None:
    x = vector()
    scale = x.abs().max()
    p = x.abs() / scale
    std = scale * torch.sqrt(p * (1 - p))
    assert_unbiased(sample_mean("terngrad", x), x, std)


def test_random_k_with_rescale_is_unbiased() -> None:
    x, k = vector(), 10
    d = x.numel()
    std = x.abs() * math.sqrt(d / k - 1)  # x * d/k with probability k/d, else 0
    assert_unbiased(sample_mean("random_k", x, k=k, rescale=True), x, std)


def test_random_k_sends_values_only_and_needs_the_seed_to_decode() -> None:
    x, d, k = vector(100), 100, 7
    payload = random_k.compress(x, k=k, seed=11)
    assert set(payload) == {"val"}
    assert payload["val"].dtype == np.float32 and payload["val"].shape == (k,)
    out = random_k.decompress(payload, d, seed=11)
    support = torch.nonzero(out).reshape(-1)
    torch.testing.assert_close(support, random_k.coordinates(d, k, 11))
    torch.testing.assert_close(out[support], x[support])
    other = random_k.decompress(payload, d, seed=12)
    assert not torch.equal(torch.nonzero(other).reshape(-1), support)


def test_qsgd_bytes_s4_d1000() -> None:
    d, s = 1000, 4  # levels 0..4 need ceil(log2 5) = 3 bits
    payload = qsgd.compress(vector(d), s=s, seed=0)
    shapes = {key: (arr.dtype, arr.shape) for key, arr in payload.items()}
    assert shapes == {
        "norm": (np.dtype(np.float32), (1,)),
        "sign": (np.dtype(np.uint8), (125,)),
        "level": (np.dtype(np.uint8), (375,)),
    }
    assert payload_nbytes(payload) == 4 + math.ceil(d / 8) + math.ceil(d * 3 / 8) == 504


@pytest.mark.parametrize(("d", "bucket_size"), [(1001, None), (1001, 128), (64, 64)])
def test_bytes_of_terngrad_signsgd_and_bucketed_qsgd(d: int, bucket_size: int | None) -> None:
    nb = 1 if bucket_size is None else math.ceil(d / bucket_size)
    x = vector(d)
    tern = terngrad.compress(x, seed=0, bucket_size=bucket_size)
    sign = signsgd.compress(x, bucket_size=bucket_size)
    quant = qsgd.compress(x, s=255, seed=0, bucket_size=bucket_size)
    assert payload_nbytes(tern) == 4 * nb + math.ceil(2 * d / 8)
    assert payload_nbytes(sign) == 4 * nb + math.ceil(d / 8)
    assert payload_nbytes(quant) == 4 * nb + math.ceil(d / 8) + d  # 255 levels: 8 bits


def test_stochastic_compressors_are_deterministic_given_the_seed() -> None:
    x = vector(500)
    for name, options in [
        ("qsgd", {"s": 3}),
        ("terngrad", {}),
        ("random_k", {"k": 20}),
    ]:
        comp = get_compressor(name, 500, **options)
        a, b, c = (
            comp.compress(x, seed=5),
            comp.compress(x, seed=5),
            comp.compress(x, seed=6),
        )
        assert all(np.array_equal(a[key], b[key]) for key in a), name
        assert not all(np.array_equal(a[key], c[key]) for key in a), name


def test_signsgd_is_the_scaled_sign() -> None:
    x = torch.tensor([3.0, -1.0, 0.0, -4.0])
    out = signsgd.decompress(signsgd.compress(x), 4)
    # ||x||_1 / d = 2; a zero coordinate goes out as +scale.
    torch.testing.assert_close(out, torch.tensor([2.0, -2.0, 2.0, -2.0]))
    bucketed = signsgd.decompress(signsgd.compress(x, bucket_size=3), 4, bucket_size=3)
    torch.testing.assert_close(bucketed, torch.tensor([4 / 3, -4 / 3, 4 / 3, -4.0]))


def test_quantizers_send_zero_vectors_as_zero() -> None:
    x = torch.zeros(33)
    assert torch.equal(qsgd.decompress(qsgd.compress(x, s=2, seed=0), 33, s=2), x)
    assert torch.equal(terngrad.decompress(terngrad.compress(x, seed=0), 33), x)


def test_qsgd_keeps_extreme_coordinates_exact() -> None:
    """A one-hot vector sits on level s: no rounding noise at all."""
    x = torch.zeros(10)
    x[3] = -2.5
    out = qsgd.decompress(qsgd.compress(x, s=7, seed=1), 10, s=7)
    torch.testing.assert_close(out, x)


def test_decoding_with_other_settings_fails_loudly() -> None:
    payload = qsgd.compress(vector(100), s=4, seed=0)
    with pytest.raises(ValueError, match=r"'sign' is uint8\[13\]; expected uint8\[125\]"):
        qsgd.decompress(payload, 1000, s=4)
    with pytest.raises(ValueError, match=r"'level' is uint8\[38\]; expected uint8\[50\]"):
        qsgd.decompress(payload, 100, s=8)
    with pytest.raises(ValueError, match=r"'norm' is float32\[1\]; expected float32\[4\]"):
        qsgd.decompress(payload, 100, s=4, bucket_size=32)
    with pytest.raises(ValueError, match="no 'scale' array"):
        terngrad.decompress(payload, 100)
