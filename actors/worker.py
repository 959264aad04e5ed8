"""The worker actor: runs tasks in an executor, keeps their outputs, serves peers.

What lives here: :class:`Worker` (the actor). Where its tasks run and how RSS is read
around each one is ``actors/executor.py``; how memory is governed, ``actors/memory.py``.

Per task the worker measures duration, output size (``dask.sizeof``) and process RSS
right before and right after it; the scheduler turns these into per-category
statistics. Inputs the worker lacks are fetched straight from the peer workers that hold
them (by message; never through the scheduler). A task whose inputs cannot be fetched
is reported as ``missing`` (it did not start) so the scheduler can recompute them.

Threads never touch actor state: a finished task is handed back to the event loop with
``call_soon_threadsafe`` and becomes a message to the worker itself, batched with every
other task that finished meanwhile.
"""

from __future__ import annotations

import inspect
import pickle
from collections.abc import Callable
from typing import Any

import psutil
from dask.sizeof import sizeof

from actors.executor import Executor, rss
from actors.scheduler_state import TaskResult, ToRun
from runtime.errors import ActorStopped, AskTimeout, CorralError
from runtime.graph import Key
from runtime.kernel import Actor, Envelope, Ref, handles, new_causal_id
from runtime.messages import (
    CancelTasks,
    DataReply,
    DropKeys,
    GetData,
    Message,
    RegisterWorker,
    RunTasks,
    StatusRequest,
    Stop,
    TasksDone,
    WorkerInfo,
    message,
)

__all__ = ["Executor", "Worker", "WorkerStatus", "rss"]


@message(local=True)
class _Finished(Message):
    """Worker-internal: results handed back by executor threads."""

    results: tuple[Any, ...]


@message(local=True)
class _Fetched(Message):
    """Worker-internal: inputs fetched from peers for ``task`` (or the ones missing)."""

    task: Any
    data: dict[Any, Any]
    missing: tuple[Any, ...]


@message()
class WorkerStatus(Message):
    worker_id: str
    stored: int
    stored_bytes: int
    running: int
    waiting: int
    rss: int


