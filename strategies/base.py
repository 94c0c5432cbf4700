"""The round loop every fedsketch strategy shares.

A strategy holds the global model and one explicit algorithm state; each
method supplies only its payload layout and its ``apply`` step (the math lives
in ``fedsketch``). The loop replaces ``Strategy.start`` so that rounds can wait
for nodes, sample a fixed number of logical clients, evaluate on the server,
and write ``metrics.jsonl`` as they go. Around each method's step: replies are
validated (:mod:`strategies.replies`), clipped or noised
(:mod:`strategies.guard`), or summed under SecAgg+ (:mod:`strategies.secure`);
a round that is short of replies or not finite is not applied; and the server
side is checkpointed and resumed (:mod:`strategies.resume`).
"""

from __future__ import annotations

import secrets
import time
from abc import abstractmethod
from collections.abc import Callable, Iterable
from logging import INFO, WARNING
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from torch import nn

from fedsketch import download, runlog, schedule, wire
from fedsketch.config import RunConfig
from fedsketch.evaluate import evaluate
from fedsketch.flat import get_flat, set_flat
from strategies.guard import all_finite, clip_updates, noisy_mean, payload_norm, privacy_metrics, scale_payload
from strategies.limits import ReplyLimits, spec_bytes
from strategies.records import model_record, payload_to_record, wire_bytes
from strategies.replies import ClientUpdate, PayloadCheck, PayloadSpec, RoundReplies, collect
from strategies.resume import Resumable
from strategies.sampling import assign_cohorts, assign_homes, sample_clients, wait_for_nodes
from strategies.secure import SecureRounds

COUNTERS = (
    "upload", "download", "dense", "clients", "failures", "timeouts", "client_errors", "rejected", "skipped_rounds",
    "clipped", "sparse_downloads", "diagnostic",
)  # fmt: skip
"""Totals kept over the run; metrics rows report each since the previous row."""


