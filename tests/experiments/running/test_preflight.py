"""Settings that do not fit the model are refused before Flower starts; a failed run says why."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bridge import flower
from experiments.analysis.results import failure_reason
from experiments.running.preflight import Checked, check_runs, model_size
from fedsketch.config import ConfigError, RunConfig
from fedsketch.data import handoff
from fedsketch.data.run import data_spec, load_data
from fedsketch.task import make_model
from tests.streams import held_stdout


@pytest.mark.parametrize("settings", [{}, {"model-hidden": 64}])
def test_model_size_without_data_matches_the_model_built_from_data(settings: dict) -> None:
    cfg = RunConfig.from_mapping(settings)
    assert model_size(cfg) == sum(p.numel() for p in make_model(cfg, load_data(cfg)).parameters())


def test_known_image_shapes_give_the_documented_sizes() -> None:
    assert model_size(RunConfig.from_mapping({"dataset": "cifar10", "model": "resnet9"})) == 6_573_120
    assert model_size(RunConfig.from_mapping({"dataset": "mnist", "model": "cnn"})) == 1_663_370
    with pytest.raises(FileNotFoundError, match="npz: no file at x.npz"):
        model_size(RunConfig.from_mapping({"dataset": "npz", "data-root": "x.npz"}))  # its shape is in the file


def test_client_state_and_k_are_checked_before_any_run() -> None:
    ok = RunConfig.from_mapping({"strategy": "local_topk"})
    too_many = RunConfig.from_mapping({"strategy": "local_topk", "num-clients": 10_000})
    with pytest.raises(ConfigError, match="max-client-state-mb"):
        check_runs([ok, too_many])
    with pytest.raises(ConfigError, match="'k' \\(400000\\) exceeds the model's 299018 parameters"):
        check_runs([RunConfig.from_mapping({"k": 400_000})])
    (checked,) = check_runs([ok])
    assert (checked.d, checked.num_classes, checked.num_clients, checked.inferred) == (299_018, 10, 100, False)


def test_failure_reason_is_the_last_exception_in_the_log(tmp_path: Path) -> None:
    assert failure_reason(tmp_path) == ""
    (tmp_path / "flower.log").write_text(
        'INFO :  starting\nTraceback (most recent call last):\n  File "x.py", line 1\n'
        "ValueError: first\nfedsketch.config.ConfigError: setting 'k' is too large\nINFO : stopped\n"
    )
    assert failure_reason(tmp_path) == "ConfigError: setting 'k' is too large"


LAB = """
import io
import sys

import numpy as np
from torch import nn


SEEN = []  # what had reached the output's bytes when the loader was called


def load(root, seed):
    written = getattr(sys.stdout, "buffer", None)
    SEEN.append(written.getvalue() if isinstance(written, io.BytesIO) else b"")
    rng = np.random.default_rng(seed)
    return {"x_train": rng.normal(size=(60, 6)).astype(np.float32), "y_train": np.arange(60) % 3,
            "x_test": rng.normal(size=(9, 6)).astype(np.float32), "y_test": np.arange(9) % 3}


def by_seed(input_shape, num_classes, seed):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), seed + 1), nn.Linear(seed + 1, num_classes))
"""


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's loader and builder on the path; what a check hands over is forgotten afterwards."""
    (tmp_path / "prelab.py").write_text(LAB, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "prelab", raising=False)  # another test's copy, and what it saw
    monkeypatch.setenv(handoff.ENV, "")  # recorded as unset, so the test's hand-over leaves nothing behind
    monkeypatch.delenv(handoff.ENV)
    yield tmp_path
    handoff.forget()


def _user(lab: Path, **settings: object) -> RunConfig:
    base = {"dataset": "prelab:load", "data-root": str(lab), "partition": "iid", "num-clients": 6, "clients-per-round": 3, "k": 10,
            "sketch-cols": 100, "out-dir": str(lab / "runs")}  # fmt: skip
    return RunConfig.from_mapping({**base, **settings})


def test_what_was_checked_is_said_with_whether_the_classes_were_inferred() -> None:
    checked = Checked("npz:a.npz", 1_000, 60_000, (1, 28, 28), 10, True, 1_663_370)
    assert checked.describe() == (
        "data npz:a.npz: 60,000 training samples of shape (1, 28, 28) over 1,000 clients, "
        "10 classes (inferred: largest label + 1); model d = 1,663,370"
    )
    assert replace(checked, inferred=False).describe().endswith(" over 1,000 clients, 10 classes; model d = 1,663,370")


