"""Actor references across a connection: the same ``tell``/``ask`` to another process.

What lives here: :class:`Peer` (one per connection: sends this side's messages, delivers
the other side's to a local actor, matches replies to asks), :class:`RemoteRef` (an
``ActorRef`` look-alike whose messages travel over the connection), and the rule for
process-local messages on the wire (:class:`PickledMsg`, :func:`to_wire`,
:func:`from_wire`). It works over any :class:`transport.Connection`: ``inproc://``
(with or without the codec) and ``ws://`` alike.

Rules:

1. Wire-capable messages travel as themselves (the codec checks every field).
   Process-local ones (``local=True``: they carry task nodes, results, exceptions) are
   pickled with cloudpickle into a :class:`PickledMsg`; a peer accepts those only when
   built with ``allow_pickle=True`` (that is, only from an authenticated connection),
   and answers anything else with an ``ErrorReply`` without unpickling. An answer that
   is a tuple of wire messages, or made of JSON values only (that JSON gives back
   unchanged: no tuples), travels typed too (:class:`MessagesReply`,
   :class:`JsonReply`), so a peer that takes no pickles (a console) can read it.
   A message with a ``for_wire(error)`` method is sent as what it returns (each task of
   a ``RunTasks`` pickled on its own; each task error of a ``TasksDone`` made fit to
   travel by :func:`wire_error`, so that the other side always loads the frame).
2. An ask is a frame with a ``request_id``; its answer is a frame whose ``reply_to`` is
   that id: the handler's return value, or an ``ErrorReply`` carrying the exception
   (pickled when the connection allows it, so the asker re-raises the original type;
   otherwise :class:`RemoteError` with the type's name and text). An answer that
   cannot be sent (larger than a frame may be, say) is answered with that error.
3. Backpressure is end to end: incoming tells are handed to the local actor with
   ``await tell``, so a full mailbox stops this side reading, which (through the
   transport's bounded buffers) stops the sender. With ``max_asks``, at most that many
   of the other side's asks are served at once (this side reads nothing more
   meanwhile); with ``reply_room`` too, an ask is served only while the connection has
   room for its answer (``send_room`` exceeds the asks being served), one answer
   computed at a time: a side that takes no answers gets none computed.
4. When the connection closes, pending asks fail with ``ActorStopped``; the reference
   reports ``stopped``; ``on_close`` (if given) is called once.
5. Liveness: with ``heartbeat=T``, a side that has sent nothing for ``T`` seconds sends
   a ``Ping``; a side that has received nothing for ``timeout`` seconds (default 3 T)
   closes the connection as dead (``closed_reason`` says so, and so does the close,
   for the other side's ``close_reason``), which rule 4 turns into failures on both
   sides. So is a connection whose transport has held a full queue for the other side
   (``send_stalled``: at its bound in bytes, nothing written) for ``timeout`` seconds:
   a peer that reads nothing. Once closed, :meth:`Peer.why_closed` is that reason, the
   other side's, and this side's own stall just before, if any (a paused process).
   Silence is not counted while this side's own event loop was stalled (a task holding
   the GIL, say: its check came more than ``T`` late), as it could not read meanwhile;
   ``on_stall`` (if given) is told how late.
6. Refusal: a side that will not serve the other (a gateway refusing a ``Hello``, a
   token or a connection that keeps sending refused messages) says why with a
   :class:`Refused` frame and closes (:meth:`Peer.refuse`). The other side keeps that
   error (``refusal``, and ``closed_reason`` says it) and raises it, instead of
   ``ActorStopped``, from pending and later asks and tells. A manager that stops on
   purpose says so the same way, with :class:`~runtime.errors.ManagerStopping`
   (:meth:`Peer.say_goodbye`; a websocket then closes with code 1001, going away, not a
   refusal's 1008): that is a goodbye, not a refusal (kept as ``farewell``, logged at
   info, ``closed_reason`` its text; asks and tells fail with ``ActorStopped`` as on any
   close).
7. Remote input is the message's problem, not the actor's: tells are delivered with
   ``tell(msg, origin=<peer name>)``, so a handler that raises on one is logged and
   counted by the kernel, and never restarts or crashes the actor (kernel rule 2). An
   ``ErrorReply`` that answers nothing (the transport reporting bad input we sent) is
   logged, not delivered.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import os
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.abc
import cloudpickle
import tblib  # type: ignore[import-untyped]

from runtime import pickling, unpickling
from runtime.codec import Frame
from runtime.errors import (
    STANDS_FOR,
    ActorStopped,
    AskTimeout,
    ConnectionClosed,
    CorralError,
    FrameTooLarge,
    GraphNotLoadable,
    ManagerStopping,
    ProtocolError,
    RemoteError,
    TaskErrorTooLarge,
    command_output,
    note_command_output,
)
from runtime.kernel import ActorRef, current_causal_id, new_causal_id
from runtime.log import get_logger
from runtime.messages import (
    CORRAL_VERSION,
    UNREADABLE_REPLY,
    ErrorReply,
    Message,
    Ping,
    RunOutcome,
    SubmitGraphRequest,
    bare_exception,
    message,
)

__all__ = [
    "DEFAULT_MAX_TASK_ERROR_BYTES",
    "ERROR_HEAD_CHARS",
    "MAX_TASK_ERROR_ENV",
    "JsonReply",
    "MessagesReply",
    "Peer",
    "PickledMsg",
    "Refused",
    "RemoteError",
    "RemoteRef",
    "bound_error",
    "check_run_timeout",
    "exception_chain",
    "from_wire",
    "not_welcomed",
    "pack_error",
    "pickled_call",
    "refusal_error",
    "refuse",
    "run_failure",
    "substitute_error",
    "task_error_limit",
    "to_wire",
    "too_large_error",
    "wire_error",
]

_log = get_logger("corral.remote")


@message("corral.Pickled")
class PickledMsg(Message):
    """A process-local message crossing a process boundary (cloudpickle, protocol 5)."""

    type_name: str
    payload: bytes


@message("corral.Refused")
class Refused(Message):
    """The last frame before a side closes a connection it refuses to serve: why.

    ``kind`` and ``text`` are the error's type name and message; ``pickled`` the error
    itself (cloudpickle), opened only by a side that accepts pickles from this one."""

    kind: str
    text: str
    pickled: bytes | None = None


@message("corral.Json")
class JsonReply(Message):
    """An answer made of JSON values only (str-keyed dicts, lists, str, int, float,
    bool, None, bytes), carried as such; the asker gets ``value``."""

    value: Any


@message("corral.Messages")
class MessagesReply(Message):
    """An answer that is a tuple of wire messages (task records, policies); the asker
    gets the tuple."""

    items: tuple[Message, ...]


def to_wire(msg: Any) -> Message:
    """``msg`` itself if the codec can carry it; a tuple of such messages as a
    :class:`MessagesReply`, JSON values as a :class:`JsonReply`; anything else as a
    :class:`PickledMsg`."""
    if isinstance(msg, Message) and not type(msg).local:
        return msg
    if type(msg) is tuple and all(isinstance(m, Message) and not type(m).local for m in msg):
        return MessagesReply(msg)
    if _is_json(msg, _JSON_DEPTH):
        return JsonReply(msg)
    prepare = getattr(msg, "for_wire", None)
    if prepare is not None:  # RunTasks: each task pickled on its own; TasksDone: errors
        msg = prepare(wire_error)
    name = getattr(type(msg), "wire_name", "") or type(msg).__name__
    return PickledMsg(name, pickling.cloudpickle_dumps(msg))


#: deepest nesting of lists and dicts an answer may have to travel as JSON
_JSON_DEPTH = 64


def _is_json(value: Any, depth: int) -> bool:
    """``value`` is made of JSON values (and bytes) that the codec gives back unchanged:
    no tuples or other types, ints within 64 bits, finite floats, valid UTF-8, at most
    ``depth`` levels of lists and dicts."""
    t = type(value)
    if t is str:
        return value.isascii() or _is_utf8(value)
    if t is bool or t is bytes or value is None:
        return True
    if t is int:
        return bool(-(2**63) <= value < 2**64)
    if t is float:
        return math.isfinite(value)
    if depth <= 0:
        return False
    if t is list:
        return all(_is_json(v, depth - 1) for v in value)
    if t is dict:
        return all(
            type(k) is str and _is_json(k, 0) and _is_json(v, depth - 1) for k, v in value.items()
        )
    return False


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def from_wire(msg: Message, *, allow_pickle: bool, no_pickle: str = "") -> Any:
    """Undo :func:`to_wire` (:class:`JsonReply` and :class:`MessagesReply` are undone
    by :meth:`Peer._resolve`, as only answers come so); refuse pickles unless
    ``allow_pickle``, saying ``no_pickle`` (why this connection may not send them)."""
    if not isinstance(msg, PickledMsg):
        return msg
    if not allow_pickle:
        why = no_pickle or (
            "pickled payloads are accepted only from authenticated peers. Connect with "
            "the cluster token."
        )
        raise ProtocolError(f"refusing a pickled {msg.type_name}: {why}", type_name=msg.type_name)
    try:
        obj = unpickling.loads(msg.payload)
    except Exception as exc:
        missing = unpickling.missing_global(exc, msg.payload)
        if missing is not None and msg.type_name == SubmitGraphRequest.wire_name:
            # The user's code, not the versions: a graph this process cannot load.
            raise GraphNotLoadable(*missing, str(exc)) from exc
        raise ProtocolError(
            f"could not unpickle a {msg.type_name}: {exc!r}. Do both sides run the same "
            "versions of Corral and of the libraries your tasks use?",
            type_name=msg.type_name,
        ) from exc
    if getattr(type(obj), "wire_name", type(obj).__name__) != msg.type_name:
        raise ProtocolError(
            f"pickled payload claims to be {msg.type_name} but is {type(obj).__name__}",
            type_name=msg.type_name,
        )
    return obj


# -- task errors across processes


def _describe(exc: BaseException) -> tuple[str, str, str]:
    """The qualified name of ``exc``'s type, its text (``str``) and its ``repr``."""
    kind = _kind(exc)
    try:
        rep = repr(exc)
    except Exception:
        rep = kind
    return kind, _text(exc), rep


