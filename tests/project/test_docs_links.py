"""Every relative link in the README, docs/ and docs/measurements/ names a file that exists (and an anchor its page has)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "docs" / "measurements").glob("*.md")),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    heads = [line.lstrip("#").strip() for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("#")]
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in heads}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: " + ", ".join(broken)


def _runnable() -> set[str]:
    """Every product module with a ``__main__`` block, as ``python -m`` names it."""
    found = set()
    for package in ("fedsketch", "strategies", "clients", "bridge", "experiments", "tests/tools"):
        for file in (ROOT / package).rglob("*.py"):
            if 'if __name__ == "__main__":' in file.read_text(encoding="utf-8"):
                found.add(".".join(file.relative_to(ROOT).with_suffix("").parts))
    return found


def test_the_architecture_page_names_every_entry_point() -> None:
    """Each runnable module is in the page's table of ``python -m`` entry points, or named as a script run by path."""
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = set(re.findall(r"^\| `([a-z_]+(?:\.[a-z_]+)+)` \|", page, flags=re.MULTILINE))
    named = {m for m in _runnable() if f"python -m {m}`" in page or f"`{m.replace('.', '/')}.py`" in page}
    assert _runnable() - table - named == set(), "runnable modules the page does not name"
    assert table - _runnable() == set(), "entry points in the page's table that do not run"
