"""A manager process and its garbage collector (the scale audit, findings 3-4): a
100,000-task run made 12 full collections in the manager, the longest 2.5 s, each
holding its event loop (workers count a manager silent for 10 s as gone), and the
process kept 0.35-1 GB once nothing was wanted.

- ``run_manager`` raises the collector's first threshold while it runs
  (``--gc-threshold``, ``GC_THRESHOLD`` by default; ``None``: Python's own) and
  restores it after; a bad value is refused before anything starts
  (tests/test_manager_cli.py).
- Once a large graph is in (``TRIM_AFTER`` tasks), the objects alive are frozen
  (``gc.freeze()``: no collection walks them while the run goes on); after the run
  (fewer than ``TRIM_BELOW`` tasks left, nothing being taken in) they are unfrozen and
  memory is given back once (``trim_memory``: a full collection, then glibc's
  ``malloc_trim``).
"""

from __future__ import annotations

import contextlib
import gc
from types import SimpleNamespace
from typing import Any

import anyio
import pytest

import runtime.node
from actors.manager import GC_THRESHOLD
from runtime.node import Tokens, check_gc_threshold, run_manager

LIMIT = 30


@pytest.mark.parametrize(("given", "expected"), [("default", GC_THRESHOLD), (None, None)])
@pytest.mark.anyio
async def test_the_manager_raises_the_gc_threshold_while_it_runs(
    given: Any, expected: int | None
) -> None:
    before = gc.get_threshold()
    seen: list[tuple[int, int, int]] = []
    kw = {} if given == "default" else {"gc_threshold": given}
    with anyio.fail_after(LIMIT):
        with anyio.CancelScope() as scope:

            def ready(address: str, tokens: Tokens) -> None:
                seen.append(gc.get_threshold())
                scope.cancel()

            await run_manager("inproc://", ready=ready, **kw)
    assert seen == [(expected, *before[1:]) if expected else before]
    assert gc.get_threshold() == before  # restored


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "50000"])
def test_a_gc_threshold_that_is_not_a_whole_number_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="gc_threshold must be a whole number >= 1"):
        check_gc_threshold(bad)
    assert check_gc_threshold(700) == 700 and check_gc_threshold(None) is None


@pytest.mark.anyio
async def test_a_large_run_is_frozen_while_it_runs_and_memory_given_back_once_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once a large graph is in, its objects are frozen (no full collection walks them
    while it runs: one walk over 100,000 tasks' objects held the loop 4 s); once its
    keys are let go, they are unfrozen and memory is given back, once; a manager that is
    never idle unfreezes every ``FREEZE_SPAN`` tasks."""
    monkeypatch.setattr(runtime.node, "TRIM_CHECK", 0.01)
    monkeypatch.setattr(runtime.node, "TRIM_AFTER", 100)
    monkeypatch.setattr(runtime.node, "TRIM_BELOW", 10)
    monkeypatch.setattr(runtime.node, "FREEZE_SPAN", 300)
    done: list[tuple[str, int]] = []  #: ("freeze" | "unfreeze" | "trim", tasks taken in)
    frozen = [0]
    trimmed = anyio.Event()
    state = SimpleNamespace(created=0, tasks={})
    scheduler = SimpleNamespace(state=state, taking_in=False)

    def trim() -> bool:
        done.append(("trim", state.created))
        trimmed.set()
        return True

    def freeze() -> None:
        done.append(("freeze", state.created))
        frozen[0] = 1

    def unfreeze() -> None:
        if frozen[0]:
            done.append(("unfreeze", state.created))
        frozen[0] = 0

    sends, looked = anyio.create_memory_object_stream[None](1000)

    async def check_twice() -> None:
        """Until ``_give_back`` looked twice more (each look follows its sleep)."""
        with contextlib.suppress(anyio.WouldBlock):
            while True:
                looked.receive_nowait()
        await looked.receive()
        await looked.receive()

    real_sleep = anyio.sleep

    async def counted(seconds: float) -> None:
        await real_sleep(seconds)
        if seconds == runtime.node.TRIM_CHECK:
            sends.send_nowait(None)  # (its look follows before anything else runs)

    monkeypatch.setattr(runtime.node, "trim_memory", trim)
    monkeypatch.setattr(runtime.node.anyio, "sleep", counted)
    monkeypatch.setattr(runtime.node.gc, "freeze", freeze)
    monkeypatch.setattr(runtime.node.gc, "unfreeze", unfreeze)
    monkeypatch.setattr(runtime.node.gc, "get_freeze_count", lambda: frozen[0])
    with anyio.fail_after(LIMIT), sends, looked:
        async with anyio.create_task_group() as tg:
            await tg.start(runtime.node._give_back, scheduler)
            state.created = 500  # a large graph being taken in: nothing yet
            state.tasks = dict.fromkeys(range(500))
            scheduler.taking_in = True
            await check_twice()
            assert done == []
            scheduler.taking_in = False  # in, and running
            await check_twice()
            assert done == [("freeze", 500)]  # once
            state.tasks = {}  # its keys let go, but a release still being taken in
            scheduler.taking_in = True
            await check_twice()
            assert done == [("freeze", 500)]
            scheduler.taking_in = False
            await trimmed.wait()
            await check_twice()
            assert done == [("freeze", 500), ("unfreeze", 500), ("trim", 500)]
            state.created = 550  # a small run after it: nothing
            await check_twice()
            state.created = 650  # another large one, let go already: given back
            await check_twice()
            assert done[3:] == [("trim", 650)]
            state.tasks = dict.fromkeys(range(500))  # a manager never idle from now on
            state.created = 800
            await check_twice()
            state.created = 950
            await check_twice()
            state.created = 1100  # FREEZE_SPAN past its first freeze
            await check_twice()
            assert done[4:] == [("freeze", 800), ("freeze", 950), ("unfreeze", 1100)]
            tg.cancel_scope.cancel()
