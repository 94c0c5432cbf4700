"""What an experiment will send before it is run: bytes per client and per round, the runs' totals.

FetchSGD (Rothchild et al., ICML 2020) and its baselines are compared by accuracy against bytes
sent; this module says what each run of an experiment will send before any Flower process starts.
Each run's first round runs once, in this process, through the real strategy and the real
ClientApp (:mod:`experiments.running.inprocess_grid`: each sampled client's update as the run computes it, no
Flower process, and no evaluation of the model, which bills nothing), and
every byte is billed by the run's own code (:mod:`strategies.billing`, :mod:`strategies.replies`),
so a run's first round bills exactly these figures (secure aggregation aside, :func:`secure_note`):
what a client uploads depends on its data
(its example count travels in its reply; Gaussian-k's count of values), and only the real round
knows it. The run's totals are that round times the number of rounds: an estimate, as later
rounds sample other clients and carry their own round number. Beside the bytes: the model's size
(as the round's own strategy built it), FetchSGD's sketch columns per k against the regime map
(docs/regime.md), and the clients' kept state (:func:`fedsketch.fit.client_state_bytes`).
"""

from __future__ import annotations

import logging
import textwrap
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from experiments.analysis.results import format_bytes
from experiments.running.runner import describe
from fedsketch import sketch_regime
from fedsketch.server.runlog import experiment_name

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

REGIME_COLS_PER_K = sketch_regime.COLS_PER_K
"""docs/regime.md's columns per k for FetchSGD (:mod:`fedsketch.sketch.count_sketch.regime`, where the map's figures live)."""
BYTE_COLUMNS = ("up/client", "down/client", "up/round", "down/round", "up (run)", "down (run)")
COLUMNS = ("run", "d", *BYTE_COLUMNS, "cols/k", "client state")


@dataclass(frozen=True)
class FirstRound:
    """What a run's first round billed, summed over its clients (its ``upload_bytes`` and ``download_bytes``)."""

    d: int  # the model's parameters, as the strategy built it
    sampled: int  # clients asked
    contributed: int  # clients whose replies were accepted
    upload: int
    download: int


@dataclass(frozen=True)
class RunForecast:
    """One run: its settings, the model's size and what its first round billed."""

    cfg: RunConfig
    d: int
    first: FirstRound

    @property
    def upload_per_client(self) -> float:
        """Round 1's upload over the clients whose replies it took (both exchanges, where there are two)."""
        return self.first.upload / self.first.contributed if self.first.contributed else 0.0

    @property
    def download_per_client(self) -> float:
        """Round 1's download over the clients it asked."""
        return self.first.download / self.first.sampled if self.first.sampled else 0.0

    @property
    def upload_total(self) -> int:
        """The run's upload if every round bills like its first."""
        return self.first.upload * self.cfg.num_rounds

    @property
    def download_total(self) -> int:
        """The run's download if every round bills like its first (dense: see :func:`notes` for sparse)."""
        return self.first.download * self.cfg.num_rounds

    @property
    def cols_per_k(self) -> float | None:
        """Sketch columns per coordinate applied a round, for methods that sketch; ``None`` otherwise."""
        from fedsketch.methods import get_method

        return self.cfg.sketch_cols / self.cfg.k if get_method(self.cfg.strategy).reads("sketch-cols") else None

    @property
    def state_bytes(self) -> int:
        """The clients' kept state at its largest over the run (every client has taken part)."""
        from fedsketch.fit import client_state_bytes

        return client_state_bytes(self.cfg, self.d)


