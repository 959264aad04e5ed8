"""Corral's exception types.

What lives here: every exception Corral raises to its users, each with the fields a
program needs and a message that says what to do next. All of them pickle (their
``__reduce__`` rebuilds them from their fields), so they cross process boundaries.

This module is the base of the import stack: it imports nothing of Corral's. The
modules that raise an error re-export it under the name they always had (for example
``actors.executor.TaskProcessDied``, ``transport.ConnectFailed``).
"""

from __future__ import annotations

import contextlib
import difflib
import re
import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

__all__ = [
    "ActorCrashed",
    "ActorStopped",
    "AddressInUse",
    "AskTimeout",
    "AuthenticationFailed",
    "BatchSystemError",
    "CancelledError",
    "ClusterAlreadyStarted",
    "ClusterClosed",
    "ConnectFailed",
    "ConnectionClosed",
    "ConsoleError",
    "CorralError",
    "CorralHomeDenied",
    "CorralHomeError",
    "CycleError",
    "DaskOnlyArgument",
    "DependencyFailed",
    "DiskFull",
    "EagerComputeOnCluster",
    "FrameTooLarge",
    "GraphError",
    "GraphNotLoadable",
    "InputsUnreachable",
    "InvalidAddress",
    "InvalidTransition",
    "MailboxFull",
    "ManagerLost",
    "ManagerStopping",
    "ManagerUnreachable",
    "MemoryConfigError",
    "MemoryStalled",
    "MissingKeysError",
    "MonitoringDBError",
    "PackageShadowed",
    "ParslOnlyArgument",
    "PermissionDenied",
    "PolicyCreateError",
    "PolicyKindError",
    "PolicyParamsError",
    "ProtocolError",
    "ProtocolMismatch",
    "RemoteError",
    "ReportOutputError",
    "ReportRunError",
    "ResultNotPicklable",
    "RetryPolicyLoop",
    "RunNoAnswer",
    "RunNotSent",
    "RunQueueFull",
    "ShuffleMethodError",
    "SubmissionsSuspended",
    "TaskArgumentsTooLarge",
    "TaskCrashedWorkers",
    "TaskErrorTooLarge",
    "TaskExited",
    "TaskLongerThanWalltime",
    "TaskNotLoadable",
    "TaskOutOfMemory",
    "TaskProcessDied",
    "TaskTimeout",
    "TaskTooBigForDisk",
    "TaskTooLarge",
    "TokenFileError",
    "TooManyFrames",
    "TransportError",
    "UnknownCategory",
    "UnknownFuture",
    "UnknownPolicyError",
    "UnknownStream",
    "UnknownWorkers",
    "ValueTooLarge",
    "WorkerCoreFailed",
    "WorkerLost",
    "WorkersTimeout",
    "describe_exit",
]


