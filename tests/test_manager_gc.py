"""A manager process and its garbage collector (the scale audit, findings 3-4): a
100,000-task run made 12 full collections in the manager, the longest 2.5 s, each
holding its event loop (workers count a manager silent for 10 s as gone), and the
process kept 0.35-1 GB once nothing was wanted.

- ``run_manager`` raises the collector's first threshold while it runs
  (``--gc-threshold``, ``GC_THRESHOLD`` by default; ``None``: Python's own) and
  restores it after; a bad value is refused before anything starts
  (tests/test_manager_cli.py).
- After a large run (``TRIM_AFTER`` tasks taken in since the last time, fewer than
  ``TRIM_BELOW`` left, nothing being taken in) it gives memory back once
  (``trim_memory``: a full collection, then glibc's ``malloc_trim``).
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
async def test_memory_is_given_back_once_after_a_large_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runtime.node, "TRIM_CHECK", 0.01)
    monkeypatch.setattr(runtime.node, "TRIM_AFTER", 100)
    monkeypatch.setattr(runtime.node, "TRIM_BELOW", 10)
    trims: list[int] = []  #: the tasks taken in at each trim
    trimmed = anyio.Event()
    state = SimpleNamespace(created=0, tasks={})
    scheduler = SimpleNamespace(state=state, taking_in=False)

    def trim() -> bool:
        trims.append(state.created)
        trimmed.set()
        return True

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
    with anyio.fail_after(LIMIT), sends, looked:
        async with anyio.create_task_group() as tg:
            await tg.start(runtime.node._give_back, scheduler)
            state.created = 500  # a large run under way: 500 tasks held
            state.tasks = dict.fromkeys(range(500))
            await check_twice()
            state.tasks = {}  # its keys let go, but a release still being taken in
            scheduler.taking_in = True
            await check_twice()
            assert trims == []
            scheduler.taking_in = False
            await trimmed.wait()
            await check_twice()
            state.created = 550  # small runs after it: not again
            await check_twice()
            assert trims == [500]
            state.created = 650  # another large one
            await check_twice()
            assert trims == [500, 650]
            tg.cancel_scope.cancel()
