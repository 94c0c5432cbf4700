"""Bad data or a bad model is refused before Flower starts: exit 2, one line naming the problem, nothing started.

Each case runs ``fedsketch run`` (its ``main``, in this process; one case also as
the installed command) on a small npz file or model builder with one fault.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from experiments.cli import main

BUILDERS = """
import numpy as np
import torch
from torch import nn

def good(input_shape, num_classes, seed):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))

def eleven(input_shape, num_classes, seed):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), 11))

def unflattened(input_shape, num_classes, seed):
    return nn.Linear(int(np.prod(input_shape)), num_classes)

def broken(input_shape, num_classes, seed):
    return nn.Linear(-1, num_classes)

def indexes(input_shape, num_classes, seed):
    return nn.Linear(input_shape[3], num_classes)

def normed(input_shape, num_classes, seed):
    return nn.Sequential(nn.Flatten(), nn.BatchNorm1d(int(np.prod(input_shape))), good(input_shape, num_classes, seed))

class Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(1))

    def forward(self, x):
        return x * self.scale

def four(input_shape, num_classes, seed):
    return nn.Sequential(normed(input_shape, num_classes, seed), Scaled())

class Both(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x), self.model(x)

def pair(input_shape, num_classes, seed):
    return Both(good(input_shape, num_classes, seed))

def empty():
    return {"x_train": np.zeros((0, 1, 4, 4), np.float32), "y_train": np.zeros(0, np.int64),
            "x_test": np.zeros((5, 1, 4, 4), np.float32), "y_test": np.zeros(5, np.int64)}

def unseeded(input_shape, num_classes, seed):
    model = good(input_shape, num_classes, seed)
    for p in model.parameters():
        p.data = p.data + float(np.random.random())  # numpy's global RNG: not the seed
    return model