class CorralError(Exception):
    """Base of every Corral error."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.message = message
        self.fields = fields
        for name, value in fields.items():
            setattr(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.fields))

    def __str__(self) -> str:  # (before KeyError's, which quotes it, in a subclass's MRO)
        return self.message


def _rebuild(cls: type[CorralError], message: str, fields: dict[str, Any]) -> CorralError:
    err = cls.__new__(cls)
    CorralError.__init__(err, message, **fields)
    return err


def _names(keys: Iterable[object], limit: int = 8) -> str:
    keys = [str(k) for k in keys]
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


# ----------------------------------------------------------------------------- actors


class PackageShadowed(CorralError, ImportError):
    """One of Corral's top-level packages (``package``: ``runtime``, ``actors``,
    ``policies`` or ``transport``) would be imported from ``shadow``, a module or folder
    of the same name that comes first on ``sys.path`` (the script's directory, or the
    working directory under ``python -m``), instead of from Corral's installation
    (``corral``, the directory that holds Corral's packages). Raised when ``runtime`` is
    imported (:func:`runtime.packages.check_packages`), before anything imports the
    wrong one. An :class:`ImportError`, and defined here, in a module that imports
    nothing of Corral's, so it can be raised with the others shadowed."""

    def __init__(self, package: str, shadow: str, corral: str) -> None:
        super().__init__(
            f"{shadow} shadows Corral's package {package!r} (Corral is installed in "
            f"{corral}): Python finds it first on sys.path (the script's directory, or "
            f"the working directory under `python -m`). Rename it, or run from another "
            f"directory (with Corral installed, the `corral` command does not look in the "
            f"working directory)",
            package=package,
            shadow=shadow,
            corral=corral,
        )


class ActorStopped(CorralError):
    """A message was sent to an actor that has stopped (or is stopping)."""

    def __init__(self, actor: str, message_type: str = "", closed: str = "") -> None:
        what = f" ({message_type})" if message_type else ""
        if closed:  # a remote reference whose connection closed: the actor may be alive
            text = (
                f"the connection to {actor!r} closed ({closed}); the message{what} was not "
                "delivered. The actor there may well be running: this side reconnects "
                "if it can, else look up a live reference."
            )
        else:
            text = (
                f"actor {actor!r} has stopped; the message{what} was not delivered. "
                "Look up a live reference (the actor may have been restarted under a new "
                "one) or check its logs for why it stopped."
            )
        super().__init__(text, actor=actor, message_type=message_type, closed=closed)


class AskTimeout(CorralError, TimeoutError):
    """``ActorRef.ask`` got no reply in time. The message may still be processed."""

    def __init__(self, actor: str, message_type: str, timeout: float) -> None:
        super().__init__(
            f"actor {actor!r} did not answer {message_type} within {timeout:g} s. "
            "It may be overloaded or blocked; the request may still be processed later. "
            "Raise the timeout or inspect the actor with story().",
            actor=actor,
            message_type=message_type,
            timeout=timeout,
        )


class MailboxFull(CorralError):
    """``tell_nowait`` found the actor's bounded mailbox full (use ``await tell``)."""

    def __init__(self, actor: str, capacity: int) -> None:
        super().__init__(
            f"mailbox of actor {actor!r} is full ({capacity} messages). Use `await ref.tell()` "
            "to wait for room, or give the actor a larger mailbox.",
            actor=actor,
            capacity=capacity,
        )


class ActorCrashed(CorralError):
    """An actor failed more often than its restart budget allows."""

    actor: str
    restarts: int
    cause: str

    def __init__(self, actor: str, restarts: int, cause: str) -> None:
        super().__init__(
            f"actor {actor!r} crashed after {restarts} restart(s); last error: {cause}. "
            "The actor system was shut down; fix the handler or raise its restart budget.",
            actor=actor,
            restarts=restarts,
            cause=cause,
        )


# ----------------------------------------------------------------------------- wire


class ProtocolError(CorralError):
    """A frame or message could not be encoded or decoded."""

    def __init__(self, message: str, field: str = "", type_name: str = "") -> None:
        super().__init__(message, field=field, type_name=type_name)


class FrameTooLarge(ProtocolError):
    """A frame would be (or is) larger than the connection's message limit. Large
    values do not travel in one frame; see ``actors/transfer.py``."""

    def __init__(self, message: str, size: int, limit: int) -> None:
        CorralError.__init__(self, message, field="", type_name="", size=size, limit=limit)


class TooManyFrames(ProtocolError):
    """Received data holds more frames than its sender had credits for (the codec's
    ``max_frames``): a flow-control violation, which a transport closes the connection
    for, unlike a malformed message (a plain :class:`ProtocolError`), which it answers
    and drops."""

    def __init__(self, message: str, frames: int, limit: int) -> None:
        CorralError.__init__(self, message, field="", type_name="", frames=frames, limit=limit)


class ProtocolMismatch(ProtocolError):
    """A manager refused a worker, client or console (``kind``, named ``name``) at its
    Hello: the peer speaks version ``peer`` of the protocol between a manager and its
    peers, the manager ``manager`` (of Corral ``version``), and a manager serves only
    peers of its own (``runtime.node.PROTOCOL_VERSION``; 0: a peer from before protocol
    versions). An older peer must be upgraded, a newer one waits for its manager's
    upgrade. Nothing of it was registered: a refused worker was never given a task."""

    kind: str
    name: str
    peer: int
    manager: int
    version: str

    def __init__(self, kind: str, name: str, peer: int, manager: int, version: str) -> None:
        if peer < manager:
            peers = (
                "0 (a Corral from before protocol versions, older than the manager's)"
                if peer == 0
                else f"{peer}, older than the manager's"
            )
            todo = (
                f"upgrade this {kind}'s Corral to the manager's (the same release or "
                f"checkout) and start it again"
            )
        else:
            peers = f"{peer}, newer than the manager's"
            todo = "upgrade the manager first (or run the same version on both)"
        CorralError.__init__(
            self,
            f"the manager refused this {kind} ({name!r}): it speaks Corral protocol "
            f"{peers}, and the manager speaks protocol {manager} (Corral {version}), the "
            f"only one it serves: {todo}. See docs/deployment.md, Upgrading Corral",
            field="",
            type_name="",
            kind=kind,
            name=name,
            peer=peer,
            manager=manager,
            version=version,
        )


class RemoteError(CorralError):
    """The remote handler raised an exception that could not be shipped as itself."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(f"remote {kind}: {text}", kind=kind, text=text)


class UnknownStream(CorralError):
    """A ReadStream named a stream that is closed, expired or never was."""

    def __init__(self, stream: int, idle: float = 120.0) -> None:
        # idle: the bound after which an unread stream is closed (actors/transfer.py's
        # IDLE_SECONDS, which passes it; this module imports nothing of Corral's)
        super().__init__(
            f"stream {stream} is not open here: it was read to its end, closed, or left "
            f"unread for over {idle:.0f} s. Ask for the value again.",
            stream=stream,
        )


# ----------------------------------------------------------------------------- connections


class TransportError(CorralError):
    """Base of every transport error."""


class ConnectionClosed(TransportError):
    """The connection (or listener) is closed: by this side, or by the peer.

    Raised by ``send`` as soon as either side has closed, by ``receive`` once every
    frame the peer sent before closing has been received, and by ``accept`` on a
    closed listener. ``address`` is the local address, ``reason`` says who closed.
    """

    address: str
    reason: str

    def __init__(self, address: str, reason: str) -> None:
        super().__init__(
            f"connection {address} is closed ({reason}). Frames can no longer be sent on it; "
            "open a new connection with transport.connect() to continue.",
            address=address,
            reason=reason,
        )


#: what a :class:`ConnectFailed` says to do unless its cause says better
CHECK_LISTENER = "Check that a listener is running at that address and is reachable."


class ConnectFailed(TransportError):
    """No connection could be made: nothing listens there, it refused, or it timed out.
    ``hint`` says what to do (default :data:`CHECK_LISTENER`)."""

    address: str
    reason: str
    hint: str

    def __init__(self, address: str, reason: str, hint: str = CHECK_LISTENER) -> None:
        super().__init__(
            f"could not connect to {address}: {reason}. {hint}",
            address=address,
            reason=reason,
            hint=hint,
        )


class AddressInUse(TransportError):
    """Another listener already listens on this address."""

    address: str

    def __init__(self, address: str) -> None:
        super().__init__(
            f"address {address} is already in use by another listener. Close that listener "
            "first, or listen on another address (an empty inproc name or port 0 picks a free "
            "one; listener.address tells which).",
            address=address,
        )


class InvalidAddress(TransportError, ValueError):
    """The address is malformed or names a scheme no backend is registered for."""

    address: str
    reason: str
    schemes: list[str]

    def __init__(self, address: str, reason: str, schemes: Sequence[str] = ()) -> None:
        known = ", ".join(f"{s}://" for s in schemes) or "none registered"
        super().__init__(
            f"invalid transport address {address!r}: {reason}. Addresses look like "
            f"scheme://location; known schemes: {known}.",
            address=address,
            reason=reason,
            schemes=list(schemes),
        )


class AuthenticationFailed(ConnectFailed):
    """The listener refused the handshake: no token, or a token it does not know.

    ``status`` is the HTTP status of the refusal (401: no or malformed credentials,
    403: the token matches none of the listener's tokens). ``hint``: what to do, for
    the kind of connection refused (a client's: ``Cluster._token_refused``); by default
    :data:`TOKENS_HINT`.
    """

    status: int

    def __init__(self, address: str, reason: str, status: int = 401, hint: str = "") -> None:
        ConnectFailed.__init__(self, address, reason, hint or TOKENS_HINT)
        self.status = self.fields["status"] = status


#: where a manager keeps its tokens and how each kind of connection is given one: what an
#: :class:`AuthenticationFailed` says to do unless its raiser knows better
TOKENS_HINT = (
    "A manager keeps its four tokens (admin, submit, worker and read) in its token file "
    "(~/.corral/tokens/HOST_PORT.json on its machine, CORRAL_HOME/tokens/ if set, or its "
    "--token-file; new ones at each start, unless it runs with --keep-tokens) and prints "
    "only the read token, in its dashboard URL. Command line (console, worker): "
    "--token-file PATH (a file holding the token, mode 0600) or --token TOKEN or "
    "CORRAL_TOKEN, else that file on this machine. Python: Cluster(address, "
    "token_file=... or token=...) or CORRAL_TOKEN, else that file on this machine."
)


class PermissionDenied(CorralError):
    """This connection's role may not do that (see :data:`ALLOWED`, docs/security.md)."""

    def __init__(self, what: str, message: str = "", **fields: Any) -> None:
        super().__init__(
            message or f"{what} needs the admin token; this connection has the read-only one",
            what=what,
            **fields,
        )


# ----------------------------------------------------------------------------- graphs


class GraphError(CorralError, ValueError):
    """A submitted graph is not valid; nothing of it was run."""


def _not_loadable_text(what: str, module: str, where: str, reason: str) -> str:
    """What :class:`TaskNotLoadable` and :class:`GraphNotLoadable` say: the function or
    argument ``what`` (qualified; ``""``: only the module is known) could not be loaded
    in ``where`` (a process) because ``module`` is not importable there."""
    thing = f"the function or argument {what!r}" if what else "a function or argument"
    return (
        f"{thing} could not be loaded in {where}: module {module!r} is not importable "
        f"there ({reason}). Put the module on that process's PYTHONPATH (install the "
        "package where the workers and the manager run: a sys.path change in the client "
        "does not reach them), or have cloudpickle send its code with the task: "
        f"cloudpickle.register_pickle_by_value({module.partition('.')[0]}) in the client, "
        "after importing it."
    )


class GraphNotLoadable(GraphError):
    """A manager process could not load a submitted graph: a task's function or
    argument (``what``) comes from a module (``module``) that the manager cannot
    import (``reason``: what loading raised, also the ``__cause__`` on the manager's
    side). The graph was refused; nothing of it ran."""

    def __init__(self, what: str, module: str, reason: str) -> None:
        super().__init__(
            "the graph was refused, nothing of it ran: "
            + _not_loadable_text(what, module, "the manager process", reason),
            what=what,
            module=module,
            reason=reason,
        )


class CycleError(GraphError):
    def __init__(self, cycle: list[str]) -> None:
        super().__init__(
            f"the graph has a cycle: {' -> '.join(repr(k) for k in cycle)}. "
            "A task cannot depend on its own output; break the cycle.",
            cycle=cycle,
        )


class MissingKeysError(GraphError, KeyError):
    """A task depends on keys the graph does not define, or a requested key is unknown."""

    def __init__(
        self, missing: dict[str, list[str]] | Sequence[object], *, requested: bool = False
    ) -> None:
        if requested:
            keys = sorted(map(str, missing))
            text = (
                f"requested key(s) {_names(keys)} are not in the graph. "
                "Ask only for keys the graph defines."
            )
            super().__init__(text, missing=keys, requested=True)
        else:
            assert isinstance(missing, dict)
            parts = [f"{dep!r} (needed by {_names(users, 3)})" for dep, users in missing.items()]
            text = (
                f"the graph refers to key(s) it does not define: {'; '.join(parts[:8])}. "
                "Add them to the graph or pass them as data. A key of an earlier "
                "submission can be used only while a client holds a Future of it."
            )
            super().__init__(text, missing=missing, requested=False)


class ShuffleMethodError(GraphError):
    """A graph has a dask shuffle Corral cannot run correctly: dask's disk (partd)
    shuffle, or its p2p shuffle. Fields ``method`` (``"disk"`` or ``"p2p"``) and
    ``found`` (where: the config setting, or a task's key)."""

    def __init__(self, method: str, found: str) -> None:
        if method == "disk":
            why = (
                "its tasks append rows to a partd directory outside their outputs, so a "
                "retry after a lost worker, or a speculative copy of a slow task, adds "
                "those rows again (wrong results, with no error), and workers on several "
                "machines do not share that directory"
            )
        else:
            why = "its tasks run only on dask.distributed's workers, which Corral's are not"
        super().__init__(
            f"the graph has dask's {method} shuffle ({found}): {why}. Nothing of it was "
            "run. Use the task shuffle: dask.config.set({'dataframe.shuffle.method': "
            "'tasks'}) before building the collection (or a merge's "
            "shuffle_method='tasks', a bag groupby's shuffle='tasks'); a dataframe "
            "computed with the method unset gets the task shuffle from Corral.",
            method=method,
            found=found,
        )


class UnknownPolicyError(CorralError, KeyError):
    """No policy of that kind has that name. ``in_manager``: the request came from
    another process (a client or console of a manager process), where registering the
    policy does not make it known to the manager. ``in_config``: the name is in a
    manager's ``[policies]`` (its ``--config`` file), read once its ``--policy-module``
    modules are imported."""

    kind: str
    name: str
    available: list[str]
    in_manager: bool
    in_config: bool

    def __init__(
        self,
        kind: str,
        name: str,
        available: Iterable[str],
        *,
        in_manager: bool = False,
        in_config: bool = False,
    ) -> None:
        avail = sorted(available)
        where, fix = "", "Register it with policies.register() or pick one of these."
        if in_config:
            fix = (
                "A policy of your own must be registered in the manager's process before "
                "its [policies] are read: start the manager with `--policy-module "
                "MODULE` (MODULE: the module, or .py file, whose import calls "
                "policies.register(); `python -m runtime check --config FILE "
                "--policy-module MODULE` checks the two together), or pick one of these."
            )
        if kind == "kind of":  # the kinds are Corral's: none can be registered
            super().__init__(
                f"no kind of policy named {name!r}{did_you_mean(name, avail, '.')} The kinds "
                f"are: {', '.join(avail)} (a kind cannot be registered: "
                "policies.register(kind, name) registers a policy of one of these kinds).",
                kind=kind,
                name=name,
                available=avail,
                in_manager=in_manager,
            )
            return
        if in_manager:
            where = " in the manager process"
            fix = (
                "Policies run in the manager's scheduler, so a policy must be registered "
                "in the manager's process, not in the client's: start the manager with "
                "`python -m runtime manager --policy-module MODULE` (MODULE: the "
                "module, or .py file, whose import calls policies.register()), or pick "
                "one of these."
            )
        super().__init__(
            f"no {kind} policy named {name!r}{where}{did_you_mean(name, avail, '.')} "
            f"Available: {', '.join(avail) or 'none'}. {fix}",
            kind=kind,
            name=name,
            available=avail,
            in_manager=in_manager,
            in_config=in_config,
        )


class UnknownCategory(CorralError, KeyError):
    """``forget CATEGORY`` (``ForgetCategoryRequest``) named a task category the
    scheduler keeps no statistics of: none of its tries ended yet, it was forgotten
    (past ``MAX_CATEGORIES``), or the name is misspelt. Fields ``category``, ``known``
    (how many categories it keeps)."""

    category: str
    known: int

    def __init__(self, category: str, known: Iterable[str]) -> None:
        names = list(known)
        super().__init__(
            f"no task category {category!r} has statistics in the scheduler"
            f"{did_you_mean(category, names, '.')} It keeps {len(names)} categories: "
            "`status --categories all` lists them (a category is a key's prefix, as "
            "dask's key_split makes it: 'random' for ('random-3f2a...', 0, 1))",
            category=category,
            known=len(names),
        )


class PolicyParamsError(CorralError, TypeError):
    def __init__(self, kind: str, name: str, error: str) -> None:
        super().__init__(
            f"bad parameters for {kind} policy {name!r}: {error}. "
            "See docs/policies.md for the parameters each policy takes.",
            kind=kind,
            name=name,
            error=error,
        )


class PolicyKindError(CorralError, TypeError):
    """A policy given for ``kind`` lacks that kind's method(s) (``missing``): an object
    of another kind, or registered under the wrong kind. Refused when a class is
    registered (``policies.register``), and when a policy is set."""

    def __init__(self, kind: str, name: str, missing: Iterable[str], has: Iterable[str]) -> None:
        missing, has = list(missing), list(has)
        others = f" (it has {', '.join(has)}: a policy of another kind?)" if has else ""
        super().__init__(
            f"{kind} policy {name!r} has no method {', '.join(missing)}{others}: a {kind} "
            f"policy must define {', '.join(missing)}. Register it under the kind whose "
            "method it has, or add the method (docs/policies.md#writing-and-registering-"
            "your-own lists each kind's).",
            kind=kind,
            name=name,
            missing=missing,
        )


class PolicyCreateError(CorralError, RuntimeError):
    """A policy's constructor raised something other than ``ValueError`` or
    ``TypeError`` (which are :class:`PolicyParamsError`): ``error`` is what it
    raised, as text."""

    def __init__(self, kind: str, name: str, params: Mapping[str, Any], error: str) -> None:
        given = ", ".join(f"{k}={v!r}" for k, v in params.items()) or "none"
        super().__init__(
            f"{kind} policy {name!r} could not be created (parameters: {given}): its "
            f"constructor raised {error}. Fix what it needs (or its parameters), or pick "
            "another policy; nothing was changed.",
            kind=kind,
            name=name,
            error=error,
        )


class RetryPolicyLoop(CorralError):
    """The retry policy kept retrying a task past the core's ceiling: ``free`` retries
    beyond the task's ``retries=`` budget (``MAX_FREE_RETRIES``)."""

    def __init__(self, key: str, policy: str, free: int, tries: int, reason: str) -> None:
        said = f" (its latest reason: {reason!r})" if reason else ""
        super().__init__(
            f"task {key!r} failed {tries} tries: retry policy {policy!r} kept answering "
            f"retry{said}, {free} times beyond the task's retries= budget, the most the "
            "scheduler allows, so it stopped retrying. Have the policy answer "
            "RetryDecision(False) at some point (bound its free retries, e.g. by "
            "task.lost_tries, or charge them to the task's budget), or use the default "
            "retry policy; the task's own error is this one's __cause__.",
            key=key,
            policy=policy,
            free=free,
            tries=tries,
            reason=reason,
        )


# ----------------------------------------------------------------------------- tasks


class DependencyFailed(CorralError):
    """A task was not run because a task it depends on failed."""

    def __init__(self, key: str, dependency: str, reason: str) -> None:
        super().__init__(
            f"task {key!r} was not run: dependency {dependency!r} failed ({reason}). "
            "Fix the failing task; its own error is on its future.",
            key=key,
            dependency=dependency,
            reason=reason,
        )


class CancelledError(CorralError):
    """The task (or its run) was cancelled before it produced a result."""

    def __init__(self, key: str, reason: str = "cancelled by request") -> None:
        super().__init__(f"task {key!r} was cancelled: {reason}", key=key, reason=reason)


class WorkerLost(CorralError):
    """A task could not finish because the workers running it were lost too often.

    ``policy`` and ``params``: the retry policy in force that decided so (its name, and
    the parameters it was set with, each value's ``repr``: ``policies.params_of``);
    ``retries_left``: the task's own ``retries=`` budget left. The text says which knob
    to turn: ``retries=`` on the submission when the policy charged the losses to that
    budget (``charge_lost=True``) and it is spent, else the policy's ``max_lost``; and
    that changing the policy, the manager's for every client, takes the admin token."""

    def __init__(
        self,
        key: str,
        worker: str,
        cause: str,
        tries: int,
        policy: str = "",
        params: Mapping[str, str] | None = None,
        retries_left: int | None = None,
    ) -> None:
        params = dict(params or {})
        shown = ", ".join(f"{k}={v}" for k, v in params.items())
        with_ = f"with {shown}" if shown else "its defaults"
        in_force = f" (the retry policy in force: {policy!r}, {with_})" if policy else ""
        charged = params.get("charge_lost") == "True" and (retries_left or 0) <= 0
        call: dict[str, str] = {}
        if policy not in ("", "default"):  # its own knobs; the default one retries losses free
            advice = ""
        elif charged:
            call = {k: v for k, v in params.items() if k != "charge_lost"}
            advice = (
                "; that policy charges each loss to the task's own retries= budget "
                "(charge_lost=True), which was spent: submit the task with a larger one "
                "(retries=N to submit, map or compute, or dask.annotate(retries=N)), or ask "
                "the operator to turn charge_lost off"
            )
        else:
            now = params.get("max_lost", "")
            raised = max(20, 2 * int(now)) if now.isdigit() else 20
            call = {**params, "max_lost": str(raised)}
            advice = (
                ", or have the retry policy's limit for infrastructure losses raised (its "
                f"max_lost, {f'now {now}' if now else 'at its default'}: losses in a row "
                "that left no checkpoint of their try, so a long task that saves its "
                "progress with runtime.checkpoint goes on while each try saves some)"
            )
        args = "".join(f", {k}={v}" for k, v in call.items())
        words = "".join(f" {k}={v}" for k, v in call.items())
        how = (
            f"await cluster.set_policy('retry', 'default'{args}), or in the console policy "
            f"set retry default{words}"
        )
        super().__init__(
            f"task {key!r} was lost with worker {worker!r} ({cause}) and will not be retried "
            f"after {tries} {'try' if tries == 1 else 'tries'}{in_force}. Check the workers' "
            f"logs and resources{advice}. The retry policy is the manager's, for all its "
            f"clients, and setting it takes the admin token, the operator's ({how}): with "
            "the submit token, ask the operator.",
            key=key,
            worker=worker,
            cause=cause,
            tries=tries,
            policy=policy,
            params=params,
            retries_left=retries_left,
        )


def _span(seconds: float) -> str:
    """``"90 s"``, ``"2 min 30 s"``, ``"4 h"``: a duration as people read it."""
    whole = max(0, round(seconds))
    if whole < 120:
        return f"{whole} s"
    big, small, units = (60, 1, ("min", "s")) if whole < 7200 else (3600, 60, ("h", "min"))
    rest = whole % big // small
    return f"{whole // big} {units[0]}" + (f" {rest} {units[1]}" if rest else "")


class TaskLongerThanWalltime(WorkerLost):
    """A task that cannot fit in its pool's walltime: its try was lost to the walltime
    after executing about the whole life a worker of its pool gets (``ran`` seconds of
    ``walltime``, its workers drained ``drain`` seconds before it), so another worker
    of the pool would cut it short again."""

    def __init__(
        self,
        key: str,
        worker: str,
        pool: str,
        ran: float,
        walltime: float,
        drain: float,
        tries: int,
    ) -> None:
        CorralError.__init__(
            self,
            f"task {key!r} ran {_span(ran)} on worker {worker!r} and was still running when "
            f"the walltime of pool {pool!r} ended it: its workers live {_span(walltime)} "
            f"(drained {_span(drain)} before the end), and it had about all of that, so "
            "it is not retried into the same wall. Raise the pool's walltime, split the "
            "task into shorter ones, have it checkpoint (runtime.checkpoint) so that a "
            "retry resumes, or send it to a pool without a walltime (pool=, or the retry "
            "policy's fallback for this pool).",
            key=key,
            worker=worker,
            cause="walltime",
            tries=tries,
            pool=pool,
            ran=ran,
            walltime=walltime,
            drain=drain,
        )


def describe_exit(returncode: int) -> str:
    """``"exit code 3"`` or ``"killed by SIGKILL (signal 9)"``."""
    if returncode >= 0:
        return f"exit code {returncode}"
    number = -returncode
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = "an unknown signal"
    return f"killed by {name} (signal {number})"


class TaskNotLoadable(CorralError):
    """Task ``key``'s function or an argument of it (``what``) could not be loaded in
    the process that was to run it (``where``: a worker process, or its task process),
    so the task did not start: its module (``module``) is not importable there
    (``reason``: what loading raised, which is the ``__cause__``). Every worker of the
    same installation fails alike, so the default retry policy does not retry it."""

    def __init__(self, key: Hashable, what: str, module: str, where: str, reason: str) -> None:
        super().__init__(
            f"task {key!r} did not run: " + _not_loadable_text(what, module, where, reason),
            key=key,
            what=what,
            module=module,
            where=where,
            reason=reason,
        )


class TaskProcessDied(CorralError):
    """The task process running a task ended before the task did (process mode), on
    worker ``worker`` ("" when not known)."""

    def __init__(self, key: Hashable, pid: int, exitcode: int | None, worker: str = "") -> None:
        how = "unknown exit" if exitcode is None else describe_exit(exitcode)
        hint = (
            " (a SIGKILL from outside Corral is most often the kernel's out-of-memory killer)"
            if exitcode == -signal.SIGKILL
            else ""
        )
        super().__init__(
            f"task {key!r} did not finish: its task process (pid {pid}"
            f"{f' on worker {worker!r}' if worker else ''}) died, {how}{hint}. "
            "The task or a library it calls ended the process (a crash in compiled code, "
            "os._exit, running out of memory); check the task's memory use and native "
            "code. The worker is fine and runs its next task in a new process.",
            key=key,
            pid=pid,
            exitcode=exitcode,
            worker=worker,
        )


class TaskExited(CorralError):
    """Task ``key`` raised a ``BaseException`` that is not an ``Exception``: it called
    ``sys.exit()`` (``SystemExit``), or raised ``KeyboardInterrupt``, ``GeneratorExit``
    or a ``BaseException`` subclass of its own. Raised as itself in the program that
    waits for the task it would end that program (``except Exception`` lets it through;
    a ``KeyboardInterrupt`` looks like the user's Ctrl-C), so the caller gets this error
    instead, with that exception as its ``__cause__``. The worker took it as the task's
    failure and goes on. ``kind``: its type, qualified (``SystemExit``); ``code``: the
    exit status ``sys.exit`` was given (None for other types); ``text``: its message."""

    def __init__(self, key: Hashable, kind: str, code: Any = None, text: str = "") -> None:
        if kind == "SystemExit":
            what = f"called sys.exit({'' if code is None else repr(code)}) (SystemExit)"
        elif kind == "KeyboardInterrupt":
            what = "raised KeyboardInterrupt (the task's own, not a Ctrl-C of this program)"
        else:
            said = f": {text}" if text else ""
            what = f"raised {kind}{said}, a BaseException that is not an Exception"
        super().__init__(
            f"task {key!r} {what}. It failed, and this error stands for that exception, "
            "which raised as itself would end the program waiting for the task "
            "(`except Exception` does not catch it); the worker and the other tasks go "
            "on. To fail a task, raise an Exception; to end it early, return a value. "
            "The original exception is this error's __cause__.",
            key=key,
            kind=kind,
            code=code,
            text=text,
        )

    @classmethod
    def of(cls, error: BaseException, key: Hashable) -> BaseException:
        """``error``, task ``key``'s exception, as its caller raises it: itself if it is
        an ``Exception``, else a :class:`TaskExited` whose ``__cause__`` it is."""
        if isinstance(error, Exception):
            return error
        kind = type(error).__qualname__
        if type(error).__module__ != "builtins":
            kind = f"{type(error).__module__}.{kind}"
        code: Any = None
        if isinstance(error, SystemExit):
            code, args = error.code, error.args
            if code is None and args:  # ``code`` may not cross processes; its args do
                code = args[0] if len(args) == 1 else args
        if not isinstance(code, int | str | None):
            code = repr(code)  # (what sys.exit was given need not pickle)
        try:
            text = "" if isinstance(error, SystemExit) else str(error)
        except Exception:  # a hostile __str__
            text = ""
        exited = cls(key, kind, code, text[:500])
        exited.__cause__ = error
        return exited


class TaskTimeout(CorralError):
    """A try of a task executed longer than its ``timeout=`` on its worker and was
    stopped there as a cancel stops a running try. It counts as a failed try:
    ``retries=`` applies as for any exception.

    ``timeout``: the task's setting (seconds); ``ran``: how long the try had executed
    when it was stopped (from when it began on the worker, not its wait in a queue);
    ``stopped``: whether it was really stopped (process execution: its task process
    was killed with the programs it started; an ``async def`` task in thread
    execution: its coroutine was cancelled, ``coroutine``), or only given up (thread
    execution: a thread cannot be stopped, so the call runs on, with any program it
    started, until it returns, while a fresh thread takes the slot)."""

    def __init__(
        self,
        key: Hashable,
        worker: str,
        timeout: float,
        ran: float,
        stopped: bool = True,
        coroutine: bool = False,
    ) -> None:
        if coroutine:
            what = (
                "and was stopped there: its coroutine (an async def task, run in a thread) "
                "was cancelled, asyncio.CancelledError raised at the await it waited in (a "
                "coroutine that catches it and goes on, or that runs long without an await, "
                "runs on until it returns, its result dropped)."
            )
        elif stopped:
            what = "and was stopped there (its task process killed, with the programs it started)."
        else:
            what = (
                "and was given up there, but not stopped: it runs in a thread, which cannot "
                "be stopped, so the call runs on (with any program it started) until it "
                "returns, its result dropped. Run tasks that may hang, or that run "
                'external programs, in workers with execution="process", where a timeout '
                "kills them."
            )
        super().__init__(
            f"task {key!r} ran {ran:.3g} s on worker {worker!r}, past its timeout of "
            f"{timeout:.3g} s, {what} If it needs longer, raise its "
            "timeout= (submit, submit_graph or the dask annotation); if it should not, "
            "look at why it hangs (a deadlocked lock, a network read that never returns, "
            "a call waiting for input).",
            key=key,
            worker=worker,
            timeout=timeout,
            ran=ran,
            stopped=stopped or coroutine,
            coroutine=coroutine,
        )


# ----------------------------------------------------------------------------- memory


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f} MiB"


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def size_text(n: float) -> str:
    """Bytes for people: MiB to a tenth below a GiB, GiB to a hundredth from one (a
    need beside a limit, 1.04 and 1.00 GiB, must not read the same). The one size
    formatter of Corral's messages: these errors, the pre-flight checks and the
    scheduler's warnings (:mod:`actors.host_memory`, :mod:`actors.shared_disk`);
    :func:`memory_sizes` (one unit for several) and :func:`disk_size` (bytes below a
    MiB) write its units."""
    return _mib(n) if n < 2**30 else _gib(n)


def memory_sizes(*sizes: float, top: float = 0) -> list[str]:
    """``sizes`` of memory in one unit: GiB to a hundredth when ``top`` (default: the
    largest of them; a worker's limit, where one is named) is a GiB or more, else MiB to
    a tenth (a 400 MiB worker's 0.39 GiB said nothing of how near its limit it was)."""
    if max(top, *sizes, 0) >= 2**30:
        return [_gib(n) for n in sizes]
    return [_mib(n) for n in sizes]


#: What to do about a worker's floor (its RSS holding no output in memory and running
#: no task: libraries, task processes, memory the allocator keeps) at its memory marks.
FLOOR_ADVICE = (
    "give workers more memory (--memory, a pool's memory_per_worker); with execution "
    "'process', run fewer task processes (fewer --cores) or execution 'thread' (each task "
    "process holds its own copy of the libraries)"
)


#: the share of a worker's RSS at a kill for memory that, neither the killed task's
#: process nor outputs (its floor), ``TaskOutOfMemory`` states: smaller chunks shrink
#: only the rest
FLOOR_SHARE = 0.4


#: What to do about a worker whose tasks run in threads and took it past its terminate
#: fence, which cannot kill them (the scheduler's warning of it, and a client's log line)
PAST_LIMIT_ADVICE = (
    "its tasks run in threads, which its terminate fence cannot kill. Start its workers "
    "with execution 'process' (--execution process) for a fence that kills the task "
    "that grew, or give them more memory (--memory), or split those tasks' data into "
    "smaller pieces"
)


#: How to get back memory a worker process keeps that no spilling frees (a task's data
#: in a global or a cache): a fresh worker process
RESTART_ADVICE = (
    "restart those workers (drain them: the console's 'drain WORKER', or scale the pool in and out)"
)


def floor_warning(
    floor: int, resume_at: int, throttle_at: int, limit: int, *, execution: str, at_start: bool
) -> str:
    """Say that a worker's floor ``floor`` (bytes) is at or past its resume mark
    ``resume_at`` (its throttle fence ``throttle_at``, limit ``limit``), and what to do
    for its ``execution`` (``"thread"`` or ``"process"``). A ``thread`` worker's floor
    past its limit once tasks ran (not ``at_start``) is said to be, almost surely, a
    task's data kept in a module global or a cache; its advice never names task
    processes, which it has none of."""
    f, r, t, lim = memory_sizes(floor, resume_at, throttle_at, limit, top=limit)
    head = (
        f"memory that is not outputs is {f} (the worker's floor: its RSS holding no output "
        "in memory and running no task: libraries, "
    )
    marks = (
        f"at or past its resume mark {r} (throttle fence {t}, limit {lim}), so spilling "
        "cannot bring it under that mark and outputs have little room"
    )
    if execution == "process":
        return f"{head}task processes, memory the allocator keeps), {marks}; {FLOOR_ADVICE}"
    kept = "memory the allocator keeps, what its tasks keep in globals or caches)"
    if floor < limit or at_start:
        return (
            f"{head}{kept}, {marks}; give workers more memory (--memory, a pool's "
            "memory_per_worker). Its tasks run in threads of the worker's own process: "
            "if its floor grows as they run, a task keeps data in a module global or a "
            f"cache; free it in the task, and {RESTART_ADVICE}"
        )
    return (
        f"{head}{kept}, at or past its limit {lim} (resume mark {r}, throttle fence {t}). "
        "Its tasks run in threads of the worker's own process and libraries alone seldom "
        "take a worker past its limit: this is almost surely a task that keeps data in a "
        "module global or a cache (a module-level list it appends to, a cache without a "
        "bound), which stays after the task ends. Free it in the task or bound the cache, "
        f"and {RESTART_ADVICE}; with execution 'process' (--execution process) a task "
        "process whose idle memory creeps up is replaced"
    )


__all__ += [
    "FLOOR_ADVICE",
    "FLOOR_SHARE",
    "PAST_LIMIT_ADVICE",
    "RESTART_ADVICE",
    "floor_warning",
    "memory_sizes",
    "size_text",
]


class MemoryConfigError(CorralError, ValueError):
    def __init__(self, problem: str) -> None:
        super().__init__(
            f"bad memory configuration: {problem}. See docs/memory.md for each setting.",
            problem=problem,
        )


class TaskCrashedWorkers(WorkerLost):
    """A poison task: it was running, or may have been, on several workers that ended
    unexpectedly, so it is not given another (``crashes``: ``(worker, cause)`` of each).
    A try counts unless it surely waited in its worker's queue (the worker had said
    that other tries filled all its threads): a worker says a try executes once it has
    executed 0.5 s, so one that died sooner may have been killed by a try it never
    named (docs/policies.md, retry). ``contained``: each of those workers ran its tasks
    in task processes (execution ``process``), where a task's crash ends its task
    process, not the worker, so the advice is not to run them there but to look for
    what ends the workers from outside."""

    def __init__(
        self, key: str, crashes: Sequence[tuple[str, str]], contained: bool = False
    ) -> None:
        # A worker restarted under its name (a supervisor loop) ends again: one entry
        # saying how many of its lives ended so, not the name repeated.
        times = Counter(crashes)
        took = "; ".join(
            f"{w!r} ({c})" if n == 1 else f"{w!r} ({c}, {n} times: {n} lives of it)"
            for (w, c), n in times.items()
        )
        lives = (
            " (each life of a worker restarted under its name)" if len(times) < len(crashes) else ""
        )
        silent = ""
        if crashes and all(c == "unknown" for _, c in crashes):
            why = (
                "they ran their tasks in task processes, so no task held their GIL; a "
                "machine that swaps or is overloaded, or a network that drops, stops "
                "heartbeats too"
                if contained
                else "a task that holds Python's GIL for long (one long call into compiled "
                "code: sum over a huge range, a slow regular expression) stops its "
                "worker's heartbeats"
            )
            fix = (
                ""
                if contained
                else (
                    "run such a task with execution 'process' (its own process: the worker "
                    "stays responsive), or "
                )
            )
            silent = (
                f" Each went silent rather than dying: {why}, and a worker silent for "
                "longer than the manager's worker timeout (10 s by default) counts as "
                f"lost; {fix}give the workers longer: python -m runtime manager "
                "--worker-timeout SECONDS, or Cluster(worker_timeout=SECONDS)."
            )
        how = (
            "(through memory, or by ending its worker's process)"
            if contained
            else "(os._exit, a crash in compiled code, memory outside the worker's fences)"
        )
        contain = (
            "Run it alone to see; the workers ran their tasks in task processes already "
            "(execution 'process'), where a crash in a task ends its task process, not its "
            "worker, so look for what ends the workers themselves: the kernel's OOM killer "
            "(a task process's memory counts on its worker's machine, and the killer may "
            "pick the worker), a kill from outside (kill -9), or the task ending its "
            "worker (os.kill of its parent process). If they died for other reasons, "
            if contained
            else "Run it alone to see, run workers with execution 'process' to contain it, "
            "or, if the workers died for other reasons (killed from outside: the OOM "
            "killer, kill -9), "
        )
        CorralError.__init__(
            self,
            f"task {key!r} was running, or may have been, on {len(crashes)} workers that "
            f"ended unexpectedly{lives}: {took}. It may be what kills them {how}, so it is "
            "not retried on another (tries that surely waited in a worker's queue do not "
            f"count). {contain}"
            "raise the retry policy's max_crashes and max_lost, the limit on losses of any "
            "kind: await cluster.set_policy('retry', 'default', max_crashes=20, "
            f"max_lost=20).{silent}",
            key=key,
            crashes=list(crashes),
            worker=crashes[-1][0] if crashes else "",
            cause=crashes[-1][1] if crashes else "",
            tries=len(crashes),
            contained=contained,
        )


#: a dask collection's task key as a string: ``('name-<token>', i, ...)`` (a plain
#: ``name-<token>`` is also what ``submit`` and ``dask.delayed`` name a function's call)
_DASK_KEY = re.compile(r"^\('([A-Za-z_][\w.-]*?)-[0-9a-f]{32}', ")

#: a rechunk's memory: dask plans it in steps (``dask.array.rechunk.plan_rechunk``), whose
#: intermediate chunks may be far larger than the chunks it reads or writes (a user audit's
#: median of 40 MiB time chunks into 12.5 MiB space chunks went through 112 MiB ones)
_RECHUNK = (
    "it cuts (split) or joins (merge) chunks for a rechunk, and dask's rechunk plans "
    "intermediate chunks up to array.chunk-size (128 MiB by default), whatever the sizes "
    "of the chunks it reads and writes: dask.config.set({'array.chunk-size': '32MiB'}) "
    "before building the array"
)

#: what a task dask names so does with memory, and how to control it
_DASK_STEPS = {
    "repartitiontofewer": (
        "it joins several partitions into one, for a step that has fewer output "
        "partitions than input ones (a groupby or shuffle whose split_out is under the "
        "input's npartitions, repartition(npartitions=...)): ask for more output "
        "partitions, e.g. groupby(...).agg(..., split_out=N) with N the input's npartitions"
    ),
    "rechunk-split": _RECHUNK,
    "rechunk-merge": _RECHUNK,
}


def dask_name(key: str) -> str | None:
    """The dask operation a task of a dask collection belongs to: its key's name
    (``'name-<32 hex>'`` first in a tuple with the chunk's or partition's index, such as
    ``rechunk-merge``); None for any other key (a ``submit``'s ``'func-<token>'``)."""
    found = _DASK_KEY.match(key)
    return None if found is None else found.group(1)


def dask_chunks_hint(key: str) -> str:
    """Advice on the size of a task of a dask collection (:func:`dask_name`), which the
    user may never have written (dask's optimizer makes tasks such as
    ``repartitiontofewer``); "" for any other key (a ``submit``'s ``'func-<token>'`` is
    the user's own function)."""
    name = dask_name(key)
    if name is None:
        return ""
    step = _DASK_STEPS.get(name)
    what = (
        f"; {step}"
        if step
        else "; its memory follows the partitions (chunks) it reads and writes, set where "
        "the collection is made or reshaped: npartitions, partition_size, a groupby's "
        "split_out for a dask.dataframe, chunks for a dask.array"
    )
    return (
        f" ({name!r} is the dask operation this task belongs to: where your code does not "
        f"call it, dask made it from your collection{what}.)"
    )


#: a killed try's inputs in memory at this share of its worker's limit or more are named
#: in its :class:`TaskOutOfMemory` (process execution holds them twice)
COPIED_SHARE = 0.25


class TaskOutOfMemory(CorralError):
    """A task was killed at its worker's terminate fence too often to retry it, or no
    worker with a larger memory limit than those it was killed on is there or can come.

    ``worker``, ``rss``, ``limit``: its last try's; ``tries``: its tries in all;
    ``ooms``: every try killed for memory, oldest first, as ``(worker, limit, peak)``
    (the worker's memory limit and the highest RSS seen while the task ran there);
    ``nowhere``: why it was not retried when a retry was allowed ("" otherwise);
    ``own``: the highest RSS of its last killed try's own task process with the programs
    it started (a tool it ran), the task's own memory without the worker's (0: not
    known, thread execution); ``floor``: that
    worker's floor (memory that is not outputs: libraries, task processes) when it was
    at or past its resume mark (0: under it), the kill's likelier cause than the task's
    size, which the message then leads with (docs/memory.md); ``rest``: of ``rss``, what
    was neither the task's own process nor outputs in memory (the worker's process with
    its libraries, its other task processes, copies on their way: its floor; 0: not
    known), which the message states when it is ``FLOOR_SHARE`` of ``rss`` or more.
    ``exited``: that worker ran its tasks in threads, which cannot be killed, and
    stopped itself past its exit mark (the memory option ``exit``). ``copied``: the
    bytes of its inputs held in memory, which process execution copies into its task
    process (so the worker holds them twice while it runs); stated when ``own`` is
    known and they are ``COPIED_SHARE`` of ``limit`` or more."""

    def __init__(
        self,
        key: str,
        worker: str,
        rss: int,
        limit: int,
        tries: int,
        ooms: Sequence[tuple[str, int, int]] = (),
        nowhere: str = "",
        *,
        own: int = 0,
        floor: int = 0,
        rest: int = 0,
        exited: bool = False,
        copied: int = 0,
    ) -> None:
        ooms = tuple(ooms) or ((worker, limit, rss),)
        # one unit in all: MiB while every limit and peak is under a GiB
        top = max(limit, rss, *(max(lim, peak) for _, lim, peak in ooms))

        def size(n: int) -> str:
            return memory_sizes(n, top=top)[0]

        each = ", then ".join(
            f"on {w!r} (limit {size(lim) if lim else 'none'}, peak {size(peak)})"
            for w, lim, peak in ooms
        )
        times = "once" if len(ooms) == 1 else f"{len(ooms)} times"
        why = f" Not retried: {nowhere}." if nowhere else ""
        n_tries = f"{tries} {'try' if tries == 1 else 'tries'}"
        # (its task process's tree: a tool it ran holds memory there, not the task's
        # Python code, which the words must not blame alone)
        itself = (
            f"; the task's process and the programs it started, if any, used {size(own)} of it"
            if own
            else ""
        )
        large = not floor and rss and rest >= FLOOR_SHARE * rss
        if large:  # a user audit shrank its chunks while 218 of 390 MiB were not the task's
            itself += (
                f", and {size(rest)} ({rest / rss:.0%}) was the worker's floor, neither "
                "that process nor outputs in memory (the worker's own process with its "
                "libraries, its other task processes, copies on their way)"
            )
        twice = ""
        if own and limit and copied >= COPIED_SHARE * limit:  # a user audit's 350 MB chain
            twice = (
                f" Its inputs, {size(copied)}, were in the task process as a copy of the "
                "worker's own: process execution copies a task's inputs into its task "
                "process, so the worker holds them twice while it runs. For inputs this "
                "large run the workers with execution 'thread', or make them file outputs "
                "(docs/files.md), which the task reads from disk."
            )
        cause = advice = ""
        fence = "past the terminate fence"
        fraction = "raise the terminate fraction"
        if exited:  # a thread cannot be killed: its worker process stopped itself
            fence = (
                "past its exit mark: its tasks run in threads, which cannot be killed, so "
                "the worker stopped itself (a pool or Cluster(processes=N) starts another "
                "in its place; a worker started by hand is not replaced)"
            )
            fraction = (
                "raise the exit fraction (memory_options exit), or run the workers with "
                "execution 'process', where the terminate fence kills the task alone"
            )
        if floor:  # the worker's own memory filled it, not the task's
            cause = (
                f" Memory that is not outputs was {size(floor)} of that worker's "
                f"{size(limit)} (its floor: libraries, task processes, memory the "
                "allocator keeps), at or past its resume mark: the worker was nearly "
                f"full before the task began, and smaller chunks will not help; "
                f"{FLOOR_ADVICE}."
            )
        elif large:
            advice = (
                " With a floor that large, smaller chunks shrink only the rest: "
                f"{FLOOR_ADVICE}; or "
                f"make the task's chunks smaller, or {fraction}."
                f"{dask_chunks_hint(key)}"
            )
        else:
            advice = (
                " Give workers more memory (--memory, a pool's memory_per_worker), make "
                f"the task's chunks smaller, or {fraction}."
                f"{dask_chunks_hint(key)}"
            )
        super().__init__(
            f"task {key!r} was killed for memory on worker {worker!r}: the worker used "
            f"{size(rss)} of its {size(limit)} limit while the task ran{itself}, {fence} "
            f"({n_tries}).{cause}{twice} Killed for memory {times}: {each}.{why}"
            f"{advice}",
            key=key,
            worker=worker,
            rss=rss,
            limit=limit,
            tries=tries,
            ooms=ooms,
            nowhere=nowhere,
            own=own,
            floor=floor,
            rest=rest,
            exited=exited,
            copied=copied,
        )


class MemoryStalled(CorralError):
    """Every worker is throttled (over its throttle fence, or too near it for its next
    producer's expected output) and nothing that frees memory can run; or, with
    ``pool``, every worker of that pool (``workers`` of them), with tasks of the pool
    waiting: those fail, the other pools run on.

    ``holding`` lists ``(category, bytes, outputs)`` held by workers (in memory or
    spilled to their disks: the scheduler does not tell them apart), largest
    first; ``needed`` estimates the bytes the producer tasks still to run will make
    (each as large as its layer's outputs made so far, else its category's mean; 0
    when none of their categories has finished a task: not known), and ``available``
    the bytes left under the workers' throttle fences; ``rss`` is the workers' RSS in
    all, as last reported (0: not reported); ``in_memory`` the bytes of outputs in
    their memory, as they last reported (None: not known; 0 with outputs held: all
    spilled, so their RSS is memory that is not outputs, their floor); ``limit`` the
    largest worker's memory limit (0: not known), which says the unit (MiB under a GiB).
    ``spill_refused``: ``(worker, spill directory, spills refused, seconds since the
    latest)`` of the workers whose spills found no disk room, the latest at most ten
    ``stall_timeout``s before (an older refusal has cleared since).
    ``executing``: ``(key, worker, seconds executed, bound)`` of the tries on those
    workers (of whatever pool) that had executed longer than the watchdog waits for a
    try (its bound, docs/memory.md: a number of ``stall_timeout``s, twice its
    category's longest ok try or its ``timeout=``, whichever is longest), which no
    longer held the watchdog off and fail too (not counted in ``waiting``; with no
    output held, the message says they may hold the memory).
    """

    def __init__(
        self,
        holding: Sequence[tuple[str, int, int]],
        needed: int,
        available: int,
        waiting: int,
        stalled_for: float,
        rss: int = 0,
        in_memory: int | None = None,
        limit: int = 0,
        *,
        pool: str | None = None,
        workers: int = 0,
        spill_refused: Sequence[tuple[str, str, int, float]] = (),
        executing: Sequence[tuple[Any, str, float, float]] = (),
    ) -> None:
        held_bytes = sum(b for _, b, _ in holding)
        top = limit or max(rss, held_bytes, needed, available)

        def size(n: int) -> str:
            return memory_sizes(n, top=top)[0]

        held = "; ".join(f"{c!r} {size(b)} in {n} outputs" for c, b, n in holding[:5])
        n = len(executing)
        culprit = (
            f"the tr{'ies' if n != 1 else 'y'} past {'their' if n != 1 else 'its'} bound "
            "named above may hold it, or something else does"
            if executing
            else "something else takes it"
        )
        other = (
            f"{culprit} (a task that keeps data in a global or a cache, a "
            "library's memory pool, memory the process has not given back). "
            f"{RESTART_ADVICE[0].upper()}{RESTART_ADVICE[1:]}, or give them more memory."
        )
        if not held:
            advice = f"No output is in their memory: {other}"
        elif in_memory == 0:  # spilling was on and moved everything: allow it says nothing
            advice = (
                "None of those outputs is in the workers' memory (all of them are spilled "
                f"to disk): their {size(rss)} of RSS is memory that is not outputs (their "
                "floor: libraries, task processes, memory the allocator keeps), which no "
                f"spilling lowers. {FLOOR_ADVICE[0].upper()}{FLOOR_ADVICE[1:]}."
            )
        else:
            spill = (
                "give spilling room (free space on that file system, a --spill-dir on a "
                "larger one, or a larger --disk)"
                if spill_refused
                else "allow spilling to disk (a spill fraction and disk room)"
            )
            advice = (
                f"Give workers more memory, {spill}, persist less at once, or release "
                "futures you no longer need. An output that cannot be pickled cannot be "
                "spilled either (the workers' logs name it)."
            )
            if rss and held_bytes < rss / 2:
                advice += (
                    f" The outputs held, spilled ones included, are {size(held_bytes)} "
                    f"against the workers' {size(rss)} RSS: for the rest, {other}"
                )
        if spill_refused:
            where = "; ".join(
                f"on {d or 'its spill directory'!r} (worker {w}, {n} time{'s' * (n != 1)}, "
                f"the latest {ago:.0f} s ago)"
                for w, d, n, ago in spill_refused[:5]
            )
            advice = f"Spilling failed: no room {where}. {advice}"
        need = f"about {size(needed)}" if needed else "an amount not known yet"
        who = (
            "every worker"
            if pool is None
            else f"every worker of pool {pool!r} ({workers} worker{'s' * (workers != 1)})"
        )
        fate = (
            ""
            if pool is None
            else f" The tasks of pool {pool!r} still to run fail; the other pools run on."
        )
        hung = ""
        if executing:
            tries = "; ".join(
                f"{key!r} on worker {w} ({ran:.0f} s, its bound {bound:.0f} s)"
                for key, w, ran, bound in executing[:5]
            )
            more = f" and {len(executing) - 5} more" if len(executing) > 5 else ""
            hung = (
                f" {n} tr{'ies' if n != 1 else 'y'} executed longer than the watchdog "
                f"waits for a try, which may never end, and fail{'s' * (n == 1)} too: "
                f"{tries}{more}. A task that runs longer than its bound needs a "
                "timeout= at least as long (the bound grows to it)."
            )
        super().__init__(
            f"memory stalled for {stalled_for:.1f} s: {who} is over its memory "
            "throttle fence (or too near it for its next producer's expected output) and "
            "nothing that frees memory can run. Outputs held (in memory "
            "or spilled to disk): "
            f"{held or 'none'}. The {waiting} producer tasks still to run need {need}; "
            f"{size(available)} is left under the throttle fences.{hung}{fate} {advice}",
            holding=list(holding),
            needed=needed,
            available=available,
            waiting=waiting,
            stalled_for=stalled_for,
            rss=rss,
            in_memory=in_memory,
            limit=limit,
            pool=pool,
            workers=workers,
            spill_refused=list(spill_refused),
            executing=list(executing),
        )


def disk_size(n: float) -> str:
    """Bytes for people, exact below a MiB (small disks in tests and tight limits)."""
    return f"{int(n):,} bytes" if n < 2**20 else size_text(n)


class TaskArgumentsTooLarge(CorralError):
    """A task's own arguments (the values in its graph node, not its inputs from other
    tasks) pickled to ``size`` bytes, more than one message to a worker process may
    carry (``limit``), so it could not be sent to a worker and did not run."""

    def __init__(self, key: str, size: int, limit: int, *, scattered: bool = False) -> None:
        if scattered:  # Cluster.scatter(value): refused at the call, nothing sent
            text = (
                f"scatter got a value ({key}) of {size_text(size)} pickled ({size:,} "
                f"bytes), over the {size_text(limit)} a task's arguments may carry "
                "to a worker process; nothing was sent. Scatter it in parts (a list of "
                "smaller values, one future each), or make or load it in a task "
                "(cluster.submit(np.load, path), da.from_zarr), whose output moves between "
                "processes in parts of any size."
            )
        else:
            text = (
                f"task {key!r} could not be sent to a worker process: its arguments are "
                f"{size_text(size)} pickled ({size:,} bytes), over the {size_text(limit)} "
                "one message may carry. Large data should be the output of a task, which "
                "moves between processes in parts of any size: make or load it in a task "
                "(np.load, da.from_zarr, reading a file) instead of passing it as an "
                "argument (a numpy array given to da.from_array, a big list or bytes)."
            )
        super().__init__(text, key=key, size=size, limit=limit)


class TaskErrorTooLarge(CorralError):
    """A task raised an exception too large to carry back to its caller, and this
    error stands for it: the exception's message (with those of its cause, context and
    notes) or its pickle is ``size`` bytes, more than ``limit``, the most a task's
    error may take (``CORRAL_MAX_TASK_ERROR_BYTES``, 1 MiB by default; or the most one
    message from a worker process may carry, when the report of the try is larger
    than that). ``kind`` names the exception's type, ``head`` is the start of its
    message. It has the exception's traceback where it can."""

    def __init__(self, key: str, kind: str, size: int, limit: int, head: str) -> None:
        super().__init__(
            f"task {key!r} raised {kind}, whose message or pickle is {disk_size(size)} "
            f"({size:,} bytes), more than the {disk_size(limit)} a task's error may carry "
            f"back; this error stands for it. Its message began: {head!r}. Raise errors "
            "with short messages: write large details (data, logs) to a file or to "
            "storage and name it in the message, or return them as the task's output "
            "(CORRAL_MAX_TASK_ERROR_BYTES in the workers' environment raises the limit).",
            key=key, kind=kind, size=size, limit=limit, head=head,
        )  # fmt: skip


#: The attribute of the ``RuntimeError`` that stands for a task's exception that could
#: not travel between processes (``runtime.remote.substitute_error``): that
#: exception's type, qualified (``mymodule.TwoArgError``).
STANDS_FOR = "stands_for"


def error_name(error: BaseException) -> str:
    """The name a failed try with ``error`` is counted and grouped under (the metrics'
    ``cause``, the failure groups, the monitoring database's ``cause`` and
    ``error_type``): its type's name; for a ``RuntimeError`` that stands for a task's
    exception that could not travel between processes, that exception's type's name
    (``TwoArgError``), not ``RuntimeError``."""
    if type(error) is RuntimeError:
        kind = error.__dict__.get(STANDS_FOR)
        if isinstance(kind, str) and kind:
            return kind.rpartition(".")[2]
    return type(error).__name__


__all__ += ["STANDS_FOR", "error_name"]


#: characters kept of what an external command that failed wrote (the end of it)
MAX_COMMAND_OUTPUT = 2_000
#: how the note that carries them begins (:func:`note_command_output`)
COMMAND_OUTPUT_NOTE = "the command's "


def command_output(error: BaseException) -> str | None:
    """The note :func:`note_command_output` added to ``error`` (what its external
    command wrote), or None."""
    notes = getattr(error, "__notes__", None)
    if isinstance(notes, list):
        for note in notes:
            if isinstance(note, str) and note.startswith(COMMAND_OUTPUT_NOTE):
                return note
    return None


def _tail(value: object) -> tuple[str, bool]:
    """The last :data:`MAX_COMMAND_OUTPUT` characters of a command's output (bytes
    decoded as UTF-8, what does not decode replaced), its trailing blanks left out, and
    whether it was cut; ``""`` for none."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        value = bytes(value[-4 * MAX_COMMAND_OUTPUT :]).decode("utf-8", "replace")
    if not isinstance(value, str):
        return "", False
    text = value.rstrip()
    return text[-MAX_COMMAND_OUTPUT:], len(text) > MAX_COMMAND_OUTPUT


def note_command_output(error: BaseException) -> None:
    """Add to ``error``, a :class:`subprocess.SubprocessError` (``CalledProcessError``,
    ``TimeoutExpired``) that carries what its command wrote, the end of it as a note:
    its ``stderr``, else its ``output`` (a command run with ``stderr=STDOUT``), at most
    :data:`MAX_COMMAND_OUTPUT` characters. Its own text says only that the command
    ``returned non-zero exit status 3``; the note travels with it to the client, whose
    traceback prints it, and the scheduler's text of the error ends with it (the
    dashboard's failure groups, the monitoring database). One whose command's output
    was not captured (``subprocess.run(cmd, check=True)``, or ``stderr=`` a file, as a
    Parsl ``bash_app`` redirects it, or ``stdout=PIPE`` alone with nothing written
    there: ``stderr`` None and no ``output`` to show) gets :data:`NOT_CAPTURED_NOTE`
    instead, which says where the stderr went and how to
    have it here. A command run with ``stderr=subprocess.STDOUT`` (read from the
    arguments of the ``subprocess`` call in the error's traceback) gets
    :data:`MERGED_EMPTY_NOTE` when its output was captured and blank, and
    :data:`MERGED_NOT_CAPTURED_NOTE` when its stdout was not captured. Once per
    exception; any other exception is left as it is."""
    if not isinstance(error, subprocess.SubprocessError) or command_output(error) is not None:
        return
    note = ""
    for name in ("stderr", "output"):
        text, cut = _tail(getattr(error, name, None))
        if text:
            said = f" (its last {MAX_COMMAND_OUTPUT} characters)" if cut else ""
            note = f"{COMMAND_OUTPUT_NOTE}{name}{said}:\n{text}"
            break
    if not note and isinstance(error, _COMMAND_ERRORS) and error.stderr is None:
        if not _stderr_merged(error):
            # (its stdout captured alone, stdout=PIPE, and blank: its stderr went
            # elsewhere too)
            note = NOT_CAPTURED_NOTE
        elif error.output is None:
            note = MERGED_NOT_CAPTURED_NOTE
        else:
            note = MERGED_EMPTY_NOTE
    if note:
        with contextlib.suppress(Exception):  # (a __notes__ that is not a list)
            error.add_note(note)


#: the errors of a command that may carry what it wrote (``stderr``, ``output``)
_COMMAND_ERRORS = (subprocess.CalledProcessError, subprocess.TimeoutExpired)
#: the note of a command error whose command's output was not captured
NOT_CAPTURED_NOTE = (
    f"{COMMAND_OUTPUT_NOTE}stderr was not captured: it went to the file given as "
    "stderr=, or else where the task's worker writes its stderr (a manager's or "
    "cluster's log for the workers it started, a Slurm block's .err file), not with "
    "this task. To have its end here, run the command with capture_output=True (or "
    "stderr=subprocess.PIPE), and write it to a file yourself if you keep one: "
    "docs/configuration.md#where-a-tasks-output-goes"
)

#: the note of a command error whose command ran with ``stderr=subprocess.STDOUT``,
#: its output captured and blank
MERGED_EMPTY_NOTE = (
    f"{COMMAND_OUTPUT_NOTE}output (its stdout and stderr, stderr=subprocess.STDOUT) was "
    "empty: it wrote nothing"
)
#: the note of a command error whose command ran with ``stderr=subprocess.STDOUT``,
#: its stdout not captured
MERGED_NOT_CAPTURED_NOTE = (
    f"{COMMAND_OUTPUT_NOTE}stderr was not captured: it went with its stdout (stderr="
    "subprocess.STDOUT), which was not captured either, to the file given as stdout=, "
    "or else where the task's worker writes its stdout. To have its end here, run the "
    "command with stdout=subprocess.PIPE too: "
    "docs/configuration.md#where-a-tasks-output-goes"
)
#: the ``subprocess`` calls that raise a command's error with its arguments in
#: ``kwargs`` (``check_output`` calls ``run``)
_COMMAND_CALLS = (subprocess.run.__code__, subprocess.check_call.__code__)


def _stderr_merged(error: BaseException) -> bool:
    """Whether ``error`` was raised by ``subprocess.run`` (or ``check_output``,
    ``check_call``) of a command given ``stderr=subprocess.STDOUT``: read from that
    call's frame in the error's traceback (False when not found)."""
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code in _COMMAND_CALLS:
            kwargs = frame.f_locals.get("kwargs")
            if isinstance(kwargs, dict) and kwargs.get("stderr") == subprocess.STDOUT:
                return True
        tb = tb.tb_next
    return False


__all__ += [
    "MAX_COMMAND_OUTPUT",
    "MERGED_EMPTY_NOTE",
    "MERGED_NOT_CAPTURED_NOTE",
    "NOT_CAPTURED_NOTE",
    "command_output",
    "note_command_output",
]


class InputsUnreachable(CorralError):
    """A task's inputs could not be had from workers that were still connected, ``times``
    tries in a row over ``seconds`` (the task did not start): they could not hand the
    outputs over (a worker that cannot reach its peer, a transfer that keeps timing out
    or failing its checksum) or did not have them any more. Making the inputs again did
    not help, so it failed instead of trying for ever. ``inputs`` are the latest
    ``(key, holder)`` pairs that failed; ``worker`` the one that could not get them."""

    def __init__(
        self,
        key: str,
        worker: str,
        inputs: tuple[tuple[str, str], ...],
        times: int,
        seconds: float,
    ) -> None:
        pairs = ", ".join(f"{k!r} from {w!r}" for k, w in inputs[:8])
        more = f" and {len(inputs) - 8} more" if len(inputs) > 8 else ""
        super().__init__(
            f"task {key!r} could not get its inputs on worker {worker!r} ({pairs}{more}) "
            f"{times} times in a row over {seconds:.0f} s, from workers still connected; "
            "it was not started. "
            "Check that the workers can reach each other (each worker's --host, the "
            "address its peers reach it on; a firewall between hosts or pools; over "
            "wss://, each worker's certificate must name its --host: "
            "docs/security.md#tls): the worker's log says why each fetch failed ('fetch "
            "failed'). Then submit it again.",
            key=key,
            worker=worker,
            inputs=inputs,
            times=times,
            seconds=seconds,
        )


class TaskTooLarge(CorralError):
    """A task's inputs alone are larger than the memory limit of every worker that could
    run it, so it was not started (memory admission). ``needed`` is the known size of
    its inputs so far (it fails as soon as that passes the limit, before the rest are
    computed); ``largest`` the largest limit among the workers of ``pool`` (``None``: a
    task without a pool, which any worker may run); ``inputs``: how many inputs it has
    in memory (0: not told), ``done``: how many of them are computed so far, whose sizes
    ``needed`` adds up."""

    def __init__(
        self,
        key: str,
        needed: int,
        largest: int,
        pool: str | None,
        *,
        inputs: int = 0,
        done: int = 0,
    ) -> None:
        where = "of any worker" if pool is None else f"of a worker in pool {pool!r}"
        need, limit = size_text(needed), size_text(largest)
        if need == limit:  # just over: say by how much
            need, limit = f"{need} ({needed:,} bytes)", f"{limit}, {largest:,} bytes"
        if 0 < done < inputs:  # a user audit's 800 MiB cube read "at least 440.0 MiB"
            need += (
                f" (of its {inputs} inputs, {done} finished so far: about "
                f"{size_text(needed * inputs / done)} if the rest are as large)"
            )
        name = dask_name(key)
        if name is None or name.startswith("finalize"):  # a result to gather, or not dask's
            blocks = (
                ", gather its blocks into this client instead, where no worker's limit "
                "applies (futures = await cluster.submit_graph(x.__dask_graph__(), "
                "list(dask.core.flatten(x.__dask_keys__()))), then await "
                "cluster.gather(futures), and assemble them there)"
                if key.startswith("finalize-") or (name or "").startswith("finalize")
                else ""
            )
            advice = (
                "Write large results to storage from the workers (for example dask.array's "
                "to_zarr or dask.dataframe's to_parquet) instead of computing them into one "
                f"value, reduce them before gathering{blocks}, or start workers with a "
                "larger --memory."
            )
        else:  # a step inside a dask graph: its chunks are too large
            advice = (
                "Make the chunks (or partitions) it reads smaller, or start workers with a "
                f"larger --memory.{dask_chunks_hint(key)}"
            )
        super().__init__(
            f"task {key!r} needs at least {need} of inputs in memory at once, more "
            f"than the largest memory limit {where} ({limit}); it was not started. {advice}",
            key=key,
            needed=needed,
            largest=largest,
            pool=pool,
            inputs=inputs,
            done=done,
        )


class TaskTooBigForDisk(CorralError):
    """No worker that could run a task has the disk to hold it (disk-aware placement):
    ``needed`` is the least disk it needs on any of them (its output plus the inputs it
    would have to fetch there), ``largest`` the largest disk limit among the workers of
    ``pool`` (``None``: any pool), ``expected`` its output and where that size comes from
    (``source``: declared, or measured by a try of this very task that ended
    ``disk-full``; an estimate never refuses a task, so with :attr:`UNCOUNTED` and
    ``expected`` 0 its inputs alone are too large). ``held``: the bytes of its file
    inputs already on the disk of the worker it needs least on, part of ``needed`` (they
    stay there while it waits for them). ``tries`` is how many times it ran before (0:
    it was never started), ``outcome`` and ``worker`` its latest try's. ``stuck``: refused
    in a pool stuck on disk with nothing to drop and nothing running, where what is free
    now is all there will be; ``needed`` and ``largest`` are then its need on worker
    ``on`` and the disk free there now (not the largest limit): of the pool's workers,
    the one it comes closest to fitting on. ``stall``: the disk stall's account (the disks'
    use, what holds them) when the stall breaker gave up on it, ``again`` the key it
    would have dropped once more; ``foreign``: the bytes other programs' files take on
    those workers' file systems (a larger ``--disk`` cannot help then). ``held_by``
    (when ``stuck``): the file outputs on its pool's disks that only a client's futures
    hold, ``(category, bytes, outputs)`` by most bytes first: Corral cannot drop them,
    and the advice is then to release those futures first."""

    #: ``source`` when only the inputs count: the output's size is an estimate
    UNCOUNTED = "its output not counted: its size is only estimated"
    #: ``source`` of an output measured by a try that the file system stopped partway
    #: (``ENOSPC``): what it wrote by then, so the task needs at least that much
    AT_LEAST = (
        "measured: a try of this task wrote that much before the file system filled and "
        "ended disk-full"
    )

    def __init__(
        self,
        key: str,
        needed: int,
        largest: int,
        pool: str | None,
        expected: int,
        source: str,
        *,
        held: int = 0,
        tries: int = 0,
        outcome: str = "",
        worker: str = "",
        stuck: bool = False,
        stall: str = "",
        foreign: int = 0,
        again: str = "",
        on: str = "",
        held_by: tuple[tuple[str, int, int], ...] = (),
    ) -> None:
        held_by = tuple(held_by)
        where = "of any worker" if pool is None else f"of a worker in pool {pool!r}"
        inputs = max(0, needed - expected - held)
        need, limit, output, fetch, kept = _disk_sizes(needed, largest, expected, inputs, held)
        on_disk = f"{kept} of its file inputs already on that worker's disk"
        least = "at least " if source == self.AT_LEAST else ""
        if source == self.UNCOUNTED and held:
            what = f"for its inputs alone ({fetch} to fetch there plus {on_disk}; {source})"
        elif source == self.UNCOUNTED:
            what = f"for the inputs it must fetch alone ({source})"
        else:
            what = f"(an output of {least}{output}, {source}"
            if inputs:
                what += f", plus {fetch} of inputs it must fetch"
            what += f", plus {on_disk})" if held else ")"
        if not tries:
            ran = "it was not started"
        elif tries == 1:
            ran = f"it ran once and ended {outcome} on worker {worker!r}; it is not tried again"
        else:
            ran = (
                f"it ran {tries} times, the latest ending {outcome} on worker {worker!r}; it "
                "is not tried again"
            )
        advice = [
            "Start workers with a larger --disk (disk_per_worker)",
            "free their disks (release futures you no longer need)",
        ]
        if source == self.UNCOUNTED:
            advice.append("split the task so that it reads fewer inputs")
        else:
            advice.append("split the task's output into smaller chunks")
            if "resources=" in source:  # declared: it may be overestimated
                advice.append(
                    'declare a smaller output with resources={"disk": bytes} if it is overestimated'
                )
        only = sum(n for _, _, n in held_by)
        if only:  # outputs only the client's futures hold: Corral cannot drop them
            advice.remove("free their disks (release futures you no longer need)")
            advice.insert(
                0,
                "Release the futures you no longer need (del the lists of earlier stages "
                "once the next is submitted) so Corral can drop their outputs",
            )
            advice[1] = advice[1][0].lower() + advice[1][1:]
        if foreign:  # other programs' files take the room: a larger --disk cannot help
            advice = [
                "Free space on the file system holding the workers' spill directories "
                f"(other programs' files take {disk_size(foreign)} there: a larger --disk "
                "cannot help)",
                "give the workers a --spill-dir on a larger file system",
                "release futures you no longer need",
            ]
        # stuck: need and free are one worker's, the one it comes closest to fitting on
        in_pool = "" if pool is None else f" of pool {pool!r}"
        free_on = (
            f"more than the {limit} free now on worker {on!r}, the worker{in_pool} it comes "
            "closest to fitting on"
            if on
            else f"more than the most disk free now on any worker{in_pool} ({limit})"
        )
        if stuck and stall:  # the stall breaker found it could not make room
            than = (
                f"{free_on}, with nothing running on its pool's workers, and the stall "
                f"breaker could not make room: it would drop {again!r} again, made again "
                f"since it dropped it with no task finished between (their disks: {stall})"
            )
        elif stuck and only:  # what fills the disks only the client's futures hold
            than = (
                f"{free_on}, with nothing running on its pool's workers that could free "
                f"more; {only} output{'s' if only != 1 else ''} on their disks "
                f"{'is' if only == 1 else 'are'} held only by your futures "
                f"({_outputs(held_by)})"
            )
        elif stuck:  # largest: the disk free now on ``on``, in a pool that cannot free more
            than = (
                f"{free_on}, with nothing running on its pool's workers that could free "
                "more and nothing stored there that can be made again elsewhere"
            )
        else:
            than = f"more than the largest disk {where} can hold ({limit})"
        super().__init__(
            f"task {key!r} needs {least}{need} of disk {what}, {than}; {ran}. "
            f"{', '.join(advice[:-1])}, or {advice[-1]}.",
            key=key,
            needed=needed,
            largest=largest,
            pool=pool,
            expected=expected,
            source=source,
            held=held,
            tries=tries,
            outcome=outcome,
            worker=worker,
            stuck=stuck,
            stall=stall,
            foreign=foreign,
            again=again,
            on=on,
            held_by=held_by,
        )


def _disk_sizes(needed: int, largest: int, *others: int) -> list[str]:
    """``needed``, ``largest`` and ``others`` in one unit, the one that suits the largest
    of them: bytes below a MiB, else MiB (GiB from a GiB) to a tenth, or bytes for all
    when ``needed`` and ``largest`` would read the same."""
    sizes = (needed, largest, *others)
    top = max(sizes)
    scale, unit = (2**30, "GiB") if top >= 2**30 else (2**20, "MiB")
    texts = [f"{n / scale:.1f} {unit}" for n in sizes]
    if top < 2**20 or (texts[0] == texts[1] and needed != largest):
        return [f"{int(n):,} bytes" for n in sizes]
    return [
        t if n == 0 or n >= scale / 20 else f"less than 0.1 {unit}"
        for n, t in zip(sizes, texts, strict=True)
    ]


def _outputs(by: tuple[tuple[str, int, int], ...]) -> str:
    """``(category, bytes, outputs)`` each, for people: ``raw: 2 outputs, 2.0 MiB; ...``."""
    return "; ".join(f"{c}: {n} output{'s' if n != 1 else ''}, {disk_size(b)}" for c, b, n in by)


class DiskFull(CorralError):
    """A task's output did not fit on its worker's disk (the try ended ``disk-full``),
    too often to retry: ``nbytes`` is the output's size, ``room`` the disk that was
    left under the worker's limit ``disk``. With ``input``, task ``key`` wrote nothing:
    its worker could not copy that file input (``nbytes`` its size), refused before a
    byte was written, or stopped by the file system partway (``partial``). Without it,
    ``partial``: the file system stopped the task's own write (``ENOSPC``) after
    ``nbytes``, so its output is larger. ``filesystem``: the worker's spill directory,
    when the file system holding it is what had no room (it refused a write, or had
    less free than the limit left), with ``fs_free`` free bytes there: a larger
    ``--disk`` cannot help then. ``filled_by``: what the scheduler knew to fill that
    disk with other tasks' outputs, ``(category, bytes, outputs)`` by most bytes first:
    given when it was full of them rather than the output or input too large for it
    (it would fit on that disk empty); the advice is then about running their
    consumers first. ``held_by``: of ``filled_by``, the outputs only a client's futures
    hold (a client wants them, no reader of them waits): the advice is then to release
    those futures first. ``consumers_first``: the ``consumers-first`` priority is in
    force already (so it is not advised). ``declared``: the task declared its output's
    size already (so declaring one is not advised). ``measured``: the worker was
    given no ``--disk``: its limit is its file system's free space measured at start."""

    key: str
    worker: str
    nbytes: int
    room: int
    disk: int
    input: str
    partial: bool
    filesystem: str
    fs_free: int
    filled_by: tuple[tuple[str, int, int], ...]
    declared: bool
    held_by: tuple[tuple[str, int, int], ...]
    consumers_first: bool
    measured: bool
    kept_by: tuple[tuple[str, int, int], ...]
    prune_depth: int

    def __init__(
        self,
        key: str,
        worker: str,
        nbytes: int,
        room: int,
        disk: int,
        *,
        input: str = "",
        partial: bool = False,
        filesystem: str = "",
        fs_free: int = 0,
        filled_by: tuple[tuple[str, int, int], ...] = (),
        declared: bool = False,
        held_by: tuple[tuple[str, int, int], ...] = (),
        consumers_first: bool = False,
        measured: bool = False,
        kept_by: tuple[tuple[str, int, int], ...] = (),
        prune_depth: int = 1,
    ) -> None:
        filled_by = tuple(filled_by)
        held_by = tuple(held_by)
        kept_by = tuple(kept_by)
        its = "its disk (measured at start)" if measured else "its --disk"
        if filesystem:
            fs = f"the file system holding its spill directory {filesystem!r}"
            free = disk_size(fs_free)
            if partial:  # it refused a write (ENOSPC)
                left = (
                    f"{fs} ran out of space before {its} of {disk_size(disk)} was "
                    f"reached ({free} free there now)"
                    if disk
                    else f"{fs} ran out of space ({free} free there now; the worker has "
                    "no --disk limit)"
                )
            else:
                spare = f" (it keeps {disk_size(fs_free - room)} of that spare)"
                left = f"{fs} has {free} free{spare if fs_free > room else ''}" + (
                    f", less than {its} of {disk_size(disk)} leaves"
                    if disk
                    else "; the worker has no --disk limit"
                )
            left = f"{disk_size(room)} of disk left: {left}"
            advice = (
                "A larger --disk cannot help: free space on that file system, give the "
                "worker a spill directory (--spill-dir) on a larger file system, or a "
                "--disk no larger than that file system's free space (so that tasks are "
                "placed where the room is)."
            )
        elif filled_by:
            held = sum(n for _, _, n in held_by)
            pruned = sum(n for _, _, n in kept_by)
            total = sum(n for _, _, n in filled_by)
            rule = "never pruned" if prune_depth == 0 else f"pruned {prune_depth} steps downstream"
            if held and held == total:
                whose = f"other tasks' outputs that your futures hold ({_outputs(held_by)})"
            elif pruned and pruned == total:
                whose = (
                    f"other tasks' outputs whose readers all ran, kept by prune_depth="
                    f"{prune_depth} ({rule}) ({_outputs(kept_by)})"
                )
            elif held or pruned:
                notes = []
                if held:
                    notes.append(
                        f"{held} of them ({_outputs(held_by)}) {'is' if held == 1 else 'are'} "
                        "held by your futures"
                    )
                if pruned:
                    read = (
                        "was read by all its readers and is"
                        if pruned == 1
                        else "were read by all their readers and are"
                    )
                    notes.append(
                        f"{pruned} {'of them ' if not held else ''}({_outputs(kept_by)}) "
                        f"{read} kept by prune_depth={prune_depth} ({rule})"
                    )
                others = ", the others wait for their consumers" if held + pruned < total else ""
                whose = f"other tasks' outputs ({_outputs(filled_by)}); {', '.join(notes)}{others}"
            else:
                whose = f"other tasks' outputs waiting for their consumers ({_outputs(filled_by)})"
            left = (
                f"{disk_size(room)} of disk left of its {disk_size(disk)} limit: the "
                f"disk was full of {whose}, not too small for this "
                f"{'input' if input else 'output'}"
            )
            steps = []
            if held:
                steps.append(
                    "Release the futures you no longer need (del the lists of earlier "
                    "stages once the next is submitted) so Corral can drop them"
                )
            if pruned:
                steps.append(
                    "let Corral drop each output once its readers ran: prune_depth=1 (the "
                    "default; Cluster(prune_depth=1), the manager's --prune-depth 1)"
                )
            if held + pruned < total and not consumers_first:
                steps.append(
                    'run consumers before new producers (set_policy("priority", "consumers-first"))'
                )
            steps.append(
                "give the tasks that gather many outputs fewer inputs each (a smaller fan-in)"
            )
            steps.append("start workers with a larger --disk (disk_per_worker)")
            steps[0] = steps[0][0].upper() + steps[0][1:]
            advice = f"{', '.join(steps[:-1])}, or {steps[-1]}."
        else:
            left = f"{disk_size(room)} of disk left of its {disk_size(disk)} limit"
            advice = ""
        if input:
            kept = (
                "the file system filled during the copy; its partial file was removed"
                if partial
                else "nothing was written: the copy was refused before its first byte"
            )
            message = (
                f"{f'task {key!r}' if key else 'a task'} could not fetch its input "
                f"{input!r} ({disk_size(nbytes)}) to worker {worker!r}, which had {left}; "
                f"{kept}. "
                + (
                    advice
                    or "Start workers with a larger --disk (disk_per_worker), or hold "
                    "fewer outputs on their disks: release the futures you no longer need "
                    "(a prune_depth above 1 keeps outputs longer)."
                )
            )
        else:
            wrote = (
                f"filled the file system after writing {disk_size(nbytes)} of its output "
                "(the output is larger)"
                if partial
                else f"wrote an output of {disk_size(nbytes)}"
            )
            message = (
                f"task {key!r} {wrote} on worker {worker!r}, which had {left}; the partial "
                "file was removed. "
                + (
                    advice
                    or (
                        "Start workers with a larger --disk (disk_per_worker), or make "
                        "the output smaller (its declared size is what it was placed by)."
                        if declared
                        else "Start workers with a larger --disk (disk_per_worker), "
                        'declare the output\'s size with resources={"disk": bytes} so '
                        "that it is placed where it fits, or make the output smaller."
                    )
                )
            )
        super().__init__(
            message,
            key=key,
            worker=worker,
            nbytes=nbytes,
            room=room,
            disk=disk,
            input=input,
            partial=partial,
            filesystem=filesystem,
            fs_free=fs_free,
            filled_by=filled_by,
            declared=declared,
            held_by=held_by,
            consumers_first=consumers_first,
            measured=measured,
            kept_by=kept_by,
            prune_depth=prune_depth,
        )

    def with_context(
        self,
        filled_by: tuple[tuple[str, int, int], ...],
        declared: bool,
        held_by: tuple[tuple[str, int, int], ...] = (),
        consumers_first: bool = False,
        kept_by: tuple[tuple[str, int, int], ...] = (),
        prune_depth: int = 1,
    ) -> DiskFull:
        """This error, told what filled the disk (``filled_by``; ``held_by``: of those,
        the ones only a client's futures hold; ``kept_by``: the ones whose readers all
        ran, kept by ``prune_depth``), whether the task declared its output's size
        (``declared``) and whether consumers run first already (``consumers_first``)."""
        return DiskFull(
            self.key, self.worker, self.nbytes, self.room, self.disk,
            input=self.input, partial=self.partial,
            filesystem=self.filesystem, fs_free=self.fs_free,
            filled_by=filled_by, declared=declared,
            held_by=held_by, consumers_first=consumers_first,
            measured=getattr(self, "measured", False),
            kept_by=kept_by, prune_depth=prune_depth,
        )  # fmt: skip

    def reading(self, key: str) -> DiskFull:
        """This error of a file input's copy, for task ``key`` that waited for it."""
        return DiskFull(
            key, self.worker, self.nbytes, self.room, self.disk,
            input=self.input, partial=self.partial,
            filesystem=self.filesystem, fs_free=self.fs_free,
            filled_by=getattr(self, "filled_by", ()), declared=getattr(self, "declared", False),
            held_by=getattr(self, "held_by", ()),
            consumers_first=getattr(self, "consumers_first", False),
            measured=getattr(self, "measured", False),
            kept_by=getattr(self, "kept_by", ()),
            prune_depth=getattr(self, "prune_depth", 1),
        )  # fmt: skip


class ValueTooLarge(CorralError):
    """A value cannot be moved to where it was asked for: it is larger than the limit
    there (``where`` names the receiver and the limit's kind)."""

    def __init__(self, key: str, nbytes: int, limit: int, where: str) -> None:
        super().__init__(
            f"value {key!r} is {size_text(nbytes)}, more than the {size_text(limit)} {where} can "
            "take; it was not moved. Keep large values where they are made (write them to "
            "storage from the task), split them into smaller chunks, or raise the limit.",
            key=key,
            nbytes=nbytes,
            limit=limit,
            where=where,
        )


class DaskOnlyArgument(CorralError, TypeError):
    """``submit`` or ``map`` got ``name``, a keyword of dask.distributed's
    ``Client.submit``/``Client.map`` that Corral's do not take, for a function that
    does not take it either (its signature names no such parameter). Corral says so at
    the call instead of passing it to the function; ``instead`` is what to use. Or
    ``method`` (``scatter``) got such a keyword (``func`` is then empty).
    Also a ``TypeError``, what a call with an unexpected keyword raises."""

    name: str
    func: str
    instead: str

    def __init__(self, name: str, func: str, instead: str, *, method: str = "") -> None:
        if method:  # a keyword of a call with no function to pass it to (scatter)
            said = f"{name}= is a dask.distributed keyword that Corral's {method} does not take."
        else:
            said = (
                f"{name}= is a dask.distributed keyword that Corral's submit and map do not "
                f"take, and {func}() has no parameter {name!r}, so it is not passed to it "
                "either."
            )
        super().__init__(
            f"{said} {instead} (docs/api.md, 'Coming from dask.distributed').",
            name=name,
            func=func,
            instead=instead,
        )


class ParslOnlyArgument(CorralError, TypeError):
    """``submit`` or ``map`` got ``name``, a keyword a Parsl app takes (``walltime``,
    ``stdout``, ``stderr``, ``inputs``, ``outputs``, ``parsl_resource_specification``),
    for a function whose signature does not name it and that takes no ``**kwargs``:
    Corral says so at the call, with
    what to use instead (``instead``), where passing it on would fail the task on its
    worker with ``TypeError: f() got an unexpected keyword argument``. Also a
    ``TypeError``, what such a call raises."""

    name: str
    func: str
    instead: str

    def __init__(self, name: str, func: str, instead: str) -> None:
        super().__init__(
            f"{name}= is a keyword of a Parsl app that Corral's submit and map do not take, "
            f"and {func}() has no parameter {name!r}, so it is not passed to it either. "
            f"{instead} (docs/api.md, 'Coming from Parsl').",
            name=name,
            func=func,
            instead=instead,
        )


class ResultNotPicklable(CorralError, TypeError):
    """The output of task ``key`` cannot be pickled (``reason``: what pickling it
    raised), so it cannot leave worker ``worker`` for ``to``: another worker process
    where a task needs it as an input (that task fails with this error), or a client
    gathering it through a manager process. The task itself ended ok; its output stays
    on its worker, and nothing else there is lost. Also a ``TypeError``, what pickling
    such a value raises."""

    key: str
    reason: str
    worker: str
    to: str

    def __init__(self, key: str, reason: str, worker: str, to: str) -> None:
        super().__init__(
            f"the output of task {key!r} cannot be pickled ({reason}), so it cannot go "
            f"from worker {worker!r} to {to}. Return a value that pickles: open the "
            "connection, lock or file handle in the task that uses it, and return what "
            "opens it (a path, a URL, parameters) instead. Workers in one process (a "
            "Cluster() with neither an address nor processes) hand outputs to each other "
            "and to their client without pickling them.",
            key=key,
            reason=reason,
            worker=worker,
            to=to,
        )


class WorkersTimeout(CorralError, TimeoutError):
    """``wait_for_workers(wanted)`` ran out of time: ``joined`` workers had registered
    after ``seconds`` (None: the count could not be had in time either)."""

    def __init__(self, wanted: int, joined: int | None, seconds: float) -> None:
        have = "how many joined is not known" if joined is None else f"{joined} joined"
        super().__init__(
            f"waited {seconds:g} s for {wanted} worker(s); {have}. Are the workers "
            "running and pointed at this manager (their logs say why not)? With pools, "
            "is the pool's max_blocks (or the target set with scale) below that, or are "
            "its blocks still pending? status()['autoscaler'] shows the blocks and the "
            "provider's latest error. Or wait longer: wait_for_workers(n, timeout=...).",
            wanted=wanted,
            joined=joined,
            seconds=seconds,
        )


class UnknownWorkers(CorralError, ValueError):
    """``Cluster.run(..., workers=...)`` named workers (``unknown``) that the scheduler
    does not know: never joined, left already, or misspelt. ``known``: the ids of the
    workers it knows now. Nothing was run. Also a ``ValueError``."""

    def __init__(self, unknown: Iterable[str], known: Iterable[str]) -> None:
        unknown, known = tuple(unknown), tuple(sorted(known))
        hint = did_you_mean(unknown[0], known, ".") if len(unknown) == 1 else "."
        have = _names(known) if known else "none"
        super().__init__(
            f"run(workers=...) names {_names(unknown)}, which this cluster's scheduler does "
            f"not know as a worker{hint} Its workers now: {have} (`[w.worker_id for w in "
            "(await cluster.status())['workers']]`). Nothing was run: name "
            "workers from that list, or leave workers= out to run on every worker.",
            unknown=unknown,
            known=known,
        )


#: what a worker's failed ``Cluster.run`` call says of the others
_RUN_OTHERS = (
    "The other workers' answers came: run(..., on_error='return') gives them with this "
    "error in this worker's place, on_error='ignore' without it."
)


class RunNoAnswer(CorralError, TimeoutError):
    """Worker ``worker`` gave no answer to ``Cluster.run``'s call of ``func``: it left,
    or its connection dropped, before it answered (``left`` True), or it did not
    answer within ``timeout`` seconds (``left`` False: a call that had started there
    may still be running, in a thread of its own that nothing can stop; one that was
    still waiting for one of the worker's run threads was dropped there, never to run).
    The other workers' answers came. Also a ``TimeoutError``."""

    def __init__(self, worker: str, func: str, timeout: float, *, left: bool) -> None:
        if left:
            why = "left, or its connection dropped, before it answered"
        else:
            why = (
                f"did not answer within {timeout:g} s: if {func}() started there it may "
                "still be running (in a thread of its own, which nothing can stop); if it "
                "was waiting for one of the worker's run threads (all taken by calls that "
                "have not returned) it was dropped and will not run. Or the worker is "
                "stalled or cut off. Raise run(..., timeout=...) for a call that takes longer"
            )
        super().__init__(
            f"worker {worker!r} {why}. {_RUN_OTHERS}",
            worker=worker,
            func=func,
            timeout=timeout,
            left=left,
        )


class RunQueueFull(CorralError, RuntimeError):
    """Worker ``worker`` refused ``Cluster.run``'s call of ``func`` at once, not running
    it: its ``threads`` run threads were all taken by calls that had not returned, and
    ``waiting`` more calls waited for them already, the most it keeps. The other
    workers' answers came. Also a ``RuntimeError``."""

    def __init__(self, worker: str, func: str, threads: int, waiting: int) -> None:
        super().__init__(
            f"worker {worker!r} did not run {func}(): its {threads} run threads are taken "
            f"by calls that have not returned, and {waiting} more calls wait for them, the "
            "most a worker keeps. Nothing was run there. A call that never returns keeps "
            "its thread until the worker process ends: let those calls return (or "
            f"restart that worker), then call again. {_RUN_OTHERS}",
            worker=worker,
            func=func,
            threads=threads,
            waiting=waiting,
        )


class RunNotSent(CorralError, TimeoutError):
    """``Cluster.run``'s call of ``func`` reached no worker within ``timeout`` seconds:
    the manager was still at ``stage`` (``"targets"``: asking its scheduler which
    workers to call, ``"pickle"``: pickling the call for the worker processes). Nothing
    was run. Also a ``TimeoutError``."""

    def __init__(self, func: str, timeout: float, stage: str) -> None:
        doing = {
            "targets": "its scheduler had not said which workers to call (it is busy: a "
            "large graph being submitted, say)",
            "pickle": "it was still pickling the call for the worker processes (large "
            "arguments: make them inside the function, or send a path to read)",
        }[stage]
        super().__init__(
            f"run: {func}() was sent to no worker within {timeout:g} s: {doing}. Nothing "
            "was run. Call again, or raise run(..., timeout=...).",
            func=func,
            timeout=timeout,
            stage=stage,
        )


class UnknownFuture(CorralError, LookupError):
    """``Future(key, cluster)`` made by hand for a key this cluster's client holds no
    Future of: one another client submitted, one released already, or one that does
    not exist. Nothing would ever tell such a future its task's fate (the cluster
    sends it only to the clients that submitted the key), so awaiting it would wait
    forever: it is refused when made. ``key``: the key. Also a ``LookupError``."""

    def __init__(self, key: object) -> None:
        super().__init__(
            f"Future({key!r}, cluster): this cluster's client holds no Future of that key "
            "(another client submitted it, it was released, or there is no such task), so "
            "nothing would ever answer it. A Future comes from this cluster's submit, map, "
            "submit_graph, scatter or persist. To read a result another client of the same "
            "manager holds, submit a task that takes it, while that client holds it: "
            "`cluster.submit(func, TaskRef(key))` (`from dask._task_spec import TaskRef`), "
            "or submit the same pure call, whose key is the same task",
            key=key,
        )


class EagerComputeOnCluster(CorralError, ValueError):
    """dask computed, with a scheduler of this process (its threads, its synchronous
    one), a graph that reads chunks a running :class:`~runtime.client.Cluster` holds
    on its workers (a collection ``persist`` returned, or one made from it): what dask
    computes at once, outside any ``compute`` (``len(x)``, a ``set_index``'s
    divisions), or ``x.compute()`` without ``scheduler=``. Those chunks are not in
    this process, so dask's scheduler cannot read them (dask said ``ValueError:
    Missing dependency``). ``keys``: some of them. Also a ``ValueError``."""

    def __init__(self, keys: Iterable[object]) -> None:
        keys = tuple(keys)
        super().__init__(
            f"dask computed a graph reading {_names(keys, 3)} with a scheduler of this "
            "process, but those are chunks of a collection persisted on a Corral cluster: "
            "they are on its workers, not here. In the cluster's event loop, await the "
            "cluster for the value: `await cluster.compute(x.shape[0])` for a length, "
            "`await cluster.compute(x)`; in a thread (`await anyio.to_thread.run_sync(f)`), "
            "compute inside `with dask.config.set(scheduler=cluster.get):` "
            "(docs/api.md#computes-dask-makes-while-it-optimizes)",
            keys=keys,
        )


class ClusterAlreadyStarted(CorralError, RuntimeError):
    """``Cluster.start()`` (or ``async with cluster``) on a cluster whose start is under
    way (``state`` ``"starting"``: another task's ``start()``, not finished yet) or that
    runs already (``"running"``). Nothing is started: a second start would start a
    second set of actors and workers for the same object. Also a ``RuntimeError``."""

    def __init__(self, state: str) -> None:
        if state == "starting":
            what = (
                "this cluster is starting already: another start() of it (or `async "
                "with` it) is under way, in another task. Await that one, then use the "
                "cluster"
            )
        else:
            what = (
                "this cluster is already running (an earlier start() or `async with` "
                "started it): use it as it is; `async with` it again would close it when "
                "its block is left"
            )
        super().__init__(
            f"{what}. Nothing was started; for a second cluster, make a new Cluster(...)",
            state=state,
        )


class ClusterClosed(CorralError, RuntimeError):
    """``Cluster.start()`` (or ``async with cluster``) on a cluster that was closed
    (``close()``, or its ``async with`` block left): a closed cluster does not start
    again (its futures' results went with it); nothing is started. Also a
    ``RuntimeError``. A start that failed is not a close: that object may start again."""

    def __init__(self) -> None:
        super().__init__(
            "this cluster was closed (close() was called, or its `async with` block was "
            "left) and does not start again: its futures' results went with it. Nothing "
            "was started; make a new Cluster(...) (the same arguments give the same kind "
            "of cluster) and submit the work to it"
        )


class ManagerLost(CorralError):
    """The client's connection to the manager closed, or the manager stayed silent past
    the liveness bound: every result still pending is gone with it, and the
    ``Cluster(address)`` that lost it is closed for good (every later call raises this):
    a new one connects to a manager running again. ``timeout``: the seconds of silence
    after which the client gave up on a manager that sent nothing (its
    ``manager_timeout``; None: the connection closed), which may only have stalled."""

    def __init__(self, address: str, reason: str, timeout: float | None = None) -> None:
        stall = (
            ""
            if timeout is None
            else "The manager may still be running, only stalled (a long garbage collection, "
            "swapping, a paused machine): this client gives up on a manager silent for "
            f"{timeout:g} s; to ride out such stalls, give it longer with "
            "Cluster(address, manager_timeout=SECONDS) (docs/deployment.md#when-the-manager-"
            "stalls). "
        )
        super().__init__(
            f"lost the manager at {address}: {reason}. {stall}{_resubmit(address)}",
            address=address,
            reason=reason,
            timeout=timeout,
        )


def _resubmit(address: str) -> str:
    """What a client that lost its manager does next (:class:`ManagerLost`, and a
    client's :class:`ManagerStopping`)."""
    return (
        "Results that were still pending are gone with it, and this Cluster is closed for "
        "good: every later call on it raises this error. Once a manager is running there "
        f"again, make a new Cluster({address!r}) and submit the work again."
    )


#: the signals that stop a manager or worker process in order (runtime/node.py
#: ``_until_signalled``), in words: a closed terminal's SIGHUP is one of them
STOP_SIGNALS = "SIGINT, SIGTERM or SIGHUP"


class ManagerStopping(ManagerLost):
    """The manager stops on purpose (SIGINT/SIGTERM/SIGHUP, or its embedding program cancelled
    it): the last word it sends each connection (a ``Refused`` frame) before it closes
    it. A worker told so leaves (one with ``--connect-retry`` tries to rejoin a manager
    started again there for that long first); a client's pending calls and later ones
    raise it (a :class:`ManagerLost`, so code that catches that still does), with
    ``for_client``: its text then says what to do next, as ManagerLost's does."""

    def __init__(self, address: str, how: str = STOP_SIGNALS, *, for_client: bool = False) -> None:
        # Without for_client: the text consoles and workers show as the reason the
        # connection ended (and a websocket's close reason: short).
        tail = f". {_resubmit(address)}" if for_client else ""
        CorralError.__init__(
            self,
            f"the manager at {address} stopped on purpose ({how}){tail}",
            address=address,
            reason=f"it stopped on purpose ({how})",
            how=how,
        )


class ManagerUnreachable(CorralError):
    """A worker lost its manager without being told it was stopping (a crash, a
    ``kill -9``, the network) and could not rejoin it within its reconnect time."""

    def __init__(self, address: str, seconds: float) -> None:
        super().__init__(
            f"lost the manager at {address} without its goodbye (it crashed, was killed or "
            f"the network failed) and could not rejoin it for {seconds:g} s; start the "
            "worker again once the manager is back",
            address=address,
            seconds=seconds,
        )


class WorkerCoreFailed(CorralError):
    """A worker process's core raised (a bug in Corral): the worker told the scheduler
    it is lost (cause ``crash``; its tasks run elsewhere) and left; its log has the
    traceback (``worker core failed``)."""

    worker: str

    def __init__(self, worker: str) -> None:
        super().__init__(
            f"worker {worker!r} stopped: its core raised (a bug in Corral; the traceback is "
            "logged above as 'worker core failed'), so it left as lost and its tasks run "
            "elsewhere. Please report it with that traceback; a new worker may be started",
            worker=worker,
        )


class CorralHomeError(CorralError, NotADirectoryError):
    """Corral's directory of the user's (``$CORRAL_HOME``, else ``~/.corral``: the token
    files, run directories, console history) is not a directory and cannot be made one:
    ``path`` is a file, or lies under one (``blocker``). ``variable``: whether
    ``CORRAL_HOME`` named it. Also a ``NotADirectoryError`` (an ``OSError``), what
    making a directory there raised before."""

    def __init__(self, path: str, blocker: str, variable: bool) -> None:
        what = "is a file" if blocker == path else f"is under {blocker}, which is a file"
        who = f"CORRAL_HOME={path!r}" if variable else f"Corral's directory {path}"
        fix = (
            "Set CORRAL_HOME to a directory (one that does not exist yet is made), or unset "
            "it for ~/.corral"
            if variable
            else "Move that file away, or set CORRAL_HOME to a directory"
        )
        text = (
            f"{who} {what}, not a directory: Corral keeps its token files, run directories "
            f"and console history there. {fix}"
        )
        super().__init__(text, path=path, blocker=blocker, variable=variable)


class CorralHomeDenied(CorralHomeError, PermissionError):
    """Corral's directory of the user's (``$CORRAL_HOME``, else ``~/.corral``) lies under
    a directory (``blocker``) this user may not enter (no search permission), so it
    cannot be read or made. Also a ``PermissionError``, what reaching it raised before;
    ``uid``: the user's id."""

    def __init__(self, path: str, blocker: str, variable: bool, uid: int) -> None:
        who = f"CORRAL_HOME={path!r}" if variable else f"Corral's directory {path}"
        fix = (
            "Set CORRAL_HOME to a directory this user may reach (one that does not exist "
            "yet is made), or unset it for ~/.corral"
            if variable
            else "Set CORRAL_HOME to a directory this user may reach"
        )
        text = (
            f"{who} is under {blocker}, which this user (uid {uid}) may not enter: Corral "
            "keeps its token files, run directories and console history there. "
            f"{fix}; or let this user enter {blocker} (chmod u+x, g+x or o+x, whichever "
            "applies to it)"
        )
        CorralError.__init__(self, text, path=path, blocker=blocker, variable=variable, uid=uid)


class _FileProblem:
    """The constructor of the errors (before :class:`CorralError` in their bases) about
    a file (``path``) that cannot be used, ``problem`` saying why and what to do: the
    message is the class's :attr:`TEXT` with both put in. Not an exception class of its
    own (every one of those is public, re-exported by ``runtime``)."""

    #: the message, with ``{path}`` and ``{problem}``
    TEXT = "{path}: {problem}"
    path: str
    problem: str

    def __init__(self, path: str, problem: str) -> None:
        text = self.TEXT.format(path=path, problem=problem)
        super().__init__(text, path=path, problem=problem)  # type: ignore[call-arg]


class TokenFileError(_FileProblem, CorralError, ValueError):
    """The token file given (``--token-file PATH`` of a worker or console,
    ``Cluster(address, token_file=PATH)``) cannot be used: missing, a directory, empty,
    open to other users (group or others may read or change it: as ssh refuses a
    private key, until ``chmod 600 PATH``), not a token, or given together with a token
    (``--token``, ``token=``). ``problem`` says which and what to do; it never quotes
    the file's text."""

    TEXT = "token file {path}: {problem}"


# ----------------------------------------------------------------------------- console


class ConsoleError(CorralError):
    """A console command was given wrong arguments, or asked what cannot be done
    (``undrain`` of a worker that cannot be taken back): the message says why."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


# ----------------------------------------------------------------------------- bugs


class InvalidTransition(CorralError, RuntimeError):
    """A bug: the core tried a transition that ``TRANSITIONS`` does not allow."""

    def __init__(
        self, key: Hashable, start: str, finish: str, story: list[tuple[Any, ...]]
    ) -> None:
        super().__init__(
            f"invalid transition of task {key!r}: {start} -> {finish}. This is a bug in "
            f"Corral; please report it with this story: {story[-10:]}",
            key=key,
            start=start,
            finish=finish,
            story=story,
        )


# ----------------------------------------------------------------------------- batch systems


class BatchSystemError(CorralError):
    """A batch-system command (``sbatch``, ``squeue``, ``scancel``, ``scontrol``) could
    not be run or failed: the controller is down or unreachable, the command is missing,
    or it refused the request. ``exit_code`` is None when the command did not run (not
    found, no answer within the time limit, or held back while backing off)."""

    command: str
    exit_code: int | None
    stderr: str
    advice: str
    failure: str  #: the message without the advice: what failed and what it printed

    def __init__(self, command: str, exit_code: int | None, stderr: str, advice: str) -> None:
        if exit_code is not None:
            how = f"failed with exit code {exit_code}"
        else:
            how = "could not be run" if stderr.strip() else "was not run"
        said = stderr.strip()
        said = f": {said[-800:]}" if said else ""
        failure = f"{command!r} {how}{said}"
        super().__init__(
            f"{failure}. {advice}",
            command=command,
            exit_code=exit_code,
            stderr=stderr,
            advice=advice,
            failure=failure,
        )


class SubmissionsSuspended(CorralError):
    """A provider stopped submitting blocks: too many of its recent submissions failed
    (``failures`` of the last ``window``). It asks again only once an operator resumes
    its pool (``pool``, "" if not known): ``resume POOL`` in the console, or the
    provider's ``resume()`` where it is driven from Python, after fixing the cause
    (``last_error``)."""

    provider: str
    failures: int
    window: int
    last_error: str
    pool: str

    def __init__(
        self, provider: str, failures: int, window: int, last_error: str, pool: str = ""
    ) -> None:
        which = f" for pool {pool}" if pool else ""
        super().__init__(
            f"the {provider} provider stopped submitting blocks{which}: "
            f"{failures} of its last {window} submissions failed (the last: {last_error}). "
            f"Fix the cause, then run `resume {pool or 'POOL'}` in the console (or call the "
            "provider's resume() if you drive it from Python); until then no block is requested.",
            provider=provider,
            failures=failures,
            window=window,
            last_error=last_error,
            pool=pool,
        )


# ----------------------------------------------------------------------------- configuration


class PoolConfigError(CorralError, ValueError):
    """A pool's configuration (``Cluster(pools=...)``, ``--config FILE``) was refused
    before anything started: ``key`` of pool ``pool`` (either may be empty for a
    problem with the whole file) and what is wrong with it, with what is allowed and,
    for a misspelt name, the closest known one. ``source`` is the file, if any."""

    pool: str
    key: str
    problem: str
    source: str

    def __init__(self, pool: str, key: str, problem: str, source: str = "") -> None:
        where = f"pool {pool!r}" if pool else "the pool configuration"
        super().__init__(
            _refused(where, source, key, problem, "docs/configuration.md#pools for every key"),
            pool=pool,
            key=key,
            problem=problem,
            source=source,
        )


class PoolNameError(CorralError, ValueError):
    """A pool's name that cannot be one (``""``, blank, or ``"*"``, the key of any pool:
    ``runtime.messages.pool_name_problem``), given where a worker joins a pool or a pool
    is scaled or resumed: ``given`` says where (``--pool``, ``Cluster(pool=...)``,
    ``run_worker(pool=...)``, ``scale``, ``resume``), ``problem`` why, ``todo`` what to
    give instead. Refused before anything is done."""

    name: object
    given: str
    problem: str

    def __init__(self, name: object, given: str, problem: str, todo: str) -> None:
        super().__init__(
            f"{given} must name a pool, got {name!r}: {problem}. {todo}",
            name=name,
            given=given,
            problem=problem,
        )


__all__ += ["PoolNameError"]


class WalltimeError(CorralError, ValueError):
    """A walltime (``SlurmOptions(walltime=...)``; a pool's ``walltime``, which
    :class:`PoolConfigError` reports with the same ``problem``) that is not a time
    Corral and Slurm's ``sbatch --time`` both read: ``value`` as given, ``problem``
    what is wrong, with the forms a walltime takes and an example."""

    value: object
    problem: str

    def __init__(self, value: object, problem: str) -> None:
        super().__init__(
            f"walltime {problem}. See docs/configuration.md#pools.", value=value, problem=problem
        )


__all__ += ["WalltimeError"]


def _refused(where: str, source: str, key: str, problem: str, see: str) -> str:
    """The message of a refused configuration: where (in which file), which key, what is
    wrong, where to read more."""
    if source:
        where += f" in {source}"
    what = f"key {key!r} " if key else ""
    end = "" if problem.endswith((".", "?")) else "."
    return f"{where}: {what}{problem}{end} See {see}."


__all__ += ["PoolConfigError"]


class TableConfigError(CorralError, ValueError):
    """A table of a manager's configuration file (``[policies]``, ``[scheduler]``: its
    subclasses) was refused before anything started: ``key`` and what is wrong with it
    (``problem``). ``source`` is the file. The message names the table, the file and
    the key, and points to the table's section of docs/configuration.md."""

    #: the table's name, which is also its section's anchor in docs/configuration.md
    table = ""
    key: str
    problem: str
    source: str

    def __init__(self, key: str, problem: str, source: str = "") -> None:
        see = f"docs/configuration.md#{self.table}"
        super().__init__(
            _refused(f"[{self.table}]", source, key, problem, see),
            key=key,
            problem=problem,
            source=source,
        )