def _kind(exc: BaseException) -> str:
    """The qualified name of ``exc``'s type (without ``builtins.``)."""
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _text(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder when that raises."""
    try:
        return str(exc)
    except Exception:
        return "<str() failed>"


#: The most bytes a task's exception may take (its messages, or its pickle) to travel
#: back to its caller, unless :data:`MAX_TASK_ERROR_ENV` says otherwise: a larger one
#: is replaced where it is caught by a :class:`~runtime.errors.TaskErrorTooLarge`
#: (:func:`bound_error`).
DEFAULT_MAX_TASK_ERROR_BYTES = 1 << 20
#: The environment variable that sets that limit (bytes), read by each worker.
MAX_TASK_ERROR_ENV = "CORRAL_MAX_TASK_ERROR_BYTES"
#: exceptions of a task's error (causes, contexts) given their command's output, at most
_MAX_NOTED = 64
#: How much of a too-large exception's message its stand-in keeps (characters).
ERROR_HEAD_CHARS = 500


def task_error_limit() -> int:
    """The most bytes a task's exception may take: ``$CORRAL_MAX_TASK_ERROR_BYTES`` if
    set, else :data:`DEFAULT_MAX_TASK_ERROR_BYTES`; a :class:`ValueError` saying so for a
    bad value (a worker reads it as it starts)."""
    text = os.environ.get(MAX_TASK_ERROR_ENV, "").strip()
    if not text:
        return DEFAULT_MAX_TASK_ERROR_BYTES
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"{MAX_TASK_ERROR_ENV}={text!r} is not a whole number of bytes > 0: set it to "
            f"one (such as {4 << 20}), or unset it for the default "
            f"{DEFAULT_MAX_TASK_ERROR_BYTES:,} bytes"
        )
    return value


class _Over(Exception):
    """Raised by :class:`_Meter` once more than its limit was written."""


class _Meter:
    """A file that counts what is written to it, and stops a pickle past ``limit``."""

    __slots__ = ("limit", "n")

    def __init__(self, limit: int) -> None:
        self.limit, self.n = limit, 0

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        self.n += size
        if self.n > self.limit:
            raise _Over
        return size


def exception_chain(
    exc: BaseException, *, groups: bool = False, most: int | None = None
) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from (its ``__cause__`` and
    ``__context__``; with ``groups``, an exception group's members too), each once, up
    to ``most`` of them (None: all)."""
    todo: list[BaseException] = [exc]
    seen: set[int] = set()
    while todo and (most is None or len(seen) < most):
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        if groups and isinstance(e, BaseExceptionGroup):
            todo.extend(reversed(e.exceptions))
        todo.extend(x for x in (e.__context__, e.__cause__) if x is not None)


def _error_size(exc: BaseException, limit: int) -> int:
    """The bytes ``exc`` would take to travel, measured up to just past ``limit``: its
    chain's messages and notes, then (if those fit) its chain's pickles; 0 for one that
    does not pickle (:func:`pack_error` makes a small substitute of it)."""
    chain = list(exception_chain(exc, groups=True))
    size = 0
    for one in chain:
        size += len(_text(one))
        size += sum(len(str(n)) for n in getattr(one, "__notes__", None) or ())
        if size > limit:
            return size  # never pickled: a message past the limit says enough
    meter = _Meter(limit)
    try:
        for one in chain:
            cloudpickle.CloudPickler(meter, protocol=5).dump(bare_exception(one))
    except _Over:
        return meter.n
    except Exception:
        return 0
    return meter.n


def bound_error(exc: BaseException, key: Any, limit: int) -> BaseException:
    """``exc``, a task's exception, if it takes at most ``limit`` bytes to travel back
    to its caller; else the :class:`~runtime.errors.TaskErrorTooLarge` that stands for
    it (its type, size, the start of its message and what to do), with its traceback.

    Called where a task's exception is caught, in the thread or task process that ran
    the task (never on an event loop: measuring a large one takes time), so that one
    never grows the worker's report past what a message may carry, nor blocks its
    loop while it is sent. Measuring stops just past ``limit``. An external command's
    error in its chain gets the end of what the command wrote as a note first
    (:func:`~runtime.errors.note_command_output`)."""
    for one in exception_chain(exc, groups=True, most=_MAX_NOTED):
        note_command_output(one)
    size = _error_size(exc, limit)
    return exc if size <= limit else too_large_error(exc, key, size, limit)


def too_large_error(exc: BaseException, key: Any, size: int, limit: int) -> TaskErrorTooLarge:
    """The :class:`~runtime.errors.TaskErrorTooLarge` that stands for task ``key``'s
    exception ``exc`` of ``size`` bytes, over ``limit``: its type, the start of its
    message, and its traceback (frames only: bounded, unlike its messages)."""
    head = _text(exc)[:ERROR_HEAD_CHARS]
    output = command_output(exc)  # (bounded: its stand-in's text keeps it)
    if output is not None:
        head = f"{head}\n{output}"
    error = TaskErrorTooLarge(str(key), _kind(exc), size, limit, head)
    return error.with_traceback(exc.__traceback__)


def substitute_error(kind: str, text: str, rep: str, tb: str, why: str) -> RuntimeError:
    """The error that stands for a task's exception that cannot travel to the process
    that reports it: a RuntimeError naming its type (``kind``, qualified; also its
    :data:`~runtime.errors.STANDS_FOR` attribute, which pickles with it, so that the
    failure counts under that type: :func:`~runtime.errors.error_name`), its text, its
    ``repr``, ``why`` it stands in, and the traceback where it was raised."""
    raised = f"{kind}: {text}" if text else kind
    error = RuntimeError(
        f"the task raised {raised}\n(a RuntimeError stands for {rep}: {why}. To get the "
        "exception itself, make it picklable: pass every argument of its __init__ on to "
        "super().__init__, or give it a __reduce__.) Its traceback where it was raised:\n"
        f"{tb}"
    )
    setattr(error, STANDS_FOR, kind)
    return error


def _pickle_in_band(obj: Any) -> list[memoryview]:
    return [memoryview(pickling.cloudpickle_dumps(obj))]


def pack_error(
    exc: BaseException,
    where: str,
    dumps: Callable[[Any], list[memoryview]] = _pickle_in_band,
) -> tuple[list[memoryview], str]:
    """A task's exception pickled by ``dumps`` (the pickle, then its out-of-band
    buffers), checked to load again as the other process will load it
    (:mod:`runtime.unpickling`), and its traceback text. It travels with its traceback,
    ``__cause__`` and ``__context__`` (:class:`_WithFrames`), which a pickle of an
    exception leaves out. What of those does not survive the trip is left out: its
    chain (a cause that does not load again, say), then its frames. An exception that
    does not survive the trip even so is replaced by :func:`substitute_error`, which
    always does; ``where`` names the process it travels back from (for its message).

    The one check for task errors: the task process's reply to its worker
    (``actors/executor.py``) and the worker's ``TasksDone`` (:func:`wire_error`)."""
    tb = "".join(traceback.format_exception(exc))

    def as_pickled() -> BaseException:  # (any reducer installed for its class decides)
        return exc

    tries: list[Callable[[], Any]] = [lambda: _WithFrames.of(exc, {})]  # frames, chain
    if exc.__cause__ is not None or exc.__context__ is not None:
        tries.append(lambda: _WithFrames(bare_exception(exc), (_frames(exc),)))  # frames only
    tries += [as_pickled, lambda: bare_exception(exc)]  # itself only
    failure: Exception | None = None
    for make in tries:
        try:
            parts = dumps(make())
            unpickling.loads(parts[0], parts[1:])
            return parts, tb
        except Exception as failed:
            if failure is None or make is as_pickled:  # why the exception itself fails
                failure = failed
    why = f"it cannot be pickled and loaded again ({failure!r}) to travel back from {where}"
    return dumps(substitute_error(*_describe(exc), tb, why)), tb


def pickled_call(call: tuple[Any, ...], name: str) -> bytes:
    """``Cluster.run``'s ``(func, args, kwargs)`` pickled to travel to a worker process
    (cloudpickle: a function of a script by value); a ``TypeError`` saying what to do
    when it does not pickle. Called in a thread: it may take a while."""
    try:
        return pickling.cloudpickle_dumps(call)
    except Exception as exc:
        raise TypeError(
            f"run: {name}() or its arguments cannot be pickled to travel to the worker "
            f"processes ({exc!r}). Pass picklable arguments, or make the object (a lock, an "
            "open file or connection...) inside the function."
        ) from exc


def check_run_timeout(timeout: object) -> float:
    """``timeout`` as a float, or a ``ValueError`` unless it is ``Cluster.run``'s: a
    finite number of seconds > 0 (checked by the client at the call, and by the manager
    and the worker for any client: it bounds the call). An int too large for a float
    (``10**400``) is a ``ValueError`` too, not the ``OverflowError`` of its conversion."""
    seconds = math.nan
    if not isinstance(timeout, bool) and isinstance(timeout, int | float):
        with contextlib.suppress(OverflowError):
            seconds = float(timeout)
    if not 0 < seconds < math.inf:
        raise ValueError(
            "run(timeout=...) is the seconds each worker has to answer, a finite number > 0, "
            f"got {timeout!r:.80}"
        )
    return seconds


def run_failure(exc: BaseException, name: str, worker: str) -> RunOutcome:
    """The outcome of ``Cluster.run``'s call of ``name`` on ``worker`` that came to
    ``exc``: raised there (bounded as a task's error is, :func:`bound_error`), or the
    manager's word that the worker gave no answer. Packed as a task's error is
    (:func:`pack_error`: it loads again, or a stand-in does), with its type's name and
    traceback for a side that cannot load it."""
    error = bound_error(exc, f"{name}() on {worker}", task_error_limit())
    parts, tb = pack_error(error, f"worker {worker!r}")
    return RunOutcome(worker, False, bytes(parts[0]), type(exc).__name__, tb)


def _frames(exc: BaseException) -> list[Any]:
    """``exc``'s traceback as tblib nodes (file and function names, line numbers), one
    per frame, unlinked: a deep traceback (a RecursionError's) does not nest the pickle
    a level per frame."""
    frames: list[Any] = []
    node = tblib.Traceback(exc.__traceback__) if exc.__traceback__ is not None else None
    while node is not None:
        frames.append(node)
        node.tb_next, node = None, node.tb_next
    return frames


class _WithFrames:
    """An exception as it travels from :func:`pack_error`: its ``body`` (the exception
    without its traceback and chain, :func:`~runtime.messages.bare_exception`) pickled
    as any, and what a pickle of it leaves out (:meth:`extras_of`): its traceback, its
    ``__cause__`` and ``__context__`` (each made to travel so too),
    ``__suppress_context__``, and those of the exceptions of an exception group. It
    loads as the exception itself (:func:`_arrive`), whose traceback formats as the
    original's did."""

    __slots__ = ("body", "extras")

    def __init__(self, body: BaseException, extras: tuple[Any, ...]) -> None:
        self.body, self.extras = body, extras

    @classmethod
    def of(cls, exc: BaseException, made: dict[int, _WithFrames | None]) -> _WithFrames:
        """``exc`` made to travel with its frames and chain. ``made``: the exceptions of
        the chain made so far (one met twice, as both a ``__cause__`` and a
        ``__context__``, travels once); a link back to one still being made (a cycle)
        is left out."""
        made[id(exc)] = None
        made[id(exc)] = self = cls(bare_exception(exc), cls.extras_of(exc, made))
        return self

    @classmethod
    def extras_of(cls, exc: BaseException, made: dict[int, _WithFrames | None]) -> tuple[Any, ...]:
        """What :func:`_restore` gives back to ``exc`` as loaded: its frames
        (:func:`_frames`), cause, context, ``__suppress_context__``, and the same of
        each exception of a group."""

        def link(other: BaseException | None) -> _WithFrames | None:
            if other is None:
                return None
            if id(other) in made:
                return made[id(other)]
            return cls.of(other, made)

        members: tuple[Any, ...] = ()
        if isinstance(exc, BaseExceptionGroup):
            members = tuple(cls.extras_of(e, made) for e in exc.exceptions)
        cause, context = link(exc.__cause__), link(exc.__context__)
        return (_frames(exc), cause, context, exc.__suppress_context__, members)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_arrive, (self.body, self.extras))


