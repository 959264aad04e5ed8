"""docs/console.md's ``policy list`` sample is what the console prints for the policies
registered (a user audit found a parameter of the default retry policy missing from
it): rendered here by the console's own ``render_policies`` from ``policies.REGISTRY``,
with the policies in force the sample shows (the retry policy keeping a pool's
fallback), at the sample's width."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from policies import REGISTRY
from runtime.console import jsonable, render_policies

DOC = Path(__file__).resolve().parent.parent / "docs" / "console.md"
IN_FORCE = {
    "priority": ("graph", {}),
    "placement": ("locality", {}),
    "retry": ("default", {"fallback": {"ckpt": "owner"}}),
    "memory": ("producers-yield", {}),
    "replication": ("recompute-cost", {}),
    "speculation": ("idle-tail", {}),
    "scaling": ("demand", {}),
}


def test_the_policy_list_sample_is_what_the_console_prints() -> None:
    text = DOC.read_text()
    start = text.index("corral> policy list\n") + len("corral> policy list\n")
    sample = text[start : text.index("```", start)]
    infos = [
        jsonable(REGISTRY.info(kind, REGISTRY.create(kind, name, params)))
        for kind, (name, params) in IN_FORCE.items()
    ]
    out = io.StringIO()
    width = len(sample.splitlines()[0])
    Console(file=out, width=width, color_system=None).print(render_policies(infos))
    assert out.getvalue() == sample