"""

Arrays = dict[str, np.ndarray]


def _clean() -> Arrays:
    rng = np.random.default_rng(0)
    return {
        "x_train": rng.normal(size=(200, 1, 4, 4)).astype(np.float32),
        "y_train": np.arange(200) % 10,
        "x_test": rng.normal(size=(50, 1, 4, 4)).astype(np.float32),
        "y_test": np.arange(50) % 10,
    }


def _set(array: str, index: tuple[int, ...], value: float) -> Callable[[Arrays], None]:
    def fault(arrays: Arrays) -> None:
        arrays[array][index] = value

    return fault


def _float_labels(arrays: Arrays) -> None:
    arrays["y_train"] = arrays["y_train"].astype(np.float32)


def _string_labels(arrays: Arrays) -> None:
    arrays["y_train"] = np.array([str(label) for label in arrays["y_train"]])


def _test_shape(arrays: Arrays) -> None:
    arrays["x_test"] = np.zeros((50, 1, 4, 5), np.float32)


def _no_fault(arrays: Arrays) -> None:
    pass


def _no_test_samples(arrays: Arrays) -> None:
    arrays["x_test"], arrays["y_test"] = arrays["x_test"][:0], arrays["y_test"][:0]


def _color(arrays: Arrays) -> None:
    """Three-channel 8 x 8 images: what a residual network takes."""
    for split, n in (("train", 200), ("test", 50)):
        arrays[f"x_{split}"] = np.random.default_rng(0).normal(size=(n, 3, 8, 8)).astype(np.float32)


CASES = {
    "nan in x_train": (_set("x_train", (17, 0, 2, 1), np.nan), {},
                       r"^fedsketch: error: data: x_train of npz:.*data\.npz: sample 17 holds NaN \(1 of 200 samples"),
    "inf in x_test": (_set("x_test", (3, 0, 0, 0), np.inf), {},
                      r"x_test of npz:.*data\.npz: sample 3 holds an infinite value"),
    "label 10 of 10 classes": (_set("y_train", (42,), 10), {"num-classes": 10},
                               r"y_train of npz:.*: label 10 at index 42 is outside \[0, 10\) .*'num-classes'"),
    "negative test label": (_set("y_test", (7,), -1), {},
                            r"y_test of npz:.*: label -1 at index 7 is outside \[0, 10\)"),
    "labels not integers": (_float_labels, {}, r"y_train of npz:.* must hold integer labels; got torch.float32"),
    "labels are strings": (_string_labels, {}, r"y_train of npz:.*data\.npz must hold integer labels; got <U1"),
    "test samples of another shape": (_test_shape, {},
                                      r"npz:.*data\.npz: test samples have shape \(1, 4, 5\); expected \(1, 4, 4\)"),
    "a builder that raises": (_no_fault, {"model": "badlab:broken"},
                              (r"setting 'model': badlab:broken raised RuntimeError: .* \(at .*badlab\.py:\d+\); "
                               r"called with input_shape \(1, 4, 4\), num_classes 10, seed 0$")),
    "a builder that indexes past the shape": (_no_fault, {"model": "badlab:indexes"},
                                              r"badlab:indexes raised IndexError: tuple index out of range"),
    "model of the wrong input shape": (_no_fault, {"model": "badlab:unflattened"},
                                       r"badlab:unflattened failed on a batch of shape \(2, 1, 4, 4\) from npz:.*mat1"),
    "model output size": (_no_fault, {"model": "badlab:eleven"},
                          r"badlab:eleven gives \(2, 11\) for 2 samples; expected \(2, 10\)"),
    "model not deterministic": (_no_fault, {"model": "badlab:unseeded"},
                                r"badlab:unseeded is not deterministic in its seed: parameter '1.weight' differs"),
    "natural without client ids": (_no_fault, {"partition": "natural"}, r"has no natural clients \(no client ids\)"),
    "too few classes": (_no_fault, {"partition": "pathological", "classes-per-client": 12},
                        r"setting 'classes-per-client' is 12 but the data has only 10 classes"),
    "a client left empty": (_no_fault, {"partition": "iid", "num-clients": 250, "clients-per-round": 10},
                            r"cannot give 250 clients a sample each from 200 samples"),
    "num-classes of a fixed data set": (_no_fault, {"dataset": "synthetic", "num-classes": 12},
                                        r"setting 'num-classes' is 12 but dataset 'synthetic' has 10 classes"),
    "fewer sketch columns than k": (_no_fault, {"k": 150},
                                    (r"settings 'sketch-cols' \(100\) and 'k' \(150\) do not fit: fetchsgd .* 100 "
                                     r"columns a row cannot hold 150 coordinates apart")),
    "a model with buffers": (_no_fault, {"model": "badlab:normed"},
                             (r"setting 'model': badlab:normed keeps buffers \(1.running_mean, 1.running_var, "
                              r"1.num_batches_tracked\) that no method trains or sends, so the server would evaluate with their "
                              r"initial values; build it with torch.nn.GroupNorm or LayerNorm instead of BatchNorm "
                              r"\(or BatchNorm with track_running_stats=False\)$")),
    "a model with four buffers": (_no_fault, {"model": "badlab:four"},
                                  (r"keeps buffers \(0.1.running_mean, 0.1.running_var, 0.1.num_batches_tracked and "
                                   r"1 more\) that")),
    "a model of the user's with batch norm asked for": (_no_fault, {"model": "badlab:normed", "model-norm": "batch"},
                                                         r"setting 'model': badlab:normed keeps buffers \(1.running"),
    "a model whose output is not a tensor": (_no_fault, {"model": "badlab:pair"},
                                             r"setting 'model': badlab:pair gives tuple for 2 samples; expected \(2, 10\)"),
    "images too small for the model": (_no_fault, {"model": "resnet9"},
                                       (r"^fedsketch: error: setting 'model': model 'resnet9' needs images \(C, H, W\) "
                                        r"with H, W >= \d+; got \(1, 4, 4\)$")),
    "batch norm in a built-in model": (_color, {"model": "resnet9", "model-norm": "batch"},
                                       (r"setting 'model-norm' is 'batch' for model 'resnet9': .* use "
                                        r"model-norm = \"group\"")),
    "a model module that is not there": (_no_fault, {"model": "nosuchlab.model:build"},
                                         r"^fedsketch: error: setting 'model': no module 'nosuchlab'"),
    "a loader module that is not there": (_no_fault, {"dataset": "nosuchlab.data:load"},
                                          r"^fedsketch: error: setting 'dataset': no module 'nosuchlab'"),
    "no test samples": (_no_test_samples, {},
                        r"x_test and y_test of npz:.*data\.npz are empty \(0 samples\): .* the server evaluates on"),
    "a loader that returns no training samples": (_no_fault, {"dataset": "badlab:empty"},
                                                  r"^fedsketch: error: data: x_train and y_train of badlab:empty are empty \(0 samples\)"),
    "generating devices that are not the clients": (_no_fault, {"dataset": "synthetic", "partition": "natural",
                                                                "synthetic-devices": 50},
                                                    r"setting 'synthetic-devices' \(50\) differs from 'num-clients' \(20\)"),
    "a setting misspelt by meaning": (_no_fault, {"num-rows": 3},
                                      r"unknown setting 'num-rows' \(did you mean 'sketch-rows' or 'num-rounds'\?\)"),
}  # fmt: skip  # one case a line: fault, settings, what the error says


def _settings(tmp_path: Path, settings: dict[str, object]) -> dict[str, object]:
    base = {"dataset": "npz", "data-root": str(tmp_path / "data.npz"), "model": "badlab:good", "partition": "iid"}
    return {**base, "num-clients": 20, "num-rounds": 2, "k": 10, "sketch-cols": 100, **settings}


def _args(tmp_path: Path, settings: dict[str, object]) -> list[str]:
    sets = [arg for key, value in _settings(tmp_path, settings).items() for arg in ("--set", f"{key}={value}")]
    return ["run", *sets, "--strategies", "fetchsgd", "--out", str(tmp_path / "runs"), "--no-plot"]


@pytest.fixture
def lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "badlab.py").write_text(textwrap.dedent(BUILDERS), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_before_flower_starts(lab: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    fault, settings, says = CASES[case]
    arrays = _clean()
    fault(arrays)
    np.savez(lab / "data.npz", **arrays)  # type: ignore[arg-type]  # numpy's stubs want positional arrays
    start = time.monotonic()
    code = main(_args(lab, settings))
    elapsed = time.monotonic() - start
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.count("\n") == 0 and err.startswith("fedsketch: error: "), err
    assert re.search(says, err), err
    assert elapsed < 15, f"took {elapsed:.1f} s"
    assert not (lab / "runs" / "default").exists()  # no run folder: nothing was started or marked


def test_the_clean_data_passes_the_same_checks(lab: Path) -> None:
    from experiments.running.preflight import check_runs
    from experiments.running.runner import DEFAULT_CONFIG, load_experiment

    np.savez(lab / "data.npz", **_clean())  # type: ignore[arg-type]
    (checked,) = check_runs(load_experiment(DEFAULT_CONFIG, _settings(lab, {}), None, ["fetchsgd"]).runs)
    assert (checked.num_classes, checked.inferred, checked.input_shape) == (10, True, (1, 4, 4))


@pytest.mark.slow  # the command in a fresh Python
def test_the_command_exits_2_with_one_line_in_time(lab: Path) -> None:
    arrays = _clean()
    arrays["x_train"][5, 0, 0, 0] = np.nan
    np.savez(lab / "data.npz", **arrays)  # type: ignore[arg-type]
    command = [sys.executable, "-m", "experiments.cli", *_args(lab, {})]
    start = time.monotonic()
    env = {**os.environ, "PYTHONPATH": f"{lab}{os.pathsep}{Path(__file__).parents[3]}"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=lab, check=False, env=env)
    elapsed = time.monotonic() - start
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and "x_train of npz:" in done.stderr, done.stderr
    assert "sample 5 holds NaN" in done.stderr
    assert elapsed < 15, f"took {elapsed:.1f} s"
