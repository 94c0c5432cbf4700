"""``fedsketch plan``: its table's pieces, the regime map's figure, the time-left estimate, and the plan of the
default job against what round 1 of every method bills."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from flwr.serverapp import Grid

from bridge.flower import task_identity
from experiments.analysis.results import format_bytes
from experiments.cli import main as fedsketch_main
from experiments.running import forecast, runner
from experiments.running.forecast import (
    COLUMNS,
    REGIME_COLS_PER_K,
    FirstRound,
    RunForecast,
    download_note,
    first_round,
    larger_note,
    render,
    row,
    secure_note,
    sketch_note,
    table,
    totals_note,
)
from experiments.running.progress import LineProgress, RunWatcher, time_left
from fedsketch.config import RunConfig
from fedsketch.fit import client_state_bytes
from fedsketch.methods import NAMES
from fedsketch.server import runlog
from strategies.server_app import build_strategy
from tests.federation import TestGrid

ROOT = Path(__file__).resolve().parents[3]
DEFAULT = RunConfig.from_mapping({"sketch-rows": 3, "sketch-cols": 9000, "k": 3000, "num-rounds": 250})


def _forecast(strategy: str, first: FirstRound | None = None, settings: dict[str, Any] | None = None) -> RunForecast:
    cfg = RunConfig.from_mapping({"strategy": strategy, **(settings or {})}, base=DEFAULT)
    return RunForecast(cfg, 299_018, first or FirstRound(299_018, 10, 10, 1_086_076, 11_966_650))


# ------------------------------------------------------------------------------------------ the table's pieces
def test_a_client_is_the_mean_of_round_1_and_the_run_is_round_1_times_its_rounds() -> None:
    f = _forecast("fetchsgd", FirstRound(299_018, sampled=10, contributed=8, upload=800, download=10_010))
    assert (f.upload_per_client, f.download_per_client) == (100.0, 1001.0)  # over those who answered / were asked
    assert (f.upload_total, f.download_total) == (800 * 250, 10_010 * 250)


def test_a_row_shows_round_1_to_the_byte_and_a_mean_with_its_decimal() -> None:
    cells = dict(zip(COLUMNS, row(_forecast("fetchsgd")), strict=True))
    assert cells["run"] == "fetchsgd seed 0"
    assert (cells["d"], cells["up/round"], cells["down/round"]) == ("299,018", "1,086,076", "11,966,650")
    assert (cells["up/client"], cells["down/client"]) == ("108,607.6", "1,196,665")
    assert (cells["up (run)"], cells["down (run)"]) == (format_bytes(271_519_000), format_bytes(2_991_662_500))
    assert (cells["cols/k"], cells["client state"]) == ("3.0", "none")


@pytest.mark.parametrize(("strategy", "ratio"), [("fetchsgd", 3.0), ("sketched_sgd", 3.0), ("fedavg", None)])
def test_columns_per_k_only_for_methods_that_sketch(strategy: str, ratio: float | None) -> None:
    assert _forecast(strategy).cols_per_k == ratio


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_client_state_is_the_whole_runs_and_says_where(where: str) -> None:
    f = _forecast("local_topk", settings={"client-state": where})
    state = dict(zip(COLUMNS, row(f), strict=True))["client state"]
    assert state == f"{format_bytes(client_state_bytes(f.cfg, f.d))} {where}"
    assert f.state_bytes == 2 * 4 * 299_018 * 100  # one error vector, committed and pending, for every client
    assert _forecast("fedavg").state_bytes == 0


def test_the_table_is_aligned() -> None:
    forecasts = [_forecast("fetchsgd"), _forecast("local_topk"), _forecast("sketched_sgd", settings={"k": 30})]
    lines = table(forecasts).splitlines()
    cells = [list(re.finditer(r"\S+(?: \S+)*", line)) for line in lines]  # cells are two spaces apart at least
    assert [line[0].group() for line in cells] == ["run", *(runner.describe(f.cfg) for f in forecasts)]
    assert all(line[0].start() == 0 for line in cells)  # names to the left
    header_ends = [c.end() for c in cells[0]]
    for line in cells[1:]:
        assert len(line) == len(COLUMNS)
        assert [c.end() for c in line][1:] == header_ends[1:]  # every figure right-aligned under its header


def test_an_upload_larger_than_the_dense_update_is_told_so() -> None:
    small = _forecast("fetchsgd", FirstRound(4_490, 10, 10, 1_086_076, 185_490))
    small = RunForecast(small.cfg, 4_490, small.first)
    note = larger_note(small)
    assert note is not None and "uploads 6.0x the dense float32 update (17,960 B at d = 4,490)" in note
    assert "(a 3 x 9,000 sketch)" in note
    assert larger_note(_forecast("fetchsgd")) is None  # 108,608 B a client against 1,196,072
    fedavg = _forecast("fedavg").cfg
    at_dense = RunForecast(fedavg, 4_490, FirstRound(4_490, 10, 10, 10 * 18_505, 0))  # 4 d and its records
    assert larger_note(at_dense) is None  # uncompressed training's own upload: nothing to say
    tiny = RunForecast(fedavg, 100, FirstRound(100, 10, 10, 10 * 950, 0))  # 2.4x 4 d, all of it records
    assert larger_note(tiny) is None
    edge = RunForecast(fedavg, 20_000, FirstRound(20_000, 10, 10, 10 * 120_000, 0))  # exactly 1.5 x 4 d
    assert larger_note(edge) is None
    over = RunForecast(fedavg, 20_000, FirstRound(20_000, 10, 10, 10 * 120_001, 0))
    note = larger_note(over)
    assert note is not None and "1.5x" in note and "sketch" not in note  # a method that does not sketch


def test_fetchsgd_below_the_regime_maps_columns_per_k_is_told_so() -> None:
    note = sketch_note(_forecast("fetchsgd"))
    assert note is not None and "cols/k = 3.0" in note and "docs/regime.md" in note and "10 columns per k" in note
    assert sketch_note(_forecast("fetchsgd", settings={"sketch-cols": 30_000})) is None  # 10 per k
    assert sketch_note(_forecast("sketched_sgd")) is None  # the map measured FetchSGD


def _regime_rows() -> list[tuple[float, int, float, float]]:
    """docs/regime.md's dense-model tables: (k as % of d, cols per k, mean recall, gap to true top-k in points)."""
    out = []
    for line in (ROOT / "docs" / "regime.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        share = re.search(r"\((\d+\.\d+)%\)", cells[0])
        if len(cells) == 9 and share and cells[2].isdigit():
            out.append((float(share.group(1)), int(cells[2]), float(cells[4]), float(cells[8])))
    return out


def test_the_figures_the_note_quotes_are_the_regime_maps() -> None:
    rows = _regime_rows()
    assert len(rows) == 18  # three models, two k, three widths
    at_one_percent = [r for r in rows if r[0] > 0.9]
    within_5 = {cols for _, cols, _, gap in at_one_percent if gap >= -5}
    assert min(within_5) == REGIME_COLS_PER_K
    assert all(gap >= -5 for _, cols, _, gap in at_one_percent if cols == REGIME_COLS_PER_K)
    gaps_at_3 = sorted(-gap for _, cols, _, gap in at_one_percent if cols == 3)
    assert (gaps_at_3[0], gaps_at_3[-1]) == (6.2, 12.6)
    assert max(recall for _, _, recall, _ in rows) <= 0.11
    note = sketch_note(_forecast("fetchsgd"))
    assert note is not None and "6.2-12.6 points behind at 3 per k" in note and "at most 11%" in note


def test_a_sparse_download_is_said_to_be_bounded_by_the_dense_column() -> None:
    assert "dense" in download_note([_forecast("fedavg")])
    note = download_note([_forecast("fetchsgd", settings={"download": "sparse"}), _forecast("fedavg")])
    assert "fetchsgd seed 0" in note and "fedavg" not in note and "upper bound" in note


def test_secure_aggregation_is_said_to_bill_by_nodes_and_not_to_the_byte() -> None:
    text = render([_forecast("fetchsgd", settings={"secure-aggregation": True}), _forecast("fedavg")], seconds=1.0)
    note = next(line for line in text.splitlines() if line.startswith("secure aggregation"))
    assert "(fetchsgd seed 0)" in note and "fedavg" not in note and "--supernodes" in text
    assert "secure aggregation" not in render([_forecast("fetchsgd")], seconds=1.0)


def test_the_plan_reads_as_a_table_and_its_notes() -> None:
    text = render([_forecast("fetchsgd"), _forecast("local_topk")], seconds=1.25)
    lines = text.splitlines()
    assert lines[0].startswith("Plan of default: 2 run(s)")
    assert lines[1].split()[:3] == ["run", "d", "up/client"]
    assert "(1.2 s," in text and "round 1 x num-rounds (250)" in text and "client state:" in text
    assert all(len(line) <= 130 for line in lines)


# --------------------------------------------------------------------------------------------- time left
def test_time_left_waits_for_two_rounds_then_follows_their_pace() -> None:
    assert time_left([], 10) is None
    assert time_left([(1, 100.0)], 10) is None  # round 1's own time includes Flower's start-up
    assert time_left([(1, 100.0), (2, 101.0), (3, 104.0)], 10) == pytest.approx(2.0 * 7)
    assert time_left([(1, 100.0), (10, 118.0)], 10) == 0.0


def test_the_progress_line_estimates_from_the_rounds_of_this_watch_only(tmp_path: Path) -> None:
    out = io.StringIO()
    watcher = RunWatcher(LineProgress(out), "fedavg seed 0", tmp_path, num_rounds=100, started=1000.0)
    for rnd, stamp in [(1, 900.0), (2, 1010.0), (3, 1012.0), (4, 1016.0)]:  # round 1: before a resume
        runlog.append_metrics(tmp_path, {"round": rnd, "unix_time": stamp}, runlog.ROUNDS)
    watcher()
    line = out.getvalue().splitlines()[-1]
    assert line.startswith("fedavg seed 0: round 4/100  about 0:04:48 left (estimate)")  # 3 s a round x 96


def test_the_last_round_is_shown_once_evaluated(tmp_path: Path) -> None:
    out = io.StringIO()
    watcher = RunWatcher(LineProgress(out), "fedavg seed 0", tmp_path, num_rounds=1, started=1000.0)
    runlog.append_metrics(tmp_path, {"round": 1, "unix_time": 1001.0}, runlog.ROUNDS)  # ended, not yet evaluated
    watcher()
    assert len(out.getvalue().splitlines()) == 1  # only "starting Flower..."
    runlog.append_metrics(
        tmp_path, {"round": 1, "test_accuracy": 0.5, "cum_upload_bytes": 10, "cum_download_bytes": 20}
    )
    watcher()
    assert out.getvalue().splitlines()[-1].startswith("fedavg seed 0: round 1/1  acc 0.500  up 10 B  down 20 B")


# ------------------------------------------------------------------------------------- the default job, every method
@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """22 small rounds: on a busy 2-core machine two torch threads wait on each other at every small operation
    (this test took 83 s so, 10 s on one thread); the bytes do not depend on it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _round_1_as_a_run_writes_it(cfg: RunConfig) -> dict[str, Any]:
    """``metrics.jsonl``'s row of round 1, written by the run's strategy and ClientApp (num-rounds 1, eval-every 1).

    The in-process grid bills as ``fedsketch run`` does: the same strategy, ClientApp and billing, and
    test_the_plan_equals_a_flower_runs_first_round below checks that against Flower for three methods.
    """
    path = runlog.run_dir(cfg)
    with task_identity():
        build_strategy(cfg, path).start(cast(Grid, TestGrid(cfg.to_mapping(), num_nodes=2)))
    rows = runlog.read_metrics(path)
    assert rows[0]["round"] == 1
    return rows[0]


def _printed_round(printed: str, cfg: RunConfig) -> tuple[int, int]:
    """The up/round and down/round cells of the plan's row for ``cfg``."""
    label = runner.describe(cfg)
    line = next(line for line in printed.splitlines() if line.startswith(label + " "))
    cells = line[len(label) :].split()
    return int(cells[3].replace(",", "")), int(cells[4].replace(",", ""))


@pytest.mark.slow  # a real Flower run through its processes (seconds)
def test_the_plan_of_the_default_job_is_what_round_1_bills_for_every_method(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], one_torch_thread: None
) -> None:
    assert fedsketch_main(["plan", "--strategies", ",".join(NAMES), "--out", str(tmp_path / "plan")]) == 0
    printed = capsys.readouterr().out
    one_round = {"num-rounds": 1, "eval-every": 1, "out-dir": str(tmp_path / "runs")}
    experiment = runner.load_experiment(runner.DEFAULT_CONFIG, one_round, None, list(NAMES))
    assert [cfg.strategy for cfg in experiment.runs] == list(NAMES)
    for cfg in experiment.runs:
        measured = _round_1_as_a_run_writes_it(cfg)
        assert _printed_round(printed, cfg) == (measured["upload_bytes"], measured["download_bytes"]), cfg.strategy


