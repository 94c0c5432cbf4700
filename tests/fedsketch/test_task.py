"""From a run config to what a process trains with (``fedsketch/task.py``): the device, the local training spec."""

from __future__ import annotations

import pytest
import torch

from fedsketch.config import RunConfig
from fedsketch.task import local_spec, resolve_device
from fedsketch.training.local import LocalSpec


def test_the_local_spec_is_the_runs_client_settings() -> None:
    cfg = RunConfig.from_mapping(
        {
            "strategy": "fedavg",
            "client-update": "delta",
            "local-batch-size": 7,
            "local-steps": 3,
            "client-lr": 0.25,
            "weight-decay": 0.001,
            "client-momentum": 0.5,
        }
    )
    assert local_spec(cfg) == LocalSpec("delta", 7, 3, 0.25, 0.001, 0.5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA GPU")
def test_auto_is_the_cpu_without_a_gpu_and_a_gpu_it_lacks_is_refused() -> None:
    assert resolve_device("auto") == resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(
        ValueError, match=r"^setting 'device' is 'cuda:1' but this machine shows no CUDA GPU to PyTorch"
    ):
        resolve_device("cuda:1")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_is_the_gpu_and_the_model_is_built_there() -> None:
    from fedsketch.data.run import load_data
    from fedsketch.task import make_model

    assert resolve_device("auto") == torch.device("cuda")
    cfg = RunConfig.from_mapping({"device": "auto"})
    assert all(p.device.type == "cuda" for p in make_model(cfg, load_data(cfg)).parameters())
