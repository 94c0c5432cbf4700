"""The peer side of ``experiments/bench/bench_peer.py``: the same FedAvg job on Apple's pfl-research.

pfl (Granqvist et al., "pfl-research: simulation framework for accelerating
research in Private Federated Learning", NeurIPS 2024 Datasets and Benchmarks)
simulates a round's users one after another inside one process. This script
runs the job that ``bench_peer`` hands it (an ``.npz`` with the data, each
training sample's client and the initial weights) with pfl's own pieces:
``FederatedDataset``, ``SimulatedBackend``, ``FederatedAveraging``,
``PyTorchModel`` with a plain SGD local optimizer and an SGD(lr=1) central
optimizer, ``WeightByDatapoints`` and ``CentralEvaluationCallback``.

To train exactly as fedsketch does (so both must end at the same accuracy),
two choices are fedsketch's, not pfl's defaults, and are written out here:

- the users of round ``r`` are ``numpy.random.default_rng([seed, r])``'s
  ``choice(num_clients, per_round, replace=False)``, sorted
  (``strategies/plan.py``);
- each local step draws its batch of ``batch_size`` samples without
  replacement from the user's data with ``torch.randperm`` on the user's own
  generator, seeded ``(seed * 1_000_003 + r) * 1_000_033 + cid``
  (``fedsketch/training/local.py``); a user with ``batch_size`` samples or fewer uses
  all of them every step.

pfl is not a dependency of fedsketch. It needs Python < 3.13 and runs from its
own virtual environment::

    python3 -m venv /work/pflvenv && /work/pflvenv/bin/pip install "pfl[pytorch]==0.6.0" torch
    /work/pflvenv/bin/python experiments/bench/peer_pfl.py JOB.npz --rounds 30 ...

It prints one JSON object: the Unix time at which each round ended (model
updated and evaluated), and each round's test accuracy and loss.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import torch
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByDatapoints
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.callback.central_evaluation import CentralEvaluationCallback
from pfl.data.dataset import Dataset
from pfl.data.federated_dataset import FederatedDataset
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel
from torch import nn
from torch.nn import functional as F

from experiments.bench import peer_job

EVAL_BATCH = 1024  # fedsketch/server/evaluate.py's batch


class MLP(nn.Module):
    """fedsketch's ``mlp``: flatten, two ReLU layers of ``hidden`` units, a linear output; pfl's loss and metrics."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = True) -> dict[str, Weighted]:
        self.eval() if eval else self.train()
        logits = self(x)
        loss = float(F.cross_entropy(logits, y, reduction="sum"))
        return {"loss": Weighted(loss, len(y)), "accuracy": Weighted(float((logits.argmax(1) == y).sum()), len(y))}


class UserData(Dataset):
    """One user's samples in one round; training batches drawn as fedsketch's clients draw them."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, cid: int, seed_value: int, batch: int, steps: int) -> None:
        super().__init__((x, y), user_id=str(cid))
        self.seed_value, self.batch, self.steps = seed_value, batch, steps

    def iter(self, batch_size: int | None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if batch_size != self.batch:  # evaluation: plain slices
            yield from super().iter(batch_size)
            return
        x, y = self.raw_data
        gen = torch.Generator()
        gen.manual_seed(self.seed_value)
        for _ in range(self.steps):
            if len(x) > self.batch:
                idx = torch.randperm(len(x), generator=gen)[: self.batch]
                yield x[idx], y[idx]
            else:
                yield x, y


class RoundClock(TrainingProcessCallback):
    """Records when each central iteration ended, and the central evaluation's figures."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.accuracy: list[float] = []
        self.loss: list[float] = []

    def after_central_iteration(
        self, aggregate_metrics: Metrics, model: PyTorchModel, *, central_iteration: int
    ) -> tuple[bool, Metrics]:
        self.ends.append(time.time())
        values = {str(name): float(getattr(value, "overall_value", value)) for name, value in aggregate_metrics}
        self.accuracy.append(values.get("Central val | accuracy", float("nan")))
        self.loss.append(values.get("Central val | loss", float("nan")))
        return False, type(aggregate_metrics)()


def schedule(seed: int, rounds: int, num_clients: int, per_round: int) -> list[tuple[int, int]]:
    """Every round's users, in order, as ``(round, cid)``: fedsketch's sampling."""
    return [(rnd, cid) for rnd in range(1, rounds + 1) for cid in peer_job.cohort(seed, rnd, num_clients, per_round)]


def main() -> None:
    args = peer_job.parser(__doc__.splitlines()[0]).parse_args()
    job = peer_job.load(args.job)
    x, y, users = job.x, job.y, job.users
    model = MLP(x.shape[1], args.hidden, job.classes)
    with torch.no_grad():
        for p, value in zip(model.parameters(), job.params, strict=True):
            p.copy_(torch.from_numpy(value))
    plan = iter(schedule(args.seed, args.rounds, len(users), args.per_round))

    def make_user(user: tuple[int, int]) -> UserData:
        rnd, cid = user
        idx = users[cid]
        return UserData(
            x[idx], y[idx], cid, peer_job.client_seed(args.seed, rnd, cid), args.batch_size, args.local_steps
        )

    train = FederatedDataset(make_user, lambda: next(plan))
    central = Dataset((job.x_test, job.y_test))
    pfl_model = PyTorchModel(model, torch.optim.SGD, torch.optim.SGD(model.parameters(), lr=1.0))
    clock = RoundClock()
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=args.rounds,
            evaluation_frequency=args.rounds + 1,
            train_cohort_size=args.per_round,
            val_cohort_size=None,
        ),
        backend=SimulatedBackend(training_data=train, val_data=train, postprocessors=[WeightByDatapoints()]),
        model=pfl_model,
        model_train_params=NNTrainHyperParams(
            local_num_epochs=None,
            local_learning_rate=args.client_lr,
            local_batch_size=args.batch_size,
            local_num_steps=args.local_steps,
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=EVAL_BATCH),
        callbacks=[CentralEvaluationCallback(central, NNEvalHyperParams(local_batch_size=EVAL_BATCH)), clock],
        send_metrics_to_platform=False,
    )
    print(json.dumps({"round_ends": clock.ends, "accuracy": clock.accuracy, "loss": clock.loss}))


if __name__ == "__main__":
    main()
