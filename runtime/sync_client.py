"""A :class:`~runtime.client.Cluster` on an event loop of its own thread, with a
synchronous API: :class:`Client`, for a Jupyter notebook and for dask.distributed's
``Client`` habits (``fut.result()``, ``client.gather(futures)``, ``x.compute()``).

An embedded ``Cluster`` runs in the caller's event loop: in a notebook, the kernel's,
so a cell that computes locally (numpy, pandas, ``time.sleep``) stops its manager, and
its calls must be awaited. A ``Client`` starts the same ``Cluster`` on a loop that runs
in a thread of its own: its manager goes on placing tasks while a cell blocks, and
every call waits in the calling thread, as dask.distributed's synchronous ``Client``
does (docs/api.md, "A synchronous Client")."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import dask
import dask.threaded

from runtime.client import FUTURE_WRAPPERS, Cluster, Future, wait_on_loop
from runtime.errors import CorralError
from runtime.task import in_task

__all__ = ["Client", "ClientFuture"]

#: Cluster's coroutines whose answer holds Futures (given back as ClientFutures)
_GIVE_FUTURES = frozenset({"scatter", "submit_graph"})


class ClientFuture:
    """A :class:`~runtime.client.Future` of a :class:`Client`, waited for synchronously
    (``fut.result()``) or awaited in any asyncio event loop (``await fut``; not trio)."""

    __slots__ = ("_client", "future")

    #: dask's mark of a scheduler's future: in a graph or a ``dask.delayed`` call's
    #: arguments, a reference to its key (as the cluster's own ``Future``)
    __dask_future__ = True

    def __init__(self, future: Future, client: Client) -> None:
        self.future = future  #: the cluster's own Future (lives on the client's loop)
        self._client = client

    @property
    def key(self) -> Any:
        return self.future.key

    @property
    def status(self) -> str:
        return self.future.status

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> Any:
        """The value, waited for in this thread (``TimeoutError`` past ``timeout``
        seconds: only the wait ends, the task runs on); raises what ``await fut``
        raises. An interrupt (Ctrl-C, a notebook's stop button) ends the wait only."""
        return self._client._wait(_bounded(self.future.result, timeout), "fut.result()")

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The exception :meth:`result` would raise, or None, once the task is done."""
        return self._client._wait(_bounded(self.future.exception, timeout), "fut.exception()")  # type: ignore[no-any-return]

    def cancel(self) -> None:
        """Cancels the task, as :meth:`Client.cancel` (returns once the future shows it)."""
        self._client.cancel(self)

    def release(self) -> None:
        """Lets go of the result now, as ``Future.release``."""
        self._client._soon(self.future.release, "fut.release()")

    def __await__(self) -> Any:
        """``await fut`` in any asyncio event loop (a notebook cell's): the value."""
        return self._client._awaitable(self.future.result).__await__()

    def __reduce__(self) -> Any:
        """Pickled as its cluster's ``Future`` is: a reference to its key inside a graph
        sent to a manager, refused anywhere else."""
        return self.future.__reduce__()

    def __repr__(self) -> str:
        return f"<ClientFuture {self.key!r} {self.status}>"


FUTURE_WRAPPERS.add(ClientFuture)  # in a graph, checked as the Future it holds


class Client:
    """``Cluster(*args, **kwargs)`` started on an event loop of its own thread, with
    synchronous calls: ``Client(processes=2)``, then ``client.submit(...)`` (a
    :class:`ClientFuture`: ``.result()``), ``client.gather(futures)``,
    ``client.compute(x)`` (the value) and ``x.compute()`` (with ``set_as_default``,
    dask's scheduler is this cluster's until :meth:`close`). Every other coroutine
    method of ``Cluster`` is here as a synchronous one (``client.status()``,
    ``client.scale(4)``); ``client.cluster`` is the ``Cluster`` itself, for its own
    loop only. ``with Client(...) as client:`` closes it at the end."""

    def __init__(self, *args: Any, set_as_default: bool = True, **kwargs: Any) -> None:
        self.cluster = Cluster(*args, **kwargs)
        self._closed = False
        self._closing = threading.Lock()  # one close at a time (from any thread)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="corral-client-loop", daemon=True
        )
        self._thread.start()
        try:
            self._wait(self.cluster.start, "Client(...)")
        except BaseException:
            self._stop_loop()
            raise
        self._default: tuple[Any, Any] | None = None
        if set_as_default:
            self._default = (dask.config.get("scheduler", None), self._default_get)
            dask.config.set(scheduler=self._default[1])

    # -- waiting on the client's loop ------------------------------------------------

    def _wait(self, work: Callable[[], Awaitable[Any]], call: str) -> Any:
        """Run ``work()`` on the client's loop and wait for it here; an interrupt of the
        wait cancels it. ``CorralError`` on the client's own loop, which it would block."""
        self._check_open(call)
        self._check_thread(call)
        return wait_on_loop(self._loop, work)

    def _check_thread(self, call: str) -> None:
        if threading.current_thread() is self._thread:
            raise CorralError(
                f"{call} waits, and called in the Client's own event loop it would block "
                "it: there, use client.cluster's coroutines (`await client.cluster.gather(...)`)"
            )

    def _check_open(self, call: str) -> None:
        if self._closed:
            raise CorralError(f"{call}: this Client was closed; make a new Client(...)")

    def _soon(self, call: Callable[[], Any], name: str) -> Any:
        """``call()`` run on the client's loop (what must run there: ``submit``)."""

        async def now() -> Any:
            return call()

        return self._wait(now, name)

    def _awaitable(self, work: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
        """``work()`` run on the client's loop, awaitable from the caller's loop."""
        self._check_open("await fut")

        async def main() -> Any:
            return await work()

        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(main(), self._loop))

    # -- the API -----------------------------------------------------------------------

    def submit(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> ClientFuture:
        """``Cluster.submit``: the task goes at once (the client's loop runs)."""
        args, kwargs = _unwrapped(args), _unwrapped(kwargs)
        return ClientFuture(
            self._soon(lambda: self.cluster.submit(func, *args, **kwargs), "client.submit"), self
        )

    def map(self, func: Callable[..., Any], *iterables: Any, **kwargs: Any) -> list[ClientFuture]:
        """``Cluster.map``."""
        lists = [_unwrapped(list(items)) for items in iterables]
        kwargs = _unwrapped(kwargs)
        futures = self._soon(lambda: self.cluster.map(func, *lists, **kwargs), "client.map")
        return [ClientFuture(f, self) for f in futures]

    def gather(self, futures: Any, *, root_errors: bool = False) -> Any:
        """``Cluster.gather``, waited for here; also a single future (its value)."""
        if isinstance(futures, ClientFuture):
            return futures.result()
        return self._wait(
            lambda: self.cluster.gather(_unwrapped(list(futures)), root_errors=root_errors),
            "client.gather",
        )

    def as_completed(self, futures: Any = (), *, with_results: bool = False) -> Iterator[Any]:
        """``Cluster.as_completed`` as a plain iterator: each future as its task is done
        (with ``with_results``, ``(future, value)``)."""
        futures = list(futures)
        by_future = {id(_unwrapped(f)): f for f in futures}  # (a persisted one's: a Future)
        it = self._soon(
            lambda: self.cluster.as_completed(_unwrapped(futures), with_results=with_results),
            "client.as_completed",
        )
        while True:
            try:
                item = self._wait(it.__anext__, "client.as_completed")
            except StopAsyncIteration:
                return
            if with_results:
                yield by_future[id(item[0])], item[1]
            else:
                yield by_future[id(item)]

    def cancel(self, futures: Any) -> None:
        """``Cluster.cancel``: returns once the futures show it."""
        self._wait(lambda: self.cluster.cancel(_unwrapped(futures)), "client.cancel")

    def _default_get(self, dsk: Any, keys: Any, **kwargs: Any) -> Any:
        """dask's scheduler while the client is its default: the cluster's ``get``, but
        in a task of one of its in-process workers dask's threads (as in a worker
        process): there the compute would wait for a slot of the workers the task
        itself holds, and with one slot never get it."""
        if in_task():
            return dask.threaded.get(dsk, keys, **kwargs)
        return self.cluster.get(dsk, keys, **kwargs)

    @property
    def get(self) -> Callable[..., Any]:
        """The cluster's synchronous dask scheduler: ``x.compute(scheduler=client.get)``."""
        return self.cluster.get

    @property
    def dashboard_link(self) -> str | None:
        return self.cluster.dashboard_link

    def close(self) -> None:
        """Stops the cluster and its loop's thread; dask's scheduler is set back. Called
        from several threads at once, it closes once; each returns when it is closed."""
        self._check_thread("client.close()")  # (there, it would wait for itself for ever)
        with self._closing:
            self._close()

    def _close(self) -> None:
        if self._closed:
            return
        if self._default is not None and dask.config.get("scheduler", None) is self._default[1]:
            dask.config.set(scheduler=_live_scheduler(self._default[0]))
        try:
            self._wait(self.cluster.close, "client.close")
        finally:
            self._closed = True
            self._stop_loop()

    def _stop_loop(self) -> None:
        """Stops the loop once what still runs on it ended (a start or close that an
        interrupt cancelled stops its actors and worker processes first), within 30 s."""

        async def settle() -> None:
            others = asyncio.all_tasks() - {asyncio.current_task()}
            if others:
                await asyncio.wait(others, timeout=30)

        try:
            asyncio.run_coroutine_threadsafe(settle(), self._loop).result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        """Cluster's other coroutine methods (``status``, ``scale``, ``persist``, ...),
        waited for here; its other attributes as they are."""
        if name.startswith("_") or "cluster" not in self.__dict__:
            raise AttributeError(name)
        attr = getattr(self.cluster, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            a, k = _unwrapped(args), _unwrapped(kwargs)
            answer = self._wait(lambda: attr(*a, **k), f"client.{name}")
            return _wrapped(answer, self) if name in _GIVE_FUTURES else answer

        call.__name__ = name
        call.__doc__ = attr.__doc__
        return call

    def __repr__(self) -> str:
        return self._shown(lambda: repr(self.cluster)).replace("<Cluster", "<Client", 1)

    def _repr_html_(self) -> str:
        return self._shown(self.cluster._repr_html_)

    def _shown(self, show: Callable[[], str]) -> str:
        """``show()`` taken on the client's loop, between its events (the scheduler's
        state read from this thread may change under the read), with the Client's
        calls for the cluster's."""
        if not self._closed and threading.current_thread() is not self._thread:
            with contextlib.suppress(Exception):  # closed meanwhile: read it here
                return _as_client(self._soon(show, "repr"))
        return _as_client(show())


def _live_scheduler(previous: Any) -> Any:
    """The scheduler to give dask back: ``previous``, or if it is a Client closed since
    (two Clients closed in the order they started), or whose cluster was (`await
    Cluster.running()[0].close()`, a cell run again), the one that Client saved."""
    # (a cluster that runs, not one of Cluster.running(): it lists no client of a
    # manager process, and a Client(address) runs without being there)
    while isinstance(owner := getattr(previous, "__self__", None), Client) and (
        owner._closed or owner.cluster._system is None
    ):
        assert owner._default is not None  # it was dask's scheduler: it saved one
        previous = owner._default[0]
    return previous


def _as_client(text: str) -> str:
    """A Cluster's repr, with the Client's calls for the cluster's it names."""
    return text.replace("`await cluster.", "`client.").replace(
        "cluster.dashboard_link", "client.dashboard_link"
    )


def _bounded(
    wait: Callable[[], Awaitable[Any]], timeout: float | None
) -> Callable[[], Awaitable[Any]]:
    if timeout is None:
        return wait

    async def bounded() -> Any:
        with anyio.fail_after(timeout):
            return await wait()

    return bounded


def _unwrapped(obj: Any) -> Any:
    """``obj`` with each :class:`ClientFuture` (also in lists, tuples, sets and dict
    values, where ``submit`` looks for futures) as its cluster's own Future."""
    if isinstance(obj, ClientFuture):
        return obj.future
    if type(obj) in (list, tuple, set, frozenset):
        return type(obj)(_unwrapped(item) for item in obj)
    if type(obj) is dict:
        return {k: _unwrapped(v) for k, v in obj.items()}
    return obj


def _wrapped(obj: Any, client: Client) -> Any:
    """``obj`` with the cluster's Futures as :class:`ClientFuture` (a call's answer)."""
    if isinstance(obj, Future):
        return ClientFuture(obj, client)
    if type(obj) in (list, tuple):
        return type(obj)(_wrapped(item, client) for item in obj)
    if type(obj) is dict:
        return {k: _wrapped(v, client) for k, v in obj.items()}
    return obj
