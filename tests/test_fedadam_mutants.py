"""FedAdam's server step (Reddi et al., ICLR 2021, Algorithm 2): where its moments live, and its message.

Each test pins a behaviour of :mod:`fedsketch.algorithms.fedadam` that tests/fedsketch/algorithms/test_fedadam.py
passes through without checking (docs/mutation.md, the algorithms' section).
"""

from __future__ import annotations

import pytest
import torch

from fedsketch.algorithms import fedadam


def test_both_moments_live_on_the_device_asked_for() -> None:
    state = fedadam.init(4, "meta")
    assert state.m.device.type == state.v.device.type == "meta"
    assert state.m.shape == state.v.shape == (4,)
    cpu = fedadam.init(4)
    assert cpu.m.device.type == cpu.v.device.type == "cpu"


def test_an_update_of_the_wrong_shape_is_refused_with_both_shapes() -> None:
    with pytest.raises(ValueError, match=r"^update has shape \(5,\); expected \(4,\)$"):
        fedadam.step(fedadam.init(4), torch.zeros(5), 0.1, beta1=0.9, beta2=0.99, tau=1e-3)
