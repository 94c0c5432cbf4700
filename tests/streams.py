"""Standard output as a pipe or a file gives it: text held until it is flushed."""

from __future__ import annotations

import io
import sys

import pytest


def held_stdout(monkeypatch: pytest.MonkeyPatch) -> io.BytesIO:
    """Replace ``sys.stdout`` (for the test) with a stream that holds text until flushed; the bytes it let out."""
    raw = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(raw, encoding="utf-8"))
    return raw
