"""The actor kernel: actors, references, mailboxes, supervision, causal ids.

What lives here: :class:`Actor` (typed handlers per message type, lifecycle hooks),
:class:`ActorRef` (``tell``/``ask``), :class:`Mailbox` (bounded, with backpressure),
:class:`ActorSystem` (one anyio task-group tree; spawn, stop, supervision) and the causal
id carried by every envelope. No scheduling logic, no sockets.

Failure rules (docs/kernel.md repeats them for users):

1. **ask + handler raises**: the exception is raised from ``ask`` in the caller, with
   its original type. The actor is not restarted (the failure was reported to the one
   who asked) and goes on with its next message.
2. **tell + handler raises** (or a helper task from ``start_soon`` raises): the failure
   is logged and :meth:`Actor.on_failure` is
   called; the supervisor then restarts the actor (``on_restart``, by default
   ``on_stop`` then ``on_start`` on the same instance) and the actor continues with the
   messages queued behind the failed one. The failed message is lost, and so is what
   ``on_restart`` drops (by default, what ``on_stop`` releases): an actor whose state
   others count on overrides it to keep that state (the worker does). More than
   ``max_restarts`` failures within ``restart_window`` seconds stop the actor and, with
   ``escalate=True`` (the default), shut the actor system down with
   :class:`~runtime.errors.ActorCrashed`.
   **Except for a tell from another process** (``tell(..., origin=...)``, as
   :class:`runtime.remote.Peer` delivers them): its failure is that message's, not the
   actor's. It is logged (``remote message failed``) and counted in
   ``ActorRef.remote_failures``; no ``on_failure``, no restart, no escalation. The same
   holds when such a tell's handler returns :class:`Later` and the coroutine raises.
3. **A message to a stopped actor**: ``tell``/``ask`` raise
   :class:`~runtime.errors.ActorStopped` at once. Asks that were still queued when the
   actor stopped are answered with ``ActorStopped``; queued tells are dropped and
   counted in ``ActorRef.dropped``. So are asks whose handler returned :class:`Later`
   and whose coroutine was still running when the actor stopped (it is cancelled).
4. **No reply in time**: ``ask(..., timeout=T)`` raises
   :class:`~runtime.errors.AskTimeout`; the message may still be processed later.
5. **A message with no handler**: ``ask`` raises ``TypeError`` naming the actor and the
   message type; a ``tell`` is logged at error level and dropped.
6. **Mailbox full**: ``await tell`` waits for room (backpressure); ``tell_nowait``
   raises :class:`~runtime.errors.MailboxFull`. The kernel's own messages (timers,
   stop) and ``post`` (actors whose mutual traffic is bounded by design) bypass it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import itertools
import math
import os
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

import anyio
import anyio.abc
from anyio.lowlevel import checkpoint

from runtime.errors import ActorCrashed, ActorStopped, AskTimeout, MailboxFull
from runtime.log import get_logger
from runtime.messages import Message, message

__all__ = [
    "Actor",
    "ActorRef",
    "ActorSystem",
    "Clock",
    "Later",
    "Mailbox",
    "Ref",
    "Timer",
    "current_causal_id",
    "handles",
    "new_causal_id",
]

M = TypeVar("M", bound=Message)
R = TypeVar("R")
A = TypeVar("A", bound="Actor")

# ----------------------------------------------------------------------------- causal ids

_causal: contextvars.ContextVar[str] = contextvars.ContextVar("corral_causal_id", default="")
_ids = itertools.count(1)
_id_prefix = f"{__import__('os').getpid():x}"


def new_causal_id(prefix: str = "c") -> str:
    """A fresh causal id, unique within this process (``prefix-pid-n``)."""
    return f"{prefix}-{_id_prefix}-{next(_ids)}"


def current_causal_id() -> str:
    """The causal id of the message being handled in this context, or ``""``."""
    return _causal.get()


# ----------------------------------------------------------------------------- clock


class Clock:
    """Time for actors: ``now()`` and ``sleep()``. Tests inject their own."""

    def now(self) -> float:
        return anyio.current_time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


# ----------------------------------------------------------------------------- envelopes


class _Reply:
    """Where the answer to one ``ask`` lands."""

    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def set(self, value: Any) -> None:
        self.value = value
        self.done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.done.set()


class Envelope:
    """A message in a mailbox with its causal id, for an ask its reply slot, and for a
    tell from another process its ``origin`` (the peer it came from; ``""``: local)."""

    __slots__ = ("causal_id", "msg", "origin", "reply")

    def __init__(
        self, msg: Any, causal_id: str, reply: _Reply | None = None, origin: str = ""
    ) -> None:
        self.msg = msg
        self.causal_id = causal_id
        self.reply = reply
        self.origin = origin


class _StopSignal:
    """Kernel-internal: the actor stops after the messages queued before this one."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


