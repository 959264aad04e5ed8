"""dask's callbacks (``dask.callbacks.Callback``: ``dask.diagnostics.ProgressBar`` and
your own) called by Corral's ``compute``, ``get`` and ``cluster.get``.

dask's local schedulers call a callback's hooks as they run each task. Corral's tasks
run on workers, so a compute made while callbacks are active (``with ProgressBar():``,
or ``Callback.register()``) is submitted to be counted (``SubmitGraphRequest.progress``):
the scheduler keeps, for that run alone, how many of its tasks wait, are ready, run
and have ended, and the keys that ended since the client last asked. The client asks
(``ProgressQuery``) every :data:`PROGRESS_EVERY` seconds while the compute lasts, and
:class:`Hooks` calls the hooks in the cluster's event loop: ``start(dsk)`` and
``start_state(dsk, state)`` before the graph is sent, ``pretask(key, dsk, state)`` then
``posttask(key, None, dsk, state, worker)`` for each task once the client learns it
ended (its result stays on its worker: ``None``), and ``finish(dsk, state, errored)``
at the end, an error's included. ``state`` holds ``finished`` (the set of keys ended),
and ``waiting``, ``ready`` and ``running``, whose ``len()`` is how many tasks are in
each (:class:`Counted`: their keys are not sent to the client).

Futures (``submit``, ``map``) are counted by the client alone, from the word each gets
anyway (``runtime.client._Ends``, into a :class:`Tally`, answering in the shape of a
``ProgressQuery``'s answer): ``gather`` under dask callbacks feeds :class:`Hooks` with
it, and ``Cluster.progress(futures)`` draws it with a :class:`TextBar` (in place on a
terminal, a line every :data:`LINE_EVERY` seconds elsewhere). No scheduler ask, no wire
change.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any

#: Seconds between a compute's ``ProgressQuery`` asks while dask callbacks are active.
PROGRESS_EVERY = 0.2


class Counted:
    """The tasks of a compute in one state (``state["waiting"]``, ``"ready"``,
    ``"running"``), as a count: ``len()`` works; their keys are not sent to the client,
    so iterating or ``in`` raises ``TypeError`` saying so."""

    __slots__ = ("n", "what")

    def __init__(self, what: str) -> None:
        self.what = what
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def _refuse(self) -> TypeError:
        return TypeError(
            f"state[{self.what!r}] of a Corral compute is a count ({self.n} tasks): len() "
            "works, but the keys of tasks still under way are not sent to the client. "
            "state['finished'] holds the keys of those that ended"
        )

    def __iter__(self) -> Iterator[Any]:
        raise self._refuse()

    def __contains__(self, key: object) -> bool:
        raise self._refuse()

    def __repr__(self) -> str:
        return f"Counted({self.what!r}, {self.n})"


class Hooks:
    """The active dask callbacks of one compute (dask's ``(start, start_state, pretask,
    posttask, finish)`` tuples), called as :mod:`runtime.progress` says."""

    def __init__(self, callbacks: Any, dsk: Any) -> None:
        self.dsk = dsk
        hooks: list[list[Callable[..., Any]]] = [[], [], [], [], []]
        for cb in callbacks:
            for i, f in enumerate(cb):
                if f is not None:
                    hooks[i].append(f)
        self._start, self._start_state, self._pretask, self._posttask, self._finish = hooks
        self.finished: set[Any] = set()
        self.counts = {what: Counted(what) for what in ("waiting", "ready", "running")}
        self.state: dict[str, Any] = {"finished": self.finished, **self.counts}
        self.total = 0

    def start(self) -> None:
        for f in self._start:
            f(self.dsk)
        for f in self._start_state:
            f(self.dsk, self.state)

    def update(self, reply: dict[str, Any] | None) -> None:
        """Take a ``ProgressQuery`` answer: the counts, then the hooks of each task
        that ended since the previous one."""
        if reply is None:
            return
        self.total = reply["total"]
        for what, counted in self.counts.items():
            counted.n = reply[what]
        for key, worker, _ in reply["ended"]:
            for f in self._pretask:
                f(key, self.dsk, self.state)
            self.finished.add(key)
            for f in self._posttask:
                f(key, None, self.dsk, self.state, worker)

    def finish(self, errored: bool) -> None:
        for f in self._finish:
            f(self.dsk, self.state, errored)


class Tally:
    """The ends of a fixed set of ``total`` tasks, as the client learns them (a
    Future's update: ``Cluster.progress`` and ``gather`` under dask callbacks), told
    with :meth:`end` and read with :meth:`answer` in the shape of a ``ProgressQuery``
    answer, so that :class:`Hooks` and :class:`TextBar` take either. Pure: no clock,
    no I/O. ``state`` of an end: ``"memory"`` (finished), ``"erred"``, ``"cancelled"``
    or ``"released"`` (the task's last Future let go: nothing more will be told)."""

    __slots__ = ("_ended", "cancelled", "erred", "finished", "released", "total")

    def __init__(self, total: int) -> None:
        self.total = total
        self.finished = self.erred = self.cancelled = self.released = 0
        self._ended: list[tuple[Any, str, str]] = []

    @property
    def pending(self) -> int:
        """How many have not ended."""
        return self.total - self.finished

    def end(self, key: Any, worker: str, state: str) -> None:
        """``key`` ended in ``state`` on ``worker`` ("" for none); each key once."""
        self.finished += 1
        self.erred += state == "erred"
        self.cancelled += state == "cancelled"
        self.released += state == "released"
        self._ended.append((key, worker, state))

    def answer(self) -> dict[str, Any]:
        """The counts (``ProgressQuery``'s keys, with ``cancelled`` and ``released``;
        the tasks not ended are all ``waiting``: where each stands is the scheduler's)
        and ``ended``, those that ended since the previous answer."""
        ended, self._ended = self._ended, []
        return {
            "total": self.total, "finished": self.finished, "erred": self.erred,
            "cancelled": self.cancelled, "released": self.released,
            "waiting": self.pending, "ready": 0, "running": 0, "complete": True,
            "ended": ended,
        }  # fmt: skip


#: Seconds between two draws of a :class:`TextBar` on a terminal, and between two
#: lines of one written to anything else (a file, a pipe, a job's log).
BAR_EVERY = 0.2
LINE_EVERY = 10.0


def _seconds(elapsed: float) -> str:
    """``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if elapsed < 60:
        return f"{elapsed:.1f} s"
    minutes, seconds = divmod(int(elapsed), 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def bar_text(counts: dict[str, Any], elapsed: float, width: int = 40) -> str:
    """One line saying how far ``counts`` (a :meth:`Tally.answer` or a ``ProgressQuery``
    answer) are after ``elapsed`` seconds: a bar of ``width`` (0: none), the percent
    ended, ended of total, and the failed and cancelled among them when there are any.
    ``[####    ] | 45% | 4500 of 10000 ended, 3 failed | 12.3 s``."""
    total, ended = counts["total"], counts["finished"]
    fraction = ended / total if total else 1.0
    parts = [f"{int(100 * fraction):3d}%", f"{ended} of {total} ended"]
    for what, said in (("erred", "failed"), ("cancelled", "cancelled"), ("released", "released")):
        if counts.get(what):
            parts[-1] += f", {counts[what]} {said}"
    parts.append(_seconds(elapsed))
    if width:
        filled = int(width * fraction)
        parts.insert(0, "[" + "#" * filled + " " * (width - filled) + "]")
    return " | ".join(parts)


def columns_of(out: Any) -> int:
    """The width of the terminal ``out`` is, in characters: its own size, else
    ``shutil.get_terminal_size()``'s (``$COLUMNS``, this process's terminal, or 80)."""
    try:
        columns = os.get_terminal_size(out.fileno()).columns
    except (AttributeError, ValueError, OSError):  # (no file descriptor, or not a tty)
        columns = 0
    return columns if columns > 0 else shutil.get_terminal_size().columns


class TextBar:
    """Draws counts to ``out`` with :func:`bar_text`: on a terminal (``out.isatty()``)
    one line drawn again in place (``\\r``) at most every ``every`` seconds
    (:data:`BAR_EVERY`), else a line of its own every ``every`` seconds
    (:data:`LINE_EVERY`: a log stays readable, and says the wait is alive while nothing
    ends); :meth:`draw` ``final`` always draws and ends the line. Time is given, not
    read (``now``, seconds on any clock). On a terminal the line fits in ``columns``
    (None: :func:`columns_of` ``out`` at each draw, a window may be resized): a longer
    one wraps, and ``\\r`` would draw each time on a row of its own; the bar narrows,
    then the text is cut. A line shorter than the one before is padded over it."""

    def __init__(
        self, out: Any, started: float, every: float | None = None, columns: int | None = None
    ) -> None:
        isatty = getattr(out, "isatty", None)
        self.tty = bool(isatty and isatty())
        if every is not None and (isinstance(every, bool) or not isinstance(every, int | float)):
            raise TypeError(
                f"every must be a number of seconds above 0 (every=1), got "
                f"{type(every).__name__} {every!r}"
            )
        if every is not None and not every > 0:
            raise ValueError(f"every must be a number of seconds above 0, got {every!r}")
        self.every = every if every is not None else BAR_EVERY if self.tty else LINE_EVERY
        self.out = out
        self.started = started
        self.drawn: float | None = None  #: when it last drew (None: not yet)
        self.columns = columns  #: the terminal's width (None: asked at each draw)
        self.shown = 0  #: the length of the line on the terminal

    def draw(self, counts: dict[str, Any], now: float, final: bool = False) -> None:
        if not final and self.drawn is not None and now - self.drawn < self.every:
            return
        self.drawn = now
        if self.tty:
            # (one column spare: a line up to the last column wraps on some terminals)
            room = max((self.columns or columns_of(self.out)) - 1, 1)
            text = bar_text(counts, now - self.started, 0)
            width = min(40, room - len(text) - len("[] | "))  # the bar takes the rest
            if width >= 10:  # (narrower, it says nothing the percent does not)
                text = bar_text(counts, now - self.started, width)
            text = text[:room]
            self.out.write("\r" + text.ljust(min(self.shown, room)) + ("\n" if final else ""))
            self.shown = 0 if final else len(text)
        else:
            text = bar_text(counts, now - self.started, 0)
            self.out.write("progress: " + text + "\n")
        self.out.flush()
