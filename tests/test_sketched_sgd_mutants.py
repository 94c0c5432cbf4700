"""Sketched-SGD's bounds and messages, a client without momentum, and where a client's tables live.

Ivkin et al., NeurIPS 2019, Algorithm 2; each test pins a behaviour of
:mod:`fedsketch.algorithms.sketched_sgd` that tests/fedsketch/algorithms/test_sketched_sgd.py passes through without
checking (docs/mutation.md, the algorithms' section).
"""

from __future__ import annotations

import pytest
import torch

from fedsketch.algorithms import sketched_sgd

D = 12


def _params(k: int, factor: int, momentum: float = 0.0) -> sketched_sgd.SketchedSGDParams:
    return sketched_sgd.SketchedSGDParams(d=D, rows=3, cols=D, seed=1, k=k, candidate_factor=factor, momentum=momentum)


def test_k_and_the_candidates_may_be_1_or_d() -> None:
    assert _params(1, 1).num_candidates == 1
    assert _params(D, 1).num_candidates == D
    assert _params(4, 3).num_candidates == D


@pytest.mark.parametrize(
    ("k", "factor", "message"),
    [
        (0, 3, rf"^k must be in 1\.\.d={D}; got 0$"),
        (D + 1, 1, rf"^k must be in 1\.\.d={D}; got {D + 1}$"),
        (5, 3, rf"^candidate_factor \* k must be in 1\.\.d={D}; got 15$"),
        (1, 0, rf"^candidate_factor \* k must be in 1\.\.d={D}; got 0$"),
    ],
)
def test_out_of_range_sizes_are_refused_with_their_message(k: int, factor: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _params(k, factor)


def test_momentum_below_one_is_accepted_and_one_or_more_refused_with_its_message() -> None:
    assert _params(1, 1, momentum=1 - 2**-20).momentum == 1 - 2**-20
    for rho in (1.0, 1.5):
        with pytest.raises(ValueError, match=rf"^momentum must be in \[0, 1\); got {rho}$"):
            _params(1, 1, momentum=rho)


def test_a_client_without_momentum_keeps_none_and_accumulates_the_raw_updates() -> None:
    """``momentum = 0``: the client keeps no ``u_i`` (ClientState's documented None) and ``v_i`` sums the updates."""
    p = _params(2, 2)
    g = torch.arange(1.0, D + 1)
    state, _ = sketched_sgd.client_step(None, g, p)
    assert state.momentum is None and torch.equal(state.error, g)
    state, _ = sketched_sgd.client_step(state, g, p, torch.tensor([0, 3]))
    assert state.momentum is None
    expected = 2 * g
    expected[[0, 3]] = g[[0, 3]]
    assert torch.equal(state.error, expected)
    with_momentum, _ = sketched_sgd.client_step(None, g, _params(2, 2, momentum=0.5))
    assert with_momentum.momentum is not None and torch.equal(with_momentum.momentum, g)


def test_exact_values_of_the_wrong_shape_are_refused_with_both_shapes() -> None:
    cands = torch.tensor([1, 4, 9])
    with pytest.raises(ValueError, match=r"^exact values have shape \(2,\); candidates \(3,\)$"):
        sketched_sgd.server_step(sketched_sgd.ServerState(), _params(2, 1), cands, torch.zeros(2), [], [])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_client_on_cuda_sketches_on_cuda_and_answers_cuda_candidates_from_a_cpu_state() -> None:
    p = _params(2, 2, momentum=0.5)
    g = torch.arange(1.0, D + 1, device="cuda")
    state, table = sketched_sgd.client_step(None, g, p)
    assert table.device.type == state.error.device.type == "cuda"
    cpu_state, cpu_table = sketched_sgd.client_step(None, g.cpu(), p)
    assert torch.equal(table.cpu(), cpu_table)
    values = sketched_sgd.client_answer(cpu_state, torch.tensor([0, 5], device="cuda"))
    assert values.device.type == "cpu" and values.tolist() == [1.0, 6.0]
