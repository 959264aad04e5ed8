"""Policy interfaces, the read-only views policies get, and the registry of policies.

What lives here: one ``Protocol`` per policy kind (priority, placement, retry, memory), the
views they read, :class:`RetryDecision`, and :class:`PolicyRegistry` (policies by kind
and name, so they can be swapped at runtime by a message naming them). Concrete
policies live in the sibling modules.

Rule: a policy proposes, the core decides. A policy gets read-only views and returns a
value; it never changes scheduler state. The core validates what comes back (a
placement outside the candidates, or a policy that raises, falls back to the default
and is counted as a policy error).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import numbers
import types
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Protocol, Union, get_args, get_origin, runtime_checkable

from policies.survival import Survival
from runtime.client_ids import client_name
from runtime.errors import (
    PolicyCreateError,
    PolicyKindError,
    PolicyParamsError,
    UnknownPolicyError,
    did_you_mean,
)
from runtime.messages import PolicyInfo, SetPolicyRequest

__all__ = [
    "KINDS",
    "MAX_RETRY_DELAY",
    "METHODS",
    "NOT_LOADABLE",
    "REGISTRY",
    "RISE_WINDOW",
    "CategoryStats",
    "CategoryStatsView",
    "DataLocality",
    "MemoryPolicy",
    "PlacementPolicy",
    "PolicyParamsError",
    "PolicyRegistry",
    "PoolView",
    "PriorityPolicy",
    "ReplicationPolicy",
    "RetryDecision",
    "RetryPolicy",
    "ScalingPolicy",
    "SpeculationPolicy",
    "TaskView",
    "WalltimeLoss",
    "WorkerView",
    "check_kind",
    "check_params",
    "defaults_of",
    "param_values",
    "params_of",
    "params_text",
    "policies_toml",
    "policy_change_fields",
    "register",
]

KINDS = ("priority", "placement", "retry", "memory", "replication", "scaling", "speculation")

RECENT = 256  #: ok tries' durations kept per category for its percentiles
#: ok tries' RSS rises kept per category: memory admission uses the largest of these
#: latest ones (:attr:`CategoryStats.rss_rise`), so one past outlier stops counting
#: after this many tries of the category (docs/memory.md#memory-admission-by-rss-rise)
RISE_WINDOW = 16
#: output sizes kept per category: disk-aware placement expects the largest of these
#: latest ones (:attr:`CategoryStats.out_recent`), so one run's large outputs stop
#: steering a long-lived manager's later runs after this many outputs of the category
#: (docs/files.md#disks)
OUTPUT_WINDOW = 16


def _window_max(window: deque[int], value: int, top: int) -> int:
    """Append ``value`` to ``window`` (bounded) and return its new largest, ``top``
    being its largest before: O(1), but O(len) when the value leaving it was ``top``."""
    gone = window[0] if len(window) == window.maxlen else None
    window.append(value)
    if value >= top:
        return value
    if gone is not None and gone >= top:
        return max(window)
    return top


@dataclasses.dataclass(slots=True)
class CategoryStats:
    """What the scheduler learned about one task category (key prefix) so far."""

    count: int = 0  #: tasks finished ok
    errors: int = 0  #: tries that raised
    lost: int = 0  #: tries lost with their worker
    oom: int = 0  #: tries killed at a worker's memory terminate fence
    total_duration: float = 0.0  #: seconds, over ok tries
    max_duration: float = 0.0
    total_nbytes: int = 0  #: output bytes (produced), over ok tries
    consumed_nbytes: int = 0  #: input bytes (consumed), over ok tries
    #: highest worker RSS seen while (sampled) or right after a task of this category ran
    peak_rss: int = 0
    #: largest rise of the worker's RSS while one ran, ever: its peak (sampled while it
    #: ran, or right after it) less its RSS right before
    max_rss_growth: int = 0
    #: the largest rise of the latest :data:`RISE_WINDOW` ok tries whose rise was
    #: measured (:meth:`add_rise`): memory admission holds a task of the category back
    #: from a worker with too little room for it beside its running tries
    rss_rise: int = 0
    #: those latest rises, oldest first
    rises: deque[int] = dataclasses.field(default_factory=lambda: deque(maxlen=RISE_WINDOW))
    #: largest output seen: of ok tries and of tries whose output did not fit on their
    #: worker's disk (``disk-full``); disk-aware placement expects outputs this large
    max_nbytes: int = 0
    #: the largest of the latest :data:`OUTPUT_WINDOW` outputs (ok tries and
    #: ``disk-full`` ones, :meth:`add_output`): what disk-aware placement expects
    out_recent: int = 0
    #: those latest output sizes, oldest first
    outs: deque[int] = dataclasses.field(default_factory=lambda: deque(maxlen=OUTPUT_WINDOW))
    disk_full: int = 0  #: tries whose output did not fit on their worker's disk
    #: the latest ok tries' durations (seconds), for :attr:`p90_duration`
    recent: deque[float] = dataclasses.field(default_factory=lambda: deque(maxlen=RECENT))

    def add_rise(self, growth: int) -> None:
        """An ok try raised its worker's RSS by ``growth``: the all-time
        ``max_rss_growth`` and the window's ``rss_rise`` follow it. O(1), but
        O(:data:`RISE_WINDOW`) when the rise leaving the window was the largest."""
        if growth > self.max_rss_growth:
            self.max_rss_growth = growth
        self.rss_rise = _window_max(self.rises, growth, self.rss_rise)

    def add_output(self, nbytes: int) -> None:
        """A try wrote an output of ``nbytes`` (ok, or ``disk-full``): the all-time
        ``max_nbytes`` and the window's ``out_recent`` follow it."""
        if nbytes > self.max_nbytes:
            self.max_nbytes = nbytes
        self.out_recent = _window_max(self.outs, nbytes, self.out_recent)

    @property
    def mean_duration(self) -> float:
        return self.total_duration / self.count if self.count else 0.0

    @property
    def p90_duration(self) -> float:
        """90% of the latest ok tries took at most this long (0.0: none yet)."""
        recent = sorted(self.recent)
        return recent[min(len(recent) - 1, int(0.9 * len(recent)))] if recent else 0.0

    @property
    def mean_nbytes(self) -> float:
        return self.total_nbytes / self.count if self.count else 0.0

    @property
    def production_ratio(self) -> float:
        """Bytes produced per byte consumed (``inf`` for roots that consume nothing):
        far above 1 marks a memory *producer*, such as a loader."""
        if self.consumed_nbytes:
            return self.total_nbytes / self.consumed_nbytes
        return float("inf") if self.total_nbytes else 0.0


