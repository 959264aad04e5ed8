"""Cluster nodes: the control plane, the gateway that joins processes to it, and the
manager and worker process entry points.

What lives here:

- :func:`start_control_plane`: spawns the file registry, scheduler, manager and
  (optionally) autoscaler into an actor system. The embedded ``Cluster`` and the manager
  process both use it, so there is one way to assemble a cluster.
- :class:`Gateway`: serves a listener. Every connection starts with a :class:`Hello`
  saying what connects (worker, client, console); the gateway then joins it to the
  control plane with a :class:`runtime.remote.Peer`: a worker is registered with the
  scheduler (its messages go to the scheduler), a client or console talks to the
  manager. A worker whose connection drops gets ``reconnect_timeout`` seconds to come
  back with the same id and keep its work; after that it is lost.
- Authorization at the door: each connection has a role (``admin``, ``submit``,
  ``read`` or ``worker``, from its token and its Hello) and :data:`ALLOWED` says, as data, which
  message types each role may send. Anything else is refused before it reaches an
  actor: an ask gets :class:`PermissionDenied`, a tell is dropped, logged and counted,
  and a connection that keeps at it is closed with the reason (:class:`_Door`).
- Worker identity: only a worker- or admin-token connection may say Hello as a worker; a new
  worker id gets a secret (:class:`Welcome`) that a worker must present to rejoin under
  that id, so no other connection can take a worker's place.
- Tokens: :class:`Tokens` (an admin token for the operator's clients, the admin console
  and workers started by hand; a submit token for the clients of the people sharing the
  manager; a read-only one for consoles that only look; a worker token that only joins
  workers, which the manager's own pools give theirs), written to a user-only file.

docs/security.md describes the roles, tokens and trust for users.
- :func:`run_manager` and :func:`run_worker`: what ``python -m runtime manager`` and
  ``python -m runtime worker`` run.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import dataclasses
import functools
import gc
import hmac
import json
import math
import os
import secrets
import signal
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from urllib.parse import urlsplit

import anyio
import anyio.abc

from actors.autoscaler import Autoscaler, PoolTarget, RefusedWorker
from actors.executor import kill_task_processes
from actors.host_memory import CORES_FLAG
from actors.manager import GC_THRESHOLD, GatherResult, GcTuning, Manager, process_figures
from actors.pools import (
    PoolConfig,
    check_fallback,
    ignored_settings,
    load_config,
    load_policies,
    load_scheduler,
    local_workers,
    pool_fallbacks,
    scheduler_settings,
)
from actors.protocol import TaskResult
from actors.providers import DISK_OFF, BlockSpec, Provider, WorkerFactory
from actors.registry import FileRegistry
from actors.scheduler import LOST_NAMES, Scheduler
from actors.scheduler_records import SchedulerConfig
from actors.worker import (
    STOP_SIGNALLED,
    ForgetWork,
    Leave,
    Spilling,
    Worker,
    host_cpus,
    note_stop_signal,
    trim_memory,
)
from policies import KINDS, REGISTRY
from runtime.errors import (
    STOP_SIGNALS,
    ActorStopped,
    AddressInUse,
    AskTimeout,
    AuthenticationFailed,
    ConnectFailed,
    CorralError,
    FrameTooLarge,
    InvalidAddress,
    MailboxFull,
    ManagerStopping,
    ManagerUnreachable,
    PermissionDenied,
    PoolNameError,
    ProtocolError,
    ProtocolMismatch,
    TaskArgumentsTooLarge,
    TaskErrorTooLarge,
    TokenFileError,
    UnknownPolicyError,
    WorkerCoreFailed,
    size_text,
)
from runtime.graph import PoolShape
from runtime.home import corral_home, private_dir
from runtime.kernel import ActorRef, ActorSystem
from runtime.log import get_logger
from runtime.messages import (
    CORRAL_VERSION,
    PROTOCOL_VERSION,
    AlertRuleAdd,
    AlertRuleRemove,
    AlertsRequest,
    CancelKeysRequest,
    CancelRequest,
    CheckpointSaved,
    ClientCame,
    ClientGone,
    CloseStream,
    ClusterStopping,
    DataReply,
    DrainRequest,
    Evacuated,
    ForgetCategoryRequest,
    GatherRequest,
    GetData,
    Leaving,
    Message,
    MetricsReply,
    MetricsRequest,
    MoveRequest,
    OutputUnpicklable,
    PolicyQuery,
    ProgressQuery,
    ReadStream,
    RegisterWorker,
    ReleaseKeysRequest,
    ResumeRequest,
    RunRequest,
    RunTasks,
    ScaleRequest,
    SetPolicyRequest,
    SettingsAt,
    StatusRequest,
    StoryQuery,
    StoryRequest,
    StreamPart,
    SubmitGraphRequest,
    SubmitReply,
    SubmitRoleGraphRequest,
    TasksDone,
    TasksQuery,
    TasksStarted,
    UndrainRequest,
    WaitForWorkersRequest,
    WorkerDropped,
    WorkerGone,
    WorkerHolds,
    WorkerInfo,
    WorkerMemoryReport,
    message,
    pool_name_problem,
)
from runtime.monitor import (
    DEFAULT_ALERTING,
    AlertingConfig,
    DashboardAt,
    Monitor,
    alerting_config,
    load_alerting,
)
from runtime.packages import corral_home as corral_install
from runtime.remote import (
    Peer,
    Refused,
    RemoteRef,
    not_welcomed,
    refusal_error,
    refuse,
    too_large_error,
)

__all__ = [
    "ALLOWED",
    "HELLO_RULES",
    "HELLO_TIMEOUT",
    "PROTOCOL_VERSION",
    "ControlPlane",
    "Gateway",
    "Hello",
    "PeerQuery",
    "PermissionDenied",
    "Tokens",
    "Welcome",
    "check_client_timeout",
    "check_reconnect_timeout",
    "check_worker_pool",
    "check_worker_timeout",
    "end_run",
    "read_token_file",
    "run_manager",
    "run_worker",
    "say_hello",
    "start_control_plane",
    "start_recorder",
    "token_path",
    "worker_factory",
    "worker_pool_error",
]

if TYPE_CHECKING:
    from runtime.dashboard import DashboardFeed, Sources
    from runtime.monitordb import MonitorRecorder, MonitorWriter
    from transport.base import Listener

_log = get_logger("corral.node")

#: Seconds between heartbeats on an idle connection, and of silence before a peer is
#: declared dead (a worker then becomes lost, unless it reconnects in time). The
#: manager's limit for its workers is its ``worker_timeout`` (``--worker-timeout``),
#: this by default.
HEARTBEAT = 2.0
DEAD_AFTER = 10.0
#: seconds a worker that is told to stop while it waits for the manager's answer to
#: its Hello waits more for it (a Welcome on its way: it then leaves in order)
STOP_WELCOME_WAIT = 1.0
#: Seconds the manager holds the id of a worker whose connection dropped for its rejoin
#: (its work kept) before it counts the worker lost (``reconnect_timeout``;
#: ``--reconnect-timeout``)
RECONNECT_TIMEOUT = 10.0
#: Seconds a new connection to the gateway has, after its websocket handshake, to send
#: its Hello (a Corral worker, client or console sends it at once); a connection
#: silent past it is closed and counted as refused (``no hello``), as the HTTP
#: handshake's own timeout closes a connection that does not complete its request
HELLO_TIMEOUT = 10.0
#: What the listener's refusal log and ``corral_refused_connections_total`` call it
NO_HELLO = "no hello"
# PROTOCOL_VERSION, which every Hello carries, is defined in runtime/messages.py (at the
# base, so that `check`'s probe compares it too) and exported from here as well.
#: Seconds a worker that lost its manager (without its goodbye) keeps trying to rejoin
#: before it exits 1 (``run_worker``'s ``reconnect``; a worker's ``--connect-retry``)
RECONNECT = 10.0
#: Seconds a worker's event loop may be blocked (a task holding the GIL) before the
#: worker warns that it was (``event loop blocked``); the manager's gateway warns of its
#: own loop's stalls from the same length on
LOOP_BLOCKED_WARN = 5.0
#: Seconds a worker waits, once it saw its event loop was blocked, before it says why:
#: the handler that notes a SIGCONT (a stop, not a block) runs in the loop's thread, and
#: may run only after the loop saw the stall when the signal reached another thread
CONTINUED_GRACE = 0.25
#: Seconds a worker's probe of its manager's port (:func:`port_takes_connections`) waits
#: for the TCP connection (the operating system accepts it, even for a stalled process)
PROBE_TIMEOUT = 1.0
#: Seconds each try of a worker waiting for a stalled manager (below) may take: its
#: connection waits in the manager's backlog until the manager's loop runs again (a
#: try at a time, not one a window: a long stall does not fill the backlog)
STALLED_TRY = 300.0
#: How many of its loop's stalls a gateway keeps for an embedded Cluster's next call
STALLS_KEPT = 10
#: Seconds between the ticks of a gateway's loop watch (:meth:`Gateway.watch_loop`):
#: how late each wakes is its loop's lag, a stall longer than this seen to within it
LOOP_TICK = 0.1
#: Seconds over which ``corral_manager_loop_lag_seconds`` is the most lag seen
LOOP_LAG_WINDOW = 60.0
#: Why a worker started by a local process provider waits for a manager that does not
#: answer rather than give up after its window (``the manager does not answer; waiting
#: for it``)
MANAGER_STALLED = (
    "the manager runs in this worker's parent process, which lives, and its port takes "
    "connections: its event loop is blocked (a long synchronous call in the program that "
    "embeds it, a notebook cell); this worker's tasks run on, and it rejoins, keeping "
    "them, once that loop runs again"
)
#: Seconds of silence before the manager drops a client: a client holds no work, and
#: its event loop may be busy with the user's own code for a while (hashing large
#: arguments to make their keys, say); a client process that dies closes its
#: connection and is seen at once.
CLIENT_DEAD_AFTER = 120.0
#: Seconds a stopping manager gives its connections to take its goodbye and close
#: (:meth:`Gateway.say_goodbye`); those not closed by then are closed without it
GOODBYE_TIMEOUT = 5.0
#: Seconds a client or console that gave its name way to a worker (:meth:`Gateway.
#: _give_way`) has to take the frame that says why before it is closed without it (one
#: that does not read must not hold anything up)
GIVE_WAY_TIMEOUT = 1.0
#: Seconds an orderly stop gives the alert monitor and the scheduler (asked at once) to
#: take it before the workers are stopped (:func:`end_run`): the scheduler answers once
#: the graphs it takes in ahead of the stop are in
END_RUN_TIMEOUT = 10.0
#: How a cancelled run_manager's goodbye says it stopped (ManagerStopping's ``how``)
CANCELLED = "cancelled by the program that runs it"
#: seconds the alert monitor waits at most for the listener's URL (the dashboard's,
#: each alert's link) before its first evaluation
DASHBOARD_WAIT = 10.0


def check_worker_timeout(value: object, name: str = "worker_timeout") -> float:
    """``value`` as the seconds a worker may be silent before the manager counts it
    lost: a :class:`ValueError` naming ``name`` unless it is a finite number > 0."""
    return _seconds(
        value, name, "a worker may be silent (as while one of its tasks holds the GIL) "
        "before the manager counts it lost", DEAD_AFTER,
    )  # fmt: skip


def check_client_timeout(value: object, name: str = "client_timeout") -> float:
    """``value`` as the seconds a client or console may be silent before the manager
    drops it: a :class:`ValueError` naming ``name`` unless it is a finite number > 0."""
    return _seconds(
        value, name, "a client or console may be silent (its event loop busy with the "
        "user's code) before the manager drops it", CLIENT_DEAD_AFTER,
    )  # fmt: skip


def check_reconnect_timeout(value: object, name: str = "reconnect_timeout") -> float:
    """``value`` as the seconds the manager holds a dropped worker's id for its rejoin:
    a :class:`ValueError` naming ``name`` unless it is a finite number > 0."""
    return _seconds(
        value, name, "the manager keeps a worker whose connection dropped (its id and "
        "its work) for it to rejoin before counting it lost", RECONNECT_TIMEOUT,
    )  # fmt: skip


def check_gc_threshold(value: object, name: str = "gc_threshold") -> int | None:
    """``value`` as a manager process's garbage collector threshold (:class:`GcTuning`;
    None: Python's own): a :class:`ValueError` naming ``name`` unless it is a whole
    number >= 1 or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"{name} must be a whole number >= 1: the new container objects after which "
            f"Python's garbage collector runs in the manager process (default "
            f"{GC_THRESHOLD:,}; Python's own is 700); got {value!r}"
        )
    return value


#: A manager process gives memory back to the system (a full garbage collection, then
#: glibc's ``malloc_trim(0)``: :func:`~actors.worker.trim_memory`) once it took in at
#: least this many tasks since it last did and its scheduler holds fewer than
#: :data:`TRIM_BELOW` tasks, nothing being taken in: the end of a large run, whose
#: objects are gone but whose freed heap stayed with the process (the scale audit: 0.8-1
#: GB kept after 300,000 tasks, nothing wanted). Checked every :data:`TRIM_CHECK` s.
TRIM_AFTER = 10_000
TRIM_BELOW = 1_000
TRIM_CHECK = 5.0
#: A manager process keeps a large run's objects out of the garbage collector's full
#: collections, each of which walked them all and held the event loop (4 s at 100,000
#: tasks, past 10 s at 300,000: the workers' limit): once a graph of :data:`TRIM_AFTER`
#: tasks or more is in, ``gc.freeze()`` (the collector skips every object alive then;
#: reference counting still frees them as usual), and ``gc.unfreeze()`` at the
#: give-back, or once this many more tasks were taken in without one (a manager never
#: idle: the collector takes them up again, so that cycles among them are not kept).
FREEZE_SPAN = 100_000


async def _give_back(
    scheduler: Scheduler, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
) -> None:
    """A manager process's service: once a large graph is in, freeze the objects alive
    (:data:`FREEZE_SPAN`); give memory back after each large run (:data:`TRIM_AFTER`),
    off the hot path (nothing wanted then), and say so."""
    task_status.started()
    # the scheduler's count of tasks taken in at the last give-back, at the last freeze
    # (or unfreeze), and at the first freeze since the last unfreeze (None: none)
    since = frozen = scheduler.state.created
    first: int | None = None
    while True:
        await anyio.sleep(TRIM_CHECK)
        state = scheduler.state
        if scheduler.taking_in:
            continue
        created = state.created
        if len(state.tasks) >= TRIM_BELOW:  # a run goes on
            if first is not None and created - first >= FREEZE_SPAN:
                gc.unfreeze()
                frozen, first = created, None
            elif created - frozen >= TRIM_AFTER:
                gc.freeze()
                frozen, first = created, created if first is None else first
            continue
        if created - since < TRIM_AFTER and first is None:
            continue
        gc.unfreeze()
        tasks, since, frozen, first = created - since, created, created, None
        before, began = process_figures()["rss"], time.perf_counter()
        trimmed = trim_memory()
        _log.info(
            "gave memory back after a large run",
            tasks=tasks, rss_before=size_text(before), rss=size_text(process_figures()["rss"]),
            seconds=round(time.perf_counter() - began, 3),
            **({} if trimmed else {"note": "no malloc_trim here (not glibc)"}),
        )  # fmt: skip