@pytest.mark.slow
def test_the_plan_equals_a_flower_runs_first_round(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_leftover_processes: None
) -> None:
    """Through Flower's simulation: FetchSGD, Gaussian-k (what it sends depends on the gradient) and PowerSGD
    (a request to each client and a second exchange)."""
    strategies = ["fetchsgd", "gaussiank", "powersgd"]
    one_round = ["--set", "num-rounds=1", "--set", "eval-every=1"]
    args = ["--strategies", ",".join(strategies), "--out", str(tmp_path), *one_round]
    assert fedsketch_main(["plan", *args]) == 0
    printed = capsys.readouterr().out
    assert fedsketch_main(["run", *args, "--no-plot"]) == 0
    table_lines = 2 + len(strategies)  # its heading, the header and a row per run, before the notes
    ran = capsys.readouterr().out.splitlines()
    assert ran[:table_lines] == printed.splitlines()[:table_lines]  # `run` prints the same plan first
    settings = {"num-rounds": 1, "eval-every": 1, "out-dir": str(tmp_path)}
    for cfg in runner.load_experiment(runner.DEFAULT_CONFIG, settings, None, strategies).runs:
        first = runlog.read_metrics(runlog.run_dir(cfg))[0]
        assert _printed_round(printed, cfg) == (first["upload_bytes"], first["download_bytes"]), cfg.strategy