class CategoryStatsView:
    """A read-only view of one :class:`CategoryStats`, as policies get it: the same
    attributes (properties, not a ``__getattr__``: policies read them on the hot path),
    live, and none of them can be set."""

    __slots__ = ("_stats",)
    _stats: CategoryStats

    def __init__(self, stats: CategoryStats) -> None:
        object.__setattr__(self, "_stats", stats)

    @property
    def count(self) -> int:
        return self._stats.count

    @property
    def errors(self) -> int:
        return self._stats.errors

    @property
    def lost(self) -> int:
        return self._stats.lost

    @property
    def oom(self) -> int:
        return self._stats.oom

    @property
    def total_duration(self) -> float:
        return self._stats.total_duration

    @property
    def max_duration(self) -> float:
        return self._stats.max_duration

    @property
    def p90_duration(self) -> float:
        return self._stats.p90_duration

    @property
    def recent(self) -> tuple[float, ...]:
        return tuple(self._stats.recent)

    @property
    def total_nbytes(self) -> int:
        return self._stats.total_nbytes

    @property
    def consumed_nbytes(self) -> int:
        return self._stats.consumed_nbytes

    @property
    def peak_rss(self) -> int:
        return self._stats.peak_rss

    @property
    def max_rss_growth(self) -> int:
        return self._stats.max_rss_growth

    @property
    def rss_rise(self) -> int:
        return self._stats.rss_rise

    @property
    def rises(self) -> tuple[int, ...]:
        return tuple(self._stats.rises)

    @property
    def max_nbytes(self) -> int:
        return self._stats.max_nbytes

    @property
    def out_recent(self) -> int:
        return self._stats.out_recent

    @property
    def outs(self) -> tuple[int, ...]:
        return tuple(self._stats.outs)

    @property
    def disk_full(self) -> int:
        return self._stats.disk_full

    @property
    def mean_duration(self) -> float:
        return self._stats.mean_duration

    @property
    def mean_nbytes(self) -> float:
        return self._stats.mean_nbytes

    @property
    def production_ratio(self) -> float:
        return self._stats.production_ratio

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"category statistics are read-only (cannot set {name!r})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"category statistics are read-only (cannot delete {name!r})")

    def __repr__(self) -> str:
        return f"<CategoryStatsView {self._stats!r}>"


#: causes of a worker loss that say nothing about the tasks it ran: it was drained
#: (asked to leave), preempted (its batch job taken back), went silent while its batch
#: job was suspended (suspended), reached its walltime, or an operator stopped it
#: (shutdown).
#: Other losses (a crash, a lost connection, an exit code) make its tasks suspects.
BENIGN_LOSSES: frozenset[str] = frozenset(
    {"drained", "preempted", "suspended", "walltime", "shutdown"}
)