def _arrive(exc: BaseException, extras: tuple[Any, ...]) -> BaseException:
    """Undo :class:`_WithFrames`: ``exc`` with its traceback and chain again."""
    _restore(exc, *extras)
    return exc


def _restore(
    exc: BaseException,
    frames: list[Any],
    cause: BaseException | None = None,
    context: BaseException | None = None,
    suppress_context: bool = False,
    members: tuple[Any, ...] = (),
) -> None:
    """Give ``exc`` its traceback (``frames``) and chain back, and those of its group's
    exceptions (``members``). Frames that cannot be rebuilt here are left out: the
    exception arrives all the same."""
    if frames:
        for node, below in itertools.pairwise(frames):
            node.tb_next = below
        with contextlib.suppress(Exception):
            exc.__traceback__ = frames[0].as_traceback()
    exc.__cause__, exc.__context__ = cause, context
    exc.__suppress_context__ = suppress_context
    if members and isinstance(exc, BaseExceptionGroup):
        for member, extras in zip(exc.exceptions, members, strict=False):
            _restore(member, *extras)


class _WireError:
    """A task's exception on its way to another process inside a message (made by
    :func:`wire_error`): its own pickle, loaded by :func:`_load_wire_error` there. So an
    exception that does not load on that side (its module is not installed there, say)
    becomes a substitute error instead of making the whole message unreadable.

    Not an exception itself: ``tblib.pickling_support.install()`` (which dask's and
    distributed's imports call, and a user may) registers tblib's reducer for every
    exception class then defined, which pickle prefers to the class's own
    ``__reduce__``; it would load this as the exception and then set that exception's
    traceback to this stand-in's (none), dropping the frames it brought."""

    __slots__ = ("facts",)

    def __init__(self, payload: bytes, kind: str, text: str, rep: str, tb: str) -> None:
        self.facts = (payload, kind, text, rep, tb)

    def __repr__(self) -> str:
        return f"<{self.facts[1]} on its way: {self.facts[2]!r}>"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_load_wire_error, self.facts)


