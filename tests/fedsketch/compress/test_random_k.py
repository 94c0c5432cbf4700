"""Random-k sends the seed's coordinates, scaled by ``d / k`` when asked, against a reference permutation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsketch.compress import random_k
from tests.fedsketch.compress.test_topk import X


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


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_random_k_on_cuda_sends_the_seeds_values() -> None:
    payload = random_k.compress(X.to("cuda"), k=3, seed=4, rescale=True)
    assert payload["val"].tolist() == [float(np.float32(X[i].item() * 7 / 3)) for i in reference_coordinates(7, 3, 4)]