# ----------------------------------------------------------------------------- mailbox


class Mailbox:
    """A bounded FIFO of envelopes for one actor.

    ``put`` waits while the mailbox holds ``capacity`` envelopes; ``put_nowait`` raises
    :class:`MailboxFull` instead (or, with ``force=True``, ignores the bound: kernel use
    only). Neither yields to the event loop when there is room.
    """

    __slots__ = ("_getter", "_putters", "_q", "capacity", "closed", "name")

    def __init__(self, name: str, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"mailbox capacity must be at least 1, got {capacity}")
        self.name = name
        self.capacity = capacity
        self.closed = False
        self._q: deque[Envelope] = deque()
        self._getter: anyio.Event | None = None
        self._putters: deque[anyio.Event] = deque()

    def __len__(self) -> int:
        return len(self._q)

    def put_nowait(self, env: Envelope, *, force: bool = False) -> None:
        if self.closed:
            raise ActorStopped(self.name, type(env.msg).__name__)
        if not force and len(self._q) >= self.capacity:
            raise MailboxFull(self.name, self.capacity)
        self._q.append(env)
        getter = self._getter
        if getter is not None:
            self._getter = None
            getter.set()

    async def put(self, env: Envelope) -> None:
        while len(self._q) >= self.capacity and not self.closed:
            room = anyio.Event()
            self._putters.append(room)
            try:
                await room.wait()
            except BaseException:
                # Pass our turn on, so a cancelled putter never strands the others.
                if room in self._putters:
                    self._putters.remove(room)
                elif room.is_set():
                    self._wake_putter()
                raise
        self.put_nowait(env)

    def get_nowait(self) -> Envelope | None:
        if not self._q:
            return None
        env = self._q.popleft()
        if self._putters:
            self._wake_putter()
        return env

    def _wake_putter(self) -> None:
        while self._putters:
            room = self._putters.popleft()
            if not room.is_set():
                room.set()
                return

    async def wait(self) -> None:
        """Return once the mailbox holds at least one envelope."""
        while not self._q:
            ev = anyio.Event()
            self._getter = ev
            await ev.wait()

    def close(self) -> list[Envelope]:
        """Refuse new envelopes; return the ones still queued; release waiting putters."""
        self.closed = True
        left = list(self._q)
        self._q.clear()
        for room in self._putters:
            room.set()
        self._putters.clear()
        return left


# ----------------------------------------------------------------------------- handlers


@message("corral.HelperFailed", local=True)
class _HelperFailed(Message):
    """Kernel-internal: a task started with ``start_soon`` raised ``error``."""

    error: Any


def _cancelled() -> type[BaseException]:
    return anyio.get_cancelled_exc_class()


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out


_HANDLER_ATTR = "__corral_handles__"


