"""docs/configuration.md's table of environment variables names every ``CORRAL_*``
variable the code reads, and nothing else (a user audit found it listed none): the
code is grepped, so a new variable without a row fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("runtime", "actors", "policies", "transport")
#: ``CORRAL_*`` names in the code that are no environment variable
NOT_VARIABLES = {"CORRAL_VERSION"}  # runtime.messages.CORRAL_VERSION, a constant


def _in_code() -> set[str]:
    names: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            # (``CORRAL_TLS_*`` in prose names a family, not a variable)
            names |= {n for n in re.findall(r"\bCORRAL_[A-Z0-9_]+", path.read_text())}
    return {n for n in names if not n.endswith("_")} - NOT_VARIABLES


def _in_table() -> set[str]:
    text = (ROOT / "docs" / "configuration.md").read_text()
    section = text.split("\n## Environment variables\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `CORRAL_")]
    return {n for row in rows for n in re.findall(r"`(CORRAL_[A-Z0-9_]+)`", row.split("|")[1])}


def test_every_variable_the_code_reads_has_a_row() -> None:
    missing = _in_code() - _in_table()
    assert not missing, f"add rows to docs/configuration.md#environment-variables: {missing}"


def test_every_row_is_a_variable_the_code_reads() -> None:
    stale = _in_table() - _in_code()
    assert not stale, f"rows for variables the code no longer reads: {stale}"


def test_the_names_that_are_not_variables_are_still_in_the_code() -> None:
    code = "".join(p.read_text() for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    assert all(name in code for name in NOT_VARIABLES)
