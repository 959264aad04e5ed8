"""Workers sharing a file system: whether their disk budgets, added up, pass the free
space it has (docs/files.md, "Workers sharing a file system").

Each worker counts its disk on its own: its ``--disk`` (by default the free space of
the file system holding its spill directory, less a margin), never more than that file
system has free. Two worker processes whose spill directories are on one file system
each count its whole free space: on a 60 MB tmpfs, two workers report 54 MiB free each
and the scheduler places 108 MB there. The scheduler's shell keeps a
:class:`~actors.host_memory.HostLedger` of its own for this, keyed by
:func:`disk_key` (the host and the ``st_dev`` of the worker's disk directory, as
``WorkerInfo.disk_device`` tells), with each worker's budget as what it claims
(:func:`disk_claim`) and that file system's free space as what there is: it settles
and says a change as it does for memory, and :func:`shared_disk_text` is what the
manager logs and shows. Workers of one process (``Cluster(workers=N)``) count once,
with the largest of their budgets, as for memory: their file system is covered by
``disk_per_worker`` (docs/files.md). Pure.
"""

from __future__ import annotations

from actors.host_memory import claims_and_share
from actors.scheduler_events import HostOvercommitted
from runtime.errors import size_text
from runtime.messages import WorkerInfo

__all__ = ["disk_claim", "disk_key", "shared_disk_text"]

_SEP = " dev "  #: between the host and the device in a key


def disk_key(info: WorkerInfo) -> str:
    """The file system ``info``'s worker keeps its outputs on, as ``host dev N``; ""
    when it did not say (an older worker, or its spill directory cannot be looked at)."""
    if not info.host or not info.disk_device or info.disk_fs_free <= 0:
        return ""
    return f"{info.host}{_SEP}{info.disk_device}"


def disk_claim(info: WorkerInfo) -> int:
    """The bytes of its file system ``info``'s worker counts as its own: its disk
    budget (``--disk``, or the free-space default), at most what that file system had
    free when it joined; all of that free space with ``--disk off`` (it counts none,
    but places as if it had all of it)."""
    if info.disk <= 0:
        return info.disk_fs_free
    return min(info.disk, info.disk_fs_free)


def shared_disk_text(cmd: HostOvercommitted) -> str:
    """What the manager logs and shows of ``cmd`` (a file system's :class:`HostLedger`
    warning: its ``host`` is a :func:`disk_key`, its ``host_memory`` the free space):
    which workers, the sum, the free space and the ``--disk`` that fits."""
    host, _, device = cmd.host.partition(_SEP)
    names, share = claims_and_share(cmd)
    return (
        f"host {host}: {cmd.processes} worker processes keep their outputs on one file "
        f"system (device {device}) and count its free space each: the disk budgets of "
        f"{names} add up to {size_text(cmd.claimed)}, more than the "
        f"{size_text(cmd.host_memory)} it has free, so tasks are placed where there is no "
        f"room and end disk-full. Give each a --disk (disk_per_worker) so that they sum "
        f"to at most its free space: "
        f"--disk {share // 2**20}MiB (its free space / {cmd.processes} worker processes), "
        f"or give each a spill directory (--spill-dir) on a file system of its own"
    )
