"""Every relative link in the README, ``docs/`` and the examples' READMEs names a file of the repository, and a
``#fragment`` names a heading of the linked page (GitHub's anchors: lower case, punctuation dropped, spaces to
``-``). Links inside code blocks and to other sites are not followed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), *sorted((REPO / "examples").rglob("*.md"))]
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: ``FL-bench (pFedHN, pFedLA): what differs`` -> ``fl-bench-pfedhn-pfedla-what-differs``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", FENCE.sub("", page.read_text()), re.M)}


def links(page: Path) -> list[str]:
    return [m.group(1) for m in re.finditer(r"\]\(([^)\s]+)\)", FENCE.sub("", page.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", m.group(1))]


def broken(page: Path) -> list[str]:
    out = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            out.append(f"{target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in anchors(linked):
            out.append(f"{target}: no such heading in {linked.name}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_relative_links_name_files_and_headings_that_exist(page):
    assert broken(page) == []


def test_a_missing_file_or_heading_is_found(tmp_path):
    (tmp_path / "b.md").write_text("# Two words: here\n```\n# not a heading\n```\n")
    page = tmp_path / "a.md"
    page.write_text("[ok](b.md#two-words-here) [x](c.md) [y](b.md#not-a-heading) [web](https://example.org/x)\n"
                    "```\n[in code](nowhere.md)\n```\n")
    assert broken(page) == ["c.md: no such file", "b.md#not-a-heading: no such heading in b.md"]