@contextmanager
def _quiet_flower() -> Iterator[None]:
    """Keep the round's INFO lines (the strategy's summary, its metrics row) out of the plan; warnings still show."""
    logger = logging.getLogger("flwr")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def first_round(cfg: RunConfig, nodes: int = 2) -> FirstRound:
    """Run round 1 of ``cfg`` in this process (real strategy, real ClientApp, no Flower process, no evaluation); what
    it billed.

    ``nodes``: the simulated nodes the run will have (``--supernodes``). A client is billed alike on any
    number of them except under secure aggregation, whose bytes are the nodes' (:func:`secure_note`);
    with one client per node (``client-assignment = "node"``) every client is a node. The round's
    clients keep their state in memory whatever ``client-state`` says, with no limit (the run's was
    checked by :func:`experiments.running.preflight.check_runs`): they are one round's clients, and where a
    client keeps its state changes nothing it sends. Nothing is written to disk.
    """
    from flwr.app import ConfigRecord
    from flwr.serverapp import Grid

    from bridge.flower import task_identity
    from experiments.running.inprocess_grid import InProcessGrid
    from fedsketch.config import RunConfig
    from strategies.server_app import build_strategy

    dry = RunConfig.from_mapping({"client-state": "memory", "max-client-state-mb": 2**40}, base=cfg)
    nodes = dry.num_clients if dry.client_assignment == "node" else max(nodes, dry.min_nodes)
    strat = build_strategy(dry, None)
    with task_identity(), _quiet_flower():
        strat.run_round(1, cast(Grid, InProcessGrid(dry.to_mapping(), num_nodes=nodes)), ConfigRecord())
    totals = strat.books.totals
    sampled = strat.plan.sampled() if strat.plan is not None else 0
    return FirstRound(strat.d, sampled, totals["clients"], totals["upload"], totals["download"])


def forecast_run(cfg: RunConfig, nodes: int = 2) -> RunForecast:
    """One run's forecast; ``d`` is the model the round's strategy built (the run's own model, user-built too)."""
    first = first_round(cfg, nodes)
    return RunForecast(cfg, first.d, first)


def forecast(runs: Sequence[RunConfig], nodes: int = 2) -> tuple[list[RunForecast], float]:
    """Every run's forecast on ``nodes`` simulated nodes, and the seconds it took."""
    start = time.perf_counter()
    out = [forecast_run(cfg, nodes) for cfg in runs]
    return out, time.perf_counter() - start


def _amount(x: float) -> str:
    """An exact byte count with thousands separators; a mean keeps one decimal when it is not whole."""
    return f"{int(x):,}" if float(x).is_integer() else f"{x:,.1f}"


def _state(f: RunForecast) -> str:
    return f"{format_bytes(f.state_bytes)} {f.cfg.client_state}" if f.state_bytes else "none"


def row(f: RunForecast) -> list[str]:
    """One run's cells, in the order of :data:`COLUMNS`."""
    ratio = f.cols_per_k
    return [
        describe(f.cfg),
        f"{f.d:,}",
        _amount(f.upload_per_client),
        _amount(f.download_per_client),
        f"{f.first.upload:,}",
        f"{f.first.download:,}",
        format_bytes(f.upload_total),
        format_bytes(f.download_total),
        f"{ratio:.1f}" if ratio is not None else "-",
        _state(f),
    ]


def table(forecasts: Sequence[RunForecast]) -> str:
    """The aligned table: the run's name on the left, every figure right-aligned."""
    rows = [list(COLUMNS), *(row(f) for f in forecasts)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True)))
        for r in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def sketch_note(f: RunForecast) -> str | None:
    """The regime map's word on FetchSGD's sketch width, for a run below it; ``None`` otherwise."""
    return sketch_regime.cols_note(f.cfg, describe(f.cfg))


LARGER_RATIO = 1.5
LARGER_MARGIN_B = 4096
"""A client's upload is called larger than the dense float32 update (4 d bytes) above both 1.5 times it and
4 KiB more: below that, a message's own records (keys, example counts: about 550 bytes) make even
uncompressed training's upload a little larger than 4 d at a small d."""


def larger_note(f: RunForecast) -> str | None:
    """For a run whose client uploads clearly more than the dense float32 update: compression that costs here."""
    dense = 4 * f.d
    if f.upload_per_client <= max(LARGER_RATIO * dense, dense + LARGER_MARGIN_B):
        return None
    shape = f" (a {f.cfg.sketch_rows} x {f.cfg.sketch_cols:,} sketch)" if f.cols_per_k is not None else ""
    return (
        f"{describe(f.cfg)}: a client uploads {f.upload_per_client / dense:.1f}x the dense float32 update "
        f"({dense:,} B at d = {f.d:,}){shape}: at this model size it sends more than uncompressed training."
    )


