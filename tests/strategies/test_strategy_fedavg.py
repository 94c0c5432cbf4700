"""``fedavg`` follows Flower's own FedAvg strategy round for round.

FedAvg (McMahan et al., AISTATS 2017) sets the global model to the
example-weighted mean of the clients' trained models. fedsketch's ``fedavg``
uploads each client's model change instead and steps ``w - lr * mean(delta)``
with server momentum; with ``client-update = "delta"``, ``lr = 1`` and no
momentum that is the same model. Here Flower's ``FedAvg`` (its sampling,
messages, weighting and aggregation, unmodified) drives a ClientApp that
trains exactly as fedsketch's clients do (same data, batches and steps: the
same ``local_update`` with each client's own RNG) and returns the trained
model; the test-set curve and the final model must match fedsketch's run.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import FedAvg

from bridge.flower import task_identity
from fedsketch.config import RunConfig
from fedsketch.data.run import load_data
from fedsketch.model.flat import set_flat
from fedsketch.server.evaluate import evaluate
from fedsketch.task import local_spec, make_model
from fedsketch.training.local import client_generator, local_update
from strategies.server_app import build_strategy
from tests.federation import TestGrid

NODES = 4
CFG = RunConfig.from_mapping(
    {
        "strategy": "fedavg",
        "num-clients": NODES,
        "clients-per-round": NODES,
        "num-rounds": 4,
        "eval-every": 1,
        "client-update": "delta",
        "local-steps": 3,
        "client-lr": 0.1,
        "local-batch-size": 32,
        "lr": 1.0,
        "lr-schedule": "constant",
        "momentum": 0.0,
        "model-hidden": 32,
        "k": 100,
    }
)


def model_returning_app(cfg: RunConfig) -> ClientApp:
    """A plain FedAvg ClientApp: train from the received model, return the trained model."""
    data = load_data(cfg)
    scratch = make_model(cfg, data)
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        cid = int(context.node_config["partition-id"])  # one node is one client, as in Flower's examples
        server_round = int(msg.content.config_records["config"]["server-round"])  # type: ignore[arg-type]
        w = torch.from_numpy(msg.content.array_records["arrays"]["w"].numpy())
        x, y = data.client_data(cid)
        result = local_update(scratch, w, x, y, local_spec(cfg), client_generator(cfg.seed, server_round, cid))
        trained = (w - result.update).numpy()
        content = RecordDict(
            {
                "arrays": ArrayRecord({"w": Array(trained)}),
                "metrics": MetricRecord({"num-examples": result.num_examples}),
            }
        )
        return Message(content, reply_to=msg)

    return app


@contextmanager
def flower_samples_in_a_fixed_order() -> Iterator[None]:
    """Flower samples nodes with Python's ``random``, so its sum of the replies runs in another order each time:
    a rounding difference that, once in a while, flips a ReLU and moves a few weights by 2e-4. Seeded here, its
    rounds are the same in every run; the global generator is left as it was."""
    state = random.getstate()
    random.seed(0)
    try:
        yield
    finally:
        random.setstate(state)


def flower_fedavg(cfg: RunConfig, w0: torch.Tensor) -> tuple[list[tuple[float, float]], torch.Tensor]:
    """Test (accuracy, loss) after each round, and the final model, under Flower's FedAvg."""
    data = load_data(cfg)
    model = make_model(cfg, data)
    curve: list[tuple[float, float]] = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        set_flat(model, torch.from_numpy(arrays["w"].numpy()))
        acc, loss = evaluate(model, data.test_x, data.test_y)
        if server_round > 0:  # round 0 is the initial model
            curve.append((acc, loss))
        return MetricRecord({"accuracy": acc, "loss": loss})

    strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=NODES, min_available_nodes=NODES)
    grid = TestGrid(cfg.to_mapping(), num_nodes=NODES, app=model_returning_app(cfg))
    with task_identity(), flower_samples_in_a_fixed_order():
        result = strategy.start(
            grid=grid,  # type: ignore[arg-type]
            initial_arrays=ArrayRecord({"w": Array(w0.numpy())}),
            num_rounds=cfg.num_rounds,
            train_config=ConfigRecord(),
            evaluate_fn=evaluate_fn,
        )
    return curve, torch.from_numpy(result.arrays["w"].numpy())


def test_fedavg_matches_flowers_fedavg_round_for_round(tmp_path: Path) -> None:
    strat = build_strategy(CFG, tmp_path)
    w0 = strat.weights.clone()
    with task_identity():
        strat.start(TestGrid(CFG.to_mapping(), num_nodes=2))
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["clients"] for r in rows] == [NODES] * CFG.num_rounds  # every client, every round, as FedAvg here

    curve, flower_w = flower_fedavg(CFG, w0)
    ours = [(r["test_accuracy"], r["test_loss"]) for r in rows]
    assert len(curve) == len(ours) == CFG.num_rounds
    # Two float32 paths (mean of models, model minus mean change) round differently and the gap
    # compounds over rounds: 2e-7 in the loss here, 1.8e-5 in one CI run (a Flower side whose round-4
    # loss 100 runs here never reproduced). A server step 0.01% short moves the loss 1.2e-4, w 2.1e-4.
    np.testing.assert_allclose(np.array(ours), np.array(curve), rtol=0, atol=1e-4)
    assert ours[-1][1] < ours[0][1] - 0.01  # it trained: the comparison is not between two idle runs
    assert not torch.equal(flower_w, w0)
    # Flower averages the models, fedsketch subtracts the mean change: equal up to rounding.
    torch.testing.assert_close(strat.weights, flower_w, rtol=0, atol=1e-4)
