"""Layout rules: the core library never imports Flower; Flower named by string only in bridge/; a data spec without torch.

The other layer rules are import-linter contracts in pyproject.toml (`lint-imports`, run by .ci/run).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_fedsketch_never_imports_flwr() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / "fedsketch").rglob("*.py"))
        for name in _imported_modules(path)
        if name == "flwr" or name.startswith("flwr.")
    ]
    assert offenders == []


def test_flowers_modules_are_named_by_string_in_bridge_only() -> None:
    """import-linter's contract sees imports; a module Flower's internals are reached through by name
    (``importlib.import_module("flwr....")``, a patch's target) must be in bridge/ too."""
    named = re.compile(r"""["']flwr\.[a-z_]+(?:\.[a-z_]+)*["']""")
    offenders = [
        f"{path.relative_to(ROOT)}: {match}"
        for package in ("fedsketch", "strategies", "clients", "experiments")
        for path in sorted((ROOT / package).rglob("*.py"))
        for match in named.findall(path.read_text(encoding="utf-8"))
        if not match.strip("\"'").startswith(("flwr.app", "flwr.clientapp", "flwr.serverapp", "flwr.simulation"))
    ]
    assert offenders == []


def test_a_data_spec_is_read_without_torch() -> None:
    """``fedsketch.data`` imports its torch loaders on first use: a spec, the registry and the partitioners do not
    need torch (a step toward settings checked without it)."""
    probe = "import sys, fedsketch.data, fedsketch.data.spec, fedsketch.data.registry; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"
