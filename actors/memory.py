"""A worker's memory governor: the pure core behind "pause for a bit".

What lives here: :class:`MemoryConfig` (the fences and intervals), the events the
governor takes and the commands it returns, and :class:`MemoryGovernor` with its one
mutator ``handle(*events) -> list[Command]``. No clock, no threads, no I/O: events carry
``now``; a deferral is a command the worker's shell turns into a timer.

The fences, as fractions of the worker's memory ``limit`` (defaults in brackets; see
docs/memory.md for the picture):

- ``spill`` [0.6]: at or above it, the worker moves stored outputs to disk, least
  recently used first, down to 90% of the fence (:class:`Spill` says how many bytes).
  Spilling comes first so that a worker holding more results than fit (a persist larger
  than memory) keeps going instead of stopping. Spilling moves outputs, so it is decided
  by the outputs' bytes in memory (``stored``, the store's *managed* memory) as well as
  by the RSS: it asks for no more than ``stored``, and when the memory that is not
  outputs (``rss - stored``: the interpreter, libraries, running tasks' temporaries,
  memory the allocator keeps) is at or past the spill target by itself, so that writing
  every output would leave the worker past its fence anyway, an output made less than
  ``SPILL_GRACE`` seconds ago stays in memory (:attr:`Spill.keep`) while the RSS is
  under the terminate fence: its consumer usually comes within that time and would read
  it straight back. Older outputs go as before.
- ``throttle`` [0.7]: at or above it, a task that *produces* memory (the scheduler marks
  it so) is deferred for a short interval that grows each time the same task is
  deferred again (``first_delay`` x ``growth``^k, at most ``max_delay``); consumers and
  everything else keep running, so memory can come down. The worker is *throttled* and
  says so (:class:`Throttled`), so the scheduler stops sending it producers. It resumes
  only once a sample is under the *resume mark*, ``hysteresis`` [0.1] of the limit
  under the fence (never under the spill fence, from which spilling acts): one sample
  just under the fence releases nothing. Deferred tasks then run without waiting for
  their timers, oldest first, as long as the output each is expected to make fits
  under the fence (see below). (In the users' thread of seed 003 a full pause
  deadlocked clusters: here nothing but producers ever waits, and the scheduler's
  watchdog fails a run that cannot move.)

  A producer's *expected output* is the largest of the latest ``OUTPUT_WINDOW`` outputs
  producers of its category made on this worker (0 until one finished: not known).
  One starts only if the RSS plus the expected outputs of the producers started and not
  finished plus its own stays under the fence; else it is deferred: until those
  running end, or, with none running, the worker throttles, even under the fence (and
  spills, under the spill fence too, when moving outputs to disk makes room for it
  alone: :meth:`MemoryGovernor._room`). So released producers do not
  take memory past the fence in a flood, in thread execution too, where nothing else
  would stop them. Except that a worker under the resume mark running no producer
  starts one whose expected output fits under the terminate fence (the limit, with
  that fence off): a task larger than the room under the throttle fence still runs,
  alone.
- ``terminate`` [0.95]: at or above it, the running task whose own process grew most
  since the task began is killed (:class:`Kill`; its try ends ``oom``), not the worker;
  when none grew by the governor's margin, none is (:class:`Spared`): the memory is the
  worker process's, and a kill would only fail a try. Only tasks that run in task
  processes can be killed: the shell reports per-task RSS for those only.

``None`` turns the spill or the terminate fence off.

What the scheduler knows of a worker's memory (the bytes of outputs it holds in memory,
its RSS, its spilled bytes: ``corral_memory_bytes``, ``status()["memory"]``, the
monitoring database, the dashboard) is the worker's latest ``WorkerMemoryReport``. A
worker reports when it starts or stops throttling (:class:`Throttled`), spills, its disk
use moves, or a thread is abandoned; and, besides, when its bytes held in memory or its
RSS moved though none of that happened: :class:`ReportPacing` says when, from the
memory tick, never per task.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Mapping
from typing import Any, Literal

from runtime.errors import MemoryConfigError, did_you_mean, floor_warning

__all__ = [
    "MIN_LIMIT",
    "OUTPUT_WINDOW",
    "SPILL_GRACE",
    "Command",
    "Defer",
    "Event",
    "Finished",
    "Floor",
    "Kill",
    "MemoryConfig",
    "MemoryConfigError",
    "MemoryGovernor",
    "Ready",
    "ReportPacing",
    "Run",
    "Sampled",
    "Spared",
    "Spill",
    "Throttled",
    "Tick",
    "Trim",
    "floor_at_start",
    "limit_too_small",
]

#: The smallest memory limit a worker takes (64 MiB), 0 (the machine's memory) aside. A
#: worker process alone takes about 65-75 MiB of RSS with numpy loaded (docs/memory.md),
#: so under a smaller limit it is past every fence before its first task and every
#: producer ends ``MemoryStalled``: such a limit is a size missing its unit
#: (``--memory 512`` is 512 bytes), refused where it is given.
MIN_LIMIT = 64 * 2**20


def limit_too_small(given: object, limit: int) -> str | None:
    """What is wrong with the memory limit ``limit`` (bytes) read from ``given``: None
    for 0 (the machine's memory) or at least :data:`MIN_LIMIT`; else what was read and
    the unit it likely lacks, to follow the setting's name (``"is 512 bytes; did you
    mean 512MiB? ..."``)."""
    if limit == 0 or limit >= MIN_LIMIT:
        return None
    number = str(given).strip().rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    try:
        unit = "MiB" if float(number) * 2**20 >= MIN_LIMIT else "GiB"
        meant = f"; did you mean {number.strip()}{unit}?"
    except ValueError:
        meant = "."
    return (
        f"is {limit:,} byte{'' if limit == 1 else 's'}{meant} A worker's memory limit is at "
        "least 64 MiB (a worker process alone takes about 65-75 MiB), or 0 for the "
        "machine's memory"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryConfig:
    """How one worker governs its memory. ``limit`` is in bytes; fences are fractions
    of it; intervals are seconds."""

    limit: int
    spill: float | None = 0.6
    throttle: float = 0.7
    terminate: float | None = 0.95
    first_delay: float = 0.05  #: first deferral of a producer
    growth: float = 2.0  #: each further deferral of the same task is this much longer
    max_delay: float = 2.0  #: longest deferral
    #: a throttled worker resumes producers once RSS is this fraction of the limit
    #: under the throttle fence (never under the spill fence)
    hysteresis: float = 0.1
    interval: float = 0.05  #: RSS is sampled this often, besides after every task
    execution: Literal["thread", "process"] = "thread"  #: where tasks run
    spill_dir: str | None = None  #: parent directory for spill files (None: system temp)
    disk_limit: int = 0  #: bytes of spill files at most (0: no limit)
    #: in ``thread`` execution, a worker process whose RSS reaches this fraction of the
    #: limit stops itself, as dask's nanny restarts a worker: the executing task whose
    #: RSS rise is largest ends ``oom``, the rest run elsewhere, and its provider starts
    #: another (None: never; in-process workers never stop themselves)
    exit: float | None = None

    #: options that may be given by name (everything but ``limit``)
    OPTIONS = (
        "spill",
        "throttle",
        "terminate",
        "first_delay",
        "growth",
        "max_delay",
        "hysteresis",
        "interval",
        "execution",
        "spill_dir",
        "disk_limit",
        "exit",
    )

    def __post_init__(self) -> None:
        for name in ("spill", "throttle", "terminate", "first_delay", "growth", "max_delay",
                     "hysteresis", "interval", "disk_limit", "exit"):  # fmt: skip
            value = getattr(self, name)
            off = name in ("spill", "terminate", "exit")
            if value is None and off:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
                also = (
                    ', or None to turn it off ("off" is the command line\'s word for None)'
                    if off
                    else ""
                )
                raise MemoryConfigError(
                    f"{name} must be a number{also}; got {value!r} ({type(value).__name__})"
                )
        if self.limit <= 0:
            raise MemoryConfigError(f"the memory limit must be positive, got {self.limit}")
        if not 0 < self.throttle <= 1:
            raise MemoryConfigError(f"throttle must be in (0, 1], got {self.throttle}")
        if self.spill is not None and not 0 < self.spill <= 1:
            raise MemoryConfigError(f"spill must be in (0, 1] or None, got {self.spill}")
        if self.spill is not None and self.spill > self.throttle:
            raise MemoryConfigError(
                f"spill ({self.spill}) is above throttle ({self.throttle}): spilling comes "
                "before throttling (docs/memory.md), or a worker throttles with outputs it "
                f"could have moved to disk. Lower spill to at most {self.throttle}, raise "
                "throttle, or turn spilling off (None; 'off' on the command line)"
            )
        if self.terminate is not None and not self.throttle < self.terminate <= 1:
            raise MemoryConfigError(
                f"terminate must be above throttle ({self.throttle}) and at most 1, or "
                f"None; got {self.terminate}"
            )
        below = self.terminate if self.terminate is not None else self.throttle
        if self.exit is not None and not below < self.exit < math.inf:
            raise MemoryConfigError(
                f"exit must be above {'terminate' if self.terminate is not None else 'throttle'}"
                f" ({below}) and finite, or None to turn it off; got {self.exit} (a fraction "
                "of the limit, may be over 1: 2.0 stops a thread worker at twice its limit)"
            )
        if self.first_delay <= 0 or self.growth < 1 or self.max_delay < self.first_delay:
            raise MemoryConfigError(
                "deferrals need first_delay > 0, growth >= 1 and max_delay >= first_delay; "
                f"got {self.first_delay}, {self.growth}, {self.max_delay}"
            )
        if not 0 <= self.hysteresis < self.throttle:
            raise MemoryConfigError(
                f"hysteresis must be at least 0 and under throttle ({self.throttle}), got "
                f"{self.hysteresis}"
            )
        if self.interval <= 0:
            raise MemoryConfigError(f"interval must be positive, got {self.interval}")
        if self.execution not in ("thread", "process"):
            raise MemoryConfigError(
                f"execution must be 'thread' or 'process', got {self.execution!r}"
            )
        if self.disk_limit < 0:
            raise MemoryConfigError(f"disk_limit must be >= 0, got {self.disk_limit}")

    @classmethod
    def of(cls, limit: int, options: Mapping[str, Any] | None = None) -> MemoryConfig:
        """``MemoryConfig(limit, **options)``, with a clear error for unknown names."""
        options = dict(options or {})
        unknown = sorted(set(options) - set(cls.OPTIONS))
        if unknown:
            hints = [did_you_mean(name, cls.OPTIONS).removeprefix("; ") for name in unknown]
            named = [f"{n} ({h})" if h else n for n, h in zip(unknown, hints, strict=True)]
            raise MemoryConfigError(
                f"unknown option(s) {', '.join(named)}; known: {', '.join(cls.OPTIONS)}"
            )
        return cls(limit, **options)

    def options(self) -> dict[str, Any]:
        """The settings other than ``limit``, as :meth:`of` takes them."""
        return {name: getattr(self, name) for name in self.OPTIONS}

    def at(self, fraction: float) -> int:
        """Bytes at ``fraction`` of the limit."""
        return int(fraction * self.limit)

    @property
    def resume_at(self) -> int:
        """The resume mark, bytes: a throttled worker resumes producers under it;
        ``hysteresis`` under the throttle fence, never under the spill fence."""
        mark = self.at(self.throttle) - self.at(self.hysteresis)
        return max(mark, self.at(self.spill)) if self.spill is not None else mark

    @property
    def terminate_at(self) -> int | None:
        """The terminate fence, bytes (None: turned off)."""
        return self.at(self.terminate) if self.terminate is not None else None

    @property
    def exit_at(self) -> int | None:
        """Where a thread worker process stops itself, bytes (None: never)."""
        return self.at(self.exit) if self.exit is not None else None

    @property
    def ceiling(self) -> int:
        """Bytes a producer's expected output may take an idle worker to, at most: the
        terminate fence (the limit with it off)."""
        return self.at(self.terminate) if self.terminate is not None else self.limit


def floor_at_start(config: MemoryConfig, rss: int) -> str | None:
    """What to warn of when a worker that has just started (its task processes up, no
    task run) measures ``rss``: None under its resume mark; else that its floor is past
    the mark before any output, with the numbers and what to do
    (docs/memory.md#the-floor-memory-that-is-not-outputs)."""
    if rss < config.resume_at:
        return None
    return floor_warning(
        rss, config.resume_at, config.at(config.throttle), config.limit,
        execution=config.execution, at_start=True,
    )  # fmt: skip


# ----------------------------------------------------------------------------- reports

#: a producer's expected output is the largest of the latest this many outputs of its
#: category made on the worker: an outlier (an earlier run's 800 MB outputs of a category
#: whose tasks now make 350 MB) is forgotten after that many, as the scheduler's
#: ``RISE_WINDOW`` forgets a category's rise
OUTPUT_WINDOW = 4

#: seconds between two reports of a worker's memory that only moved, at least
REPORT_EVERY = 1.0
#: seconds after which a change of the bytes held too small to be a move is reported
REPORT_SETTLE = 5.0
#: seconds between two :class:`Trim` asks, at least (each runs ``gc.collect()``): well
#: under the scheduler's ``stall_timeout`` (10 s), so that a floor that rose is measured
#: again before the watchdog takes the wait for a stall
TRIM_EVERY = 2.0
#: seconds an output made here stays in memory when the memory that is not outputs is
#: past the spill target by itself (:meth:`MemoryGovernor._spill`): long enough for the
#: scheduler to send the consumer placed with it, short enough that outputs nobody reads
#: soon (a persist) still go to disk before the throttle holds producers back for long
SPILL_GRACE = 1.0
#: a move: the bytes held or the RSS changed by this fraction of the memory limit...
REPORT_STEP = 0.01
#: ...or by this many bytes, whichever is more
REPORT_MIN_STEP = 2**20


@dataclasses.dataclass(slots=True)
class ReportPacing:
    """When a worker tells the scheduler its memory again though it crossed no fence:
    what it last reported (the bytes of outputs held in memory, RSS) and when.

    :meth:`due` says yes when the bytes held or the RSS moved by ``step`` (a hundredth
    of the memory limit, at least a MiB) or more since the last report, at most every
    ``every`` seconds; and for any other change of the bytes held, once ``settle``
    seconds passed since the last report. So the scheduler's figures of a worker's
    memory are at most ``every`` seconds and ``step`` bytes behind, its bytes held
    exact within ``settle`` seconds, and a worker whose memory does not move sends
    nothing (RSS moves of less than a step are not reported: every task's result
    carries its RSS). The worker records each report it sends, whatever made it
    (:meth:`sent`), and asks :meth:`due` on its memory tick: nothing per task."""

    step: int
    at: float = 0.0  #: when the last report was sent (the shell's clock)
    memory_bytes: int = 0  #: the bytes held in memory it said
    rss: int = 0  #: the RSS it said
    every: float = REPORT_EVERY
    settle: float = REPORT_SETTLE

    @classmethod
    def of(cls, limit: int, now: float, rss: int) -> ReportPacing:
        """The pacing of a worker with memory ``limit`` whose latest report (or its
        start) was at ``now``, saying ``rss`` (0: none told yet, so the first measured
        RSS is due once ``every`` passed) and holding nothing (as the scheduler first
        knows it)."""
        return cls(max(REPORT_MIN_STEP, int(limit * REPORT_STEP)), now, 0, rss)

    def sent(self, now: float, memory_bytes: int, rss: int) -> None:
        """A report saying ``memory_bytes`` and ``rss`` was sent at ``now``."""
        self.at, self.memory_bytes, self.rss = now, memory_bytes, rss

    def due(self, now: float, memory_bytes: int, rss: int) -> bool:
        """Whether to report now, holding ``memory_bytes`` in memory at ``rss``."""
        since = now - self.at
        if since < self.every:
            return False
        if rss and not self.rss:  # a measured RSS the scheduler was never told: it shows 0
            return True
        held = memory_bytes - self.memory_bytes
        if abs(held) >= self.step or abs(rss - self.rss) >= self.step:
            return True
        return held != 0 and since >= self.settle


# ----------------------------------------------------------------------------- events


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class Sampled(Event):
    """The worker's RSS (with its task processes), read after a task finished or on the
    periodic tick; ``tasks``: ``(key, RSS)`` of each running task that can be killed;
    ``idle``: the worker runs no task, holds no output in memory (all it holds is on
    disk) and writes none to disk (a value being spilled stays in memory until its file
    is complete, also one dropped meanwhile), so nothing it could spill or end would
    lower its RSS; ``stored``: the bytes of
    outputs (and peers' copies) it holds in memory, the part of ``rss`` spilling can
    move (None: not known, spilling acts as if all of the RSS over the fence were
    outputs)."""

    rss: int
    tasks: tuple[tuple[Any, int], ...] = ()
    idle: bool = False
    stored: int | None = None
    #: ``(key, RSS)`` of each of ``tasks``' processes when its task began: what it grew
    #: by since is what killing it frees of what the task took (a task not in it counts
    #: its whole RSS as grown)
    began: tuple[tuple[Any, int], ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Ready(Event):
    """A task whose inputs are all here wants to start; ``category``: its category
    (a producer's expected output is its category's, as learnt here)."""

    key: Any
    producer: bool
    category: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Finished(Event):
    """A task ended (however), or was cancelled before it ran; ``nbytes``: the size of
    the output it left in memory (0: none, it failed, or a file output)."""

    key: Any
    nbytes: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Tick(Event):
    """A deferral timer fired."""


# ----------------------------------------------------------------------------- commands


@dataclasses.dataclass(frozen=True, slots=True)
class Command:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class Run(Command):
    key: Any


@dataclasses.dataclass(frozen=True, slots=True)
class Defer(Command):
    """Do not start ``key`` before ``until``; send a :class:`Tick` then."""

    key: Any
    until: float


@dataclasses.dataclass(frozen=True, slots=True)
class Throttled(Command):
    """Tell the scheduler the worker is (or no longer is) deferring producers."""

    on: bool
    rss: int


@dataclasses.dataclass(frozen=True, slots=True)
class Spill(Command):
    """Move at least ``nbytes`` of stored outputs to disk, least recently used first
    (``nbytes`` 0: nothing to move), but none of ``keep``: outputs made less than
    ``SPILL_GRACE`` seconds ago, kept while what is over the fence is not outputs
    (``nbytes`` is then every output in memory: all the others go)."""

    nbytes: int
    keep: frozenset[Any] = frozenset()


@dataclasses.dataclass(frozen=True, slots=True)
class Trim(Command):
    """Give freed memory back to the OS (``gc.collect()``, then glibc's
    ``malloc_trim(0)`` where there is one): the worker is idle over its resume mark
    with nothing left to spill. The next idle sample says what is left."""


@dataclasses.dataclass(frozen=True, slots=True)
class Floor(Command):
    """The worker's floor (``floor``: its RSS idle after a trim, holding no output in
    memory) is at or past its resume mark: memory that is not outputs, which nothing
    the worker can do frees. It resumes producers under ``resume`` and throttles at
    ``throttle`` now (bytes), instead of staying throttled for good. Said once per
    rise of the floor past the mark (a warning)."""

    floor: int
    resume: int
    throttle: int


@dataclasses.dataclass(frozen=True, slots=True)
class Alone(Command):
    """Producer ``key`` starts alone on an idle worker although its expected output
    (``expected``, bytes: its category's, learnt here) does not fit under the terminate
    fence from the worker's RSS (``rss``, its floor after a trim): nothing on the worker
    can free more, so waiting would hold it for ever (its :class:`Run` comes with
    this). A thread worker runs it past its limit, as it did the first such task; a
    process worker's terminate fence kills it if it grows as expected."""

    key: Any
    expected: int
    rss: int


@dataclasses.dataclass(frozen=True, slots=True)
class Kill(Command):
    """Kill the running task ``key``: memory crossed the terminate fence. ``own``:
    its process's RSS in the sample (what of ``rss`` is the task's own)."""

    key: Any
    rss: int
    limit: int
    own: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Spared(Command):
    """Memory crossed the terminate fence, but no running task's process grew by the
    governor's margin since its task began (``grown``: the most one did, bytes): what
    took the worker there is not a task's (the worker process's own memory: outputs,
    inputs and copies on their way to or from peers, the libraries), so killing a task
    would free none of it and fail a try (a dask ``barrier`` task, in a user audit).
    None is killed; spilling and the throttle act as ever."""

    rss: int
    limit: int
    grown: int


# ----------------------------------------------------------------------------- core


class MemoryGovernor:
    """Decides, for one worker, what may start and when memory needs action."""

    def __init__(self, config: MemoryConfig) -> None:
        self.config = config
        self.rss = 0  #: latest RSS sample
        self.throttled = False  #: deferring producers now
        self.deferred: dict[Any, float] = {}  #: producer -> not before this time
        self.deferrals: dict[Any, int] = {}  #: producer -> times deferred so far
        self.killed: set[Any] = set()  #: kills asked for, not finished yet
        #: producers started and not finished -> the output each is expected to make
        self.producing: dict[Any, int] = {}
        self.categories: dict[Any, str] = {}  #: deferred or producing key -> its category
        #: category -> the largest of the latest OUTPUT_WINDOW outputs producers of it
        #: made here (its expected output)
        self.outputs: dict[str, int] = {}
        #: category -> those latest outputs, oldest first
        self.recent: dict[str, deque[int]] = {}
        #: outputs made here in the last SPILL_GRACE seconds -> when (oldest first)
        self.fresh: dict[Any, float] = {}
        self._trim_at = -TRIM_EVERY  #: when a Trim was last asked for
        self._trimming = False  #: a Trim asked for, its idle sample not seen yet
        #: the worker's floor: its RSS at the idle sample after a trim, lowered by any
        #: idle sample under it (0: not measured). Memory that is not outputs.
        self.floor = 0
        self._warned = 0  #: the floor last said (Floor) while past the resume mark
        #: the marks in force: the configured ones, moved up past a floor (:meth:`_mark`)
        self.resume_at = config.resume_at
        self.throttle_at = config.at(config.throttle)
        #: the gap kept over a floor: half the hysteresis, at least 2% of the limit
        self.margin = max(config.at(config.hysteresis) // 2, config.limit // 50)

    # -- the one mutator ---------------------------------------------------------------

    def handle(self, *events: Event) -> list[Command]:
        out: list[Command] = []
        for ev in events:
            if isinstance(ev, Sampled):
                self._sampled(ev, out)
            elif isinstance(ev, Ready):
                self._ready(ev, out)
            elif isinstance(ev, Finished):
                self._finished(ev)
            elif isinstance(ev, Tick):
                self._tick(ev, out)
            else:
                raise TypeError(f"MemoryGovernor cannot handle {type(ev).__name__}")
        return out

    # -- queries -----------------------------------------------------------------------

    @property
    def moved(self) -> bool:
        """Whether the floor moved the marks up (:meth:`_mark`): it is at or past the
        configured resume mark."""
        return self.floor >= self.config.resume_at

    def floor_text(self) -> str:
        """What the worker warns of a floor that moved its marks up: the floor, its
        configured marks and what to do (:func:`~runtime.errors.floor_warning`); ""
        while the floor is under its resume mark."""
        cfg = self.config
        if not self.moved:
            return ""
        return floor_warning(
            self.floor, cfg.resume_at, cfg.at(cfg.throttle), cfg.limit,
            execution=cfg.execution, at_start=False,
        )  # fmt: skip

    @property
    def level(self) -> float:
        """RSS as a fraction of the limit."""
        return self.rss / self.config.limit

    def expected(self, key: Any) -> int:
        """The output producer ``key`` is expected to make (0: not known)."""
        return self.outputs.get(self.categories.get(key, ""), 0)

    def fits(self, key: Any) -> bool:
        """Whether producer ``key`` may start as far as memory goes: its expected output
        and those of the producers running fit under the throttle fence; or, on a worker
        under the resume mark running no producer, its own fits under the terminate
        fence (the limit with that fence off): a task larger than the room under the
        throttle fence runs, alone."""
        need, cfg = self.expected(key), self.config
        if self.rss + sum(self.producing.values()) + need < self.throttle_at:
            return True
        return not self.producing and self.rss < self.resume_at and self.rss + need < cfg.ceiling

    # -- handlers ----------------------------------------------------------------------

    def _sampled(self, ev: Sampled, out: list[Command]) -> None:
        cfg, fresh = self.config, self.fresh
        self.rss = rss = ev.rss
        while fresh and ev.now - next(iter(fresh.values())) >= SPILL_GRACE:
            del fresh[next(iter(fresh))]  # no longer fresh (oldest first)
        if ev.idle:
            self._idle(ev, out)
        else:
            self._trimming = False  # a task or an output came: what a trim left is unknown
        if cfg.spill is not None and rss >= cfg.at(cfg.spill):
            out.append(self._spill(ev, cfg.at(cfg.spill * 0.9)))
        elif cfg.spill is not None and (room := self._room(ev)) is not None:
            out.append(room)
        if rss < self.throttle_at:
            if not self.throttled or rss < self.resume_at:
                self._resume(out)
            return
        if not self.throttled:
            self.throttled = True
            out.append(Throttled(True, rss))
        if cfg.terminate is not None and rss >= cfg.at(cfg.terminate):
            self._terminate(ev, out)

    def _terminate(self, ev: Sampled, out: list[Command]) -> None:
        """Past the terminate fence: kill the running task whose own process grew most
        since the task began (ties: the one listed last, the newest), if it grew by
        ``margin`` or more; killing frees what the task took. A task process that did
        not grow holds what any fresh one would (its libraries), so killing it frees
        nothing of what took the worker past the fence: with no task grown, none is
        killed (:class:`Spared`)."""
        began = dict(ev.began)
        grown = [(k, r - began.get(k, 0)) for k, r in ev.tasks if k not in self.killed]
        if not grown:
            return
        _, (worst, most) = max(enumerate(grown), key=lambda ikg: (ikg[1][1], ikg[0]))
        if most < self.margin:
            out.append(Spared(ev.rss, self.config.limit, most))
            return
        self.killed.add(worst)
        out.append(Kill(worst, ev.rss, self.config.limit, dict(ev.tasks).get(worst, 0)))

    def _spill(self, ev: Sampled, target: int) -> Spill:
        """What to spill from a sample at or past the spill fence, down to ``target``
        (90% of it): the excess, but no more than the outputs in memory (spilling moves
        nothing else). When the memory that is not outputs is at or past ``target`` by
        itself, spilling cannot bring the worker under its fence; what it can do is
        write outputs that their consumers read back at once. Then the outputs made in
        the last ``SPILL_GRACE`` seconds stay (``keep``), unless the RSS is at the
        terminate fence (the limit with it off); the older ones go, so outputs nobody
        reads soon still leave memory."""
        excess, stored, fresh = ev.rss - target, ev.stored, self.fresh
        if stored is None:  # not known: all of the excess counts as outputs
            return Spill(excess)
        if ev.rss - stored < target or ev.rss >= self.config.ceiling or not fresh:
            return Spill(min(excess, stored))
        return Spill(stored, frozenset(fresh))

    def _room(self, ev: Sampled) -> Spill | None:
        """Under the spill fence, a producer held back here (the oldest deferred one,
        which :meth:`_resume` would start first) whose expected output does not fit
        even alone, with no producer running: the spill the worker makes room with,
        since spilling comes before throttling. It asks for the outputs in memory over
        what lets the producer start alone (the RSS under the resume mark and, with its
        output, under the terminate fence: :meth:`fits`), keeping the fresh ones
        (``SPILL_GRACE``: their consumers usually come within it; once it is over,
        they go too). None when that is nothing, when producers run (it waits for
        them), or when spilling every output in memory would not make room: the
        producer then waits, as before, for memory to fall (a chaos audit: a worker
        holding a 350 MB input at 43% of its limit held back a producer expected to
        make 800 MB, by an earlier run, throttled under its spill fence, and waited for
        ever while two other workers were idle)."""
        oldest = self._stuck()
        if oldest is None:
            return None
        target = min(self.resume_at, self.config.ceiling - self.expected(oldest))
        excess = ev.rss - target + 1  # fits() needs the RSS under the target
        if target <= 0 or (ev.stored is not None and excess > ev.stored):
            return None  # no spill makes room: it waits for memory to fall
        return Spill(excess, frozenset(self.fresh))

    def _idle(self, ev: Sampled, out: list[Command]) -> None:
        """An idle sample (no task runs, no output in memory): over the resume mark, or
        holding back producers it cannot start (their expected outputs do not fit under
        the marks in force), nothing is left to spill, so ask the shell to give freed
        memory back (:class:`Trim`), at most once every ``TRIM_EVERY`` seconds; the next
        sample decides: what is left is the worker's floor (:meth:`_mark`). So a floor
        measured high (memory a later collection frees) that moved the marks up, with
        the RSS then between it and the mark, is measured again while producers wait,
        rather than holding them back until the scheduler's watchdog fails them."""
        if self._trimming:
            self._trimming = False
            self._mark(ev.rss, out)
            self._alone(ev, out)
        elif self.floor and ev.rss < self.floor:
            self._mark(ev.rss, out)  # less is not outputs than measured: marks move down
        elif ev.now - self._trim_at >= TRIM_EVERY and (
            ev.rss >= self.resume_at or self._held_back()
        ):
            self._trim_at = ev.now
            self._trimming = True
            out.append(Trim())

    def _alone(self, ev: Sampled, out: list[Command]) -> None:
        """The idle sample after a trim (the floor just measured): a producer still held
        back here with no producer running would wait for ever, since nothing on this
        worker frees memory any more (no task runs, no output is in memory) and the
        scheduler sends a throttled worker no producers to take its place (a 1.5 GB
        output made once on a 1 GiB thread worker kept the next task of its category
        deferred there, the worker throttled at 80 MiB of RSS, for ever, its peer idle).
        The oldest starts, alone (:class:`Alone`): other producers wait for it."""
        oldest = self._stuck()
        if oldest is None:
            return
        del self.deferred[oldest]
        self.deferrals.pop(oldest, None)
        self._start(oldest, out)
        out.append(Alone(oldest, self.expected(oldest), ev.rss))

    def _held_back(self) -> bool:
        """Producers wait here that memory keeps from starting: the oldest deferred one
        (the first :meth:`_resume` would start) does not fit."""
        oldest = self._oldest()
        return oldest is not None and not self.fits(oldest)

    def _oldest(self) -> Any | None:
        """The oldest deferred producer, the first :meth:`_resume` would start (None:
        none is deferred)."""
        return min(self.deferred, key=self.deferred.__getitem__, default=None)

    def _stuck(self) -> Any | None:
        """The oldest deferred producer when no producer runs and its expected output
        does not fit even so (it starts only once memory falls), else None: what
        :meth:`_room` spills for and :meth:`_alone` starts."""
        oldest = self._oldest()
        if oldest is None or self.producing or self.fits(oldest):
            return None
        return oldest

    def _mark(self, floor: int, out: list[Command]) -> None:
        """The floor is ``floor``. Memory that is not outputs and that a trim did not
        free must not throttle the worker for good: with the floor at or past the
        configured resume mark, the worker resumes under ``floor + margin`` and
        throttles no lower than ``margin`` above that (at most the terminate fence, the
        limit with it off); so an idle worker at its floor takes producers again, and a
        sample must climb ``margin`` over the new mark to throttle it (no flapping). A
        floor under the mark changes nothing: the configured marks hold. The first time
        the floor is past the mark, and whenever it rose ``margin`` since it was last
        said, :class:`Floor`."""
        cfg, margin = self.config, self.margin
        self.floor = floor
        resume, throttle = cfg.resume_at, cfg.at(cfg.throttle)
        if floor < resume:
            self._warned = 0  # under the mark: a later rise past it is said again
        else:
            resume = floor + margin
            throttle = max(throttle, min(resume + margin, cfg.ceiling))
            resume = min(resume, throttle)
        self.resume_at, self.throttle_at = resume, throttle
        if floor >= cfg.resume_at and (not self._warned or floor >= self._warned + margin):
            self._warned = floor
            out.append(Floor(floor, resume, throttle))

    def _resume(self, out: list[Command]) -> None:
        """Under the throttle fence (and, once throttled, under the resume mark): run
        the deferred producers, oldest first, while their expected outputs fit (nothing
        waits for its timer). A throttled worker stops throttling once none is left
        deferred; one that is not starts when the next would not fit even with no
        producer running."""
        runs: list[Command] = []
        for key in sorted(self.deferred, key=self.deferred.__getitem__):
            if not self.fits(key):
                break
            del self.deferred[key]
            self.deferrals.pop(key, None)
            self._start(key, runs)
        if self.throttled and not self.deferred:
            self.throttled = False
            out.append(Throttled(False, self.rss))
        elif not self.throttled and self.deferred and not self.producing:
            self.throttled = True
            out.append(Throttled(True, self.rss))
        out += runs

    def _ready(self, ev: Ready, out: list[Command]) -> None:
        if not ev.producer:
            self.deferred.pop(ev.key, None)
            out.append(Run(ev.key))
            return
        self.categories[ev.key] = ev.category
        if not self.throttled and not self.deferred and self.fits(ev.key):
            self._start(ev.key, out)
            return
        # Throttled, or its expected output does not fit: it waits. While producers run,
        # the worker waits for them to end (a sample after they do runs it if it fits);
        # with none running, it would not fit alone: the worker throttles.
        if not self.throttled and not self.producing:
            self.throttled = True
            out.append(Throttled(True, self.rss))
        self._defer(ev.key, ev.now, out)

    def _finished(self, ev: Finished) -> None:
        key = ev.key
        self.killed.discard(key)
        self.deferrals.pop(key, None)
        self.deferred.pop(key, None)
        self.producing.pop(key, None)
        category = self.categories.pop(key, None)
        if category is not None and ev.nbytes:
            recent = self.recent.get(category)
            if recent is None:
                recent = self.recent[category] = deque(maxlen=OUTPUT_WINDOW)
            recent.append(ev.nbytes)
            self.outputs[category] = max(recent)
        if ev.nbytes:
            self.fresh.pop(key, None)  # oldest first: a later one goes last
            self.fresh[key] = ev.now

    def _start(self, key: Any, out: list[Command]) -> None:
        self.producing[key] = self.expected(key)
        out.append(Run(key))

    def _tick(self, ev: Tick, out: list[Command]) -> None:
        due = sorted(
            (k for k, until in self.deferred.items() if until <= ev.now),
            key=self.deferred.__getitem__,
        )
        # Still deferred means memory is still high, or their outputs do not fit (a
        # sample under the resume mark would have run those that fit): wait again, a
        # little longer.
        for key in due:
            del self.deferred[key]
            self._defer(key, ev.now, out)

    def _defer(self, key: Any, now: float, out: list[Command]) -> None:
        cfg = self.config
        k = self.deferrals.get(key, 0)
        delay = min(cfg.first_delay * cfg.growth**k, cfg.max_delay)
        self.deferrals[key] = k + 1
        self.deferred[key] = now + delay
        out.append(Defer(key, now + delay))


# ----------------------------------------------------------------------------- task processes

#: a task process is replaced by a fresh one, between tasks, once its idle RSS has
#: crept over its fresh floor by this fraction of its share of the worker's limit...
RECYCLE_SHARE = 0.2
#: ...and by this many bytes at least
RECYCLE_MIN = 32 * 2**20


def recycle_over(limit: int, processes: int) -> int:
    """The bytes a task process's idle RSS may creep over its fresh floor before it is
    replaced between tasks (:func:`recycle_task_process`): ``RECYCLE_SHARE`` of its
    share of the worker's memory ``limit`` among ``processes``, at least
    ``RECYCLE_MIN``; 0 (never) for a worker with no limit."""
    if limit <= 0 or processes <= 0:
        return 0
    return max(RECYCLE_MIN, int(RECYCLE_SHARE * limit / processes))


def recycle_task_process(fresh: int, idle: int, over: int) -> bool:
    """Whether a task process whose RSS is ``idle`` between two tasks, and was
    ``fresh`` idle after its first task (its modules loaded), has kept so much (the
    allocator's arenas, caches of the libraries it ran) that it should make way for a
    fresh one before its next task: ``idle`` is ``over`` or more above ``fresh``.
    Never when ``over`` is 0 or no fresh floor is known yet."""
    return over > 0 and fresh > 0 and idle - fresh >= over