#: The ``cause`` a retry policy is given with outcome ``error`` when the task did not
#: start because its function or an argument could not be loaded on its worker (its
#: module is not importable there: :class:`~runtime.errors.TaskNotLoadable`); for
#: another error the cause is None.
NOT_LOADABLE = "not-loadable"

#: Causes of a worker's end that were chosen, not suffered: its life is *censored* in
#: the pool's survival estimate (``policies/survival.py``), not counted as a death.
ON_PURPOSE: frozenset[str] = frozenset({"drained", "walltime", "shutdown"})


@dataclasses.dataclass(frozen=True, slots=True)
class WalltimeLoss:
    """A try lost to its worker's walltime (cause ``walltime``), and the room its pool
    gives: it had executed ``ran`` seconds (its worker said so as it left); a worker
    of its pool lives at most ``walltime`` seconds (from joining to its deadline, the
    longest of its pool's workers the scheduler knows) and is drained ``drain`` seconds
    before its deadline. ``whole_life``: it executed at least ``walltime - drain`` (and
    at least half the walltime): it started in the first ``drain`` seconds of its
    worker's life, the most any try gets in this pool short of an idle fresh worker's
    first second, and did not finish. A try that started later in its worker's life
    (behind other tasks, on a worker that had worked a while) is not ``whole_life``:
    a fresh worker may give it the time."""

    ran: float
    walltime: float
    drain: float
    pool: str

    @property
    def whole_life(self) -> bool:
        return self.ran >= max(self.walltime - self.drain, self.walltime / 2)


class TaskView(Protocol):
    """Read-only view of a task for policies."""

    @property
    def key(self) -> Any: ...
    @property
    def category(self) -> str: ...
    @property
    def order(self) -> int: ...
    @property
    def user_priority(self) -> float: ...
    @property
    def generation(self) -> int: ...
    @property
    def client(self) -> str:
        """The name of the client whose submission brought it (``Cluster(...,
        name=)``, by default that process's user name; "" if not known). The first
        client to submit a key owns its task: another client submitting the same key
        shares it."""
        ...

    @property
    def turn(self) -> float:
        """Its client's turn: a client's n-th task (in graph order) from when its
        submission came has a turn n further on than the turn being served then. The
        ``fair`` priority runs the smallest first, so clients take turns."""
        ...

    @property
    def retries_left(self) -> int: ...
    @property
    def charged_tries(self) -> int:
        """Retries so far that spent the user's budget (``retries=`` less
        :attr:`retries_left`)."""
        ...

    @property
    def lost_tries(self) -> int: ...
    @property
    def lost_since_saved(self) -> int:
        """Of :attr:`lost_tries`, the latest in a row that lost every checkpoint their
        try saved, or saved none (for a task that never checkpoints: all of them). A
        loss after which a checkpoint of the try survives, progress its retry resumes
        from, starts the count again; the default retry policy bounds this count by
        ``max_lost``, so a task that checkpoints keeps going over any number of
        preemptions and walltimes while each of its tries saves some work."""
        ...

    @property
    def oom_tries(self) -> int:
        """Tries killed at a worker's memory terminate fence."""
        ...

    @property
    def disk_full_tries(self) -> int:
        """Tries whose output did not fit on their worker's disk."""
        ...

    @property
    def crash_tries(self) -> int:
        """Tries lost with a worker that ended unexpectedly (not drained or
        preempted: see :data:`BENIGN_LOSSES`): the task may be what killed it. A try
        that surely waited in the worker's queue (the worker had said that other tries
        filled all its threads, or, leaving, that it did not execute) is not one."""
        ...

    @property
    def producer(self) -> bool:
        """Marked a memory producer by the memory policy when it was queued."""
        ...

    @property
    def pool(self) -> str | None:
        """The pool it runs in (``None``: any)."""
        ...

    @property
    def ran_for(self) -> float:
        """Seconds its latest try ran (from being sent to a worker to its end; 0 for a
        try lost with a leaving worker that had not started it)."""
        ...

    @property
    def saved_work(self) -> float | None:
        """Seconds of its execution that its newest checkpoint holds, the one its next
        try resumes from (its saves so far, over all its tries; None: it saved none, or
        none survived the loss of its workers' disks: the next try starts over)."""
        ...

    @property
    def unsaved_for(self) -> float:
        """Seconds of its latest try's run (:attr:`ran_for`) that its newest surviving
        checkpoint does not hold: the try's run since that checkpoint was saved, the
        work a retry does again. :attr:`ran_for` when no checkpoint of the try's run
        survived (and for a task that never checkpoints)."""
        ...

    @property
    def survival(self) -> Survival:
        """How long the workers of its pool live (Kaplan-Meier; empty when unknown)."""
        ...

    @property
    def walltime_loss(self) -> WalltimeLoss | None:
        """Its latest try's loss to its worker's walltime (None: not lost so, or it is
        not known how long it executed, or a worker that could run it has no walltime,
        or it left a checkpoint that a retry resumes from)."""
        ...

    @property
    def stats(self) -> CategoryStatsView | None:
        """What is known of its category's tasks so far (None: nothing yet)."""
        ...

    @property
    def dep_locations(self) -> tuple[tuple[frozenset[str], int], ...]:
        """(workers holding it, bytes) for each dependency, in a tuple."""
        ...

    @property
    def dependents(self) -> tuple[TaskView, ...]:
        """Views of the tasks that read this one's output."""
        ...

    @property
    def error_type(self) -> str | None:
        """For the retry policy: the name of the type of the exception the failing try
        ended with (``ValueError``; as the monitoring database's ``tries.error_type``
        and the metrics' ``cause`` name it). None for a try lost with its worker, and
        for the other policies."""
        ...

    @property
    def error_types(self) -> tuple[str, ...]:
        """For the retry policy: the names of that exception's type and its base
        classes, its own first (``('FileNotFoundError', 'OSError', 'Exception',
        'BaseException')``): ``"OSError" in task.error_types`` is ``isinstance``.
        Empty when :attr:`error_type` is None."""
        ...

    @property
    def error_message(self) -> str | None:
        """For the retry policy: that exception's text (``str()``), at most 2,000
        characters; None when :attr:`error_type` is None."""
        ...


