"""fedsketch against its fastest peer, pfl-research, on one FedAvg job: time, start-up and memory.

The job (issue 17): 1,000 clients of fedsketch's generated data (Synthetic(0.5,
0.5), one client per generating device), 100 a round, 30 rounds, 5 local SGD
steps of 64 samples at lr 0.1, the default MLP (299,018 parameters), the
server's FedAvg step (lr 1, no momentum), the model evaluated on the held-out
56,281 samples after every round. The data, each sample's client and the
initial weights are built once and written to one ``.npz`` that both sides
read (fedsketch as ``dataset = "npz"``); pfl's side draws the same clients and
the same batches (``experiments/bench/peer_pfl.py``), so both end at the same test
accuracy to a few digits, which is checked.

The two sides run alternately, ``--runs`` times each, in fresh processes:

- ``pfl``: ``peer_pfl.py`` in pfl's own virtual environment (``--pfl-python``);
- ``fedsketch``: the whole command ``python -m experiments.cli run JOB.toml``
  (validation, the Flower simulation, the plots and the report), once per
  ``--supernodes`` value;
- ``fedsketch FetchSGD``: the same command and clients with FetchSGD
  (``--fetchsgd``), against pfl's FedAvg: what the sketch costs;
- ``bare torch loop`` (``--floor``): the job with no framework at all
  (``experiments/bench/peer_floor.py``), what any simulator must at least spend.

For each it prints the median over runs of the seconds a round (median of rounds
2..30), the whole command, the time to the end of round 1 and the peak PSS of the
command's process tree (:mod:`experiments.bench.proctree`), and each run's ratio to
the pfl run beside it (median, range, every one). ``--breakdown`` adds, for the last
run of each side, the PSS of each kind of process at the tree's peak.

pfl is not a dependency of fedsketch; create its environment once (it needs
Python < 3.13) and point ``--pfl-python`` at it::

    python3 -m venv /work/pflvenv && /work/pflvenv/bin/pip install "pfl[pytorch]==0.6.0" torch
    python -m experiments.bench.bench_peer --runs 5 --pfl-python /work/pflvenv/bin/python --breakdown

``--backends inprocess ray``: fedsketch's two simulation backends side by side. ``--baseline DIR``
adds a FedAvg row run from another copy of the code (``git archive REV``), for a change's
before and after in the same runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from experiments.bench.bench_sim import round_times
from experiments.bench.peer_tables import Run, print_breakdown, print_table
from experiments.bench.proctree import TreeSampler, tag_env
from experiments.flower.federation import BACKENDS, RUNTIMES
from fedsketch.config import RunConfig
from fedsketch.server import runlog

APP_DIR = Path(__file__).resolve().parents[2]
PEER_SCRIPT = Path(__file__).resolve().parent / "peer_pfl.py"
FLOOR_SCRIPT = Path(__file__).resolve().parent / "peer_floor.py"
JOB = {
    "num-clients": 1000,
    "clients-per-round": 100,
    "num-rounds": 30,
    "eval-every": 1,
    "seed": 0,
    "model": "mlp",
    "model-hidden": 512,
    "client-update": "delta",
    "local-steps": 5,
    "local-batch-size": 64,
    "client-lr": 0.1,
    "lr": 1.0,
    "momentum": 0.0,
    "lr-schedule": "constant",
}
FETCHSGD = {"sketch-rows": 3, "sketch-cols": 30000, "k": 10000, "momentum": 0.9, "lr": 1.0}
"""FetchSGD's settings on the same clients: a 3 x 30,000 sketch (3.3x smaller than the update), top 10,000."""


