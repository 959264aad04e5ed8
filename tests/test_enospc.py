"""A full disk under a task's own writes: its try ends ``disk-full``, not ``error``.

A task that fails with ``OSError(ENOSPC)`` (raised as it is, or as the cause or context
of what it raised) while it writes on its worker's disk (the file system of the
worker's sandbox) ends its try ``disk-full``, with the bytes its try left in its try
directory as the output's size; its files are removed; the scheduler retries it where
it fits and its category learns the size. An ENOSPC on another file system stays an
ordinary error (docs/files.md, "When the disk fills anyway").

Most tests need no full file system: the task raises the ``OSError`` a full disk
raises, naming the file it wrote (as ``open`` and the copies do), and the executor, the
worker and a cluster are run for real around it. The tests marked so fill a real small
file system (a tmpfs the test mounts: only as root, skipped otherwise). Every wait is
bounded and gated on what the executor delivers or the worker reports.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import anyio
import pytest
from dask._task_spec import Task

from actors import executor as executor_module
from actors.executor import (
    BaseExecutor,
    Executor,
    ProcessExecutor,
    no_space,
    out_of_disk,
    unsaid_os_error,
)
from actors.protocol import TaskResult, ToRun
from actors.worker import Worker
from runtime import Cluster, File, output_path
from runtime.errors import DiskFull, TaskTooBigForDisk
from runtime.graph import Key
from runtime.kernel import ActorSystem
from runtime.messages import RunTasks
from tests.helpers import SchedulerRecorder

pytestmark = pytest.mark.anyio

BOUND = 30  # seconds any test's waits may take (task processes start in about a second)
MiB = 2**20
NOSPACE = os.strerror(errno.ENOSPC)


# ----------------------------------------------------------------------------- tasks


def _write(name: str, nbytes: int) -> str:
    path = output_path(name)
    with open(path, "wb") as f:
        f.write(b"x" * nbytes)
    return path


def fills_named(nbytes: int) -> File:
    """Writes ``nbytes`` in its try's directory, then the disk is full: the error
    ``open`` or a copy raises, naming the file."""
    path = _write("out.bin", nbytes)
    raise OSError(errno.ENOSPC, NOSPACE, path)


def fills_then_raises_from(nbytes: int) -> File:
    """A library that wraps the disk's error in its own (``raise ... from``)."""
    path = _write("out.bin", nbytes)
    try:
        raise OSError(errno.ENOSPC, NOSPACE, path)
    except OSError as exc:
        raise RuntimeError("could not save the histogram") from exc


def fills_then_fails_handling(nbytes: int) -> File:
    """A failure while handling the disk's error: ENOSPC is its context."""
    path = _write("out.bin", nbytes)
    try:
        raise OSError(errno.ENOSPC, NOSPACE, path)
    except OSError:
        raise ValueError("cleanup failed too")  # noqa: B904 - the context is the point


def fills_in_a_subdirectory(nbytes: int) -> File:
    """ENOSPC making a file in a directory that does not exist yet (named, missing)."""
    _write("part-0.bin", nbytes)
    raise OSError(errno.ENOSPC, NOSPACE, os.path.join(output_path("deeper"), "x", "y.bin"))


def fills_elsewhere(path: str) -> None:
    """ENOSPC on a path that is not on the worker's disk (shared storage, say)."""
    _write("out.bin", MiB)
    raise OSError(errno.ENOSPC, NOSPACE, path)


def fills_nameless(nbytes: int) -> None:
    """A ``write`` to an open file: the error names no file."""
    _write("out.bin", nbytes)
    raise OSError(errno.ENOSPC, NOSPACE)


def numpy_says_no_room(nbytes: int) -> None:
    """What numpy's ``tofile`` raises when the disk fills: an ``OSError`` without an
    errno (here with room on the disk: an ordinary error)."""
    _write("out.bin", nbytes)
    raise OSError(f"Not enough free space to write {4 * nbytes} bytes after offset 0")


