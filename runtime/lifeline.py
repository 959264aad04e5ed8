"""How a child process dies with its parent: the one copy both kinds of children use.

Corral starts two kinds of child processes: worker processes (``spawn_child`` in
``actors/processes.py``, programs that are exec'd) and task processes (the
``ProcessExecutor`` in ``actors/executor.py``, started by ``multiprocessing`` with
``spawn``). Both are tied to their parent the same two ways:

- **PDEATHSIG** (Linux): the child asks the kernel for a signal when the parent *thread*
  that started it ends (:func:`die_with_parent`, or :func:`die_with_parent_preexec` as a
  ``preexec_fn`` between fork and exec), then compares ``getppid()`` with the pid of the
  parent that started it: if the parent died before the request took effect, nobody
  will ever send that signal, so the child exits at once with
  :data:`ORPHANED_EXIT_CODE`.
- **A lifeline**: a pipe whose write end only the parent holds; the child exits with
  :data:`LIFELINE_EXIT_CODE` when it reads end-of-file. Each kind of child reads its
  lifeline its own way (an anyio task in a worker process, a thread in a task process).

Neither reaches the programs a worker's tasks started: they are the worker's
grandchildren (its task processes' children, in ``execution = "process"``) or children of
it that PDEATHSIG was never asked for (``execution = "thread"``), and a worker killed
outright (SIGKILL, the OOM killer) leaves them running, re-parented to ``init``. What
does reach them is the **session**: a worker Corral starts (``spawn_child``) leads a
session of its own, and a session cannot be joined from outside, only left
(``setsid``). Its task processes stay in it (:func:`own_process_group`: a process group
of their own, which the worker kills to stop one, in its session), as do the programs
their tasks, or its threads, start. Once the worker has exited, its parent kills every
process still in that session (:func:`kill_session`): what the worker started and left,
however it ended. Linux only (it reads ``/proc``); elsewhere the parent reaches the
worker's own process group alone (its threads' programs), not its task processes'.
A task process also adopts the orphans of what it starts (:func:`adopt_orphans`,
Linux), so a program that double-forked (a daemon) is still its descendant when its
task returns, and killed with the other leftovers; a try stopped (its timeout, a
cancel) has every process under its task process killed before the task process
(``actors.executor.kill_descendants``), so that one too. Not covered anywhere: a
program that made a session of its own (``setsid``, a daemon) once its task process is
gone otherwise (it died by itself, or with a worker killed outright: the daemon goes to
``init``), and a worker no Corral process started
(by hand, or in a batch job: there the batch system's end of the job takes what is
left).

This module is part of the base layer: it imports only the standard library.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import signal
import sys
from collections.abc import Callable

__all__ = [
    "LIFELINE_EXIT_CODE",
    "ORPHANED_EXIT_CODE",
    "adopt_orphans",
    "die_with_parent",
    "die_with_parent_preexec",
    "kill_session",
    "own_process_group",
    "session_members",
]

LIFELINE_EXIT_CODE = 75
"""Exit code of a child whose lifeline broke (``EX_TEMPFAIL``: the parent is gone)."""

ORPHANED_EXIT_CODE = 74
"""Exit code of a child whose parent died before PDEATHSIG was set (never seen by it)."""

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, or None off Linux (resolved in the parent when it is for a
    ``preexec_fn``: never between fork and exec)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


def die_with_parent_preexec(sig: int, parent_pid: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking for ``sig`` when the parent dies, or None off Linux.

    It runs in the child between fork and exec, so it does the bare minimum: no imports,
    no locks, no logging. ``parent_pid`` is the pid of the process that spawns the child
    (``os.getpid()`` there).
    """
    prctl = _prctl()
    if prctl is None:
        return None

    def setup() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl: nobody will tell us
            os._exit(ORPHANED_EXIT_CODE)

    return setup


def die_with_parent(sig: int, parent_pid: int) -> None:
    """In a child, first thing: ask for ``sig`` when the parent dies (Linux), and exit at
    once if the parent (pid ``parent_pid``) is already gone."""
    setup = die_with_parent_preexec(sig, parent_pid)
    if setup is not None:
        setup()
    elif os.getppid() != parent_pid:
        os._exit(ORPHANED_EXIT_CODE)


