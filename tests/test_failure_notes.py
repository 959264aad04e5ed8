"""A task's own exception, as the client raises it, says which task raised it, on which
worker and in which try.

A user audit (why do my tasks fail?) found that ``await cluster.gather(futs)`` over 50
tasks, one raising, gave the bare ``ValueError`` (no task, no worker, no try: only
``compute``/``get`` added a note naming the task), and ``await fut`` the same. Now every
task's own exception carries the note ``(raised by task 'KEY' on worker 'W', try N of
M)``, once.

An embedded cluster and a client connected over the codec (``tests.helpers.nodes``, in
this process); every wait is bounded.
"""

from __future__ import annotations

import re

import anyio
import pytest

from runtime import Cluster
from runtime.errors import DependencyFailed

LIMIT = 60  # seconds for a cluster to start


def load(i: int) -> int:
    if i == 37:
        raise ValueError("bad row: negative energy")
    return i


def boom() -> None:
    raise ValueError("boom")


def plus_one(x: int) -> int:
    return x + 1


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
    # raised (and as exception() returns it).
    f = cluster.submit(boom, retries=2)
    for _ in range(3):
        with pytest.raises(ValueError, match="boom") as info:
            await f
    note = note_of(info.value)
    assert (note["key"], note["n"], note["of"]) == (f.key, "3", "3")
    assert note["worker"] == (await ran_on(cluster, f.key))[-1]
    assert await f.exception() is info.value
    noted = info.value.__notes__

    # Through a dependent: root_errors gives the same exception, noted once; the
    # DependencyFailed has none (a Corral error names its key in its fields).
    g = cluster.submit(plus_one, f)
    for _ in range(2):
        with pytest.raises(ValueError) as info:
            await cluster.gather([g], root_errors=True)
        assert info.value.__notes__ == noted
        with pytest.raises(DependencyFailed) as failed:
            await g
        assert not getattr(failed.value, "__notes__", None)


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
