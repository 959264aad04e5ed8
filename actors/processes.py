"""Local worker processes that never outlive the process that started them.

What lives here:

- :func:`spawn_child` starts one child process (an :class:`anyio.abc.Process`, here a
  :class:`ChildProcess`) tied to its parent twice over: ``PR_SET_PDEATHSIG`` on Linux,
  and a *lifeline* pipe whose write end only the parent holds.
- :func:`run_command` runs a short command (``sbatch``, ``squeue``...) to its end with
  :func:`spawn_child`, leaving nothing behind when cancelled.
- :func:`watch_lifeline` is what the child program runs (in a task of its own) to exit
  as soon as the lifeline reaches end-of-file, i.e. as soon as the parent is gone.
- :class:`LocalProcessProvider` implements :class:`~actors.providers.Provider` with
  blocks of local processes built from an ``argv_for(block_id, index)`` factory.

Nothing here knows what the children run: a Corral worker (``python -m runtime worker
ws://...``), or the tiny test programs in ``tests/helpers_child.py``.

How orphans are prevented (the parent may die in any way, SIGKILL included):

1. **PDEATHSIG.** Between ``fork`` and ``exec`` the child asks the kernel
   (``prctl(PR_SET_PDEATHSIG, sig)``) for ``sig`` when its parent goes away, then checks
   ``getppid()`` against the pid of the parent that spawned it: if the parent died
   before the ``prctl`` took effect the child exits at once. Linux only. The kernel
   sends the signal when the parent *thread* that forked the child exits, not the parent
   process: children are spawned from the event-loop thread (``spawn_child`` is a
   coroutine, so they are), so do not run the event loop in a thread that ends before
   the process does (e.g. a short-lived ``from_thread`` portal) while children live.
   The setting is cleared when the child execs a set-user-id program. The request and
   the check are ``runtime/lifeline.py``, shared with the executor's task processes.
2. **Lifeline.** A pipe per child; the child gets the read end (its number in the
   environment variable ``CORRAL_LIFELINE_FD``), the parent keeps the only write end
   (close-on-exec, so no other child inherits it). When the parent dies the kernel
   closes that write end and the child's :func:`watch_lifeline` sees end-of-file, runs
   an optional graceful hook, and ends the process with ``os._exit``. This also covers
   what PDEATHSIG does not: non-Linux systems, a PDEATHSIG the child ignores, a spawning
   thread that ended while the process lives on. It only works in children that run
   :func:`watch_lifeline`, and a process forked from the parent *without* exec
   (``multiprocessing`` with the "fork" start method) would hold a copy of the write end
   and delay the end-of-file.

Children also get a session (and process group) of their own, so a terminal's Ctrl-C
reaches only the parent, which then stops them in order; escalation to SIGKILL reaches
the child's whole process group, and the clean-up after a child exits its whole session
(Linux; elsewhere its process group): whatever it started and left there, however it
ended. A worker killed outright (SIGKILL, the OOM killer) leaves the programs its tasks
started: its threads' in its group, its task processes' in their groups in its session
(:func:`runtime.lifeline.kill_session` says what this covers, and what not).

Processes are driven through asyncio (``loop.subprocess_exec``, which takes the
``preexec_fn`` anyio's ``open_process`` does not), as is all of Corral.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

import anyio
import anyio.abc

from actors.providers import Block, BlockSpec, BlockState, Provider, accelerator_env
from runtime.errors import describe_exit
from runtime.lifeline import LIFELINE_EXIT_CODE, die_with_parent_preexec, kill_session
from runtime.log import JSON_LINES_ENV, get_logger, relayed

__all__ = [
    "LIFELINE_ENV",
    "LIFELINE_EXIT_CODE",
    "ChildProcess",
    "LocalProcessProvider",
    "describe_exit",
    "has_lifeline",
    "spawn_child",
    "watch_lifeline",
]

LIFELINE_ENV = "CORRAL_LIFELINE_FD"
"""Environment variable holding the number of the child's lifeline read end."""

_READ_CHUNK = 65536
_MAX_LINE = 65536  # bytes; a longer "line" is forwarded in pieces

_log = get_logger("corral", component="processes")

# ----------------------------------------------------------------------------- spawning


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's stream protocol plus an event set when the process exits.

    asyncio's own ``Process.wait`` also waits for the pipes to close, which never happens
    while a grandchild holds them; ``exited`` does not.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=_READ_CHUNK, loop=loop)
        self.exited = asyncio.Event()

    def process_exited(self) -> None:
        super().process_exited()
        self.exited.set()


class _ReceiveStream(anyio.abc.ByteReceiveStream):
    """An asyncio ``StreamReader`` seen as an anyio byte stream (one pipe of a child)."""

    def __init__(
        self, reader: asyncio.StreamReader, transport: asyncio.SubprocessTransport, fd: int
    ) -> None:
        self._reader = reader
        self._transport = transport
        self._fd = fd

    async def receive(self, max_bytes: int = _READ_CHUNK) -> bytes:
        try:
            data = await self._reader.read(max_bytes)
        except OSError as exc:
            raise anyio.BrokenResourceError from exc
        if not data:
            raise anyio.EndOfStream
        return data

    async def aclose(self) -> None:
        pipe = self._transport.get_pipe_transport(self._fd)
        if pipe is not None:
            pipe.close()  # the reader then sees end-of-file
        await anyio.lowlevel.checkpoint()


