"""The Count Sketch, checked by its properties on fixed seeds through the public API, then its edges.

FetchSGD (Rothchild et al., ICML 2020) relies on linearity (merging client
sketches), on recovering heavy coordinates (top-k unsketch) and on every party
deriving the same hashes from a seed; Sketched-SGD (Ivkin et al., NeurIPS 2019)
on the L2 estimate and the HEAVYMIX heavy-hitter test. The edges (bounds and
messages, operators, device and dtype, top-k's second pass) pin what the
property tests pass through without checking (docs/mutation.md, fourth module).
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from fedsketch import CountSketch
from fedsketch.sketch.estimates import sample_threshold

ROOT = Path(__file__).resolve().parents[3]
# (d, rows, cols): chunk == cols < 2048 takes the vectorized path on a CPU, larger
# chunks the per-chunk window path; 300_001 ends with a partial chunk; 4 rows use
# the generic (lower) median instead of a min/max network.
SHAPES = [(5_000, 3, 300), (300_001, 5, 100_000), (200_000, 4, 1_500), (100_000, 4, 5_000)]


def randn(n: int, seed: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def sketch_of(vec: torch.Tensor, rows: int, cols: int, seed: int = 0, **kwargs: object) -> CountSketch:
    return CountSketch(vec.numel(), rows, cols, seed=seed, **kwargs).accumulate(vec)  # type: ignore[arg-type]


def hash_reader(d: int, cols: int, seed: int) -> CountSketch:
    """A 1-row sketch whose table holds ``bucket + 1``: ``estimate(i) = sign(i) * (bucket(i) + 1)``."""
    return CountSketch.from_table(torch.arange(1.0, cols + 1.0)[None], d, seed)


# ---------------------------------------------------------------- linearity
@pytest.mark.parametrize(("d", "rows", "cols"), SHAPES)
def test_sketch_is_linear(d: int, rows: int, cols: int) -> None:
    a, b = randn(d, 1), randn(d, 2)
    torch.testing.assert_close(
        (sketch_of(a, rows, cols) + sketch_of(b, rows, cols)).table,
        sketch_of(a + b, rows, cols).table,
        rtol=1e-5,
        atol=1e-4,
    )
    torch.testing.assert_close(
        (2.5 * sketch_of(a, rows, cols)).table, sketch_of(2.5 * a, rows, cols).table, rtol=1e-5, atol=1e-4
    )
    torch.testing.assert_close(
        (sketch_of(a, rows, cols) * -3).table, sketch_of(-3 * a, rows, cols).table, rtol=1e-5, atol=1e-4
    )


def test_merge_of_client_sketches_is_the_sketch_of_the_sum() -> None:
    d, rows, cols = 50_000, 5, 4_000
    clients = [randn(d, seed) for seed in range(8)]
    merged = CountSketch(d, rows, cols, seed=3)
    for update in clients:
        merged += sketch_of(update, rows, cols, seed=3)
    total = sketch_of(torch.stack(clients).sum(0), rows, cols, seed=3)
    torch.testing.assert_close(merged.table, total.table, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(
        sum(sketch_of(u, rows, cols, seed=3) for u in clients).table,
        total.table,  # type: ignore[union-attr]
        rtol=1e-5,
        atol=1e-4,
    )


@pytest.mark.parametrize(("d", "rows", "cols"), SHAPES)
def test_dense_and_sparse_updates_give_the_same_table(d: int, rows: int, cols: int) -> None:
    gen = torch.Generator().manual_seed(0)
    indices = torch.randperm(d, generator=gen)[:500]
    values = torch.randint(-1000, 1000, (500,), generator=gen).float()  # integers: sums exact in any order
    dense = torch.zeros(d)
    dense[indices] = values
    sparse = CountSketch(d, rows, cols).accumulate_sparse(indices, values)
    assert torch.equal(sparse.table, sketch_of(dense, rows, cols).table)


def test_copies_and_received_tables_are_independent() -> None:
    sketch = sketch_of(randn(1_000, 0), 3, 100)
    before = sketch.table.clone()
    sketch.copy().zero()
    CountSketch.from_table(sketch.table, 1_000, 0).accumulate(randn(1_000, 1))
    sketch.clone().accumulate_sparse(torch.tensor([3]), torch.tensor([1.0]))
    assert torch.equal(sketch.table, before)


# ---------------------------------------------------------------- recovery
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sparse_vector_is_recovered_exactly(seed: int) -> None:
    """cols/100 nonzeros: topk returns exactly their indices and values.

    A zero coordinate is misestimated only when it collides with nonzeros in 3
    of the 5 rows, about ``10 (nnz / cols)**3`` per coordinate, so exactness is
    likely only while d is small: at d = 2 cols it failed for 1 in 200 seeds
    (fully random hashes: 7 in 200), at d = 10 cols for 1 in 5 (random: the same).
    """
    d, cols, nnz = 20_000, 10_000, 100
    gen = torch.Generator().manual_seed(seed)
    support = torch.randperm(d, generator=gen)[:nnz]
    vec = torch.zeros(d)
    vec[support] = (1 + torch.rand(nnz, generator=gen)) * torch.sign(torch.randn(nnz, generator=gen))
    indices, values = sketch_of(vec, 5, cols, seed=seed).topk(nnz)
    assert set(indices.tolist()) == set(support.tolist())
    assert torch.equal(values, vec[indices])


def test_a_vector_within_one_chunk_never_collides() -> None:
    """d <= min(cols, 2**15): coordinates of one chunk get distinct buckets, so estimates are exact."""
    vec = randn(32_768, 4)
    assert torch.equal(sketch_of(vec, 3, 70_000).estimate(), vec)


@pytest.mark.parametrize(("d", "rows", "cols"), SHAPES)
@pytest.mark.parametrize("k", [1, 37, 2_500])
def test_topk_is_the_exact_top_k_of_the_estimates(d: int, rows: int, cols: int, k: int) -> None:
    sketch = sketch_of(randn(d, 5), rows, cols, seed=9)
    estimates = sketch.estimate()
    order = torch.sort(estimates.abs(), descending=True, stable=True).indices[:k]
    indices, values = sketch.topk(k)
    assert indices.dtype == torch.int64
    assert torch.equal(indices, order) and torch.equal(values, estimates[order])
    assert torch.equal(sketch.estimate(torch.arange(d)), estimates)


def test_float64_stays_float64() -> None:
    vec = randn(70_000, 8).double()
    sketch = sketch_of(vec, 5, 10_000, dtype=torch.float64)
    estimates = sketch.estimate()
    assert sketch.table.dtype == estimates.dtype == sketch.topk(10)[1].dtype == torch.float64
    assert torch.equal(
        sketch.topk(10)[1], estimates[torch.sort(estimates.abs(), descending=True, stable=True).indices[:10]]
    )


def test_topk_of_all_coordinates_and_ties_go_to_the_smaller_index() -> None:
    sketch = CountSketch.from_table(torch.ones(3, 500), 2_000, 0)  # every |estimate| is 1
    assert torch.equal(sketch.topk(50)[0], torch.arange(50))
    indices, _ = sketch.topk(2_000)
    assert torch.equal(indices, torch.arange(2_000))


def planted(d: int, k: int, seed: int, height: float = 30.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian noise with ``k`` spikes of +-height; returns (vector, spike indices)."""
    gen = torch.Generator().manual_seed(seed)
    vec = torch.randn(d, generator=gen)
    spikes = torch.randperm(d, generator=gen)[:k]
    vec[spikes] = height * torch.sign(torch.randn(k, generator=gen))
    return vec, spikes


