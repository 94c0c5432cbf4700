"""Buckets split a vector (the last padded with zeros) and expand per-bucket scales over their coordinates."""

from __future__ import annotations

import torch

from fedsketch.compress import buckets


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