# ------------------------------------------------------------------------------------------ the notes' words
def test_the_totals_note_names_every_rounds_count_and_sketched_sgds_positions_only_when_it_runs() -> None:
    runs = [_forecast("fetchsgd"), _forecast("fedavg", settings={"num-rounds": 40}), _forecast("local_topk")]
    assert totals_note(runs) == (
        "up (run), down (run): round 1 x num-rounds (40, 250), an estimate. Later rounds ask other clients, whose "
        "replies differ by a few bytes (their example counts; Gaussian-k's count of values), and from round 64 the "
        "round's number takes a byte more in each client's config."
    )
    assert totals_note([*runs, _forecast("sketched_sgd")]).endswith(
        "config; Sketched-SGD also sends a returning client the positions its last upload helped apply."
    )


def test_the_secure_note_names_the_runs_and_says_the_nodes_decide() -> None:
    assert secure_note(["fetchsgd seed 0", "fedavg seed 1"]) == (
        "secure aggregation (fetchsgd seed 0, fedavg seed 1): the bytes are what SecAgg+'s four stages serialized "
        "between the server and its nodes, each node summing its clients: a client's figure is its share of its "
        "node's, another number of nodes (--supernodes) bills otherwise, and as the stages name the nodes, whose ids "
        "Flower draws at random, a run's round differs by a few hundred bytes."
    )


