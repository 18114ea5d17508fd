"""The documentation holds together: every relative link of README.md and docs/*.md names a file of the repository
(and, with ``#anchor``, a heading of that file), and README.md stays a front page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 200

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.DOTALL | re.MULTILINE)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def without_code(text: str) -> str:
    """The text with code blocks and code spans removed: a bracket in code is not a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``path``: lower case, punctuation dropped, spaces to hyphens, a
    repeated heading numbered (``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    found = set()
    for title in HEADING.findall(FENCE.sub("", path.read_text())):
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "")  # a link's text, no code marks
        slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def relative_links(path: Path) -> list[str]:
    return [target for target in LINK.findall(without_code(path.read_text()))
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target)]  # http:, https:, mailto: are not checked


def test_the_link_check_sees_links_and_anchors(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A title (`x.y`)\n\n## Two\n\n## Two\n\nsee [it](other.md#sec), ![fig](a.png), `[no](code.md)`,"
                    " [web](https://example.org)\n\n```\n[no](block.md)\n```\n")
    assert relative_links(page) == ["other.md#sec", "a.png"]
    assert anchors(page) == {"a-title-xy", "two", "two-1"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc):
    broken = []
    for target in relative_links(doc):
        name, _, anchor = target.partition("#")
        path = (doc.parent / name).resolve() if name else doc
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target}: no heading with that anchor in {path.relative_to(REPO)}")
    assert broken == [], f"{doc.relative_to(REPO)}: broken links"


def test_the_readme_is_a_front_page():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines < README_MAX_LINES, f"README.md has {lines} lines: move reference material into docs/"
