"""docs/configuration.md's ``Cluster(...)`` table, which says it gives every knob, has a
row for every parameter of ``Cluster`` and none that it does not take (a user audit
found ``name`` missing): the signature is read, so a new parameter without a row fails
here."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from runtime import Cluster

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_the_cluster_table_has_a_row_per_parameter() -> None:
    section = DOC.read_text().split("\n## `Cluster(...)`\n", 1)[1].split("\n## ", 1)[0]
    rows = {m.group(1) for m in re.finditer(r"^\| `(\w+)` \|", section, re.MULTILINE)}
    assert rows == set(inspect.signature(Cluster).parameters)
