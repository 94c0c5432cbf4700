"""What a method is: one record that the clients, the server, the config check and the tools all read.

A method (FetchSGD, Rothchild et al., ICML 2020; or one of its baselines) is
what a client computes and uploads (:attr:`Client.encode`, :attr:`Wire.layout`),
what the server does with the round's uploads, as an explicit state transition
(:attr:`Server.init`, :attr:`Server.step`, the fedjax shape), and facts the rest
of the project derives from: the settings it reads and which of them may be
swept, whether its uploads add up (so they may be merged, clipped, noised and
summed securely), and how much memory its clients keep. Everything else (Flower
records, validation, bytes, sampling) is shared and knows no method by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from fedsketch.settings.declared import Declaration, Docs
from fedsketch.settings.setting import Setting

if TYPE_CHECKING:
    from fedsketch.config import RunConfig

Payload = dict[str, np.ndarray]
"""What one client puts on the wire: plain numpy arrays by name."""
State = dict[str, torch.Tensor]
"""What one client keeps between rounds (methods with client-side memory)."""
PayloadSpec = dict[str, tuple[tuple[int, ...], np.dtype]]
"""An exact payload layout: names, shapes and dtypes."""
PayloadCheck = Callable[[Payload], object]
"""For layouts that vary (sparse encodings, counts): decode the payload or raise ValueError."""
Layout = PayloadSpec | PayloadCheck


@dataclass(frozen=True)
class ClientUpdate:
    """One logical client's accepted contribution to a round."""

    cid: int
    payload: Payload
    num_examples: int
    loss: float
    upload_bytes: int
    node: int = 0
    decoded: object = None  # what a PayloadCheck returned (e.g. the dense vector), else None
    diagnostic: Payload | None = None  # diagnose-sketch's dense update (simulation only)


@dataclass(frozen=True)
class ClientJob:
    """One logical client's inputs besides its update."""

    cid: int
    server_round: int
    round_config: Mapping[str, int] = field(default_factory=dict)  # the round's :attr:`Wire.round_config`
    state: State = field(default_factory=dict)  # what it kept from its last round ({} the first time)
    request: Payload = field(default_factory=dict)  # arrays the server sent to it alone


@dataclass(frozen=True)
class Query:
    """A two-exchange method's question to a round's clients, from :attr:`Server.ask`.

    The round loop sends ``payload`` to the clients ``cids`` (each billed it), checks
    their answers against ``layout`` and calls the method's ``step`` with them
    (:attr:`Round.answers`); ``carry`` is what the step needs of the first half.
    """

    cids: tuple[int, ...]  # whom to ask: clients whose first uploads the round accepted
    payload: Payload  # the same arrays to every one of them
    layout: Layout  # what each answer must be
    carry: Mapping[str, torch.Tensor] = field(default_factory=dict)


Ask = Callable[[list["ClientUpdate"], Query], list["ClientUpdate"]]
"""The round loop's second request: the asked clients' first updates and the query; returns the accepted answers."""


@dataclass(frozen=True)
class Round:
    """What a server step sees of one round: its inputs, and a two-exchange method's query and answers."""

    server_round: int
    lr: float  # this round's learning rate (after the schedule)
    updates: list[ClientUpdate]  # accepted, validated, clipped, sorted by client id
    d: int
    device: torch.device
    query: Query | None = None  # what :attr:`Server.ask` asked this round (two-exchange methods)
    answers: tuple[ClientUpdate, ...] = ()  # the accepted answers to ``query``


ServerState = Any  # each method's own frozen dataclass of tensors
Encoder = Callable[[torch.Tensor, ClientJob, "RunConfig"], tuple[Payload, State]]
BatchEncoder = Callable[[list[torch.Tensor], list[ClientJob], "RunConfig"], list[tuple[Payload, State]]]


def no_round_config(cfg: RunConfig) -> dict[str, int]:
    """Most methods send nothing but the model and the common round keys."""
    return {}


def stateless(cfg: RunConfig) -> int:
    """Clients keep nothing between rounds."""
    return 0


def no_requests(state: ServerState, cids: list[int], cfg: RunConfig, d: int) -> dict[int, Payload]:
    """No arrays for single clients."""
    return {}


def no_report(state: ServerState, cfg: RunConfig) -> tuple[ServerState, dict[str, float]]:
    """No method-specific columns in the metrics rows."""
    return state, {}


def no_diagnostic(cfg: RunConfig, d: int) -> PayloadSpec | None:
    """No diagnostic arrays beside the payload."""
    return None


def no_check(cfg: RunConfig, d: int) -> None:
    """No limits beyond the shared ones (``k`` and ``download-k`` at most d)."""


def unit_sensitivity(cfg: RunConfig) -> float:
    """An upload's norm is the update's norm."""
    return 1.0


def payload_norm(u: ClientUpdate) -> float:
    """L2 (Frobenius) norm over every float array of the payload, accumulated in float64."""
    squares = sum(float(np.square(arr, dtype=np.float64).sum()) for arr in u.payload.values() if arr.dtype.kind == "f")
    return math.sqrt(squares)


def update_norm(u: ClientUpdate, cfg: RunConfig, d: int) -> float:
    """The norm ``clip-norm`` bounds: the decoded vector's if the layout decodes one, else the payload's."""
    if isinstance(u.decoded, torch.Tensor):
        return float(torch.linalg.vector_norm(u.decoded.double()))
    return payload_norm(u)