class WorkerView(Protocol):
    """Read-only view of a worker for policies."""

    @property
    def id(self) -> str: ...
    @property
    def cores(self) -> int: ...
    @property
    def memory(self) -> int: ...
    @property
    def pool(self) -> str: ...
    @property
    def n_processing(self) -> int: ...
    @property
    def slots(self) -> int: ...
    @property
    def limit(self) -> int:
        """Tasks it may hold when they are short (at least ``slots``)."""
        ...

    @property
    def throttled(self) -> bool:
        """Past its memory throttle fence (deferring producers)."""
        ...


@runtime_checkable
class PriorityPolicy(Protocol):
    """Orders ready tasks: the smallest tuple runs first."""

    def priority(self, task: TaskView, stats: Mapping[str, CategoryStats]) -> tuple[float, ...]: ...


@runtime_checkable
class PlacementPolicy(Protocol):
    """Picks one of ``candidates`` (never empty; all have a free slot) for ``task``.

    A placement policy may also implement the hooks of :class:`DataLocality`; the
    scheduler core asks each one the policy has, and a rule whose hook is missing is
    off. ``policies.placement.KeepsDataLocal`` holds the default hooks.
    """

    def choose(
        self,
        task: TaskView,
        candidates: Sequence[WorkerView],
        stats: Mapping[str, CategoryStats],
    ) -> WorkerView: ...


