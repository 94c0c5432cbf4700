"""The Count Sketch's edges: its bounds and messages, its operators, its device and dtype, and top-k's second pass.

Each test pins a behaviour of :mod:`fedsketch.sketch.count_sketch` (FetchSGD, Rothchild et al., ICML 2020) that
tests/fedsketch/sketch/test_count_sketch.py passes through without checking (docs/mutation.md, fourth module).
"""

from __future__ import annotations

import pytest
import torch

from fedsketch import CountSketch
from fedsketch.sketch.estimates import sample_threshold

HALF = [torch.float16, torch.bfloat16]


def _sketch() -> CountSketch:
    return CountSketch(10, 3, 8)


def test_cols_may_be_exactly_2_to_the_30() -> None:
    sketch = CountSketch(10, 1, 2**30, device="meta")  # a meta table holds no memory
    assert sketch.cols == 2**30 and sketch.table.shape == (1, 2**30)
    with pytest.raises(ValueError, match=r"^cols must be at most 2\*\*30; got 1073741825$"):
        CountSketch(10, 1, 2**30 + 1, device="meta")


def test_a_seed_may_be_any_64_bit_integer_and_no_larger() -> None:
    assert CountSketch(10, 3, 8, seed=2**64 - 1).seed == 2**64 - 1
    message = r"^seed must be below 2\*\*64 \(it is mixed as a 64-bit integer\); got 18446744073709551616$"
    with pytest.raises(ValueError, match=message):
        CountSketch(10, 3, 8, seed=2**64)


def test_the_table_and_the_estimates_live_on_the_device_asked_for() -> None:
    sketch = CountSketch(10, 3, 8, device="meta")
    assert sketch.table.device.type == sketch.device.type == "meta"
    assert sketch.estimate().device.type == "meta"


def test_a_received_table_keeps_its_seed_and_its_float64_precision() -> None:
    d, seed = 1_000, 5
    vec = torch.zeros(d, dtype=torch.float64)
    vec[[3, 700]] = torch.tensor([1 + 2**-40, -2.0], dtype=torch.float64)  # 1 + 2**-40 is not a float32
    sent = CountSketch(d, 3, 100, seed=seed, dtype=torch.float64).accumulate(vec)
    received = CountSketch.from_table(sent.table, d, seed)
    assert received.seed == seed and received.dtype == torch.float64
    assert torch.equal(received.table, sent.table)
    assert torch.equal(received.estimate(), sent.estimate())
    assert received.estimate(torch.tensor([3])).item() == 1 + 2**-40


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_received_cuda_table_stays_on_cuda() -> None:
    table = torch.arange(24.0, device="cuda").view(3, 8)
    received = CountSketch.from_table(table, 10, 0)
    assert received.table.device.type == "cuda" and torch.equal(received.table, table)


@pytest.mark.parametrize("dtype", HALF)
def test_sparse_updates_go_into_half_precision_tables(dtype: torch.dtype) -> None:
    """d <= cols: one chunk, no collisions, so each estimate is the value added, exactly."""
    d, indices = 1_000, torch.tensor([0, 17, 999])
    values = torch.tensor([0.5, -3.25, 7.0], dtype=dtype)
    sketch = CountSketch(d, 3, d, dtype=dtype).accumulate_sparse(indices, values)
    dense = torch.zeros(d, dtype=dtype)
    dense[indices] = values
    assert sketch.dtype == dtype
    assert torch.equal(sketch.table, CountSketch(d, 3, d, dtype=dtype).accumulate(dense).table)
    assert torch.equal(sketch.estimate(indices), values)


@pytest.mark.parametrize("dtype", HALF)
def test_topk_and_heavy_hitters_answer_in_the_tables_dtype(dtype: torch.dtype) -> None:
    d = 1_000
    vec = torch.zeros(d, dtype=dtype)
    vec[[4, 50, 600]] = torch.tensor([8.0, -1.0, 0.5], dtype=dtype)
    sketch = CountSketch(d, 3, d, dtype=dtype).accumulate(vec)
    indices, values = sketch.topk(2)
    assert indices.tolist() == [4, 50] and values.dtype == dtype and torch.equal(values, vec[[4, 50]])
    indices, values = sketch.heavy_hitters(0.5)
    assert indices.tolist() == [4] and values.dtype == dtype and torch.equal(values, vec[[4]])


