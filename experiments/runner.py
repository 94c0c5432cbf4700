"""Plan and execute an experiment: strategies x seeds, each one Flower run.

An experiment file has a ``[run]`` table (any run setting, kebab-case), a
``[compare]`` table (``strategies``, ``seeds``) and optional
``[strategy.NAME]`` tables of per-strategy overrides. Every run is validated
before the first one starts, so a typo stops the whole experiment at once.
A run whose ``metrics.jsonl`` already reaches its last round with the same
config is not redone; an unfinished one is restarted cleanly, unless it
checkpoints (``checkpoint-every``) and left a checkpoint with the same config:
then it resumes from there.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsketch import checkpoint, runlog
from fedsketch.config import ConfigError, RunConfig

DEFAULT_CONFIG = Path(__file__).parent / "configs" / "default.toml"


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
        For unknown tables or keys, wrong types, or values out of range.
    FileNotFoundError
        If ``path`` does not exist.
    """
    if not path.exists():
        raise FileNotFoundError(f"experiment config {path} not found")
    with open(path, "rb") as f:
        doc = tomllib.load(f)
    unknown = set(doc) - {"run", "compare", "strategy"}
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {sorted(unknown)}; expected run, compare, strategy")
    compare = dict(doc.get("compare", {}))
    extra = set(compare) - {"strategies", "seeds"}
    if extra:
        raise ConfigError(f"{path}: unknown key(s) {sorted(extra)} in [compare]")
    names = strategies or list(compare.get("strategies", [doc.get("run", {}).get("strategy", "fetchsgd")]))
    n_seeds = seeds if seeds is not None else int(compare.get("seeds", 1))
    per_strategy = doc.get("strategy", {})
    base = RunConfig.from_mapping({**doc.get("run", {}), **(overrides or {})})
    for name, table in per_strategy.items():  # a typo in a table not run now is still a typo
        RunConfig.from_mapping({"strategy": name, **table}, base=base)
    runs: list[RunConfig] = []
    for name in names:
        cfg = RunConfig.from_mapping({"strategy": name, **per_strategy.get(name, {})}, base=base)
        cfg = RunConfig.from_mapping(dict(overrides or {}), base=cfg)  # command line wins
        runs.extend(RunConfig.from_mapping({"seed": cfg.seed + s}, base=cfg) for s in range(n_seeds))
    return Experiment(tuple(runs))


def is_finished(cfg: RunConfig) -> bool:
    """The run's metrics reach its last round and its saved config is this one."""
    path = runlog.run_dir(cfg)
    config_file = path / "config.json"
    if not config_file.exists():
        return False
    if json.loads(config_file.read_text(encoding="utf-8")) != cfg.to_mapping():
        return False
    rows = runlog.read_metrics(path)
    return bool(rows) and rows[-1].get("round") == cfg.num_rounds


def prepare(cfg: RunConfig) -> Path:
    """Clear an unfinished run's folder (unless it can resume) and write the run config Flower will read."""
    path = runlog.run_dir(cfg)
    if path.exists() and not is_resumable(cfg):
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    lines = [f"{key} = {_toml_value(value)}" for key, value in cfg.to_mapping().items()]
    (path / "run_config.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def is_resumable(cfg: RunConfig) -> bool:
    """The run checkpoints, left a checkpoint, and its saved config is this one: the strategy resumes it."""
    path = runlog.run_dir(cfg)
    config_file = path / "config.json"
    if not cfg.checkpoint_every or not (path / checkpoint.FILE).exists() or not config_file.exists():
        return False
    return bool(json.loads(config_file.read_text(encoding="utf-8")) == cfg.to_mapping())


def run_all(experiment: Experiment, execute: Callable[[RunConfig, Path], int]) -> list[tuple[RunConfig, str]]:
    """Execute every unfinished run; returns ``(config, outcome)`` per run."""
    results = []
    for cfg in experiment.runs:
        if is_finished(cfg):
            results.append((cfg, "already finished"))
            continue
        code = execute(cfg, prepare(cfg))
        results.append((cfg, "finished" if is_finished(cfg) else f"failed (exit code {code})"))
    return results


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    return repr(value)
