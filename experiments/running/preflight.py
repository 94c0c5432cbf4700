"""Checks of the data and the model, run before any Flower process starts.

Settings that do not fit the data or the model would otherwise surface only
inside the ServerApp or a ClientApp, after Flower has started, as a traceback
in ``flower.log`` (or, for a NaN feature, as clients rejected round after round).
Here, for each distinct data set and model of an experiment, in this process:

- the data is loaded and partitioned as every Flower process will (features
  finite, labels integers in ``[0, num-classes)``, a partition that gives every
  client a sample: :func:`fedsketch.data.from_arrays`);
- the model is built twice from the run seed and compared (a builder must be
  deterministic in its seed: every process builds its own copy);
- one forward pass on two training samples, on the CPU, must give one output
  per class;
- the model keeps no buffers (batch norm's running statistics), which no
  method trains or sends;
- the settings that depend on the model's size ``d`` are checked, and the
  regime map's word on a FetchSGD sketch of that size is kept as a warning
  (:mod:`fedsketch.sketch.count_sketch.regime`).

A user's model or loader (``package.module:function``) is imported here first,
and the folder it came from is exported on ``PYTHONPATH`` for Flower's processes.
For runs made on this machine (``here``), the ``device`` setting is checked
against the GPUs PyTorch sees, and data that takes its own time to load (a
loader of the user's, an image folder) is loaded here once, with a line before
and after, and handed to the runs' Flower processes (:mod:`fedsketch.data.handoff`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import ParamSpec, TypeVar

import torch
from torch import nn

from bridge import flower
from experiments.running.runner import describe
from fedsketch import sketch_regime
from fedsketch.config import RunConfig
from fedsketch.data import FederatedData, handoff, load_federated
from fedsketch.data.registry import DATASETS
from fedsketch.data.run import data_spec
from fedsketch.data.spec import DataSpec
from fedsketch.fit import check_against_model
from fedsketch.model import build
from fedsketch.model.models import build_model
from fedsketch.settings import device, entry
from fedsketch.settings.setting import ConfigError

P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Checked:
    """What the checks learned of one run's data and model."""

    data: str  # the data set's name, as errors name it
    num_clients: int
    train: int  # training samples
    input_shape: tuple[int, ...]
    num_classes: int
    inferred: bool  # num_classes read off the labels rather than set
    d: int  # the model's parameters
    warnings: tuple[str, ...] = ()  # what the regime map says against its runs' sketches (sketch_regime.py)

    def describe(self) -> str:
        classes = f"{self.num_classes} classes" + (" (inferred: largest label + 1)" if self.inferred else "")
        return (
            f"data {self.data}: {self.train:,} training samples of shape {self.input_shape} over "
            f"{self.num_clients:,} clients, {classes}; model d = {self.d:,}"
        )


def check_runs(runs: Iterable[RunConfig], here: bool = True, hand_over: bool = True) -> list[Checked]:
    """Every run's data and model checks (once per distinct data set and model); what each distinct pair is.

    ``here``: the runs will run on this machine (not on a deployment kit's devices): their ``device`` is checked
    against this machine's GPUs, and data that takes its own time to load is loaded first, timed; with
    ``hand_over`` (Flower's processes will run them: not for ``fedsketch plan``) that data is written for them.

    Raises
    ------
    ConfigError
        One line naming the first problem: the setting, or the array, file and first offending index.
    """
    runs = list(runs)
    secure = next((cfg for cfg in runs if cfg.secure_aggregation), None)
    if secure is not None and not flower.internals():
        raise ConfigError(
            f"setting 'secure-aggregation' needs Flower's legacy internals (bridge/legacy.py), and fedsketch runs on "
            f"Flower's public API only: {flower.public_only_reason()}"
        )
    if here:
        check_devices(runs)
    handoff.forget()  # a new command loads afresh, and checks what it loaded, not an earlier command's data
    load_federated.cache_clear()
    sizes: dict[tuple[object, ...], int] = {}
    fixed = [cfg for cfg in runs if build.fixed_input(cfg) is not None]
    for cfg in fixed:  # what the model's size alone refuses, before any data is loaded
        shape_key = (cfg.dataset, cfg.model, cfg.model_hidden, cfg.model_norm)
        sizes[shape_key] = sizes[shape_key] if shape_key in sizes else model_size(cfg)
        check_against_model(cfg, sizes[shape_key])
    found: dict[tuple[object, ...], Checked] = {}
    for cfg in runs:
        key = (data_spec(cfg), cfg.model, cfg.model_hidden, cfg.model_norm, cfg.seed)
        if key not in found:
            found[key] = check_one(cfg, hand_over=here)
        check_against_model(cfg, found[key].d)
        said = tuple(sketch_regime.shape_warnings(cfg, found[key].d, describe(cfg)))
        found[key] = replace(found[key], warnings=found[key].warnings + said)
    if here and hand_over and runs:  # every check passed: what was loaded goes to the runs' Flower processes
        for name, path in handoff.hand_over(runs[0].out_dir):
            print(f"fedsketch: {name}: Flower's processes read it from {path} instead of loading it again")
    return list(found.values())