def build_job(folder: Path) -> Path:
    """Generate the data once; write it, each training sample's client and the initial weights to one ``.npz``."""
    from fedsketch.data.run import load_data
    from fedsketch.task import make_model

    cfg = RunConfig.from_mapping({**JOB, "dataset": "synthetic", "partition": "natural"})
    data = load_data(cfg)
    owner = np.full(len(data.train_y), -1, dtype=np.int64)
    for cid, idx in enumerate(data.client_indices):
        owner[idx] = cid
    params = {f"param_{i:02d}": p.detach().numpy() for i, p in enumerate(make_model(cfg, data).parameters())}
    path = folder / "job.npz"
    arrays = {
        "x_train": data.train_x.numpy(),
        "y_train": data.train_y.numpy(),
        "x_test": data.test_x.numpy(),
        "y_test": data.test_y.numpy(),
        "client_ids": owner,
        **params,
    }
    with open(path, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub reads ** as allow_pickle
    same = load_data(RunConfig.from_mapping({**JOB, "dataset": "npz", "data-root": str(path), "partition": "natural"}))
    if any(not np.array_equal(a, b) for a, b in zip(same.client_indices, data.client_indices, strict=True)):
        raise RuntimeError("the npz's natural partition differs from the generated one")
    return path


def write_experiment(folder: Path, job: Path, strategy: str) -> Path:
    """The fedsketch experiment file for one side."""
    run = {
        **JOB,
        "experiment": f"peer-{strategy}",
        "dataset": "npz",
        "data-root": str(job),
        "partition": "natural",
        "strategy": strategy,
        **(FETCHSGD if strategy == "fetchsgd" else {}),
    }
    lines = ["[run]"] + [f"{key} = {json.dumps(value)}" for key, value in run.items()]
    path = folder / f"{strategy}.toml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def measure(cmd: list[str], log: Path, cwd: Path = APP_DIR) -> tuple[float, float, TreeSampler]:
    """Run ``cmd`` in ``cwd`` to the end; returns its start (Unix time), its wall seconds and the tree's memory."""
    env, tag = tag_env({**os.environ, "PYTHONPATH": str(cwd)})
    start = time.time()
    with TreeSampler(tag, start=start) as tree, open(log, "wb") as out:
        code = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited with {code}; see {log}")
    return start, time.time() - start, tree


def run_script(python: str, script: Path, job: Path, folder: Path) -> Run:
    """One run of a stand-alone side (pfl's, ``PEER_SCRIPT``; the bare loop, ``FLOOR_SCRIPT``): its own clock."""
    flags = {"--rounds": "num-rounds", "--per-round": "clients-per-round", "--local-steps": "local-steps"}
    flags |= {"--batch-size": "local-batch-size", "--client-lr": "client-lr"}
    cmd = [python, str(script), str(job), *itertools.chain.from_iterable((f, str(JOB[k])) for f, k in flags.items())]
    log = folder / f"{script.stem}.log"
    start, wall, tree = measure(cmd, log)
    out = json.loads(log.read_text().strip().splitlines()[-1])
    return _row(start, wall, tree, out["round_ends"], out["accuracy"][-1])


def run_fedsketch(
    experiment: Path,
    supernodes: int,
    folder: Path,
    checkout: Path = APP_DIR,
    backend: str | None = None,
    runtime: str | None = None,
) -> Run:
    """One whole ``fedsketch run`` of the code in ``checkout``: per-round times from ``metrics.jsonl``."""
    out_dir = folder / "runs"
    cmd = [
        sys.executable,
        "-m",
        "experiments.cli",
        "run",
        str(experiment),
        "--out",
        str(out_dir),
        "--supernodes",
        str(supernodes),
        *(["--backend", backend] if backend else []),
        *(["--runtime", runtime] if runtime else []),
    ]
    start, wall, tree = measure(cmd, folder / "fedsketch.log", checkout)
    strategy = experiment.stem
    rows = runlog.read_metrics(out_dir / f"peer-{strategy}" / strategy)
    if len(rows) != JOB["num-rounds"]:
        raise RuntimeError(f"{len(rows)} metrics rows in {out_dir}; see {folder / 'fedsketch.log'}")
    return _row(start, wall, tree, [float(r["unix_time"]) for r in rows], float(rows[-1]["test_accuracy"]))


def _row(start: float, wall: float, tree: TreeSampler, ends: list[float], accuracy: float) -> Run:
    times = round_times(ends, start)
    return Run(
        round_s=times["round_s"],
        total_s=wall,
        first_round_s=times["first_round_s"],
        peak_mb=tree.peak_mb,
        accuracy=accuracy,
        tree=tree,
    )


def _label(nodes: int, backend: str | None, runtime: str | None) -> str:
    """A fedsketch row's name: its nodes, and its backend and runtime where chosen."""
    return ", ".join([f"{nodes} nodes", *(x for x in (backend, runtime) if x)])


def main() -> None:
    """Build the job, alternate the sides, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pfl-python", default="/work/pflvenv/bin/python", help="python of pfl's environment")
    parser.add_argument("--supernodes", type=int, nargs="+", default=[2], help="one fedsketch row per value")
    parser.add_argument(
        "--backends",
        nargs="+",
        default=[None],
        choices=BACKENDS,
        help="one fedsketch FedAvg row per backend and --supernodes value (default: fedsketch's own "
        "default, inprocess; an older --checkout has no choice)",
    )
    parser.add_argument(
        "--runtimes",
        nargs="+",
        default=[None],
        choices=RUNTIMES,
        help="one fedsketch FedAvg row per runtime too (default: fedsketch's own, process; an older "
        "--checkout has no choice)",
    )
    parser.add_argument("--no-fetchsgd", dest="fetchsgd", action="store_false", help="leave out the FetchSGD row")
    parser.add_argument("--breakdown", action="store_true", help="PSS and first sighting by kind of process")
    parser.add_argument("--floor", action="store_true", help="add the job as a bare torch loop (peer_floor.py)")
    parser.add_argument(
        "--checkout",
        type=Path,
        default=APP_DIR,
        help="run the fedsketch side from this copy of the code (e.g. an earlier commit, for a baseline)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="add a FedAvg row run from this copy of the code (e.g. the commit before a change), beside --checkout's",
    )
    args = parser.parse_args()
    if not Path(args.pfl_python).exists():
        sys.exit(f"no pfl environment at {args.pfl_python}; create it as this module's docstring says")
    with tempfile.TemporaryDirectory(prefix="bench-peer-") as tmp:
        folder = Path(tmp)
        job = build_job(folder)
        sides: dict[str, Callable[[Path], Run]] = {"pfl": partial(run_script, args.pfl_python, PEER_SCRIPT, job)}
        if args.floor:
            sides["bare torch loop"] = partial(run_script, sys.executable, FLOOR_SCRIPT, job)
        fedavg = write_experiment(folder, job, "fedavg")
        for backend, runtime, n in itertools.product(args.backends, args.runtimes, args.supernodes):
            name = f"fedsketch FedAvg ({_label(n, backend, runtime)})"
            sides[name] = partial(run_fedsketch, fedavg, n, checkout=args.checkout, backend=backend, runtime=runtime)
        if args.baseline is not None:
            name = f"fedsketch FedAvg ({_label(args.supernodes[0], None, None)}, baseline)"
            sides[name] = partial(run_fedsketch, fedavg, args.supernodes[0], checkout=args.baseline)
        if args.fetchsgd:
            fetch = write_experiment(folder, job, "fetchsgd")
            n, backend, runtime = args.supernodes[0], args.backends[0], args.runtimes[0]
            name = f"fedsketch FetchSGD ({_label(n, backend, runtime)})"
            sides[name] = partial(run_fedsketch, fetch, n, checkout=args.checkout, backend=backend, runtime=runtime)
        results: dict[str, list[Run]] = {name: [] for name in sides}
        for i in range(args.runs):
            for k, (name, side) in enumerate(sides.items()):
                run_folder = folder / f"run{i}-{k}"
                run_folder.mkdir()
                results[name].append(side(run_folder))
                r = results[name][-1]
                print(
                    f"run {i + 1} {name}: {r['round_s']:.3f} s/round, {r['total_s']:.1f} s, round 1 after "
                    f"{r['first_round_s']:.1f} s, {r['peak_mb']:,.0f} MB, accuracy {r['accuracy']:.4f}",
                    file=sys.stderr,
                    flush=True,
                )
    print(
        f"FedAvg, {JOB['num-clients']:,} clients, {JOB['clients-per-round']} a round, {JOB['num-rounds']} rounds, "
        f"{JOB['local-steps']} local steps; {args.runs} runs each, alternated"
    )
    print_table(results)
    if args.breakdown:
        print_breakdown(results)


if __name__ == "__main__":
    main()