@runtime_checkable
class DataLocality(Protocol):
    """Optional placement hooks that keep consumers with their data, beyond ``choose``.

    Each proposes; the core asks only where its own rules allow the move (the worker is
    known, not draining, in the task's pool, fits its resources and memory admission,
    holds fewer than ``limit`` tasks, and for ``partner`` is not throttled and holds at
    most ``slots`` tasks), then checks the answer: ``partner`` and ``stays_with_data``
    must return a ``bool``, ``data_holder`` one of ``holders`` (or its ``id``) or
    ``None``. Any other answer, or a hook that raises, counts as a policy error and the
    move is not made.
    """

    def partner(self, task: TaskView, worker: WorkerView, next_root: TaskView) -> bool:
        """``task``, a root producer, was just sent to ``worker``; ``next_root`` is the
        root next in line in the same ready queue. True sends it to ``worker`` too,
        one task past the worker's slots if need be."""
        ...

    def stays_with_data(self, task: TaskView, worker: WorkerView) -> bool:
        """Consumer ``task`` just became ready and every input is on ``worker`` (which
        made the last one). True runs it there now, past the worker's slots if need
        be."""
        ...

    def data_holder(self, task: TaskView, holders: Sequence[WorkerView]) -> WorkerView | None:
        """Consumer ``task`` is next to place; ``holders`` (by id; never empty) are busy
        workers with no free slot that hold every input of it. The one returned joins
        the candidates given to ``choose``; ``None``: it waits for a free slot. When it
        would be the only candidate, it takes ``task`` only if ``stays_with_data``
        agrees too."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class RetryDecision:
    """What to do with a task whose try did not end ``ok``.

    ``retry``: run it again; ``charge``: the retry spends the user's retry budget;
    ``behind``: the retry goes behind work that has not been tried yet; ``pool``: the
    task moves to that pool (e.g. off a preemptible one) for this and later tries (a
    pool's name: a move to ``""`` or ``"*"``, the key of any pool, is a policy error and
    the task stays in its pool); ``delay``: seconds the retry waits before it is ready
    (a backoff; 0: at once). The scheduler core holds the task that long (not ready, not
    placed), at most
    :data:`MAX_RETRY_DELAY` (a longer one is cut to it); a delay that is not a number
    at least 0 is a policy error and the retry is ready at once.
    """

    retry: bool
    charge: bool = False
    behind: bool = True
    reason: str = ""
    pool: str | None = None  #: run the retry in this pool instead (a fallback)
    delay: float = 0.0  #: seconds before the retry is ready (0: at once)


#: the longest a retry is held before it is ready (seconds): a longer
#: :attr:`RetryDecision.delay` is cut to it
MAX_RETRY_DELAY = 3600.0


@runtime_checkable
class RetryPolicy(Protocol):
    """Decides per outcome (``error``, ``worker-lost``, ``timeout``, ``oom``) whether to
    retry."""

    def decide(self, task: TaskView, outcome: str, cause: str | None) -> RetryDecision: ...


@runtime_checkable
class MemoryPolicy(Protocol):
    """Says which categories produce memory, and whether producers yield under pressure
    (see ``policies/memory.py``). ``yields`` is asked whenever the core fills free
    slots, with ``pressure`` true while some worker is past its throttle fence."""

    def producer(self, category: str, stats: CategoryStats | None, root: bool) -> bool: ...

    def yields(self, pressure: bool) -> bool: ...


@runtime_checkable
class ReplicationPolicy(Protocol):
    """Proposes how many temporary replicas a task's output gets on other workers, so
    that losing its worker does not mean computing it again (see
    ``policies/replication.py``). Asked once per output, when its task finishes ok.

    ``inputs`` is the scheduler's estimate, in seconds of work, of remaking the task's
    inputs that will not be kept (released ones, and those only this task needed), each
    with its own inputs in turn; ``workers`` how many workers the cluster has. The core
    decides: it makes at most ``workers - 1`` replicas (never two on one worker), only
    on workers that take new tasks and have memory room for the output, and drops them
    with the output when it is released.

    Optional: an attribute ``min_cost`` (seconds). When a task finishes, the core does
    not ask the policy if its category's mean duration plus ``inputs`` is below it (the
    answer would be 0): the call is skipped on the hot path. Without it, the policy is
    asked for every finished task."""

    def replicas(self, task: TaskView, inputs: float, workers: int) -> int: ...


@runtime_checkable
class SpeculationPolicy(Protocol):
    """Proposes speculative copies of long-running tasks (see
    ``policies/speculation.py``). ``copy`` is asked about a running task only while
    some worker is idle (``idle`` of them: they run nothing and no ready task can go to
    them) and the task has fewer than ``max_copies`` copies running; ``running_for`` is
    how many seconds its first try has executed on its worker (asked only once its
    worker said it executes: never of a try waiting in a worker's queue). True
    proposes one more copy.

    The core decides: a copy goes only to an idle worker that may run the task (pool,
    resources, memory admission, free disk), never to one running it already. The
    first copy or try to finish ok wins; the others are cancelled and their outputs
    dropped. A ``max_copies`` of 0 turns speculation off (``copy`` is never asked)."""

    max_copies: int

    def copy(self, task: TaskView, running_for: float, idle: int) -> bool: ...


Factory = Callable[..., Any]

#: the method(s) a policy of each kind must have (optional hooks are not listed): a
#: policy class lacking one is refused when it is registered, and any policy lacking
#: one when it is set (:class:`PolicyKindError`)
METHODS: dict[str, tuple[str, ...]] = {
    "priority": ("priority",),
    "placement": ("choose",),
    "retry": ("decide",),
    "memory": ("producer", "yields"),
    "replication": ("replicas",),
    "scaling": ("desired",),
    "speculation": ("copy",),
}


def check_kind(kind: str, name: str, policy: Any) -> None:
    """:class:`PolicyKindError` unless ``policy`` has every method of ``kind``
    (:data:`METHODS`), naming those it lacks and the other kinds' methods it has."""
    missing = [m for m in METHODS.get(kind, ()) if not callable(getattr(policy, m, None))]
    if missing:
        has = sorted(
            {m for ms in METHODS.values() for m in ms if callable(getattr(policy, m, None))}
        )
        raise PolicyKindError(kind, name, missing, has)


class PolicyRegistry:
    """Policies by kind and name. ``create`` builds one from its name and parameters."""

    def __init__(self) -> None:
        self._factories: dict[str, dict[str, Factory]] = {k: {} for k in KINDS}

    def register(self, kind: str, name: str) -> Callable[[Factory], Factory]:
        """Decorator: register ``factory(**params)`` as the ``kind`` policy ``name``.

        A class lacking a method of ``kind`` (:data:`METHODS`) is refused here, with
        :class:`PolicyKindError` naming it, unless it defines ``__getattr__`` (its
        instances may have it then); what another factory (a function) makes is
        checked when it is created."""
        if kind not in self._factories:
            raise UnknownPolicyError("kind of", kind, KINDS)

        def add(factory: Factory) -> Factory:
            if inspect.isclass(factory) and not hasattr(factory, "__getattr__"):
                check_kind(kind, name, factory)
            self._factories[kind][name] = factory
            return factory

        return add

    def names(self, kind: str) -> list[str]:
        if kind not in self._factories:
            raise UnknownPolicyError("kind of", kind, KINDS)
        return sorted(self._factories[kind])

    def defaults(self, kind: str) -> dict[str, dict[str, str]]:
        """Per name of ``kind``, its parameters with their defaults (:func:`defaults_of`):
        what ``set_policy`` with no parameters makes, and what a parameter given
        changes. ``policy list`` shows them; ``PolicyInfo.defaults`` carries them."""
        return {name: defaults_of(self._factories[kind][name]) for name in self.names(kind)}

    def info(self, kind: str, policy: Any) -> PolicyInfo:
        """What ``policy list`` and ``set_policy`` answer of ``policy``, in force as the
        ``kind`` policy: its name and parameters, the names one may switch to and each
        one's parameters with their defaults."""
        name = getattr(policy, "name", type(policy).__name__)
        return PolicyInfo(
            kind, name, tuple(self.names(kind)), param_values(policy), self.defaults(kind)
        )

    def create(self, kind: str, name: str, params: Mapping[str, Any] | None = None) -> Any:
        """A new policy instance; typed errors for an unknown kind, name or parameters."""
        if kind not in self._factories:
            raise UnknownPolicyError("kind of", kind, KINDS)
        factory = self._factories[kind].get(name)
        if factory is None:
            raise UnknownPolicyError(kind, name, self._factories[kind])
        checked = check_params(kind, name, factory, params or {})
        try:
            policy = factory(**checked)
        except (TypeError, ValueError) as exc:
            raise PolicyParamsError(kind, name, str(exc)) from exc
        except Exception as exc:  # the policy's own trouble: say which policy, and how
            raise PolicyCreateError(kind, name, checked, f"{type(exc).__name__}: {exc}") from exc
        check_kind(kind, name, policy)
        policy.name = name
        policy.params = checked
        return policy


# ----------------------------------------------------------------------------- parameters

#: the kinds of value a parameter's annotation may admit, and how a message names them:
#: (the phrase when the parameter has no wording of its own, the type's name)
_KINDS: dict[Any, tuple[str, str]] = {
    bool: ("true or false (a bool)", "bool"),
    int: ("a whole number (an int)", "int"),
    float: ("a number (a float or an int)", "float or int"),
    str: ("text (a str)", "str"),
    Mapping: ("a mapping (a dict)", "dict"),
    Sequence: ("a list", "list"),
    None: ("None (null in the console)", "None"),
}
_MAPPINGS = (Mapping, dict)
_SEQUENCES = (Sequence, list, tuple)


def _admits(hint: Any) -> tuple[tuple[Any, ...], str | None] | None:
    """The kinds of value (keys of :data:`_KINDS`) a parameter annotated ``hint`` takes,
    in order, and its own wording (the first string of an ``Annotated``) or None; None
    when the annotation is not one the registry checks (``Any``, a class, ...)."""
    wording = None
    if get_origin(hint) is Annotated:
        wording = next((m for m in hint.__metadata__ if isinstance(m, str)), None)
        hint = get_args(hint)[0]
    members = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    kinds: list[Any] = []
    for member in members:
        base = get_origin(member) or member
        if base is None or base is type(None):
            kind: Any = None
        elif base in (bool, int, float, str):
            kind = base
        elif base in _MAPPINGS:
            kind = Mapping
        elif base in _SEQUENCES:
            kind = Sequence
        else:
            return None
        if kind not in kinds:
            kinds.append(kind)
    return tuple(kinds), wording


def _admit(value: Any, kinds: tuple[Any, ...]) -> tuple[bool, Any]:
    """Whether ``value`` is of one of ``kinds``, and the value to pass on: a whole
    float (``3.0``) for an ``int`` becomes that int; a bool is only ever a bool."""
    if value is None:
        return None in kinds, value
    if isinstance(value, bool):
        return bool in kinds, value
    if isinstance(value, numbers.Integral):
        if int in kinds:
            return True, int(value)
        return float in kinds, value
    if isinstance(value, numbers.Real):
        if float in kinds:
            return True, value
        whole = int in kinds and float(value).is_integer()
        return whole, int(float(value)) if whole else value
    if isinstance(value, str):
        return str in kinds, value
    if isinstance(value, Mapping):
        return Mapping in kinds, value
    if isinstance(value, (list, tuple)):
        return Sequence in kinds, value
    return False, value


def _wanted(param: str, value: Any, kinds: tuple[Any, ...], wording: str | None) -> str:
    """What is wrong with ``value`` for ``param`` and what to give instead."""
    if wording is not None:
        wanted = f"{wording} ({' or '.join(_KINDS[k][1] for k in kinds)})"
    else:
        phrases = [_KINDS[k][0] for k in kinds]
        wanted = ", ".join(phrases[:-1]) + (" or " if len(phrases) > 1 else "") + phrases[-1]
    text = f"{param} must be {wanted}, got {value!r} ({type(value).__name__})"
    if bool in kinds:
        text += (
            f": write {param}=true or {param}=false (JSON, lower case, in the console; "
            "True or False in Python)"
        )
    return text


def check_params(
    kind: str, name: str, factory: Factory, params: Mapping[str, Any]
) -> dict[str, Any]:
    """``params`` checked against the annotations of ``factory``'s signature (the
    class's ``__init__``), the one place every policy's parameters are checked by type.

    ``bool`` takes only ``True``/``False`` (not ``"False"``, ``"no"``, 0 or 1); ``int``
    an int or a whole float (passed on as an int), not a bool or text; ``float`` an int
    or a float, not a bool or text; ``str`` text; ``Mapping``/``dict`` a mapping;
    ``Sequence``/``list``/``tuple`` a list or tuple; ``None`` None; a union any of its
    members. ``Annotated[int, "a whole number of blocks"]`` words the message. Other
    annotations (``Any``, a class) and parameters without one are left to the factory,
    and so are names the signature does not have when it takes ``**kwargs``; without
    it such a name is refused here, with the closest parameter it has and the list of
    them. Range checks stay in the factory.

    Returns the parameters to call ``factory`` with; raises :class:`PolicyParamsError`
    naming every bad parameter, the value given and the type wanted.
    """
    out = dict(params)
    if not out:
        return out
    try:
        signature = inspect.signature(factory, eval_str=True)
    except (TypeError, ValueError, NameError, AttributeError, SyntaxError):
        return out  # no signature, or annotations that cannot be read: the factory checks
    problems = []
    named = [
        p.name for p in signature.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    ]  # fmt: skip
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    for param, value in params.items():
        declared = signature.parameters.get(param)
        if declared is None and not takes_any:
            which = f"its parameters: {', '.join(named)}" if named else "it takes none"
            problems.append(f"no parameter {param!r}{did_you_mean(param, named)} ({which})")
            continue
        if declared is None or declared.kind not in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        ):
            continue
        if declared.annotation is inspect.Parameter.empty:
            continue
        admits = _admits(declared.annotation)
        if admits is None:
            continue
        kinds, wording = admits
        ok, out[param] = _admit(value, kinds)
        if not ok:
            problems.append(_wanted(param, value, kinds, wording))
    if problems:
        raise PolicyParamsError(kind, name, "; ".join(problems))
    return out


