"""Executors: where a worker's tasks run, and the RSS probe read around every task.

What lives here:

- :class:`BaseExecutor`: what every execution mode offers the worker (``submit``,
  ``shutdown``, ``kill``, ``cancel``, ``total_rss``, ``executing``: the tasks started
  and not ended, which the worker's memory samples are attributed to) and the one copy
  of the result hand-over: finished tasks go back to the event loop in batches through
  ``deliver``.
- :class:`Executor` (mode ``"thread"``, the default): ``n`` threads of the worker
  process run the tasks.
- :class:`ProcessExecutor` (mode ``"process"``): ``n`` long-lived *task processes*,
  one per slot, run the tasks; one of them can be killed (:meth:`ProcessExecutor.kill`)
  without killing the worker.
- :class:`TaskProcessDied`: the error of a task whose task process died under it.
- :func:`rss`: this process's resident set size, cheap enough to read around each task.

Each executor measures, per task, duration, output size (``dask.sizeof``) and RSS right
before and right after it, and runs it in its file outputs' context
(:func:`runtime.files.task_outputs`: the worker's sandbox, given as ``sandbox``), which
measures a returned ``File`` in the task's own thread or task process. A task process
that dies under its task (killed, crashed) never ends that context: its try's directory
is removed when the process is replaced (:func:`runtime.files.remove_tries`). A task
that fails because the worker's disk filled up while it wrote (``ENOSPC`` on the
sandbox's file system, or an ``OSError`` without an errno while that file system is full:
:func:`out_of_disk`) ends ``disk-full``, not ``error``, with the
bytes its try wrote as ``nbytes`` (measured before its try's directory is removed), so
that the scheduler retries it where it fits.

Which mode to pick: threads are the default because tasks share the worker's memory, so
inputs and outputs are never copied, and numpy, pandas and most compiled code release
the GIL while they work. Processes cost a pickle copy of every task's inputs and output
(and a process start after every kill), but a task that runs away with memory can be
killed at the worker's memory *terminate* fence and its try recorded as ``oom`` while
the worker and the other tasks' results live on. In process mode the RSS a task reports
is its task process's; :meth:`BaseExecutor.total_rss` is the worker's plus its task
processes' and what the programs their tasks started add (:class:`ProgramTree`); in thread
mode the worker's plus that of the programs started from its threads.

How task processes work: each is started with the ``spawn`` start method (never
``fork``: the worker is multi-threaded) by the thread that feeds it, and dies with its
parent (``PR_SET_PDEATHSIG`` on Linux, plus a lifeline pipe whose end-of-file ends it
anywhere; both as for worker processes, :mod:`runtime.lifeline`). It leads a process
group of its own, which the programs its tasks start join: wherever the worker stops a
task process (a timeout, a cancel, the terminate fence, its shutdown, a replacement) it
SIGKILLs the whole group (:func:`signal_group`), so those programs stop with it. That
group is in the worker's session when the worker leads one (a worker Corral started:
its own, without a terminal), else in a session of its own (a worker started from a
shell: the terminal's job control reaches the worker's group alone, as before)
(:func:`runtime.lifeline.own_process_group`). It ignores SIGINT and SIGTERM (a batch
system's stop reaches every process of the job, and a terminal's Ctrl-C the worker's
process group, not the task process's; the worker, told the same moment, stops its task
processes itself and its tries are lost with it, not failed: SIGTERM by a no-op handler,
so a program the task runs gets the default action back at exec, and a process it forks
gets it back at the fork, :func:`_default_sigterm`). It is not daemonic, so that its
tasks may start ``multiprocessing`` pools (a daemonic process may have no child); the
worker's exit kills it all the same (:func:`_kill_at_exit`). What a task leaves running
under it when it returns (a program it did not wait for) is killed then, before its
result goes back, and the worker says so (:func:`_kill_leftovers`): left, it would count
as the next task's memory (not the live pools it keeps for the next task, nor
``multiprocessing``'s helpers; joblib's reusable pool is shut down instead). A worker
killed outright (SIGKILL, the OOM killer) takes its task processes with it (PDEATHSIG), and
nothing of it runs to stop the programs they, or its threads, started: for a worker
Corral started, its parent (a local process provider) kills every process left in the
worker's session once it has exited (:func:`runtime.lifeline.kill_session`, Linux), so
they go too, unless they made a session of their own. A job travels as the
key, the node pickled by ``cloudpickle`` (a :class:`~runtime.graph.PickledNode` is
sent as the bytes it already holds) and the inputs pickled with protocol 5, their
out-of-band buffers (numpy arrays, ...) written straight from their memory and read
straight into the receiving buffer; results come back the same way. A task that
checkpoints (:mod:`runtime.task`) writes its checkpoint files itself in both modes, in
the worker's checkpoint directory (``checkpoints``); from a task process it asks for
room and says a file is in place over the job's pipe (``("checkpoint", ...)``
messages), which the feeding thread answers until the task's result comes. Because task
processes are spawned, a *script* that runs a cluster in process mode must guard its
entry point with ``if __name__ == "__main__":`` (spawn imports the main module in each
task process), as with any ``multiprocessing`` program.
"""

from __future__ import annotations

import abc
import asyncio
import atexit
import contextlib
import ctypes
import errno
import faulthandler
import functools
import inspect
import math
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import re
import signal
import stat
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Coroutine, Iterable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, ClassVar, Final, Literal, TypeAlias, cast

import psutil
from dask import _task_spec
from dask.sizeof import sizeof

from actors import memory as mem
from actors.protocol import TaskResult, ToRun
from actors.store import Unpicklable
from runtime import pickling, unpickling
from runtime.errors import ResultNotPicklable, TaskNotLoadable, TaskProcessDied, size_text
from runtime.files import discard_output, remove_tries, task_outputs
from runtime.graph import Key, PickledNode, futures_as_refs
from runtime.lifeline import (
    LIFELINE_EXIT_CODE,
    adopt_orphans,
    die_with_parent,
    own_process_group,
)
from runtime.log import get_logger
from runtime.messages import RunOutcome
from runtime.remote import (
    DEFAULT_MAX_TASK_ERROR_BYTES,
    bound_error,
    exception_chain,
    pack_error,
    run_failure,
    task_error_limit,
)
from runtime.task import TaskContext, running

__all__ = [
    "BaseExecutor",
    "Executor",
    "ProcessExecutor",
    "TaskProcessDied",
    "descendants",
    "device_of",
    "give_back_freed_memory",
    "kill_task_processes",
    "no_space",
    "out_of_disk",
    "print_stacks_on_crash",
    "program_rss",
    "rss",
    "rss_of",
    "stop_resource_tracker",
    "tree_rss",
]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PROC = psutil.Process()
_LINUX = sys.platform.startswith("linux")
_log = get_logger("corral", component="executor")


_STATM: int | None = None