def tofile_past_the_disk(nbytes: int, filled: bool = False) -> File:
    """numpy's ``tofile`` of ``nbytes`` for real. ``filled``: the file system fills
    up under it after numpy got its room (another worker on the same file system, in
    the audit), which numpy says with ``problem writing element N to file``: here the
    task fills it itself, then raises numpy's error."""
    import numpy as np

    path = output_path("big.npy")
    if filled:
        with contextlib.suppress(OSError), open(path, "wb") as f:
            for _ in range(nbytes // MiB):
                f.write(b"s" * MiB)
        raise OSError("problem writing element 1130496 to file")
    np.zeros(nbytes, dtype=np.uint8).tofile(path)
    return File(path)


def fills_next_to(path: str, nbytes: int) -> None:
    """Writes ``nbytes`` at ``path`` (in the sandbox, outside its try's directory: next
    to an input, say), then the disk is full."""
    with open(path, "wb") as f:
        f.write(b"n" * nbytes)
    raise OSError(errno.ENOSPC, NOSPACE, path)


def renames_onto(path: str) -> None:
    """A rename onto ``path`` (a file it did not write) refused for room."""
    _write("out.bin", 1000)
    raise OSError(errno.ENOSPC, NOSPACE, output_path("out.bin"), None, path)


def returns(path: str) -> File:
    """Returns a file of the sandbox it did not write (an input's): the worker copies it."""
    return File(path)


def denied(nbytes: int) -> None:
    """Another OSError, naming a file in the sandbox: an ordinary error."""
    path = _write("out.bin", nbytes)
    raise OSError(errno.EACCES, os.strerror(errno.EACCES), path)


def writes_past_the_disk(nbytes: int, left_open: bool = True) -> File:
    """Writes ``nbytes`` for real, in 1 MiB writes, and returns it. ``left_open``: the
    file is not closed when the disk fills (no ``with``): its frames must let it go."""
    path = output_path("big.bin")
    chunk = b"y" * MiB
    if not left_open:
        with open(path, "wb") as f:
            for _ in range(nbytes // MiB):
                f.write(chunk)
        return File(path)
    f = open(path, "wb")  # noqa: SIM115 - left open on purpose
    for _ in range(nbytes // MiB):
        f.write(chunk)
    f.close()
    return File(path)


def writes_to(directory: str, nbytes: int) -> None:
    """Writes ``nbytes`` for real in ``directory`` (not the worker's disk)."""
    with open(os.path.join(directory, "scratch.bin"), "wb") as f:
        f.write(b"z" * nbytes)


def job(key: Key, func: Callable[..., Any], *args: Any) -> ToRun:
    return ToRun(key, Task(key, func, *args), key.split("-")[0], ())


# ----------------------------------------------------------------------------- harness


class Delivered:
    """What an executor delivered, by key; ``get`` waits for a key's result."""

    def __init__(self) -> None:
        self.results: dict[Key, tuple[TaskResult, Any]] = {}
        self._changed = anyio.Event()

    def __call__(self, batch: list[tuple[TaskResult, Any]]) -> None:
        for result, value in batch:
            self.results[result.key] = (result, value)
        self._changed.set()

    async def get(self, key: Key) -> TaskResult:
        with anyio.fail_after(BOUND):
            while key not in self.results:
                self._changed = anyio.Event()
                await self._changed.wait()
        return self.results.pop(key)[0]


@contextlib.asynccontextmanager
async def executor(mode: str, sandbox: Path) -> AsyncIterator[tuple[BaseExecutor, Delivered]]:
    delivered = Delivered()
    kind = ProcessExecutor if mode == "process" else Executor
    ex = kind(1, "w1", delivered, sandbox=str(sandbox))
    try:
        yield ex, delivered
    finally:
        with anyio.fail_after(BOUND):
            await anyio.to_thread.run_sync(ex.shutdown, True)


def tries_left(sandbox: Path) -> list[str]:
    """The try directories (and what is in them) left in a sandbox."""
    out = sandbox / "out"
    return sorted(str(p.relative_to(out)) for p in out.rglob("*")) if out.exists() else []


def other_file_system(than: Path) -> str | None:
    """A directory on another file system than ``than``'s, if this machine has one."""
    dev = os.stat(than).st_dev
    for candidate in ("/dev/shm", "/proc", "/sys", "/dev", "/run"):
        with contextlib.suppress(OSError):
            if os.stat(candidate).st_dev != dev:
                return candidate
    return None


# ----------------------------------------------------------------------------- the rule


def test_no_space_finds_enospc_as_raised_caused_or_in_context_and_in_groups() -> None:
    full = OSError(errno.ENOSPC, NOSPACE, "/x")
    assert no_space(full) is full
    wrapped = RuntimeError("save failed")
    wrapped.__cause__ = full
    assert no_space(wrapped) is full
    handling = ValueError("cleanup")
    handling.__context__ = wrapped
    assert no_space(handling) is full
    group = ExceptionGroup("tasks", [KeyError("k"), handling])
    assert no_space(group) is full
    looped = RuntimeError("a")  # a cycle of contexts ends
    looped.__context__ = RuntimeError("b")
    looped.__context__.__context__ = looped
    assert no_space(looped) is None
    assert no_space(OSError(errno.EACCES, "denied", "/x")) is None
    assert no_space(OSError("no errno")) is None


def test_out_of_disk_is_enospc_on_the_sandboxes_file_system(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    tried = sandbox / "out" / "try-1"
    (tried / "sub").mkdir(parents=True)
    (tried / "a.bin").write_bytes(b"a" * 3000)
    (tried / "sub" / "b.bin").write_bytes(b"b" * 500)
    os.symlink("/etc/hostname", tried / "link")  # not followed, not counted
    here = str(tried / "a.bin")

    def full(path: str | None) -> OSError:
        if path is None:
            return OSError(errno.ENOSPC, NOSPACE)
        return OSError(errno.ENOSPC, NOSPACE, path)

    assert out_of_disk(full(here), str(sandbox), str(tried)) == 3500
    assert out_of_disk(full(here), str(sandbox), None) == 0  # no try directory made
    # A file that could not be made: its nearest existing parent counts.
    assert out_of_disk(full(str(tried / "no" / "such.bin")), str(sandbox), str(tried)) == 3500
    # A copy's error names its source, then its target (filename2): the target counts.
    copy = OSError(errno.ENOSPC, NOSPACE, str(other_file_system(sandbox)), None, here)
    assert out_of_disk(copy, str(sandbox), str(tried)) == 3500
    assert out_of_disk(OSError(errno.EIO, "io", here), str(sandbox), str(tried)) is None
    assert out_of_disk(full(here), None, str(tried)) is None  # no sandbox: no disk
    elsewhere = other_file_system(sandbox)
    if elsewhere is not None:
        missing = os.path.join(elsewhere, "corral-no-such-dir", "out.bin")
        assert out_of_disk(full(missing), str(sandbox), str(tried)) is None
        copy_out = OSError(errno.ENOSPC, NOSPACE, here, None, missing)  # from here to there
        assert out_of_disk(copy_out, str(sandbox), str(tried)) is None
    # No file named: whether the sandbox's file system is full now decides.
    assert not executor_module.sandbox_full(str(sandbox))  # this test's disk has room
    assert out_of_disk(full(None), str(sandbox), str(tried)) is None


def test_an_os_error_without_errno_is_disk_full_only_when_the_sandbox_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """numpy's ``tofile`` says a full disk with an ``OSError`` without an errno: it is
    the worker's disk filling up when the sandbox's file system is full now (named or
    not; a file it names must be there), or numpy asked it for more room than it has
    free; never while that file system has room. Socket errors without an errno never
    are."""
    sandbox = tmp_path / "sandbox"
    tried = sandbox / "out" / "try-1"
    tried.mkdir(parents=True)
    (tried / "a.npy").write_bytes(b"a" * 3000)
    numpy = OSError("Not enough free space to write 83886080 bytes after offset 0")
    wrapped = RuntimeError("could not write the skim")
    wrapped.__cause__ = numpy
    timeout = TimeoutError("timed out")
    named = OSError(None, "HDF5 write failed", str(tried / "a.npy"))
    assert unsaid_os_error(numpy) is numpy and unsaid_os_error(wrapped) is numpy
    assert unsaid_os_error(timeout) is None and unsaid_os_error(ConnectionResetError()) is None
    assert unsaid_os_error(OSError(errno.EACCES, "denied")) is None
    # This test's disk has room (for numpy's 80 MiB too): each is an ordinary error.
    assert not executor_module.sandbox_full(str(sandbox))
    assert shutil.disk_usage(sandbox).free > 83886080
    for exc in (numpy, wrapped, named):
        assert out_of_disk(exc, str(sandbox), str(tried)) is None
    # numpy refused room for more than that file system has free: the worker's disk.
    huge = OSError(f"Not enough free space to write {2**62} bytes after offset 0")
    assert out_of_disk(huge, str(sandbox), str(tried)) == 3000
    assert out_of_disk(OSError(f"cannot write {2**62} bytes"), str(sandbox), str(tried)) is None
    monkeypatch.setattr(executor_module, "sandbox_full", lambda where: True)
    for exc in (numpy, wrapped, named):
        assert out_of_disk(exc, str(sandbox), str(tried)) == 3000
    assert out_of_disk(timeout, str(sandbox), str(tried)) is None
    assert out_of_disk(RuntimeError("not an OSError"), str(sandbox), str(tried)) is None
    elsewhere = other_file_system(sandbox)
    if elsewhere is not None:  # names a file elsewhere: not the worker's disk
        there = OSError(None, "write failed", os.path.join(elsewhere, "x.h5"))
        assert out_of_disk(there, str(sandbox), str(tried)) is None


# ----------------------------------------------------------------------------- executors


@pytest.mark.parametrize("mode", ["thread", "process"])
@pytest.mark.parametrize("func", [fills_named, fills_then_raises_from, fills_then_fails_handling])
async def test_a_task_whose_disk_fills_ends_disk_full_with_the_bytes_it_wrote(
    tmp_path: Path, mode: str, func: Callable[[int], Any]
) -> None:
    """Before, each of these tries ended ``error`` with ``nbytes`` 0 (the OSError as it
    was): the scheduler charged a retry and never learned the size."""
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    async with executor(mode, sandbox) as (ex, delivered):
        ex.submit(job("save-0", func, 3 * MiB + 7), {})
        res = await delivered.get("save-0")
    assert (res.outcome, res.nbytes) == ("disk-full", 3 * MiB + 7), res.error
    assert res.error is not None and res.start <= res.stop
    if mode == "thread":  # the task's own error, as raised (a process's is a copy)
        assert no_space(res.error) is not None
    assert tries_left(sandbox) == []  # its partial file went with its try's directory


@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_enospc_making_a_file_in_a_missing_directory_of_the_sandbox(
    tmp_path: Path, mode: str
) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    async with executor(mode, sandbox) as (ex, delivered):
        ex.submit(job("deep-0", fills_in_a_subdirectory, 5000), {})
        res = await delivered.get("deep-0")
    assert (res.outcome, res.nbytes) == ("disk-full", 5000)
    assert tries_left(sandbox) == []


@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_a_partial_file_the_try_wrote_elsewhere_in_the_sandbox_is_counted_and_removed(
    tmp_path: Path, mode: str
) -> None:
    """A file the try wrote in the sandbox outside its own directory (next to an
    input) that the disk refused is its partial output: counted and removed. A file it
    did not write (older than the try) that its error names is left alone."""
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    kept = sandbox / "0123456789ab-kept.bin"  # a stored output, written long ago
    kept.write_bytes(b"k" * 100)
    os.utime(kept, (1_000_000_000, 1_000_000_000))
    async with executor(mode, sandbox) as (ex, delivered):
        ex.submit(job("next-0", fills_next_to, str(sandbox / "next.bin"), 2000), {})
        ex.submit(job("onto-0", renames_onto, str(kept)), {})
        res = await delivered.get("next-0")
        onto = await delivered.get("onto-0")
    assert (res.outcome, res.nbytes) == ("disk-full", 2000)
    assert (onto.outcome, onto.nbytes) == ("disk-full", 1000)  # its try's directory only
    assert sorted(p.name for p in sandbox.iterdir()) == ["0123456789ab-kept.bin", "out"]
    assert kept.read_bytes() == b"k" * 100 and tries_left(sandbox) == []


@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_enospc_elsewhere_and_other_os_errors_stay_ordinary_errors(
    tmp_path: Path, mode: str
) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    elsewhere = other_file_system(sandbox)
    async with executor(mode, sandbox) as (ex, delivered):
        ex.submit(job("denied-0", denied, 1000), {})
        ex.submit(job("nameless-0", fills_nameless, 1000), {})  # this disk has room
        ex.submit(job("numpy-0", numpy_says_no_room, 1000), {})  # and no errno
        if elsewhere is not None:
            path = os.path.join(elsewhere, "corral-no-such-dir", "out.bin")
            ex.submit(job("shared-0", fills_elsewhere, path), {})
        results = [await delivered.get(k) for k in ("denied-0", "nameless-0", "numpy-0")]
        if elsewhere is not None:
            results.append(await delivered.get("shared-0"))
    for res in results:
        assert (res.outcome, res.nbytes) == ("error", 0), res.key
        assert isinstance(res.error, OSError), res.error
    assert tries_left(sandbox) == []


async def test_a_nameless_enospc_is_disk_full_when_the_sandboxes_disk_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``write`` to an open file names no file: the sandbox's file system, full when
    the task raised (here said so; for real in the tmpfs tests below), decides."""
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    seen: list[tuple[str, list[str]]] = []

    def full(where: str) -> bool:
        seen.append((where, tries_left(sandbox)))  # asked before the files go
        return True

    monkeypatch.setattr(executor_module, "sandbox_full", full)
    async with executor("thread", sandbox) as (ex, delivered):
        ex.submit(job("nameless-0", fills_nameless, 4096), {})
        res = await delivered.get("nameless-0")
    assert (res.outcome, res.nbytes) == ("disk-full", 4096)
    ((where, files),) = seen
    assert where == str(sandbox) and len(files) == 2 and files[1].endswith("out.bin")
    assert tries_left(sandbox) == []


# ----------------------------------------------------------------------------- a worker


@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_the_worker_reports_the_try_disk_full_with_its_disk_first(
    tmp_path: Path, mode: str
) -> None:
    """The worker's report: outcome ``disk-full``, ``nbytes`` one more than the bytes
    written (its output did not fit in them), a :class:`DiskFull` naming it, the bytes
    written and its room (raised from the task's error, in a thread), after a memory
    report that tells the scheduler of its disk now. Before, the scheduler got
    ``error`` with the task's OSError."""
    sched = SchedulerRecorder()
    disk = 64 * MiB
    with anyio.fail_after(BOUND):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            w = Worker(
                "w1", sref, lambda _: None, memory=2**30, disk=disk,
                memory_options={"spill_dir": str(tmp_path), "execution": mode},
            )  # fmt: skip
            ref = await system.spawn(w, "w1")
            ref.post(RunTasks((job("save-0", fills_named, 3 * MiB),)))
            res = await sched.result("save-0")
            sandbox = Path(w.data.sandbox())
            assert tries_left(sandbox) == []
    assert (res.outcome, res.nbytes, res.file) == ("disk-full", 3 * MiB + 1, False)
    assert isinstance(res.error, DiskFull), res.error
    assert (res.error.worker, res.error.nbytes, res.error.disk) == ("w1", 3 * MiB, disk)
    assert 0 < res.error.room <= disk
    if mode == "thread":
        cause = res.error.__cause__
        assert isinstance(cause, OSError) and cause.errno == errno.ENOSPC
    kinds = [type(m).__name__ for m in sched.messages]
    assert kinds.index("WorkerMemoryReport") < kinds.index("TasksDone"), kinds


def a_small_file_system(monkeypatch: pytest.MonkeyPatch, root: Path, size: int) -> None:
    """The worker's free-space probe sees the file system of ``root`` as ``size`` bytes
    holding only what is under ``root``: its free space is the rest."""
    from actors import worker as worker_module

    def free(directory: str) -> int:
        held = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
        return max(0, size - held)

    monkeypatch.setattr(worker_module, "disk_free", free)


def writes_a_file(nbytes: int) -> File:
    path = _write("out.bin", nbytes)
    return File(path)


async def test_a_full_file_system_below_the_disk_limit_is_named_not_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker with --disk 200 MiB whose spill directory is on a 6 MiB file system: a
    task that the file system stops (ENOSPC) after 4.7 MiB, and a 5.6 MiB file output
    that fits the limit but not the file system less the worker's margin (0.6 MiB).
    Each DiskFull says the file system holding the spill directory is what is full,
    with its path and free bytes, and what helps; not "a larger --disk", which cannot.
    The stopped write is what was written before it filled: the output is larger
    (``partial``). Before, both said "... of disk left of its 200.0 MiB limit ... Start
    workers with a larger --disk"."""
    spill = tmp_path / "spill"
    a_small_file_system(monkeypatch, spill, 6 * MiB)
    sched = SchedulerRecorder()
    disk = 200 * MiB
    wrote, big = 4 * MiB + 700 * 1024, 5 * MiB + 600 * 1024
    with anyio.fail_after(BOUND):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            w = Worker(
                "w1", sref, lambda _: None, memory=2**30, disk=disk,
                memory_options={"spill_dir": str(spill), "execution": "thread"},
            )  # fmt: skip
            ref = await system.spawn(w, "w1")
            ref.post(RunTasks((job("save-0", fills_named, wrote),)))
            filled = await sched.result("save-0")
            ref.post(RunTasks((job("keep-0", writes_a_file, big),)))
            refused = await sched.result("keep-0")
    for res in (filled, refused):
        err = res.error
        assert res.outcome == "disk-full" and isinstance(err, DiskFull), res
        assert (err.filesystem, err.fs_free, err.disk) == (str(spill), 6 * MiB, disk)
        text = str(err)
        assert f"the file system holding its spill directory {str(spill)!r} " in text
        assert (
            "A larger --disk cannot help: free space on that file system, give the worker "
            "a spill directory (--spill-dir) on a larger file system, or a --disk no "
            "larger than that file system's free space"
        ) in text, text
        assert "Start workers with a larger --disk" not in text
    assert filled.error.partial and filled.error.nbytes == wrote
    assert str(filled.error).startswith(
        "task 'save-0' filled the file system after writing 4.7 MiB of its output (the "
        "output is larger) on worker 'w1'"
    )
    assert "ran out of space before its --disk of 200.0 MiB was reached (6.0 MiB free " in str(
        filled.error
    )
    assert not refused.error.partial and refused.error.nbytes == big
    margin = 6 * MiB // 10
    assert refused.error.room == 6 * MiB - margin
    assert (
        f"has 6.0 MiB free (it keeps {margin:,} bytes of that spare), less than its --disk of "
        "200.0 MiB leaves"
    ) in str(refused.error)
    assert str(refused.error).startswith("task 'keep-0' wrote an output of 5.6 MiB on worker")
    # Where --disk is what is short, the error says so as before.
    full = DiskFull("k", "w1", 5 * MiB, MiB, 4 * MiB)
    assert "of disk left of its 4.0 MiB limit" in str(full) and not full.filesystem
    assert "Start workers with a larger --disk" in str(full)


# ----------------------------------------------------------------------------- a cluster


def fills_once(flag: str, nbytes: int) -> bytes:
    """Its first try fills the disk (``nbytes`` written), the next one succeeds."""
    if not os.path.exists(flag):
        Path(flag).touch()
        fills_named(nbytes)
    return b"ok"


async def test_a_cluster_retries_a_try_that_filled_the_disk_and_learns_its_size(
    tmp_path: Path,
) -> None:
    """No retries asked for: the disk-full try is retried for free, the result comes,
    the category counts one ``disk-full`` try, of more than the size written. Before,
    the run failed with the task's ``OSError: [Errno 28] No space left on device``."""
    flag = str(tmp_path / "filled")
    with anyio.fail_after(60):
        async with Cluster(workers=2) as cluster:
            fut = cluster.submit(fills_once, flag, 2 * MiB, retries=0)
            assert await fut == b"ok"
            st = await cluster.status()
            story = [row[1:3] for row in await cluster.story(fut.key)]
    cat = st["categories"]["fills_once"]
    assert (cat["disk_full"], cat["errors"], cat["max_nbytes"]) == (1, 0, 2 * MiB + 1)
    assert ("processing", "queued") in story and ("processing", "memory") in story, story


# ----------------------------------------------------------------------------- a real full disk


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A fresh 8 MiB tmpfs, mounted for the test (root only; skipped otherwise, and
    failed with ``CI=true``: CI runs as root)."""

    def cannot(why: str) -> NoReturn:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}; CI runs as root and must run this test")
        pytest.skip(why)

    if os.geteuid() != 0 or shutil.which("mount") is None:
        cannot("fills a real file system: needs root to mount an 8 MiB tmpfs")
    where = tmp_path / "small"
    where.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(where)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if made.returncode != 0:
        cannot(f"fills a real file system: cannot mount a tmpfs ({made.stderr.strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], timeout=30, check=False)


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free


# The task leaves its file open: once its frames let go of it, the file is closed by the
# garbage collector, which warns of it (and of the buffered bytes it cannot write).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_a_task_filling_a_real_file_system_ends_disk_full_and_frees_it(
    small_fs: Path, tmp_path: Path, mode: str
) -> None:
    """The sandbox on an 8 MiB tmpfs; a task writes 16 MiB (the file left open): its
    try ends ``disk-full`` with what it wrote (about the tmpfs' size) and the tmpfs is
    as empty as before once it is reported. A task on a sandbox elsewhere that fills
    that tmpfs (not the worker's disk) fails with its OSError."""
    sandbox = small_fs / "sandbox"
    sandbox.mkdir()
    empty = free_bytes(small_fs)
    async with executor(mode, sandbox) as (ex, delivered):
        ex.submit(job("big-0", writes_past_the_disk, 16 * MiB), {})
        res = await delivered.get("big-0")
        assert res.outcome == "disk-full", res.error
        assert empty - MiB <= res.nbytes <= empty, (res.nbytes, empty)
        assert tries_left(sandbox) == [] and free_bytes(small_fs) == empty
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    async with executor(mode, elsewhere) as (ex, delivered):
        ex.submit(job("scratch-0", writes_to, str(small_fs), 16 * MiB), {})
        res = await delivered.get("scratch-0")
    assert (res.outcome, res.nbytes) == ("error", 0)
    assert isinstance(res.error, OSError) and res.error.errno == errno.ENOSPC


@pytest.mark.parametrize("mode", ["thread", "process"])
@pytest.mark.parametrize("filled", [False, True], ids=["no-room", "filled"])
async def test_numpy_tofile_filling_a_real_file_system_ends_disk_full(
    small_fs: Path, mode: str, filled: bool
) -> None:
    """numpy's ``tofile`` past an 8 MiB tmpfs raises an ``OSError`` without an errno:
    ``Not enough free space to write 16777216 bytes`` before writing a byte (it asks
    for the room first), or ``problem writing element N to file`` when the file system
    fills up under it (filled here by the task itself). Either way the try ends
    ``disk-full`` with what it wrote, and the tmpfs is as empty as before. Before, it
    ended ``error``."""
    sandbox = small_fs / "sandbox"
    sandbox.mkdir()
    empty = free_bytes(small_fs)
    async with executor(mode, sandbox) as (ex, delivered):
        ex.submit(job("skim-0", tofile_past_the_disk, 16 * MiB, filled), {})
        res = await delivered.get("skim-0")
    assert res.outcome == "disk-full", res.error
    if mode == "thread":  # the task's own error, as numpy raised it
        assert isinstance(res.error, OSError) and res.error.errno is None, res.error
    if filled:
        assert empty - MiB <= res.nbytes <= empty, (res.nbytes, empty)
    else:
        assert res.nbytes == 0  # refused before its first byte
    assert tries_left(sandbox) == [] and free_bytes(small_fs) == empty


@pytest.mark.parametrize("mode", ["thread", "process"])
async def test_the_copy_of_an_input_that_fills_a_real_disk_is_removed(
    small_fs: Path, mode: str
) -> None:
    """A task returns a 5 MiB file of the sandbox it did not write (an input's): the
    worker copies it (its own output), and the 8 MiB tmpfs refuses the copy. The try
    ends ``disk-full`` with what was copied, and the partial copy, which is not in the
    try's directory, is removed: the tmpfs holds the input alone again."""
    sandbox = small_fs / "sandbox"
    sandbox.mkdir()
    source = sandbox / "0123456789ab-events.bin"
    source.write_bytes(b"e" * 5 * MiB)
    os.utime(source, (1_000_000_000, 1_000_000_000))  # written before the try
    free = free_bytes(small_fs)
    async with executor(mode, sandbox) as (ex, delivered):
        ex.submit(job("keep-0", returns, str(source)), {})
        res = await delivered.get("keep-0")
    assert res.outcome == "disk-full", res.error
    assert free - MiB <= res.nbytes <= free, (res.nbytes, free)
    assert [p.name for p in sandbox.iterdir()] == [source.name]  # the copy went
    assert free_bytes(small_fs) == free


async def test_a_cluster_whose_only_disk_is_too_small_says_so(small_fs: Path) -> None:
    """The audit's run: a worker whose sandbox is on a small file system, a task writing
    more than it holds. The try ends ``disk-full`` and the task fails saying what it
    needs, not with ``OSError: [Errno 28]`` after an ``error`` try."""
    options = {"spill_dir": str(small_fs)}
    with anyio.fail_after(60):
        async with Cluster(workers=1, memory_options=options) as cluster:
            fut = cluster.submit(writes_past_the_disk, 16 * MiB, False)
            with pytest.raises((TaskTooBigForDisk, DiskFull)) as info:
                await fut
            st = await cluster.status()
    cat = st["categories"]["writes_past_the_disk"]
    assert (cat["disk_full"], cat["errors"]) == (1, 0), cat
    assert 6 * MiB < cat["max_nbytes"] <= 8 * MiB + 1  # one more than it wrote
    assert "Errno 28" not in str(info.value)


async def test_a_cluster_whose_numpy_task_fills_its_disk_says_so(small_fs: Path) -> None:
    """The audit's numpy run: ``ndarray.tofile`` of more than the worker's file system
    holds. Its tries end ``disk-full`` (retried for free), and the task fails with a
    ``DiskFull`` saying a larger --disk cannot help, not with numpy's ``OSError`` after
    an ``error`` try."""
    options = {"spill_dir": str(small_fs)}
    with anyio.fail_after(60):
        async with Cluster(workers=1, disk_per_worker="300MiB", memory_options=options) as cluster:
            fut = cluster.submit(tofile_past_the_disk, 16 * MiB)
            with pytest.raises((TaskTooBigForDisk, DiskFull)) as info:
                await fut
            st = await cluster.status()
    cat = st["categories"]["tofile_past_the_disk"]
    assert cat["errors"] == 0 and cat["disk_full"] >= 1, cat
    assert "Not enough free space" not in str(info.value).splitlines()[0]
    assert "larger --disk cannot help" in str(info.value), info.value


async def test_a_worker_started_on_a_full_file_system_says_so(
    small_fs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The chaos audit's D5: a worker whose spill directory's file system was full when
    it started (a node whose scratch is full) joined without a word, and the console
    showed its disk as ``0 B of 1 B``. It warns at start, naming the directory and what
    to do, and the console says it had none; one with room says nothing."""
    import logging

    from actors.worker import DISK_FULL_AT_START
    from runtime.console import jsonable
    from runtime.messages import StatusReply, WorkerInfo
    from tests.helpers import status_text

    caplog.set_level(logging.WARNING, logger="corral")

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if DISK_FULL_AT_START in r.getMessage()]

    async def start(spill: Path) -> WorkerInfo:
        sched = SchedulerRecorder()
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            w = Worker(
                "w1", sref, lambda _: None, memory=2**30,
                memory_options={"spill_dir": str(spill)},
            )  # fmt: skip
            await system.spawn(w, "w1")  # returns once its start (and warning) is done
            return w.info

    with anyio.fail_after(BOUND):
        roomy = await start(small_fs / "spill")
        assert roomy.disk > MiB and said() == []
        (small_fs / "hog").write_bytes(b"\0" * (free_bytes(small_fs) - 512 * 1024))
        nearly = await start(small_fs / "spill")  # half a MiB left: no room either
        assert 0 < nearly.disk < MiB and len(said()) == 1
        (small_fs / "hog2").write_bytes(b"\0" * free_bytes(small_fs))  # fills it
        full = await start(small_fs / "spill")
    assert full.disk == 1  # counted (so nothing is placed there), none free
    line = said()[-1]
    assert len(said()) == 2 and str(small_fs / "spill") in line and "--spill-dir" in line, line
    text = status_text(jsonable(StatusReply(workers=(full,)).to_dict()))
    assert "0 B (none at start)" in text and "of 1 B" not in text
