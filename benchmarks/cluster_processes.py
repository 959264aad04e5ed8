"""A manager process and worker processes on 127.0.0.1 for the benchmarks that run
Corral as processes (``transfer.py``, ``disk_recovery.py``): started, waited for until
each worker joined, and stopped (SIGTERM, then SIGKILL) however the benchmark ends.

The benchmarks import it by name (``from cluster_processes import manager_and_workers``):
``benchmarks/`` is on the path when they run as scripts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import runtime

#: the tree whose ``runtime`` this process imported (PYTHONPATH's, or the checkout's):
#: the processes import the same one. They run in it: ``python -m`` puts its working
#: directory first on the path, ahead of PYTHONPATH, so started from inside a checkout
#: they would import that checkout's ``runtime`` whatever PYTHONPATH says.
TREE = str(Path(runtime.__file__).resolve().parents[1])


@contextmanager
def manager_and_workers(
    home: str,
    workers: Sequence[Sequence[str]],
    manager: Sequence[str] = (),
    log: str | None = None,
) -> Iterator[tuple[str, list[subprocess.Popen[str]]]]:
    """``python -m runtime manager --listen 127.0.0.1:0 MANAGER...`` and one ``python -m
    runtime worker ADDRESS ARGS...`` per entry of ``workers``, with ``CORRAL_HOME`` at
    ``home``; yields the manager's address and the workers' ``Popen`` once each has
    joined. With ``log``, the manager's output is written there. All are stopped on
    the way out."""
    env = dict(os.environ, CORRAL_HOME=home, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (TREE, env.get("PYTHONPATH")) if p)

    def start(*args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "runtime", *args], env=env, text=True, cwd=TREE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def wait_for(proc: subprocess.Popen[str], needle: str, to: str | None = None) -> str:
        """The line of ``proc``'s output with ``needle``; the rest goes to ``to``
        (None: nowhere), read by a thread so that the process never blocks on it."""
        assert proc.stdout is not None
        out = proc.stdout

        def copy() -> None:
            with open(to or os.devnull, "w") as f:
                for line in out:
                    f.write(line)

        for line in out:
            if needle in line:
                threading.Thread(target=copy, daemon=True).start()
                return line
        raise RuntimeError(f"process ended before printing {needle!r}")

    procs = [start("manager", "--listen", "127.0.0.1:0", *manager)]
    try:
        line = wait_for(procs[0], "manager listening on", log)
        address = line.split("listening on", 1)[1].strip()
        joined = [start("worker", address, *args) for args in workers]
        procs += joined
        for w in joined:
            wait_for(w, "joined")
        yield address, joined
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