class _SendStream(anyio.abc.ByteSendStream):
    """An asyncio ``StreamWriter`` seen as an anyio byte stream."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def send(self, item: bytes) -> None:
        try:
            self._writer.write(item)
            await self._writer.drain()
        except (ConnectionError, RuntimeError) as exc:
            raise anyio.BrokenResourceError from exc

    async def aclose(self) -> None:
        self._writer.close()
        await anyio.lowlevel.checkpoint()


class ChildProcess(anyio.abc.Process):
    """A child started by :func:`spawn_child`.

    Like anyio's process, plus: :meth:`stop` (SIGTERM, grace period, SIGKILL),
    :meth:`close_lifeline`, and :meth:`aclose` that kills a child still running rather
    than waiting for it. Signals go to the child by pid (never after it has been
    reaped); :meth:`kill` and the clean-up in :meth:`aclose` reach its whole process
    group when it has one of its own (``new_session=True``).
    """

    def __init__(
        self,
        transport: asyncio.SubprocessTransport,
        protocol: _Protocol,
        *,
        lifeline_fd: int | None,
        own_group: bool,
    ) -> None:
        self._transport = transport
        self._protocol = protocol
        self._lifeline = lifeline_fd  #: the parent's write end; None once closed
        self._own_group = own_group  #: the child leads a process group of its own
        self._pid = transport.get_pid()
        self._stdin = _SendStream(protocol.stdin) if protocol.stdin is not None else None
        self._stdout = (
            None if protocol.stdout is None else _ReceiveStream(protocol.stdout, transport, 1)
        )
        self._stderr = (
            None if protocol.stderr is None else _ReceiveStream(protocol.stderr, transport, 2)
        )
        self.killed_after: float | None = None  #: grace (s) after which stop() used SIGKILL

    def __repr__(self) -> str:
        rc = self.returncode
        return f"<ChildProcess pid={self._pid} {'running' if rc is None else describe_exit(rc)}>"

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def returncode(self) -> int | None:
        """The exit status once reaped: ``-N`` if killed by signal ``N``; else None."""
        return self._transport.get_returncode()

    @property
    def stdin(self) -> anyio.abc.ByteSendStream | None:
        return self._stdin

    @property
    def stdout(self) -> anyio.abc.ByteReceiveStream | None:
        return self._stdout

    @property
    def stderr(self) -> anyio.abc.ByteReceiveStream | None:
        return self._stderr

    async def wait(self) -> int:
        """Wait until the child has exited (not for its pipes to close); its status."""
        await self._protocol.exited.wait()
        rc = self.returncode
        assert rc is not None
        return rc

    def send_signal(self, signal: int) -> None:
        """Send ``signal`` to the child (nothing once it has exited)."""
        if self.returncode is not None:
            return
        # os.kill, not Popen.send_signal: the latter polls with waitpid and may reap the
        # child under asyncio's child watcher, which would then report exit code 255.
        with contextlib.suppress(ProcessLookupError):
            os.kill(self._pid, signal)

    def terminate(self) -> None:
        """SIGTERM to the child only: it may shut its own children down gracefully."""
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the child and, when it leads one, its whole process group."""
        if self.returncode is not None:
            return
        if self._own_group:
            try:
                os.killpg(self._pid, signal.SIGKILL)
                return
            except (ProcessLookupError, PermissionError):
                pass
        self.send_signal(signal.SIGKILL)

    async def stop(self, grace: float) -> int:
        """SIGTERM, up to ``grace`` seconds, then SIGKILL; wait for the exit; its status."""
        if self.returncode is None:
            self.terminate()
            with anyio.move_on_after(grace):
                return await self.wait()
            self.killed_after = grace
            self.kill()
        return await self.wait()

    def close_lifeline(self) -> None:
        """Close the parent's end of the lifeline: a watching child then exits."""
        fd, self._lifeline = self._lifeline, None
        if fd is not None:
            os.close(fd)

    def kill_leftovers(self, session: bool = False) -> int:
        """SIGKILL what the exited child left in its process group (it leads one of its
        own: ``new_session=True``) or, with ``session``, in its whole session, process
        groups made in it included; how many processes were left (0: none; 1 for any
        when only the group is signalled, whose members are not counted).

        The session reaches what the child started, however it ended (SIGKILL, the OOM
        killer): a worker's threads' programs, and its task processes and the programs
        their tasks started (in groups of their own in its session:
        :func:`runtime.lifeline.own_process_group`). It is read in /proc, a pass over
        every process of the machine (:func:`runtime.lifeline.kill_session`; Linux only,
        elsewhere the process group alone), so run it off the event loop's thread. Safe
        after the child was reaped: neither a session's nor a process group's id is
        given to another while it has members.
        """
        if not self._own_group or self.returncode is None:
            return 0
        if session and sys.platform.startswith("linux"):
            return len(kill_session(self._pid))
        try:
            os.killpg(self._pid, 0)
            os.killpg(self._pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return 0
        return 1

    def release(self) -> None:
        """Close pipes and lifeline without waiting (SIGKILL first if it still runs)."""
        if self.returncode is None:
            self.kill()
        else:
            self.kill_leftovers()
        self._transport.close()
        self.close_lifeline()

    async def aclose(self) -> None:
        """Kill the child if it still runs, wait for it, release pipes and lifeline."""
        with anyio.CancelScope(shield=True):
            try:
                if self.returncode is None:
                    self.kill()
                    await self.wait()
            finally:
                self.release()


async def spawn_child(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: int | IO[Any] | None = subprocess.DEVNULL,
    stdout: int | IO[Any] | None = subprocess.PIPE,
    stderr: int | IO[Any] | None = subprocess.PIPE,
    pdeathsig: int | None = signal.SIGTERM,
    lifeline: bool = True,
    new_session: bool = True,
) -> ChildProcess:
    """Start ``argv`` as a child that does not outlive this process.

    ``env`` is the child's whole environment (None: this process's); ``stdin``,
    ``stdout`` and ``stderr`` are as for :class:`subprocess.Popen` (default: no input,
    both outputs piped to :attr:`ChildProcess.stdout`/``stderr``, which the caller must
    then read or close). ``pdeathsig`` is the signal the child gets when the spawning
    thread dies (Linux; None: none). SIGTERM lets the child clean up (a child that
    ignores it relies on its lifeline); SIGKILL is certain. With ``lifeline`` the child's
    environment gets ``CORRAL_LIFELINE_FD``, which :func:`watch_lifeline` uses. With
    ``new_session`` the child runs in a session and process group of its own.

    Must run in the event loop's thread (a coroutine always does); see the module
    header for why that thread should live as long as the children. Raises
    :class:`OSError` (e.g. ``FileNotFoundError``) if the program cannot be started.
    The caller owns the result: ``aclose`` it (or use it as an async context manager).
    """
    if not argv:
        raise ValueError("spawn_child needs a non-empty argv")
    child_env = dict(os.environ if env is None else env)
    read_fd: int | None = None
    write_fd: int | None = None
    if lifeline:
        read_fd, write_fd = os.pipe()  # both close-on-exec; pass_fds opens read_fd only
        child_env[LIFELINE_ENV] = str(read_fd)
    else:
        child_env.pop(LIFELINE_ENV, None)
    preexec = None if pdeathsig is None else die_with_parent_preexec(pdeathsig, os.getpid())
    loop = asyncio.get_running_loop()
    try:
        # Shielded: asyncio abandons a child whose start is cancelled halfway (a pipe it
        # connects after the cancellation is never closed, and the child is never reaped
        # if the event loop ends first). Starting is a fork, an exec and three pipes.
        with anyio.CancelScope(shield=True):
            transport, protocol = await loop.subprocess_exec(
                lambda: _Protocol(loop),
                *argv,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                env=child_env,
                cwd=cwd,
                pass_fds=() if read_fd is None else (read_fd,),
                start_new_session=new_session,
                preexec_fn=preexec,
            )
    except BaseException:
        if write_fd is not None:
            os.close(write_fd)
        raise
    finally:
        if read_fd is not None:
            os.close(read_fd)
    child = ChildProcess(transport, protocol, lifeline_fd=write_fd, own_group=new_session)
    try:
        await anyio.lowlevel.checkpoint_if_cancelled()
    except BaseException:
        await child.aclose()  # cancelled while starting: nobody else will own the child
        raise
    return child


async def run_command(
    argv: Sequence[str], *, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` to its end: its exit status and whole stdout and stderr (no input).

    Like ``anyio.run_process(argv, check=False)``, except that a cancellation at any
    point (a timeout around it, a provider closing) leaves nothing behind: the child is
    killed and reaped before the cancellation goes on. ``env`` is the whole environment
    (None: this process's). Raises :class:`OSError` if the program cannot be started.
    """
    output = [b"", b""]

    async def drain(stream: anyio.abc.ByteReceiveStream | None, index: int) -> None:
        if stream is not None:
            output[index] = b"".join([chunk async for chunk in stream])

    child = await spawn_child(argv, env=env, lifeline=False)
    async with child, anyio.create_task_group() as tg:
        tg.start_soon(drain, child.stdout, 0)
        tg.start_soon(drain, child.stderr, 1)
        returncode = await child.wait()
    return subprocess.CompletedProcess(list(argv), returncode, output[0], output[1])


# ----------------------------------------------------------------------------- the child side

_lifeline_fd: int | None = None  # taken from the environment by the first watch_lifeline


def _take_lifeline() -> int | None:
    """The lifeline's read end, taken out of the environment (so grandchildren do not
    inherit a number that means nothing to them); None if this process has none."""
    global _lifeline_fd
    if _lifeline_fd is None:
        raw = os.environ.pop(LIFELINE_ENV, None)
        if raw is None:
            return None
        try:
            fd = int(raw)
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                raise ValueError(f"fd {fd} is not a pipe")
        except (ValueError, OSError) as exc:
            _log.warning("ignoring a broken lifeline", value=raw, error=str(exc))
            return None
        os.set_inheritable(fd, False)
        _lifeline_fd = fd
    return _lifeline_fd


def has_lifeline() -> bool:
    """Whether this process was started by :func:`spawn_child` with a lifeline: its
    parent lives as long as it runs (:func:`watch_lifeline` ends it otherwise). A worker
    process with one has its manager in that parent (a local process provider runs in
    the manager's process)."""
    return _take_lifeline() is not None


async def watch_lifeline(
    on_lost: Callable[[], Awaitable[object] | object] | None = None,
    *,
    grace: float = 2.0,
    exit_code: int = LIFELINE_EXIT_CODE,
) -> None:
    """In a child started by :func:`spawn_child`: exit when the parent is gone.

    Waits until the lifeline pipe reaches end-of-file (the parent died, or closed it on
    purpose), then calls ``on_lost()`` (sync or async; at most ``grace`` seconds; its
    errors are logged), flushes stdout and stderr, and ends the process with
    ``os._exit(exit_code)``: no ``finally`` blocks, no atexit handlers. Run it as a task
    next to the program's work (``tg.start_soon(watch_lifeline)``) and cancel it when the
    program ends on its own. Returns at once if this process has no lifeline (it was not
    started by :func:`spawn_child`, or with ``lifeline=False``). One watcher at a time.
    """
    fd = _take_lifeline()
    if fd is None:
        return
    while True:
        await anyio.wait_readable(fd)
        try:
            if not os.read(fd, 512):
                break  # end-of-file: the write end is closed everywhere
        except BlockingIOError:
            continue
    _log.warning("lifeline lost: the parent process is gone; exiting", pid=os.getpid())
    if on_lost is not None:
        with anyio.move_on_after(grace):
            try:
                result = on_lost()
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                _log.error("lifeline hook failed", error=repr(exc))
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(exit_code)


# ----------------------------------------------------------------------------- provider


def _open_output_files(log_dir: Path, wid: str) -> tuple[IO[bytes], IO[bytes]]:
    """``<log_dir>/<wid>.stdout`` and ``.stderr``, opened for appending (small, local)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out = open(log_dir / f"{wid}.stdout", "ab")  # noqa: SIM115 - closed by the caller
    try:
        return out, open(log_dir / f"{wid}.stderr", "ab")
    except BaseException:
        out.close()
        raise


_CGROUP_ROOT = Path("/sys/fs/cgroup")


def _oom_events(pid: int) -> tuple[Path, int] | None:
    """The file of process ``pid``'s memory cgroup that counts its OOM kills, and the
    ``oom_kill`` count there now: cgroup v1's ``memory.oom_control`` of its ``memory``
    hierarchy, else cgroup v2's ``memory.events`` (at ``/sys/fs/cgroup`` or, hybrid,
    ``/sys/fs/cgroup/unified``). None where there is none to read (not Linux, no
    memory controller, the process gone)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    candidates: list[Path] = []
    for line in lines:
        _, controllers, where = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        where = where.strip().rstrip("/")
        if "memory" in controllers.split(","):
            candidates.insert(0, _CGROUP_ROOT / f"memory{where}" / "memory.oom_control")
        elif controllers == "":
            candidates.append(_CGROUP_ROOT / where.lstrip("/") / "memory.events")
            candidates.append(_CGROUP_ROOT / "unified" / where.lstrip("/") / "memory.events")
    for path in candidates:
        count = _oom_kills(path)
        if count is not None:
            return path, count
    return None


def _oom_kills(path: Path) -> int | None:
    """The ``oom_kill`` count in a cgroup's ``memory.events`` (v2) or
    ``memory.oom_control`` (v1): processes of the cgroup the kernel's OOM killer
    killed; None if unreadable."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


@dataclasses.dataclass(slots=True, eq=False)
class _Child:
    worker_id: str
    process: ChildProcess
    scope: anyio.CancelScope = dataclasses.field(
        default_factory=lambda: anyio.CancelScope(shield=True)
    )
    outcome: str = ""  #: describe_exit(...) once it has exited
    #: the file counting its memory cgroup's OOM kills and the count when it started
    #: (None: none to read; see _oom_events)
    oom_events: tuple[Path, int] | None = None
    oom: bool = False  #: killed by SIGKILL while its cgroup counted an OOM kill
    accelerator: str = ""  #: the accelerator it is pinned to ("": none)


@dataclasses.dataclass(slots=True, eq=False)
class _Record:
    block: Block
    children: list[_Child] = dataclasses.field(default_factory=list)
    ended: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    starting: bool = True  #: start_block is still spawning its processes
    stopping: bool = False  #: stop_block (or the provider's exit) asked it to end
    failure: str = ""  #: the first failure seen while not stopping
    failed_worker: str = ""  #: whose failure that was
    #: the rest of the block was stopped because of the failure (False: the failed
    #: worker was the last one left, the rest had ended before it)
    stopped_rest: bool = False
    live: int = 0  #: children not yet reaped and finished with
    #: while a pending block waits out the provision delay: cancel it to start nothing
    waiting: anyio.CancelScope | None = None


class LocalProcessProvider(Provider):
    """Blocks of local processes: each worker of a block is one :func:`spawn_child` child.

    ``argv_for(block_id, index)`` builds the command line of worker ``index`` of a block;
    the block (with its spec) is already in :attr:`blocks` when it is called. Each child
    also finds ``CORRAL_WORKER_ID`` and ``CORRAL_BLOCK_ID`` in its environment (this
    process's environment plus ``env``; ``PYTHONUNBUFFERED=1`` unless ``env`` says
    otherwise, so Python children's lines arrive as they are printed). The worker id is
    the one in ``block.workers``: a Corral worker (``python -m runtime worker``) joins
    the scheduler under it, so the autoscaler can drain a block's workers by id and
    report them lost the moment their process exits (no reconnection grace).

    Use it as ``async with LocalProcessProvider(...) as provider:`` or run it in a task
    group with ``await tg.start(provider.run)``. Every child is supervised by a task of
    that scope; leaving it (normally, on error or on cancellation) stops every child:
    SIGTERM, ``grace`` seconds, then SIGKILL to its process group, then up to
    ``kill_timeout`` seconds for the kernel to reap it. Enter it *outside* the actor
    system whose :class:`~actors.autoscaler.Autoscaler` drives it (or stop the
    autoscaler first): the autoscaler then scales its blocks in while the provider still
    runs, and ``start_block`` on a provider that is closing raises ``RuntimeError``.

    Block states: PENDING for ``provision_delay`` seconds first, if set (a stand-in for
    a batch queue's wait, for demos and tests of provisioning); RUNNING while any of its
    processes runs; COMPLETED when all exited
    with 0; FAILED when one could not start, exited non-zero or was killed by a signal
    while the block was not being stopped; OOM instead of FAILED when that first failure
    was a SIGKILL while the memory cgroup of the process counted a kill by the kernel's
    OOM killer (``oom_kill`` in ``memory.events``, or cgroup v1's ``memory.oom_control``,
    went up while it lived; the count is the cgroup's, so another process of it killed
    by the OOM killer meanwhile, one of its task processes say, counts as well);
    SCALED_IN when stopped on purpose.
    ``block.detail`` says who exited how.

    One worker's failure stops its block-mates (SIGTERM, then SIGKILL after the
    grace), so a half-dead block is never counted as live: the block ends FAILED (or
    OOM) and the autoscaler replaces it whole. Output of each child goes, line by
    line, to
    the ``corral`` logger (stdout at INFO, stderr at WARNING, with ``child=<worker id>``)
    or, with ``log_dir``, to ``<log_dir>/<worker id>.stdout`` and ``.stderr``.
    ``pool``: the pool whose blocks these are (the manager gives each configured local
    pool its provider); its own log lines (``block pending``, ``block started``,
    ``block ended``, ...) then name a block ``<pool>/block-<n>``, as the autoscaler's do.
    ``accelerators``: device ids (``["0", "1"]``) each of which is given to one worker
    process at a time, pinned with :func:`~actors.providers.accelerator_env` in its
    environment; a worker that has exited frees its device for the next block's. A
    block started while too few are free waits, pending, until its workers' exits free
    enough (a pool's replacement of a drained block whose worker still runs its tasks).
    """

    def __init__(
        self,
        argv_for: Callable[[str, int], Sequence[str]],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        prefix: str = "worker",
        grace: float = 5.0,
        kill_timeout: float = 5.0,
        drain: float = 1.0,
        pdeathsig: int | None = signal.SIGTERM,
        log_dir: str | os.PathLike[str] | None = None,
        provision_delay: float = 0.0,
        pool: str = "",
        accelerators: Sequence[str] = (),
    ) -> None:
        if not provision_delay >= 0:
            raise ValueError(f"provision_delay must be >= 0 seconds, got {provision_delay!r}")
        self.argv_for = argv_for
        #: seconds a block stays PENDING before its processes start (a batch queue's wait)
        self.provision_delay = provision_delay
        self.env = dict(env or {})
        self.cwd = cwd
        self.prefix = prefix
        self.grace = grace  #: seconds between SIGTERM and SIGKILL
        self.kill_timeout = kill_timeout  #: seconds to wait for a SIGKILLed child
        self.drain = drain  #: seconds to read a child's output after it exited
        self.pdeathsig = pdeathsig  #: signal when this process dies (None: lifeline only)
        self.log_dir = None if log_dir is None else Path(log_dir)
        self.blocks: dict[str, Block] = {}  #: every block started, by id
        self.blocks_started = 0  #: how many start_block calls returned a block
        self._records: dict[str, _Record] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._closing = False
        self._started_changed = anyio.Event()
        #: the pool these blocks are of, if one: log lines name a block as the
        #: autoscaler does, ``<pool>/block-<n>`` (else ``block-<n>``)
        self.pool = pool
        self.accelerators = tuple(accelerators)  #: the devices its workers are pinned to
        self._pinned: dict[str, str] = {}  #: device -> the worker process holding it
        #: what the blocks waiting for accelerators wait on: set (and dropped) when one
        #: is freed
        self._freed: anyio.Event | None = None
        self._log = get_logger("corral", component="local-processes")

    # -- lifetime ------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._tg is not None:
            raise RuntimeError("this LocalProcessProvider is already running")
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        self._closing = False
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tg = self._tg
        assert tg is not None
        self._closing = True
        try:
            with anyio.CancelScope(shield=True):
                async with anyio.create_task_group() as stoppers:
                    for rec in self._records.values():
                        if not rec.ended.is_set():
                            rec.stopping = True
                            stoppers.start_soon(self._terminate, rec)
                for rec in self._records.values():  # what could not be reaped: let go
                    for child in rec.children:
                        child.scope.cancel()
            tg.cancel_scope.cancel()
            # Every task of the group has ended or been cancelled; the body's exception,
            # if any, propagates unchanged (not wrapped in an exception group).
            await tg.__aexit__(None, None, None)
        finally:
            self._tg = None

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Provide until cancelled (``await tg.start(provider.run)``), then stop every child."""
        async with self:
            task_status.started()
            await anyio.sleep_forever()

    # -- Provider ------------------------------------------------------------------------

    async def start_block(self, spec: BlockSpec) -> Block:
        """Start ``spec.workers`` processes; return the block, RUNNING.

        If a process cannot be started (e.g. the program does not exist), the processes
        already started for the block are stopped and the block is returned FAILED with
        the reason in ``detail``: a failure to start is a block state, not an exception.
        Exceptions from ``argv_for`` propagate.

        With a ``provision_delay``, the block is returned PENDING at once (its worker ids
        known) and its processes start that many seconds later, in the provider's task
        group, as a batch system's job would; stopping it meanwhile starts none.
        """
        tg = self._tg
        if tg is None or self._closing:
            raise RuntimeError("LocalProcessProvider is not running; use `async with` or run()")
        if spec.workers < 1:
            raise ValueError(f"a block needs at least one worker, got {spec.workers}")
        n = len(self._records) + 1
        block = Block(f"block-{n}", spec, BlockState.PENDING, [])
        rec = _Record(block)
        self.blocks[block.block_id] = block
        self._records[block.block_id] = rec
        if self.provision_delay > 0 or not self._devices_free(spec.workers):
            block.workers.extend(self._worker_id(n, i, spec.workers) for i in range(spec.workers))
            rec.waiting = anyio.CancelScope()
            tg.start_soon(self._provision, rec, n)
            self._log.info(
                "block pending", block=self._logged(block), delay=self.provision_delay,
                **({} if self._devices_free(spec.workers) else {"waits_for": "accelerators"}),
            )  # fmt: skip
        else:
            await self._launch(rec, n)
        self.blocks_started += 1
        changed, self._started_changed = self._started_changed, anyio.Event()
        changed.set()
        return block

    def _logged(self, block: Block) -> str:
        """The block's id in log lines: the autoscaler's (``<pool>/block-<n>``)."""
        return f"{self.pool}/{block.block_id}" if self.pool else block.block_id

    def _worker_id(self, n: int, i: int, workers: int) -> str:
        return f"{self.prefix}-{n}" if workers == 1 else f"{self.prefix}-{n}.{i}"

    async def _provision(self, rec: _Record, n: int) -> None:
        """A pending block: wait ``provision_delay``, then until as many accelerators as
        it has workers are free (unless stopped meanwhile), then start its processes."""
        assert rec.waiting is not None
        try:
            with rec.waiting:
                await anyio.sleep(self.provision_delay)
                while not self._devices_free(rec.block.spec.workers):
                    if self._freed is None:
                        self._freed = anyio.Event()
                    await self._freed.wait()
        except BaseException:  # cancelled outright (the provider's group, as it closes)
            rec.stopping = True
            raise
        finally:
            rec.waiting = None
            if rec.stopping or self._closing:  # it ends, never started
                rec.starting = False
                self._finish_if_done(rec)
        if not (rec.stopping or self._closing):
            await self._launch(rec, n)

    async def _launch(self, rec: _Record, n: int) -> None:
        """Spawn the block's processes; RUNNING, or FAILED if one could not start."""
        tg = self._tg
        assert tg is not None
        block, spec = rec.block, rec.block.spec
        # Every worker's device taken now, before the first spawn's await: a block
        # waiting for devices (_provision) that looks meanwhile sees them held, not
        # free, and waits on rather than take some and fail ("no free accelerator").
        devices = [self._pin(self._worker_id(n, i, spec.workers)) for i in range(spec.workers)]
        try:
            for i in range(spec.workers):
                if rec.stopping or self._closing:  # stopped while it started: no more
                    break
                wid = self._worker_id(n, i, spec.workers)
                argv = list(self.argv_for(block.block_id, i))
                device = devices[i]
                try:
                    if device is None:
                        raise OSError(
                            f"no free accelerator: all {len(self.accelerators)} "
                            f"({', '.join(self.accelerators)}) are held by running workers"
                        )
                    pin = accelerator_env(device) if device else {}
                    process = await self._spawn(wid, block.block_id, argv, pin)
                except OSError as exc:
                    rec.failure = f"{wid} could not start {argv!r}: {exc}"
                    rec.failed_worker = wid
                    self._log.error("worker process could not start", worker=wid, error=str(exc))
                    break
                child = _Child(wid, process, oom_events=_oom_events(process.pid))
                child.accelerator, devices[i] = device, ""  # freed as it exits
                rec.children.append(child)
                rec.live += 1
                if wid not in block.workers:
                    block.workers.append(wid)
                tg.start_soon(self._supervise, rec, child)
        except BaseException:  # cancelled (or argv_for raised) half-way: undo
            rec.starting = False
            with anyio.CancelScope(shield=True):
                rec.failure = rec.failure or "start_block was interrupted"
                rec.stopped_rest = True
                await self._terminate(rec)
            raise
        finally:
            for device in devices:  # those of workers it never started
                self._unpin(device)
        rec.starting = False
        if rec.failure or rec.stopping:  # one could not start, one failed already, or
            rec.stopped_rest = True  # the block was stopped meanwhile: stop the others
            await self._terminate(rec)
        else:
            block.state = BlockState.RUNNING
            self._log.info(
                "block started",
                block=self._logged(block),
                pids={c.worker_id: c.process.pid for c in rec.children},
            )
            self._finish_if_done(rec)  # they may all have exited (with 0) already

    async def stop_block(self, block: Block) -> None:
        """Stop the block's processes (SIGTERM, ``grace``, SIGKILL); SCALED_IN.

        Returns once they have exited (or ``kill_timeout`` after the SIGKILL; that is
        logged as an error). A block that had already ended keeps the state it ended in.
        """
        rec = self._record(block)
        if rec.ended.is_set():
            return
        rec.stopping = True
        await self._terminate(rec)
        if not rec.ended.is_set():
            block.state = BlockState.SCALED_IN
            block.detail = "stopped, but some processes were not reaped after SIGKILL"

    def poll(self, block: Block) -> BlockState:
        """The block's current state (the provider updates ``block`` as it changes)."""
        self._record(block)
        return block.state

    async def wait_ended(self, block: Block) -> BlockState:
        """Return the block's terminal state once it has one."""
        rec = self._record(block)
        await rec.ended.wait()
        return block.state

    # -- extras --------------------------------------------------------------------------

    def pids(self, block: Block) -> dict[str, int]:
        """Worker id -> process id for each process of ``block`` (also the exited)."""
        return {c.worker_id: c.process.pid for c in self._record(block).children}

    async def wait_blocks_started(self, count: int) -> None:
        """Return once :attr:`blocks_started` has reached ``count``."""
        while self.blocks_started < count:
            await self._started_changed.wait()

    # -- internals -----------------------------------------------------------------------

    def _record(self, block: Block) -> _Record:
        rec = self._records.get(block.block_id)
        if rec is None or rec.block is not block:
            raise ValueError(f"block {block.block_id!r} does not come from this provider")
        return rec

    def _devices_free(self, workers: int) -> bool:
        """Whether ``workers`` worker processes may each be pinned to a free accelerator
        now (always, without accelerators). A block that may not waits, pending, until
        enough are freed (:meth:`_provision`): a pool's replacement of a drained block
        whose worker still finishes its tasks on its device comes up once it exits,
        where it failed at once, and so did each next one, until the pool gave up."""
        return not self.accelerators or len(self.accelerators) - len(self._pinned) >= workers

    def _unpin(self, device: str | None) -> None:
        """``device`` (if any) is free again: the blocks waiting for devices look."""
        if device and self._pinned.pop(device, None) is not None and self._freed is not None:
            self._freed.set()
            self._freed = None

    def _pin(self, wid: str) -> str | None:
        """The first accelerator no running worker holds, now held by ``wid`` ("" without
        accelerators; None when all are held)."""
        if not self.accelerators:
            return ""
        device = next((d for d in self.accelerators if d not in self._pinned), None)
        if device is not None:
            self._pinned[device] = wid
        return device

    async def _spawn(
        self, wid: str, block_id: str, argv: list[str], pin: Mapping[str, str]
    ) -> ChildProcess:
        env = dict(os.environ)
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self.env)
        env.update(pin)
        env["CORRAL_WORKER_ID"] = wid
        env["CORRAL_BLOCK_ID"] = block_id
        if self.log_dir is None:  # relayed into our log: a Corral child writes JSON lines
            env.setdefault(JSON_LINES_ENV, "1")
            return await spawn_child(argv, env=env, cwd=self.cwd, pdeathsig=self.pdeathsig)
        out, err = _open_output_files(self.log_dir, wid)
        with out, err:  # the child has its own copies; ours close once it is started
            return await spawn_child(
                argv, env=env, cwd=self.cwd, stdout=out, stderr=err, pdeathsig=self.pdeathsig
            )

    async def _supervise(self, rec: _Record, child: _Child) -> None:
        """Forward the child's output until it exits, then record how it ended.

        Runs in a shielded scope: cancelling whoever entered the provider must not stop
        the supervision before ``__aexit__`` has stopped the child; ``__aexit__`` cancels
        ``child.scope`` itself once that is done.
        """
        process = child.process
        try:
            with child.scope:
                async with anyio.create_task_group() as forwarders:
                    for name, stream, level in (
                        ("stdout", process.stdout, logging.INFO),
                        ("stderr", process.stderr, logging.WARNING),
                    ):
                        if stream is not None:
                            forwarders.start_soon(
                                self._forward, child.worker_id, name, stream, level
                            )
                    await process.wait()
                    # Whatever the child left behind may hold the pipes open: stop it, and
                    # read what is already buffered for at most `drain` seconds.
                    left = await anyio.to_thread.run_sync(process.kill_leftovers, True)
                    if left:
                        self._log.warning(
                            "killed processes the worker left in its session",
                            child=child.worker_id,
                            processes=left,
                        )
                    forwarders.cancel_scope.deadline = anyio.current_time() + self.drain
        finally:
            process.release()  # exited by now, unless supervision was abandoned
            self._child_ended(rec, child)

    async def _forward(
        self, wid: str, name: str, stream: anyio.abc.ByteReceiveStream, level: int
    ) -> None:
        """Log ``stream`` line by line (a last unterminated line included)."""
        pending = b""
        try:
            while True:
                try:
                    chunk = await stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    self._emit(wid, name, level, line)
                while len(pending) > _MAX_LINE:
                    self._emit(wid, name, level, pending[:_MAX_LINE])
                    pending = pending[_MAX_LINE:]
        finally:
            if pending:
                self._emit(wid, name, level, pending)

    def _emit(self, wid: str, name: str, level: int, line: bytes) -> None:
        """Log one line of a child's ``name`` stream at ``level``; a Corral child's
        record (:data:`~runtime.log.JSON_LINES_ENV`) at its own level, with its event
        and fields."""
        text = line.decode("utf-8", errors="replace").rstrip("\r")
        record = relayed(text)
        if record is None:
            self._log.log(level, text, child=wid, stream=name)
        else:
            number, event, fields = record
            self._log.log(number, event, **{**fields, "child": wid, "stream": name})

    def _child_ended(self, rec: _Record, child: _Child) -> None:
        process = child.process
        rc = process.returncode
        if rc is None:
            child.outcome = "not reaped (supervision abandoned)"
        else:
            child.outcome = describe_exit(rc)
            if process.killed_after is not None and rc == -signal.SIGKILL:
                child.outcome += f" after ignoring SIGTERM for {process.killed_after:g} s"
            elif rc == -signal.SIGKILL and child.oom_events is not None:
                path, before = child.oom_events
                after = _oom_kills(path)
                if after is not None and after > before:
                    child.oom = True
                    child.outcome += (
                        f" (the OOM killer: oom_kill in {path} went {before} -> {after})"
                    )
        rec.live -= 1
        if rc is not None and child.accelerator:  # exited: its device is free again
            self._unpin(child.accelerator)
        failed = rc != 0
        if failed and not rec.stopping and not rec.failure:
            rec.failure = f"{child.worker_id} failed: {child.outcome}"
            rec.failed_worker = child.worker_id
            self._log.warning(
                "worker process failed",
                block=self._logged(rec.block),
                child=child.worker_id,
                outcome=child.outcome,
            )
            # The rest of the block goes too, so the autoscaler replaces it whole: a
            # block that ran on short of a worker was counted at full size and not
            # replaced (kept idle-less, at min_blocks never) while it ran short.
            if rec.live:  # (with the provider stopping, it stops them itself)
                rec.stopped_rest = True
                if self._tg is not None:
                    self._tg.start_soon(self._terminate, rec)
        self._finish_if_done(rec)

    def _finish_if_done(self, rec: _Record) -> None:
        """Give the block its terminal state once none of its processes is left."""
        if rec.live or rec.starting or rec.ended.is_set():
            return
        block = rec.block
        outcomes = ", ".join(f"{c.worker_id} {c.outcome}" for c in rec.children)
        if rec.failure:
            failed = [c for c in rec.children if c.worker_id == rec.failed_worker]
            oom = bool(failed) and failed[0].oom
            block.state = BlockState.OOM if oom else BlockState.FAILED
            others = [c for c in rec.children if c.worker_id != rec.failed_worker]
            rest = ", ".join(f"{c.worker_id} {c.outcome}" for c in others)
            how = "stopped the rest of the block" if rec.stopped_rest else "the rest had ended"
            block.detail = rec.failure + (f"; {how}: {rest}" if rest else "")
        elif rec.stopping:
            block.state = BlockState.SCALED_IN
            block.detail = f"stopped: {outcomes}"
        else:
            block.state = BlockState.COMPLETED
            block.detail = f"completed: {outcomes}"
        self._log.info(
            "block ended", block=self._logged(block), state=block.state.value, detail=block.detail
        )
        rec.ended.set()

    async def _terminate(self, rec: _Record) -> None:
        """Stop every running process of ``rec`` at once; wait (bounded) for the block."""
        if rec.waiting is not None:  # pending: start none (_provision ends the block)
            rec.waiting.cancel()
        self._finish_if_done(rec)
        if rec.ended.is_set():
            return
        running = [c.process for c in rec.children if c.process.returncode is None]
        if running:
            async with anyio.create_task_group() as tg:
                for process in running:
                    tg.start_soon(self._stop_process, process)
        with anyio.move_on_after(self.drain + 1.0):
            await rec.ended.wait()  # the supervisors finish reading output and record it
        if not rec.ended.is_set():
            self._log.error(
                "block processes did not end after SIGKILL",
                block=self._logged(rec.block),
                pids=[p.pid for p in running if p.returncode is None],
            )

    async def _stop_process(self, process: ChildProcess) -> None:
        with anyio.move_on_after(self.grace + self.kill_timeout):
            await process.stop(self.grace)