def test_topk_passes_again_when_fewer_than_k_clear_the_sampled_threshold() -> None:
    """Nine nonzeros and k = 10: the sampled threshold is 0, nine pass it, and the tenth is the first zero."""
    d, support = 1_000, [0, 5, 100, 200, 300, 400, 500, 999, 2]
    vec = torch.zeros(d)
    vec[support] = torch.tensor([9.0, -8.0, 7.0, -6.0, 5.0, -4.0, 3.0, -2.0, 1.0])
    sketch = CountSketch(d, 3, d).accumulate(vec)
    assert sample_threshold(sketch.table, sketch._hashes, 10) == 0.0
    indices, values = sketch.topk(10)
    assert indices.tolist() == [*support, 1]
    assert values.tolist() == [9.0, -8.0, 7.0, -6.0, 5.0, -4.0, 3.0, -2.0, 1.0, 0.0]


def test_a_sum_starts_only_from_the_int_zero() -> None:
    a, b = _sketch().accumulate(torch.arange(10.0)), _sketch().accumulate(torch.ones(10))
    total = sum([a, b])
    assert isinstance(total, CountSketch) and torch.equal(total.table, a.table + b.table)
    started = 0 + a
    assert started is not a and torch.equal(started.table, a.table)
    for start in (0.0, False, 1, True):
        with pytest.raises(TypeError, match="unsupported operand"):
            start + a  # type: ignore[operator]


def test_in_place_addition_keeps_the_sketch_and_its_table() -> None:
    a, b = _sketch().accumulate(torch.arange(10.0)), _sketch().accumulate(torch.ones(10))
    expected = a.table + b.table
    before, table = a, a.table
    a += b
    assert a is before and a.table is table and torch.equal(a.table, expected)
    with pytest.raises(TypeError, match="unsupported operand"):
        a += 1  # type: ignore[operator]


def test_a_sketch_is_scaled_by_numbers_but_not_by_bools() -> None:
    sketch = _sketch().accumulate(torch.arange(10.0))
    assert torch.equal((sketch * 2).table, 2 * sketch.table)
    for flag in (True, False):
        with pytest.raises(TypeError, match="unsupported operand"):
            sketch * flag  # type: ignore[operator]
        with pytest.raises(TypeError, match="unsupported operand"):
            flag * sketch  # type: ignore[operator]


@pytest.mark.parametrize(("k", "shown"), [(True, "True"), (2.0, "2.0"), ("3", "'3'")])
def test_k_must_be_an_int_and_not_a_bool(k: object, shown: str) -> None:
    with pytest.raises(ValueError, match=rf"^k must be an int in 1\.\.d=10; got {shown}$"):
        _sketch().topk(k)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fraction", "shown"), [(True, "True"), ("0.5", "'0.5'"), (1.5, "1.5"), (1 + 2**-52, "1.0000000000000002")]
)
def test_fraction_must_be_a_number_in_0_to_1(fraction: object, shown: str) -> None:
    with pytest.raises(ValueError, match=rf"^fraction must be a number in \(0, 1\]; got {shown}$"):
        _sketch().heavy_hitters(fraction)  # type: ignore[arg-type]


def test_a_fraction_of_one_is_allowed() -> None:
    """One row holding 3 and 4: the L2 estimate is 5, so no estimate clears fraction 1, and only 4 clears 0.5."""
    vec = torch.zeros(1_000)
    vec[[10, 20]] = torch.tensor([3.0, 4.0])
    sketch = CountSketch(1_000, 1, 1_000).accumulate(vec)
    assert sketch.l2_estimate() == 5.0
    for fraction in (1, 1.0):
        indices, values = sketch.heavy_hitters(fraction)
        assert indices.dtype == torch.int64 and indices.numel() == 0 and values.numel() == 0
    assert sketch.heavy_hitters(0.5)[0].tolist() == [20]


def test_topk_with_k_above_a_quarter_chunk_over_a_short_last_chunk() -> None:
    """Chunks of 2048 never gather 4k = 2400 candidates, so nothing is trimmed; the last chunk holds 100 < k."""
    d = 5 * 2_048 + 100
    sketch = CountSketch(d, 3, 2_048).accumulate(torch.randn(d, generator=torch.Generator().manual_seed(3)))
    estimates = sketch.estimate()
    order = torch.sort(estimates.abs(), descending=True, stable=True).indices[:600]
    indices, values = sketch.topk(600)
    assert torch.equal(indices, order) and torch.equal(values, estimates[order])