# ------------------------------------------------------------------------------------------ round 1, run here
SMALL = {"num-clients": 6, "clients-per-round": 4, "model-hidden": 8, "k": 20, "sketch-cols": 200, "seed": 3}


def test_round_1_asks_the_rounds_clients_and_a_node_per_client_when_each_has_its_own() -> None:
    for assignment in ("cohort", "node"):
        cfg = RunConfig.from_mapping({**SMALL, "client-assignment": assignment, "min-nodes": 1})
        first = first_round(cfg, nodes=2)
        assert (first.sampled, first.contributed) == (4, 4), assignment
        assert first.upload > 0 and first.download > 0


def test_round_1_runs_on_the_nodes_the_plan_is_told_or_one_per_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """The nodes decide a secure aggregation's bytes (:func:`secure_note`): the plan's round runs on those asked."""
    from experiments.running import inprocess_grid

    cfg = RunConfig.from_mapping({**SMALL, "secure-aggregation": True, "min-nodes": 2})
    asked: list[int] = []

    class Counting(inprocess_grid.InProcessGrid):
        def __init__(self, run_config: dict[str, Any], num_nodes: int = 2, **kwargs: Any) -> None:
            asked.append(num_nodes)
            super().__init__(run_config, num_nodes, **kwargs)

    monkeypatch.setattr(inprocess_grid, "InProcessGrid", Counting)
    runs, seconds = forecast.forecast([cfg, RunConfig.from_mapping(SMALL)], nodes=3)
    node_cfg = RunConfig.from_mapping({**SMALL, "client-assignment": "node"})
    forecast.forecast_run(node_cfg, nodes=3)
    assert asked == [3, 3, 6]  # the nodes asked for; one per client with client-assignment = "node"
    small = RunConfig.from_mapping(SMALL)
    forecast.first_round(small)
    forecast.forecast_run(small)
    forecast.forecast([small])
    assert asked[3:] == [2, 2, 2]  # two unless told (a simulation's default --supernodes)
    assert [f.cfg for f in runs] == [cfg, RunConfig.from_mapping(SMALL)]
    assert 0.0 < seconds < 600.0


