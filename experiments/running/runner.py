"""Plan and execute an experiment: strategies x seeds, each one Flower run.

An experiment file has a ``[run]`` table (any run setting, kebab-case), a
``[compare]`` table (``strategies``, ``seeds``), optional
``[strategy.NAME]`` tables of per-strategy overrides, and an optional
``[sweep]`` table of values to run each strategy at (``experiments/running/sweep.py``).
Every run is validated before the first one starts, so a typo stops the whole
experiment at once.
A run whose ``metrics.jsonl`` already reaches its last round with the same
config is not redone; an unfinished one is restarted cleanly, unless it left a
checkpoint (``checkpoint-every``) with the same config: then it resumes from
there. "The same" leaves out the settings a resume may change (timeouts, the
evaluation's cadence, tracking: :mod:`fedsketch.server.resumable`); a checkpoint of a run with
other settings is refused before anything starts, never deleted unless the
command is told to (``--restart``). A run stopped by a signal is one of those
unfinished runs (``docs/stopping.md``). Each run that ends (or was already finished) is
also written to TensorBoard and MLflow where its setting ``tracking`` asks
(``experiments/analysis/tracking.py``).
"""

from __future__ import annotations

import json
import shutil
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from experiments.running import stopping
from fedsketch.server import resumable, runlog
from fedsketch.server.runlog import RunSpec
from fedsketch.settings.setting import ConfigError

if TYPE_CHECKING:  # planning needs them (and torch); running a plan does not (experiments/running/command_plan.py)
    from experiments.running import sweep
    from fedsketch.config import RunConfig

Run = TypeVar("Run", bound=RunSpec)
DEFAULT_CONFIG = Path(__file__).parents[1] / "configs" / "default.toml"


