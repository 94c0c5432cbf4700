"""Sketch settings that cannot work are refused; those the regime map says fail are warned of, in numbers.

The command's refusal itself (exit 2, one line, no run folder) is a case of tests/experiments/running/test_preflight_bad_data.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from experiments.cli import main
from experiments.running.preflight import model_size
from experiments.running.runner import describe, load_experiment
from fedsketch import sketch_regime
from fedsketch.config import ConfigError, RunConfig
from fedsketch.fit import check_against_model
from fedsketch.model.build import fixed_input

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "experiments" / "configs").glob("*.toml"))


def _cfg(**settings: object) -> RunConfig:
    return RunConfig.from_mapping({key.replace("_", "-"): value for key, value in settings.items()})


@pytest.mark.parametrize("strategy", ["fetchsgd", "sketched_sgd"])
def test_fewer_columns_than_k_is_refused_naming_both_settings(strategy: str) -> None:
    cfg = _cfg(strategy=strategy, sketch_rows=1, sketch_cols=100, k=5000)
    with pytest.raises(ConfigError, match=r"settings 'sketch-cols' \(100\) and 'k' \(5,000\) do not fit") as caught:
        check_against_model(cfg, 999_985)
    assert f"{strategy} recovers k coordinates" in str(caught.value)
    check_against_model(_cfg(strategy=strategy, sketch_cols=5000, k=5000), 999_985)  # one column per k: measured


def test_methods_that_do_not_sketch_are_not_held_to_it() -> None:
    for strategy in ("fedavg", "local_topk", "true_topk"):
        check_against_model(_cfg(strategy=strategy, sketch_cols=100, k=5000), 999_985)


def test_a_sketch_far_narrower_than_the_map_measured_is_warned_of_in_numbers() -> None:
    cfg = _cfg(sketch_rows=3, sketch_cols=1000, k=100)
    (line,) = sketch_regime.shape_warnings(cfg, 999_985, describe(cfg))
    assert line.startswith("fetchsgd seed 0: a 3 x 1,000 sketch is 3,000 counters for d = 999,985 coordinates, 333")
    assert "measured up to 35, where FetchSGD already trailed true top-k by 8.7-32.3 points" in line
    assert sketch_regime.shape_warnings(cfg, 35 * 3000, "x") == []  # at the map's edge: measured
    assert sketch_regime.shape_warnings(cfg, 35 * 3000 + 1, "x") != []
    sketched = _cfg(strategy="sketched_sgd", sketch_rows=3, sketch_cols=1000, k=100)
    assert sketch_regime.shape_warnings(sketched, 999_985, "x") == []  # the map measured FetchSGD


def test_a_fetchsgd_sketch_under_ten_columns_per_k_gets_the_maps_note() -> None:
    note = sketch_regime.cols_note(_cfg(sketch_cols=250, k=100), "run a")
    assert note is not None and note.startswith("run a: cols/k = 2.5 is below the 10 columns per k at which the")
    assert sketch_regime.cols_note(_cfg(sketch_cols=999, k=100), "x") is not None
    assert sketch_regime.cols_note(_cfg(sketch_cols=1000, k=100), "x") is None  # ten per k: where the map found it
    for strategy in ("sketched_sgd", "true_topk"):  # the map measured FetchSGD
        assert sketch_regime.cols_note(_cfg(strategy=strategy, sketch_cols=250, k=100), "x") is None


def test_the_command_prints_the_warning_before_it_plans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sets = ["--set", "sketch-rows=1", "--set", "sketch-cols=3000", "--set", "k=3000", "--set", "num-rounds=2"]
    assert main(["plan", *sets, "--strategies", "fetchsgd", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    warning = "fedsketch: warning: fetchsgd seed 0: a 1 x 3,000 sketch is 3,000 counters for d = 299,018 coordinates"
    assert warning in out and out.index(warning) < out.index("Plan of default")


def _regime_rows() -> list[tuple[str, float, float]]:
    """docs/regime.md's dense-model tables: (rows x cols, upload compression, gap to true top-k in points)."""
    out = []
    for line in (ROOT / "docs" / "regime.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and re.fullmatch(r"\d+ x [\d,]+", cells[1]) and cells[3].endswith("x"):
            out.append((cells[1], float(cells[3][:-1]), float(cells[8])))
    return out


def test_the_warnings_figures_are_the_regime_maps() -> None:
    """The narrowest sketches the map ran, in model coordinates a counter, and FetchSGD's gaps there."""
    regime = [p for p in CONFIGS if p.stem.startswith("regime_")]
    ratios = [
        model_size(cfg) / (cfg.sketch_rows * cfg.sketch_cols)
        for path in regime
        for cfg in load_experiment(path).runs
        if cfg.strategy == "fetchsgd"
    ]
    assert math.ceil(max(ratios)) == sketch_regime.MAP_COORDINATES_PER_COUNTER
    rows = _regime_rows()
    assert len(rows) == 18
    narrowest = [-gap for _, compression, gap in rows if compression > 30]
    assert len(narrowest) == 6 and (min(narrowest), max(narrowest)) == sketch_regime.MAP_GAPS


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_passes_the_sketch_checks(path: Path) -> None:
    """No refusal; and, where the model's size is known without data files, no warning either."""
    sizes: dict[tuple[object, ...], int] = {}
    for cfg in load_experiment(path).runs:
        sketch_regime.refuse(cfg)
        if fixed_input(cfg) is not None or cfg.dataset.startswith("synthetic"):
            key = (cfg.dataset, cfg.model, cfg.model_hidden, cfg.model_norm)
            if key not in sizes:
                sizes[key] = model_size(cfg)
            assert sketch_regime.shape_warnings(cfg, sizes[key], describe(cfg)) == [], describe(cfg)
