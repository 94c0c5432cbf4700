"""Benchmark of the Count Sketch: accumulate and unsketch (top-k) against one copy of the input.

FetchSGD (Rothchild et al., ICML 2020) sketches every client update and
unsketches the merged table every round, so both must cost a few passes over
the vector. The yardstick is measured in the same run on the same vector: one
``copy_`` of the input into a preallocated buffer (pure memory bandwidth), so
the ratios mean something even on a shared machine where absolute times drift.

    python experiments/bench/bench_sketch.py            # d = 10^6 and 10^7 on the CPU (10^8 on a GPU)
    python experiments/bench/bench_sketch.py --quick    # d = 10^6 only, 3 repeats
    python experiments/bench/bench_sketch.py --classic  # also the precomputed-hash layout, for reference

Shape: rows = 5, cols = d / 20, k = d / 200 (d = 10^7: 5 x 500,000 and k = 50,000).
Times are medians over the repeats after one warm-up call. Peak extra memory is
measured in a fresh process per operation, once its input and table exist:
CPU, the RSS high-water mark (``VmHWM``, reset just before the call) above the
RSS at that point; GPU, ``max_memory_allocated`` above what was allocated.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fedsketch import CountSketch

ROWS = 5


def shape(d: int) -> tuple[int, int]:
    """(cols, k) for a vector of length d."""
    return d // 20, d // 200


def median_ms(fn: Callable[[], object], repeats: int, device: torch.device) -> float:
    """Median wall time of ``fn()`` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def operations(d: int, device: torch.device) -> dict[str, Callable[[], object]]:
    """The timed operations on one random vector and a sketch of it."""
    cols, k = shape(d)
    gen = torch.Generator().manual_seed(0)
    vec = torch.randn(d, generator=gen).to(device)
    buffer = torch.empty_like(vec)
    sketch = CountSketch(d, ROWS, cols, seed=0, device=device).accumulate(vec)
    top_idx, top_val = sketch.topk(k)
    return {
        "copy": lambda: buffer.copy_(vec),
        "build": lambda: CountSketch(d, ROWS, cols, seed=1, device=device),
        "accumulate": lambda: sketch.accumulate(vec),
        "topk": lambda: sketch.topk(k),
        "accumulate_sparse": lambda: sketch.accumulate_sparse(top_idx, top_val),
        "zero_buckets": lambda: sketch.copy().zero_buckets(top_idx),
    }


def classic(d: int) -> dict[str, Callable[[], object]]:
    """The csvec layout for reference: hashes precomputed for all d, scatter, gather, median, topk."""
    cols, k = shape(d)
    gen = torch.Generator().manual_seed(0)
    vec = torch.randn(d, generator=gen)
    buckets = torch.randint(0, cols, (ROWS, d), generator=gen) + torch.arange(ROWS)[:, None] * cols
    signs = torch.randint(0, 2, (ROWS, d), generator=gen).float() * 2 - 1
    table = torch.zeros(ROWS * cols)

    def accumulate() -> None:
        table.index_add_(0, buckets.view(-1), (signs * vec).view(-1))

    def topk() -> object:
        return torch.topk((table[buckets] * signs).median(dim=0).values.abs(), k, sorted=False)

    return {"accumulate": accumulate, "topk": topk}


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def single_call(op: str, d: int, device: torch.device) -> Callable[[], object]:
    """One call of ``op`` ("accumulate" or "topk") on fresh objects, set up without running it."""
    cols, k = shape(d)
    gen = torch.Generator().manual_seed(0)
    if op == "accumulate":
        vec = torch.randn(d, generator=gen).to(device)
        sketch = CountSketch(d, ROWS, cols, seed=0, device=device)
        return lambda: sketch.accumulate(vec)
    received = CountSketch.from_table(torch.randn(ROWS, cols, generator=gen).to(device), d, seed=0)
    return lambda: received.topk(k)


def peak_memory_mb(op: str, d: int, device: torch.device) -> float:
    """Peak extra memory of one call of ``op``, beyond its input and table, in this fresh process.

    On the CPU the RSS high-water mark is reset (``/proc/self/clear_refs``)
    after the set-up, and the parent sets ``MALLOC_MMAP_THRESHOLD_`` so that
    freed buffers leave the RSS instead of hiding later allocations.
    """
    call = single_call(op, d, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        call()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # reset VmHWM to the current RSS
    rss_before = _status_kb("VmRSS")
    call()
    return (_status_kb("VmHWM") - rss_before) / 1024


def measure_in_fresh_process(op: str, d: int, device: torch.device) -> float:
    cmd = [sys.executable, __file__, "--memory-of", op, "--d", str(d), "--device", str(device)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 16)}
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900, env=env)
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def bench(sizes: list[tuple[int, torch.device]], repeats: int, with_classic: bool) -> list[str]:
    """Rows of the markdown table."""
    header = (
        "| device | d | cols | k | copy ms | accumulate ms (x copy) | topk ms (x copy) | "
        "accumulate_sparse(k) ms | zero_buckets(k) ms | build ms | peak extra MB accumulate / topk |"
    )
    lines = [header, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for d, device in sizes:
        cols, k = shape(d)
        ms = {name: median_ms(fn, repeats, device) for name, fn in operations(d, device).items()}
        mem = [f"{measure_in_fresh_process(op, d, device):.1f}" for op in ("accumulate", "topk")]
        lines.append(
            f"| {device.type} | {d:.0e} | {cols:,} | {k:,} | {ms['copy']:.1f} | "
            f"{ms['accumulate']:.0f} ({ms['accumulate'] / ms['copy']:.0f}x) | {ms['topk']:.0f} "
            f"({ms['topk'] / ms['copy']:.0f}x) | {ms['accumulate_sparse']:.1f} | {ms['zero_buckets']:.1f} | "
            f"{ms['build']:.0f} | {mem[0]} / {mem[1]} |"
        )
        if with_classic and device.type == "cpu":
            old = {name: median_ms(fn, max(1, repeats // 2), device) for name, fn in classic(d).items()}
            lines.append(
                f"| cpu, classic | {d:.0e} | {cols:,} | {k:,} | | {old['accumulate']:.0f} "
                f"({old['accumulate'] / ms['copy']:.0f}x) | {old['topk']:.0f} ({old['topk'] / ms['copy']:.0f}x) "
                "| | | | |"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="d = 10^6 only, 3 repeats")
    parser.add_argument("--repeats", type=int, default=None, help="timed calls per operation (default 5; 3 quick)")
    parser.add_argument("--classic", action="store_true", help="also time the precomputed-hash layout (CPU)")
    parser.add_argument("--memory-of", help=argparse.SUPPRESS)
    parser.add_argument("--d", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_of:
        print(json.dumps(peak_memory_mb(args.memory_of, args.d, torch.device(args.device))))
        return
    cpu = torch.device("cpu")
    sizes = [(10**6, cpu)] if args.quick else [(10**6, cpu), (10**7, cpu)]
    if torch.cuda.is_available():
        sizes += [(10**7, torch.device("cuda"))] if args.quick else [(10**8, torch.device("cuda"))]
    repeats = args.repeats or (3 if args.quick else 5)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, rows = {ROWS}, medians of {repeats}")
    print("\n".join(bench(sizes, repeats, args.classic)))


if __name__ == "__main__":
    main()
