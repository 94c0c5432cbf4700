"""Where a deployed round's time goes: the SuperNode's log lines against the server's own round records.

One real SuperLink and one SuperNode under :mod:`bridge.runtime.launcher` on loopback
(:class:`experiments.deployment.deploy.LocalFederation`), a few rounds of FetchSGD (Rothchild
et al., ICML 2020) with ``flwr run``. Per round: the wait until the SuperNode
picks the round's message up (from the end of the server's previous evaluation
to the SuperNode's "Receiving" line), the device's part ("Receiving" to "Sent
successfully"), from the reply to the server's round end (the reply's pull and
the server's step: ``rounds.jsonl``), the server's evaluation (``metrics.jsonl``, 0 in rounds without one)
and the server's whole round. A log line's time is when the sampler read it
(every 20 ms, later on a busy machine).

    python -m experiments.bench.round_timeline [--model mlp|cnn] [--rounds 5] [--eval-every 1]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from experiments.bench.bench_device import APP_DIR, MODELS, _toml, write_mnist_like
from experiments.bench.device_sampler import DeviceSampler
from experiments.deployment.deploy import Deployment, LocalFederation, node_settings


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _times(path: Path) -> list[float]:
    return [float(row["unix_time"]) for row in _rows(path)]


def timeline(model: str, rounds: int, work: Path, eval_every: int = 1) -> list[tuple[float, ...]]:
    """Per round: pick-up wait, device, reply to round end, evaluation, server round (seconds; NaN where none)."""
    extra = dict(MODELS[model])
    if model == "cnn":
        extra["data-root"] = str(write_mnist_like(work / "mnist"))
    settings = {
        **node_settings(1),
        "num-rounds": rounds,
        "eval-every": eval_every,
        **extra,
        "out-dir": str(work / "run"),
    }
    (work / "run").mkdir(parents=True)
    (work / "run_config.toml").write_text(_toml(settings), encoding="utf-8")
    offset = time.time() - time.monotonic()  # the sampler stamps lines on the monotonic clock
    with LocalFederation(Deployment(1, isolation="launcher"), work / "fed", None) as fed:
        sampler = DeviceSampler(fed.procs["supernode-0"].pid, fed.log("supernode-0"))
        sampler.start()
        sampler.wait_for("launcher ready", timeout=120.0)
        time.sleep(1.0)
        code = fed.run(APP_DIR, work / "run_config.toml", work / "flower.log")
        sampler.stop()
    if code != 0:
        raise RuntimeError(f"flwr run failed ({code}); see {work / 'flower.log'}")
    (run,) = list(Path(settings["out-dir"]).glob("*/*/rounds.jsonl"))
    ends = _times(run)
    evals = {int(row["round"]): float(row["unix_time"]) for row in _rows(run.with_name("metrics.jsonl"))}
    done = [evals.get(r + 1, ends[r]) for r in range(rounds)]  # the server is ready for the next round
    recv = [t + offset for t, line in sampler.lines if "Receiving:" in line]
    sent = [t + offset for t, line in sampler.lines if "Sent successfully" in line]
    rows: list[tuple[float, ...]] = []
    for r in range(rounds):
        pick_up, server_round = (recv[r] - done[r - 1], done[r] - done[r - 1]) if r else (math.nan, math.nan)
        rows.append((pick_up, sent[r] - recv[r], ends[r] - sent[r], done[r] - ends[r], server_round))
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the federation and print one row per round."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--eval-every", type=int, default=1, help="the server evaluates every N rounds (default 1)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="round-timeline-"))  # kept if the run fails: its logs are there
    rows = timeline(args.model, args.rounds, work, args.eval_every)
    shutil.rmtree(work)
    print("| round | pick-up wait s | device s | reply to server round end s | server evaluation s | server round s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r, row in enumerate(rows, 1):
        print(f"| {r} | " + " | ".join(f"{x:.2f}" for x in row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