Planted = tuple[torch.Tensor, dict[torch.dtype, CountSketch]]


@pytest.fixture(scope="module")
def planted_sketches() -> Planted:
    """Spike indices, and sketches (d = 10^6, 5 x 10^5) of one planted vector in three table dtypes."""
    vec, spikes = planted(10**6, 1_000, seed=0)
    dtypes = (torch.float32, torch.float16, torch.bfloat16)
    return spikes, {dt: sketch_of(vec, 5, 10**5, seed=0, dtype=dt) for dt in dtypes}


def test_planted_heavy_hitters_are_found(planted_sketches: Planted) -> None:
    spikes, sketches = planted_sketches
    indices, _ = sketches[torch.float32].topk(1_000)
    assert torch.isin(indices, spikes).float().mean() >= 0.99
    sketch = sketches[torch.float32]
    found, values = sketch.heavy_hitters(0.5 * 30.0**2 / sketch.l2_estimate() ** 2)
    assert torch.isin(spikes, found).float().mean() >= 0.99 and torch.isin(found, spikes).float().mean() >= 0.99
    assert torch.all(found[1:] > found[:-1]) and torch.equal(values, sketch.estimate(found))


@pytest.mark.parametrize(("dtype", "bound"), [(torch.float16, 2e-3), (torch.bfloat16, 1.5e-2)])
def test_lower_precision_tables_cost_little(planted_sketches: Planted, dtype: torch.dtype, bound: float) -> None:
    """What a half-size upload costs: estimates within ``bound`` (relative L2) of float32's, same recall.

    float16 keeps 11 significant bits (about 5e-4 relative rounding), bfloat16 8 (about 4e-3).
    """
    spikes, sketches = planted_sketches
    full, low = sketches[torch.float32], sketches[dtype]
    indices, values = full.topk(1_000)
    assert low.table.dtype == dtype
    relative = (low.estimate(indices).float() - values).norm() / values.norm()
    assert relative <= bound
    recall = torch.isin(low.topk(1_000)[0], spikes).float().mean()
    assert recall >= torch.isin(indices, spikes).float().mean() - 0.005


