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
"""

from __future__ import annotations

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
