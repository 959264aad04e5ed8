"""What a process can tell of its machine at no cost: :func:`host_cpus`, and
:func:`memory_limit`, the memory a worker without ``--memory`` may take.

Apart from actors/worker.py (which re-exports :func:`host_cpus`) so that the command
line can name the CPUs in its help without importing the worker (dask, the executor:
about a second under load), which ``report --list`` and ``version`` do not need.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from runtime.errors import size_text

__all__ = ["CGROUP_ROOT", "MemoryLimit", "cgroup_memory_limit", "host_cpus", "memory_limit"]

#: where the cgroup file systems are mounted (a test points it at fake files)
CGROUP_ROOT = "/sys/fs/cgroup"
#: the file naming this process's cgroups
SELF_CGROUP = "/proc/self/cgroup"
#: a cgroup memory limit at or above this is none (cgroup v1 writes "no limit" as
#: 2**63 less a page; v2 as "max")
NO_LIMIT = 2**60


def host_cpus() -> int:
    """The CPUs this process may run on (its affinity; else the machine's count; 0:
    unknown), which the ``cores`` of a machine's workers are checked against
    (``WorkerInfo.host_cpus``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on this system (macOS)
        return os.cpu_count() or 0


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryLimit:
    """A worker's default memory limit: ``total`` bytes (the least of what this
    process may have), from ``source`` (words), shared by ``share`` workers."""

    total: int
    source: str
    share: int = 1

    @property
    def limit(self) -> int:
        """Each worker's: ``total`` over ``share``."""
        return self.total // max(1, self.share)

    def text(self) -> str:
        """What a worker says of it as it starts."""
        shared = self.share > 1
        over = f", over the {self.share} workers sharing it (--memory-share {self.share})"
        return f"{size_text(self.limit)}: {self.source}{over if shared else ''}"


def cgroup_memory_limit(
    root: str | os.PathLike[str] | None = None, self_cgroup: str | os.PathLike[str] | None = None
) -> tuple[int, str]:
    """The memory limit of this process's cgroup (bytes; 0: none) and the file it was
    read from: the smallest of its cgroup's and its ancestors' up to the mount's root
    (cgroup v2's ``memory.max``, v1's ``memory.limit_in_bytes``; "max" and huge values
    are none). ``root``: where the cgroup file systems are mounted (default
    :data:`CGROUP_ROOT`); ``self_cgroup``: the file naming this process's cgroups
    (default ``/proc/self/cgroup``). A cgroup path not under the mount (a container
    that sees only its own cgroup at the mount's root) is read from what exists of it,
    the mount's root at least. Nothing readable: ``(0, "")``."""
    mount = Path(CGROUP_ROOT if root is None else root)
    try:
        text = Path(SELF_CGROUP if self_cgroup is None else self_cgroup).read_text()
    except OSError:
        return 0, ""
    found: list[tuple[int, str]] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:  # v2: the unified hierarchy
            base = next(
                (m for m in (mount, mount / "unified") if (m / "cgroup.controllers").exists()),
                mount,
            )
            name = "memory.max"
        elif "memory" in controllers.split(","):  # v1: the memory controller's own
            base, name = mount / "memory", "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):
            where = base.joinpath(*parts[:depth], name)
            try:
                value = where.read_text().strip()
            except OSError:
                continue
            if value.isdigit() and 0 < int(value) < NO_LIMIT:
                found.append((int(value), str(where)))
    return min(found) if found else (0, "")


def slurm_memory(environ: Mapping[str, str]) -> tuple[int, str]:
    """The memory (bytes; 0: not said) a Slurm job has on this node, from its
    environment: ``SLURM_MEM_PER_NODE`` (MiB), else ``SLURM_MEM_PER_CPU`` (MiB) times
    ``SLURM_CPUS_ON_NODE``; and the words saying so."""
    per_node = environ.get("SLURM_MEM_PER_NODE", "").strip()
    if per_node.isdigit() and int(per_node):
        return int(per_node) * 2**20, f"SLURM_MEM_PER_NODE={per_node} MiB"
    per_cpu = environ.get("SLURM_MEM_PER_CPU", "").strip()
    cpus = environ.get("SLURM_CPUS_ON_NODE", "").strip()
    if per_cpu.isdigit() and int(per_cpu) and cpus.isdigit() and int(cpus):
        text = f"SLURM_MEM_PER_CPU={per_cpu} MiB x SLURM_CPUS_ON_NODE={cpus}"
        return int(per_cpu) * int(cpus) * 2**20, text
    return 0, ""


def memory_limit(
    share: int = 1,
    *,
    machine: int | None = None,
    environ: Mapping[str, str] | None = None,
    cgroup_root: str | os.PathLike[str] | None = None,
    self_cgroup: str | os.PathLike[str] | None = None,
) -> MemoryLimit:
    """The memory limit of a worker given none (``--memory``), one of ``share`` workers
    sharing what this process may have: the smallest of the machine's memory
    (``machine``, default psutil's total), its cgroup's memory limit
    (:func:`cgroup_memory_limit`) and, inside a Slurm job, the job's memory on this node
    (:func:`slurm_memory`, from ``environ``, default ``os.environ``), over ``share``.
    A Slurm pool's workers are ``share`` (``--memory-share``, its ``workers_per_node``)
    of their job on a node, as its cores are divided; a local pool's, of the machine
    (and the manager's cgroup). Without this, a Slurm worker took the node's whole
    memory, and the job's cgroup killed it (``OUT_OF_MEMORY``) before its fences
    acted."""
    if machine is None:
        import psutil

        machine = int(psutil.virtual_memory().total)
    found = [(machine, f"the machine's memory ({size_text(machine)})")]
    cgroup, path = cgroup_memory_limit(cgroup_root, self_cgroup)
    if cgroup:
        found.append((cgroup, f"its cgroup's memory limit ({size_text(cgroup)}, {path})"))
    slurm, said = slurm_memory(os.environ if environ is None else environ)
    if slurm:
        found.append((slurm, f"the Slurm job's memory on this node ({size_text(slurm)}, {said})"))
    # The smallest; of equals the last named: a Slurm job's cgroup holds what Slurm gave.
    total, source = min(reversed(found), key=lambda f: f[0])
    return MemoryLimit(total, source, max(1, share))