@dataclass(frozen=True)
class Client:
    """What a client computes and keeps.

    ``encode(update, job, cfg) -> (payload, state to keep)``; ``answer(state, query, cfg) ->
    (payload, state to keep or None: as it was)``, a second exchange's answer from the kept state
    (Sketched-SGD's exact values, PowerSGD's Q); ``state_vectors(cfg)``: how many float32 vectors
    of length d it keeps between rounds (0: stateless); ``commit``: when its new state counts as
    applied, once its upload was used in an applied round (``"upload"``) or only once it also
    answered the round's second exchange (``"answer"``); until then it is pending
    (:mod:`fedsketch.client.state`). ``encode_many(updates, jobs, cfg)``, optional: ``encode`` for
    each of a chunk of ``client-batching`` clients, computed together (:mod:`fedsketch.client.cohort`).
    """

    encode: Encoder
    answer: Callable[[State, Payload, RunConfig], tuple[Payload, State | None]] | None = None
    state_vectors: Callable[[RunConfig], int] = stateless
    commit: str = "upload"
    encode_many: BatchEncoder | None = None


@dataclass(frozen=True)
class Server:
    """The server's side, as explicit state transitions (the fedjax shape), all pure.

    ``init(cfg, d, device) -> state``; ``step(state, round, cfg) -> (state, Delta)``, the model
    moves by ``w -= Delta``; ``ask(state, round, cfg) -> Query``, two-exchange methods only: what
    to ask the round's clients before ``step``, which reads the answers in ``round.answers``
    (:func:`server_step`); ``requests(state, cids, cfg, d)``: arrays each sampled client receives
    with the model, where ``cids`` may hold ``wire.NEW_CLIENT`` (a deployed node's first contact);
    ``report(state, cfg)``: method-specific metrics columns, from (and resetting) tallies in its state.
    """

    init: Callable[[RunConfig, int, torch.device], ServerState]
    step: Callable[[ServerState, Round, RunConfig], tuple[ServerState, torch.Tensor]]
    ask: Callable[[ServerState, Round, RunConfig], Query] | None = None
    requests: Callable[[ServerState, list[int], RunConfig, int], dict[int, Payload]] = no_requests
    report: Callable[[ServerState, RunConfig], tuple[ServerState, dict[str, float]]] = no_report


@dataclass(frozen=True)
class Wire:
    """What travels: ``layout(cfg, d, server_round)``, the exact layout every payload must have or a
    decoder that checks it; ``round_config(cfg)``, keys every client of a round receives and echoes
    back (the sketch's seed and shape); ``diagnostic(cfg, d)``, arrays a client adds beside its
    payload for diagnostics only (``diagnose-sketch``)."""

    layout: Callable[[RunConfig, int, int], Layout]
    round_config: Callable[[RunConfig], dict[str, int]] = no_round_config
    diagnostic: Callable[[RunConfig, int], PayloadSpec | None] = no_diagnostic


@dataclass(frozen=True)
class Privacy:
    """What clipping and DP need: ``norm``, what ``clip-norm`` bounds (``None``: uploads cannot be
    clipped, as the method's declaration says); ``sensitivity``, an upload's Frobenius norm per unit
    of the update's norm (``sqrt(rows)`` for a sketch)."""

    norm: Callable[[ClientUpdate, RunConfig, int], float] | None = update_norm
    sensitivity: Callable[[RunConfig], float] = unit_sensitivity


@dataclass(frozen=True)
class Method:
    """One method (see the module docstring): what it is for the settings, and how it computes.

    ``declared``: its table in the .toml file beside its module (its name, the settings only it reads,
    the shared ones it uses and sweeps, whether its uploads add up); ``check``: raises ``ConfigError``
    if the settings do not fit a model of d parameters (run before training).

    Raises
    ------
    ValueError
        If ``privacy.norm`` contradicts the declaration's ``clip``.
    """

    declared: Declaration
    client: Client
    server: Server
    wire: Wire
    privacy: Privacy = Privacy()
    check: Callable[[RunConfig, int], None] = no_check

    def __post_init__(self) -> None:
        if (self.privacy.norm is not None) != self.declared.clip:
            raise ValueError(
                f"{self.name}'s uploads are declared clip = {self.declared.clip}, but its norm says otherwise"
            )

    @property
    def name(self) -> str:
        return self.declared.name

    @property
    def docs(self) -> Docs:
        return self.declared.docs

    @property
    def settings(self) -> tuple[Setting[Any], ...]:
        return self.declared.settings

    @property
    def uses(self) -> tuple[str, ...]:
        return self.declared.uses

    @property
    def sweep(self) -> Mapping[str, str]:
        return self.declared.sweep

    @property
    def linear(self) -> bool:
        """Its uploads add up (merged by a weighted sum, so they may be noised and summed securely)."""
        return self.declared.linear

    def reads(self, key: str) -> bool:
        """Whether a run of this method reads setting ``key`` (shared or its own)."""
        return self.declared.reads(key)


def server_step(
    method: Method, state: ServerState, rnd: Round, cfg: RunConfig, ask: Ask | None = None
) -> tuple[ServerState, torch.Tensor, Round]:
    """One round's server transition: for a two-exchange method, its query, the answers ``ask`` returns
    and its finishing step; for any other, its step. Returns the new state, ``Delta`` and the round as
    the step saw it (with the answers).

    Raises
    ------
    ValueError
        If the method asks a second question and no ``ask`` was given.
    """
    if method.server.ask is not None:
        if ask is None:
            raise ValueError(f"{method.name}'s step needs the round's second exchange")
        query = method.server.ask(state, rnd, cfg)
        wanted = set(query.cids)
        answers = ask([u for u in rnd.updates if u.cid in wanted], query)
        rnd = replace(rnd, query=query, answers=tuple(a for a in answers if a.cid in wanted))
    state, delta = method.server.step(state, rnd, cfg)
    return state, delta, rnd
