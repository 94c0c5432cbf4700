"""Large-client simulation: what Flower costs on top of the clients' own work.

For 100 clients a round out of 1,000 and out of 10,000 registered clients,
FetchSGD on the default model, this prints in one table, measured in the same
run (the machines are shared and noisy, so only same-run ratios mean much):

- the per-round wall time through Flower's simulation runtime (median of
  rounds 2..R), and the same rounds (same model, data, client batches, sketches,
  server step and evaluation) in a plain single-process PyTorch loop, and their
  ratio; and, as a reference, the Flower run again with Flower's own 0.1 s
  wait between the ServerApp's looks for replies (``reply-poll-s = 0.1``);
- the time from the start of the launch (SuperLink start included) to the end
  of round 1;
- the peak memory (PSS) of the whole Flower process tree: SuperLink,
  SuperExec, ServerApp, Ray's raylet and GCS and every worker process. They are
  found by the private ``FLWR_HOME`` they all inherit, so ``/usr/bin/time``'s
  driver-only view is not used.

    python -m experiments.bench.bench_sim [--clients 1000 10000] [--rounds 10] [--supernodes 2]

The data pool is fixed (Synthetic with 1,000 generating devices, about 227,000
samples, split IID over the registered clients), so memory differences come
from the number of clients, not from more data.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fedsketch.config import RunConfig

APP_DIR = Path(__file__).resolve().parents[2]
FLOWER_REPLY_POLL_S = 0.1  # InMemoryGrid's own pull_interval


def bench_config(num_clients: int, rounds: int, out_dir: Path) -> RunConfig:
    """The benchmark's run: the default job's FetchSGD settings over ``num_clients``."""
    return RunConfig.from_mapping(
        {
            "experiment": f"bench-{num_clients}",
            "strategy": "fetchsgd",
            "out-dir": str(out_dir),
            "num-clients": num_clients,
            "clients-per-round": 100,
            "num-rounds": rounds,
            "eval-every": 1,
            "synthetic-devices": 1000,
            "partition": "iid",
            "sketch-rows": 3,
            "sketch-cols": 9000,
            "k": 3000,
            "lr": 0.3,
            "error-feedback": "zero-buckets",
        }
    )


# ---------------------------------------------------------------- the plain loop
def plain_loop(cfg: RunConfig, threads: int) -> dict[str, float]:
    """The same rounds in one process, no framework; returns per-round seconds and peak RSS."""
    import resource

    import numpy as np
    import torch

    from fedsketch.client.cohort import run_cohort
    from fedsketch.client.uploads import merge, mergeable
    from fedsketch.data.run import load_data
    from fedsketch.methods import ClientJob, ClientUpdate, Round, get_method
    from fedsketch.model.flat import get_flat, set_flat
    from fedsketch.server.evaluate import evaluate
    from fedsketch.server.schedule import lr_at
    from fedsketch.task import make_model

    torch.set_num_threads(threads)
    start = time.perf_counter()
    data = load_data(cfg)
    model = make_model(cfg, data)
    w = get_flat(model)
    method = get_method(cfg.strategy)
    state = method.server.init(cfg, w.numel(), w.device)
    ends = []  # when each round's update was applied: what rounds.jsonl stamps on the Flower side
    for rnd in range(1, cfg.num_rounds + 1):
        rng = np.random.default_rng([cfg.seed, rnd])  # the strategy's sampling (strategies/sampling.py)
        cids = sorted(int(c) for c in rng.choice(cfg.num_clients, size=cfg.clients_per_round, replace=False))
        outcomes = run_cohort(
            cfg, w.cpu().numpy(), [ClientJob(cid, rnd, method.wire.round_config(cfg)) for cid in cids]
        )
        updates = []
        for o in outcomes:
            assert o.payload is not None, o.error  # the benchmark's clients do not fail
            updates.append(ClientUpdate(o.cid, o.payload, o.num_examples, o.loss, 0))
        if mergeable(cfg):  # as a node does with merge-uploads: one mean of the cohort's uploads
            spec = method.wire.layout(cfg, w.numel(), rnd)
            examples = [u.num_examples for u in updates]
            mean = merge([u.payload for u in updates], examples, spec, w.device)  # type: ignore[arg-type]
            updates = [ClientUpdate(cids[0], mean, sum(examples), 0.0, 0)]
        lr = lr_at(cfg.lr_schedule, cfg.lr, rnd, cfg.num_rounds)
        state, delta = method.server.step(state, Round(rnd, lr, updates, w.numel(), w.device), cfg)
        w = w - delta
        set_flat(model, w)
        ends.append(time.perf_counter())
        if rnd % cfg.eval_every == 0 or rnd == cfg.num_rounds:  # as the strategy evaluates
            evaluate(model, data.test_x, data.test_y)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {**round_times(ends, start), "peak_mb": rss_mb, "total_s": time.perf_counter() - start}


def round_times(ends: list[float], start: float) -> dict[str, float]:
    """Seconds a round (median and mean of rounds 2..R: from one round's end to the next, evaluations included),
    and when round 1 ended, from ``start``."""
    gaps = [b - a for a, b in itertools.pairwise(ends)] or [ends[0] - start]
    return {
        "round_s": statistics.median(gaps),
        "mean_round_s": statistics.fmean(gaps),
        "first_round_s": ends[0] - start,
    }


def run_plain_loop_in_child(cfg: RunConfig, threads: int) -> dict[str, float]:
    """The plain loop in a fresh process, so its memory and start-up are its own.

    ``first_round_s`` counts from the child's start, Python and torch imports included.
    """
    code = (
        "import json, sys; from experiments.bench.bench_sim import plain_loop; from fedsketch.config import RunConfig; "
        "print(json.dumps(plain_loop(RunConfig.from_mapping(json.loads(sys.argv[1])), int(sys.argv[2]))))"
    )
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cfg.to_mapping()), str(threads)],
        cwd=APP_DIR,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    imports_s = time.perf_counter() - t0 - result["total_s"]
    result["first_round_s"] += imports_s
    result["threads"] = threads
    return result


# ----------------------------------------------------------- the Flower run
@dataclass
class TreeMemory:
    """Samples the summed PSS of every process carrying ``FLWR_HOME=home``."""

    home: Path
    peak_mb: float = 0.0
    _stop: bool = False

    def run(self) -> None:
        """Sample every 0.2 s until :meth:`stop`."""
        from experiments.flower.procs import processes_with_env

        while not self._stop:
            total = sum(_pss_kb(pid) for pid in processes_with_env("FLWR_HOME", str(self.home)))
            self.peak_mb = max(self.peak_mb, total / 1024)
            time.sleep(0.2)

    def stop(self) -> None:
        """End sampling."""
        self._stop = True


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def flower_run(cfg: RunConfig, supernodes: int) -> dict[str, float]:
    """One run through ``flwr run`` against a private simulation SuperLink."""
    import torch

    from experiments.flower.federation import Federation, cpus_per_node, gpus_per_node
    from experiments.flower.launch import simulate
    from experiments.running import runner
    from fedsketch.server import runlog

    path = runner.prepare(cfg)
    memory = TreeMemory(path / "flwr-home")
    sampler = threading.Thread(target=memory.run, daemon=True)
    sampler.start()
    t0 = time.time()
    gpus = gpus_per_node(supernodes, None, torch.cuda.device_count())
    federation = Federation(num_supernodes=supernodes, cpus_per_client=cpus_per_node(supernodes), gpus_per_client=gpus)
    code = simulate(APP_DIR, path / "run_config.toml", federation, path)
    memory.stop()
    sampler.join()
    rows = runlog.read_metrics(path, runlog.ROUNDS)
    if code != 0 or len(rows) != cfg.num_rounds:
        raise RuntimeError(f"flwr run failed (exit {code}, {len(rows)} rounds); see {path / 'flower.log'}")
    return {**round_times([float(r["unix_time"]) for r in rows], t0), "peak_mb": memory.peak_mb}


def main() -> None:
    """Run both sides for each client count and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--supernodes", type=int, default=2)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as tmp:
        for n in args.clients:
            cfg = bench_config(n, args.rounds, Path(tmp))
            # The loop's best torch thread count on this machine, 1 or 2, so Flower is not
            # flattered by a loop that oversubscribes the cores.
            loop = min((run_plain_loop_in_child(cfg, t) for t in (1, 2)), key=lambda r: r["round_s"])
            flower = flower_run(cfg, args.supernodes)
            slow_poll = flower_run(dataclasses.replace(cfg, reply_poll_s=FLOWER_REPLY_POLL_S), args.supernodes)
            rows.append((n, loop, flower, slow_poll))
            print(
                f"{n} clients: loop {loop}, flower {flower}, flower polling 0.1 s {slow_poll}",
                file=sys.stderr,
                flush=True,
            )
    print(f"FetchSGD, 100 clients a round, {args.rounds} rounds, {args.supernodes} simulated nodes")
    print(
        "| registered clients | loop s/round (threads) | Flower s/round | ratio | Flower s/round, 0.1 s reply polling "
        "| ratio | Flower round 1 done after | loop round 1 done after | Flower tree peak PSS | loop peak RSS |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n, loop, flower, slow in rows:
        print(
            f"| {n:,} | {loop['round_s']:.3f} ({loop['threads']:.0f}) | {flower['round_s']:.3f} | {flower['round_s'] / loop['round_s']:.2f} "
            f"| {slow['round_s']:.3f} | {slow['round_s'] / loop['round_s']:.2f} "
            f"| {flower['first_round_s']:.1f} s | {loop['first_round_s']:.1f} s | {flower['peak_mb']:,.0f} MB "
            f"| {loop['peak_mb']:,.0f} MB |"
        )
    if len(rows) > 1:
        growth = rows[-1][2]["peak_mb"] / rows[0][2]["peak_mb"] - 1
        print(f"Flower tree memory from {rows[0][0]:,} to {rows[-1][0]:,} clients: {growth:+.1%}")


if __name__ == "__main__":
    main()
