"""A setting a method declares, and the error every bad setting raises.

Most settings are fields of :class:`fedsketch.config.RunConfig`. A setting that
only one method reads (QSGD's levels, PowerSGD's rank) is declared beside the
method's module (fedsketch/methods/NAME.toml, read by
:mod:`fedsketch.settings.declared`) and becomes a :class:`Setting`, which
``RunConfig`` parses, checks and prints like its own fields. A method reads its
value with ``SETTING.of(cfg)``, typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, cast

T = TypeVar("T", int, float, str, bool)


class ConfigError(ValueError):
    """A setting is unknown, of the wrong type, or out of range."""


class HasExtras(Protocol):
    """What :meth:`Setting.of` reads: the run config's method-declared values."""

    @property
    def extras(self) -> tuple[tuple[str, Any], ...]: ...


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One kebab-case key, its type, default and meaning, with optional choices and bounds (either or both)."""

    key: str
    kind: type[T]
    default: T
    doc: str
    choices: tuple[T, ...] = ()
    minimum: T | None = None
    maximum: T | None = None

    def check(self, value: Any) -> T:
        """``value`` coerced to the setting's type, after checking it.

        Raises
        ------
        ConfigError
            Naming the key, for a value of the wrong type, not among the choices, or out of range.
        """
        value = coerce(self.key, value, self.kind)
        if self.choices and value not in self.choices:
            raise ConfigError(f"setting '{self.key}' must be one of {', '.join(map(str, self.choices))}; got {value!r}")
        below = self.minimum is not None and not value >= self.minimum  # NaN is in no range
        if below or (self.maximum is not None and not value <= self.maximum):
            raise ConfigError(f"setting '{self.key}' must be {self.bounds()}; got {value}")
        return cast(T, value)

    def bounds(self) -> str:
        """The range a value must lie in: ``in 1..255``, ``>= 0`` or ``<= 1.0``."""
        if self.minimum is not None and self.maximum is not None:
            return f"in {self.minimum}..{self.maximum}"
        return f">= {self.minimum}" if self.maximum is None else f"<= {self.maximum}"

    def of(self, cfg: HasExtras) -> T:
        """This setting's value in a run config."""
        return cast(T, dict(cfg.extras).get(self.key, self.default))


def coerce(key: str, value: Any, kind: Any) -> Any:
    """Check one value against a setting's type; ints are accepted for floats.

    Raises
    ------
    ConfigError
        For a value of another type (a bool is never taken for a number).
    """
    if kind is bool:
        if isinstance(value, bool):
            return value
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is str and isinstance(value, str):
        return value
    raise ConfigError(f"setting '{key}' must be of type {kind.__name__}, got {type(value).__name__} {value!r}")


def parse_extras(declared: Mapping[str, Setting[Any]], values: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """Every declared setting's value (given, else its default), checked, in key order."""
    return tuple((key, declared[key].check(values.get(key, declared[key].default))) for key in sorted(declared))
