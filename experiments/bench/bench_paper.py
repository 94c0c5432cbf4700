"""The paper's CIFAR-10 shape through Flower on one machine: clients a second, against a plain loop, and GPU memory.

FetchSGD's CIFAR-10 run (Rothchild et al., ICML 2020, Sec. 6): 10,000 clients
of 5 images of one class, 100 a round, ResNet-9 with group norm, one gradient a
client, a 5 x 500,000 Count Sketch and k = 50,000, evaluated every 100 rounds;
2,400 rounds is 24 epochs. No CIFAR files can be fetched on the machines this
runs on, so the images are a generated stand-in of the same shape
(:func:`standin`: 3 x 32 x 32, 10 classes, each a smooth random template plus
pixel noise), written once to an ``.npz`` that both sides read.

For each ``--batching`` value (``client-batching``: clients whose gradients
one vectorized call computes, 0 for one at a time) it runs, in fresh processes:

- ``loop``: the same rounds (clients, sketches, server step, evaluation) in a
  plain single-process PyTorch loop (``bench_sim.plain_loop``);
- ``flower``: the whole run through Flower's simulation runtime
  (``flwr run`` against a private SuperLink, the in-process backend).

It prints the mean seconds a round over rounds 2..R (evaluation rounds
included, so the mean is what 2,400 rounds cost), clients a second, the ratio
of Flower's to the loop's, when round 1 ended, the 2,400 rounds projected
from them (round 1, then 2,399 mean rounds), and the peak GPU memory in use
(``nvidia-smi``, sampled every 0.5 s; blank without a GPU).

    python -m experiments.bench.bench_paper [--rounds 300] [--batching 0 100] [--supernodes 2]
    python -m experiments.bench.bench_paper --rounds 2400 --batching 100 --no-loop --keep runs/paper
    python -m experiments.bench.bench_paper --small      # a CPU-sized check of the same pipeline

``--no-loop`` runs Flower's side alone, ``--no-flower`` the loop alone; ``--no-merge`` sends every client's
upload in its own reply record (``merge-uploads = false``); ``--clients N`` registers N clients sharing the same
50,000 images; ``--strategy local_topk`` runs local top-k with each client's error in a file; ``--keep DIR`` keeps the runs' folders
(``rounds.jsonl`` stamps each round's end, so a run cut short still says how
far it got and how fast).

Issue 17's goal: 2,400 rounds in under 10 minutes on one H100, at least 400
clients a second. Measurements and the machines they came from: docs/simulation.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Self

import numpy as np

from experiments.bench.bench_sim import flower_run, run_plain_loop_in_child
from fedsketch.config import RunConfig

PAPER = {
    "strategy": "fetchsgd",
    "dataset": "npz",
    "partition": "pathological",
    "classes-per-client": 1,
    "samples-per-client": 5,
    "num-clients": 10000,
    "clients-per-round": 100,
    "eval-every": 100,
    "model": "resnet9",
    "model-norm": "group",
    "client-update": "gradient",
    "local-batch-size": 5,
    "lr": 0.4,
    "lr-schedule": "linear",
    "momentum": 0.9,
    "sketch-rows": 5,
    "sketch-cols": 500000,
    "k": 50000,
    "error-feedback": "zero-buckets",
    "download": "sparse",
    "device": "auto",
    "merge-uploads": True,
}
"""Issue 17's run: the paper's CIFAR-10 shape with a 5 x 500,000 sketch and k = 50,000."""
SMALL = {"num-clients": 200, "clients-per-round": 10, "eval-every": 2, "sketch-cols": 5000, "k": 500}
"""``--small``: the same pipeline at a size a 2-core CPU runs in seconds a round."""
LOCAL_TOPK = {
    "strategy": "local_topk",
    "local-topk-error": "client",
    "client-state": "disk",
    "max-client-state-mb": 2**20,
}
"""``--strategy local_topk``: local top-k at FetchSGD's k, each client's error kept in a file of its own."""
POOL = 50_000
"""Training images, whatever ``--clients`` is: CIFAR-10's, so memory compares client counts, not data sizes."""
PAPER_ROUNDS = 2400
CLASSES, SHAPE = 10, (3, 32, 32)


