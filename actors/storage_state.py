"""Storage over time: what the scheduler core counts of its workers' disks, the outputs
copied between workers and the outputs it recovered (docs/files.md, "Storage over time").

What lives here: :class:`StorageLedger`, kept by the scheduler core
(``SchedulerState.storage``) and fed by it. Pure: times come in as data, nothing here
reads a clock. Each ``transfer`` and ``recovery`` returns the record the core puts on
its monitoring feed (the monitoring database's ``transfers`` and ``recoveries``
tables).

- a **transfer** is an output copied from one worker to another: ``fetch`` (a worker
  fetched a task's input from a peer), ``replica`` (a temporary replica) or
  ``evacuation`` (copied off a worker that was leaving);
- a **recovery** is an output lost with a worker (or missing where it was thought to
  be) that was still needed: ``recomputed`` (its task runs again) or ``replica`` (a
  replica kept it, nothing runs again).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from runtime.graph import Key

__all__ = ["RECOVERY_KINDS", "TRANSFER_KINDS", "StorageLedger"]

#: the workers that left whose counts and peak are kept (``status()`` lists them): the
#: latest to leave; a manager that runs for days sees workers come and go by thousands
DEPARTED_KEPT = 100
TRANSFER_KINDS = ("fetch", "replica", "evacuation", "checkpoint")
RECOVERY_KINDS = ("recomputed", "replica")


class StorageLedger:
    """Counters of transfers and recoveries, per kind and per worker, and each worker's
    highest reported disk use (``disk_peak``: bytes of outputs on disk)."""

    def __init__(self) -> None:
        self.transfers: Counter[str] = Counter()  #: kind -> transfers
        self.transfer_bytes: Counter[str] = Counter()  #: kind -> bytes copied
        self.bytes_in: Counter[str] = Counter()  #: worker -> bytes it received
        self.bytes_out: Counter[str] = Counter()  #: worker -> bytes copied from it
        self.recoveries: Counter[str] = Counter()  #: how -> outputs recovered
        self.lost_by_worker: Counter[str] = Counter()  #: worker -> its outputs recovered
        self.disk_used: dict[str, int] = {}  #: worker -> bytes on disk, latest report
        self.disk_peak: dict[str, int] = {}  #: worker -> most bytes on disk reported
        #: replica copies on their way: (key, receiver) -> (source, sent at)
        self._copies: dict[tuple[Key, str], tuple[str, float]] = {}
        self._leaving: dict[str, float] = {}  #: worker -> when it started leaving
        self._departed: dict[str, None] = {}  #: the workers that left, the first first

    # ----------------------------------------------------------------- disks

    def disk(self, worker: str, used: int) -> None:
        """``worker`` reported ``used`` bytes of outputs on disk."""
        self.disk_used[worker] = used
        if used > self.disk_peak.get(worker, -1):
            self.disk_peak[worker] = used

    def joined(self, worker: str) -> None:
        """``worker`` joined, a new life (a name may come back): an old life's peak goes."""
        self.disk_peak.pop(worker, None)
        self._departed.pop(worker, None)

    def forget(self, worker: str) -> None:
        """``worker`` left: its current use is gone. Its peak and counts stay, until
        :data:`DEPARTED_KEPT` workers left after it (the totals per kind stay)."""
        self.disk_used.pop(worker, None)
        self._leaving.pop(worker, None)
        for k in [k for k in self._copies if k[1] == worker]:
            del self._copies[k]
        self._departed.pop(worker, None)
        self._departed[worker] = None
        while len(self._departed) > DEPARTED_KEPT:
            old = next(iter(self._departed))
            del self._departed[old]
            self.disk_peak.pop(old, None)
            for counts in (self.bytes_in, self.bytes_out, self.lost_by_worker):
                counts.pop(old, None)

    # ----------------------------------------------------------------- transfers

    def copy_sent(self, key: Key, receiver: str, source: str, now: float) -> None:
        """A replica of ``key`` was asked of ``receiver``, from ``source``."""
        self._copies[(key, receiver)] = (source, now)

    def copy_ended(self, key: Key, receiver: str, now: float) -> tuple[str, float | None]:
        """The copy of ``key`` to ``receiver`` ended: its source and how long it took
        (``("", None)`` if it was not asked through :meth:`copy_sent`)."""
        sent = self._copies.pop((key, receiver), None)
        if sent is None:
            return "", None
        return sent[0], max(now - sent[1], 0.0)

    def leaving(self, worker: str, now: float) -> None:
        """``worker`` started leaving: its outputs are being evacuated."""
        self._leaving.setdefault(worker, now)

    def left_after(self, worker: str, now: float) -> float | None:
        """Seconds since ``worker`` started leaving (None: it did not say it would)."""
        at = self._leaving.get(worker)
        return None if at is None else max(now - at, 0.0)

    def transfer(
        self, kind: str, key: Key, nbytes: int, source: str, target: str, duration: float | None
    ) -> tuple[Any, ...]:
        """Count a transfer; returns its feed record ``("transfer", key, kind, nbytes,
        source, target, duration)`` (``duration`` None: not known to the scheduler)."""
        self.transfers[kind] += 1
        self.transfer_bytes[kind] += nbytes
        self.bytes_in[target] += nbytes
        if source:
            self.bytes_out[source] += nbytes
        return ("transfer", key, kind, nbytes, source, target, duration)

    # ----------------------------------------------------------------- recoveries

    def recovery(self, key: Key, category: str, worker: str, how: str) -> tuple[Any, ...]:
        """Count a recovery of ``key`` lost with ``worker``; returns its feed record
        ``("recovery", key, category, worker, how)``."""
        self.recoveries[how] += 1
        self.lost_by_worker[worker] += 1
        return ("recovery", key, category, worker, how)
