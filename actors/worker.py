"""The worker actor: the shell around the worker's pure core.

What lives here: :class:`Worker` (the actor) and :class:`WorkerStatus`. The decisions
(which tasks fetch, wait and run; which peer to fetch from, and the next one when it
fails; when spilled inputs are loaded; which copies of peers' outputs stay; what memory
needs) are :class:`~actors.worker_state.WorkerState`'s, which calls the memory governor
(``actors/memory.py``). This shell owns what does I/O or holds threads: the spillable
store of outputs (``actors/store.py``), the executor where tasks run
(``actors/executor.py``), the streams peers read large values from
(``actors/transfer.py``), the RSS probe and the one timer. It turns messages into core
events, carries out the core's commands, and feeds back what came of them.

File outputs (``runtime/files.py``): tasks write them in the store's directory (the
sandbox the executor hands them), the executor measures them, and the worker keeps
them as the store's file entries, after checking that they fit on its disk
(:meth:`Worker._keep_files`); a task whose writes fill the sandbox's file system
(``ENOSPC``) ends its try ``disk-full``, retried where it fits, not ``error``
(:meth:`Worker._task_disk_full`). Peers copy file outputs as streams of their bytes
into their own sandbox (:meth:`Worker._fetch_file`, :func:`actors.transfer.fetch_file`),
resuming a broken copy from the bytes they have, from the same holder or the next one.
Checkpoint files (``actors/checkpoints.py``) live in the ``checkpoints`` directory of
the same sandbox and travel the same way (:meth:`Worker._fetch_checkpoint`). One
sandbox, one disk budget: spilled outputs, file outputs, checkpoint files and the copies
under way all count in :meth:`Worker._disk_used`, and stopping removes the sandbox with
them all.

Per task the executor measures duration, output size (``dask.sizeof``) and process RSS
right before and right after it; RSS is also sampled after every batch of finished tasks
and every ``interval`` seconds, with the keys of the tasks executing at that moment (the
executor's, not those waiting in its queue), and the core keeps each one's peak. The
scheduler turns these into per-category statistics.

Threads never touch actor state: a finished task is handed back to the event loop with
``call_soon_threadsafe`` and becomes a message to the worker itself, batched with every
other task that finished meanwhile; a fetch's answer does the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import gc
import inspect
import io
import math
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

import anyio
import psutil
from dask.sizeof import sizeof

from actors import memory as mem
from actors import transfer
from actors import worker_state as ws
from actors.checkpoints import INLINE_BYTES, CheckpointFiles
from actors.executor import GLIBC, Executor, ProcessExecutor, device_of, rss, run_call
from actors.host import host_cpus, memory_limit
from actors.protocol import TaskResult, ToRun
from actors.providers import accelerator_of
from actors.shared_disk import disk_margin, free_share
from actors.store import SpillStore, Unpicklable, load_opened
from actors.transfer import STREAM_BYTES, FileSegments, StreamBroken, StreamInfo, UnknownStream
from actors.worker_state import WorkerState
from runtime.errors import (
    CorralError,
    DiskFull,
    FileChecksumError,
    FrameTooLarge,
    ResultNotPicklable,
    RunNoAnswer,
    RunQueueFull,
    ValueTooLarge,
)
from runtime.files import File, digest, discard_output
from runtime.graph import Key
from runtime.kernel import Actor, ActorRef, Envelope, Later, Ref, handles, new_causal_id
from runtime.messages import (
    CancelTasks,
    CheckpointFetched,
    CheckpointSaved,
    CheckpointStream,
    CloseStream,
    ConfirmHolds,
    CopiesReply,
    CopyFrom,
    DataReply,
    DropCheckpointsMsg,
    DropKeys,
    Evacuated,
    EvacuationPlan,
    FetchCheckpoint,
    GetCheckpoint,
    GetData,
    Leaving,
    Message,
    OutputUnpicklable,
    ReadStream,
    RegisterWorker,
    RunCall,
    RunOutcome,
    RunTasks,
    StatusRequest,
    Stop,
    StreamPart,
    TasksDone,
    TasksStarted,
    WorkerGone,
    WorkerHolds,
    WorkerInfo,
    WorkerMemoryReport,
    message,
)
from runtime.remote import check_run_timeout, run_failure

__all__ = ["Executor", "ForgetWork", "Worker", "WorkerStatus", "disk_free", "host_cpus", "rss"]

#: less than this left over the margin (no ``--disk``): the worker says at start that
#: its output directory has no room (DISK_FULL_AT_START)
NO_ROOM = 2**20
#: what comes of a try whose output did not fit on this worker's disk (it ends
#: ``disk-full``): the worker logs it at info, since the scheduler handles it. The
#: default retry policy retries it for free where it fits (docs/files.md#disks); a
#: task that keeps not fitting fails with ``DiskFull``, which says what to give; and
#: when every worker of a pool is full, the manager warns of a disk stall.
DISK_FULL_THEN = (
    "the scheduler retries it on a worker with the room (free, up to the retry policy's "
    "max_disk_full); if this repeats, give workers a larger --disk"
)


@functools.cache
def host_identity() -> tuple[str, int]:
    """This machine as workers tell the scheduler (``WorkerInfo.host``, ``host_memory``):
    its host name and the first 12 characters of /etc/machine-id (else of the boot id,
    else nothing), so that two machines of one name, or containers sharing a host name,
    are told apart; and its total memory in bytes. Read once per process."""
    import socket

    tag = ""
    for path in ("/etc/machine-id", "/proc/sys/kernel/random/boot_id"):
        try:
            with open(path) as f:
                tag = f.read().strip().replace("-", "")[:12]
        except OSError:
            continue
        if tag:
            break
    name = socket.gethostname() or "localhost"
    return (f"{name}/{tag}" if tag else name), int(psutil.virtual_memory().total)


def disk_free(directory: str) -> int:
    """Free bytes of the file system holding ``directory`` (or its nearest existing
    parent: a spill directory is made at the first spill)."""
    path = os.path.abspath(directory)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return int(shutil.disk_usage(path).free)


def disk_share(directory: str, workers: int) -> int:
    """One of ``workers`` worker processes' even share (bytes, at least 1) of the free
    space of the file system holding ``directory``, less the safety margin a worker
    keeps, measured now: what each worker process of ``Cluster(processes=N)`` and of
    the local pools takes without ``--disk`` (``--disk-share N``, docs/files.md)."""
    return free_share(disk_free(directory), workers)


@message(local=True)
class _Finished(Message):
    """Worker-internal: results handed back by executor threads."""

    results: tuple[Any, ...]


@message(local=True)
class _Fetched(Message):
    """Worker-internal: the answer of one fetch from a peer, for the core."""

    answer: Any


@message(local=True)
class Leave(Message):
    """To a worker, from its process (an ask): it is about to go (``cause``); copy its
    needed outputs that no other worker holds to the workers the scheduler names, within
    the asker's timeout. The reply: the ``(key, worker)`` copies made."""

    cause: str


@message(local=True)
class ForgetWork(Message):
    """To a worker, from its process, before the manager's first message on a joined
    connection: the manager it joined does not know this worker (it gave it a new
    secret: it restarted, or gave the worker up after its grace), so the work it had
    in hand is no one's any more. Cancel every task in hand (a task process is
    killed, a thread's slot handed to a fresh thread) and drop every output held, so
    that the slots the manager sees free are (docs/deployment.md, As systemd
    services)."""


@message(local=True)
class _TimerFired(Message):
    """Worker-internal: the core's timer fired."""


@message(local=True)
class _MemoryTick(Message):
    """Worker-internal: the monitor's tick: sample memory now."""


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
    files: int = 0  #: file outputs held now
    file_bytes: int = 0  #: their bytes (part of spilled_bytes: the bytes on disk)
    checkpoint_bytes: int = 0  #: checkpoint files on its disk (and room reserved for them)
    #: every byte on its disk: spilled_bytes, checkpoint_bytes and file copies under way
    disk_used: int = 0


def _malloc_trim() -> Callable[[int], int] | None:
    return None if GLIBC is None else cast(Callable[[int], int], GLIBC.malloc_trim)


#: glibc's malloc_trim: hands freed heap pages back to the OS. Outputs of a few MiB live
#: on the heap once glibc's mmap threshold has grown, so freeing them (after a spill)
#: lowers RSS only after a trim; without one, the governor would see no relief and
#: spill everything.
MALLOC_TRIM = _malloc_trim()


@dataclasses.dataclass(slots=True)
class Spilling:
    """A spill of the worker's outputs to disk: when it began and ended
    (``time.monotonic()``; ``ended`` None while under way) and the bytes asked for."""

    began: float
    nbytes: int
    ended: float | None = None


def thread_cpu() -> dict[int, float]:
    """CPU seconds each thread of this process has used so far, by native thread id
    (empty where the system does not say)."""
    try:
        return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}
    except (psutil.Error, OSError):
        return {}


#: seconds between two samples of the threads' CPU (:meth:`Worker.busy_threads`)
CPU_SAMPLE_EVERY = 1.0


def trim_memory() -> bool:
    """Give freed memory back to the OS: collect Python's garbage (cycles holding
    frames, dataframes), then glibc's ``malloc_trim(0)``; False where the C library has
    none (the collection still ran)."""
    gc.collect()
    if MALLOC_TRIM is None:
        return False
    MALLOC_TRIM(0)
    return True