def own_process_group(parent_pid: int) -> None:
    """In a task process, first thing: lead a process group of its own, which the
    programs its tasks start join, so that its worker (pid ``parent_pid``) can stop them
    with it (``killpg``) and never signals its own group that way.

    In the worker's session when the worker leads one (a worker Corral started: its
    parent then kills what is left in that session once the worker has exited,
    :func:`kill_session`; that session has no terminal). Else (a worker started from a
    shell, whose session has the terminal; or one that leads a session with a terminal,
    a container's first process started with one) a session of its own, as a
    terminal's job-control signals then reach only the worker's group, and a program
    that reads the terminal is not stopped for reading it from a background group.
    """
    with contextlib.suppress(OSError):  # (already a group leader: never, when spawned)
        if os.getsid(0) == parent_pid and not _has_terminal():
            os.setpgid(0, 0)
        else:
            os.setsid()


def adopt_orphans() -> bool:
    """In a task process: become the parent of the orphans of what it starts
    (``PR_SET_CHILD_SUBREAPER``, Linux), so that a program that double-forked (a
    daemon, also one that made a session of its own with ``setsid``) stays under it
    instead of going to ``init``, where its leftover kill at the task's end
    (``actors.executor._kill_leftovers``) would not see it. Whether it took (off
    Linux, or refused: no)."""
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def _has_terminal() -> bool:
    """Whether this process has a controlling terminal (its session has one)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    os.close(fd)
    return True


def _stat(pid: int) -> tuple[bytes, int, int] | None:
    """Process ``pid``'s state letter, session id and start time (clock ticks since
    boot), from /proc/<pid>/stat; None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read()
    except OSError:
        return None
    # Fields after the command name (in parentheses, which may hold anything): state,
    # ppid, pgrp, session, ... the 22nd field of the line, starttime, is the 20th here.
    rest = text[text.rfind(b")") + 2 :].split()
    try:
        return rest[0], int(rest[3]), int(rest[19])
    except (IndexError, ValueError):
        return None


def session_members(sid: int) -> list[tuple[int, int]]:
    """The live processes (zombies left out) of session ``sid``: ``(pid, start time)``
    each, read from /proc; [] off Linux."""
    if not sys.platform.startswith("linux"):
        return []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    found: list[tuple[int, int]] = []
    for name in names:
        if not name.isdigit():
            continue
        stat = _stat(int(name))
        if stat is not None and stat[1] == sid and stat[0] not in (b"Z", b"X"):
            found.append((int(name), stat[2]))
    return found


def _kill_member(pid: int, started: int, sid: int, sig: int) -> None:
    """Send ``sig`` to process ``pid`` if it is still the one that started at
    ``started``, in session ``sid``: through a pidfd where there is one, so that the
    check and the signal are about the same process, never one that took its number."""
    pidfd: int | None = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return
        except OSError:
            pass  # a kernel without pidfds (before 5.3): os.kill after the check
    try:
        stat = _stat(pid)
        if stat is None or stat[1:] != (sid, started):
            return
        with contextlib.suppress(OSError):
            if pidfd is not None:
                signal.pidfd_send_signal(pidfd, sig)
            else:
                os.kill(pid, sig)
    finally:
        if pidfd is not None:
            os.close(pidfd)


def kill_session(sid: int, sig: int = signal.SIGKILL, rounds: int = 8) -> list[int]:
    """Send ``sig`` to every process of session ``sid`` (the session a child that has
    exited led, ``sid`` its pid: :func:`own_process_group`); the pids signalled.

    Call it once the child has exited, soon after it was reaped: a session's id is not
    given to another while the session has a member, and a session cannot be joined
    from outside, so every process found in it was started under that child. Again
    while a pass finds processes it had not signalled (started by one before it was
    signalled), at most ``rounds`` passes. Never this process's own session (nor this
    process). Linux only: [] elsewhere. A live process whose pid is ``sid`` took the
    dead child's number once its session had emptied (a number is not reused while a
    session has it): that session, if it leads one, is not the child's, and nothing
    more is signalled.
    """
    if sid <= 1 or sid == os.getsid(0):
        return []
    me = os.getpid()
    done: set[tuple[int, int]] = set()
    for _ in range(rounds):
        leader = _stat(sid)
        if leader is not None and leader[0] not in (b"Z", b"X"):  # the number reused
            break
        new = [m for m in session_members(sid) if m not in done and m[0] != me]
        if not new:
            break
        for pid, started in new:
            _kill_member(pid, started, sid, sig)
        done.update(new)
    return sorted({pid for pid, _ in done})
