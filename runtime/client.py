"""The user API: :class:`Cluster`, :class:`Future` and the dask scheduler :func:`get`.

What lives here: the embedded cluster (it starts the manager, scheduler, file registry,
autoscaler and workers as actors in the caller's event loop, without taking it over),
the client actor that receives key updates, futures, and ``get`` for
``dask.compute(x, scheduler=get)``.

Errors: a task that raises makes its future raise the original exception (with its
traceback); a future whose dependency failed raises :class:`DependencyFailed` whose
``__cause__`` is the original exception. ``compute`` and ``get`` raise the original
exception of the first failed task, as dask's own schedulers do. A task's exception
that is not an ``Exception`` (``sys.exit()``'s ``SystemExit``, ``KeyboardInterrupt``)
is raised as a :class:`TaskExited` whose ``__cause__`` it is, not as itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import copy
import dataclasses
import functools
import importlib
import inspect
import itertools
import json
import math
import os
import pickle
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, NoReturn, TypeVar

import anyio
import anyio.abc
import dask
from dask._expr import Expr
from dask._task_spec import DataNode, Task, TaskRef
from dask.base import (
    collections_to_expr,
    is_dask_collection,
    normalize_token,
    tokenize,
    unpack_collections,
)
from dask.callbacks import Callback
from dask.core import flatten
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.sizeof import sizeof
from dask.utils import funcname

from actors import transfer
from actors.autoscaler import PoolTarget
from actors.autoscaler_state import check_blocks, policy_failing_text
from actors.manager import GC_THRESHOLD as GC_THRESHOLD  # (Cluster(gc_threshold=GC_THRESHOLD))
from actors.manager import THREAD_THRESHOLD, GatherResult, GcTuning, Manager
from actors.memory import limit_too_small
from actors.providers import DISK_OFF, BlockSpec, InProcessProvider
from actors.scheduler import Scheduler
from actors.scheduler_events import KeyCancelled, KeyDone, KeyErred, KeysReused, KeyTaken
from actors.scheduler_state import MAX_PROGRESS_RUNS
from actors.transfer import READ_TIMEOUT, StreamInfo, UnknownStream
from actors.worker import host_cpus
from policies import KINDS, REGISTRY
from runtime import pickling, unpickling
from runtime.codec import MAX_FRAME_BYTES
from runtime.errors import (
    FLOOR_ADVICE,
    PAST_LIMIT_ADVICE,
    STOP_SIGNALS,
    ActorStopped,
    AddressInUse,
    AskTimeout,
    AuthenticationFailed,
    ClusterAlreadyStarted,
    ClusterClosed,
    CorralError,
    DaskOnlyArgument,
    DependencyFailed,
    EagerComputeOnCluster,
    FileOutputError,
    FrameTooLarge,
    GraphError,
    GraphNotLoadable,
    ManagerLost,
    ManagerStopping,
    ParslOnlyArgument,
    PermissionDenied,
    RemoteError,
    RunNoAnswer,
    TaskArgumentsTooLarge,
    TaskExited,
    UnknownFuture,
    UnknownPolicyError,
    WorkersTimeout,
    memory_sizes,
)
from runtime.files import File
from runtime.graph import (
    SUBMISSION,
    Key,
    ScatteredData,
    TaskOptions,
    check_key,
    check_keys,
    check_shuffle_method,
    collections_expr,
    futures_as_refs,
    futures_pickle_as_refs,
    holds_collection,
    known_size,
    make_task,
    persist_expr,
    reject_collection,
    short_repr,
    too_deep,
    unpicklable_error,
)
from runtime.kernel import Actor, ActorRef, ActorSystem, handles
from runtime.log import get_logger, json_lines
from runtime.messages import (
    ANY_POOL,
    AlertInfo,
    AlertsReply,
    AlertsRequest,
    AutoscalerStatus,
    CancelRequest,
    ClientCame,
    GatherRequest,
    KeyUpdates,
    Message,
    MoveRequest,
    PolicyInfo,
    PolicyQuery,
    ProgressQuery,
    ReleaseKeysRequest,
    RunOutcome,
    RunRequest,
    ScaleRequest,
    SetPolicyRequest,
    StatusReply,
    StatusRequest,
    StoryRequest,
    SubmitGraphRequest,
    SubmitReply,
    WaitForWorkersRequest,
    message,
    pool_name_problem,
    rejoin_causes,
)

# What Cluster() checks its arguments with, and, through these modules, most of what a
# cluster's start runs (aiohttp among them): imported with this module, not in the
# caller's event loop at its first Cluster() (docs/embedding.md). The rest a start
# needs is imported in a thread (_START_MODULES).
from runtime.monitor import alerting_config
from runtime.node import (
    DEAD_AFTER,
    check_one_token,
    check_worker_pool,
    check_worker_timeout,
    end_run,
)
from runtime.progress import PROGRESS_EVERY, Hooks, Tally, TextBar
from runtime.remote import check_run_timeout, pickled_call

__all__ = ["Cluster", "Future", "get", "parse_bytes"]

_log = get_logger("corral.client")

#: Seconds the last ``ProgressQuery`` of a compute with dask callbacks may take.
_PROGRESS_LAST = 2.0
#: What a compute whose progress counts the scheduler let go logs: its bar stops there.
PROGRESS_LET_GO = (
    f"the scheduler counts the progress of at most {MAX_PROGRESS_RUNS} computes at once "
    "(those made with dask callbacks active, such as a ProgressBar) and let this one's "
    "go for a newer one (or the manager started again): its progress bar and callbacks "
    "stop here, and the compute goes on to its result. Make fewer such computes at once "
    "(docs/api.md#progress)"
)

#: Seconds :meth:`Cluster.run` gives each worker to answer, unless told otherwise.
RUN_TIMEOUT = 30.0
#: Seconds the client waits for the manager's answer to a run past its ``timeout``
#: (the manager answers within it: this bounds a manager that does not).
RUN_SLACK = 30.0
#: ``Cluster.run``'s ``on_error`` values, dask's.
RUN_ON_ERROR = ("raise", "return", "ignore")

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "t": 1e12, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}  # fmt: skip  # noqa: E501


def parse_bytes(value: int | float | str | None) -> int:
    """``4GiB``, ``500 MB``, ``1e9`` or an int -> bytes. ``None`` -> 0 (use the machine's)."""
    if value is None:
        return 0
    if isinstance(value, int | float):
        size = float(value)
    else:
        text = value.strip().lower().replace(" ", "")
        num = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(num) :]
        try:
            size = float(num) * _UNITS[unit]
        except (KeyError, ValueError):
            raise ValueError(
                f"cannot read {value!r} as a size; write e.g. '4GiB' or '500MB'"
            ) from None
    if not math.isfinite(size):
        raise ValueError(f"{value!r} is not a size: give a finite number of bytes, e.g. '4GiB'")
    if 0 < size < 1:  # it would read as 0, which means "the machine's" where 0 is allowed
        raise ValueError(f"{value!r} is less than one byte: give a size of at least 1 byte")
    return int(value) if isinstance(value, int) else int(size)


def _told_of(reply: object) -> None:
    """Log, at WARNING, what the manager's answer to a submission says of it (its tasks
    of a pool that is not configured and that no worker has joined wait until one
    joins; a task's memory resource is too small to be bytes): a script waiting on
    their results says why they do not come."""
    if isinstance(reply, SubmitReply):
        for warning in reply.warnings:
            _log.warning(warning, run=reply.run)


#: What ``processes=True`` (or False) without ``pools=`` should have been.
_PROCESSES_BOOL = (
    " (True only with pools=, whose blocks say how many: give processes=N for N worker "
    "processes, or None for in-process workers)"
)


def _whole(name: str, value: object, least: int, *, bool_ok: bool = False, also: str = "") -> int:
    """``value`` if it is a whole number >= ``least``; a ValueError naming ``name``."""
    if (isinstance(value, bool) and not bool_ok) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be a whole number >= {least}{also}, got {value!r}")
    return value


#: What a cluster's start imports besides this module's own imports, by the way it runs
#: (:meth:`Cluster.start` imports them in a thread: ``_import_all``).
_START_MODULES = {
    "embedded": ("runtime.preflight", "runtime.monitordb"),
    "processes": ("actors.processes", "transport.ws", "runtime.metrics", "runtime.dashboard"),
    "address": ("transport.ws",),
}


def _import_all(names: Iterable[str]) -> None:
    for name in names:
        importlib.import_module(name)


def _port(port: object, processes: object) -> int:
    """``Cluster(port=...)`` checked: a port number for worker processes to join on
    (``processes=0`` too: the processes ``scale(n)`` starts join there)."""
    if processes is None or processes is False:
        raise ValueError(
            f"port={port!r} is the port worker processes join the cluster on (127.0.0.1): "
            "give it with processes=N (or pools= with processes=True); in-process workers "
            "listen on nothing"
        )
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be a whole number 0-65535 (0: a free one), got {port!r}")
    return port


# ----------------------------------------------------------------------------- gc

# ----------------------------------------------------------------------------- futures


_Said = set[tuple[tuple[tuple[str, str], ...], float | None]]


def _no_workers_new(alerts: Sequence[AlertInfo], said: _Said) -> list[AlertInfo]:
    """The pending ``CorralNoWorkers`` alerts of ``alerts`` not in ``said``."""
    return [
        a
        for a in alerts
        if a.name == "CorralNoWorkers"
        and a.state == "pending"
        and (tuple(sorted(a.labels.items())), a.active_since) not in said
    ]


def _scaling_failing(auto: AutoscalerStatus | None) -> dict[str, str]:
    """Per pool whose scaling policy fails now (``AutoscalerStatus.policy_failing``),
    why it gets no worker and what to do (:func:`policy_failing_text`)."""
    if auto is None:
        return {}
    return {
        pool: policy_failing_text(auto.policy, pool, problem, auto.desired.get(pool, 0))
        for pool, problem in auto.policy_failing.items()
    }


def _blocks_starting(auto: AutoscalerStatus | None) -> dict[str, int]:
    """Per pool none of whose blocks runs yet, its blocks still starting (pending or
    held in its batch system): its tasks wait for them, as they should. ``*`` (tasks
    any pool may run): every such block, when no block of any pool runs."""
    if auto is None:
        return {}
    states: dict[str, list[str]] = {}
    for block, state in auto.blocks.items():
        states.setdefault(auto.block_pools.get(block, ""), []).append(state)
    starting = {
        pool: sum(s in ("pending", "held") for s in got)
        for pool, got in states.items()
        if pool and "running" not in got and any(s in ("pending", "held") for s in got)
    }
    if starting and not any("running" in got for got in states.values()):
        starting[ANY_POOL] = sum(starting.values())
    return starting


def _starting_text(pool: str, blocks: int) -> str:
    """What the "no worker" warning says of a pool whose ``blocks`` are still starting."""
    where = "any pool" if pool == ANY_POOL else f"pool {pool!r}"
    return (
        f"{blocks} block(s) of {where} are starting (queued in the batch system): the "
        "tasks run once one does. CorralProvisioningStuck fires if one is not running "
        "after 10 minutes"
    )


#: the queue alert a client does not show while the blocks of its pool start
QUEUE_ALERT = "CorralQueueTime"

#: seconds a pool's blocks run (after they started) before a queue alert held back
#: while they started is shown, if it still fires: its tasks had the time to start
QUEUE_GRACE = 60.0

#: a queue alert held back: the alert, and since when its pool has a block running
_Held = dict[tuple[tuple[tuple[str, str], ...], float | None], tuple[AlertInfo, float | None]]


def _queue_news(
    news: Sequence[AlertInfo],
    alerts: Sequence[AlertInfo],
    held: _Held,
    starting: Mapping[str, int],
    now: float,
) -> tuple[list[AlertInfo], _Held]:
    """Of a look's ``news`` (``AlertChanges.news``) at ``now``, what the client logs,
    and the :data:`QUEUE_ALERT` alerts it holds back. One that fires while its pool's
    blocks all still start (``starting``: :func:`_blocks_starting`) is not shown: tasks
    queue while blocks start, as they should (the manager's log and Alertmanager still
    have it). It is shown if it still fires :data:`QUEUE_GRACE` seconds after a block
    of its pool runs (``held``, from the last look, checked against ``alerts``, all the
    manager's now), and forgotten if it resolves before."""
    shown: list[AlertInfo] = []
    kept: _Held = {}
    firing = {
        (tuple(sorted(a.labels.items())), a.active_since): a
        for a in alerts
        if a.name == QUEUE_ALERT and a.state == "firing"
    }
    for key, (alert, ran) in held.items():
        if key not in firing:
            continue  # resolved while held: never shown, so no end to show
        if alert.labels.get("pool", ANY_POOL) in starting:
            kept[key] = (alert, None)
        elif ran is not None and now - ran >= QUEUE_GRACE:
            shown.append(firing[key])
        else:
            kept[key] = (alert, now if ran is None else ran)
    for alert in news:
        key = (tuple(sorted(alert.labels.items())), alert.active_since)
        if alert.name == QUEUE_ALERT and key in held:
            continue  # held (or shown above): its firing or resolution is not news here
        if (
            alert.name == QUEUE_ALERT
            and alert.state == "firing"
            and alert.labels.get("pool", ANY_POOL) in starting
        ):
            kept[key] = (alert, None)
            continue
        shown.append(alert)
    return shown, kept


#: tasks the "no worker to run the ready tasks" warning names as what may be killing
#: the workers, at most (``status()["crash_suspects"]`` has them all)
SUSPECTS_NAMED = 3


def crash_suspects_text(suspects: Mapping[str, Sequence[str]], contained: bool = False) -> str:
    """The tasks of ``suspects`` (``StatusReply.crash_suspects``: per task still to run,
    the workers that ended unexpectedly while it was running, or may have been) said as
    what may be killing the workers, and what to do ("": none). ``contained``: the
    workers run their tasks in task processes already (execution ``process``), so the
    advice does not send them there."""
    if not suspects:
        return ""
    said = []
    for key, workers in list(suspects.items())[:SUSPECTS_NAMED]:
        lives = collections.Counter(workers)
        named = ", ".join(repr(w) if n == 1 else f"{w!r} ({n} lives)" for w, n in lives.items())
        on = "1 worker when it" if len(workers) == 1 else f"{len(workers)} workers when they"
        said.append(
            f"task {key!r} was running, or may have been, on {on} ended unexpectedly ({named})"
        )
    more = len(suspects) - SUSPECTS_NAMED
    return (
        "; ".join(said)
        + (f"; and {more} more (status()['crash_suspects'])" if more > 0 else "")
        + ". It may be what kills them (os._exit, a crash in compiled code): run it alone to "
        + (
            "see; the workers run their tasks in task processes already, where a crash "
            "ends the task's process, not its worker: look for what ends the workers from "
            "outside (the kernel's OOM killer, a kill) "
            if contained
            else "see, or run the workers with execution 'process' to contain it "
        )
        + "(docs/api.md#errors, TaskCrashedWorkers)"
    )


def _no_workers_news(
    alerts: Sequence[AlertInfo],
    said: _Said,
    manager: str,
    failing: Mapping[str, str] | None = None,
    start: str = "start workers, or replacements of those that died",
    suspects: Mapping[str, Sequence[str]] | None = None,
    contained: bool = False,
) -> _Said:
    """Log a WARNING for each pending ``CorralNoWorkers`` alert of ``alerts`` not in
    ``said`` (a pool with ready tasks and no worker, not for 2 minutes yet); return the
    ones pending now, said (what the next look compares with: one line per episode).
    ``failing``: per pool whose scaling policy fails now, what its hint says instead of
    "start workers" (:func:`_scaling_failing`; an alert of any pool, ``*``, names every
    one); ``start``: what starts workers (for an embedded cluster, its ``scale``);
    ``suspects``: the tasks that were running on workers that ended unexpectedly
    (``StatusReply.crash_suspects``), which its hint names first
    (:func:`crash_suspects_text`; ``contained``: the workers run them in task processes
    already)."""
    blame = crash_suspects_text(suspects or {}, contained)
    now = time.time()
    pending = set()
    for alert in alerts:
        if alert.name != "CorralNoWorkers" or alert.state != "pending":
            continue
        key = (tuple(sorted(alert.labels.items())), alert.active_since)
        pending.add(key)
        if key in said:
            continue
        since = 0.0 if alert.active_since is None else max(0.0, now - alert.active_since)
        pool = alert.labels.get("pool", ANY_POOL)
        why = [t for p, t in sorted((failing or {}).items()) if pool in (ANY_POOL, p)]
        hint = (
            "; ".join(why) + ". The CorralNoWorkers alert fires after 2 min"
            if why
            else f"they wait for a worker to join ({start}); the CorralNoWorkers alert "
            "fires after 2 min. To bound the wait, wrap the run in anyio.fail_after(SECONDS)"
        )
        _log.warning(
            "no worker to run the ready tasks",
            manager=manager,
            pool=pool,
            ready=int(alert.value),
            seconds=round(since),
            hint=f"{blame}. {hint[0].upper()}{hint[1:]}" if blame else hint,
        )
    return pending


#: seconds of memory throttling that more than half of the workers (of the pools this
#: client's waiting tasks were submitted to: ``ClientActor.waiting_pools``) must have had while
#: this client's tasks waited (an episode: from the first look that saw them waiting)
#: before the client warns that throttling holds its run back (:func:`_throttle_news`)
THROTTLE_HINT_AFTER = 30.0


class _ThrottleWatch:
    """Client-side state of the throttle hint: each worker's throttled seconds (as the
    manager counts them, ``StatusReply.throttled_seconds``) when the episode began and
    at the latest look; when it began (this client's clock); whether it was told."""

    __slots__ = ("last", "looks", "since", "start", "told")

    def __init__(self) -> None:
        self.start: dict[str, float] | None = None  #: None: no episode (nothing waits)
        self.last: dict[str, float] = {}
        self.since = 0.0
        self.told = False
        self.looks = 0  #: looks at the manager's status made while tasks waited


def _throttle_news(
    watch: _ThrottleWatch,
    reply: StatusReply | None,
    now: float,
    manager: str,
    after: float | None = None,
    pools: set[str | None] | None = None,
) -> bool:
    """One look: ``reply`` is the manager's status while this client's tasks wait
    (None: none waits, which ends the episode). Log ONE warning per episode once more
    than half of the workers (those of ``pools``, the pools its waiting tasks were
    submitted to, when none of them is any pool, None) were throttled for memory
    ``after`` seconds
    (:data:`THROTTLE_HINT_AFTER`) or more since it began: which workers, their limit,
    floor and throttle fence, and what to do. An episode ends when nothing waits, or
    when no worker was throttled since the previous look. Returns whether it warned."""
    after = THROTTLE_HINT_AFTER if after is None else after
    if reply is None:
        watch.start, watch.told = None, False
        return False
    watch.looks += 1
    seconds = dict(reply.throttled_seconds)
    if watch.start is None or (not reply.throttled and seconds == watch.last):
        watch.start, watch.since, watch.told = seconds, now, False  # (again)
    watch.last = seconds
    if watch.told:
        return False
    start = watch.start
    named = None if not pools or None in pools else pools
    present = {i.worker_id for i in reply.workers if named is None or i.pool in named} - set(
        reply.away
    )
    held = {
        w: s - start.get(w, 0.0)
        for w, s in sorted(seconds.items())
        if w in present and s - start.get(w, 0.0) >= after
    }
    if not present or 2 * len(held) <= len(present):
        return False
    watch.told = True
    said = []
    for w, s in held.items():
        m = reply.memory.get(w)
        if m is None:
            said.append(f"{w} (throttled {s:.0f} s)")
            continue
        limit, floor, fence = memory_sizes(m.limit, m.floor, m.throttle_at, top=m.limit)
        floor = f"floor {floor}" if m.floor else "floor under its resume mark"
        said.append(f"{w} (limit {limit}, {floor}, throttles at {fence}, throttled {s:.0f} s)")
    _log.warning(
        "workers throttled for memory hold this client's tasks back",
        manager=manager,
        throttled=f"{len(held)} of {len(present)} workers"
        + ("" if named is None else f" of pool {', '.join(sorted(str(p) for p in named))}"),
        waited=round(now - watch.since),
        workers="; ".join(said),
        hint="a throttled worker starts no new producer (a task that makes more than it "
        "reads: loaders, roots) until its memory falls under its resume mark, so the run "
        f"goes at the pace of its memory, not its cores. {FLOOR_ADVICE[0].upper()}"
        f"{FLOOR_ADVICE[1:]}; from a script, Cluster(memory_per_worker=...) or fewer "
        "threads_per_worker. A floor near the marks is memory that is not outputs "
        "(docs/memory.md#the-floor-memory-that-is-not-outputs); the fences: "
        "docs/memory.md#the-fences. The workers' own logs say when their floor moved "
        "their marks",
    )
    return True


def _past_limit_news(said: set[str], reply: StatusReply | None, manager: str) -> set[str]:
    """One look: log ONE warning per worker episode for each worker in ``reply`` (the
    manager's status while this client's tasks wait; None: none waits, nothing is
    said) that ran past its terminate fence with its tasks in threads
    (``WorkerMemoryReport.past_peak``), which that fence cannot kill, and is still high
    by its latest memory report (throttled, or its RSS at or past its own terminate
    fence, ``WorkerMemoryReport.terminate_at``, where its ``memory_options`` put it, or
    its limit when that fence is off or not told; a worker reports as it stops
    throttling). A worker
    whose memory came back down long ago is not told of: its ``past_peak`` stays for
    as long as it is connected. ``said``: the workers told of already. Returns those
    told of that still are past it (a worker that left, or was told of and is no
    longer, is told of again in a new episode)."""
    if reply is None:
        return said
    past = {
        w: m
        for w, m in sorted(reply.memory.items())
        if m.past_peak
        and (m.throttled or m.rss >= (m.limit if m.terminate_at is None else m.terminate_at))
    }
    for w, m in past.items():
        if w in said:
            continue
        limit, peak = memory_sizes(m.limit, m.past_peak, top=m.limit)
        _log.warning(
            "a worker ran past its memory limit: its tasks run in threads and cannot be killed",
            manager=manager,
            worker=w,
            limit=limit,
            peak=peak,
            hint=f"{PAST_LIMIT_ADVICE}. The manager's status() warnings and dashboard show "
            "its highest RSS as it climbs (docs/memory.md#the-fences)",
        )
    return set(past)


def _policy_call(info: PolicyInfo) -> str:
    """The call that sets the policy ``info`` describes (its params are values)."""
    params = "".join(f", {k}={v!r}" for k, v in sorted(info.params.items()))
    return f"await cluster.set_policy({info.kind!r}, {info.name!r}{params})"


