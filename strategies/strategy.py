"""The one Flower strategy: a thin round loop around a method's explicit state transition.

Every method (:mod:`fedsketch.methods`) runs through this class. One round: wait for nodes and
sample logical clients (:mod:`strategies.plan`), send the model and count each client's download
(:mod:`strategies.billing`), validate the replies (:mod:`strategies.replies`), clip or noise them
(:mod:`strategies.guard`), apply the method's ``step`` unless too few clients answered or the
result is not finite, evaluate on the server and append ``metrics.jsonl``. Secure aggregation
(:mod:`strategies.secure`) replaces the exchange and hands back the sum, which
:meth:`FedSketchStrategy.finish_round` applies. Weights, the method's state, the books
(:class:`fedsketch.server.books.Books`), noise and round are one frozen value
(:class:`strategies.values.ServerValues`) that each step replaces, never changes, and that
checkpoints (:mod:`strategies.resume`) save and restore whole; the steps return what they count.
Neither module imports this one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from logging import INFO, WARNING, getLogger
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import nn

from bridge import messages
from fedsketch import wire
from fedsketch.client.uploads import mergeable, set_aside
from fedsketch.config import RunConfig
from fedsketch.methods import ClientUpdate, Round, get_method
from fedsketch.methods.method import Layout, Query, server_step
from fedsketch.model.flat import get_flat, set_flat
from fedsketch.server import runlog, schedule
from fedsketch.server.books import Books
from fedsketch.server.evaluate import evaluate
from fedsketch.server.ledger import forget, mark_synced, record_update
from fedsketch.server.privacy import privacy_metrics
from strategies import billing, guard, plan, records, resume
from strategies.limits import ReplyLimits, for_layout
from strategies.replies import COUNTED_AS, RoundReplies, collect, exchange
from strategies.values import ServerValues

log = getLogger("flwr").log  # Flower's own logger: the lines go where Flower's go (flower.log)

DIVERGED_LOSS = 1e6
"""A test loss above this (the true class's probability below e^-1,000,000 on average) means training diverged:
an untrained model's is about ln(classes), and no run that learns comes near it."""


class FedSketchStrategy(Strategy):
    """Sampling, messaging, byte accounting, evaluation and logging for any registered method.

    Parameters
    ----------
    cfg
        The run's configuration (already validated).
    model
        The global model (updated in place every round).
    test_x, test_y
        Held-out data for server-side evaluation.
    out_dir
        Where ``metrics.jsonl`` and ``config.json`` go; ``None`` writes nothing.
    max_examples
        The largest example count a client may claim (its weight); default: one batch for gradients.
    """

    def __init__(
        self,
        cfg: RunConfig,
        model: nn.Module,
        test_x: torch.Tensor,
        test_y: torch.Tensor,
        out_dir: Path | None = None,
        max_examples: int | None = None,
    ) -> None:
        self.cfg, self.method = cfg, get_method(cfg.strategy)
        self.model = model
        weights = get_flat(model)
        self.d = weights.numel()
        books, noise = Books.start(self.d, cfg.download == "sparse"), guard.noise_generator().get_state()
        self.values = ServerValues(weights, self.method.server.init(cfg, self.d, weights.device), books, noise)
        self.test_x, self.test_y = test_x, test_y
        self.out_dir = out_dir
        self.history: list[dict[str, Any]] = []
        default = cfg.local_batch_size if cfg.client_update == "gradient" else 2**31 - 1
        self.max_examples = max_examples if max_examples is not None else default
        self.dense_bytes = messages.wire_bytes(messages.payload_to_record({"update": np.zeros(self.d, np.float32)}))
        self.plan: plan.RoundPlan | None = None  # the current round's, while it runs
        self.stateful = self.method.client.state_vectors(cfg) > 0  # clients keep state: tell them what was applied
        self.requested: dict[str, int] = {}  # this round's requests: message id -> node (replies.exchange)

    # ---------------------------------------------------------- Flower API
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample logical clients, spread them over nodes, build one message per node and bill it."""
        self.plan = p = self.plan_round(server_round, config, grid)
        self.requested = {}
        targets = p.targets(self.books)
        wanted = [cid for cids in targets.values() for cid in cids]
        extras = {
            c: messages.payload_to_record(x)
            for c, x in self.method.server.requests(self.state, wanted, self.cfg, self.d).items()
        }
        contents, charged = billing.round_requests(
            self.books, self.cfg, p, arrays, self.weights, targets, extras, self.stateful
        )
        self.values = self.values.book(charged)
        return [Message(content=c, message_type=MessageType.TRAIN, dst_node_id=node) for node, c in contents.items()]

    def plan_round(self, server_round: int, config: ConfigRecord, grid: Grid) -> plan.RoundPlan:
        """Wait for nodes, sample this round's clients, assign them to nodes; the round's config."""
        nodes = plan.wait_for_nodes(grid, self.cfg.min_nodes, self.cfg.round_timeout)
        sent, homes = plan.assign(self.cfg, server_round, grid, self.books.homes, self.stateful, nodes)
        missing = plan.missing_nodes(self.cfg, len(nodes), server_round)
        self.values = self.values.book(homes=homes)
        base = {**dict(config), **self.method.wire.round_config(self.cfg), "server-round": server_round}
        echo: dict[str, Any] = dict(self.method.wire.round_config(self.cfg))
        if self.cfg.download == "sparse" and self.cfg.client_assignment == "node":  # a device that caught up
            echo[wire.MODEL_CRC] = messages.model_crc(self.weights.cpu().numpy())  # must have trained on this
        return plan.RoundPlan(server_round, grid, sent, {**base, "lr": self.lr_at(server_round)}, echo, missing)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, apply the method's step if enough clients answered."""
        p = self._current(server_round)
        layout = self.method.wire.layout(self.cfg, self.d, server_round)
        limits = self.reply_limits(layout, p.echo, merged=mergeable(self.cfg))
        got = collect(replies, p.sent, layout, limits, self.method.wire.diagnostic(self.cfg, self.d), self.requested)
        got.updates, aside = set_aside(self.cfg, self.d, got.updates)
        for cid, why in aside.items():
            got.fail(cid, "bounded", why)
            log(WARNING, "client %d %s: %s", cid, COUNTED_AS["bounded"], why)
        node_cid = {**self.books.node_cid, **{u.node: u.cid for u in got.contributors()}}
        self.values = self.values.book(records.round_counts(got, self.dense_bytes), node_cid=node_cid)
        return self.finish_round(server_round, got, len(got.contributors()))

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Evaluation is centralized on the server's held-out set: no client messages."""
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Nothing to aggregate (see :meth:`configure_evaluate`)."""
        return None

    def summary(self) -> None:
        """Log the run's key settings."""
        c = self.cfg
        log(INFO, f"{c.strategy}: d={self.d}, {c.clients_per_round} of {c.num_clients} a round, {c.num_rounds} rounds")

    # ------------------------------------------------------------ the loop
    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | None = None,
        num_rounds: int | None = None,
        timeout: float | None = None,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Run the rounds; the model starts from ``initial_arrays`` if given, else the strategy's own."""
        if initial_arrays is not None:
            self.set_weights(torch.as_tensor(initial_arrays["w"].numpy()).to(self.weights.device))
        num_rounds = num_rounds if num_rounds is not None else self.cfg.num_rounds
        self.summary()
        first, spent = self.resume()  # before config.json is written: a refused resume leaves the folder as it was
        if self.out_dir is not None:
            runlog.write_config(self.cfg, self.out_dir)
        start = time.perf_counter() - spent
        for rnd in range(first, num_rounds + 1):
            self.run_round(rnd, grid, train_config or ConfigRecord(), timeout)
            if rnd % self.cfg.eval_every == 0 or rnd == num_rounds:
                self.log_row(rnd, time.perf_counter() - start)
            resume.checkpoint_round(self.cfg, self.out_dir, num_rounds, time.perf_counter() - start, self.values)
        if self.broken():
            log(WARNING, "%s", self.broken())
        return Result(arrays=messages.model_record(self.weights.cpu().numpy()))

    def broken(self) -> str | None:
        """Why the model the run ends with is of no use (its last test loss not finite, or above
        :data:`DIVERGED_LOSS`); ``None`` if it is of use."""
        if not self.history or self.history[-1]["test_loss"] <= DIVERGED_LOSS:
            return None
        row = self.history[-1]
        return (
            f"the model is broken: its test loss is {row['test_loss']:.3g} at round {row['round']}, "
            f"{row.get('skipped_rounds', 0)} rounds not applied since the row before (see rounds.jsonl)"
            + ("" if self.cfg.norm_bound > 0 else "; with norm-bound = 0 one client's upload can wreck it")
        )

    def run_round(self, server_round: int, grid: Grid, config: ConfigRecord, timeout: float | None = None) -> None:
        """One round's exchange and step, plain or through secure aggregation; no evaluation, no checkpoint."""
        if self.cfg.secure_aggregation:
            self.secure_round(server_round, grid, config)
        else:
            arrays = messages.model_record(self.weights.cpu().numpy())
            requests = list(self.configure_train(server_round, arrays, config, grid))
            replies, self.requested = exchange(grid, requests, timeout or self.cfg.round_timeout)
            self.aggregate_train(server_round, replies)
        self.values = replace(self.values, server_round=server_round)

    def secure_round(self, server_round: int, grid: Grid, config: ConfigRecord) -> None:
        """One round through SecAgg+ (:mod:`strategies.secure`): the sum, already clipped by the nodes, is applied."""
        from strategies import secure  # Flower's legacy API (bridge/legacy.py), for these rounds only

        self.plan = p = self.plan_round(server_round, config, grid)
        layout = self.method.wire.layout(self.cfg, self.d, server_round)
        done = secure.secure_round(
            p, self.weights.cpu().numpy(), layout, self.dense_bytes, self.max_examples, self.cfg.round_timeout
        )
        self.values = self.values.book(done.counts).book(records.failure_counts(done.replies))
        if done.refused:
            self.skip(server_round, done.replies, f"secure aggregation gave no usable sum: {done.refused}", 0)
        else:
            self.finish_round(server_round, done.replies, done.contributors)

    def finish_round(
        self, server_round: int, got: RoundReplies, contributors: int
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Apply the accepted updates unless too few clients contributed or the result is not finite.

        A secure round's one update, the sum, was clipped by the nodes (:mod:`strategies.secure`): it is not
        screened again.
        """
        if contributors < self.cfg.min_replies:
            why = f"{contributors} valid replies < min-replies {self.cfg.min_replies}"
            return self.skip(server_round, got, why, contributors)
        screened = got.updates if self.cfg.secure_aggregation else self.screen(got.updates)
        updates = sorted([*screened, *got.merged], key=lambda u: u.cid)
        self.values = self.values.book({"clipped": got.clipped})  # by the nodes that merged them
        rnd = Round(server_round, self.lr_at(server_round), updates, self.d, self.weights.device)
        state, delta, rnd = server_step(self.method, self.state, rnd, self.cfg, self._ask)
        if not guard.all_finite(delta) or not guard.all_finite(state):
            why = "the update is not finite (huge client values?); state rolled back"
            return self.skip(server_round, got, why, contributors)
        before = self.weights
        self.values = replace(self.values, state=state)
        self.set_weights(self.weights - delta)
        if self.stateful:  # these clients' pending states now count: tell them in their next request
            used = [a.cid for a in rnd.answers] if self.method.client.commit == "answer" else [u.cid for u in updates]
            self.values = self.values.book(applied={**self.books.applied, **dict.fromkeys(used, server_round)})
        if self.cfg.download == "sparse":
            ledger, _ = record_update(self.books.ledger, server_round, before, self.weights)
            self.values = self.values.book(ledger=ledger)
        losses = [u.loss for u in got.contributors() if u.loss == u.loss]
        self.values = self.values.book(last_loss=float(np.mean(losses)) if losses else float("nan"))
        self.round_done(server_round, got, None, contributors)
        return messages.model_record(self.weights.cpu().numpy()), MetricRecord({"train-loss": self.books.last_loss})

    def skip(self, server_round: int, got: RoundReplies, why: str, contributors: int) -> tuple[None, MetricRecord]:
        """A round whose update is not applied: the model and the method's state stay as they were."""
        log(WARNING, "round %d not applied: %s", server_round, why)
        self.values = self.values.book({"skipped_rounds": 1})
        self.round_done(server_round, got, why, contributors)
        return None, MetricRecord({"clients": contributors, "failures": got.failed})

    # ------------------------------------------------------------- the value
    @property
    def weights(self) -> torch.Tensor:
        """The model's flat weights (:class:`ServerValues`)."""
        return self.values.weights

    @property
    def state(self) -> Any:
        """The method's state (:class:`ServerValues`)."""
        return self.values.state

    @property
    def books(self) -> Books:
        """The run's books (:class:`ServerValues`)."""
        return self.values.books

    def resume(self) -> tuple[int, float]:
        """Restore the run's last checkpoint, if any: the first round to run and the time already spent."""
        back = resume.restore(self.cfg, self.out_dir, self.values)
        if back.values is not None:
            self.values = back.values
            set_flat(self.model, back.values.weights)
            self.history = back.history
        return back.first_round, back.elapsed

    def set_weights(self, weights: torch.Tensor) -> None:
        """The new global model (flat weights, written into the module too)."""
        self.values = replace(self.values, weights=weights)
        set_flat(self.model, weights)

    def screen(self, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        """Clip, or clip and noise, the round's updates (:mod:`strategies.guard`), keeping the noise's new state."""
        noise = self.values.generator()
        screened = guard.screen(self.cfg, self.method, noise, self.d, updates)
        self.values = replace(self.values, noise=noise.get_state())
        self.values = self.values.book({"clipped": screened.clipped}, dp_rounds=self.books.dp_rounds + screened.noised)
        return screened.updates

    def lr_at(self, server_round: int) -> float:
        """This round's server learning rate (see :mod:`fedsketch.server.schedule`)."""
        return schedule.lr_at(self.cfg.lr_schedule, self.cfg.lr, server_round, self.cfg.num_rounds)

    def reply_limits(self, layout: Layout, echo: dict[str, Any], merged: bool = False) -> ReplyLimits:
        """What one client's reply may be (:func:`strategies.limits.for_layout`); ``merged``: a node may merge."""
        return for_layout(layout, echo, self.dense_bytes, self.max_examples, self.cfg.num_clients, merged)

    def round_done(self, server_round: int, got: RoundReplies, skipped: str | None, contributors: int) -> None:
        """One line per round in ``rounds.jsonl``: who answered, who failed and how, whether it was applied, and when
        the round ended (before its evaluation, if it has one)."""
        if self.cfg.download == "sparse":  # an accepted reply shows the client got this round's model
            ledger = forget(self.books.ledger, list(got.failures))  # a failed one may not have it
            ledger = mark_synced(ledger, [u.cid for u in got.contributors()], server_round)
            self.values = self.values.book(ledger=ledger)
        if self.out_dir is None or self.plan is None:
            return
        line = records.round_line(server_round, self.plan.sampled(), got, skipped, contributors, self.plan.missing)
        runlog.append_metrics(self.out_dir, line, runlog.ROUNDS)

    def log_row(self, server_round: int, wall_s: float) -> None:
        """Evaluate the model and append one row to ``metrics.jsonl``."""
        acc, loss = evaluate(self.model, self.test_x, self.test_y)
        state, extra = self.method.server.report(self.state, self.cfg)
        self.values = replace(self.values, state=state)
        row = runlog.metrics_row(self.cfg, server_round, acc, loss, self.books, wall_s)
        self.values = replace(self.values, books=self.books.next_row())
        self.history.append({**row, **privacy_metrics(self.cfg, self.books.dp_rounds), **extra})
        log(
            INFO,
            "round %d: accuracy %.4f, loss %.4f, up %d B, down %d B",
            server_round,
            acc,
            loss,
            row["cum_upload_bytes"],
            row["cum_download_bytes"],
        )
        if self.out_dir is not None:
            runlog.append_metrics(self.out_dir, self.history[-1])

    def _current(self, server_round: int) -> plan.RoundPlan:
        if self.plan is None or self.plan.server_round != server_round:
            raise RuntimeError(f"round {server_round} was not configured by this strategy (configure_train first)")
        return self.plan

    def _ask(self, updates: list[ClientUpdate], query: Query) -> list[ClientUpdate]:
        """A second request within the round to the clients of ``updates`` (two-exchange methods), billed both ways."""
        p = self.plan
        if p is None:
            raise RuntimeError("a second exchange needs a round in progress")
        sent, requests, charged = billing.second_exchange(self.cfg, p, updates, query.payload)
        self.values = self.values.book(charged)
        replies, requested = exchange(p.grid, requests, self.cfg.round_timeout)
        got = collect(replies, sent, query.layout, self.reply_limits(query.layout, {}), requested=requested)
        self.values = self.values.book(records.reply_counts(got))
        return got.updates
