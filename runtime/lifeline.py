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

This module is part of the base layer: it imports only the standard library.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
from collections.abc import Callable

__all__ = [
    "LIFELINE_EXIT_CODE",
    "ORPHANED_EXIT_CODE",
    "die_with_parent",
    "die_with_parent_preexec",
]

LIFELINE_EXIT_CODE = 75
"""Exit code of a child whose lifeline broke (``EX_TEMPFAIL``: the parent is gone)."""

ORPHANED_EXIT_CODE = 74
"""Exit code of a child whose parent died before PDEATHSIG was set (never seen by it)."""

_PR_SET_PDEATHSIG = 1


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
