"""The method registry: every method has every part, and every tool reads the registry.

A method is one record (:mod:`fedsketch.methods`) over its declaration in plain data
(fedsketch/methods/NAME.toml); the config's choices, sweeps, the settings page and
the methods table derive from them, and the two must agree. Each method is also
driven once through its own parts on a tiny model: encode, the layout check,
init, step (with its second exchange, if it has one).
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments.running.sweep import SWEEP_KEYS
from fedsketch import methods
from fedsketch.algorithms import fetchsgd
from fedsketch.config import DECLARED, RunConfig, field_keys
from fedsketch.data.run import load_data
from fedsketch.methods import METHODS, NAMES, REGISTRY, ClientUpdate, Round, get_method
from fedsketch.methods.method import Layout, Payload, Query, server_step
from fedsketch.model.flat import num_params
from fedsketch.settings.declared import DECLARATIONS, STRATEGIES
from fedsketch.task import make_model
from fedsketch.validate import CHOICES
from tests.method_helpers import encode
from tests.tools.settings_doc import main as settings_doc

ROOT = Path(__file__).resolve().parents[3]
TINY = {"num-clients": 10, "clients-per-round": 3, "model-hidden": 8, "k": 20, "sketch-rows": 3, "sketch-cols": 64}


def test_the_registry_is_the_strategy_choice() -> None:
    assert tuple(REGISTRY) == NAMES == CHOICES["strategy"] and len(set(NAMES)) == len(METHODS)
    assert all(REGISTRY[name].name == name for name in NAMES)


@pytest.mark.parametrize("method", METHODS, ids=lambda m: m.name)
def test_every_method_has_every_part(method: object) -> None:
    m = get_method(method.name)  # type: ignore[attr-defined]
    for part in ("upload", "client_state", "paper"):
        assert isinstance(getattr(m.docs, part), str) and getattr(m.docs, part), f"{m.name} has no {part} line"
    sides = {
        "client": ("encode", "state_vectors"),
        "server": ("init", "step", "requests", "report"),
        "wire": ("layout", "round_config", "diagnostic"),
        "privacy": ("sensitivity",),
    }
    for side, parts in sides.items():
        for part in parts:
            assert callable(getattr(getattr(m, side), part)), f"{m.name}.{side}.{part} is not callable"
    assert callable(m.check)
    assert (m.server.ask is None) == (m.client.answer is None), f"{m.name}: a second exchange needs ask and answer"
    known = set(field_keys()) | set(DECLARED)
    assert set(m.uses) <= known, f"{m.name} reads unknown settings {set(m.uses) - known}"
    assert all(s.key in DECLARED for s in m.settings)
    for key in m.sweep:
        assert m.reads(key), f"{m.name} sweeps {key!r}, which it does not read"
        assert m.name in SWEEP_KEYS[key].strategies
    if m.linear:
        assert m.privacy.norm is not None, f"{m.name}: uploads that add up can be clipped"


@pytest.mark.parametrize("name", NAMES)
def test_every_method_runs_one_round_through_its_own_parts(name: str) -> None:
    """Encode three clients, check each payload against the layout, init, one step: a finite update of size d."""
    cfg = RunConfig.from_mapping({**TINY, "strategy": name})
    method = get_method(name)
    d = num_params(make_model(cfg, load_data(cfg)))  # methods may follow the model's shapes (PowerSGD)
    requests = method.server.requests(method.server.init(cfg, d, torch.device("cpu")), [0, 1, 2], cfg, d)
    gen = torch.Generator().manual_seed(1)
    updates, kept = [], {}
    for cid in range(3):
        payload, kept[cid] = encode(cfg, torch.randn(d, generator=gen), cid=cid, request=requests.get(cid))
        assert bool(kept[cid]) == (method.client.state_vectors(cfg) > 0)
        decoded = _checked(method.wire.layout(cfg, d, 1), payload)
        updates.append(ClientUpdate(cid, payload, 10 + cid, 0.5, 0, decoded=decoded))

    def ask(asked: list[ClientUpdate], query: Query) -> list[ClientUpdate]:
        assert method.client.answer is not None, f"{name} asked for a second exchange but has no answer"
        answers = [(u, method.client.answer(kept[u.cid], query.payload, cfg)[0]) for u in asked]
        return [ClientUpdate(u.cid, a, u.num_examples, 0.0, 0, decoded=_checked(query.layout, a)) for u, a in answers]

    state = method.server.init(cfg, d, torch.device("cpu"))
    state, delta, _ = server_step(method, state, Round(1, 0.1, updates, d, torch.device("cpu")), cfg, ask)
    assert delta.shape == (d,) and bool(torch.isfinite(delta).all()) and bool(delta.abs().sum() > 0)


def _checked(layout: Layout, payload: Payload) -> object:
    """What the server's validation makes of a payload: decoded, or checked against the exact layout."""
    if callable(layout):
        return layout(payload)
    assert set(payload) == set(layout)
    for key, (shape, dtype) in layout.items():
        assert payload[key].shape == shape and payload[key].dtype == dtype
    return None


