"""A task's error and output on their way back from a worker process: bad ones get a
typed error, and nothing waits for ever.

- An exception too large to carry back (its message, or its pickle, over
  ``CORRAL_MAX_TASK_ERROR_BYTES``) is replaced where it is caught, in the thread or
  task process that ran the task, by a :class:`TaskErrorTooLarge` naming its type, its
  size and the start of its message. Before, an 80 MiB message grew the worker's
  ``TasksDone`` past the 256 MiB a message may carry: it was dropped with a log line,
  and the task stayed running for ever (a 300 MiB one also blocked the worker's event
  loop until the manager counted it lost, then did the same to the next worker).
- A report of tries too large for one message (``TasksDone``) goes a try at a time,
  and a try whose report alone is too large fails with :class:`TaskErrorTooLarge`
  instead of being dropped.
- In process execution an output that does not pickle is :class:`ResultNotPicklable`
  with its key and advice, as in thread execution; it was a bare ``TypeError``.

The limit is lowered through its environment variable (the worker processes inherit
it), so the messages stay small and the tests fast.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Iterator
from typing import Any

import anyio
import pytest

from actors.protocol import TaskResult
from runtime import Cluster, ResultNotPicklable, TaskErrorTooLarge
from runtime.kernel import Actor, ActorSystem, handles
from runtime.messages import TasksDone
from runtime.node import unsendable_tries
from runtime.remote import ERROR_HEAD_CHARS, MAX_TASK_ERROR_ENV, Peer
from transport import connect, listen

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIMIT = 120  # seconds a whole test may take
SMALL = 64 * 1024  # the task error limit these tests set (bytes)


def shout(n: int) -> None:
    raise ValueError("m" * n)


class Heavy(Exception):
    """A short message, a large attribute: its pickle is what is too large."""

    def __init__(self, blob: bytes) -> None:
        super().__init__("short")
        self.blob = blob


def heavy(n: int) -> None:
    raise Heavy(b"x" * n)


def inc(x: int) -> int:
    return x + 1


def lock() -> threading.Lock:
    return threading.Lock()


def numbers() -> Iterator[int]:
    return (i for i in range(3))


@pytest.mark.parametrize("execution", ["thread", "process"])
async def test_a_task_error_over_the_limit_fails_its_future_with_a_typed_error(
    monkeypatch: pytest.MonkeyPatch, execution: str
) -> None:
    monkeypatch.setenv(MAX_TASK_ERROR_ENV, str(SMALL))
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=2, memory_options={"execution": execution}) as cluster:
            await cluster.wait_for_workers(2)
            state = cluster.scheduler_state
            workers = set(state.workers)
            others = cluster.map(inc, range(6), pure=False)
            loud = cluster.submit(shout, 4 * SMALL, pure=False)
            with pytest.raises(TaskErrorTooLarge, match="Raise errors with short messages") as info:
                await loud
            err = info.value
            assert (err.key, err.kind, err.limit) == (loud.key, "ValueError", SMALL)
            assert err.size > SMALL
            assert err.head == "m" * ERROR_HEAD_CHARS
            # It keeps the traceback of the exception it stands for.
            assert "shout" in [f.name for f in traceback.extract_tb(err.__traceback__)]

            with pytest.raises(TaskErrorTooLarge) as info:
                await cluster.submit(heavy, 4 * SMALL, pure=False)
            assert info.value.kind.endswith("Heavy") and info.value.head == "short"

            # Small enough: the exception itself, as before.
            with pytest.raises(ValueError) as small:
                await cluster.submit(shout, SMALL // 2, pure=False)
            assert set(str(small.value)) == {"m"}  # (its note, naming the task, aside)
            assert await cluster.gather(others) == [i + 1 for i in range(6)]
            assert set(state.workers) == workers  # no worker was lost
            assert sum(st.lost for st in state.stats.values()) == 0


async def test_an_output_that_does_not_pickle_in_process_execution_is_result_not_picklable() -> (
    None
):
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1, memory_options={"execution": "process"}) as cluster:
            await cluster.wait_for_workers(1)
            (worker,) = cluster.scheduler_state.workers
            for make, what in [(lock, "'_thread.lock'"), (numbers, "'generator'")]:
                fut = cluster.submit(make, pure=False)
                with pytest.raises(ResultNotPicklable, match="Return a value that pickles") as info:
                    await fut
                err = info.value
                assert isinstance(err, TypeError)
                assert (err.key, err.worker) == (fut.key, worker)
                assert what in err.reason and "task process" in err.to
            assert await cluster.submit(inc, 1, pure=False) == 2


class Scheduler(Actor):
    """Collects the tries reported to it; ``arrived`` once ``wanted`` have come."""

    def __init__(self, wanted: int) -> None:
        super().__init__()
        self.wanted = wanted
        self.results: list[TaskResult] = []
        self.arrived = anyio.Event()

    @handles(TasksDone)
    def done(self, msg: TasksDone) -> None:
        self.results.extend(msg.results)
        if len(self.results) >= self.wanted:
            self.arrived.set()


async def test_a_report_too_large_for_one_message_fails_its_try_and_the_rest_arrive() -> None:
    """What a worker's connection to its manager does (``runtime.node``): a TasksDone
    over the connection's limit goes a try at a time, and a try whose report alone is
    over it arrives failed with TaskErrorTooLarge, not dropped."""
    frame = 64 * 1024
    scheduler = Scheduler(wanted=3)
    async with ActorSystem() as system, anyio.create_task_group() as tg:
        ref: Any = await system.spawn(scheduler, "scheduler")
        listener = await listen("ws://127.0.0.1:0", max_message_bytes=frame)

        async def serve(conn: Any) -> None:
            await Peer(conn, ref, name="worker", allow_pickle=True).run()

        await tg.start(listener.serve, serve)
        conn = await connect(listener.address, max_message_bytes=frame)
        peer = Peer(conn, None, name="manager", allow_pickle=True)
        peer.on_too_large = unsendable_tries("w1", lambda m: peer.post(m, ""))
        await tg.start(peer.run)
        with anyio.fail_after(LIMIT):
            big = ValueError("m" * 2 * frame)
            peer.ref.post(
                TasksDone(
                    "w1",
                    (
                        TaskResult("a", "ok", nbytes=8, attempt=1),
                        TaskResult("b", "error", error=big, fetched=("x",), attempt=2),
                        TaskResult("c", "error", error=KeyError("k"), attempt=3),
                    ),
                )
            )
            await scheduler.arrived.wait()
        by_key = {r.key: r for r in scheduler.results}
        assert sorted(by_key) == ["a", "b", "c"]
        assert by_key["a"].outcome == "ok"
        assert isinstance(by_key["c"].error, KeyError)
        failed = by_key["b"]
        assert (failed.outcome, failed.attempt, failed.fetched) == ("error", 2, ("x",))
        assert isinstance(failed.error, TaskErrorTooLarge)
        assert (failed.error.kind, failed.error.limit) == ("ValueError", frame)
        assert failed.error.size > 2 * frame and failed.error.head.startswith("mmm")
        await peer.aclose()
        await listener.aclose()
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("value", ["abc", "0", "-5", "1.5"])
def test_a_bad_limit_is_a_value_error_when_the_cluster_is_made(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """Not in each worker process as it starts (each would exit, and be replaced, while
    the client waits for workers): at once, from Cluster()."""
    monkeypatch.setenv(MAX_TASK_ERROR_ENV, value)
    with pytest.raises(ValueError, match=r"CORRAL_MAX_TASK_ERROR_BYTES=.* is not a whole number"):
        Cluster(processes=1)
