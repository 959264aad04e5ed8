"""Workers sharing a machine: whether their memory limits, added up, pass the memory
the machine has (docs/memory.md#workers-sharing-a-machine).

Each worker's fences act on its own limit (``--memory``; by default the machine's
memory). Two workers started by hand on one machine without ``--memory`` each claim the
whole of it: together they may take twice what it has before either fence acts, and the
dashboard shows twice its memory as capacity. :class:`HostLedger`, kept by the scheduler
core (``SchedulerState.hosts``), adds up the limits of the workers connected on each
machine (``WorkerJoined.host``, ``host_memory``; workers in one process share its RSS and
count once, with the largest of their limits) and says so with
:class:`~actors.scheduler_events.HostOvercommitted` when the sum passes the machine's
memory, and with :class:`~actors.scheduler_events.HostOvercommitCleared` once it no
longer does.

A machine is looked at once its workers stopped changing for :data:`SETTLE` seconds (or
:data:`MOST_WAIT` after the first change not looked at): a dozen workers starting
together give one warning, not one per join. It is said again only when the workers on
it (or their limits) changed since it was last said. Pure: times come in as data.
"""

from __future__ import annotations

from collections.abc import Sequence

from actors.scheduler_events import HostOvercommitCleared, HostOvercommitted
from runtime.errors import size_text

__all__ = [
    "CORES_FLAG",
    "MOST_WAIT",
    "SETTLE",
    "HostLedger",
    "claims_and_share",
    "cores_overcommit_text",
    "overcommit_text",
]

SETTLE = 1.0  #: seconds without a join or leave on a machine before it is looked at
MOST_WAIT = 10.0  #: and at most this long after its first change not looked at


def claims_and_share(cmd: HostOvercommitted) -> tuple[str, int]:
    """The workers of ``cmd`` with their claims, and what each of its processes may
    have: the machine's memory (a file system's free space, :mod:`actors.shared_disk`)
    over their number."""
    names = ", ".join(f"{w} ({size_text(limit)})" for w, limit in cmd.workers)
    return names, cmd.host_memory // max(cmd.processes, 1)


def _pool_keys(pools: Sequence[str]) -> str:
    """``[pools.a]`` or ``[pools.a] and [pools.b]``: where a pool's keys are set."""
    return " and ".join(f"[pools.{p}]" for p in pools)


def overcommit_text(cmd: HostOvercommitted, pools: Sequence[str] = (), by_hand: bool = True) -> str:
    """What the manager logs and shows (status, dashboard) of ``cmd``: which workers, the
    sum, the machine's memory and what to do: for the workers of configured ``pools``
    (started by their providers), the pools' ``memory_per_worker``; for the others
    (``by_hand``: some are not a configured pool's), ``--memory`` or a cluster that
    divides the machine."""
    names, share = claims_and_share(cmd)
    mib = f"{share // 2**20}MiB"
    why = f"the machine's memory / {cmd.processes} worker processes"
    if not pools:
        advice = (
            f"--memory {mib} ({why}), or start them with Cluster(processes={cmd.processes}) "
            "or a local pool, which divide the machine's memory among their workers"
        )
    else:
        advice = f'set memory_per_worker = "{mib}" in {_pool_keys(pools)} ({why})'
        if by_hand:
            advice += f", and start the workers not of a pool with --memory {mib}"
    return (
        f"host {cmd.host}: the memory limits of its workers {names} add up to "
        f"{size_text(cmd.claimed)}, more than the machine's {size_text(cmd.host_memory)}; "
        f"no memory fence acts before the machine runs out. Give each worker its share: "
        f"{advice}"
    )


#: what a cores warning asks for, ``{cpus}`` the CPUs: workers started by hand (or a
#: pool's) declare their cores with ``--cores``; an embedded ``Cluster`` says its own
#: keywords instead (``Scheduler(cores_advice=...)``)
CORES_FLAG = "give the workers --cores that add up to {cpus} or fewer"