def _load_wire_error(payload: bytes, kind: str, text: str, rep: str, tb: str) -> BaseException:
    """Undo :class:`_WireError`, on the receiving side, while its message is loaded: the
    exception, or its substitute if it does not load here."""
    try:
        error = unpickling.loads(payload)
        if isinstance(error, BaseException):
            return error
        why = f"its pickle holds a {type(error).__name__}"
    except Exception as failure:  # never _NewImport: unpickling reruns the whole load
        why = f"it cannot be loaded in this process ({failure!r})"
    return substitute_error(kind, text, rep, tb, why)


def wire_error(exc: BaseException) -> Any:
    """``exc`` in the form that travels inside a pickled message to another process
    (``TasksDone.for_wire`` calls it for each result that carries an error): checked
    here to load again (:func:`pack_error`, a substitute otherwise), and pickled on its
    own, so that the other side gets a substitute too if it cannot load it there. A
    task's caller thus always gets an error, never a result that does not arrive."""
    parts, tb = pack_error(exc, "its worker process")
    return _WireError(bytes(parts[0]), *_describe(exc), tb)


def _error_reply(exc: BaseException, allow_pickle: bool) -> ErrorReply:
    pickled = None
    if allow_pickle:
        try:
            pickled = pickling.cloudpickle_dumps(exc)
        except Exception:
            pickled = None
    return ErrorReply(type(exc).__name__, str(exc), pickled)


