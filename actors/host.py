"""What a process can tell of its machine at no cost: :func:`host_cpus`.

Apart from actors/worker.py (which re-exports it) so that the command line can name the
CPUs in its help without importing the worker (dask, the executor: about a second
under load), which ``report --list`` and ``version`` do not need.
"""

from __future__ import annotations

import os

__all__ = ["host_cpus"]


def host_cpus() -> int:
    """The CPUs this process may run on (its affinity; else the machine's count; 0:
    unknown), which the ``cores`` of a machine's workers are checked against
    (``WorkerInfo.host_cpus``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on this system (macOS)
        return os.cpu_count() or 0
