"""Clients per second: one client at a time against several clients' gradients in one call.

FetchSGD's CIFAR setting (Rothchild et al., ICML 2020): ResNet-9 (GroupNorm),
5 images of 32x32 a client, one gradient each, a 5 x 130,000 Count Sketch of
it. This times ``run_cohort`` (the code a simulated Flower node runs for its
cohort) on the same clients and round, in the same run:

- ``loop``: one client at a time (``client-batching = 0``), the plain loop;
- ``vectorized N``: ``client-batching = N``, N clients' gradients in one
  ``torch.func`` call (:mod:`fedsketch.training.batched`), each still sketched alone;

and prints clients per second and the ratio to the loop, on the GPU when one is
present (``--device auto``), else on the CPU. The images are random (written
to a temporary ``.npz``): the time of a gradient does not depend on them.

    python -m experiments.bench.bench_clients [--clients 100] [--batching 10 25 50 100] [--repeats 3]

``--fedavg`` times FedAvg's local training instead, in the shape of
``experiments/bench/bench_peer.py``: the MLP (60 features, 2 x 512 hidden, 10
classes: 299,018 parameters), ``local-steps`` SGD steps of ``local-batch-size``
(default 5 of 32) a client on 64 random samples each, the dense update sent.
The loop and each batching run alternately, ``--repeats`` rounds each, and
the table gives the median seconds of one call of ``run_cohort`` for all the
clients (their local training and encoding):

    python -m experiments.bench.bench_clients --fedavg --clients 50 --batching 50 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from fedsketch.client.cohort import ClientOutcome, run_cohort
from fedsketch.config import RunConfig
from fedsketch.data.run import load_data
from fedsketch.methods import ClientJob
from fedsketch.model.flat import get_flat
from fedsketch.task import make_model, resolve_device

IMAGES_PER_CLIENT = 5
SAMPLES_PER_CLIENT = 64  # --fedavg: more than a batch of 32, so every client draws batches of equal length
FEATURES = 60  # bench_peer's generated data: Synthetic(0.5, 0.5)'s 60 features, 10 classes


def jobs(cids: list[int], server_round: int) -> list[ClientJob]:
    """The clients' jobs with the benchmark's 5 x 130,000 sketch."""
    return [ClientJob(cid, server_round, {"sketch-seed": 0, "sketch-rows": 5, "sketch-cols": 130_000}) for cid in cids]


def write_images(path: Path, num_clients: int) -> None:
    """Random CIFAR-shaped images, ``IMAGES_PER_CLIENT`` a client, and a small test set."""
    rng = np.random.default_rng(0)
    n = num_clients * IMAGES_PER_CLIENT
    np.savez(
        path,
        x_train=rng.standard_normal((n, 3, 32, 32), dtype=np.float32),
        y_train=rng.integers(0, 10, n),
        x_test=rng.standard_normal((100, 3, 32, 32), dtype=np.float32),
        y_test=rng.integers(0, 10, 100),
    )


def bench_config(path: Path, num_clients: int, batching: int, device: str) -> RunConfig:
    """The CIFAR-10 config's client settings on the images at ``path``."""
    return RunConfig.from_mapping(
        {
            "dataset": "npz",
            "data-root": str(path),
            "partition": "iid",
            "num-clients": num_clients,
            "clients-per-round": num_clients,
            "model": "resnet9",
            "model-norm": "group",
            "client-update": "gradient",
            "local-batch-size": IMAGES_PER_CLIENT,
            "sketch-rows": 5,
            "sketch-cols": 130000,
            "k": 65000,
            "client-batching": batching,
            "device": device,
        }
    )


def write_features(path: Path, num_clients: int) -> None:
    """Random features, ``SAMPLES_PER_CLIENT`` a client, and a small test set."""
    rng = np.random.default_rng(0)
    n = num_clients * SAMPLES_PER_CLIENT
    np.savez(
        path,
        x_train=rng.standard_normal((n, FEATURES), dtype=np.float32),
        y_train=rng.integers(0, 10, n),
        x_test=rng.standard_normal((100, FEATURES), dtype=np.float32),
        y_test=rng.integers(0, 10, 100),
    )


def fedavg_config(path: Path, num_clients: int, batching: int, args: argparse.Namespace) -> RunConfig:
    """bench_peer's FedAvg client settings on the features at ``path``."""
    data = {"dataset": "npz", "data-root": str(path), "partition": "iid", "num-clients": num_clients}
    model = {"model": "mlp", "model-hidden": 512, "strategy": "fedavg", "clients-per-round": num_clients}
    local = {"client-update": "delta", "local-steps": args.steps, "local-batch-size": args.batch, "client-lr": 0.1}
    return RunConfig.from_mapping({**data, **model, **local, "client-batching": batching, "device": args.device})


