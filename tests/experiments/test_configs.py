"""Every shipped experiment file is valid and says what it reproduces and what to expect."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.running.preflight import model_size
from experiments.running.runner import load_experiment
from fedsketch.config import ConfigError
from fedsketch.data.run import load_data
from fedsketch.fit import check_against_model
from fedsketch.model.build import fixed_input
from fedsketch.task import make_model

CONFIGS = sorted((Path(__file__).parents[2] / "experiments" / "configs").glob("*.toml"))


def test_the_paper_settings_are_shipped() -> None:
    names = {p.stem for p in CONFIGS}
    assert {
        "default",
        "baselines",
        "fetchsgd_cifar10",
        "fetchsgd_cifar10_cpu",
        "fetchsgd_femnist",
        "fetchsgd_femnist_cpu",
        "sketched_sgd",
        "noniid_cpu",
    } <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_is_valid_and_documented(path: Path) -> None:
    runs = load_experiment(path).runs
    assert runs, f"{path.name} runs nothing"
    header = path.read_text(encoding="utf-8").split("[run]")[0]
    assert header.lstrip().startswith("#") and "fedsketch run" in header, f"{path.name}: no header saying how to run it"
    if path.stem not in ("default", "baselines"):
        assert "expect" in header.lower(), f"{path.name}: the header does not say what result to expect"
    if runs[0].dataset in ("synthetic", "synthetic_text"):  # generated data: the model-size checks run here too
        data = load_data(runs[0])
        d = sum(p.numel() for p in make_model(runs[0], data).parameters())
        for cfg in runs:
            check_against_model(cfg, d)
    for cfg in runs:  # a data set of fixed shape: the model's size without its files, as the command checks first
        if fixed_input(cfg) is not None:
            check_against_model(cfg, model_size(cfg))


def test_command_line_settings_apply_only_to_the_strategies_run_now() -> None:
    default = Path(__file__).parents[2] / "experiments" / "configs" / "default.toml"
    runs = load_experiment(default, {"diagnose-sketch": True}, strategies=["fetchsgd"]).runs
    assert [(r.strategy, r.diagnose_sketch) for r in runs] == [("fetchsgd", True)]
    with pytest.raises(ConfigError, match="diagnose-sketch"):
        load_experiment(default, {"diagnose-sketch": True}, strategies=["fedavg"])


def test_a_setting_only_some_methods_take_is_checked_against_the_methods_run_now() -> None:
    """The file's ``[run]`` table runs FetchSGD by default; ``download-k`` is valid for local_topk alone."""
    baselines = Path(__file__).parents[2] / "experiments" / "configs" / "baselines.toml"
    runs = load_experiment(baselines, {"download-k": 3000}, strategies=["local_topk"]).runs
    assert [(r.strategy, r.download_k) for r in runs] == [("local_topk", 3000)]
    with pytest.raises(ConfigError, match="download-k"):
        load_experiment(baselines, {"download-k": 3000}, strategies=["local_topk", "fetchsgd"])
