"""Corral's CLI as child processes on this machine: ``python -m runtime manager`` and
``python -m runtime worker`` (or any program) started, their output read all along,
stopped at the end. The one copy the tests (``tests/helpers.py`` re-exports
:class:`Cli`) and the benchmarks that run Corral as processes
(``benchmarks/cluster_processes.py``) share.

The processes import the ``runtime`` this module belongs to (:data:`TREE` is put first
on their ``PYTHONPATH``), whichever tree that is: the checkout, or another one a
comparison put on ``PYTHONPATH``. This module imports nothing of Corral's; it is the
top layer (docs/architecture.md, "Layers"), so no module of the package imports it.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlsplit

__all__ = ["TREE", "Cli"]

#: the tree whose ``runtime`` this is (the directory above the package ``runtime``)
TREE = Path(__file__).resolve().parents[1]


class Cli:
    """Corral processes started through the CLI (``python -m runtime ...``).

    They get a token directory of their own (``home``) and :data:`TREE` first on their
    path (with ``cwd``, they run there: ``python -m`` puts its working directory ahead
    of ``PYTHONPATH``, so started from inside another checkout they would import that
    one's ``runtime``); a thread per process reads its output all along (so a full pipe
    never blocks it) into a queue that :meth:`line_with` reads, and closes the pipe at
    the end of the output. :meth:`stop` ends them all (SIGTERM, then SIGKILL after
    ``grace`` seconds) and waits (bounded) for the readers. As a context manager it
    also points this process's ``CORRAL_HOME`` at ``home`` (clients find the manager's
    token there) and restores it.
    """

    def __init__(
        self, home: Path | str, *, cwd: Path | str | None = None, grace: float = 10
    ) -> None:
        self.home = Path(home)
        self.cwd = cwd
        self.grace = grace  #: seconds :meth:`stop` waits after SIGTERM before SIGKILL
        self.env = dict(os.environ, CORRAL_HOME=str(home), PYTHONUNBUFFERED="1")
        self.env["PYTHONPATH"] = os.pathsep.join([str(TREE), self.env.get("PYTHONPATH", "")])
        self.procs: list[subprocess.Popen[str]] = []
        self._lines: dict[int, queue.Queue[str | None]] = {}
        self._readers: list[threading.Thread] = []
        self._old_home: str | None = None

    def __enter__(self) -> Cli:
        self._old_home = os.environ.get("CORRAL_HOME")
        os.environ["CORRAL_HOME"] = str(self.home)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            if self._old_home is None:
                os.environ.pop("CORRAL_HOME", None)
            else:
                os.environ["CORRAL_HOME"] = self._old_home

    def start(self, *args: str, log: str | None = None) -> subprocess.Popen[str]:
        """``python -m runtime ARGS...``."""
        return self.spawn([sys.executable, "-m", "runtime", *args], log=log)

    def spawn(self, argv: Sequence[str], log: str | None = None) -> subprocess.Popen[str]:
        """``argv`` as a child process; with ``log``, its output is written there too."""
        proc = subprocess.Popen(
            list(argv), env=self.env, text=True, cwd=self.cwd,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.procs.append(proc)
        lines: queue.Queue[str | None] = queue.Queue()
        self._lines[proc.pid] = lines
        sink: IO[str] | None = open(log, "w") if log is not None else None  # noqa: SIM115

        def read() -> None:
            assert proc.stdout is not None
            try:
                with proc.stdout as out:  # closed here, at the end of the output
                    for line in out:
                        lines.put(line)
                        if sink is not None:
                            sink.write(line)
            finally:
                if sink is not None:
                    sink.close()
                lines.put(None)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        self._readers.append(reader)
        return proc

    def line_with(
        self,
        proc: subprocess.Popen[str],
        needle: str,
        limit: float = 30,
        seen: list[str] | None = None,
    ) -> str:
        """The next line of ``proc``'s output that contains ``needle`` (bounded); the
        lines read on the way are added to ``seen``, if given."""
        seen = [] if seen is None else seen
        for line in self._lines_of(proc, limit, f"no {needle!r} within {limit} s", seen):
            if needle in line:
                return line
        raise AssertionError(f"process ended before printing {needle!r}: {seen[-20:]}")

    def rest(self, proc: subprocess.Popen[str], limit: float = 10) -> list[str]:
        """The lines of ``proc``'s output not read yet, up to its end (it has ended, or
        ends within ``limit`` seconds)."""
        out: list[str] = []
        for _ in self._lines_of(proc, limit, f"output not ended within {limit} s", out):
            pass
        return out

    def _lines_of(
        self, proc: subprocess.Popen[str], limit: float, late: str, seen: list[str]
    ) -> Iterator[str]:
        """``proc``'s next lines as they come, each also put in ``seen``, up to the end
        of its output; ``AssertionError(late)`` when none comes within ``limit`` s."""
        lines = self._lines[proc.pid]
        deadline = time.monotonic() + limit
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"{late}: {seen[-20:]}") from None
            if line is None:
                lines.put(None)
                return
            seen.append(line)
            yield line

    def manager(
        self, *flags: str, log: str | None = None, port: int = 0
    ) -> tuple[subprocess.Popen[str], str]:
        """A manager on ``port`` of 127.0.0.1 (0: a free one); returns it and its
        address."""
        proc = self.start("manager", "--listen", f"127.0.0.1:{port}", *flags, log=log)
        line = self.line_with(proc, "manager listening on")
        return proc, line.split("manager listening on", 1)[1].strip()

    def worker(self, address: str, *flags: str) -> subprocess.Popen[str]:
        """A worker joined to the manager at ``address``."""
        proc = self.start("worker", address, *flags)
        self.line_with(proc, "joined")
        return proc

    def tokens(self, address: str) -> dict[str, str]:
        """The manager's token file: ``{"admin": ..., "read": ...}``."""
        parts = urlsplit(address)
        path = self.home / "tokens" / f"{parts.hostname}_{parts.port}.json"
        data: dict[str, str] = json.loads(path.read_text())
        return data

    def stop(self, procs: Iterable[subprocess.Popen[str]] | None = None) -> None:
        """End ``procs`` (default: all), gracefully first."""
        stop_processes(self.procs if procs is None else procs, self.grace)
        if procs is None:
            for r in self._readers:
                r.join(5)  # each closes its pipe at the end of the output


def stop_processes(procs: Iterable[subprocess.Popen[Any]], grace: float = 10.0) -> None:
    """End ``procs`` in order, gracefully first: SIGTERM to each still running (after a
    SIGCONT: a stopped process cannot take it), then up to ``grace`` seconds each for
    it to end, and SIGKILL for what is left."""
    chosen = list(procs)
    for p in chosen:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
    for p in chosen:
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)
