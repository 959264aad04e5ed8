"""A worker's memory governor: the pure core behind "pause for a bit".

What lives here: :class:`MemoryConfig` (the fractions and intervals), the events the
governor takes and the commands it returns, and :class:`MemoryGovernor` with its one
mutator ``handle(*events) -> list[Command]``. No clock, no threads, no I/O: events carry
``now``; a deferral is a command the worker's shell turns into a timer.

The rules (from the users' thread in seed 003, where a full pause deadlocked clusters):

- Below ``throttle`` x limit, every ready task runs.
- At or above it, a task that *produces* memory (its category makes far more than it
  consumes) is deferred for a short interval that grows each time the same task is
  deferred again (``first_delay`` x ``growth``^k, at most ``max_delay``); consumers and
  everything else keep running, so memory can come down. The worker is *throttled*,
  and says so (:class:`Throttled`), so the scheduler stops sending it producers.
- Deferred tasks run at once when memory falls below ``throttle`` x limit: nothing waits
  for its timer then.
- At or above ``spill`` x limit, the worker is asked to move stored outputs to disk
  until memory is back under ``throttle`` x limit (:class:`Spill` says how many bytes).
- At or above ``terminate`` x limit, the running task that grew memory the most since it
  started is killed (:class:`Kill`; its try ends ``oom``), not the worker.

This module is the decision logic only. Wiring it into the worker (running tasks in
killable child processes, spilling, telling the scheduler, the cluster-wide stall
watchdog) is the next step of the memory work and not done yet.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = [
    "Command",
    "Defer",
    "Event",
    "Finished",
    "Kill",
    "MemoryConfig",
    "MemoryGovernor",
    "Ready",
    "Run",
    "Sampled",
    "Spill",
    "Started",
    "Throttled",
    "Tick",
]


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryConfig:
    """Memory fences of one worker, as fractions of its ``limit`` in bytes."""

    limit: int
    throttle: float = 0.6
    spill: float = 0.7
    terminate: float = 0.95
    first_delay: float = 0.05
    growth: float = 2.0
    max_delay: float = 2.0

    def __post_init__(self) -> None:
        if self.limit <= 0:
            raise ValueError(f"memory limit must be positive, got {self.limit}")
        if not 0 < self.throttle <= self.spill < self.terminate <= 1:
            raise ValueError(
                "memory fractions must satisfy 0 < throttle <= spill < terminate <= 1; got "
                f"throttle={self.throttle}, spill={self.spill}, terminate={self.terminate}"
            )
        if self.first_delay <= 0 or self.growth < 1 or self.max_delay < self.first_delay:
            raise ValueError(
                "deferrals need first_delay > 0, growth >= 1 and max_delay >= first_delay"
            )


# ----------------------------------------------------------------------------- events


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    now: float


@dataclasses.dataclass(frozen=True, slots=True)
class Sampled(Event):
    """The process's RSS, read after a task finished or on the periodic tick."""

    rss: int


@dataclasses.dataclass(frozen=True, slots=True)
class Ready(Event):
    """A task whose inputs are all here wants to start."""

    key: Any
    producer: bool


@dataclasses.dataclass(frozen=True, slots=True)
class Started(Event):
    key: Any
    rss: int


@dataclasses.dataclass(frozen=True, slots=True)
class Finished(Event):
    key: Any


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
    """Move at least ``nbytes`` of stored outputs to disk, least recently used first."""

    nbytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class Kill(Command):
    """Kill the running task ``key``: memory crossed the terminate fence."""

    key: Any
    rss: int
    limit: int


# ----------------------------------------------------------------------------- core


class MemoryGovernor:
    """Decides, for one worker, what may start and when memory needs action."""

    def __init__(self, config: MemoryConfig) -> None:
        self.config = config
        self.rss = 0  #: latest RSS sample
        self.throttled = False  #: deferring producers now
        self.deferred: dict[Any, float] = {}  #: producer -> not before this time
        self.deferrals: dict[Any, int] = {}  #: producer -> times deferred so far
        self.running: dict[Any, int] = {}  #: task -> RSS when it started
        self.killed: set[Any] = set()  #: kills asked for, not finished yet

    # -- the one mutator ---------------------------------------------------------------

    def handle(self, *events: Event) -> list[Command]:
        out: list[Command] = []
        for ev in events:
            if isinstance(ev, Sampled):
                self._sampled(ev, out)
            elif isinstance(ev, Ready):
                self._ready(ev, out)
            elif isinstance(ev, Started):
                self.running[ev.key] = ev.rss
            elif isinstance(ev, Finished):
                self.running.pop(ev.key, None)
                self.killed.discard(ev.key)
                self.deferrals.pop(ev.key, None)
            elif isinstance(ev, Tick):
                self._tick(ev, out)
            else:
                raise TypeError(f"MemoryGovernor cannot handle {type(ev).__name__}")
        return out

    # -- queries -----------------------------------------------------------------------

    @property
    def level(self) -> float:
        """RSS as a fraction of the limit."""
        return self.rss / self.config.limit

    # -- handlers ----------------------------------------------------------------------

    def _sampled(self, ev: Sampled, out: list[Command]) -> None:
        cfg = self.config
        self.rss = ev.rss
        level = self.level
        if level < cfg.throttle:
            if self.throttled:
                self.throttled = False
                out.append(Throttled(False, ev.rss))
            for key in sorted(self.deferred, key=self.deferred.__getitem__):
                out.append(Run(key))  # memory fell: nothing waits for its timer
            self.deferred.clear()
            return
        if not self.throttled:
            self.throttled = True
            out.append(Throttled(True, ev.rss))
        if level >= cfg.spill:
            out.append(Spill(ev.rss - int(cfg.throttle * cfg.limit)))
        if level >= cfg.terminate:
            candidates = [k for k in self.running if k not in self.killed]
            if candidates:
                # The task that grew memory the most since it started; ties: the newest.
                order = {k: i for i, k in enumerate(self.running)}
                worst = max(candidates, key=lambda k: (ev.rss - self.running[k], order[k]))
                self.killed.add(worst)
                out.append(Kill(worst, ev.rss, cfg.limit))

    def _ready(self, ev: Ready, out: list[Command]) -> None:
        if not ev.producer or self.level < self.config.throttle:
            self.deferred.pop(ev.key, None)
            out.append(Run(ev.key))
            return
        self._defer(ev.key, ev.now, out)

    def _tick(self, ev: Tick, out: list[Command]) -> None:
        due = sorted(
            (k for k, until in self.deferred.items() if until <= ev.now),
            key=self.deferred.__getitem__,
        )
        # Still deferred means memory is still high (a sample under the fence would have
        # run them all): wait again, a little longer.
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