def _seconds(value: object, name: str, what: str, default: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(
            f"{name} must be a number of seconds > 0: how long {what}; default "
            f"{default:g}; got {value!r}"
        )
    return float(value)


# ----------------------------------------------------------------------------- control plane


class LoopLag:
    """The most an event loop's ticker woke late over the latest ``window`` seconds
    (``corral_manager_loop_lag_seconds``): :meth:`note` at each tick, :meth:`recent`
    at a scrape; time as data. It keeps only the ticks that may still be the most (a
    tick later and later-woken drops those before it): 600 at most, at 10 ticks a
    second over a minute."""

    def __init__(self, window: float = LOOP_LAG_WINDOW) -> None:
        self.window = window
        self._seen: collections.deque[tuple[float, float]] = collections.deque()

    def note(self, now: float, late: float) -> None:
        """The ticker woke ``late`` seconds after it was due, at ``now``."""
        late = max(0.0, late)
        while self._seen and self._seen[-1][1] <= late:
            self._seen.pop()
        self._seen.append((now, late))
        self._forget(now)

    def recent(self, now: float) -> float:
        """The most seconds late of the ticks of the latest ``window`` (0.0: none)."""
        self._forget(now)
        return self._seen[0][1] if self._seen else 0.0

    def _forget(self, now: float) -> None:
        while self._seen and self._seen[0][0] <= now - self.window:
            self._seen.popleft()


@dataclasses.dataclass
class ControlPlane:
    """The control actors of one cluster and how to find any actor by name."""

    system: ActorSystem
    refs: dict[str, ActorRef[Any]]  #: the control actors by name: several kinds
    scheduler: Scheduler
    resolvers: list[Callable[[str], Any]]
    #: the scaling policy chosen at start, for the autoscaler (None: the default)
    scaling: Any = None
    #: where the autoscaler gets its workers (set by :func:`start_autoscaler`)
    provider: Provider | None = None
    #: or, with configured pools, the provider of each pool by name
    providers: dict[str, Provider] = dataclasses.field(default_factory=dict)
    #: the alert monitor (None: the cluster runs none)
    monitor: Monitor | None = None
    #: the monitoring database's recorder (None: no database)
    recorder: MonitorRecorder | None = None
    #: the gateway's ``event loop blocked`` records not yet told to the program that
    #: embeds the cluster (its next call tells them: :meth:`Gateway.watch_loop`)
    stalls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: how late the gateway's loop watch woke lately (``corral_manager_loop_lag_seconds``)
    loop_lag: LoopLag = dataclasses.field(default_factory=LoopLag)

    def resolve(self, name: str) -> Any:
        """A reference to the actor or remote peer called ``name``, or ``None``."""
        ref = self.system.actors.get(name)
        if ref is not None:
            return ref
        for resolver in self.resolvers:
            found = resolver(name)
            if found is not None:
                return found
        return None

    @property
    def manager(self) -> ActorRef[Manager]:
        return self.refs["manager"]


async def start_control_plane(
    system: ActorSystem,
    *,
    saturation: float = 2.0,
    policies: dict[str, tuple[str, dict[str, Any]]] | None = None,
    provider: Callable[[ControlPlane], Provider] | None = None,
    targets: dict[str, PoolTarget] | None = None,
    stall_timeout: float = 10.0,
    alerting: AlertingConfig | None = DEFAULT_ALERTING,
    monitoring: str | os.PathLike[str] | None = None,
    monitoring_interval: float = 2.0,
    prune_depth: int = 1,
    long_task: float = 1.0,
    unknown_long: bool = True,
    dashboard: bool = False,
    monitor_feed: bool = False,
    pools: Mapping[str, PoolConfig] | None = None,
    fixed: tuple[str, PoolShape, str] | None = None,
    closed: str = "",
    settings: Mapping[str, Any] | None = None,
    cores_advice: str = CORES_FLAG,
) -> ControlPlane:
    """Spawn registry, scheduler, manager, the alert monitor (unless ``alerting`` is
    None; by default the default rules, logged) and, with a ``provider``, the
    autoscaler. ``stall_timeout``, ``prune_depth``, ``long_task``, ``unknown_long``: see
    :class:`~actors.scheduler_records.SchedulerConfig`. ``monitoring``: the path of a
    monitoring database to write every ``monitoring_interval`` seconds
    (:class:`~runtime.monitordb.MonitorRecorder`, docs/monitoring.md). ``dashboard``:
    a listener will serve the dashboard (its URL comes as :class:`DashboardAt`): the
    alert monitor's first evaluation waits for it, so alerts carry their link.
    ``monitor_feed``: keep the scheduler's monitoring feed from the start for a
    recorder started later (:func:`start_recorder`; the manager process starts it once
    its listeners are up, so a manager that cannot listen leaves no database).
    ``pools``: the configured pools, whose worker shapes (:func:`pool_shapes`) the
    manager checks submissions against (a task asking for more than every worker of its
    pool has is refused) and whose ``drain_period`` the scheduler drains their workers
    by (:func:`pool_drain_periods`), and after their ``tasks_per_worker`` tasks
    (:func:`pool_tasks_per_worker`); a pool with ``any_pool_tasks = false`` gets no task
    of no pool. ``fixed``: with no ``pools``, an embedded
    cluster's one pool, the shape of its workers (:func:`worker_shape`) and where that
    is set (``"Cluster(...)"``): checked the same, and a task naming another pool that
    no worker has joined is told to its client. ``closed``: who runs this cluster
    (``"runtime.get"``) when no worker but its own can ever join it: a task naming
    another pool is refused at submit (``Manager.closed``). ``settings``: more
    :class:`~actors.scheduler_records.SchedulerConfig` settings by name (a manager's
    ``[scheduler]`` table with its flags), over the arguments above. ``cores_advice``:
    what the warning of a machine's workers declaring more cores than it has CPUs asks
    for (``{cpus}`` its CPUs; an embedded cluster names its own keywords).

    ``policies`` of kind ``scaling`` go to the autoscaler (started here or later by
    :func:`start_autoscaler`), the others to the scheduler; an unknown name or bad
    parameters raise here, before anything is spawned."""
    refs: dict[str, ActorRef[Any]] = {}
    policies = dict(policies or {})
    if "retry" in policies and pools:
        check_fallback("retry", *policies["retry"], pools)
    scaling = policies.pop("scaling", None)
    shapes = pool_shapes(pools or {}) if pools or fixed is None else {fixed[0]: fixed[1]}
    fields = {
        "saturation": saturation, "stall_timeout": stall_timeout, "prune_depth": prune_depth,
        "long_task": long_task, "unknown_long": unknown_long, **(settings or {}),
    }  # fmt: skip
    config = SchedulerConfig(
        **fields, drain_periods=pool_drain_periods(pools or {}),
        tasks_per_worker=pool_tasks_per_worker(pools or {}),
        monitor=monitor_feed or monitoring is not None,
        pool_memory={p: int(s["memory"][0]) for p, s in shapes.items() if "memory" in s},
        pool_cores={p: s["cores"][0] for p, s in shapes.items()},
        pool_disk={p: int(s["disk"][0]) for p, s in shapes.items() if "disk" in s},
        pools=tuple(pools) if pools else (fixed[0],) if fixed is not None else (),
        reserved_pools=frozenset(n for n, p in (pools or {}).items() if not p.any_pool_tasks),
    )  # fmt: skip
    plane = ControlPlane(system, refs, None, [])  # type: ignore[arg-type]
    if scaling is not None:
        plane.scaling = REGISTRY.create("scaling", *scaling)
    registry = FileRegistry(lambda: refs["scheduler"], plane.resolve)
    refs["registry"] = await system.spawn(registry, "registry")
    scheduler = Scheduler(
        lambda: refs["manager"],
        lambda: refs["registry"],
        config=config,
        initial=policies,
        cores_advice=cores_advice,
        pool_keys=tuple(pools or ()),
        monitor=lambda: refs.get("monitor"),
    )
    plane.scheduler = scheduler
    # No restarts for the scheduler: a failure there is a bug that may have left its
    # state half-applied, so the cluster stops with ActorCrashed rather than limp on.
    refs["scheduler"] = await system.spawn(scheduler, "scheduler", max_restarts=0)
    manager = Manager(
        lambda: refs["scheduler"], lambda: refs["registry"], lambda: refs.get("autoscaler"),
        plane.resolve, monitor=lambda: refs.get("monitor"),
        pools=shapes, reserved=config.reserved_pools,
        sizing="" if pools or fixed is None else fixed[2], closed=closed,
        fallback=fallbacks(pools or {}), submit_max_priority=config.submit_max_priority,
    )  # fmt: skip
    refs["manager"] = await system.spawn(manager, "manager")
    if alerting is not None:

        async def metrics() -> MetricsReply:
            reply: MetricsReply = await refs["manager"].ask(MetricsRequest(), timeout=30.0)
            return reply

        plane.monitor = Monitor(
            metrics, lambda: refs.get("autoscaler"), alerting,
            dashboard_wait=DASHBOARD_WAIT if dashboard else 0.0,
        )  # fmt: skip
        refs["monitor"] = await system.spawn(plane.monitor, "monitor")
    if provider is not None:
        await start_autoscaler(plane, provider(plane), targets or {})
    if monitoring is not None:
        await start_recorder(plane, monitoring, monitoring_interval)
    return plane


async def end_run(plane: ControlPlane) -> None:
    """An orderly stop's first step, before any worker is stopped
    (:class:`~runtime.messages.ClusterStopping`, asked of the alert monitor and the
    scheduler at once, within :data:`END_RUN_TIMEOUT` in all): the alert monitor's alerts
    hold still (the stop neither resolves nor fires one: they end with the run), and the
    run's tasks end: those not finished are cancelled and a finished one keeps its end
    (and a graph that comes after it is cancelled as it comes), so that the workers
    stopped next leave as losses of nothing (no output computed again, no recovery
    recorded). The monitor's ask is queued before the scheduler's, so that any metrics
    it reads after the cancel are taken after its stop. An actor stopped already is
    skipped; one that does not answer in time is not waited for, and one that fails is
    not either (each logged): the stop goes on."""
    answers: list[tuple[str, Coroutine[Any, Any, Any]]] = []
    for name in ("monitor", "scheduler"):  # (queued now, in this order)
        ref = plane.refs.get(name)
        if ref is None:
            continue
        with contextlib.suppress(ActorStopped):  # (stopped already: skipped)
            answers.append((name, ref.post_ask(ClusterStopping(), timeout=END_RUN_TIMEOUT)))
    async with anyio.create_task_group() as tg:  # waited for together: one bound
        for name, answer in answers:
            tg.start_soon(_run_ended, name, answer)


async def _run_ended(name: str, answer: Coroutine[Any, Any, Any]) -> None:
    """:func:`end_run`'s wait for ``name``'s answer: its stop, timeout or failure is
    logged, never raised (the stop goes on)."""
    try:
        await answer
    except ActorStopped:
        pass
    except AskTimeout:
        _log.warning(
            "an actor did not take the cluster's stop before its workers stop",
            actor=name, seconds=END_RUN_TIMEOUT,
            advice="the monitoring database may record what the stop did as the run's",
        )  # fmt: skip
    except Exception as exc:  # its failure must not keep the workers and actors up
        _log.error(
            "an actor failed to take the cluster's stop; the stop goes on",
            actor=name, error=repr(exc),
            advice="the monitoring database may record what the stop did as the run's",
        )  # fmt: skip


async def start_recorder(
    plane: ControlPlane,
    monitoring: str | os.PathLike[str],
    interval: float = 2.0,
    keep: float | None = None,
) -> MonitorRecorder:
    """Create (or open) the monitoring database at ``monitoring`` and spawn its
    recorder, writing every ``interval`` seconds, keeping ``keep`` seconds of history
    (None: all); :class:`~runtime.errors.MonitoringDBError` for a bad path. The
    scheduler must keep its feed (``SchedulerConfig.monitor``)."""
    from runtime.monitordb import MonitorRecorder, MonitorWriter

    refs = plane.refs
    # MonitoringDBError (a bad path) from here, as itself
    writer = await anyio.to_thread.run_sync(functools.partial(MonitorWriter, monitoring, keep=keep))
    # Spawned after the scheduler: stopped before it (newest first), so its last
    # poll still finds the scheduler.
    recorder = MonitorRecorder(
        writer, lambda: refs["scheduler"], lambda: refs["manager"],
        lambda: refs.get("autoscaler"), interval=interval,
    )  # fmt: skip
    refs["monitoring"] = await plane.system.spawn(recorder, "monitoring")
    plane.recorder = recorder
    return recorder


def machine_blocks(started: Iterable[int] = ()) -> int:
    """The most blocks (of one worker) ``scale`` may ask of a pool without limits of its
    own: :data:`~runtime.preflight.LOCAL_WORKERS_PER_CPU` workers per CPU of this
    machine, the bound past which ``python -m runtime check`` warns of a local pool, or
    the blocks the pool ``started`` with, if more."""
    from runtime.preflight import LOCAL_WORKERS_PER_CPU

    return max(LOCAL_WORKERS_PER_CPU * (host_cpus() or 1), *started, 1)


async def start_autoscaler(
    plane: ControlPlane,
    provider: Provider | Mapping[str, Provider],
    targets: dict[str, PoolTarget],
) -> ActorRef[Autoscaler]:
    """Spawn the autoscaler (with the plane's scaling policy); it starts the blocks that
    policy wants (by default the targets) at once. ``provider``: one for every pool, or
    one per pool (``{pool: provider}``). A pool without limits (the pool of an embedded
    cluster, whose workers run on this machine) may be scaled to :func:`machine_blocks`
    blocks, no more."""
    autoscaler = Autoscaler(
        provider, plane.refs["scheduler"], dict(targets), policy=plane.scaling,
        max_unconfigured=machine_blocks(t.n for t in targets.values() if t.limits is None),
    )  # fmt: skip
    if isinstance(provider, Provider):
        plane.provider = provider
    else:
        plane.providers = dict(provider)
    plane.refs["autoscaler"] = await plane.system.spawn(autoscaler, "autoscaler")
    return plane.refs["autoscaler"]


def worker_factory(scheduler: ActorRef[Scheduler], **options: Any) -> WorkerFactory:
    """How an :class:`~actors.providers.InProcessProvider` makes its workers: a
    :class:`Worker` joined to ``scheduler`` offering what the block spec says, with the
    other ``options`` (e.g. ``memory_options``)."""

    def make(
        block_id: str, worker_id: str, spec: BlockSpec, resolve: Callable[[str], Any]
    ) -> Worker:
        return Worker(
            worker_id, scheduler, resolve, nthreads=spec.threads, memory=spec.memory,
            disk=None if spec.disk == DISK_OFF else spec.disk, pool=spec.pool,
            block=block_id, **options,
        )  # fmt: skip

    return make


async def serve_gateway(
    plane: ControlPlane,
    address: str,
    tokens: Tokens,
    *,
    listen_options: dict[str, Any] | None = None,
    reconnect_timeout: float = RECONNECT_TIMEOUT,
    worker_timeout: float = DEAD_AFTER,
    client_timeout: float | None = None,
) -> tuple[Gateway, Listener]:
    """Listen on ``address`` (websockets require ``tokens``) and serve a gateway to
    ``plane`` as a service of its actor system; the listener closes with the system.
    Returns the gateway and the listener (whose ``address`` has the real port).
    ``worker_timeout``: seconds of silence before a worker is counted lost;
    ``client_timeout``: before a client or console is dropped (None:
    :data:`CLIENT_DEAD_AFTER`; never less than ``worker_timeout``). The
    websocket heartbeat (30 s by default; aiohttp closes a connection that has not
    answered its ping within half of it more) is made at least as long as the longest
    silence the gateway allows a connection (a client's or console's
    ``client_timeout``, or the worker timeout if longer), so it never drops a
    silent peer before the gateway's own liveness check would: that check does not count
    time when the manager's event loop did not run, and says why it closed."""
    from transport import listen as listen_on
    from transport.ws import DEFAULT_HEARTBEAT

    gateway = Gateway(
        plane, reconnect_timeout=reconnect_timeout, dead_after=worker_timeout,
        client_dead_after=client_timeout,
    )  # fmt: skip
    options = dict(listen_options or {})
    if address.startswith(("ws://", "wss://")):
        options["tokens"] = tokens.roles()
        gateway.peer_token = tokens.worker
        options.setdefault("heartbeat", max(DEFAULT_HEARTBEAT, gateway.client_dead_after))
    listener = await listen_on(address, **options)
    await plane.system.start_service(gateway.watch_loop)

    async def serve(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        try:
            await listener.serve(gateway.handle, task_status=task_status)
        finally:
            with anyio.CancelScope(shield=True):  # never leave the socket open
                await listener.aclose()

    await plane.system.start_service(serve)
    return gateway, listener


def _alertmanagers(plane: ControlPlane) -> list[Any]:
    """The alert monitor's Alertmanager notifiers (none without a monitor)."""
    from runtime.notify import AlertmanagerNotifier

    notifiers = plane.monitor.notifiers if plane.monitor else []
    return [n for n in notifiers if isinstance(n, AlertmanagerNotifier)]


_T = TypeVar("_T")


def shared_call(call: Callable[[], Awaitable[_T]]) -> Callable[[], Awaitable[_T]]:
    """``call`` made once for all who want it at the same time: while one runs, other
    callers wait for its outcome (its value, or its error) rather than make their own.
    The manager's metrics are so: a flood of ``GET /metrics`` (any read-token holder,
    2,000 at once) queued as many MetricsRequests at the manager, whose answers timed
    out (503) while a client's 21 tasks took 12 s; now it computes one at a time. A
    call cancelled (its HTTP client left) lets the next waiter make its own."""
    running: list[tuple[anyio.Event, list[Any]]] = []

    async def shared() -> _T:
        while running:
            done, outcome = running[0]
            await done.wait()
            if outcome:
                ok, value = outcome
                if ok:
                    return value  # type: ignore[no-any-return]
                raise copy.copy(value)  # one instance per raise: tracebacks stay apart
        done, outcome = anyio.Event(), []
        running.append((done, outcome))
        try:
            value = await call()
        except Exception as exc:
            outcome += [False, exc]
            raise
        else:
            outcome += [True, value]
            return value
        finally:
            running.clear()
            done.set()

    return shared


@dataclasses.dataclass
class GatewayRoutes:
    """What a websocket gateway serves besides its connections (:func:`gateway_routes`)."""

    #: for :func:`serve_gateway`'s ``listen_options``: ``http_routes`` (``GET
    #: /metrics``) and ``web_routes`` (the live dashboard); empty without them
    options: dict[str, Any]
    #: the manager's metrics, as ``/metrics`` and a metrics listener besides show them
    fetch: Callable[[], Awaitable[MetricsReply]]
    #: the collectors ``/metrics`` shows after the snapshot's
    extra: list[Any]
    #: the dashboard's feed (None without the dashboard)
    feed: DashboardFeed | None


async def gateway_routes(
    plane: ControlPlane, listening: list[Listener], *, web: bool = True
) -> GatewayRoutes:
    """``GET /metrics`` and the live dashboard (unless not ``web``; its feed starts
    here as a service of the plane's system) for a websocket gateway of ``plane``,
    with the collectors of the notifications to Alertmanager and of the refusals of
    the listener appended to ``listening`` once it listens."""
    from prometheus_client import ProcessCollector

    from runtime.dashboard import DashboardFeed, dashboard_routes
    from runtime.metrics import (
        ManagerCollector,
        NotifierCollector,
        RefusalCollector,
        metrics_route,
    )

    ams = _alertmanagers(plane)  # corral_notifications_*
    extra = [
        NotifierCollector(lambda: ams),
        RefusalCollector(lambda: getattr(listening[0], "refused_by", {}) if listening else {}),
        ManagerCollector(
            lambda: plane.loop_lag.recent(anyio.current_time()),
            lambda: plane.recorder.writer if plane.recorder is not None else None,
        ),
        ProcessCollector(registry=None),  # process_resident_memory_bytes, ...
    ]

    @shared_call
    async def fetch() -> MetricsReply:
        reply = await plane.manager.ask(MetricsRequest(), timeout=10.0)
        assert isinstance(reply, MetricsReply)
        return reply

    if not web:
        return GatewayRoutes({}, fetch, extra, None)
    feed = DashboardFeed(_dashboard_sources(plane))
    await plane.system.start_service(feed.run)
    options = {
        "http_routes": {"/metrics": metrics_route(fetch, extra)},
        "web_routes": dashboard_routes(feed),
    }
    return GatewayRoutes(options, fetch, extra, feed)


async def serve_local_gateway(
    plane: ControlPlane, listen: str, tokens: Tokens, *, worker_timeout: float = DEAD_AFTER
) -> Listener:
    """An embedded cluster's gateway on ``listen``, which its worker processes join:
    it serves ``GET /metrics`` and the live dashboard to its tokens as a manager's
    listener does (:func:`gateway_routes`), and the alerts link to its page."""
    listening: list[Listener] = []
    routes = await gateway_routes(plane, listening)
    _, listener = await serve_gateway(
        plane, listen, tokens, listen_options=routes.options, worker_timeout=worker_timeout
    )
    listening.append(listener)
    if "monitor" in plane.refs:
        plane.refs["monitor"].post(DashboardAt(_http_url(listener.address) + "/"))
    return listener


async def start_local_processes(
    plane: ControlPlane,
    *,
    n: int,
    threads: int = 1,
    memory: int = 0,
    pool: str = "default",
    listen: str = "ws://127.0.0.1:0",
    tokens: Tokens | None = None,
    memory_options: Mapping[str, Any] | None = None,
    disk: int = 0,
    worker_timeout: float = DEAD_AFTER,
) -> str:
    """Serve a gateway on ``listen`` (with ``/metrics`` and the dashboard:
    :func:`serve_local_gateway`) and keep ``n`` worker processes on this machine
    joined to ``plane`` (replaced when they crash; stopped with the plane's system, and
    never outliving this process however it ends). Returns the gateway's address.
    ``disk``: each worker's ``--disk`` (0: an ``n``th of its file system's free space,
    ``--disk-share``, measured by the worker; ``DISK_OFF``: off).
    ``worker_timeout``: the gateway's (:func:`serve_gateway`)."""

    from actors.processes import LocalProcessProvider

    tokens = tokens or Tokens.generate()
    listener = await serve_local_gateway(plane, listen, tokens, worker_timeout=worker_timeout)
    address = listener.address

    def argv_for(block_id: str, index: int) -> list[str]:
        return worker_argv(address, threads, memory, pool, memory_options, disk=disk, disk_share=n)

    provider = LocalProcessProvider(argv_for, env={"CORRAL_TOKEN": tokens.worker})
    await plane.system.start_service(provider.run)
    spec = BlockSpec(1, threads, memory, disk, pool)
    await start_autoscaler(plane, provider, {pool: PoolTarget(n, spec)})
    return address


def worker_argv(
    address: str,
    threads: int,
    memory: int,
    pool: str,
    memory_options: Mapping[str, Any] | None = None,
    deadline: float | None = None,
    disk: int = 0,
    share: int = 1,
    disk_share: int = 1,
) -> list[str]:
    """The command line of a worker process joining ``address`` (``disk`` 0: no
    ``--disk``, the worker measures its disk; ``DISK_OFF``: ``--disk off``). With
    ``memory`` 0 and ``share`` N > 1, ``--memory-share N``: the worker takes an Nth of
    its machine's memory, one of N workers there. With ``disk`` 0 and ``disk_share`` N
    > 1, ``--disk-share N``: an Nth of its file system's free space, one of N workers
    keeping their outputs there, a share the scheduler shrinks further while other
    workers without ``--disk`` keep theirs there too (docs/files.md)."""
    import sys

    # -P: the working directory does not come first on the worker's sys.path, where a
    # user's `policies/` would shadow Corral's; the worker adds it at the end
    # (runtime.packages.working_directory_last). Not when Corral itself is run from the
    # working directory (a checkout, in place): -P would make its workers import another
    # copy of Corral, an installed one, or none; no folder there can shadow it.
    safe = [] if corral_install() == Path.cwd().resolve() else ["-P"]
    argv = [sys.executable, *safe, "-m", "runtime", "worker", address, "--cores", str(threads)]
    argv += ["--memory", str(memory), "--pool", pool]
    if not memory and share > 1:
        argv += ["--memory-share", str(share)]
    if memory_options:
        argv += ["--memory-options", json.dumps(dict(memory_options))]
    if deadline is not None:
        argv += ["--deadline", repr(deadline)]
    if disk:
        argv += ["--disk", "off" if disk == DISK_OFF else str(disk)]
    elif disk_share > 1:
        argv += ["--disk-share", str(disk_share)]
    return argv


def pool_targets(pools: Mapping[str, PoolConfig]) -> dict[str, PoolTarget]:
    """What the autoscaler starts with for configured pools: a floor of ``min_blocks``,
    the block shape, and the limits the ``demand`` strategy keeps to (which starts
    ``init_blocks``)."""
    return {
        name: PoolTarget(
            p.min_blocks, p.block_spec(), dataclasses.replace(p.limits(), walltime=p.walltime)
        )
        for name, p in pools.items()
    }


def pool_shapes(pools: Mapping[str, PoolConfig]) -> dict[str, PoolShape]:
    """What every worker of each configured pool has by its configuration, as the
    manager checks submissions against it (``runtime.graph.check_pool_fit``): its cores;
    its memory, unless it is the machine's (``memory_per_worker = 0``: not known here
    for a pool whose workers run elsewhere); its disk only when it is a number (not
    ``0``, its file system's free space, nor ``"off"``). Pools do not change while the
    cluster runs (a pool scaled that is not configured is refused), so this is taken
    once, at start."""
    return {
        name: worker_shape(p.cores_per_worker, p.memory_per_worker, p.disk_per_worker)
        for name, p in pools.items()
    }


def worker_shape(
    cores: int, memory: int, disk: int, cores_setting: str = "cores_per_worker"
) -> PoolShape:
    """What each worker of a pool has, as ``check_pool_fit`` takes it: its ``cores``
    (set by ``cores_setting``), its ``memory`` and ``disk`` when they are known
    amounts (> 0: not the machine's, the file system's free space nor ``DISK_OFF``),
    set by ``memory_per_worker`` and ``disk_per_worker``."""
    shape = {"cores": (float(cores), cores_setting)}
    if memory > 0:
        shape["memory"] = (float(memory), "memory_per_worker")
    if disk > 0:  # DISK_OFF is negative
        shape["disk"] = (float(disk), "disk_per_worker")
    return shape


def warn_ignored_settings(
    path: str | os.PathLike[str],
    pools: Mapping[str, PoolConfig],
    policies: Mapping[str, tuple[str, dict[str, Any]]] | None,
) -> list[tuple[str, str]]:
    """Log a warning for each key of the configuration file at ``path`` that has no
    effect under the scaling policy the manager starts with
    (:func:`~actors.pools.ignored_settings`: ``init_blocks`` under ``fixed``), as
    ``check --config`` does; the ``(pool, why)`` said."""
    scaling = pool_policies(pools, policies)["scaling"][0] if pools else ""
    found = ignored_settings(path, pools, scaling)
    for pool, why in found:
        _log.warning(f"configuration: {why}", pool=pool)
    return found


def pool_policies(
    pools: Mapping[str, PoolConfig], policies: Mapping[str, tuple[str, dict[str, Any]]] | None
) -> dict[str, tuple[str, dict[str, Any]]]:
    """The initial policies of a cluster with configured pools: the ``demand`` scaling
    strategy unless another is chosen, and the pools' ``fallback`` in the default retry
    policy's ``fallback`` map (unless the retry policy is another one or already has a
    ``fallback``)."""
    out = dict(policies or {})
    out.setdefault("scaling", ("demand", {}))
    fallback = fallbacks(pools)
    if fallback:
        name, params = out.get("retry", ("default", {}))
        out["retry"] = (name, pool_fallbacks("retry", name, params, fallback))
    return out


def fallbacks(pools: Mapping[str, PoolConfig]) -> dict[str, str]:
    """Each configured pool's ``fallback``, of those that have one."""
    return {name: p.fallback for name, p in pools.items() if p.fallback is not None}


def pool_drain_periods(pools: Mapping[str, PoolConfig]) -> dict[str, float]:
    """The drain period of each configured pool that sets one: its workers are drained
    that long before their walltime (a pool that sets none: computed, see
    :meth:`~actors.scheduler_state.SchedulerState.drain_margin`)."""
    return {name: p.drain_period for name, p in pools.items() if p.drain_period is not None}


def pool_tasks_per_worker(pools: Mapping[str, PoolConfig]) -> dict[str, int]:
    """The ``tasks_per_worker`` of each configured pool that sets one: the scheduler
    drains each of its workers once it was sent that many tasks."""
    return {n: p.tasks_per_worker for n, p in pools.items() if p.tasks_per_worker is not None}


def pool_worker_argv(
    pool: PoolConfig,
    memory_options: Mapping[str, Any] | None,
    share: int,
    address: str,
    block_id: str,
    index: int,
) -> list[str]:
    """A worker of ``pool`` joining ``address``: its cores, memory, pool and, for a
    local pool with a walltime, its deadline (a Slurm job's is its batch system's), and
    the flags of the pool's worker keys (:meth:`~actors.pools.PoolConfig.worker_flags`:
    ``--host``, ``--port-range``, ``--grace``, ``--execution``, ``--spill-dir``), and
    ``--memory-options``: ``memory_options`` with the pool's own over it. A
    Slurm worker listens on its node's address (``{host}``, which the batch script
    expands) unless the pool's ``worker_host`` says otherwise, so its peers on other
    nodes reach it. Without ``memory_per_worker``, it
    takes a ``share`` of its machine's memory (``--memory-share``): a local worker, one
    of all the local pools' workers (:func:`actors.pools.local_workers`); a Slurm worker,
    one of its node's ``workers_per_node``. A local worker without ``disk_per_worker``
    takes that share of its spill directory's file system too (``--disk-share``), which
    they all keep their outputs on."""
    from actors.slurm import HOST_PLACEHOLDER

    deadline = None
    if pool.provider == "local" and pool.walltime is not None:
        deadline = time.time() + pool.walltime
    options = {**(memory_options or {}), **pool.memory_options}  # the pool's own win
    argv = worker_argv(
        address, pool.cores_per_worker, pool.memory_per_worker, pool.name, options,
        deadline, disk=pool.disk_per_worker, share=share,
        disk_share=share if pool.provider == "local" else 1,
    )  # fmt: skip
    if pool.provider == "slurm" and not pool.worker_host:
        argv += ["--host", HOST_PLACEHOLDER]
    return argv + pool.worker_flags()


def _local_address(address: str) -> str:
    """``address`` as a worker on this machine reaches it (a wildcard host: loopback)."""
    parts = urlsplit(address)
    if parts.hostname in ("0.0.0.0", "::", ""):
        return f"{parts.scheme}://127.0.0.1:{parts.port}"
    return address


def _loopback(host: str | None) -> bool:
    """Whether ``host`` is this machine's loopback (a name or an address)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:
        return False


def cleartext_warning(address: str) -> str | None:
    """What a manager listening on ``address`` warns of (None: nothing): a ``ws://``
    address another machine can reach carries the tokens and everything else in clear
    text over the network. (Loopback is not sniffed by other users, but on a shared
    host every user can connect to it: the tokens are the barrier there.)"""
    parts = urlsplit(address)
    if parts.scheme != "ws" or _loopback(parts.hostname):
        return None
    return (
        f"listening on {address} without TLS: the tokens and all traffic cross the network "
        "in clear text, readable by anyone on its path. Off a trusted network listen on "
        "wss:// (--tls-cert, --tls-key: docs/security.md#tls), or listen on 127.0.0.1 and "
        "reach it through an SSH tunnel"
    )


def _http_url(address: str) -> str:
    """The http(s) URL of a websocket listener's ``address``, reachable from other
    machines (a wildcard host becomes this machine's name)."""
    import socket

    parts = urlsplit(address)
    host = parts.hostname or ""
    if host in ("0.0.0.0", "::", ""):
        host = socket.getfqdn()
    elif ":" in host:
        host = f"[{host}]"
    scheme = "https" if parts.scheme == "wss" else "http"
    return f"{scheme}://{host}:{parts.port}"


async def start_pools(
    plane: ControlPlane,
    pools: Mapping[str, PoolConfig],
    address: str,
    tokens: Tokens,
    *,
    memory_options: Mapping[str, Any] | None = None,
    run_dir: Path | None = None,
) -> dict[str, Provider]:
    """Build a provider per configured pool (``local``: worker processes on this
    machine; ``slurm``: batch jobs, with the pool's Slurm options) whose workers join
    the gateway at ``address`` with the worker token, run each as a service of the
    plane's system, and start the autoscaler over them with the pools' limits. A Slurm
    pool keeps its scripts and job output in ``<run_dir>/<pool>`` (default ``run_dir``:
    ``./corral-slurm/run-<time>-<pid>``)."""
    import socket

    from actors.processes import LocalProcessProvider
    from actors.slurm import SlurmProvider

    env = {"CORRAL_TOKEN": tokens.worker}  # a worker's token only: no client, no console
    if run_dir is None:  # one directory per run, one per pool in it: block ids repeat
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = Path.cwd() / "corral-slurm" / f"run-{stamp}-{os.getpid()}"
    providers: dict[str, Provider] = {}
    here = local_workers(pools)  #: the local pools' workers share this machine
    for name, pool in pools.items():
        share = here if pool.provider == "local" else pool.workers_per_node
        argv_for = functools.partial(pool_worker_argv, pool, memory_options, share)
        if pool.provider == "local":
            local = functools.partial(argv_for, _local_address(address))
            provider: Any = LocalProcessProvider(
                local,
                env=env,
                prefix=name,
                provision_delay=pool.provision_delay,
                pool=name,
                accelerators=pool.accelerators,
            )
        else:
            parts = urlsplit(address)
            remote = address
            if parts.hostname in ("0.0.0.0", "::", ""):
                remote = f"{parts.scheme}://{socket.getfqdn()}:{parts.port}"
            elif _loopback(parts.hostname):
                _log.warning(
                    "Slurm workers will dial this machine's loopback address",
                    pool=name, address=remote,
                    hint="they join only if Slurm runs them on this machine; for compute "
                    "nodes, start the manager with --listen 0.0.0.0:PORT (workers then dial "
                    "this machine's name) or --listen on an address the nodes reach",
                )  # fmt: skip
            provider = SlurmProvider(
                functools.partial(argv_for, remote), pool.slurm_options(), env=env,
                prefix=name, run_dir=run_dir / name,
            )  # fmt: skip
        await plane.system.start_service(provider.run)
        providers[name] = provider
    await start_autoscaler(plane, providers, pool_targets(pools))
    return providers


# ----------------------------------------------------------------------------- tokens


@dataclasses.dataclass(frozen=True)
class Tokens:
    """The cluster's secrets: ``admin`` for the operator's clients, the admin console and
    workers started by hand; ``read`` for consoles that only look; ``submit`` for the
    clients of people who share the manager (they submit and look, and cancel only their
    own work: :data:`ALLOWED`); ``worker`` for workers only (the manager's own pools
    give it theirs: it may say Hello as a worker and nothing else). A ``submit`` or
    ``worker`` not given is made afresh."""

    admin: str
    read: str
    # Hex: no character a shell or argparse could take for something else ("-x").
    submit: str = dataclasses.field(default_factory=lambda: secrets.token_hex(32))
    worker: str = dataclasses.field(default_factory=lambda: secrets.token_hex(32))

    @classmethod
    def generate(cls) -> Tokens:
        return cls(*(secrets.token_hex(32) for _ in TOKEN_ROLES))

    def entries(self) -> dict[str, str]:
        """Role -> token, as the token file holds them."""
        return {role: getattr(self, role) for role in TOKEN_ROLES}

    def roles(self) -> dict[str, str]:
        return {token: role for role, token in self.entries().items()}

    def of(self, role: str) -> str:
        """The token of ``role`` (``admin``, ``read``, ``submit`` or ``worker``)."""
        return self.entries()[role]

    def write(self, path: Path) -> None:
        """Write to ``path`` readable by this user only (0600), atomically; a
        :class:`CorralError` saying what to do if it cannot be (a directory there, no
        permission), leaving nothing behind."""
        if path.is_dir():
            raise CorralError(
                f"the token file {path} is a directory: give --token-file a file's path "
                f"(e.g. {path / 'tokens.json'})"
            )
        tmp: str | None = None
        try:
            private_dir(path.parent)  # ~/.corral too, if it is new
            # A new file under a random name (O_CREAT | O_EXCL, 0600, no symlink
            # followed): nothing another user planted in the directory gets the tokens.
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            with os.fdopen(fd, "w") as f:
                json.dump(self.entries(), f)
            os.replace(tmp, path)
        except OSError as exc:
            if tmp is not None:  # the admin token must not stay in a stray file
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise CorralError(
                f"cannot write the token file {path}: {exc.strerror or exc}; give "
                "--token-file a path this user can write"
            ) from None

    @classmethod
    def kept(cls, path: Path) -> Tokens | None:
        """The tokens of a manager's token file at ``path`` that a manager started with
        ``--keep-tokens`` takes up again; None when there is no file (it makes new ones).
        A file without a ``submit`` or ``worker`` entry (written before that role was)
        keeps its other tokens and gets a new one of that role (the manager writes it
        there). A file there that is not a manager's token file (JSON with distinct
        ``admin`` and ``read`` entries, and ``submit`` and ``worker`` if any, of
        :data:`KEPT_TOKEN_LEAST` characters or more), or that
        lets another user read or change it (its tokens may be theirs), is a
        :class:`TokenFileError` that says what to do: making new tokens in its place
        would lock out everyone who holds the old ones, without a word."""
        if not os.path.lexists(path):
            return None
        fix = (
            "it must be the manager's own token file (JSON with 'admin' and 'read' "
            f"entries), readable by its user only (chmod 600 {path}); to make new tokens "
            f"instead (rotate them), remove it, or start the manager without --keep-tokens"
        )
        try:
            kept = {role: read_token_file(path, role) for role in ("admin", "read")}
            for role in ("submit", "worker"):
                entry = _optional_entry(path, role)
                if entry is not None:
                    kept[role] = entry
        except TokenFileError as exc:
            raise TokenFileError(
                exc.path, f"{exc.problem.partition('; write')[0]} (--keep-tokens: {fix})"
            ) from None
        if len(set(kept.values())) < len(kept):
            raise TokenFileError(
                os.fspath(path),
                f"holds one token (or the same one twice), not a manager's admin and read "
                f"tokens (and its submit and worker tokens, if any: all distinct) "
                f"(--keep-tokens: {fix})",
            )
        if min(map(len, kept.values())) < KEPT_TOKEN_LEAST:
            raise TokenFileError(
                os.fspath(path),
                f"its admin, read, submit and worker tokens must have {KEPT_TOKEN_LEAST} "
                "characters or more each, or they are guessed (a manager writes 64 random "
                "hexadecimal characters each; python -c 'import secrets; "
                f"print(secrets.token_hex(32))' makes one) (--keep-tokens: {fix})",
            )
        return cls(**kept)

    @classmethod
    def read_file(cls, path: Path, give: str = "") -> Tokens:
        """The tokens in a manager's token file. ``give``: how the caller is given a
        token, for the error of a missing file (:data:`GIVE_TOKEN_PY` for a Python
        client; by default a command's ``--token``)."""
        try:
            data = json.loads(path.read_text())
            return cls(
                str(data["admin"]), str(data["read"]), str(data.get("submit", "")),
                str(data.get("worker", "")),
            )  # fmt: skip
        except FileNotFoundError:
            give = give or GIVE_TOKEN_CLI
            which = TOKEN_TO_COPY.get(give, "the admin token")
            port = path.stem.rpartition("_")[2]
            others = sorted(p.name for p in path.parent.glob(f"*_{port}.json")) if port else []
            here = (
                f" This machine has token files for that port under other host names: "
                f"{', '.join(others)} (a file is named after the address the manager "
                f"listened on: use that host in the address, or pass {which} from the file "
                f"{give})."
                if others
                else ""
            )
            look = (
                "; to look only, pass the read token it printed (in its dashboard URL) the same way"
                if give == GIVE_TOKEN_CLI
                else ""  # a client submits work: the read token is refused
            )
            raise CorralError(
                f"no token file at {path}: a manager writes its tokens there, named after "
                "the address it listens on (or at its --token-file), on its machine, for "
                "its user, under $CORRAL_HOME/tokens (default ~/.corral/tokens: a manager "
                "started with CORRAL_HOME set wrote them under that directory, so set the "
                f"same CORRAL_HOME here).{here} Otherwise copy {which} from that file on the "
                f"manager's machine and pass it {give}{look}"
            ) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise CorralError(f"token file {path} is not valid: {exc}") from exc


#: the fewest characters :meth:`Tokens.kept` takes in a kept token (a manager makes 64)
KEPT_TOKEN_LEAST = 32


#: the roles of a manager's tokens, in :class:`Tokens`' order (its token file's entries)
TOKEN_ROLES = ("admin", "read", "submit", "worker")

#: the entry a role takes from a manager's token file that has none of its own (written
#: by a manager from before that role): a worker takes the ``worker`` entry, else the
#: ``admin`` one (:func:`read_token_file`, :func:`find_token`)
ROLE_FALLBACK = {"worker": "admin"}


def _optional_entry(path: Path, role: str) -> str | None:
    """The ``role`` entry (``submit``, ``worker``) of a manager's token file (read and
    checked already by :func:`read_token_file`), None when it has none (a file written
    before the role was, or by hand with ``admin`` and ``read`` only); one that is not a
    token is refused as :func:`read_token_file` refuses it."""
    try:
        has = role in json.loads(path.read_text())
    except (OSError, ValueError, TypeError):
        has = False
    return read_token_file(path, role) if has else None


#: how a console, a worker and a Python client (``Cluster(address)``,
#: ``runtime.get(..., address=...)``) are given a token: for :meth:`Tokens.read_file`'s
#: error. A file first: a --token on a command line is shown by ps to every user. Only
#: a console may look with the read token (the others are refused it).
GIVE_TOKEN_CLI = (
    "in a file readable by you only (chmod 600) with --token-file PATH (or --token, which "
    "ps shows to other users, or CORRAL_TOKEN)"
)
GIVE_TOKEN_WORKER = (
    "to this worker in a file readable by you only (chmod 600) with --token-file PATH (or "
    "set CORRAL_TOKEN); a worker needs the worker token (that file's 'worker' entry: the "
    "better choice) or the admin token, not the read token"
)
GIVE_TOKEN_PY = (
    "as token= (or the path of a file holding it as token_file=) to Cluster(address, ...) "
    "or runtime.get(..., address=...), or set CORRAL_TOKEN"
)

#: the token of a manager's token file to copy, for how it is given (a ``give`` above):
#: a worker's, a client's; a console's (:data:`GIVE_TOKEN_CLI`): the admin token
TOKEN_TO_COPY = {
    GIVE_TOKEN_WORKER: "the worker token (its 'worker' entry)",
    GIVE_TOKEN_PY: "the submit token (its 'submit' entry; the admin token if you are the "
    "cluster's operator)",
}


def token_path(address: str) -> Path:
    """Where the manager listening on ``address`` keeps its tokens (one file per port)."""
    parts = urlsplit(address)
    host = parts.hostname or "local"
    port = parts.port or 0
    return corral_home() / "tokens" / f"{host}_{port}.json"


def worker_token_refused(
    address: str,
    status: int,
    token: str | None,
    token_file: str | os.PathLike[str] | None,
    from_env: bool = False,
) -> AuthenticationFailed:
    """What a worker raises when the manager at ``address`` refuses its token in the
    handshake (HTTP ``status``), at its start or when it rejoins: the likely cause (the
    manager made new tokens when it started) and what to do, for where the token came
    from (``token``: ``--token``; ``token_file``: ``--token-file``; ``from_env``:
    ``CORRAL_TOKEN``, which the worker took out of its environment at its start
    (:func:`take_env_token`); else the manager's token file on this machine)."""
    if token:
        source = (
            "This worker presented the token it was given (--token): start it again with "
            "the manager's current worker token (or its admin token), best in a file of its "
            "own (mode 0600) with --token-file PATH"
        )
    elif token_file is not None:
        source = (
            f"This worker presented the token of --token-file {os.fspath(token_file)} (its "
            "'worker' entry, or its 'admin' entry if it has none, if it is a manager's token "
            "file): write the manager's current worker token (or its admin token) in it and "
            "start the worker again"
        )
    elif from_env:
        source = (
            "This worker presented CORRAL_TOKEN from the environment (it wins over the "
            "manager's token file on this machine): set it to the manager's current worker "
            "token (or its admin token), or unset it"
        )
    else:
        source = (
            "This worker presented the worker token (or, without one, the admin token) of "
            f"{token_path(address)}, where a manager listening at that address on this "
            "machine writes its tokens: one running elsewhere (another machine, another "
            "CORRAL_HOME or --token-file) has others; give its worker token (or its admin "
            "token) with --token-file PATH (mode 0600)"
        )
    return AuthenticationFailed(
        address,
        f"the manager refused this worker's token (HTTP {status}); was it restarted with "
        f"new tokens? {source} (a manager started with --keep-tokens keeps its tokens "
        "across restarts: docs/security.md#keeping-tokens-across-restarts)",
        status,
    )


def stale_token_hint(
    address: str,
    token: str | None,
    token_file: str | os.PathLike[str] | None,
    from_env: bool = False,
) -> str:
    """What a worker's log says, at each try its manager refuses its token (HTTP 403)
    while it keeps trying (``--connect-retry``): the likely cause, and what mends it
    without a restart of the worker where a restart is not needed (its token file is
    read again at each try; a ``--token`` or ``CORRAL_TOKEN`` is not). The arguments
    as :func:`worker_token_refused`'s."""
    cause = (
        "the manager probably restarted without --keep-tokens and made new tokens "
        "(docs/security.md#keeping-tokens-across-restarts)"
    )
    if token or from_env:
        given = "--token" if token else "CORRAL_TOKEN set to it"
        return f"{cause}: stop this worker and start it again with its new worker token ({given})"
    where = os.fspath(token_file) if token_file is not None else token_path(address)
    return (
        f"{cause}: copy the 'worker' entry of the manager's token file into {where}, which "
        "this worker reads again at each try"
    )


def take_env_token() -> str | None:
    """``CORRAL_TOKEN`` (None: unset or empty), removed from this process's environment:
    a worker calls it once, at its start, and keeps the token in memory for its rejoins.
    A task run in the worker's own process (thread execution) then does not find it in
    ``os.environ``, nor does a program it starts (``env``) inherit it, and neither do
    the worker's task processes (process execution). ``/proc/self/environ`` still shows
    the environment the process started with (docs/security.md)."""
    return os.environ.pop("CORRAL_TOKEN", None) or None


#: why the gateway refuses a client (``Cluster``, ``runtime.get``) that presents the read
#: token; the client adds where its token came from (``Cluster._hello``)
READ_TOKEN_CLIENT = (
    "this token is read-only; clients (Cluster, runtime.get) need the submit token (or the "
    "admin token, the operator's): the read token only looks (a console with --read-only, "
    "GET /metrics, the dashboard), and a client submits work"
)


#: the roles of the tokens that may say Hello as a worker
WORKER_TOKEN_ROLES = frozenset({"worker", "admin"})

#: why the gateway refuses a worker that presents another token (read, submit)
WORKER_NEEDS = (
    "workers need the worker token (the 'worker' entry of the manager's token file), or "
    "the admin token"
)

#: why the gateway refuses a client or a console that presents the worker token
WORKER_TOKEN_OTHER = (
    "this token is the worker token, which only joins workers (Hello as a worker): a "
    "client (Cluster, runtime.get) needs the submit token (or the admin token, the "
    "operator's), a console the read token to look (or the submit or admin token); each "
    "is an entry of the manager's token file"
)


#: why the gateway refuses a pickled message (a GatherRequest: results; a graph, a
#: function) from a connection with the read token
READ_TOKEN_PICKLE = (
    "this connection has the read token, which only looks: it may not read results nor "
    "send graphs or functions (pickled messages); use the submit token (or the admin "
    "token, the operator's)"
)


def find_token(
    address: str,
    token: str | None,
    role: str = "admin",
    token_file: str | os.PathLike[str] | None = None,
    give: str = "",
) -> str | None:
    """The token to present: given (``token``, or the one in ``token_file``: not both,
    :class:`TokenFileError`), else ``CORRAL_TOKEN``, else the local token file (``give``:
    as for :meth:`Tokens.read_file`)."""
    check_one_token(token, token_file)
    if token_file is not None:
        return read_token_file(token_file, role, give)
    if token:
        return token
    if os.environ.get("CORRAL_TOKEN"):
        return os.environ["CORRAL_TOKEN"]
    path = local_token_file(address, token, token_file)
    if path is None:
        return None
    tokens = Tokens.read_file(path, give)  # a role it has none of: "" (ROLE_FALLBACK)
    return tokens.of(role) or tokens.of(ROLE_FALLBACK.get(role, role))


def local_token_file(
    address: str, token: str | None, token_file: str | os.PathLike[str] | None
) -> Path | None:
    """The manager's token file on this machine that :func:`find_token` reads for
    ``address``: none when a token or token file is given, ``CORRAL_TOKEN`` is set, or
    the address takes no token (not ``ws://`` or ``wss://``)."""
    if token_file is not None or token or os.environ.get("CORRAL_TOKEN"):
        return None
    return token_path(address) if address.startswith(("ws://", "wss://")) else None


async def find_token_there(
    address: str,
    token: str | None,
    role: str = "admin",
    token_file: str | os.PathLike[str] | None = None,
    timeout: float | None = None,  # noqa: ASYNC109 (transport.connect's)
    give: str = "",
) -> str | None:
    """:func:`find_token`, for a worker, console or client about to connect: where it
    would read a manager's token file on this machine that is not there, it first tries
    the address, and raises its :class:`ConnectFailed` when nothing accepts the
    connection (a wrong port, a manager not up yet: not a token to copy); only when
    something answers, the missing token file."""
    path = local_token_file(address, token, token_file)
    if path is not None and not path.exists():
        from transport import connect

        try:
            conn = await connect(address, timeout=timeout)
        except AuthenticationFailed:
            pass  # a listener that wants a token: the token file is what is missing
        except ConnectFailed as exc:
            exc.add_note(
                f"(Nor is there a token file for that address on this machine, at {path}: "
                "a manager on this machine listening there writes its tokens there.)"
            )
            raise
        else:
            await conn.aclose()
    return find_token(address, token, role, token_file, give)


def worker_pool_error(pool: object, given: str, example: str) -> PoolNameError | None:
    """The error of a worker's pool that no pool may have (``""``, blank, ``"*"``:
    :func:`~runtime.messages.pool_name_problem`), given as ``given`` (``--pool``,
    ``run_worker(pool=...)``, ``Cluster(pool=...)``, a worker's Hello); ``example``: how
    to give a pool there. None for a pool's name."""
    problem = pool_name_problem(pool)
    if not problem:
        return None
    return PoolNameError(
        pool, given, problem,
        f"Name the pool its workers serve ({example}), or leave it out for the pool 'default'",
    )  # fmt: skip


def check_worker_pool(pool: object, given: str, example: str) -> None:
    """:func:`worker_pool_error` raised, before the worker (or cluster) starts."""
    error = worker_pool_error(pool, given, example)
    if error is not None:
        raise error


#: the most a token file (``--token-file``) may hold: a token is 64 characters, the
#: manager's own token file about 150; anything far larger is the wrong file
TOKEN_FILE_LIMIT = 64 * 1024


def check_one_token(token: str | None, token_file: str | os.PathLike[str] | None) -> None:
    """:class:`TokenFileError` when both a token and a token file are given."""
    if token and token_file is not None:
        raise TokenFileError(
            os.fspath(token_file),
            "given together with a token (--token, token=): give one of them, the file "
            "rather than the token itself (a --token on a command line is shown by ps to "
            "every user of the machine)",
        )


def read_token_file(path: str | os.PathLike[str], role: str = "admin", give: str = "") -> str:
    """The token in the file at ``path`` (``--token-file`` of a worker or console,
    ``Cluster(address, token_file=...)``; ``~`` is expanded): its text less the
    whitespace around it, one word; or, from a manager's own token file
    (``Tokens.write``: JSON with ``admin`` and ``read`` entries, e.g. on a shared file
    system), its ``role`` entry (without one, its :data:`ROLE_FALLBACK` entry: a
    worker's ``worker`` entry, else its ``admin`` one).

    :class:`TokenFileError`, saying what to do, for a file that is missing, a
    directory, unreadable, open to other users (any permission for group or others:
    ``chmod 600``, as ssh asks of a private key), empty, more than one word, larger
    than :data:`TOKEN_FILE_LIMIT`, or JSON without that entry. The error never quotes
    the file's text; it says to write the ``role`` token there, a Python client's
    (``give``: :data:`GIVE_TOKEN_PY`) the submit token, or the operator's admin token."""
    import shlex
    import stat

    shown = os.fspath(path)
    quoted = shlex.quote(shown)
    asked, operator = (
        ("submit", "; its 'admin' entry if you are the cluster's operator")
        if give == GIVE_TOKEN_PY
        else (role, "")
    )
    fix = (
        f"write the manager's {asked} token in it (the {asked!r} entry of the manager's own "
        f"token file, ~/.corral/tokens/HOST_PORT.json on its machine{operator}), readable by "
        f"you only (chmod 600 {quoted})"
    )

    def refuse(problem: str) -> TokenFileError:
        return TokenFileError(shown, problem)

    try:
        # Non-blocking: a FIFO without a writer would hang open() (refused below).
        fd = os.open(os.path.expanduser(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(fd).st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(path)
            if not stat.S_ISREG(mode):
                raise refuse(f"is not a regular file ({stat.filemode(mode)}); {fix}")
            if mode & 0o077:
                raise refuse(
                    f"its permissions ({stat.filemode(mode)}) let other users read or change "
                    "it, and a token in it is theirs to use; as ssh does with a private key "
                    f"that is too open, it is not used. Make it yours only: chmod 600 {quoted}"
                )
            data = f.read(TOKEN_FILE_LIMIT + 1)
    except FileNotFoundError:
        where = (
            ""
            if os.path.isabs(os.path.expanduser(shown))
            else f" (from the working directory {os.getcwd()})"
        )
        raise refuse(f"no such file{where}; {fix}") from None
    except IsADirectoryError:
        raise refuse(
            "is a directory: give the path of the file that holds the token (one line, "
            "the token; or the manager's own token file)"
        ) from None
    except PermissionError:
        raise refuse(
            "this user may not read it: it must be readable by the user the process runs "
            f"as (its owner, chmod 600 {quoted})"
        ) from None
    except OSError as exc:
        raise refuse(f"cannot be read: {exc.strerror or exc}") from None
    if len(data) > TOKEN_FILE_LIMIT:
        raise refuse(
            f"holds more than {TOKEN_FILE_LIMIT // 1024} KiB: not a token file (a token is "
            f"one word, 64 characters); {fix}"
        )
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        raise refuse(f"is not text (a token is 64 hexadecimal characters); {fix}") from None
    if not text:
        raise refuse(f"is empty; {fix}")
    if text.startswith("{"):
        fallback = ROLE_FALLBACK.get(role)
        try:
            entries = json.loads(text)
            entry = entries.get(role, entries.get(fallback) if fallback else None)
        except (ValueError, AttributeError):
            entry = None
        if not isinstance(entry, str) or not entry.strip():
            wanted = f"{role!r} entry" + (f" (or {fallback!r})" if fallback else "")
            raise refuse(
                f"is not one token, nor a manager's token file with the {wanted} "
                f"(JSON with 'admin' and 'read' entries); {fix}"
            )
        return entry.strip()
    if len(text.split()) > 1:
        raise refuse(
            "holds more than one word: a token file holds one token (or is the manager's "
            f"own token file); {fix}"
        )
    if not text.isprintable():
        raise refuse(f"holds control characters, which a token never has; {fix}")
    return text


def _kept_token_path(address: str, token_file: Path | None) -> Path:
    """Where a manager started with ``--keep-tokens`` on ``address`` finds the tokens
    it keeps: its ``token_file``, else the token file of its address, which must have
    a fixed port (with port 0 each start listens, and writes, elsewhere)."""
    if token_file is not None:
        return token_file
    if not address.startswith(("ws://", "wss://")):
        raise ValueError(f"--keep-tokens: a manager on {address} has no tokens to keep")
    if not urlsplit(address).port:
        raise ValueError(
            f"--keep-tokens needs a fixed port (--listen {address} picks a free one at each "
            "start, and its token file is named after it) or a --token-file PATH"
        )
    return token_path(address)


# ----------------------------------------------------------------------------- gateway


@message("corral.Hello")
class Hello(Message):
    """First frame on every connection to a manager: who connects."""

    kind: str  #: "worker", "client" or "console"
    #: worker id (its own listen address, or the id its provider gave it), or a unique
    #: client name
    name: str
    info: WorkerInfo | None = None
    #: a returning worker: the secret its id was given at registration (Welcome)
    secret: str = ""
    #: the protocol version the peer speaks (:data:`PROTOCOL_VERSION`); a Hello without
    #: it comes from a Corral of before protocol versions, and reads as 0
    protocol: int = PROTOCOL_VERSION

    absent_reads_as: ClassVar[Mapping[str, Any]] = MappingProxyType({"protocol": 0})


@message("corral.Welcome")
class Welcome(Message):
    """Gateway -> worker, client or console, the answer to its Hello: joined. ``secret``
    is what the worker must present (``Hello.secret``) to rejoin under its id (a
    client's and a console's are empty). Each waits for it (:func:`say_hello`) before it
    sends anything else. (A console of before 2026-12-07 expects none, and drops it
    unread; a manager of before then sends a console none: :func:`say_hello`.)"""

    secret: str
    #: to a worker: the manager's worker token, which its workers present to each other
    #: (and accept from each other) whichever token each joined with, so a worker
    #: started by hand with the admin token and one of a pool (the worker token) fetch
    #: from each other ("" without tokens)
    peer_token: str = ""


@message("corral.PeerQuery")
class PeerQuery(Message):
    """Worker -> gateway: how to reach the worker ``worker``. Answered by the gateway
    itself (it never reaches an actor) with that worker's :class:`WorkerInfo`, whose
    ``address`` its peers connect to, or None when no such worker is joined. A worker
    needs it for peers whose id is not their address: those a provider started under
    the id it gave them (``--name``), so that the autoscaler knows them by id."""

    worker: str


async def _shorten_on(event: anyio.Event, scope: anyio.CancelScope, seconds: float) -> None:
    """Once ``event`` is set, bring ``scope``'s deadline to at most ``seconds`` on."""
    await event.wait()
    scope.deadline = min(scope.deadline, anyio.current_time() + seconds)


async def _answer(conn: Any, stop: anyio.Event, scope: anyio.CancelScope) -> Any:
    """The message ``conn`` receives next (the manager's answer to a Hello), read in
    ``scope``, whose deadline ``stop`` set brings to :data:`STOP_WELCOME_WAIT` on at
    most. What the read raises comes out as it is (``ConnectionClosed``: a manager that
    dropped the connection, tried again as one that did not answer), not in the
    ``ExceptionGroup`` of the task group that watches ``stop``."""
    failed: list[Exception] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_shorten_on, stop, scope, STOP_WELCOME_WAIT)
        try:
            answer = (await conn.receive()).msg
        except Exception as exc:
            failed.append(exc)
        tg.cancel_scope.cancel()
    if failed:
        raise failed.pop()
    return answer


async def say_hello(
    conn: Any, hello: Hello, address: str, limit: float, *, allow_pickle: bool
) -> None:
    """Send ``hello`` (a client's or a console's) on ``conn`` and wait, at most ``limit``
    seconds, for the manager's :class:`Welcome`, before anything else is sent: a
    manager that refuses the Hello is then heard saying why, not answering what came
    after it (``the first frame ... must be a Hello ... got Ping``). Its ``Refused``
    raises the error it carries (:class:`ProtocolMismatch`, :class:`PermissionDenied`;
    a :class:`RemoteError` of that kind when not ``allow_pickle``); an ``ErrorReply``,
    the reason of a manager that could not read the Hello, raises
    :func:`~runtime.remote.not_welcomed`'s ``ProtocolError`` (another Corral version:
    "upgrade the manager first"); no answer in time, or a closed connection,
    :class:`ConnectFailed`. A console also takes a first ``Ping`` (a manager's
    heartbeat) for its welcome: a manager of its protocol from before 2026-12-07 welcomes
    no console, and pings it once it has taken its Hello."""
    from runtime.codec import Frame
    from runtime.messages import Ping
    from transport import ConnectionClosed

    await conn.send(Frame(hello))
    try:
        with anyio.fail_after(limit):
            answer = (await conn.receive()).msg
    except TimeoutError:
        raise ConnectFailed(
            address, f"the manager did not answer this {hello.kind}'s Hello within {limit:g} s"
        ) from None
    except ConnectionClosed as exc:
        raise ConnectFailed(
            address, f"the connection closed before the manager answered ({exc})"
        ) from None
    if isinstance(answer, Welcome) or (hello.kind == "console" and type(answer) is Ping):
        return
    if isinstance(answer, Refused):
        raise refusal_error(answer, allow_pickle=allow_pickle)
    raise not_welcomed(answer, address, hello.kind)


#: What the gateway tells a connection whose first frame breaks them.
HELLO_RULES = (
    "the first frame on a connection to a Corral manager must be a Hello: kind 'worker' "
    "(worker or admin token; name = the worker's id, info.worker_id the same; a returning "
    "worker presents the secret it was given), 'client' (admin or submit token) or "
    "'console' (admin, submit or read token), with a name of 1 to 256 characters that no "
    "other connection uses"
)

#: Longest name a Hello may carry.
MAX_NAME = 256

#: Refused messages a connection may send before it is closed (the next one closes it).
MAX_REFUSED = 10
#: seconds a client's ended connection may take to have the streams it left unread
#: closed on their workers (told to the manager; past it they expire idle, as before)
CLOSE_STREAMS_WITHIN = 5.0


_READ: frozenset[type[Message]] = frozenset(
    {StatusRequest, StoryRequest, TasksQuery, StoryQuery, PolicyQuery, AlertsRequest}
)

#: What a client with the submit token may send besides the reads: its own work
#: (submit, gather, release and cancel its own keys: :data:`OWN_CLIENT`), wait for
#: workers, and run a function on them (``Cluster.run``: code, as a graph is). Not the
#: operator's commands (the console's cancel of any key or run, policies, scaling,
#: draining, alert rules). ``ProgressQuery`` is a client's, not a read: its answer hands
#: over the keys that ended since the last one (each said once) and ``stop`` lets the
#: run's counts go, so a read-token console asking it of a run (``run-N``, numbered in
#: turn) would take them from the compute's own client (its ProgressBar short of them).
_SUBMIT: frozenset[type[Message]] = _READ | {
    SubmitGraphRequest,
    ProgressQuery,
    GatherRequest,
    ReadStream,
    CloseStream,
    ReleaseKeysRequest,
    CancelRequest,
    WaitForWorkersRequest,
    RunRequest,
}

#: The messages a ``submit`` connection may send only for itself: their ``client``
#: must be the connection's own name (its Hello's), so that it releases and cancels
#: its own keys only (a cancel spares what other clients' keys need: ``Manager._cancel``).
OWN_CLIENT: frozenset[type[Message]] = frozenset(
    {SubmitGraphRequest, ReleaseKeysRequest, CancelRequest}
)

#: The roles whose connections may send pickles (functions, graphs: opening them runs
#: code) and messages of any size: the ones that submit work.
SUBMITTING_ROLES = frozenset({"admin", "submit"})

#: What each role may send, by exact message type; the gateway refuses anything else
#: before it reaches an actor. ``admin``: a client or console with the admin token (to
#: the manager); ``submit``: a client or console with the submit token (to the manager;
#: some messages for itself only, :data:`OWN_CLIENT`); ``read``: a console with the
#: read token (to the manager); ``worker``: a worker process (to the scheduler; and only
#: about itself, see :func:`_its_own`).
ALLOWED: Mapping[str, frozenset[type[Message]]] = MappingProxyType(
    {
        "read": _READ,
        "submit": _SUBMIT,
        "admin": _SUBMIT
        | {
            CancelKeysRequest,
            MoveRequest,
            SetPolicyRequest,
            ScaleRequest,
            ResumeRequest,
            DrainRequest,
            UndrainRequest,
            ForgetCategoryRequest,
            AlertRuleAdd,
            AlertRuleRemove,
        },
        "worker": frozenset(
            {
                TasksDone,
                TasksStarted,
                WorkerMemoryReport,
                WorkerGone,
                WorkerHolds,
                Leaving,
                Evacuated,
                CheckpointSaved,
                OutputUnpicklable,
            }
        ),
    }
)


#: why a connection with the submit token may not send an operator's command
SUBMIT_TOKEN_REFUSED = (
    "needs the admin token (the operator's); this connection has the submit token, which "
    "submits work, gathers its results, cancels and releases its own keys, waits for "
    "workers and looks (status, tasks, stories, policies, alerts). Ask the cluster's "
    "operator (who holds the admin token) to do it"
)


#: the roles that speak for themselves only: the field of a message that names whom
#: it is for, and what a refusal of one for someone else says
_ITS_OWN = {
    "worker": (
        "worker_id",
        "about worker {who!r} refused: the connection of worker {name!r} speaks for that "
        "worker only",
    ),
    "submit": (
        "client",
        "for client {who!r} refused: a connection with the submit token acts for its own "
        "client ({name!r}) only",
    ),
}


#: runs submitted through the gateway with ``progress`` whose submitting connection it
#: keeps (:attr:`Gateway.progress_runs`) until their client's last ``ProgressQuery``
#: (``stop``): past it, the oldest is let go (a client that never asked its last one)
MAX_PROGRESS_OWNERS = 1024

#: why a submit connection may not ask the progress of a run another client submitted
_NOT_ITS_RUN = (
    "ProgressQuery of run {run!r} refused: a connection with the submit token asks the "
    "progress of its own client's runs only ({name!r} did not submit it through this "
    "manager); each compute under dask's callbacks asks its own"
)


def _its_own(role: str, msg: Any, name: str, owners: Mapping[str, str]) -> bool:
    """A worker speaks for itself only: its results, its memory, its leaving. A submit
    connection submits, releases and cancels for its own client only (:data:`OWN_CLIENT`),
    and asks the progress of its own client's runs only (``owners``: run -> the client
    that submitted it with ``progress``): the answer hands over the keys that ended since
    the last ask, each once, and ``stop`` lets the run's counts go."""
    if role == "submit" and type(msg) is ProgressQuery:
        return owners.get(msg.run) == name
    if role == "worker" or (role == "submit" and type(msg) in OWN_CLIENT):
        field = _ITS_OWN[role][0]
        return getattr(msg, field, name if role == "worker" else None) == name
    return True


def _refusal(role: str, name: str, msg: Any) -> PermissionDenied:
    what = type(msg).__name__
    if role == "read":
        return PermissionDenied(what)
    if role == "submit" and type(msg) is ProgressQuery:
        return PermissionDenied(what, _NOT_ITS_RUN.format(run=msg.run, name=name))
    if role in _ITS_OWN and type(msg) in ALLOWED[role]:
        field, text = _ITS_OWN[role]
        return PermissionDenied(
            what, f"{what} " + text.format(who=getattr(msg, field, "?"), name=name)
        )
    if role == "submit":
        return PermissionDenied(what, f"{what} {SUBMIT_TOKEN_REFUSED}")
    if role == "worker":
        allowed = ", ".join(sorted(t.__name__ for t in ALLOWED["worker"]))
        return PermissionDenied(what, f"{what} may not be sent by a worker (it sends {allowed})")
    return PermissionDenied(what, f"{what} is not accepted from other processes")


#: reads (status, stories, task listings, policies) one connection may make per second,
#: and in a burst: past that, its reads wait their turn. A flood from one console slows
#: that console down, not the scheduler.
READS_PER_SECOND = 20.0
READ_BURST = 40
#: asks from one read-token or worker-token connection served at once: past that the
#: gateway reads nothing more from it until one is answered, so a flood of asks (a
#: read-only console's 100,000 status asks once took the manager from 80 to 560 MiB
#: and blocked its event loop 7.5 s) waits at its sender, not in the manager's memory.
#: Their asks are all short (reads; a worker's PeerQuery); a client's and an admin
#: console's, which may wait long (a gather), are not bounded so.
MAX_ASKS = 64
#: A read-token connection's asks are served only while it has room for their answers
#: (Peer's ``reply_room``: its send credits exceed the asks being served, the bytes
#: queued to send are under the transport's bound, one answer computed at a time): a
#: listing of 10,000 tasks is ~7 MB of objects, and a console asking for such listings
#: without reading them once grew the manager from 119 to 770 MiB in 23 s. Not a
#: worker's: its asks are answered from a table, and its connection carries the tells
#: that free it (a worker waiting to send those must not stop the manager reading it).


class _Pace:
    """A token bucket: :meth:`take` returns at once while tokens last, else waits for
    the next one (in arrival order); it returns the seconds it waited."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.stamp: float | None = None  #: when tokens were counted (None: full)
        self._lock = anyio.Lock()

    async def take(self) -> float:
        async with self._lock:
            now = anyio.current_time()
            if self.stamp is not None:
                self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            wait = 0.0
            if self.tokens < 1:
                wait = (1 - self.tokens) / self.rate
                await anyio.sleep(wait)
                self.tokens = 1.0
                self.stamp = now + wait
            self.tokens -= 1
            return wait


def unsendable_tries(
    worker: str, post: Callable[[TasksDone], Any]
) -> Callable[[Any, FrameTooLarge], bool]:
    """What a worker's connection does with a message of tries too large to send even on
    its own (a :class:`~runtime.remote.Peer`'s ``on_too_large``), on either side: each
    try in it fails with a typed error, reported to the scheduler in a ``TasksDone``
    given to ``post`` (the scheduler's ``post`` on the manager's side, the connection's
    own on the worker's), so no try stays running for want of a report. A task of a
    ``RunTasks`` (to ``worker``) fails with :class:`TaskArgumentsTooLarge`; a try of a
    ``TasksDone`` (from ``worker``) with :class:`TaskErrorTooLarge`, standing for its
    error (its other fields kept, but the fetch timings). Anything else, or a report
    of such failures that is still too large, it leaves to the peer, which logs it as
    dropped."""

    def unsendable(msg: Any, exc: FrameTooLarge) -> bool:
        size, limit = int(exc.fields.get("size", 0)), int(exc.fields.get("limit", 0))
        results: tuple[TaskResult, ...]
        if isinstance(msg, RunTasks):
            event = "task too large to send to a worker"
            results = tuple(
                TaskResult(
                    t.key,
                    "error",
                    error=TaskArgumentsTooLarge(str(t.key), size, limit),
                    attempt=t.attempt,
                )
                for t in msg.tasks
            )
        elif isinstance(msg, TasksDone) and not all(
            isinstance(r.error, TaskErrorTooLarge) for r in msg.results
        ):
            event = "report of a try too large to send to the manager"
            results = tuple(
                dataclasses.replace(
                    r,
                    outcome="error",
                    nbytes=0,
                    file=False,
                    fetches=(),
                    error=_stand_in(r, size, limit),
                )
                for r in msg.results
            )
        else:
            return False
        _log.warning(
            event, worker=worker, keys=[str(r.key) for r in results], size=size, limit=limit
        )
        with contextlib.suppress(CorralError):
            post(TasksDone(worker, results))
        return True

    return unsendable


def _stand_in(result: TaskResult, size: int, limit: int) -> TaskErrorTooLarge:
    """The error that stands for how ``result`` ended, whose report was ``size`` bytes,
    more than the ``limit`` a message may carry: it names its error, if it has one."""
    error = result.error or RuntimeError(
        f"its try ended {result.outcome}, but the report of it was too large to send"
    )
    return too_large_error(error, result.key, size, limit)


class _Door:
    """The actor a connection reaches, as its role allows: every message is checked
    against :data:`ALLOWED` before it is handed on. A refused ask raises
    :class:`PermissionDenied` (the asker gets it); a refused tell is dropped, logged and
    counted; after :data:`MAX_REFUSED` refusals the next one closes the connection."""

    def __init__(self, gateway: Gateway, target: ActorRef[Any], role: str, name: str) -> None:
        self.gateway = gateway
        self.target = target  #: the scheduler (a worker's door) or the manager: so Any
        self.role = role
        self.name = name
        self.allowed = ALLOWED[role]
        self.peer: Peer | None = None
        self.refused = 0  #: messages refused on this connection
        self.pace = _Pace(READS_PER_SECOND, READ_BURST)  #: this connection's reads
        self.said_goodbye = False  #: a worker's WorkerGone came through (it left)
        #: the streams a gather's answer offered this connection (read through the
        #: manager, ``ReadStream``) that it has not read to their end: ``(worker,
        #: stream)`` -> bytes left. A client killed mid-read leaves them open on their
        #: workers, each holding its value's pickle, until their idle expiry (2 minutes);
        #: they are closed when the connection ends (:meth:`close_streams`)
        self.streams = _OfferedStreams()

    def check(self, msg: Any) -> None:
        owners = self.gateway.progress_runs
        if type(msg) in self.allowed and _its_own(self.role, msg, self.name, owners):
            return
        raise _refusal(self.role, self.name, msg)

    async def _refused(self, msg: Any, error: PermissionDenied, asked: bool) -> None:
        self.refused += 1
        self.gateway.refused_messages += 1
        _log.warning(
            "refused a message", peer=self.name, role=self.role, message=type(msg).__name__,
            asked=asked, refused=self.refused, reason=str(error),
        )  # fmt: skip
        peer = self.peer
        if self.refused > MAX_REFUSED and peer is not None and not peer.closed:
            _log.warning("closing a connection that keeps sending refused messages",
                         peer=self.name, role=self.role, refused=self.refused)  # fmt: skip
            self.gateway.closed_for_refusals += 1
            await peer.refuse(
                PermissionDenied(
                    "this connection",
                    f"closed after {self.refused} refused messages (the {self.role!r} role "
                    f"may send: {', '.join(sorted(t.__name__ for t in self.allowed))}); "
                    f"last: {error}",
                )
            )

    async def _paced(self, msg: Any) -> None:
        if type(msg) in _READ and await self.pace.take():
            self.gateway.paced_reads += 1

    async def tell(self, msg: Any, *, causal_id: str | None = None, origin: str = "") -> None:
        try:
            self.check(msg)
        except PermissionDenied as exc:
            await self._refused(msg, exc, asked=False)
            return
        await self._paced(msg)  # a paced tell holds up this connection's reading
        if type(msg) is WorkerGone:
            self.said_goodbye = True
        self.streams.told(msg)
        await self.target.tell(msg, causal_id=causal_id, origin=origin or self.name)

    async def ask(
        self,
        msg: Any,
        *,
        timeout: float | None = 30.0,  # noqa: ASYNC109 - ActorRef's API
        causal_id: str | None = None,
    ) -> Any:
        if self.role == "worker" and type(msg) is PeerQuery:
            return self.gateway.infos.get(msg.worker)
        try:
            self.check(msg)
        except PermissionDenied as exc:
            await self._refused(msg, exc, asked=True)
            raise
        await self._paced(msg)
        if self.role == "submit" and type(msg) is SubmitGraphRequest:
            # the manager holds a submit-token graph to [scheduler] submit_max_priority
            fields = {f.name: getattr(msg, f.name) for f in dataclasses.fields(msg)}
            msg = SubmitRoleGraphRequest(**fields)
        if type(msg) is GatherRequest:
            return await self.streams.answer(self.target, msg, timeout, causal_id)
        try:
            reply = await self.target.ask(msg, timeout=timeout, causal_id=causal_id)
        except UnknownPolicyError as exc:
            if exc.kind not in KINDS:  # no such kind anywhere: nothing to register
                raise
            # Registered in the asker's process, perhaps: it must be in this one.
            raise UnknownPolicyError(exc.kind, exc.name, exc.available, in_manager=True) from None
        # (a submit-token graph goes on as a SubmitRoleGraphRequest, a SubmitGraphRequest)
        if isinstance(msg, SubmitGraphRequest) and msg.progress and isinstance(reply, SubmitReply):
            self.gateway.progress_owned(reply.run, self.name)
        elif type(msg) is ProgressQuery and msg.stop:
            self.gateway.progress_runs.pop(msg.run, None)
        if type(msg) is ReadStream:
            self.streams.read(msg, reply)
        return reply

    async def close_streams(self) -> None:
        """The connection ended: the streams offered to it that it did not read to
        their end are closed on their workers now (through the manager, which relays
        ``CloseStream``), so their values' pickles do not stay in the workers' memory
        until the streams' idle expiry."""
        await self.streams.close(self.target)


class _OfferedStreams:
    """The streams offered over one connection (a gather's answer to a client, through
    the manager; a ``GetData`` answer to a peer worker) that its reader has not read to
    their end: ``(worker, stream)`` -> bytes left. A reader killed mid-read leaves them
    open on their worker, each holding its value's pickle until its idle expiry
    (``IDLE_SECONDS``, 2 minutes); :meth:`close` closes them when the connection ends,
    also those of an answer still under way then (:meth:`answer`)."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, int], int] = {}
        self.closed = False  #: the connection ended (:meth:`close`)

    async def answer(self, target: Any, msg: Any, limit: float | None, causal_id: Any) -> Any:
        """``target``'s answer to ``msg`` (a ``GatherRequest``, a ``GetData``): not cut by the
        connection's end, so that the streams it opens are closed at once then. The
        answerer bounds it (a gather: each worker's answer within its timeout)."""
        with anyio.CancelScope(shield=True):
            reply: Any = await target.ask(msg, timeout=limit, causal_id=causal_id)
            if isinstance(reply, GatherResult | DataReply):
                for info in reply.streams:
                    if sum(info.sizes):
                        self.open[(info.worker, info.stream)] = sum(info.sizes)
            if self.closed:
                await self.close(target)
        return reply

    def told(self, msg: Any) -> None:
        """A message its reader sent: a ``CloseStream`` closes that stream itself."""
        if type(msg) is CloseStream:
            self.open.pop((msg.worker, msg.stream), None)

    def read(self, msg: ReadStream, part: Any) -> None:
        """A part of a stream was read: one read to its end is closed by its worker."""
        at = (msg.worker, msg.stream)
        left = self.open.get(at)
        if left is not None and type(part) is StreamPart:
            if left > len(part.data):
                self.open[at] = left - len(part.data)
            else:
                del self.open[at]

    async def close(self, target: Any) -> None:
        """The connection ended: tell ``target`` to close the streams left unread."""
        self.closed = True
        streams, self.open = self.open, {}
        for worker, stream in streams:
            with contextlib.suppress(ActorStopped):  # the manager is stopping
                await target.tell(CloseStream(stream, worker))


class _PeerDoor:
    """What a worker's peer connection reaches: the worker, with the streams its
    ``GetData`` answers offer the peer followed (:class:`_OfferedStreams`), so that a
    peer killed mid-fetch leaves none open."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.streams = _OfferedStreams()

    async def tell(self, msg: Any, *, causal_id: str | None = None, origin: str = "") -> None:
        self.streams.told(msg)
        await self.target.tell(msg, causal_id=causal_id, origin=origin)

    async def ask(
        self,
        msg: Any,
        *,
        timeout: float | None = 30.0,  # noqa: ASYNC109 - ActorRef's API
        causal_id: str | None = None,
    ) -> Any:
        if type(msg) is GetData:
            return await self.streams.answer(self.target, msg, timeout, causal_id)
        reply = await self.target.ask(msg, timeout=timeout, causal_id=causal_id)
        if type(msg) is ReadStream:
            self.streams.read(msg, reply)
        return reply


@dataclasses.dataclass(eq=False)
class _Hold:
    """A worker id kept for its worker's rejoin: the connection dropped without a
    goodbye. It ends when the worker is back (with its secret), when its grace is
    over (lost), or when a new process says Hello under the id without a secret (a
    crashed worker started again: the old one is lost at once, the id is the new one's)."""

    until: float  #: wall clock: when the grace ends
    cause: str  #: what the worker is lost as if it does not come back
    link: Link | None  #: the scheduler's reference to it
    back: anyio.Event = dataclasses.field(default_factory=anyio.Event)  #: the hold ended early
    taken_over: bool = False  #: by a new process under the id
    ending: bool = False  #: its grace is over: it is being reported lost


@dataclasses.dataclass(eq=False)
class _Other:
    """A client or console connection holding a name (:attr:`Gateway._others`), told
    apart from any later connection under the name by identity."""

    kind: str  #: "client" or "console"
    peer: Peer | None = None  #: set once it is served (None: it is being welcomed)
    #: its handler's task group while it is served: a give-way refuses it there
    tg: anyio.abc.TaskGroup | None = None


class Gateway:
    """Joins connections from other processes to a control plane."""

    def __init__(
        self,
        plane: ControlPlane,
        *,
        reconnect_timeout: float = RECONNECT_TIMEOUT,
        heartbeat: float = HEARTBEAT,
        dead_after: float = DEAD_AFTER,
        client_dead_after: float | None = None,
        hello_timeout: float = HELLO_TIMEOUT,
    ) -> None:
        self.plane = plane
        self.reconnect_timeout = reconnect_timeout
        #: seconds a connection has to send its Hello (:data:`HELLO_TIMEOUT`)
        self.hello_timeout = hello_timeout
        self.no_hello = 0  #: connections closed for sending no Hello in time
        self.heartbeat = heartbeat
        self.dead_after = dead_after
        #: clients, consoles (None: CLIENT_DEAD_AFTER, read now: tests may set it)
        allowed = CLIENT_DEAD_AFTER if client_dead_after is None else client_dead_after
        self.client_dead_after = max(dead_after, allowed)
        self.peers: dict[str, Peer] = {}  #: live peers by name
        self._generation: dict[str, int] = {}  #: connections seen per name
        #: a dropped worker's id -> its hold (kept for its rejoin till its grace ends)
        self._holds: dict[str, _Hold] = {}
        self.links: dict[str, Link] = {}  #: the scheduler's reference to each worker
        self._secrets: dict[str, str] = {}  #: worker id -> the secret it rejoins with
        #: client and console connections by name, being welcomed or live (a worker's
        #: Hello under one of these names closes it: :meth:`_give_way`)
        self._others: dict[str, _Other] = {}
        self.infos: dict[str, WorkerInfo] = {}  #: joined workers (answers PeerQuery)
        self.refused_hellos = 0  #: connections refused at their Hello
        self.refused_messages = 0  #: messages refused at the door (all connections)
        #: run -> the client connection that submitted it with ``progress`` (the only
        #: submit connection that may ask its ``ProgressQuery``), till its last ask
        self.progress_runs: dict[str, str] = {}
        self.closed_for_refusals = 0  #: connections closed for sending refused messages
        self.paced_reads = 0  #: reads that waited their turn (a connection over its pace)
        #: the manager's token file (its absolute path; "" if it has none), told to a
        #: client refused for the read token: where the admin token is
        self.token_file = ""
        #: the manager's worker token, told to each worker in its Welcome: what its
        #: workers present to each other ("" without tokens: :func:`serve_gateway`)
        self.peer_token = ""
        #: the manager stops on purpose (:meth:`say_goodbye`): connections that end now
        #: are not drops, and no worker id is held for a rejoin
        self.stopping = False
        plane.resolvers.append(self.resolve)

    def progress_owned(self, run: str, client: str) -> None:
        """``client``'s connection submitted ``run`` with ``progress``: it alone (of the
        submit connections) may ask the run's ``ProgressQuery``."""
        owners = self.progress_runs
        owners[run] = client
        while len(owners) > MAX_PROGRESS_OWNERS:
            del owners[next(iter(owners))]

    def resolve(self, name: str) -> RemoteRef | None:
        peer = self.peers.get(name)
        return peer.ref if peer is not None and not peer.closed else None

    async def watch_loop(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Warn, once per stall, when this process's event loop did not run for
        :data:`LOOP_BLOCKED_WARN` seconds or more (a long synchronous call in the
        program that embeds the manager: a notebook cell, ``time.sleep``,
        ``runtime.get``; a long garbage collection; the process stopped): its workers
        heard nothing meanwhile. The record is written when the loop runs again, and
        kept in the plane's ``stalls`` (the latest :data:`STALLS_KEPT`) for an embedded
        ``Cluster`` to log again at its next call (:meth:`stall_record`). Every tick
        (:data:`LOOP_TICK`) notes how late it woke in the plane's ``loop_lag``
        (``corral_manager_loop_lag_seconds``)."""
        task_status.started()
        while True:
            due = anyio.current_time() + LOOP_TICK
            await anyio.sleep(LOOP_TICK)
            now = anyio.current_time()
            late = now - due
            self.plane.loop_lag.note(now, late)
            if late >= LOOP_BLOCKED_WARN:
                record = self.stall_record(late)
                _log.warning("event loop blocked", **record)
                # Written between a notebook's cells, maybe: an embedded Cluster says it
                # again at its next call, in the cell that makes it.
                if len(self.plane.stalls) >= STALLS_KEPT:
                    del self.plane.stalls[0]
                at = time.strftime("%H:%M:%S UTC", time.gmtime())  # not localtime()
                self.plane.stalls.append({**record, "at": at})

    def stall_record(self, seconds: float) -> dict[str, Any]:
        """The fields of the manager's ``event loop blocked`` record for a stall of
        ``seconds``: the workers joined, and what the manager and they do about it."""
        joined = sorted(name for name in self._secrets if name in self.infos)
        return {
            "seconds": round(seconds, 1),
            "workers": joined[:LOST_NAMES],
            "more": max(0, len(joined) - LOST_NAMES),
            "what": (
                "the manager's event loop did not run, so its workers heard nothing from "
                "it: their silence meanwhile is not counted against them; a worker that "
                "closed its connection meanwhile keeps its tasks, and its id is held "
                f"{self.reconnect_timeout:g} s for its rejoin; workers started by this "
                "process wait for it as long as it lives"
            ),
            "hint": (
                "keep long synchronous work off the event loop that runs the cluster: "
                "await anyio.to_thread.run_sync(...) (docs/api.md, In a Jupyter notebook)"
            ),
        }

    def _hello_refusal(self, hello: Any, role: str) -> CorralError | None:
        """Why this first frame may not join (None: it may). Changes nothing."""
        if (
            not isinstance(hello, Hello)
            or hello.kind not in ("worker", "client", "console")
            or not 0 < len(hello.name) <= MAX_NAME
        ):
            got = type(hello).__name__
            if isinstance(hello, Hello):
                got = f"Hello(kind={hello.kind[:40]!r}, name of {len(hello.name)} characters)"
            return ProtocolError(f"{HELLO_RULES}; got {got}")
        if hello.protocol != PROTOCOL_VERSION:  # before anything else: it cannot be served
            return ProtocolMismatch(
                hello.kind, hello.name[:MAX_NAME], hello.protocol, PROTOCOL_VERSION, CORRAL_VERSION
            )
        name = hello.name
        live = self.peers.get(name)
        if hello.kind == "worker":
            if role not in WORKER_TOKEN_ROLES:
                return PermissionDenied(
                    "Hello as a worker",
                    f"this token is {'read-only' if role == 'read' else f'the {role} token'}; "
                    f"{WORKER_NEEDS}",
                )
            if hello.info is None or hello.info.worker_id != name:
                return ProtocolError(f"{HELLO_RULES}; got a worker Hello whose info does not match")
            refused = worker_pool_error(hello.info.pool, "a worker's pool", "--pool gpu")
            if refused is not None:
                return refused
            # A client or console under the name gives way (handle): it may not keep a
            # worker out, whatever its token (pool workers' ids are easy to guess).
            secret = self._secrets.get(name)
            if (
                secret is not None
                and not hmac.compare_digest(hello.secret.encode(), secret.encode())
                and self._taken_over(hello) is None
            ):
                return PermissionDenied("worker id", self._held(name))
            return None
        if role == "worker":  # the worker token: nothing but a worker
            return PermissionDenied(
                f"Hello as a {hello.kind}", WORKER_TOKEN_OTHER, token_file=self.token_file
            )
        if role not in SUBMITTING_ROLES and hello.kind == "client":
            return PermissionDenied(
                "Hello as a client", READ_TOKEN_CLIENT, token_file=self.token_file
            )
        other = self._others.get(name)
        if (
            (live is not None and not live.closed)
            or name in self._secrets  # a worker's, or reserved by its Hello being welcomed
            or (other is not None and other.peer is None)  # another one being welcomed
        ):
            return PermissionDenied(
                "name", f"the name {name!r} is in use by another connection; pick a unique one"
            )
        return None

    def _taken_over(self, hello: Hello) -> _Hold | None:
        """The hold this worker ``Hello`` ends (None: none). A Hello with no secret at
        all under the id of a worker whose connection dropped, its grace running, comes
        from a process started afresh under that id (a crashed worker started again by
        its supervisor: the old process's connection is gone, and the new one holds
        nothing): it takes the id over rather than wait out the grace. Only an admin
        connection says Hello as a worker; a wrong secret is not a fresh start and is
        refused, and a worker still connected keeps its id."""
        hold = self._holds.get(hello.name)
        if hold is None or hold.ending or hello.secret:
            return None
        return hold

    def _held(self, name: str) -> str:
        """Why the worker id ``name`` is not free: its worker is joined, or it dropped
        and its id is kept for its rejoin until its grace ends (then free)."""
        needs = "rejoining under it needs the secret that worker was given when it registered"
        hold = self._holds.get(name)
        if hold is None:
            return (
                f"worker id {name!r} belongs to a registered worker, connected now; {needs}. "
                "The id is free again as soon as that worker has left"
            )
        left = max(0.0, hold.until - time.time())
        at = time.strftime("%H:%M:%S", time.gmtime(hold.until))
        return (
            f"worker id {name!r} is held for a rejoin: its worker's connection dropped "
            f"without a goodbye, and the manager keeps the id and the worker's work for "
            f"{self.reconnect_timeout:g} s (its reconnect timeout) in case it comes back; "
            f"{needs}. The id is free at {at} UTC: wait {math.ceil(left):g} s, or start "
            "the worker afresh (a new process, with no secret, takes the id over at once), "
            "or use another id"
        )

    async def handle(self, conn: Any) -> None:
        """Serve one connection (a listener's ``serve`` handler)."""
        from runtime.codec import Frame
        from transport import ConnectionClosed

        try:
            with anyio.fail_after(self.hello_timeout):
                first = await conn.receive()
        except TimeoutError:
            self.no_hello += 1
            conn.note_refusal(NO_HELLO)
            await conn.aclose(
                f"no Hello within {self.hello_timeout:g} s of connecting (a Corral worker, "
                "client or console sends it at once)"
            )
            return
        except ConnectionClosed:
            await conn.aclose()
            return
        hello = first.msg
        role = getattr(conn, "role", None) or "admin"  # no authentication configured
        refusal = self._hello_refusal(hello, role)
        if isinstance(refusal, ProtocolMismatch):
            self.refused_hellos += 1
            _log.error(
                "refused a peer of another Corral protocol version", peer=conn.peer_address,
                kind=refusal.kind, name=refusal.name, its_protocol=refusal.peer,
                protocol=refusal.manager, version=CORRAL_VERSION, reason=str(refusal),
            )  # fmt: skip
            autoscaler = self.plane.refs.get("autoscaler")
            if refusal.kind == "worker" and role in WORKER_TOKEN_ROLES and autoscaler:
                # A pool's worker (its block ends as it exits): not a crash, and the
                # pool's next block would be refused the same way. (A full mailbox:
                # skipped; the block's end is then read as a crash, as before.)
                with contextlib.suppress(MailboxFull, ActorStopped):
                    autoscaler.tell_nowait(RefusedWorker(refusal.name, str(refusal)))
            # A peer older than the class reads it as the ProtocolError it knows.
            plain = ProtocolError(str(refusal)) if refusal.peer == 0 else None
            await refuse(conn, refusal, readable=plain)
            return
        if refusal is not None:
            self.refused_hellos += 1
            _log.warning(
                "refused a connection", peer=conn.peer_address, role=role,
                kind=getattr(hello, "kind", type(hello).__name__),
                name=str(getattr(hello, "name", ""))[:MAX_NAME], reason=str(refusal),
            )  # fmt: skip
            await refuse(conn, refusal)
            return
        assert isinstance(hello, Hello)
        # Hello accepted: raise the connection's receive limits by role (issue 9).
        trusted = role in SUBMITTING_ROLES or hello.kind == "worker"  # a worker: its results
        conn.set_limits(max_message_bytes=None if trusted else 256 << 10)
        if hello.kind == "worker":
            door = _Door(self, self.plane.refs["scheduler"], "worker", hello.name)
            lost = self._taken_over(hello)
            if lost is not None:  # forgotten now: no other Hello takes the id meanwhile
                self._forget_worker(hello.name)
                lost.taken_over = True
                lost.back.set()  # its connection's handler closes its link later
            new = hello.name not in self._secrets
            # Reserved before anything is awaited: a Hello under the name meanwhile (a
            # client's, a console's, another worker's without this secret) is refused.
            secret = self._secrets.setdefault(hello.name, secrets.token_hex(16))
            welcomed = False
            try:
                if hello.name in self._others:
                    await self._give_way(hello.name, conn.peer_address)
                if lost is not None:
                    # Lost now, as at the end of its grace; told before the new one registers.
                    _log.warning(
                        "worker restarted under its id: the old one is lost",
                        worker=hello.name, cause=lost.cause, peer=conn.peer_address,
                    )  # fmt: skip
                    with contextlib.suppress(ActorStopped):  # the scheduler is stopping
                        await self.plane.refs["scheduler"].tell(WorkerGone(hello.name, lost.cause))
                await conn.send(Frame(Welcome(secret, self.peer_token)))
                welcomed = True
            except CorralError:  # gone before it heard its secret
                await conn.aclose()
                return
            finally:
                if not welcomed and new:  # the id stays free
                    self._secrets.pop(hello.name, None)
        else:
            other = self._others[hello.name] = _Other(hello.kind)
            door = _Door(self, self.plane.manager, role, hello.name)
            # A client or console waits for this before it sends anything else
            # (say_hello): refused (a client with the read token, another version),
            # it fails at connect, not at its first call. One gone already still has
            # what it sent read, as any closing connection has.
            with contextlib.suppress(CorralError):
                await conn.send(Frame(Welcome("")))
            if hello.kind == "client" and self._others.get(hello.name) is other:
                with contextlib.suppress(ActorStopped):  # the manager is stopping
                    await self.plane.manager.tell(ClientCame(hello.name))
                if self._others.get(hello.name) is not other:
                    # Its ClientGone (the give-way's) may have been queued first.
                    with contextlib.suppress(ActorStopped):
                        await self.plane.manager.tell(ClientGone(hello.name))
            if self._others.get(hello.name) is not other:  # a worker took it meanwhile
                await self._tell_gave_way(conn, hello.name, hello.kind)
                return
        generation = self._generation.get(hello.name, 0) + 1
        self._generation[hello.name] = generation
        hold = self._holds.pop(hello.name, None)
        if hold is not None:
            hold.back.set()
        peer = Peer(
            conn, door, name=hello.name, allow_pickle=trusted,
            no_pickle=READ_TOKEN_PICKLE if role == "read" else "",
            max_asks=MAX_ASKS if door.role in ("read", "worker") else None,
            reply_room=door.role == "read",
            heartbeat=self.heartbeat,
            timeout=self.dead_after if hello.kind == "worker" else self.client_dead_after,
            on_too_large=(
                unsendable_tries(hello.name, self.plane.refs["scheduler"].post)
                if hello.kind == "worker"
                else None
            ),
        )  # fmt: skip
        door.peer = peer
        old = self.peers.get(hello.name)
        self.peers[hello.name] = peer
        if hello.kind != "worker":
            # Nothing was awaited since the check above: it holds the name still.
            try:
                await self._serve_other(hello.name, other, peer)
            finally:
                with anyio.move_on_after(CLOSE_STREAMS_WITHIN, shield=True):
                    await door.close_streams()
            return
        if old is not None and not old.closed:
            await old.aclose()
        assert hello.info is not None
        # its token's role: a worker joined with the admin token still (not the worker token)
        _log.info("worker connected", worker=hello.name, generation=generation, role=role)
        link = self.links.get(hello.name)
        if link is None or link.stopped:
            link = self.links[hello.name] = Link(hello.name)
        link.attach(peer)
        self.infos[hello.name] = hello.info
        # A worker that rejoins registers again: the scheduler keeps its work.
        await self.plane.refs["scheduler"].tell(RegisterWorker(hello.info, link))
        try:
            await peer.run()
        finally:
            if self.peers.get(hello.name) is peer:
                # Silence means we cannot tell why; a dropped connection without a
                # goodbye (a graceful worker says WorkerGone first) is a crash.
                cause = "unknown" if peer.closed_reason else "crash"
                self.links[hello.name].detach()
                if self.stopping:  # closed by us, told why: it leaves, not rejoins
                    _log.info("worker connection closed: the manager is stopping",
                              worker=hello.name)  # fmt: skip
                else:
                    await self._worker_dropped(
                        hello.name, generation, cause, left=door.said_goodbye
                    )

    async def _serve_other(self, name: str, other: _Other, peer: Peer) -> None:
        """Serve the client or console ``other`` under ``name`` until its connection
        ends, in a task group of its own, where a give-way refuses it (:meth:`_give_way`);
        then, unless it gave way (forgotten then), its name is free again."""
        try:
            async with anyio.create_task_group() as tg:
                other.peer, other.tg = peer, tg
                if self._others.get(name) is not other:  # a worker took it meanwhile
                    self._refuse_other(name, other)
                await peer.run()
        finally:
            if self._others.get(name) is other:
                await self._forget_other(name, other)

    async def _forget_other(self, name: str, other: _Other) -> None:
        """The client or console ``other`` under ``name`` is gone: its name is free
        again, and the manager is told that a client went."""
        del self._others[name]
        self.peers.pop(name, None)
        self._generation.pop(name, None)  # a name per session: forgotten
        if other.kind == "client":
            with contextlib.suppress(ActorStopped):  # the manager is stopping
                await self.plane.manager.tell(ClientGone(name))

    async def _give_way(self, name: str, by: str) -> None:
        """A worker says Hello under ``name``, which a client or console connection
        holds: that connection is forgotten now (so its own handler's end leaves the
        worker's name alone), then closed, told why, in its own handler's task group
        (the worker's Hello does not wait for one that does not read), or by its
        handler itself if it is still being welcomed. Worker ids come first: a
        connection that only looks or submits may not keep a worker out."""
        other = self._others[name]
        await self._forget_other(name, other)
        _log.warning(
            "a worker joins under the name of a connection that is not a worker's; closed it",
            name=name, kind=other.kind, peer=by,
        )  # fmt: skip
        self._refuse_other(name, other)

    def _refuse_other(self, name: str, other: _Other) -> None:
        """Start closing ``other``, which gave ``name`` way, in its handler's task group
        (nothing if it is not served yet: its handler refuses it itself)."""
        if other.tg is not None and other.peer is not None:
            other.peer.closed_reason = f"refused: {self._gave_way(name, other.kind)}"
            other.tg.start_soon(self._tell_gave_way, other.peer.conn, name, other.kind)

    async def _tell_gave_way(self, conn: Any, name: str, kind: str) -> None:
        """Close ``conn``, a client's or console's under ``name``, saying it gave way to
        a worker: the frame that says so is sent within :data:`GIVE_WAY_TIMEOUT` (a
        connection that does not read gives no credit for it), else only the close
        says it."""
        error = self._gave_way(name, kind)
        with anyio.move_on_after(GIVE_WAY_TIMEOUT):
            await refuse(conn, error)
        await conn.aclose(reason=str(error))

    @staticmethod
    def _gave_way(name: str, kind: str) -> PermissionDenied:
        """What a client or console under ``name`` is told when a worker takes it."""
        return PermissionDenied(
            "name",
            f"{name!r} is the id of a worker that joined: this {kind} connection gave way "
            "to the worker (worker ids come first). Connect again under another name",
        )

    async def say_goodbye(self, address: str, how: str = STOP_SIGNALS) -> None:
        """The manager stops on purpose (``how``): tell every connection so
        (:class:`ManagerStopping` in a ``Refused`` frame: its workers leave rather than
        try to rejoin) and close it, all at once, within :data:`GOODBYE_TIMEOUT`."""
        self.stopping = True
        goodbye = ManagerStopping(address, how)
        with anyio.move_on_after(GOODBYE_TIMEOUT):
            async with anyio.create_task_group() as tg:
                for peer in list(self.peers.values()):
                    if not peer.closed:
                        tg.start_soon(peer.say_goodbye, goodbye)
        for peer in list(self.peers.values()):  # what did not close in time
            await peer.aclose()

    async def _worker_dropped(
        self, name: str, generation: int, cause: str, *, left: bool = False
    ) -> None:
        """Give a worker ``reconnect_timeout`` seconds to come back, then report it. One
        that ``left`` (it said WorkerGone first, so the scheduler knows already and its
        connection's end is no loss) is not waited for: its id is free at once."""
        if left:
            link = self._forget_worker(name)
            _log.info("worker connection closed after it left", worker=name)
            # Its link ends later: the scheduler may send to it until it reads the
            # goodbye, and a send that fails would report the worker lost (by name:
            # by then, maybe a new worker under that id).
            await anyio.sleep(self.reconnect_timeout)
            if link is not None:
                link.close()
            return
        until = time.time() + self.reconnect_timeout
        hold = self._holds[name] = _Hold(until, cause, self.links.get(name))
        # Away from now: no new work, its cores not counted; lost, it ended now. Posted
        # (not told) so that it is queued before the RegisterWorker of its rejoin.
        with contextlib.suppress(ActorStopped):  # the scheduler is stopping
            self.plane.refs["scheduler"].post(WorkerDropped(name))
        _log.warning(
            "worker connection dropped; its id is held for its rejoin", worker=name,
            seconds=self.reconnect_timeout, until=time.strftime("%H:%M:%S UTC", time.gmtime(until)),
        )  # fmt: skip
        with anyio.move_on_after(self.reconnect_timeout):
            await hold.back.wait()
        if hold.taken_over:
            # Reported lost by the new process's Hello. Its link ends later, as a left
            # worker's: the scheduler may send to it until it reads the WorkerGone, and
            # a send that fails would report the new worker under the id lost.
            await anyio.sleep(self.reconnect_timeout)
            if hold.link is not None:
                hold.link.close()
            return
        if self._generation.get(name) != generation:
            return  # back in time (or a newer connection serves the id)
        hold.ending = True  # no fresh start takes it over while it is reported lost
        _log.warning("worker connection lost", worker=name)
        # Told before the id is free: a new worker under it registers after this.
        with contextlib.suppress(ActorStopped):  # the scheduler is stopping
            await self.plane.refs["scheduler"].tell(WorkerGone(name, cause))
        if self._generation.get(name) == generation:
            link = self._forget_worker(name)
            if link is not None:
                link.close()

    def _forget_worker(self, name: str) -> Link | None:
        """The worker ``name`` is gone for good: its id is free again. Returns its link
        (the scheduler's reference to it), for the caller to close."""
        self._holds.pop(name, None)
        self.peers.pop(name, None)
        self._generation.pop(name, None)
        self._secrets.pop(name, None)
        self.infos.pop(name, None)
        return self.links.pop(name, None)


# ----------------------------------------------------------------------------- processes


class Link:
    """A reference to the other side of a connection that survives reconnections: a
    worker's reference to the manager, and the scheduler's reference to each remote
    worker.

    While connected, messages go straight to the current connection. While not, posts
    wait in order (both directions are bounded by the worker's task slots) and are sent
    first when the connection is back; ``tell`` and ``ask`` wait for it. Once
    :meth:`close` is called (the other side is given up), it behaves like a stopped
    actor: everything raises ``ActorStopped``.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.peer: Peer | None = None
        self.backlog: list[tuple[Message, str]] = []
        self._connected = anyio.Event()
        self._closed = False

    @property
    def stopped(self) -> bool:
        return self._closed

    def close(self) -> None:
        self._closed = True
        self.backlog.clear()
        self._connected.set()  # wake waiters: they see the link closed

    def attach(self, peer: Peer) -> None:
        self.peer = peer
        backlog, self.backlog = self.backlog, []
        for msg, causal_id in backlog:
            peer.ref.post(msg, causal_id=causal_id or None)
        self._connected.set()

    def detach(self) -> None:
        self.peer = None
        self._connected = anyio.Event()

    def _check(self, msg: Any) -> None:
        if self._closed:
            raise ActorStopped(self.name, type(msg).__name__)

    def post(self, msg: Message, *, causal_id: str | None = None) -> None:
        self._check(msg)
        peer = self.peer
        if peer is not None and not peer.closed:
            try:
                peer.ref.post(msg, causal_id=causal_id)
                return
            except CorralError:
                pass
        self.backlog.append((msg, causal_id or ""))

    def tell_nowait(self, msg: Message, *, causal_id: str | None = None) -> None:
        self.post(msg, causal_id=causal_id)

    async def _current(self, msg: Message) -> Peer:
        """The connection to send ``msg`` on, once there is one (``ActorStopped`` once
        the link is closed). Waiting for the connection event yields even when it is
        set already, and the connection may drop meanwhile (``detach``): so the peer is
        read after the wait, and a dropped one means waiting for the next."""
        while True:
            self._check(msg)
            peer = self.peer
            if peer is not None:
                return peer
            await self._connected.wait()

    async def tell(self, msg: Message, *, causal_id: str | None = None) -> None:
        peer = await self._current(msg)
        await peer.ref.tell(msg, causal_id=causal_id)

    async def ask(
        self,
        msg: Message,
        *,
        timeout: float | None = 30.0,  # noqa: ASYNC109 - ActorRef's API
        causal_id: str | None = None,
    ) -> Any:
        with anyio.fail_after(timeout if timeout is not None else float("inf")):
            peer = await self._current(msg)
        return await peer.ref.ask(msg, timeout=timeout, causal_id=causal_id)


#: seconds a second interrupt waits at most for ``give_up`` (the monitoring database's
#: writer dropping its backlog and writing the run's end) before the process exits
GIVE_UP_TIMEOUT = 10.0


def _stop_signals() -> tuple[signal.Signals, ...]:
    """The signals :func:`_until_signalled` stops the process on: SIGINT, SIGTERM and
    SIGHUP, but not SIGHUP when this process was started ignoring it (``nohup``: it
    means to outlive its terminal, and a handler would undo that)."""
    hangup = () if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN else (signal.SIGHUP,)
    return (signal.SIGINT, signal.SIGTERM, *hangup)


async def _until_signalled(
    on_signal: Callable[[], Awaitable[None]],
    give_up: Callable[[], Awaitable[int | None]] | None = None,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Call ``on_signal`` at the first SIGINT, SIGTERM or SIGHUP (:data:`STOP_SIGNALS`:
    a closed terminal's hangup stops the process in order too, unless it was started
    under ``nohup``, :func:`_stop_signals`; its log line names the signal), then keep
    the signals: a batch system signals every process of a job, and the job script's
    trap passes the signal on, so a worker gets SIGTERM twice as it starts to copy its
    outputs away; with Python's default handler back, the second one would end it
    half-way. A second SIGINT (Ctrl-C again) stops the process with exit status 130: at
    once, or once ``give_up`` has returned (a manager's monitoring database drops the
    rows it was catching up on and writes the run's end:
    :func:`runtime.monitordb.give_up_all`; the rows dropped in all, None when there was
    nothing to give up), waited for at most :data:`GIVE_UP_TIMEOUT` seconds; a third
    SIGINT meanwhile stops it at once."""
    with anyio.open_signal_receiver(*_stop_signals()) as signals:
        task_status.started()
        stopping = giving_up = False
        async with anyio.create_task_group() as tg:
            async for signum in signals:
                name = signal.Signals(signum).name
                if not stopping:
                    stopping = True
                    _log.info("stopping on signal", signal=name)
                    await on_signal()
                elif signum != signal.SIGINT:
                    _log.info("already stopping; signal ignored", signal=name)
                elif giving_up or give_up is None:
                    _log.warning(
                        "another interrupt: exiting now" if giving_up
                        else "second interrupt: exiting now, without a graceful stop"
                    )  # fmt: skip
                    kill_task_processes()  # and the programs their tasks started
                    os._exit(130)
                else:
                    giving_up = True
                    tg.start_soon(_give_up_then_exit, give_up)


async def _give_up_then_exit(give_up: Callable[[], Awaitable[int | None]]) -> None:
    """The second interrupt with something to give up: ``give_up()``, bounded, then
    exit 130 (see :func:`_until_signalled`). Shielded: the give-up lets the recorder's
    stop end too, and the process's shutdown, which cancels this task, must not win the
    race and leave with status 0."""
    dropped: int | None = None
    with anyio.CancelScope(shield=True), anyio.move_on_after(GIVE_UP_TIMEOUT) as scope:
        dropped = await give_up()
    if scope.cancelled_caught:
        _log.warning("second interrupt: giving up took too long; exiting now",
                     limit_s=GIVE_UP_TIMEOUT)  # fmt: skip
    elif dropped is None:
        _log.warning("second interrupt: exiting now, without a graceful stop")
    else:
        _log.warning(
            "second interrupt: exiting now; the monitoring database's backlog dropped "
            "(runs.dropped_rows)",
            dropped_rows=dropped,
        )  # fmt: skip
    kill_task_processes()
    os._exit(130)


async def _lifeline(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """In a worker started by a local process provider: exit when the parent is gone."""
    from actors.processes import watch_lifeline

    task_status.started()
    await watch_lifeline(kill_task_processes)  # their programs are in groups of their own


def _dashboard_sources(plane: ControlPlane) -> Sources:
    """What the dashboard asks the manager (runtime/dashboard.py): the metrics (those
    of ``/metrics``, with the failure groups and the latest tries), the status, the
    alerts, a task's story, and the total queue depth alone (while no page is open)."""
    from runtime.dashboard import Sources
    from runtime.messages import (
        AlertsReply,
        AlertsRequest,
        MetricsReply,
        MetricsRequest,
        StatusReply,
        StatusRequest,
    )

    @shared_call  # (a story page asks it too: shared with the feed's)
    async def metrics() -> MetricsReply:
        reply = await plane.manager.ask(MetricsRequest(details=True), timeout=10.0)
        assert isinstance(reply, MetricsReply)
        return reply

    async def status() -> StatusReply:
        # (the page shows no per-category statistics: a run may have many thousands)
        reply = await plane.manager.ask(StatusRequest(categories=False), timeout=10.0)
        assert isinstance(reply, StatusReply)
        return reply

    async def alerts() -> AlertsReply:
        reply = await plane.manager.ask(AlertsRequest(), timeout=10.0)
        assert isinstance(reply, AlertsReply)
        return reply

    async def story(key: str) -> list[list[str]]:
        rows = await plane.manager.ask(StoryQuery((key,)), timeout=10.0)
        return [[str(x) for x in row] for row in rows]

    async def depth() -> int:
        # The scheduler's own answer (its counters, never the tasks): no autoscaler ask.
        reply = await plane.refs["scheduler"].ask(MetricsRequest(), timeout=10.0)
        return sum(p.queue_depth for p in reply["pools"].values())

    return Sources(metrics, status, alerts, story, depth)


async def run_manager(
    listen: str,
    *,
    tokens: Tokens | None = None,
    token_file: Path | None = None,
    policies: dict[str, tuple[str, dict[str, Any]]] | None = None,
    ready: Callable[[str, Tokens], None] | None = None,
    reconnect_timeout: float = RECONNECT_TIMEOUT,
    listen_options: dict[str, Any] | None = None,
    on_gateway: Callable[[Gateway], None] | None = None,
    on_monitoring: Callable[[MonitorWriter], None] | None = None,
    config: str | os.PathLike[str] | Mapping[str, PoolConfig] | None = None,
    metrics_listen: str | None = None,
    metrics_ready: Callable[[str], None] | None = None,
    alerting: AlertingConfig | None = None,
    alertmanager: str | None = None,
    monitoring: str | os.PathLike[str] | None = None,
    monitoring_interval: float = 2.0,
    monitoring_keep: float | None = None,
    prune_depth: int | None = None,
    long_task: float | None = None,
    unknown_long: bool | None = None,
    worker_timeout: float = DEAD_AFTER,
    client_timeout: float | None = None,
    keep_tokens: bool = False,
    scheduler: Mapping[str, Any] | None = None,
    sources: Mapping[str, str] | None = None,
    config_file: str | os.PathLike[str] | None = None,
    gc_threshold: int | None = GC_THRESHOLD,
) -> None:
    """Run a manager process until SIGINT, SIGTERM or SIGHUP: control plane + gateway on
    ``listen`` (``host:port``, ``ws://host:port`` or any transport address). Cancelled
    (an embedding program's cancel scope), it stops as on SIGTERM, shielded and bounded
    (:func:`_stop_manager`, then every actor in order), and the cancellation goes on.

    ``worker_timeout``: seconds a worker may be silent (its heartbeats stop while a task
    holds the GIL) before the manager counts it lost (:func:`check_worker_timeout`);
    ``client_timeout``: seconds a client or console may be silent (its event loop busy
    with the user's code) before the manager drops it (:func:`check_client_timeout`;
    None: :data:`CLIENT_DEAD_AFTER`); ``reconnect_timeout``: seconds a worker whose
    connection dropped keeps its id (and its work) for its rejoin before it is counted
    lost (:func:`check_reconnect_timeout`).

    Metrics (docs/monitoring.md): a websocket gateway also answers ``GET /metrics``
    (Prometheus' text format) and serves the live dashboard (``GET /``,
    runtime/dashboard.py) to the read or admin token; ``metrics_listen``
    (``host:port``) serves them besides without authentication, and
    ``metrics_ready`` is called with its ``http://host:port/metrics`` URL.
    ``monitoring``: the path of the monitoring database it writes (None: none; the
    command line's default is a new run directory, :func:`runtime.monitordb.default_path`);
    ``monitoring_keep``: seconds of history it keeps (None: all; docs/monitoring.md);
    ``on_monitoring`` is called with its writer once it is open (before ``ready``): its
    ``upgraded`` says whether an older file was upgraded and where its copy is.

    ``config``: configured pools (a TOML file, or pools from
    :func:`~actors.pools.pools_from_dicts`), checked before anything starts
    (:class:`~runtime.errors.PoolConfigError`). The manager then runs an autoscaler
    that keeps each pool's blocks (worker processes on this machine, or Slurm jobs)
    within its limits, with the ``demand`` strategy unless ``policies`` picks another
    scaling policy, and the pools' ``fallback`` in the default retry policy. Without
    pools it has no autoscaler: workers join it by themselves.

    Alerts (docs/monitoring.md): ``alerting``, else the ``[alerting]`` and ``[[alerts]]``
    tables of a ``config`` file, else the default rules, logged
    (:class:`~runtime.errors.AlertConfigError` before anything starts);
    ``alertmanager``: an Alertmanager's base URL to send them to. Each alert's
    ``dashboard`` link is the manager's own page unless the configuration gives one.

    ``scheduler``: :class:`~actors.scheduler_records.SchedulerConfig` settings by name,
    the keys of a ``[scheduler]`` table (checked as one:
    :class:`~runtime.errors.SchedulerConfigError`), over those of a ``config`` file's
    ``[scheduler]``; ``prune_depth`` (how far downstream an output's readers must be
    done before it is dropped, docs/files.md#pruning-depth), ``long_task`` and
    ``unknown_long`` (which tasks go only to a worker with a core free of tasks), when
    given (the command line's flags), over both.

    As it listens it logs the settings it runs with at info (``configuration``) and
    answers them in ``status()["config"]`` (:func:`runtime.settings.manager_settings`):
    ``sources`` says where those not at their default came from, by ``section.key``
    (``{"scheduler.long_task": "flag --long-task"}``; a ``config`` file's settings are
    ``file`` without it); ``config_file``: the file ``config`` was read from when it is
    given as pools (shown, and its settings marked ``file``).

    ``keep_tokens`` (``--keep-tokens``): take up the tokens of its token file
    (``token_file``, else the one of ``listen``, which then needs a fixed port) when
    there is one (:meth:`Tokens.kept`; docs/security.md#keeping-tokens-across-restarts),
    instead of making new ones, so that workers, clients and Prometheus holding copies
    of them are not locked out by a restart.

    ``gc_threshold`` (``--gc-threshold``): Python's garbage collector runs after this
    many new container objects instead of 700 while the manager runs (:class:`GcTuning`,
    process-wide, restored after; None: Python's own): a large run makes full
    collections, each over all of the run's objects and holding the event loop, rare.
    After each large run the manager gives memory back (:func:`_give_back`)."""
    from runtime.settings import file_sources

    given = {"prune_depth": prune_depth, "long_task": long_task, "unknown_long": unknown_long}
    # the [scheduler] table, then the flags; SchedulerConfigError, PruneDepthError,
    # LongTaskError before anything starts
    path = config_file
    settings: dict[str, Any] = {}
    if config is not None and not isinstance(config, Mapping):
        path, settings = config, load_scheduler(config)
    settings.update(scheduler_settings(scheduler or {}))
    settings.update({k: v for k, v in given.items() if v is not None})
    SchedulerConfig(**settings)
    sources = {
        **file_sources(path),
        **{f"scheduler.{k}": "argument" for k, v in given.items() if v is not None},
        **({"manager.config": "argument"} if path is not None else {}),
        **({"alerting.alertmanager": "argument"} if alertmanager is not None else {}),
        **(sources or {}),
    }
    worker_timeout = check_worker_timeout(worker_timeout)
    reconnect_timeout = check_reconnect_timeout(reconnect_timeout)
    tuning = GcTuning(check_gc_threshold(gc_threshold))
    if client_timeout is not None:
        client_timeout = check_client_timeout(client_timeout)
        if client_timeout < worker_timeout:
            _log.warning(
                "client timeout below the worker timeout: clients get the worker timeout",
                client_timeout=client_timeout, worker_timeout=worker_timeout,
                advice="a client or console is never dropped sooner than a worker; give "
                "--client-timeout at least --worker-timeout",
            )  # fmt: skip
    pools: Mapping[str, PoolConfig] = {}
    if config is not None:
        pools = config if isinstance(config, Mapping) else load_config(config)
    if config is not None and not isinstance(config, Mapping):  # its [policies] too
        policies = {**load_policies(config, REGISTRY), **(policies or {})}
        warn_ignored_settings(config, pools, policies)
    if alerting is None:
        if config is not None and not isinstance(config, Mapping):
            alerting = load_alerting(config, alertmanager=alertmanager)
        else:
            alerting = alerting_config(alertmanager=alertmanager)
    elif alertmanager is not None:
        alerting = dataclasses.replace(alerting, alertmanager=alertmanager)
    if "scaling" in (policies or {}) and not pools:
        raise ValueError("a manager process has no autoscaler: it takes no scaling policy")
    if monitoring is not None and not monitoring_interval > 0:
        raise ValueError(f"--monitoring-interval must be positive, got {monitoring_interval}")
    if monitoring_keep is not None and not monitoring_keep > 0:
        raise ValueError(f"--monitoring-keep must be a positive duration, got {monitoring_keep}")
    address = listen if "://" in listen else f"ws://{listen}"
    _check_listen_address(address)  # InvalidAddress before anything starts
    keep_at = _kept_token_path(address, token_file) if keep_tokens else None
    if keep_at is not None and tokens is None:  # TokenFileError before anything starts
        tokens = Tokens.kept(keep_at)
    tokens = tokens or Tokens.generate()
    websockets = address.startswith(("ws://", "wss://"))
    stop = anyio.Event()
    if pools:
        policies = pool_policies(pools, policies)
    metrics_at: tuple[str, int] | None = None
    metrics_url = ""
    if metrics_listen is not None:
        host, sep, port = metrics_listen.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"--metrics-listen takes HOST:PORT, got {metrics_listen!r}")
        metrics_at = (host.strip("[]"), int(port))
    async with ActorSystem() as system:
        # The monitoring database is created once the listeners are up (below): a
        # manager that cannot listen leaves no empty run behind.
        plane = await start_control_plane(
            system, policies=policies, alerting=alerting, settings=settings,
            dashboard=websockets, monitor_feed=monitoring is not None,
            pools=pools,
        )  # fmt: skip
        listening: list[Listener] = []  # the gateway's listener, once it listens
        routes = await gateway_routes(plane, listening, web=websockets)
        fetch, notifications, feed = routes.fetch, routes.extra, routes.feed
        ams = _alertmanagers(plane)
        options = dict(listen_options or {})
        for name, route in routes.options.items():
            options.setdefault(name, route)
        try:
            gateway, listener = await serve_gateway(
                plane,
                address,
                tokens,
                listen_options=options,
                reconnect_timeout=reconnect_timeout,
                worker_timeout=worker_timeout,
                client_timeout=client_timeout,
            )
        except AddressInUse as exc:
            exc.add_note(
                f"(--listen {listen}: stop what listens there, or choose another port; 0 "
                "picks a free one, printed as `manager listening on ADDRESS`)"
            )
            raise
        listening.append(listener)
        if metrics_at is not None:
            runner, port_bound = await _serve_metrics(
                metrics_listen or "", metrics_at, fetch, notifications
            )

            async def stop_metrics(
                *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
            ) -> None:
                task_status.started()
                try:
                    await anyio.sleep_forever()
                finally:
                    with anyio.CancelScope(shield=True):
                        await runner.cleanup()

            await system.start_service(stop_metrics)
            host = f"[{metrics_at[0]}]" if ":" in metrics_at[0] else metrics_at[0]  # IPv6
            metrics_url = f"http://{host}:{port_bound}/metrics"
            _log.warning("metrics listening (no authentication)", url=metrics_url)
        if monitoring is not None:  # MonitoringDBError (a bad path) from here
            recorder = await start_recorder(plane, monitoring, monitoring_interval, monitoring_keep)
            if on_monitoring is not None and recorder.writer is not None:
                on_monitoring(recorder.writer)
        if on_gateway is not None:
            on_gateway(gateway)
        if websockets:  # alerts link to the manager's page (served on its listener)
            for n in ams:  # and say which manager's they are (before the first evaluation)
                n.instance = urlsplit(_http_url(listener.address)).netloc
            plane.refs["monitor"].post(DashboardAt(_http_url(listener.address) + "/"))
        path_written = keep_at or token_file or token_path(listener.address)
        if websockets:
            tokens.write(path_written)
            gateway.token_file = str(path_written.absolute())
        if pools:
            await start_pools(plane, pools, listener.address, tokens)

        async def on_signal() -> None:
            stop.set()

        async def give_up() -> int | None:  # a second Ctrl-C while the database catches up
            from runtime.monitordb import give_up_all

            return await anyio.to_thread.run_sync(give_up_all, abandon_on_cancel=True)

        await system.start_service(_until_signalled, on_signal, give_up)
        _settings_said(
            plane, pools, policies or {}, alerting, sources,
            [
                ("config", str(path) if path is not None else None),
                ("listen", listener.address),
                ("token_file", str(path_written) if websockets else None),
                ("keep_tokens", keep_tokens),
                ("metrics_listen", metrics_listen),
                ("worker_timeout", worker_timeout),
                ("client_timeout", gateway.client_dead_after),
                ("reconnect_timeout", reconnect_timeout),
                ("monitoring", str(monitoring) if monitoring is not None else "off"),
                ("monitoring_interval", monitoring_interval),
                ("monitoring_keep", monitoring_keep),
                ("gc_threshold", gc_threshold),
                *_tls_settings(address),
            ],
        )  # fmt: skip

        async def gc_tuned(
            *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
        ) -> None:
            tuning.enter()
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                tuning.exit()

        await system.start_service(gc_tuned)
        await system.start_service(_give_back, plane.scheduler)
        _log.info(  # the command line prints it on stdout (with the token file)
            "manager listening",
            address=listener.address,
            token_file=str(path_written) if websockets else "-",
        )
        cleartext = cleartext_warning(listener.address)
        if cleartext is not None:
            _log.warning(cleartext)
        if listener.address.startswith("wss://"):
            _check_served_certificate(None, options)
        if pools:  # in the background: it only warns, and Slurm may take long to answer
            from runtime.preflight import quick_checks_service

            await system.start_service(quick_checks_service, pools)
        if ready is not None:
            ready(listener.address, tokens)
        if metrics_at is not None and metrics_ready is not None:
            metrics_ready(metrics_url)
        cancelled = True
        try:
            await stop.wait()
            cancelled = False
        finally:
            # The same orderly stop for a signal and for a cancelled run_manager (an
            # embedding program's cancel scope): shielded, so that the cancellation
            # cannot cut it short, and bounded by each step's own timeout.
            with anyio.CancelScope(shield=True):
                how = CANCELLED if cancelled else STOP_SIGNALS
                await _stop_manager(system, plane, feed, listener, gateway, how)
                if cancelled:
                    # As leaving the block normally does (then the cancellation goes
                    # on): every actor stopped in order, the monitoring database's
                    # recorder writing out its rows and the run's end.
                    await system.shutdown()


def _settings_said(
    plane: ControlPlane,
    pools: Mapping[str, PoolConfig],
    policies: Mapping[str, tuple[str, dict[str, Any]]],
    alerting: AlertingConfig | None,
    sources: Mapping[str, str],
    manager: Sequence[tuple[str, object]],
) -> None:
    """Log the settings the manager runs with (one ``configuration`` line, at info) and
    give them to its manager actor for ``status()["config"]``: the scheduler's as its
    core holds them, the pools', the alerting and the policies it started with."""
    from runtime.settings import manager_settings, setting_fields

    rows = manager_settings(
        manager=manager, pools=pools, scheduler=plane.scheduler.state.config,
        alerting=alerting, policies=policies, sources=sources,
    )  # fmt: skip
    _log.info("configuration", **setting_fields(rows))
    plane.manager.post(SettingsAt(rows))


def _tls_settings(address: str) -> list[tuple[str, object]]:
    """A ``wss://`` manager's certificate files (paths, never their contents)."""
    if not address.startswith("wss://"):
        return []
    from transport.tls import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV

    return [
        (name, os.environ.get(env) or None)
        for name, env in (("tls_cert", TLS_CERT_ENV), ("tls_key", TLS_KEY_ENV),
                          ("tls_ca", TLS_CA_ENV))
    ]  # fmt: skip


async def _stop_manager(
    system: ActorSystem,
    plane: ControlPlane,
    feed: DashboardFeed | None,
    listener: Listener,
    gateway: Gateway,
    how: str,
) -> None:
    """A manager process's orderly stop, before its actors stop: the run ends
    (:func:`end_run`: the alerts hold still, the tasks not finished are cancelled; not
    for a cancelled run_manager, whose actors the cancellation stops as it comes); then
    the pools' workers, while the manager still listens (they leave, drained, their ids
    freed, rather than lose their manager); the dashboard's pages; the listening socket
    (the port is free); then the goodbye to every connection
    (:meth:`Gateway.say_goodbye`, saying ``how`` the manager was stopped).
    Each step is bounded: the run's end by :data:`END_RUN_TIMEOUT`, the autoscaler by
    its stop bound, the goodbye by :data:`GOODBYE_TIMEOUT`, closes by the transport's
    ``close_timeout``."""
    if how != CANCELLED:  # (cancelled, its actors stop with the cancellation: none takes it)
        await end_run(plane)
    autoscaler = plane.refs.get("autoscaler")
    if autoscaler is not None:
        await system.shutdown([autoscaler])
    if feed is not None:
        await feed.close()
    await listener.aclose()
    await gateway.say_goodbye(listener.address, how)


def _check_listen_address(address: str) -> None:
    """:class:`InvalidAddress` for an address a manager cannot listen on, before it
    starts anything (a websocket address is parsed as its listener would)."""
    from transport.base import backend_for
    from transport.ws import SCHEMES, _parse

    backend_for(address)  # a known scheme
    if address.split("://", 1)[0].lower() in SCHEMES:
        _parse(address, listening=True)


async def _serve_metrics(
    flag: str,
    at: tuple[str, int],
    fetch: Callable[[], Awaitable[MetricsReply]],
    extra: Sequence[Any] = (),
) -> tuple[Any, int]:
    """``serve_metrics`` on ``at`` (``--metrics-listen`` ``flag``): a port in use is
    :class:`AddressInUse`, as on the manager's own address, and an address it cannot
    listen on :class:`InvalidAddress`, each naming the flag."""
    import errno

    from runtime.metrics import serve_metrics

    host = f"[{at[0]}]" if ":" in at[0] else at[0]  # IPv6
    url = f"http://{host}:{at[1]}"
    try:
        return await serve_metrics(*at, fetch, extra)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            error: CorralError = AddressInUse(url)
            error.add_note(
                f"(--metrics-listen {flag}: stop what listens there, or choose another "
                "port; 0 picks a free one, printed as `metrics on URL`)"
            )
        else:
            error = InvalidAddress(url, f"cannot listen there ({exc.strerror or exc})", ["http"])
            error.add_note(f"(--metrics-listen {flag}: give a HOST:PORT of this machine)")
        raise error from None


async def _listen_for_peers(base: str, port: int | tuple[int, int], options: dict[str, Any]) -> Any:
    """A worker's listener for its peers at ``base`` (``ws://HOST``) on ``port`` (its
    ``--port``, 0: a free one) or on the first free port of a ``(lo, hi)`` range (its
    ``--port-range``): :class:`AddressInUse` naming the flag when there is none."""
    from transport import listen

    if isinstance(port, int):
        try:
            return await listen(f"{base}:{port}", **options)
        except AddressInUse as exc:
            exc.add_note(
                f"(--port {port}: stop what listens there, or choose another port; without "
                "--port the worker takes a free one, --port-range LO-HI the first free of those)"
            )
            raise
    lo, hi = port
    for each in range(lo, hi + 1):
        with contextlib.suppress(AddressInUse):
            return await listen(f"{base}:{each}", **options)
    error = AddressInUse(f"{base}:{lo}-{hi}")
    error.add_note(
        f"(--port-range {lo}-{hi}: every port of it is in use: widen the range, or stop "
        "what listens there)"
    )
    raise error


def loop_blocked_why(
    seconds: float,
    now: float,
    continued: float,
    spill: Spilling | None,
    running: bool,
    busy: Sequence[tuple[str, float]] = (),
) -> str:
    """Why a worker's event loop was blocked for ``seconds`` until ``now``
    (``time.monotonic()``), as far as it can tell: the process was continued
    (SIGCONT) at ``continued``; another of its threads was busy (``busy``: what each
    is and its CPU seconds meanwhile, the busiest first, :meth:`Worker.busy_threads`)
    for a quarter of the time or more; a spill (``spill``, under way for half of that
    time) was writing outputs; no task ran in the worker's threads (``running``); or a
    task held the GIL."""
    lost = (
        "no heartbeats went out meanwhile, and the manager counts a worker "
        "silent for longer than its --worker-timeout (10 s by default) as lost"
    )
    if continued >= now - seconds - 1:
        return (
            f"the process was stopped (SIGSTOP, a suspended job or terminal) "
            f"and continued (SIGCONT), not blocked by a task: {lost}"
        )
    if busy and busy[0][1] >= seconds / 4:
        what, cpu = busy[0]
        return (
            f"its {what} used {cpu:.1f} s of CPU in those {seconds:.1f} s; while it "
            f"runs Python code or a call that keeps Python's GIL, the event loop cannot "
            f"run: {lost}; if it runs tasks, run them with execution 'process'; else it "
            f"is the worker's own work: please report it (with this line)"
        )
    if spill is not None:
        still = " and still is" if spill.ended is None else ""
        return (
            f"the worker was spilling outputs to disk ({size_text(spill.nbytes)} asked "
            f"for){still}: the spill writes from a thread, yet a slow or full disk, or "
            f"memory so short that the machine swaps, slows the whole process: {lost}; "
            f"give the worker a faster --spill-dir or more memory, or raise the manager's "
            f"--worker-timeout"
        )
    if not running:
        return (
            f"no task was running in its threads and none of its threads was busy: the "
            f"process was paused or starved of CPU (an overloaded machine, swapping, a "
            f"suspended virtual machine): {lost}"
        )
    return (
        f"{lost}: a task that holds Python's GIL (one long call into "
        "compiled code) does this; run such a task with execution "
        "'process', or raise the manager's --worker-timeout "
        "(Cluster(worker_timeout=...))"
    )


def _back_after_tries(
    worker: str, manager: str, failed: int, seconds: float, *, rejoin: bool, loud: bool
) -> None:
    """Log that the worker ``worker`` (re)joined the manager at ``manager`` after
    ``failed`` failed tries over ``seconds``: ``rejoined the manager after 2 failed tries
    (3.1 s)`` (``joined`` for its first join), at warning when a failure was logged at
    warning or above (``loud``: a rejoin's loss always is), so that a log shown at the
    default level does not end with the failures while the worker is back; else at
    info, as those tries were."""
    tries = "try" if failed == 1 else "tries"
    (_log.warning if loud else _log.info)(
        f"{'rejoined' if rejoin else 'joined'} the manager after {failed} failed {tries} "
        f"({seconds:.1f} s)",
        worker=worker, manager=manager, failed=failed, seconds=round(seconds, 1),
    )  # fmt: skip


async def run_worker(
    address: str,
    *,
    cores: int = 1,
    memory: int = 0,
    disk: int | None = 0,
    disk_share: int = 1,
    pool: str = "default",
    host: str = "127.0.0.1",
    port: int | tuple[int, int] = 0,
    token: str | None = None,
    ready: Callable[[str], None] | None = None,
    listen_options: dict[str, Any] | None = None,
    reconnect: float = RECONNECT,
    memory_options: Mapping[str, Any] | None = None,
    name: str | None = None,
    deadline: float | None = None,
    grace: float = 5.0,
    block: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
    connect_retry: float = 0.0,
    left: Callable[[str, str], None] | None = None,
) -> None:
    """Run a worker process until SIGINT/SIGTERM/SIGHUP, until the scheduler retires it, until
    the manager says it stops (:class:`ManagerStopping`: the worker leaves at once,
    without trying to rejoin, and returns; with a ``connect_retry``, it first tries for
    that long to rejoin a manager started again there, a planned restart, and returns
    only if none takes it), or until the manager, lost without that word (a crash, the
    network), stays unreachable for ``reconnect`` seconds (then it raises
    :class:`ManagerUnreachable`: the command line exits 1).

    When it stops it tells the scheduler why (:func:`leaving_cause`): ``drained`` when
    the scheduler retired it (``walltime`` when it drained it because its walltime was
    near), ``walltime`` when a signal came within a minute of its
    ``deadline`` (a wall-clock time, given by the provider that knows the block's
    walltime), ``preempted`` when the batch system took it back (a signal inside a
    Slurm job, any other time), ``shutdown`` when an operator stopped it. Unless it was
    drained, it first copies the outputs that are still needed and held by no other
    worker to the workers the scheduler names (data evacuation), within ``grace``
    seconds less one (what a batch system leaves between its signal and its kill).
    Having left without an error, it calls ``left(worker_id, why)`` (``why``:
    :func:`leaving_words`), as it calls ``ready(worker_id)`` once joined.

    The worker listens on ``host`` for its peers, on ``port`` (0: a free one; a
    ``(lo, hi)`` pair: the first of those ports that is free; a port in use, or a range
    with none free, is :class:`AddressInUse` naming ``--port`` or ``--port-range``;
    ignored for an ``inproc://`` manager); its id is ``name`` or,
    without one, that address. (A :class:`~actors.processes.LocalProcessProvider` names
    its workers, so the autoscaler knows which block each one belongs to.) It connects
    to the manager at ``address``, says ``Hello`` (its info carries the address) and
    waits for the ``Welcome`` that carries its secret. If the connection drops it
    rejoins under the same id with that secret; what it sends meanwhile waits (see
    :class:`Link`). A peer whose id is not an address is looked up at the manager
    (:class:`PeerQuery`). Its info also names its ``block`` (default:
    ``CORRAL_BLOCK_ID``, which a process provider or a Slurm block's script sets; none
    without it): the scheduler sends none of a leaving worker's outputs to the other
    workers of its block, which go with it.

    Raises the manager's refusal (e.g. :class:`PermissionDenied` for the read-only
    token): a worker the manager will not take stops instead of retrying. A token the
    manager no longer knows (HTTP 403: it restarted with new tokens) is retried with
    backoff for ``reconnect`` seconds, then raised. With ``token_file`` (not with
    ``token``) the token is read from that file again at each try, so a worker whose
    file is the manager's own token file (a shared file system) joins the restarted
    manager with its new token. From a manager's own token file (``token_file``, or
    the one of ``address`` on this machine) it takes the ``worker`` entry, or the
    ``admin`` entry of a file without one (:data:`ROLE_FALLBACK`). It takes
    ``CORRAL_TOKEN`` out of this process's environment as it starts, whichever token it
    presents (:func:`take_env_token`: its tasks and the programs they start do not
    inherit it), so a program that runs a worker in its own process loses that variable.
    ``connect_retry``: seconds the first join keeps trying a manager that is not there
    yet (not listening, its token file not written, its token not the one presented)
    before it raises the last error (0: one try), and those a worker told that its
    manager stopped keeps trying to rejoin, with a backoff of 0.05 s doubled up to 1 s,
    5 s after the first 10 s of trying, and a log line per failed try.
    """
    from runtime.codec import Frame
    from transport import ConnectionClosed, connect, listen

    check_worker_pool(pool, "run_worker(pool=...)", "pool='gpu'")
    check_one_token(token, token_file)
    _signal_warning(os.environ)  # a bad value stops it here, not as it leaves
    given = token  #: --token (``token`` is the one presented from here on)
    # Taken out of the environment whatever wins (its tasks and their programs inherit
    # the environment); kept here for the rejoins. --token and --token-file win over it.
    env_token = take_env_token()
    from_env = not token and token_file is None and env_token is not None
    if from_env:
        token = env_token
    #: a token given as such, not read from a file (which may change: read at each try)
    fixed = token_file is None and token
    if fixed or connect_retry <= 0:  # read now: a bad file stops it at once
        token = await find_token_there(
            address, token, "worker", token_file=token_file, give=GIVE_TOKEN_WORKER
        )
    scheme = urlsplit(address).scheme
    stop = anyio.Event()
    fatal: list[BaseException] = []  #: why the worker had to stop, raised at the end
    async with ActorSystem() as system:
        peers: dict[str, Peer] = {}
        worker_ref: dict[str, ActorRef[Worker]] = {}
        listen_options = dict(listen_options or {})
        connect_options: dict[str, Any] = {}
        if scheme in ("ws", "wss"):
            # Its peers present the token it presents (its file may not be there yet, a
            # manager not started: a placeholder until then), or, once it joined, the
            # manager's worker token (its Welcome's peer_token), as it does.
            listen_options["tokens"] = {token or secrets.token_hex(32): "admin"}
            if token:
                connect_options["token"] = token
        _check_peer_tls(address, listen_options)
        if scheme in ("ws", "wss"):
            own = await _listen_for_peers(f"{scheme}://{host}", port, listen_options)
        else:
            own = await listen("inproc://", **listen_options)
        if scheme == "wss":
            _check_served_certificate(host, listen_options)
        try:
            worker_id = name or own.address

            async def serve_peer(conn: Any) -> None:
                role = getattr(conn, "role", None) or "admin"
                door = _PeerDoor(worker_ref["worker"])
                peer = Peer(conn, door, name="peer", allow_pickle=role == "admin")
                try:
                    await peer.run()
                finally:
                    with anyio.move_on_after(CLOSE_STREAMS_WITHIN, shield=True):
                        await door.streams.close(door.target)

            async def resolve(wid: str) -> Any:
                peer = peers.get(wid)
                if peer is not None and not peer.closed:
                    return peer.ref
                where = wid
                if "://" not in wid:  # named by its provider: ask where it listens
                    try:
                        info = await link.ask(PeerQuery(wid), timeout=DEAD_AFTER)
                    except TimeoutError as exc:  # no manager connection meanwhile
                        raise AskTimeout("manager", "PeerQuery", DEAD_AFTER) from exc
                    if not isinstance(info, WorkerInfo) or not info.address:
                        return None  # not joined (any more): gone
                    where = info.address
                conn = await connect(where, **{**connect_options, **peer_token})
                peer = Peer(conn, None, name=wid, allow_pickle=True)
                peers[wid] = peer
                await system.start_service(peer.run)
                return peer.ref

            link = Link("manager")
            #: the manager said it stops on purpose; the seconds the worker then tried
            #: to rejoin a manager started again (its ``connect_retry``; 0: none)
            farewell: list[float] = []
            retired: list[str] = []  #: why the scheduler retired it (its Stop's reason)
            #: set when the manager connection ends after the stop began: no evacuation
            #: plan can come any more, so the worker does not wait out its grace for one
            manager_gone = anyio.Event()

            def on_retire(reason: str) -> None:
                retired.append(reason)
                stop.set()

            worker = Worker(
                worker_id, link, resolve, nthreads=cores, memory=memory, disk=disk, pool=pool,
                disk_share=disk_share, register=False, on_retire=on_retire,
                memory_options=memory_options, deadline=deadline or 0.0, grace=grace,
                block=os.environ.get("CORRAL_BLOCK_ID", "") if block is None else block,
            )  # fmt: skip
            worker_ref["worker"] = await system.spawn(worker, "worker")

            info = WorkerInfo(**{**worker.info.to_fields(), "address": own.address})
            secret = [""]  #: given by the manager at the first Welcome
            #: what it presents to its peers: the manager's worker token, as its Welcome
            #: tells it (none yet: the token it presents to the manager)
            peer_token: dict[str, str] = {}

            def accept_peers() -> None:
                """Its peers may present the token it presents to the manager, or the
                manager's worker token (a worker started by hand with the admin token,
                and the workers of a pool with the worker token, fetch from each other)."""
                accepted = {connect_options.get("token"), peer_token.get("token")}
                own.set_tokens({t: "admin" for t in accepted if t})

            async def read_token() -> None:
                """Present the token of its file (``token_file``, else the manager's
                token file on this machine) as it is now (the manager may have restarted
                with a new one), and take it from peers too."""
                if fixed or scheme not in ("ws", "wss"):
                    return
                new = await find_token_there(
                    address, None, "worker", token_file=token_file, give=GIVE_TOKEN_WORKER
                )
                if new and new != connect_options.get("token"):
                    connect_options["token"] = new
                    accept_peers()

            async def join(patience: float | None = None) -> Peer:
                """Connect, say Hello, take the Welcome; ``patience``: the seconds the
                connection may take (None: the transport's connect timeout)."""
                await read_token()
                conn = await connect(address, timeout=patience, **connect_options)
                try:
                    # From its Hello on, the manager may take the worker in: its answer
                    # is read whatever comes meanwhile (a stop signal cancels the join:
                    # the worker then leaves in order, its WorkerGone told, where cut
                    # short here the manager saw its connection drop). Once the stop
                    # signal came, for STOP_WELCOME_WAIT more at most, not DEAD_AFTER.
                    with anyio.CancelScope(shield=True), anyio.fail_after(DEAD_AFTER) as bound:
                        await conn.send(Frame(Hello("worker", worker_id, info, secret[0])))
                        answer = await _answer(conn, stop, bound)
                except (TimeoutError, ConnectionClosed) as exc:
                    await conn.aclose()
                    raise CorralError(f"the manager at {address} did not answer: {exc}") from None
                if not isinstance(answer, Welcome):
                    await conn.aclose()
                    if isinstance(answer, Refused):
                        raise _WorkerRefused(refusal_error(answer, allow_pickle=True))
                    raise _WorkerRefused(not_welcomed(answer, address, "worker"))
                if secret[0] and answer.secret != secret[0]:
                    # A new secret: the manager does not know this worker (it restarted,
                    # or gave it up), and no one waits for its work. Dropped before the
                    # manager's first message (its ConfirmHolds then finds nothing).
                    worker_ref["worker"].post(ForgetWork())
                secret[0] = answer.secret
                if answer.peer_token and scheme in ("ws", "wss"):
                    peer_token["token"] = answer.peer_token
                    accept_peers()
                peer = Peer(
                    conn, worker_ref["worker"], name="manager", allow_pickle=True,
                    heartbeat=HEARTBEAT, timeout=DEAD_AFTER, on_stall=blocked,
                )  # fmt: skip
                peer.on_too_large = unsendable_tries(worker_id, lambda m: peer.post(m, ""))
                return peer

            async def manager_stalled() -> bool:
                """Whether the manager, not answering, is only stalled: it runs in our
                parent process (a lifeline: we live no longer than it) and its port
                still takes connections (its listener is open; the kernel accepts for a
                process whose event loop does not run)."""
                from actors.processes import has_lifeline

                return has_lifeline() and await port_takes_connections(address)

            continued = [-math.inf]  #: when this process was last continued (SIGCONT)

            def blocked(seconds: float) -> None:
                """Our event loop was blocked (the manager connection's watchdog came
                ``seconds`` late): warn, once per stall, when it was for long, saying
                what did it as far as it can tell."""
                if seconds < LOOP_BLOCKED_WARN:
                    return
                running = sorted(str(key) for key in worker.state.running)
                now = time.monotonic()
                spill = worker.spill_during(now - seconds, now)
                in_threads = bool(running) and worker.memory_config.execution != "process"
                busy = worker.busy_threads()

                def warn() -> None:
                    why = loop_blocked_why(seconds, now, continued[0], spill, in_threads, busy)
                    _log.warning(
                        "event loop blocked", worker=worker_id, seconds=round(seconds, 1),
                        running=running[:LOST_NAMES], more=max(0, len(running) - LOST_NAMES),
                        why=why,
                    )  # fmt: skip

                # The why a moment later: a SIGCONT may reach another thread of this
                # process first, and its handler (_note_continued) run in this one only
                # after this look (CI 116: a stopped worker told of a block by nothing).
                asyncio.get_running_loop().call_later(CONTINUED_GRACE, warn)

            async def reach(window: float, *, rejoin: bool) -> Peer:
                """Join, trying again for ``window`` seconds after a failed try (with
                backoff, logged), and raise the last try's error then: a refusal as
                :class:`_WorkerRefused` at once; a token the manager does not know
                (HTTP 403), retried, as ``_WorkerRefused`` too on a ``rejoin``. A join
                after failed tries says so (:func:`_back_after_tries`): the failures
                logged are not the last word of its log."""
                delay, began = 0.05, anyio.current_time()
                deadline = began + window
                last: BaseException | None = None
                waiting = False  #: told that the manager is stalled (once per reach)
                failed = 0  #: tries that failed
                #: something was logged at warning or above (a rejoin: the loss was)
                loud = rejoin
                while True:
                    bound = math.inf if last is None and window <= 0 else deadline
                    with anyio.move_on_after(bound - anyio.current_time()) as scope:
                        tried = anyio.current_time()
                        try:
                            peer = await join(STALLED_TRY if waiting else None)
                        except AuthenticationFailed as exc:
                            failed += 1
                            # It answers, but does not know our token (restarted with new
                            # tokens?): slower tries, each with the token read again.
                            # At the start as when rejoining, an unknown token (403) says
                            # what to do about it.
                            last = exc
                            if exc.status == 403:
                                last = worker_token_refused(
                                    address, 403, given, token_file, from_env
                                )
                            if rejoin or exc.status == 403:
                                last = _WorkerRefused(last)
                            delay = max(delay, 0.5)
                            if window > 0:
                                loud = True
                                hint = {}
                                if exc.status == 403:
                                    hint["hint"] = stale_token_hint(
                                        address, given, token_file, from_env
                                    )
                                _log.error(
                                    "the manager refused our token; retrying",
                                    worker=worker_id, status=exc.status, retry_in=delay,
                                    reason=exc.reason, token_file=os.fspath(token_file or ""),
                                    **hint,
                                )  # fmt: skip
                        except CorralError as exc:  # not there (yet), or not answering
                            failed += 1
                            last = exc
                            # The quick first tries at info; not one that took its
                            # whole connect timeout (a manager stalled, a network that
                            # drops packets): at info, a worker waiting out a 60 s
                            # stall said nothing for 45 s (multi audit, finding 4).
                            slow = delay >= 1.0 or anyio.current_time() - tried >= 1.0
                            if window > 0:
                                loud = loud or slow
                                (_log.warning if slow else _log.info)(
                                    "could not reach the manager; retrying",
                                    worker=worker_id, manager=address, error=str(exc),
                                    retry_in=delay,
                                    left=round(max(0.0, deadline - anyio.current_time()), 1),
                                )  # fmt: skip
                        else:
                            if failed:
                                _back_after_tries(
                                    worker_id, address, failed, anyio.current_time() - began,
                                    rejoin=rejoin, loud=loud or waiting,
                                )  # fmt: skip
                            return peer
                    if scope.cancelled_caught and last is None:  # the first try, cut short
                        last = CorralError(f"the manager at {address} did not answer")
                    now = anyio.current_time()
                    if now >= deadline or waiting:
                        assert last is not None  # a try that was not cut short failed
                        answered = isinstance(last, AuthenticationFailed | _WorkerRefused)
                        if answered or not await manager_stalled():
                            raise last
                        # Our parent runs the manager and its port takes connections:
                        # its event loop is blocked (a long synchronous call in the
                        # program that embeds it). Our tasks run on; wait for it, with
                        # one try at a time left waiting in its port's backlog.
                        if not waiting:
                            _log.warning(
                                "the manager does not answer; waiting for it",
                                worker=worker_id, manager=address, waited=round(now - began, 1),
                                why=MANAGER_STALLED,
                            )  # fmt: skip
                        waiting = True
                        deadline = now + STALLED_TRY
                        delay = min(delay, 1.0)
                    await anyio.sleep(min(delay, deadline - now))
                    # (a token refused: slower, as a new one is written once, if ever;
                    # a stalled parent: at least a try a second, to be back soon after)
                    slow = isinstance(last, AuthenticationFailed | _WorkerRefused)
                    slow = slow or (now - began >= 10 and not waiting)
                    delay = min(delay * 2, 5.0 if slow else 1.0)

            # The stop signals are ours before the first connection: a SIGTERM that
            # came after the manager took the worker in and before the handlers were
            # set ended it by Python's default (no WorkerGone: the manager warned of a
            # dropped connection, as when Cluster(processes=N) closes right after
            # wait_for_workers); one while it still tries to join stops that try.
            joining = anyio.CancelScope()

            async def on_signal() -> None:
                stop.set()
                joining.cancel()

            # The tries that end in error once the stop signal came failed for it (the
            # programs they started got it too): Worker._not_failed_by_the_stop. Not
            # an earlier run's signal (a program that runs workers one after another).
            STOP_SIGNALLED.clear()
            if threading.current_thread() is threading.main_thread():
                # (signals reach the main thread only, and only it may set their
                # handlers: a worker run in another thread, as a program embedding
                # main() may, is stopped by that program)
                await system.start_service(_until_signalled, on_signal)
                for signum in _stop_signals():
                    signal.signal(signum, note_stop_signal)
            with joining:
                try:
                    first = await reach(connect_retry, rejoin=False)
                except _WorkerRefused as exc:
                    raise exc.error from None
            if joining.cancelled_caught:
                _log.info("stopped before it joined", worker=worker_id, manager=address)
                return

            async def stay_joined(
                *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
            ) -> None:
                """Serve the manager connection; when it drops, rejoin with the same id
                within ``reconnect`` seconds (the manager keeps our work meanwhile), else stop.
                """
                peer: Peer | None = first
                task_status.started()
                short = 0  # connections in a row that ended within a second
                while True:
                    assert peer is not None
                    link.attach(peer)
                    began = anyio.current_time()
                    await peer.run()
                    link.detach()
                    if stop.is_set():
                        manager_gone.set()
                        return
                    told = peer.farewell is not None  # the manager stopped on purpose
                    if told and connect_retry <= 0:  # nothing to rejoin
                        _log.info("the manager stopped; leaving", worker=worker_id,
                                  manager=address)  # fmt: skip
                        farewell.append(0.0)
                        manager_gone.set()
                        stop.set()
                        return
                    if peer.refusal is not None:  # the manager closed on us, saying why
                        _log.error("refused by the manager; stopping", worker=worker_id,
                                   reason=str(peer.refusal))  # fmt: skip
                        fatal.append(peer.refusal)
                        stop.set()
                        return
                    if told:  # a planned restart, maybe: rejoin the next one, as below
                        _log.warning(
                            "the manager stopped on purpose; trying to rejoin",
                            worker=worker_id, manager=address, seconds=connect_retry,
                            why="--connect-retry",
                        )  # fmt: skip
                    else:
                        short = short + 1 if anyio.current_time() - began < 1.0 else 0
                        _log.warning("lost the manager; reconnecting", worker=worker_id)
                        if short > 1:  # never a tight loop, whatever the manager does
                            await anyio.sleep(min(0.05 * 2**short, 2.0))
                    window = connect_retry if told else reconnect
                    peer = None
                    refused: BaseException | None = None
                    try:
                        peer = await reach(window, rejoin=True)
                    except _WorkerRefused as exc:
                        refused = exc.error
                    except CorralError:
                        pass
                    if peer is None:
                        if refused is not None:
                            _log.error("refused by the manager; stopping", worker=worker_id,
                                       reason=str(refused))  # fmt: skip
                            fatal.append(refused)
                        elif told:  # not back: it leaves as if it had not waited
                            _log.info("the manager stopped; leaving", worker=worker_id,
                                      manager=address, waited=window)  # fmt: skip
                            farewell.append(window)
                        else:  # no goodbye: a crash; exit 1, for a service manager
                            _log.error("manager unreachable; stopping", worker=worker_id,
                                       manager=address, seconds=reconnect)  # fmt: skip
                            fatal.append(ManagerUnreachable(address, reconnect))
                        stop.set()
                        return

            await system.start_service(stay_joined)
            await system.start_service(_note_continued, continued)
            await system.start_service(own.serve, serve_peer)

            await system.start_service(_lifeline)
            if ready is not None:
                ready(worker_id)
            await stop.wait()
            # Graceful: tell the scheduler we leave and why (it hands our running tasks
            # to others, free of charge), stop serving peers, close.
            cause = leaving_cause(
                retired[0] if retired else None, time.time(), deadline, os.environ
            )
            _log.info("leaving", worker=worker_id, cause=cause)
            if cause == "crash":  # exits 1, so a service manager starts another
                fatal.append(WorkerCoreFailed(worker_id))
            connected = link.peer is not None and not link.peer.closed
            if not retired and connected:  # (retired: copied before it stopped)
                # Copy needed outputs no one else holds to surviving workers first, in
                # most of the grace: the WorkerGone that follows says they are safe. The
                # plan and that report go through the manager: once its connection
                # ends (stopped with us, as a terminal's Ctrl-C or a job's end stops
                # both), neither can, so the worker stops waiting then.
                evacuated = False
                with anyio.move_on_after(max(0.0, grace - 1.0)) as leaving:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(_cancel_when, manager_gone, leaving)
                        await worker_ref["worker"].ask(Leave(cause), timeout=None)
                        evacuated = True
                        tg.cancel_scope.cancel()
                # (A grace of a second or less leaves no time to copy: chosen, not news.)
                if not evacuated and (manager_gone.is_set() or grace > 1.0):
                    _log.warning(
                        "leaving before the needed outputs were copied to other workers",
                        worker=worker_id,
                        why="the manager went away" if manager_gone.is_set()
                        else f"the grace ran out ({grace:g} s less one)",
                    )  # fmt: skip
            with anyio.move_on_after(5):
                if link.peer is not None and not link.peer.closed:
                    await link.tell(WorkerGone(worker_id, cause))
                    await link.peer.aclose()
        finally:
            with anyio.CancelScope(shield=True):  # never leave the socket open
                await own.aclose()
    if fatal:
        raise fatal[0]
    if left is not None:
        waited = farewell[0] if farewell else 0.0
        # (past its exit mark: it leaves as a drained worker does, in words of its own)
        said = "memory" if retired and retired[0] == "memory" else cause
        left(worker_id, leaving_words(said, manager_stopped=bool(farewell), waited=waited))


async def port_takes_connections(address: str) -> bool:
    """Whether a TCP connection to the host and port of ``address`` (``ws://`` or
    ``wss://``) is accepted within :data:`PROBE_TIMEOUT`: something listens there. The
    operating system accepts it for a listening process whose event loop does not run
    (its backlog), so it says that the process is there, not that it answers. Closed at
    once, unused."""
    parts = urlsplit(address)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        return False
    try:
        port = parts.port
    except ValueError:
        return False
    if port is None:
        return False
    with anyio.move_on_after(PROBE_TIMEOUT):
        try:
            stream = await anyio.connect_tcp(parts.hostname, port)
        except OSError:
            return False
        await stream.aclose()
        return True
    return False


def leaving_words(cause: str, *, manager_stopped: bool, waited: float = 0.0) -> str:
    """Why a worker process left, in words for its operator (the command line prints
    ``worker ID left ADDRESS: WHY``): ``cause`` is :func:`leaving_cause`'s;
    ``manager_stopped``: its manager said it stops on purpose, which the worker took as
    its own stop, after trying for ``waited`` seconds (its ``--connect-retry``; 0: not
    at all) to rejoin a manager started again there."""
    if manager_stopped:
        words = f"its manager stopped on purpose ({STOP_SIGNALS} of the manager)"
        if waited > 0:
            words += f" and was not back within {waited:g} s (--connect-retry)"
        return words
    return {
        "drained": "drained by its manager (an operator's drain, the autoscaler's scale "
        "in, or its pool's tasks_per_worker)",
        "walltime": "its walltime ends (--deadline)",
        "preempted": "stopped by a signal inside a Slurm job (preempted)",
        "shutdown": f"stopped by a signal ({STOP_SIGNALS})",
        "memory": "stopped itself past its exit mark (its tasks run in threads, which "
        "cannot be killed: the memory option exit)",
    }.get(cause, cause)


def _check_peer_tls(address: str, listen_options: Mapping[str, Any]) -> None:
    """A worker of a ``wss://`` manager serves its peers over ``wss://`` too, which
    needs a certificate: without one, a :class:`ValueError` that says so, and that the
    manager may not be TLS at all (nothing has reached it yet)."""
    from transport.tls import TLS_CERT_ENV

    if not address.startswith("wss://") or listen_options.get("ssl_context"):
        return
    if os.environ.get(TLS_CERT_ENV):
        return
    raise ValueError(
        f"this worker joins {address} over TLS, so it serves its peers over wss:// too, "
        f"which needs a certificate: --tls-cert FILE (and --tls-key) or ${TLS_CERT_ENV}, "
        "naming the host its peers reach it on (--host; docs/security.md#tls). If that "
        "manager is not TLS (it printed `manager listening on ws://...`), join it with "
        f"ws://{address.removeprefix('wss://')}"
    )


def _check_served_certificate(host: str | None, listen_options: Mapping[str, Any]) -> None:
    """Warn, as a ``wss://`` worker starts, when its peers would refuse the certificate
    it serves them: verified as this worker verifies its own peers (``CORRAL_TLS_CA``,
    else the system's CAs), dialled at ``host`` (its ``--host``). It joins anyway (the
    manager does not verify it), but every fetch of its outputs would fail.

    ``host`` None: a manager, as it listens: its certificate's dates, and its chain
    against its ``--tls-ca`` when given (:func:`transport.tls.own_certificate_verifier`;
    not its names, which its clients may dial by any of). An expired certificate made
    every client, worker and console fail with nothing said at the manager (multi
    audit, finding 2)."""
    import ssl

    from transport import tls

    from_code = listen_options.get("ssl_context")
    server = from_code or tls.server_context()
    if server is None:
        return
    if host is None:
        if from_code is not None:  # its files are not known (not CORRAL_TLS_CERT's)
            return
        try:
            client = tls.own_certificate_verifier()
        except ValueError as exc:  # its --tls-ca: it listens anyway, as it did before
            _log.warning(
                "cannot check this manager's certificate: its CA file (--tls-ca) is not "
                "usable, nor by the workers it starts, which inherit it",
                error=str(exc),
            )
            return
        if client is None:  # (no CORRAL_TLS_CERT: not served from a file)
            return
        event = (
            "clients, workers and consoles would refuse this manager's certificate: none of "
            "them can connect"
        )
    else:
        client = tls.client_context() or ssl.create_default_context()
        event = "peers would refuse this worker's certificate: they cannot fetch its outputs"
    refused = tls.refused_certificate(server, client, host)
    if refused is not None:
        _log.warning(
            event,
            **({} if host is None else {"host": host}),
            reason=refused.verify_message,
            hint=tls.certificate_hint(refused.verify_code, host or ""),
        )


async def _note_continued(
    continued: list[float],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Keep in ``continued[0]`` when this process was last continued (SIGCONT, after a
    SIGSTOP or a suspended job), by ``time.monotonic()``, until cancelled; then put the
    signal's handler back. Not known outside the main thread."""

    def note(signum: int, frame: Any) -> None:
        continued[0] = time.monotonic()

    try:
        previous = signal.signal(signal.SIGCONT, note)
    except ValueError:  # not the main thread
        task_status.started()
        return
    try:
        task_status.started()
        await anyio.sleep_forever()
    finally:
        signal.signal(signal.SIGCONT, previous)


async def _cancel_when(event: anyio.Event, scope: anyio.CancelScope) -> None:
    """Cancel ``scope`` once ``event`` is set."""
    await event.wait()
    scope.cancel()


#: a stop signal this close to a worker's deadline is its walltime, not a preemption
WALLTIME_MARGIN = 60.0


#: seconds before its walltime that a Slurm block's script is signalled (its pool's
#: ``signal_warning``), which the script exports for its workers
SIGNAL_WARNING_ENV = "CORRAL_SIGNAL_WARNING"


def _signal_warning(env: Mapping[str, str]) -> float:
    """Seconds before its walltime that a Slurm block's script is signalled (its pool's
    ``signal_warning``, :data:`SIGNAL_WARNING_ENV`, which the script sets): 0 without.
    A value that is not a number of seconds >= 0: a :class:`ValueError` saying so
    (:func:`run_worker` checks it before it joins), as for the other variables."""
    text = env.get(SIGNAL_WARNING_ENV, "").strip()
    if not text:
        return 0.0
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ValueError(
            f"{SIGNAL_WARNING_ENV}={text!r} is not a number of seconds >= 0 (how long "
            "before its walltime Slurm signals the worker's job: its pool's "
            "signal_warning, which the block's script sets): set it to one (such as 120), "
            "or unset it for none"
        )
    return seconds


def leaving_cause(
    retired: str | None, now: float, deadline: float | None, env: Mapping[str, str]
) -> str:
    """Why a worker process is stopping: the scheduler retired it (``retired``, its
    Stop's reason): ``walltime`` when it drained the worker because its walltime was
    near, else ``drained``; ``crash`` when its own core failed (``Worker._core_failed``);
    not retired (None): ``walltime`` (a signal within
    :data:`WALLTIME_MARGIN` seconds of its deadline, plus its pool's ``signal_warning``,
    or after it), ``preempted`` (a
    signal inside a Slurm job at any other time: the batch system took the node back)
    or ``shutdown`` (an operator's signal)."""
    if retired in ("walltime", "crash"):
        return retired
    if retired is not None:
        return "drained"
    if deadline is not None and now >= deadline - WALLTIME_MARGIN - _signal_warning(env):
        return "walltime"
    if env.get("SLURM_JOB_ID"):
        return "preempted"
    return "shutdown"


class _WorkerRefused(Exception):
    """Internal: the manager answered a worker's Hello with a refusal (``error``)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error