class PolicyConfigError(TableConfigError):
    """The ``[policies]`` table of a manager's configuration file was refused before
    anything started: ``key`` (a kind, or ``kind.parameter``) and what is wrong with it
    (an unknown kind or policy, bad parameters: the registry's own words).
    ``source`` is the file."""

    table = "policies"


class SchedulerConfigError(TableConfigError):
    """The ``[scheduler]`` table of a manager's configuration file was refused before
    anything started: ``key`` and what is wrong with it (an unknown key, with the
    closest one; a value of the wrong type or out of range, with what is allowed).
    ``source`` is the file."""

    table = "scheduler"


__all__ += ["PolicyConfigError", "SchedulerConfigError", "TableConfigError"]


class AlertConfigError(CorralError, ValueError):
    """An alert rule (``[[alerts]]`` of the manager's configuration, ``alert add`` in
    the console, or a rule given as data) or an alerting setting was refused: ``key``
    of rule ``rule`` (either may be empty for a problem with the whole configuration)
    and what is wrong with it, with what is allowed and, for a misspelt name (key,
    metric, label), the closest known one. ``source`` is the file, if any; ``see``: the
    section of docs/monitoring.md the message points to."""

    rule: str
    key: str
    problem: str
    source: str
    see: str

    def __init__(
        self, rule: str, key: str, problem: str, source: str = "", see: str = "alert-rules"
    ) -> None:
        where = f"alert rule {rule!r}" if rule else "the alerting configuration"
        super().__init__(
            _refused(where, source, key, problem, f"docs/monitoring.md#{see}"),
            rule=rule,
            key=key,
            problem=problem,
            source=source,
            see=see,
        )


