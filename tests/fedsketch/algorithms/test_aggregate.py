"""The one weighted mean (fedsketch/algorithms/aggregate.py): its value, its dtype and every input it refuses."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsketch.algorithms.aggregate import weighted_mean


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


def test_arrays_on_the_outputs_device_add_in_order_whatever_they_came_as() -> None:
    """Tensors and numpy arrays, float16 among float32: the same sum, added in client order, as by hand."""
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(4, 5, generator=g) for _ in range(5)]
    arrays = [xs[0], xs[1].numpy(), xs[2].half(), xs[3].numpy(), xs[4]]
    weights = [1.0, 2.0, 0.5, 3.0, 1.5]
    want = torch.zeros(4, 5)
    for x, w in zip(arrays, weights, strict=True):
        want += (w / sum(weights)) * torch.as_tensor(x)
    assert torch.equal(weighted_mean(arrays, weights), want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_host_arrays_sent_to_a_gpu_through_staging_add_exactly_as_on_the_gpu() -> None:
    """Host arrays bound for a GPU pass through two page-locked buffers in turn; a buffer refilled before its
    copy arrived would add one client's table twice. The sum equals the one of arrays moved one by one,
    bit for bit, for many arrays (each buffer reused), a float16 one among them (a fresh buffer) and CUDA ones.
    The stream is kept busy first, so a buffer refilled without waiting would be refilled before its copy ran."""
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(5, 200_000, generator=g) for _ in range(9)]
    arrays: list[torch.Tensor | np.ndarray] = [x.numpy() for x in xs]
    arrays[4] = xs[4].half()
    arrays[6] = xs[6].cuda()
    weights = [float(i + 1) for i in range(9)]
    like = torch.zeros(5, 200_000, device="cuda")
    want = torch.zeros_like(like)
    for x, w in zip(arrays, weights, strict=True):
        want += (w / sum(weights)) * torch.as_tensor(x).cuda()
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # the stream busy (about 0.1 s): every copy to the GPU queues behind it
    assert torch.equal(weighted_mean(arrays, weights, like=like), want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_arrays_averaged_into_a_host_tensor_are_brought_to_the_host() -> None:
    """The mean is on ``like``'s device whatever the arrays' devices: CUDA arrays into a host mean."""
    g = torch.Generator().manual_seed(6)
    xs = [torch.randn(3, 1000, generator=g) for _ in range(3)]
    weights = [1.0, 2.0, 3.0]
    mean = weighted_mean([x.cuda() for x in xs], weights, like=torch.zeros(3, 1000))
    assert mean.device.type == "cpu"
    torch.testing.assert_close(mean, weighted_mean(xs, weights))
