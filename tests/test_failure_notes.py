"""A task's own exception, as the client raises it, says which task raised it, on which
worker and in which try; and raising it again does not make its traceback longer.

A user audit (why do my tasks fail?) found that ``await cluster.gather(futs)`` over 50
tasks, one raising, gave the bare ``ValueError`` (no task, no worker, no try: only
``compute``/``get`` added a note naming the task), and ``await fut`` the same; and that
each ``await`` of the same failed future made its traceback some 10 lines longer (the
same object raised again: ``raise err`` adds the frames of every raise to its
``__traceback__``), as did the futures sharing one ``GraphNotLoadable`` (46 to 101
lines). Now every task's own exception carries the note ``(raised by task 'KEY' on
worker 'W', try N of M)``, once, and every failure is raised with the traceback it came
with.

An embedded cluster, a client connected over the codec (``tests.helpers.nodes``, in
this process) and a real manager process on 127.0.0.1 (port 62100); every wait is
bounded.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from runtime import Cluster
from runtime.client import _raised_copy
from runtime.errors import DependencyFailed, GraphNotLoadable
from tests.helpers import Cli, free_port
from tests.test_not_importable import labops

__all__ = ["labops"]  # the fixture, used by name

LIMIT = 60  # seconds for a cluster (or a manager process) to start


def load(i: int) -> int:
    if i == 37:
        raise ValueError("bad row: negative energy")
    return i


def boom() -> None:
    raise ValueError("boom")


def plus_one(x: int) -> int:
    return x + 1


def looks_up() -> None:
    try:
        {}["row"]
    except KeyError as exc:
        raise ValueError("no such row") from exc


def lines(err: BaseException) -> int:
    """How long ``err``'s traceback prints (now: raising it again changes it)."""
    return len("".join(traceback.format_exception(err)).splitlines())


NOTE = re.compile(
    r"\(raised by task '(?P<key>[^']+)' on worker '(?P<worker>[^']+)', "
    r"try (?P<n>\d+) of (?P<of>\d+)\)"
)


def note_of(err: BaseException) -> dict[str, str]:
    """The one note of ``err``, parsed; fails unless it has exactly one, that one."""
    notes = getattr(err, "__notes__", [])
    assert len(notes) == 1, notes
    found = NOTE.fullmatch(notes[0])
    assert found, notes
    return found.groupdict()


async def ran_on(cluster: Cluster, key: str) -> list[str]:
    """The workers ``key``'s tries were sent to, as its story says."""
    story = await cluster.story(key)
    return [str(e[2]).removeprefix("runs-on:") for e in story if str(e[2]).startswith("runs-on:")]


async def check_notes(cluster: Cluster) -> None:
    # One of 50 raises: the gather's error names it, where it ran and which try.
    futs = cluster.map(load, range(50))
    with pytest.raises(ValueError, match="bad row") as info:
        await cluster.gather(futs)
    note = note_of(info.value)
    assert note["key"] == futs[37].key and (note["n"], note["of"]) == ("1", "1")
    assert [note["worker"]] == await ran_on(cluster, futs[37].key)

    # Retried twice: the third try's error, "try 3 of 3", noted once however often
    # raised, its traceback as long each time (and exception() gives it back as it
    # came: shorter than raised, with no frame of an await).
    f = cluster.submit(boom, retries=2)
    long = set()
    for _ in range(4):
        with pytest.raises(ValueError, match="boom") as info:
            await f
        long.add(lines(info.value))
    assert len(long) == 1, long
    note = note_of(info.value)
    assert (note["key"], note["n"], note["of"]) == (f.key, "3", "3")
    assert note["worker"] == (await ran_on(cluster, f.key))[-1]
    kept = await f.exception()  # (a copy of the kept error, as what is raised)
    assert type(kept) is ValueError and kept.args == info.value.args
    assert kept.__notes__ == info.value.__notes__ and lines(kept) < min(long)
    noted = info.value.__notes__
    with pytest.raises(ValueError) as info:
        await cluster.gather([f], root_errors=True)
    as_root = lines(info.value)

    # Through a dependent submitted after f was raised: root_errors gives the same
    # exception, noted once, as long as gathering f itself gives it; the
    # DependencyFailed has no note (a Corral error names its key in its fields), and its
    # traceback does not grow either.
    g = cluster.submit(plus_one, f)
    roots, deps = set(), set()
    for _ in range(3):
        with pytest.raises(ValueError) as info:
            await cluster.gather([g], root_errors=True)
        assert info.value.__notes__ == noted
        roots.add(lines(info.value))
        with pytest.raises(DependencyFailed) as failed:
            await g
        assert not getattr(failed.value, "__notes__", None)
        deps.add(lines(failed.value))
    assert roots == {as_root} and len(deps) == 1, (roots, as_root, deps)