def _console_value(value: Any) -> str:
    """``value`` as the console's ``policy set`` reads it back: JSON, or plain text for
    a str that is not JSON (``pool=gpu``, ``max_lost=20``, ``charge_lost=false``)."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return value if value and " " not in value else json.dumps(value)
    return json.dumps(value)


def _cores_advice(processes: bool) -> str:
    """What the warning that this machine's workers declare more cores than it has CPUs
    asks an embedded cluster for: its own keywords, not the --cores of a worker started
    by hand (``{cpus}``: the CPUs)."""
    count = "processes" if processes else "workers"
    return (
        f"start the Cluster with {count} times threads_per_worker (each worker's cores) "
        "adding up to {cpus} or fewer"
    )


def _policies_left_news(
    set_here: Mapping[str, tuple[PolicyInfo | None, PolicyInfo]],
    in_force: Sequence[PolicyInfo],
    manager: str,
    failing_before: Mapping[str, str] | None = None,
) -> list[str]:
    """At a client's close: per kind it set (``set_here``: the policy before its first
    set, None if not known, and the one its latest set made), warn when what it set is
    still in force on the shared manager (``in_force``): every later client runs under
    it. ``failing_before``: per kind, how the policy before was failing when this client
    replaced it (the status's ``policy_failing``, a scaling policy's the autoscaler's):
    that one is not proposed back.
    Returns the kinds warned of."""
    now = {info.kind: info for info in in_force}
    warned = []
    for kind, (before, mine) in sorted(set_here.items()):
        info = now.get(kind)
        if info is None or (info.name, info.params) != (mine.name, mine.params):
            continue  # changed since (by another client): not this client's to say
        failed = (failing_before or {}).get(kind)
        if before is None:
            back = "the policy in force before it is not known"
        elif (before.name, before.params) == (mine.name, mine.params):
            continue  # set to what was there already: nothing changed
        elif failed is not None:
            back = (
                f"the one in force before it, {before.name!r}, was failing ({failed}), so "
                f"it is not proposed; console: policy list lists the others"
            )
        else:
            back = f"{_policy_call(before)} (console: policy set {kind} {before.name}" + (
                "".join(f" {k}={_console_value(v)}" for k, v in sorted(before.params.items())) + ")"
            )
        warned.append(kind)
        _log.warning(
            "a policy this client set stays in force on the shared manager",
            manager=manager,
            kind=kind,
            name=info.name,
            params=dict(info.params),
            hint=f"it applies to every later client of this manager until set again. "
            f"To set it back: {back}",
        )
    return warned


class _KeyWatch:
    """Client-side state of one key: how many Future objects hold it, and its fate."""

    __slots__ = ("arrived", "fence", "held", "holders", "left", "pool", "update", "wants")

    def __init__(self) -> None:
        self.holders = 0  #: Future objects (and computes) holding the key
        #: the pool its latest submission named (None: any pool, or not submitted here):
        #: the throttle hint counts the workers of the pools this client waits on
        self.pool: str | None = None
        self.update: Any = None  #: KeyDone / KeyErred / KeyCancelled, None while pending
        #: the exceptions of a ``KeyErred`` update (its error, that error's cause, its
        #: root's error) with the tracebacks they came with: each is raised with its own
        #: again (:func:`_task_error`), as raising one object adds the frames of every
        #: raise to its traceback
        self.arrived: tuple[tuple[BaseException, TracebackType | None], ...] = ()
        #: times a Future (or a compute) took the key: a cancel asked before the latest
        #: is for a submission made before it, and is dropped
        self.wants = 0
        #: cancelled for this client only (other clients want the key): this client no
        #: longer wants it at the manager, and words on it that were on their way are
        #: not for it. Until it is submitted again.
        self.left = False
        #: submissions of the key under way: sent, and either not answered yet or
        #: answered that a ``KeyTaken`` comes. Meanwhile a failure or cancel said of it
        #: may be older than the submission (a cancel's word still on its way when the
        #: key was submitted again): it is held, not told, until the answer (then it is
        #: newer) or the ``KeyTaken`` (then it is stale, and what comes before the
        #: ``KeyTaken`` says again where the key stands)
        self.fence = 0
        self.held: Any = None  #: the latest such failure or cancel


class _Waiter:
    """One ``wait_all`` call: how many keys it still waits for, the first that failed
    (``every``: a failure ends no wait, as ``ClientActor.cancel_told`` waits)."""

    __slots__ = ("event", "every", "failed", "pending")

    def __init__(self, every: bool = False) -> None:
        self.pending = 0
        self.every = every
        self.failed: Key | None = None
        self.event = anyio.Event()

    def settle(self, key: Key, ok: bool) -> None:
        if not ok and self.failed is None:
            self.failed = key
            if not self.every:
                self.event.set()
        self.pending -= 1
        if self.pending == 0:
            self.event.set()


class _Wake:
    """A gather waiting to ask again for ``keys`` (their worker did not answer): woken
    by the next update of any of them, or by its timer (:class:`_RetryDue`)."""

    __slots__ = ("event", "keys")

    def __init__(self, keys: tuple[Key, ...]) -> None:
        self.keys = keys
        self.event = anyio.Event()

    def settle(self, key: Key, ok: bool) -> None:
        self.event.set()


#: Seconds a gather waits, times its attempt, before it asks again for values whose
#: worker did not answer; the next update of one of those keys ends the wait sooner.
RETRY_DELAY = 0.2


@message(local=True)
class _Regather(Message):
    """Client-internal: a gather's answer left keys to get again. ``missing`` and
    ``unreachable`` hold ``(key, the update the gather went by)``; ``delay``: seconds
    before asking an unreachable worker again. Answer: an event to wait on, or None."""

    missing: tuple[tuple[Key, Any], ...]
    unreachable: tuple[tuple[Key, Any], ...]
    delay: float


@message(local=True)
class _RetryDue(Message):
    """Client-internal: the timer of a :class:`_Wake` fired."""

    wake: Any


_DEFAULTS = TaskOptions()  #: a ``submit`` call's settings when it gives none


def _task_options(
    func: Callable[..., Any],
    key: Key | None,
    priority: float = 0,
    retries: int = 0,
    resources: Mapping[str, float] | None = None,
    pool: str | None = None,
    timeout: float | None = None,
) -> TaskOptions:
    """The settings of ``submit(func, ..., key=key, priority=...)``, checked;
    ``TypeError`` if ``func`` is not callable."""
    if not callable(func):
        raise TypeError(f"submit needs a callable, got {type(func).__name__}")
    if key is not None:
        check_key(key, "submit")  # as any deployment would refuse it: here, at the call
    if priority == 0 and retries == 0 and resources is None and pool is None and timeout is None:
        return _DEFAULTS  # the common case: nothing to check
    return TaskOptions.of(key or funcname(func), priority, retries, resources, pool, timeout)


#: The keywords of dask.distributed's ``Client.submit`` and ``Client.map`` that Corral's
#: do not take, and what to use instead.
_DASK_ONLY = {
    "workers": "Corral places tasks by pool: name the workers' pool, pool='gpu' "
    "(workers join one with --pool), or ask for what the task needs, resources=",
    "allow_other_workers": "Corral places tasks by pool and resources: leave it out, and "
    "leave out pool= for a task any worker may run",
    "fifo_timeout": "Corral orders tasks by priority= and the order of the calls: leave it out",
    "actor": "Corral has no actors: submit a function, and keep state in its return value",
    "actors": "Corral has no actors: submit a function, and keep state in its return value",
}


#: The keywords a Parsl app takes when called that Corral's ``submit`` and ``map`` do
#: not, and what to use instead.
_PARSL_ONLY = {
    "walltime": "Parsl's walltime= is timeout= here: the seconds each try may run, past "
    "which it fails with TaskTimeout (which retries= retries)",
    "stdout": "Corral does not redirect a task's output: capture it in the task "
    "(subprocess.run(..., capture_output=True, text=True)) and write it to the file, or "
    "return it",
    "stderr": "Corral does not redirect a task's output: capture it in the task "
    "(subprocess.run(..., capture_output=True, text=True)), write it to the file, then "
    "done.check_returncode(), so that a failure's error shows its end",
    "inputs": "Pass a task's inputs as its arguments: a path on shared storage as a str, "
    "or a file output's Future (its File arrives on the task's worker)",
    "outputs": "A task makes a file its output by writing at output_path(name) and "
    "returning File(path); one on shared storage, by returning its path as a str",
    "parsl_resource_specification": "Give resources=, in bytes where Parsl's are MB: "
    "resources={'cores': 2, 'memory': 2000 * 2**20, 'disk': 1000 * 2**20}",
}


def _refuse_dask_only(func: Callable[..., Any], kwargs: Mapping[str, Any]) -> None:
    """:class:`DaskOnlyArgument` for a keyword of dask.distributed's ``submit`` among
    ``kwargs`` that ``func``'s signature does not name (which then gets it, as any other
    keyword), :class:`ParslOnlyArgument` for a keyword of a Parsl app's call alike,
    unless ``func`` takes ``**kwargs`` (a wrapper such as ``sh(cmd, **kw)`` that hands
    ``stdout=`` on to ``subprocess.run``: it takes them without failing). A function
    whose signature cannot be read gets them."""
    given = [name for name in (*_DASK_ONLY, *_PARSL_ONLY) if name in kwargs]
    if not given:
        return
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for name in given:
        param = params.get(name)
        if param is None or param.kind is inspect.Parameter.POSITIONAL_ONLY:
            if name in _DASK_ONLY:
                raise DaskOnlyArgument(name, funcname(func), _DASK_ONLY[name])
            if not takes_any:
                raise ParslOnlyArgument(name, funcname(func), _PARSL_ONLY[name])


class _FuncToken:
    """``func`` normalized for :func:`~dask.base.tokenize` once, to stand in for it in
    each of :meth:`Cluster.map`'s tokens: ``tokenize(_FuncToken(f), a)`` is
    ``tokenize(f, a)``, without pickling ``f`` again for every item (a function of the
    script, ``__main__``, is pickled by value to be tokenized)."""

    __slots__ = ("token",)

    def __init__(self, func: Callable[..., Any]) -> None:
        self.token = normalize_token(func)

    def __dask_tokenize__(self) -> Any:
        return self.token


#: ``submit``'s own keyword arguments, the rest being ``func``'s
_SUBMIT_SETTINGS = ("key", "priority", "retries", "resources", "pool", "timeout")


#: a submission of at least this many tasks is logged at INFO as it goes to the manager
#: and once the manager has taken it in, and a ``map`` of as many items once it has made
#: its tasks (a ``map`` of 300,000 items blocked its caller 13-25 s, and a run's first
#: result came 25-60 s later, with nothing said meanwhile)
LOG_SUBMISSION = 10_000


def _sending(n: int) -> float | None:
    """Log a large submission of ``n`` tasks as it goes; its start (None: not logged)."""
    if n < LOG_SUBMISSION:
        return None
    _log.info("sending a large submission to the manager", tasks=n)
    return time.monotonic()


def _taken_in(n: int, began: float | None) -> None:
    """Log that the manager took in a submission :func:`_sending` logged."""
    if began is not None:
        _log.info(
            "the manager took in the submission", tasks=n,
            seconds=round(time.monotonic() - began, 1),
        )  # fmt: skip


async def _for_manager(manager: object, request: SubmitGraphRequest, refs: bool = False) -> Message:
    """What to ask ``manager`` for ``request``: the request itself, or, to a manager in
    another process, a graph of :data:`~actors.manager.THREAD_THRESHOLD` tasks or more
    (or a dask expression) as the pickle the connection would make of it
    (:func:`runtime.remote.to_wire`), made in a thread, so that its pickling does not
    hold this event loop (docs/embedding.md). Errors are pickling's own, as on the loop.

    :class:`Future` objects in the graph (:func:`_futures_in`): an embedded manager
    takes them as they are (dask reads each as a reference to its key,
    ``__dask_future__``); to a manager process, in a graph or collection given as one
    (``refs``: compute, persist, submit_graph), each goes as a ``TaskRef`` to its key
    (:meth:`Future.__reduce__`); the tasks of ``submit`` and ``map`` have theirs as
    dependencies already, and one left inside an object is refused."""
    if not isinstance(manager, _RemoteManager):
        return request  # an embedded manager takes the objects, and builds large graphs in a thread
    graph = request.graph
    from runtime.remote import to_wire

    size = known_size(graph)
    small = size is not None and size < THREAD_THRESHOLD
    if not refs:
        return request if small else await anyio.to_thread.run_sync(to_wire, request)
    if small:
        return _to_wire_with_refs(request)
    return await anyio.to_thread.run_sync(_to_wire_with_refs, request)


def _to_wire_with_refs(request: SubmitGraphRequest) -> Message:
    """``request`` pickled, each future in its graph as a reference to its key."""
    from runtime.remote import to_wire

    with futures_as_refs():
        return to_wire(request)


# ------------------------------------------------------------------ nested computes
# dask computes while it optimizes: set_index and sort_values compute their divisions
# (quantiles of the column), with the scheduler dask's config names, else dask's
# threads in the calling process. For a collection computed on a cluster those must
# run there: a persisted collection's chunks are on its workers only (dask's threads
# fail on its futures, "Missing dependency"), and a large one's quantiles would read
# the whole data in the client, outside the workers' memory limits. dask's config is
# the process's, so while such an optimization runs in some thread, dask's config
# names :func:`_nested_scheduler`, which runs a compute of that thread on its cluster
# and one of any other thread as that thread would have run it.

_nested = threading.local()  # .get: this thread's cluster scheduler, while optimizing
_nested_lock = threading.Lock()
_nested_state: dict[str, Any] = {"users": 0, "before": None}


def _nested_scheduler(dsk: Any, keys: Any, **kwargs: Any) -> Any:
    """The scheduler in dask's config while a :func:`nested_computes_on` block runs in
    some thread: that thread's cluster's ``get`` there; elsewhere the scheduler dask's
    config named before (dask's threads if none)."""
    get = getattr(_nested, "get", None)
    if get is None:
        before = _nested_state["before"]
        if before is None:
            import dask.threaded

            get = dask.threaded.get
        else:
            from dask.base import get_scheduler

            get = get_scheduler(scheduler=before)
    return get(dsk, keys, **kwargs)


@contextlib.contextmanager
def nested_computes_on(get: Callable[..., Any]) -> Iterator[None]:
    """Within it, in this thread, the computes dask makes while it optimizes (a
    ``set_index``'s divisions) run with ``get``, a synchronous scheduler of the cluster
    the collection is computed on (``Cluster.get``); other threads' computes meanwhile
    run as they would have. Blocks in several threads at once are fine: dask's config
    names :func:`_nested_scheduler` from the first one's start to the last one's end,
    then what it named before."""
    previous = getattr(_nested, "get", None)
    with _nested_lock:
        if _nested_state["users"] == 0:
            before = dask.config.get("scheduler", None)
            # (itself: put back by another thread's dask.config.set block that began in
            # an earlier block and ended after it; named before, it would call itself)
            _nested_state["before"] = None if before is _nested_scheduler else before
            dask.config.set(scheduler=_nested_scheduler)
        _nested_state["users"] += 1
    _nested.get = get
    try:
        yield
    finally:
        _nested.get = previous
        with _nested_lock:
            _nested_state["users"] -= 1
            if _nested_state["users"] == 0:
                if dask.config.get("scheduler", None) is _nested_scheduler:
                    dask.config.set(scheduler=_nested_state["before"])
                _nested_state["before"] = None


#: the client actors of the clusters running in this process, whose held keys
#: :func:`_check_local_compute` looks for
_LIVE_CLIENTS: weakref.WeakSet[ClientActor] = weakref.WeakSet()


def _check_local_compute(dsk: Mapping[Any, Any]) -> None:
    """A dask callback's start, for every compute a scheduler of this process runs once
    a cluster started here (dask's threads, its synchronous one): a graph that reads
    keys a running cluster's client holds Futures of, and does not compute them (the
    chunks of a persisted collection), raises :class:`EagerComputeOnCluster` saying
    what to do, where dask would raise ``ValueError: Missing dependency`` next. Nothing
    for any other graph (a dict lookup per dependency while a cluster holds keys)."""
    held = [c.watches for c in list(_LIVE_CLIENTS) if c.watches]
    if not held:
        return
    found: dict[Any, None] = {}
    for node in dsk.values():
        for dep in getattr(node, "dependencies", ()):
            if dep not in dsk and any(dep in w for w in held):
                found[dep] = None
    if found:
        raise EagerComputeOnCluster(found)


#: :func:`_check_local_compute` as an entry of dask's ``Callback.active``
_LOCAL_CHECK = Callback(start=_check_local_compute)._callback


def _own_callbacks() -> set[Any]:
    """Corral's own entries of dask's ``Callback.active`` (:func:`_check_local_compute`'s),
    which a compute on the cluster does not call: it is for dask's own schedulers."""
    return {_LOCAL_CHECK}


_local_lock = threading.Lock()  #: clusters start and close in any thread's event loop


class _Swapped(set[Any]):
    """``Callback.active`` while a compute under callbacks awaits its tasks
    (:func:`_callbacks_taken`): it remembers the callbacks discarded meanwhile (a
    ``with ProgressBar():`` left while the compute still runs), so that they are not
    put back when the compute ends."""

    def __init__(self, *entries: Any) -> None:
        super().__init__(entries)
        self.dropped: set[Any] = set()

    def discard(self, entry: Any) -> None:
        self.dropped.add(entry)
        super().discard(entry)

    def remove(self, entry: Any) -> None:
        self.dropped.add(entry)
        super().discard(entry)


_T = TypeVar("_T")


async def _followed(
    hooks: Hooks,
    ask: Callable[[], Awaitable[dict[str, Any] | None]],
    said_let_go: Callable[[], None] | None,
    run: str,
    work: Awaitable[_T],
) -> _T:
    """Await ``work`` (a gather) while ``hooks`` are updated with what ``ask`` answers
    (a ``ProgressQuery``'s or a :class:`~runtime.progress.Tally`'s counts) every
    :data:`~runtime.progress.PROGRESS_EVERY` seconds. An answer of None after counts
    (``said_let_go``: the scheduler let the run's counts go) ends the following; so
    does a hook's or the ask's error, logged (the work goes on)."""

    async def follow() -> None:
        counted = False  # (None before the first counts: not taken in yet)
        try:
            while True:
                await anyio.sleep(PROGRESS_EVERY)
                counts = await ask()
                if counts is None and counted and said_let_go is not None:
                    said_let_go()  # let go: the bar would freeze
                    return
                counted = counts is not None
                hooks.update(counts)
        except Exception as exc:  # (a hook's or the ask's: the work goes on)
            _log.warning("progress not followed", run=run, error=repr(exc))

    # a task of its own, not a task group's: the work's error is raised as it is, not
    # in an exception group
    following = asyncio.ensure_future(follow())
    try:
        return await work
    finally:
        following.cancel()
        await asyncio.wait([following])  # (a cancel of this call propagates)


@contextlib.contextmanager
def _callbacks_taken() -> Iterator[list[Any]]:
    """The user's dask callbacks in force, taken from ``Callback.active`` for a compute
    on the cluster, as dask's ``local_callbacks`` takes them (a dask compute inside a
    task of an in-process worker meanwhile calls none of them), but put back as they
    stand when it ends: dask's puts the set back as it was taken, which is right for a
    scheduler that blocks its thread but, across a compute's awaits, kept a callback
    whose ``with`` ended meanwhile registered for good (it was called by every later
    compute) and lost one registered meanwhile. Corral's own entry stays in force."""
    taken = Callback.active
    own = _own_callbacks() & taken
    swapped = _Swapped(*own)
    Callback.active = swapped
    try:
        yield [cb for cb in taken if cb not in own]
    finally:
        swapped.update(cb for cb in taken if cb not in swapped.dropped)
        if Callback.active is swapped:  # (else another swap puts ``swapped`` back)
            Callback.active = set(swapped)


def _watch_local_computes(client: ClientActor, watch: bool = True) -> None:
    """From now on (its cluster started) :func:`_check_local_compute` knows ``client``'s
    keys; the dask callback is in ``Callback.active`` while a cluster runs in this
    process. With ``watch`` false (its cluster closes): no longer, and the callback goes
    with the last cluster. While one of dask's local schedulers computes, in any
    thread, ``Callback.active`` is an empty set that dask swaps back at the end: so the
    callback is added at each start (one made meanwhile was swapped away) and discarded
    at the last close, never removed (it may be absent: ``KeyError``); one dask swaps
    back after the last close checks nothing (no client) and is not a user's."""
    with _local_lock:
        if watch:
            _LIVE_CLIENTS.add(client)
            Callback.active.add(_LOCAL_CHECK)
        else:
            _LIVE_CLIENTS.discard(client)
            if not _LIVE_CLIENTS:
                Callback.active.discard(_LOCAL_CHECK)


def _graph_and_keys(args: tuple[Any, ...]) -> bool:
    """Whether ``compute(*args)`` is ``compute(graph, keys)``: two arguments, the keys
    no collection, and the graph a mapping that is no collection (a dict is not looked
    into: a graph's tasks may be many) or anything else holding none (a list of
    collections is ``compute([x, y], z)``)."""
    if len(args) != 2 or holds_collection(args[1], in_dicts=True):
        return False
    graph = args[0]
    if isinstance(graph, Mapping) and not is_dask_collection(graph):
        return True
    return not holds_collection(graph)


def futures_of(*collections: Any) -> list[Future]:
    """The :class:`Future` objects that dask collections hold, each once, as
    dask.distributed's ``futures_of``: those of a collection :meth:`Cluster.persist`
    returned, or of one made from it, are its chunks on the cluster, so ``await
    cluster.gather(futures_of(x))`` waits for them (their values: ``fut.wait()`` for
    each, not to bring them over). Lists and tuples of collections are looked into;
    ``TypeError`` for anything else. Nothing is computed nor materialized: the
    collections' expressions are read as they are."""
    if not holds_collection(list(collections)):
        raise TypeError(
            f"futures_of takes dask collections (futures_of(x), futures_of(x, y)); got "
            f"{', '.join(type(c).__name__ for c in collections) or 'nothing'}"
        )
    found, _ = unpack_collections(*collections, traverse=True)
    return _futures_in(collections_to_expr(list(found), optimize_graph=False))


#: types that wrap a Future in ``.future`` (runtime.sync_client's ClientFuture, which
#: this layer does not import): _futures_in checks the Future they hold
FUTURE_WRAPPERS: set[type] = set()


def _futures_in(graph: Any) -> list[Future]:
    """The :class:`Future` objects inside ``graph`` (a graph, a dask expression, or
    what they hold), each once: where dask keeps a collection's values (legacy tasks'
    tuples, lists and dicts; a ``HighLevelGraph``'s materialized layers; an expression's
    operands), as :meth:`Cluster.persist`'s collections and graphs written by hand hold
    them. Layers dask generates (blockwise) are not materialized to look."""
    found: dict[int, Future] = {}
    seen: set[int] = set()
    stack = [graph]
    while stack:
        obj = stack.pop()
        t = type(obj)
        if t is Future:
            found.setdefault(id(obj), obj)
        elif t in FUTURE_WRAPPERS:
            stack.append(obj.future)
        elif t is tuple or t is list or t is set or t is frozenset:
            stack.extend(obj)
        elif t is dict:
            stack.extend(obj.values())
        elif isinstance(obj, Task):  # a dask.delayed call's, or a list or dict of its
            # arguments that also holds a delayed (dask's List, Dict: Task subclasses)
            stack.extend(obj.args)
            stack.extend(obj.kwargs.values())
        elif isinstance(obj, Expr | HighLevelGraph | MaterializedLayer):
            if id(obj) in seen:  # (an expression's nodes may be shared)
                continue
            seen.add(id(obj))
            if isinstance(obj, Expr):
                stack.extend(obj.operands)
            elif isinstance(obj, HighLevelGraph):
                stack.extend(obj.layers.values())
            else:
                stack.append(obj.mapping)
    return list(found.values())


@message(local=True)
class _Flush(Message):
    """Client-internal: send the tasks queued by ``submit``."""


@message(local=True)
class _ManagerGone(Message):
    """Client-internal: the connection to the manager is gone (``error``: ManagerLost)."""

    error: Any


class _RemoteManager:
    """The manager of another process, as a client sees it: a :class:`RemoteRef` whose
    failures, once the connection is gone, say so (:class:`ManagerLost`) rather than
    that some actor stopped."""

    def __init__(self, peer: Any, address: str) -> None:
        self.peer = peer
        self.ref = peer.ref
        self.address = address

    @property
    def name(self) -> str:
        return str(self.ref.name)

    @property
    def stopped(self) -> bool:
        return bool(self.ref.stopped)

    def lost(self) -> ManagerLost:
        """What the calls raise once the connection is gone: the manager's goodbye
        (:class:`ManagerStopping`) when it stopped on purpose, else ManagerLost."""
        farewell = self.peer.farewell
        if farewell is not None:
            how = getattr(farewell, "how", STOP_SIGNALS)
            return ManagerStopping(self.address, how, for_client=True)
        silent = self.peer.timeout if self.peer.silent else None  # it may only be stalled
        return ManagerLost(self.address, self.peer.why_closed(), silent)

    @property
    def gone(self) -> bool:
        """The connection is closed, or closing (a send found it so before the peer
        finished reading what was left)."""
        return bool(self.peer.closed or self.peer.conn.closed)

    def post(self, msg: Message, *, causal_id: str | None = None) -> None:
        try:
            self.ref.post(msg, causal_id=causal_id)
        except ActorStopped:
            raise self.lost() from None  # (the internal ActorStopped says nothing to do)

    async def tell(self, msg: Message, *, causal_id: str | None = None) -> None:
        try:
            await self.ref.tell(msg, causal_id=causal_id)
        except ActorStopped:
            raise self.lost() from None  # (the internal ActorStopped says nothing to do)

    async def ask(
        self,
        msg: Message,
        *,
        timeout: float | None = 30.0,  # noqa: ASYNC109 - the same API as ActorRef.ask
        causal_id: str | None = None,
    ) -> Any:
        try:
            return await self.ref.ask(msg, timeout=timeout, causal_id=causal_id)
        except ActorStopped:
            if self.gone:
                raise self.lost() from None
            raise


@message(local=True)
class _FlushReleases(Message):
    """Client-internal: tell the manager about the keys let go since the last flush
    while no ``submit`` call was waiting to go (those let go after one go with its
    batch, :attr:`ClientActor.after_flush`)."""


@message(local=True)
class _SendReleases(Message):
    """Client-internal, asked: tell the manager now of the keys let go so far, after
    what this actor had to send before (the graphs of ``submit`` calls, answered)."""


@message(local=True)
class _Cancel(Message):
    """Client-internal: cancel ``keys`` for this client (``Cluster.cancel``,
    ``Future.cancel``). ``wants``: each key's :attr:`_KeyWatch.wants` when asked.
    ``told``: nobody waits for the answer (``Future.cancel``), so a failure is logged."""

    keys: tuple[Key, ...]
    wants: tuple[int, ...]
    reason: str
    told: bool = False


#: What a client's cancel says on its futures of a task other clients want too.
SHARED_CANCEL = (
    "{reason}, for this client only: other clients of the manager want this task (or a "
    "task that needs it) too, so it runs on for them (submit it again to want its result "
    "again)"
)


class ClientActor(Actor):
    """Receives key updates from the manager; batches ``submit`` calls into graphs."""

    def __init__(self, manager: ActorRef[Manager] | _RemoteManager) -> None:
        self.manager = manager
        self.watches: dict[Key, _KeyWatch] = {}
        #: tasks from submit() not sent yet, with their options, in the order made
        self.pending: dict[Key, tuple[Any, TaskOptions]] = {}
        self.flush_queued = False
        #: the keys the tasks in :attr:`pending` read, with how many of those tasks
        #: read each (a released key among them still goes with them: they need it;
        #: once the last of them is dropped, so is it, if it is still to go)
        self.read_by_pending: collections.Counter[Key] = collections.Counter()
        #: keys no Future holds any more, let go while nothing was pending, not yet sent
        #: (:class:`_FlushReleases`)
        self.to_release: dict[Key, None] = {}
        #: keys let go while tasks were pending (submit calls made before the release):
        #: sent after those tasks' graphs, by the ``_Flush`` that sends them
        self.after_flush: dict[Key, None] = {}
        #: gathers waiting on each key (its update, or its retry), and as_completed
        #: iterators
        self.waiters: dict[Key, list[_Waiter | _Wake | _Arrivals | _Ends]] = {}
        self.wakes: set[_Wake] = set()  #: gathers waiting to ask again
        self.loop_thread = threading.get_ident()  #: the event loop's thread
        #: why nothing more will come (the cluster stopped, the manager was lost): the
        #: error every key still pending then failed with; None while it runs
        self.gone: BaseException | None = None

    async def on_stop(self) -> None:
        # Nothing may wait for ever on a cluster that is gone: fail every pending key.
        err = CorralError(
            "the cluster stopped before this task finished (closed, or one of its actors "
            "crashed: Cluster.close() raises ActorCrashed with the cause)"
        )
        self.gone = self.gone or err
        for key, w in list(self.watches.items()):
            if w.update is None:
                self._settle(KeyErred("", key, err, key, err))
        for wake in list(self.wakes):  # and no gather waits for a retry that never comes
            self._wake_up(wake)

    @handles(_ManagerGone)
    def manager_gone(self, msg: _ManagerGone) -> None:
        """Every key still pending fails with the ManagerLost error: nothing will come."""
        self.gone = msg.error
        for key, w in list(self.watches.items()):
            if w.update is None:
                self._settle(KeyErred("", key, msg.error, key, msg.error))
        for wake in list(self.wakes):  # their next ask says ManagerLost
            self._wake_up(wake)

    @handles(KeyUpdates)
    def updates(self, msg: KeyUpdates) -> None:
        rejoin_causes(msg.updates)  # (from another process: see KeyUpdates.for_wire)
        for upd in msg.updates:
            if type(upd) is KeysReused:  # keys of a submission that named other tasks
                _log.warning(upd.text(), keys=upd.count)
                continue
            w = self.watches.get(upd.key)
            if w is None or w.left:  # left: sent before our release came
                continue
            if type(upd) is KeyTaken:
                if upd.pending:  # runs (again): what was held or told before is stale
                    w.held = w.update = None
                self._unfence(w)
            elif w.fence and not isinstance(upd, KeyDone):
                w.held = upd
            else:
                w.held = None
                self._tell(w, upd)

    def _unfence(self, w: _KeyWatch) -> None:
        """One submission of ``w``'s key is answered, taken in, or failed before it went:
        once none is under way, what was held is told."""
        if w.fence:
            w.fence -= 1
        if not w.fence and w.held is not None:
            upd, w.held = w.held, None
            self._settle(upd)

    def sent(self, keys: Iterable[Key], reply: object) -> None:
        """A submission of ``keys`` was answered (``reply``) or failed (None): the keys
        no ``KeyTaken`` comes of are no longer under way."""
        echoed = {_wire_key(k) for k in reply.echoed} if isinstance(reply, SubmitReply) else set()
        for key in keys:
            w = self.watches.get(key)
            if w is not None and key not in echoed:
                self._unfence(w)

    def _settle(self, upd: Any) -> None:
        w = self.watches.get(upd.key)
        if w is not None:
            self._tell(w, upd)

    def _tell(self, w: _KeyWatch, upd: Any) -> None:
        """``upd`` is the word on ``w``'s key: the watch keeps it (a failure's exceptions
        with the tracebacks they came with), its waiters hear."""
        w.update = upd
        if isinstance(upd, KeyErred):
            # A root's exception this client raised already (its own future awaited)
            # came with the traceback its root's watch kept.
            root = self.watches.get(upd.root)
            known = root.arrived if root is not None and root is not w else ()
            arrived: list[tuple[BaseException, TracebackType | None]] = []
            for exc in (upd.error, upd.error.__cause__, upd.root_error):
                if exc is not None and all(e is not exc for e, _ in arrived):
                    tb = next((t for e, t in known if e is exc), exc.__traceback__)
                    arrived.append((exc, tb))
            w.arrived = tuple(arrived)
        waiters = self.waiters.pop(upd.key, None)
        if waiters:
            ok = isinstance(upd, KeyDone)
            for waiter in waiters:
                waiter.settle(upd.key, ok)

    async def wait_all(self, keys: Sequence[Key]) -> Key | None:
        """Wait until every key is done or one failed; return the failed key, if any.

        O(1) per update however many keys are waited for, and no event-loop round trip
        for keys that are already done.
        """
        waiter = _Waiter()
        for key in keys:
            w = self.watches.get(key)
            if w is None:  # every Future of it was released: nothing will come
                return key
            if w.update is not None:
                if not isinstance(w.update, KeyDone):
                    return key
                continue
            waiter.pending += 1
            self.waiters.setdefault(key, []).append(waiter)
        if waiter.pending:
            await waiter.event.wait()
            if waiter.failed is None:
                # A key whose done word settled this wait may have failed since: its
                # output lost, the task made again failed (a third crash, say). That
                # word settles no waiter (this one was settled); a gather must raise
                # it, not fetch the key: the manager, which has no KeyDone of it,
                # answers "missing", and the client would wait for a word that came.
                for key in keys:
                    w = self.watches.get(key)
                    if w is None:
                        return key
                    if w.update is not None and not isinstance(w.update, KeyDone):
                        return key
        return waiter.failed

    async def cancel_told(self, request: _Cancel) -> None:
        """Wait until this client's futures of the keys ``request`` asked to cancel have
        the cancel's word (or whatever word came first: the task finished, failed, or
        its futures were released), as the manager's answer to it left them: a key the
        scheduler cancels is told ``KeyCancelled`` soon after that answer, on its way
        through the manager. A key let go or submitted again since the cancel was asked
        is not waited for (that submission decides its word), nor one told already. The
        words come or the client stops (its ``on_stop`` and a lost manager fail every
        key still pending)."""
        waiter = _Waiter(every=True)
        for key, wants in zip(request.keys, request.wants, strict=True):
            w = self.watches.get(key)
            if w is None or w.left or w.wants != wants or w.update is not None:
                continue
            waiter.pending += 1
            self.waiters.setdefault(key, []).append(waiter)
        if waiter.pending:
            await waiter.event.wait()

    @handles(_Regather)
    def regather(self, msg: _Regather) -> anyio.Event | None:
        """What a gather's answer means for the watches, decided here and not in the
        gather (which awaited meanwhile): an update that came while it waited is newer
        than the answer and stands. A missing key waits for the scheduler's next word
        on it; an unreachable one (still where it was, as far as anyone knows) is asked
        for again after ``msg.delay`` seconds or at its next update."""
        for key, upd in msg.missing:
            w = self.watches.get(key)
            if w is not None and w.update is upd:
                w.update = None
        keys = []
        for key, upd in msg.unreachable:
            w = self.watches.get(key)
            if w is not None and w.update is upd:
                keys.append(key)
        if not keys:
            return None
        wake = _Wake(tuple(keys))
        for key in keys:
            self.waiters.setdefault(key, []).append(wake)
        self.wakes.add(wake)
        self.send_later(msg.delay, _RetryDue(wake))
        return wake.event

    @handles(_RetryDue)
    def retry_due(self, msg: _RetryDue) -> None:
        self._wake_up(msg.wake)

    def _wake_up(self, wake: _Wake) -> None:
        wake.event.set()
        self.wakes.discard(wake)
        for key in wake.keys:
            waiting = self.waiters.get(key)
            if waiting is not None and wake in waiting:
                waiting.remove(wake)
                if not waiting:
                    del self.waiters[key]

    def queue(self, key: Key, task: Any, opts: TaskOptions) -> None:
        """``key``'s task from ``submit``, sent at the next ``_Flush`` (queued if it is
        the first since the last one began)."""
        self.pending[key] = (task, opts)
        readers = self.read_by_pending
        for dep in getattr(task, "dependencies", ()):
            readers[dep] = readers.get(dep, 0) + 1
        if not self.flush_queued:
            self.flush_queued = True
            self.ref.post(_Flush())

    @handles(_Flush)
    async def flush(self, msg: _Flush) -> None:
        """Send the tasks of ``submit`` calls as one graph per run of calls with the same
        options, in the order they were made (a task's inputs were submitted before it,
        so each graph's dependencies went out before it); then the keys let go since
        those calls, which their tasks may read (dask's ``del`` of a future passed to
        ``submit``): the manager has the tasks that need them by then."""
        self.flush_queued = False
        pending, self.pending = self.pending, {}
        self.read_by_pending = collections.Counter()
        after, self.after_flush = self.after_flush, {}
        try:
            await self._send_pending(pending)
        finally:
            # those held again meanwhile stay (as watch() drops a release not sent yet)
            keys = tuple(k for k in after if k not in self.watches)
            if keys and not self.manager.stopped:
                self.manager.post(ReleaseKeysRequest(keys, self.name))

    async def _send_pending(self, pending: dict[Key, tuple[Any, TaskOptions]]) -> None:
        """:meth:`flush`'s sending of the ``pending`` tasks."""
        runs: list[tuple[TaskOptions, dict[Key, Any]]] = []
        for key, (task, opts) in pending.items():
            if not runs or runs[-1][0] != opts:
                runs.append((opts, {}))
            runs[-1][1][key] = task
        #: keys failed here, never sent: the task whose own failure it was, and its error
        failed: dict[Key, tuple[Key, BaseException]] = {}
        todo = collections.deque(runs)
        while todo:
            opts, graph = todo.popleft()
            self._fail_dependents(graph, failed)
            while graph:
                request = SubmitGraphRequest(
                    graph, tuple(graph), self.name, opts.priority, opts.retries,
                    dict(opts.resources) or None, opts.pool, opts.timeout,
                )  # fmt: skip
                try:
                    began = _sending(len(graph))
                    reply = await self.manager.ask(await _for_manager(self.manager, request))
                    _taken_in(len(graph), began)
                    self.sent(graph, reply)
                    _told_of(reply)
                    break
                except FrameTooLarge as exc:
                    # More than one message to a remote manager may carry: in parts that
                    # fit, in order (a task's inputs were submitted before it); a task
                    # whose own arguments are too much fails alone.
                    limit = int(exc.fields["limit"])
                    parts = await self._parts(graph, limit, failed)
                    todo.extendleft((opts, part) for part in reversed(parts))
                    break
                except GraphNotLoadable as exc:
                    # The manager could not load a task of it (the error names the first
                    # it met). More tasks than one, made by separate submit calls: those
                    # that load from the module it lacks fail, each naming its own
                    # function, and the rest go again; if none is found so, it goes in
                    # halves, in order, until each refused part is one task, which fails.
                    if len(graph) > 1 and await self._fail_not_loadable(graph, exc, failed):
                        self._fail_dependents(graph, failed)
                        continue
                    if len(graph) > 1:
                        keys = list(graph)
                        half = len(keys) // 2
                        todo.appendleft((opts, {k: graph[k] for k in keys[half:]}))
                        todo.appendleft((opts, {k: graph[k] for k in keys[:half]}))
                        break
                    (key,) = graph
                    failed[key] = (key, exc)
                    self.fail_local(key, exc)
                    break
                except Exception as exc:
                    # Not sent for a remote manager, as it does not pickle (nothing went):
                    # the tasks that do not pickle fail alone, the rest go again.
                    if not isinstance(exc, CorralError) and self._fail_unpicklable(graph, failed):
                        self._fail_dependents(graph, failed)
                        continue
                    for _, later in [(opts, graph), *todo]:  # and the later graphs
                        for key in later:
                            self.fail_local(key, exc)
                    return

    async def _parts(
        self, graph: dict[Key, Any], limit: int, failed: dict[Key, tuple[Key, BaseException]]
    ) -> list[dict[Key, Any]]:
        """``graph`` cut, in order, into graphs of at most 3/4 of ``limit`` bytes
        pickled; a task whose own arguments pass ``limit`` fails here with
        :class:`TaskArgumentsTooLarge`. The tasks are pickled in a thread, so that the
        connection's heartbeats go on meanwhile."""

        def sizes() -> list[int]:
            return [len(pickling.cloudpickle_dumps(task)) for task in graph.values()]

        parts: list[dict[Key, Any]] = [{}]
        room = limit * 3 // 4
        used = 0
        for (key, task), n in zip(
            graph.items(), await anyio.to_thread.run_sync(sizes), strict=True
        ):
            if n > limit - (1 << 20):  # with the request around it, it cannot go
                error = TaskArgumentsTooLarge(str(key), n, limit)
                failed[key] = (key, error)
                self.fail_local(key, error)
                continue
            if parts[-1] and used + n > room:
                parts.append({})
                used = 0
            parts[-1][key] = task
            used += n
        return [p for p in parts if p]

    def _fail_unpicklable(
        self, graph: dict[Key, Any], failed: dict[Key, tuple[Key, BaseException]]
    ) -> bool:
        """Fail (and take out of ``graph``) each task that does not pickle on its own,
        with an error saying so; whether there was any."""
        found = False
        for key, task in list(graph.items()):
            try:
                pickling.cloudpickle_dumps(task)
            except Exception as exc:
                error = unpicklable_error(key, exc)
                error.__cause__ = exc
                del graph[key]
                failed[key] = (key, error)
                self.fail_local(key, error)
                found = True
        return found

    async def _fail_not_loadable(
        self,
        graph: dict[Key, Any],
        refused: GraphNotLoadable,
        failed: dict[Key, tuple[Key, BaseException]],
    ) -> bool:
        """Fail (and take out of ``graph``) each task whose pickle loads something from
        the module the manager could not import (``refused.module``), with a
        :class:`GraphNotLoadable` naming what it loads from there; whether there was
        any. The tasks are pickled and read in a thread (heartbeats go on meanwhile)."""
        module, reason = str(refused.fields["module"]), str(refused.fields["reason"])

        def scan() -> list[str | None]:
            dumps, needs = pickling.cloudpickle_dumps, unpickling.needs_module
            return [needs(dumps(task), module) for task in graph.values()]

        found = False
        for key, what in zip(list(graph), await anyio.to_thread.run_sync(scan), strict=True):
            if what is not None:
                error = GraphNotLoadable(what, module, reason)
                error.__cause__ = refused.__cause__
                del graph[key]
                failed[key] = (key, error)
                self.fail_local(key, error)
                found = True
        return found

    def _fail_dependents(
        self, graph: dict[Key, Any], failed: dict[Key, tuple[Key, BaseException]]
    ) -> None:
        """Fail (and take out of ``graph``) the tasks that depend on a task failed here,
        which the manager never saw, as the scheduler would (a task's inputs come first)."""
        if not failed:
            return
        for key, task in list(graph.items()):
            dep = next((d for d in getattr(task, "dependencies", ()) if d in failed), None)
            if dep is None:
                continue
            root, root_error = failed[key] = failed[dep]
            reason = f"{type(root_error).__name__}: {root_error}"
            error = DependencyFailed(str(key), str(root), reason)
            error.__cause__ = root_error
            del graph[key]
            self.sent((key,), None)
            self._settle(KeyErred("", key, error, root, root_error))

    def fail_local(self, key: Key, error: BaseException) -> None:
        """``key`` failed here, before its submission went."""
        self.sent((key,), None)
        self._settle(KeyErred("", key, error, key, error))

    def waiting(self) -> bool:
        """Some task of this client waits: a Future (or a compute) holds a key with no
        word on its fate yet (the throttle hint looks only then)."""
        if self.pending:
            return True
        return any(w.update is None and w.holders and not w.left for w in self.watches.values())

    def waiting_pools(self) -> set[str | None]:
        """The pools the waiting keys of this client were submitted to (None: any
        pool): whose workers the throttle hint counts. One pass over its keys."""
        pools: set[str | None] = {opts.pool for _, opts in self.pending.values()}
        pools.update(
            w.pool for w in self.watches.values() if w.update is None and w.holders and not w.left
        )
        return pools

    def watch(self, key: Key) -> _KeyWatch:
        """The key's watch, for a Future (or a compute) being made: its key is being
        submitted (again). A key that failed or was cancelled runs again: its futures,
        old and new, wait for that run."""
        w = self.watches.get(key)
        if w is None:
            w = self.watches[key] = _KeyWatch()
            # Held again before its release went out: cancel the release, or it could
            # reach the manager after the new submission (which does not pass through
            # this actor) and drop the key that submission wants. The manager still
            # counts this client for the key and re-sends its state on resubmission.
            self.to_release.pop(key, None)
            self.after_flush.pop(key, None)
            if key in self.pending:  # its task still to go, kept for the tasks reading it
                w.fence = 1
        elif w.left:  # cancelled for this client only, now submitted again: wanted again
            w.left = False
            w.update = None
        elif w.update is not None and type(w.update) is not KeyDone:
            w.update = None
        w.wants += 1
        return w

    def unhold(self, key: Key) -> None:
        w = self.watches.get(key)
        if w is None:
            return
        w.holders -= 1
        if w.holders <= 0:
            del self.watches[key]
            if key not in self.read_by_pending:  # not sent yet, and no task to go reads it
                self._drop_pending(key)
            # A gather still waiting on it (a Future released while awaited): nothing
            # will come for it now; it fails saying so.
            for waiter in self.waiters.pop(key, ()):
                waiter.settle(key, False)
            if self.pending:
                # After the submit calls not sent yet, made before it (their tasks may
                # read it): it goes right after their graphs (flush).
                self.after_flush[key] = None
                return
            # Batched: every release made before the actor next runs goes as one message.
            self.to_release[key] = None
            if len(self.to_release) == 1 and not self.ref.stopped:
                self.ref.post(_FlushReleases())

    def _drop_pending(self, key: Key) -> None:
        """Take ``key``'s task out of :attr:`pending`, if it is there, and with it each
        of its inputs still to go that nothing holds and no other task to go reads, and
        theirs in turn (let go in the same turn of the event loop: ``y = submit(g, x)``,
        then ``y.release()`` and ``x.release()``, in either order), so none of them is
        sent. Their releases still go (:meth:`unhold` queued them): a key may have been
        sent before, and be pending again to run again."""
        readers = self.read_by_pending
        todo = [key]
        while todo:
            entry = self.pending.pop(todo.pop(), None)
            if entry is None:
                continue
            for dep in getattr(entry[0], "dependencies", ()):
                left = readers[dep] - 1
                if left > 0:
                    readers[dep] = left
                    continue
                del readers[dep]
                if dep not in self.watches:  # let go already, and read by no task to go
                    todo.append(dep)

    @handles(_FlushReleases, _SendReleases)
    def flush_releases(self, msg: _FlushReleases | _SendReleases) -> None:
        """Tell the manager of the keys let go since the last time. Asked
        (``_SendReleases``) by ``Cluster.submit_graph`` before it sends a graph: in this
        mailbox's order, after the ``submit`` graphs queued before it (which may read
        those keys), and before that graph (which must find them let go)."""
        keys, self.to_release = self.to_release, {}
        if keys and not self.manager.stopped:
            self.manager.post(ReleaseKeysRequest(tuple(keys), self.name))

    @handles(MoveRequest)
    async def move(self, msg: MoveRequest) -> Any:
        """``Cluster.move``: sent through this actor, so it reaches the manager after
        the submissions made before it (``_Flush``)."""
        return await self.manager.ask(msg, timeout=None)

    @handles(_Cancel)
    async def cancel(self, msg: _Cancel) -> None:
        """Cancel keys for this client. Sent through this actor, so it reaches the
        manager after the submissions made before it (``_Flush``): the manager then
        counts this client among those that want each key. The manager cancels the keys
        no other client wants (the scheduler's ``KeyCancelled`` comes back as usual) and
        answers the others: for those this client alone is done (its futures raise
        ``CancelledError`` saying the task runs on) and it stops wanting them there."""
        asked = dict(zip(msg.keys, msg.wants, strict=True))
        keys = tuple(k for k, wants in asked.items() if self._still_asked(k, wants))
        if not keys:
            return
        try:
            # the keys other clients want too (an older manager answers None)
            shared = await self.manager.ask(CancelRequest(keys, msg.reason, self.name)) or ()
        except Exception as exc:  # the manager gone, say
            if not msg.told:
                raise
            self.log.warning("cancel failed", keys=[str(k) for k in keys[:5]], error=str(exc))
            return
        leave = []
        for key in shared:
            if not self._still_asked(key, asked[key]):
                continue  # let go or submitted again while the manager answered
            if self.watches[key].update is not None:
                continue  # finished, failed or cancelled: a cancel changes nothing of it
            self._settle(KeyCancelled("", key, SHARED_CANCEL.format(reason=msg.reason)))
            self.watches[key].left = True
            leave.append(key)
        if leave and not self.manager.stopped:
            self.manager.post(ReleaseKeysRequest(tuple(leave), self.name))

    def _still_asked(self, key: Key, wants: int) -> bool:
        """A cancel of ``key`` asked when its watch counted ``wants`` still applies: the
        key is held, not cancelled for this client already, and not submitted again
        since (that submission, made after the cancel, wants it)."""
        w = self.watches.get(key)
        return w is not None and not w.left and w.wants == wants

    def cancel_request(self, keys: Sequence[Key], reason: str, *, told: bool) -> _Cancel:
        """The :class:`_Cancel` for ``keys``, as their watches stand now."""
        wants = tuple(w.wants if (w := self.watches.get(k)) else 0 for k in keys)
        return _Cancel(tuple(keys), wants, reason, told)


def _release_soon(loop: asyncio.AbstractEventLoop, client: ClientActor, key: Key) -> None:
    """Finalizer of a Future: release its key on the loop thread (GC may run anywhere)."""
    try:
        if threading.get_ident() == client.loop_thread:
            loop.call_soon(client.unhold, key)  # no self-pipe wake-up needed
        else:
            loop.call_soon_threadsafe(client.unhold, key)
    except RuntimeError:  # the loop is closed: the cluster is gone anyway
        pass


class Future:
    """A handle on a task's result. ``await fut`` gives the value (or raises)."""

    __slots__ = ("__weakref__", "_client", "_cluster", "_finalizer", "_watch", "key")

    #: dask's mark of a scheduler's future (``dask._task_spec``): inside a dask graph or
    #: a task's arguments, dask reads it as a reference to its key (a dependency), as it
    #: reads dask.distributed's. So a persisted collection (:meth:`Cluster.persist`),
    #: whose graph maps each of its keys to its future, is computed from those futures.
    __dask_future__ = True

    def __init__(self, key: Key, cluster: Cluster, *, _submitting: bool = False) -> None:
        """``Future(key, cluster)`` by hand: another Future of a key this cluster's client
        holds; :class:`UnknownFuture` for any other key, which nothing would answer.
        ``_submitting``: made by a submission of the key (``submit``, ...)."""
        client = cluster._client_actor
        if not _submitting and key not in client.watches:
            raise UnknownFuture(key)
        self.key = key
        self._cluster = cluster
        self._client = client
        self._watch = client.watch(key)
        self._watch.holders += 1
        self._finalizer = weakref.finalize(
            self, _release_soon, asyncio.get_running_loop(), client, key
        )

    def __repr__(self) -> str:
        return f"<Future {self.key!r} {self.status}>"

    def __dask_tokenize__(self) -> tuple[str, Key]:
        """A future stands for its task, so it tokenizes as its key: a pure call taking
        it gets the same key each time, without pickling anything (as dask's)."""
        return ("corral.Future", self.key)

    def __reduce__(self) -> tuple[Any, tuple[Key]]:
        """Inside the tasks of a graph or dask collection given to compute, persist or
        submit_graph (:func:`runtime.graph.futures_as_refs`), a future pickles as a
        reference to its key, dask's ``TaskRef`` (as dask.distributed's pickles as its
        key), never its value: where dask finds it in a graph (:func:`_futures_in`)
        that is a dependency; inside an object such a task takes (an xarray object in
        its collection's finalize task, whose dask data are a persisted collection's
        futures, read for their metadata) it is the reference alone. Anywhere else
        (inside an object, a closure or a dict key given to ``submit`` or ``map``, a
        scattered object, ``Cluster.run``'s function) pickling it, to a task process
        or a manager process, raises :class:`TypeError` saying what to do: the task
        would get a bare reference, not the value (with threads it gets the future)."""
        if not futures_pickle_as_refs():
            raise TypeError(
                f"a Future ({self.key!r}) cannot be sent to another process inside an "
                "object, a closure or a dict key: the task would get no value. Pass the "
                "future as an argument (or in a list, tuple, set or dict value among "
                "them) so the task gets its value, or pass fut.key"
            )
        return TaskRef, (self.key,)

    def __copy__(self) -> Future:
        return self  # a handle on a key: a copy would be a reference, not a future

    def __deepcopy__(self, memo: dict[int, Any]) -> Future:
        return self

    @property
    def released(self) -> bool:
        """Whether :meth:`release` was called: this object no longer holds the result."""
        return not self._finalizer.alive

    @property
    def status(self) -> str:
        if self.released:
            return "released"
        upd = self._watch.update
        if upd is None:
            return "pending"
        return {KeyDone: "finished", KeyErred: "error", KeyCancelled: "cancelled"}[type(upd)]

    def done(self) -> bool:
        """Whether awaiting it would not wait: its task finished, failed or was
        cancelled, or it was released (awaiting it then raises at once)."""
        return self.released or self._watch.update is not None

    async def wait(self) -> None:
        """Wait until the task finished, failed or was cancelled, or the future was
        released (raises nothing)."""
        if not self.released:
            await self._client.wait_all([self.key])

    async def result(self) -> Any:
        # (not gather: one future's wait calls no dask callback, as a ProgressBar's)
        cluster = self._cluster
        cluster._require()
        (value,) = await cluster._gather_keys(cluster._keys_of([self], "gather"), root_errors=False)
        return value

    async def exception(self) -> BaseException | None:
        """Wait, then the exception awaiting it would raise (None: it finished): a copy
        of the error the client keeps for its key, as ``result()`` raises
        (:func:`_raised_copy`), so what is done to it (raised, a note added) stays off
        the kept one and off what the next ``await`` or ``exception()`` gives."""
        await self.wait()
        if self.released:
            return released_error(self.key, "awaited")
        if isinstance(self._watch.update, KeyDone):
            return None
        return _raised_copy(_task_error(self._watch, root_errors=False))

    def __await__(self) -> Any:
        return self.result().__await__()

    def cancel(self) -> None:
        """Ask the cluster to cancel this task (and whatever depends on it) for this
        client: a task other clients want too runs on for them. Nothing for a released
        future."""
        if self.released:
            return
        request = self._client.cancel_request([self.key], "cancelled by the client", told=True)
        self._client.ref.post(request)

    def release(self) -> None:
        """Let go of the result now instead of when this object is garbage collected.
        The future's status is then ``"released"``; awaiting it, gathering it or passing
        it to ``submit`` raises :class:`~runtime.errors.CorralError`. On the event loop's
        thread the release reaches the cluster before anything submitted after it, and
        after every ``submit`` made before it, also one not sent yet (as in dask:
        ``tot = submit(comb, sims)`` then ``release()`` of each of ``sims`` computes the
        total)."""
        client = self._client
        if threading.get_ident() == client.loop_thread and self._finalizer.detach():
            client.unhold(self.key)
        else:
            self._finalizer()


def released_error(key: Key, what: str) -> CorralError:
    """The error of a released future ``key`` that is ``what`` (awaited, ...)."""
    return CorralError(
        f"future {key!r} was released (Future.release()), so it cannot be {what}: it no "
        "longer holds its task's result, which the cluster may have dropped already. Keep "
        "a future until you have its value (and until the tasks that take it as an "
        "argument are submitted), or submit its task again for a new future.",
        key=key,
    )


def _error_of(upd: Any) -> BaseException:
    """What a future of ``upd``'s key raises: a task's ``SystemExit`` or
    ``KeyboardInterrupt`` (any ``BaseException`` not an ``Exception``) as a
    :class:`~runtime.errors.TaskExited`, not as itself, which would end the caller."""
    if isinstance(upd, KeyErred):
        return TaskExited.of(upd.error, upd.key)
    if isinstance(upd, KeyCancelled):
        from runtime.errors import CancelledError

        return CancelledError(str(upd.key), upd.reason)
    raise AssertionError(upd)


def _task_error(watch: _KeyWatch, *, root_errors: bool) -> BaseException:
    """What a future of ``watch``'s failed key raises (``root_errors``: a dependency's
    failure as the exception of the task that failed first, not
    :class:`DependencyFailed`), with the traceback it came with, however often it is
    raised: raising the same object again would add the frames of every raise to it.
    A task's own exception carries the note ``(raised by task 'KEY' on worker 'W', try
    N of M)`` (:func:`_raised_note`), once."""
    upd = watch.update
    err = _error_of(upd)
    if root_errors and isinstance(err, DependencyFailed) and err.__cause__:
        err = TaskExited.of(err.__cause__, upd.root)
    # Not on Corral's own errors (WorkerLost, ManagerLost...): they were not raised by
    # the task, name their key in their fields, and some are one object shared by many
    # keys.
    if isinstance(upd, KeyErred) and not isinstance(err, CorralError):
        _note(err, _raised_note(upd))
    tb = next((t for e, t in watch.arrived if e is err), err.__traceback__)
    return err.with_traceback(tb)


def _raised_copy(err: BaseException) -> BaseException:
    """A copy of ``err`` to raise, with its notes, its chain (its cause and context,
    each a copy made the same way: :func:`_copy_of`) and its traceback: the frames a
    raise adds go on the copy, not on the error the client keeps for the key. Raised
    itself, the kept error's traceback held the awaiting frames, and with them their
    futures (``fut = submit(...)``; ``await fut`` in a ``try``): the futures were never
    let go, their keys held on the cluster for as long as the client ran (an asyncio
    service's audit: 2,000 failed requests, 2,000 keys held). So too for its chain: a
    handler that raises the cause (``raise err.__cause__``, a ``DependencyFailed``'s
    root error) or notes it raises and notes a copy, not what the next ``await`` or
    ``exception()`` gives. A chain that loops stays one loop of copies. ``err`` itself
    (and a link of its chain itself) when its type cannot be made again from its
    ``args`` (a constructor of its own). ``Future.exception()`` gives such a copy too."""
    copies: dict[int, tuple[BaseException, BaseException]] = {}  # id: (kept, copy)
    todo = [err]
    while todo:  # (a loop, not recursion: a chain of any length)
        kept = todo.pop()
        if id(kept) not in copies:
            copies[id(kept)] = (kept, _copy_of(kept))
            todo.extend(e for e in (kept.__cause__, kept.__context__) if e is not None)
    for kept, new in copies.values():
        if new is not kept:
            cause, context = kept.__cause__, kept.__context__
            new.__cause__ = None if cause is None else copies[id(cause)][1]
            new.__context__ = None if context is None else copies[id(context)][1]
            new.__suppress_context__ = kept.__suppress_context__
    return copies[id(err)][1]


def _copy_of(err: BaseException) -> BaseException:
    """A copy of ``err`` alone (its chain is its copier's, :func:`_raised_copy`): its
    type, args, attributes, notes and traceback; ``err`` itself when its type cannot be
    made again from its ``args``."""
    try:
        new = copy.copy(err)
    except Exception:
        return err
    if type(new) is not type(err) or new.args != err.args:
        return err
    # Its own attributes: with tblib's reducer registered for exceptions (importing dask
    # does it), copy.copy gives most of them the kept error's own __dict__, notes and all.
    new.__dict__ = dict(vars(err))
    notes = getattr(err, "__notes__", None)
    if notes is not None:  # (one rebuilt from its fields by its __reduce__ lacks them)
        new.__notes__ = list(notes)
    return new.with_traceback(err.__traceback__)


def _raised_note(upd: KeyErred) -> str:
    """The note on the exception of ``upd``'s root, a task's own: the task, and the
    worker and number of the try that raised it when the scheduler told them."""
    where = f" on worker {upd.worker!r}" if upd.worker else ""
    if upd.attempt:
        where += f", try {upd.attempt} of {max(upd.attempts, upd.attempt)}"
    return f"(raised by task {upd.root!r}{where})"


class _Arrivals:
    """The waiter (as a gather's, in ``ClientActor.waiters``) of one
    :class:`AsCompleted`: a key's update hands its futures over to it. It holds the
    iterator weakly, so one left mid-way (a ``break``, a cancel) lets go of its futures;
    its entries go with the keys' next updates, as a cancelled gather's do."""

    __slots__ = ("owner",)

    def __init__(self, owner: AsCompleted) -> None:
        self.owner = weakref.ref(owner)

    def settle(self, key: Key, ok: bool) -> None:
        owner = self.owner()
        if owner is not None:
            owner._arrived(key)


class _Ends:
    """The waiter (as a gather's, in ``ClientActor.waiters``) of the keys of a set of
    futures followed for their progress (``Cluster.progress``, ``gather`` under dask
    callbacks): each key's end (its update, or its last Future let go) is told once to
    :attr:`tally`; :attr:`done` is set once none is pending. :meth:`close` takes it off
    the keys still pending (the follower cancelled, a gather that raised), so that
    nothing of it stays behind. Nothing runs in the background."""

    __slots__ = ("client", "done", "pending", "tally")

    def __init__(self, client: ClientActor, keys: Sequence[Key]) -> None:
        self.client = client
        self.tally = Tally(len(keys))
        self.pending: set[Key] = set()
        self.done = anyio.Event()
        for key in keys:
            w = client.watches.get(key)
            if w is None or w.update is not None:  # ended already (or let go)
                self._end(key, None if w is None else w.update)
                continue
            self.pending.add(key)
            client.waiters.setdefault(key, []).append(self)
        if not self.pending:
            self.done.set()

    def _end(self, key: Key, upd: Any) -> None:
        if isinstance(upd, KeyDone | KeyErred):
            self.tally.end(key, upd.worker, "memory" if isinstance(upd, KeyDone) else "erred")
        else:
            self.tally.end(key, "", "released" if upd is None else "cancelled")

    def settle(self, key: Key, ok: bool) -> None:
        if key in self.pending:
            self.pending.discard(key)
            w = self.client.watches.get(key)
            self._end(key, None if w is None else w.update)
            if not self.pending:
                self.done.set()

    def close(self) -> None:
        waiters = self.client.waiters
        for key in self.pending:
            waiting = waiters.get(key)
            if waiting is not None and self in waiting:
                waiting.remove(self)
                if not waiting:
                    del waiters[key]
        self.pending.clear()


class AsCompleted:
    """``async for fut in cluster.as_completed(futures)``: each future as soon as it is
    done (finished, failed or cancelled), in the order they got done. See
    :meth:`Cluster.as_completed`.

    Nothing runs in the background: the futures' updates, as the client actor takes
    them in, put them in line here (:class:`_Arrivals`), and ``__anext__`` waits on an
    event they set. Leaving the loop early, or being cancelled in it, leaves no task.
    """

    def __init__(
        self, cluster: Cluster, futures: Iterable[Future], with_results: bool, raise_errors: bool
    ) -> None:
        self._cluster = cluster
        self._with_results = with_results
        self._raise_errors = raise_errors
        self._waiting: dict[Key, list[Future]] = {}  #: futures not done, by key
        self._done: collections.deque[Future] = collections.deque()  #: in the order done
        self._changed = anyio.Event()  #: set when a future gets done
        self._arrivals = _Arrivals(self)
        self.update(futures)

    def update(self, futures: Iterable[Future]) -> None:
        """Add ``futures`` (a list of this cluster's futures) to the iteration, also
        while it runs; one already done comes next, after those done before it."""
        self._cluster._require()
        checked = self._cluster._futures_of(futures, "as_completed")
        client = self._cluster._client_actor
        for f in checked:
            if f.done():
                self._done.append(f)
            elif f.key in self._waiting:
                self._waiting[f.key].append(f)
            else:
                self._waiting[f.key] = [f]
                client.waiters.setdefault(f.key, []).append(self._arrivals)
        if self._done:
            self._changed.set()

    def add(self, future: Future) -> None:
        """Add one future to the iteration, also while it runs."""
        self.update([future])

    def count(self) -> int:
        """How many futures are still to come (done or not)."""
        return len(self._done) + sum(map(len, self._waiting.values()))

    def is_empty(self) -> bool:
        return not self.count()

    def _arrived(self, key: Key) -> None:
        futures = self._waiting.pop(key, None)
        if futures:
            self._done.extend(futures)
            self._changed.set()

    def __aiter__(self) -> AsCompleted:
        return self

    async def __anext__(self) -> Any:
        while not self._done:
            if not self._waiting:
                raise StopAsyncIteration
            if self._changed.is_set():
                self._changed = anyio.Event()
            await self._changed.wait()
        future = self._done.popleft()
        if not self._with_results:
            return future
        try:
            value = await future.result()
        except Exception as exc:
            if self._raise_errors:
                raise
            return future, exc
        except BaseException:  # cancelled while getting its value: it stays next in line
            self._done.appendleft(future)
            raise
        return future, value

    def __iter__(self) -> NoReturn:
        raise TypeError(
            "as_completed is asynchronous: use `async for future in cluster.as_completed(futures)`"
        )


# ----------------------------------------------------------------------------- cluster


class Cluster:
    """A Corral cluster embedded in the running event loop.

    ``async with Cluster(workers=2) as cluster:`` starts a manager, scheduler, file
    registry, autoscaler and ``workers`` in-process workers (``threads_per_worker``
    threads each) as actors in the caller's event loop. Leaving the block stops them,
    also when a cancellation leaves it (a timeout around it, a failing sibling task).

    ``policies`` picks the initial policies, e.g. ``{"placement": "round-robin"}`` or
    ``{"retry": ("default", {"max_lost": 2})}``; swap them later with
    :meth:`set_policy`.

    Memory (docs/memory.md): ``memory_per_worker`` is each worker's limit (default: the
    machine's memory, shared evenly by ``processes=N`` worker processes:
    :meth:`worker_memory`); ``memory_options`` sets its fences and execution mode, e.g.
    ``{"spill": 0.6, "throttle": 0.7, "terminate": 0.95, "execution": "process"}`` (see
    :class:`~actors.memory.MemoryConfig`). If every worker stays throttled with nothing
    that frees memory able to run for ``stall_timeout`` seconds, the run fails with
    :class:`~runtime.errors.MemoryStalled` instead of hanging. In-process workers share
    this process, so their fences watch this process's RSS.

    Disk (docs/files.md): ``disk_per_worker`` is the disk each worker offers for its
    outputs (default: the free space of the file system holding its spill directory,
    less a margin, shared evenly by ``processes=N`` worker processes:
    :meth:`worker_disk`); the scheduler sends a worker no task whose inputs to fetch and
    expected output do not fit in its free disk.

    ``gc_threshold``: ``None`` (the default) leaves Python's cyclic garbage collector
    alone. Given (``GC_THRESHOLD``, 50,000, suits large graphs), the collector runs
    after this many new container objects instead of its default 700 while the cluster
    runs, process-wide (see :class:`GcTuning`); on graphs of 20,000 tasks that halves
    the scheduler core's time per task.

    ``Cluster(processes=N)`` runs the workers as ``N`` processes on this machine instead,
    joined to this process over loopback websockets (``threads_per_worker`` threads each);
    a crashed one is replaced, and none outlives this process. They join on ``port`` of
    127.0.0.1 (default: a free port; ``cluster.gateway_address`` says which), also with
    pools and ``processes=True``; a port something listens on already raises
    :class:`~runtime.errors.AddressInUse` at start, and ``port`` without worker
    processes a ``ValueError``.

    Without pools, the cluster's workers (in ``pool``) have ``threads_per_worker``
    cores, :meth:`worker_memory` and a ``disk_per_worker`` given as a size: a task of
    that pool or of none asking for more ``resources`` is refused at submit
    (:class:`~runtime.errors.GraphError`, naming the argument to raise), and one naming
    a pool no worker has joined is taken with a warning to the client, as with
    configured pools (docs/configuration.md#pools).

    ``name``: who submits, as the console, the monitoring database and the policies
    show it (letters, digits, ``.``, ``_``, ``-``; default: this process's user name);
    the manager tells each connected client apart whatever its name, and the ``fair``
    priority takes turns between them (docs/policies.md#priority).

    ``Cluster("ws://host:port")`` connects to a running manager instead (``python -m
    runtime manager``); the token comes from ``token=`` or the file ``token_file=``
    (one token, or a manager's own token file: its admin entry; not both,
    :class:`~runtime.errors.TokenFileError`, which a file that is missing, empty or
    readable by other users raises too), else ``CORRAL_TOKEN``, else the token file
    the manager wrote on this machine, and must be the admin one: entering the
    cluster waits for the manager's answer and raises its refusal
    (:class:`~runtime.errors.PermissionDenied` for the read token, which is the
    console's). The worker options (``workers``, ``processes``, ``threads_per_worker``,
    ``memory_per_worker``, ``disk_per_worker``, ``memory_options``: workers join a
    manager process on their own, ``python -m runtime worker ADDRESS``) and the
    options that set what the manager holds for all its clients (``policies``,
    ``pools``, ``saturation``, ``stall_timeout``, ``prune_depth``, ``long_task``,
    ``unknown_long``, ``monitoring``, ``monitoring_interval``, ``alerts``,
    ``alertmanager``, ``alerting``, ``worker_timeout``) raise ``ValueError`` here,
    saying where the manager takes them from; ``set_policy`` changes its policies for
    every client (it stays after this client closes: :meth:`close` warns of a policy it
    set that is still in force, with the call that sets the one before back).

    ``Cluster(pools={"name": {...}})`` configures pools as data instead of ``workers``
    (docs/configuration.md#pools): each pool's blocks (``workers_per_node`` workers of
    ``cores_per_worker`` threads) are kept from ``min_blocks`` to ``max_blocks``
    (``init_blocks`` at start) by the ``demand`` strategy, and a pool's ``fallback`` goes
    into the default retry policy. Pools are checked here
    (:class:`~runtime.errors.PoolConfigError`). Their workers are in-process actors, or,
    with ``processes=True``, worker processes on this machine. A ``slurm`` pool needs a
    manager process (``python -m runtime manager --config FILE``). A task of one of these
    pools asking for more ``resources`` than its workers have (``cores_per_worker``, a
    ``memory_per_worker`` or ``disk_per_worker`` given as a size) is refused at submit
    (:class:`~runtime.errors.GraphError`), and an alert rule's scale-out must name one of
    them (:class:`~runtime.errors.AlertConfigError`).

    Alerts (docs/monitoring.md): the default rules run, logged, unless ``alerting``
    says ``{"default_rules": False}``; ``alerts`` adds rules as data (``[{"name": ...,
    "expr": ..., "for": "1m", ...}]``), ``alertmanager`` sends them to an Alertmanager
    (its base URL); ``alerting`` takes the other settings of ``[alerting]``
    (``interval``, ``dashboard_url``, ``resend``). A bad rule raises
    :class:`~runtime.errors.AlertConfigError` here. ``cluster.alerts()`` lists them.

    ``monitoring``: the path of a monitoring database (SQLite) the cluster writes what
    happens to, every ``monitoring_interval`` seconds: tasks, tries, workers, blocks,
    memory and metric samples, alerts (docs/monitoring.md); ``python -m runtime report
    PATH`` makes an HTML report of it. ``None`` (the default): none is written.

    ``manager_alerts``: with ``address``, every this many seconds (10) the client looks
    at the manager's alerts and logs each one that fires or resolves (WARNING),
    with its summary and dashboard link, so a script waiting on its results says why
    they wait (a pool suspended, no worker, a queue stuck); those already firing when it
    connects are logged once. Ready tasks with no worker at all (every worker died) are
    logged at the next look, before that alert fires. While this client's tasks wait,
    each look also reads the manager's status and warns, once an episode, when most
    workers were throttled for memory :data:`THROTTLE_HINT_AFTER` seconds (30) or more
    meanwhile (:func:`_throttle_news`), and once per worker that ran past its memory
    limit with its tasks in threads (:func:`_past_limit_news`). ``None``: it does not
    look. An embedded cluster's alert monitor logs them in this process anyway; an
    embedded cluster looks every ``manager_alerts`` seconds for ready tasks with no
    worker alone (``workers=0`` before a ``scale(n)``), and says so the same way.

    ``prune_depth`` (docs/files.md#pruning-depth): an output is dropped from the
    workers once the tasks that read it are done (1, the default), or once their own
    readers are done too (2), and so on; 0 never drops one.

    ``long_task``, ``unknown_long`` (docs/configuration.md#schedulerconfig): a task
    expected to run ``long_task`` seconds or longer (its category's mean duration; 1.0,
    inf: none), or of a category with no finished try while ``unknown_long`` (True), goes
    only to a worker with a core free of tasks; ``unknown_long=False`` lets a worker take
    up to ``saturation`` tasks per core of new categories (a graph of nearly one category
    per task). Checked here: :class:`~runtime.errors.LongTaskError`.

    ``worker_timeout``: with worker processes, the seconds one may be silent before it
    counts as lost (default 10; a task that holds the GIL silences its worker). A
    manager process takes ``--worker-timeout`` instead.

    ``manager_timeout``: with ``address``, the seconds the manager may be silent
    (heartbeats run every 2 s) before this client gives up on it: every pending future
    fails with :class:`~runtime.errors.ManagerLost` (``None``: 10). Raise it to ride out
    longer manager stalls (swapping, a long garbage collection, a SIGSTOP): the
    manager's workers ride out about 25 s, and the manager waits 120 s for a client. A
    manager that dies closes the connection and is seen at once, whatever this is.
    """

    def __init__(
        self,
        address: str | None = None,
        *,
        name: str | None = None,
        workers: int | None = None,
        threads_per_worker: int = 1,
        memory_per_worker: int | str | None = None,
        pool: str = "default",
        policies: Mapping[str, str | tuple[str, dict[str, Any]]] | None = None,
        saturation: float = 2.0,
        gc_threshold: int | None = None,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        processes: int | None = None,
        port: int | None = None,
        memory_options: Mapping[str, Any] | None = None,
        stall_timeout: float = 10.0,
        pools: Mapping[str, Mapping[str, Any]] | None = None,
        alerts: Sequence[Mapping[str, Any]] = (),
        alertmanager: str | None = None,
        alerting: Mapping[str, Any] | None = None,
        disk_per_worker: int | str | None = None,
        monitoring: str | os.PathLike[str] | None = None,
        monitoring_interval: float = 2.0,
        prune_depth: int = 1,
        long_task: float = 1.0,
        unknown_long: bool = True,
        manager_alerts: float | None = 10.0,
        worker_timeout: float | None = None,
        manager_timeout: float | None = None,
    ) -> None:
        from runtime.client_ids import client_id

        #: who submits (``name``, default the user name), and a random tail: one
        #: connection (docs/api.md#naming-a-client)
        self.client_id = client_id(name)
        if manager_alerts is not None:
            _seconds("manager_alerts", manager_alerts, ", or None")
        self.manager_alerts = manager_alerts
        #: the throttle hint's state (with ``address``, at each look at the alerts)
        self._throttle = _ThrottleWatch()
        #: the workers past their memory limit this client told of (:func:`_past_limit_news`)
        self._past_limit: set[str] = set()
        #: with ``address``: per kind this client set, the policy before its first set
        #: (None: not known) and the latest it set; warned of at close if still in force
        self._policies_set: dict[str, tuple[PolicyInfo | None, PolicyInfo]] = {}
        #: per kind, how the policy before this client's first set was failing then
        self._failing_before: dict[str, str] = {}
        #: seconds the manager may be silent before this client gives up on it
        self.manager_timeout = DEAD_AFTER
        if manager_timeout is not None:
            if address is None:
                raise ValueError(
                    "manager_timeout= is for Cluster(address, ...): how long the manager of "
                    "another process may be silent. An embedded cluster's manager is this "
                    "process; leave it out"
                )
            self.manager_timeout = _seconds(
                "manager_timeout",
                manager_timeout,
                f" (how long the manager may be silent before this client gives up on it, "
                f"ManagerLost; default {DEAD_AFTER:g})",
            )
        if address is not None:
            from transport.base import split_address

            split_address(address)  # InvalidAddress now, not at start
            _refuse_manager_settings(
                workers=workers, processes=processes, port=port,
                threads_per_worker=threads_per_worker,
                memory_per_worker=memory_per_worker, disk_per_worker=disk_per_worker,
                memory_options=memory_options,
                policies=policies, pools=pools, saturation=saturation,
                stall_timeout=stall_timeout, prune_depth=prune_depth, long_task=long_task,
                unknown_long=unknown_long, monitoring=monitoring,
                monitoring_interval=monitoring_interval, alerts=alerts,
                alertmanager=alertmanager, alerting=alerting, worker_timeout=worker_timeout,
            )  # fmt: skip
            check_one_token(token, token_file)  # TokenFileError now, not at start
        elif token_file is not None:
            raise ValueError(
                "token_file= is for Cluster(address, ...): the token of a manager in another "
                "process. An embedded cluster has no token; give the manager's address, or "
                "leave token_file out"
            )
        #: seconds a worker process may be silent before it counts as lost
        self.worker_timeout = (
            DEAD_AFTER if worker_timeout is None else check_worker_timeout(worker_timeout)
        )
        if monitoring_interval <= 0:
            raise ValueError(f"monitoring_interval must be positive, got {monitoring_interval}")
        self.monitoring = monitoring
        self.monitoring_interval = monitoring_interval
        self.address = address
        self.token = token
        self.token_file = token_file
        if processes is not None:  # True: with pools=, worker processes
            _whole("processes", processes, 0, bool_ok=pools is not None, also=_PROCESSES_BOOL)
        self.processes = processes  #: worker processes on this machine, over websockets
        #: the port on 127.0.0.1 those worker processes join this cluster on (0: a free one)
        self.port = 0 if port is None else _port(port, processes)
        n = (host_cpus() or 1) if workers is None else _whole("workers", workers, 0)
        self.n_workers = n
        self.threads_per_worker = _whole("threads_per_worker", threads_per_worker, 1)
        self.memory_per_worker = parse_bytes(memory_per_worker)
        if self.memory_per_worker < 0:  # every worker would fail to start
            from runtime.errors import MemoryConfigError

            raise MemoryConfigError(
                f"memory_per_worker must be >= 0 (None or 0: the machine's memory), got "
                f"{memory_per_worker!r}"
            )
        too_small = limit_too_small(memory_per_worker, self.memory_per_worker)
        if too_small:  # a size without its unit: every producer would stall
            from runtime.errors import MemoryConfigError

            raise MemoryConfigError(f"memory_per_worker={memory_per_worker!r} {too_small}")
        if disk_per_worker == "off":
            self.disk_per_worker = DISK_OFF  # not counted
        else:
            self.disk_per_worker = parse_bytes(disk_per_worker)
            if self.disk_per_worker < 0:
                raise ValueError(f"disk_per_worker must be >= 0 or 'off', got {disk_per_worker!r}")
        self.memory_options = dict(memory_options or {})
        if self.memory_options:  # MemoryConfigError now, not in each worker later
            from actors.memory import MemoryConfig

            MemoryConfig.of(self.memory_per_worker or 1 << 30, self.memory_options)
        if address is None:  # its workers read it: ValueError now, not in each later
            from runtime.remote import task_error_limit

            task_error_limit()  # a bad CORRAL_MAX_TASK_ERROR_BYTES
        json_lines()  # a bad CORRAL_LOG_JSON (read by this process and its workers)
        if stall_timeout <= 0:
            raise ValueError(f"stall_timeout must be positive, got {stall_timeout}")
        self.stall_timeout = stall_timeout
        from actors.scheduler_records import SchedulerConfig

        # PruneDepthError, LongTaskError now, not at start
        SchedulerConfig(prune_depth=prune_depth, long_task=long_task, unknown_long=unknown_long)
        self.prune_depth = prune_depth
        self.long_task = long_task
        self.unknown_long = unknown_long
        check_worker_pool(pool, "Cluster(pool=...)", "pool='gpu'")
        self.pool = pool
        if (
            isinstance(saturation, bool)
            or not isinstance(saturation, int | float)
            or not (0 < saturation < math.inf)
        ):
            raise ValueError(
                f"saturation must be a number > 0 (tasks sent to a worker per thread), got "
                f"{saturation!r}"
            )
        self.saturation = saturation
        if gc_threshold is not None:
            _whole("gc_threshold", gc_threshold, 1, also=" or None")
        self._gc = GcTuning(gc_threshold)
        #: who runs this cluster when no worker but its own can ever join it
        #: (``runtime.get``): a task naming another pool is refused at submit
        self._closed = ""
        self.initial_policies = _initial_policies(policies)
        self.pools: dict[str, Any] = {}  #: configured pools by name (actors.pools)
        if pools is not None:
            self._configure_pools(pools, workers, processes)
        #: the alert monitor's settings and rules (AlertConfigError now, not at start;
        #: with pools, a rule's scale-out must name one of them, as in a config file)
        self.alerting = alerting_config(
            alerting, alerts, alertmanager=alertmanager, pools=list(self.pools) or None,
            flag="Cluster(alertmanager=...)",
        )  # fmt: skip
        self._system: ActorSystem | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # where it runs, for get()
        self._client_actor: ClientActor
        self._manager: ActorRef[Manager] | _RemoteManager
        self._scheduler_actor: Scheduler
        self._provider: InProcessProvider

    def worker_memory(self) -> int:
        """Each worker's memory limit (bytes) in an embedded cluster without pools:
        ``memory_per_worker``, or by default the machine's total memory (psutil; or the
        less this process's cgroup, or the Slurm job it runs in, has:
        :func:`actors.host.memory_limit`), which ``processes=N`` worker processes share
        evenly (each gets a ``1/N`` share, as dask's ``LocalCluster`` does) and
        in-process workers each watch whole (they share this process's RSS:
        docs/memory.md#in-process-workers)."""
        if self.memory_per_worker:
            return self.memory_per_worker
        from actors.host import memory_limit

        return memory_limit(self.processes or 1).limit

    def worker_disk(self) -> int:
        """Each worker's disk budget (bytes) in an embedded cluster without pools:
        ``disk_per_worker``, or by default 0 (each worker measures its file system's
        free space, less a margin, when it starts), except for ``processes=N`` worker
        processes, which share the free space of the file system holding their spill
        directory evenly, as they share the machine's memory: each takes a ``1/N`` share
        of it less the margin (``--disk-share N``), about this, measured now, when it
        starts (docs/files.md)."""
        if self.disk_per_worker or not self.processes:
            return self.disk_per_worker
        from actors.worker import disk_share

        spill_dir = self.memory_options.get("spill_dir") or tempfile.gettempdir()
        return disk_share(spill_dir, self.processes)

    def _configure_pools(
        self, pools: Mapping[str, Mapping[str, Any]], workers: int | None, processes: int | None
    ) -> None:
        from actors.pools import WORKER_PROCESS_KEYS, pools_from_dicts
        from runtime.errors import PoolConfigError

        if workers is not None or processes not in (None, True):
            raise ValueError(
                "with pools= the pools say how many workers there are: give no workers=, "
                "and processes=True (worker processes) or nothing (in-process workers)"
            )
        self.pools = pools_from_dicts(pools)
        for pool in self.pools.values():
            if pool.provider != "local":
                raise PoolConfigError(
                    pool.name, "provider",
                    f"{pool.provider!r} pools need a manager process: "
                    "`python -m runtime manager --config FILE`, then Cluster('ws://HOST:PORT'); "
                    "an embedded Cluster takes 'local' pools",
                )  # fmt: skip
            given = [k for k in WORKER_PROCESS_KEYS if k in pools[pool.name]]
            if given and processes is not True:  # in-process workers have no command line
                raise PoolConfigError(
                    pool.name, given[0],
                    "sets a flag of worker processes, which in-process workers do not take: "
                    "give Cluster(pools=..., processes=True) (execution and spill_dir of "
                    "in-process workers: memory_options=)",
                )  # fmt: skip
        if self.pool not in self.pools:
            self.pool = next(iter(self.pools))  # scale(n) without a pool: the first one
        from runtime.node import pool_policies

        self.initial_policies = pool_policies(self.pools, self.initial_policies)

    # -- lifecycle -------------------------------------------------------------------

    async def __aenter__(self) -> Cluster:
        await self.start()
        return self

    def __enter__(self) -> NoReturn:
        if _loop_runs_here():  # a notebook: asyncio.run and anyio.run fail there
            raise TypeError(
                "a Cluster runs in an event loop, and one runs in this thread already (a "
                f"Jupyter notebook, or async code): not `with`, but {_START_HERE}. See "
                "docs/api.md#in-a-jupyter-notebook."
            )
        raise TypeError(
            "a Cluster runs in an event loop: use `async with Cluster(...) as cluster:` "
            "inside an async function (run by anyio.run or asyncio.run), not `with`. From "
            "synchronous code, compute a dask collection or graph with runtime.get "
            "(dask.compute(x, scheduler=runtime.get), or runtime.get(dsk, keys)). See "
            "docs/api.md."
        )

    def __exit__(self, *exc: object) -> None:  # with needs it before it calls __enter__
        pass

    async def start(self) -> None:
        """Start the cluster's actors (``async with Cluster()`` calls this).

        The actors live in a task of their own, so ``start`` and :meth:`close` may be
        called from different tasks (aiohttp cleanup contexts, test fixtures).

        Raises :class:`~runtime.errors.ClusterAlreadyStarted`, and starts nothing, while
        another start of it is under way (two tasks starting it at once would each start
        a set of actors and workers, and the first set would never be stopped) or once it
        runs; a failed start lets it start again. Once closed, it raises
        :class:`~runtime.errors.ClusterClosed` and starts nothing: make a new Cluster.
        """
        if self._starting or self._system is not None:
            raise ClusterAlreadyStarted("starting" if self._starting else "running")
        if self._ended:
            raise ClusterClosed()
        self._starting = True
        try:
            await self._start_system()
        finally:
            self._starting = False

    async def _start_system(self) -> None:
        """:meth:`start`'s work, while it shows as ``starting``."""
        if self.address is None and self._closed != "runtime.get":
            _warn_running(self)
        # what this start imports beyond this module's imports: in a thread, so that the
        # first start in a process does not hold the caller's event loop for them
        await anyio.to_thread.run_sync(_import_all, self._start_modules())
        system = ActorSystem()
        self._gc.enter()
        try:
            await system.start()
        except BaseException:
            self._gc.exit()
            raise
        self._system = system
        self._loop = asyncio.get_running_loop()
        # Its event loop may end without close (asyncio.run returning): let go then
        system.when_ended(functools.partial(_ended_unclosed, weakref.ref(self), system))
        try:
            if self.address is None:
                await self._start(system)
            else:
                await self._connect(system, self.address)
        except BaseException as exc:
            await self.close()
            # it never ran: its error says why it did not start, not that it was closed
            self._ended = False
            self._start_failed = _first_line(exc)
            raise
        self._start_failed = ""
        if self.address is None and self._closed != "runtime.get":
            _RUNNING.append(self)

    async def _connect(self, system: ActorSystem, address: str) -> None:
        """Join a manager in another process as a client: connected once its gateway
        welcomed the client's Hello; a refusal (the read-only token, say) is raised
        here, not at the first call."""
        from runtime.node import GIVE_TOKEN_PY, HEARTBEAT, find_token_there
        from runtime.remote import Peer
        from transport import connect

        options: dict[str, Any] = {}
        token = await find_token_there(
            address, self.token, token_file=self.token_file, give=GIVE_TOKEN_PY
        )
        if token and address.startswith(("ws://", "wss://")):
            options["token"] = token
        if address.startswith(("ws://", "wss://")):
            # aiohttp's own ping (a pong due within half of it more) must not cut a
            # manager stall this client was told to wait out: at its default (30 s) it
            # ended a manager_timeout=120 client after 45 s (multi audit, finding 3).
            # The Peer's check below, which says why, is what gives up.
            from transport.ws import DEFAULT_HEARTBEAT

            options["heartbeat"] = max(DEFAULT_HEARTBEAT, self.manager_timeout)
        try:
            conn = await connect(address, **options)
        except AuthenticationFailed as exc:
            raise self._token_refused(address, exc) from None
        try:
            name = await self._hello(conn, address, self.manager_timeout)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await conn.aclose()
            raise
        # Liveness: heartbeats both ways; a closed connection, or manager_timeout seconds
        # of silence, fails every pending future with ManagerLost (the on_close below).
        peer = Peer(
            conn, None, name="manager", allow_pickle=True, heartbeat=HEARTBEAT,
            timeout=self.manager_timeout, on_close=self._manager_closed,
        )  # fmt: skip
        manager = _RemoteManager(peer, address)
        self._client_actor = ClientActor(manager)
        peer.target = await system.spawn(self._client_actor, name)
        _watch_local_computes(self._client_actor)
        await system.start_service(peer.run)
        self._manager = manager
        self._peer = peer
        if self.manager_alerts is not None:
            await system.start_service(self._log_manager_alerts, manager, self.manager_alerts)

    async def _log_manager_alerts(
        self,
        manager: _RemoteManager | ActorRef[Manager],
        every: float,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Log the manager's alerts as they fire and resolve (pending ones are not
        news yet; one that fired and resolved between two looks, both), looking every
        ``every`` seconds while connected; at the first look, only those firing. But
        ready tasks with no worker to run them (``CorralNoWorkers`` pending: every
        worker died, none joined) is news at once: a run that waits for a worker says
        so within a look, not after the alert's 2 minutes (:func:`_no_workers_news`).
        An embedded cluster's own manager (an ActorRef) is looked at for that alone: its
        alert monitor logs the alerts in this process, and its workers are this
        cluster's to start (``scale``)."""
        from runtime.notify import AlertChanges, LogNotifier

        remote = isinstance(manager, _RemoteManager)
        where = str(self.address) if remote else "this process"
        start = (
            "start workers, or replacements of those that died"
            if remote
            else "this cluster has none there: `await cluster.scale(n)` starts n"
            + (", `scale(n, pool=...)` in a pool" if self.pools else "")
        )

        changes = AlertChanges()
        log = LogNotifier(_log.bind(manager=self.address))
        said: _Said = set()
        held: _Held = {}  # queue alerts not shown while their pool's blocks start
        first = True
        task_status.started()
        while True:
            try:
                reply: AlertsReply = await manager.ask(AlertsRequest(), timeout=max(every, 5.0))
            except ManagerLost:
                return  # the client's futures say so
            except (CorralError, TimeoutError) as exc:  # a busy manager: look again later
                _log.debug("could not read the manager's alerts", error=str(exc))
            else:
                news = changes.news(reply.alerts, first=first) if remote else []
                if held or any(a.name == QUEUE_ALERT for a in news):  # are blocks starting?
                    status = await self._manager_status(manager, every)
                    starting = _blocks_starting(status.autoscaler if status else None)
                    news, held = _queue_news(news, reply.alerts, held, starting, time.time())
                for alert in news:
                    log.notify(alert)
                failing: dict[str, str] = {}
                suspects: dict[str, tuple[str, ...]] = {}
                contained = False  # (the workers that ran them said their execution)
                if _no_workers_new(reply.alerts, said):  # a failing scaling policy? a task?
                    status = await self._manager_status(manager, every)
                    if status is not None:
                        starting = _blocks_starting(status.autoscaler)
                        failing = {
                            p: _starting_text(p, n) for p, n in starting.items() if p != ANY_POOL
                        }
                        failing.update(_scaling_failing(status.autoscaler))
                        suspects = status.crash_suspects
                        contained = bool(suspects) and set(suspects) <= set(
                            status.contained_suspects
                        )
                said = _no_workers_news(
                    reply.alerts, said, where, failing, start, suspects, contained=contained
                )
                first = False
            if isinstance(manager, _RemoteManager):  # (an embedded cluster: not this)
                await self._look_at_throttling(manager, every)
            await anyio.sleep(every)

    async def _manager_status(
        self, manager: _RemoteManager | ActorRef[Manager], every: float
    ) -> StatusReply | None:
        """The manager's status (None: it did not answer: a failed look is skipped, as
        the alerts' are)."""
        try:
            status = await manager.ask(StatusRequest(categories=False), timeout=max(every, 5.0))
        except (CorralError, TimeoutError) as exc:  # ManagerLost too: the futures say so
            _log.debug("could not read the manager's status", error=str(exc))
            return None
        return status if isinstance(status, StatusReply) else None

    async def _autoscaler_status(
        self, manager: _RemoteManager | ActorRef[Manager], every: float
    ) -> AutoscalerStatus | None:
        """The manager's autoscaler status (None: it has none, or did not answer)."""
        status = await self._manager_status(manager, every)
        return status.autoscaler if status is not None else None

    async def _look_at_throttling(self, manager: _RemoteManager, every: float) -> None:
        """While this client's tasks wait, read the manager's status and warn once an
        episode when most workers were throttled for memory long enough
        (:func:`_throttle_news`), and once per worker episode of one past its memory
        limit with its tasks in threads (:func:`_past_limit_news`); a look that fails
        is skipped."""
        status: StatusReply | None = None
        if self._client_actor.waiting():
            try:
                status = await manager.ask(StatusRequest(categories=False), timeout=max(every, 5.0))
            except ManagerLost:
                return
            except (CorralError, TimeoutError) as exc:
                _log.debug("could not read the manager's status", error=str(exc))
                return
        pools = self._client_actor.waiting_pools() if status is not None else None
        _throttle_news(self._throttle, status, time.monotonic(), str(self.address), pools=pools)
        self._past_limit = _past_limit_news(self._past_limit, status, str(self.address))

    async def _hello(self, conn: Any, address: str, limit: float) -> str:
        """Say ``Hello`` as a client on ``conn`` and wait, at most ``limit`` seconds, for
        the gateway's ``Welcome``; return the client's name. Its ``Refused`` is raised: a
        read token gets :class:`PermissionDenied` saying which token to pass instead,
        and where it is."""
        from runtime.node import Hello, say_hello

        name = self.client_id
        try:
            await say_hello(conn, Hello("client", name), address, limit, allow_pickle=True)
        except PermissionDenied as error:
            if getattr(error, "what", None) != "Hello as a client":
                raise
            where = getattr(error, "token_file", "")  # the read-only token, as the manager tells
            raise PermissionDenied(
                "Hello as a client",
                f"{error}. {self._read_token_source(address, where)}",
                token_file=where,
            ) from None
        return name

    def _read_token_source(self, address: str, token_file: str) -> str:
        """Where the read token this client presented came from, and which to pass:
        the submit token (the admin token for the operator) of the manager's
        ``token_file`` (its path on the manager's machine, as the manager told it; "" if
        it did not: then where a manager keeps it, as no path built here is the
        manager's)."""
        where = (
            f"{token_file} on the manager's machine"
            if token_file
            else "$CORRAL_HOME/tokens/HOST_PORT.json of the manager's user on its machine "
            "(CORRAL_HOME is ~/.corral unless set; HOST and PORT those of the address it "
            "listens on; or the file its --token-file names)"
        )
        given = self._presented("This client presented the manager's read token")
        return (
            f"{given}: pass the submit token instead (the admin token, if you are the "
            "cluster's operator), as token=... or CORRAL_TOKEN. It is the 'submit' entry "
            f"of the manager's token file, {where} (readable by that user only: ask them "
            "for it), where the read token is the 'read' entry. To only look, use the "
            f"console: python -m runtime console {address} --read-only"
        )

    def _presented(self, local: str) -> str:
        """Where the token this client presented came from: ``token=``, ``token_file=``,
        ``CORRAL_TOKEN``, else ``local`` (the manager's token file on this machine)."""
        if self.token:
            return "This client presented the token it was given (token=...)"
        if self.token_file is not None:
            path = os.fspath(self.token_file)
            return f"This client presented the token of its token_file={path!r}"
        if os.environ.get("CORRAL_TOKEN"):
            return (
                "This client presented CORRAL_TOKEN from the environment (it wins over the "
                "token file)"
            )
        return local

    def _token_refused(self, address: str, exc: AuthenticationFailed) -> AuthenticationFailed:
        """The manager's listener refused this client's token in the handshake (HTTP 401
        or 403): the likely cause, where the token came from and what to put there (the
        submit token), as a worker's (``worker_token_refused``) and a console's refusals
        say it."""
        from runtime.node import token_path

        if self.token:
            fix = ": pass the manager's current submit token"
        elif self.token_file is not None:
            fix = (
                " (its 'admin' entry, if it is a manager's token file): write the manager's "
                "current submit token in it"
            )
        elif os.environ.get("CORRAL_TOKEN"):
            fix = ": set it to the manager's current submit token, or unset it"
        else:
            fix = (
                ": stale if that manager was restarted since, or another manager's if this one "
                "runs elsewhere (another machine, another CORRAL_HOME or --token-file): pass "
                "the manager's current submit token as token_file= or token="
            )
        local = (
            f"This client presented the admin token of {token_path(address)}, where a "
            "manager listening at that address on this machine writes its tokens"
        )
        hint = (
            f"{self._presented(local)}{fix}. A client (Cluster, runtime.get) needs the "
            "submit token, the 'submit' entry of the manager's token file "
            "($CORRAL_HOME/tokens/HOST_PORT.json of the manager's user on its machine, "
            "CORRAL_HOME being ~/.corral unless set, or the file its --token-file names), "
            "or the admin token if you are the cluster's operator: ask the operator for "
            "the current one (a manager makes new tokens each time it starts, unless it "
            "runs with --keep-tokens: docs/security.md#keeping-tokens-across-restarts)."
        )
        why = (
            "the manager refused this client's token (HTTP 403: it matches none of the "
            "manager's tokens)"
            if exc.status == 403
            else exc.reason
        )
        return AuthenticationFailed(address, why, exc.status, hint)

    def _manager_closed(self, peer: Any) -> None:
        if self._system is None:
            return  # closed on purpose
        manager = self._manager
        err = manager.lost() if isinstance(manager, _RemoteManager) else None
        if isinstance(err, ManagerStopping):  # its goodbye: on purpose, no loss to warn of
            _log.info("the manager stopped", address=self.address, reason=str(err))
        else:
            _log.warning("lost the manager", address=self.address, reason=peer.why_closed())
        with contextlib.suppress(ActorStopped):
            self._client_actor.ref.post(_ManagerGone(err))

    async def _start(self, system: ActorSystem) -> None:
        """Start the control plane and in-process workers in ``system``."""
        from runtime.node import (
            Tokens,
            start_control_plane,
            start_local_processes,
            worker_factory,
            worker_shape,
        )

        if self.pools:
            await self._start_pools(system)
            return
        # its one pool's workers, as a task's resources are checked against at submit
        memory = self.worker_memory()
        shape = worker_shape(
            self.threads_per_worker, memory, self.disk_per_worker, "threads_per_worker"
        )
        fixed: dict[str, Any] = {
            "fixed": (self.pool, shape, "Cluster(...)"),
            "closed": self._closed,
            "cores_advice": _cores_advice(self.processes is not None),
        }
        if self.processes is not None:
            plane = await start_control_plane(
                system,
                saturation=self.saturation,
                policies=self.initial_policies,
                stall_timeout=self.stall_timeout,
                alerting=self.alerting,
                dashboard=True,
                **self._monitoring(),
                **self._scheduler(),
                **fixed,
            )
            self._tokens = Tokens.generate()
            with self._port_taken():
                self.gateway_address = await start_local_processes(
                    plane,
                    n=self.processes,
                    listen=self._gateway_url(),
                    tokens=self._tokens,
                    threads=self.threads_per_worker,
                    memory=memory,
                    pool=self.pool,
                    memory_options=self.memory_options,
                    disk=self.disk_per_worker,
                    worker_timeout=self.worker_timeout,
                )
            await self._finish_start(system, plane)
            return
        spec = BlockSpec(
            1, self.threads_per_worker, self.memory_per_worker, self.disk_per_worker, self.pool
        )

        def provider(plane: Any) -> InProcessProvider:
            make = worker_factory(plane.refs["scheduler"], memory_options=self.memory_options)
            self._provider = InProcessProvider(system, make)
            return self._provider

        plane = await start_control_plane(
            system,
            saturation=self.saturation,
            policies=self.initial_policies,
            provider=provider,
            targets={self.pool: PoolTarget(self.n_workers, spec)},
            stall_timeout=self.stall_timeout,
            alerting=self.alerting,
            **self._monitoring(),
            **self._scheduler(),
            **fixed,
        )
        await self._finish_start(system, plane)

    def _start_modules(self) -> tuple[str, ...]:
        """The modules :meth:`start` imports for this cluster (:data:`_START_MODULES`)."""
        if self.address is not None:
            return _START_MODULES["address"]
        if self.processes:
            return _START_MODULES["embedded"] + _START_MODULES["processes"]
        return _START_MODULES["embedded"]

    def _gateway_url(self) -> str:
        """Where the gateway worker processes join listens (``port``; 0: a free port)."""
        return f"ws://127.0.0.1:{self.port}"

    @contextlib.contextmanager
    def _port_taken(self) -> Iterator[None]:
        """A ``port`` given that something listens on already: its AddressInUse says so."""
        try:
            yield
        except AddressInUse as exc:
            exc.add_note(
                f"(Cluster(processes=..., port={self.port}): something on this machine listens "
                "on that port already, another cluster or program: choose another port, or "
                "leave port out and read the free one taken from cluster.gateway_address)"
            )
            holders = [c for c in Cluster.running() if c._port_of() == self.port]
            if holders:  # a notebook cell run again: the Cluster it made before
                exc.add_note(
                    f"(it is {holders[0]!r}, started earlier in this process and "
                    "still running: `await old.close()` frees the port, old being the "
                    "variable that held it, or Cluster.running()[i]; a runtime.Client: "
                    "`old.close()`, not awaited)"
                )
            raise

    def _scheduler(self) -> dict[str, Any]:
        """The scheduler settings ``start_control_plane`` takes from this cluster."""
        return {
            "prune_depth": self.prune_depth,
            "long_task": self.long_task,
            "unknown_long": self.unknown_long,
        }

    def _monitoring(self) -> dict[str, Any]:
        if self.monitoring is None:
            return {}
        return {"monitoring": self.monitoring, "monitoring_interval": self.monitoring_interval}

    async def _start_pools(self, system: ActorSystem) -> None:
        """Configured pools: a provider per pool (in-process workers, or worker
        processes with ``processes=True``) and the autoscaler over them."""
        from runtime.node import (
            Tokens,
            pool_targets,
            serve_local_gateway,
            start_autoscaler,
            start_control_plane,
            start_pools,
            worker_factory,
        )

        plane = await start_control_plane(
            system, saturation=self.saturation, policies=self.initial_policies,
            stall_timeout=self.stall_timeout, alerting=self.alerting,
            dashboard=bool(self.processes),
            **self._monitoring(),
            **self._scheduler(), pools=self.pools,
        )  # fmt: skip
        if self.processes:
            tokens = self._tokens = Tokens.generate()
            with self._port_taken():
                listener = await serve_local_gateway(
                    plane, self._gateway_url(), tokens, worker_timeout=self.worker_timeout
                )
            self.gateway_address = listener.address
            await start_pools(
                plane, self.pools, listener.address, tokens, memory_options=self.memory_options
            )
        else:
            providers = {
                name: InProcessProvider(
                    system,
                    worker_factory(  # a pool's own memory_options win over the cluster's
                        plane.refs["scheduler"],
                        memory_options={**self.memory_options, **pool.memory_options},
                    ),
                    prefix=name,
                    peers=plane.resolve,
                )
                for name, pool in self.pools.items()
            }
            await start_autoscaler(plane, providers, pool_targets(self.pools))
        await self._finish_start(system, plane)

    async def _finish_start(self, system: ActorSystem, plane: Any) -> None:
        self._scheduler_actor = plane.scheduler
        self._manager = plane.manager
        self._client_actor = ClientActor(plane.manager)
        await system.spawn(self._client_actor, self.client_id)
        _watch_local_computes(self._client_actor)
        await plane.manager.tell(ClientCame(self.client_id))  # as a gateway's clients are
        self._refs = plane.refs
        self._plane = plane  #: for tests: its provider, say
        if self.manager_alerts is not None:  # ready tasks and no worker: said, as to a
            await system.start_service(  # client of a manager process
                self._log_manager_alerts, plane.manager, self.manager_alerts
            )

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop every actor of the cluster, gracefully: no new work, the run's tasks
        ended (those not finished cancelled: :func:`runtime.node.end_run`), then the
        workers (through the autoscaler, so it does not replace them), then the control
        actors.
        A cancelled caller does not cut it short: the stop is shielded and bounded by
        the shutdown's timeouts (an actor past its own is cancelled alone, a hung
        ``on_stop`` is cut, and the others still stop in order).

        Raises :class:`~runtime.errors.ActorCrashed` if one of them crashed for good.
        Awaited in another event loop than the cluster's (``await
        Cluster.running()[0].close()`` in a notebook cell, of a :class:`runtime.Client`'s
        cluster), it closes the cluster on its own loop and waits for that;
        ``CorralError`` if that loop no longer runs, nothing closed.
        """
        if self._in_other_loop():
            assert self._loop is not None
            if self._loop.is_running():
                closing = asyncio.run_coroutine_threadsafe(self.close(), self._loop)
                return await asyncio.wrap_future(closing)
            self._refuse_other_loop()
        system, self._system = self._system, None
        if system is None:
            return
        self._ended = True
        self._unlist()
        if self._policies_set and system.running:
            with anyio.CancelScope(shield=True):
                await self._policies_left()
        client = getattr(self, "_client_actor", None)
        peer = getattr(self, "_peer", None)
        if peer is not None:  # the manager's updates that cross our close are expected
            peer.stopping = True
        plane = getattr(self, "_plane", None)
        if plane is not None and system.running:  # its own scheduler: the run ends first
            with anyio.CancelScope(shield=True):
                await end_run(plane)
        # the monitoring recorder after the workers (it records them leaving), before
        # the actors its last poll asks
        order = [client.name if client else "", "autoscaler", "monitoring", "manager",
                 "scheduler", "registry"]  # fmt: skip
        # Shielded: a cancelled caller (a timeout around the block, a failing sibling
        # task) would cancel the shutdown at its first wait and leave every actor, the
        # listener, the worker processes and the connection to a manager running, with
        # this cluster already marked closed. The wait is bounded by the shutdown's own:
        # an actor not stopped within its bound (or whose on_stop hangs) is logged and
        # cancelled alone, and the others still stop (workers leave, ports are freed).
        with anyio.CancelScope(shield=True):
            try:
                if system.running:
                    await system.shutdown([system.actors[n] for n in order if n in system.actors])
            finally:
                try:
                    await system.stop()
                finally:
                    self._gc.exit()

    def _unlist(self) -> None:
        """Out of the process's running clusters (:data:`_RUNNING`), and its client's
        keys no longer checked by dask's computes (:func:`_watch_local_computes`)."""
        with contextlib.suppress(ValueError):  # not listed: runtime.get's, a client's
            _RUNNING.remove(self)
        client = getattr(self, "_client_actor", None)
        if client is not None:
            _watch_local_computes(client, watch=False)

    async def _policies_left(self) -> None:
        """Warn of the policies this client set on its shared manager that are still in
        force as it closes (:func:`_policies_left_news`); a manager that does not answer
        within 5 s (or is gone) is not waited for."""
        manager = self._manager
        if not isinstance(manager, _RemoteManager) or manager.gone:
            return
        try:
            infos = await manager.ask(PolicyQuery(), timeout=5.0)
        except (CorralError, TimeoutError) as exc:
            _log.debug("could not read the manager's policies", error=str(exc))
            return
        _policies_left_news(self._policies_set, infos, str(self.address), self._failing_before)

    #: closed (``close()``, or its ``async with`` block left): never running again
    _ended = False
    #: why its latest start failed (its error's type and first line; "": it did not)
    _start_failed = ""
    #: start() is under way (its actors and workers are not all there yet)
    _starting = False

    def _require(self, *, any_loop: bool = False) -> None:
        """Raise ``CorralError`` unless the cluster runs; unless ``any_loop``, also
        where another event loop than the cluster's runs in this thread."""
        if not any_loop:
            self._refuse_other_loop()
        stalls = getattr(getattr(self, "_plane", None), "stalls", None)
        while stalls:  # its manager's loop (ours) was blocked since the last call: say so
            _log.warning("the event loop was blocked before this call", **stalls.pop(0))
        if self._system is None:
            if self._ended:
                raise CorralError(
                    "the cluster is not running: it was closed (its `async with` block was "
                    "left, or close() was called), and its futures' results went with it. "
                    "Await them inside the block, or make a new Cluster for new work."
                )
            if self._start_failed:
                raise CorralError(
                    f"the cluster is not running: its start failed ({self._start_failed}), "
                    "and nothing of it runs. Remove the cause and start it again (`await "
                    "cluster.start()`), or drop this Cluster."
                )
            if _loop_runs_here():
                raise CorralError(
                    "the cluster is not running: it was not started. An event loop runs in "
                    f"this thread (a Jupyter notebook, or async code): {_START_HERE}."
                )
            raise CorralError(
                "the cluster is not running; use `async with Cluster() as c:` inside an "
                "async function, or `await cluster.start()` there (and `await "
                "cluster.close()` once done)"
            )

    def _refuse_other_loop(self) -> None:
        """``CorralError`` for a call made in another event loop than the one the cluster
        runs in (a :class:`runtime.Client`'s thread, another ``asyncio.run``), whose
        waits would never be woken: its close, shielded, would hang that loop for good."""
        if self._in_other_loop():
            raise CorralError(
                "this Cluster runs in another event loop than the one this call is made "
                "in (a runtime.Client's thread, or another asyncio.run), and its calls "
                "are made there. A Client's cluster: use the Client's own methods "
                "(client.close(), client.gather(futures)); another loop's: call it in "
                "that loop, or from a thread with cluster.get / cluster.run_sync"
            )

    def _in_other_loop(self) -> bool:
        """Whether this call is made in another event loop than the running cluster's."""
        loop = self._loop
        if self._system is None or loop is None or loop.is_closed() or not _in_running_loop():
            return False
        return asyncio.get_running_loop() is not loop

    # -- showing it ------------------------------------------------------------------

    #: the tokens of the gateway of its worker processes (None: it has none)
    _tokens: Any = None

    @staticmethod
    def running() -> list[Cluster]:
        """The embedded clusters this process started that still run, oldest first (not
        those of ``runtime.get``, nor clients of a manager process): a notebook cell run
        again leaves the one it made before running, and ``await
        Cluster.running()[0].close()`` stops it."""
        return [c for c in _RUNNING if c._system is not None and c._system.running]

    @property
    def dashboard_link(self) -> str | None:
        """The URL of the cluster's live dashboard (docs/monitoring.md#live-dashboard),
        or None while it does not run, and with in-process workers (no listener).
        With worker processes (``processes=N``), the page served on the gateway they
        join (``gateway_address`` as ``http://``), with the cluster's read token
        (``?token=``), as a manager prints its own: opened once, the page keeps the
        token in a cookie and takes it out of the address bar. Each start makes new
        tokens. With ``address``, the manager's page without a token: it opens in a
        browser that opened the URL the manager printed once."""
        if self._system is None:
            return None
        from runtime.dashboard import dashboard_url

        if self.address is not None:
            return dashboard_url(self.address, "")
        if self._tokens is None:
            return None
        return dashboard_url(self.gateway_address, self._tokens.read)

    def _port_of(self) -> int | None:
        """The port its worker processes join it on (None: none)."""
        from urllib.parse import urlsplit

        gateway = getattr(self, "gateway_address", None)
        return urlsplit(gateway).port if gateway and self._system is not None else None

    def _now(self) -> tuple[str, list[tuple[str, str]]]:
        """Its state (``running``, ``starting``, ``not started``, ``start failed``,
        ``closed``) and what to show of it, as (label, text) rows: where it runs, its
        workers, its tasks by state, its dashboard (without its token); read from the
        scheduler in this process, so of a client of a manager process only the
        address. It never raises: a repr is taken anywhere (a log, a debugger, a
        notebook showing a cluster whose start is under way in a task)."""
        if self._starting:  # its actors are not all there yet
            return "starting", [("address", self.address)] if self.address else []
        if self._system is None:
            if self._ended:
                return "closed", []
            if self._start_failed:
                return "start failed", [
                    ("error", self._start_failed),
                    ("next", "remove the cause and `await cluster.start()` again, or drop it"),
                ]
            return "not started", [("start", "`await cluster.start()`")]
        if self.address is not None:
            return "running", [
                ("address", f"{self.address} (a manager process: `await cluster.status()` "
                 "for its workers and tasks)"),
                ("dashboard", f"{self.dashboard_link} (opens in a browser that opened the "
                 "URL the manager printed once)"),
            ]  # fmt: skip
        state = self._scheduler_actor.state  # read in its loop's thread, between events
        try:
            workers = sorted(state.workers)
            tasks = state.by_state
        except RuntimeError:  # read from another thread while they changed
            workers, tasks = [], {}
        named = ", ".join(workers[:5]) + (f", +{len(workers) - 5}" if len(workers) > 5 else "")
        told = [f"{n} {st}" for st, n in sorted(tasks.items())]
        unsent = len(self._client_actor.pending)  # submitted in this turn of the loop
        if unsent:
            told.append(f"{unsent} not sent yet (sent once the event loop runs: an await, "
                        "or the cell's end)")  # fmt: skip
        link = self.dashboard_link
        return "running", [
            ("address", getattr(self, "gateway_address", "") or "in-process"),
            ("workers", f"{len(workers)}" + (f": {named}" if workers else "")),
            ("tasks", ", ".join(told) or "none"),
            ("dashboard",
             f"{link.split('?')[0]} (cluster.dashboard_link opens it: it carries the read "
             "token)" if link else "none (in-process workers: Cluster(processes=N) serves one)"),
        ]  # fmt: skip

    def __repr__(self) -> str:
        state, rows = self._now()
        shown = "; ".join(f"{label} {text}" for label, text in rows)
        return f"<Cluster {state}{': ' if shown else ''}{shown}>"

    def _repr_html_(self) -> str:
        """Its rows as a table in a notebook, the dashboard a link that opens it."""
        from html import escape

        state, rows = self._now()
        cells = []
        for label, text in rows:
            link = self.dashboard_link if label == "dashboard" else None
            shown = escape(text)
            if link:
                shown = (
                    f'<a href="{escape(link)}" target="_blank">{escape(link.split("?")[0])}</a>'
                    " (the link carries the cluster's read token: the page keeps it in a "
                    "cookie; new at each start)"
                )
            cells.append(
                f'<tr><th style="text-align:left">{escape(label)}</th>'
                f'<td style="text-align:left">{shown}</td></tr>'
            )
        table = "".join(cells)
        return f"<div><strong>Corral Cluster</strong> {escape(state)}<table>{table}</table></div>"

    # -- submitting ------------------------------------------------------------------

    def submit(
        self,
        func: Callable[..., Any],
        *args: Any,
        key: Key | None = None,
        pure: bool = True,
        priority: float = 0,
        retries: int = 0,
        resources: Mapping[str, float] | None = None,
        pool: str | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> Future:
        """Run ``func(*args, **kwargs)`` on the cluster; futures in the arguments (also
        inside lists, tuples and dicts) become dependencies. Returns a :class:`Future`.

        ``priority``, ``retries``, ``resources``, ``pool`` and ``timeout`` (seconds each
        try may execute on its worker, past which it fails with
        :class:`~runtime.errors.TaskTimeout`; None: no limit) are the task's settings, as
        :meth:`submit_graph` takes them (not passed to ``func``); a bad one raises
        :class:`~runtime.errors.GraphError` here. A pure call's key is its function's
        name and a hash of the function, the arguments and the settings other than the
        defaults: the same call twice is one task; with other settings, another. Calls
        are batched: every ``submit`` made before the event loop next runs goes to the
        manager as one graph (one per run of calls with the same settings).
        """
        self._require()
        opts = _task_options(func, key, priority, retries, resources, pool, timeout)
        _refuse_dask_only(func, kwargs)
        return self._submit_call(func, func, args, kwargs, key, pure, opts)

    def _submit_call(
        self,
        func: Callable[..., Any],
        named: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        key: Key | None,
        pure: bool,
        opts: TaskOptions,
    ) -> Future:
        """:meth:`submit` with its settings checked (``opts``), ``named`` tokenized in
        place of ``func`` (``func`` itself or its :class:`_FuncToken`)."""
        if key is None:
            if not pure:
                token = os.urandom(16).hex()
            elif opts is _DEFAULTS:
                token = tokenize(named, args, kwargs)
            else:  # the same call with other settings is another task, with its own
                token = tokenize(named, args, kwargs, dataclasses.astuple(opts))
            key = f"{funcname(func)}-{token}"
        client = self._client_actor
        fut = Future(
            key, self, _submitting=True
        )  # (failed or cancelled: pending again, to run again)
        watch = fut._watch
        watch.pool = opts.pool
        if key not in client.pending and watch.update is None:
            client.queue(key, make_task(key, func, args, kwargs, self._key_of_future), opts)
            watch.fence += 1
        return fut

    def map(
        self, func: Callable[..., Any], *iterables: Iterable[Any], pure: bool = True, **kwargs: Any
    ) -> list[Future]:
        """``submit(func, *items, **kwargs)`` for each tuple of items of ``iterables``
        (``priority``, ``retries``, ``resources``, ``pool`` and ``timeout`` among ``kwargs`` are the
        tasks' settings, as in :meth:`submit`). The keys are those ``submit`` gives; the
        function is tokenized once for them all, not once per item."""
        self._require()  # also with nothing to map
        settings = {k: kwargs.pop(k) for k in _SUBMIT_SETTINGS if k in kwargs}
        key = settings.pop("key", None)
        _refuse_dask_only(func, kwargs)
        named: Any = None
        futures = []
        began = time.monotonic()
        for items in zip(*iterables, strict=False):
            if named is None:  # once, and not for an empty map (nor tokenized if impure)
                opts = _task_options(func, key, **settings)
                named = _FuncToken(func) if pure else func
            futures.append(self._submit_call(func, named, items, kwargs, key, pure, opts))
        if len(futures) >= LOG_SUBMISSION:
            _log.info(
                "map made its tasks; they go to the manager next", tasks=len(futures),
                seconds=round(time.monotonic() - began, 1),
                **({"hint": "pure=False skips hashing each item's arguments"} if pure else {}),
            )  # fmt: skip
        return futures

    def _keys_of(self, futures: Any, method: str) -> list[Key]:
        """The keys of ``futures``, as :meth:`_futures_of` checks them."""
        return [f.key for f in self._futures_of(futures, method)]

    def _futures_of(self, futures: Any, method: str) -> list[Future]:
        """``futures``, a list of this cluster's futures; ``TypeError`` for anything
        else (``CorralError`` for a future of another cluster, and for a released one,
        which ``cancel`` skips instead)."""
        if isinstance(futures, Future | str | bytes | Mapping) or not isinstance(futures, Iterable):
            raise TypeError(
                f"{method} takes a list of Futures, got {type(futures).__name__} "
                f"{short_repr(futures)}{_TAKES_FUTURES[method]}"
            )
        checked = []
        for f in futures:
            if type(f) is not Future:
                raise TypeError(
                    f"{method} takes Futures (what submit, map and submit_graph return), "
                    f"got {type(f).__name__} {short_repr(f)}{_TAKES_FUTURES[method]}"
                )
            if method == "cancel" and f.released and f._cluster is self:
                continue  # let go already: nothing of this client's to cancel
            # CorralError for another cluster's future, or a released one
            self._key_of_future(f, _USES[method])
            checked.append(f)
        return checked

    def _key_of_future(self, obj: Any, use: str = "passed to submit as an argument") -> Key | None:
        if isinstance(obj, Future):
            if obj._cluster is not self:
                raise CorralError(f"future {obj.key!r} belongs to another cluster")
            if obj.released:
                raise released_error(obj.key, use)
            return obj.key
        return None

    async def submit_graph(
        self,
        graph: Any,
        keys: Sequence[Key] | None = None,
        *,
        priority: float = 0,
        retries: int = 0,
        resources: Mapping[str, float] | None = None,
        pool: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - the tasks' setting, not the call's
    ) -> list[Future]:
        """Submit a dask graph; return futures for ``keys`` (a flat list of keys). Or
        submit dask collections, ``submit_graph(x)`` or ``submit_graph([x, y])``, with no
        keys: one future per collection, whose value is the collection's (what
        ``dask.compute`` gives for it).

        The settings are every task's (a dask annotation of the same name overrides
        them for its tasks); ``timeout``: seconds each try may execute on its worker,
        past which it fails with :class:`~runtime.errors.TaskTimeout` (None: no limit).
        Raises :class:`~runtime.errors.GraphError` (missing keys, cycles, a bad
        setting) before anything runs.
        """
        self._require()
        opts = TaskOptions.of(SUBMISSION, priority, retries, resources, pool, timeout)
        if holds_collection(graph):
            if keys is not None:
                raise TypeError(
                    "submit_graph got a dask collection and keys: a collection's keys are "
                    "its own. Give the collection (or a list of them) alone, "
                    "submit_graph(x), for one future per collection"
                )
            graph, keys, _, inputs = await self._collections((graph,), "submit_graph")
        elif keys is None:
            raise TypeError(
                "submit_graph needs the keys of the graph to compute, submit_graph(graph, "
                "keys), or dask collections alone, submit_graph(x) or submit_graph([x, y])"
            )
        else:
            # Checked before any Future holds a key (and here, not after pickling the
            # graph off to a remote manager): GraphError saying what each must be.
            reject_collection(graph, values=True)
            inputs = await self._inputs_of(graph)
        check_shuffle_method(graph)  # with this process's dask config
        keys = check_keys(keys)
        futures = [Future(k, self, _submitting=True) for k in keys]
        for f in futures:
            f._watch.pool = opts.pool
        await self._submit(graph, keys, opts, inputs)
        return futures

    async def _submit(
        self,
        graph: Mapping[Key, Any],
        keys: Sequence[Key],
        opts: TaskOptions,
        inputs: Sequence[Future] = (),
        refs: bool = True,
        progress: bool = False,
    ) -> str:
        """Send a graph checked by the caller (:func:`reject_collection`, its keys
        hashable, ``opts`` checked; ``inputs``: the futures it holds, checked by
        :meth:`_inputs_of`, held by the caller until this returns: the manager then has
        the tasks that read them). A graph more than one message to a remote manager
        may carry is a :class:`GraphError` saying what to do. ``refs``: a future
        inside its tasks goes as a reference to its key (a graph or collection), or is
        refused (scattered values: :meth:`Future.__reduce__`). ``progress``: the
        scheduler counts the run's tasks (``ProgressQuery``). Returns the run's id."""
        client = self._client_actor
        under_way = tuple(dict.fromkeys(keys))
        for key in under_way:  # see _KeyWatch.fence
            client.watches[key].fence += 1
        reply = None
        try:
            # the submit() graphs and the releases made before it go first, in that order
            await client.ref.ask(_SendReleases(), timeout=None)
            request = SubmitGraphRequest(
                graph,
                tuple(keys),
                self._client_actor.name,
                priority=opts.priority,
                retries=opts.retries,
                resources=dict(opts.resources) or None,
                pool=opts.pool,
                timeout=opts.timeout,
                progress=progress,
            )
            n = known_size(graph) or 0  # (a dask expression: not known)
            began = _sending(n)
            reply = await self._manager.ask(
                await _for_manager(self._manager, request, refs), timeout=None
            )
            _taken_in(n, began)
        except FrameTooLarge as exc:
            size, limit = exc.fields["size"], exc.fields["limit"]
            raise GraphError(
                f"the graph is {size / 2**20:.1f} MiB pickled, over the {limit / 2**20:.0f} "
                "MiB one message to the manager may carry; nothing of it was sent. Its "
                "arguments hold large data (a numpy array given to da.from_array, big "
                "lists or bytes): make or load large data in tasks instead (np.load, "
                "da.from_zarr, reading a file), whose outputs move in parts of any size.",
                size=size, limit=limit,
            ) from exc  # fmt: skip
        except pickle.PicklingError as exc:
            if isinstance(exc.__cause__, RecursionError):  # cloudpickle's, a graph nested
                raise too_deep() from None  # too deeply to pickle (as to read: build_specs)
            raise
        finally:
            client.sent(under_way, reply)
        _told_of(reply)
        return str(reply.run)

    async def _collections(
        self, args: tuple[Any, ...], method: str
    ) -> tuple[Any, list[Key], Callable[[Any], Any], list[Future]]:
        """:func:`~runtime.graph.collections_expr` of ``args``, each a dask collection
        or a list or tuple of them (``TypeError`` for anything else among them), made in
        a thread: dask's optimization may take a while; and the futures it holds (a
        persisted collection's), checked (:meth:`_inputs_of`)."""
        for arg in args:
            if not holds_collection(arg, in_dicts=method == "compute"):
                raise TypeError(
                    f"{method} got {type(arg).__name__} {short_repr(arg)} beside dask "
                    f"collections: {method}(x, ...) takes collections (or lists and tuples "
                    f"of them) alone, whose keys are their own; a graph goes with its keys "
                    f"alone, {method}(graph, keys)"
                )

        def made() -> tuple[Any, list[Key], Callable[[Any], Any], list[Future]]:
            with nested_computes_on(self.get):  # (a set_index's divisions: on the workers)
                expr, keys, repack = collections_expr(args)
            return expr, keys, repack, _futures_in(expr)

        expr, keys, repack, inputs = await anyio.to_thread.run_sync(made)
        return expr, keys, repack, self._checked_inputs(inputs)

    async def _inputs_of(self, graph: Any) -> list[Future]:
        """The futures ``graph`` holds (:func:`_futures_in`; looked for in a thread in a
        graph of :data:`~actors.manager.THREAD_THRESHOLD` tasks or more), checked: each
        this cluster's and not released (:class:`~runtime.errors.CorralError` naming
        it), so each stands for a key the cluster holds."""
        size = known_size(graph)
        if size is not None and size < THREAD_THRESHOLD:
            found = _futures_in(graph)
        else:
            found = await anyio.to_thread.run_sync(_futures_in, graph)
        return self._checked_inputs(found)

    def _checked_inputs(self, found: list[Future]) -> list[Future]:
        for f in found:
            if f._cluster is not self:
                raise CorralError(
                    f"future {f.key!r} in the graph belongs to another cluster: a graph "
                    "(a persisted collection's) is computed on the cluster its futures "
                    "belong to",
                    key=f.key,
                )
            if f.released:
                raise CorralError(
                    f"the graph holds future {f.key!r}, which was released "
                    "(Future.release()): its task's result may be gone from the cluster, "
                    "and the graph has no other way to make it, so nothing was computed. "
                    "Keep a persisted collection's futures while collections made from it "
                    "are computed, or persist (or compute) the original collection again.",
                    key=f.key,
                )
        return found

    async def compute(self, *args: Any, **options: Any) -> Any:
        """Compute dask collections, ``compute(x)`` (the value of ``x``, what
        ``x.compute()`` gives) or ``compute(x, y, ...)`` (a tuple, as from
        ``dask.compute``); lists, tuples, dicts and sets of collections are looked into, as
        dask does: ``compute({"mean": x.mean(), "std": x.std()})`` gives a dict.
        Or compute ``keys`` (a key or nested lists of keys) of a dask graph,
        ``compute(graph, keys)``.

        Nested lists come back as nested tuples, like dask's ``get``. Raises the original
        exception of the first task that failed. Results are released once returned,
        except file outputs: a :class:`~runtime.files.File` returned stays on its
        worker's disk while the returned ``File`` object lives (as a Future's output
        does), so that it can be opened (same machine) or downloaded.
        """
        self._require()
        opts = _submission_options("compute", options)
        if _graph_and_keys(args):
            graph, keys = args
        elif any(holds_collection(arg, in_dicts=True) for arg in args):
            expr, flat, repack, inputs = await self._collections(args, "compute")
            values = repack(await self._compute(expr, flat, opts, inputs))
            return values[0] if len(args) == 1 else values
        else:
            raise TypeError(
                f"compute takes dask collections, compute(x, ...), or a graph and its "
                f"keys, compute(graph, keys); got {len(args)} argument(s) and no collection"
            )
        reject_collection(graph, values=True)  # GraphError for each, before any key is held
        check_shuffle_method(graph)  # with this process's dask config
        inputs = await self._inputs_of(graph)
        return await self._compute(graph, keys, opts, inputs)

    async def _compute(
        self, graph: Any, keys: Any, opts: TaskOptions, inputs: Sequence[Future] = ()
    ) -> Any:
        """:meth:`compute` of a checked graph (or expression) and its keys (``inputs``:
        the futures it holds, checked)."""
        from runtime.graph import flatten_keys

        flat = flatten_keys(keys)
        client = self._client_actor
        for k in flat:  # hold the keys without a Future object each (cheaper for big graphs)
            watch = client.watch(k)
            watch.holders += 1
            watch.pool = opts.pool
        values: list[Any] = []
        try:
            if Callback.active - _own_callbacks():  # dask's (a ProgressBar): told as tasks end
                values = await self._compute_told(graph, flat, opts, inputs)
            else:
                await self._submit(graph, flat, opts, inputs)
                values = await self._gather_keys(flat, root_errors=True)
        finally:
            loop = asyncio.get_running_loop()
            for i, (k, v) in enumerate(itertools.zip_longest(flat, values)):
                if isinstance(v, File):  # held while the File object returned lives
                    # its own object: the one gathered may be the worker's (in-process)
                    values[i] = v = dataclasses.replace(v)
                    weakref.finalize(v, _release_soon, loop, client, k)
                else:
                    client.unhold(k)
        return _pack(keys, dict(zip(flat, values, strict=True)))

    async def _compute_told(
        self, graph: Any, flat: list[Key], opts: TaskOptions, inputs: Sequence[Future]
    ) -> list[Any]:
        """:meth:`_compute`'s submit and gather with dask's active callbacks called
        (:mod:`runtime.progress`): taken from ``Callback.active`` for the call, as
        dask's schedulers take them (a dask compute inside a task of an in-process
        worker calls none of them), the run counted by the scheduler and asked how far
        it is every :data:`~runtime.progress.PROGRESS_EVERY` seconds; ``finish`` is
        called however the compute ends."""
        with _callbacks_taken() as callbacks:
            hooks = Hooks(callbacks, graph)
            errored = True
            run = ""
            let_go: list[bool] = []  # said: the run's counts were let go

            def said_let_go() -> None:
                let_go.append(True)
                _log.warning("progress no longer counted", run=run, advice=PROGRESS_LET_GO)

            try:
                hooks.start()
                run = await self._submit(graph, flat, opts, inputs, progress=True)

                async def ask() -> dict[str, Any] | None:
                    return await self._manager.ask(ProgressQuery(run))  # type: ignore[no-any-return]

                gathered = self._gather_keys(flat, root_errors=True)
                values = await _followed(hooks, ask, said_let_go, run, gathered)
                errored = False
                return values
            finally:
                if run:  # the last counts (and let them go), unless the manager is gone
                    with anyio.move_on_after(_PROGRESS_LAST, shield=True):
                        try:
                            last = await self._manager.ask(ProgressQuery(run, stop=True))
                        except Exception as exc:  # (the compute's own error is raised)
                            _log.warning("progress counts not got", run=run, error=repr(exc))
                        else:
                            if last is None and not let_go:  # let go before its first counts
                                said_let_go()
                            hooks.update(last)
                hooks.finish(errored)

    async def persist(self, *collections: Any, **options: Any) -> Any:
        """Start computing dask collections on the cluster and keep their chunks there:
        ``x = await cluster.persist(x)`` (``persist(x, y)`` gives a tuple, ``persist([x,
        y])`` a list, ``persist({"x": x, "y": y})`` a dict under the same names), as
        dask.distributed's ``Client.persist``. Returns once the graph
        is submitted, not computed: each collection rebuilt on the futures of its own
        keys (dask's ``__dask_postpersist__``), so that what is computed from it later
        (``await cluster.compute(x.sum())``) runs only its new tasks, reading those
        chunks on the workers. The chunks stay on the cluster while the returned
        collection (its futures: ``Future`` objects in its graph) lives; a collection
        made from it that is computed after they were released (``Future.release()``)
        raises :class:`~runtime.errors.CorralError` saying so, nothing computed.

        ``options`` are ``compute``'s (``priority``, ``retries``, ``resources``, ``pool``,
        ``timeout``): every task's settings. ``TypeError`` for anything that is not a
        dask collection."""
        self._require()
        opts = _submission_options("persist", options)
        shape: type[list[Any]] | type[tuple[Any, ...]] | None = None
        names: list[Any] | None = None  # a dict of collections: its keys
        items = list(collections)
        if len(collections) == 1 and type(collections[0]) in (list, tuple):
            shape, items = type(collections[0]), list(collections[0])
        elif len(collections) == 1 and type(collections[0]) is dict:
            names, items = list(collections[0]), list(collections[0].values())
        for c in items:
            if not is_dask_collection(c):
                raise TypeError(
                    f"persist takes dask collections (persist(x), persist(x, y), "
                    f"persist([x, y]), persist({{'x': x}})), got {type(c).__name__} "
                    f"{short_repr(c)}; for values, scatter(data); for a graph, "
                    "submit_graph(graph, keys)"
                )
        if not items:
            return {} if names is not None else shape() if shape else ()

        def made() -> tuple[Any, list[Any], list[Future]]:
            with nested_computes_on(self.get):
                expr, keys = persist_expr(items)
            return expr, keys, _futures_in(expr)

        expr, keys, found = await anyio.to_thread.run_sync(made)
        inputs = self._checked_inputs(found)
        flat = list(dict.fromkeys(flatten(keys)))
        futures = {k: Future(k, self, _submitting=True) for k in flat}
        for f in futures.values():
            f._watch.pool = opts.pool
        await self._submit(expr, flat, opts, inputs)
        rebuilt = []
        for c, ks in zip(items, keys, strict=True):
            rebuild, args = c.__dask_postpersist__()
            rebuilt.append(rebuild({k: futures[k] for k in flatten(ks)}, *args))
        if names is not None:
            return dict(zip(names, rebuilt, strict=True))
        if shape is not None:
            return shape(rebuilt)
        return rebuilt[0] if len(rebuilt) == 1 else tuple(rebuilt)

    async def scatter(self, data: Any, *, hash: bool = True, **dask_only: Any) -> Any:
        """Put values on the cluster, each as a :class:`Future` (of a task that returns
        it), to pass to ``submit`` and ``map`` or inside graphs: ``scatter(value)`` gives
        a future, ``scatter([a, b])`` a list of futures, ``scatter({"a": a})`` a dict
        of futures keyed alike, as dask.distributed's ``Client.scatter``. A value's key
        is its type's name and its dask token: the same value scattered twice is one
        task (``hash=False``: a random key each time). The value stays on the cluster
        while its future lives.

        A value is a task's argument: at most :data:`~runtime.codec.MAX_FRAME_BYTES`
        (256 MiB) pickled, the most one message to a worker process carries, on any
        cluster; past it :class:`~runtime.errors.TaskArgumentsTooLarge` at the call,
        nothing sent (scatter it in parts, or load it in a task). It is measured (pickled)
        when dask's ``sizeof`` makes it :data:`SCATTER_MEASURED` (1 MiB) or more; one
        that ``sizeof`` underestimates fails, if too large, when sent to a worker
        process, with the same error. dask.distributed's
        ``broadcast=``, ``workers=``, ``direct=`` and ``timeout=`` raise
        :class:`~runtime.errors.DaskOnlyArgument`, saying what to do instead."""
        self._require()
        for name in dask_only:
            instead = _SCATTER_DASK_ONLY.get(name)
            if instead is None:
                raise TypeError(
                    f"scatter got an unexpected keyword argument {name!r}; it takes data and hash="
                )
            raise DaskOnlyArgument(name, "", instead, method="scatter")
        names = list(data) if type(data) is dict else None
        if names is not None:
            values = list(data.values())
        elif type(data) in (list, tuple, set, frozenset):
            values = list(data)
        else:
            values = [data]
        keys, graph = await anyio.to_thread.run_sync(_scattered, values, hash)
        futures = {
            k: Future(k, self, _submitting=True) for k in graph
        }  # (a value given twice: one task)
        if graph:
            await self._submit(graph, list(graph), _DEFAULTS, refs=False)
        out = [futures[k] for k in keys]
        if names is not None:
            return dict(zip(names, out, strict=True))
        if type(data) in (list, tuple):
            return type(data)(out)
        return out if type(data) in (set, frozenset) else out[0]

    @property
    def get(self) -> Callable[..., Any]:
        """``get(dsk, keys, **options)``: a synchronous dask scheduler bound to this
        running cluster, for code in another thread: ``dask.compute(x,
        scheduler=cluster.get)`` (also ``x.persist(scheduler=cluster.get)``), say in
        ``await anyio.to_thread.run_sync(...)``. It waits for :meth:`compute` of ``dsk``
        and ``keys`` on the cluster's event loop (``options`` as for ``compute``); an
        interrupt of the wait cancels it. ``CorralError`` in the event loop's own
        thread, which the wait would block: there, ``await cluster.compute(x)``.

        A function, not a bound method: dask hands its persist calls to the object a
        scheduler is a method of when that object has a ``persist`` (synchronously, as
        dask.distributed's ``Client.persist``), and :meth:`persist` is a coroutine. So
        ``x.persist(scheduler=cluster.get)`` stays dask's own, which brings the chunks
        into the calling thread's memory."""
        return functools.partial(self._get)

    def _get(self, dsk: Any, keys: Any, **options: Any) -> Any:
        """:attr:`get`'s call."""
        return self._from_thread(
            lambda: self.compute(dsk, keys, **options),
            "cluster.get waits for the computation",
            "`await cluster.compute(x)`; or call dask.compute(x, scheduler=cluster.get) in "
            "a thread, `await anyio.to_thread.run_sync(functools.partial(dask.compute, x, "
            "scheduler=cluster.get))`",
        )

    def _from_thread(self, work: Callable[[], Awaitable[Any]], waits: str, there: str) -> Any:
        """Wait in this thread for ``work()`` run on the cluster's event loop (the
        synchronous calls for code in another thread: :attr:`get`, :meth:`run_sync`);
        an interrupt of the wait cancels it. ``CorralError`` in the loop's own thread,
        which the wait would block: ``waits``, say what; ``there``, what to use there."""
        self._require(any_loop=True)
        loop = self._loop
        assert loop is not None  # set by start, as _system is
        if _in_running_loop() and asyncio.get_running_loop() is loop:
            raise CorralError(
                f"{waits}, and called in the cluster's own event loop it would block the "
                f"loop that runs it. There, use {there}"
            )
        return wait_on_loop(loop, work)

    async def gather(self, futures: Sequence[Future], *, root_errors: bool = False) -> list[Any]:
        """Wait for ``futures`` and return their values in order.

        Raises the error of the first future that fails (as soon as it fails). With
        ``root_errors=True`` a future that failed because a dependency failed raises that
        dependency's original exception instead of :class:`DependencyFailed`.
        """
        self._require()
        keys = self._keys_of(futures, "gather")
        if Callback.active - _own_callbacks():  # dask's (a ProgressBar): told as they end
            return await self._gather_told(keys, root_errors)
        return await self._gather_keys(keys, root_errors=root_errors)

    async def _gather_told(self, keys: list[Key], root_errors: bool) -> list[Any]:
        """:meth:`gather` with dask's active callbacks called as for a compute
        (:meth:`_compute_told`), from what the client learns of the futures themselves
        (:class:`_Ends`: no ask of the scheduler). ``dsk`` is ``{key: None}`` for the
        keys gathered; every task not ended counts as waiting."""
        with _callbacks_taken() as callbacks:
            unique = list(dict.fromkeys(keys))
            hooks = Hooks(callbacks, dict.fromkeys(unique))
            errored = True
            ends: _Ends | None = None
            try:
                hooks.start()
                ends = _Ends(self._client_actor, unique)
                tally = ends.tally

                async def ask() -> dict[str, Any]:
                    return tally.answer()

                values = await _followed(
                    hooks, ask, None, "", self._gather_keys(keys, root_errors=root_errors)
                )
                errored = False
                return values
            finally:
                if ends is not None:
                    ends.close()
                    hooks.update(ends.tally.answer())
                hooks.finish(errored)

    async def progress(
        self, futures: Iterable[Future], *, out: Any = None, every: float | None = None
    ) -> dict[str, int]:
        """Wait until every one of ``futures`` is done (finished, failed or cancelled,
        or let go), showing how many are, as dask.distributed's ``progress(futures)``:
        on a terminal a bar drawn again in place every ``every`` seconds (0.2), written
        anywhere else (a file, a pipe, a job's log) a line every ``every`` seconds (10)
        and one at the end. ``out``: where to (``sys.stdout``). Raises nothing for a
        task that failed (await its future for its error), but the cluster's error if
        it stopped (or its manager was lost) while it waited, as ``gather`` does;
        cancelling the wait (or an interrupt) ends the line and leaves nothing behind,
        the tasks running on.
        Returns the counts at the end: ``total`` (the keys followed, each once),
        ``finished`` (ended), ``erred``, ``cancelled`` and ``released``."""
        self._require()
        held = self._futures_of(futures, "progress")  # (held while it waits, as gather's)
        keys = list(dict.fromkeys(f.key for f in held))
        bar = TextBar(sys.stdout if out is None else out, time.monotonic(), every)
        ends = _Ends(self._client_actor, keys)
        try:
            while ends.pending:
                bar.draw(ends.tally.answer(), time.monotonic())
                with anyio.move_on_after(bar.every):
                    await ends.done.wait()
            if (gone := self._client_actor.gone) is not None:
                # the keys pending then failed with it: no task's failure, as gather says
                raise _raised_copy(gone)
        finally:
            ends.close()
            counts = ends.tally.answer()
            bar.draw(counts, time.monotonic(), final=True)
        return {k: counts[k] for k in ("total", "finished", "erred", "cancelled", "released")}

    def as_completed(
        self,
        futures: Iterable[Future] = (),
        *,
        with_results: bool = False,
        raise_errors: bool = True,
    ) -> AsCompleted:
        """Iterate over ``futures`` as they get done: ``async for fut in
        cluster.as_completed(futures)`` gives each one as soon as its task finished,
        failed or was cancelled, in that order (await it for its value or its error; a
        failure does not end the loop). ``add(future)`` adds one while iterating.

        With ``with_results=True`` it gives ``(future, value)`` pairs, the value got as
        ``await future`` gets it (a result lost meanwhile is waited for while it is made
        again, as in :meth:`gather`); a failed task's error is raised there, or, with
        ``raise_errors=False``, given as the value. Not a coroutine: the futures are
        checked at the call, as ``gather`` checks them.
        """
        return AsCompleted(self, futures, with_results, raise_errors)

    async def _gather_keys(self, keys: Sequence[Key], *, root_errors: bool) -> list[Any]:
        """The values of ``keys``. ``root_errors``: a dependency's failure raises its
        original exception, not :class:`DependencyFailed`. A task's own exception
        carries the note naming the task, its worker and its try (:func:`_task_error`)."""
        client = self._client_actor
        remaining = list(dict.fromkeys(keys))
        values: dict[Key, Any] = {}
        for attempt in range(1, 11):
            failed = await client.wait_all(remaining)
            if failed is not None:
                watch = client.watches.get(failed)
                if watch is None:  # its last Future was released while we waited
                    raise released_error(failed, "awaited or gathered")
                raise _raised_copy(_task_error(watch, root_errors=root_errors))
            # what this try goes by (None: released meanwhile; the next wait says so)
            seen = {k: w.update if (w := client.watches.get(k)) else None for k in remaining}
            missing, again = await self._fetch(remaining, values)
            if not missing and not again:
                break
            # Lost meanwhile: wait for the recomputation. Not lost (as far as anyone
            # knows): ask again soon. The client actor's handler decides, as updates
            # that came while this gather waited may have made the answer stale.
            wake = await client.ref.ask(
                _Regather(
                    tuple((k, seen[k]) for k in missing),
                    tuple((k, seen[k]) for k in again),
                    RETRY_DELAY * attempt,
                ),
                timeout=None,
            )
            if wake is not None:
                await wake.wait()
            remaining = [*missing, *again]
        else:
            raise CorralError(
                f"could not gather {remaining[:5]}: their data kept disappearing "
                "(workers lost while gathering). Check the workers' health."
            )
        return [values[k] for k in keys]

    async def _fetch(
        self, keys: Sequence[Key], values: dict[Key, Any]
    ) -> tuple[list[Key], list[Key]]:
        """Ask the manager for the values of ``keys``, put into ``values``, in as many
        answers as it takes: an answer to a client in another process holds at most
        64 MiB of values inline, and names the keys it left for the next
        (``GatherResult.later``). Returns the keys missing (lost: made again) and those
        to ask for again (their worker did not answer, or a stream read failed)."""
        missing: list[Key] = []
        again: list[Key] = []
        ask = tuple(keys)
        while ask:
            result: GatherResult = await self._manager.ask(
                GatherRequest(ask, raw=self.address is not None), timeout=None
            )
            if result.raw:  # pickled once by the worker, opened only here
                values.update({k: unpickling.loads(v) for k, v in result.data.items()})
            else:
                values.update(result.data)
            unread = await self._read_streams(result.streams, values)
            missing.extend(result.missing)
            again.extend([*result.unreachable, *unread])
            ask = result.later
        return missing, again

    async def _read_streams(
        self, streams: Sequence[StreamInfo], values: dict[Key, Any]
    ) -> list[Key]:
        """Read large values part by part through the manager (``actors/transfer.py``);
        return the keys whose read failed (their worker went away or stalled)."""
        manager = self._manager
        failed = []
        for info in streams:
            try:
                values[info.key] = await transfer.receive(
                    lambda part: manager.ask(part, timeout=READ_TIMEOUT), info, close=manager.post
                )
            except (ActorStopped, AskTimeout, UnknownStream) as exc:
                _log.warning("reading a result failed", key=str(info.key), error=str(exc))
                failed.append(info.key)
        return failed

    async def download(self, future: Future, dest: str | os.PathLike[str]) -> File:
        """Copy the file output of ``future`` (``runtime/files.py``) from the worker
        holding it to ``dest`` on this machine; its ``File`` here. The bytes travel
        through the manager in parts, written to ``dest`` part by part (never whole in
        memory), checked against the file's checksum, and a broken read resumes from
        the bytes written. Raises ``FileOutputError`` if the output is not a file, and
        what ``await future`` raises if its task failed, or if ``dest`` is a directory or
        its directory does not exist (it is not made: a mistyped path would be)."""
        self._require()
        key = future.key
        target = os.fspath(dest)
        _check_download_target(key, target)
        manager = self._manager
        remote = self.address is not None

        async def stream() -> StreamInfo | None:
            result: GatherResult = await manager.ask(
                GatherRequest((key,), raw=remote, files=True), timeout=None
            )
            info = next((s for s in result.streams if s.key == key), None)
            if info is None and key in result.data:
                value = result.data[key]
                kind = type(unpickling.loads(value) if result.raw else value).__name__
                raise FileOutputError(
                    f"download({key!r}): its output is a {kind}, not a file output; get it "
                    "with await (a task makes a file output by returning File(path))."
                )
            return info

        for _ in range(10):
            # done (or raises); made again if it was lost. As gather, less its dask
            # callbacks (a ProgressBar's); ``future`` checked as gather checks it: this
            # cluster's (another's key is none of this manager's), not released
            await self._gather_keys(self._keys_of([future], "gather"), root_errors=False)
            info = await stream()
            if info is None:
                continue  # lost meanwhile: wait for it again
            try:
                got = await transfer.fetch_file(
                    lambda part: manager.ask(part, timeout=READ_TIMEOUT),
                    info,
                    target,
                    reopen=lambda offset: stream(),
                    close=manager.post,
                    holder=info.worker,
                )
            except transfer.StreamBroken as exc:
                with contextlib.suppress(OSError):
                    os.unlink(exc.part)
                _log.warning("download failed", key=str(key), error=str(exc))
                continue
            return got
        raise CorralError(
            f"could not download {key!r}: its file kept disappearing (workers lost while "
            "reading it). Check the workers' health."
        )

    # -- control ---------------------------------------------------------------------

    async def cancel(self, futures: Sequence[Future] | Future) -> None:
        """Cancel tasks; their futures raise :class:`~runtime.errors.CancelledError`.
        Returns once those futures show it (``status`` ``"cancelled"``, ``done()``), or
        show how their task ended first."""
        self._require()
        keys = self._keys_of([futures] if isinstance(futures, Future) else futures, "cancel")
        if keys:
            client = self._client_actor
            request = client.cancel_request(keys, "cancelled by request", told=False)
            await client.ref.ask(request, timeout=None)
            await client.cancel_told(request)

    async def move(
        self,
        futures: Sequence[Future] | Future,
        pool: str | None = None,
        priority: int | None = None,
    ) -> dict[str, Any]:
        """Move the tasks of ``futures`` that are still waiting or queued (sent to no
        worker yet) to ``pool`` and/or ``priority``; they keep their keys, so their
        futures and dependents stand. Returns ``{"moved": [key, ...], "left": {key:
        why}}`` (keys as text; a running or finished task is left as it is). A pool the
        scheduler does not know: ``ValueError`` naming the pools it knows, nothing
        moved. Admin only on a shared manager (as ``set_policy``)."""
        self._require()
        keys = self._keys_of([futures] if isinstance(futures, Future) else futures, "move")
        if pool is not None and pool_name_problem(pool):
            raise ValueError(f"move(pool={pool!r}): {pool_name_problem(pool)}; name one pool")
        if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
            raise TypeError(
                f"move(priority=): a whole number (higher runs first), got "
                f"{type(priority).__name__} {short_repr(priority)}"
            )
        if pool is None and priority is None:
            raise ValueError("move: give pool=, priority= or both")
        if not keys:
            return {"moved": [], "left": {}}
        # through the client actor: after the submissions made before it (_Flush)
        request = MoveRequest(tuple(keys), (), pool, priority)
        reply: dict[str, Any] = await self._client_actor.ref.ask(request, timeout=None)
        return dict(reply)

    async def set_policy(self, kind: str, name: str, **params: Any) -> Any:
        """Swap the ``kind`` policy (priority, placement, retry) for ``name`` at runtime."""
        self._require()
        # What the manager refuses, refused here too: a message cannot carry these.
        if not isinstance(kind, str):
            raise UnknownPolicyError("kind of", kind, KINDS)
        if not isinstance(name, str):
            raise UnknownPolicyError(kind, name, REGISTRY.names(kind))
        msg = SetPolicyRequest(kind, name, params, by=self._client_actor.name)
        if not isinstance(self._manager, _RemoteManager):
            return await self._manager.ask(msg)
        # A shared manager: the policy stays for every later client. Kept, so that
        # close() warns if it is still in force then, saying how to set back the one
        # before (docs/api.md#policies).
        before = self._policies_set.get(kind, (None,))[0]
        if kind not in self._policies_set:
            infos = await self._manager.ask(PolicyQuery())
            before = next((i for i in infos if i.kind == kind), None)
            if before is not None:  # was it failing? then it is not proposed back
                status = await self._manager_status(self._manager, 5.0)
                auto = status.autoscaler if status is not None else None
                if kind != "scaling":
                    if status is not None and status.policy_failing.get(kind):
                        self._failing_before[kind] = status.policy_failing[kind]
                elif auto is not None and auto.policy == before.name and auto.policy_failing:
                    self._failing_before[kind] = "; ".join(
                        f"pool {p}: {t}" for p, t in sorted(auto.policy_failing.items())
                    )
        info: PolicyInfo = await self._manager.ask(msg)
        self._policies_set[kind] = (before, info)
        return info

    async def scale(self, n: int, pool: str | None = None, *, hold: float | None = None) -> Any:
        """Keep ``n`` blocks of workers in ``pool``; with ``hold`` (seconds), at least
        ``n`` for that long only, then back to the target set before (the scaling
        policy scales in the extra blocks as usual)."""
        self._require()
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(
                f"scale(n): n is the number of blocks of workers to keep, a whole number (an int), "
                f"got {type(n).__name__} {short_repr(n)}"
            )
        if hold is not None and (isinstance(hold, bool) or not isinstance(hold, int | float)):
            raise TypeError(
                f"scale(hold=...): hold is a number of seconds (an int or a float) or None, "
                f"got {type(hold).__name__} {short_repr(hold)}"
            )
        pool = self.pool if pool is None else pool
        check_blocks(pool, n)  # here too: a message cannot carry a larger n, nor a pool "*"
        return await self._manager.ask(ScaleRequest(n, pool, hold))

    async def status(self) -> dict[str, Any]:
        """The cluster's status as the documented dict (``StatusReply.to_dict()``)."""
        self._require()
        reply: StatusReply = await self._manager.ask(StatusRequest())
        return reply.to_dict()

    async def alerts(self) -> AlertsReply:
        """The alert monitor's alerts (pending, firing, lately resolved), its rules (as
        data) and its latest remediation audit lines."""
        self._require()
        reply: AlertsReply = await self._manager.ask(AlertsRequest())
        return reply

    async def story(self, *keys: Key) -> list[tuple[Any, ...]]:
        """Every recorded transition of ``keys``: (key, start, finish, causal id, time)."""
        self._require()
        return list(await self._manager.ask(StoryRequest(keys)))

    async def wait_for_workers(self, n: int, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Wait until ``n`` workers have registered with the scheduler;
        :class:`~runtime.errors.WorkersTimeout` (a ``TimeoutError``) after ``timeout``
        seconds, saying how many did. ``ValueError`` for ``n`` not a whole number >= 0."""
        self._require()
        _whole("wait_for_workers(n): n, the number of workers to wait for,", n, 0)
        try:
            with anyio.fail_after(timeout):
                await self._manager.ask(WaitForWorkersRequest(n), timeout=None)
        except TimeoutError:
            joined = None
            with anyio.move_on_after(5.0):
                joined = len((await self.status())["workers"])
            raise WorkersTimeout(n, joined, timeout) from None

    async def run(
        self,
        func: Callable[..., Any],
        *args: Any,
        workers: Iterable[str] | None = None,
        timeout: float = RUN_TIMEOUT,  # noqa: ASYNC109 - bounds each worker's answer
        on_error: str = "raise",
        **kwargs: Any,
    ) -> dict[str, Any]:
        """Call ``func(*args, **kwargs)`` once on every worker (or on ``workers``, ids),
        outside the task graph, as dask.distributed's ``Client.run``; return
        ``{worker id: what it returned}``. It runs in the worker's process, in a thread
        of its own (never its event loop, nor a task slot; an ``async def`` function's
        coroutine is awaited there, on an event loop of its own; a daemon thread: a call
        that never returns does not keep the worker's process from ending). The answer
        comes within ``timeout`` seconds: a worker that leaves or does not answer in
        time comes to :class:`~runtime.errors.RunNoAnswer` naming it (a call that waited
        there for a run thread until then is dropped, never run), one whose run threads
        are all held by calls that have not returned, with too many waiting, to
        :class:`~runtime.errors.RunQueueFull`; :class:`~runtime.errors.RunNotSent` when
        the call reached no worker in time (nothing ran). ``on_error``: ``"raise"``
        raises the error of the first worker (by id) whose call failed (the original
        exception, or :class:`~runtime.errors.RemoteError` when it does not load here),
        ``"return"`` puts the error in that worker's place, ``"ignore"`` leaves that
        worker out. :class:`~runtime.errors.UnknownWorkers` for an id the scheduler does
        not know (nothing runs). dask.distributed's ``wait=False``, ``nanny=True`` and a
        ``dask_worker`` parameter raise :class:`~runtime.errors.DaskOnlyArgument`."""
        self._require()
        name, wanted = _run_checked(func, workers, timeout, on_error, kwargs)
        call: Any = (func, args, kwargs)  # an embedded manager's workers: as it is
        if self.address is not None:  # pickled here: the manager opens none of it
            call = await anyio.to_thread.run_sync(pickled_call, call, name)
        seconds = check_run_timeout(timeout)  # (checked above: a float now)
        request = RunRequest(call, name, wanted, seconds)
        outcomes = await self._manager.ask(request, timeout=seconds + RUN_SLACK)
        return _run_results(outcomes, on_error, name)

    def run_sync(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        """:meth:`run` for code in another thread than the cluster's event loop (as
        :attr:`get` is :meth:`compute`'s): it waits for the answers there. Not a
        coroutine; ``CorralError`` in the event loop's own thread, which it would block."""
        answers: dict[str, Any] = self._from_thread(
            lambda: self.run(func, *args, **kwargs),
            "cluster.run_sync waits for the workers' answers",
            "`await cluster.run(func)`",
        )
        return answers

    @property
    def scheduler_state(self) -> Any:
        """The scheduler's core state, read-only (for statistics and tests). Only for
        an embedded cluster: a remote one answers ``status()`` instead."""
        self._require(any_loop=True)
        if self.address is not None:
            raise CorralError("scheduler_state is only there for an embedded cluster")
        return self._scheduler_actor.state


#: The options ``compute`` passes on to ``submit_graph``.
_OPTIONS = frozenset({"priority", "retries", "resources", "pool", "timeout"})


#: A value :meth:`Cluster.scatter` is given is pickled, to measure it against the limit
#: of a task's arguments, when dask's ``sizeof`` makes it this large or larger (below,
#: not: its pickle would be a copy made for nothing, in an embedded cluster's workers)
SCATTER_MEASURED = 2**20


def _scattered(values: list[Any], pure: bool) -> tuple[list[Key], dict[Key, Any]]:
    """The keys of ``values`` for :meth:`Cluster.scatter`, in order, and the graph of
    their tasks (one per key); :class:`TaskArgumentsTooLarge` for a value over the limit
    of a task's arguments. Slow for large values (tokenized, maybe pickled): in a
    thread."""
    keys: list[Key] = []
    graph: dict[Key, Any] = {}
    limit = MAX_FRAME_BYTES
    for i, value in enumerate(values):
        name = type(value).__name__
        if sizeof(value) >= SCATTER_MEASURED:  # (measured before it is hashed, which is slow)
            size = len(pickling.cloudpickle_dumps(DataNode(name, value)))
            if size > limit - (1 << 20):  # with the message around it, it could not go
                raise TaskArgumentsTooLarge(f"{name}, item {i}", size, limit, scattered=True)
        key = f"{name}-{tokenize(value) if pure else os.urandom(16).hex()}"
        keys.append(key)
        graph.setdefault(key, ScatteredData(key, value))  # (a future inside: refused)
    return keys, graph


def _submission_options(method: str, options: Mapping[str, Any]) -> TaskOptions:
    """The settings of a ``compute`` or ``persist`` call, checked (``TypeError`` for an
    unknown one, ``GraphError`` for a bad value)."""
    unknown = options.keys() - _OPTIONS
    if unknown:
        raise TypeError(
            f"{method} got unknown option(s) {sorted(unknown)}; it takes "
            f"{', '.join(sorted(_OPTIONS))}"
        )
    return TaskOptions.of(SUBMISSION, **options)


#: The keywords of dask.distributed's ``Client.scatter`` that Corral's does not take,
#: and what to do instead.
_SCATTER_DASK_ONLY = {
    "broadcast": "Corral copies a value to the workers whose tasks read it, when they "
    "read it (and keeps temporary replicas of outputs long to make again): leave it out",
    "workers": "Corral places the task that holds the value like any other, by pool: "
    "leave it out, or submit the value's task yourself with pool=",
    "direct": "a Corral client always sends through the manager: leave it out",
    "timeout": "await the call within anyio.fail_after(seconds) instead",
}

#: dask.distributed's keywords of ``Client.run`` that Corral's does not take: their
#: dask default (accepted, and not passed to the function, as dask does not), and what
#: to do instead of another value.
_RUN_DASK_ONLY = {
    "wait": (
        True,
        "every call is waited for (an async def function too): start background work in "
        "a thread or task of the function's own, and return",
    ),
    "nanny": (False, "Corral's workers have no nanny: the function runs in the worker's process"),
}


def _run_checked(
    func: Any, workers: Any, timeout: Any, on_error: Any, kwargs: dict[str, Any]
) -> tuple[str, tuple[str, ...] | None]:
    """``Cluster.run``'s arguments checked (its function's name, and the worker ids as a
    tuple, None for all); dask.distributed's keywords taken out of ``kwargs``."""
    if not callable(func):
        raise TypeError(f"run(func, ...): func must be callable, got {short_repr(func)}")
    name = funcname(func)
    for key, (default, instead) in _RUN_DASK_ONLY.items():
        if key in kwargs and kwargs.pop(key) is not default:
            raise DaskOnlyArgument(key, name, instead, method="run")
    params: Mapping[str, Any] = {}
    with contextlib.suppress(TypeError, ValueError):  # a signature that cannot be read
        params = inspect.signature(func).parameters
    if "dask_worker" in params:
        raise DaskOnlyArgument(
            "dask_worker",
            name,
            "Corral's workers are no dask Worker objects to pass: read what you need in "
            "the function itself (os.getpid(), socket.gethostname(), os.environ)",
            method="run",
        )
    if on_error not in RUN_ON_ERROR:
        raise ValueError(
            f"run(on_error=...) is one of {', '.join(map(repr, RUN_ON_ERROR))}, as in dask, "
            f"got {short_repr(on_error)}"
        )
    check_run_timeout(timeout)
    if workers is None:
        return name, None
    if isinstance(workers, str) or not isinstance(workers, Iterable):
        raise TypeError(
            "run(workers=...) is a list of worker ids (a single id in a list: "
            f"workers=['worker-1']), got {short_repr(workers)}"
        )
    wanted = tuple(workers)
    for wid in wanted:
        if not isinstance(wid, str):
            raise TypeError(f"run(workers=...): a worker id is a str, got {short_repr(wid)}")
    return name, wanted


def _run_results(outcomes: Iterable[RunOutcome], on_error: str, name: str) -> dict[str, Any]:
    """``Cluster.run``'s answer, ``{worker id: value}``, from the workers' outcomes (by
    worker id), the failed ones as ``on_error`` says: the first raised, or its error in
    the worker's place, or left out."""
    results: dict[str, Any] = {}
    for out in sorted(outcomes, key=lambda o: o.worker):
        if out.ok:
            try:
                results[out.worker] = unpickling.loads(out.payload) if out.pickled else out.payload
                continue
            except Exception as exc:  # its value's class is not importable here, say
                exc.add_note(f"(the value {name}() returned on worker {out.worker!r})")
                error: BaseException = exc
        else:
            error = _run_error(out, name)
        if on_error == "raise":
            raise error
        if on_error == "return":
            results[out.worker] = error
    return results


def _run_error(out: RunOutcome, name: str) -> BaseException:
    """The error of a failed outcome, as the caller gets it: the worker's exception
    (:class:`~runtime.errors.TaskExited` for one that is not an ``Exception``, which
    raised as itself would end this program), or :class:`~runtime.errors.RemoteError`
    when it does not load here; with a note naming the worker."""
    try:
        error = unpickling.loads(out.payload) if out.pickled else out.payload
        if not isinstance(error, BaseException):
            raise TypeError(f"a {type(error).__name__} in place of an exception")
    except Exception:
        return RemoteError(out.kind, out.text)
    if isinstance(error, RunNoAnswer):
        return error  # (its text names the worker)
    error = TaskExited.of(error, f"{name}() on {out.worker}")
    error.add_note(f"(raised on worker {out.worker!r} in Cluster.run's call of {name}())")
    return error


#: What each method that takes futures says to do with something else.
_TAKES_FUTURES = {
    "gather": "; for one future, await it; for keys of a graph, use compute(graph, keys)",
    "cancel": "; to cancel by key, use the console's `cancel KEY` (python -m runtime console)",
    "as_completed": "; add one future with add(future)",
    "progress": "; for one future, progress([future])",
    "move": "; to move by key, use the console's `move KEY --pool P`",
}

#: What each method that takes futures does with them, for the error of a released one.
_USES = {
    "gather": "awaited or gathered",
    "cancel": "cancelled",
    "as_completed": "waited for",
    "progress": "followed",
    "move": "moved",
}


#: The ``Cluster`` options of its workers, which a client does not start.
_WORKER_OPTIONS = (
    "workers", "processes", "port", "threads_per_worker", "memory_per_worker",
    "disk_per_worker", "memory_options",
)  # fmt: skip

#: What a manager process holds for all its clients, by the ``Cluster`` options that
#: set it in an embedded cluster (its workers among them); and where a manager process
#: takes it from instead.
_MANAGER_SETTINGS: tuple[tuple[tuple[str, ...], str], ...] = (
    (
        _WORKER_OPTIONS,
        "a manager process's workers are started on their own: python -m runtime worker "
        "ADDRESS (--cores, --memory, --disk, --memory-options; docs/deployment.md), or by "
        "the manager's pools (--config FILE), and a client does not start any",
    ),
    (
        ("policies",),
        "a manager process has its own policies, which all its clients share, and a "
        "client does not change them by connecting: once connected, `await "
        "cluster.set_policy(kind, name, **params)` changes one for every client (as the "
        "console's `policy set` does), and a policy of your own must be registered in "
        "the manager's process (python -m runtime manager --policy-module MODULE)",
    ),
    (("pools",), "a manager process has its own pools: give it --config FILE ([pools.NAME])"),
    (
        ("saturation", "stall_timeout"),
        "a manager process's scheduler keeps its own for all its clients (saturation "
        "2.0, stall_timeout 10 s)",
    ),
    (("prune_depth",), "a manager process has its own: python -m runtime manager --prune-depth N"),
    (
        ("long_task", "unknown_long"),
        "a manager process has its own: python -m runtime manager --long-task SECONDS, "
        "--no-unknown-long",
    ),
    (
        ("worker_timeout",),
        "a manager process has its own: python -m runtime manager --worker-timeout SECONDS",
    ),
    (
        ("monitoring", "monitoring_interval"),
        "a manager process writes its own database (python -m runtime manager "
        "--monitoring PATH --monitoring-interval SECONDS)",
    ),
    (
        ("alerts", "alertmanager", "alerting"),
        "a manager process has its own alerting: give it --config FILE ([[alerts]], "
        "[alerting]) or --alertmanager URL",
    ),
)


#: the embedded clusters this process started, while they run (Cluster.running())
_RUNNING: list[Cluster] = []


def _ended_unclosed(ref: weakref.ref[Cluster], system: ActorSystem) -> None:
    """A cluster's actors (``system``) ended: if it was not closed (its event loop
    ended, ``asyncio.run`` returning without ``close``; or an actor crashed), let go of
    what it holds in the process as ``close`` does, so that the cluster is freed and
    dask's computes and the gc threshold are as before it; ``close`` later does
    nothing more of it."""
    cluster = ref()
    if cluster is None or cluster._system is not system:  # closed, or started again
        return
    cluster._unlist()
    cluster._gc.exit()


#: how to start a Cluster where an event loop runs in the thread (a notebook)
_START_HERE = (
    "start it with `await cluster.start()` (in a notebook, in one cell; use it in later "
    "cells; `await cluster.close()` stops it), or use `async with Cluster(...) as "
    "cluster:` around the work (in a notebook, at the top level of one cell); "
    "asyncio.run and anyio.run fail where a loop runs already"
)


def _loop_runs_here() -> bool:
    """Whether an event loop runs in this thread (a Jupyter kernel's, async code)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _first_line(exc: BaseException) -> str:
    """``exc``'s type and the first line of its message, for an error that says why."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _warn_running(cluster: Cluster) -> None:
    """Warn that ``cluster`` starts while other embedded clusters of this process run
    (a notebook cell run again), naming them and how to close them; none is closed."""
    running = Cluster.running()
    if running:
        _log.warning(
            "a Cluster starts while another started in this process still runs: each keeps "
            "its workers",
            running=[repr(c) for c in running],
            advice="a notebook cell run again makes a new Cluster and leaves the old one "
            "running. Close the old one with `await old.close()` (old: the variable that "
            "held it, or Cluster.running()[i]; a runtime.Client: `old.close()`, not "
            "awaited); it is not closed for you",
        )


def _seconds(name: str, value: object, what: str = "") -> float:
    """``value`` as a number of seconds: a :class:`ValueError` naming ``name`` (and
    saying ``what``) unless it is a finite number > 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ValueError(f"{name} must be a number of seconds > 0{what}, got {value!r}")
    return float(value)


def _refuse_manager_settings(**values: Any) -> None:
    """``ValueError`` for ``Cluster(address, ...)`` given an option that sets what a
    manager process holds for all its clients, its workers among them (``values``:
    option name to its value; it counts as given when it is not its default in
    ``Cluster``'s signature, nor None nor empty), rather than ignoring it; says where
    the manager takes it from."""
    import inspect

    defaults = inspect.signature(Cluster.__init__).parameters

    def given(name: str) -> bool:
        value = values[name]
        if value is None or (isinstance(value, list | tuple | dict) and not value):
            return False
        return bool(value != defaults[name].default)

    for names, where in _MANAGER_SETTINGS:
        named = [f"{name}=" for name in names if given(name)]
        if named:
            raise ValueError(
                f"{' and '.join(named)} {'is' if len(named) == 1 else 'are'} for an embedded "
                f"cluster; with an address, {where}. Leave {'it' if len(named) == 1 else 'them'} "
                "out (docs/configuration.md)"
            )


def _initial_policies(
    policies: Mapping[str, str | tuple[str, dict[str, Any]]] | None,
) -> dict[str, tuple[str, dict[str, Any]]]:
    """``Cluster(policies=...)`` as ``{kind: (name, params)}``; ``TypeError`` saying what
    an entry must be (a policy name, or a pair of a name and a dict of parameters)."""
    if policies is None:
        return {}
    if not isinstance(policies, Mapping):
        raise TypeError(
            f"policies must be a dict of kind to policy, e.g. {{'retry': 'default'}}, got "
            f"{type(policies).__name__} {short_repr(policies)}"
        )
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    for kind, spec in policies.items():
        if isinstance(spec, str):
            out[kind] = (spec, {})
        elif (
            isinstance(spec, tuple | list)
            and len(spec) == 2
            and isinstance(spec[0], str)
            and isinstance(spec[1], Mapping)
        ):
            out[kind] = (spec[0], dict(spec[1]))
        else:
            raise TypeError(
                f"policies[{kind!r}] is {short_repr(spec)}; it must be a policy name or a pair "
                f"(name, params), e.g. 'default' or ('default', {{'max_lost': 2}}). "
                "See docs/policies.md"
            )
    return out


def _note(err: BaseException, text: str) -> None:
    notes = getattr(err, "__notes__", [])
    if text not in notes:
        err.add_note(text)


def _wire_key(key: Any) -> Key:
    """``key`` as it was before it crossed the wire as JSON (a ``SubmitReply``'s
    ``echoed``), which makes tuples (dask's ``("part", 3)``) lists: tuples again."""
    return tuple(_wire_key(k) for k in key) if isinstance(key, list) else key


def _pack(keys: Any, values: Mapping[Key, Any]) -> Any:
    if isinstance(keys, list):  # a key, not a call, per item that is no list
        return tuple([_pack(k, values) if isinstance(k, list) else values[k] for k in keys])
    return values[keys]


# ----------------------------------------------------------------------------- dask get


def _check_download_target(key: Key, target: str) -> None:
    """A FileOutputError, now, for a ``download`` ``target`` no file can be written at."""
    where = os.path.dirname(os.path.abspath(target))
    problem = ""
    if os.path.isdir(target):
        problem = f"{target!r} is a directory; give the path of the file to write in it"
    elif os.path.exists(where) and not os.path.isdir(where):
        problem = f"{where!r} is not a directory"
    elif not os.path.isdir(where):
        problem = (
            f"the directory {where!r} does not exist; create it first, e.g. "
            f"os.makedirs({where!r}, exist_ok=True)"
        )
    if problem:
        raise FileOutputError(f"download({key!r}) to {target!r}: {problem}.")


def _files_dir(files_to: str | os.PathLike[str] | None) -> str:
    """Where :func:`get` copies file outputs: ``files_to`` (made if missing), or a new
    directory in the system's temporary directory."""
    if files_to is None:
        return tempfile.mkdtemp(prefix="corral-files-")
    os.makedirs(files_to, exist_ok=True)
    return os.fspath(files_to)


#: Seconds :func:`get`, interrupted inside a running event loop, waits for its helper
#: thread to cancel the computation and stop its cluster before the interrupt goes on.
_GET_STOP_LIMIT = 30.0
#: Seconds between a waiting caller's checks for a signal: a signal the kernel gives to
#: another thread (a worker's, the helper's) runs its handler in the main thread only
#: when that thread next runs Python code, not while it sleeps in a lock.
_GET_POLL = 0.05


class _GetHelper:
    """The thread :func:`get` computes in when its caller runs an event loop (a Jupyter
    cell). The caller waits in short waits, so that Ctrl-C reaches it promptly, and
    :meth:`cancel` ends the computation as Ctrl-C does outside a loop: its main task is
    cancelled, so its tasks are cancelled and its cluster stops (or its connection
    closes)."""

    def __init__(self, main: Callable[[], Any]) -> None:
        self._main = main
        self._lock = threading.Lock()
        self._task: tuple[asyncio.AbstractEventLoop, asyncio.Task[Any]] | None = None
        self._cancelled = False
        self._value: Any = None
        self._error: BaseException | None = None
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, name="corral-get", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = anyio.run(self._body, backend="asyncio")
        except BaseException as exc:  # the caller raises it
            self._error = exc
        finally:
            self._ended.set()

    async def _body(self) -> Any:
        with self._lock:
            task = asyncio.current_task()
            if self._cancelled or task is None:
                raise asyncio.CancelledError
            self._task = (asyncio.get_running_loop(), task)
        return await self._main()

    def wait(self, limit: float = math.inf, *, caller: asyncio.Task[Any] | None = None) -> bool:
        """Wait until the thread ends, at most ``limit`` seconds; whether it ended. What
        interrupts the caller (KeyboardInterrupt) is raised from here. (Not in
        ``Thread.join``: on Python 3.11, an interrupted join marks a running thread as
        stopped.) ``caller``: the task :func:`get` was called in, whose cancel asked
        meanwhile (``asyncio.run``'s Ctrl-C: its SIGINT handler cancels its main task
        instead of raising) raises ``asyncio.CancelledError`` here."""
        deadline = time.monotonic() + limit
        asked = caller.cancelling() if caller is not None else 0
        while not self._ended.wait(min(_GET_POLL, max(deadline - time.monotonic(), 0))):
            if caller is not None and caller.cancelling() > asked:
                raise asyncio.CancelledError
            if time.monotonic() >= deadline:
                return False
        self._thread.join()  # it has only to return from _run
        return True

    def result(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            started = self._task
        if started is not None:
            loop, task = started
            with contextlib.suppress(RuntimeError):  # its loop has closed: it ended
                loop.call_soon_threadsafe(task.cancel)


def wait_on_loop(loop: asyncio.AbstractEventLoop, work: Callable[[], Awaitable[Any]]) -> Any:
    """``work()`` run on ``loop`` (another thread's), waited for in this thread; an
    interrupt of the wait (Ctrl-C: ``KeyboardInterrupt``) cancels it, then goes on."""

    async def main() -> Any:
        return await work()

    done = asyncio.run_coroutine_threadsafe(main(), loop)
    try:
        return done.result()
    except BaseException:  # an interrupt of the wait: end the work too
        done.cancel()
        raise


def _in_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def get(
    dsk: Mapping[Key, Any],
    keys: Any,
    *,
    workers: int | None = None,
    threads_per_worker: int | None = None,
    num_workers: int | None = None,
    address: str | None = None,
    name: str | None = None,
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
    gc_threshold: int | None = None,
    files_to: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Any:
    """A synchronous dask scheduler: ``dask.compute(x, scheduler=get)``.

    Starts an in-process Corral cluster (by default one worker with a thread per core;
    ``num_workers`` sets the threads, as for dask's threaded scheduler), computes
    ``keys`` and stops it. With ``address`` it computes on that manager's workers
    instead, and ``workers``, ``threads_per_worker`` and ``num_workers`` raise
    ``TypeError``. Safe to call from inside a running event loop: it then runs in a
    helper thread with its own loop, and Ctrl-C (``KeyboardInterrupt``) cancels the
    computation there before it reaches the caller, as it does outside a loop; under
    ``asyncio.run``, whose Ctrl-C cancels its main task instead, the computation is
    cancelled and then ``asyncio.CancelledError`` raised in the task.
    ``name``, ``gc_threshold``, ``token`` and ``token_file`` are as for
    :class:`Cluster`. ``options`` go to :meth:`Cluster.submit_graph` (``priority``,
    ``retries``, ``resources``, ``pool``, ``timeout``).
    No other worker can join its cluster: a task naming another pool than its own
    (``"default"``), or asking for more ``resources`` than its worker has, raises
    :class:`~runtime.errors.GraphError` at once instead of waiting forever.

    A result that is a file output (:class:`~runtime.files.File`) is copied, before the
    cluster stops, to the directory ``files_to`` (made if missing; default a new
    ``corral-files-*`` directory in the system's temporary directory), and its ``File``
    there is returned: the worker's copy goes with the cluster.
    """
    allowed = _OPTIONS
    unknown = set(options) - allowed
    if unknown:
        raise TypeError(
            f"runtime.get got unknown option(s) {sorted(unknown)}; it takes workers, "
            "threads_per_worker, num_workers, address, name, token, token_file, gc_threshold, "
            f"files_to and {sorted(allowed)}"
        )
    sizing = {"workers": workers, "threads_per_worker": threads_per_worker,
              "num_workers": num_workers}  # fmt: skip
    given = [name for name, value in sizing.items() if value is not None]
    if address is not None and given:
        names = " and ".join([", ".join(given[:-1]), given[-1]] if len(given) > 1 else given)
        raise TypeError(
            f"runtime.get got {names} with address={address!r}: "
            f"{'they size' if len(given) > 1 else 'it sizes'} the cluster get starts for "
            "the call, and with address= it computes on the workers of that manager "
            f"instead. Leave {'them' if len(given) > 1 else 'it'} out; a manager's workers get "
            "their threads where they are started (`python -m runtime worker ADDRESS "
            "--cores N`, or its pools), see docs/deployment.md"
        )
    pool = options.get("pool")
    if pool is not None and not isinstance(pool, str):
        hint = "" if address is not None else " (set the threads with num_workers=)"
        raise GraphError(
            f"runtime.get got a {type(pool).__name__} as pool: in Corral, pool names a pool of "
            "workers (a string, e.g. pool='gpu'; docs/configuration.md), and dask's "
            "threaded scheduler's pool= (an executor) does not apply. Leave it out"
            f"{hint}."
        )
    threads = threads_per_worker or num_workers or host_cpus() or 1

    async def main() -> Any:
        own = address is None  # else the manager's workers: no sizing to give
        cluster = Cluster(
            address,
            name=name,
            workers=(1 if workers is None else workers) if own else None,
            threads_per_worker=threads if own else 1,
            gc_threshold=gc_threshold,
            token=token,
            token_file=token_file,
        )
        if own:  # its own cluster: tasks of another pool could never run
            cluster._closed = "runtime.get"
        async with cluster:
            from runtime.graph import flatten_keys

            flat = flatten_keys(keys)
            values = list(await cluster.compute(dsk, list(flat), **options))
            where: str | None = None
            for i, (key, value) in enumerate(zip(flat, values, strict=True)):
                if isinstance(value, File):
                    if where is None:
                        where = _files_dir(files_to)
                    dest = os.path.join(where, f"{i}-{value.name}")
                    values[i] = await cluster.download(Future(key, cluster), dest)
            return _pack(keys, dict(zip(flat, values, strict=True)))

    if not _in_running_loop():
        # Not inside the check's `except`: what this raises would have its RuntimeError
        # as __context__, in place of the task's own.
        return anyio.run(main, backend="asyncio")
    helper = _GetHelper(main)
    try:
        helper.wait(caller=asyncio.current_task())
    except BaseException:  # Ctrl-C in the caller's thread: end the computation first
        helper.cancel()
        try:
            stopped = helper.wait(_GET_STOP_LIMIT)
        except KeyboardInterrupt:  # Ctrl-C again: do not wait any longer
            stopped = False
        if not stopped:
            _log.warning(
                "runtime.get was interrupted and its computation is still stopping in "
                "the background", limit=_GET_STOP_LIMIT,
            )  # fmt: skip
        raise
    return helper.result()