@dataclass(frozen=True)
class Experiment:
    """The runs an experiment file asks for, already validated."""

    runs: tuple[RunConfig, ...]


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """``["k=100", "lr=0.1", "dataset=\\"mnist\\""]`` -> typed values (TOML syntax; bare words are strings)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {pair!r} is not of the form key=value")
        try:
            out[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = value.strip()
    return out


def load_experiment(
    path: Path,
    overrides: Mapping[str, Any] | None = None,
    seeds: int | None = None,
    strategies: list[str] | None = None,
) -> Experiment:
    """Read an experiment file and expand it into validated runs.

    Raises
    ------
    ConfigError
        For unknown tables or keys, wrong types, or values out of range; for a
        ``[sweep]`` key that cannot be swept, applies to no strategy of the
        file, or is also set on the command line.
    FileNotFoundError
        If ``path`` does not exist.
    """
    from experiments.running import sweep
    from fedsketch.config import RunConfig

    if not path.is_file():
        raise FileNotFoundError(f"experiment config {path} not found" + (" (it is a folder)" if path.is_dir() else ""))
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    unknown = set(doc) - {"run", "compare", "strategy", "sweep"}
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {sorted(unknown)}; expected run, compare, strategy, sweep")
    compare = dict(doc.get("compare", {}))
    extra = set(compare) - {"strategies", "seeds"}
    if extra:
        raise ConfigError(f"{path}: unknown key(s) {sorted(extra)} in [compare]")
    listed = list(compare.get("strategies", [doc.get("run", {}).get("strategy", "fetchsgd")]))
    names = strategies or listed
    n_seeds = _seeds(seeds, compare, path)
    per_strategy = doc.get("strategy", {})
    # The base is checked as the first strategy run now sees it: a setting that only some methods
    # take (``--strategies local_topk --set download-k=3000``) is valid for the runs it reaches.
    base = RunConfig.from_mapping({**doc.get("run", {}), "strategy": names[0], **(overrides or {})})
    # A typo in a table not run now is still a typo; command-line settings apply only to the runs made now
    # (``--strategies fetchsgd --set diagnose-sketch=true`` must not be refused for fedavg's table).
    file_base = RunConfig.from_mapping(doc.get("run", {}))
    for name, table in per_strategy.items():
        RunConfig.from_mapping({"strategy": name, **table}, base=base if name in names else file_base)
    grid = _parse_sweep(doc.get("sweep", {}), path, listed, base, overrides or {})
    runs: list[RunConfig] = []
    for name in names:
        table = {"strategy": name, **per_strategy.get(name, {})}
        for point in sweep.points(grid, name):
            runs.extend(_point_runs(base, table, point, overrides or {}, n_seeds))
    return Experiment(tuple(runs))


def _parse_sweep(
    table: Mapping[str, Any], path: Path, listed: list[str], base: RunConfig, overrides: Mapping[str, Any]
) -> sweep.Sweep:
    """The ``[sweep]`` table, checked against the rest of the experiment.

    A key both swept and set with ``--set`` is refused rather than resolved
    either way: one of the two would be silently dropped.
    """
    from experiments.running import sweep

    grid = sweep.parse_sweep(table, str(path))
    sweep.check_applies(grid, listed, str(path))
    clash = sorted(set(grid) & set(overrides))
    if clash:
        raise ConfigError(f"{path}: {clash} swept in [sweep] and also set on the command line; drop one")
    if runlog.POINT_SEP in base.experiment:
        raise ConfigError(f"experiment name {base.experiment!r} must not contain {runlog.POINT_SEP!r}")
    return grid


def _seeds(given: int | None, compare: Mapping[str, Any], path: Path) -> int:
    """The number of seeds: ``given`` (the command line, the API), else the file's ``[compare] seeds``, else 1.

    Raises
    ------
    ConfigError
        For a count that is not a whole number of at least 1, naming where it came from.
    """
    where, value = ("seeds", given) if given is not None else (f"{path}: [compare] seeds", compare.get("seeds", 1))
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where} must be a whole number; got {value!r}")
    if value < 1:
        raise ConfigError(f"{where} must be at least 1; got {value}")
    return value


def _point_runs(
    base: RunConfig, table: Mapping[str, Any], point: Mapping[str, Any], overrides: Mapping[str, Any], n_seeds: int
) -> list[RunConfig]:
    """One strategy's runs at one sweep point, one per seed: file, then point, then command line."""
    from experiments.running import sweep
    from fedsketch.config import RunConfig

    cfg = RunConfig.from_mapping({**table, **point}, base=base)
    cfg = RunConfig.from_mapping(dict(overrides), base=cfg)  # command line wins
    if point:
        cfg = RunConfig.from_mapping(
            {"experiment": cfg.experiment + runlog.POINT_SEP + sweep.point_name(point)}, base=cfg
        )
    return [RunConfig.from_mapping({"seed": cfg.seed + s}, base=cfg) for s in range(n_seeds)]


def describe(cfg: RunSpec) -> str:
    """``fetchsgd rows3-cols5000 seed 1``: which run this is, for progress and summaries."""
    return " ".join(part for part in (cfg.strategy, runlog.sweep_point(cfg), f"seed {cfg.seed}") if part)


def saved_settings(cfg: RunSpec) -> dict[str, Any] | None:
    """The settings the run's folder was last run with (its ``config.json``); ``None`` if it has none."""
    config_file = runlog.run_dir(cfg) / "config.json"
    if not config_file.exists():
        return None
    return dict(json.loads(config_file.read_text(encoding="utf-8")))


def is_finished(cfg: RunSpec) -> bool:
    """The run's metrics reach its last round and its saved config is this one, but for settings a resume may
    change (:data:`fedsketch.server.resumable.RUNTIME_KEYS`: a timeout, the evaluation's cadence)."""
    saved = saved_settings(cfg)
    if saved is None or resumable.differences(saved, cfg.to_mapping()):
        return False
    path = runlog.run_dir(cfg)
    rows = runlog.read_metrics(path)
    return bool(rows) and rows[-1].get("round") == cfg.num_rounds and not runlog.broken(path)


