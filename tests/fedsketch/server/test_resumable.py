"""A run's checkpoint is kept: resumed across settings that may change, refused (never deleted) across others."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from experiments.cli import main as fedsketch_main
from experiments.running import runner
from experiments.running.progress import LineProgress, RunWatcher
from fedsketch.config import ConfigError, RunConfig
from fedsketch.server import checkpoint, resumable, runlog

TINY = {"num-rounds": 4, "model-hidden": 8, "sketch-rows": 3, "sketch-cols": 400, "k": 30, "experiment": "keep"}


def _left_mid_way(tmp_path: Path, **changes: object) -> tuple[RunConfig, Path]:
    """A run stopped after round 2 with a checkpoint of it; the same run with ``changes``, and its folder."""
    settings = {**TINY, "out-dir": str(tmp_path), "checkpoint-every": 2}
    cfg = runner.load_experiment(runner.DEFAULT_CONFIG, settings, strategies=["fetchsgd"]).runs[0]  # as the command
    path = runner.prepare(cfg)
    runlog.write_config(cfg, path)
    for rnd in (1, 2):
        runlog.append_metrics(path, {"round": rnd, "strategy": cfg.strategy})
    (path / checkpoint.FILE).write_bytes(b"the server side after round 2")
    return RunConfig.from_mapping(dict(changes), base=cfg), path


@pytest.mark.parametrize("changes", [{"round-timeout": 30.0}, {"eval-every": 2}, {"checkpoint-every": 0}, {}])
def test_settings_that_may_change_keep_the_run_and_its_checkpoint(tmp_path: Path, changes: dict[str, object]) -> None:
    again, path = _left_mid_way(tmp_path, **changes)
    assert runner.check_resumes([again]) == []
    assert runner.is_resumable(again) and runner.prepare(again) == path
    assert (path / checkpoint.FILE).read_bytes() == b"the server side after round 2"
    assert len(runlog.read_metrics(path)) == 2


def test_a_finished_run_is_finished_whatever_its_timeout(tmp_path: Path) -> None:
    again, path = _left_mid_way(tmp_path, **{"round-timeout": 30.0})
    for rnd in (3, 4):
        runlog.append_metrics(path, {"round": rnd, "strategy": again.strategy})
    assert runner.is_finished(again)
    assert not runner.is_finished(RunConfig.from_mapping({"lr": 0.2}, base=again))


def test_another_setting_is_refused_in_one_line_naming_it_and_its_two_values(tmp_path: Path) -> None:
    again, path = _left_mid_way(tmp_path, lr=0.25, **{"round-timeout": 30.0})
    with pytest.raises(ConfigError) as refused:
        runner.check_resumes([again])
    message = str(refused.value)
    assert "\n" not in message and str(path) in message
    assert "'lr' 0.3 -> 0.25" in message and "round-timeout" not in message and "--restart" in message
    with pytest.raises(ConfigError):
        runner.prepare(again)  # not even the run's own start deletes it
    assert (path / checkpoint.FILE).exists() and len(runlog.read_metrics(path)) == 2


def test_restart_deletes_the_checkpoint_only_when_told(tmp_path: Path) -> None:
    again, path = _left_mid_way(tmp_path, lr=0.25)
    assert runner.check_resumes([again], restart=True) == [again]
    assert not path.exists()
    assert not (runner.prepare(again) / checkpoint.FILE).exists()


def test_the_command_refuses_with_exit_code_2_and_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _left_mid_way(tmp_path)
    args = ["run", "--out", str(tmp_path), "--strategies", "fetchsgd", "--no-plot", "--no-plan", "--set", "lr=0.25"]
    for key, value in TINY.items():
        args += ["--set", f"{key}={value}"]
    args += ["--set", "checkpoint-every=2"]
    assert fedsketch_main(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fedsketch: error")]
    assert len(err) == 1 and "holds a checkpoint of a run with other settings ('lr' 0.3 -> 0.25)" in err[0]
    assert (tmp_path / "keep" / "fetchsgd" / checkpoint.FILE).exists()


def test_a_checkpoint_written_before_eval_every_could_change_still_resumes() -> None:
    """A checkpoint's saved fingerprint that still holds ``eval-every`` differs in nothing that counts."""
    cfg = RunConfig.from_mapping(TINY)
    saved = {**checkpoint.fingerprint(cfg), "eval-every": 5}
    assert resumable.differences(saved, cfg.to_mapping()) == []


def test_the_console_says_after_which_round_a_run_resumes(tmp_path: Path) -> None:
    out = io.StringIO()
    watcher = RunWatcher(LineProgress(out), "fetchsgd seed 0", tmp_path, 6)
    watcher()
    runlog.mark_resumed(tmp_path, 4)
    watcher()
    watcher()
    assert out.getvalue().count("fetchsgd seed 0: resuming after round 4") == 1
    runlog.clear_status(tmp_path)
    assert runlog.resumed_after(tmp_path) is None


MAY_CHANGE = [
    "out-dir",
    "checkpoint-every",
    "round-timeout",
    "reply-poll-s",
    "object-retry-s",
    "min-nodes",
    "device",
    "client-state",
    "eval-every",
    "tracking",
]


def test_exactly_the_settings_that_change_no_result_may_differ_and_each_other_is_named_with_both_values() -> None:
    saved = RunConfig.from_mapping({}).to_mapping()
    assert sorted(resumable.RUNTIME_KEYS) == sorted(MAY_CHANGE)
    for key in MAY_CHANGE:
        assert resumable.differences(saved, {**saved, key: "changed"}) == [], key
        assert resumable.differences({**saved, key: "changed"}, saved) == [], key
    assert resumable.fingerprint(saved) == {k: v for k, v in saved.items() if k not in MAY_CHANGE}
    for key, value in saved.items():
        if key not in MAY_CHANGE:
            assert resumable.differences(saved, {**saved, key: "changed"}) == [(key, value, "changed")]


def test_differences_are_sorted_by_setting_and_say_which_side_lacks_one() -> None:
    saved = {"seed": 0, "lr": 0.1, "k": 5, "gone": None, "device": "cpu"}
    current = {"seed": 1, "lr": 0.2, "k": 5, "new": 3, "device": "cuda"}
    assert resumable.differences(saved, current) == [
        ("lr", 0.1, 0.2),
        ("new", "(unset)", 3),
        ("seed", 0, 1),
    ]  # None and unset are one: a setting added later with no value changes nothing
    assert resumable.differences({"gone": 1}, {}) == [("gone", 1, "(unset)")]


def test_the_description_quotes_the_first_six_differences() -> None:
    found = [(f"s{i}", i, str(i + 1)) for i in range(8)]
    assert resumable.describe(found[:2]) == "'s0' 0 -> '1'; 's1' 1 -> '2'"
    assert resumable.describe(found) == "; ".join(f"'s{i}' {i} -> '{i + 1}'" for i in range(6))
    assert resumable.describe(found, limit=1) == "'s0' 0 -> '1'"
