"""The worker actor: runs tasks in an executor, keeps their outputs, serves peers.

What lives here: :class:`Worker` (the actor). Where its tasks run and how RSS is read
around each one is ``actors/executor.py``; the memory rules, ``actors/memory.py``; the
spillable store of outputs, ``actors/store.py``.

Memory: RSS (with the worker's task processes) is sampled after every batch of finished
tasks and every ``interval`` seconds, and fed to the :class:`MemoryGovernor`, whose
commands the worker carries out: spill least recently used outputs to disk, defer
producers (and tell the scheduler it is throttled, :class:`WorkerMemoryReport`), run
them when memory falls, kill a task past the terminate fence (process execution only).

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

import asyncio
import ctypes
import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import psutil
from dask.sizeof import sizeof

from actors import memory as mem
from actors import transfer
from actors.executor import Executor, ProcessExecutor, rss, rss_of
from actors.protocol import TaskResult, ToRun
from actors.store import SpillStore
from actors.transfer import STREAM_BYTES, UnknownStream
from runtime.errors import ActorStopped, AskTimeout, CorralError, FrameTooLarge, ValueTooLarge
from runtime.graph import Key
from runtime.kernel import Actor, ActorRef, Envelope, Ref, handles, new_causal_id
from runtime.messages import (
    CancelTasks,
    CloseStream,
    ConfirmHolds,
    DataReply,
    DropKeys,
    GetData,
    Message,
    ReadStream,
    RegisterWorker,
    RunTasks,
    StatusRequest,
    Stop,
    StreamPart,
    TasksDone,
    WorkerHolds,
    WorkerInfo,
    WorkerMemoryReport,
    get_data_batches,
    message,
)

__all__ = ["Executor", "Worker", "WorkerStatus", "rss"]


@message(local=True)
class _Finished(Message):
    """Worker-internal: results handed back by executor threads."""

    results: tuple[Any, ...]


@message(local=True)
class _Fetched(Message):
    """Worker-internal: inputs fetched from peers for ``task`` (or the ones missing, or
    the error that makes the task fail without running)."""

    task: Any
    data: dict[Any, Any]
    missing: tuple[Any, ...]
    error: BaseException | None = None


@message(local=True)
class _MemoryTick(Message):
    """Worker-internal: sample memory now (the monitor's tick or a deferral timer)."""


@message()
class WorkerStatus(Message):
    worker_id: str
    stored: int
    stored_bytes: int
    running: int
    waiting: int
    rss: int
    spilled: int = 0  #: outputs on disk now
    spilled_bytes: int = 0  #: their bytes
    spilled_total: int = 0  #: bytes ever spilled
    deferred: int = 0  #: producers deferred by the memory governor
    throttled: bool = False
    execution: str = "thread"
    abandoned: int = 0  #: threads still running a cancelled task (their slot was replaced)


#: a copy of a peer's output at least this large is dropped once nothing here needs it
KEEP_REPLICA_BYTES = 1 << 20


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


#: glibc's malloc_trim: hands freed heap pages back to the OS. Outputs of a few MiB live
#: on the heap once glibc's mmap threshold has grown, so freeing them (after a spill)
#: lowers RSS only after a trim; without one, the governor would see no relief and
#: spill everything.
MALLOC_TRIM = _malloc_trim()


class Worker(Actor):
    """Runs tasks, stores outputs, serves them to peers, reports to the scheduler.

    ``resolve(worker_id)`` returns a reference to a peer worker (or ``None`` when the
    peer is gone); ``scheduler`` receives :class:`RegisterWorker`, :class:`TasksDone`
    and :class:`WorkerMemoryReport`. ``memory`` is its memory limit in bytes (default:
    the machine's); ``memory_options`` the rest of its
    :class:`~actors.memory.MemoryConfig`. ``probe`` replaces what memory is governed by
    (default: the RSS of this process and its task processes).
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
        memory_options: Mapping[str, Any] | None = None,
        probe: Callable[[], int] | None = None,
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
        #: memory fences and intervals (MemoryConfigError here, not later, if bad)
        self.memory_config = mem.MemoryConfig.of(self.memory, memory_options)
        self.governor = mem.MemoryGovernor(self.memory_config)
        cfg = self.memory_config
        #: outputs held here (spilled to disk under memory pressure)
        self.data = SpillStore(cfg.spill_dir, disk_limit=cfg.disk_limit, sizeof=sizeof)
        self.streams = transfer.StreamTable()  #: outputs being read by peers part by part
        self.deferred: dict[Key, ToRun] = {}  #: producers the governor holds back
        #: tasks with spilled inputs, waiting for a free thread (loaded only then)
        self.unspill: dict[Key, ToRun] = {}
        #: what memory is governed by (default: RSS of this process and its task processes)
        self.probe = probe
        self.running: dict[Key, ToRun] = {}  #: tasks handed to the executor
        self.fetching: dict[Key, ToRun] = {}  #: tasks waiting for inputs from peers
        self.fetched: dict[Key, list[Key]] = {}  #: task -> inputs it copied from peers
        self.executor: Executor | ProcessExecutor | None = None
        self.tasks_run = 0
        self._timer: asyncio.TimerHandle | None = None  #: the next deferral's timer
        self._fetches: anyio.Semaphore | None = None  #: bounds concurrent input fetches
        self._killed_at: dict[Key, int] = {}  #: killed task -> worker memory at the kill
        self._peaks: dict[Key, int] = {}  #: running task -> highest RSS sampled meanwhile
        self._trimmed = 0.0  #: when the heap was last trimmed
        self._over_terminate = False  #: warned that threads cannot be killed
        self._disk_full = False  #: warned that spilling has no disk room

    @property
    def info(self) -> WorkerInfo:
        return WorkerInfo(self.worker_id, self.nthreads, self.memory, self.disk, self.pool)

    async def on_start(self) -> None:
        kind = ProcessExecutor if self.memory_config.execution == "process" else Executor
        self.executor = kind(self.nthreads, self.worker_id, self._deliver)
        self._fetches = anyio.Semaphore(max(2, 2 * self.nthreads))
        if self.register:
            await self.scheduler.tell(RegisterWorker(self.info, self.ref))
        self.start_soon(self._monitor)

    async def on_stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self.executor is not None:
            self.executor.shutdown()
            self.executor = None
        self.streams.close_all()
        self.data.close()

    # -- memory ------------------------------------------------------------------------

    async def _monitor(self) -> None:
        """Sample memory every ``interval`` seconds (besides after every task)."""
        tick = Envelope(_MemoryTick(), "")
        while True:
            await anyio.sleep(self.memory_config.interval)
            if self.ref.mailbox.closed:
                return
            self.ref.mailbox.put_nowait(tick, force=True)

    @handles(_MemoryTick)
    def memory_tick(self, msg: _MemoryTick) -> None:
        self._sample()
        if self.streams:
            self.streams.expire(self._now())  # streams whose reader died
        if self.governor.deferred:
            self._govern(mem.Tick(self._now()))

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _sample(self) -> None:
        ex = self.executor
        if ex is None:
            return
        tasks: tuple[tuple[Key, int], ...] = ()
        peaks = self._peaks
        if isinstance(ex, ProcessExecutor):
            tasks = tuple((k, rss_of(pid)) for k, pid in ex.running().items())
            for k, r in tasks:  # each task's own process
                if r > peaks.get(k, 0):
                    peaks[k] = r
        used = ex.total_rss() if self.probe is None else self.probe()
        if not tasks and 0 < len(self.running) <= self.nthreads:
            # Threads: every task handed over is running (none waits in the executor's
            # queue), so the process's RSS now is an RSS each of them ran at.
            for k in self.running:
                if used > peaks.get(k, 0):
                    peaks[k] = used
        cfg = self.memory_config
        over = cfg.terminate is not None and used >= cfg.at(cfg.terminate)
        if over and not ex.killable and not self._over_terminate:
            self.log.warning(
                "past the terminate fence, but tasks run in threads and cannot be killed; "
                "run workers with execution 'process' to have the fence kill tasks",
                rss=used, limit=cfg.limit,
            )  # fmt: skip
        self._over_terminate = over
        self._govern(mem.Sampled(self._now(), used, tasks))

    def _govern(self, *events: mem.Event) -> None:
        """Feed the governor; carry out its commands."""
        for cmd in self.governor.handle(*events):
            if type(cmd) is mem.Run:
                task = self.deferred.pop(cmd.key, None)
                if task is not None:
                    self._run(task)
            elif type(cmd) is mem.Defer:
                self._arm(cmd.until)
            elif type(cmd) is mem.Throttled:
                self.log.info("throttled" if cmd.on else "unthrottled", rss=cmd.rss)
                self._report()
            elif type(cmd) is mem.Spill:
                self._spill(cmd.nbytes)
            elif type(cmd) is mem.Kill:
                self._kill(cmd)

    def _arm(self, until: float) -> None:
        """Make sure a tick comes by ``until`` (one timer: the earliest deferral)."""
        timer = self._timer
        if timer is not None and timer.when() <= until:
            return
        if timer is not None:
            timer.cancel()
        tick = Envelope(_MemoryTick(), "")

        def fire() -> None:
            self._timer = None
            if not self.ref.mailbox.closed:
                self.ref.mailbox.put_nowait(tick, force=True)

        self._timer = asyncio.get_running_loop().call_at(until, fire)

    def _spill(self, nbytes: int) -> None:
        store = self.data
        moved = store.spill(nbytes)
        now = self._now()
        if moved or now - self._trimmed >= 0.5:
            # Over the fence with nothing (more) to spill: freed inputs and copies may
            # still sit in the heap; hand them back (at most twice a second).
            self._trimmed = now
            if MALLOC_TRIM is not None:
                MALLOC_TRIM(0)
        if moved:
            self.log.debug("spilled", nbytes=moved, on_disk=store.disk_bytes)
            self._report()
        if store.disk_full and not self._disk_full:  # once per time it fills up
            self.log.warning(
                "cannot spill: no disk room", disk_limit=store.disk_limit, on_disk=store.disk_bytes
            )
        self._disk_full = store.disk_full

    def _kill(self, cmd: mem.Kill) -> None:
        assert self.executor is not None
        if self.executor.kill(cmd.key, "oom"):
            self._killed_at[cmd.key] = cmd.rss
            self.log.warning(
                "killed a task past the terminate fence", key=str(cmd.key), rss=cmd.rss
            )

    def _report(self) -> None:
        cfg, store = self.memory_config, self.data
        self.scheduler.post(
            WorkerMemoryReport(
                self.worker_id,
                self.governor.throttled,
                self.governor.rss,
                cfg.at(cfg.throttle),
                cfg.limit,
                store.memory_bytes,
                store.disk_bytes,
                store.spilled_total,
                self.executor.abandoned if self.executor is not None else 0,
            )
        )

    # -- running tasks ---------------------------------------------------------------

    @handles(RunTasks)
    def run_tasks(self, msg: RunTasks) -> None:
        for task in msg.tasks:
            self._start(task)

    def _start(self, task: ToRun) -> None:
        data = self.data
        if not task.deps or all(dk in data for dk, _ in task.deps):
            self._ready(task)
            return
        self.fetching[task.key] = task
        self.start_soon(self._fetch, task)

    def _ready(self, task: ToRun) -> None:
        """Its inputs are here: run it, unless the governor defers it (a producer while
        the worker is throttled)."""
        if self.governor.admits(task.producer):
            self._run(task)
            return
        self.deferred[task.key] = task
        self._govern(mem.Ready(self._now(), task.key, task.producer))

    def _run(self, task: ToRun) -> None:
        assert self.executor is not None
        data = self.data
        if self.unspill or (
            len(self.running) >= self.nthreads and any(data.on_disk(dk) for dk, _ in task.deps)
        ):
            # Its inputs are on disk: load them only when a thread is free for it, not
            # for every task queued ahead in the executor at once.
            self.unspill[task.key] = task
            self._run_unspilled()
            return
        self.running[task.key] = task
        self.executor.submit(task, self._inputs(task))

    def _inputs(self, task: ToRun) -> dict[Key, Any]:
        """The task's inputs. A spilled one is read for this task only and stays on
        disk: putting it back in memory would push other outputs out, and writing it
        again later would cost the disk twice."""
        data = self.data
        return {dk: data.peek(dk) if data.on_disk(dk) else data[dk] for dk, _ in task.deps}

    def _run_unspilled(self) -> None:
        assert self.executor is not None
        while self.unspill and len(self.running) < self.nthreads:
            key = next(iter(self.unspill))
            task = self.unspill.pop(key)
            self.running[key] = task
            self.executor.submit(task, self._inputs(task))

    async def _fetch(self, task: ToRun) -> None:
        """Copy the inputs ``task`` lacks from peers; report what could not be had."""
        want: dict[str, list[tuple[Key, int]]] = {}
        missing: list[tuple[Key, str]] = []
        sizes = task.dep_nbytes or (0,) * len(task.deps)
        for (dk, holders), nbytes in zip(task.deps, sizes, strict=True):
            if dk in self.data:
                continue
            if not holders:
                missing.append((dk, ""))
                continue
            want.setdefault(holders[0], []).append((dk, nbytes))
        got: dict[Key, Any] = {}
        # At most GET_DATA_BYTES per request: each reply is one message.
        requests = [(w, keys) for w, sized in want.items() for keys in get_data_batches(sized)]
        assert self._fetches is not None
        error: BaseException | None = None
        async with self._fetches:  # a few tasks' inputs in flight at once, not all
            try:
                await self._fetch_from(requests, got, missing)
            except ValueTooLarge as exc:  # an input this worker can never hold
                error = exc
        self.ref.mailbox.put_nowait(
            Envelope(_Fetched(task, got, tuple(missing), error), new_causal_id("f")), force=True
        )

    async def _fetch_from(
        self,
        requests: list[tuple[str, tuple[Key, ...]]],
        got: dict[Key, Any],
        missing: list[tuple[Key, str]],
    ) -> None:
        for wid, keys in requests:
            peer = self.resolve(wid)
            if inspect.isawaitable(peer):  # remote peers may need a connection first
                try:
                    peer = await peer
                except CorralError as exc:
                    self.log.warning("cannot reach peer", peer=wid, error=str(exc))
                    peer = None
            if peer is None:
                missing.extend((k, wid) for k in keys)
                continue
            try:
                await self._fetch_keys(peer, wid, keys, got, missing)
            except (ActorStopped, AskTimeout, UnknownStream) as exc:
                self.log.warning("fetch failed", peer=wid, error=str(exc))
                missing.extend((k, wid) for k in keys if k not in got)

    async def _fetch_keys(
        self,
        peer: Any,
        wid: str,
        keys: tuple[Key, ...],
        got: dict[Key, Any],
        missing: list[tuple[Key, str]],
    ) -> None:
        """One GetData of ``keys`` from ``peer``; values above ``STREAM_BYTES`` from a
        peer in another process come as streams, read here part by part."""
        # A peer in this process hands over references: nothing to stream.
        stream_over = 0 if isinstance(peer, ActorRef) else STREAM_BYTES
        try:
            reply = await peer.ask(
                GetData(keys, stream_over=stream_over), timeout=self.fetch_timeout
            )
        except FrameTooLarge:
            # The recorded sizes understated the values (dask.sizeof of an object it
            # cannot see into): ask again with every value as a stream.
            reply = await peer.ask(GetData(keys, stream_over=1), timeout=self.fetch_timeout)
        got.update(reply.data)
        missing.extend((k, wid) for k in reply.missing)
        for info in reply.streams:
            got[info.key] = await transfer.receive(
                lambda part: peer.ask(part, timeout=self.fetch_timeout),
                info,
                limit=self.memory,
                where=f"worker {self.worker_id!r} (its memory limit)",
                close=peer.post,
            )

    @handles(_Fetched)
    def fetched_inputs(self, msg: _Fetched) -> None:
        task: ToRun = msg.task
        if self.fetching.pop(task.key, None) is None:
            return  # cancelled meanwhile
        for k, v in msg.data.items():
            if k not in self.data:
                self.data[k] = v
                self.fetched.setdefault(task.key, []).append(k)
        if msg.error is not None or msg.missing:
            fetched = tuple(self.fetched.pop(task.key, ()))
            if msg.error is not None:
                now = time.time()
                result = TaskResult(task.key, "error", now, now, error=msg.error, fetched=fetched)
            else:
                result = TaskResult(task.key, "missing", missing=msg.missing, fetched=fetched)
            self.scheduler.post(TasksDone(self.worker_id, (result,)))
            return
        self._ready(task)

    def _deliver(self, done: list[tuple[TaskResult, Any]]) -> None:
        """Event-loop side of the executor: queue the results as a message to self."""
        if not self.ref.mailbox.closed:
            self.ref.mailbox.put_nowait(Envelope(_Finished(tuple(done)), ""), force=True)

    @handles(_Finished)
    def finished(self, msg: _Finished) -> None:
        results = []
        cancelled = self.executor.cancelled if self.executor is not None else set()
        killed = self.governor.killed
        for res, value in msg.results:
            key = res.key
            self.running.pop(key, None)
            if killed and key in killed:
                self.governor.handle(mem.Finished(self._now(), key))
            if res.outcome == "oom":  # the worker's memory at the kill, not the task's
                res.rss = self._killed_at.pop(key, res.rss)
            fetched = self.fetched.pop(key, None)
            if fetched:
                res = TaskResult(
                    key, res.outcome, res.start, res.stop, res.nbytes, res.rss, res.error,
                    fetched=self._keep_fetched(fetched), rss_before=res.rss_before,
                )  # fmt: skip
            res.rss_peak = max(self._peaks.pop(key, 0), res.rss)
            if key in cancelled:
                cancelled.discard(key)
                if res.outcome != "error":
                    res = TaskResult(key, "cancelled", res.start, res.stop, fetched=res.fetched)
            elif res.outcome == "ok":
                self.data.put(key, value, res.nbytes)
            self.tasks_run += 1
            results.append(res)
        if results:
            self.scheduler.post(TasksDone(self.worker_id, tuple(results)))
        if self.unspill:
            self._run_unspilled()
        self._sample()

    def _keep_fetched(self, fetched: list[Key]) -> tuple[Key, ...]:
        """Copies of peers' outputs a finished task read: the small ones, and those
        another task here still needs, are kept (and reported as replicas); a large one
        nothing here needs is dropped at once. Its owner still has it, and a second
        copy would only take memory (or disk, once spilled) until the run ends."""
        store = self.data
        large = [k for k in fetched if k in store and store.nbytes(k) >= KEEP_REPLICA_BYTES]
        if not large:
            return tuple(fetched)
        pending = (self.running, self.deferred, self.unspill, self.fetching)
        needed = {dk for tasks in pending for t in tasks.values() for dk, _ in t.deps}
        keep = []
        for k in fetched:
            if k in large and k not in needed:
                del store[k]
            else:
                keep.append(k)
        return tuple(keep)

    # -- requests from the scheduler, the registry and peers ---------------------------

    @handles(CancelTasks)
    def cancel_tasks(self, msg: CancelTasks) -> None:
        assert self.executor is not None
        for key in msg.keys:
            if self.fetching.pop(key, None) is not None:
                continue
            if self.deferred.pop(key, None) is not None:
                self.governor.handle(mem.Finished(self._now(), key))
                continue
            if self.unspill.pop(key, None) is not None:
                continue
            if key in self.running:
                # Process mode kills its process; thread mode hands the slot to a fresh
                # thread. Either way the try comes back ``cancelled`` and the slot is free.
                before = self.executor.abandoned
                self.executor.cancel(key)
                if self.executor.abandoned != before:
                    self._report()  # the scheduler's status shows the abandoned thread

    @handles(ConfirmHolds)
    def confirm_holds(self, msg: ConfirmHolds) -> None:
        """The scheduler asks after a rejoin; everything it sent before has been handled
        by now (one connection, one mailbox: in order), so this is what reached us."""
        pending = (self.fetching, self.deferred, self.unspill, self.running)
        active = tuple(key for tasks in pending for key in tasks)
        store = self.data
        held = tuple((key, store.nbytes(key)) for key in store)
        self.log.info("rejoined", active=len(active), held=len(held))
        self.scheduler.post(WorkerHolds(self.worker_id, active, held))

    @handles(DropKeys)
    def drop_keys(self, msg: DropKeys) -> None:
        for key in msg.keys:
            self.data.pop(key, None)

    @handles(GetData)
    def get_data(self, msg: GetData) -> DataReply:
        data: dict[Key, Any] = {}
        missing = []
        streams = []
        store = self.data
        over = msg.stream_over
        for key in msg.keys:
            if key not in store:
                missing.append(key)
            elif over and store.nbytes(key) >= over:  # a spilled one is read from disk
                streams.append(self.streams.start(key, store.segments(key), self._now()))
            elif msg.raw:
                data[key] = store.get_raw(key)  # a spilled output stays on disk
            else:
                data[key] = store.peek(key)
        return DataReply(data, tuple(missing), msg.raw, tuple(streams))

    @handles(ReadStream)
    def read_stream(self, msg: ReadStream) -> StreamPart:
        return StreamPart(self.streams.read(msg.stream, msg.offset, msg.length, self._now()))

    @handles(CloseStream)
    def close_stream(self, msg: CloseStream) -> None:
        self.streams.close(msg.stream)

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
        store = self.data
        ex = self.executor
        return WorkerStatus(
            self.worker_id,
            len(store),
            store.memory_bytes,
            len(self.running),
            len(self.fetching) + len(self.unspill),
            ex.total_rss() if ex is not None else rss(),
            store.n_spilled,
            store.disk_bytes,
            store.spilled_total,
            len(self.deferred),
            self.governor.throttled,
            self.memory_config.execution,
            ex.abandoned if ex is not None else 0,
        )
