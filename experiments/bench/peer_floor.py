"""The floor beside ``experiments/bench/bench_peer.py``: the same FedAvg job as a bare PyTorch loop, no framework.

What any simulator of this job must at least do on the machine: each round, every sampled
client's ``local_steps`` SGD steps on its own batches, the weighted mean of the updates, the
server's step and the evaluation on the held-out set. No messages, no processes beyond one, no
records, no checks. The clients are split over ``--workers`` threads, each with its own scratch
model and one torch thread (the cores' best split for these small matrix products); the
evaluation runs on every core. The clients and batches are those of fedsketch and of
``peer_pfl.py`` (same seeds), so the final accuracy is theirs to rounding.

It prints one JSON object as ``peer_pfl.py`` does: the Unix time each round ended and each
round's test accuracy and loss. ``bench_peer --floor`` runs it beside the others::

    python experiments/bench/peer_floor.py JOB.npz --rounds 30 --workers 2
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import torch
from torch import nn
from torch.nn import functional as F

from experiments.bench import peer_job
from fedsketch.model.models import build_model

EVAL_BATCH = 1024


def train(
    model: nn.Module,
    start: list[torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    args: argparse.Namespace,
    gen_seed: int,
) -> list[torch.Tensor]:
    """One client's local SGD from ``start``; returns its end parameters."""
    with torch.no_grad():
        for p, s in zip(model.parameters(), start, strict=True):
            p.copy_(s)
    gen = torch.Generator()
    gen.manual_seed(gen_seed)
    for _ in range(args.local_steps):
        if len(x) > args.batch_size:
            idx = torch.randperm(len(x), generator=gen)[: args.batch_size]
            xb, yb = x[idx], y[idx]
        else:
            xb, yb = x, y
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(xb), yb).backward()
        with torch.no_grad():
            for p in model.parameters():
                p.sub_(p.grad, alpha=args.client_lr)  # type: ignore[arg-type]  # every parameter has a gradient here
    return [p.detach().clone() for p in model.parameters()]


def main() -> None:
    parser = peer_job.parser(__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="threads the clients are split over")
    args = parser.parse_args()
    job = peer_job.load(args.job)
    x, y, x_test, y_test, users = job.x, job.y, job.x_test, job.y_test, job.users
    model, *scratch = [
        build_model("mlp", (x.shape[1],), job.classes, hidden=args.hidden) for _ in range(args.workers + 1)
    ]
    with torch.no_grad():
        for p, value in zip(model.parameters(), job.params, strict=True):
            p.copy_(torch.from_numpy(value))

    def run_part(part: int, rnd: int, cids: list[int], start: list[torch.Tensor]) -> list[torch.Tensor]:
        torch.set_num_threads(1)  # per thread
        total = [torch.zeros_like(s) for s in start]
        for cid in cids[part :: args.workers]:
            idx = users[cid]
            end = train(scratch[part], start, x[idx], y[idx], args, peer_job.client_seed(args.seed, rnd, cid))
            for t, e in zip(total, end, strict=True):
                t.add_(e, alpha=float(len(idx)))
        return total

    ends, accuracy, loss = [], [], []
    with ThreadPoolExecutor(args.workers) as pool:
        for rnd in range(1, args.rounds + 1):
            cids = peer_job.cohort(args.seed, rnd, len(users), args.per_round)
            start = [p.detach().clone() for p in model.parameters()]
            parts = list(pool.map(partial(run_part, rnd=rnd, cids=cids, start=start), range(args.workers)))
            examples = float(sum(len(users[c]) for c in cids))
            with torch.no_grad():
                for i, p in enumerate(model.parameters()):
                    p.copy_(torch.stack([part[i] for part in parts]).sum(0) / examples)  # server SGD, lr 1: the mean
                model.eval()
                correct, summed = 0, 0.0
                for b in range(0, len(y_test), EVAL_BATCH):
                    logits, target = model(x_test[b : b + EVAL_BATCH]), y_test[b : b + EVAL_BATCH]
                    summed += float(F.cross_entropy(logits, target, reduction="sum"))
                    correct += int((logits.argmax(1) == target).sum())
                model.train()
            ends.append(time.time())
            accuracy.append(correct / len(y_test))
            loss.append(summed / len(y_test))
    print(json.dumps({"round_ends": ends, "accuracy": accuracy, "loss": loss}))


if __name__ == "__main__":
    main()
