"""The strategy's checkpoints, without a run: which rounds save, and what a resume gives back or refuses."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from fedsketch.config import RunConfig
from fedsketch.server import checkpoint, runlog
from fedsketch.server.books import Books
from fedsketch.server.checkpoint import CheckpointError
from strategies import resume
from strategies.values import ServerValues

D = 7


def config(every: int) -> RunConfig:
    return RunConfig.from_mapping({"strategy": "fedavg", "checkpoint-every": every, "num-rounds": 5})


def values(server_round: int, seed: int = 0) -> ServerValues:
    """A strategy's values after ``server_round`` (fedavg: its state is its momentum buffer)."""
    gen = torch.Generator().manual_seed(seed)
    books = replace(Books.start(D, sparse_download=False).add({"upload": 100 * server_round + seed}), last_loss=0.5)
    noise = torch.Generator().manual_seed(seed + 1).get_state()
    return ServerValues(torch.randn(D, generator=gen), torch.randn(D, generator=gen), books, noise, server_round)


def saved_round(out: Path, cfg: RunConfig) -> int | None:
    ckpt = checkpoint.load(out, cfg)
    return None if ckpt is None else ckpt.round


@pytest.mark.parametrize(("every", "saved"), [(2, [2, 4, 5]), (3, [3, 5])])
def test_a_checkpoint_is_taken_every_nth_round_and_after_the_last(tmp_path: Path, every: int, saved: list[int]) -> None:
    cfg = config(every)
    taken = []
    for rnd in range(1, 6):
        resume.checkpoint_round(cfg, tmp_path, 5, float(rnd), values(rnd))
        if saved_round(tmp_path, cfg) == rnd:
            taken.append(rnd)
    assert taken == saved


def test_no_checkpoint_without_a_folder_or_with_checkpoints_off(tmp_path: Path) -> None:
    resume.checkpoint_round(config(0), tmp_path, 5, 1.0, values(5))  # even the last round
    resume.checkpoint_round(config(1), None, 5, 1.0, values(5))
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_holds_the_values_the_logs_sizes_and_the_time_spent(tmp_path: Path) -> None:
    cfg = config(2)
    runlog.append_metrics(tmp_path, {"round": 2})
    runlog.append_metrics(tmp_path, {"round": 2}, runlog.ROUNDS)
    saved = values(2, seed=3)
    resume.checkpoint_round(cfg, tmp_path, 5, 12.5, saved)
    ckpt = checkpoint.load(tmp_path, cfg)
    assert ckpt is not None
    assert (ckpt.round, ckpt.elapsed) == (2, 12.5)
    assert torch.equal(ckpt.weights, saved.weights) and torch.equal(ckpt.noise, saved.noise)
    assert ckpt.logs == checkpoint.log_sizes(tmp_path) and min(ckpt.logs.values()) > 0
    books = checkpoint.books_from_tree(saved.books, ckpt.books)
    assert (books.totals, books.last_loss) == (saved.books.totals, saved.books.last_loss)


def test_a_resume_gives_back_what_was_saved_and_rewinds_the_logs_and_generators(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = config(2)
    runlog.append_metrics(tmp_path, {"round": 2, "test_accuracy": 0.5})
    saved = values(2, seed=3)
    torch.manual_seed(11)
    resume.checkpoint_round(cfg, tmp_path, 5, 12.5, saved)
    expected_draw = torch.rand(3)
    runlog.append_metrics(tmp_path, {"round": 3, "test_accuracy": 0.6})  # logged, then lost in a crash
    with caplog.at_level(logging.INFO, logger="flwr"):
        back = resume.restore(cfg, tmp_path, values(0, seed=8))
    assert f"resuming after round 2 from {tmp_path / checkpoint.FILE}" in [r.getMessage() for r in caplog.records]
    assert torch.equal(torch.rand(3), expected_draw)
    assert (back.first_round, back.elapsed) == (3, 12.5)
    assert back.history == [{"round": 2, "test_accuracy": 0.5}]
    assert runlog.read_metrics(tmp_path) == back.history
    assert back.values is not None
    assert torch.equal(back.values.weights, saved.weights) and torch.equal(back.values.state, saved.state)
    assert torch.equal(back.values.noise, saved.noise)
    assert (back.values.books.totals, back.values.books.last_loss) == (saved.books.totals, saved.books.last_loss)
    assert back.values.server_round == 2
    assert runlog.resumed_after(tmp_path) == 2


def test_a_fresh_start_clears_the_rows_of_an_earlier_attempt(tmp_path: Path) -> None:
    for name in checkpoint.LOGS:
        runlog.append_metrics(tmp_path, {"round": 1}, name)
    back = resume.restore(config(0), tmp_path, values(0))
    assert back == resume.Resumed()
    assert (back.first_round, back.elapsed, back.values, back.history) == (1, 0.0, None, [])
    assert all((tmp_path / name).read_text() == "" for name in checkpoint.LOGS)
    assert runlog.resumed_after(tmp_path) is None
    assert resume.restore(config(0), None, values(0)) == resume.Resumed()


def test_a_checkpoint_of_another_model_size_is_refused_before_anything_is_restored(tmp_path: Path) -> None:
    cfg = config(2)
    runlog.append_metrics(tmp_path, {"round": 2})
    resume.checkpoint_round(cfg, tmp_path, 5, 1.0, values(2))
    runlog.append_metrics(tmp_path, {"round": 3})
    bigger = replace(values(0), weights=torch.zeros(D + 1))
    with pytest.raises(CheckpointError, match=f"^checkpoint model has {D} weights; this run's has {D + 1}$"):
        resume.restore(cfg, tmp_path, bigger)
    assert [json.loads(line)["round"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [2, 3]
    assert runlog.resumed_after(tmp_path) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_resume_on_a_gpu_puts_the_saved_weights_and_state_where_the_runs_live(tmp_path: Path) -> None:
    cfg, saved = config(2), values(2, seed=3)
    resume.checkpoint_round(cfg, tmp_path, 5, 12.5, saved)
    fresh = values(0, seed=8)
    back = resume.restore(cfg, tmp_path, replace(fresh, weights=fresh.weights.cuda(), state=fresh.state.cuda()))
    assert back.values is not None and back.values.weights.is_cuda and back.values.state.is_cuda
    assert torch.equal(back.values.weights.cpu(), saved.weights) and torch.equal(back.values.state.cpu(), saved.state)
