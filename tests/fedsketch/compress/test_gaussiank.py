"""Gaussian-k lands within its factor of k, caps to exact top-k, and searches its threshold as a reference does.

The reference repeats Shi et al.'s search (arXiv:1911.08772, Sec. 5) in Python floats: the initial
threshold ``|mu| + sigma * Phi^{-1}(1 - k / (2 d))``, the count window ``[2k/3, 4k/3]``, and the two
correction rules. Each vector checked against it was picked for the path it takes (named in its
comment), with every magnitude far from every threshold tried, so float32 and float64 select the same
coordinates.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest
import torch

from fedsketch.compress import gaussiank, sparse_count, topk
from fedsketch.compress.sparse import decode_sparse

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


# the threshold search against a float64 reference, on small vectors with known paths ------------------------


# k = 3, paper rule: counts 1, 6, 5, 1, 6, 5, ... never in the window; interpolate: 1, 6, 5, 5, 1, 5.
WANDERS = [-2.0, -6.0, 6.0, 1.0, -6.0, -4.0, 16.0, -6.0, 1.0, -3.0]
# k = 3, paper rule: counts 1 (halve), 5 (grow by 1.5), 3: in the window after a bracket.
BRACKETS = [3.0, -8.0, 6.0, -1.0, -8.0, -0.25, 0.0, -0.25, -6.0, -2.0, -2.0, -16.0]
# k = 2, interpolate: counts 3, 0, 0, 3, 0, 0: the midpoint rule for a threshold that selected none.
EMPTIES = [-0.25, 2.0, -4.0, 0.5, -8.0, -16.0, -16.0, 0.5, -4.0, -3.0, -1.0, 16.0]
# k = 3: the first threshold selects 2 = 2k/3, the window's lower edge.
LOW_EDGE = [2.0, -4.0, -0.5, 0.25, 8.0, 8.0, -2.0, 16.0, 8.0, 16.0]
# k = 3: the first threshold selects 4 = 4k/3, the window's upper edge.
HIGH_EDGE = [0.0, 3.0, -2.0, 0.0, 16.0, 0.0, 16.0, -16.0, -0.5, 2.0, 16.0, 0.5, -1.0, 0.0, -8.0, 8.0]


def reference_threshold(values: list[float], k: int) -> float:
    d = len(values)
    mean = sum(values) / d
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / d)  # population std (correction 0)
    return abs(mean) + std * NormalDist().inv_cdf(1.0 - k / (2.0 * d))


def reference_select(
    values: list[float], k: int, max_rounds: int = 3, adjust: str = "paper"
) -> tuple[list[int], float, int, list[tuple[float, int]]]:
    """(indices, last threshold, rounds, the (threshold, count) pairs tried), in Python floats."""
    t = reference_threshold(values, k)
    tried: list[tuple[float, int]] = []
    for rounds in range(1, max_rounds + 1):
        chosen = [i for i, v in enumerate(values) if abs(v) > t]
        tried.append((t, len(chosen)))
        if 2 * k <= 3 * len(chosen) <= 4 * k or rounds == max_rounds:
            return chosen, t, rounds, tried
        many = [p for p in tried if 3 * p[1] > 4 * k]
        few = [p for p in tried if 3 * p[1] < 2 * k]
        if adjust == "interpolate" and many and few:
            (t_a, c_a), (t_b, c_b) = max(many), min(few)
            if c_b == 0:
                t = (t_a + t_b) / 2
            else:
                t = t_a + (math.log(k) - math.log(c_a)) * (t_b - t_a) / (math.log(c_b) - math.log(c_a))
        else:
            t *= 0.5 if 3 * len(chosen) < 2 * k else 1.5
    raise AssertionError("unreachable")


CASES = [
    (WANDERS, 3, 1, "paper"),
    (WANDERS, 3, 3, "paper"),
    (WANDERS, 3, 4, "paper"),
    (WANDERS, 3, 6, "interpolate"),
    (BRACKETS, 3, 3, "paper"),
    (BRACKETS, 3, 5, "interpolate"),
    (EMPTIES, 2, 6, "interpolate"),
    (EMPTIES, 2, 4, "paper"),
    (LOW_EDGE, 3, 3, "paper"),
    (HIGH_EDGE, 3, 3, "interpolate"),
]


@pytest.mark.parametrize(("values", "k", "max_rounds", "adjust"), CASES)
def test_select_follows_the_reference_search(values: list[float], k: int, max_rounds: int, adjust: str) -> None:
    indices, threshold, rounds, tried = reference_select(values, k, max_rounds, adjust)
    for t, _ in tried:  # no magnitude near a threshold: float32 and float64 agree on every count
        assert all(abs(abs(v) - t) > 1e-4 * t for v in values)
    vec = torch.tensor(values)
    sel = gaussiank.select(vec, k, max_rounds=max_rounds, adjust=adjust)
    assert sel.indices.dtype == torch.int64
    assert sel.indices.tolist() == indices
    assert torch.equal(sel.values, vec[indices])
    assert sel.rounds == rounds
    assert sel.count == len(indices)
    assert sel.threshold == pytest.approx(threshold, rel=1e-6)


def test_the_cases_take_the_paths_they_are_named_for() -> None:
    assert [c for _, c in reference_select(WANDERS, 3, 6)[3]] == [1, 6, 5, 1, 6, 5]
    assert [c for _, c in reference_select(WANDERS, 3, 6, "interpolate")[3]] == [1, 6, 5, 5, 1, 5]
    assert [c for _, c in reference_select(BRACKETS, 3)[3]] == [1, 5, 3]
    assert [c for _, c in reference_select(EMPTIES, 2, 6, "interpolate")[3]] == [3, 0, 0, 3, 0, 0]
    assert [c for _, c in reference_select(LOW_EDGE, 3)[3]] == [2]
    assert [c for _, c in reference_select(HIGH_EDGE, 3)[3]] == [4]


def test_defaults_are_three_rounds_of_the_paper_rule() -> None:
    vec = torch.tensor(WANDERS)
    indices, threshold, rounds, _ = reference_select(WANDERS, 3)
    sel = gaussiank.select(vec, 3)
    assert (sel.indices.tolist(), sel.rounds) == (indices, rounds)
    assert (len(indices), rounds) == (5, 3)
    assert sel.threshold == pytest.approx(threshold, rel=1e-6)
    capped = gaussiank.decompress(gaussiank.compress(vec, k=3), len(WANDERS))  # capped to 3 by default
    assert int(torch.count_nonzero(capped)) == 3 and float(capped[6]) == 16.0


def test_compress_passes_every_option_on() -> None:
    vec, d, k = torch.tensor(WANDERS), len(WANDERS), 3
    for max_rounds, adjust in [(1, "paper"), (4, "paper"), (6, "interpolate")]:
        indices, _, _, _ = reference_select(WANDERS, k, max_rounds, adjust)
        payload = gaussiank.compress(vec, k=k, max_rounds=max_rounds, adjust=adjust, cap=False)
        expected = torch.zeros(d)
        expected[indices] = vec[indices]
        assert torch.equal(gaussiank.decompress(payload, d), expected)


def test_varint_only_when_asked() -> None:
    """Three neighbours in 1000: 12 bytes as indices, 3 as varint gaps."""
    vec = torch.zeros(1000)
    vec[500:503] = torch.tensor([4.0, -5.0, 6.0])
    plain = gaussiank.compress(vec, k=3)
    assert "gaps" not in plain and plain["idx"].tolist() == [500, 501, 502]
    packed = gaussiank.compress(vec, k=3, varint=True)
    assert packed["gaps"].tolist() == [244, 3, 0, 0]  # 500 as LEB128, then gaps of 0
    assert torch.equal(gaussiank.decompress(packed, 1000), vec)
    sel = gaussiank.select(vec, 3)
    assert "gaps" in gaussiank.encode(sel, 3, 1000, varint=True)
    assert "gaps" not in gaussiank.encode(sel, 3, 1000)


def test_cap_keeps_the_k_largest_only_when_asked_and_needed() -> None:
    vec, d = torch.tensor(BRACKETS), len(BRACKETS)
    over = gaussiank.select(vec, 3, max_rounds=2)  # 5 selected
    assert over.count == 5
    capped = gaussiank.encode(over, 3, d)
    kept = sorted(over.indices.tolist(), key=lambda i: -abs(BRACKETS[i]))[:3]
    expected = torch.zeros(d)
    expected[kept] = vec[kept]
    assert torch.equal(decode_sparse(capped, d), expected)
    uncapped = gaussiank.encode(over, 3, d, cap=False)
    assert torch.nonzero(decode_sparse(uncapped, d)).reshape(-1).tolist() == over.indices.tolist()
    exact = gaussiank.select(vec, 3)  # 3 selected: nothing to cap
    assert exact.count == 3
    expected = torch.zeros(d)
    expected[exact.indices] = exact.values
    assert torch.equal(decode_sparse(gaussiank.encode(exact, 3, d), d), expected)


def test_a_constant_vector_sits_on_its_threshold_and_is_not_selected() -> None:
    """std 0: the threshold is |c| itself, and only magnitudes strictly above it are selected."""
    vec = torch.full((6,), -0.75)
    assert gaussiank.initial_threshold(vec, 2) == 0.75
    sel = gaussiank.select(vec, 2, max_rounds=1)
    assert sel.count == 0 and sel.rounds == 1 and sel.threshold == 0.75


@pytest.mark.parametrize(("values", "k"), [(WANDERS, 1), (WANDERS, 3), (WANDERS, 10), (EMPTIES, 5)])
def test_initial_threshold_is_the_gaussian_quantile(values: list[float], k: int) -> None:
    got = gaussiank.initial_threshold(torch.tensor(values), k)
    assert isinstance(got, float)
    assert got == pytest.approx(reference_threshold(values, k), rel=1e-6)


def test_options_are_checked_by_name() -> None:
    vec = torch.tensor(WANDERS)
    with pytest.raises(ValueError, match=r"^k must be in \[1, 10\]; got 0$"):
        gaussiank.initial_threshold(vec, 0)
    with pytest.raises(ValueError, match=r"^k must be in \[1, 10\]; got 11$"):
        gaussiank.select(vec, 11)
    with pytest.raises(ValueError, match=r"^max_rounds must be in \[1\]; got 0$"):
        gaussiank.select(vec, 3, max_rounds=0)
    with pytest.raises(ValueError, match=r"^adjust must be one of \('paper', 'interpolate'\); got 'bisect'$"):
        gaussiank.compress(vec, k=3, adjust="bisect")
    with pytest.raises(ValueError, match=r"^d must be in \[1, 2147483647\]; got 0$"):
        gaussiank.decompress(gaussiank.compress(vec, k=3), 0)
    assert gaussiank.decompress(gaussiank.compress(vec, k=3), 10).dtype == torch.float32
    assert np.asarray(gaussiank.compress(vec, k=3)["val"]).dtype == np.float32