#: seconds a worker waits for its task processes to start before it measures its memory
#: at start (:meth:`Worker._floor_at_start`)
START_SETTLE = 10.0
#: the warning a worker logs when its memory at start is at or past its resume mark
FLOOR_AT_START = "the worker's memory at start is past its resume mark"
DISK_FULL_AT_START = "the worker's output directory has no room on its file system"
#: a cancelled try whose thread could be neither stopped nor abandoned (as many are
#: abandoned already as the worker has threads): a sync call's, and an ``async def``
#: task's, whose coroutine was cancelled
HELD_THREAD = (
    "a running task could not be stopped: its thread cannot be abandoned (as many are "
    "already as this worker has threads); its try ends now, but the thread keeps its "
    "slot, and takes no task, until the call returns. Run tasks that may hang with "
    "execution 'process'"
)
#: a task given up in thread execution (its timeout, a cancel) whose programs run on
LEFT_PROGRAMS = (
    "a task given up (its timeout, or a cancel) left the programs it started running: "
    "in thread execution Corral cannot stop them (nor a thread). Stop them "
    "yourself (kill PID) if they should not run on, and run tasks that start programs "
    "in workers with --execution process (execution='process'), where a timeout or a "
    "cancel kills them with their task"
)
HELD_COROUTINE = (
    "a running async task's coroutine was cancelled; its thread cannot be abandoned (as "
    "many are already as this worker has threads), so it keeps its slot, and takes no "
    "task, until the coroutine ends at the await it waits in"
)

#: seconds a peer's ask for a checkpoint not measured yet waits for its sha256 before the
#: answer says "measuring" (the asker then asks again: a large file is not read within
#: one ask's timeout, and a peer that answers is alive)
MEASURE_WAIT = 0.2
#: the asker's pauses between those asks: from the first, doubled up to the second
MEASURE_POLL = (0.05, 2.0)


@dataclasses.dataclass(eq=False)
class _RunCall:
    """One ``Cluster.run`` call on this worker, as its shell follows it: ``started``
    once it has a thread, ``done`` once it returned, with its ``outcome``."""

    msg: RunCall
    started: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    outcome: RunOutcome | None = None


#: when this worker process got its stop signal (SIGTERM, SIGINT, SIGHUP: its batch job
#: preempted or at its walltime, a stop), recorded by :func:`note_stop_signal`; empty
#: before (and in a process whose workers are not worker processes)
STOP_SIGNALLED: list[float] = []


def note_stop_signal(signum: int, frame: Any) -> None:
    """The Python-level handler of the stop signals in a worker process: records the
    first (:data:`STOP_SIGNALLED`). The event loop's wake-up (its signal receiver) is
    not this handler's: it goes on seeing the signal as before."""
    if not STOP_SIGNALLED:
        STOP_SIGNALLED.append(time.time())