def _rss_statm() -> int:
    global _STATM
    if _STATM is None:
        _STATM = os.open("/proc/self/statm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    # pread at offset 0: no shared file position, so threads can call it at once.
    return int(os.pread(_STATM, 128, 0).split()[1]) * _PAGE


def _rss_psutil() -> int:
    return int(_PROC.memory_info().rss)


#: Resident set size of this process in bytes. On Linux it reads /proc/self/statm
#: through a kept-open descriptor (about 1.5 µs, against about 11 µs for psutil's
#: ``memory_info``: cheap enough to call around every task); elsewhere psutil.
rss: Callable[[], int] = _rss_statm if _LINUX else _rss_psutil


def _glibc() -> ctypes.CDLL | None:
    """The C library, when it is glibc (it has ``malloc_trim`` and ``mallopt``)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 (glibc's, or AttributeError)
    except (OSError, AttributeError):
        return None
    return libc


#: glibc, or None (another C library: musl, macOS)
GLIBC = _glibc()
#: ``mallopt`` parameters, from glibc's <malloc.h>
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: an allocation of this many bytes or more gets pages of its own (mmap), which go back
#: to the OS when it is freed: glibc's default, kept from growing
MMAP_THRESHOLD = 128 * 2**10
#: free memory at the top of the heap past this many bytes goes back to the OS at once
TRIM_THRESHOLD = 64 * 2**10


def print_stacks_on_crash() -> bool:
    """Have a fatal signal (a segfault in compiled code a task calls, an abort) print the
    Python stack of every thread of this process to its stderr before it dies
    (:mod:`faulthandler`): a worker process, or a task process, that a task crashes
    leaves the task's frames behind, not only the shell's ``Segmentation fault``.
    Whether it is on (not when this process has no stderr to write to)."""
    with contextlib.suppress(RuntimeError, ValueError, OSError, AttributeError):
        faulthandler.enable(all_threads=True)
    return faulthandler.is_enabled()


def give_back_freed_memory() -> bool:
    """Make glibc's allocator give memory freed in this process back to the OS at once,
    for a worker process and its task processes (called when each starts); False where
    the C library is not glibc (nothing changed).

    By default glibc raises its mmap threshold to the size of each large block freed (up
    to 32 MiB), so after the first few outputs of a few MiB, the next ones (column
    buffers, pickled frames, data read back from disk or a peer) come from the heap's
    arenas, one per thread, and stay there when freed: free but resident until a
    ``malloc_trim``, and fragmented between arenas. A worker process running the user
    audit's dask.dataframe pipeline had 300-500 MiB in glibc's arenas, 35-50 MiB of them
    in use, once its outputs were spilled or sent: RSS the memory governor counts
    against its fences. A fixed threshold (setting one stops its growth, as
    dask.distributed's ``MALLOC_TRIM_THRESHOLD_`` does) keeps every block of 128 KiB or
    more in pages of its own, unmapped when freed (benchmarks/README.md,
    ``process_floor.py``)."""
    if GLIBC is None:
        return False
    GLIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    GLIBC.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    return True


def rss_of(pid: int) -> int:
    """Resident set size of process ``pid`` in bytes; 0 if it is gone (or unreadable)."""
    try:
        if _LINUX:
            with open(f"/proc/{pid}/statm", "rb") as f:
                return int(f.read().split()[1]) * _PAGE
        return int(psutil.Process(pid).memory_info().rss)
    except (OSError, ValueError, IndexError, psutil.Error):
        return 0


#: Whether this system lists a thread's children in /proc/<pid>/task/<tid>/children
#: (Linux with CONFIG_PROC_CHILDREN, as every major distribution's kernel has it)
_PROC_CHILDREN = _LINUX and os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")
#: processes under one task process (or the executor's threads) looked at, at most (a
#: tree past it is logged once: :class:`ProgramTree`)
_MAX_DESCENDANTS = 256
#: seconds between two walks of a tree's programs, at least (:class:`ProgramTree`)
_WALK_EVERY = 1.0
#: the share of the time a tree's walks may take: after a walk of ``t`` seconds the next
#: comes ``t / _WALK_SHARE`` seconds later if that is more than :data:`_WALK_EVERY`
_WALK_SHARE = 0.05


class KeptFiles:
    """Descriptors of /proc files kept open to be read again at every memory sample
    (a ``pread`` costs a tenth of an ``open``, ``read`` and ``close``:
    benchmarks/README.md, ``descendants_cost.py``). A descriptor of a /proc file
    stays bound to its process: once that process is gone it reads nothing, never a
    process that took its number. Thread-safe; :meth:`keep_only` closes those no longer
    read, :meth:`close` all (after which every read is None: nothing is opened again)."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()
        self._closed = False

    def read(self, path: str) -> bytes | None:
        """The file's text (its first 64 KiB), or None if it cannot be read (gone), or
        these files are closed."""
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                if self._closed:
                    return None
                try:
                    fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    return None
            try:
                return os.pread(fd, 65536, 0)
            except OSError:
                del self._fds[path]
                os.close(fd)
                return None

    def keep_only(self, paths: Iterable[str], prefix: str = "") -> None:
        """Close the descriptors under ``prefix`` of the files not in ``paths``."""
        keep = set(paths)
        with self._lock:
            for path in [p for p in self._fds if p.startswith(prefix) and p not in keep]:
                os.close(self._fds.pop(path))

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.keep_only(())

    def __len__(self) -> int:
        """How many descriptors are open."""
        with self._lock:
            return len(self._fds)


def _pids(text: bytes | None) -> list[int]:
    try:
        return [int(c) for c in text.split()] if text else []
    except ValueError:
        return []


def _children_of(pid: int) -> list[int]:
    """The pids of the children of process ``pid``, from its threads'
    /proc/<pid>/task/<tid>/children (each lists the children its thread started); []
    if it is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tids:
        try:
            fd = os.open(f"/proc/{pid}/task/{tid}/children", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            found.extend(_pids(os.read(fd, 65536)))
        except OSError:
            pass
        finally:
            os.close(fd)
    return found


def descendants(pid: int, children: list[int] | None = None) -> list[int]:
    """The pids of the processes under process ``pid``: its children, theirs, and so on
    (at most :data:`_MAX_DESCENDANTS`); or under ``children``, when the caller read
    which of its children count. [] if it is gone, or has none.

    Read from /proc/<pid>/task/<tid>/children on Linux (a few reads of small files per
    process: benchmarks/README.md, ``descendants_cost.py``); elsewhere psutil (which
    looks at every process of the system)."""
    found: list[int] = [] if children is None or _PROC_CHILDREN else list(children)
    if not _PROC_CHILDREN:
        for root in [pid] if children is None else children:
            with contextlib.suppress(psutil.Error):
                found.extend(p.pid for p in psutil.Process(root).children(recursive=True))
        return found
    todo = _children_of(pid) if children is None else list(children)
    while todo and len(found) < _MAX_DESCENDANTS:
        child = todo.pop()
        found.append(child)
        todo.extend(_children_of(child))
    return found


def _rollup(pid: int) -> dict[str, int] | None:
    """The sizes (bytes) of process ``pid``'s /proc/<pid>/smaps_rollup (``Rss``,
    ``Pss``, ``Anonymous``, ``Pss_Anon`` where the kernel gives it, ...); None if it
    cannot be read (gone, not Linux, a kernel before 4.14)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            text = f.read()
    except OSError:
        return None
    sizes: dict[str, int] = {}
    for line in text.splitlines()[1:]:
        name, _, rest = line.partition(b":")
        with contextlib.suppress(ValueError, IndexError):
            sizes[name.decode()] = int(rest.split()[0]) * 1024
    return sizes if "Pss" in sizes else None


def program_rss(pid: int, children: list[int] | None = None) -> tuple[int, int]:
    """What the processes under process ``pid`` (:func:`descendants`, from
    ``children`` when given) add to its RSS, in bytes, and how many they are.

    Each counts its PSS (``Pss:`` of /proc/<pid>/smaps_rollup: a page shared by ``k``
    processes counts ``1/k`` in each), less the share of ``pid``'s own anonymous pages
    they hold (forked children hold their parent's heap until they write it: ``pid``'s
    RSS counts it whole already). So a task process that loads 2 GiB and forks 8
    children adds about nothing for them, where their RSS would add 16 GiB; an
    exec'd program adds what it holds. Where PSS cannot be read, RSS (which counts
    pages shared once in each process)."""
    procs = descendants(pid, children)
    if not procs:
        return 0, 0
    total = 0
    for child in procs:
        sizes = _rollup(child)
        total += sizes["Pss"] if sizes is not None else rss_of(child)
    own = _rollup(pid)
    if own is not None:
        if "Pss_Anon" in own and "Anonymous" in own:  # (Linux 5.9 on)
            total -= own["Anonymous"] - own["Pss_Anon"]
        elif "Rss" in own:  # its pages the others hold a share of, files too
            total -= own["Rss"] - own["Pss"]
    return max(0, total), len(procs)


def tree_rss(pid: int) -> int:
    """Resident set size of process ``pid`` plus what every process under it adds
    (:func:`program_rss`: the programs a task running there started), in bytes; 0 if
    it is gone. Read now, whole (a worker's samples go through :class:`ProgramTree`)."""
    return rss_of(pid) + program_rss(pid)[0]


class ProgramTree:
    """The memory of a process (a task process, or the worker's for its executor's
    threads) and of the programs under it, as a worker's memory samples read it (every
    50 ms), at a bounded cost: each sample reads the process's RSS and its threads'
    lists of children through kept descriptors (:class:`KeptFiles`); the processes under
    those children are walked and their PSS read (:func:`program_rss`) at most every
    :data:`_WALK_EVERY` seconds (less often when a walk takes more than
    :data:`_WALK_SHARE` of the time between), only while there are children, and by
    one caller at a time: in between, what they add is that of the last walk. Its
    threads are listed again as often. Thread-safe."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.kept = KeptFiles()
        self.added = 0  #: what the programs under it added at the last walk (bytes)
        self._lists: list[str] = []  #: its threads' lists of children
        self._listed = -math.inf  #: when its threads were listed (time.monotonic)
        self._next = -math.inf  #: when the next walk may be
        self._walking = threading.Lock()
        self._logged = False  #: said it has more processes than are looked at

    def rss(self, walk: bool = True) -> int:
        """The process's RSS (0 if it is gone) plus what the programs under it add
        (:meth:`programs`)."""
        statm = self.kept.read(f"/proc/{self.pid}/statm") if _LINUX else None
        try:
            own = int(statm.split()[1]) * _PAGE if statm else 0
        except (ValueError, IndexError):
            own = 0
        if not _LINUX:
            own = rss_of(self.pid)
        return own + self.programs(None, walk)

    def programs(self, lists: list[str] | None = None, walk: bool = True) -> int:
        """What the programs under the process add to its RSS (bytes): those listed in
        ``lists`` (files /proc/<pid>/task/<tid>/children; None: every thread's of the
        process) and everything under them. ``walk`` False: never walk (what the last
        walk found, or 0 if there are no children now)."""
        if not _PROC_CHILDREN:
            return program_rss(self.pid)[0] if walk else self.added
        now = time.monotonic()
        if lists is None:
            if now - self._listed >= _WALK_EVERY:
                try:
                    tids = os.listdir(f"/proc/{self.pid}/task")
                except OSError:
                    tids = []
                self._lists = [f"/proc/{self.pid}/task/{tid}/children" for tid in tids]
                self._listed = now
            lists = self._lists
            self.kept.keep_only([f"/proc/{self.pid}/statm", *lists])
        else:
            self.kept.keep_only(lists)
        children = [c for path in lists for c in _pids(self.kept.read(path))]
        if not children:
            self.added = 0
            return 0
        if not walk or now < self._next or not self._walking.acquire(blocking=False):
            return self.added
        try:
            began = time.perf_counter()
            self.added, seen = program_rss(self.pid, children)
            took = time.perf_counter() - began
            self._next = now + max(_WALK_EVERY, took / _WALK_SHARE)
        finally:
            self._walking.release()
        if seen >= _MAX_DESCENDANTS and not self._logged:
            self._logged = True
            _log.warning(
                "more processes under a task process (or the executor's threads) than "
                "memory samples look at: those past them are not counted",
                pid=self.pid, most=_MAX_DESCENDANTS, took=round(took, 4),
            )  # fmt: skip
        return self.added

    def close(self) -> None:
        self.kept.close()


#: told, from the loop a task's coroutine runs on, the loop and the asyncio task that
#: runs it (:func:`_awaited`): a cancel of the try can then cancel it there
Started: TypeAlias = "Callable[[asyncio.AbstractEventLoop, asyncio.Task[Any]], None]"


def _run_node(node: Any, inputs: Any, started: Started | None = None) -> Any:
    """Run a task's node on its inputs; an ``async def`` task's coroutine is run here,
    in the task's own thread or process, on an event loop of its own (as dask's
    workers await one), to its end or until it is cancelled (``started``)."""
    return _awaited(node(inputs), started)


def _awaited(value: Any, started: Started | None = None) -> Any:
    """``value``, or, a coroutine, what it returns, run here on an event loop of its
    own (the calling thread's: a task's, or ``Cluster.run``'s). ``started`` is called
    on that loop, before the coroutine runs, with the loop and the asyncio task that
    runs it: cancelled there (``loop.call_soon_threadsafe(task.cancel)``), the
    coroutine gets ``asyncio.CancelledError`` at the await it waits in, which this
    raises once it ends."""
    if inspect.iscoroutine(value):
        value = asyncio.run(value if started is None else _told(value, started))
    return value


async def _told(coro: Coroutine[Any, Any, Any], started: Started) -> Any:
    """Await ``coro`` in the task :func:`asyncio.run` made, which ``started`` is told of
    first."""
    task = asyncio.current_task()
    assert task is not None
    started(asyncio.get_running_loop(), task)
    return await coro


#: where the frames that run a task live, ahead of its own in its exception's
#: traceback: Corral's (this executor, ``runtime``), dask's task spec (a node calling
#: its function, a nested node's argument), asyncio's (an ``async def`` task's loop)
_HARNESS_DIRS: Final = tuple(
    os.path.dirname(os.path.abspath(f)) + os.sep
    for f in (__file__, pickling.__file__, asyncio.__file__ or "")
)
_HARNESS_FILES: Final = frozenset({os.path.abspath(_task_spec.__file__ or "")})


def _harness(filename: str) -> bool:
    return filename.startswith(_HARNESS_DIRS) or filename in _HARNESS_FILES


def from_task_code(exc: BaseException) -> BaseException:
    """``exc``, a task's exception as its executor caught it, its traceback starting at
    the task's own code: the leading frames that ran the task (:data:`_HARNESS_DIRS`,
    :data:`_HARNESS_FILES`) left out, so that the caller, the dashboard and the
    monitoring database show the user's frames first. A traceback with no frame of
    the task's (an error of Corral's own, a ``TaskNotLoadable``) is kept whole: never
    an empty one."""
    tb = exc.__traceback__
    while tb is not None and _harness(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    if tb is not None:
        exc.__traceback__ = tb
    return exc


def run_call(call: Any, name: str, worker: str) -> RunOutcome:
    """``Cluster.run``'s call on ``worker``, in the calling thread (one of the worker
    process's, never its event loop; not a task slot): ``call`` (``(func, args,
    kwargs)``, or the client's pickle of it) called, an ``async def`` function's
    coroutine awaited as a task's is (:func:`_awaited`). A pickled call answers pickles:
    the value, or whatever it raised (opening it, in it, pickling its value; a
    ``SystemExit`` too) packed as a task's error is (:func:`runtime.remote.run_failure`);
    a call given as objects (an in-process worker's) answers the value or the exception
    itself. Nothing escapes into the worker."""
    wire = isinstance(call, bytes)
    try:
        func, args, kwargs = unpickling.loads(call) if wire else call
        value = _awaited(func(*args, **kwargs))
    except BaseException as exc:
        from_task_code(exc)
        if not wire:
            return RunOutcome(worker, False, exc, type(exc).__name__, pickled=False)
        return run_failure(exc, name, worker)
    if not wire:
        return RunOutcome(worker, True, value, pickled=False)
    try:
        return RunOutcome(worker, True, pickling.cloudpickle_dumps(value))
    except BaseException as exc:
        exc.add_note(
            f"{name}() returned a {type(value).__name__}, which cannot be pickled to travel "
            f"back from worker {worker!r}: return what pickles (text, numbers, lists and "
            "dicts of them)"
        )
        return run_failure(exc, name, worker)


# ----------------------------------------------------------------------------- disk full

#: a task's ENOSPC that names no file is its worker's disk filling up when the sandbox's
#: file system has this little free (or a hundredth of its size, if less) right after
#: the task raised (:func:`out_of_disk`)
FULL_SLACK = 64 * 2**20
_MAX_CHAIN = 64  #: exceptions of a task's error (causes, contexts) looked at, at most
_MAX_ENTRIES = 100_000  #: entries of a try's directory counted, at most


#: ``OSError`` subclasses that are never a write refused for room, even without an
#: errno (a socket's timeout, a refused connection, ...): :func:`unsaid_os_error`
_NOT_STORAGE: tuple[type[OSError], ...] = (
    ConnectionError,
    TimeoutError,
    InterruptedError,
    BlockingIOError,
    ChildProcessError,
    ProcessLookupError,
)


def no_space(exc: BaseException) -> OSError | None:
    """The ``OSError`` with errno ``ENOSPC`` that ``exc`` is, or that it was raised from
    (:func:`~runtime.remote.exception_chain`, exception groups' members included); None
    if there is none."""
    for e in exception_chain(exc, groups=True, most=_MAX_CHAIN):
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return e
    return None


def unsaid_os_error(exc: BaseException) -> OSError | None:
    """The ``OSError`` without an errno that ``exc`` is, or that it was raised from (as
    :func:`no_space` looks), one of :data:`_NOT_STORAGE` excepted; None if there is
    none. Writers that do their own I/O say a full disk so: numpy's ``tofile``
    (``OSError('Not enough free space to write ...')``, ``OSError('problem writing
    element ...')``), h5py's ``OSError`` naming HDF5's own error."""
    for e in exception_chain(exc, groups=True, most=_MAX_CHAIN):
        if isinstance(e, OSError) and e.errno is None and not isinstance(e, _NOT_STORAGE):
            return e
    return None


def device_of(path: Any) -> int | None:
    """The device (``st_dev``) of the file system holding ``path``, or its nearest
    existing parent (a file that could not be made); of an open descriptor; None if
    that cannot be told."""
    try:
        if isinstance(path, int):
            return os.fstat(path).st_dev
        where = os.path.abspath(os.fsdecode(path))
        while True:
            try:
                return os.stat(where).st_dev
            except (FileNotFoundError, NotADirectoryError):
                parent = os.path.dirname(where)
                if parent == where:
                    return None
                where = parent
    except (OSError, TypeError, ValueError):
        return None


def _free_and_size(sandbox: str) -> tuple[int, int] | None:
    """The bytes free (for this user) on the file system holding ``sandbox``, and its
    size; None if that cannot be told."""
    try:
        fs = os.statvfs(sandbox)
    except OSError:
        return None
    return fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize


def sandbox_full(sandbox: str) -> bool:
    """Whether the file system holding ``sandbox`` is full: less free (for this user)
    than :data:`FULL_SLACK`, or than a hundredth of its size if that is less."""
    got = _free_and_size(sandbox)
    return got is not None and got[0] <= min(FULL_SLACK, got[1] // 100)


#: numpy's ``tofile`` asks the file system for the room first (``fallocate``) and says
#: so when it is refused, with no errno and before writing a byte
_NUMPY_NO_ROOM = re.compile(r"Not enough free space to write (\d+) bytes")


def _cannot_fit(err: OSError, sandbox: str) -> bool:
    """Whether ``err`` (an ``OSError`` without an errno) says a write of more bytes than
    the file system holding ``sandbox`` has free now was refused for room (numpy's
    ``Not enough free space to write N bytes``)."""
    said = _NUMPY_NO_ROOM.search(str(err))
    got = _free_and_size(sandbox) if said is not None else None
    return said is not None and got is not None and int(said.group(1)) > got[0]


def _tree_bytes(directory: str) -> int:
    """Bytes of the regular files under ``directory`` (symbolic links not followed;
    at most :data:`_MAX_ENTRIES` entries looked at)."""
    total, seen, todo = 0, 0, [directory]
    while todo and seen < _MAX_ENTRIES:
        try:
            entries = os.scandir(todo.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                seen += 1
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
    return total


def _let_go(exc: BaseException) -> None:
    """Clear the locals of the finished frames in the tracebacks of ``exc`` and the
    exceptions it was raised from: a file a task left open in one (written without a
    ``with``) is closed, so its blocks go back to the full disk once its try's directory
    is removed, not when the error (kept in the try's records) is."""
    for e in exception_chain(exc, most=_MAX_CHAIN):
        traceback.clear_frames(e.__traceback__)  # an executing frame is left as it is


#: nanoseconds a file's modification time may read before the try began and the file
#: still count as the try's (file systems stamp times from a coarse clock)
_MTIME_SLACK = 50_000_000


def _remove_named(path: Any, sandbox: str, directory: str | None, since: int) -> int:
    """The bytes of the file ``path`` if this try wrote it in the sandbox outside its
    own directory (modified since ``since``, ns; not a checkpoint file), which is then
    removed: the partial copy of an input that ``TaskOutputs.finish`` makes, a file
    written next to an input. 0 for anything else, left alone."""
    try:
        real = os.path.realpath(os.fsdecode(path))
        root = os.path.realpath(sandbox)
        inside = (root + os.sep, os.path.join(root, "checkpoints") + os.sep)
        if not real.startswith(inside[0]) or real.startswith(inside[1]):
            return 0
        if directory is not None and real.startswith(os.path.realpath(directory) + os.sep):
            return 0  # counted with the try's directory, removed with it
        st = os.lstat(real)
        if not stat.S_ISREG(st.st_mode) or st.st_mtime_ns < since - _MTIME_SLACK:
            return 0
        os.unlink(real)
    except (OSError, TypeError, ValueError):
        return 0
    return int(st.st_size)


def out_of_disk(
    exc: BaseException, sandbox: str | None, directory: str | None, since: int | None = None
) -> int | None:
    """Whether a task's error ``exc`` is its worker's disk filling up while the task
    wrote: if so, the bytes its try left in its ``directory`` (0: none, or no
    directory), measured before the directory is removed; else None (an ordinary error).
    With ``since`` (when the try began, ns), the file the error names, if the try wrote
    it elsewhere in the sandbox, is counted too, and removed (:func:`_remove_named`).

    The rule (docs/files.md, "When the disk fills anyway"): ``exc`` is, or was raised
    from, an ``OSError`` with errno ``ENOSPC`` (:func:`no_space`), and the file system
    that refused is the one of the worker's ``sandbox``:

    - the error names a file (``filename2``, the target of a copy, rename or link, else
      ``filename``): that file (or its nearest existing parent directory, for one that
      could not be made) is on the sandbox's file system (the same ``st_dev``);
    - it names none (a ``write`` to an open file says no more): the sandbox's file
      system is full now, before the try's files are removed (:func:`sandbox_full`).

    An ``OSError`` without an errno (:func:`unsaid_os_error`: numpy's ``tofile`` on a
    full disk) counts only when the sandbox's file system is full now
    (:func:`sandbox_full`), or it says a write of more bytes than that file system has
    free now was refused (:func:`_cannot_fit`), whether it names a file or not (and one
    it names must be on that file system): with room there, it is an ordinary error.
    So a task that fills a shared file system elsewhere (a path outside the worker's
    disk) fails with its error as any other, its retries charged."""
    if sandbox is None:
        return None
    enospc = no_space(exc)
    err = enospc if enospc is not None else unsaid_os_error(exc)
    if err is None:
        return None
    unsaid = enospc is None
    named = err.filename2 if err.filename2 is not None else err.filename
    if named is not None:
        dev = device_of(named)
        if dev is None or dev != device_of(sandbox):
            return None
    if unsaid:
        if not sandbox_full(sandbox) and not _cannot_fit(err, sandbox):
            return None
    elif named is None and not sandbox_full(sandbox):
        return None
    wrote = _tree_bytes(directory) if directory is not None else 0
    if named is not None and since is not None:
        wrote += _remove_named(named, sandbox, directory, since)
    return wrote


Results = list[tuple[TaskResult, Any]]
_Outcome = Literal["ok", "error", "timeout", "cancelled", "missing", "oom", "disk-full"]
_KILL_OUTCOMES: frozenset[str] = frozenset({"oom", "timeout", "cancelled", "error"})


class BaseExecutor(abc.ABC):
    """What the worker needs from an execution mode, and the result hand-over.

    ``deliver(results)`` is called on the event loop thread (the loop running when the
    executor was created) with every ``(TaskResult, value)`` pair that finished since
    the previous call; ``value`` is the task's output for outcome ``ok``, else None.
    A task passed to :meth:`cancel` is reported ``cancelled`` (without running, if it had
    not started); the executor keeps that set itself and clears a key when its try is
    delivered, so the same key can run here again later. ``batch_delay`` bounds how
    long a mode may hold a finished result back to send it together with the next ones.
    """

    #: Whether :meth:`kill` can stop a running task.
    killable: ClassVar[bool] = False
    #: The execution mode's name, as in configuration: ``"thread"`` or ``"process"``.
    mode: ClassVar[str] = ""

    def __init__(
        self,
        deliver: Callable[[Results], None],
        *,
        batch_delay: float = 0.002,
        sandbox: str | None = None,
    ) -> None:
        self.batch_delay = batch_delay
        #: the most bytes a task's exception may take (:func:`runtime.remote.bound_error`)
        self.error_limit = task_error_limit()
        #: where tasks write their file outputs (``runtime/files.py``): the worker's store
        self.sandbox = sandbox
        self._deliver = deliver
        self._lock = threading.Lock()
        self._done: Results = []
        self._soon = False  #: a delivery of ``_done`` is on its way to the loop
        self._timed = False  #: a delivery of held results is due within ``batch_delay``
        self._loop = asyncio.get_running_loop()
        self._cancelled: set[Key] = set()  #: cancelled keys whose try is not delivered
        #: tries handed over (:meth:`_push`, :meth:`_hold`) that the worker has not taken
        #: back yet (:meth:`settled`): key -> when it began (epoch s, its ``start``)
        self._handed: dict[Key, float] = {}
        #: the worker's checkpoint files (:class:`~actors.checkpoints.CheckpointFiles`:
        #: ``directory``, ``reserve``, ``latest``); None: tasks cannot checkpoint here
        self.checkpoints: Any = None
        #: told on the loop of each checkpoint file a task wrote, ``(key, seq, path,
        #: nbytes)`` (``path`` "": the write failed, its reserved room goes back)
        self.on_checkpoint: Callable[[Key, int, str, int], None] | None = None

    @abc.abstractmethod
    def submit(self, task: ToRun, inputs: dict[Key, Any]) -> None:
        """Queue ``task`` to run with ``inputs`` (dependency key -> value)."""

    @abc.abstractmethod
    def shutdown(self, wait: bool = False) -> None:
        """Stop after the work at hand; idempotent. ``wait``: until the threads end."""

    def kill(self, key: Key, outcome: str = "oom") -> bool:
        """Kill running task ``key``; whether it was. Threads cannot be: always False."""
        return False

    def programs_of(self, key: Key) -> list[tuple[str, int]]:
        """``(name, pid)`` of the programs running task ``key`` started that run now
        and that a cancel of it would leave running (thread mode, on Linux, which lists
        a thread's children; []: none, or the mode stops them with the task)."""
        return []

    def cancel(self, key: Key) -> bool:
        """Cancel ``key``: a queued task is reported ``cancelled`` without running; a
        running one frees its slot at once where the mode can (see each mode), its
        try reported ``cancelled``. True when a running ``async def`` task's coroutine
        was cancelled on its event loop (thread execution, where nothing else can be
        stopped); False otherwise."""
        with self._lock:
            self._cancelled.add(key)
        return False

    def settled(self, keys: Iterable[Key]) -> None:
        """The worker has these keys' tries back: a cancel of one that came after its
        try was delivered (the cancel and the result crossed) is let go. Kept, it
        would cancel the key's next try here before it ran. No other try of a key is
        handed over before its last one is back (the worker runs one at a time).
        Nor are they :meth:`started_for`'s any more."""
        keys = tuple(keys)
        with self._lock:
            for key in keys:
                self._handed.pop(key, None)
            if self._cancelled:
                self._cancelled.difference_update(keys)

    @property
    def abandoned(self) -> int:
        """Threads still running a cancelled task (thread mode); 0 elsewhere."""
        return 0

    @property
    def held(self) -> int:
        """Threads holding their slot with a cancelled task they could not give up
        (thread mode, past its abandoned threads); 0 elsewhere."""
        return 0

    @abc.abstractmethod
    def executing(self) -> tuple[Key, ...]:
        """The keys of the tasks executing now: started, not ended (not those queued
        behind them, nor a cancelled one whose slot went to a fresh thread or process).
        The worker samples it with its RSS, to tell whose peak a sample is."""

    @abc.abstractmethod
    def executing_for(self) -> dict[Key, float]:
        """The tasks executing now (as :meth:`executing`), each with the seconds it
        has executed: a leaving worker says so (``Leaving.executed``), and the
        scheduler tells a task that had its worker's whole life from one that started
        late in it."""

    def started_for(self) -> dict[Key, float]:
        """:meth:`executing_for` and the tries that ended but are not back with the
        worker yet (handed over, not :meth:`settled`), each with the seconds since it
        began: all that started. A leaving worker says so (``Leaving``): a try that
        ended as it left (its error after the stop signal is not reported) executed
        all the same, and is no try that never started."""
        now = time.time()
        with self._lock:
            ended = {key: max(0.0, now - began) for key, began in self._handed.items()}
        return {**ended, **self.executing_for()}

    def children_rss(self) -> int:
        """RSS of the processes this executor runs tasks in, besides this one (bytes)."""
        return 0

    def total_rss(self) -> int:
        """RSS of this process plus the executor's task processes, in bytes."""
        return rss() + self.children_rss()

    def _resume(self, task: ToRun) -> tuple[int, str | None]:
        """The checkpoint ``task`` starts from: the newest file of it on this worker
        (the worker put the one the scheduler named here before submitting it), and the
        number its next checkpoint numbers on from."""
        given = task.checkpoint[0] if task.checkpoint is not None else 0
        local = self.checkpoints.latest(task.key) if self.checkpoints is not None else None
        if local is None:
            return given, None  # none, or it could not be brought here: from the start
        return max(given, local[0]), local[1]

    def _context(self, task: ToRun) -> TaskContext:
        """The checkpoint context ``task`` runs in (see :mod:`runtime.task`)."""
        files = self.checkpoints
        if files is None:
            return TaskContext(
                task.key, why=f"task {task.key!r} runs where no worker keeps checkpoints."
            )
        seq, path = self._resume(task)
        return TaskContext(
            task.key, seq, path, files.directory, files.reserve, self._save_checkpoint
        )

    def _save_checkpoint(self, key: Key, seq: int, path: str, nbytes: int) -> None:
        """From a task's thread (or a task process's feeding thread): hand a checkpoint
        file to the loop (a cancelled try's too: the scheduler has it deleted)."""
        if self.on_checkpoint is not None:
            with contextlib.suppress(RuntimeError):  # loop closed: the worker is gone
                self._loop.call_soon_threadsafe(self.on_checkpoint, key, seq, path, nbytes)

    def _push(self, results: Results) -> None:
        """Hand results over from any thread; the event loop delivers them in a batch
        (with any held, :meth:`_hold`), empty or not."""
        with self._lock:
            self._done.extend(results)
            self._handed.update((res.key, res.start) for res, _ in results if res.start)
            if self._soon:
                return
            self._soon = True
        with contextlib.suppress(RuntimeError):  # loop closed: the worker is gone
            self._loop.call_soon_threadsafe(self._flush)

    def _hold(self, results: Results) -> None:
        """Hand results over from any thread, to go with the next ones: the event loop
        delivers them within ``batch_delay`` whatever this thread runs meanwhile (a
        task of a kind that ran short here may hang: what is done goes out anyway)."""
        with self._lock:
            self._done.extend(results)
            self._handed.update((res.key, res.start) for res, _ in results if res.start)
            if self._soon or self._timed:
                return
            self._timed = True
        with contextlib.suppress(RuntimeError):  # loop closed: the worker is gone
            self._loop.call_soon_threadsafe(self._loop.call_later, self.batch_delay, self._due)

    def _due(self) -> None:
        """The hold of :meth:`_hold` is over: deliver what is still held, if anything
        (a delivery already on its way takes it)."""
        with self._lock:
            self._timed = False
            if not self._done or self._soon:
                return
            done = self._take()
        self._deliver(done)

    def _flush(self) -> None:
        with self._lock:
            self._soon = False
            done = self._take()
        self._deliver(done)

    def _take(self) -> Results:
        """The results to deliver now, settled. Under ``_lock``."""
        done, self._done = self._done, []
        if self._cancelled:
            done = [self._settle(result, value) for result, value in done]
        return done

    def _settle(self, result: TaskResult, value: Any) -> tuple[TaskResult, Any]:
        """A cancelled key's try is reported ``cancelled`` (an error stays an error),
        however it ended; the key leaves the cancelled set. Under ``_lock``."""
        key = result.key
        if key not in self._cancelled:
            return result, value
        self._cancelled.discard(key)
        if result.outcome in ("error", "cancelled"):
            return result, None
        discard_output(value)  # a file output nobody keeps
        return TaskResult(key, "cancelled", result.start, result.stop), None


# ----------------------------------------------------------------------------- threads


class Executor(BaseExecutor):
    """``n`` threads running tasks; results come back through ``deliver`` in batches.

    ``deliver(results)`` is called on the event loop thread with every result that
    finished since the previous call. Running tasks cannot be killed, but a cancelled
    one gives its slot back at once: its thread is *abandoned* (it runs the task to its
    end, drops the result and exits) and a fresh thread takes its place, up to
    ``max_abandoned`` abandoned threads at a time (default ``n``). Past that a cancelled
    task's thread is *held*: its try is reported ``cancelled`` at once all the same, but
    the thread keeps its slot (it takes no other task) until the call returns, drops its
    result and serves the queue again; ``held`` counts such threads, which the worker
    reports so that the scheduler sends no task for their slots. When an abandoned
    thread ends, a held one is abandoned in its place and its slot goes to a fresh thread.
    An ``async def`` task's coroutine is cancelled on its event loop as well
    (:meth:`cancel`): it stops at the await it waits in, and its thread, abandoned or
    held, ends or serves the queue again soon after.
    """

    killable = False
    mode = "thread"

    def __init__(
        self,
        n: int,
        name: str,
        deliver: Callable[[Results], None],
        *,
        batch_delay: float = 0.002,
        max_abandoned: int | None = None,
        sandbox: str | None = None,
    ) -> None:
        super().__init__(deliver, batch_delay=batch_delay, sandbox=sandbox)
        self._jobs: queue.SimpleQueue[tuple[ToRun, dict[Key, Any]] | None] = queue.SimpleQueue()
        self._closed = False
        self._name = name
        self._spawned = n
        self.max_abandoned = n if max_abandoned is None else max_abandoned
        self._running: dict[Key, threading.Thread] = {}  #: key -> the thread running it
        self._began: dict[Key, float] = {}  #: key -> when it started (time.monotonic)
        #: seconds the latest task of each category took here: a batch waits for the
        #: next task only if its kind ran within ``batch_delay`` (``_run``)
        self._took: dict[str, float] = {}
        self._abandoned: set[threading.Thread] = set()  #: threads whose task was cancelled
        #: threads whose task was cancelled past ``max_abandoned``: they keep their slot
        self._held: set[threading.Thread] = set()
        #: thread -> the event loop and asyncio task of the ``async def`` task's
        #: coroutine it runs now (:meth:`_started`), which a cancel cancels there
        self._coroutines: dict[
            threading.Thread, tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]]
        ] = {}
        #: the worker's programs started from these threads (``children_rss``)
        self._tree = ProgramTree(os.getpid())
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(n)
        ]
        for t in self._threads:
            t.start()

    def cancel(self, key: Key) -> bool:
        """As :meth:`BaseExecutor.cancel`; a running ``async def`` task's coroutine is
        cancelled on its event loop too (``asyncio.CancelledError`` at the await it waits
        in), so it stops there and its thread ends (or, held, gets its slot back); its
        try is reported ``cancelled`` with ``stopping``. True when it was."""
        with self._lock:
            thread = self._running.get(key)
            if thread is None or thread in self._abandoned or self._closed:
                self._cancelled.add(key)  # queued (or past replacing): skipped or dropped
                return False
            del self._running[key]
            self._began.pop(key, None)
            fresh = None
            if len(self._abandoned) >= self.max_abandoned:
                self._held.add(thread)  # no room for another thread: it keeps its slot
            else:
                fresh = self._replace(thread)
            # (one not on its loop yet is cancelled as it gets there: _started)
            coroutine = self._coroutines.pop(thread, None)
        if fresh is not None:
            fresh.start()
        if coroutine is not None:
            loop, task = coroutine
            with contextlib.suppress(RuntimeError):  # its loop closed: it ended meanwhile
                loop.call_soon_threadsafe(task.cancel)
        now = time.time()
        stopping = coroutine is not None
        self._push([(TaskResult(key, "cancelled", now, now, stopping=stopping), None)])
        return stopping

    def programs_of(self, key: Key) -> list[tuple[str, int]]:
        """As :meth:`BaseExecutor.programs_of`: the children the thread running ``key``
        started (``/proc/self/task/<tid>/children``), not the exited ones; not those
        it started from threads of its own."""
        with self._lock:
            thread = self._running.get(key)
        if thread is None or not thread.native_id or not _PROC_CHILDREN:
            return []
        try:
            with open(f"/proc/self/task/{thread.native_id}/children", "rb") as f:
                pids = _pids(f.read())
        except OSError:
            return []
        found = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                with proc.oneshot():
                    if proc.status() != psutil.STATUS_ZOMBIE:
                        found.append((proc.name(), pid))
        return found

    def _started(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        """From a task's thread, on the loop its coroutine is about to run on (the
        ``started`` of :func:`_run_node`): kept, for a cancel to cancel it there; one
        whose try was cancelled already (its thread abandoned or held) is cancelled
        now, before it runs."""
        me = threading.current_thread()
        with self._lock:
            if me not in self._abandoned and me not in self._held:
                self._coroutines[me] = (loop, task)
                return
        task.cancel()

    def _replace(self, thread: threading.Thread) -> threading.Thread:
        """Abandon ``thread``: a fresh thread (returned, to start) takes its slot. Under
        ``_lock``."""
        self._abandoned.add(thread)
        fresh = threading.Thread(
            target=self._run, name=f"{self._name}-{self._spawned}", daemon=True
        )
        self._spawned += 1
        self._threads = [t for t in self._threads if t is not thread] + [fresh]
        return fresh

    @property
    def held(self) -> int:
        """Threads running a cancelled task that could not be abandoned (as many are
        already as ``max_abandoned``): each keeps its slot until its call returns."""
        with self._lock:
            return len(self._held)

    @property
    def abandoned(self) -> int:
        with self._lock:
            return len(self._abandoned)

    def executing(self) -> tuple[Key, ...]:
        with self._lock:
            return tuple(self._running)

    def executing_for(self) -> dict[Key, float]:
        now = time.monotonic()
        with self._lock:
            return {k: now - self._began.get(k, now) for k in self._running}

    def submit(self, task: ToRun, inputs: dict[Key, Any]) -> None:
        self._jobs.put((task, inputs))

    def shutdown(self, wait: bool = False) -> None:
        """Let the threads end once the queued tasks have run; idempotent.

        ``wait``: return only when they have (a running task cannot be interrupted).
        """
        if not self._closed:
            self._closed = True
            for _ in self._threads:
                self._jobs.put(None)
            self._tree.close()  # (and a later children_rss opens nothing)
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()

    def kill(self, key: Key, outcome: str = "oom") -> bool:
        """Threads cannot be killed: always False (the task runs to its end)."""
        return False

    def children_rss(self) -> int:
        """RSS of the programs the tasks started from their threads (``subprocess.run``,
        ``os.system``, ...), and of everything those started, in bytes (Linux; 0
        elsewhere). Not those a task starts from threads of its own: Linux lists a
        child under the thread that started it."""
        with self._lock:
            threads = [*self._threads, *self._abandoned, *self._held]
        if not _PROC_CHILDREN or self._closed:
            return 0  # (psutil cannot tell which thread started a child)
        # Only live threads: an ended thread's file reads nothing, and its number may
        # be a new thread's
        lists = {
            f"/proc/self/task/{t.native_id}/children"
            for t in threads
            if t.native_id and t.is_alive()
        }
        return self._tree.programs(sorted(lists))

    def _run(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            done: Results = []
            first = time.perf_counter()
            rss_now = rss()
            # Run queued jobs back to back and hand results over together, but never
            # hold a finished result longer than ``batch_delay``: short tasks travel in
            # batches, a long task's result goes back as soon as it is ready. Back to
            # back, the RSS read after one task is the reading before the next.
            me = threading.current_thread()
            running, took, began = self._running, self._took, self._began
            while job is not None:
                with self._lock:
                    running[job[0].key] = me
                    began[job[0].key] = time.monotonic()
                started = time.perf_counter()
                result, value, rss_now = self._execute(job[0], job[1], rss_now)
                took[job[0].category] = time.perf_counter() - started
                with self._lock:
                    # Not a newer try of the same key: cancelled, this thread was
                    # abandoned and the key may have started again on a fresh one.
                    if running.get(job[0].key) is me:
                        del running[job[0].key]
                        began.pop(job[0].key, None)
                    abandoned = me in self._abandoned
                    self._abandoned.discard(me)
                    held = me in self._held
                    self._held.discard(me)
                    fresh = None
                    if abandoned and self._held and not self._closed:
                        fresh = self._replace(self._held.pop())  # room for one more
                if fresh is not None:
                    fresh.start()
                if abandoned or held:  # cancelled while it ran: reported already
                    discard_output(value)
                    # The worker learns that a held thread's slot is back, or that an
                    # abandoned one ended, from this delivery, empty or not.
                    self._push(done)
                    done = []
                    if abandoned:  # a fresh thread has its slot; this one ends here
                        return
                    break  # held: its slot is back; it serves the queue again
                done.append((result, value))
                if time.perf_counter() - first > self.batch_delay:
                    break
                try:
                    job = jobs.get_nowait()
                except queue.Empty:
                    break
                if job is not None and took.get(job[0].category, math.inf) > self.batch_delay:
                    # The next task may run long (its kind did here, or has not run
                    # here yet): hand over what is done first, not after it, so its
                    # dependents need not wait for that one.
                    self._push(done)
                    first = time.perf_counter()
                else:
                    # Its kind ran short here, but this one may hang (a frame that
                    # stalls on NFS): the loop delivers what is done within
                    # ``batch_delay`` however long it runs.
                    self._hold(done)
                done = []
            if done:
                self._push(done)
            if job is None:
                return
            # Let go of the last inputs and output before waiting for the next job: held
            # by this frame, they would stay in memory (spilled, sent, released, but
            # never freed) until the next task came, and a worker they keep over its
            # fence gets none.
            del job, done, result, value

    def _execute(
        self, task: ToRun, inputs: dict[Key, Any], before: int
    ) -> tuple[TaskResult, Any, int]:
        """Run one task; measure its duration, output size and RSS right after it."""
        if task.key in self._cancelled:
            return TaskResult(task.key, "cancelled"), None, before
        start = time.time()
        full: int | None = None  #: the bytes it wrote, if its disk filled up
        try:
            with running(self._context(task)), task_outputs(self.sandbox, task.key) as files:
                try:
                    node = task.node
                    if isinstance(node, PickledNode):
                        node = _load_node(task.key, node.payload, "the worker process")
                    value = files.finish(_run_node(node, inputs, self._started))
                except BaseException as exc:  # measured before its files are removed
                    with contextlib.suppress(Exception):
                        full = out_of_disk(exc, self.sandbox, files.directory, files.started)
                    raise
                finally:
                    with self._lock:
                        self._coroutines.pop(threading.current_thread(), None)
        except BaseException as exc:
            stop = time.time()
            if full is not None:
                _let_go(exc)
            after = rss()
            outcome: _Outcome = "error" if full is None else "disk-full"
            error = bound_error(from_task_code(exc), task.key, self.error_limit)
            return (
                TaskResult(
                    task.key, outcome, start, stop, full or 0, after, error, rss_before=before
                ),
                None,
                after,
            )
        stop = time.time()
        after = rss()
        try:
            nbytes = int(sizeof(value))
        except Exception:
            nbytes = 0
        return (
            TaskResult(task.key, "ok", start, stop, nbytes, after, rss_before=before),
            value,
            after,
        )


def _load_node(key: Key, payload: bytes | bytearray | memoryview, where: str) -> Any:
    """The task node pickled in ``payload``, loaded in a thread or a task process (``where``
    says which process): through :mod:`runtime.unpickling`, so that its first imports of
    the task's modules never race the worker's other unpickles (its event loop's, its
    other threads'). A module not importable here is a :class:`TaskNotLoadable` (the
    loading error its ``__cause__``), which the scheduler does not retry."""
    try:
        return unpickling.loads(payload)
    except Exception as exc:
        missing = unpickling.missing_global(exc, payload)
        if missing is not None:
            raise TaskNotLoadable(key, *missing, where, f"{exc}") from exc
        exc.add_note(
            f"(while loading task {key!r} in {where}: its function or arguments "
            "cannot be loaded there; do the workers run the same versions of their modules "
            "as the client?)"
        )
        raise


# ----------------------------------------------------------------------------- processes


class _RemoteTraceback(Exception):
    """The traceback of a task's exception in its task process, as text (the
    ``__cause__`` of the exception the worker reports, as concurrent.futures does)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n" + self.tb


#: what the text of a traceback says between the exceptions of a chain (at the start
#: of a line: an exception group's members' chains are indented, and travel with them)
_CHAINED = re.compile(
    r"^(The above exception was the direct cause of the following exception:"
    r"|During handling of the above exception, another exception occurred:)$",
    re.MULTILINE,
)

_CTX = multiprocessing.get_context("spawn")
#: What a task process removes from its environment before it runs a task: the worker's
#: token (a pool starts its workers with the worker token there). Its tasks, and the
#: programs they start, do not see it in ``os.environ``. (A worker started by
#: ``python -m runtime worker`` took it out of its own environment already:
#: ``runtime.node.take_env_token``; this covers an executor in any other process.)
SECRET_VARIABLES: Final = ("CORRAL_TOKEN",)
_START_LOCK = threading.Lock()  # one task process started at a time
_STOP = pickle.dumps(None, protocol=5)


def _write_all(fd: int, data: memoryview) -> None:
    """Write all of ``data`` to the (blocking) descriptor ``fd``, without copying it."""
    pos, n = 0, data.nbytes
    while pos < n:
        pos += os.write(fd, data[pos:])


def _read_exactly(fd: int, n: int) -> bytearray | memoryview:
    """Read ``n`` bytes from ``fd`` straight into a new (writable) buffer, whose pages
    the read fills with the GIL released (:func:`runtime.unpickling.buffer`)."""
    buf = unpickling.buffer(n)
    with memoryview(buf) as view:
        pos = 0
        while pos < n:
            got = os.readv(fd, [view[pos:]])
            if got == 0:
                raise EOFError("the other end of the task pipe closed")
            pos += got
    return buf


def _dumps(obj: Any) -> list[memoryview]:
    """``obj`` pickled with protocol 5: the pickle, then its out-of-band buffers.

    Falls back to cloudpickle (functions, lambdas, classes defined in ``__main__``);
    raises what cloudpickle raises if neither can pickle it.
    """
    buffers: list[memoryview] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        try:
            buffers.append(buf.raw())
        except BufferError:  # not contiguous: pickled in-band
            return True
        return False

    try:
        data = pickle.dumps(obj, protocol=5, buffer_callback=out_of_band)
    except Exception:
        buffers.clear()
        data = pickling.cloudpickle_dumps(obj, buffer_callback=out_of_band)
    return [memoryview(data), *buffers]


def _send(conn: Connection, header: Any, parts: Iterable[memoryview]) -> None:
    """One message: a pickled header naming the sizes of ``parts``, then the parts raw."""
    parts = list(parts)
    conn.send_bytes(pickle.dumps((header, [p.nbytes for p in parts]), protocol=5))
    fd = conn.fileno()
    for part in parts:
        _write_all(fd, part)


def _receive(
    conn: Connection, on_header: Callable[[Any], None] | None = None
) -> tuple[Any, list[bytearray | memoryview]] | None:
    """The other end's :func:`_send`: ``(header, parts)``; None for the stop message.
    ``on_header`` is called with the header before the parts are read."""
    msg = unpickling.loads(conn.recv_bytes())
    if msg is None:
        return None
    header, sizes = msg
    if on_header is not None:
        on_header(header)
    fd = conn.fileno()
    return header, [_read_exactly(fd, n) for n in sizes]


# -- the task process side


def _watch_lifeline(lifeline: Connection) -> None:
    """End the task process as soon as the parent's end of the lifeline closes."""
    with contextlib.suppress(EOFError, OSError):
        lifeline.recv_bytes()
    os._exit(LIFELINE_EXIT_CODE)


def _pack_error(exc: BaseException, key: Key) -> tuple[list[memoryview], str]:
    """Task ``key``'s exception pickled for the worker (checked to load again), and its
    traceback text; one too large to travel is replaced by the error that stands for it
    (:func:`runtime.remote.bound_error`, as a thread of the worker does), and one that
    does not survive the trip by a RuntimeError that names it and carries its
    traceback (:func:`runtime.remote.pack_error`, the check the worker's messages to the
    scheduler make too). Its traceback starts at the task's code (:func:`from_task_code`)."""
    return pack_error(
        bound_error(from_task_code(exc), key, _ERROR_LIMIT), "its task process", _dumps
    )


def _child_context(conn: Connection, header: tuple[Any, ...]) -> TaskContext:
    """The checkpoint context of a job in a task process: the task writes its files in
    the worker's checkpoint directory and asks the worker (over the job's pipe, which
    the worker's feeding thread reads until the result comes) for room, and tells it
    of each file in place."""
    key, seq, path, where = header

    def reserve(key: Key, seq: int, nbytes: int) -> str | None:
        _send(conn, ("checkpoint", "reserve", key, seq, "", nbytes), [])
        return cast(str | None, unpickling.loads(conn.recv_bytes()))

    def saved(key: Key, seq: int, path: str, nbytes: int) -> None:
        _send(conn, ("checkpoint", "saved", key, seq, path, nbytes), [])

    why = f"task {key!r} runs where the worker keeps no checkpoints."
    return TaskContext(key, seq, path, where, reserve, saved, why)


def _run_job(
    header: tuple[Any, ...], parts: list[bytearray | memoryview], conn: Connection
) -> tuple[tuple[Any, ...], list[memoryview]]:
    """Run one job in the task process; the reply's header and parts."""
    key = header[0]
    node_bytes, inputs_bytes, *buffers = parts
    parts.clear()  # the inputs' pickle goes once they are loaded
    try:
        inputs = unpickling.loads(inputs_bytes, buffers)
    except BaseException as exc:
        now, after = time.time(), rss()
        error, tb = _pack_error(exc, key)
        return ("error", now, now, after, after, tb), error
    del inputs_bytes, buffers
    # As in a thread: the RSS before the task counts its inputs, its time loading it.
    before = rss()
    start = time.time()
    full: int | None = None  #: the bytes it wrote, if its disk filled up
    try:
        node = _load_node(key, node_bytes, "the worker's task process")
        with running(_child_context(conn, header)), task_outputs(_SANDBOX, key) as files:
            try:
                value = files.finish(_run_node(node, inputs))  # a File is measured here
            except BaseException as exc:  # measured before its files are removed
                with contextlib.suppress(Exception):
                    full = out_of_disk(exc, _SANDBOX, files.directory, files.started)
                raise
    except BaseException as exc:
        stop = time.time()
        error, tb = _pack_error(exc, key)
        if full is not None:
            _let_go(exc)
            return ("disk-full", start, stop, before, rss(), tb, full), error
        return ("error", start, stop, before, rss(), tb), error
    stop = time.time()
    after = rss()
    del inputs, node
    try:
        out = _dumps(value)
    except Exception as exc:
        reason = Unpicklable.of(exc).reason
        error, tb = _pack_error(ResultNotPicklable(str(key), reason, _WORKER, _BACK), key)
        return ("error", start, stop, before, after, tb), error
    return ("ok", start, stop, before, after, ""), out


#: the worker's sandbox for file outputs, in a task process (``_task_process_main``)
_SANDBOX: str | None = None
#: the id of the worker a task process runs tasks for, and the most bytes a task's
#: exception may take there (:attr:`BaseExecutor.error_limit`)
_WORKER = ""
_ERROR_LIMIT = DEFAULT_MAX_TASK_ERROR_BYTES
#: where an output that does not pickle could not go (:class:`ResultNotPicklable`)
_BACK = (
    "that worker's own process, out of the task process that ran it (execution "
    '"process" pickles every output; execution "thread" keeps it unpickled)'
)


def _ignore_signal(signum: int, frame: Any) -> None:
    """A task process's SIGTERM handler: nothing (see :func:`_task_process_main`)."""


def _default_sigterm() -> None:
    """In a process a task process forks (``multiprocessing`` with fork, a
    ``ProcessPoolExecutor``, ``os.fork``): SIGTERM's default action back, which
    :func:`_task_process_main` replaced by a no-op for the task process alone. A pool
    stops its workers with SIGTERM (``Pool.terminate``, which ``with Pool(...)`` calls
    at its exit, then joins them): with the no-op they would never stop. (An exec'd
    program gets the default back at exec.) A handler the forking code set itself is
    left alone."""
    if signal.getsignal(signal.SIGTERM) is _ignore_signal:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


#: the reusable process pools of libraries a task may use, each (module, its lock, the
#: module global holding the pool): loky's, which joblib's default backend (and so
#: scikit-learn's ``n_jobs``) keeps between calls, whether vendored by joblib or not
_REUSABLE_POOLS = (
    ("joblib.externals.loky.reusable_executor", "_executor_lock", "_executor"),
    ("loky.reusable_executor", "_executor_lock", "_executor"),
)


def _shut_reusable_pools() -> None:
    """Shut down, workers and all, the reusable process pools of the libraries a task
    used (:data:`_REUSABLE_POOLS`), which they keep for the next call: the next task
    that uses one gets a fresh pool. Killed as leftovers instead, the pool would be
    handed to the next task with its workers dead (joblib: ``TerminatedWorkerError``);
    left, their memory would count as the next task's."""
    for module_name, lock_name, holder in _REUSABLE_POOLS:
        module = sys.modules.get(module_name)
        if module is None:
            continue
        with contextlib.suppress(Exception), getattr(module, lock_name):
            pool = getattr(module, holder, None)
            if pool is not None:
                pool.shutdown(wait=True, kill_workers=True)
                setattr(module, holder, None)


def _mp_helpers() -> set[int]:
    """The pids of the helper processes ``multiprocessing`` (or loky, joblib's) started
    in this process and keeps for the next use (its fork server, its resource tracker),
    and of the processes of ``multiprocessing`` pools and ``Process`` objects still
    alive here (``multiprocessing.active_children()``: a ``Pool`` or a
    ``ProcessPoolExecutor`` a task keeps for the next one, which killed would be broken
    for it): not a task's leftovers, though they outlive the task that started them."""
    pids: set[int] = set()
    for module, holder, field in (
        ("multiprocessing.forkserver", "_forkserver", "_forkserver_pid"),
        ("multiprocessing.resource_tracker", "_resource_tracker", "_pid"),
        ("joblib.externals.loky.backend.resource_tracker", "_resource_tracker", "_pid"),
        ("loky.backend.resource_tracker", "_resource_tracker", "_pid"),
    ):
        pid = getattr(getattr(sys.modules.get(module), holder, None), field, None)
        if isinstance(pid, int):
            pids.add(pid)
    with contextlib.suppress(Exception):
        pids.update(p.pid for p in multiprocessing.active_children() if p.pid)
    return pids


#: how many times the task process looks again for leftovers (a program may fork while
#: its parent is being killed)
_LEFTOVER_ROUNDS = 3
#: how long the task process waits, after its kill, for a leftover that is not its
#: child (so cannot be reaped by it) to be gone or a zombie
_LEFTOVER_GONE = 0.2


def _kill_leftovers() -> list[tuple[str, int, int]]:
    """Kill (SIGKILL) the programs still running under this task process once its task
    has returned: what it started and did not wait for (a ``Popen`` it forgot, a server
    it left), whose memory would otherwise count as the next
    task's in this slot and get that one killed at the terminate fence. Libraries'
    reusable pools are shut down first (:func:`_shut_reusable_pools`). The task
    process's own children are reaped; the others killed (a program's children) are
    only seen gone or exited within :data:`_LEFTOVER_GONE` (where PID 1 does not reap,
    they stay zombies). ``multiprocessing``'s helpers and live pools
    (:func:`_mp_helpers`), with what runs under them, are left; exited children
    (zombies: no memory) are reaped, not named: the orphans the task process adopted
    (:func:`runtime.lifeline.adopt_orphans`) among them. A program that double-forked
    (a daemon) is one of those orphans, on Linux, so it is killed and named as any
    other. ``(name, pid, rss)`` of each killed, for the worker to say (none: ``[]``,
    after one read of this process's lists of children on Linux)."""
    killed: list[tuple[str, int, int]] = []
    me = os.getpid()
    _shut_reusable_pools()
    for _ in range(_LEFTOVER_ROUNDS):
        pids = descendants(me)
        if not pids:
            break
        spared = _mp_helpers() & set(pids)
        for pid in list(spared):
            spared.update(descendants(pid))
        children: list[psutil.Process] = []
        others: list[psutil.Process] = []
        for pid in pids:
            if pid in spared:
                continue
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                with proc.oneshot():
                    if proc.status() == psutil.STATUS_ZOMBIE:
                        if proc.ppid() == me:  # (an adopted orphan: nobody else will)
                            with contextlib.suppress(ChildProcessError):
                                os.waitpid(pid, os.WNOHANG)
                        continue
                    killed.append((proc.name(), pid, proc.memory_info().rss))
                    (children if proc.ppid() == me else others).append(proc)
        if not children and not others:
            break
        for proc in children + others:
            with contextlib.suppress(psutil.Error):
                proc.kill()  # (checks it is still the process it read: never a reuser)
        psutil.wait_procs(children, timeout=1.0)  # reaps them
        # Not our children: gone, or a zombie that PID 1 (or their parent, killed
        # too) is left to reap, which waiting on it would not hasten.
        deadline = time.monotonic() + _LEFTOVER_GONE
        while others and time.monotonic() < deadline:
            others = [proc for proc in others if not _gone(proc)]
            if others:
                time.sleep(0.005)
    return killed


def _gone(proc: psutil.Process) -> bool:
    """Whether ``proc`` has exited (gone, or a zombie: it holds no memory)."""
    try:
        return bool(proc.status() == psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return True


def _task_process_main(
    conn: Connection,
    lifeline: Connection,
    parent_pid: int,
    sandbox: str | None = None,
    worker: str = "",
    error_limit: int = _ERROR_LIMIT,
) -> None:
    """What a task process runs: jobs from ``conn``, one at a time, until told to stop
    or until the parent is gone."""
    global _SANDBOX, _WORKER, _ERROR_LIMIT
    # A process group of our own, which the programs our tasks start join: the worker
    # signals the whole group when it stops us (a timeout, a cancel, the terminate
    # fence, its shutdown), so they stop with the try. Never the worker's group: a
    # signal to ours cannot reach it. In the worker's session when it leads one (it
    # was started by Corral), whose parent kills what is left there if the worker is
    # killed outright; else a session of our own (runtime/lifeline.py says why).
    own_process_group(parent_pid)
    # The parent of the orphans of what our tasks start (Linux): a program that
    # double-forked (a daemon, in a session of its own or not) stays under us, and is
    # killed with the other leftovers when its task returns, not left to init.
    adopt_orphans()
    _SANDBOX, _WORKER, _ERROR_LIMIT = sandbox, worker, error_limit
    for name in SECRET_VARIABLES:  # the worker's token is none of its tasks' business
        os.environ.pop(name, None)
    give_back_freed_memory()  # what its tasks free leaves it (its idle RSS is the floor)
    print_stacks_on_crash()  # a task's segfault prints its stack to the worker's stderr
    # SIGKILL when the thread that started us ends; exit now if it has.
    die_with_parent(signal.SIGKILL, parent_pid)
    # Ctrl-C in a terminal reaches the worker's process group, not ours (our session
    # has no terminal); should one reach us all the same, the worker stops its task
    # processes itself, so a keystroke does not fail the task running here.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # So does a batch system's SIGTERM (Slurm's preemption, scancel, the kill at the
    # walltime signal every process of the job): the worker, told the same moment,
    # leaves with the try as lost (a free retry from its checkpoint) and kills us
    # itself. Had SIGTERM killed us first, the try would read as a task error. A
    # handler, not SIG_IGN, so a program the task runs gets the default back at exec.
    signal.signal(signal.SIGTERM, _ignore_signal)
    os.register_at_fork(after_in_child=_default_sigterm)  # but not in what we fork
    os.set_inheritable(conn.fileno(), False)
    os.set_inheritable(lifeline.fileno(), False)
    threading.Thread(target=_watch_lifeline, args=(lifeline,), daemon=True).start()
    while True:
        try:
            job = _receive(conn)
        except (EOFError, OSError):
            return  # the parent closed its end: it is gone or has given up on us
        if job is None:
            return
        job_header, parts = job
        header, reply = _run_job(job_header, parts, conn)
        del job, parts
        for stream in (sys.stdout, sys.stderr):  # what the task printed, before the result
            with contextlib.suppress(Exception):
                stream.flush()
        # What the task left running goes before its result does (its last field).
        header = (*header, _kill_leftovers())
        try:
            _send(conn, header, reply)
        except OSError:
            return
        del reply


# -- the worker side


class _Slot:
    """One task process and the thread that feeds it. Fields that other threads read
    (``pid``, ``key``, ``killed``) change only under the executor's state lock."""

    __slots__ = (
        "began_rss",
        "conn",
        "fresh_rss",
        "idle_rss",
        "index",
        "key",
        "kill_rss",
        "killed",
        "lifeline",
        "pid",
        "pidfd",
        "process",
        "returning",
        "since",
        "start_error",
        "tasks",
        "tree",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.process: BaseProcess | None = None
        self.conn: Connection | None = None
        self.lifeline: Connection | None = None  #: our end; closing it ends the child
        self.pid = 0
        self.pidfd: int | None = None  #: signals reach this process, never a pid reuser
        self.key: Key | None = None  #: the task running in it
        self.since = 0.0  #: when that task started (time.monotonic)
        self.began_rss = 0  #: the task process's RSS when that task was sent to it
        self.killed: str | None = None  #: the outcome :meth:`ProcessExecutor.kill` gave it
        #: its task returned: its result is on its way to the worker (not killed for
        #: memory then: the work is done, and the copy is the result's own)
        self.returning = False
        self.kill_rss = 0  #: the child's RSS when it was killed
        self.idle_rss = 0  #: the child's RSS after its last task
        self.start_error: BaseException | None = None
        #: its task process's memory with its programs' (None: no task process)
        self.tree: ProgramTree | None = None
        self.tasks = 0  #: tasks its task process has run
        self.fresh_rss = 0  #: its task process's RSS idle after its first task (0: unknown)


class ProcessExecutor(BaseExecutor):
    """``n`` task processes, each fed by a thread of its own; a running task can be
    killed (:meth:`kill`) without harming the worker or the other tasks.

    Same interface as :class:`Executor`. A task's ``rss_before``/``rss`` are its task
    process's RSS right before and right after it. A task process that dies under its
    task (a segfault, ``os._exit``, the kernel's OOM killer) fails that try with
    :class:`TaskProcessDied`; either way the slot gets a fresh process and goes on with
    the next task. Results go back as soon as each task ends (results that end while
    the event loop has not yet taken the previous ones travel with them), since every
    task costs a round trip to its process anyway.
    """

    killable = True
    mode = "process"

    def __init__(
        self,
        n: int,
        name: str,
        deliver: Callable[[Results], None],
        *,
        batch_delay: float = 0.002,
        sandbox: str | None = None,
        recycle_over: int = 0,
    ) -> None:
        super().__init__(deliver, batch_delay=batch_delay, sandbox=sandbox)
        self.name = name
        #: bytes a task process's idle RSS may creep over its fresh floor before it is
        #: replaced between tasks (0: never; :func:`actors.memory.recycle_over`)
        self.recycle_over = recycle_over
        self.recycled = 0  #: task processes replaced so far for memory they kept
        self._jobs: queue.SimpleQueue[tuple[ToRun, dict[Key, Any]] | None] = queue.SimpleQueue()
        self._state = threading.Lock()  #: guards the slots' pid, key and killed
        self._closing = False
        self._slots = [_Slot(i) for i in range(n)]
        _EXECUTORS.add(self)
        self._threads = [
            threading.Thread(target=self._serve, args=(s,), name=f"{name}-{i}", daemon=True)
            for i, s in enumerate(self._slots)
        ]
        for t in self._threads:
            t.start()

    # -- the interface

    def submit(self, task: ToRun, inputs: dict[Key, Any]) -> None:
        self._jobs.put((task, inputs))

    def shutdown(self, wait: bool = False) -> None:
        """Stop: running tasks are killed (reported ``cancelled``), queued ones are
        reported ``cancelled`` without running, task processes are told to stop, and
        SIGKILLed if they have not within a second. Idempotent; never blocks for long.

        ``wait``: return only once the threads and task processes have ended.
        """
        with self._state:
            first = not self._closing
            self._closing = True
            if first:
                for slot in self._slots:
                    if slot.key is not None and slot.killed is None:
                        slot.killed = "cancelled"
                        self._signal(slot, signal.SIGKILL)
        if first:
            for _ in self._threads:
                self._jobs.put(None)
        if wait:
            deadline = time.monotonic() + 10.0
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join(max(0.0, deadline - time.monotonic()))

    def kill(self, key: Key, outcome: str = "oom") -> bool:
        """SIGKILL the task process running ``key``; whether one was.

        Its try is then reported with ``outcome`` (``"oom"``, ``"timeout"``,
        ``"cancelled"`` or ``"error"``), no error and the process's RSS when it was
        killed, even if the task finished at that very moment; the slot gets a fresh
        task process. A queued task, one that is not running here, or one already killed
        is left alone: False; so is one whose result is on its way (``oom`` only: its
        work is done, :meth:`_returning`).
        """
        if outcome not in _KILL_OUTCOMES:
            raise ValueError(f"kill outcome must be one of {sorted(_KILL_OUTCOMES)}")
        with self._state:
            for slot in self._slots:
                if slot.key is not None and slot.killed is None and slot.key == key:
                    if outcome == "oom" and slot.returning:
                        return False
                    # (no walk of its programs here: what the last one found)
                    slot.kill_rss = slot.tree.rss(walk=False) if slot.tree else 0
                    slot.killed = outcome
                    self._signal(slot, signal.SIGKILL)
                    return True
        return False

    def cancel(self, key: Key) -> bool:
        """A running task's process is killed (its try ``cancelled``; the slot gets a
        fresh process), an ``async def`` task's coroutine with it; a queued one is
        skipped. False: nothing is cancelled on an event loop."""
        if not self.kill(key, "cancelled"):
            with self._lock:
                self._cancelled.add(key)
        return False

    def running(self) -> dict[Key, int]:
        """Keys running now (not killed) -> pid of the task process running each."""
        with self._state:
            return {s.key: s.pid for s in self._slots if s.key is not None and s.killed is None}

    def running_rss(self) -> tuple[dict[Key, int], int]:
        """Keys running now (not killed) -> the RSS of the task process running each
        with the programs it started (:func:`tree_rss`), and :meth:`total_rss`, from
        one read of each task process's tree."""
        with self._state:  # (a returning task is done: no kill is its to take)
            slots = [
                (s.tree, s.key if s.killed is None and not s.returning else None)
                for s in self._slots
                if s.tree
            ]
        trees = [(key, tree.rss()) for tree, key in slots]
        return {key: n for key, n in trees if key is not None}, rss() + sum(n for _, n in trees)

    def began(self) -> dict[Key, int]:
        """Keys running now (not killed) -> the RSS of the task process running each,
        with the programs it ran (:func:`tree_rss`), when the task was sent to it: what
        it grew by since is the task's."""
        with self._state:
            return {
                s.key: s.began_rss for s in self._slots if s.key is not None and s.killed is None
            }

    def executing(self) -> tuple[Key, ...]:
        return tuple(self.running())

    def executing_for(self) -> dict[Key, float]:
        now = time.monotonic()
        with self._state:
            return {
                s.key: now - s.since for s in self._slots if s.key is not None and s.killed is None
            }

    def pids(self) -> list[int]:
        """The pids of the live task processes, busy or idle."""
        with self._state:
            return [s.pid for s in self._slots if s.pid]

    def children_rss(self) -> int:
        """Sum of the RSS of the live task processes and of every process under them
        (the programs their tasks started: :func:`tree_rss`), in bytes."""
        with self._state:
            trees = [s.tree for s in self._slots if s.tree]
        return sum(tree.rss() for tree in trees)

    # -- the slot threads

    def _serve(self, slot: _Slot) -> None:
        jobs = self._jobs
        try:
            self._start_child(slot)
            while True:
                job = jobs.get()
                if job is None:
                    return
                try:
                    done = self._execute(slot, job[0], job[1])
                except Exception as exc:  # a bug here must not leave the task unreported
                    now = time.time()
                    done = (TaskResult(job[0].key, "error", now, now, 0, 0, exc), None)
                self._push([done])
                del job, done  # not held while waiting for the next (see ThreadExecutor)
        finally:
            self._stop_child(slot)

    def _execute(self, slot: _Slot, task: ToRun, inputs: dict[Key, Any]) -> tuple[TaskResult, Any]:
        """Run one task in the slot's task process; its result and value."""
        key = task.key
        if key in self._cancelled or self._closing:
            return TaskResult(key, "cancelled"), None
        try:
            node = task.node
            payload = node.payload if isinstance(node, PickledNode) else _cloudpickle(node)
            parts = [memoryview(payload), *_dumps(inputs)]
        except Exception as exc:
            exc.add_note(
                f"(while pickling task {key!r} and its inputs to run it in a task process: "
                "make them picklable, or run in thread mode)"
            )
            now = time.time()
            return TaskResult(key, "error", now, now, 0, slot.idle_rss, exc), None
        if slot.process is None or self._ended(slot, 0.0):
            self._restart_child(slot)  # it died while idle, or could not start
        elif self.recycle_over and slot.tasks and not self._closing:
            self._recycle(slot)
        conn, process = slot.conn, slot.process
        if conn is None or process is None:
            now = time.time()
            error = slot.start_error or RuntimeError("no task process could be started")
            return TaskResult(key, "error", now, now, 0, 0, error), None
        start, began = time.time(), slot.tree.rss() if slot.tree else 0
        with self._state:
            if self._closing:  # shutdown() came while the job was being pickled
                return TaskResult(key, "cancelled"), None
            slot.key, slot.killed, slot.since = key, None, time.monotonic()
            slot.began_rss = began
        reply: tuple[Any, list[bytearray | memoryview]] | None = None
        failure: Exception | None = None
        try:
            seq, path = self._resume(task)
            where = self.checkpoints.directory if self.checkpoints is not None else None
            _send(conn, (key, seq, path, where), parts)
            del parts
            while reply is None:  # the task's checkpoint requests, then its result
                if conn not in multiprocessing.connection.wait([conn, process.sentinel]):
                    raise EOFError("the task process ended without a reply")
                got = _receive(conn, functools.partial(self._returning, slot))
                if got is not None and got[0][0] == "checkpoint":
                    self._child_checkpoint(conn, got[0])
                else:
                    reply = got
                    break
        except Exception as exc:
            failure = exc
        with self._state:
            killed, slot.key, slot.returning = slot.killed, None, False
        if killed is not None:
            now = time.time()
            outcome = cast(_Outcome, killed)
            before, at_kill = slot.idle_rss, slot.kill_rss or slot.idle_rss
            self._restart_child(slot)
            if reply is not None:  # it finished as it was killed: its file goes
                _discard_reply(reply)
            return TaskResult(key, outcome, start, now, 0, at_kill, rss_before=before), None
        if reply is None:
            failure = failure or EOFError("the task process sent no reply")
            return self._lost(slot, key, start, failure), None
        slot.tasks += 1
        header, left = reply[0][:-1], reply[0][-1]
        if left:
            self._left_running(key, left)
        return self._result(slot, key, header, reply[1])

    def _returning(self, slot: _Slot, header: Any) -> None:
        """A message's header came from ``slot``'s task process: its task's result
        (anything but a checkpoint request) is on its way, part by part. The worker
        holds it twice until the task process lets its copy go: a user audit's 500 MB
        output of a 1 GiB worker passed the terminate fence so, and its finished task
        was killed (``TaskOutOfMemory``, blaming the worker's floor)."""
        if header[0] != "checkpoint":
            with self._state:
                slot.returning = True

    def _left_running(self, key: Key, left: list[tuple[str, int, int]]) -> None:
        """Say that task ``key`` left programs running when it returned, which its task
        process killed (:func:`_kill_leftovers`): ``(name, pid, rss)`` of each."""
        _log.warning(
            "a task left programs running when it returned: they were killed. A task "
            "must wait for the programs it starts (a background service it needs is "
            "started and stopped within it, or runs outside Corral)",
            worker=self.name, key=key,
            programs=", ".join(f"{name} (pid {pid}, {size_text(n)})" for name, pid, n in left),
        )  # fmt: skip

    def _recycle(self, slot: _Slot) -> None:
        """Between two tasks: measure the slot's task process idle (the first time,
        after its first task, as its fresh floor) and replace it by a fresh one if its
        RSS crept past ``recycle_over`` over that floor
        (:func:`actors.memory.recycle_task_process`): memory a task process keeps after
        its tasks (the allocator's, the libraries' caches) is the worker's floor, past
        which the memory governor has nothing to spill and kills tasks."""
        idle = rss_of(slot.pid)
        if not slot.fresh_rss:
            slot.fresh_rss = idle
        elif mem.recycle_task_process(slot.fresh_rss, idle, self.recycle_over):
            fresh, pid = slot.fresh_rss, slot.pid
            self._stop_child(slot)
            self._start_child(slot)
            with self._state:
                self.recycled += 1
            _log.info(
                "task process replaced: its idle memory crept over its fresh floor",
                worker=self.name, pid=pid, fresh=fresh, idle=idle, over=self.recycle_over,
            )  # fmt: skip

    def _child_checkpoint(self, conn: Connection, header: tuple[Any, ...]) -> None:
        """A task process's checkpoint request: room for one (answered), or one saved."""
        _, op, key, seq, path, nbytes = header
        if op == "reserve":
            files = self.checkpoints
            answer = "this worker keeps no checkpoints." if files is None else None
            if files is not None:
                answer = files.reserve(key, seq, nbytes)
            conn.send_bytes(pickle.dumps(answer, protocol=5))
        else:
            self._save_checkpoint(key, seq, path, nbytes)

    def _result(
        self, slot: _Slot, key: Key, header: tuple[Any, ...], parts: list[bytearray | memoryview]
    ) -> tuple[TaskResult, Any]:
        """The TaskResult and value of a task process's reply (a ``disk-full`` one's
        header ends with the bytes its try wrote)."""
        outcome, start, stop, before, after, tb = header[:6]
        slot.idle_rss = after
        if outcome == "ok":
            try:
                value = unpickling.loads(parts[0], parts[1:])
            except Exception as exc:
                exc.add_note(f"(while loading the result of task {key!r} from its task process)")
                return TaskResult(key, "error", start, stop, 0, after, exc, rss_before=before), None
            try:
                nbytes = int(sizeof(value))
            except Exception:
                nbytes = 0
            return TaskResult(key, "ok", start, stop, nbytes, after, rss_before=before), value
        try:
            error = unpickling.loads(parts[0])
            if not isinstance(error, BaseException):
                raise TypeError(f"not an exception: {type(error).__name__}")
        except Exception as exc:
            error = RuntimeError(
                f"the error of task {key!r} cannot be loaded from its task process ({exc!r}); "
                f"its traceback there:\n{tb}"
            )
        if (
            tb
            and error.__cause__ is None
            and (
                error.__traceback__ is None  # its frames could not travel, or its chain
                or (error.__context__ is None and _CHAINED.search(tb) is not None)
            )
        ):
            # (pack_error sends them when they can) the text of its traceback there
            # stands for what is missing, as concurrent.futures does
            error.__cause__ = _RemoteTraceback(tb)
        if outcome == "disk-full":
            nbytes = header[6]
            return (
                TaskResult(key, "disk-full", start, stop, nbytes, after, error, rss_before=before),
                None,
            )
        return TaskResult(key, "error", start, stop, 0, after, error, rss_before=before), None

    def _lost(self, slot: _Slot, key: Key, start: float, failure: Exception) -> TaskResult:
        """The task process stopped answering mid-task (not killed by us): it died, or
        (a bug) the exchange broke. Either way it is replaced."""
        pid = slot.pid
        # Alive but the exchange failed: a broken exchange, not a death.
        ended = self._ended(slot, 1.0)
        now, last = time.time(), slot.idle_rss
        code = self._stop_child(slot, graceful=False)
        error = TaskProcessDied(key, pid, code, self.name) if ended else failure
        self._start_child(slot)
        return TaskResult(key, "error", start, now, 0, last, error, rss_before=last)

    # -- task processes

    def _start_child(self, slot: _Slot) -> None:
        """Start the slot's task process (from the slot's thread: PDEATHSIG is tied to
        the thread that starts a child). A failure is kept for the next task to report."""
        if self._closing:
            return
        try:
            process, ours, life_w = self._spawn(slot.index)
        except Exception as exc:
            slot.start_error = exc
            return
        pid = process.pid
        assert pid is not None
        pidfd: int | None = None
        if hasattr(os, "pidfd_open"):
            with contextlib.suppress(OSError):
                pidfd = os.pidfd_open(pid)
        with self._state:
            slot.process, slot.conn, slot.lifeline = process, ours, life_w
            slot.pid, slot.pidfd = pid, pidfd
            slot.tree = ProgramTree(pid)
            slot.start_error = None
            slot.idle_rss = 0
            slot.kill_rss = 0
            slot.tasks = 0
            slot.fresh_rss = 0

    def _spawn(self, index: int) -> tuple[BaseProcess, Connection, Connection]:
        """A started task process, our end of its pipe and our end of its lifeline."""
        ours, theirs = _CTX.Pipe(duplex=True)
        try:
            life_r, life_w = _CTX.Pipe(duplex=False)
        except BaseException:
            ours.close()
            theirs.close()
            raise
        process = _CTX.Process(
            target=_task_process_main,
            args=(theirs, life_r, os.getpid(), self.sandbox, self.name, self.error_limit),
            name=f"{self.name}-task-{index}",
            # Not daemonic: a daemonic process may start no child, and a task's
            # multiprocessing pool (a ProcessPoolExecutor, torch's DataLoader workers,
            # joblib) must. It never outlives us all the same: its lifeline and
            # PDEATHSIG end it with us, every stop kills it with its process group, and
            # so does this process's exit (_kill_at_exit, before multiprocessing's own
            # exit handler joins it).
            daemon=False,
        )
        try:
            with _START_LOCK:
                process.start()
        except BaseException:
            ours.close()
            life_w.close()
            raise
        finally:
            theirs.close()  # the child has its own copies now
            life_r.close()
        return process, ours, life_w

    def _restart_child(self, slot: _Slot) -> None:
        self._stop_child(slot, graceful=False)
        self._start_child(slot)

    def _ended(self, slot: _Slot, timeout: float) -> bool:
        """Whether the slot's task process has ended, waiting up to ``timeout`` seconds
        for it to, without reaping it (its pidfd, or its sentinel, turns readable):
        until it is reaped its number, and its process group's, cannot be another's."""
        process = slot.process
        if process is None or _reaped(process):
            return True
        fd = slot.pidfd if slot.pidfd is not None else process.sentinel
        return bool(multiprocessing.connection.wait([fd], timeout))

    def _stop_child(self, slot: _Slot, graceful: bool = True) -> int | None:
        """Stop the slot's task process (if any) and release everything it held; its
        exit code (None: none, or unknown)."""
        process = slot.process
        if process is None:
            return None
        if graceful and slot.conn is not None and not self._ended(slot, 0.0):
            with contextlib.suppress(OSError):
                slot.conn.send_bytes(_STOP)
            self._ended(slot, 1.0)
        # Killed, or ended by itself: what its tasks started and left running (in its
        # process group) goes with it, signalled before it is reaped (by the join
        # below), so that neither its number nor its group's is free for another
        # process yet. Once reaped (by another slot's start, which reaps the ended
        # children of this process: not while this holds _START_LOCK), only through
        # its pidfd, which never reaches another process.
        with _START_LOCK, self._state:
            signal_group(slot.pidfd, 0 if _reaped(process) else slot.pid, signal.SIGKILL)
        process.join(5.0)
        code = process.exitcode
        with self._state:
            conn, lifeline, pidfd, pid = slot.conn, slot.lifeline, slot.pidfd, slot.pid
            tree, slot.tree = slot.tree, None
            slot.process = slot.conn = slot.lifeline = slot.pidfd = None
            slot.pid = 0
        for c in (conn, lifeline):
            if c is not None:
                c.close()
        if tree is not None:
            tree.close()
        if pidfd is not None:
            os.close(pidfd)
        if self.sandbox is not None and pid:  # what a task it was killed in wrote
            remove_tries(self.sandbox, pid)
        if code is not None:
            process.close()
        return code

    def _signal(self, slot: _Slot, sig: int) -> None:
        """Send ``sig`` to the slot's task process and every process in its process
        group: the programs its tasks started (caller holds the state lock).
        :func:`signal_group` says how. A SIGKILL reaches the programs that left that
        group too, first (:func:`kill_descendants`)."""
        if sig == signal.SIGKILL:
            kill_descendants(slot.pidfd, slot.pid)
        signal_group(slot.pidfd, slot.pid, sig)


def _reaped(process: BaseProcess) -> bool:
    """Whether ``process`` was reaped (``join``, ``is_alive``, ``exitcode``, or
    ``multiprocessing``'s clean-up at every start reap an ended child): its number,
    and its group's if it had no member left, may be another process's now. Read
    without reaping it."""
    popen = getattr(process, "_popen", None)
    return popen is None or getattr(popen, "returncode", None) is not None


#: how many times :func:`kill_descendants` looks again (a program may fork while its
#: parent is being killed)
_DESCENDANT_ROUNDS = 3


def kill_descendants(pidfd: int | None, pid: int) -> list[int]:
    """SIGKILL every process under task process ``pid`` (its pidfd ``pidfd``), which
    is stopped first (SIGSTOP: it starts no more), before it is killed itself: the
    programs its tasks started that left its process group (a daemon in a session of
    its own, ``setsid``), which a kill of the group misses. The task process adopts
    the orphans of what it starts (:func:`runtime.lifeline.adopt_orphans`, Linux), so
    they are under it while it lives; once it is killed they go to ``init``, out of
    reach. Nothing if it is no longer that process (its pidfd refuses a signal: it was
    reaped, its number may be another's) or, without a pidfd, if it is gone. Each
    process is killed by the number just read (psutil checks nothing more): the task
    process's own children are not reaped while it is stopped (unless it ignores
    SIGCHLD), so their numbers stay theirs; one further down that ended and was
    reaped by its parent in between (microseconds) may have had its number taken. The
    pids killed."""
    if not pid:
        return []
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGSTOP)
        else:
            os.kill(pid, signal.SIGSTOP)
    except OSError:
        return []  # gone (or reaped)
    killed: list[int] = []
    for _ in range(_DESCENDANT_ROUNDS):
        found = [p for p in descendants(pid) if p not in killed]
        if not found:
            break
        for child in found:
            with contextlib.suppress(psutil.Error):
                psutil.Process(child).kill()
        killed += found
    return killed


#: ``pidfd_send_signal``'s flag (Linux 6.9) that sends to the process group led by the
#: pidfd's process; False once the kernel refused it
_PIDFD_SIGNAL_PROCESS_GROUP = 4
_pidfd_groups = True


def signal_group(pidfd: int | None, pid: int, sig: int) -> None:
    """Send ``sig`` to process ``pid`` (a task process: through its ``pidfd`` when it
    has one, which never reaches a process that took its number after it was reaped),
    then to the process group it leads (:func:`runtime.lifeline.own_process_group`),
    which the processes it started are in unless they left it; nothing to a group that
    has no member left (nor to one before it made it: the process alone).

    The group through the ``pidfd`` where the kernel can (Linux 6.9 and later): that
    names the group by its leader, never one whose id came back into use after it.
    Else ``killpg(pid)``, as a process provider's clean-up does: a process group's id
    is not given to another while the group has a member, so once it has none the
    call finds nothing, unless a new process took that number and leads a group of its
    own meanwhile: so a task process is signalled by number (``pid``) only before it is
    reaped (``ProcessExecutor._stop_child``); after, ``pid`` 0: only through ``pidfd``."""
    global _pidfd_groups
    with contextlib.suppress(OSError):
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        elif pid:
            os.kill(pid, sig)
    if pidfd is not None and _pidfd_groups:
        try:
            signal.pidfd_send_signal(pidfd, sig, None, _PIDFD_SIGNAL_PROCESS_GROUP)
            return
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                return  # (ESRCH: the group has no member left)
            _pidfd_groups = False  # an older kernel: killpg from now on
    if pid:
        with contextlib.suppress(OSError):
            os.killpg(pid, sig)


#: the process executors of this process, for :func:`kill_task_processes`
_EXECUTORS: weakref.WeakSet[ProcessExecutor] = weakref.WeakSet()


def kill_task_processes() -> int:
    """SIGKILL every task process of this process's executors, each with its process
    group (the programs its tasks started), at once; how many there were. For a process
    about to end without stopping its executors (``os._exit`` at a second Ctrl-C, a
    lost lifeline): its task processes would die with it, but not the programs they
    started, which are in process groups of their own and no longer get the terminal's
    signals (nor is anything left to kill its session after it, where it leads one)."""
    killed = 0
    for ex in list(_EXECUTORS):
        with ex._state:
            for slot in ex._slots:
                if slot.pid:
                    ex._signal(slot, signal.SIGKILL)
                    killed += 1
    return killed


@atexit.register  # (after multiprocessing's: run before it, which joins our children)
def _kill_at_exit() -> None:
    """At this process's exit, with executors never shut down: SIGKILL their task
    processes with their process groups (:func:`kill_task_processes`). Idle ones would
    wait for a job and keep multiprocessing's exit handler, which joins every child
    that is not daemonic, waiting for them."""
    kill_task_processes()


def stop_resource_tracker() -> None:
    """Stop multiprocessing's resource tracker, which the first task process started,
    once no task process is left (each holds its pipe, which it waits on): for a worker
    process about to exit, so that it leaves no process behind (a process provider
    kills what is left in its session, and warns of it)."""
    from multiprocessing import resource_tracker

    if multiprocessing.active_children():  # (it reaps the ended ones)
        return
    stop = getattr(resource_tracker._resource_tracker, "_stop", None)
    if stop is not None:  # (a private method: skipped where a Python has none)
        with contextlib.suppress(Exception):
            stop()


def _discard_reply(reply: tuple[Any, list[bytearray | memoryview]]) -> None:
    """Remove the file of a file output in a reply nobody keeps (its try was killed)."""
    header, parts = reply
    if header[0] == "ok":
        with contextlib.suppress(Exception):
            discard_output(unpickling.loads(parts[0], parts[1:]))


def _cloudpickle(node: Any) -> bytes:
    """A task's node pickled: a future inside it goes as a reference to its key only in
    a collection's task (:func:`runtime.graph.futures_as_refs`)."""
    with futures_as_refs(node):
        return pickling.cloudpickle_dumps(node)