def did_you_mean(
    word: object, choices: Iterable[str], otherwise: str = "", *, prefix: str = ""
) -> str:
    """The text "; did you mean 'x'?" for the choice closest to ``word`` (else
    ``otherwise``): for errors about a misspelt name (a ``word`` that is no string, say
    None, is no misspelling: ``otherwise``). ``prefix``: what the error puts before the
    word it names (``alerting.`` for ``key 'alerting.resnd'``), put before the choice
    too, so the two are named alike (``did you mean 'alerting.resend'?``). The text ends
    a sentence (``?``): what follows starts a new one (``otherwise`` is ``.`` for it)."""
    if not isinstance(word, str):
        return otherwise
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {prefix + close[0]!r}?" if close else otherwise


__all__ += ["AlertConfigError", "did_you_mean"]


_T = TypeVar("_T")


class Refusals:
    """Where a configuration loader (:func:`actors.pools.read_config`,
    ``pools_from_dicts``, ``load_policies``, ``runtime.monitor.alerting_config``) puts
    what it refuses. By default (``keep=False``) the first refusal is raised, as a
    manager starting with the file does; with ``keep=True`` each is kept in ``errors``
    and the loader goes on with the next key, table or section (a pool's and an alert
    rule's keys, and ``[alerting]``'s, each: :meth:`per_key`), so ``python -m runtime
    check`` reports every one in one run. A refusal already kept (the same message: a
    file's unknown top-level key, which each section's loader sees) is kept once."""

    def __init__(self, keep: bool = False) -> None:
        self.keep = keep
        self.errors: list[CorralError] = []

    def __call__(self, error: CorralError) -> None:
        if not self.keep:
            raise error from error.__cause__
        if all(str(e) != str(error) for e in self.errors):
            self.errors.append(error)

    def unknown(
        self, keys: Iterable[object], known: Sequence[str], error: Callable[[str], CorralError]
    ) -> bool:
        """Refuse ``error(key)`` for each of ``keys`` not in ``known`` (each error says
        its own did-you-mean); whether there was one."""
        bad = [str(k) for k in keys if k not in known]
        for key in bad:
            self(error(key))
        return bool(bad)

    def per_key(
        self,
        check: Callable[[Mapping[str, Any]], _T],
        raw: Mapping[str, Any],
        key_of: Callable[[Any], str],
        *,
        final: Sequence[str] = (),
    ) -> tuple[_T | None, bool]:
        """``check(raw)``, which raises a :class:`CorralError` naming a key
        (``key_of(error)``, its first dotted part counts) for the first problem. Not
        keeping refusals, that error is raised. Keeping them, the key it names is left
        out (its default taken) and the rest checked again, so one run keeps every
        key's problem, not only the first. Returns what ``check`` made of the keys left
        (None when it gave up: a refused key not in ``raw``, or one of ``final``, whose
        default would only bring up problems of its own) and whether anything was
        refused."""
        if not self.keep:
            return check(raw), False
        rest = dict(raw)
        refused = False
        while True:
            try:
                return check(rest), refused
            except CorralError as err:
                self(err)
                refused = True
                key = key_of(err).split(".", 1)[0]
                if key not in rest or key in final:
                    return None, True
                del rest[key]