@pytest.mark.parametrize("cols", [1_000, 100_000])
def test_l2_estimate_is_within_ten_percent(cols: int) -> None:
    vec = randn(10**6, 3) * torch.linspace(0.1, 3.0, 10**6)
    assert abs(sketch_of(vec, 5, cols).l2_estimate() / vec.norm().item() - 1) < 0.10


# ---------------------------------------------------------------- hash quality
@pytest.mark.parametrize("cols", [1_000, 100_003])
def test_buckets_are_uniform_and_signs_unbiased(cols: int) -> None:
    """Chi-square of 10^6 random coordinates' buckets in 1000 bins; sign means near zero."""
    d = 10**9
    gen = torch.Generator().manual_seed(cols)
    coords = torch.randint(0, d, (10**6,), generator=gen)
    est = hash_reader(d, cols, seed=5).estimate(coords)
    buckets, signs = est.abs().long() - 1, torch.sign(est)
    counts = torch.bincount(buckets * 1_000 // cols, minlength=1_000).double()
    chi2_per_dof = ((counts - counts.mean()) ** 2 / counts.mean()).sum().item() / 999
    assert 0.85 < chi2_per_dof < 1.15  # +-3.3 standard deviations of a uniform hash
    assert abs(signs.mean().item()) < 0.004  # 4 standard deviations
    assert abs((signs[::2] * signs[1::2]).mean().item()) < 0.006  # pairs from different chunks
    # i and i ^ 1 share a chunk; their sign product depends on lo only, so C / 2 distinct pairs.
    neighbours = torch.sign(hash_reader(d, cols, seed=5).estimate(coords ^ 1))
    assert abs((neighbours * signs).mean().item()) < 4 / (min(cols, 2**15) / 2) ** 0.5


def test_collisions_happen_at_rate_one_over_cols_and_never_within_a_chunk() -> None:
    d, cols = 10**8, 1_000
    gen = torch.Generator().manual_seed(0)
    reader = hash_reader(d, cols, seed=1)
    first, second = torch.randint(0, d, (2, 10**6), generator=gen)
    same = reader.estimate(first).abs() == reader.estimate(second).abs()
    assert 850 <= same.sum().item() <= 1_150  # 1000 expected, sd 32
    for start in (torch.randint(0, d // cols, (5,), generator=gen) * cols).tolist():
        # chunk = cols here: a whole chunk fills every bucket exactly once
        buckets = reader.estimate(torch.arange(start, start + cols)).abs()
        assert torch.equal(buckets.sort().values, torch.arange(1.0, cols + 1.0))


def test_loads_are_exactly_even_when_chunks_cover_the_table() -> None:
    d, cols = 400_000, 1_000
    loads = torch.bincount(hash_reader(d, cols, seed=2).estimate().abs().long() - 1, minlength=cols)
    assert loads.min() == loads.max() == d // cols


# ---------------------------------------------------------------- determinism
def huge_estimates() -> torch.Tensor:
    """Estimates at d = 10^9 of 1,000 random coordinates, each added once."""
    idx = torch.randint(0, 10**9, (1_000,), generator=torch.Generator().manual_seed(1))
    return CountSketch(10**9, 5, 10**5, seed=7).accumulate_sparse(idx, randn(1_000, 2)).estimate(idx)


def fingerprints() -> dict[str, str]:
    """Digests of a table and of estimates at d = 10^9."""
    table = sketch_of(randn(123_457, 11), 5, 20_000, seed=42).table
    return {
        name: hashlib.sha256(t.numpy().tobytes()).hexdigest()
        for name, t in (("table", table), ("huge", huge_estimates()))
    }


def with_peak_growth(make: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
    """What ``make()`` returns, and the peak memory (MB) it added to this process."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    made = make()
    return made, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024


def in_a_fork(work: Callable[[], Any]) -> Any:
    """``work()``'s JSON value, computed in a forked copy of this process, whose peak memory starts at what it
    holds now (Linux)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: answer, then leave at once (no atexit, no pytest teardown)
        status = 1
        try:
            torch.set_num_threads(1)  # the parent's OpenMP threads are not in the copy
            os.write(write, json.dumps(work()).encode())
            status = 0
        except BaseException:  # noqa: BLE001 -- told to the parent by the exit status, shown on stderr
            traceback.print_exc()
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read) as answer:
        text = answer.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0, "the forked work failed (its traceback is on stderr)"
    return json.loads(text)


@pytest.fixture(scope="module")
def other_process() -> dict[str, str]:
    code = "import json; from tests.fedsketch.sketch.test_count_sketch import fingerprints; print(json.dumps(fingerprints()))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow  # a second Python process that imports torch: about 5 s
def test_same_arguments_give_the_same_hashes_in_another_process(other_process: dict[str, object]) -> None:
    here = fingerprints()
    assert other_process == here
    changed = sketch_of(randn(123_457, 11), 5, 20_000, seed=43).table
    assert hashlib.sha256(changed.numpy().tobytes()).hexdigest() != here["table"]


def test_d_of_a_billion_needs_no_d_sized_memory() -> None:
    """A d-sized int64 hash tensor would be 8 GB; sparse work at d = 10^9 adds almost nothing."""

    def work() -> tuple[bool, float]:
        estimates, grown_mb = with_peak_growth(huge_estimates)
        return bool(torch.equal(estimates, randn(1_000, 2))), grown_mb

    exact, grown_mb = in_a_fork(work)
    assert exact is True and grown_mb < 64


def test_the_memory_measure_sees_a_d_sized_tensor() -> None:
    """The measure above would see a hash tensor of d = 10^8 (800 MB) made in the fork."""
    assert in_a_fork(lambda: with_peak_growth(lambda: torch.ones(10**8, dtype=torch.int64))[1]) > 700


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_and_gpu_agree() -> None:
    for d, rows, cols in SHAPES:
        vec = randn(d, 6)
        cpu, gpu = sketch_of(vec, rows, cols, seed=8), sketch_of(vec.cuda(), rows, cols, seed=8, device="cuda")
        torch.testing.assert_close(gpu.table.cpu(), cpu.table, rtol=1e-5, atol=1e-4)
        idx = torch.arange(0, d, 7)
        assert torch.equal(gpu.estimate(idx.cuda()).cpu(), CountSketch.from_table(gpu.table.cpu(), d, 8).estimate(idx))
        gpu_top, cpu_top = gpu.topk(100), CountSketch.from_table(gpu.table.cpu(), d, 8).topk(100)
        assert torch.equal(gpu_top[0].cpu(), cpu_top[0]) and torch.equal(gpu_top[1].cpu(), cpu_top[1])


# ---------------------------------------------------------------- bad input
def _sketch() -> CountSketch:
    return CountSketch(10, 3, 8)


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: CountSketch(0, 3, 8), ValueError, "d must be positive; got 0"),
        (lambda: CountSketch(10, -1, 8), ValueError, "rows must be positive"),
        (lambda: CountSketch(10, 3, 0), ValueError, "cols must be positive"),
        (lambda: CountSketch(10, True, 8), TypeError, "rows must be an int; got bool"),
        (lambda: CountSketch(10.0, 3, 8), TypeError, "d must be an int; got float"),  # type: ignore[arg-type]
        (lambda: CountSketch(10, 3, 8, seed=-1), ValueError, "seed must be non-negative"),
        (lambda: CountSketch(10, 3, 2**30 + 1), ValueError, r"cols must be at most 2\*\*30"),
        (lambda: CountSketch(2**32, 1, 1), ValueError, "chunks .* use more cols"),
        (lambda: CountSketch(10, 3, 8, dtype=torch.int32), TypeError, "dtype must be one of"),
        (lambda: _sketch().accumulate(torch.zeros(9)), ValueError, "vec has length 9; expected 10"),
        (lambda: _sketch().accumulate(torch.zeros(2, 5)), ValueError, r"flat 1-D tensor; got shape \(2, 5\)"),
        (lambda: _sketch().accumulate(torch.zeros(10, dtype=torch.int64)), TypeError, "floating-point.*int64"),
        (lambda: _sketch().accumulate(torch.tensor([float("nan")] * 10)), ValueError, "vec contains NaN or Inf"),
        (lambda: _sketch().accumulate(torch.full((10,), float("inf"))), ValueError, "vec contains NaN or Inf"),
        (lambda: _sketch().accumulate([0.0] * 10), TypeError, "vec must be a torch.Tensor"),  # type: ignore[arg-type]
        (
            lambda: _sketch().accumulate(torch.zeros(10, device="meta")),
            ValueError,
            "vec is on meta but the sketch is on cpu",
        ),
        (lambda: _sketch().topk(0), ValueError, r"k must be an int in 1\.\.d=10; got 0"),
        (lambda: _sketch().topk(11), ValueError, r"k must be an int in 1\.\.d=10; got 11"),
        (lambda: _sketch().heavy_hitters(0.0), ValueError, r"fraction must be a number in \(0, 1\]"),
        (lambda: _sketch().estimate(torch.tensor([10])), ValueError, r"indices must be in \[0, d=10\)"),
        (lambda: _sketch().estimate(torch.tensor([1.0])), TypeError, "indices must be an integer tensor"),
        (lambda: _sketch().zero_buckets(torch.zeros(2, 2, dtype=torch.int64)), ValueError, "indices must be 1-D"),
        (
            lambda: _sketch().accumulate_sparse(torch.tensor([1, 2]), torch.ones(3)),
            ValueError,
            "values has length 3; expected 2",
        ),
        (
            lambda: CountSketch.from_table(torch.zeros(8), 10, 0),
            ValueError,
            r"table must be 2-D \(rows x cols\); got shape \(8,\)",
        ),
        (lambda: CountSketch.from_table(torch.zeros(2, 3, 4), 10, 0), ValueError, "table must be 2-D"),
        (lambda: CountSketch.from_table(torch.zeros(0, 4), 10, 0), ValueError, "rows must be positive"),
        (lambda: CountSketch.from_table(torch.zeros(3, 8, dtype=torch.int32), 10, 0), TypeError, "floating-point"),
        (lambda: CountSketch.from_table(torch.full((3, 8), float("nan")), 10, 0), ValueError, "table contains NaN"),
        (lambda: _sketch() + CountSketch(10, 3, 9), ValueError, r"different cols \(8 vs 9\)"),
        (lambda: _sketch() + CountSketch(11, 3, 8, seed=1), ValueError, r"different d \(10 vs 11\), seed \(0 vs 1\)"),
        (lambda: _sketch() * float("nan"), ValueError, "cannot scale a sketch by nan"),
        (lambda: _sketch() + 1, TypeError, "unsupported operand"),
    ],
)
def test_bad_input_is_refused_with_the_reason(make, error: type[Exception], match: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        make()


def test_zero_buckets_zeroes_exactly_the_touched_buckets() -> None:
    d, indices = 20_000, torch.tensor([5, 17, 19_999])
    sketch = sketch_of(randn(d, 7), 5, 700)
    touched = CountSketch(d, 5, 700).accumulate_sparse(indices, torch.ones(3)).table != 0
    before = sketch.table.clone()
    sketch.zero_buckets(indices)
    assert torch.all(sketch.table[touched] == 0) and torch.equal(sketch.table[~touched], before[~touched])
    assert torch.equal(sketch.estimate(indices), torch.zeros(3))


def test_hash_functions_are_derived_once_per_seed_shape_and_device() -> None:
    from fedsketch.sketch.hashing import TabulationHash

    args = (7, 10_000, 3, 500, torch.device("cpu"))
    shared = TabulationHash.build(*args)
    assert TabulationHash.build(*args) is shared  # every sketch of a run shares them
    fresh = TabulationHash.derive(*args)
    for name in ("coeffs", "pos", "inv", "lo_sign", "inv_sign"):
        assert torch.equal(getattr(shared, name), getattr(fresh, name)), name
    for other in ((8, 10_000, 3, 500), (7, 10_001, 3, 500), (7, 10_000, 4, 500), (7, 10_000, 3, 501)):
        built = TabulationHash.build(*other, torch.device("cpu"))
        assert (built.d, built.rows, built.cols) == other[1:]
        assert not torch.equal(built.coeffs[:, :1], shared.coeffs[:, :1])  # all four arguments are in the key


# the edges: bounds and messages, operators, device and dtype, top-k's second pass ---------------------------


HALF = [torch.float16, torch.bfloat16]


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