class Worker(Actor):
    """Runs tasks, stores outputs, serves them to peers, reports to the scheduler.

    ``resolve(worker_id)`` returns a reference to a peer worker (or ``None`` when the
    peer is gone); ``scheduler`` receives :class:`RegisterWorker`, :class:`TasksDone`
    and :class:`WorkerMemoryReport`. ``memory`` is its memory limit in bytes (default:
    the least of the machine's, its cgroup's and its Slurm job's); ``memory_options``
    the rest of its :class:`~actors.memory.MemoryConfig`. ``probe`` replaces what
    memory is governed by
    (default: the RSS of this process and its task processes). ``block``: the block it
    belongs to ("": unknown), which its :class:`WorkerInfo` tells the scheduler.
    ``disk`` is the disk it offers for outputs (bytes; 0: the free space of its output
    directory's file system less a margin, or with ``disk_share`` N, one of N workers
    there, 1/N of that; None: not counted).
    """

    def __init__(
        self,
        worker_id: str,
        scheduler: Ref,
        resolve: Callable[[str], Any],
        *,
        nthreads: int = 1,
        memory: int = 0,
        disk: int | None = 0,
        disk_share: int = 1,
        pool: str = "default",
        fetch_timeout: float = 30.0,
        register: bool = True,
        on_retire: Callable[[str], None] | None = None,
        memory_options: Mapping[str, Any] | None = None,
        probe: Callable[[], int] | None = None,
        deadline: float = 0.0,
        grace: float = 5.0,
        block: str = "",
    ) -> None:
        if nthreads < 1:
            raise ValueError(f"a worker needs at least one thread, got {nthreads}")
        self.worker_id = worker_id
        #: Cluster.run's calls: which run, wait or are refused (the pure part), the
        #: waiting ones, and the ids they are known by
        self._run_slots = ws.RunSlots()
        self._run_waiting: dict[int, _RunCall] = {}
        self._run_ids = 0
        #: times the scheduler asked what it holds: once per (re)join
        self.joins = 0
        self.scheduler = scheduler
        self.resolve = resolve
        self.nthreads = nthreads
        #: its limit: by default the least of the machine's memory, its cgroup's limit
        #: and its Slurm job's memory on the node (actors.host.memory_limit)
        self.memory = memory or memory_limit(machine=host_identity()[1]).limit
        if disk is not None and disk < 0:
            raise ValueError(f"disk must be >= 0 bytes (or None: not counted), got {disk}")
        if disk_share < 1:
            raise ValueError(f"disk_share must be a whole number >= 1, got {disk_share}")
        self.pool = pool
        self.deadline = deadline  #: when its walltime ends (epoch seconds; 0: never)
        self.grace = grace  #: seconds it has to leave once told to (copies, goodbye)
        self.block = block  #: the block it belongs to ("": unknown)
        self.fetch_timeout = fetch_timeout
        #: checkpoint files being measured for a peer (their sha256), set when done
        self._measuring: dict[tuple[Any, int], anyio.Event] = {}
        #: checkpoint files that turned out not to be the ones saved: not served (until
        #: dropped, or found gone)
        self._unservable: set[tuple[Any, int]] = set()
        self.register = register  #: tell the scheduler at start (False: a gateway does)
        #: what a Stop from the scheduler does, given its reason (default: stop)
        self.on_retire = on_retire
        #: its core raised (:meth:`_core_failed`): it takes no more events and leaves
        self.broken = False
        #: memory fences and intervals (MemoryConfigError here, not later, if bad)
        self.memory_config = cfg = mem.MemoryConfig.of(self.memory, memory_options)
        #: the accelerator its environment pins it to at start ("": none), told to the
        #: scheduler (``WorkerInfo.accelerator``)
        self.accelerator = accelerator_of(os.environ)
        #: the directory its outputs go to on disk, and the disk it offers for them:
        #: ``disk``, or the free space of that file system now less a margin; 0 when
        #: ``disk`` is None (not counted: the scheduler places as if it had no limit)
        self.disk_dir = cfg.spill_dir or tempfile.gettempdir()
        free = disk_free(self.disk_dir) if disk is not None else 0
        self.disk_margin = disk_margin(free)
        #: with ``disk_share`` N (one of N workers there): 1/N of that
        self.disk = 0 if disk is None else disk or free_share(free, disk_share)
        #: its file system had no room at start (no ``--disk``): said once at start
        self.disk_full_at_start = disk == 0 and free - self.disk_margin < NO_ROOM
        #: no ``--disk`` given: the scheduler shares its file system's free space among
        #: the workers on it that took this default (their budgets are the share)
        self.disk_auto = disk == 0
        limits = [n for n in (cfg.disk_limit, self.disk) if n]
        store_limit = min(limits) if limits else 0
        #: the pure core: which tasks fetch, wait and run, what memory needs
        self.state = WorkerState(
            worker_id,
            nthreads,
            cfg,
            killable=cfg.execution == "process",
            exits=on_retire is not None,  # a worker process: it may stop itself
        )
        #: outputs held here (spilled to disk under memory pressure)
        self.data = SpillStore(cfg.spill_dir, disk_limit=store_limit, sizeof=sizeof)
        self.streams = transfer.StreamTable()  #: outputs being read by peers part by part
        #: checkpoint files on its disk (its tasks', copies of peers'), in its disk
        #: budget, in the store's sandbox (where tasks write their file outputs too)
        self.checkpoints = CheckpointFiles(
            os.path.join(self.data.sandbox(), "checkpoints"), worker_id, self._disk_free
        )
        #: what memory is governed by (default: RSS of this process and its task processes)
        self.probe = probe
        self.executor: Executor | ProcessExecutor | None = None
        self._timer: asyncio.TimerHandle | None = None  #: the core's one timer
        self._copies: dict[int, tuple[anyio.Event, list[tuple[Key, ...]]]] = {}
        self._copy_ids = 0
        #: while leaving, until its copies start: set once a plan came, and the plans
        self._plan: tuple[anyio.Event, list[tuple[Any, ...]]] | None = None
        #: while its copies are made: starts those of more of its plan
        self._more_moves: Callable[[tuple[Any, ...]], None] | None = None
        #: tries that ended in error after the stop signal, not reported (lost with
        #: this worker: :meth:`_not_failed_by_the_stop`): key -> when each began
        #: (epoch s), for the ``Leaving`` that says what it was executing
        self._lost_to_stop: dict[Key, float] = {}
        self._trimmed = 0.0  #: when the heap was last trimmed
        #: the threads' CPU seconds (:func:`thread_cpu`) at the last memory tick that
        #: took them, at most ``CPU_SAMPLE_EVERY`` s apart while the loop runs: the
        #: baseline of a stall (:meth:`busy_threads`)
        self._cpu_sample: tuple[float, dict[int, float]] = (-math.inf, {})
        self._started = 0.0  #: when it started (the loop's clock)
        self._up = 0.0  #: when its task processes were seen up (0: not yet)
        self._start_checked = False  #: its memory at start was looked at
        self._disk_full = False  #: warned that spilling has no disk room
        self._spill_refused_at = 0.0  #: when a spill last found no disk room (epoch s)
        self.spilling: Spilling | None = None  #: the spill under way (in a thread)
        self.spilled_last: Spilling | None = None  #: the last spill that ended
        self._spill_limiter = anyio.CapacityLimiter(1)  #: one value written at a time
        #: spilled inputs read back at once (for the tasks about to run), at most
        self._read_limiter = anyio.CapacityLimiter(max(1, nthreads))
        self._written: set[Key] = set()  #: outputs just written to disk, for the core
        #: file copies that broke: key -> (.part file, bytes in it, the holder's File,
        #: when), resumed by the next fetch of the same file (from any holder); removed
        #: when nothing fetched it again for ``transfer.IDLE_SECONDS``
        self._partials: dict[Key, tuple[str, int, File, float]] = {}
        self._incoming = 0  #: disk set aside for the file copies under way
        #: bytes of the file copies that have landed but that the store does not hold
        #: yet: the core hears of a fetch's copies (and stores them) when all of them
        #: are done (:meth:`fetched_inputs`)
        self._landed = 0
        #: (bytes on disk, disk free) as the scheduler knows them: at first, from the
        #: registration (nothing on disk, all of ``disk`` free)
        self._reported_disk = (0, self._disk_free())
        #: abandoned threads as last reported: the scheduler prefers, for a task with a
        #: timeout, a worker that can still abandon a thread (one ending is reported)
        self._reported_abandoned = 0
        #: the bytes held in memory and RSS the scheduler knows, and when it was told:
        #: whether the memory tick tells it again (set when the worker starts)
        self._pacing = mem.ReportPacing.of(self.memory, 0.0, 0)

    @property
    def governor(self) -> mem.MemoryGovernor:
        return self.state.governor

    @property
    def info(self) -> WorkerInfo:
        host, host_memory = host_identity()
        try:
            fs_free = disk_free(self.disk_dir)
        except OSError:  # its file system went away: not told
            fs_free = 0
        return WorkerInfo(
            self.worker_id, self.nthreads, self.memory, self.disk, self.pool, "", self.deadline,
            self.block, host, host_memory, os.getpid(), device_of(self.disk_dir) or 0, fs_free,
            self.disk_auto, host_cpus(), self.memory_config.spill is not None,
            self.memory_config.execution, self.accelerator,
        )  # fmt: skip

    async def on_start(self) -> None:
        sandbox = self.data.sandbox()  # where tasks write their file outputs
        if self.memory_config.execution == "process":
            self.executor = ProcessExecutor(
                self.nthreads, self.worker_id, self._deliver, sandbox=sandbox,
                recycle_over=mem.recycle_over(self.memory, self.nthreads),
            )  # fmt: skip
        else:
            self.executor = Executor(self.nthreads, self.worker_id, self._deliver, sandbox=sandbox)
        self.executor.checkpoints = self.checkpoints
        self.executor.on_checkpoint = self._checkpoint
        # The scheduler knows of nothing held and no RSS at first: the first memory
        # tick a second on reports the RSS measured (an idle worker, or one running a
        # long first task, showed 0 until its first result came back).
        self._pacing = mem.ReportPacing.of(self.memory, self._now(), 0)
        self._started = self._now()
        self._floor_at_start(self.executor)  # with task processes: from the memory tick
        if self.disk_full_at_start:
            self.log.warning(
                DISK_FULL_AT_START,
                directory=self.disk_dir,
                free=disk_free(self.disk_dir),
                hint="its outputs that do not fit in memory have nowhere to go: the "
                "scheduler places them on other workers while this one's file system is "
                "full. Free space there, or start the worker with --spill-dir on a file "
                "system with room (or --disk off to run without a disk budget)",
            )
        if self.register:
            await self.scheduler.tell(RegisterWorker(self.info, self.ref))
        # A sample before any task (those the scheduler sends are taken after this):
        # the exit rule measures a task's rise from the sample before the first that
        # saw it execute; with none, a hog that allocated before the first memory tick
        # rose 0 and its worker stayed past its exit mark.
        self._sample()
        self.start_soon(self._monitor)

    async def on_restart(self) -> None:
        """After a failed told message or helper task (the kernel's rule 2): keep
        everything. The outputs held here, the tasks running in the executor and the
        core's record of both are what the scheduler counts on; dropping them (the
        default restart, ``on_stop`` then ``on_start``) would lose results and tasks
        without a word to the scheduler. Only the failed message is lost."""
        self.log.warning("worker kept its outputs and tasks after a failed message")

    async def on_stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        executor, self.executor = self.executor, None
        if executor is not None:
            if executor.killable:  # its task processes end before the worker does
                await anyio.to_thread.run_sync(executor.shutdown, True)
            else:
                executor.shutdown()
        self.streams.close_all()
        self.checkpoints.close()
        self.data.close()  # the sandbox: file outputs, spill files, partial copies

    # -- the core and its commands -----------------------------------------------------

    def _feed(self, *events: ws.Event) -> None:
        """Hand events to the core and carry out its commands (which may feed more).

        A command that fails does not stop the rest (the tries reported among them
        still go to the scheduler), and a task that could not be handed to the
        executor ends its try (:meth:`_not_submitted`): the core counts it as running,
        and nothing else would ever end it. The failure is logged.

        The core itself raising is a bug whose damage nobody can bound: its record of
        the tasks and outputs here may be half updated, and the events it did not take
        (the tasks of a ``RunTasks``, say) would never run. So the worker gives up
        (:meth:`_core_failed`): it feeds its core nothing more and leaves as lost."""
        if self.broken:
            return
        try:
            commands = self.state.handle(*events)
        except Exception as exc:
            self._core_failed(exc, events)
            return
        done: list[TaskResult] = []
        for cmd in commands:
            try:
                self._carry_out(cmd, done)
            except Exception as exc:
                self.log.error(
                    "command failed", command=type(cmd).__name__, error=repr(exc), exc_info=True
                )
                if isinstance(cmd, ws.Submit):
                    self._not_submitted(cmd.task, exc)
        if done:  # with its RSS with its task processes (the sample after the tries)
            self.scheduler.post(TasksDone(self.worker_id, tuple(done), self.state.governor.rss))
        if self._disk_used() != self._reported_disk[0]:
            self._report()  # placement counts this worker's free disk

    def _core_failed(self, exc: Exception, events: tuple[ws.Event, ...]) -> None:
        """The core raised on ``events``: log it (with the traceback, at CRITICAL), tell
        the scheduler this worker is lost (``crash``: it runs the tasks that were here
        elsewhere, each crash counting towards ``TaskCrashedWorkers`` as a worker that
        died under it would, and counts the outputs held here as lost), then stop: a
        worker process ends as when the scheduler retires it, an in-process worker
        stops its actor. Keeping it would keep tasks that never run."""
        self.broken = True
        self.log.critical(
            "worker core failed; the worker leaves as lost and its tasks run elsewhere",
            events=sorted({type(e).__name__ for e in events}),
            error=repr(exc),
            what="a bug in Corral: please report it with this traceback",
            exc_info=exc,
        )
        self.scheduler.post(WorkerGone(self.worker_id, "crash"))
        if self.on_retire is not None:
            self.on_retire("crash")
        else:
            self.stop("its core failed")

    def _carry_out(self, cmd: ws.Command, done: list[TaskResult]) -> None:
        """One command of the core (a :class:`~actors.worker_state.ReportDone`'s tries
        are gathered in ``done``, to go in one message)."""
        if isinstance(cmd, ws.Submit):
            self._submit(cmd.task)
        elif isinstance(cmd, ws.ReportDone):
            done.extend(cmd.results)
        elif isinstance(cmd, ws.Store):
            if cmd.key in self._written:  # on disk already (_write_outputs)
                self._written.discard(cmd.key)
            elif isinstance(cmd.value, File):  # a file output copied from a peer
                self.data.put_file(cmd.key, cmd.value)
            else:
                self.data.put(cmd.key, cmd.value, cmd.nbytes)
        elif isinstance(cmd, ws.Fetch):
            self.start_soon(self._fetch, cmd)
        elif isinstance(cmd, ws.Forget):
            for key in cmd.keys:
                self.data.discard(key)  # a spilled one's file goes unread
                self._drop_partial(key)
        elif isinstance(cmd, ws.Sample):
            self._sample()
        elif isinstance(cmd, ws.Spill):
            self._spill(cmd)
        elif isinstance(cmd, ws.Trim):
            self._trimmed = self._now()
            trim_memory()
        elif isinstance(cmd, ws.ReportMemory):
            self._report()
        elif isinstance(cmd, ws.ReportStarted):
            self.scheduler.post(TasksStarted(self.worker_id, cmd.started))
        elif isinstance(cmd, ws.StartTimer):
            self._arm(cmd.at)
        elif isinstance(cmd, ws.CancelRunning):
            self._cancel_running(cmd.key)
        elif isinstance(cmd, ws.Kill):
            self._kill(cmd.key, cmd.rss)
        elif isinstance(cmd, ws.Exit) and self.on_retire is not None:
            # Past its exit mark in thread execution (the core reported cmd.key's try
            # oom): the process leaves, its running threads with it (a nanny's restart)
            self.on_retire("memory")
        elif isinstance(cmd, ws.CopiesDone):
            waiter = self._copies.pop(cmd.request, None)
            if waiter is not None:
                waiter[1].append(cmd.got)
                waiter[0].set()
        elif isinstance(cmd, ws.Log):
            getattr(self.log, cmd.level)(cmd.event, **dict(cmd.fields))

    def _not_submitted(self, task: ToRun, exc: Exception) -> None:
        """``task`` could not be handed to the executor (``exc``): its try ends as if
        the executor had ended it, through :meth:`finished`. An input the store does
        not hold (``KeyError``) ends it ``missing`` (it did not start; the scheduler
        sends it again, to fetch that input), anything else ``error``."""
        key = exc.args[0] if isinstance(exc, KeyError) and exc.args else None
        if key is not None and key not in self.data and any(dk == key for dk, _ in task.deps):
            result = TaskResult(task.key, "missing", missing=((key, self.worker_id),))
        else:
            now = time.time()
            result = TaskResult(task.key, "error", now, now, error=exc)
        result.attempt = task.attempt
        self._deliver([(result, None)])

    def _submit(self, task: ToRun) -> None:
        """Hand ``task`` to the executor. A spilled input is read for this task only and
        stays on disk: putting it back in memory would push other outputs out, and
        writing it again later would cost the disk twice. It is read in a thread
        (:meth:`_read_then_submit`), from its file opened here: the event loop goes on
        meanwhile, and a drop of the input meanwhile does not take the file away."""
        assert self.executor is not None
        data = self.data
        spilled = [dk for dk, _ in task.deps if data.on_disk(dk)]
        inputs = {dk: data[dk] for dk, _ in task.deps if dk not in spilled}
        if spilled:
            opened: dict[Key, io.BufferedReader] = {}
            try:
                for dk in spilled:
                    opened[dk] = data.open_spilled(dk)
            except BaseException:
                for file in opened.values():
                    file.close()
                raise
            self.start_soon(self._read_then_submit, task, inputs, opened)
            return
        self._submit_read(task, inputs)

    async def _read_then_submit(
        self, task: ToRun, inputs: dict[Key, Any], opened: dict[Key, io.BufferedReader]
    ) -> None:
        """Read ``task``'s spilled inputs (``opened``) in a thread, then submit it; a
        read that fails ends its try as a failed submission (:meth:`_not_submitted`). A
        cancel meanwhile reaches the executor first, which then reports the try
        ``cancelled`` without running it."""
        try:
            for dk, file in opened.items():
                inputs[dk] = await anyio.to_thread.run_sync(
                    load_opened, file, limiter=self._read_limiter
                )
        except Exception as exc:
            self.log.error("spilled input not read", key=str(task.key), error=repr(exc))
            self._not_submitted(task, exc)
            return
        finally:
            for file in opened.values():
                file.close()
        if self.executor is None:  # stopped meanwhile
            return
        try:
            self._submit_read(task, inputs)
        except Exception as exc:
            self.log.error("command failed", command="Submit", error=repr(exc), exc_info=True)
            self._not_submitted(task, exc)

    def _submit_read(self, task: ToRun, inputs: dict[Key, Any]) -> None:
        """Hand ``task`` to the executor with its inputs, all read."""
        assert self.executor is not None
        cp = task.checkpoint
        if cp is not None and self.checkpoints.find(task.key, cp[0]) is None:
            if cp[1] is not None:
                self._write_checkpoint(task.key, cp[0], cp[1])
            elif cp[2] and cp[2] != self.worker_id:
                self.start_soon(self._resume_then_submit, task, inputs)
                return
        self.executor.submit(task, inputs)

    def _cancel_running(self, key: Key) -> None:
        assert self.executor is not None
        before = self.executor.abandoned
        programs = self.executor.programs_of(key)
        coroutine = self.executor.cancel(key)
        if programs:
            self.log.warning(
                LEFT_PROGRAMS, key=str(key),
                programs=", ".join(f"{name} (pid {pid})" for name, pid in programs),
            )  # fmt: skip
        if self.executor.abandoned != before:
            self._report()  # the scheduler's status shows the abandoned thread
        elif self.executor.held != self.state.threads_held:  # no room for another
            # A coroutine was cancelled: it ends at its next await (info); a sync
            # call runs on until it returns (warning).
            log = self.log.info if coroutine else self.log.warning
            log(
                HELD_COROUTINE if coroutine else HELD_THREAD,
                key=str(key),
                abandoned=self.executor.abandoned,
                held=self.executor.held,
            )
            self._feed(ws.ThreadsHeld(time.time(), self.executor.held))

    # -- memory ------------------------------------------------------------------------

    async def _monitor(self) -> None:
        """Sample memory every ``interval`` seconds (besides after every task)."""
        tick = Envelope(_MemoryTick(), "")
        while True:
            await anyio.sleep(self.memory_config.interval)
            if self.ref.mailbox.closed:
                return
            self.ref.mailbox.put_nowait(tick, force=True)

    def _floor_at_start(self, ex: Executor | ProcessExecutor) -> None:
        """Once, at start (when it starts; with task processes, from the memory tick):
        warn when the worker's RSS, its task processes up (waited for ``START_SETTLE``
        seconds at most, then given a second to load), is already at or past its resume
        mark: a floor no spilling can bring under it
        (docs/memory.md#the-floor-memory-that-is-not-outputs). Not once a task has run or
        runs: its memory is no longer the worker's at start."""
        now = self._now()
        if self.state.tasks_run or self.state.running:
            self._start_checked = True
            return
        if isinstance(ex, ProcessExecutor):
            if not self._up:
                if len(ex.pids()) < self.nthreads and now - self._started < START_SETTLE:
                    return
                self._up = now
            if now - self._up < 1.0:
                return
        self._start_checked = True
        used = ex.total_rss() if self.probe is None else self.probe()
        warning = mem.floor_at_start(self.memory_config, used)
        if warning is not None:
            self.log.warning(FLOOR_AT_START, rss=used, warning=warning)

    @handles(_MemoryTick)
    def memory_tick(self, msg: _MemoryTick) -> None:
        self._sample()
        if time.monotonic() - self._cpu_sample[0] >= CPU_SAMPLE_EVERY:
            self._cpu_sample = (time.monotonic(), thread_cpu())
        if not self._start_checked and self.executor is not None:
            self._floor_at_start(self.executor)
        # Others may fill (or free) the file system: report a move of 1% of the disk.
        if self.disk:
            moved = abs(self._disk_free() - self._reported_disk[1])
            if moved >= max(2**20, self.disk // 100):
                self._report()
        # Outputs stored or dropped, RSS moved, with no fence crossed: report that too,
        # paced (ReportPacing), so the scheduler's figures of this memory stay fresh.
        if self._pacing.due(self._now(), self.data.memory_bytes, self.state.governor.rss):
            self._report()
        if self.streams:
            self.streams.expire(self._now())  # streams whose reader died
        if self._partials:  # broken copies nothing resumed
            now = self._now()
            for key, (*_, when) in list(self._partials.items()):
                if now - when > transfer.IDLE_SECONDS:
                    self._drop_partial(key)

    @handles(_TimerFired)
    def timer_fired(self, msg: _TimerFired) -> None:
        self._feed(ws.TimerFired(time.time()))

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _sample(self) -> None:
        """Read memory, and who executes (not who waits in the executor's queue): the
        core attributes the reading to those tasks' peaks."""
        ex = self.executor
        if ex is None:
            return
        tasks: tuple[tuple[Key, int], ...] = ()
        began: tuple[tuple[Key, int], ...] = ()
        executing: tuple[Key, ...] = ()
        if isinstance(ex, ProcessExecutor):
            running, used = ex.running_rss()
            tasks = tuple(running.items())
            began = tuple(ex.began().items())
            if self.probe is not None:
                used = self.probe()
        else:
            # The tasks executing both before and after the read ran at that RSS (one
            # that ended or started in between is not credited with it).
            before = ex.executing()
            used = ex.total_rss() if self.probe is None else self.probe()
            if before:
                after = ex.executing()
                executing = before if before == after else tuple(k for k in before if k in after)
        executed = tuple(ex.executing_for().items())
        stored = self.data.memory_bytes
        spilling = self.spilling is not None and self.spilling.nbytes > 0
        self._feed(
            ws.MemorySampled(
                time.time(),
                used,
                tasks,
                executing,
                executed,
                stored,
                began,
                spilling,
                self.streams.in_memory,
            )
        )

    def _arm(self, at: float) -> None:
        """The core's timer: a :class:`_TimerFired` to self at wall time ``at``."""
        if self._timer is not None:
            self._timer.cancel()
        fired = Envelope(_TimerFired(), "")

        def fire() -> None:
            self._timer = None
            if not self.ref.mailbox.closed:
                self.ref.mailbox.put_nowait(fired, force=True)

        delay = max(0.0, at - time.time())
        self._timer = asyncio.get_running_loop().call_later(delay, fire)

    def _spill(self, cmd: ws.Spill) -> None:
        """Spill in a thread (:meth:`_spill_off_loop`), one spill at a time: a
        ``Spill`` while one is under way is let go (the governor asks again at its
        next sample if memory is still past the fence once that one has moved what
        it could)."""
        if self.spilling is not None:
            return
        self.spilling = Spilling(time.monotonic(), cmd.nbytes)
        self.start_soon(self._spill_off_loop, cmd)

    async def _spill_off_loop(self, cmd: ws.Spill) -> None:
        """Carry out ``cmd``: the store pickles and writes each value in a worker
        thread, so heartbeats and fetches go on meanwhile (an 800 MB output took the
        event loop for seconds when it was written on it); an output stays in memory,
        served as it is, until its file is in place."""
        store = self.data
        refused = store.spill_refused
        try:
            moved = await store.spill_keys_off_loop(
                cmd.nbytes, cmd.in_use | cmd.fresh, cmd.read_soon, limiter=self._spill_limiter
            )
        finally:
            assert self.spilling is not None
            self.spilling.ended = time.monotonic()
            self.spilled_last, self.spilling = self.spilling, None
        if store.spill_refused != refused:
            self._spill_refused_at = time.time()
        now = self._now()
        if moved or now - self._trimmed >= 0.5:
            # Over the fence with nothing (more) to spill: freed inputs and copies may
            # still sit in the heap; hand them back (at most twice a second).
            self._trimmed = now
            if MALLOC_TRIM is not None:
                MALLOC_TRIM(0)
        if moved:
            self.log.debug("spilled", keys=len(moved), on_disk=store.disk_bytes)
            self._feed(ws.Spilled(time.time(), tuple(moved)))
            self._report()
        if store.disk_full and not self._disk_full:  # once per time it fills up
            self.log.warning(
                "cannot spill: no disk room", disk_limit=store.disk_limit, on_disk=store.disk_bytes
            )
            if not moved:  # the scheduler learns at once (status, MemoryStalled)
                self._report()
        self._disk_full = store.disk_full

    def spill_during(self, began: float, now: float | None = None) -> Spilling | None:
        """The spill under way, or the last one, if it ran for at least half of the
        time from ``began`` to ``now`` (``time.monotonic()``, by default now) and asked
        for bytes: what a blocked event loop's warning may name. A spill that asked
        for none (memory over the fence is not outputs: the audit's "0.0 MiB asked
        for") or was over in a moment did not take those seconds."""
        now = time.monotonic() if now is None else now
        for spill in (self.spilling, self.spilled_last):
            if spill is None or spill.nbytes <= 0:
                continue
            ran = (now if spill.ended is None else spill.ended) - max(spill.began, began)
            if ran >= (now - began) / 2:
                return spill
        return None

    def busy_threads(self) -> list[tuple[str, float]]:
        """The threads of this process other than the event loop's that used CPU since
        the last sample (:meth:`memory_tick`, taken before a stall of the loop, which
        ran no tick meanwhile), the busiest first: what each is, and its CPU seconds.
        While one of them runs Python code, or a call that keeps Python's GIL, the
        event loop cannot run: what a blocked event loop's warning names."""
        before, now = self._cpu_sample[1], thread_cpu()
        loop = threading.get_native_id()
        names = {t.native_id: t.name for t in threading.enumerate()}
        ex = self.executor
        busy: list[tuple[str, float]] = []
        for tid, cpu in now.items():
            used = cpu - before.get(tid, 0.0)
            if tid == loop or used <= 0:
                continue
            name = names.get(tid, "")
            if ex is not None and name.startswith(f"{self.worker_id}-"):
                what = (
                    f"thread {name!r} (it hands tasks to their task process and reads "
                    "back their results)"
                    if isinstance(ex, ProcessExecutor)
                    else f"thread {name!r} (it runs tasks)"
                )
            elif name:
                what = f"thread {name!r} (the worker's own: spilling, reading spilled inputs)"
            else:
                what = f"thread {tid} (not Python's)"
            busy.append((what, used))
        return sorted(busy, key=lambda b: -b[1])

    def _kill(self, key: Key, rss: int) -> None:
        assert self.executor is not None
        if self.executor.kill(key, "oom"):
            self.log.warning("killed a task past the terminate fence", key=str(key), rss=rss)

    def _disk_used(self) -> int:
        """Bytes this worker has on disk, or has set aside there: spilled outputs and
        file outputs (the store's), checkpoint files (and room reserved for one being
        written or copied), and the file copies under way (their ``.part`` files) or
        landed and not stored yet."""
        return self.data.disk_bytes + self.checkpoints.nbytes + self._incoming + self._landed

    def _disk_rooms(self, written: int = 0) -> tuple[int | None, int | None]:
        """The disk left under the limit (:meth:`_disk_used` counted; None: no limit)
        and what the file system holding the spill directory has free less the margin
        (None: that directory's file system went away), each as it is. ``written``:
        bytes on that file system already that are not counted yet (a file output just
        made), which are room for themselves."""
        room = self.disk - self._disk_used() if self.disk else None
        try:
            fs = disk_free(self.disk_dir) + written - self.disk_margin
        except OSError:  # the directory's file system went away
            fs = None
        return room, fs

    def _disk_free(self, written: int = 0) -> int:
        """Disk left for anything new (an output, a file copy, a checkpoint): the limit
        less :meth:`_disk_used`, or what the file system has free less the margin,
        whichever is less; with no limit (``--disk off``), what the file system has
        free (:meth:`_disk_rooms`)."""
        room, fs = self._disk_rooms(written)
        if room is None:
            room = fs or 0
        elif fs is not None:
            room = min(room, fs)
        return max(0, room)

    def _disk_full_error(
        self,
        key: Key,
        nbytes: int,
        *,
        enospc: bool = False,
        input: Key = None,
        partial: bool = False,
    ) -> DiskFull:
        """The :class:`DiskFull` of ``key`` (``""``: its readers', for the copy of
        file input ``input``) that did not fit here (``nbytes``), with the room left
        now. When the file system holding the spill directory is what had no room
        (``enospc``: it refused a write; or it has less free than the limit leaves by
        more than its rounding, :func:`~actors.worker_state.file_system_short`), the
        error names it and its free bytes: a larger ``--disk`` cannot help.
        ``partial``: a write the file system stopped partway (``nbytes`` written)."""
        room, fs = self._disk_rooms()
        files = self.data.disk_files + len(self.checkpoints.files)
        if enospc or ws.file_system_short(room, fs, self.disk, files):
            try:
                where, fs_free = self.disk_dir, disk_free(self.disk_dir)
            except OSError:  # the directory's file system went away
                where, fs_free = self.disk_dir, 0
        else:
            where, fs_free = "", 0
        return DiskFull(
            str(key), self.worker_id, nbytes, self._disk_free(), self.disk,
            input="" if input is None else str(input), partial=partial,
            filesystem=where, fs_free=fs_free, measured=self.disk_auto,
        )  # fmt: skip

    def _report(self) -> None:
        cfg, store, governor = self.memory_config, self.data, self.state.governor
        free = self._disk_free()
        self._reported_disk = (self._disk_used(), free)
        self._pacing.sent(self._now(), store.memory_bytes, governor.rss)
        disk_free = free if self.disk else None
        abandoned = self.executor.abandoned if self.executor is not None else 0
        self._reported_abandoned = abandoned
        self.scheduler.post(
            WorkerMemoryReport(
                self.worker_id,
                governor.throttled,
                governor.rss,
                governor.throttle_at,
                cfg.limit,
                store.memory_bytes,
                store.disk_bytes,
                store.spilled_total,
                abandoned,
                disk_free,
                self._reported_disk[0],  # and checkpoint files and copies under way
                governor.floor if governor.moved else 0,
                store.file_bytes,
                self.state.past_peak,
                self.state.threads_held,
                governor.floor_text(),
                store.spill_refused,
                self._spill_refused_at,
                store.spill_refused_why,
                self.disk_dir,
                cfg.terminate_at,
            )
        )

    # -- running tasks ---------------------------------------------------------------

    @handles(RunTasks)
    def run_tasks(self, msg: RunTasks) -> None:
        self._feed(ws.TasksAssigned(time.time(), msg.tasks))

    @handles(CancelTasks)
    def cancel_tasks(self, msg: CancelTasks) -> None:
        self._feed(ws.CancelRequested(time.time(), msg.keys))

    # -- checkpoints (docs/files.md#checkpoints) ----------------------------------------

    def _checkpoint(self, key: Key, seq: int, path: str, nbytes: int) -> None:
        """A running task wrote a checkpoint file (``path`` "": it failed to): it is
        recorded here and the scheduler is told, with its bytes when they are few
        enough to travel (the scheduler's copy off this worker)."""
        if not path:
            self.checkpoints.release(key, seq)
            return
        self.checkpoints.commit(key, seq, path, nbytes)
        data = None
        if nbytes <= INLINE_BYTES:
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:  # dropped already (a cancelled try's): the scheduler says so
                data = None
        self.scheduler.post(CheckpointSaved(self.worker_id, key, seq, nbytes, data))
        if data is None and self.disk:
            self._report()  # a large file: placement counts this worker's disk

    def _write_checkpoint(self, key: Key, seq: int, data: bytes) -> None:
        """Put a checkpoint the scheduler sent (its bytes) on disk, for a try to start from."""
        files = self.checkpoints
        if files.reserve(key, seq, len(data)) is not None:
            self.log.warning("no disk room for a checkpoint to resume", key=str(key))
            return
        path = files.path(key, seq)
        try:
            with open(path + ".tmp", "wb") as f:
                f.write(data)
            os.replace(path + ".tmp", path)
        except OSError as exc:
            files.release(key, seq)
            self.log.warning("checkpoint to resume not written", key=str(key), error=str(exc))
            return
        files.commit(key, seq, path, len(data))

    async def _resume_then_submit(self, task: ToRun, inputs: dict[Key, Any]) -> None:
        """Fetch the checkpoint ``task`` resumes from off the worker holding it, then
        run it; if the fetch fails it runs from the newest checkpoint here, or none."""
        assert task.checkpoint is not None
        seq, _, holder, nbytes = task.checkpoint
        try:
            await self._fetch_checkpoint(holder, task.key, seq, nbytes)
        except Exception as exc:
            self.log.warning(
                "checkpoint to resume not fetched", key=str(task.key), holder=holder, error=str(exc)
            )
        if self.executor is not None:
            self.executor.submit(task, inputs)

    async def _fetch_checkpoint(self, holder: str, key: Key, seq: int, nbytes: int) -> None:
        """Copy checkpoint ``seq`` of ``key`` from ``holder``'s disk to this one as any
        file travels between workers (:func:`actors.transfer.fetch_file`: part by part,
        checked against its sha256, resumed from the bytes written after a broken
        stream); raises why it could not, its partial file removed."""
        files = self.checkpoints
        if files.find(key, seq) is not None:
            return
        refusal = files.reserve(key, seq, nbytes, fetch=True)
        if refusal is not None:
            raise CorralError(refusal)
        path = files.path(key, seq)
        try:
            peer = self.resolve(holder)
            if inspect.isawaitable(peer):
                peer = await peer
            if peer is None:
                raise CorralError(f"worker {holder!r} is gone")

            async def stream(at: int = 0) -> StreamInfo | None:
                pause, most = MEASURE_POLL
                while True:
                    reply = await peer.ask(GetCheckpoint(key, seq), timeout=self.fetch_timeout)
                    if not isinstance(reply, CheckpointStream):
                        return None
                    if not reply.measuring:
                        info: StreamInfo | None = reply.info
                        return info
                    await anyio.sleep(pause)  # its sha256 is being measured: ask again
                    pause = min(pause * 2, most)

            info = await stream()
            if info is None:
                raise CorralError(f"worker {holder!r} has no checkpoint {seq} of {key!r}")
            got = await transfer.fetch_file(
                lambda part: peer.ask(part, timeout=self.fetch_timeout),
                info,
                path,
                reopen=stream,
                close=peer.post,
                holder=holder,
            )
        except BaseException:
            files.release(key, seq)
            with contextlib.suppress(OSError):  # a broken copy: nothing resumes it
                os.unlink(path + ".part")
            raise
        files.commit(key, seq, path, got.size or 0, got.checksum or "")
        if self.disk:
            self._report()

    @handles(FetchCheckpoint)
    def fetch_checkpoint(self, msg: FetchCheckpoint) -> Later:
        """The scheduler asks for a copy of a peer's checkpoint file on this disk."""

        async def copy() -> CheckpointFetched:
            try:
                await self._fetch_checkpoint(msg.holder, msg.key, msg.seq, msg.nbytes)
            except Exception as exc:
                return CheckpointFetched(False, f"{type(exc).__name__}: {exc}")
            return CheckpointFetched(True)

        return Later(copy())

    @handles(GetCheckpoint)
    def get_checkpoint(self, msg: GetCheckpoint) -> Later:
        """A peer reads a checkpoint file of this disk: a stream of it with its size and
        sha256, or None. The first time, the sha256 is measured in a thread (once,
        however many peers ask); an answer that would wait for it more than
        :data:`MEASURE_WAIT` says ``measuring`` instead, and the peer asks again."""
        return Later(self._serve_checkpoint(msg.key, msg.seq))

    async def _serve_checkpoint(self, key: Key, seq: int) -> CheckpointStream:
        files = self.checkpoints
        found = files.find(key, seq)
        if found is None:
            self._unservable.discard((key, seq))  # gone: a file saved again is new
            return CheckpointStream(None)
        if (key, seq) in self._unservable:
            return CheckpointStream(None)
        path, nbytes = found
        checksum = files.checksum(key, seq)
        if not checksum:
            done = self._measuring.get((key, seq))
            if done is None:  # one measure per file, however many peers ask
                done = self._measuring[(key, seq)] = anyio.Event()
                self.start_soon(self._measure_checkpoint, key, seq, path, nbytes, done)
            with anyio.move_on_after(MEASURE_WAIT):
                await done.wait()
            if not done.is_set():
                return CheckpointStream(None, measuring=True)
            return await self._serve_checkpoint(key, seq)
        try:
            segments = FileSegments(path, [(0, nbytes)])
        except OSError:  # deleted meanwhile (its task ended)
            return CheckpointStream(None)
        info = self.streams.start(key, segments, self._now())
        return CheckpointStream(info._replace(file=File(path, size=nbytes, checksum=checksum)))

    async def _measure_checkpoint(
        self, key: Key, seq: int, path: str, nbytes: int, done: anyio.Event
    ) -> None:
        """The sha256 of a checkpoint file, in a thread (it reads the whole file)."""
        try:
            size, checksum = await anyio.to_thread.run_sync(digest, path)
            if size == nbytes:
                self.checkpoints.measured(key, seq, path, checksum)
            else:  # not the file that was saved: none to serve
                self._unservable.add((key, seq))
        except OSError:  # deleted meanwhile (its task ended)
            self._unservable.add((key, seq))
        finally:
            del self._measuring[(key, seq)]
            done.set()

    @handles(DropCheckpointsMsg)
    def drop_checkpoints(self, msg: DropCheckpointsMsg) -> None:
        freed = sum(self.checkpoints.drop(key, seq) for key, seq in msg.items)
        if self._unservable:
            dropped = {(key, seq) for key, seq in msg.items}
            self._unservable = {
                (k, n) for k, n in self._unservable if not {(k, n), (k, 0)} & dropped
            }
        if freed and self.disk:
            self._report()

    def _deliver(self, done: list[tuple[TaskResult, Any]]) -> None:
        """Event-loop side of the executor: queue the results as a message to self."""
        if not self.ref.mailbox.closed:
            self.ref.mailbox.put_nowait(Envelope(_Finished(tuple(done)), ""), force=True)

    @handles(_Finished)
    def finished(self, msg: _Finished) -> None:
        cfg, governor = self.memory_config, self.state.governor
        results = msg.results
        if self.executor is not None:
            self.executor.settled(res.key for res, _ in results)
        if self.checkpoints.pending:  # a try killed mid-checkpoint: its room comes back
            for res, _ in results:
                self.checkpoints.settle(res.key)
        if STOP_SIGNALLED:
            results = self._not_failed_by_the_stop(results)
            if not results:
                return
        results = self._keep_files(results)
        if cfg.spill is not None and governor.rss >= cfg.at(cfg.spill):
            results = self._write_outputs(results)  # memory is past its spill fence
        written = set(self._written)
        now = time.time()
        events: list[ws.Event] = [ws.TasksFinished(now, results)]
        if self.executor is not None and self.executor.held != self.state.threads_held:
            events.append(ws.ThreadsHeld(now, self.executor.held))  # a held thread is back
        self._feed(*events)
        if self.executor is not None and self.executor.abandoned != self._reported_abandoned:
            self._report()  # an abandoned thread ended (a held one reports by itself)
        if written:
            for key in self._written:  # results the core did not keep (cancelled)
                self.data.discard(key)  # its file too, without reading it back
            kept = tuple(k for k in written - self._written if self.data.on_disk(k))
            self._written.clear()
            if kept:
                self._feed(ws.Spilled(time.time(), kept))

    def _not_failed_by_the_stop(self, results: tuple[Any, ...]) -> tuple[Any, ...]:
        """This worker process got its stop signal (:data:`STOP_SIGNALLED`): a batch
        system signals every process of the job at once, the programs its tasks started
        too, which die of it (a task's ``subprocess.run(..., check=True)`` then raises
        ``CalledProcessError``, "died with SIGTERM"). A try that ends in an error from
        then on failed for the stop, not for itself: it is not reported, and is lost
        with this worker as its running tries are (a preemption's: a free retry), where
        it would have spent a retry, or failed its task with ``retries=0``. The
        worker's ``Leaving`` lists it as executing, with the seconds since it began:
        not listed, the scheduler would take it for a try that never started (0 s run:
        no walltime loss known, 0 s in the report's preemption cost)."""
        kept = tuple((res, value) for res, value in results if res.outcome != "error")
        for res, _ in results:
            if res.outcome == "error":  # it executed until now: Leaving says so
                self._lost_to_stop[res.key] = res.start or time.time()
        if len(kept) < len(results):
            self.log.info(
                "tries ended in error after the stop signal: lost with this worker, not failed",
                keys=[str(res.key) for res, _ in results if res.outcome == "error"],
            )
        return kept

    def _write_outputs(self, results: tuple[Any, ...]) -> tuple[Any, ...]:
        """Past the spill fence, a new output cannot stay in memory for long: it will
        be spilled. One larger than the disk left under ``--disk`` is written to disk at
        once; if that fails for room (as expected) or the disk refuses it, its try ends
        ``disk-full``: its partial file is removed, nothing of it is kept, and the
        scheduler retries it where it fits. Outputs that fit are stored as always (in
        memory; the governor spills the least recently used)."""
        out = []
        for res, value in results:
            if res.key in self._written:  # a file output, kept already
                out.append((res, value))
                continue
            room = self._disk_free() if res.outcome == "ok" and self.disk else None
            if room is None or res.nbytes <= room:
                out.append((res, value))
                continue
            if self.data.write(res.key, value, res.nbytes):  # smaller than it seemed
                self._written.add(res.key)
                out.append((res, value))
                continue
            self.log.info(  # the scheduler retries it where it fits: see DISK_FULL_THEN
                "output did not fit on disk", key=str(res.key), nbytes=res.nbytes, room=room,
                then=DISK_FULL_THEN,
            )  # fmt: skip
            error = self._disk_full_error(res.key, res.nbytes)
            out.append((dataclasses.replace(res, outcome="disk-full", error=error), None))
        if self._written:
            self._report()  # before the results: the scheduler sees the disk they take
        return tuple(out)

    def _keep_files(self, results: tuple[Any, ...]) -> tuple[Any, ...]:
        """File outputs among ``results`` (measured by the executor, in the sandbox):
        each is kept as a file entry of the store, its size as the try's ``nbytes``, if
        it fits in the disk left under ``--disk``; one that does not is removed and its
        try ends ``disk-full``, as an output written to disk that does not fit. A try
        the executor ended ``disk-full`` (its task's writes filled the sandbox's file
        system) gets its :class:`DiskFull` here (:meth:`_task_disk_full`)."""
        if not any(isinstance(v, File) or r.outcome == "disk-full" for r, v in results):
            return results
        out: list[tuple[TaskResult, Any]] = []
        for res, value in results:
            if res.outcome == "disk-full":
                out.append((self._task_disk_full(res), None))
                continue
            if res.outcome != "ok" or not isinstance(value, File):
                out.append((res, value))
                continue
            size = value.size or 0
            res = dataclasses.replace(res, nbytes=size, file=True)
            room = self._disk_free(written=size) if self.disk else None
            if room is not None and size > room:
                discard_output(value)
                self.log.info(
                    "file output did not fit on disk", key=str(res.key), nbytes=size,
                    room=room, then=DISK_FULL_THEN,
                )  # fmt: skip
                error = self._disk_full_error(res.key, size)
                out.append((dataclasses.replace(res, outcome="disk-full", error=error), None))
                continue
            self.data.put_file(res.key, value)
            self._written.add(res.key)  # stored: the core's Store keeps it as it is
            out.append((res, value))
        if self._written:
            self._report()  # before the results: the scheduler sees the disk they take
        return tuple(out)

    def _task_disk_full(self, res: TaskResult) -> TaskResult:
        """A try whose task failed because the file system of this worker's disk was
        full (``ENOSPC`` while it wrote on its sandbox's: the executor's
        :func:`~actors.executor.out_of_disk`, which measured the bytes its try wrote
        before its files were removed): it ends ``disk-full`` with a :class:`DiskFull`
        naming this worker, those bytes and the room left, raised from the task's own
        error. Its ``nbytes``, what its category and the task learn, is one more than it
        wrote: its output is larger than what fitted, so its retry does not come back to
        a disk with no more room than this one had (one that filled before the task
        wrote a byte, say). The scheduler hears of this disk first."""
        if isinstance(res.error, DiskFull):
            return res
        room = self._disk_free()
        self.log.warning(
            "task filled the disk", key=str(res.key), wrote=res.nbytes, room=room,
            error=f"{type(res.error).__name__}: {res.error}",
        )  # fmt: skip
        error = self._disk_full_error(res.key, res.nbytes, enospc=True, partial=True)
        error.__cause__ = res.error
        self._report()  # before the result: placement sees this disk as it is now
        return dataclasses.replace(res, nbytes=res.nbytes + 1, error=error)

    def _drop_partial(self, key: Key) -> None:
        partial = self._partials.pop(key, None)
        if partial is not None:
            with contextlib.suppress(OSError):
                os.unlink(partial[0])

    # -- fetching inputs from peers ----------------------------------------------------

    async def _fetch(self, cmd: ws.Fetch) -> None:
        """Carry out one :class:`~actors.worker_state.Fetch`; the answer, whatever
        happens, goes back to the core as an :class:`~actors.worker_state.InputsFetched`."""
        got: list[tuple[Key, Any, int]] = []
        missing: tuple[Key, ...] = ()
        refused: list[tuple[Key, BaseException]] = []
        failed = ""
        peer = self.resolve(cmd.peer)
        try:
            if inspect.isawaitable(peer):  # remote peers may need a connection first
                peer = await peer
            if peer is None:
                failed = "gone"
            else:
                missing = await self._fetch_keys(peer, cmd.keys, got, refused, cmd.peer)
        except (CorralError, UnknownStream) as exc:  # unreachable, gone, timed out
            failed = f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            # Anything else (the holder's handler failed, a bug here): this fetch failed,
            # not the worker. Raised on, it would restart the actor and the core would
            # wait for this answer for ever; answered, the next holder is asked, or the
            # tasks needing the inputs go back to the scheduler ("missing").
            self.log.error(
                "fetch failed unexpectedly", peer=cmd.peer, error=repr(exc), exc_info=True
            )
            failed = f"{type(exc).__name__}: {exc}"
        answer = ws.InputsFetched(
            time.time(), cmd.fetch, tuple(got), missing, tuple(refused), failed
        )
        self.ref.mailbox.put_nowait(Envelope(_Fetched(answer), new_causal_id("f")), force=True)

    async def _fetch_keys(
        self,
        peer: Any,
        keys: tuple[Key, ...],
        got: list[tuple[Key, Any, int]],
        refused: list[tuple[Key, BaseException]],
        holder: str = "",
    ) -> tuple[Key, ...]:
        """One GetData of ``keys`` from ``peer``; values above ``STREAM_BYTES`` from a
        peer in another process come as streams, read here part by part. Returns the
        keys the peer does not hold. An output the peer cannot pickle is ``refused``
        with :class:`ResultNotPicklable` (the tasks needing it fail with it) and the
        rest asked for again."""
        # A peer in this process hands over references: nothing to stream (but the
        # bytes of file outputs, copied here).
        over = 0 if isinstance(peer, ActorRef) else STREAM_BYTES
        reply: DataReply
        while True:
            try:
                reply = await peer.ask(
                    GetData(keys, stream_over=over, files=True), timeout=self.fetch_timeout
                )
                break
            except ResultNotPicklable as exc:  # never comes again: the rest are asked for
                if not any(str(k) == exc.key for k in keys):
                    raise  # not one of ours: the fetch fails
                error = ResultNotPicklable(
                    exc.key, exc.reason, exc.worker,
                    f"worker {self.worker_id!r}, as an input of a task there (which failed "
                    "with this error)",
                )  # fmt: skip
                refused.extend((k, error) for k in keys if str(k) == exc.key)
                keys = tuple(k for k in keys if str(k) != exc.key)
                if not keys:
                    return ()
            except FrameTooLarge:
                # The recorded sizes understated the values (dask.sizeof of an object
                # it cannot see into): ask again with every value as a stream.
                if over == 1:
                    raise
                over = 1
            except CorralError:  # unreachable, gone, timed out
                raise
            except Exception:
                # The peer could not send its reply (it is pickled after its handler
                # returned, so the error names no key): mostly a value that does not
                # pickle. Asked again with every value as a stream, it serializes each
                # in its handler and names the one that does not (ResultNotPicklable).
                if over <= 1:  # in this process (nothing pickled), or asked so already
                    raise
                over = 1
        sizes = reply.nbytes  # the holder's records: no value sized again here
        if len(sizes) == len(reply.data):
            got.extend((k, v, n) for (k, v), n in zip(reply.data.items(), sizes, strict=True))
        else:
            got.extend((k, v, sizeof(v)) for k, v in reply.data.items())
        for info in reply.streams:
            if info.file is not None:
                try:
                    file = await self._fetch_file(peer, info, holder)
                except DiskFull as exc:  # no room here: the tasks needing it end disk-full
                    refused.append((info.key, exc))
                    continue
                except (StreamBroken, FileChecksumError, CorralError, OSError) as exc:
                    # Not had from this peer: the next holder is asked (resuming a
                    # broken copy from where it stopped), else it is made again.
                    self.log.warning("file copy failed", key=str(info.key), error=str(exc))
                    continue
                got.append((info.key, file, file.size or 0))
                continue
            try:
                value = await transfer.receive(
                    lambda part: peer.ask(part, timeout=self.fetch_timeout),
                    info,
                    limit=self.memory,
                    where=f"worker {self.worker_id!r} (its memory limit)",
                    close=peer.post,
                )
            except ValueTooLarge as exc:  # an input this worker can never hold
                refused.append((info.key, exc))
                continue
            got.append((info.key, value, sizeof(value)))
        return tuple(reply.missing)

    async def _fetch_file(self, peer: Any, info: StreamInfo, holder: str = "") -> File:
        """Copy the file output streamed by ``info`` from ``peer`` into the sandbox,
        resuming a copy of the same file that broke before (from any holder). Refused
        with :class:`DiskFull`, before a byte is written, if the disk left under
        ``--disk`` (less the copies under way) cannot hold the bytes still to come."""
        meta = info.file
        assert meta is not None and meta.size is not None
        key = info.key
        part, offset = "", 0
        partial = self._partials.pop(key, None)
        if partial is not None:
            if partial[2].checksum == meta.checksum and partial[2].size == meta.size:
                part, offset = partial[0], partial[1]
            else:  # the file was made again meanwhile: start over
                with contextlib.suppress(OSError):
                    os.unlink(partial[0])
        need = meta.size - offset
        if self.disk:
            room = self._disk_free()
            if need > room:
                peer.post(CloseStream(info.stream, info.worker))
                if part:
                    with contextlib.suppress(OSError):
                        os.unlink(part)
                # its readers' own: WorkerState names each (DiskFull.reading)
                raise self._disk_full_error("", meta.size, input=key)

        async def reopen(at: int) -> StreamInfo | None:
            reply = await peer.ask(GetData((key,), files=True), timeout=self.fetch_timeout)
            return next((s for s in reply.streams if s.file is not None), None)

        self._incoming += need
        try:
            file = await transfer.fetch_file(
                lambda p: peer.ask(p, timeout=self.fetch_timeout),
                info,
                os.path.join(self.data.sandbox(), f"{uuid.uuid4().hex[:12]}-{meta.name}"),
                reopen=reopen,
                part=part,
                offset=offset,
                close=peer.post,
                holder=holder,
            )
        except StreamBroken as exc:
            if exc.prefix:  # the next fetch of this file goes on from there
                self._partials[key] = (exc.part, exc.prefix, meta, self._now())
            raise
        except OSError as exc:
            if exc.errno == errno.ENOSPC:  # the file system filled up meanwhile
                self._incoming -= need  # its partial file went: the room it had is free
                need = 0
                raise self._disk_full_error(
                    "", meta.size, enospc=True, input=key, partial=True
                ) from exc
            raise
        finally:
            self._incoming -= need
        self._landed += file.size or 0  # on disk, not in the store yet: counted until it is
        return file

    @handles(_Fetched)
    def fetched_inputs(self, msg: _Fetched) -> None:
        # The copies that landed leave _landed as the core stores them (or they go).
        self._landed -= sum(v.size or 0 for _, v, _ in msg.answer.got if isinstance(v, File))
        self._feed(msg.answer)
        for key, value, _ in msg.answer.got:  # file copies the core did not keep
            if isinstance(value, File) and not (
                self.data.is_file(key) and self.data.peek(key) is value
            ):
                discard_output(value)

    # -- leaving: copies of needed outputs to peers --------------------------------------

    @handles(Leave)
    def leave(self, msg: Leave) -> Later:
        return Later(self._evacuate(msg.cause))

    async def _evacuate(self, cause: str) -> tuple[tuple[Key, str], ...]:
        """Ask the scheduler where this worker's needed outputs should go, have each
        target copy its share (all targets at once), tell the scheduler what was copied.
        More of the plan may come while the copies are made (a target said it leaves
        too: its share goes to another): those copies start at once, and are waited for
        as well. Bounded by the asker's timeout (the grace before the process must be
        gone)."""
        done, plans = anyio.Event(), list[tuple[Any, ...]]()
        self._plan = (done, plans)
        # What it executes now: the tasks it has in hand besides these never started.
        ex = self.executor
        running = ex.started_for() if ex is not None else {}
        # (and those whose error after the stop signal was not reported: they
        # executed until it; else the scheduler reads them as never started, 0 s)
        now = time.time()
        for key, began in self._lost_to_stop.items():
            running.setdefault(key, max(0.0, now - began))
        executing = tuple(str(k) for k in running)
        self.scheduler.post(Leaving(self.worker_id, cause, executing, tuple(running.values())))
        await done.wait()
        copied: list[tuple[Key, str]] = []
        planned = 0

        async def copy_to(target: str, keys: list[tuple[Key, int]]) -> None:
            try:
                peer = self.resolve(target)
                if inspect.isawaitable(peer):
                    peer = await peer
                if peer is None:
                    return
                reply = await peer.ask(CopyFrom(self.worker_id, tuple(keys)), timeout=None)
            except CorralError as exc:
                self.log.warning("evacuation failed", target=target, error=str(exc))
                return
            copied.extend((k, target) for k in reply.got)

        try:
            async with anyio.create_task_group() as tg:

                def start(moves: tuple[Any, ...]) -> None:
                    nonlocal planned
                    planned += len(moves)
                    by_target: dict[str, list[tuple[Key, int]]] = {}
                    for key, target, nbytes in moves:
                        by_target.setdefault(target, []).append((key, nbytes))
                    for target, keys in by_target.items():
                        tg.start_soon(copy_to, target, keys)

                for moves in plans:
                    start(moves)
                self._plan, self._more_moves = None, start
        finally:
            self._more_moves = None
        self.log.info("evacuated", cause=cause, copies=len(copied), planned=planned)
        self.scheduler.post(Evacuated(self.worker_id, tuple(copied)))
        return tuple(copied)

    @handles(EvacuationPlan)
    def evacuation_plan(self, msg: EvacuationPlan) -> None:
        if self._plan is not None:  # before the copies start: all of them start together
            done, plans = self._plan
            plans.append(msg.moves)
            done.set()
        elif self._more_moves is not None:  # while they are made: these start now
            self._more_moves(msg.moves)

    @handles(CopyFrom)
    def copy_from(self, msg: CopyFrom) -> Later:
        """A leaving peer's outputs: fetch and keep them; reply with what is held."""
        self._copy_ids += 1
        request = self._copy_ids
        done, got = anyio.Event(), list[tuple[Key, ...]]()
        self._copies[request] = (done, got)
        keys = tuple((key, (msg.holder,), nbytes) for key, nbytes in msg.keys)
        self._feed(ws.CopiesRequested(time.time(), request, keys))

        async def answer() -> CopiesReply:
            await done.wait()
            return CopiesReply(got[0])

        return Later(answer())

    # -- requests from the scheduler, the registry and peers ---------------------------

    @handles(ConfirmHolds)
    def confirm_holds(self, msg: ConfirmHolds) -> None:
        """The scheduler asks as the worker joins, and after each rejoin; everything it
        sent before has been handled by now (one connection, one mailbox: in order), so
        this is what reached us."""
        active = self.state.active
        store = self.data
        held = tuple((key, store.nbytes(key)) for key in store)
        self.log.info("rejoined" if self.joins else "joined", active=len(active), held=len(held))
        self.joins += 1
        self.scheduler.post(WorkerHolds(self.worker_id, active, held))
        if self.state.governor.rss:  # measured: the scheduler has it from the start
            self._report()

    @handles(DropKeys)
    def drop_keys(self, msg: DropKeys) -> None:
        self._feed(ws.DropRequested(time.time(), msg.keys))

    @handles(ForgetWork)
    def forget_work(self, msg: ForgetWork) -> None:
        active, held = self.state.active, tuple(self.data)
        if active:
            self._feed(ws.CancelRequested(time.time(), active))
        if held:
            self._feed(ws.DropRequested(time.time(), held))
        if active or held:
            self.log.warning(
                "joined a manager that does not know this worker (restarted, or it gave "
                "the worker up): its previous work is gone; dropped what it had",
                tasks=len(active), outputs=len(held), running=len(self.state.running),
            )  # fmt: skip

    @handles(RunCall)
    def run_call(self, msg: RunCall) -> RunOutcome | Later:
        """``Cluster.run``: the call in a thread of this process (off the event loop,
        beside the tasks: it takes no slot, and in process execution it runs here, not
        in a task process), answered when it returns. A daemon thread, as a task's: a
        call that never returns does not keep the process from ending. At most
        :data:`~actors.worker_state.RUN_THREADS` at once, apart from the threads the
        worker's own work takes (spills, reads): a call that never returns keeps one;
        past that many a call waits for one (at most
        :data:`~actors.worker_state.RUN_WAITING`, the next refused at once:
        :class:`~runtime.errors.RunQueueFull`), and one still waiting when its
        ``msg.timeout`` runs out is dropped, never run (answered
        :class:`~runtime.errors.RunNoAnswer`). Which, :class:`~ws.RunSlots` decides.
        A worker that stops meanwhile does not wait for the call: its asker gets
        ``ActorStopped`` (its client :class:`~runtime.errors.RunNoAnswer`, ``left``),
        a waiting call is dropped, and a running one is let go."""
        timeout = check_run_timeout(msg.timeout)  # (a peer of another process says any)
        self._run_ids += 1
        call, now = self._run_ids, time.monotonic()
        verdict = self._run_slots.arrive(call, now + timeout)
        if verdict == "refuse":
            self.log.warning("refusing a Cluster.run call: its threads are taken, too many wait",
                             func=msg.name, waiting=len(self._run_slots.waiting))  # fmt: skip
            full = RunQueueFull(self.worker_id, msg.name, self._run_slots.threads,
                                self._run_slots.most_waiting)  # fmt: skip
            return run_failure(full, msg.name, self.worker_id)
        self.log.info("running a function for Cluster.run", func=msg.name,
                      waits=verdict == "wait")  # fmt: skip
        run = _RunCall(msg)
        if verdict == "run":
            self._start_run(call, run)
        else:
            self._run_waiting[call] = run
        return Later(self._run_answer(call, run, now + timeout))

    async def _run_answer(self, call: int, run: _RunCall, deadline: float) -> RunOutcome:
        """``run``'s outcome once it returned; a :class:`~runtime.errors.RunNoAnswer`
        one, at ``deadline``, for a call that waited for a thread until then (dropped)."""
        try:
            with anyio.move_on_after(deadline - time.monotonic()):
                await run.started.wait()
            if not run.started.is_set():
                self.log.warning("dropped a Cluster.run call that had no thread by its timeout",
                                 func=run.msg.name)  # fmt: skip
                nothing = RunNoAnswer(self.worker_id, run.msg.name, run.msg.timeout, left=False)
                return run_failure(nothing, run.msg.name, self.worker_id)
            await run.done.wait()
        finally:  # answered, timed out, or the worker stops: a waiting call is dropped
            if not run.started.is_set():
                self._run_waiting.pop(call, None)
                self._run_slots.expired(call)
        assert run.outcome is not None
        return run.outcome

    def _start_run(self, call: int, run: _RunCall) -> None:
        """``run`` in a daemon thread of its own (as tasks' threads are: the process
        does not wait for it at its end), its outcome handed back to the event loop."""
        run.started.set()
        loop = asyncio.get_running_loop()
        msg, worker = run.msg, self.worker_id

        def body() -> None:
            outcome = run_call(msg.call, msg.name, worker)  # (it raises nothing)
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(self._run_ended, call, run, outcome)

        threading.Thread(target=body, name=f"corral-run-{call}", daemon=True).start()

    def _run_ended(self, call: int, run: _RunCall, outcome: RunOutcome) -> None:
        """In the event loop: ``run`` returned ``outcome``; its thread's place goes to
        the next waiting call still in time (:meth:`ws.RunSlots.ended`)."""
        run.outcome = outcome
        run.done.set()
        following, dropped = self._run_slots.ended(call, time.monotonic())
        for late in dropped:  # (its answer, at its deadline, says it was not run)
            self._run_waiting.pop(late, None)
        if following is not None:
            self._start_run(following, self._run_waiting.pop(following))

    @handles(GetData)
    def get_data(self, msg: GetData) -> DataReply:
        """The values of ``msg.keys`` held here. For another process (``raw``, or
        ``stream_over`` set) they are pickled: those pickled here (raw, streams) and one
        the store knows does not pickle raise :class:`ResultNotPicklable` naming its
        key (the streams opened for this reply are closed). One sent in the reply that
        does not pickle fails the reply as it is sent (:class:`~runtime.remote.Peer`),
        naming no key: the asker then asks again with ``stream_over=1``, every value
        serialized here (:meth:`_fetch_keys`, the manager's gather)."""
        data: dict[Key, Any] = {}
        missing = []
        streams: list[StreamInfo] = []
        store = self.data
        over = msg.stream_over
        key: Key = None
        try:
            for key in msg.keys:
                if key not in store:
                    missing.append(key)
                elif store.is_file(key):  # a file output: its bytes, or its handle
                    file = store.peek(key)
                    if msg.files:
                        info = self.streams.start(key, store.segments(key), self._now())
                        streams.append(info._replace(file=file))
                    else:
                        data[key] = store.get_raw(key) if msg.raw else file
                elif over and store.nbytes(key) >= over:  # a spilled one is read from disk
                    streams.append(self.streams.start(key, store.segments(key), self._now()))
                elif msg.raw:
                    data[key] = store.get_raw(key)  # a spilled output stays on disk
                else:
                    # To another process, and the store failed to pickle it before (to
                    # spill or send it): it would fail the reply naming no key.
                    why = store.unpicklable_error(key) if over else None
                    if why is not None:
                        raise Unpicklable(why)
                    data[key] = store.peek(key)
        except Unpicklable as exc:
            for info in streams:
                self.streams.close(info.stream)
            to = "a client (through the manager)" if msg.raw else "another process"
            self.log.warning(
                "output cannot be pickled to leave this worker", key=str(key), error=exc.reason
            )
            # The scheduler records it as the task's failure (it never asked for this).
            self.scheduler.post(OutputUnpicklable(self.worker_id, key, exc.reason, to))
            raise ResultNotPicklable(str(key), exc.reason, self.worker_id, to) from None
        sizes = tuple(store.nbytes(k) for k in data)
        return DataReply(data, tuple(missing), msg.raw, tuple(streams), sizes)

    @handles(ReadStream)
    def read_stream(self, msg: ReadStream) -> StreamPart:
        return StreamPart(self.streams.read(msg.stream, msg.offset, msg.length, self._now()))

    @handles(CloseStream)
    def close_stream(self, msg: CloseStream) -> None:
        self.streams.close(msg.stream)

    @handles(Stop)
    def retire(self, msg: Stop) -> Later:
        """The scheduler retires this worker (drained; the reason is why: ``walltime``
        or ``drained``): copy the outputs others still need and no other worker holds to
        the workers the scheduler names (within ``grace`` seconds less one), then end."""
        self.log.info("retired", reason=msg.reason)

        async def leave() -> None:
            with anyio.move_on_after(max(0.0, self.grace - 1.0)):
                await self._evacuate("drained")
            if self.on_retire is not None:
                self.on_retire(msg.reason)
            else:
                self.stop(msg.reason)

        return Later(leave())

    @handles(StatusRequest)
    def status(self, msg: StatusRequest) -> WorkerStatus:
        store, ex, state = self.data, self.executor, self.state
        return WorkerStatus(
            self.worker_id,
            len(store),
            store.memory_bytes,
            len(state.running),
            len(state.fetching) + len(state.queued),
            ex.total_rss() if ex is not None else rss(),
            store.n_spilled,
            store.disk_bytes,
            store.spilled_total,
            len(state.deferred),
            state.governor.throttled,
            self.memory_config.execution,
            ex.abandoned if ex is not None else 0,
            store.n_files,
            store.file_bytes,
            self.checkpoints.nbytes,
            self._disk_used(),
        )
