"""The example under "The generated script" in docs/deployment.md is what a manager's
Slurm pool writes (a user audit found it had drifted: no ``#SBATCH --time``, no
``CORRAL_DEADLINE``, a worker line without ``--memory 0 ... --grace 5``, the wait loop
cut short, and the scripts placed in ``run_dir`` where a manager puts them in
``run-<time>-<pid>/<pool>/``). The page's pool goes through the manager's own wiring
(:func:`runtime.node.start_pools`) to the provider's :meth:`block_script`, which is what
``start_block`` writes; no Slurm is needed."""

from __future__ import annotations

import dataclasses
import socket
import sys
import tomllib
from pathlib import Path

import anyio
import pytest

import runtime.node
from actors.pools import pools_from_dicts
from actors.slurm import SlurmProvider
from tests.helpers import ROOT

SECTION = "### The generated script"
#: what the page says: the manager's machine, its working directory, its run directory
HOST = "login1.example.org"
RUN_DIR = "/shared/corral/corral-slurm/run-20261204-192904-81234"
PYTHON = "/opt/venv/bin/python"  # an installed Corral (so its workers run `python -P`)


def fenced(kind: str) -> str:
    """The body of the section's one ```kind block."""
    text = (ROOT / "docs" / "deployment.md").read_text()
    section = text.split(f"\n{SECTION}\n", 1)[1].split("\n### ", 1)[0]
    blocks = section.split(f"```{kind}\n")
    assert len(blocks) == 2, f"one ```{kind} block expected in {SECTION!r}"
    return blocks[1].split("```\n", 1)[0]


async def written(tmp_path: Path) -> str:
    """The first block's script of the page's pool, from a manager listening on
    ``0.0.0.0:8786`` that keeps its Slurm files under ``tmp_path``."""
    from runtime.kernel import ActorSystem
    from runtime.node import Tokens, start_control_plane, start_pools

    pools = pools_from_dicts(tomllib.loads(fenced("toml"))["pools"])
    assert list(pools) == ["ckpt"] and pools["ckpt"].provider == "slurm"
    # no block at start: none is submitted (there is no sbatch here)
    pools = {name: dataclasses.replace(p, init_blocks=0) for name, p in pools.items()}
    with anyio.fail_after(30):
        async with ActorSystem() as system:
            plane = await start_control_plane(system)
            providers = await start_pools(
                plane, pools, "ws://0.0.0.0:8786", Tokens.generate(), run_dir=tmp_path
            )
            provider = providers["ckpt"]
            assert isinstance(provider, SlurmProvider)
            wids, script = provider.block_script(1, pools["ckpt"].block_spec())
    assert wids == ["ckpt-1"]
    return script.replace(str(tmp_path), RUN_DIR)


@pytest.mark.anyio
async def test_the_generated_script_on_the_page_is_what_a_managers_pool_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "getfqdn", lambda *_: HOST)
    monkeypatch.setattr(sys, "executable", PYTHON)
    monkeypatch.setattr(runtime.node, "corral_install", lambda: Path("/opt/venv/lib/corral"))
    script = await written(tmp_path)
    # what the audit missed on the page
    for line in (
        "#SBATCH --time=01:00:00",
        "export CORRAL_DEADLINE=$(( $(date +%s) + 3600 ))",
        f"{PYTHON} -P -m runtime worker ws://{HOST}:8786 --cores 2 --memory 0 --pool ckpt",
        f". {RUN_DIR}/ckpt/block-1.env",
    ):
        assert line in script, line
    assert fenced("bash") == script
