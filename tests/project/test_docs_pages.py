"""The docs are reference pages: short, current, and with their dated measurements in one place.

Every page of docs/ (but the generated settings page) fits in 300 lines, the README in 200, and the
index lists every page; a reference page (docs/*.md but the changelog, and the README) holds the
current figure with its command and no history: no load averages, no "tried and not kept" or dated
sections. Dated records live in docs/measurements/, one file per measurement named by its date and
listed on its index."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
MEASUREMENTS = DOCS / "measurements"
PAGES = sorted(p for p in DOCS.glob("*.md") if p.name != "settings.md")  # settings.md is generated
REFERENCE = [ROOT / "README.md", *(p for p in PAGES if p.name != "changelog.md")]
HISTORY_HEADING = re.compile(r"^#+ .*(tried|not kept|history|earlier|\b20\d\d-\d\d(-\d\d)?\b)", re.IGNORECASE)


def _lines(page: Path) -> list[str]:
    return page.read_text(encoding="utf-8").splitlines()


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_a_docs_page_fits_in_300_lines(page: Path) -> None:
    assert len(_lines(page)) <= 300, f"docs/{page.name} has {len(_lines(page))} lines; move detail to a page of its own"


def test_the_readme_fits_in_200_lines() -> None:
    assert len(_lines(ROOT / "README.md")) <= 200


@pytest.mark.parametrize("page", REFERENCE, ids=[p.name for p in REFERENCE])
def test_a_reference_page_holds_no_history(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert "load average" not in text.lower(), f"{page.name}: a load average belongs in docs/measurements/"
    history = [line for line in text.splitlines() if HISTORY_HEADING.match(line)]
    assert not history, (
        f"{page.name}: history or dated sections belong in docs/measurements/ or the changelog: {history}"
    )


def test_each_measurement_is_a_dated_file_listed_on_the_index() -> None:
    files = sorted(p.name for p in MEASUREMENTS.glob("*.md") if p.name != "index.md")
    assert files, "docs/measurements/ holds no measurement"
    undated = [name for name in files if not re.fullmatch(r"20\d\d-\d\d-\d\d-[a-z0-9-]+\.md", name)]
    assert not undated, f"name each measurement YYYY-MM-DD-subject.md: {undated}"
    index = (MEASUREMENTS / "index.md").read_text(encoding="utf-8")
    unlisted = [name for name in files if f"]({name})" not in index]
    assert not unlisted, f"docs/measurements/index.md does not list {unlisted}"


def test_the_readme_keeps_the_two_commands_ci_reads() -> None:
    """.ci/run runs the line between the test-command markers; the main command is the other."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for marker in ("main-command", "test-command"):
        block = re.search(rf"<!-- {marker} -->\n```bash\n(.*?)```\n<!-- /{marker} -->", text, re.DOTALL)
        assert block, f"README.md lost its {marker} block"
        assert len(block.group(1).splitlines()) == 1 and block.group(1).startswith("python3 -m venv .venv")


def test_the_index_lists_every_page() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    unlisted = [p.name for p in sorted(DOCS.glob("*.md")) if p.name != "index.md" and f"]({p.name})" not in index]
    assert not unlisted, f"docs/index.md does not list {unlisted}"