def test_the_notes_say_where_the_figures_come_from_what_state_is_kept_and_who_did_not_answer() -> None:
    full = _forecast("fetchsgd", FirstRound(299_018, 10, 10, 1, 1))
    short = _forecast("local_topk", FirstRound(299_018, 10, 7, 1, 1), {"seed": 2})
    lines = forecast.notes([full, short], seconds=2.5)
    assert lines[0] == (
        "Round 1 of each run, run in this process (2.5 s, each sampled client's own update, no Flower process, no "
        "evaluation) and billed by the run's own code: up/round and down/round are its upload_bytes and "
        "download_bytes to the byte; up/client is their mean over the clients that answered, down/client over "
        "those asked."
    )
    assert lines[1] == totals_note([full, short]) and lines[2] == download_note([full, short])
    assert lines[-2:] == [
        (
            "client state: at its largest, once every client has taken part (its committed and pending vectors, "
            "fedsketch/fit.py), where client-state keeps it."
        ),
        "local_topk seed 2: only 7 of 10 clients answered round 1",
    ]
    alone = forecast.notes([full], 1.0)  # fetchsgd keeps no client state, and every client answered
    assert not any(line.startswith("client state:") or "answered round 1" in line for line in alone)


def test_the_plan_names_its_experiments_and_wraps_its_notes_at_the_width_with_an_indent() -> None:
    runs = [_forecast("fetchsgd"), _forecast("fedavg", settings={"experiment": "other"})]
    text = render(runs, seconds=1.0, width=60)
    head, *rest = text.splitlines()
    assert head.startswith("Plan of default, other: 2 run(s); bytes billed in round 1")
    notes = rest[len(table(runs).splitlines()) :]
    assert notes[0].startswith("Round 1 of each run") and all(len(line) <= 60 for line in notes)
    assert notes[1].startswith("  ") and all(not line.startswith("   ") for line in notes)
    assert render(runs, seconds=1.0) == render(runs, seconds=1.0, width=110) != render(runs, seconds=1.0, width=111)


def test_the_download_note_says_how_each_kind_of_download_is_billed() -> None:
    assert download_note([_forecast("fetchsgd")]) == (
        "download = dense: every sampled client is billed the whole model every round."
    )
    sparse = [_forecast("fetchsgd", settings={"download": "sparse"}), _forecast("fedavg")]
    sparse.append(_forecast("local_topk", settings={"download": "sparse", "seed": 1}))
    assert download_note(sparse) == (
        "download = sparse (fetchsgd seed 0, local_topk seed 1): a returning client is billed only the coordinates "
        "changed since it last took part, which training decides. Round 1 is dense (no client has the model yet), "
        "and so is the down (run) column: an upper bound on the model's part of the download."
    )


def test_a_method_that_does_not_sketch_has_no_columns_per_k_and_no_sketch_in_its_notes() -> None:
    f = _forecast("fedavg")
    assert dict(zip(COLUMNS, row(f), strict=True))["cols/k"] == "-"
    over = RunForecast(f.cfg, 20_000, FirstRound(20_000, 10, 10, 10 * 120_001, 0))
    assert larger_note(over) == (
        "fedavg seed 0: a client uploads 1.5x the dense float32 update (80,000 B at d = 20,000): at this model "
        "size it sends more than uncompressed training."
    )
    note = sketch_note(_forecast("fetchsgd"))
    assert note is not None and note.startswith("fetchsgd seed 0")