def test_pyproject_and_the_settings_page_list_every_declared_setting() -> None:
    assert settings_doc(["--check"]) == 0, "docs/settings.md is out of date: run python -m tests.tools.settings_doc"
    text = (ROOT / "pyproject.toml").read_text()
    for key in DECLARED:
        assert f"\n{key} = " in text, f"pyproject.toml's [tool.flwr.app.config] lacks {key}"
    assert len(fields(RunConfig)) - 1 + len(DECLARED) == len(RunConfig().to_mapping())


def test_the_methods_page_lists_every_method() -> None:
    text = (ROOT / "docs" / "methods.md").read_text()
    missing = [m.name for m in METHODS if f"`{m.name}`" not in text]
    assert not missing, f"docs/methods.md does not list {missing}"


def test_every_sweep_key_is_a_setting() -> None:
    known = set(field_keys()) | set(DECLARED)
    assert set(SWEEP_KEYS) <= known
    assert np.all([bool(key.strategies) for key in SWEEP_KEYS.values()])


def test_the_records_and_the_declarations_name_the_same_methods(monkeypatch: pytest.MonkeyPatch) -> None:
    assert NAMES == STRATEGIES
    assert all(get_method(name).declared is DECLARATIONS[name] for name in NAMES)
    monkeypatch.setattr(methods, "STRATEGIES", (*STRATEGIES, "newcomer"))
    with pytest.raises(ValueError) as caught:
        methods._discover()
    assert str(caught.value) == (
        f"the methods' .toml files declare {sorted([*STRATEGIES, 'newcomer'])} but the modules define {sorted(STRATEGIES)}"
    )


KEPT_STATE = [
    {"strategy": name, **over}
    for name in STRATEGIES
    for over in ({}, {"momentum": 0.0}, {"local-topk-error": "none"}, {"signsgd-variant": "majority"})
]


@pytest.mark.parametrize("settings", KEPT_STATE, ids=lambda s: "-".join(map(str, s.values())))
def test_a_declaration_says_whether_clients_keep_state_as_the_method_keeps_it(settings: dict[str, object]) -> None:
    """What the settings' checks read (its .toml file) and what the clients do (the record) agree."""
    cfg = RunConfig.from_mapping(settings)
    method = get_method(cfg.strategy)
    assert method.declared.keeps_state_with(cfg) == (method.client.state_vectors(cfg) > 0)


def test_every_declared_setting_takes_its_own_default_in_its_own_type() -> None:
    for setting in DECLARED.values():
        assert type(setting.default) is setting.kind and setting.check(setting.default) == setting.default
        for bound in (setting.minimum, setting.maximum):
            assert bound is None or type(bound) is setting.kind
    assert DECLARED["error-feedback"].choices == fetchsgd.VARIANTS
    assert DECLARED["lr-placement"].choices == fetchsgd.LR_PLACEMENTS


def test_a_record_whose_norm_contradicts_its_declaration_is_refused() -> None:
    powersgd, fedavg = get_method("powersgd"), get_method("fedavg")
    with pytest.raises(
        ValueError, match=r"^powersgd's uploads are declared clip = False, but its norm says otherwise$"
    ):
        replace(powersgd, privacy=fedavg.privacy)
    with pytest.raises(ValueError, match=r"^fedavg's uploads are declared clip = True, but its norm says otherwise$"):
        replace(fedavg, privacy=powersgd.privacy)