def handles(*types: type[Message]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Method decorator: this method handles messages of ``types`` (and subclasses).

    The method takes the message and returns the reply to an ``ask`` (ignored for a
    ``tell``). It may be a plain function (fastest) or ``async def``.
    """
    if not types:
        raise TypeError("@handles needs at least one message type")

    def mark(fn: Callable[..., R]) -> Callable[..., R]:
        setattr(fn, _HANDLER_ATTR, types)
        return fn

    return mark


class Actor:
    """Base class of every actor.

    Subclass it, decorate methods with :func:`handles`, and spawn an instance with
    :meth:`ActorSystem.spawn`. Inside a handler, ``self.ref`` is the actor's own
    reference, ``self.log`` a structlog logger bound to its name and the current causal
    id, ``self.clock`` its clock, ``self.start_soon`` starts a helper task that lives as
    long as the actor, and ``self.send_later`` is a timer.

    Lifecycle: ``on_start`` runs before the first message (``spawn`` returns after it);
    ``on_stop`` runs after the last one; ``on_failure`` is called when a told handler
    raises; ``on_restart`` runs when the supervisor restarts the actor.
    """

    #: message type -> handler method name; built per class from @handles.
    _handlers: ClassVar[dict[type, str]] = {}
    #: handler name -> whether it is a coroutine function.
    _is_async: ClassVar[dict[str, bool]] = {}

    #: seconds :meth:`ActorSystem.shutdown` waits for this actor to stop (its
    #: ``on_stop`` may write out what it holds); None: the shutdown's own ``timeout``
    stop_timeout: ClassVar[float | None] = None
    name: str
    ref: ActorRef[Self]  #: set by ActorSystem.spawn
    clock: Clock
    _tg: anyio.abc.TaskGroup | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table: dict[type, str] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                types = getattr(value, _HANDLER_ATTR, None)
                if types is None:
                    continue
                for t in types:
                    table[t] = attr
        cls._handlers = table
        # From the method the class actually has: a subclass may override a handler
        # (without re-decorating it) and switch between sync and async.
        cls._is_async = {
            attr: inspect.iscoroutinefunction(getattr(cls, attr)) for attr in set(table.values())
        }

    # -- hooks ---------------------------------------------------------------------------

    async def on_start(self) -> None:
        """Called once before the first message; ``spawn`` waits for it."""

    async def on_stop(self) -> None:
        """Called once after the last message (also when the actor crashed for good)."""

    async def on_failure(self, error: BaseException, msg: Message) -> None:
        """Called when the handler for a told ``msg`` raised ``error``."""

    async def on_restart(self) -> None:
        """Restart after a failure. Default: ``on_stop`` then ``on_start``, so what
        ``on_stop`` releases is lost; override to keep state others count on."""
        await self.on_stop()
        await self.on_start()

    # -- helpers for subclasses ----------------------------------------------------------

    @property
    def log(self) -> Any:
        return self._log.bind(causal_id=_causal.get())

    def start_soon(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> None:
        """Run ``fn(*args)`` in the actor's own task group (cancelled when it stops)."""
        if self._tg is None:
            raise RuntimeError(f"actor {self.name!r} is not running")
        self._tg.start_soon(self._guard, fn, args)

    async def _guard(
        self, fn: Callable[..., Coroutine[Any, Any, Any]], args: tuple[Any, ...]
    ) -> None:
        # A helper task that raises counts as a failed told handler (rule 2), so one
        # broken helper cannot take the whole actor system down.
        try:
            await fn(*args)
        except Exception as exc:
            if not self.ref.mailbox.closed:
                self.ref.mailbox.put_nowait(Envelope(_HelperFailed(exc), _causal.get()), force=True)

    @handles(_HelperFailed)
    def _helper_failed(self, msg: _HelperFailed) -> None:
        raise msg.error

    def send_later(self, delay: float, msg: Message) -> Timer:
        """Tell ``msg`` to this actor after ``delay`` seconds of its clock."""
        timer = Timer()
        causal_id = _causal.get() or new_causal_id("t")

        async def fire() -> None:
            with timer._scope:
                await self.clock.sleep(delay)
                if not self.ref.mailbox.closed:
                    self.ref.mailbox.put_nowait(Envelope(msg, causal_id), force=True)

        self.start_soon(fire)
        return timer

    def stop(self, reason: str = "") -> None:
        """Stop after the messages already queued."""
        self.ref.mailbox.put_nowait(Envelope(_StopSignal(reason), _causal.get()), force=True)

    def handler_for(self, msg_type: type) -> str | None:
        table = type(self)._handlers
        name = table.get(msg_type)
        if name is None:
            for base in msg_type.__mro__[1:]:
                if base in table:
                    name = table[base]
                    table[msg_type] = name  # cache the subclass lookup
                    break
        return name

    _log: Any = None


class Timer:
    """Handle of a :meth:`Actor.send_later` timer."""

    __slots__ = ("_scope",)

    def __init__(self) -> None:
        self._scope = anyio.CancelScope()

    def cancel(self) -> None:
        self._scope.cancel()


# ----------------------------------------------------------------------------- references


class Ref(Protocol):
    """What every actor reference offers, local (:class:`ActorRef`) or remote
    (:class:`runtime.remote.RemoteRef`): actors take this, so they cannot tell which."""

    @property
    def name(self) -> str: ...
    @property
    def stopped(self) -> bool: ...
    def post(self, msg: Message, *, causal_id: str | None = None) -> None: ...
    def tell_nowait(self, msg: Message, *, causal_id: str | None = None) -> None: ...
    async def tell(self, msg: Message, *, causal_id: str | None = None) -> None: ...
    async def ask(
        self,
        msg: Message,
        *,
        timeout: float | None = 30.0,  # noqa: ASYNC109
        causal_id: str | None = None,
    ) -> Any: ...


class ActorRef(Generic[A]):
    """The address of a running actor: the only way to talk to it."""

    __slots__ = (
        "_on_stop_bound", "_scope", "_stopped", "_stopping", "_task", "dropped", "mailbox",
        "name", "remote_failures", "stop_timeout",
    )  # fmt: skip

    def __init__(self, name: str, mailbox: Mailbox) -> None:
        self.name = name
        self.mailbox = mailbox
        self.stop_timeout: float | None = None  #: its actor's (Actor.stop_timeout)
        self.dropped = 0
        #: tells from other processes whose handler raised (rule 2's exception)
        self.remote_failures = 0
        self._stopped = anyio.Event()
        #: seconds its on_stop may take (its stop_timeout, else the shutdown's timeout)
        self._on_stop_bound = STOP_TIMEOUT
        self._scope: anyio.CancelScope | None = None  #: cancels this actor alone
        self._task: asyncio.Task[Any] | None = None  #: the task that runs it
        self._stopping = False  #: in its on_stop

    def __repr__(self) -> str:
        state = "stopped" if self.mailbox.closed else "running"
        return f"<ActorRef {self.name} {state}>"

    @property
    def stopped(self) -> bool:
        return self.mailbox.closed

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    def tell_nowait(self, msg: Message, *, causal_id: str | None = None) -> None:
        """Queue ``msg`` without waiting; :class:`MailboxFull` if there is no room."""
        self.mailbox.put_nowait(Envelope(msg, causal_id or _causal.get() or new_causal_id()))

    def post(self, msg: Message, *, causal_id: str | None = None) -> None:
        """Queue ``msg`` without waiting and without checking the bound.

        For actors whose traffic to each other is bounded by design (a worker has at most
        its slots of tasks in flight, so its results are bounded too) and which would
        deadlock if each waited for room in the other's mailbox. Never for client input.
        """
        self.mailbox.put_nowait(
            Envelope(msg, causal_id or _causal.get() or new_causal_id()), force=True
        )

    async def tell(self, msg: Message, *, causal_id: str | None = None, origin: str = "") -> None:
        """Queue ``msg``, waiting for room in the mailbox (backpressure).

        ``origin`` names the other process ``msg`` came from (what a
        :class:`runtime.remote.Peer` passes): if its handler raises, that is the
        message's failure, logged and counted in :attr:`remote_failures`, not the
        actor's (no restart; rule 2).
        """
        cid = causal_id or _causal.get() or new_causal_id()
        await self.mailbox.put(Envelope(msg, cid, None, origin))

    async def ask(
        self,
        msg: Message,
        *,
        timeout: float | None = 30.0,  # noqa: ASYNC109 - rule 4 is part of the API
        causal_id: str | None = None,
    ) -> Any:
        """Send ``msg`` and wait for the handler's return value (or its exception)."""
        reply = _Reply()
        env = Envelope(msg, causal_id or _causal.get() or new_causal_id(), reply)
        limit = math.inf if timeout is None else timeout
        with anyio.move_on_after(limit):
            await self.mailbox.put(env)
            await reply.done.wait()
        return self._answer(reply, msg, limit)

    def post_ask(
        self, msg: Message, *, timeout: float | None = 30.0, causal_id: str | None = None
    ) -> Coroutine[Any, Any, Any]:
        """Queue ``msg`` now, as :meth:`post` does (in order with what this caller sends
        next), and return a coroutine that waits for the handler's answer as
        :meth:`ask` does (``AskTimeout`` past ``timeout``): for a handler that must
        send a request in its turn but not hold up its own mailbox for the answer
        (return ``Later(ref.post_ask(...))``)."""
        reply = _Reply()
        self.mailbox.put_nowait(
            Envelope(msg, causal_id or _causal.get() or new_causal_id(), reply), force=True
        )
        limit = math.inf if timeout is None else timeout

        async def answer() -> Any:
            with anyio.move_on_after(limit):
                await reply.done.wait()
            return self._answer(reply, msg, limit)

        return answer()

    def _answer(self, reply: _Reply, msg: Message, limit: float) -> Any:
        """An ask's outcome once its wait ended: the answer, the handler's error, or
        ``AskTimeout`` (no answer within ``limit`` seconds)."""
        if not reply.done.is_set():
            raise AskTimeout(self.name, type(msg).__name__, limit)
        if reply.error is not None:
            raise reply.error
        return reply.value

    def stop(self, reason: str = "") -> None:
        """Ask the actor to stop after the messages already queued (idempotent)."""
        if not self.mailbox.closed:
            self.mailbox.put_nowait(Envelope(_StopSignal(reason), _causal.get()), force=True)


# ----------------------------------------------------------------------------- runner

_BATCH = 256  # messages handled before the actor yields to the event loop
#: Seconds a shutdown gives each actor to stop, and its ``on_stop`` to finish, unless the
#: actor's own :attr:`Actor.stop_timeout` or the ``timeout`` of
#: :meth:`ActorSystem.shutdown` says otherwise.
STOP_TIMEOUT = 10.0
#: Where asyncio's and anyio's own code lives: left out of "where it waits" in the logs.
_LIBRARIES = (os.path.dirname(asyncio.__file__), os.path.dirname(anyio.__file__), __file__)


def _where(frames: Iterable[tuple[Any, int]]) -> str:
    """The innermost frames (up to 3) of ``frames`` (outermost first) that are neither
    asyncio's, anyio's nor the kernel's: where an actor waits, for a log line."""
    mine = [
        f"{getattr(f.f_code, 'co_qualname', f.f_code.co_name)} ({f.f_code.co_filename}:{line})"
        for f, line in frames
        if not f.f_code.co_filename.startswith(_LIBRARIES)
    ]
    return " > ".join(mine[-3:]) or "-"


def _awaiting(task: asyncio.Task[Any] | None) -> Iterable[tuple[Any, int]]:
    """The frames a suspended ``task`` waits in, outermost first (its await chain)."""
    coro: Any = task.get_coro() if task is not None else None
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            yield frame, frame.f_lineno
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)


