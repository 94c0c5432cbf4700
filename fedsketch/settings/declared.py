"""Every setting's declaration in plain data, read without torch or any method's math.

``settings.toml`` holds every field of :class:`fedsketch.config.RunConfig` (default, meaning,
and the choices of the fixed ones). Beside each method module, ``fedsketch/methods/NAME.toml``
says what its methods are for the settings, a table each: ``upload``, ``keeps``, ``paper`` (its
line in docs/methods.md); ``linear`` (uploads add up: merged by a weighted sum, so they may be
noised and summed securely); ``clip`` (``clip-norm`` can bound an upload); ``keeps-state``
(whether its clients keep state between rounds: ``true``, ``false``, or a table of its own
settings' values under which they do); ``uses`` (the shared settings it reads besides the
common ones); ``sweep`` (the settings that change its upload, with their short names in a sweep
point's folder); and ``[NAME.settings.KEY]``, a setting only it reads (``type``, ``default``,
``doc``, and ``choices`` or ``minimum``/``maximum``). The method records
(:mod:`fedsketch.methods`) take these facts by name and add how the method computes; parsing and
checking a run's settings (:mod:`fedsketch.config`, :mod:`fedsketch.validate`) read the files by
path and never import that package.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedsketch.settings.setting import HasExtras, Setting

_HERE = Path(__file__).parent
TABLE: dict[str, dict[str, Any]] = tomllib.loads((_HERE / "settings.toml").read_text("utf-8"))
"""Every run setting's default and meaning (and choices, for the fixed ones), by key."""


def choices(key: str) -> tuple[str, ...]:
    """The values run setting ``key`` takes (settings.toml's ``choices``)."""
    return tuple(TABLE[key]["choices"])


@dataclass(frozen=True)
class Docs:
    """The methods table's line: what a client uploads, what it keeps, and the paper."""

    upload: str
    client_state: str
    paper: str


@dataclass(frozen=True)
class Declaration:
    """One method as the settings see it (its table in fedsketch/methods/NAME.toml)."""

    name: str
    docs: Docs
    linear: bool  # uploads add up: differential privacy and secure aggregation apply
    clip: bool  # `clip-norm` can bound an upload
    keeps_state: bool | Mapping[str, Any]  # or: only when these declared settings have these values
    settings: tuple[Setting[Any], ...]
    uses: tuple[str, ...]
    sweep: Mapping[str, str]

    def reads(self, key: str) -> bool:
        """Whether a run of this method reads setting ``key`` (shared or its own)."""
        return key in self.uses or any(s.key == key for s in self.settings)

    def keeps_state_with(self, cfg: HasExtras) -> bool:
        """Whether its clients keep state between rounds under ``cfg``'s settings."""
        if isinstance(self.keeps_state, bool):
            return self.keeps_state
        own = {s.key: s for s in self.settings}
        return all(own[key].of(cfg) == value for key, value in self.keeps_state.items())


KINDS: dict[str, type] = {"int": int, "float": float, "str": str, "bool": bool}


def _setting(key: str, row: Mapping[str, Any]) -> Setting[Any]:
    kind = KINDS[row["type"]]
    bounds = {name: kind(row[name]) for name in ("minimum", "maximum") if name in row}
    return Setting(key, kind, kind(row["default"]), row["doc"], choices=tuple(row.get("choices", ())), **bounds)


def _declaration(name: str, row: Mapping[str, Any]) -> Declaration:
    return Declaration(
        name=name,
        docs=Docs(row["upload"], row["keeps"], row["paper"]),
        linear=row["linear"],
        clip=row["clip"],
        keeps_state=row["keeps-state"],
        settings=tuple(_setting(key, setting) for key, setting in row.get("settings", {}).items()),
        uses=tuple(row["uses"]),
        sweep=dict(row.get("sweep", {})),
    )


def _read(folder: Path) -> dict[str, Declaration]:
    tables = [tomllib.loads(path.read_text("utf-8")) for path in sorted(folder.glob("*.toml"))]
    return {name: _declaration(name, row) for name, row in sorted(row for t in tables for row in t.items())}


DECLARATIONS: dict[str, Declaration] = _read(_HERE.parent / "methods")
"""Every method's declaration, by name."""
STRATEGIES: tuple[str, ...] = tuple(DECLARATIONS)
"""The methods' names: the choices of setting ``strategy``."""
SETTINGS: dict[str, Setting[Any]] = {s.key: s for m in DECLARATIONS.values() for s in m.settings}
"""The settings methods declare, by key."""
