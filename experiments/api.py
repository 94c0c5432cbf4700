"""Run an experiment from Python (a notebook, a script) with your own model and data, through Flower.

    from experiments.api import run

    rows = run(
        "experiments/configs/default.toml",           # or None: the embedded default job
        model=build,                                 # a builder (input_shape, num_classes, seed) -> nn.Module
        data=(x_train, y_train, x_test, y_test),     # arrays, a mapping, (train, test) Datasets, or a loader
        strategies=["fetchsgd", "local_topk", "fedavg"],
        num_rounds=20,                               # any setting, '-' written '_'
    )

It is what ``fedsketch run`` does (the command is a thin layer over
:func:`prepare` and :func:`execute`): the same checks before anything starts,
the same Flower runtime (its simulation runtime in one process per run, or
with ``runtime="superlink"`` a private SuperLink and ``flwr run``; the
in-process or the Ray backend), the same run folders, and it returns every
run's ``metrics.jsonl`` rows. What cannot be named in a setting travels by
file: data objects are written once to an ``.npz`` under ``OUT/_inputs``
(float32 samples and int64 labels, exactly what training reads), and a builder
or loader that Flower's processes cannot import by name (defined in
``__main__`` or a notebook) is pickled by value there with cloudpickle.
:func:`plan`, with the same arguments, returns what ``fedsketch plan`` prints
(what each run will send), starting no Flower.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.flower.federation import Federation
from experiments.running import runner
from experiments.running.command_plan import OUT, SUPERNODES
from experiments.running.runner import Experiment
from fedsketch.data.handoff import INPUTS
from fedsketch.settings.setting import ConfigError


class RunFailed(RuntimeError):
    """Some run of the experiment did not reach its last round; what the others measured is kept."""


def run(
    config: str | Path | None = None,
    *,
    model: str | Callable[..., Any] | None = None,
    data: Any = None,
    strategies: Sequence[str] | None = None,
    seeds: int | None = None,
    out: str | Path = OUT,
    backend: str | None = None,
    runtime: str = "process",
    supernodes: int = SUPERNODES,
    plot: bool = False,
    restart: bool = False,
    **settings: Any,
) -> list[dict[str, Any]]:
    """Run an experiment file (default: the embedded default job) and return every run's metrics rows.

    Parameters
    ----------
    model
        A built-in name, a ``package.module:function`` reference, or the builder itself.
    data
        A built-in dataset name or reference; a loader function; or the data
        (a mapping or tuple of ``x_train, y_train, x_test, y_test[, client_ids]``,
        or a pair of ``torch.utils.data.Dataset``) as docs/data.md describes.
    strategies, seeds
        Override the experiment's ``[compare]`` table.
    out, backend, runtime, supernodes, plot, restart
        As ``fedsketch run``'s ``--out``, ``--backend``, ``--runtime``, ``--supernodes``, (negated) ``--no-plot`` and
        ``--restart``; unlike the command, no plots or report unless ``plot=True``.
    settings
        Run settings, ``num_rounds=20`` for ``num-rounds = 20``.

    Raises
    ------
    ConfigError
        A setting, the data or the model is refused, or a run's checkpoint is of other settings (nothing was
        started).
    RunFailed
        A run stopped before its last round (its reason is in its ``flower.log``).
    """
    out = Path(out).resolve()
    experiment = prepare(config, _overrides(model, data, settings, out), out, seeds, strategies)
    runner.check_resumes(experiment.runs, restart)
    fed = federation(supernodes, None, backend, runtime)
    check_placement(experiment, fed)
    code = execute(experiment, fed, plot)
    if code in (130, 143):
        raise KeyboardInterrupt
    unfinished = [runner.describe(cfg) for cfg in experiment.runs if not runner.is_finished(cfg)]
    if unfinished:
        raise RunFailed(f"{', '.join(unfinished)} stopped before the last round (see each run's flower.log)")
    return [row for cfg in experiment.runs for row in _rows(cfg)]


def plan(
    config: str | Path | None = None,
    *,
    model: str | Callable[..., Any] | None = None,
    data: Any = None,
    strategies: Sequence[str] | None = None,
    seeds: int | None = None,
    out: str | Path = OUT,
    supernodes: int = SUPERNODES,
    **settings: Any,
) -> str:
    """What :func:`run` with the same arguments will send, as ``fedsketch plan`` prints it; no Flower is started.

    Every run is checked as :func:`run` checks it, then its first round runs in this process
    (:mod:`experiments.running.forecast`): bytes per client and per round, each run's totals, the model's size.

    Raises
    ------
    ConfigError
        A setting, the data or the model is refused.
    """
    from experiments.running import forecast

    out = Path(out).resolve()
    experiment = prepare(config, _overrides(model, data, settings, out), out, seeds, strategies, hand_over=False)
    return forecast.render(*forecast.forecast(experiment.runs, supernodes))


def _overrides(
    model: str | Callable[..., Any] | None, data: Any, settings: dict[str, Any], out: Path
) -> dict[str, Any]:
    """The run settings :func:`run` and :func:`plan` were given: ``num_rounds`` as ``num-rounds``, the model and
    the data as settings (objects written under ``out``)."""
    overrides = {key.replace("_", "-"): value for key, value in settings.items()}
    if model is not None:
        overrides["model"] = model if isinstance(model, str) else reference(model, out)
    if data is not None:
        overrides.update(data_settings(data, out))
    return overrides


def prepare(
    config: str | Path | None,
    overrides: dict[str, Any],
    out: Path,
    seeds: int | None = None,
    strategies: Sequence[str] | None = None,
    hand_over: bool = True,
) -> Experiment:
    """The experiment's runs, each checked with its data and model before anything starts; prints what was found.

    ``hand_over``: the runs will run next, so data loaded for the checks is written for their Flower processes
    (:func:`experiments.running.preflight.check_runs`); ``fedsketch plan`` runs none.
    """
    from experiments.analysis import tracking
    from experiments.flower.app_files import check_app_config
    from experiments.running.command_plan import APP_DIR
    from experiments.running.preflight import check_runs
    from fedsketch.config import RunConfig

    check_app_config(APP_DIR, RunConfig().to_mapping())
    overrides = {**overrides, "out-dir": str(out)}
    experiment = runner.load_experiment(
        Path(config) if config else runner.DEFAULT_CONFIG, overrides, seeds, list(strategies) if strategies else None
    )
    tracking.check(experiment.runs)  # before the data is loaded: a missing package is refused at once
    for checked in check_runs(experiment.runs, hand_over=hand_over):
        print(f"fedsketch: {checked.describe()}")
        for line in checked.warnings:
            print(f"fedsketch: warning: {line}")
    return experiment


def federation(supernodes: int, gpus: float | None, backend: str | None = None, runtime: str = "process") -> Federation:
    """The simulated nodes, their share of the CPUs and GPUs, the backend and the runtime (:mod:`experiments.flower.federation`).

    Raises
    ------
    ConfigError
        For fewer than one node, a GPU share asked for without a GPU, or an unknown backend or runtime.
    """
    if supernodes < 1:
        raise ConfigError(f"supernodes must be at least 1; got {supernodes}")
    import torch

    from bridge import flower
    from experiments.flower.federation import cpus_per_node, default_backend, gpus_per_node, on_public_flower

    try:
        share = gpus_per_node(supernodes, gpus, torch.cuda.device_count())
        fed = Federation(
            num_supernodes=supernodes,
            cpus_per_client=cpus_per_node(supernodes),
            gpus_per_client=share,
            backend=backend or default_backend(),
            runtime=runtime,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not flower.internals():
        print(
            f"fedsketch: on Flower's public API only ({flower.public_only_reason()}): each run goes through "
            "flwr run and a SuperLink, on Flower's Ray backend, with Flower's own waits"
        )
    return on_public_flower(fed)


def check_placement(experiment: Experiment, fed: Federation) -> None:
    """Every run's ``device`` against what the federation's backend gives its workers
    (:func:`experiments.flower.federation.check_device`).

    Raises
    ------
    ConfigError
        For a device the backend's workers cannot see.
    """
    from experiments.flower.federation import check_device

    for name in sorted({cfg.device for cfg in experiment.runs}):
        try:
            check_device(name, fed)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None


def execute(experiment: Experiment, fed: Federation, plot: bool) -> int:
    """Run a prepared experiment's runs in this process, print their outcomes; the command's exit code."""
    from experiments.running.command_plan import Plan, run_plan

    return run_plan(Plan.from_json(Plan.of(experiment.runs, fed, plot=plot).to_json()))


def reference(fn: Callable[..., Any], out: Path) -> str:
    """A setting value that names ``fn`` in every process: ``module:qualname``, else a pickle of it under ``out``."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if module and module != "__main__":
        try:
            target: Any = importlib.import_module(module)
            for part in name.split("."):
                target = getattr(target, part)
            if target is fn:
                return f"{module}:{name}"
        except (ImportError, AttributeError):
            pass  # its name does not reach it (a local function, a lambda): by value
    import cloudpickle  # a function of __main__ or a notebook: by value

    return str(_store(cloudpickle.dumps(fn), out, ".pkl", name.split(".")[-1] or "function"))