def _raised_in(tb: Any) -> Iterable[tuple[Any, int]]:
    """The frames an exception came through, outermost first."""
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


async def _stop_actor(actor: Actor) -> None:
    """Run ``actor.on_stop()`` once, shielded from its caller's cancellation and bounded
    by the actor's stop bound: past it the hook is cancelled and an error names the
    actor and where its ``on_stop`` waited, so a hung hook never holds up a shutdown."""
    ref = actor.ref
    bound = ref._on_stop_bound
    where = "-"
    ref._stopping = True
    with anyio.CancelScope(shield=True), anyio.move_on_after(bound) as scope:
        try:
            await actor.on_stop()
        except _cancelled() as exc:
            if scope.cancel_called:
                where = _where(_raised_in(exc.__traceback__))
            raise
    if scope.cancelled_caught:
        actor._log.error(
            "on_stop did not finish in time; cancelled", doing="on_stop", at=where,
            seconds=bound,
            advice="what it had still to release or write out may be left; bound the "
            "waits of its on_stop, or give the actor a longer stop_timeout",
        )  # fmt: skip


class _Supervisor:
    """Per-actor restart budget: at most ``max_restarts`` within ``window`` seconds."""

    __slots__ = ("failures", "max_restarts", "restarts", "window")

    def __init__(self, max_restarts: int, window: float) -> None:
        self.max_restarts = max_restarts
        self.window = window
        self.failures: deque[float] = deque()
        self.restarts = 0

    def allow(self, now: float) -> bool:
        self.failures.append(now)
        while self.failures and self.failures[0] < now - self.window:
            self.failures.popleft()
        return len(self.failures) <= self.max_restarts


