"""Sketched-SGD with its second round of communication, as explicit state transitions.

Ivkin, Rothchild, Ullah, Braverman, Stoica and Arora, "Communication-efficient
Distributed SGD with Sketching", NeurIPS 2019 (Algorithm 2, and the authors'
``sketchedsgd`` code with ``p2 > 0``). Unlike FetchSGD, the *workers* keep
momentum ``u_i`` and error accumulation ``v_i``; the server only finds the heavy
coordinates::

    client i, phase 1   u_i = rho * u_i + g_i;  v_i = v_i + u_i;  upload S(v_i)
    server              S = sum_i p_i S(v_i);  C = the P*k largest |estimates| of S
    client i, phase 2   upload v_i[C] exactly
    server              Delta = top-k of sum_i p_i v_i[C];  w = w - lr * Delta
    client i            u_i = v_i = 0 at support(Delta)

``p_i`` are the example weights (a federated mean where the paper sums workers).
Both phases happen within one round, and both are paid for in bytes.

In federated learning a client is not asked again next round, so it learns
``support(Delta)`` *the next time it is sampled*, before it touches ``u_i`` and
``v_i`` again: the server keeps each client's pending support
(:class:`ServerState`). Zeroing then is the same as zeroing at once, because
nothing else reads or writes a client's vectors in between.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from fedsketch.sketch.count_sketch import CountSketch


@dataclass(frozen=True)
class SketchedSGDParams:
    """Hyper-parameters fixed for a whole run.

    ``candidate_factor`` is the paper's P: the server asks for ``P * k`` exact values.
    """

    d: int
    rows: int
    cols: int
    seed: int
    k: int
    candidate_factor: int = 3
    momentum: float = 0.9

    def __post_init__(self) -> None:
        if not 1 <= self.k <= self.d:
            raise ValueError(f"k must be in 1..d={self.d}; got {self.k}")
        if not 1 <= self.candidate_factor * self.k <= self.d:
            raise ValueError(f"candidate_factor * k must be in 1..d={self.d}; got {self.candidate_factor * self.k}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1); got {self.momentum}")

    @property
    def num_candidates(self) -> int:
        """``P * k``: how many coordinates the second phase asks for."""
        return self.candidate_factor * self.k


@dataclass(frozen=True)
class ClientState:
    """One client's memory: momentum ``u_i`` (``None`` without momentum) and error ``v_i``."""

    error: torch.Tensor
    momentum: torch.Tensor | None = None


@dataclass(frozen=True)
class ServerState:
    """Per client, the support of the last update its values went into, not yet zeroed there."""

    pending: Mapping[int, torch.Tensor] = field(default_factory=dict)


def client_step(
    state: ClientState | None, update: torch.Tensor, params: SketchedSGDParams, applied: torch.Tensor | None = None
) -> tuple[ClientState, torch.Tensor]:
    """Phase 1 on a client: zero at ``applied`` (its pending support), accumulate, sketch ``v_i``.

    Returns the new state and the ``rows x cols`` table to upload.
    """
    update = update.detach().float()
    if state is None:
        zeros = torch.zeros_like(update)
        state = ClientState(error=zeros, momentum=zeros.clone() if params.momentum > 0 else None)
    error = state.error.clone()
    momentum = state.momentum.clone() if state.momentum is not None else None
    if applied is not None and applied.numel():
        error[applied] = 0.0
        if momentum is not None:
            momentum[applied] = 0.0
    if momentum is not None:
        momentum = params.momentum * momentum + update
        error += momentum
    else:
        error += update
    sketch = CountSketch(params.d, params.rows, params.cols, seed=params.seed, device=error.device)
    return ClientState(error=error, momentum=momentum), sketch.accumulate(error).table


def client_answer(state: ClientState, candidates: torch.Tensor) -> torch.Tensor:
    """Phase 2 on a client: the exact values of ``v_i`` at the candidates."""
    return state.error[candidates.to(state.error.device)]


def candidates(merged: torch.Tensor, params: SketchedSGDParams) -> torch.Tensor:
    """The ``P * k`` coordinates with the largest estimates in the merged table, ascending."""
    sketch = CountSketch.from_table(merged, params.d, params.seed)
    return torch.sort(sketch.topk(params.num_candidates)[0]).values


def server_step(
    state: ServerState,
    params: SketchedSGDParams,
    cands: torch.Tensor,
    exact: torch.Tensor,
    sketched: list[int],
    answered: list[int],
) -> tuple[ServerState, torch.Tensor, torch.Tensor]:
    """Phase 2 on the server: the top-k of the exact weighted sums at the candidates.

    Parameters
    ----------
    state
        Pending supports from earlier rounds.
    cands
        The candidates (ascending), as sent to the clients.
    exact
        ``sum_i p_i v_i[cands]`` over the clients that answered phase 2.
    sketched
        Clients whose phase-1 upload was accepted: they applied their pending support.
    answered
        Clients whose exact values went into ``exact``: they must zero ``support(Delta)``.

    Returns
    -------
    The new state, and the update's indices and values (``w -= lr * Delta``).
    """
    if exact.shape != cands.shape:
        raise ValueError(f"exact values have shape {tuple(exact.shape)}; candidates {tuple(cands.shape)}")
    top = torch.topk(exact.abs(), min(params.k, exact.numel()), sorted=False).indices
    indices = cands[top]
    pending = {cid: sup for cid, sup in state.pending.items() if cid not in sketched}
    pending.update({cid: indices for cid in answered})
    return ServerState(pending=pending), indices, exact[top]
