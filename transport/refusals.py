"""Which refused connections a listener logs (pure: time is data, nothing is logged here).

Anyone who can reach a listener's port can be refused, token or not: on a shared host
that is every local user. One log line per refusal would let any of them fill the log
(a few hundred bytes a refusal, a thousand refusals a second). :class:`RefusalLog`
keeps it bounded: in each window of ``interval`` seconds (from the first refusal after
a quiet one), the first ``first`` refusals of each peer and reason get a line of their
own (at most ``most`` in all); the rest are counted, and the window's end brings one
:class:`RefusedSummary` with the counts by reason and peer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass


@dataclass(frozen=True)
class Refused:
    """Log this refusal on a line of its own."""

    peer: str
    reason: str


@dataclass(frozen=True)
class RefusedSummary:
    """A window's refusals that were not each logged, and the counts of all of them."""

    total: int  #: refusals in the window, logged or not
    unlogged: int  #: those of them that had no line of their own
    seconds: float  #: the window's length
    counts: tuple[tuple[str, str, int], ...]  #: (reason, peer, refusals), most first

    def text(self, *, shown: int = 5) -> str:
        """``refused 12,345 connections in the last 60 s: bad token 12,300 from
        127.0.0.1, ...`` (the ``shown`` largest counts, then how many others)."""
        parts = [f"{reason} {n:,} from {peer}" for reason, peer, n in self.counts[:shown]]
        rest = len(self.counts) - shown
        if rest > 0:
            parts.append(f"{rest} other peer and reason pairs")
        return (
            f"refused {self.total:,} connections in the last {round(self.seconds, 1):g} s: "
            + ", ".join(parts)
        )


class RefusalLog:
    """Decides which refusals get a line and when a summary is due (see the module)."""

    def __init__(self, *, first: int = 3, most: int = 20, interval: float = 60.0) -> None:
        if first < 0 or most < 0 or not interval > 0:
            raise ValueError(
                f"RefusalLog needs first >= 0, most >= 0 and interval > 0, "
                f"got first={first}, most={most}, interval={interval}"
            )
        self.first = first
        self.most = most
        self.interval = interval
        self._start: float | None = None  # the open window's start
        self._counts: Counter[tuple[str, str]] = Counter()
        self._logged = 0
        self._unlogged = 0

    @property
    def due(self) -> float | None:
        """When the open window ends with a summary (None: none would be written)."""
        if self._start is None or not self._unlogged:
            return None
        return self._start + self.interval

    def refused(self, now: float, peer: str, reason: str) -> list[Refused | RefusedSummary]:
        """A connection from ``peer`` was refused for ``reason`` at ``now``: what to log
        (a summary of the window it ends, if any, and this refusal's own line, if it
        gets one)."""
        out: list[Refused | RefusedSummary] = list(self.flush(now))
        if self._start is None:
            self._start = now
        key = (reason, peer)
        self._counts[key] += 1
        if self._counts[key] <= self.first and self._logged < self.most:
            self._logged += 1
            out.append(Refused(peer, reason))
        else:
            self._unlogged += 1
        return out

    def flush(self, now: float, *, closing: bool = False) -> list[RefusedSummary]:
        """The open window's summary if it is over at ``now`` (or the listener is
        ``closing``) and some of its refusals were not logged; the window then ends."""
        start = self._start
        if start is None or (now < start + self.interval and not closing):
            return []
        out = []
        if self._unlogged:
            counts = sorted(self._counts.items(), key=lambda kv: (-kv[1], kv[0]))
            out.append(
                RefusedSummary(
                    total=sum(self._counts.values()),
                    unlogged=self._unlogged,
                    seconds=min(now - start, self.interval) if closing else self.interval,
                    counts=tuple((reason, peer, n) for (reason, peer), n in counts),
                )
            )
        self._start = None
        self._counts.clear()
        self._logged = self._unlogged = 0
        return out
