"""Top-k keeps exactly the k largest magnitudes, against a float64 sort on small inputs; varints when asked."""

from __future__ import annotations

import pytest
import torch

from fedsketch.compress import topk

# Distinct magnitudes, dyadic (exact in float32): no ties for top-k to break.
X = torch.tensor([0.5, -3.0, 1.25, 0.0, -0.75, 2.0, -0.125], dtype=torch.float32)


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