__all__ += ["Refusals"]


class MonitoringDBError(_FileProblem, CorralError, ValueError):
    """``path`` cannot be used as a monitoring database: it is missing, not an SQLite
    file, not one Corral wrote, or of another schema version; ``problem`` says which
    and what to do."""

    TEXT = "monitoring database {path}: {problem} (see docs/monitoring.md#monitoring-database)"


class ReportOutputError(_FileProblem, CorralError, ValueError):
    """The report cannot be written to ``path`` (``-o``): ``problem`` says why and what
    to do. Said before the report is built; nothing is written at ``path``."""

    TEXT = "report output {path}: {problem}; nothing was written (see docs/monitoring.md#report)"


class ReportRunError(MonitoringDBError):
    """The report cannot take what ``--run``, ``--since`` and ``--until`` ask of the
    monitoring database ``path``: no run of that id, a time it cannot read, a window
    outside the run or with no task in it, or several runs in a window and no ``--run``;
    ``problem`` says which, with the runs the file holds (as ``--list`` shows them) and
    what to give instead. Nothing is written. A :class:`MonitoringDBError` too."""

    TEXT = "monitoring database {path}: {problem} (see docs/monitoring.md#report)"


class PruneDepthError(CorralError, ValueError):
    """``prune_depth`` (``Cluster(prune_depth=...)``, ``--prune-depth``) is not a whole
    number >= 0."""

    def __init__(self, value: object) -> None:
        super().__init__(
            f"prune_depth must be a whole number >= 0, got {value!r}: 1 (the default) drops "
            "an output once the tasks that read it are done, 2 once their own readers are "
            "done too, and so on; 0 never drops outputs. See docs/files.md#pruning-depth.",
            value=value,
        )


