"""The one weighted mean (fedsketch/aggregate.py): its value, its dtype and every input it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsketch.aggregate import weighted_mean


def test_the_mean_weighs_each_array_by_its_share_zero_weights_included() -> None:
    a, b, c = (torch.randn(5, generator=torch.Generator().manual_seed(s)) for s in range(3))
    torch.testing.assert_close(weighted_mean([a, b, c], [0.0, 0.25, 0.5]), (0.25 * b + 0.5 * c) / 0.75)
    torch.testing.assert_close(weighted_mean([a, b], [0, 3]), b)  # a zero weight drops its array
    torch.testing.assert_close(weighted_mean([a.numpy()], [0.2]), a)  # one numpy array, weights below 1


def test_the_result_has_likes_dtype() -> None:
    a, b = np.float32([1, 2]), np.float32([3, 5])
    out = weighted_mean([a, b], [1, 2], like=torch.zeros(2, dtype=torch.float64))
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, torch.tensor([7 / 3, 4.0], dtype=torch.float64), rtol=1e-6, atol=0)
    assert weighted_mean([a, b], [1, 2]).dtype == torch.float32  # else the first array's


@pytest.mark.parametrize(
    ("arrays", "weights", "message"),
    [
        ([], [], "need one weight per array and at least one array; got 0 and 0"),
        ([np.zeros(2), np.zeros(2)], [1.0], "need one weight per array and at least one array; got 1 and 2"),
        ([np.zeros(2), np.zeros(2)], [2.0, -1.0], r"weights must be finite, >= 0 and not all zero; got \[2.0, -1.0\]"),
        ([np.zeros(2), np.zeros(2)], [1.0, float("nan")], r"got \[1.0, nan\]"),
        ([np.zeros(2), np.zeros(2)], [0.0, 0.0], r"not all zero; got \[0.0, 0.0\]"),
        ([np.zeros(2)] * 9, [-1.0] * 9, r"got \[-1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0\]$"),
        ([np.zeros(3), np.zeros(4)], [1.0, 1.0], r"arrays have shapes \(3,\) and \(4,\)"),
    ],
)
def test_bad_input_is_refused_naming_what_is_wrong(
    arrays: list[np.ndarray], weights: list[float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        weighted_mean(arrays, weights)
