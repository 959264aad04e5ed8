"""A manager process and worker processes on 127.0.0.1 for the benchmarks that run
Corral as processes (``transfer.py``, ``disk_recovery.py``, ``dataframe.py``,
``restore_takeback.py``): started, waited for until each worker joined, and stopped
(SIGTERM, then SIGKILL) however the benchmark ends, their output pipes closed.

The processes are :class:`runtime.cli_processes.Cli`'s, the tests' own: they import
the ``runtime`` this process imported (PYTHONPATH's, or the checkout's) and run in its
tree (``python -m`` puts its working directory first on the path, ahead of
PYTHONPATH, so started from inside a checkout they would import that checkout's
``runtime`` whatever PYTHONPATH says).

The benchmarks import it by name (``from cluster_processes import manager_and_workers``):
``benchmarks/`` is on the path when they run as scripts.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from runtime.cli_processes import TREE, Cli


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
    joined (each within 30 s). With ``log``, the manager's output is written there. All
    are stopped on the way out (SIGKILL after 15 s)."""
    procs = Cli(home, cwd=TREE, grace=15)
    try:
        _, address = procs.manager(*manager, log=log)
        joined = [procs.start("worker", address, *args) for args in workers]
        for w in joined:  # started together, as Cli.worker would one after the other
            procs.line_with(w, "joined")
        yield address, joined
    finally:
        procs.stop()