__all__ += ["PruneDepthError"]


class LongTaskError(CorralError, ValueError):
    """``long_task`` or ``unknown_long`` (``Cluster(long_task=..., unknown_long=...)``,
    ``SchedulerConfig``, the manager's ``--long-task``) is out of range: ``option`` names
    which, ``value`` is what was given."""

    def __init__(self, option: str, value: object) -> None:
        if option == "unknown_long":
            problem = (
                f"unknown_long must be True or False, got {value!r}: True (the default) "
                "sends a task of a category with no finished try only to a worker with a "
                "core free of tasks; False counts it as short (up to saturation tasks per "
                "core, the manager's --no-unknown-long)"
            )
        else:
            problem = (
                f"long_task must be a number of seconds >= 0, got {value!r}: a task expected "
                "to run this long or longer goes only to a worker with a core free of tasks "
                "(default 1.0; inf: none counts as long by its duration)"
            )
        super().__init__(
            f"{problem}. See docs/configuration.md#schedulerconfig.", option=option, value=value
        )


__all__ += ["LongTaskError"]


class CheckpointError(CorralError, RuntimeError):
    """``checkpoint()``, ``checkpoint_file()``, ``restore()`` or ``restore_path()``
    cannot work: called outside a running task, a checkpoint larger than the disk its
    worker has left, a file that cannot be read or written, a checkpoint that is not a
    pickle (``reason`` says which, and what to do)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason} See docs/files.md#checkpoints.", reason=reason)


__all__ += ["CheckpointError"]


class FileOutputError(CorralError, ValueError):
    """A file output used where it cannot work: ``output_path()`` called outside a
    running task or with a name that is not a plain file name, or a task that returned a
    ``File`` whose path is outside its worker's sandbox or is not a regular file
    (``reason`` says which, and what to do)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason} See docs/files.md#file-outputs.", reason=reason)


class FileChecksumError(CorralError):
    """A file output copied from worker ``worker`` does not have the checksum (sha256)
    its holder recorded: the copy was removed and the file is fetched again (from
    another holder, or made again)."""

    def __init__(self, key: str, worker: str, expected: str, got: str) -> None:
        super().__init__(
            f"file output {key!r} copied from worker {worker!r} has sha256 {got}, not the "
            f"{expected} its holder recorded; the copy was removed. The file changed on "
            "its holder's disk after the task wrote it, or was damaged on the way: tasks "
            "must not modify the files of their inputs (write a new output instead).",
            key=key,
            worker=worker,
            expected=expected,
            got=got,
        )


__all__ += ["FileChecksumError", "FileOutputError"]
