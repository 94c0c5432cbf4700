"""Stochastic compressors: unbiased over many seeds, exact bytes; QSGD, TernGrad, scaled sign to the bit.

Each randomized quantizer is also checked coordinate by coordinate: the reference repeats the paper's
rule in float64 with ``torch.rand`` from a generator seeded as the compressor seeds its own
(docs/mutation.md, "compress_codecs"). Those vectors have exact float32 norms (Pythagorean buckets,
scaled by 1/8 so that every norm is below 1), so the decoded values are compared to the bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from fedsketch.compress import get_compressor, payload_nbytes, qsgd, random_k, signsgd, terngrad

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


# against float64 references that draw from the same seeded generator ----------------------------------------


# Buckets of 3 with norms 3, 6, 6 and 40 (the last padded), the whole vector 41: all exact in float32,
# and below 1 once divided by 64.
X = torch.tensor([1.0, 2.0, -2.0, 2.0, -4.0, 4.0, 4.0, 4.0, -2.0, 24.0, -32.0]) / 64
D = X.numel()


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextmanager
def default_device(device: str) -> Iterator[None]:
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device("cpu")


def rows64(x: torch.Tensor, bucket_size: int | None) -> torch.Tensor:
    """``x`` in float64, as rows of ``bucket_size`` (the last zero-padded), or one row."""
    x = x.double()
    if bucket_size is None or bucket_size >= x.numel():
        return x.reshape(1, -1)
    return torch.nn.functional.pad(x, (0, -x.numel() % bucket_size)).reshape(-1, bucket_size)


def uniforms(seed: int, shape: torch.Size) -> torch.Tensor:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return torch.rand(shape, generator=gen).double()


def qsgd_reference(x: torch.Tensor, s: int, seed: int, bucket_size: int | None) -> torch.Tensor:
    """Alistarh et al. Sec. 3.1 in float64: norm * sign * (floor(r) + Bernoulli(r - floor(r))) / s."""
    rows = rows64(x, bucket_size)
    norms = rows.pow(2).sum(dim=1, keepdim=True).sqrt()
    ratio = torch.where(norms > 0, rows.abs() / torch.where(norms > 0, norms, 1.0) * s, 0.0)
    low = ratio.floor()
    level = low + (uniforms(seed, rows.shape) < ratio - low).double()
    return (norms * torch.sign(rows) * level / s).reshape(-1)[: x.numel()]


def terngrad_reference(x: torch.Tensor, seed: int, bucket_size: int | None) -> torch.Tensor:
    """Wen et al. Eq. 2 in float64: max|g| * sign(g_i) * Bernoulli(|g_i| / max|g|)."""
    rows = rows64(x, bucket_size)
    scale = rows.abs().amax(dim=1, keepdim=True)
    keep = uniforms(seed, rows.shape) < rows.abs() / torch.where(scale > 0, scale, 1.0)
    return (scale * torch.sign(rows) * keep.double()).reshape(-1)[: x.numel()]


# QSGD ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bucket_size", [None, 3])
@pytest.mark.parametrize("s", [1, 4, 5, 255])
@pytest.mark.parametrize("seed", [0, 7])
def test_qsgd_matches_the_float64_reference_to_the_bit(bucket_size: int | None, s: int, seed: int) -> None:
    payload = qsgd.compress(X, s=s, seed=seed, bucket_size=bucket_size)
    norms = rows64(X, bucket_size).pow(2).sum(dim=1).sqrt()
    assert payload["norm"].dtype == np.float32
    assert payload["norm"].tolist() == norms.tolist()
    assert payload["sign"].tolist() == np.packbits((X < 0).numpy(), bitorder="little").tolist()
    out = qsgd.decompress(payload, D, s=s, bucket_size=bucket_size)
    assert out.dtype == torch.float32
    expected = qsgd_reference(X, s, seed, bucket_size)
    assert torch.equal(out.double(), expected.float().double())


def test_qsgd_draws_its_noise_from_the_seed_alone() -> None:
    torch.manual_seed(0)
    a = qsgd.compress(X, s=4, seed=3, bucket_size=3)
    torch.manual_seed(1)
    b = qsgd.compress(X, s=4, seed=3, bucket_size=3)
    assert all(np.array_equal(a[key], b[key]) for key in ("norm", "sign", "level"))
    out = qsgd.decompress(a, D, s=4, bucket_size=3)
    assert torch.equal(out.double(), qsgd_reference(X, 4, 3, 3))


def test_qsgd_draws_its_noise_on_the_vectors_device_whatever_the_default_device() -> None:
    with default_device("meta"):
        payload = qsgd.compress(X, s=4, seed=2, bucket_size=3)
    out = qsgd.decompress(payload, D, s=4, bucket_size=3)
    assert torch.equal(out.double(), qsgd_reference(X, 4, 2, 3))


def test_qsgd_rounds_up_only_when_the_draw_is_below_the_fraction() -> None:
    """Seed 11993 draws exactly 0.0 at coordinate 827 of 1024: a zero coordinate there stays at level 0."""
    seed, d, j = 11993, 1024, 827
    assert float(uniforms(seed, torch.Size([1, d]))[0, j]) == 0.0
    x = torch.zeros(d)
    x[3], x[900] = 3.0, -4.0
    payload = qsgd.compress(x, s=4, seed=seed)
    assert payload["sign"].tolist() == np.packbits((x < 0).numpy(), bitorder="little").tolist()  # zeros go out as +
    out = qsgd.decompress(payload, d, s=4)
    assert float(out[j]) == 0.0
    assert torch.equal(out.double(), qsgd_reference(x, 4, seed, None))


def test_qsgd_caps_levels_at_s_when_the_float32_norm_underflows() -> None:
    """|v| = 5.5e-23 has a subnormal square: its float32 norm is 4 % below |v|, the ratio above s."""
    x = torch.tensor([5.507453235728392e-23, 0.0, 0.0])
    norm = float(torch.linalg.vector_norm(x))
    assert float(x[0]) / norm * 255 > 256
    payload = qsgd.compress(x, s=255, seed=0)
    out = qsgd.decompress(payload, 3, s=255)
    assert out.tolist() == [norm, 0.0, 0.0]


def test_qsgd_checks_s_and_the_seed_by_name() -> None:
    assert qsgd.level_bits(1) == 1
    assert qsgd.level_bits(255) == 8
    with pytest.raises(ValueError, match=r"^s must be in \[1, 255\]; got 0$"):
        qsgd.level_bits(0)
    with pytest.raises(ValueError, match=r"^s must be in \[1, 255\]; got 256$"):
        qsgd.compress(X, s=256, seed=0)
    with pytest.raises(ValueError, match=r"^qsgd is randomized and needs a seed \(see derive_seed\)$"):
        qsgd.compress(X, s=4, seed=None)  # type: ignore[arg-type]


def test_qsgd_refuses_a_level_above_s_by_name() -> None:
    x = torch.zeros(4)
    x[1] = 1.0  # a one-hot vector sits on level s: 7, which 3 bits also hold for s = 4
    payload = qsgd.compress(x, s=7, seed=0)
    with pytest.raises(ValueError, match=r"^qsgd payload has a level above s=4 \(was it sent with another s\?\)$"):
        qsgd.decompress(payload, 4, s=4)
    assert qsgd.decompress(payload, 4, s=7).tolist() == [0.0, 1.0, 0.0, 0.0]


def test_qsgd_payload_errors_name_the_method_and_the_array() -> None:
    payload = qsgd.compress(X, s=4, seed=0, bucket_size=3)
    tail = r" \(do d and the settings match the sender's\?\)$"
    with pytest.raises(ValueError, match=r"^qsgd payload 'norm' is float32\[4\]; expected float32\[1\]" + tail):
        qsgd.decompress(payload, D, s=4)
    bad = {**payload, "sign": np.zeros(3, np.uint8)}
    with pytest.raises(ValueError, match=r"^qsgd payload 'sign' is uint8\[3\]; expected uint8\[2\]" + tail):
        qsgd.decompress(bad, D, s=4, bucket_size=3)
    with pytest.raises(ValueError, match=r"^qsgd payload 'level' is uint8\[5\]; expected uint8\[6\]" + tail):
        qsgd.decompress(payload, D, s=8, bucket_size=3)


def test_qsgd_and_terngrad_decode_to_float32_whatever_the_default_dtype() -> None:
    q = qsgd.compress(X, s=4, seed=1, bucket_size=3)
    t = terngrad.compress(X, seed=1, bucket_size=3)
    with default_dtype(torch.float64):
        q_out = qsgd.decompress(q, D, s=4, bucket_size=3)
        t_out = terngrad.decompress(t, D, bucket_size=3)
    assert q_out.dtype == torch.float32 and t_out.dtype == torch.float32
    assert torch.equal(q_out.double(), qsgd_reference(X, 4, 1, 3))
    assert torch.equal(t_out.double(), terngrad_reference(X, 1, 3))


# TernGrad --------------------------------------------------------------------------------------


@pytest.mark.parametrize("bucket_size", [None, 3])
@pytest.mark.parametrize("seed", [0, 1, 7])
def test_terngrad_matches_the_float64_reference_to_the_bit(bucket_size: int | None, seed: int) -> None:
    payload = terngrad.compress(X, seed=seed, bucket_size=bucket_size)
    scales = rows64(X, bucket_size).abs().amax(dim=1)
    assert payload["scale"].dtype == np.float32
    assert payload["scale"].tolist() == scales.tolist()
    out = terngrad.decompress(payload, D, bucket_size=bucket_size)
    assert out.dtype == torch.float32
    assert torch.equal(out.double(), terngrad_reference(X, seed, bucket_size))


def test_terngrad_draws_its_noise_from_the_seed_on_the_vectors_device() -> None:
    torch.manual_seed(5)
    a = terngrad.compress(X, seed=4)
    with default_device("meta"):
        b = terngrad.compress(X, seed=4)
    assert all(np.array_equal(a[key], b[key]) for key in ("scale", "tern"))
    assert torch.equal(terngrad.decompress(a, D).double(), terngrad_reference(X, 4, None))


def test_terngrad_keeps_a_coordinate_only_when_the_draw_is_below_its_probability() -> None:
    seed, d, j = 11993, 1024, 827  # the draw at j is exactly 0.0 (see the QSGD test)
    x = torch.zeros(d)
    x[3], x[900] = 0.5, -2.0
    out = terngrad.decompress(terngrad.compress(x, seed=seed), d)
    assert float(out[j]) == 0.0
    assert torch.equal(out.double(), terngrad_reference(x, seed, None))


def test_terngrad_codes_and_their_errors() -> None:
    x = torch.tensor([2.0, -2.0, 0.0, 2.0])  # every nonzero coordinate is kept: probability 1
    payload = terngrad.compress(x, seed=0)
    assert payload["tern"].tolist() == [1 | 2 << 2 | 0 << 4 | 1 << 6]
    assert terngrad.decompress(payload, 4).tolist() == [2.0, -2.0, 0.0, 2.0]
    with pytest.raises(ValueError, match=r"^terngrad payload has the unused code 3$"):
        terngrad.decompress({"scale": np.ones(1, np.float32), "tern": np.array([3], np.uint8)}, 1)
    with pytest.raises(ValueError, match=r"^terngrad is randomized and needs a seed \(see derive_seed\)$"):
        terngrad.compress(x, seed=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^terngrad payload 'scale' is float32\[1\]; expected float32\[2\]"):
        terngrad.decompress(payload, 4, bucket_size=2)
    with pytest.raises(ValueError, match=r"^terngrad payload 'tern' is uint8\[1\]; expected uint8\[2\]"):
        terngrad.decompress(payload, 5)


# scaled sign and majority vote -------------------------------------------------------------------


@pytest.mark.parametrize("bucket_size", [None, 3])
def test_signsgd_is_the_mean_magnitude_of_each_bucket_times_the_sign(bucket_size: int | None) -> None:
    x = torch.tensor([1.0, -2.0, 0.0, 4.0, -8.0, 0.5, 0.0, -0.25])
    rows = rows64(x, bucket_size)
    sizes = [min(rows.shape[1], 8 - i * rows.shape[1]) for i in range(rows.shape[0])]
    scales = [float(r.abs().sum()) / n for r, n in zip(rows, sizes, strict=True)]
    payload = signsgd.compress(x, bucket_size=bucket_size)
    assert payload["scale"].dtype == np.float32
    assert payload["scale"].tolist() == [float(np.float32(v)) for v in scales]
    out = signsgd.decompress(payload, 8, bucket_size=bucket_size)
    assert out.dtype == torch.float32
    per = torch.tensor(scales, dtype=torch.float64).repeat_interleave(rows.shape[1])[:8].float().double()
    assert torch.equal(out.double(), per * torch.where(x < 0, -1.0, 1.0).double())


def test_signsgd_gives_zeros_the_seeds_fair_coins() -> None:
    x = torch.tensor([0.0, 1.0, 0.0, -1.0, 0.0, 0.0, 2.0, 0.0] * 4)
    coins = uniforms(9, x.shape) < 0.5
    torch.manual_seed(0)
    out = signsgd.decompress(signsgd.compress(x, zero_seed=9), 32)
    negative = torch.where(x == 0, coins, x < 0)
    assert torch.equal(out < 0, negative)
    assert 0 < int(coins[x == 0].sum()) < 16  # both signs occur among the zeros


def test_signsgd_sends_a_zero_as_plus_when_its_coin_is_exactly_one_half() -> None:
    """Seed 1965 draws exactly 0.5 at coordinate 987 of 1024: 0.5 < 0.5 is false, so the sign is +."""
    seed, d, j = 1965, 1024, 987
    assert float(uniforms(seed, torch.Size([d]))[j]) == 0.5
    x = torch.ones(d)
    x[j] = 0.0
    out = signsgd.decompress(signsgd.compress(x, zero_seed=seed), d)
    assert float(out[j]) > 0


def test_signsgd_decodes_to_float32_and_names_itself() -> None:
    payload = signsgd.compress(X, bucket_size=3)
    with default_dtype(torch.float64):
        out = signsgd.decompress(payload, D, bucket_size=3)
    assert out.dtype == torch.float32
    with pytest.raises(ValueError, match=r"^signsgd payload 'scale' is float32\[4\]; expected float32\[1\]"):
        signsgd.decompress(payload, D)
    with pytest.raises(ValueError, match=r"^signsgd payload 'sign' is uint8\[2\]; expected uint8\[3\]"):
        signsgd.decompress(payload, 17, bucket_size=5)


def test_majority_vote_is_the_sign_of_the_sum_of_signs() -> None:
    votes = [
        torch.tensor([1.0, -2.0, 3.0, 0.0], dtype=torch.float64),
        torch.tensor([5.0, -1.0, -1.0, 0.0], dtype=torch.float64),
        torch.tensor([-1.0, 4.0, -2.0, 0.0], dtype=torch.float64),
    ]
    out = signsgd.majority_vote(votes)
    assert out.dtype == torch.float32
    assert out.tolist() == [1.0, -1.0, -1.0, 0.0]
    assert signsgd.majority_vote(votes[:2]).tolist() == [1.0, -1.0, 0.0, 0.0]
    assert signsgd.majority_vote([torch.tensor([3, -1, 0])]).dtype == torch.float32


def test_majority_vote_refuses_no_votes_and_mixed_shapes_by_name() -> None:
    with pytest.raises(ValueError, match=r"^majority_vote needs at least one vector$"):
        signsgd.majority_vote([])
    with pytest.raises(ValueError, match=r"^votes have shapes \(3,\) and \(4,\)$"):
        signsgd.majority_vote([torch.zeros(3), torch.zeros(3), torch.zeros(4)])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_quantizers_on_cuda_draw_on_cuda_and_vote_across_devices() -> None:
    x = X.to("cuda")
    q = qsgd.compress(x, s=4, seed=2, bucket_size=3)  # a CUDA generator: another stream than the CPU's
    q_out = qsgd.decompress(q, D, s=4, bucket_size=3).double()
    norms = rows64(X, 3).pow(2).sum(dim=1).sqrt().repeat_interleave(3)[:D]
    assert torch.all((q_out - X.double()).abs() <= norms / 4)  # floor or ceiling of each level
    t = terngrad.compress(x, seed=2, bucket_size=3)
    t_out = terngrad.decompress(t, D, bucket_size=3).double()
    scales = rows64(X, 3).abs().amax(dim=1).repeat_interleave(3)[:D]
    assert torch.all((t_out == 0) | (t_out == torch.sign(X.double()) * scales))
    zeros = torch.tensor([0.0, 1.0, 0.0, -1.0, 0.0, 0.0, 2.0, 0.0])
    on_cuda = signsgd.compress(zeros.to("cuda"), bucket_size=3, zero_seed=9)
    on_cpu = signsgd.compress(zeros, bucket_size=3, zero_seed=9)  # the coins are drawn on the CPU either way
    assert all(np.array_equal(on_cuda[key], on_cpu[key]) for key in ("scale", "sign"))
    vote = signsgd.majority_vote([torch.tensor([1.0, -1.0], device="cuda"), torch.tensor([1.0, 1.0])])
    assert vote.device.type == "cuda" and vote.tolist() == [1.0, 0.0]