@pytest.mark.anyio
async def test_an_embedded_clusters_task_errors_name_task_worker_and_try() -> None:
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2) as cluster:
            await check_notes(cluster)


@pytest.mark.anyio
async def test_a_connected_clients_task_errors_name_task_worker_and_try() -> None:
    from tests.helpers import nodes

    with anyio.fail_after(LIMIT):
        async with nodes(2) as (address, _), Cluster(address) as cluster:
            await check_notes(cluster)


@pytest.mark.anyio
async def test_a_refused_graphs_futures_raise_its_error_as_long_each_time(
    labops: ModuleType, tmp_path: Path
) -> None:
    """The audit's phase1: submits of a function the manager cannot import (``labops``,
    tests/test_not_importable.py) fail with ``GraphNotLoadable``, a Corral error the
    client made (no note), whose traceback grew by each ``await`` (46 to 101 lines)."""
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        proc = cli.start("manager", "--listen", f"127.0.0.1:{free_port()}", "--no-monitoring")
        line = await anyio.to_thread.run_sync(cli.line_with, proc, "manager listening on")
        address = line.split("manager listening on", 1)[1].strip()
        async with Cluster(address) as c:
            futs = [c.submit(labops.double, 2), c.submit(labops.double, 3)]
            long: dict[int, set[int]] = {0: set(), 1: set()}
            for _ in range(3):
                for i, fut in enumerate(futs):
                    with pytest.raises(GraphNotLoadable) as info:
                        await fut
                    long[i].add(lines(info.value))  # (as long as it is now)
                    assert not getattr(info.value, "__notes__", None)  # a Corral error
            assert all(len(n) == 1 for n in long.values()), long


async def _request(cluster: Cluster) -> str:
    """A service's request handler: its task fails, it answers and moves on."""
    fut = cluster.submit(boom, pure=False)
    try:
        await fut
    except ValueError:
        return "error"
    return "ok"


async def _request_raising_its_exception(cluster: Cluster) -> str:
    """The same handler, taking the future's ``exception()`` and raising it (to log
    it with its traceback, say)."""
    fut = cluster.submit(boom, pure=False)
    err = await fut.exception()
    try:
        if err is not None:
            raise err
    except ValueError:
        return "error"
    return "ok"


@pytest.mark.anyio
@pytest.mark.parametrize("request_", [_request, _request_raising_its_exception])
async def test_a_failed_future_awaited_in_a_handler_is_let_go_with_its_key(
    request_: Callable[[Cluster], Awaitable[str]],
) -> None:
    """A future awaited and failed, then out of scope, is let go and its key with it:
    the error the client keeps for the key must not hold the awaiting frames (an
    asyncio service's audit: every failed request kept its key on the cluster). So for
    a handler that raises what ``exception()`` gave: that was the kept error itself,
    which took the handler's frame, and its future, with the raise."""
    import gc

    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2) as cluster:
            async with anyio.create_task_group() as tg:
                for _ in range(20):
                    tg.start_soon(request_, cluster)
            gc.collect()
            with anyio.fail_after(20):  # the releases go in a batch: until the status says so
                while held := (await cluster.status())["wanted_keys"]:
                    assert held <= 20, held
                    await anyio.sleep(0.05)