class FedSketchStrategy(Resumable, SecureRounds, Strategy):
    """Base class: sampling, messaging, byte accounting, evaluation, logging.

    Parameters
    ----------
    cfg
        The run's configuration.
    model
        The global model (updated in place every round).
    test_x, test_y
        Held-out data for server-side evaluation.
    out_dir
        Where ``metrics.jsonl`` and ``config.json`` go; ``None`` writes nothing.
    """

    state: Any  # the method's explicit algorithm state (an immutable value), set by each subclass

    def __init__(
        self, cfg: RunConfig, model: nn.Module, test_x: torch.Tensor, test_y: torch.Tensor, out_dir: Path | None = None
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.weights = get_flat(model)
        self.d = self.weights.numel()
        self.test_x, self.test_y = test_x, test_y
        self.out_dir = out_dir
        self.history: list[dict[str, Any]] = []
        self._sent: dict[int, list[int]] = {}
        self._homes: dict[int, int] = {}  # cid -> the node that keeps its state (stateful methods)
        self._node_cid: dict[int, int] = {}  # node -> its own client, learned from replies (node mode)
        self._grid: Grid | None = None  # the current round's, for a second exchange
        self.current_round = 0
        self._totals = dict.fromkeys(COUNTERS, 0)
        self._since_row = dict(self._totals)
        self._dense_bytes = wire_bytes(payload_to_record({"update": np.zeros(self.d, np.float32)}))
        self._last_loss = float("nan")
        self._echo: dict[str, Any] = {}  # what this round's replies must repeat (see wire.ECHO_KEYS)
        # A gradient covers one local batch; a delta covers the client's data (the server
        # app narrows this to the largest partition it knows).
        self.max_examples = cfg.local_batch_size if cfg.client_update == "gradient" else 2**31 - 1
        self._dp_rounds = 0  # rounds whose noisy sum was released (the privacy budget counts them)
        self._noise = torch.Generator()
        self._noise.manual_seed(secrets.randbits(63))  # never the run seed: see strategies/guard.py
        # download = "sparse": the round that last changed each coordinate, the round each client last synced
        self._changed_at = torch.zeros(self.d if cfg.download == "sparse" else 0, dtype=torch.int32)
        self._synced: dict[int, int] = {}

    # ------------------------------------------------------------ per method
    @abstractmethod
    def payload_spec(self) -> PayloadSpec | PayloadCheck:
        """Names, shapes and dtypes of the arrays each client must upload, or a decoder that checks them."""

    @abstractmethod
    def apply(self, server_round: int, updates: list[ClientUpdate], weights: torch.Tensor) -> torch.Tensor:
        """Fold one round's accepted updates into the algorithm state; return ``Delta`` (``w -= Delta``)."""

    def round_config(self, server_round: int) -> dict[str, Any]:
        """Extra per-round keys clients need (e.g. the sketch's shape and seed)."""
        return {}

    def diagnostic_spec(self) -> PayloadSpec | None:
        """The diagnostic arrays each client must add beside its payload (``diagnose-sketch``), or ``None``."""
        return None

    def keeps_client_state(self) -> bool:
        """Whether clients keep state between rounds (then a client always goes to the same node)."""
        return False

    def request_payloads(self, server_round: int, cids: list[int]) -> dict[int, dict[str, np.ndarray]]:
        """Arrays to send to single clients this round (counted in their download)."""
        return {}

    def round_metrics(self) -> dict[str, float]:
        """Method-specific figures for the next metrics row (since the previous row)."""
        return {}

    def update_norm(self, u: ClientUpdate) -> float:
        """The norm that ``clip-norm`` bounds: the decoded vector's if there is one, else the payload's."""
        if isinstance(u.decoded, torch.Tensor):
            return float(torch.linalg.vector_norm(u.decoded.double()))
        return payload_norm(u)

    def sensitivity_scale(self) -> float:
        """An upload's Frobenius norm per unit of the update's norm (``sqrt(rows)`` for a sketch)."""
        return 1.0

    def lr_at(self, server_round: int) -> float:
        """This round's server learning rate (see :mod:`fedsketch.schedule`)."""
        return schedule.lr_at(self.cfg.lr_schedule, self.cfg.lr, server_round, self.cfg.num_rounds)

    # ---------------------------------------------------------- Flower API
    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Sample logical clients, spread them over nodes, build one message per node."""
        base = self._plan_round(server_round, config, grid)
        self._count_download(arrays, base)
        messages = []
        for node, cids in self._sent.items():
            content = RecordDict({wire.MODEL_KEY: arrays, wire.CONFIG_KEY: ConfigRecord({**base, wire.CIDS: cids})})
            messages.append(Message(content=content, message_type=MessageType.TRAIN, dst_node_id=node))
        self._attach_requests(server_round, messages)
        return messages

    def _plan_round(self, server_round: int, config: ConfigRecord, grid: Grid) -> dict[str, Any]:
        """Sample this round's clients and assign them to nodes (``self._sent``); returns the round's config."""
        self._grid, self.current_round = grid, server_round
        nodes = wait_for_nodes(grid, self.cfg.min_nodes, self.cfg.round_timeout)
        if self.cfg.client_assignment == "cohort":
            cids = sample_clients(self.cfg.seed, server_round, self.cfg.num_clients, self.cfg.clients_per_round)
            if self.keeps_client_state():
                self._sent, self._homes, lost = assign_homes(cids, nodes, self._homes)
                if lost:
                    log(WARNING, "round %d: clients %s lost their node and start without state", server_round, lost)
            else:
                self._sent = assign_cohorts(cids, nodes)
        else:  # one client per node, whose data is the node's own
            rng = np.random.default_rng([self.cfg.seed, server_round])
            # Sample positions, not ids: node ids are uint64 and a numpy array of
            # them may turn into float64 and lose digits.
            chosen = rng.choice(len(nodes), size=min(self.cfg.clients_per_round, len(nodes)), replace=False)
            self._sent = {nodes[int(i)]: [] for i in sorted(chosen)}
        base = {**dict(config), **self.round_config(server_round), wire.ROUND: server_round}
        self._echo = {key: value for key, value in base.items() if key in wire.ECHO_KEYS}
        base[wire.LR] = self.lr_at(server_round)
        return base

    def exchange(
        self, server_round: int, updates: list[ClientUpdate], query: dict[str, np.ndarray],
        config: dict[str, Any], spec: PayloadSpec | PayloadCheck,
    ) -> RoundReplies:  # fmt: skip
        """A second request and reply within the round, to the clients of ``updates`` (Sketched-SGD).

        Every client is charged the query and config it receives and the reply
        it sends, as in the first exchange; failures count as such.
        """
        if self._grid is None:
            raise RuntimeError("exchange() needs the round's grid: call it from apply() during a round")
        wanted = {u.cid for u in updates}
        if self.cfg.client_assignment == "cohort":
            sent = {node: [c for c in cids if c in wanted] for node, cids in self._sent.items()}
            sent = {node: cids for node, cids in sent.items() if cids}
        else:  # one client per node: it names itself
            sent = {u.node: [] for u in updates}
        record = payload_to_record(query)
        base = {**config, wire.ROUND: server_round, wire.PHASE: 2}
        per_client = wire_bytes(record) + wire_bytes(ConfigRecord({**base, wire.CIDS: [0]}))
        self._add("download", per_client * len(wanted))
        messages = [
            Message(
                content=RecordDict({wire.QUERY_KEY: record, wire.CONFIG_KEY: ConfigRecord({**base, wire.CIDS: cids})}),
                message_type=MessageType.TRAIN,
                dst_node_id=node,
            )
            for node, cids in sent.items()
        ]
        replies = self._grid.send_and_receive(messages, timeout=self.cfg.round_timeout)
        got = collect(replies, sent, spec, self.reply_limits(spec, {}))
        self._add("upload", got.upload_bytes)
        self._count_failures(got)
        return got

    def reply_limits(self, spec: PayloadSpec | PayloadCheck, echo: dict[str, Any]) -> ReplyLimits:
        """What one client's reply may be: exact layouts bound their own size; decoders get twice dense."""
        if callable(spec):
            max_bytes, max_arrays = 2 * self._dense_bytes + 2**16, 16
        else:
            max_bytes, max_arrays = spec_bytes(list(spec.values())), len(spec)
        return ReplyLimits(self.max_examples, max_bytes, max_arrays, echo, self.cfg.num_clients)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Validate replies, apply the method's step if enough clients answered."""
        spec = self.payload_spec()
        got = collect(replies, self._sent, spec, self.reply_limits(spec, self._echo), self.diagnostic_spec())
        self._node_cid.update({u.node: u.cid for u in got.updates})
        self._add("upload", got.upload_bytes)
        self._add("diagnostic", got.diagnostic_bytes)
        self._count_failures(got)
        self._add("clients", len(got.updates))
        self._add("dense", self._dense_bytes * len(got.updates))
        return self._finish_round(server_round, got, self._guard, len(got.updates))

    def _finish_round(
        self, server_round: int, got: RoundReplies, guard: Callable[[list[ClientUpdate]], list[ClientUpdate]],
        contributors: int,
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:  # fmt: skip
        """Apply the round's accepted updates unless too few clients contributed or the result is not finite."""
        if contributors < self.cfg.min_replies:
            why = f"{contributors} valid replies < min-replies {self.cfg.min_replies}"
            return self._skip(server_round, got, why, contributors)
        updates = guard(got.updates)
        before = getattr(self, "state", None)  # states are immutable values: keeping the reference is a snapshot
        delta = self.apply(server_round, updates, self.weights)
        if not all_finite(delta) or not all_finite(getattr(self, "state", None)):
            self.state = before
            why = "the update is not finite (huge client values?); state rolled back"
            return self._skip(server_round, got, why, contributors)
        before, self.weights = self.weights, self.weights - delta
        set_flat(self.model, self.weights)
        if self.cfg.download == "sparse":
            download.record_update(self._ledger(), server_round, before, self.weights)
        losses = [u.loss for u in got.updates if u.loss == u.loss]
        self._last_loss = float(np.mean(losses)) if losses else float("nan")
        self._round_done(server_round, got, None, contributors)
        return model_record(self.weights.cpu().numpy()), MetricRecord({"train-loss": self._last_loss})

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
        log(INFO, "%s: d=%d, %d of %d clients a round, %d rounds", type(self).__name__, self.d,
            self.cfg.clients_per_round, self.cfg.num_clients, self.cfg.num_rounds)  # fmt: skip

    # ------------------------------------------------------------ the loop
    def start(  # type: ignore[override]
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
            self.weights = torch.as_tensor(initial_arrays[wire.WEIGHTS].numpy()).to(self.weights.device)
            set_flat(self.model, self.weights)
        num_rounds = num_rounds if num_rounds is not None else self.cfg.num_rounds
        self.summary()
        if self.out_dir is not None:
            runlog.write_config(self.cfg, self.out_dir)
        first, spent = self._resume()
        start = time.perf_counter() - spent
        for rnd in range(first, num_rounds + 1):
            if self.cfg.secure_aggregation:
                self._secure_round(rnd, grid, train_config or ConfigRecord())
            else:
                arrays = model_record(self.weights.cpu().numpy())
                messages = self.configure_train(rnd, arrays, train_config or ConfigRecord(), grid)
                replies = grid.send_and_receive(messages, timeout=timeout or self.cfg.round_timeout)
                self.aggregate_train(rnd, replies)
            if rnd % self.cfg.eval_every == 0 or rnd == num_rounds:
                self._log_row(rnd, time.perf_counter() - start)
            self._checkpoint(rnd, num_rounds, time.perf_counter() - start)
        result = Result()
        result.arrays = model_record(self.weights.cpu().numpy())
        return result

    # ------------------------------------------------------------- helpers
    def _add(self, key: str, amount: int) -> None:
        self._totals[key] += amount
        self._since_row[key] += amount

    def _guard(self, updates: list[ClientUpdate]) -> list[ClientUpdate]:
        """Clipping, or clipping and noise on the sum (see :mod:`strategies.guard`)."""
        cfg = self.cfg
        if cfg.dp_noise_multiplier > 0:
            self._dp_rounds += 1
            bound = cfg.clip_norm * self.sensitivity_scale()
            self._add("clipped", sum(payload_norm(u) > bound for u in updates))
            return [noisy_mean(updates, bound, cfg.dp_noise_multiplier, cfg.clients_per_round, self._noise)]
        if cfg.clip_norm > 0:
            updates, clipped = clip_updates(updates, cfg.clip_norm, self.update_norm, scale_payload)
            self._add("clipped", clipped)
        return updates

    def _count_failures(self, got: RoundReplies) -> None:
        self._add("failures", got.failed)
        self._add("timeouts", got.timeouts)
        self._add("client_errors", got.errors)
        self._add("rejected", got.rejected)

    def _skip(self, server_round: int, got: RoundReplies, why: str, contributors: int) -> tuple[None, MetricRecord]:
        """A round whose update is not applied: the model and the method's state stay as they were."""
        log(WARNING, "round %d not applied: %s", server_round, why)
        self._add("skipped_rounds", 1)
        self._round_done(server_round, got, why, contributors)
        return None, MetricRecord({"clients": contributors, "failures": got.failed})

    def _round_done(self, server_round: int, got: RoundReplies, skipped: str | None, contributors: int) -> None:
        """One line per round in ``rounds.jsonl``: who answered, who failed and how, whether it was applied."""
        if self.cfg.download == "sparse":  # an accepted reply shows the client got this round's model
            download.mark_synced(self._ledger(), [u.cid for u in got.updates], server_round)
        if self.out_dir is None:
            return
        row = {"round": server_round, "sampled": sum(max(1, len(c)) for c in self._sent.values()),
               "clients": contributors, "timeouts": got.timeouts, "client_errors": got.errors,
               "rejected": got.rejected, "applied": skipped is None, "reason": skipped or ""}  # fmt: skip
        runlog.append_metrics(self.out_dir, row, runlog.ROUNDS)

    def _attach_requests(self, server_round: int, messages: list[Message]) -> None:
        """Add each client's own arrays (:meth:`request_payloads`) to its node's message, and count them."""
        targets = {}
        for msg in messages:
            node, cids = msg.metadata.dst_node_id, self._sent[msg.metadata.dst_node_id]
            # In node mode a node's client is known once it has replied.
            targets[node] = cids if cids or node not in self._node_cid else [self._node_cid[node]]
        wanted = [cid for cids in targets.values() for cid in cids]
        extras = {cid: payload_to_record(p) for cid, p in self.request_payloads(server_round, wanted).items()}
        self._add("download", sum(wire_bytes(record) for record in extras.values()))
        for msg in messages:
            for cid in targets[msg.metadata.dst_node_id]:
                if cid in extras:
                    msg.content[wire.request_key(cid)] = extras[cid]

    def _count_download(self, arrays: ArrayRecord, base: dict[str, Any]) -> None:
        """Each logical client is charged what a message to it alone would carry.

        With ``download = "sparse"`` that is, for a client that has taken part
        before, the smaller of the dense model and the serialized catch-up
        payload (:mod:`fedsketch.download`) under the same record name.
        """
        config_bytes = wire_bytes(ConfigRecord({**base, wire.CIDS: [0]}))
        dense = wire_bytes(arrays)
        cids = [cid for cids in self._sent.values() for cid in cids]
        if self.cfg.download != "sparse" or not cids:
            self._add("download", (dense + config_bytes) * sum(max(1, len(c)) for c in self._sent.values()))
            return
        for cid in cids:
            payload = download.catch_up(self._ledger(), cid, self.current_round, self.weights)
            sparse = wire_bytes(payload_to_record(payload)) if payload is not None else dense + 1
            self._add("download", min(dense, sparse) + config_bytes)
            self._add("sparse_downloads", int(sparse < dense))

    def _ledger(self) -> download.DownloadLedger:
        """A view of the download bookkeeping (the strategy's own tensor and dict, so checkpoints keep them)."""
        return download.DownloadLedger(self._changed_at, self._synced)

    def _diagnostic_bytes(self) -> dict[str, int]:
        """With ``diagnose-sketch``: bytes clients handed over for the diagnostic only (never in upload_bytes)."""
        if not self.cfg.diagnose_sketch:
            return {}
        return {"diagnostic_bytes": self._since_row["diagnostic"], "cum_diagnostic_bytes": self._totals["diagnostic"]}

    def _log_row(self, server_round: int, wall_s: float) -> None:
        acc, loss = evaluate(self.model, self.test_x, self.test_y)
        row = {
            "round": server_round, "strategy": self.cfg.strategy, "seed": self.cfg.seed,
            "test_accuracy": acc, "test_loss": loss, "train_loss": self._last_loss,
            "upload_bytes": self._since_row["upload"], "download_bytes": self._since_row["download"],
            "dense_upload_bytes": self._since_row["dense"],
            "cum_upload_bytes": self._totals["upload"], "cum_download_bytes": self._totals["download"],
            "cum_dense_upload_bytes": self._totals["dense"],
            "clients": self._since_row["clients"], "failures": self._since_row["failures"],
            "timeouts": self._since_row["timeouts"], "client_errors": self._since_row["client_errors"],
            "rejected": self._since_row["rejected"], "skipped_rounds": self._since_row["skipped_rounds"],
            "clipped": self._since_row["clipped"], "sparse_downloads": self._since_row["sparse_downloads"],
            **privacy_metrics(self.cfg, self._dp_rounds), **self._diagnostic_bytes(),
            "wall_s": round(wall_s, 3), "unix_time": round(time.time(), 3),
            **self.round_metrics(),
        }  # fmt: skip
        self._since_row = dict.fromkeys(self._totals, 0)
        self.history.append(row)
        log(INFO, "round %d: accuracy %.4f, loss %.4f, up %d B, down %d B",
            server_round, acc, loss, row["cum_upload_bytes"], row["cum_download_bytes"])  # fmt: skip
        if self.out_dir is not None:
            runlog.append_metrics(self.out_dir, row)
