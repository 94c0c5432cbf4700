"""The bare loop of ``bench_peer --floor`` trains the peer job as fedsketch's FedAvg does.

The reference is fedsketch's own client math (:func:`fedsketch.training.local.local_update` with each
client's generator) and the weighted mean, on a tiny job written as ``bench_peer`` writes its
``.npz``; the script must report the reference's test accuracy and loss after every round.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from fedsketch.model.flat import get_flat, set_flat
from fedsketch.model.models import build_model
from fedsketch.training.local import LocalSpec, client_generator, local_update

SCRIPT = Path(__file__).resolve().parents[3] / "experiments" / "bench" / "peer_floor.py"
CLIENTS, PER_ROUND, ROUNDS, HIDDEN, FEATURES, CLASSES = 12, 5, 3, 8, 6, 3


def _job(path: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 20, CLIENTS)  # some clients below the batch of 8, some above
    owner = np.repeat(np.arange(CLIENTS), sizes)
    rng.shuffle(owner)
    model = build_model("mlp", (FEATURES,), CLASSES, seed=1, hidden=HIDDEN)
    arrays = {
        "x_train": rng.normal(size=(len(owner), FEATURES)).astype(np.float32),
        "y_train": rng.integers(0, CLASSES, len(owner)),
        "x_test": rng.normal(size=(40, FEATURES)).astype(np.float32),
        "y_test": rng.integers(0, CLASSES, 40),
        "client_ids": owner,
        **{f"param_{i:02d}": p.detach().numpy() for i, p in enumerate(model.parameters())},
    }
    with open(path, "wb") as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub reads ** as allow_pickle
    return arrays


def _reference(arrays: dict[str, np.ndarray]) -> tuple[list[float], list[float]]:
    model = build_model("mlp", (FEATURES,), CLASSES, seed=1, hidden=HIDDEN)
    scratch = build_model("mlp", (FEATURES,), CLASSES, seed=1, hidden=HIDDEN)
    x, y = torch.from_numpy(arrays["x_train"]), torch.from_numpy(arrays["y_train"])
    spec = LocalSpec(mode="delta", batch_size=8, steps=2, lr=0.1)
    accuracy, loss = [], []
    for rnd in range(1, ROUNDS + 1):
        w = get_flat(model)
        cids = sorted(int(c) for c in np.random.default_rng([0, rnd]).choice(CLIENTS, PER_ROUND, replace=False))
        idx = [np.flatnonzero(arrays["client_ids"] == c) for c in cids]
        results = [local_update(scratch, w, x[i], y[i], spec, client_generator(0, rnd, c)) for c, i in zip(cids, idx)]
        mean = sum(r.update.double() * r.num_examples for r in results) / sum(r.num_examples for r in results)
        set_flat(model, (w.double() - mean).float())
        with torch.no_grad():
            logits = model(torch.from_numpy(arrays["x_test"]))
            target = torch.from_numpy(arrays["y_test"])
            accuracy.append(int((logits.argmax(1) == target).sum()) / len(target))
            loss.append(float(F.cross_entropy(logits, target)))
    return accuracy, loss


@pytest.mark.slow  # the script in a fresh Python per run
@pytest.mark.parametrize("workers", [1, 2])
def test_the_bare_loop_reports_fedsketchs_fedavg_round_by_round(tmp_path: Path, workers: int) -> None:
    arrays = _job(tmp_path / "job.npz")
    args = ["--rounds", str(ROUNDS), "--per-round", str(PER_ROUND), "--local-steps", "2", "--batch-size", "8"]
    args += ["--hidden", str(HIDDEN), "--workers", str(workers)]
    cmd = [sys.executable, str(SCRIPT), str(tmp_path / "job.npz"), *args]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    accuracy, loss = _reference(arrays)
    assert len(out["round_ends"]) == ROUNDS and out["round_ends"] == sorted(out["round_ends"])
    assert out["accuracy"] == pytest.approx(accuracy, abs=1e-12)
    assert out["loss"] == pytest.approx(loss, rel=1e-5)
