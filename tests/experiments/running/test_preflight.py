"""Settings that do not fit the model are refused before Flower starts; a failed run says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from experiments.analysis.results import failure_reason
from experiments.running.preflight import check_runs, model_size
from fedsketch.config import ConfigError, RunConfig
from fedsketch.data.run import load_data
from fedsketch.task import make_model


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