#: what :func:`defaults_of` shows for a parameter that has no default (it must be given)
REQUIRED = "(required)"


def defaults_of(factory: Factory) -> dict[str, str]:
    """The parameters ``factory`` takes by name, in its signature's order, each with its
    default's ``repr`` (:data:`REQUIRED` if it has none); empty when it takes none, or
    its signature cannot be read (then its parameters are not known here either)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return {}
    return {
        p.name: REQUIRED if p.default is inspect.Parameter.empty else repr(p.default)
        for p in signature.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }


def params_of(policy: Any) -> dict[str, str]:
    """The parameters ``policy`` was created with (none: its defaults), each value as
    its ``repr``: what ``WorkerLost`` names (the status, the dashboard and
    ``PolicyInfo`` carry them as values: :func:`param_values`)."""
    return {k: repr(v) for k, v in sorted(dict(getattr(policy, "params", None) or {}).items())}


def _plain(value: Any) -> bool:
    """``value`` is plain data that any connection carries as is (a console's takes no
    pickles): None, a bool, a number, text, or a list, tuple or str-keyed dict of them;
    as the codec carries numbers, a finite float and an int of 64 bits (``inf``, a
    recompute-cost ``threshold`` that never replicates, would fail the whole status
    reply that carries it)."""
    if value is None or isinstance(value, bool | str):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, int):
        return -(2**63) <= value < 2**64
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


def param_values(policy: Any) -> dict[str, Any]:
    """The parameters ``policy`` was created with (none: its defaults), each as its
    value, what ``set_policy(kind, name, **params)`` takes back; a value that is not
    plain data (:func:`_plain`: an object of a policy's own) as its ``repr``. What
    ``PolicyInfo.params`` and the status's ``policy_params`` (the autoscaler's too)
    carry."""
    params = dict(getattr(policy, "params", None) or {})
    return {k: v if _plain(v) else repr(v) for k, v in sorted(params.items())}


def values_text(values: Mapping[str, Any] | None) -> str:
    """:func:`param_values`' answer as the console shows it: ``tie='id', spare=2``."""
    return ", ".join(f"{k}={v!r}" for k, v in (values or {}).items())


