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
``disk_per_worker`` (docs/files.md).

Workers that took the free-space default (no ``--disk``, ``WorkerInfo.disk_auto``:
worker processes started by hand, a Slurm pool's without ``disk_per_worker``) do not
each keep all of it: :class:`DiskShares`, kept by the scheduler core
(``SchedulerState.disk_shares``), divides their file system among them as they join and
leave, and their share is the disk budget the core places within (``WorkerState.disk``).
A worker given a ``--disk`` keeps it. Pure.
"""

from __future__ import annotations

import dataclasses

from actors.host_memory import claims_and_share
from actors.scheduler_events import DiskShared, HostOvercommitted
from runtime.errors import size_text
from runtime.messages import WorkerInfo

__all__ = [
    "DISK_MARGIN", "DiskShares", "disk_claim", "disk_key", "disk_margin", "disk_shared_text",
    "free_share", "shared_disk_text",
]  # fmt: skip

#: the most of its file system's free space a worker leaves unused when it measures
#: its disk (no ``--disk``): a tenth of the free space, at most this
DISK_MARGIN = 2**30


def disk_margin(free: int) -> int:
    """What a worker measuring ``free`` bytes of free space leaves unused: a tenth of
    it, at most ``DISK_MARGIN``."""
    return min(DISK_MARGIN, free // 10)


def free_share(free: int, workers: int = 1) -> int:
    """One of ``workers`` workers' even share (bytes, at least 1) of ``free`` bytes of
    free space less the margin: the disk a worker without ``--disk`` offers (with
    ``--disk-share N``, one of N)."""
    return max(1, (free - disk_margin(free)) // max(1, workers))


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


def disk_shared_text(cmd: DiskShared) -> str:
    """What the manager logs of ``cmd``: each worker's share and how it was made."""
    host, _, device = cmd.filesystem.partition(_SEP)
    names = ", ".join(f"{w} ({size_text(share)})" for w, share in cmd.shares)
    given = f", less {size_text(cmd.explicit)} given by --disk" if cmd.explicit else ""
    return (
        f"host {host}: the workers without --disk (disk_per_worker) that keep their "
        f"outputs on one file system (device {device}) share it: {names}: "
        f"{size_text(cmd.budget)}{given}, over {cmd.processes} worker processes. "
        f"A share limits what is placed there next, not what is stored: outputs beyond "
        f"it stay until they are released"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Member:
    """A worker on a file system: its own disk budget (``--disk``, or the free space
    less a margin it measured at start), whether that is the default, its process (0:
    not told) and that file system's free bytes when it joined."""

    disk: int
    auto: bool
    process: int
    fs_free: int


class DiskShares:
    """The workers on each file system and the disk share of those that took the
    free-space default.

    Their shares: ``budget``, the largest default budget among them (the free space
    one measured at start, less its margin: the file system when it was emptiest of
    them), less ``explicit``, the budgets of the workers on it given a ``--disk`` (at
    most its free space each; workers of one process once, with the largest; ``--disk
    off`` counts nothing), divided evenly over the processes of the default workers
    (in-process workers of one ``Cluster`` count as one, as their memory and the
    warning count them: each of them gets that process's share); each worker's share
    at most its own budget (the worker itself refuses writes past that) and at least 1
    byte (0 would mean no limit). A worker joining shrinks the others' shares, one
    leaving grows them: outputs a worker already stores beyond its new share stay
    (placement sends it nothing more until it is below). Pure: workers' joins and
    leaves in, shares out.
    """

    def __init__(self) -> None:
        self.members: dict[str, dict[str, _Member]] = {}  #: file system -> worker -> it
        self.where: dict[str, str] = {}  #: worker -> its file system
        #: file system -> the shares last said, while one differs from its worker's budget
        self.said: dict[str, tuple[tuple[str, int], ...]] = {}

    def joined(
        self,
        worker: str,
        filesystem: str,
        fs_free: int,
        disk: int,
        auto: bool,
        process: int,
        stimulus: str,
    ) -> list[DiskShared]:
        """``worker`` joined (or joined again) on ``filesystem`` (empty: not told, not
        counted); the shares that changed, on the file system it left and the one it
        joined."""
        out = self.left(worker, stimulus)
        if not filesystem or disk <= 0:  # --disk off counts nothing: places with no limit
            return out
        self.where[worker] = filesystem
        self.members.setdefault(filesystem, {})[worker] = _Member(disk, auto, process, fs_free)
        return out + self._say(filesystem, stimulus)

    def left(self, worker: str, stimulus: str) -> list[DiskShared]:
        filesystem = self.where.pop(worker, None)
        if filesystem is None:
            return []
        on = self.members[filesystem]
        del on[worker]
        if not on:
            del self.members[filesystem]
        return self._say(filesystem, stimulus)

    def shares(self, filesystem: str) -> tuple[int, int, int, tuple[tuple[str, int], ...]]:
        """``(budget, explicit, processes, ((worker, share), ...))`` of
        ``filesystem``'s default workers, in id order (see the class)."""
        on = self.members.get(filesystem, {})
        auto = {w: m for w, m in on.items() if m.auto}
        if not auto:
            return 0, 0, 0, ()
        given: dict[object, int] = {}
        for w, m in on.items():
            if not m.auto:
                key: object = m.process or ("worker", w)
                claim = min(m.disk, m.fs_free) if m.fs_free > 0 else m.disk
                given[key] = max(given.get(key, 0), claim)
        processes = len({m.process or ("worker", w) for w, m in auto.items()})
        # the free space less the margin, as one measured it; a worker that took a
        # share of it (--disk-share: a local pool's) has less of its own
        budget = max(max(m.disk, free_share(m.fs_free)) for m in auto.values())
        explicit = sum(given.values())
        each = max(1, (budget - explicit) // processes)
        shares = tuple((w, max(1, min(m.disk, each))) for w, m in sorted(auto.items()))
        return budget, explicit, processes, shares

    def _say(self, filesystem: str, stimulus: str) -> list[DiskShared]:
        """The shares of ``filesystem`` if they changed since last said: not while each
        default worker keeps its own budget (one alone on it, or one process's) and
        nothing was said before."""
        budget, explicit, processes, shares = self.shares(filesystem)
        on = self.members.get(filesystem, {})
        plain = all(share == on[w].disk for w, share in shares)
        before = self.said.get(filesystem)
        if plain:
            self.said.pop(filesystem, None)
            if before is None or not shares:
                return []
        elif before == shares:
            return []
        else:
            self.said[filesystem] = shares
        return [DiskShared(stimulus, filesystem, budget, explicit, processes, shares)]
