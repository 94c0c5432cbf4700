"""One flat, typed run configuration, parsed once at the edge.

Every setting a run needs is a field of :class:`RunConfig` or a
:class:`~fedsketch.settings.setting.Setting` that a method declares
(QSGD's levels, Sketched-SGD's candidate factor; fedsketch/methods/NAME.toml). Outside Python the keys are
kebab-case (``sketch-cols``), exactly as in ``[tool.flwr.app.config]`` of
``pyproject.toml`` and in experiment files. Parsing rejects unknown keys, wrong
types and values out of range with a message that names the key, before any
training starts (:mod:`fedsketch.validate`), without importing torch or any
method's math. docs/settings.md is generated from the fields' docs
(``python -m tests.tools.settings_doc``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, get_type_hints

from fedsketch import validate
from fedsketch.settings import suggest
from fedsketch.settings.declared import SETTINGS as DECLARED
from fedsketch.settings.declared import TABLE
from fedsketch.settings.fields import Fields
from fedsketch.settings.setting import ConfigError, coerce, parse_extras

__all__ = ["DECLARED", "TABLE", "ConfigError", "RunConfig"]


@dataclass(frozen=True)
class RunConfig(Fields):
    """Every setting of one run (one strategy, one seed), parsed and checked when built (the fields: :class:`Fields`)."""

    def __post_init__(self) -> None:
        unknown = sorted(set(dict(self.extras)) - set(DECLARED))
        if unknown:
            raise ConfigError(f"unknown setting '{unknown[0]}'")
        object.__setattr__(self, "extras", parse_extras(DECLARED, dict(self.extras)))
        validate.check(self)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], base: RunConfig | None = None) -> RunConfig:
        """Parse kebab-case keys (as in TOML and Flower's run config) over ``base``.

        Raises
        ------
        ConfigError
            For an unknown key (with the known ones it may mean, :mod:`fedsketch.settings.suggest`), a value of the wrong
            type, or a value out of range.
        """
        base = base if base is not None else cls()
        hints = get_type_hints(cls)
        known = field_keys()
        updates: dict[str, Any] = {}
        extras = dict(base.extras)
        for key, value in values.items():
            if key in DECLARED:
                extras[key] = DECLARED[key].check(value)
            elif key in known:
                updates[known[key]] = coerce(key, value, hints[known[key]])
            else:
                meanings = {**{k: TABLE[k]["doc"] for k in known}, **{k: s.doc for k, s in DECLARED.items()}}
                raise ConfigError(f"unknown setting '{key}'{suggest.hint(key, meanings)}")
        return dataclasses.replace(base, **updates, extras=tuple(sorted(extras.items())))

    def to_mapping(self) -> dict[str, Any]:
        """The kebab-case mapping that :meth:`from_mapping` reads back (declared settings included)."""
        out = {key: getattr(self, name) for key, name in field_keys().items()}
        return {**out, **dict(self.extras)}


def field_keys() -> dict[str, str]:
    """Kebab-case key -> field name, for every field but ``extras``."""
    return {f.name.replace("_", "-"): f.name for f in fields(RunConfig) if f.name != "extras"}