def check_resumes(runs: Sequence[RunSpec], restart: bool = False) -> list[RunSpec]:
    """Refuse runs whose folder holds a checkpoint of a run with other settings, before anything starts; with
    ``restart``, delete those folders (checkpoint and all) instead. Returns the runs so deleted.

    Raises
    ------
    ConfigError
        One line naming the run's folder, each setting that differs and its two values, and the ways out.
    """
    deleted = []
    for cfg in runs:
        path, saved = runlog.run_dir(cfg), saved_settings(cfg)
        if saved is None or not (path / runlog.CHECKPOINT).exists():
            continue
        differ = resumable.differences(saved, cfg.to_mapping())
        if not differ:
            continue
        if not restart:
            raise ConfigError(
                f"{path} holds a checkpoint of a run with other settings ({resumable.describe(differ)}): set them "
                "back to resume it, choose another --out, or add --restart to delete it and start over"
            )
        shutil.rmtree(path)
        deleted.append(cfg)
    return deleted


def prepare(cfg: RunSpec) -> Path:
    """Clear an unfinished run's folder (unless it resumes from its checkpoint) and write the run config Flower
    will read.

    Raises
    ------
    ConfigError
        If the folder holds a checkpoint of a run with other settings (:func:`check_resumes`): it is never deleted
        here.
    """
    path = runlog.run_dir(cfg)
    if path.exists() and not is_resumable(cfg):
        check_resumes([cfg])
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    runlog.clear_status(path)  # a run resumed after an interruption is no longer interrupted
    (path / "run_config.toml").write_text(run_config_toml(cfg), encoding="utf-8")
    return path


def run_config_toml(cfg: RunSpec) -> str:
    """Every setting of the run, one ``key = value`` line each: the file ``flwr run --run-config`` reads."""
    return "".join(f"{key} = {_toml_value(value)}\n" for key, value in cfg.to_mapping().items())


def is_resumable(cfg: RunSpec) -> bool:
    """The run left a checkpoint with the same settings but for those a resume may change: the strategy resumes it."""
    saved = saved_settings(cfg)
    if saved is None or not (runlog.run_dir(cfg) / runlog.CHECKPOINT).exists():
        return False
    return not resumable.differences(saved, cfg.to_mapping())


def run_all(runs: Sequence[Run], execute: Callable[[Run, Path], int]) -> list[tuple[Run, str]]:
    """Execute every unfinished run of ``runs`` (an experiment's, or a plan's); returns ``(run, outcome)`` per run.

    A run stopped on request (:mod:`experiments.running.stopping`) is marked as such in
    its folder; when the whole command was interrupted, the later runs are
    listed as not started.
    """
    results: list[tuple[Run, str]] = []
    for i, cfg in enumerate(runs):
        if is_finished(cfg):
            results.append((cfg, "already finished"))
            _track(cfg, results[-1][1])
            continue
        path = prepare(cfg)
        stopping.note_run(path, cfg.num_rounds)
        try:
            code = execute(cfg, path)
        except stopping.Stop as stop:
            results.append((cfg, stopping.record(path, cfg.num_rounds, stop)))
            if isinstance(stop, stopping.Interrupted):
                return results + [(later, "not started") for later in runs[i + 1 :]]
            _track(cfg, results[-1][1])
            continue
        broken = runlog.broken(path)
        results.append((cfg, f"failed: {broken}" if broken else "finished" if is_finished(cfg) else _failed(code)))
        _track(cfg, results[-1][1])
    return results


def _track(cfg: RunSpec, outcome: str) -> None:
    """The ended run also in TensorBoard and MLflow, where its setting ``tracking`` asks
    (:mod:`experiments.analysis.tracking`: from its ``metrics.jsonl``, in this process, not Flower's)."""
    from experiments.analysis import tracking

    tracking.record(cfg, describe(cfg), outcome)


def _failed(code: int) -> str:
    """A run that did not reach its last round: Flower's exit code where it gave one, else that it stopped short."""
    return f"failed (exit code {code})" if code else "failed: stopped before its last round (Flower exited 0)"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)
