"""The docs' list items keep their lines indented: a line at column 0 right after an
item's text (no blank line) still renders inside the item (a lazy continuation), but
the source reads as a paragraph broken off mid-item. Review 1206e F10: a merge left
four such lines in docs/architecture.md's "A worker that lost its manager" bullet."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

DOCS = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])
ITEM = re.compile(r"^\s*(?:[-*+]|\d+\.)\s")


def lazy_lines(text: str) -> list[int]:
    """The numbers of the lines at column 0 that continue a list item's paragraph
    (outside fenced code; tables, headings and quotes are their own blocks)."""
    found, in_item, fenced = [], False, False
    for number, line in enumerate(text.split("\n"), 1):
        if line.startswith("```"):
            fenced, in_item = not fenced, False
        elif fenced or not line.strip():
            in_item = False
        elif ITEM.match(line):
            in_item = True
        elif in_item and not line.startswith((" ", "\t", "|", "#", ">")):
            found.append(number)
    return found


def test_the_check_finds_a_line_that_lost_its_indentation() -> None:
    assert lazy_lines("- an item\n  its next line\n\nA paragraph.\n") == []
    assert lazy_lines("- an item\nits next line, not indented\n  and one that is\n") == [2]
    assert lazy_lines("1. step\n```\nnot markdown\n```\n") == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_list_items_keep_their_lines_indented(doc: Path) -> None:
    assert lazy_lines(doc.read_text()) == [], f"{doc.name}: indent these lines as the item's"