@pytest.mark.anyio
async def test_what_is_done_to_a_futures_exception_stays_off_the_kept_error() -> None:
    """``exception()`` gave the error the client keeps for the key, where ``await``
    raises a copy of it: a note the user added to it, or the frames of raising it, went
    on the kept error, into what the next ``await`` and ``exception()`` give. Now it
    gives a copy too (type, args, notes, cause and the traceback it came with). And the
    copy ``await`` raised shared the kept error's attributes (``__dict__``: copy.copy
    with tblib's reducer, which importing dask registers), so a note added to it went
    on the kept error too."""
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            f = cluster.submit(boom)
            first = await f.exception()
            assert type(first) is ValueError
            notes, long = list(first.__notes__), lines(first)
            first.add_note("seen by the request handler")
            for _ in range(2):
                with pytest.raises(ValueError):
                    raise first
            assert lines(first) > long  # (the user's copy took the frames)
            again = await f.exception()
            assert again is not first and type(again) is ValueError
            assert again.args == first.args and again.__notes__ == notes
            assert lines(again) == long
            with pytest.raises(ValueError) as info:
                await f
            assert info.value.__notes__ == notes
            info.value.add_note("seen by another handler")
            info.value.code = 7  # type: ignore[attr-defined]
            with pytest.raises(ValueError) as info:
                await f
            for err in (info.value, await f.exception()):
                assert err.__notes__ == notes and not hasattr(err, "code")


@pytest.mark.anyio
async def test_what_is_done_to_a_futures_exceptions_chain_stays_off_the_kept_one() -> None:
    """``exception()`` and ``await`` gave a copy of the kept error, but its cause and
    context were the kept error's own: a handler that noted the cause or raised it
    (``raise err.__cause__``, a ``DependencyFailed``'s root error) put its note and
    frames, and with them the awaiting frames and their futures, on the kept one, in
    what every later ``await`` and ``exception()`` gives. Now the chain is copied too,
    link by link, as it was (cause, context, the context suppressed)."""
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            f = cluster.submit(looks_up)
            g = cluster.submit(plus_one, f)
            first = await f.exception()
            cause = first.__cause__
            assert type(first) is ValueError and first.__suppress_context__
            assert type(cause) is KeyError and cause.args == ("row",)
            assert first.__context__ is cause and cause.__cause__ is None
            long = lines(cause)
            cause.add_note("seen by the request handler")
            with pytest.raises(DependencyFailed) as info:
                await g
            root = info.value.__cause__
            assert type(root) is ValueError and root.__cause__ is not cause
            for _ in range(2):
                with pytest.raises(ValueError):
                    raise root  # (unwrapped by a handler)
                with pytest.raises(KeyError):
                    raise cause
            for err in (await f.exception(), (await g.exception()).__cause__):
                assert err is not first and err is not root and type(err) is ValueError
                again = err.__cause__
                assert again is not cause and err.__context__ is again
                assert type(again) is KeyError and again.args == ("row",)
                assert not hasattr(again, "__notes__") and lines(again) == long
            with pytest.raises(ValueError) as raised:
                await f
            assert raised.value.__cause__ not in (cause, again)
            assert not hasattr(raised.value.__cause__, "__notes__")


def test_a_copied_chain_that_loops_stays_one_loop_of_copies() -> None:
    """A context chain may loop (an exception set as its own context's context): the
    copy is the same loop, of copies, and each link keeps its own suppression."""
    a, b = RuntimeError("a"), ValueError("b")
    a.__context__, b.__context__, b.__cause__ = b, a, a
    new = _raised_copy(a)
    other = new.__context__
    assert new is not a and type(other) is ValueError and other is not b
    assert other.__context__ is new and other.__cause__ is new
    assert other.__suppress_context__ and not new.__suppress_context__
    assert new.__cause__ is None