def cores_overcommit_text(
    cmd: HostOvercommitted,
    advice: str = CORES_FLAG,
    pools: Sequence[str] = (),
    by_hand: bool = True,
) -> str:
    """What the manager logs and shows of a ``"cores"`` warning: which workers, the
    cores they declare and the CPUs the machine lets them use, and ``advice`` (with
    ``{cpus}``) on what to change; for the workers of configured ``pools``, their
    ``cores_per_worker`` (and ``--cores`` for the others when ``by_hand``). Only a
    warning: tasks that wait on I/O may want more slots than CPUs."""
    names = ", ".join(f"{w} ({n})" for w, n in cmd.workers)
    if pools:
        advice = (
            f"set cores_per_worker in {_pool_keys(pools)} so that the cores of the workers "
            "on this machine add up to {cpus} or fewer"
        )
        if by_hand:
            advice += " (and give the workers not of a pool fewer --cores)"
    return (
        f"host {cmd.host}: the cores of its workers {names} add up to {cmd.claimed}, more "
        f"than the {cmd.host_memory} CPUs it lets them use; their tasks share those CPUs "
        f"and run slower than the dashboard's capacity says. If that is meant (tasks that "
        f"mostly wait on I/O), this is only a warning; else "
        f"{advice.format(cpus=cmd.host_memory)}"
    )


class HostLedger:
    """The workers connected on each machine, their limits, and the warnings in force."""

    def __init__(self, resource: str = "memory") -> None:
        #: what is added up: ``"memory"`` (bytes), ``"cores"`` (against the machine's
        #: CPUs, in :attr:`memory`); its commands carry it
        self.resource = resource
        #: host -> worker -> (limit, process id; 0: not told)
        self.workers: dict[str, dict[str, tuple[int, int]]] = {}
        self.memory: dict[str, int] = {}  #: host -> its memory (bytes), as last told
        self.where: dict[str, str] = {}  #: worker -> its host
        #: host -> (first, latest) time of its changes not looked at yet
        self.changed: dict[str, tuple[float, float]] = {}
        #: host -> the claims of the warning in force, ``((worker, limit), ...)``
        self.warned: dict[str, tuple[tuple[str, int], ...]] = {}

    @property
    def pending(self) -> bool:
        """A machine's workers changed and it was not looked at since: the shell ticks."""
        return bool(self.changed)

    def joined(
        self, worker: str, host: str, host_memory: int, limit: int, process: int, now: float
    ) -> None:
        """``worker`` joined (or joined again) on ``host`` with memory ``limit``. A worker
        that did not say its host (an older one) is not counted."""
        self.left(worker, now)
        if not host:
            return
        self.where[worker] = host
        self.workers.setdefault(host, {})[worker] = (limit, process)
        if host_memory > 0:
            self.memory[host] = host_memory
        self._changed(host, now)

    def left(self, worker: str, now: float) -> None:
        host = self.where.pop(worker, None)
        if host is None:
            return
        on = self.workers.get(host, {})
        on.pop(worker, None)
        if not on:
            self.workers.pop(host, None)
        self._changed(host, now)

    def _changed(self, host: str, now: float) -> None:
        first, _ = self.changed.get(host, (now, now))
        self.changed[host] = (first, now)

    def claimed(self, host: str) -> tuple[int, int]:
        """The bytes ``host``'s workers claim (each process once, with its largest
        limit; a worker without a process id is a process of its own) and how many
        processes that is."""
        per: dict[object, int] = {}
        for worker, (limit, process) in self.workers.get(host, {}).items():
            key: object = process if process else ("worker", worker)
            per[key] = max(per.get(key, 0), limit)
        return sum(per.values()), len(per)

    def check(self, now: float, stimulus: str) -> list[HostOvercommitted | HostOvercommitCleared]:
        """Look at the machines whose workers settled; a command for each whose
        warning starts, changes or ends."""
        out: list[HostOvercommitted | HostOvercommitCleared] = []
        for host, (first, last) in sorted(self.changed.items()):
            if now - last < SETTLE and now - first < MOST_WAIT:
                continue
            del self.changed[host]
            on = self.workers.get(host, {})
            total = self.memory.get(host, 0)
            claimed, processes = self.claimed(host)
            claims = tuple(sorted((w, limit) for w, (limit, _) in on.items()))
            if total and claimed > total:
                if self.warned.get(host) != claims:
                    self.warned[host] = claims
                    out.append(
                        HostOvercommitted(
                            stimulus, host, total, claimed, claims, processes, self.resource
                        )
                    )
            elif self.warned.pop(host, None) is not None:
                names = tuple(w for w, _ in claims)
                out.append(HostOvercommitCleared(stimulus, host, names, self.resource))
            if not on:
                self.memory.pop(host, None)
        return out
