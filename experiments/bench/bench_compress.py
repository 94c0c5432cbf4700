"""Benchmark of the upload compressors: Gaussian-k against exact top-k, and costs.

Gaussian-k (Shi et al., "Understanding Top-k Sparsification in Distributed
Deep Learning", 2019) exists because exact top-k selection is slow; this
measures by how much, on this machine, and how close to ``k`` its threshold
lands. Both are timed in the same run on the same vectors, so the ratio is
meaningful even where absolute times are not (shared CPUs).

    python -m experiments.bench.bench_compress                 # d = 10^7
    python -m experiments.bench.bench_compress --d 1000000 --repeats 3

Prints two markdown tables: selection time and count (Gaussian and Laplace
vectors, k = d/1000 and d/100), then every compressor's compress / decompress
time and payload array bytes (``payload_nbytes``; serialization headers excluded).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from fedsketch.compress import gaussiank, get_compressor, payload_nbytes

Timed = Callable[[], object]


def median_ms(fn: Timed, repeats: int) -> float:
    """Median wall time of ``fn()`` in milliseconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def exact_topk(vec: torch.Tensor, k: int) -> torch.Tensor:
    """What Gaussian-k replaces: exact top-k by magnitude (indices)."""
    return torch.topk(vec.abs(), k, sorted=False).indices


def sample_vectors(d: int, seed: int) -> dict[str, torch.Tensor]:
    """A Gaussian and a Laplace vector (heavier tails than the Gaussian fit)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.rand(d, generator=gen) - 0.5
    return {
        "gaussian": torch.randn(d, generator=gen),
        "laplace": -torch.sign(u) * torch.log1p(-2 * u.abs()),
    }


def selection_rows(d: int, repeats: int, seed: int) -> list[str]:
    """Rows of the Gaussian-k vs top-k table."""
    rows = []
    for name, vec in sample_vectors(d, seed).items():
        for k in (d // 1000, d // 100):
            exact = exact_topk(vec, k)
            t_topk = median_ms(partial(exact_topk, vec, k), repeats)
            rows.append(f"| {name} | {k} | torch.topk | {t_topk:.1f} | 1.00 | {k} | 1.00 | - | 1.00 |")
            for rule in gaussiank.ADJUST_RULES:
                sel = gaussiank.select(vec, k, adjust=rule)
                t_sel = median_ms(partial(gaussiank.select, vec, k, adjust=rule), repeats)
                recall = torch.isin(exact, sel.indices).float().mean().item()
                rows.append(
                    f"| {name} | {k} | gaussiank/{rule} | {t_sel:.1f} | {t_sel / t_topk:.2f} "
                    f"| {sel.count} | {sel.count / k:.2f} | {sel.rounds} | {recall:.2f} |"
                )
    return rows


def compressor_rows(d: int, repeats: int, seed: int) -> list[str]:
    """Rows of the per-compressor cost table."""
    k = d // 100
    settings: dict[str, dict[str, object]] = {
        "none": {},
        "topk": {"k": k},
        "random_k": {"k": k, "rescale": True},
        "gaussiank": {"k": k},
        "qsgd": {"s": 4, "bucket_size": 512},
        "terngrad": {"bucket_size": 512},
        "signsgd": {},
    }
    vec = sample_vectors(d, seed)["gaussian"]
    rows = []
    for name, options in settings.items():
        comp = get_compressor(name, d, **options)
        payload = comp.compress(vec, seed=seed)
        t_c = median_ms(partial(comp.compress, vec, seed=seed), repeats)
        t_d = median_ms(partial(comp.decompress, payload, seed=seed), repeats)
        opts = ", ".join(f"{key}={val}" for key, val in options.items()) or "-"
        rows.append(f"| {name} | {opts} | {t_c:.1f} | {t_d:.1f} | {payload_nbytes(payload)} |")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=10_000_000, help="vector length")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per entry (median)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-compressors", action="store_true", help="only the selection table")
    args = parser.parse_args(argv)
    print(f"d = {args.d}, torch {torch.__version__}, {torch.get_num_threads()} threads, CPU\n")
    print("| vector | k | method | ms | time / topk | selected | selected / k | rounds | recall of top-k |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(selection_rows(args.d, args.repeats, args.seed)))
    if not args.skip_compressors:
        print("\n| compressor | options | compress ms | decompress ms | payload bytes |")
        print("|---|---|---|---|---|")
        print("\n".join(compressor_rows(args.d, args.repeats, args.seed)))


if __name__ == "__main__":
    main()
