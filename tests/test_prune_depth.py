"""Pruning with a depth (docs/files.md#pruning-depth): ``prune_depth`` keeps an output
until the tasks that read it, and their readers down to that depth, are done.

The scheduler's pure core wired to the registry's (``tests.helpers.Loop``): each test
finishes tasks one at a time and checks exactly which ``DropKeys`` the registry sends
after each. Then what the depth buys: a lost output is made again from a kept input,
without its own input being made again.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.scheduler_events import Execute, WorkerLeft
from actors.scheduler_records import SchedulerConfig
from runtime.errors import PruneDepthError
from runtime.graph import Key
from tests.helpers import (
    ROOT,
    Factory,
    Loop,
    event,
    held_at_gate,
    join,
    make_state,
    submit,
    wait_until,
)

__all__ = ["make_state"]

CHAIN: dict[Key, list[Key]] = {"a": [], "b": ["a"], "c": ["b"], "d": ["c"]}


Drops = list[list[tuple[str, tuple[Key, ...]]]]


def drops_per_finish(loop: Loop) -> Drops:
    """Finish a -> b -> c -> d on worker w in turn; the DropKeys after each."""
    out = []
    for key in ("a", "b", "c", "d"):
        assert loop.state.tasks[key].worker == "w"
        before = len(loop.drops)
        loop.finish("w", key)
        out.append(sorted(loop.drops[before:]))
    return out


@pytest.mark.parametrize(
    ("depth", "expected"),
    [
        # today's behaviour: an output goes as soon as its reader is done
        (1, [[], [("w", ("a",))], [("w", ("b",))], [("w", ("c",))]]),
        # kept until the reader's readers are done too
        (2, [[], [], [("w", ("a",))], [("w", ("b", "c"))]]),
        (3, [[], [], [], [("w", ("a", "b", "c"))]]),
        # never dropped (d is wanted: kept in any case)
        (0, [[], [], [], []]),
    ],
)
def test_each_depth_drops_a_chains_outputs_exactly_when_its_readers_are_done(
    make_state: Factory, depth: int, expected: list[list[tuple[str, tuple[str, ...]]]]
) -> None:
    s = make_state(prune_depth=depth)
    loop = Loop(s)
    join(s, "w")
    submit(s, CHAIN, ["d"])
    got = drops_per_finish(loop)
    assert [[(w, tuple(sorted(map(str, k)))) for w, k in step] for step in got] == expected
    assert s.tasks["d"].state == "memory"


def test_a_fan_in_keeps_every_input_until_the_fan_ins_reader_is_done(make_state: Factory) -> None:
    s = make_state(prune_depth=2)
    loop = Loop(s)
    join(s, "w", cores=4)
    submit(s, {"x": [], "y": [], "sum": ["x", "y"], "out": ["sum"]}, ["out"])
    loop.finish("w", "x")
    loop.finish("w", "y")
    loop.finish("w", "sum")
    assert loop.drops == []  # sum's reader (out) is not done: x and y stay
    loop.finish("w", "out")
    assert [(w, tuple(sorted(map(str, k)))) for w, k in loop.drops] == [("w", ("sum", "x", "y"))]


@pytest.mark.parametrize(("depth", "again"), [(1, ["a", "b"]), (2, ["b"])])
def test_a_lost_output_is_made_again_from_the_input_the_depth_kept(
    make_state: Factory, depth: int, again: list[str]
) -> None:
    """a runs in pool p (worker wa), b and c in pool q (worker wb). wb is lost while c
    runs: b (c's input) is lost. With depth 2, a is still kept: b alone runs again.
    With depth 1, a was dropped once b was done: a runs again too."""
    s = make_state(prune_depth=depth)
    loop = Loop(s)
    join(s, "wa", pool="p")
    join(s, "wb", pool="q")
    pools: dict[Key, dict[str, Any]] = {"a": {"pool": "p"}, "b": {"pool": "q"}, "c": {"pool": "q"}}
    submit(s, {"a": [], "b": ["a"], "c": ["b"]}, ["c"], attrs=pools)
    loop.finish("wa", "a")
    loop.finish("wb", "b")
    assert s.tasks["c"].worker == "wb"
    assert (s.tasks["a"].state == "memory") == (depth == 2)
    out = loop.run(event(WorkerLeft, worker="wb", cause="crash"))
    out += join(s, "wb2", pool="q")
    ran: list[Key] = []  # every task sent to a worker after the loss, until c is done
    while s.tasks["c"].state != "memory":
        sent = [(c.worker, t.key) for c in out if isinstance(c, Execute) for t in c.tasks]
        assert sent, "nothing runs"
        ran.extend(key for _, key in sent)
        out = []
        for worker, key in sent:
            out += loop.finish(worker, key)
    assert ran == [*again, "c"]


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True, None])
def test_a_bad_depth_is_refused_with_what_to_do(bad: object) -> None:
    with pytest.raises(PruneDepthError, match="whole number >= 0") as info:
        SchedulerConfig(prune_depth=bad)  # type: ignore[arg-type]
    assert info.value.fields["value"] == bad and "docs/files.md" in str(info.value)


def step(x: Any) -> str:
    return "step"


def gated(x: Any, gate: str, started: str) -> str:
    return held_at_gate(gate, started)


@pytest.mark.anyio
@pytest.mark.parametrize(("depth", "released"), [(1, 1), (2, 0)])
async def test_a_clusters_prune_depth_reaches_the_scheduler(
    tmp_path: Path, depth: int, released: int
) -> None:
    """a -> b -> c, c held at a gate: once c runs, a's reader (b) is done, b's (c) is
    not. Depth 1 has dropped a; depth 2 keeps it until c is done."""
    from runtime import Cluster

    gate, started = tmp_path / "gate", tmp_path / "started"
    with anyio.fail_after(60):
        async with Cluster(workers=1, prune_depth=depth) as c:
            dsk: dict[Key, Any] = {
                "a": (step, 0),
                "b": (step, "a"),
                "c": (gated, "b", str(gate), str(started)),
            }
            (fut,) = await c.submit_graph(dsk, ["c"])
            await wait_until(started.exists, "c to start", limit=30)

            async def files() -> dict[str, Any]:
                status = await c.status()
                return status["files"] if status["files"]["states"].get("created") else {}

            seen = await wait_until(files, "b to be registered", limit=30)
            assert seen["released"] == released
            gate.touch()
            assert await fut == "opened"
            # Once c is done, a and b go whatever the depth.
            await wait_until(lambda: _released(c, 2), "a and b to be dropped", limit=30, step=0.02)


async def _released(c: Any, n: int) -> bool:
    return bool((await c.status())["files"]["released"] == n)


def test_bad_depths_are_refused_by_the_cluster_and_the_manager() -> None:
    from runtime import Cluster

    with pytest.raises(PruneDepthError):
        Cluster(workers=1, prune_depth=-1)
    with pytest.raises(PruneDepthError):
        Cluster(workers=1, prune_depth=True)
    proc = subprocess.run(
        [sys.executable, "-m", "runtime", "manager", "--listen", "127.0.0.1:0",
         "--prune-depth", "-2"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "error: PruneDepthError: prune_depth must be a whole number >= 0, got -2" in proc.stderr
