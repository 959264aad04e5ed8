"""How long the workers of a pool live: the Kaplan-Meier estimate of their survival.

What lives here: :func:`kaplan_meier` (the survival curve of a set of lifetimes, some of
them censored), :class:`Survival` (the curve with the questions policies ask of it:
``at(t)``, ``known_at(t)``, ``median``, ``quantile``). Pure functions of their inputs,
no clock.

A *life* is ``(seconds, died)``: how long a worker lived, and whether it ended by the
event studied (taken away: preempted, crashed, lost) rather than on purpose (drained,
walltime, shutdown) or not at all yet (still alive). Lives that did not end by the
event are *censored*: they say only that the worker lived at least that long, which is
what Kaplan-Meier accounts for. On a checkpoint partition most workers are preempted and
the survival curve says how likely a task of a given length is to finish there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

__all__ = ["Survival", "kaplan_meier"]


@dataclasses.dataclass(frozen=True, slots=True)
class Survival:
    """A step function: ``steps[i] = (t, S)``: the probability of living past ``t`` is
    ``S`` from ``t`` until the next step (1.0 before the first). ``lives`` and ``deaths``
    count what it was estimated from; ``longest``: the longest of those lives (ended or
    not), past which the curve says nothing (:meth:`known_at`)."""

    steps: tuple[tuple[float, float], ...] = ()
    lives: int = 0
    deaths: int = 0
    longest: float = 0.0

    def at(self, t: float) -> float:
        """The probability that a worker lives longer than ``t`` seconds."""
        s = 1.0
        for when, value in self.steps:
            if when > t:
                break
            s = value
        return s

    def known_at(self, t: float) -> float | None:
        """:meth:`at`, or ``None`` past the longest life seen (and with no life seen):
        Kaplan-Meier is undefined there. Pool workers all preempted within a minute say
        nothing of how many live an hour (``at(3600)`` would hold the curve's last
        value, e.g. 0.2, as if one in five did)."""
        if not self.lives or t > self.longest:
            return None
        return self.at(t)

    def quantile(self, q: float) -> float | None:
        """The first time by which a fraction ``q`` of workers has died (``None``: the
        estimate never gets there, too few deaths seen)."""
        if not 0 < q < 1:
            raise ValueError(f"q must be in (0, 1), got {q}")
        for when, value in self.steps:
            if value <= 1 - q:
                return when
        return None

    @property
    def median(self) -> float | None:
        """Half the workers are dead by then (``None``: not known yet)."""
        return self.quantile(0.5)

    def survives(self, elapsed: float, more: float) -> float:
        """The probability that a worker alive after ``elapsed`` seconds lives ``more``
        seconds more (1.0 when nothing is known past ``elapsed``; past the longest life
        seen, the curve's last value, as :meth:`at`: :meth:`known_at` says when that is
        not known)."""
        now = self.at(elapsed)
        return self.at(elapsed + more) / now if now > 0 else 0.0


def kaplan_meier(lives: Iterable[tuple[float, bool]]) -> Survival:
    """The Kaplan-Meier estimate from ``(seconds, died)`` pairs.

    At each time ``t`` at which some worker died, the curve drops by the factor
    ``1 - d/n``: ``d`` deaths at ``t`` among the ``n`` workers still at risk (alive, and
    not censored, just before ``t``). A censored life at the same ``t`` as a death
    counts as at risk for it.
    """
    data = sorted((float(t), bool(d)) for t, d in lives)
    for t, _ in data:
        if t < 0:
            raise ValueError(f"a life cannot be negative: {t}")
    at_risk = len(data)
    s = 1.0
    steps: list[tuple[float, float]] = []
    deaths = 0
    i = 0
    while i < len(data):
        t = data[i][0]
        died = left = 0
        while i < len(data) and data[i][0] == t:
            died += data[i][1]
            left += 1
            i += 1
        if died:
            s *= 1 - died / at_risk
            steps.append((t, s))
            deaths += died
        at_risk -= left
    return Survival(tuple(steps), len(data), deaths, data[-1][0] if data else 0.0)