def params_text(params: Mapping[str, str] | None) -> str:
    """Parameters given as reprs (:meth:`PolicyRegistry.defaults`) as the console shows
    them: ``spare=2, lookahead=60`` (empty for none)."""
    return ", ".join(f"{k}={v}" for k, v in (params or {}).items())


def _toml_key(key: str) -> str:
    return key if key and all(c.isalnum() or c in "_-" for c in key) else json.dumps(key)


def _toml_value(value: Any) -> str:
    """``value`` (plain data, :func:`_plain`) as TOML; None, which TOML has not, as the
    text ``"None"`` (a policy's None is mostly its default: leave it out)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{ " + items + " }" if items else "{}"
    return json.dumps(value if isinstance(value, str) else repr(value))


def policies_toml(policies: Mapping[str, tuple[str, Mapping[str, Any]]]) -> str:
    """The ``[policies]`` table of a configuration file that starts with ``policies``
    (per kind: its name and parameters, :func:`param_values`), as text."""
    plain = [f"{kind} = {json.dumps(name)}" for kind, (name, params) in policies.items()
             if not params]  # fmt: skip
    lines = ["[policies]", *plain] if plain else []
    for kind, (name, params) in policies.items():
        if params:
            lines += ["", f"[policies.{kind}]", f"name = {json.dumps(name)}"]
            lines += [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in params.items()
                      if v is not None]  # fmt: skip
    return "\n".join(lines).lstrip("\n")


def policy_change_fields(msg: SetPolicyRequest) -> dict[str, Any]:
    """The fields of the ``policy changed`` line the manager logs for ``msg`` (a warning
    while other clients are connected): the ``kind``, ``name`` and ``params`` set,
    ``by`` (the asking client's or console's id, ``?`` when not said) and ``client``
    (that client's name)."""
    by = msg.by or "?"
    return {"kind": msg.kind, "name": msg.name, "params": msg.params, "by": by,
            "client": client_name(by)}  # fmt: skip


#: The registry Corral's actors use unless given another.
REGISTRY = PolicyRegistry()
register = REGISTRY.register


# ----------------------------------------------------------------------------- scaling


@dataclasses.dataclass(frozen=True, slots=True)
class PoolView:
    """What the scaling policy sees of one pool (a snapshot the autoscaler core makes)."""

    pool: str
    target: int  #: blocks the user asked for (``scale``, or the start configuration)
    blocks: int  #: live blocks that count towards the pool (not being scaled in)
    requested: int  #: blocks asked of the provider, not yet started
    retiring: int  #: blocks being scaled in (draining)
    queued: int | None = None  #: ready tasks this pool may run, if the autoscaler knows


@runtime_checkable
class ScalingPolicy(Protocol):
    """Proposes how many blocks a pool should have; the autoscaler core checks the
    answer (a whole number from 0 to its ``max_blocks``) and keeps the replacement
    budget. ``PoolView.queued`` is there once the autoscaler has read the scheduler's
    counts (every tick); ``uses_queues = True`` says that a policy reads it."""

    def desired(self, pool: PoolView) -> int: ...
