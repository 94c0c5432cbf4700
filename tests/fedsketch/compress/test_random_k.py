"""Identity, top-k, random-k, buckets and error feedback against float64 references on small inputs.

Each test pins one property the compressors promise (docs/mutation.md, "compress" section): identity is
bit-exact, top-k keeps exactly the k largest magnitudes, random-k keeps the seed's coordinates scaled by
``d / k`` when asked, buckets split and expand as documented, and error feedback carries what was not sent
to the bit.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from fedsketch.compress import buckets, identity, random_k, topk
from fedsketch.compress.error_feedback import compress_with_feedback

# Distinct magnitudes, dyadic (exact in float32): no ties for top-k to break.
X = torch.tensor([0.5, -3.0, 1.25, 0.0, -0.75, 2.0, -0.125], dtype=torch.float32)


# identity ------------------------------------------------------------------


def test_identity_round_trip_is_bit_identical_and_owns_its_buffers() -> None:
    x = torch.tensor([1e-30, -3.5, float("inf"), 7.0], dtype=torch.float32)
    payload = identity.compress(x)
    assert set(payload) == {"update"}
    assert payload["update"].dtype == np.float32
    out = identity.decompress(payload, 4)
    assert out.dtype == torch.float32
    assert torch.equal(out, x)
    payload["update"][0] = 99.0  # the decoded tensor is a copy of the payload
    assert out[0].item() == pytest.approx(1e-30)
    x[1] = 42.0  # and the payload is a copy of the input
    assert payload["update"][1] == -3.5


def test_identity_names_itself_when_the_payload_does_not_match() -> None:
    payload = identity.compress(torch.zeros(3))
    with pytest.raises(ValueError, match=r"^none payload 'update' is float32\[3\]; expected float32\[4\]"):
        identity.decompress(payload, 4)
    with pytest.raises(ValueError, match=r"^none payload has no 'update' array; keys: \['x'\]"):
        identity.decompress({"x": np.zeros(3, np.float32)}, 3)
    with pytest.raises(ValueError, match=r"^d must be in \[1, 2147483647\]; got 0"):
        identity.decompress(payload, 0)


# top-k ---------------------------------------------------------------------


def reference_topk(x: torch.Tensor, k: int) -> set[int]:
    """Indices of the k largest magnitudes, by a float64 sort in Python."""
    mags = [abs(float(v)) for v in x.double()]
    return set(sorted(range(len(mags)), key=lambda i: -mags[i])[:k])


@pytest.mark.parametrize("k", [1, 2, 3, 6, 7])
def test_topk_keeps_exactly_the_k_largest_magnitudes(k: int) -> None:
    indices, values = topk.topk(X, k)
    assert indices.dtype == torch.int64
    assert set(indices.tolist()) == reference_topk(X, k)
    assert torch.equal(values, X[indices])
    out = topk.decompress(topk.compress(X, k=k), X.numel())
    expected = torch.zeros(X.numel(), dtype=torch.float64)
    for i in reference_topk(X, k):
        expected[i] = X[i].double()
    assert torch.equal(out.double(), expected)


def test_topk_refuses_k_out_of_range_by_name() -> None:
    with pytest.raises(ValueError, match=r"^k must be in \[1, 7\]; got 0$"):
        topk.topk(X, 0)
    with pytest.raises(ValueError, match=r"^k must be in \[1, 7\]; got 8$"):
        topk.compress(X, k=8)
    with pytest.raises(ValueError, match=r"^d must be in \[1, 2147483647\]; got 0$"):
        topk.decompress(topk.compress(X, k=1), 0)


def test_topk_uses_varint_only_when_asked() -> None:
    x = torch.zeros(1000)
    x[100:110] = torch.arange(1.0, 11.0)  # ten neighbours: gaps of zero, 10 bytes as varints, 40 as int32
    plain = topk.compress(x, k=10)
    assert int(plain["enc"][0]) == 0 and "idx" in plain
    packed = topk.compress(x, k=10, varint=True)
    assert "gaps" in packed and packed["gaps"].nbytes == 10
    assert torch.equal(topk.decompress(packed, 1000), x)


# random-k ------------------------------------------------------------------


def reference_coordinates(d: int, k: int, seed: int) -> list[int]:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return sorted(torch.randperm(d, generator=gen)[:k].tolist())


@pytest.mark.parametrize(("d", "k", "seed"), [(7, 1, 0), (7, 3, 5), (7, 7, 2**63 - 1), (50, 9, 123)])
def test_random_k_coordinates_are_the_seeds_first_k_of_a_permutation(d: int, k: int, seed: int) -> None:
    coords = random_k.coordinates(d, k, seed)
    assert coords.dtype == torch.int64 and coords.device.type == "cpu"
    assert coords.tolist() == reference_coordinates(d, k, seed)


@pytest.mark.parametrize("rescale", [False, True])
def test_random_k_sends_the_values_at_the_coordinates_scaled_by_d_over_k(rescale: bool) -> None:
    d, k, seed = 7, 2, 3
    coords = reference_coordinates(d, k, seed)
    payload = random_k.compress(X, k=k, seed=seed, rescale=rescale)
    assert payload["val"].dtype == np.float32
    factor = d / k if rescale else 1.0
    expected_val = [float(np.float32(X[i].double().item() * factor)) for i in coords]
    assert payload["val"].tolist() == expected_val
    out = random_k.decompress(payload, d, seed=seed)
    assert out.dtype == torch.float32
    expected = torch.zeros(d, dtype=torch.float64)
    expected[coords] = torch.tensor(expected_val, dtype=torch.float64)
    assert torch.equal(out.double(), expected)


def test_random_k_decodes_to_float32_whatever_the_default_dtype() -> None:
    payload = random_k.compress(X, k=3, seed=4)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        out = random_k.decompress(payload, 7, seed=4)
    finally:
        torch.set_default_dtype(previous)
    assert out.dtype == torch.float32
    assert torch.equal(out[reference_coordinates(7, 3, 4)], torch.from_numpy(payload["val"]))


def test_random_k_rescaled_is_unbiased_over_all_seeds_of_a_small_case() -> None:
    """Over many seeds every coordinate is kept k/d of the time; the mean is x to sampling error."""
    d, k = 7, 2
    total = torch.zeros(d, dtype=torch.float64)
    n = 4000
    for seed in range(n):
        total += random_k.decompress(random_k.compress(X, k=k, seed=seed, rescale=True), d, seed=seed).double()
    std = X.double().abs() * (d / k - 1) ** 0.5 / n**0.5
    assert torch.all((total / n - X.double()).abs() <= 5 * std + 1e-12)


def test_random_k_refuses_bad_k_and_bad_payloads_by_name() -> None:
    with pytest.raises(ValueError, match=r"^k must be in \[1, 7\]; got 0$"):
        random_k.coordinates(7, 0, 1)
    with pytest.raises(ValueError, match=r"^k must be in \[1, 7\]; got 8$"):
        random_k.compress(X, k=8, seed=1)
    with pytest.raises(ValueError, match=r"^random_k is randomized and needs a seed"):
        random_k.coordinates(7, 2, None)  # type: ignore[arg-type]
    good = np.zeros(3, np.float32)
    random_k.decompress({"val": good}, 3, seed=0)
    random_k.decompress({"val": good[:1]}, 3, seed=0)
    bad = {
        "float64[3]": good.astype(np.float64),
        "float32[1, 3]": good.reshape(1, 3),
        "float32[0]": good[:0],
        "float32[4]": np.zeros(4, np.float32),
    }
    for shown, val in bad.items():
        message = f"random_k payload 'val' must be float32[k], 1 <= k <= 3; got {shown}"
        with pytest.raises(ValueError) as caught:
            random_k.decompress({"val": val}, 3, seed=0)
        assert str(caught.value) == message
    with pytest.raises(ValueError, match=r"^random_k payload 'val' must be float32"):
        random_k.decompress({}, 3, seed=0)


# buckets -------------------------------------------------------------------


def test_split_pads_the_last_bucket_with_zeros() -> None:
    v = torch.arange(1.0, 8.0)  # 7 coordinates
    assert torch.equal(buckets.split(v, 3), torch.tensor([[1.0, 2, 3], [4, 5, 6], [7, 0, 0]]))
    assert torch.equal(buckets.split(v, 7), v.reshape(1, 7))
    assert torch.equal(buckets.split(v, 8), v.reshape(1, 7))
    assert torch.equal(buckets.split(v, None), v.reshape(1, 7))
    assert torch.equal(buckets.split(v, 1), v.reshape(7, 1))
    assert torch.equal(buckets.split(torch.arange(1.0, 7.0), 2), torch.arange(1.0, 7.0).reshape(3, 2))


def test_sizes_count_the_real_coordinates_of_each_bucket() -> None:
    assert buckets.sizes(7, 3).tolist() == [3.0, 3.0, 1.0]
    assert buckets.sizes(5, 2).tolist() == [2.0, 2.0, 1.0]
    assert buckets.sizes(6, 2).tolist() == [2.0, 2.0, 2.0]
    assert buckets.sizes(7, 7).tolist() == [7.0]
    assert buckets.sizes(7, 9).tolist() == [7.0]
    assert buckets.sizes(7, None).tolist() == [7.0]
    assert buckets.sizes(7, 3).dtype == torch.float32


def test_expand_repeats_each_bucket_scale_over_its_coordinates() -> None:
    scales = torch.tensor([2.0, 3.0, 5.0])
    assert buckets.expand(scales, 7, 3).tolist() == [2.0, 2.0, 2.0, 3.0, 3.0, 3.0, 5.0]
    assert buckets.expand(torch.tensor([4.0]), 5, None).tolist() == [4.0] * 5
    assert buckets.expand(torch.tensor([4.0]), 5, 8).tolist() == [4.0] * 5
    assert buckets.expand(torch.tensor(4.0), 3, None).tolist() == [4.0] * 3


# error feedback ------------------------------------------------------------


def test_feedback_carries_exactly_what_was_not_sent() -> None:
    """sent + new carry == update + old carry, to the bit in float64 (dyadic inputs sum exactly)."""
    error = torch.tensor([0.25, 1.0, -0.5, 4.0, 0.0, -2.0, 0.0625], dtype=torch.float64)
    payload, new_error = compress_with_feedback(X, error, partial(topk.compress, k=3), partial(topk.decompress, d=7))
    assert new_error.dtype == torch.float32  # a float64 carry is brought to float32
    sent = topk.decompress(payload, 7).double()
    target = X.double() + error
    assert torch.equal(sent + new_error.double(), target)
    assert set(torch.nonzero(sent).reshape(-1).tolist()) == reference_topk(target.float(), 3)
    assert torch.equal(new_error.double(), torch.where(sent == 0, target, torch.zeros_like(target)))


def test_feedback_with_no_carry_compresses_the_update_itself() -> None:
    payload, new_error = compress_with_feedback(X, None, identity.compress, partial(identity.decompress, d=7))
    assert torch.equal(torch.from_numpy(payload["update"]), X)
    assert torch.equal(new_error, torch.zeros(7))


def test_feedback_keeps_the_carry_on_the_updates_device() -> None:
    """An update on another device (meta, which holds no data) than the CPU carry and the CPU decoder's answer."""
    update = torch.zeros(7, device="meta")
    payload, new_error = compress_with_feedback(update, torch.ones(7), lambda t: {}, lambda p: torch.zeros(7))
    assert payload == {}
    assert new_error.device.type == "meta" and new_error.shape == (7,) and new_error.dtype == torch.float32


def test_feedback_refuses_a_carry_of_another_shape_but_takes_the_same_shape() -> None:
    comp, dec = partial(topk.compress, k=1), partial(topk.decompress, d=4)
    with pytest.raises(ValueError, match=r"^error has shape \(2, 2\); update has \(4,\)$"):
        compress_with_feedback(torch.ones(4), torch.zeros(2, 2), comp, dec)
    _, new_error = compress_with_feedback(torch.ones(4), torch.zeros(4), comp, dec)
    assert new_error.sum().item() == 3.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_random_k_on_cuda_sends_the_seeds_values() -> None:
    payload = random_k.compress(X.to("cuda"), k=3, seed=4, rescale=True)
    assert payload["val"].tolist() == [float(np.float32(X[i].item() * 7 / 3)) for i in reference_coordinates(7, 3, 4)]
