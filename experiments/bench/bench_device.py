"""A device's cost per round under Flower's deployment runtime: time, memory and bytes.

A FetchSGD client (Rothchild et al., ICML 2020) computes one gradient and one
Count Sketch a round: milliseconds. This starts a real SuperLink and one real
SuperNode on loopback (:class:`experiments.deployment.deploy.LocalFederation`), runs a few
rounds with ``flwr run``, and samples the device's processes (the SuperNode and
everything it or its launcher started) every 20 ms, for each setup:

- ``today``: Flower's default ``--isolation subprocess``, a fresh ClientApp
  process per message, in this environment (``--before-app``: the app's code as
  it was, e.g. an older checkout);
- ``launcher``: :mod:`bridge.runtime.launcher` (one warm process, a fork per message), its
  SuperNode asking for the next message soon after a reply (:mod:`bridge.runtime.supernode_waits`);
- ``launcher, Flower's waits`` (``flowerwaits``): the same with Flower's own 3 s idle wait;
- ``launcher, device env``: the same in ``--device-venv`` (a CPU-only torch).

Per round, on the device: ``device s`` from the SuperNode's "Receiving" to its
"Sent successfully" log line; ``compute s``: the same client's round (its data,
model, gradient and payload) in a process that has already imported
everything, in the same environment; ``overhead s`` the difference;
``round's own MiB`` what that round adds to the peak resident memory of that
process. Memory is PSS (shared pages split between the processes sharing them,
so a fork's pages are not counted twice) summed over the device's processes,
at its peak and while idle between rounds; RSS summed the same way is printed
too. Bytes are the serialized bytes the server counted, per round
(``metrics.jsonl``). ``round s (server)`` is the median time from one round's update to the
next's (``rounds.jsonl``); it includes the server's evaluation in the rounds that evaluate
(``--eval-every``, default every round). Medians over the rounds.

    python -m experiments.bench.bench_device [--rounds 5] [--models mlp,cnn] [--setups today,launcher,flowerwaits,device]
        [--eval-every N] [--device-venv /work/devvenv] [--before-app DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from experiments.bench.device_sampler import DeviceSampler
from experiments.deployment.deploy import Deployment, LocalFederation, node_settings

APP_DIR = Path(__file__).resolve().parents[2]
MODELS: dict[str, dict[str, Any]] = {
    "mlp": {},  # the embedded default job: synthetic data, the 299,018-parameter MLP
    "cnn": {"model": "cnn", "dataset": "mnist", "partition": "iid"},  # FedAvg's CNN, 28x28 images (data-root per run)
}


def write_mnist_like(root: Path, train: int = 60_000, test: int = 10_000) -> Path:
    """Random 28x28 images and labels in MNIST's files and sizes (time and memory do not depend on the pixels)."""
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", train), ("t10k", test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(bytes([0, 0, 8, 3]) + _dims(n, 28, 28) + images.tobytes())
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1]) + _dims(n) + labels.tobytes())
    return root


def _dims(*sizes: int) -> bytes:
    return b"".join(int(s).to_bytes(4, "big") for s in sizes)


def reference_compute(settings: dict[str, Any]) -> dict[str, float]:
    """One client's round in this process, timed after the ClientApp's imports (run in the device's env)."""
    start = time.perf_counter()
    import clients.client_app  # noqa: F401 -- the ClientApp's imports, as a round has them
    from fedsketch.client.cohort import run_cohort
    from fedsketch.config import RunConfig
    from fedsketch.data.run import load_data
    from fedsketch.methods import ClientJob, get_method
    from fedsketch.model.flat import num_params
    from fedsketch.task import make_model

    imported, base_rss = time.perf_counter(), _rss()
    cfg = RunConfig.from_mapping(settings)
    load_data(cfg)
    loaded = time.perf_counter()
    d = num_params(make_model(cfg, load_data(cfg)))  # only to size the weights: not charged
    weights = np.random.default_rng(0).standard_normal(d).astype(np.float32) * 0.01
    begin = time.perf_counter()
    (outcome,) = run_cohort(cfg, weights, [ClientJob(0, 1, get_method(cfg.strategy).wire.round_config(cfg))])
    if outcome.payload is None:
        raise RuntimeError(f"the reference round failed: {outcome.error}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "import_s": imported - start,
        "compute_s": loaded - imported + time.perf_counter() - begin,
        "compute_mib": (peak - base_rss) / 2**20,
    }