def check_devices(runs: Iterable[RunConfig]) -> None:
    """Every run's ``device`` against the CUDA GPUs PyTorch sees in this process (:func:`fedsketch.settings.device.check`).

    Raises
    ------
    ConfigError
        Naming the setting, the device and the GPUs visible.
    """
    count = torch.cuda.device_count()
    for name in sorted({cfg.device for cfg in runs}):
        _refused(device.check, "setting 'device'", name, count)


def check_one(cfg: RunConfig, hand_over: bool = False) -> Checked:
    """The data and model checks of one run config (see the module's docstring); with ``hand_over``, data that
    takes its own time to load is loaded first, timed, and held for the run's Flower processes."""
    for name in ("model", "dataset"):
        value = getattr(cfg, name)
        if entry.is_reference(value):
            _refused(entry.export_code_root, name, name, value)
    spec = data_spec(cfg)  # a checked RunConfig makes a valid DataSpec (fedsketch/validate.py)
    if hand_over and handoff.handed(spec) and not handoff.holds(spec):
        _refused(_load_now, "data", spec)
    data = _refused(load_federated, "data", spec)
    model = _build(cfg, data)
    _buffers(cfg, model)
    _deterministic(cfg, data, model)
    _forward(cfg, data, model)
    fixed = DATASETS[cfg.dataset].num_classes if cfg.dataset in DATASETS else None
    return Checked(
        data=data.name,
        num_clients=data.num_clients,
        train=int(data.train_y.shape[0]),
        input_shape=data.input_shape,
        num_classes=data.num_classes,
        inferred=cfg.num_classes == 0 and fixed is None,
        d=sum(p.numel() for p in model.parameters()),
    )


def model_size(cfg: RunConfig) -> int:
    """The number of parameters of the run's model: from the data set's fixed shape where it has one
    (:func:`fedsketch.model.build.fixed_input`), else after loading the data (once per process) and checking
    it as :func:`check_one` does."""
    if build.fixed_input(cfg) is None:
        return check_one(cfg).d
    return sum(math.prod(shape) for shape in build.model_shapes(cfg))


def _refused(fn: Callable[P, R], what: str, *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn``'s value; its ValueError or TypeError as a one-line ConfigError prefixed with ``what``."""
    try:
        return fn(*args, **kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith(("setting ", what)) else f"{what}: {message}") from None


def _load_now(spec: DataSpec) -> None:
    """Load ``spec``'s data now, saying what and for how long, and hold it for the command (its Flower processes
    get it once every check has passed: :func:`check_runs`)."""
    print(f"fedsketch: loading {handoff.describe(spec)} ...", flush=True)
    loaded = handoff.read(spec)
    handoff.hold(spec, loaded)
    note = f"; {loaded.note}" if loaded.note else ""
    print(f"fedsketch: {loaded.name}: loaded in {loaded.seconds:.1f} s{note}", flush=True)


def _buffers(cfg: RunConfig, model: nn.Module) -> None:
    """Refuse a model with buffers (batch norm's running statistics): no method trains, sends or averages them,
    so the server's model would evaluate with their initial values."""
    named = [name for name, _ in model.named_buffers()]
    if not named:
        return
    shown = ", ".join(named[:3]) + (f" and {len(named) - 3} more" if len(named) > 3 else "")
    if cfg.model_norm == "batch" and not entry.is_reference(cfg.model):
        raise ConfigError(
            f"setting 'model-norm' is 'batch' for model {cfg.model!r}: batch norm keeps running statistics "
            f"({shown}) that no method trains or sends, so the server would evaluate with their initial values; "
            'use model-norm = "group" (or "layer")'
        )
    raise ConfigError(
        f"setting 'model': {cfg.model} keeps buffers ({shown}) that no method trains or sends, so the server "
        "would evaluate with their initial values; build it with torch.nn.GroupNorm or LayerNorm instead of "
        "BatchNorm (or BatchNorm with track_running_stats=False)"
    )


def _build(cfg: RunConfig, data: FederatedData) -> nn.Module:
    return _refused(
        build_model,
        "setting 'model'",
        cfg.model,
        data.input_shape,
        data.num_classes,
        seed=cfg.seed,
        norm=cfg.model_norm,
        hidden=cfg.model_hidden,
    )


def _deterministic(cfg: RunConfig, data: FederatedData, model: nn.Module) -> None:
    again = dict(_build(cfg, data).named_parameters())
    for name, param in model.named_parameters():
        if name not in again or not torch.equal(param, again[name]):
            raise ConfigError(
                f"setting 'model': {cfg.model} is not deterministic in its seed: parameter {name!r} differs "
                f"between two builds with seed {cfg.seed} (every Flower process builds its own copy)"
            )


def _forward(cfg: RunConfig, data: FederatedData, model: nn.Module) -> None:
    batch = data.train_x[:2]
    try:
        with torch.no_grad():
            out = model.eval()(batch)
    except Exception as exc:  # noqa: BLE001  # whatever the user's model raises, as one line
        raise ConfigError(
            f"setting 'model': {cfg.model} failed on a batch of shape {tuple(batch.shape)} from {data.name}: "
            f"{entry.raised(exc)}"
        ) from None
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (batch.shape[0], data.num_classes):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ConfigError(
            f"setting 'model': {cfg.model} gives {shape} for {batch.shape[0]} samples; "
            f"expected ({batch.shape[0]}, {data.num_classes}): one output per class of {data.name}"
        )