async def _run_actor(
    actor: Actor,
    supervisor: _Supervisor,
    escalate: Callable[[ActorCrashed], None],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    ref = actor.ref
    mailbox = ref.mailbox
    handlers = type(actor)._handlers
    is_async = type(actor)._is_async
    stop_reason = ""
    crashed: ActorCrashed | None = None
    ref._task = asyncio.current_task()
    scope = ref._scope = anyio.CancelScope()  # ActorSystem.shutdown's cut of this actor
    try:
        with scope:
            async with anyio.create_task_group() as tg:
                actor._tg = tg
                await actor.on_start()
                task_status.started()
                running = True
                while running:
                    await mailbox.wait()
                    handled = 0
                    while handled < _BATCH:
                        env = mailbox.get_nowait()
                        if env is None:
                            break
                        handled += 1
                        msg = env.msg
                        if type(msg) is _StopSignal:
                            stop_reason = msg.reason
                            running = False
                            break
                        token = _causal.set(env.causal_id)
                        try:
                            name = handlers.get(type(msg)) or actor.handler_for(type(msg))
                            if name is None:
                                _unhandled(actor, env)
                                continue
                            result = getattr(actor, name)(msg)
                            if is_async[name]:
                                result = await result
                            if type(result) is Later:
                                actor.start_soon(
                                    _answer_later, actor, result, env.reply, env.origin, type(msg)
                                )
                            elif env.reply is not None:
                                env.reply.set(result)
                        except Exception as exc:
                            if env.reply is not None:
                                env.reply.fail(exc)
                                continue
                            if env.origin:  # another process's bad input, not our fault
                                _remote_failed(actor, type(msg), env.origin, exc)
                                continue
                            actor.log.error(
                                "handler failed", message=type(msg).__name__, error=repr(exc)
                            )
                            await actor.on_failure(exc, msg)
                            if supervisor.allow(actor.clock.now()):
                                supervisor.restarts += 1
                                actor.log.warning("restarting actor", restarts=supervisor.restarts)
                                await actor.on_restart()
                            else:
                                crashed = ActorCrashed(actor.name, supervisor.restarts, repr(exc))
                                running = False
                                break
                        finally:
                            _causal.reset(token)
                    if running and handled >= _BATCH:
                        await checkpoint()
                tg.cancel_scope.cancel()
    finally:
        left = mailbox.close()
        for env in left:
            if env.reply is not None:
                env.reply.fail(ActorStopped(actor.name, type(env.msg).__name__))  # rule 3
            elif not isinstance(env.msg, _StopSignal):
                ref.dropped += 1
        try:
            await _stop_actor(actor)
        finally:
            actor._tg = None
            ref._task = ref._scope = None  # (what a stopped actor's reference keeps)
            ref._stopped.set()
            actor._log.debug("actor stopped", reason=stop_reason, crashed=crashed is not None)
    if crashed is not None:
        escalate(crashed)


class Later:
    """Returned by a handler: the answer comes from ``coro``, awaited in the actor's
    task group while the actor goes on with its next messages.

    For requests whose answer waits on something else (other actors, the network):
    the mailbox is not blocked meanwhile. If ``coro`` raises, an ask gets the exception
    and, for a tell, the failure counts as a failed told handler (rule 2). If the actor
    stops (or crashes) while ``coro`` runs, ``coro`` is cancelled and an ask gets
    :class:`ActorStopped` at once (rule 3), not its timeout.
    """

    __slots__ = ("coro",)

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self.coro = coro


async def _answer_later(
    actor: Actor, later: Later, reply: _Reply | None, origin: str = "", kind: type = object
) -> None:
    try:
        value = await later.coro
    except _cancelled():
        # The actor stops: its task group cancels the coroutine. Nobody else will answer.
        if reply is not None and not reply.done.is_set():
            reply.fail(ActorStopped(actor.name, kind.__name__))
        raise
    except Exception as exc:
        if reply is not None:
            reply.fail(exc)
        elif origin:
            _remote_failed(actor, kind, origin, exc)
        else:
            raise  # a helper failure: rule 2 through the actor's guard
        return
    if reply is not None:
        reply.set(value)


def _remote_failed(actor: Actor, kind: type, origin: str, exc: Exception) -> None:
    """A tell from another process failed: the message's failure (rule 2's exception)."""
    actor.ref.remote_failures += 1
    actor.log.error(
        "remote message failed",
        message=kind.__name__,
        origin=origin,
        error=repr(exc),
        failures=actor.ref.remote_failures,
    )


def _unhandled(actor: Actor, env: Envelope) -> None:
    text = f"actor {actor.name!r} has no handler for {type(env.msg).__name__}"
    if env.reply is not None:
        env.reply.fail(TypeError(text))
    else:
        actor.log.error("no handler; message dropped", message=type(env.msg).__name__)


class ActorSystem:
    """One anyio task-group tree holding a set of actors.

    Use as ``async with ActorSystem() as system:``; leaving the block stops every actor
    (newest first, each finishing the messages already queued) and then cancels what is
    left. An actor that exhausts its restart budget with ``escalate=True`` makes the
    ``async with`` block raise :class:`ActorCrashed`.
    """

    def __init__(self, *, clock: Clock | None = None, default_capacity: int = 10_000) -> None:
        self.clock = clock or Clock()
        self.default_capacity = default_capacity
        self._tg: anyio.abc.TaskGroup | None = None
        self._refs: dict[str, ActorRef[Any]] = {}  #: every kind of actor, by name
        self._crash: ActorCrashed | None = None
        self._names = itertools.count(1)
        self._host: asyncio.Task[None] | None = None
        self._stop_hosted: asyncio.Event | None = None

    async def __aenter__(self) -> ActorSystem:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    # -- hosted mode -------------------------------------------------------------------
    #
    # ``async with ActorSystem()`` must be entered and left by the same task (anyio's
    # rule for task groups). Frameworks that set up in one task and tear down in another
    # (aiohttp's cleanup contexts, pytest fixtures, ...) use ``start``/``stop`` instead:
    # the system then lives in a task of its own, the root of its tree. That task is the
    # only one Corral starts outside a task group, and ``stop`` always joins it.

    async def start(self) -> None:
        """Run the system in a dedicated task; return once it accepts ``spawn``."""
        if self._host is not None:
            raise RuntimeError("this ActorSystem is already running")
        ready = asyncio.Event()
        stop = self._stop_hosted = asyncio.Event()

        async def host() -> None:
            async with self:
                ready.set()
                await stop.wait()

        self._host = asyncio.get_running_loop().create_task(host(), name="corral-actors")
        ready_task = asyncio.ensure_future(ready.wait())
        try:
            done, _ = await asyncio.wait(
                {self._host, ready_task}, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:  # cancelled while starting: no host task outlives the call
            ready_task.cancel()
            with contextlib.suppress(Exception):
                await self.stop()
            raise
        if self._host in done:  # it ended before it was ready: raise why
            ready_task.cancel()
            host_task, self._host = self._host, None
            host_task.result()
            raise RuntimeError("the actor system stopped while starting")

    def when_ended(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once a system started with :meth:`start` has ended:
        stopped, or its task cancelled with its event loop's end (``asyncio.run``
        returning while it ran). Not for one entered with ``async with``."""
        if self._host is None:
            raise RuntimeError("this ActorSystem was not started with start()")
        self._host.add_done_callback(lambda _: callback())

    async def stop(self) -> None:
        """Stop a system started with :meth:`start` (graceful, as leaving ``async with``).

        Raises :class:`ActorCrashed` if an actor crashed for good meanwhile.
        """
        host, self._host = self._host, None
        if host is None:
            return
        assert self._stop_hosted is not None
        self._stop_hosted.set()
        # A cancelled caller still waits for the shutdown (bounded by its per-actor
        # timeouts): its return means every actor has stopped.
        with anyio.CancelScope(shield=True):
            await asyncio.shield(host)

    @property
    def running(self) -> bool:
        """Whether the system accepts work (hosted or entered with ``async with``)."""
        if self._host is not None:
            return not self._host.done()
        return self._tg is not None

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        tg = self._tg
        assert tg is not None
        shutdown_error: BaseException | None = None
        if exc_info[0] is None and self._crash is None:
            try:
                await self.shutdown()
            except BaseException as exc:  # e.g. cancelled by a crash escalated meanwhile
                shutdown_error = exc
                exc_info = (type(exc), exc, exc.__traceback__)
        # Cancel what is left (actors spawned during the shutdown; everything on error).
        tg.cancel_scope.cancel()
        try:
            result = await tg.__aexit__(*exc_info)
        except BaseExceptionGroup as group:
            # The body's own exception comes back wrapped by the task group; give the
            # caller the exception it raised, not a group of one.
            body = exc_info[1]
            cancelled = _cancelled()
            others = [e for e in _leaves(group) if e is not body and not isinstance(e, cancelled)]
            if body is not None and not others and self._crash is None:
                return False
            raise
        finally:
            self._tg = None
        if self._crash is not None:
            raise self._crash
        if shutdown_error is not None and not result:
            raise shutdown_error
        return result

    async def start_service(self, fn: Callable[..., Coroutine[Any, Any, Any]], *args: Any) -> Any:
        """Run ``fn(*args, task_status=...)`` in the system's task group (``tg.start``):
        for services that belong to the system but are not actors (a listener serving
        connections, a connection to another process). Cancelled when the system stops.
        """
        if self._tg is None:
            raise RuntimeError("ActorSystem is not running; use `async with ActorSystem()`")
        return await self._tg.start(fn, *args)

    @property
    def actors(self) -> dict[str, ActorRef[Any]]:
        """Running actors by name."""
        return {n: r for n, r in self._refs.items() if not r.stopped}

    async def spawn(
        self,
        actor: A,
        name: str | None = None,
        *,
        capacity: int | None = None,
        max_restarts: int = 3,
        restart_window: float = 60.0,
        escalate: bool = True,
    ) -> ActorRef[A]:
        """Start ``actor``; returns its reference once ``on_start`` has finished."""
        if self._tg is None:
            raise RuntimeError("ActorSystem is not running; use `async with ActorSystem()`")
        name = name or f"{type(actor).__name__.lower()}-{next(self._names)}"
        if name in self._refs and not self._refs[name].stopped:
            raise ValueError(f"an actor named {name!r} is already running")
        size = self.default_capacity if capacity is None else capacity  # 0 is refused
        ref: ActorRef[A] = ActorRef(name, Mailbox(name, size))
        actor.name = name
        actor.ref = ref
        ref.stop_timeout = actor.stop_timeout
        ref._on_stop_bound = STOP_TIMEOUT if actor.stop_timeout is None else actor.stop_timeout
        actor.clock = getattr(actor, "clock", None) or self.clock
        actor._log = get_logger("corral", actor=name)
        self._refs.pop(name, None)  # a reused name counts as the newest (shutdown order)
        self._refs[name] = ref
        sup = _Supervisor(max_restarts, restart_window)
        await self._tg.start(_run_actor, actor, sup, self._escalate if escalate else _ignore)
        return ref

    def _escalate(self, crash: ActorCrashed) -> None:
        if self._crash is None:
            self._crash = crash
        if self._tg is not None:
            self._tg.cancel_scope.cancel()

    async def shutdown(
        self,
        refs: Iterable[ActorRef[Any]] | None = None,
        *,
        timeout: float = STOP_TIMEOUT,  # noqa: ASYNC109 - per actor, then it is cancelled
    ) -> None:
        """Stop ``refs`` (default: every actor, newest first) and wait until they stop.

        Each actor has ``timeout`` seconds (or its own :attr:`Actor.stop_timeout`) to
        handle what was queued before the stop, and its ``on_stop`` as long again. Past
        the first, an error names it and where it waits and it is cancelled alone (its
        ``on_stop`` still runs); past the second its ``on_stop`` is cancelled. Either
        way the shutdown goes on with the next actor. Only an actor that ignores even
        that cancellation (a shielded wait) has the rest of the system cancelled.
        """
        targets = list(refs) if refs is not None else list(reversed(self._refs.values()))
        for ref in targets:
            bound = timeout if ref.stop_timeout is None else ref.stop_timeout
            if not ref.stopped:
                ref._on_stop_bound = bound
            ref.stop("shutdown")
            with anyio.move_on_after(bound):
                await ref.wait_stopped()
            if ref._stopped.is_set():
                continue
            if not ref._stopping and ref._scope is not None:
                get_logger("corral").error(
                    "actor did not stop in time; cancelled", actor=ref.name,
                    doing="handling its messages", at=_where(_awaiting(ref._task)),
                    seconds=bound,
                    advice="a handler or on_start that waits without a bound holds up its "
                    "actor; the other actors go on stopping",
                )  # fmt: skip
                ref._scope.cancel()
            # Now in its on_stop, which ends within its bound (_stop_actor).
            with anyio.move_on_after(bound + 1.0):
                await ref.wait_stopped()
            if not ref._stopped.is_set() and self._tg is not None:
                get_logger("corral").error(
                    "actor ignores cancellation; cancelling the actor system", actor=ref.name,
                    at=_where(_awaiting(ref._task)),
                )  # fmt: skip
                self._tg.cancel_scope.cancel()
                return


def _ignore(crash: ActorCrashed) -> None:
    """An actor spawned with ``escalate=False`` spent its restart budget: it stays
    stopped and the rest of the system goes on (not what ``str(crash)`` says, which is
    the escalated crash's text)."""
    get_logger("corral").error(
        "actor crashed (not escalated)", actor=crash.actor, restarts=crash.restarts,
        cause=crash.cause,
        advice="it stays stopped and the other actors go on; fix the handler or raise "
        "its restart budget",
    )  # fmt: skip