def _rss() -> int:
    return int(Path("/proc/self/status").read_text().split("VmRSS:")[1].split()[0]) * 1024


def _reference(python: str, settings: dict[str, Any]) -> dict[str, float]:
    out = subprocess.run(
        [python, "-m", "experiments.bench.bench_device", "--reference", json.dumps(settings)],
        cwd=APP_DIR,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _toml(settings: dict[str, Any]) -> str:
    def value(v: Any) -> str:
        return json.dumps(v) if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else str(v)

    return "".join(f"{k} = {value(v)}\n" for k, v in settings.items())


def measure(setup: str, settings: dict[str, Any], app: Path, device_bin: Path | None, work: Path) -> dict[str, Any]:
    """One federation of one SuperNode under ``setup``; the device's figures per round."""
    isolation = "subprocess" if setup == "today" else "launcher"
    waits = "flower" if "Flower's waits" in setup else "backoff"
    (work / "run").mkdir(parents=True)
    (work / "run_config.toml").write_text(_toml(settings), encoding="utf-8")
    with LocalFederation(Deployment(1, isolation=isolation, supernode_waits=waits), work / "fed", device_bin) as fed:
        sampler = DeviceSampler(fed.procs["supernode-0"].pid, fed.log("supernode-0"))
        sampler.start()
        if isolation == "launcher":
            sampler.wait_for("launcher ready", timeout=120.0)
        time.sleep(1.0)  # an idle moment: the standing cost between rounds
        code = fed.run(app, work / "run_config.toml", work / "flower.log")
        sampler.stop()
    if code != 0:
        raise RuntimeError(f"flwr run failed ({code}); see {work / 'flower.log'} and {work / 'fed' / 'logs'}")
    found = list(Path(settings["out-dir"]).glob("*/*/metrics.jsonl"))
    if len(found) != 1:
        raise RuntimeError(f"the run wrote no metrics.jsonl; see {work / 'flower.log'} and {work / 'fed' / 'logs'}")
    rows = [json.loads(line) for line in found[0].read_text().splitlines()]
    stamps = [json.loads(line)["unix_time"] for line in (found[0].parent / "rounds.jsonl").read_text().splitlines()]
    walls = [b - a for a, b in itertools.pairwise(stamps)]  # from one round's update to the next's
    rounds = len(stamps)
    return {
        "device_s": statistics.median(sampler.round_seconds()),
        "life_s": statistics.median(sampler.task_lifetimes() or [float("nan")]),
        "pss": sampler.peak_pss / 2**20,
        "rss": sampler.peak_rss / 2**20,
        "idle_pss": sampler.idle_pss / 2**20,
        "round_s": statistics.median(walls) if walls else float("nan"),
        "up": rows[-1]["cum_upload_bytes"] / rounds,
        "down": rows[-1]["cum_download_bytes"] / rounds,
        "rounds": len(sampler.round_seconds()),
    }


def _print_table(results: list[tuple[str, str, dict[str, Any]]]) -> None:
    head = (
        "model",
        "setup",
        "device s",
        "compute s",
        "overhead s",
        "ClientApp life s",
        "peak PSS MiB",
        "idle PSS MiB",
        "round's own MiB",
        "peak RSS MiB",
        "round s (server)",
        "up B/round",
        "down B/round",
    )
    print("| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    for model, setup, r in results:
        cells = (
            model,
            setup,
            f"{r['device_s']:.2f}",
            f"{r['compute_s']:.2f}",
            f"{r['device_s'] - r['compute_s']:.2f}",
            f"{r['life_s']:.2f}",
            f"{r['pss']:.0f}",
            f"{r['idle_pss']:.0f}",
            f"{r['compute_mib']:.0f}",
            f"{r['rss']:.0f}",
            f"{r['round_s']:.2f}",
            f"{r['up']:,.0f}",
            f"{r['down']:,.0f}",
        )
        print("| " + " | ".join(cells) + " |")
    if not any(setup == "today" for _, setup, _ in results):
        return
    print(
        "\nRatios, today / each setup (same run):\n\n| model | setup | device s | overhead s | peak PSS |\n|"
        + " --- |" * 5
    )
    for model, setup, r in results:
        base = next(b for m, s, b in results if m == model and s == "today")
        over = (base["device_s"] - base["compute_s"]) / max(r["device_s"] - r["compute_s"], 1e-3)
        print(
            f"| {model} | {setup} | {base['device_s'] / r['device_s']:.1f}x | {over:.1f}x | {base['pss'] / r['pss']:.1f}x |"
        )


def _key(setup: str) -> str:
    """A setup's name in ``--setups``."""
    return "device" if "device" in setup else "flowerwaits" if "Flower's waits" in setup else setup


def main(argv: list[str] | None = None) -> int:
    """Measure every model under every setup; print the table and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rounds per federation (default: 5)")
    parser.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp, cnn (default: both)")
    parser.add_argument(
        "--eval-every", type=int, default=1, help="the server evaluates every N rounds (its round waits for it)"
    )
    parser.add_argument("--device-venv", type=Path, help="a venv for the device (CPU-only torch); adds a setup")
    parser.add_argument("--before-app", type=Path, default=APP_DIR, help="the app's code for 'today' (a checkout)")
    parser.add_argument(
        "--setups",
        default="today,launcher,flowerwaits,device",
        help="comma-separated: today, launcher, flowerwaits, device (needs --device-venv); default: all",
    )
    parser.add_argument("--reference", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reference is not None:
        print(json.dumps(reference_compute(json.loads(args.reference))))
        return 0
    models = args.models.split(",")
    if unknown := [m for m in models if m not in MODELS]:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    device_bin = args.device_venv.resolve() / "bin" if args.device_venv else None
    if device_bin is not None and not (device_bin / "python").exists():
        parser.error(f"--device-venv {args.device_venv}: no bin/python there")
    setups: list[tuple[str, Path | None, Path]] = [
        ("today", None, args.before_app.resolve()),
        ("launcher", None, APP_DIR),
        ("launcher, Flower's waits", None, APP_DIR),
    ]
    if device_bin is not None:
        setups.append(("launcher, device env", device_bin, APP_DIR))
    chosen = set(args.setups.split(","))
    setups = [s for s in setups if _key(s[0]) in chosen]
    results = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-device-"))  # kept if a run fails: its logs are there
    data_root = write_mnist_like(tmp / "mnist") if "cnn" in models else None
    for model in models:
        extra = {**MODELS[model], **({"data-root": str(data_root)} if model == "cnn" else {})}
        for setup, bin_dir, app in setups:
            work = tmp / f"{model}-{_key(setup)}"
            settings = {
                **node_settings(1),
                "num-rounds": args.rounds,
                "eval-every": args.eval_every,
                **extra,
                "out-dir": str(work / "run"),
            }
            print(f"{model} / {setup}: {args.rounds} rounds in {work} ...", file=sys.stderr, flush=True)
            figures = measure(setup, settings, app, bin_dir, work)
            python = str(bin_dir / "python") if bin_dir is not None else sys.executable
            figures.update(_reference(python, {k: v for k, v in settings.items() if k != "out-dir"}))
            print(f"  {json.dumps(figures)}", file=sys.stderr, flush=True)
            results.append((model, setup, figures))
    shutil.rmtree(tmp)
    _print_table(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