def _error_from(reply: ErrorReply | Refused, allow_pickle: bool) -> BaseException:
    if reply.pickled is not None and allow_pickle:
        try:
            err = unpickling.loads(reply.pickled)
            if isinstance(err, BaseException):
                return err
        except Exception:
            pass
    if reply.kind == UNREADABLE_REPLY:  # this side's transport could not read the reply
        return ProtocolError(unreadable_reply(reply.text))
    return RemoteError(reply.kind, reply.text)


def unreadable_reply(text: str) -> str:
    """What an ask whose reply this side could not read (``text``, the transport's
    problem) fails with: when the reply had a field, message type or wire format this
    side's code lacks, the two sides run different Corral code, which the error says,
    with what to do: the version string alone does not tell them apart (two checkouts
    of one release both say it)."""
    if not any(sign in text for sign in _VERSION_SIGNS):
        return text
    # (the codec's advice, "make sure both ends run the same Corral version", is said
    # below with what the version string cannot tell)
    text = text.partition(" The peer sent a malformed or incompatible frame")[0]
    return text.rstrip(".") + (
        f". The other side runs different Corral code than this side (Corral "
        f"{CORRAL_VERSION}): its messages have a field or type this code lacks, although "
        "both may report the same version (another checkout or commit of it, or an "
        "upgrade on one side only). Run the same Corral code on both sides (the same "
        "release, or the same checkout) and restart the side that was older"
    )


async def refuse(
    conn: Any,
    error: BaseException,
    *,
    going_away: bool = False,
    readable: BaseException | None = None,
) -> None:
    """Send ``error`` as a :class:`Refused` frame (pickled too, for a side that opens
    pickles from us) and close ``conn``: the other side learns why, not just that.
    ``going_away``: a goodbye (this side stops on purpose), not a refusal: the close
    says so too (a websocket's code 1001, not 1008). ``readable``: what to pickle in
    its place, for a side whose code may not have ``error``'s class (an older Corral's:
    it would read only the frame's kind and text)."""
    try:
        pickled = pickling.cloudpickle_dumps(error if readable is None else readable)
    except Exception:
        pickled = None
    with contextlib.suppress(CorralError):  # closed meanwhile: nobody to tell
        await conn.send(Frame(Refused(type(error).__name__, str(error), pickled)))
    # and in the close, for any websocket client
    await conn.aclose(reason=str(error), going_away=going_away)


def refusal_error(refused: Refused, *, allow_pickle: bool) -> BaseException:
    """The error a :class:`Refused` frame carries: itself when pickled and
    ``allow_pickle`` (the other side is trusted), else :class:`RemoteError`."""
    return _error_from(refused, allow_pickle)


#: What a refusal's text says when the refusing side could not read a message of this
#: version: a field, message type or wire format it does not know (runtime/codec.py).
_VERSION_SIGNS = ("unknown field", "unknown message type", "unsupported wire format version")


def not_welcomed(answer: object, address: str, who: str) -> ProtocolError:
    """The error for ``answer``, which came in place of the manager's ``Welcome`` to
    the Hello of a ``who`` ("worker", "client"). An :class:`ErrorReply` (the manager's
    transport could not read the Hello) carries the manager's reason, which is said;
    when the reason is a field or message the manager does not know, the two ends run
    different Corral versions, and the error says what to do about it."""
    if not isinstance(answer, ErrorReply):
        return ProtocolError(
            f"the manager at {address} answered this {who}'s Hello with a "
            f"{type(answer).__name__}, not a Welcome: is it a Corral manager of this "
            f"version ({CORRAL_VERSION})?"
        )
    text = f"the manager at {address} refused this {who}'s Hello: {answer.text}"
    if any(sign in answer.text for sign in _VERSION_SIGNS):
        text = text.rstrip(".") + (
            f". The manager runs another Corral version (this {who} runs Corral "
            f"{CORRAL_VERSION}): upgrade the manager first (or run the same version on both)"
        )
    return ProtocolError(text)


