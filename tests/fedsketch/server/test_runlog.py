"""A run's output files (``fedsketch/server/runlog.py``): where they go and what they hold.

A run folder is named by experiment, strategy, sweep point and seed; ``metrics.jsonl`` keeps every
appended row in order, each holding what the model scored and the bytes and counts since the previous
row (which add up to the totals); the status files say how the run stopped, and read back as written.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from fedsketch.config import RunConfig
from fedsketch.server import runlog
from fedsketch.server.books import COUNTERS, Books


def cfg(**settings: object) -> RunConfig:
    return RunConfig.from_mapping({"out-dir": "/results", **settings})


@pytest.mark.parametrize(
    ("experiment", "seed", "folder"),
    [
        ("mnist", 0, "/results/mnist/fedavg"),
        ("mnist", 3, "/results/mnist/fedavg/seed3"),
        ("sweep/rows3-cols5000", 0, "/results/sweep/fedavg/rows3-cols5000"),
        ("sweep/rows3-cols5000", 2, "/results/sweep/fedavg/rows3-cols5000/seed2"),
    ],
)
def test_a_run_folder_is_named_by_experiment_strategy_point_and_seed(experiment: str, seed: int, folder: str) -> None:
    run = cfg(experiment=experiment, seed=seed, strategy="fedavg")
    assert runlog.run_dir(run) == Path(folder)
    assert runlog.experiment_dir(run) == Path("/results") / experiment.split("/")[0]
    assert runlog.experiment_name(run) + (runlog.POINT_SEP + runlog.sweep_point(run) if "/" in experiment else "") == (
        experiment
    )
    assert runlog.sweep_point(run) == experiment.partition("/")[2]


def test_the_config_is_written_whole_and_reads_back(tmp_path: Path) -> None:
    run = cfg(seed=4, strategy="fedavg")
    folder = tmp_path / "a" / "b"
    runlog.write_config(run, folder)
    text = (folder / "config.json").read_text(encoding="utf-8")
    assert RunConfig.from_mapping(json.loads(text)) == run
    assert text == json.dumps(run.to_mapping(), indent=2, sort_keys=True) + "\n"
    runlog.write_config(dataclasses.replace(run, seed=5), folder)  # a second write replaces it
    assert json.loads((folder / "config.json").read_text())["seed"] == 5
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]  # no temporary file left


def test_rows_append_in_order_to_their_own_log_and_read_back(tmp_path: Path) -> None:
    assert runlog.read_metrics(tmp_path) == [] and runlog.read_metrics(tmp_path, runlog.ROUNDS) == []
    rows = [{"round": r, "b": [r, "x"], "a": r / 3} for r in (1, 2, 5)]
    for row in rows:
        runlog.append_metrics(tmp_path, row)
    runlog.append_metrics(tmp_path, {"round": 9}, runlog.ROUNDS)
    assert runlog.read_metrics(tmp_path) == rows
    assert runlog.read_metrics(tmp_path, runlog.ROUNDS) == [{"round": 9}]
    lines = (tmp_path / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    assert lines[0] == json.dumps(rows[0], sort_keys=True)
    with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write("\n  \n")  # blank lines, as an interrupted writer may leave, are no rows
    assert runlog.read_metrics(tmp_path) == rows


def books_with(counts: dict[str, int], later: dict[str, int], loss: float) -> Books:
    """Books that counted ``counts``, began a new row, then counted ``later``."""
    return dataclasses.replace(Books().add(counts).next_row().add(later), last_loss=loss)


@pytest.mark.parametrize("diagnose", [False, True])
def test_a_metrics_row_holds_what_the_model_scored_and_the_counts_since_the_last_row(diagnose: bool) -> None:
    run = cfg(strategy="fetchsgd", seed=7, **{"diagnose-sketch": diagnose})
    first = {key: 10 * (i + 1) for i, key in enumerate(COUNTERS)}
    later = {key: i + 1 for i, key in enumerate(COUNTERS)}
    before = time.time()
    row = runlog.metrics_row(run, 12, 0.625, 1.75, books_with(first, later, 0.5), 3.14159)
    assert (row["round"], row["strategy"], row["seed"]) == (12, "fetchsgd", 7)
    assert (row["test_accuracy"], row["test_loss"], row["train_loss"], row["wall_s"]) == (0.625, 1.75, 0.5, 3.142)
    assert before - 0.01 <= row["unix_time"] <= time.time() + 0.01
    since = {"upload": "upload_bytes", "download": "download_bytes", "dense": "dense_upload_bytes"}
    since |= {"download_sent": "download_sent_bytes", **{key: key for key in runlog.ROW_COUNTS}}
    totals = {
        "upload": "cum_upload_bytes",
        "download": "cum_download_bytes",
        "dense": "cum_dense_upload_bytes",
        "download_sent": "cum_download_sent_bytes",
    }
    if diagnose:
        since["diagnostic"], totals["diagnostic"] = "diagnostic_bytes", "cum_diagnostic_bytes"
    assert {key: row[name] for key, name in since.items()} == {key: later[key] for key in since}
    assert {key: row[name] for key, name in totals.items()} == {key: first[key] + later[key] for key in totals}
    scored = {"round", "strategy", "seed", "test_accuracy", "test_loss", "train_loss", "wall_s", "unix_time"}
    assert set(row) == scored | set(since.values()) | set(totals.values())


def test_a_stopped_run_says_after_which_round(tmp_path: Path) -> None:
    assert runlog.read_status(tmp_path) is None
    empty = runlog.write_status(tmp_path, "skipped", "on request", 9)
    assert (empty["round"], runlog.status_note(empty)) == (0, "skipped (on request) after round 0 of 9")
    for rnd in (2, 4):
        runlog.append_metrics(tmp_path, {"round": rnd})
    status = runlog.write_status(tmp_path, "interrupted", "SIGINT", 50)
    assert runlog.read_status(tmp_path) == status
    assert {k: status[k] for k in ("state", "cause", "round", "num-rounds")} == {
        "state": "interrupted",
        "cause": "SIGINT",
        "round": 4,
        "num-rounds": 50,
    }
    assert abs(status["unix-time"] - time.time()) < 5
    assert runlog.status_note(status) == "interrupted (SIGINT) after round 4 of 50"
    assert not list(tmp_path.glob("*.tmp"))


def test_a_resumed_run_says_after_which_round(tmp_path: Path) -> None:
    assert runlog.resumed_after(tmp_path) is None
    runlog.mark_resumed(tmp_path, 6)
    assert runlog.resumed_after(tmp_path) == 6
    assert abs(json.loads((tmp_path / runlog.RESUMED).read_text())["unix-time"] - time.time()) < 5
    for text in ("not json", '{"at": 6}'):
        (tmp_path / runlog.RESUMED).write_text(text)
        assert runlog.resumed_after(tmp_path) is None


def test_a_finished_server_says_its_last_round_and_why_its_model_is_broken(tmp_path: Path) -> None:
    assert not runlog.server_done(tmp_path) and runlog.broken(tmp_path) is None
    runlog.mark_server_done(tmp_path, 8)
    done = json.loads((tmp_path / runlog.SERVER_DONE).read_text())
    assert runlog.server_done(tmp_path) and runlog.broken(tmp_path) is None
    assert (done["round"], done["num-rounds"], "broken" in done) == (0, 8, False)
    assert abs(done["unix-time"] - time.time()) < 5
    runlog.append_metrics(tmp_path, {"round": 3})
    runlog.mark_server_done(tmp_path, 8, "the loss is NaN")
    assert runlog.broken(tmp_path) == "the loss is NaN"
    assert json.loads((tmp_path / runlog.SERVER_DONE).read_text())["round"] == 3
    (tmp_path / runlog.SERVER_DONE).write_text("{cut short")
    assert runlog.broken(tmp_path) is None


def test_clearing_forgets_every_mark_and_nothing_else(tmp_path: Path) -> None:
    runlog.clear_status(tmp_path)  # nothing to clear is fine
    runlog.append_metrics(tmp_path, {"round": 1})
    runlog.write_status(tmp_path, "interrupted", "SIGTERM", 3)
    runlog.mark_resumed(tmp_path, 1)
    runlog.mark_server_done(tmp_path, 3)
    runlog.clear_status(tmp_path)
    assert runlog.read_status(tmp_path) is None and runlog.resumed_after(tmp_path) is None
    assert not runlog.server_done(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_rows_and_marks_are_stamped_to_the_millisecond(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: 1764321234.123456)
    row = runlog.metrics_row(cfg(), 1, 0.5, 1.0, Books(), 2.0004)
    assert (row["wall_s"], row["unix_time"]) == (2.0, 1764321234.123)
    assert runlog.write_status(tmp_path, "interrupted", "SIGINT", 3)["unix-time"] == 1764321234.123456


def ordered_keys(text: str) -> list[list[str]]:
    """The keys of every JSON object in ``text`` (one object, or one per line), in the order written."""
    found: list[list[str]] = []
    for line in [text] if text.startswith("{\n") else text.splitlines():
        json.loads(line, object_pairs_hook=lambda pairs: found.append([k for k, _ in pairs]) or dict(pairs))
    return found


def test_every_file_a_run_writes_is_ascii_json_with_sorted_keys(tmp_path: Path) -> None:
    """Files that diff line by line between runs, and read back the same whatever the locale's encoding."""
    runlog.write_config(cfg(**{"data-root": "/données/ünï"}), tmp_path)
    runlog.append_metrics(tmp_path, {"round": 1, "strategy": "fedavg", "note": "α → ω"})
    runlog.write_status(tmp_path, "interrupted", "arrêt", 3)
    runlog.mark_resumed(tmp_path, 1)
    runlog.mark_server_done(tmp_path, 3, "la perte est « NaN »")
    names = ["config.json", "metrics.jsonl", runlog.STATUS, runlog.RESUMED, runlog.SERVER_DONE]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)
    for name in names:
        text = (tmp_path / name).read_bytes().decode("ascii")
        assert text.endswith("\n") and all(keys == sorted(keys) for keys in ordered_keys(text)), name
    for name in ("config.json", runlog.STATUS):  # the two a user opens: one key a line
        text = (tmp_path / name).read_text()
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n", name
    assert runlog.broken(tmp_path) == "la perte est « NaN »" and runlog.read_status(tmp_path)["cause"] == "arrêt"
    assert runlog.read_metrics(tmp_path)[0]["note"] == "α → ω"