def standin(n_train: int, n_test: int, seed: int = 0) -> dict[str, np.ndarray]:
    """CIFAR-10-shaped images: per class a smooth template (4 x 4 noise, upsampled), plus unit pixel noise.

    Labels are balanced (``n_train / 10`` images a class when 10 divides it),
    so a pathological one-class split of 5 images a client uses every image.
    """
    import torch
    from torch.nn import functional as F

    rng = np.random.default_rng(seed)
    low = torch.from_numpy(rng.standard_normal((CLASSES, SHAPE[0], 4, 4), dtype=np.float32))
    templates = F.interpolate(low, size=SHAPE[1:], mode="bilinear", align_corners=False).numpy()
    arrays: dict[str, np.ndarray] = {}
    for split, n in (("train", n_train), ("test", n_test)):
        y = np.arange(n, dtype=np.int64) % CLASSES
        rng.shuffle(y)
        x = rng.standard_normal((n, *SHAPE), dtype=np.float32)
        x += templates[y]
        arrays[f"x_{split}"], arrays[f"y_{split}"] = x, y
    return arrays


def write_standin(folder: Path, num_clients: int, samples_per_client: int) -> Path:
    """The stand-in for ``num_clients`` clients of ``samples_per_client`` images, and a fifth as many to test on."""
    n = num_clients * samples_per_client
    path = folder / "standin.npz"
    with open(path, "wb") as f:
        np.savez(f, **standin(n, max(CLASSES, n // 5)))  # type: ignore[arg-type]  # numpy's stub reads ** as allow_pickle
    return path


def paper_config(
    data: Path, rounds: int, batching: int, out_dir: Path, small: bool = False, **settings: object
) -> RunConfig:
    """The run for one ``client-batching`` value; ``settings`` (kebab-case, as ``key_name=...``) on top."""
    extra = {k.replace("_", "-"): v for k, v in settings.items()}
    return RunConfig.from_mapping(
        {
            **PAPER,
            **(SMALL if small else {}),
            **extra,
            "experiment": f"paper-b{batching}",
            "data-root": str(data),
            "num-rounds": rounds,
            "client-batching": batching,
            "out-dir": str(out_dir),
        }
    )


class GpuMemory:
    """Peak memory in use on the machine's GPUs (``nvidia-smi``, every 0.5 s) while the ``with`` block runs."""

    def __init__(self) -> None:
        self.tool = shutil.which("nvidia-smi")
        self.peak_mb: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        query = [str(self.tool), "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        while not self._stop.wait(0.5):
            done = subprocess.run(query, capture_output=True, text=True, check=False)
            if done.returncode == 0 and done.stdout.strip():
                used = sum(float(v) for v in done.stdout.split())
                self.peak_mb = max(self.peak_mb or 0.0, used)

    def __enter__(self) -> Self:
        if self.tool:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.tool:
            self._thread.join()


def row(name: str, result: dict[str, float], clients: int, loop_round_s: float | None, gpu_mb: float | None) -> str:
    """One line of the table (``loop_round_s`` None: no loop ran beside it)."""
    mean = result["mean_round_s"]
    projected = result["first_round_s"] + (PAPER_ROUNDS - 1) * mean
    gpu = f"{gpu_mb:,.0f} MB" if gpu_mb is not None else ""
    versus = f"{mean / loop_round_s:.2f}" if loop_round_s else ""
    return (
        f"| {name} | {mean:.3f} | {_rate(clients / mean)} | {versus} | {result['first_round_s']:.1f} s | "
        f"{result['whole_s']:.0f} s | {projected / 60:.1f} min | {gpu} | {result['peak_mb']:,.0f} MB |"
    )


def timed(run: Callable[[], dict[str, float]]) -> dict[str, float]:
    """``run``'s result, with ``whole_s``: the seconds the whole run took, start-up and shut-down included."""
    start = time.perf_counter()
    result = run()
    return {**result, "whole_s": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> None:
    """Build the stand-in, run both sides for each batching value, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="rounds a run (the paper's run has 2,400)")
    parser.add_argument("--batching", type=int, nargs="+", default=[0, 100], help="client-batching values")
    parser.add_argument("--supernodes", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="200 clients, 10 a round, a 5 x 5,000 sketch (CPU)")
    parser.add_argument("--no-loop", action="store_true", help="run Flower's side alone")
    parser.add_argument("--no-flower", action="store_true", help="run the plain loop alone")
    parser.add_argument("--keep", type=Path, help="keep the runs' folders here (default: a temporary folder)")
    parser.add_argument("--clients", type=int, help=f"registered clients, sharing {POOL:,} images (default 10,000)")
    parser.add_argument("--strategy", choices=("fetchsgd", "local_topk"), default="fetchsgd")
    parser.add_argument("--no-merge", action="store_true", help="every client's upload in its own reply record")
    args = parser.parse_args(argv)
    extra: dict[str, object] = {**(LOCAL_TOPK if args.strategy == "local_topk" else {})}
    if args.clients:
        extra.update({"num-clients": args.clients, "samples-per-client": POOL // args.clients})
    if args.no_merge:
        extra["merge-uploads"] = False
    extra = {k.replace("-", "_"): v for k, v in extra.items()}
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is timed apart from the rest)")
    threads = len(os.sched_getaffinity(0))
    lines = []
    with contextlib.ExitStack() as stack:
        folder = args.keep or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-paper-")))
        folder.mkdir(parents=True, exist_ok=True)
        base = paper_config(folder / "none.npz", args.rounds, 0, folder, args.small, **extra)
        data = write_standin(folder, base.num_clients, base.samples_per_client)
        for batching in args.batching:
            cfg = paper_config(data, args.rounds, batching, folder / f"b{batching}", args.small, **extra)
            n, loop_s = cfg.clients_per_round, None
            if not args.no_loop:
                with GpuMemory() as loop_gpu:
                    loop = timed(lambda: run_plain_loop_in_child(cfg, threads))  # noqa: B023 -- called at once
                print(f"client-batching {batching}: loop {loop}", file=sys.stderr, flush=True)
                loop_s = loop["mean_round_s"]
                lines.append(row(f"loop, client-batching {batching}", loop, n, loop_s, loop_gpu.peak_mb))
            if args.no_flower:
                continue
            flower_cfg = dataclasses.replace(cfg, experiment=f"{cfg.experiment}-flower")
            with GpuMemory() as flower_gpu:
                flower = timed(lambda: flower_run(flower_cfg, args.supernodes))  # noqa: B023 -- called at once
            print(f"client-batching {batching}: flower {flower}", file=sys.stderr, flush=True)
            lines.append(row(f"Flower, client-batching {batching}", flower, n, loop_s, flower_gpu.peak_mb))
    gpu = _gpu_name()
    merged = "merged uploads" if base.merge_uploads else "one reply record per client"
    print(
        f"{base.strategy}, {base.num_clients:,} clients of {base.samples_per_client} generated 32x32x3 images of one "
        f"class, {base.clients_per_round} a round, ResNet-9 (group norm), {base.sketch_rows} x {base.sketch_cols:,} "
        f"sketch, k = {base.k:,}, evaluated every {base.eval_every} rounds; {args.rounds} rounds, "
        f"{args.supernodes} simulated nodes, {merged}; {gpu or f'CPU, {threads} cores'}"
    )
    print(
        f"| run | seconds a round (mean) | clients/s | vs the loop | round 1 done after | whole run "
        f"| {PAPER_ROUNDS:,} rounds (projected) | GPU memory (peak) | host memory (peak) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(lines))


def _gpu_name() -> str:
    tool = shutil.which("nvidia-smi")
    if not tool:
        return ""
    done = subprocess.run(
        [tool, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip().replace("\n", ", ")


def _rate(per_s: float) -> str:
    """Clients a second: whole numbers, and two decimals below 10 (a slow round must not print as 0)."""
    return f"{per_s:,.0f}" if per_s >= 10 else f"{per_s:.2f}"


if __name__ == "__main__":
    started = time.time()
    main()
    print(f"\n(whole benchmark: {time.time() - started:.0f} s)")