def alternating_seconds(cfgs: list[RunConfig], weights: np.ndarray, repeats: int) -> list[float]:
    """Median seconds of one ``run_cohort`` over all clients, per config, the configs run in turn each round."""
    cids = list(range(cfgs[0].num_clients))
    for cfg in cfgs:
        run_cohort(cfg, weights, jobs(cids[: min(len(cids), max(cfg.client_batching, 2))], 1))  # warm-up
    times: list[list[float]] = [[] for _ in cfgs]
    for rnd in range(repeats):
        for cfg, seconds in zip(cfgs, times, strict=True):
            _sync(cfg)
            t0 = time.perf_counter()
            outcomes = run_cohort(cfg, weights, jobs(cids, rnd + 2))
            _sync(cfg)
            seconds.append(time.perf_counter() - t0)
            _raise_failures(outcomes)
    return [statistics.median(s) for s in times]


def fedavg_table(args: argparse.Namespace) -> list[str]:
    """Time FedAvg's local training, the loop against each batching, and the table's lines."""
    with tempfile.TemporaryDirectory(prefix="bench-clients-") as tmp:
        path = Path(tmp) / "features.npz"
        write_features(path, args.clients)
        cfgs = [fedavg_config(path, args.clients, n, args) for n in (0, *args.batching)]
        weights = get_flat(make_model(cfgs[0], load_data(cfgs[0]))).cpu().numpy()
        medians = alternating_seconds(cfgs, weights, args.repeats)
    shape = f"{args.clients} clients x {args.steps} local SGD steps of {args.batch}"
    lines = [
        f"MLP ({weights.size:,} parameters), {shape}, dense update; median of {args.repeats} alternating runs; "
        + _device_name(args.device),
        "| client work | seconds a cohort | clients/s | vs loop |",
        "| --- | ---: | ---: | ---: |",
    ]
    for cfg, secs in zip(cfgs, medians, strict=True):
        label = f"vectorized, {cfg.client_batching} clients a call" if cfg.client_batching else "loop (one at a time)"
        lines.append(f"| {label} | {secs:.3f} | {args.clients / secs:,.1f} | {medians[0] / secs:.2f}x |")
    return lines


def clients_per_second(cfg: RunConfig, weights: np.ndarray, repeats: int) -> float:
    """Median over ``repeats`` rounds of all clients through ``run_cohort``."""
    cids = list(range(cfg.num_clients))
    run_cohort(cfg, weights, jobs(cids[: min(len(cids), max(cfg.client_batching, 2))], 1))  # warm-up
    rates = []
    for rnd in range(repeats):
        _sync(cfg)
        t0 = time.perf_counter()
        outcomes = run_cohort(cfg, weights, jobs(cids, rnd + 2))
        _sync(cfg)
        rates.append(len(cids) / (time.perf_counter() - t0))
        _raise_failures(outcomes)
    return statistics.median(rates)


def _raise_failures(outcomes: list[ClientOutcome]) -> None:
    failed = [o.error for o in outcomes if o.error]
    if failed:
        raise RuntimeError(f"{len(failed)} clients failed, e.g. {failed[0]}")


def _device_name(name: str) -> str:
    device = resolve_device(name)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"


def _sync(cfg: RunConfig) -> None:
    if resolve_device(cfg.device).type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    """Time the loop and each batching, then print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=100, help="clients a round (default: 100)")
    parser.add_argument("--batching", type=int, nargs="+", default=[10, 25, 50, 100])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--fedavg", action="store_true", help="FedAvg's local training (bench_peer's MLP) instead")
    parser.add_argument("--steps", type=int, default=5, help="--fedavg: local SGD steps a client (default: 5)")
    parser.add_argument("--batch", type=int, default=32, help="--fedavg: samples a step (default: 32)")
    args = parser.parse_args()
    if args.fedavg:
        print("\n".join(fedavg_table(args)))
        return
    with tempfile.TemporaryDirectory(prefix="bench-clients-") as tmp:
        path = Path(tmp) / "images.npz"
        write_images(path, args.clients)
        base = bench_config(path, args.clients, 0, args.device)
        weights = get_flat(make_model(base, load_data(base))).cpu().numpy()
        rows = [("loop (one client at a time)", clients_per_second(base, weights, args.repeats))]
        for n in args.batching:
            cfg = bench_config(path, args.clients, n, args.device)
            rows.append((f"vectorized, {n} clients a call", clients_per_second(cfg, weights, args.repeats)))
    name = _device_name(args.device)
    print(
        f"ResNet-9 (GroupNorm, {weights.size:,} parameters), {IMAGES_PER_CLIENT} images of 32x32 a client, "
        f"one gradient and a 5 x 130,000 sketch each, {args.clients} clients; {name}"
    )
    print("| client work | clients/s | vs loop |")
    print("| --- | ---: | ---: |")
    for label, rate in rows:
        print(f"| {label} | {rate:,.1f} | {rate / rows[0][1]:.2f}x |")


if __name__ == "__main__":
    main()
