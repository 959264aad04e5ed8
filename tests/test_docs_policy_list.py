"""docs/console.md's ``policy list`` sample is what the console prints for the policies
registered (a user audit found a parameter of the default retry policy missing from
it): rendered here by the console's own ``render_policies`` from ``policies.REGISTRY``,
with the policies in force the sample shows (the retry policy keeping a pool's
fallback), at the sample's width, in a fresh interpreter: only Corral's own policies are
registered there (this one's registry holds the ones other tests register)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "console.md"
RENDER = """
import io, json, sys
from rich.console import Console
from policies import REGISTRY
from runtime.console import jsonable, render_policies
width, in_force = json.loads(sys.argv[1])
infos = [
    jsonable(REGISTRY.info(kind, REGISTRY.create(kind, name, params)))
    for kind, (name, params) in in_force.items()
]
out = io.StringIO()
Console(file=out, width=width, color_system=None).print(render_policies(infos))
sys.stdout.write(out.getvalue())
"""
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
    width = len(sample.splitlines()[0])
    done = subprocess.run(
        [sys.executable, "-c", RENDER, json.dumps([width, IN_FORCE])],
        cwd=DOC.parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout == sample