def data_settings(data: Any, out: Path) -> dict[str, Any]:
    """The ``dataset`` (and ``data-root``) settings for ``data``: a name, a loader, or the data itself.

    Raises
    ------
    ConfigError
        For data of no shape docs/data.md describes, or labels that are not integers.
    """
    if isinstance(data, str):
        return {"dataset": data}
    if callable(data):
        return {"dataset": reference(data, out)}
    from fedsketch.data.load import as_samples
    from fedsketch.data.user import unpack

    try:
        x_train, y_train, x_test, y_test, ids = unpack(data, "data")
        arrays = dict(zip(("x_train", "y_train"), as_samples(x_train, y_train, "train", "data"), strict=True))
        arrays.update(zip(("x_test", "y_test"), as_samples(x_test, y_test, "test", "data"), strict=True))
    except ValueError as exc:  # run's and plan's refusals are ConfigErrors, whatever refused
        raise ConfigError(str(exc)) from None
    found = {key: value.numpy() for key, value in arrays.items()}
    if ids is not None:
        found["client_ids"] = np.asarray(ids)
    buffer = io.BytesIO()
    np.savez(buffer, **found)  # type: ignore[arg-type]  # numpy's stub types **kwds as its allow_pickle flag
    return {"dataset": "npz", "data-root": str(_store(buffer.getvalue(), out, ".npz", "data"))}


def _store(content: bytes, out: Path, suffix: str, what: str) -> Path:
    """``content`` under ``out/_inputs``, named by what it is (a function's name, ``data``) and its hash
    (the same input, the same path, once); errors that name the file name what was passed."""
    stem = re.sub(r"[^A-Za-z0-9_.]+", "_", what).strip("_.") or "input"
    path = out / INPUTS / f"{stem}-{hashlib.sha256(content).hexdigest()[:16]}{suffix}"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(content)
        tmp.replace(path)
    return path


def _rows(cfg: Any) -> list[dict[str, Any]]:
    from fedsketch.server import runlog

    return runlog.read_metrics(runlog.run_dir(cfg))