def download_note(forecasts: Sequence[RunForecast]) -> str:
    """How the download is billed, and so what the runs' download column means."""
    sparse = [describe(f.cfg) for f in forecasts if f.cfg.download == "sparse"]
    if not sparse:
        return "download = dense: every sampled client is billed the whole model every round."
    return (
        f"download = sparse ({', '.join(sparse)}): a returning client is billed only the coordinates changed since it "
        "last took part, which training decides. Round 1 is dense (no client has the model yet), and so is the "
        "down (run) column: an upper bound on the model's part of the download."
    )


def totals_note(forecasts: Sequence[RunForecast]) -> str:
    """What the runs' totals assume."""
    rounds = ", ".join(str(n) for n in sorted({f.cfg.num_rounds for f in forecasts}))
    extra = (
        "; Sketched-SGD also sends a returning client the positions its last upload helped apply"
        if any(f.cfg.strategy == "sketched_sgd" for f in forecasts)
        else ""
    )
    return (
        f"up (run), down (run): round 1 x num-rounds ({rounds}), an estimate. Later rounds ask other clients, whose "
        "replies differ by a few bytes (their example counts; Gaussian-k's count of values), and from round 64 the "
        f"round's number takes a byte more in each client's config{extra}."
    )


def secure_note(labels: Sequence[str]) -> str:
    """What a client's bytes are under secure aggregation."""
    return (
        f"secure aggregation ({', '.join(labels)}): the bytes are what SecAgg+'s four stages serialized between the "
        "server and its nodes, each node summing its clients: a client's figure is its share of its node's, another "
        "number of nodes (--supernodes) bills otherwise, and as the stages name the nodes, whose ids Flower draws at "
        "random, a run's round differs by a few hundred bytes."
    )


def source_note(seconds: float) -> str:
    """Where the figures come from, and what each column is."""
    return (
        f"Round 1 of each run, run in this process ({seconds:.1f} s, each sampled client's own update, no Flower "
        "process, no evaluation) and billed by the run's own code: up/round and down/round are its upload_bytes "
        "and download_bytes to the byte; up/client is their mean over the clients that answered, down/client over "
        "those asked."
    )


def notes(forecasts: Sequence[RunForecast], seconds: float) -> list[str]:
    """The lines under the table: where the figures come from, what the totals assume, the regime map's word."""
    lines = [source_note(seconds), totals_note(forecasts), download_note(forecasts)]
    lines += [note for f in forecasts if (note := larger_note(f)) is not None]
    lines += [note for f in forecasts if (note := sketch_note(f)) is not None]
    secure = [describe(f.cfg) for f in forecasts if f.cfg.secure_aggregation]
    if secure:
        lines.append(secure_note(secure))
    if any(f.state_bytes for f in forecasts):
        lines.append(
            "client state: at its largest, once every client has taken part (its committed and pending "
            "vectors, fedsketch/fit.py), where client-state keeps it."
        )
    lines += [
        f"{describe(f.cfg)}: only {f.first.contributed} of {f.first.sampled} clients answered round 1"
        for f in forecasts
        if f.first.contributed < f.first.sampled
    ]
    return lines


def render(forecasts: Sequence[RunForecast], seconds: float, width: int = 110) -> str:
    """The plan as ``fedsketch plan`` prints it, and ``fedsketch run`` before its first run."""
    names = ", ".join(sorted({experiment_name(f.cfg) for f in forecasts}))
    head = f"Plan of {names}: {len(forecasts)} run(s); bytes billed in round 1, a client and a round, and over each run"
    wrapped = [textwrap.fill(note, width, subsequent_indent="  ") for note in notes(forecasts, seconds)]
    return "\n".join([head, table(forecasts), *wrapped])