def test_a_users_loader_is_loaded_once_said_and_handed_to_flowers_processes(
    lab: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first, other = _user(lab), _user(lab, **{"num-clients": 3, "clients-per-round": 3, "seed": 2})
    checked = check_runs([first, _user(lab, strategy="true_topk"), other])
    out = capsys.readouterr().out
    assert [c.num_clients for c in checked] == [6, 3]  # one check per data set and model, the same data shared
    assert [(c.data, c.train, c.input_shape, c.num_classes, c.inferred) for c in checked] == [
        ("prelab:load", 60, (6,), 3, True)
    ] * 2
    said = re.findall(r"fedsketch: loading prelab:load\(root='[^']*', seed=(\d)\) \.\.\.\n", out)
    assert said == ["0", "2"], out
    assert re.search(r"fedsketch: prelab:load: loaded in \d+\.\d s\n", out), out
    handed = re.findall(
        r"fedsketch: prelab:load: Flower's processes read it from (\S+) instead of loading it again", out
    )
    assert len(handed) == 2 and all(Path(p).is_file() and Path(p).parent.parent == lab / "runs" for p in handed), out


def test_a_plan_or_another_machines_runs_hand_nothing_over(lab: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (checked,) = check_runs([_user(lab)], here=False)  # runs on a deployment's devices: loaded there, not here
    assert capsys.readouterr().out == "" and not (lab / "runs").exists()
    check_runs([_user(lab)], hand_over=False)  # fedsketch plan: loaded and said, nobody to hand it to
    out = capsys.readouterr().out
    assert "fedsketch: loading prelab:load" in out and "Flower's processes" not in out and not (lab / "runs").exists()
    handoff.forget()
    assert model_size(_user(lab)) == checked.d  # the model's size alone: nothing said, nothing held
    assert capsys.readouterr().out == "" and not handoff.holds(data_spec(_user(lab)))


def test_the_load_lines_are_flushed_while_the_load_runs(lab: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A slow load says so before it ends, and when it ended, even where the output is block-buffered (a pipe)."""
    raw = held_stdout(monkeypatch)
    check_runs([_user(lab)], hand_over=False)
    seen_by_the_loader = sys.modules["prelab"].SEEN
    assert [line.decode() for line in seen_by_the_loader] == [
        "fedsketch: loading " + handoff.describe(data_spec(_user(lab))) + " ...\n"
    ]
    assert re.fullmatch(
        r"fedsketch: loading .*\nfedsketch: prelab:load: loaded in \d+\.\d s\n", raw.getvalue().decode()
    )


def test_an_image_folders_load_says_what_it_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    for split in ("train", "test"):
        for c in ("a", "b"):
            for i in range(3):
                (tmp_path / split / c).mkdir(parents=True, exist_ok=True)
                Image.new("L", (6, 5), 40 * i + 90 * (c == "b")).save(tmp_path / split / c / f"{i}.png")
    settings = {"dataset": "imagefolder", "data-root": str(tmp_path), "partition": "iid", "num-clients": 2, "clients-per-round": 2,
                "k": 10, "sketch-cols": 100}  # fmt: skip
    try:
        check_runs([RunConfig.from_mapping(settings)], hand_over=False)
        assert re.search(r"imagefolder:\S+: loaded in \d+\.\d s\n", capsys.readouterr().out)
        (tmp_path / "train" / "a" / "notes.txt").write_text("where these came from\n", encoding="utf-8")
        check_runs([RunConfig.from_mapping(settings)], hand_over=False)
        said = r"imagefolder:\S+: loaded in \d+\.\d s; skipped 1 file\(s\) without an image extension .*: train/a/notes.txt\n"
        assert re.search(said, capsys.readouterr().out)
    finally:
        handoff.forget()


def test_a_model_too_small_for_k_is_refused_before_its_data_is_read(tmp_path: Path) -> None:
    """mnist's shape is known without its files: each model's size is checked first, and separately."""
    absent = {"dataset": "mnist", "data-root": str(tmp_path / "absent"), "strategy": "true_topk"}
    cnn = RunConfig.from_mapping({**absent, "model": "cnn", "k": 1_000})
    mlp = RunConfig.from_mapping({**absent, "model": "mlp", "model-hidden": 16, "k": 20_000})
    with pytest.raises(ConfigError, match=r"'k' \(20000\) exceeds the model's 13002 parameters"):
        check_runs([cnn, mlp])


def test_the_model_is_built_with_the_runs_seed_and_width(lab: Path) -> None:
    (checked,) = check_runs([_user(lab, model="prelab:by_seed", seed=4)], hand_over=False)
    assert checked.d == 6 * 5 + 5 + 5 * 3 + 3
    wide = RunConfig.from_mapping({"model-hidden": 64})
    (checked,) = check_runs([wide], hand_over=False)
    assert checked.d == model_size(wide) == sum(p.numel() for p in make_model(wide, load_data(wide)).parameters())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without a CUDA GPU")
def test_a_gpu_the_machine_lacks_is_refused_by_the_checks() -> None:
    with pytest.raises(ConfigError, match=r"^setting 'device' is 'cuda' but this machine shows no CUDA GPU"):
        check_runs([RunConfig.from_mapping({"device": "cuda"})])
    check_runs([RunConfig.from_mapping({"device": "cuda"})], here=False)  # another machine's GPU: not checked here


def test_secure_aggregation_is_refused_on_public_flower_only(monkeypatch: pytest.MonkeyPatch) -> None:
    secure = RunConfig.from_mapping({"secure-aggregation": True})
    assert flower.internals()
    check_runs([secure], hand_over=False)
    monkeypatch.setenv(flower.SWITCH, "1")
    check_runs([RunConfig.from_mapping({})], hand_over=False)  # nothing else needs the internals
    with pytest.raises(ConfigError, match=r"^setting 'secure-aggregation' needs Flower's legacy internals .*: "
                       rf"{flower.SWITCH} is set$"):  # fmt: skip
        check_runs([RunConfig.from_mapping({}), secure])