class _Pending:
    __slots__ = ("done", "error", "value")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class Peer:
    """One end of a connection between two actor systems.

    ``target`` receives the other side's tells and asks (``None``: this side only
    sends). Run it with ``await tg.start(peer.run)``; ``peer.ref`` is the reference to
    whatever serves the other side.
    """

    def __init__(
        self,
        conn: Any,
        target: ActorRef[Any] | Any | None,
        *,
        name: str,
        allow_pickle: bool,
        on_close: Callable[[Peer], None] | None = None,
        heartbeat: float | None = None,
        timeout: float | None = None,
        on_too_large: Callable[[Any, FrameTooLarge], bool] | None = None,
        on_stall: Callable[[float], None] | None = None,
        no_pickle: str = "",
        max_asks: int | None = None,
        reply_room: bool = False,
    ) -> None:
        self.conn = conn
        #: the other side's asks this side serves at once (None: no bound); at the
        #: bound this side reads nothing more from the connection until one is answered,
        #: so a flood of asks waits in the transport's bounded buffers (and, through the
        #: credits, at its sender), not as tasks here
        self.max_asks = max_asks
        self._serving = 0  #: the other side's asks being served now
        #: serve an ask only while the connection has room to send its answer: its send
        #: credits exceed the asks being served, and its bytes queued to send are under
        #: the transport's bound; and compute one answer at a time (:meth:`_serve_ask`),
        #: so a reader that takes nothing gets nothing computed for it, and a reader
        #: that reads nothing holds at most one answer beyond that bound
        self.reply_room = reply_room
        self._answering = anyio.Lock()
        self._slot: anyio.Event | None = None  #: set when one of them ends
        #: why the other side may not send pickles (its token's role), when it may not
        self.no_pickle = no_pickle
        self.heartbeat = heartbeat
        self.timeout = timeout if timeout is not None else (3 * heartbeat if heartbeat else None)
        self.closed_reason = ""
        #: this side closed the connection for the other's silence (over ``timeout``)
        self.silent = False
        self._last_in = self._last_out = anyio.current_time()
        #: when the heartbeat loop's next check is due (None: no heartbeat loop yet)
        self._due: float | None = None
        #: the last stall of this side's event loop: (seconds, when it ended)
        self._stall: tuple[float, float] | None = None
        self._why: str | None = None  #: :meth:`why_closed`, as it was at the close
        self.target = target
        self.name = name
        self.allow_pickle = allow_pickle
        self.on_close = on_close
        #: told of a posted message too large to send (and to split): whether it took it
        #: (else it is logged as dropped)
        self.on_too_large = on_too_large
        #: told the seconds this side's event loop was stalled (rule 5), once per stall
        self.on_stall = on_stall
        self.ref = RemoteRef(self)
        self.closed = False
        #: this side stops on purpose (a client closing): a message that comes for its
        #: actor stopped meanwhile is expected, dropped with a debug record, not a warning
        self.stopping = False
        self.bad_frames = 0
        #: why the other side refused us (its Refused frame), raised instead of ActorStopped
        self.refusal: BaseException | None = None
        #: the other side's goodbye (a manager stopping on purpose: ManagerStopping)
        self.farewell: BaseException | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._out: deque[Frame] = deque()
        self._wake = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve the connection until it closes (then fail pending asks)."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._send_loop)
                if self.heartbeat:
                    tg.start_soon(self._heartbeat_loop)
                task_status.started()
                await self._receive_loop()
                tg.cancel_scope.cancel()
        finally:
            self._closed()
            with anyio.CancelScope(shield=True):
                await self.conn.aclose()

    async def aclose(self) -> None:
        await self.conn.aclose()

    async def refuse(self, error: BaseException) -> None:
        """Tell the other side why we will not serve it, then close (:func:`refuse`)."""
        self.closed_reason = f"refused: {error}"
        await refuse(self.conn, error)

    async def say_goodbye(self, error: BaseException) -> None:
        """This side stops on purpose: tell the other side so (``error`` in a
        :class:`Refused` frame, which it keeps as its ``farewell``) and close, with a
        websocket's code 1001 (going away) rather than a refusal's 1008."""
        self.closed_reason = str(error)
        await refuse(self.conn, error, going_away=True)

    def why_closed(self) -> str:
        """Why the connection ended, as far as this side knows: its own reason (the
        other side silent, refused, a goodbye), else the transport's (the other side's
        close, with its reason if it gave one); and, when this side's event loop had not
        run for longer than a heartbeat just before (the process was paused, SIGSTOP, or
        its loop blocked), that too: the other side heard nothing from it meanwhile."""
        if self._why is not None:
            return self._why
        reason = self.closed_reason or str(getattr(self.conn, "close_reason", None) or "")
        reason = reason or "the connection closed"
        stalled = self._stalled()
        if stalled:
            reason += (
                f"; this side's event loop had not run for {stalled:.1f} s just before (its "
                "process paused, SIGSTOP or a suspended terminal, or its loop blocked), so "
                "the other side heard nothing from it meanwhile"
            )
        return reason

    def _stalled(self) -> float:
        """Seconds this side's event loop has just been stalled (0: it was not): a stall
        the heartbeat loop has not seen yet (its check is overdue), or one that ended
        within the last heartbeat."""
        if not self.heartbeat or self._due is None:
            return 0.0
        now = anyio.current_time()
        if now - self._due > self.heartbeat:
            return now - self._due
        if self._stall is not None and now - self._stall[1] <= self.heartbeat:
            return self._stall[0]
        return 0.0

    def _gone(self, what: str) -> BaseException:
        """The error for using a closed connection: the refusal, if we were refused."""
        if self.refusal is not None:
            return copy.copy(self.refusal)  # one instance per raise: tracebacks stay apart
        return ActorStopped(self.name, what, closed=self.why_closed())

    # -- outgoing ------------------------------------------------------------------------

    def post(self, msg: Any, causal_id: str) -> None:
        """Queue a tell without waiting (bounded by design on the caller's side)."""
        if self.closed:
            raise self._gone(type(msg).__name__)
        self._out.append(Frame(to_wire(msg), causal_id))
        self._wake.set()

    async def tell(self, msg: Any, causal_id: str) -> None:
        if self.closed:
            raise self._gone(type(msg).__name__)
        await self._flush()
        await self._send(Frame(to_wire(msg), causal_id))

    async def ask(self, msg: Any, causal_id: str, timeout: float | None) -> Any:  # noqa: ASYNC109
        if self.closed:
            raise self._gone(type(msg).__name__)
        rid = next(self._ids)
        pending = self._pending[rid] = _Pending()
        try:
            with anyio.move_on_after(timeout if timeout is not None else float("inf")) as scope:
                await self._flush()
                await self._send(Frame(to_wire(msg), causal_id, request_id=rid))
                await pending.done.wait()
            if scope.cancelled_caught and not pending.done.is_set():
                raise AskTimeout(self.name, type(msg).__name__, timeout or 0.0)
        finally:
            self._pending.pop(rid, None)
        if pending.error is not None:
            raise pending.error
        return pending.value

    async def _heartbeat_loop(self) -> None:
        assert self.heartbeat is not None and self.timeout is not None
        while True:
            due = self._due = anyio.current_time() + self.heartbeat / 2
            await anyio.sleep(self.heartbeat / 2)
            now = anyio.current_time()
            late = now - due
            if late > self.heartbeat:  # our own loop was stalled: we could not read
                self._stall = (late, now)
                self._last_in = min(now, self._last_in + late)
                if self.on_stall is not None:
                    self.on_stall(late)
            # A transport that sees parts of a frame (ws chunks) says when it last heard
            # anything, so a large frame on the wire does not look like silence.
            heard = getattr(self.conn, "last_received", None)
            if isinstance(heard, float) and heard > self._last_in:
                self._last_in = heard
            if now - self._last_in > self.timeout:
                silent = now - self._last_in
                self.closed_reason = f"no message for {silent:.1f} s (dead peer)"
                self.silent = True
                _log.warning("peer silent; closing", peer=self.name, reason=self.closed_reason)
                # The other side learns why, should it be alive (its process was paused):
                await self.conn.aclose(
                    reason=f"no message from you for {silent:.1f} s, over the "
                    f"{self.timeout:g} s allowed (dead peer)"
                )
                return
            stalled = self.conn.send_stalled
            if stalled > self.timeout and late <= self.heartbeat:
                await self._close_unread(stalled)
                return
            if now - self._last_out >= self.heartbeat:
                self.post(Ping(), "")

    async def _close_unread(self, stalled: float) -> None:
        """Close a connection whose peer has read nothing of what this side queued for
        it, at the transport's bound, for longer than ``timeout``."""
        queued = getattr(self.conn, "queued_bytes", 0)
        self.closed_reason = (
            f"it read nothing for {stalled:.1f} s of the {queued / 2**20:.1f} MiB queued "
            f"for it, over the {self.timeout:g} s allowed (a peer that does not read)"
        )
        _log.warning("peer reads nothing; closing", peer=self.name, reason=self.closed_reason)
        await self.conn.aclose(
            reason=f"you read nothing for {stalled:.1f} s of the {queued / 2**20:.1f} MiB "
            f"queued for you, over the {self.timeout:g} s allowed"
        )

    async def _send(self, frame: Frame) -> None:
        self._last_out = anyio.current_time()
        try:
            await self.conn.send(frame)
        except CorralError as exc:
            if self.conn.closed:
                what = type(frame.msg).__name__
                raise ActorStopped(self.name, what, closed=self.why_closed()) from exc
            raise

    async def _flush(self) -> None:
        if self._out:
            frames = list(self._out)
            self._out.clear()
            self._last_out = anyio.current_time()
            try:
                await self.conn.send_many(frames)
            except FrameTooLarge:  # too much at once: one at a time, a message apart
                for frame in frames:
                    await self._send_alone(frame)

    async def _send_alone(self, frame: Frame) -> None:
        """Send a posted ``frame`` on its own; one too large goes as its parts (a
        message with ``split()``, such as RunTasks), and a part still too large is
        handed to ``on_too_large``, and logged unless that took it: never lost without a
        word, and the connection goes on."""
        try:
            await self.conn.send(frame)
        except FrameTooLarge as exc:
            msg: Any = frame.msg
            if isinstance(msg, PickledMsg):  # ours, pickled here: read back (rare)
                msg = cloudpickle.loads(msg.payload)
            split = getattr(msg, "split", None)
            parts = split() if split is not None else []
            if len(parts) > 1:
                for part in parts:
                    await self._send_alone(Frame(to_wire(part), frame.causal_id))
            elif self.on_too_large is None or not self.on_too_large(msg, exc):
                _log.error(
                    "message too large to send; dropped", peer=self.name,
                    message=type(msg).__name__, size=exc.fields.get("size"),
                    limit=exc.fields.get("limit"),
                )  # fmt: skip

    async def _send_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            try:
                await self._flush()
            except CorralError:
                return  # closed: the receive loop ends the peer

    # -- incoming ------------------------------------------------------------------------

    async def _receive_loop(self) -> None:
        while True:
            try:
                frame = await self.conn.receive()
            except ConnectionClosed:
                return
            self._last_in = anyio.current_time()
            if type(frame.msg) is Ping and not frame.request_id:
                continue  # a heartbeat: its arrival is all it says
            if frame.reply_to:
                self._resolve(frame)
                continue
            if type(frame.msg) is Refused and frame.msg.kind == ManagerStopping.__name__:
                # Not a refusal: a goodbye from a manager that stops on purpose.
                self.farewell = refusal_error(frame.msg, allow_pickle=self.allow_pickle)
                self.closed_reason = frame.msg.text
                _log.info("the peer is stopping", peer=self.name, reason=frame.msg.text)
                continue
            if type(frame.msg) is Refused:  # the other side closes on us, and says why
                self.refusal = refusal_error(frame.msg, allow_pickle=self.allow_pickle)
                self.closed_reason = f"refused: {frame.msg.text}"
                _log.warning("refused by the peer", peer=self.name, reason=frame.msg.text)
                continue
            if type(frame.msg) is ErrorReply and not frame.request_id:
                # Answers nothing: the other side's transport reporting bad input we sent.
                _log.warning("the peer reports an error", peer=self.name, error=frame.msg.text)
                continue
            try:
                msg = from_wire(frame.msg, allow_pickle=self.allow_pickle, no_pickle=self.no_pickle)
            except GraphNotLoadable as exc:  # the sender's graph, not its frame: refused
                _log.warning("refused a graph", peer=self.name, error=str(exc))
                if frame.request_id:  # as itself, to a sender whose pickles we open
                    reply = _error_reply(exc, self.allow_pickle)
                    await self._reply(frame.request_id, reply, frame.causal_id)
                continue
            except ProtocolError as exc:
                self.bad_frames += 1
                _log.warning("refused a frame", peer=self.name, error=str(exc))
                if frame.request_id:
                    await self._reply(frame.request_id, _error_reply(exc, False), frame.causal_id)
                continue
            if self.target is None:
                if frame.request_id:
                    err = CorralError(f"{self.name}: nothing serves requests on this side")
                    await self._reply(frame.request_id, _error_reply(err, False), frame.causal_id)
                continue
            if frame.request_id:
                assert self._tg is not None
                await self._ask_slot()
                if self.max_asks is not None and self.conn.closed:
                    continue  # its buffered asks (reads): nobody to answer them
                self._serving += 1
                self._tg.start_soon(self._serve_ask, msg, frame.request_id, frame.causal_id)
            else:
                try:
                    # origin: a handler failure is this message's, not the actor's.
                    await self.target.tell(msg, causal_id=frame.causal_id or None, origin=self.name)
                except ActorStopped:
                    # (the other side sent it before it heard of our close: expected then)
                    log = _log.debug if self.stopping else _log.warning
                    log(
                        "dropped a message for a stopped actor", peer=self.name,
                        message=type(msg).__name__, stopping=self.stopping,
                    )  # fmt: skip
                except CorralError as exc:  # refused on the way in, say: the message's fault
                    _log.warning(
                        "dropped a message", peer=self.name, message=type(msg).__name__,
                        error=str(exc),
                    )  # fmt: skip

    async def _ask_slot(self) -> None:
        """Wait, reading nothing, while :attr:`max_asks` asks are being served (with
        :attr:`reply_room`: or while the connection's send room does not exceed them)."""
        while self.max_asks is not None and self._serving >= self.max_asks:
            await self._slot_freed()
        conn = self.conn
        while self.reply_room and not conn.closed and conn.send_room <= self._serving:
            if self._serving < conn.max_buffer:
                await conn.wait_send_room(self._serving + 1)
            else:  # room for that many never comes: wait for answers to go first
                await self._slot_freed()

    async def _slot_freed(self) -> None:
        """Wait until one of the asks being served ends."""
        slot = self._slot
        if slot is None:
            slot = self._slot = anyio.Event()
        await slot.wait()

    async def _serve_ask(self, msg: Any, rid: int, causal_id: str) -> None:
        try:
            if not self.reply_room:
                await self._answer(msg, rid, causal_id)
                return
            async with self._answering:  # one answer computed at a time, with room for it
                await self.conn.wait_send_room(1)
                if not self.conn.closed:
                    await self._answer(msg, rid, causal_id)
        finally:
            self._serving -= 1
            slot, self._slot = self._slot, None
            if slot is not None:
                slot.set()

    async def _answer(self, msg: Any, rid: int, causal_id: str) -> None:
        assert self.target is not None
        try:
            value = await self.target.ask(msg, timeout=None, causal_id=causal_id or None)
            reply = to_wire(value) if value is not None else None
        except Exception as exc:
            reply = _error_reply(exc, self.allow_pickle)
        await self._reply(rid, reply, causal_id)

    async def _reply(self, rid: int, reply: Message | None, causal_id: str) -> None:
        msg = reply if reply is not None else _NONE
        try:
            await self.conn.send(Frame(msg, causal_id, reply_to=rid))
        except CorralError as exc:
            if self.conn.closed:
                return  # closed meanwhile: the asker's ask fails
            # Not sendable (too large for a frame, say): the asker gets this error at
            # once instead of waiting out its timeout, or forever without one.
            _log.warning("could not send a reply", peer=self.name, error=str(exc))
            with contextlib.suppress(CorralError):
                error = _error_reply(exc, self.allow_pickle)
                await self.conn.send(Frame(error, causal_id, reply_to=rid))

    def _resolve(self, frame: Frame) -> None:
        pending = self._pending.get(frame.reply_to)
        if pending is None:
            return  # timed out meanwhile
        msg = frame.msg
        if isinstance(msg, ErrorReply):
            pending.error = _error_from(msg, self.allow_pickle)
        elif msg is _NONE or isinstance(msg, _NoneReply):
            pending.value = None
        elif isinstance(msg, JsonReply):
            pending.value = msg.value
        elif isinstance(msg, MessagesReply):
            pending.value = msg.items
        else:
            try:
                pending.value = from_wire(msg, allow_pickle=self.allow_pickle)
            except ProtocolError as exc:
                pending.error = exc
        pending.done.set()

    def _closed(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._why = self.why_closed()
        for pending in self._pending.values():
            pending.error = self._gone("reply")
            pending.done.set()
        if self.on_close is not None:
            self.on_close(self)


@message("corral.NoneReply")
class _NoneReply(Message):
    """The answer to an ask whose handler returned ``None``."""


_NONE = _NoneReply()


class RemoteRef:
    """An actor reference whose messages travel over a :class:`Peer`'s connection.

    Offers what :class:`runtime.kernel.ActorRef` offers (``tell``, ``tell_nowait``,
    ``post``, ``ask``, ``stop``, ``stopped``, ``name``), so actors cannot tell whether
    the actor they talk to is local.
    """

    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    @property
    def name(self) -> str:
        return self.peer.name

    @property
    def stopped(self) -> bool:
        return self.peer.closed

    def __repr__(self) -> str:
        return f"<RemoteRef {self.name} {'closed' if self.stopped else 'open'}>"

    def post(self, msg: Message, *, causal_id: str | None = None) -> None:
        self.peer.post(msg, causal_id or current_causal_id() or new_causal_id())

    def tell_nowait(self, msg: Message, *, causal_id: str | None = None) -> None:
        self.post(msg, causal_id=causal_id)

    async def tell(self, msg: Message, *, causal_id: str | None = None) -> None:
        await self.peer.tell(msg, causal_id or current_causal_id() or new_causal_id())

    async def ask(
        self,
        msg: Message,
        *,
        timeout: float | None = 30.0,  # noqa: ASYNC109 - the same API as ActorRef.ask
        causal_id: str | None = None,
    ) -> Any:
        cid = causal_id or current_causal_id() or new_causal_id()
        return await self.peer.ask(msg, cid, timeout)

    def stop(self, reason: str = "") -> None:
        """Close the connection (the remote side sees it end)."""
        if self.peer._tg is not None:
            self.peer._tg.start_soon(self.peer.aclose)
