"""Gaussian-k lands within its documented factor of k, and caps to exact top-k."""

from __future__ import annotations

import pytest
import torch

from fedsketch.compress import gaussiank, sparse_count, topk

D = 100_000
KS = (100, 1000, 10_000)


def gaussian(seed: int) -> torch.Tensor:
    return 0.01 * torch.randn(D, generator=torch.Generator().manual_seed(seed))


def laplace(seed: int) -> torch.Tensor:
    u = torch.rand(D, generator=torch.Generator().manual_seed(seed)) - 0.5
    return -torch.sign(u) * torch.log1p(-2 * u.abs())


def student_t3(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(D, generator=gen)
    chi2 = (torch.randn(3, D, generator=gen) ** 2).sum(0)
    return z / torch.sqrt(chi2 / 3)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("k", KS)
def test_gaussian_vectors_land_in_the_window_at_once(seed: int, k: int) -> None:
    sel = gaussiank.select(gaussian(seed), k)
    assert 2 * k / 3 <= sel.count <= 4 * k / 3
    assert sel.rounds == 1


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("make", [laplace, student_t3])
def test_heavy_tails_land_within_the_documented_factors(seed: int, make: object) -> None:
    vec = make(seed)  # type: ignore[operator]
    for k in KS:
        paper = gaussiank.select(vec, k, adjust="paper").count
        interp = gaussiank.select(vec, k, adjust="interpolate").count
        assert k / 8 <= paper <= 8 * k, (k, paper)
        assert k / 2 <= interp <= 2 * k, (k, interp)


def test_selection_is_a_magnitude_threshold() -> None:
    vec = laplace(7)
    sel = gaussiank.select(vec, 500)
    inside = torch.zeros(D, dtype=torch.bool)
    inside[sel.indices] = True
    assert vec.abs()[inside].min() > sel.threshold >= vec.abs()[~inside].max()
    assert torch.equal(sel.values, vec[sel.indices])
    assert torch.equal(sel.indices, torch.sort(sel.indices).values)


def test_same_selection_for_x_and_minus_x() -> None:
    vec = gaussian(3) + 0.002
    assert torch.equal(gaussiank.select(vec, 300).indices, gaussiank.select(-vec, 300).indices)


def test_cap_keeps_the_exact_top_k_when_it_overshoots() -> None:
    vec, k = laplace(0), 1000  # the paper's rule overshoots to ~6.5k here
    sel = gaussiank.select(vec, k)
    assert sel.count > k
    capped = gaussiank.compress(vec, k=k)
    assert sparse_count(capped) == k
    exact = topk.decompress(topk.compress(vec, k=k), D)
    torch.testing.assert_close(gaussiank.decompress(capped, D), exact)
    uncapped = gaussiank.compress(vec, k=k, cap=False)
    assert sparse_count(uncapped) == sel.count


def test_rejects_bad_options() -> None:
    with pytest.raises(ValueError, match=r"k must be in \[1, 100000\]"):
        gaussiank.select(gaussian(0), 0)
    with pytest.raises(ValueError, match="adjust must be one of"):
        gaussiank.select(gaussian(0), 10, adjust="bisect")
    with pytest.raises(ValueError, match=r"max_rounds must be in \[1"):
        gaussiank.select(gaussian(0), 10, max_rounds=0)