class Worker(Actor):
    """Runs tasks, stores outputs, serves them to peers, reports to the scheduler.

    ``resolve(worker_id)`` returns a reference to a peer worker (or ``None`` when the
    peer is gone); ``scheduler`` receives :class:`RegisterWorker` and
    :class:`TasksDone`.
    """

    def __init__(
        self,
        worker_id: str,
        scheduler: Ref,
        resolve: Callable[[str], Any],
        *,
        nthreads: int = 1,
        memory: int = 0,
        disk: int = 0,
        pool: str = "default",
        fetch_timeout: float = 30.0,
        register: bool = True,
        on_retire: Callable[[], None] | None = None,
    ) -> None:
        if nthreads < 1:
            raise ValueError(f"a worker needs at least one thread, got {nthreads}")
        self.worker_id = worker_id
        self.scheduler = scheduler
        self.resolve = resolve
        self.nthreads = nthreads
        self.memory = memory or int(psutil.virtual_memory().total)
        self.disk = disk
        self.pool = pool
        self.fetch_timeout = fetch_timeout
        self.register = register  #: tell the scheduler at start (False: a gateway does)
        self.on_retire = on_retire  #: what a Stop from the scheduler does (default: stop)
        self.data: dict[Key, Any] = {}  #: outputs held here
        self.nbytes: dict[Key, int] = {}  #: their sizes
        self.running: dict[Key, ToRun] = {}  #: tasks handed to the executor
        self.fetching: dict[Key, ToRun] = {}  #: tasks waiting for inputs from peers
        self.fetched: dict[Key, list[Key]] = {}  #: task -> inputs it copied from peers
        self.executor: Executor | None = None
        self.tasks_run = 0

    @property
    def info(self) -> WorkerInfo:
        return WorkerInfo(self.worker_id, self.nthreads, self.memory, self.disk, self.pool)

    async def on_start(self) -> None:
        self.executor = Executor(self.nthreads, self.worker_id, self._deliver)
        if self.register:
            await self.scheduler.tell(RegisterWorker(self.info, self.ref))

    async def on_stop(self) -> None:
        if self.executor is not None:
            self.executor.shutdown()
            self.executor = None

    # -- running tasks ---------------------------------------------------------------

    @handles(RunTasks)
    def run_tasks(self, msg: RunTasks) -> None:
        for task in msg.tasks:
            self._start(task)

    def _start(self, task: ToRun) -> None:
        if not task.deps:
            self._submit(task, {})
            return
        data = self.data
        if all(dk in data for dk, _ in task.deps):
            self._submit(task, {dk: data[dk] for dk, _ in task.deps})
            return
        self.fetching[task.key] = task
        self.start_soon(self._fetch, task)

    def _submit(self, task: ToRun, inputs: dict[Key, Any]) -> None:
        assert self.executor is not None
        self.running[task.key] = task
        self.executor.submit(task, inputs)

    async def _fetch(self, task: ToRun) -> None:
        """Copy the inputs ``task`` lacks from peers; report what could not be had."""
        want: dict[str, list[Key]] = {}
        missing: list[tuple[Key, str]] = []
        for dk, holders in task.deps:
            if dk in self.data:
                continue
            if not holders:
                missing.append((dk, ""))
                continue
            want.setdefault(holders[0], []).append(dk)
        got: dict[Key, Any] = {}
        for wid, keys in want.items():
            peer = self.resolve(wid)
            if inspect.isawaitable(peer):  # remote peers may need a connection first
                try:
                    peer = await peer
                except CorralError as exc:
                    self.log.warning("cannot reach peer", peer=wid, error=str(exc))
                    peer = None
            reply: DataReply | None = None
            if peer is not None:
                try:
                    reply = await peer.ask(GetData(tuple(keys)), timeout=self.fetch_timeout)
                except (ActorStopped, AskTimeout) as exc:
                    self.log.warning("fetch failed", peer=wid, error=str(exc))
            if reply is None:
                missing.extend((k, wid) for k in keys)
                continue
            got.update(reply.data)
            missing.extend((k, wid) for k in reply.missing)
        self.ref.mailbox.put_nowait(
            Envelope(_Fetched(task, got, tuple(missing)), new_causal_id("f")), force=True
        )

    @handles(_Fetched)
    def fetched_inputs(self, msg: _Fetched) -> None:
        task: ToRun = msg.task
        if self.fetching.pop(task.key, None) is None:
            return  # cancelled meanwhile
        for k, v in msg.data.items():
            if k not in self.data:
                self.data[k] = v
                self.nbytes[k] = int(sizeof(v))
                self.fetched.setdefault(task.key, []).append(k)
        if msg.missing:
            fetched = tuple(self.fetched.pop(task.key, ()))
            result = TaskResult(task.key, "missing", missing=msg.missing, fetched=fetched)
            self.scheduler.post(TasksDone(self.worker_id, (result,)))
            return
        self._submit(task, {dk: self.data[dk] for dk, _ in task.deps})

    def _deliver(self, done: list[tuple[TaskResult, Any]]) -> None:
        """Event-loop side of the executor: queue the results as a message to self."""
        if not self.ref.mailbox.closed:
            self.ref.mailbox.put_nowait(Envelope(_Finished(tuple(done)), ""), force=True)

    @handles(_Finished)
    def finished(self, msg: _Finished) -> None:
        results = []
        cancelled = self.executor.cancelled if self.executor is not None else set()
        for res, value in msg.results:
            key = res.key
            self.running.pop(key, None)
            fetched = self.fetched.pop(key, None)
            if fetched:
                res = TaskResult(
                    key, res.outcome, res.start, res.stop, res.nbytes, res.rss, res.error,
                    fetched=tuple(fetched), rss_before=res.rss_before,
                )  # fmt: skip
            if key in cancelled:
                cancelled.discard(key)
                if res.outcome != "error":
                    res = TaskResult(key, "cancelled", res.start, res.stop, fetched=res.fetched)
            elif res.outcome == "ok":
                self.data[key] = value
                self.nbytes[key] = res.nbytes
            self.tasks_run += 1
            results.append(res)
        if results:
            self.scheduler.post(TasksDone(self.worker_id, tuple(results)))

    # -- requests from the scheduler, the registry and peers ---------------------------

    @handles(CancelTasks)
    def cancel_tasks(self, msg: CancelTasks) -> None:
        assert self.executor is not None
        for key in msg.keys:
            if self.fetching.pop(key, None) is not None:
                continue
            if key in self.running:
                self.executor.cancelled.add(key)

    @handles(DropKeys)
    def drop_keys(self, msg: DropKeys) -> None:
        for key in msg.keys:
            self.data.pop(key, None)
            self.nbytes.pop(key, None)

    @handles(GetData)
    def get_data(self, msg: GetData) -> DataReply:
        data = {}
        missing = []
        for key in msg.keys:
            if key in self.data:
                data[key] = self.data[key]
            else:
                missing.append(key)
        if msg.raw:
            data = {k: pickle.dumps(v, protocol=5) for k, v in data.items()}
        return DataReply(data, tuple(missing), msg.raw)

    @handles(Stop)
    def retire(self, msg: Stop) -> None:
        """The scheduler retires this worker (drained): end it."""
        self.log.info("retired", reason=msg.reason)
        if self.on_retire is not None:
            self.on_retire()
        else:
            self.stop(msg.reason)

    @handles(StatusRequest)
    def status(self, msg: StatusRequest) -> WorkerStatus:
        return WorkerStatus(
            self.worker_id,
            len(self.data),
            sum(self.nbytes.values()),
            len(self.running),
            len(self.fetching),
            rss(),
        )
