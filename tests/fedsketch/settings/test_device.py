"""The ``device`` setting: ``cuda:N`` accepted and checked against the GPUs seen, a missing GPU refused first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from experiments.cli import main
from fedsketch.config import ConfigError, RunConfig
from fedsketch.settings import device


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:0", "cuda:1", "cuda:12"])
def test_the_setting_takes_a_card_by_number(name: str) -> None:
    assert RunConfig.from_mapping({"device": name}).device == name


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:one", "cuda:-1", "CUDA", "cuda:0:1"])
def test_other_names_are_refused_with_the_forms_it_takes(name: str) -> None:
    with pytest.raises(ConfigError, match=r"setting 'device' must be one of auto, cpu, cuda or 'cuda:N'"):
        RunConfig.from_mapping({"device": name})


def test_a_card_is_checked_against_the_cards_seen(monkeypatch: pytest.MonkeyPatch) -> None:
    """cuda:1 on a machine that shows two GPUs is taken, on one that shows one it is refused (no GPU needed)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    for name in ("cuda", "cuda:0", "cuda:1", "cpu", "auto"):
        device.check(name, visible=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with pytest.raises(ValueError) as caught:
        device.check("cuda:1", visible=1)
    assert str(caught.value) == (
        "setting 'device' is 'cuda:1' but PyTorch sees 1 CUDA GPU(s), cuda:0 to cuda:0 "
        "(CUDA_VISIBLE_DEVICES='3'; cuda:N counts the visible ones)"
    )
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with pytest.raises(ValueError, match=r"'cuda' but this machine shows no CUDA GPU to PyTorch \(CUDA_VISIBLE_DEVICES "
                       r"unset\); use"):  # fmt: skip
        device.check("cuda", visible=0)
    device.check("cpu", visible=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without a CUDA GPU")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_cuda_without_a_gpu_is_refused_before_anything_starts(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["run", "--set", f"device={name}", "--set", "num-rounds=1", "--no-plot", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    says = (
        rf"fedsketch: error: setting 'device' is '{name}' but this machine shows no CUDA GPU to PyTorch "
        r"\(CUDA_VISIBLE_DEVICES[^)]*\); use device = 'auto' \(the GPU when there is one\) or 'cpu'"
    )
    assert re.fullmatch(says, err), err
    assert not (tmp_path / "default").exists()  # no run folder
