"""Executors: where a worker's tasks run, and the RSS probe read around every task.

What lives here: :class:`Executor` (a thread pool, the default execution mode) and
:func:`rss`. Each executor measures, per task, duration, output size
(``dask.sizeof``) and RSS right before and right after it, and hands finished tasks back
to the event loop in batches through ``deliver``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
from dask.sizeof import sizeof

from actors.scheduler_state import TaskResult, ToRun
from runtime.graph import Key

__all__ = ["Executor", "rss"]

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_PROC = psutil.Process()


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
rss: Callable[[], int] = _rss_statm if sys.platform.startswith("linux") else _rss_psutil


class Executor:
    """``n`` threads running tasks; results come back through ``deliver`` in batches.

    ``deliver(results)`` is called on the event loop thread with every result that
    finished since the previous call.
    """

    def __init__(
        self,
        n: int,
        name: str,
        deliver: Callable[[list[tuple[TaskResult, Any]]], None],
        *,
        batch_delay: float = 0.002,
    ) -> None:
        self.batch_delay = batch_delay
        self._jobs: queue.SimpleQueue[tuple[ToRun, dict[Key, Any]] | None] = queue.SimpleQueue()
        self._deliver = deliver
        self._lock = threading.Lock()
        self._done: list[tuple[TaskResult, Any]] = []
        self._loop = asyncio.get_running_loop()
        self.cancelled: set[Key] = set()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(n)
        ]
        for t in self._threads:
            t.start()

    def submit(self, task: ToRun, inputs: dict[Key, Any]) -> None:
        self._jobs.put((task, inputs))

    def shutdown(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)

    def _run(self) -> None:
        jobs = self._jobs
        while True:
            job = jobs.get()
            done: list[tuple[TaskResult, Any]] = []
            first = time.perf_counter()
            rss_now = rss()
            # Run queued jobs back to back and hand results over together, but never
            # hold a finished result longer than ``batch_delay``: short tasks travel in
            # batches, a long task's result goes back as soon as it is ready. Back to
            # back, the RSS read after one task is the reading before the next.
            while job is not None:
                result, value, rss_now = self._execute(job[0], job[1], rss_now)
                done.append((result, value))
                if time.perf_counter() - first > self.batch_delay:
                    break
                try:
                    job = jobs.get_nowait()
                except queue.Empty:
                    break
            if done:
                self._push(done)
            if job is None:
                return

    def _execute(
        self, task: ToRun, inputs: dict[Key, Any], before: int
    ) -> tuple[TaskResult, Any, int]:
        """Run one task; measure its duration, output size and RSS right after it."""
        if task.key in self.cancelled:
            return TaskResult(task.key, "cancelled"), None, before
        start = time.time()
        try:
            value = task.node(inputs)
        except BaseException as exc:
            stop = time.time()
            after = rss()
            return (
                TaskResult(task.key, "error", start, stop, 0, after, exc, rss_before=before),
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

    def _push(self, results: list[tuple[TaskResult, Any]]) -> None:
        with self._lock:
            first = not self._done
            self._done.extend(results)
        if first:
            with contextlib.suppress(RuntimeError):  # loop closed: the worker is gone
                self._loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        with self._lock:
            done, self._done = self._done, []
        self._deliver(done)
