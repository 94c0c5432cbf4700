"""The Python API (experiments/api.py): what a notebook passes becomes settings, then real runs through Flower."""

from __future__ import annotations

import dataclasses
import operator
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

import cloudpickle
import numpy as np
import pytest
import torch
from torch import nn

from experiments import api
from experiments.flower.federation import Federation, cpus_per_node
from experiments.running import runner
from fedsketch.data.handoff import INPUTS
from fedsketch.settings.setting import ConfigError
from tests.experiments.tiny import plan_rows, tiny


def build(input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
    """A user's model builder that Flower's processes import by name."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))


class Models:
    @staticmethod
    def linear(input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
        return build(input_shape, num_classes, seed)


def _arrays(seed: int = 0, ids: bool = False) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    x_train, x_test = rng.normal(size=(40, 6)), rng.normal(size=(12, 6))
    y_train, y_test = rng.integers(0, 3, 40), rng.integers(0, 3, 12)
    return (x_train, y_train, x_test, y_test, np.arange(40) % 4) if ids else (x_train, y_train, x_test, y_test)


def test_a_function_that_every_process_can_import_is_named_by_reference(tmp_path: Path) -> None:
    assert api.reference(build, tmp_path) == "tests.experiments.test_api:build"
    assert api.reference(Models.linear, tmp_path) == "tests.experiments.test_api:Models.linear"
    assert not (tmp_path / INPUTS).exists()  # nothing written for a function named by reference


def _pickled(value: str, stem: str) -> Path:
    path = Path(value)
    assert re.fullmatch(rf"{stem}-[0-9a-f]{{16}}\.pkl", path.name), path.name
    assert path.parent.name == INPUTS and path.is_file()
    return path


def test_a_function_no_other_process_can_import_is_pickled_by_value_once(tmp_path: Path) -> None:
    def local_builder(input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
        return build(input_shape, num_classes, seed + 1)

    first = _pickled(api.reference(local_builder, tmp_path), "local_builder")
    assert first.read_bytes() == cloudpickle.dumps(local_builder)
    stamp = first.stat().st_mtime_ns
    assert api.reference(local_builder, tmp_path) == str(first)  # the same function, the same file, not rewritten
    assert first.stat().st_mtime_ns == stamp
    assert sorted(p.name for p in first.parent.iterdir()) == [first.name]  # no temporary file left
    restored = cloudpickle.loads(first.read_bytes())
    assert restored((6,), 3, 0)[1].weight.equal(local_builder((6,), 3, 0)[1].weight)
    _pickled(api.reference(lambda shape, n, seed: build(shape, n, seed), tmp_path), "lambda")


@pytest.mark.parametrize(
    ("name", "stem"), [("Build_Model2", "Build_Model2"), ("_private_", "private"), ("_", "input"), ("X_X", "X_X")]
)
def test_a_pickled_functions_file_is_named_by_the_function(tmp_path: Path, name: str, stem: str) -> None:
    def fn() -> None:
        return None

    fn.__module__, fn.__qualname__ = "__main__", f"outer.{name}"
    _pickled(api.reference(fn, tmp_path), stem)


def test_a_callable_without_a_module_or_a_qualified_name_is_pickled(tmp_path: Path) -> None:
    _pickled(api.reference((1).__add__, tmp_path), "add")  # a builtin's method: no __module__
    _pickled(api.reference(operator.itemgetter(0), tmp_path), "function")  # an instance: no __qualname__


@pytest.mark.parametrize(
    ("module", "qualname", "stem"),
    [
        ("__main__", "build", "build"),  # a script's or notebook's function
        ("no_such_module_anywhere", "build", "build"),
        ("tests.experiments.test_api", "Models.missing", "missing"),
        ("tests.experiments.test_api", "Models.linear", "linear"),  # that name is another function
        ("tests.experiments.test_api", "", "function"),
    ],
)
def test_a_function_its_name_does_not_reach_is_pickled(
    tmp_path: Path, module: str, qualname: str, stem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fn(input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
        return build(input_shape, num_classes, seed)

    fn.__module__, fn.__qualname__ = module, qualname
    if module == "__main__":  # a script's own: there, its name reaches it; in Flower's processes, not
        monkeypatch.setattr(sys.modules["__main__"], qualname, fn, raising=False)
    _pickled(api.reference(fn, tmp_path), stem)


def test_data_objects_are_written_once_as_what_training_reads(tmp_path: Path) -> None:
    x_train, y_train, x_test, y_test, ids = _arrays(ids=True)
    settings = api.data_settings((x_train, y_train, x_test, y_test, ids), tmp_path)
    assert set(settings) == {"dataset", "data-root"} and settings["dataset"] == "npz"
    path = Path(settings["data-root"])
    assert re.fullmatch(r"data-[0-9a-f]{16}\.npz", path.name) and path.parent == tmp_path / INPUTS
    with np.load(path) as saved:
        assert sorted(saved.files) == ["client_ids", "x_test", "x_train", "y_test", "y_train"]
        assert saved["x_train"].dtype == np.float32 and saved["y_train"].dtype == np.int64
        assert np.array_equal(saved["x_train"], x_train.astype(np.float32))
        assert np.array_equal(saved["x_test"], x_test.astype(np.float32))
        assert np.array_equal(saved["y_train"], y_train) and np.array_equal(saved["y_test"], y_test)
        assert np.array_equal(saved["client_ids"], ids)
    mapping = dict(zip(("x_train", "y_train", "x_test", "y_test"), _arrays(), strict=True))
    again = api.data_settings(mapping, tmp_path)
    with np.load(again["data-root"]) as saved:
        assert "client_ids" not in saved.files
    assert again["data-root"] != settings["data-root"]  # other content, another file
    assert api.data_settings("mnist", tmp_path) == {"dataset": "mnist"}
    assert api.data_settings(_arrays, tmp_path) == {"dataset": "tests.experiments.test_api:_arrays"}
    loader = api.data_settings(lambda: _arrays(), tmp_path)["dataset"]  # a loader no other process can import
    assert Path(loader).parent == tmp_path / INPUTS and Path(loader).suffix == ".pkl"


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (5, "data returned a int; expected a mapping of x_train, y_train, x_test, y_test"),
        ({"x_train": np.zeros((2, 3))}, "data returned a mapping without ['y_train', 'x_test', 'y_test']"),
        ((np.zeros((4, 3)), np.zeros(4), np.zeros((2, 3)), np.zeros(2)), "y_train of data must hold integer labels"),
        (
            (np.zeros((4, 3)), np.zeros(4, int), np.zeros((2, 3)), np.zeros(2)),
            "y_test of data must hold integer labels",
        ),
    ],
)
def test_data_that_cannot_be_trained_on_is_a_config_error(tmp_path: Path, data: Any, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        api.plan(data=data, out=tmp_path)
    assert not (tmp_path / INPUTS).exists()


def test_settings_are_named_as_in_files_and_the_model_and_data_become_settings(tmp_path: Path) -> None:
    found = api._overrides(build, _arrays(), {"num_rounds": 3, "client_lr": 0.5}, tmp_path)
    assert found["num-rounds"] == 3 and found["client-lr"] == 0.5
    assert found["model"] == "tests.experiments.test_api:build" and found["dataset"] == "npz"
    assert Path(found["data-root"]).is_file()
    assert api._overrides("cnn", "mnist", {}, tmp_path) == {"model": "cnn", "dataset": "mnist"}
    assert api._overrides(None, None, {"k": 5}, tmp_path) == {"k": 5}


def test_a_federation_is_checked_and_built_from_the_arguments() -> None:
    fed = api.federation(3, None, "inprocess", "superlink")
    assert fed == Federation(
        num_supernodes=3,
        cpus_per_client=cpus_per_node(3),  # the machine's cores split over the nodes
        gpus_per_client=0.0,
        backend="inprocess",
        runtime="superlink",
    )
    one = api.federation(1, None)
    assert (one.backend, one.runtime, one.cpus_per_client) == ("inprocess", "process", cpus_per_node(1))
    with pytest.raises(ConfigError, match="supernodes must be at least 1; got 0"):
        api.federation(0, None)
    with pytest.raises(ConfigError, match="backend must be one of inprocess, ray; got 'threads'"):
        api.federation(2, None, "threads")
    with pytest.raises(ConfigError, match="must be >= 0"):
        api.federation(2, -1.0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_machine_the_nodes_split_its_gpus_unless_told() -> None:
    """Ray hides the GPUs from a worker that asks for none: a share of 0 would train every client on the CPU."""
    assert api.federation(4, None, "ray").gpus_per_client == min(1.0, torch.cuda.device_count() / 4) > 0
    assert api.federation(2, 0.0, "ray").gpus_per_client == 0.0


def test_a_device_the_backends_workers_cannot_see_is_refused(tmp_path: Path) -> None:
    runs = runner.load_experiment(tiny(tmp_path), {"out-dir": str(tmp_path)}, strategies=["fedavg", "fetchsgd"]).runs
    ray = Federation(num_supernodes=2, backend="ray", gpus_per_client=0.5)
    api.check_placement(runner.Experiment(runs), ray)  # the CPU: every worker's
    one_on_gpu = runner.Experiment((runs[0], dataclasses.replace(runs[1], device="cuda:1")))
    api.check_placement(one_on_gpu, Federation(num_supernodes=2))  # in one process the command's GPUs are seen
    with pytest.raises(ConfigError, match="setting 'device' is 'cuda:1' but under the Ray backend"):
        api.check_placement(one_on_gpu, ray)


def test_prepare_reads_the_embedded_default_and_says_what_the_regime_map_warns(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert api.prepare(None, {"num-rounds": 1}, tmp_path, strategies=["fedavg"]).runs[0].experiment == "default"
    capsys.readouterr()
    api.prepare(tiny(tmp_path), {"sketch-cols": 10, "k": 10}, tmp_path / "out", strategies=["fetchsgd"])
    said = capsys.readouterr().out.splitlines()
    assert said[-1].startswith("fedsketch: warning: fetchsgd seed 0: a 1 x 10 sketch is 10 counters for d = 1,418")


def test_prepare_hands_the_data_it_loaded_to_the_runs_unless_told_they_will_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fedsketch.data import handoff

    settings = {"dataset": f"{__name__}:{_loader.__name__}", "partition": "iid"}
    api.prepare(tiny(tmp_path), settings, tmp_path / "planned", hand_over=False)
    assert not os.environ.get(handoff.ENV) and "Flower's processes read it" not in capsys.readouterr().out
    api.prepare(tiny(tmp_path), settings, tmp_path / "run")
    assert os.environ.get(handoff.ENV) and "Flower's processes read it from" in capsys.readouterr().out


def test_prepare_checks_every_run_and_says_what_it_found(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    experiment = api.prepare(tiny(tmp_path), {"num-rounds": 1}, tmp_path / "out", strategies=["fedavg", "fetchsgd"])
    assert [(cfg.strategy, cfg.num_rounds, cfg.out_dir) for cfg in experiment.runs] == [
        ("fedavg", 1, str(tmp_path / "out")),
        ("fetchsgd", 1, str(tmp_path / "out")),
    ]
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("fedsketch: ") for line in lines), lines
    assert any("synthetic" in line for line in lines), lines
    assert len(api.prepare(tiny(tmp_path), {}, tmp_path / "out", seeds=2).runs) == 2


def _loader() -> tuple[Any, ...]:
    """A user's data loader, named by reference."""
    return _arrays()


def test_plan_says_what_each_run_will_send_and_writes_nothing(tmp_path: Path) -> None:
    args = {"out": tmp_path, "strategies": ["fedavg", "fetchsgd"], "supernodes": 1, "num_rounds": 3, "partition": "iid"}
    text = api.plan(tiny(tmp_path), model=build, data=_loader, seeds=2, **args)
    assert text.startswith("Plan of tiny: 4 run(s)")
    for run in ("fedavg seed 0", "fedavg seed 1", "fetchsgd seed 0", "fetchsgd seed 1"):
        assert re.search(rf"^{run} +21 ", text, re.MULTILINE), text  # the user's model: 6 x 3 weights and 3 biases
    assert "round 1 x num-rounds (3)" in text
    assert sorted(tmp_path.iterdir()) == [tmp_path / "tiny.toml"]  # no run folder, no data handed over


def test_plan_bills_secure_aggregation_by_the_nodes_asked_for(tmp_path: Path) -> None:
    args = {"out": tmp_path, "secure_aggregation": True, "num_clients": 6, "clients_per_round": 6}
    default = plan_rows(api.plan(tiny(tmp_path), **args))
    assert plan_rows(api.plan(tiny(tmp_path), supernodes=2, **args)) == default
    assert plan_rows(api.plan(tiny(tmp_path), supernodes=3, **args)) != default


def test_plan_writes_data_objects_where_the_run_would_read_them(tmp_path: Path) -> None:
    api.plan(tiny(tmp_path), data=_arrays(), out=tmp_path / "out", partition="iid")
    (written,) = (tmp_path / "out" / INPUTS).iterdir()
    assert written.suffix == ".npz"


def _unstopped(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """``api.run`` with no signal sent: a ``KeyboardInterrupt`` from it fails the test (pytest would take it for
    the user's Ctrl-C and stop)."""
    try:
        return api.run(*args, **kwargs)
    except KeyboardInterrupt:
        pytest.fail("api.run raised KeyboardInterrupt though no signal stopped its runs")


@pytest.mark.slow  # a real Flower run through its processes (seconds)
def test_run_trains_through_flower_and_returns_every_runs_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # results go to ./runs unless told
    config, data = tiny(tmp_path), _arrays(ids=True)
    rows = _unstopped(config, model=build, data=data, strategies=["fetchsgd"], seeds=2, eval_every=1)
    assert [(row["strategy"], row["seed"], row["round"]) for row in rows] == [
        ("fetchsgd", 0, 1),
        ("fetchsgd", 0, 2),
        ("fetchsgd", 1, 1),
        ("fetchsgd", 1, 2),
    ]
    assert 0 < rows[0]["cum_upload_bytes"] < rows[1]["cum_upload_bytes"]
    exp = tmp_path / "runs" / "tiny"
    assert (exp / "fetchsgd" / "seed1" / "metrics.jsonl").is_file()
    assert not (exp / "report.md").exists()  # no plots or report unless asked
    assert "fetchsgd seed 1: finished" in capsys.readouterr().out
    again = _unstopped(config, model=build, data=data, strategies=["fetchsgd"], seeds=2, plot=True)
    assert again == rows  # finished: not run again, the same rows
    assert (exp / "report.md").is_file()


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        ({"backend": "threads"}, "backend must be one of inprocess, ray; got 'threads'"),
        ({"runtime": "grpc"}, "runtime must be one of process, superlink; got 'grpc'"),
        ({"data": 5}, "data returned a int"),
        ({"model": "no_such_module_anywhere:build"}, "no_such_module_anywhere"),
        ({"supernodes": 0}, "supernodes must be at least 1; got 0"),
    ],
)
def test_run_refuses_what_cannot_run_before_anything_starts(
    tmp_path: Path, arguments: dict[str, Any], says: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        api.run(tiny(tmp_path), out=tmp_path, **arguments)
    assert not (tmp_path / "tiny").exists()


@pytest.mark.slow  # a real Flower run through its processes (seconds)
def test_a_checkpoint_of_other_settings_is_refused_unless_restart(tmp_path: Path) -> None:
    config, args = tiny(tmp_path), {"out": tmp_path, "supernodes": 1, "num_rounds": 1, "checkpoint_every": 1}
    assert len(_unstopped(config, **args)) == 1
    with pytest.raises(ConfigError, match="add --restart to delete it and start over"):
        api.run(config, client_lr=0.2, **args)
    rows = _unstopped(config, client_lr=0.2, restart=True, **args)
    assert len(rows) == 1 and (tmp_path / "tiny" / "fedavg" / "config.json").read_text().count('"client-lr": 0.2') == 1


@pytest.mark.slow  # a real Flower run through its processes (seconds)
def test_a_run_that_stops_before_its_last_round_raises_and_keeps_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    here = os.getpid()

    def only_here(input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
        if os.getpid() != here:
            raise RuntimeError("this builder works only in the test's process")
        return build(input_shape, num_classes, seed)

    with pytest.raises(
        api.RunFailed,
        match=r"^fedavg seed 0, fedavg seed 1 stopped before the last round \(see each run's flower.log\)$",
    ):
        _unstopped(tiny(tmp_path), model=only_here, out=tmp_path, supernodes=1, num_rounds=1, plot=True, seeds=2)
    assert f"no plots or report: no run under {tmp_path / 'tiny'} has metrics" in capsys.readouterr().out
    assert "this builder works only in the test's process" in (tmp_path / "tiny" / "fedavg" / "flower.log").read_text()


@pytest.mark.slow  # a real Flower run through its processes (seconds)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_run_stopped_by_a_signal_raises_keyboard_interrupt_once_everything_stopped(
    tmp_path: Path, signum: int
) -> None:
    here, sent = os.getpid(), tmp_path / "signalled"

    def stops_the_command(input_shape: tuple[int, ...], num_classes: int, seed: int) -> nn.Module:
        """In Flower's process, once the command watches it: one signal, as a user sends one (each client builds a
        model; a signal sent after the command has stopped would end the test's process, whose handler is back)."""
        if os.getpid() != here:
            try:
                sent.touch(exist_ok=False)  # once, whichever client's thread comes first
            except FileExistsError:
                pass
            else:
                os.kill(here, signum)
        return build(input_shape, num_classes, seed)

    with pytest.raises(KeyboardInterrupt):
        api.run(tiny(tmp_path), model=stops_the_command, out=tmp_path, supernodes=1, num_rounds=50)
    rows = tmp_path / "tiny" / "fedavg" / "metrics.jsonl"
    assert not rows.exists() or rows.read_text().count("\n") < 50
