"""The control console: ``python -m runtime console ADDRESS [COMMAND ...]``.

What lives here:

- :class:`ConsoleClient`: a connection to a manager as a console (``Hello("console",
  ...)``) and one async method per command, each returning data (``status()``,
  ``tasks()``, ``story()``, ``policies()``, ``set_policy()``, ``drain()``, ``scale()``,
  ``cancel()``); :meth:`ConsoleClient.execute` parses a command line and returns a
  :class:`Result` (data plus how to show it), :meth:`ConsoleClient.run_command` the
  text (tables, or JSON with ``--json``).
- Rendering: ``render_*`` functions turn data into rich tables; :func:`jsonable` into
  plain JSON values.
- :class:`ConsoleShell`: the interactive shell (``cmd.Cmd``: readline history, tab
  completion of commands and their words). Its ``onecmd`` runs one line; it calls the
  client through ``call`` (a blocking portal's ``call`` in the command line tool,
  ``anyio.from_thread.run`` in tests), so the shell itself never touches the event loop.
  In the command line tool a thread waits for the connection to end and wakes the
  prompt (a SIGINT to the main thread), so the shell leaves at once.
- :func:`main`: what ``python -m runtime console`` runs (one-shot when a command follows
  the address, else the shell).

Roles: with the read-only token the manager answers only ``status``, ``tasks``,
``story``, ``policy list`` and ``alert list``; the other commands fail with
:class:`runtime.node.PermissionDenied` and change nothing. The console sends only wire
messages, so a read-only connection can carry them, and takes only wire messages back:
it never unpickles anything (``allow_pickle=False``). The status is a typed
``StatusReply``; the other answers are wire messages or JSON values
(``runtime.remote.to_wire``).
"""

from __future__ import annotations

import argparse
import cmd
import contextlib
import dataclasses
import errno
import io
import json
import os
import re
import shlex
import signal
import sys
import threading
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import anyio
import anyio.abc
import orjson
from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from actors.alerts_state import typed_duration
from actors.autoscaler_state import brief_detail, check_blocks, policy_failing_text
from actors.scheduler_records import disk_stall_parts, placement_stall_parts
from policies import params_text, values_text
from runtime.client_ids import console_id
from runtime.errors import (
    ActorStopped,
    AuthenticationFailed,
    ConsoleError,
    CorralError,
    PermissionDenied,
    ProtocolError,
    RemoteError,
    size_text,
)
from runtime.graph import category_of
from runtime.home import corral_home, private_dir
from runtime.messages import (
    ANY_POOL,
    MAX_LISTING,
    AlertRuleAdd,
    AlertRuleRemove,
    AlertsReply,
    AlertsRequest,
    CancelKeysRequest,
    DiskStallInfo,
    DrainRequest,
    ForgetCategoryRequest,
    Message,
    MoveRequest,
    PlacementStallInfo,
    PolicyInfo,
    PolicyQuery,
    ResumeRequest,
    ScaleRequest,
    SetPolicyRequest,
    StatusReply,
    StatusRequest,
    StoryQuery,
    TaskRecord,
    TasksQuery,
    UndrainRequest,
    pool_key,
    pool_name,
    pool_name_problem,
)
from runtime.notify import AlertChanges

__all__ = [
    "COMMANDS",
    "ConsoleClient",
    "ConsoleError",
    "ConsoleShell",
    "Result",
    "history_path",
    "jsonable",
    "keep_history",
    "main",
    "render_status",
    "replaced_text",
    "resumed_text",
]

#: Task states, for ``tasks --state`` and its completion.
STATES = ("waiting", "queued", "processing", "memory", "released", "erred", "cancelled")

#: ``status`` shows this many categories, those with the most task time (a manager may
#: know many thousands: drawing them all took seconds); ``--categories N|all``.
STATUS_CATEGORIES = 20

#: Every command: (usage, what it does, admin only).
COMMANDS: dict[str, tuple[str, str, bool]] = {
    "status": (
        "status [--categories N|all]",
        "workers (cores, memory, pool, running tasks, RSS), pools and their queues, tasks "
        f"by state, the {STATUS_CATEGORIES} categories with the most task time (--categories "
        "N: N of them; all: every one), stored outputs and policies",
        False,
    ),
    "config": (
        "config [SECTION]",
        "the settings the manager runs with and where each came from (default, file, flag "
        "--NAME, env NAME): its own (listen, --config file, timeouts, monitoring), the "
        "scheduler's ([scheduler]), each pool's keys after the defaults with its workers' "
        "memory fences (memory_options.*), the alerting and the policies it started with; "
        "never a token. SECTION: only the sections it begins (manager, scheduler, pools, "
        "pools.NAME, alerting, policies)",
        False,
    ),
    "tasks": (
        "tasks [--state STATE] [--category CATEGORY] [--client NAME] [--pool NAME] [--limit N] "
        "[--offset N]",
        "list tasks, the pool and the client that submitted each (default: the first 100; "
        "--limit 0 a page of 10,000; --offset N skips N; --client NAME: that client's only; "
        "--pool NAME: those submitted to that pool only)",
        False,
    ),
    "story": ("story KEY", "every recorded transition of a task (or of a worker id)", False),
    "policy": (
        "policy list | policy set KIND NAME [key=value ...]",
        "show the policies in use and the available ones; or swap one (values are read "
        "as JSON when they parse, else as text; `set` needs the admin token)",
        False,
    ),
    "drain": (
        "drain WORKER",
        "give a worker no new tasks; it is stopped once its running tasks finish (admin)",
        True,
    ),
    "undrain": (
        "undrain WORKER",
        "take a draining worker back: it takes new tasks again and is not stopped (admin)",
        True,
    ),
    "forget": (
        "forget CATEGORY",
        "start a task category's statistics afresh (a past outlier, one huge try, no longer "
        "holds its tasks back by memory admission or steers their placement; admin)",
        True,
    ),
    "scale": (
        "scale POOL N",
        "keep N blocks of workers in a pool (clusters with an autoscaler; admin)",
        True,
    ),
    "resume": (
        "resume POOL",
        "ask the batch system for a pool's blocks again after it failed too often (status "
        "shows the error; fix the cause first) or after the pool gave up (admin)",
        True,
    ),
    "alert": (
        "alert list | alert watch [SECONDS] | alert add NAME EXPR [OPTIONS] | alert remove NAME",
        "show the alerts (pending, firing, resolved lately), the rules and the latest "
        "remediation audit; or print each change of an alert's state as it comes, for "
        "SECONDS (default 60); or add (or replace) a rule, or remove one, live (admin). EXPR "
        "in quotes; OPTIONS: --for D, --keep-firing-for D, --label K=V, --annotation K=V, "
        "--scale-out N|fit with --pool, --max-blocks, --max-cost, --cooldown (D: 90, 90s, "
        "5m); or `alert add {JSON rule}`",
        False,
    ),
    "cancel": (
        "cancel KEY|RUN",
        "cancel a task (and what depends on it), or every task of a run (run-N, as status "
        "lists them); `cancel --key KEY` or `cancel --run RUN` when it is unclear (admin)",
        True,
    ),
    "move": (
        "move KEY... [--pool POOL] [--priority N]",
        "move waiting or queued tasks (not yet sent to a worker) to another pool and/or "
        "priority; they keep their keys, so what depends on them stands (a running task "
        "is left as it is; admin)",
        True,
    ),
    "help": ("help [COMMAND]", "show the commands, or one command's usage", False),
    "quit": ("quit | exit | Ctrl-D", "leave the shell", False),
}
_ALIASES = {"exit": "quit", "?": "help"}


def command_forms() -> list[str]:
    """Every command of :data:`COMMANDS` by name, with its verbs (``policy list``,
    ``policy set``, ``alert watch``, ...), as its usage gives them: the list that
    ``console --help`` shows, from the table the shell's ``help`` shows."""
    forms: list[str] = []
    for name, (usage, _, _) in COMMANDS.items():
        for alternative in usage.split(" | "):
            first, *rest = alternative.split()
            if first != name:  # quit's other spellings (exit, Ctrl-D)
                continue
            verb = rest[0] if rest and rest[0].isalpha() and rest[0].islower() else ""
            forms.append(f"{name} {verb}".strip())
    return list(dict.fromkeys(forms))


_RUN = re.compile(r"run-\d+")
_JSON_FLAG = re.compile(r"(?:^|\s+)--json(?=\s|$)")


# ----------------------------------------------------------------------------- results


@dataclasses.dataclass
class Result:
    """What a command produced: ``data`` (plain JSON values) and ``view`` (a rich
    renderable of the same). ``command`` names the command; ``quit`` asks the shell to
    end; ``as_json``: the line asked for JSON."""

    command: str
    data: Any
    view: RenderableType
    as_json: bool = False
    quit: bool = False

    def json(self) -> str:
        return orjson.dumps(self.data, option=orjson.OPT_INDENT_2).decode() + "\n"

    def text(self, width: int = 120) -> str:
        """The result as it prints: JSON when asked for, else the tables as plain text."""
        if self.as_json:
            return self.json()
        buf = io.StringIO()
        Console(file=buf, width=width, color_system=None, force_terminal=False).print(self.view)
        return buf.getvalue()


#: the widest a view is printed off a terminal (characters)
_WIDEST = 100_000


def print_view(view: RenderableType, file: Any = None) -> None:
    """Print ``view`` on ``file`` (default: stdout). On a terminal it fits the
    terminal; elsewhere (a pipe, a file) it is as wide as it needs, at least 80
    characters: no column is cut short and no line wrapped, so keys and ids can be copied
    from it (rich would cut everything to 80 columns)."""
    console = _Console(file=file)
    if not console.is_terminal:
        probe = Console(file=io.StringIO(), width=_WIDEST, color_system=None)
        need = Measurement.get(probe, probe.options, view).maximum
        console = _Console(file=file, width=min(max(need, 80), _WIDEST))
    console.print(view)


class _Console(Console):
    """A rich console that lets a closed pipe's ``BrokenPipeError`` through (to end
    ``python -m runtime`` as a closed pipe ends cat), rather than exit 1 itself."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more to write
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON values: messages and dataclasses become dicts of their
    fields, mappings dicts with text keys, sequences and sets lists."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, Message):
        return {k: jsonable(v) for k, v in obj.to_fields().items()}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, set | frozenset):
        return sorted((jsonable(v) for v in obj), key=str)
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, bytes):
        return f"<{len(obj)} bytes>"
    return str(obj)


# ----------------------------------------------------------------------------- client

#: errors of the manager's answers that the console raises as themselves
_BUILTIN_ERRORS: dict[str, type[Exception]] = {
    e.__name__: e for e in (ValueError, RuntimeError, KeyError, TypeError, LookupError)
}


def _as_itself(exc: RemoteError, what: str) -> Exception:
    """The manager's error ``exc`` (a :class:`RemoteError`: the console unpickles
    nothing) as its own type where the console knows it: a refusal of this connection's
    role (``what``: the message refused) as ``PermissionDenied``, the refusal of
    another protocol version as a ``ProtocolError`` (its text says what to upgrade),
    ``ValueError`` and the like as themselves."""
    kind, text = getattr(exc, "kind", ""), getattr(exc, "text", str(exc))
    if kind == "PermissionDenied":  # the gateway's text: which role may, whom to ask
        return PermissionDenied(what, text)
    if kind == "ProtocolMismatch":
        return ProtocolError(text)
    if kind in _BUILTIN_ERRORS:
        return _BUILTIN_ERRORS[kind](text)
    return exc


def cancel_text(what: str, data: dict[str, Any]) -> str:
    """The console's line for a cancel's answer ``data`` (of ``what``: "run run-1",
    "key x"): how many of the keys named were still to do and so were cancelled
    (finished ones are not affected). A manager older than ``to_do`` says only how
    many keys it named."""
    count = data["count"]
    if "to_do" not in data:
        return f"cancel requested for {what}: {count} key(s)"
    to_do = data["to_do"]
    done = "nothing cancelled" if not to_do else f"cancelled {to_do} (and what depends on them)"
    return f"{what}: {to_do} of {count} key(s) still to do; {done}"


class ConsoleClient:
    """A console's connection to the manager at ``address``.

    Use as ``async with ConsoleClient(address) as console:``. The token is ``token``,
    or the one in ``token_file`` (not both: :class:`~runtime.errors.TokenFileError`; a
    manager's own token file gives its admin entry, its read entry with
    ``read_only=True``), else ``CORRAL_TOKEN``, else the manager's token file on this
    machine (its read-only token with ``read_only=True``). Every command is an async
    method returning data; errors raise (:class:`runtime.node.PermissionDenied` when a
    command needs the admin token and this connection has the read-only one).

    ``name`` names the operator (default: this process's user name, as a client's):
    the console's id is ``console:NAME`` and a random tail
    (:func:`runtime.client_ids.console_id`), and a policy it sets is recorded ``by
    console:NAME`` (``story -``, the manager's ``policy changed`` line). A name a client
    could not have is a ``ValueError``.
    """

    def __init__(
        self,
        address: str,
        *,
        token: str | None = None,
        read_only: bool = False,
        timeout: float = 30.0,
        token_file: str | os.PathLike[str] | None = None,
        connect_timeout: float | None = None,  #: None: transport.connect's default
        name: str | None = None,
    ) -> None:
        self.name = console_id(name)  #: first: a bad name fails before anything is kept
        self.address = address
        self.token = token
        self.token_file = token_file
        self.read_only = read_only
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._peer: Any = None
        self._ended: anyio.Event | None = None  #: set once the connection has ended
        self._stack: contextlib.AsyncExitStack | None = None
        #: where a command that reports as it goes (``alert watch``) prints each line
        self.emit: Callable[[str], None] | None = None

    @property
    def closed(self) -> bool:
        """The connection to the manager has ended."""
        return self._peer is None or bool(self._peer.closed)

    @property
    def closed_reason(self) -> str:
        """Why the connection to the manager ended, when that is known: the manager's
        refusal (``PermissionDenied: closed after 11 refused messages ...``) or its
        silence (``no message for 10.5 s (dead peer)``); empty otherwise, and while it
        is open."""
        peer = self._peer
        if peer is None or not peer.closed:
            return ""
        if peer.refusal is not None:
            kind = getattr(peer.refusal, "kind", type(peer.refusal).__name__)
            return f"{kind}: {getattr(peer.refusal, 'text', peer.refusal)}"
        return str(peer.closed_reason)

    async def wait_closed(self) -> None:
        """Return once the connection to the manager has ended (at once if it never
        opened)."""
        if self._ended is not None:
            await self._ended.wait()

    async def __aenter__(self) -> ConsoleClient:
        from runtime.node import DEAD_AFTER, HEARTBEAT, Hello, find_token_there, say_hello
        from runtime.remote import Peer
        from transport import connect

        options: dict[str, Any] = {}
        role = "read" if self.read_only else "admin"
        token = await find_token_there(
            self.address, self.token, role, self.token_file, self.connect_timeout
        )
        if token and self.address.startswith(("ws://", "wss://")):
            options["token"] = token
        stack = contextlib.AsyncExitStack()
        await stack.__aenter__()
        try:
            try:
                conn = await connect(self.address, timeout=self.connect_timeout, **options)
            except AuthenticationFailed as exc:
                exc.add_note(self._token_source())
                raise
            stack.push_async_callback(conn.aclose)
            # Nothing else is sent before the manager's answer: a manager that refuses
            # the Hello (another Corral version) is heard saying why.
            hello = Hello("console", self.name)
            try:
                await say_hello(conn, hello, self.address, self.timeout, allow_pickle=False)
            except RemoteError as exc:
                raise _as_itself(exc, "Hello as a console") from None
            peer = Peer(
                conn, None, name="manager", allow_pickle=False, heartbeat=HEARTBEAT,
                timeout=DEAD_AFTER,
            )  # fmt: skip
            tg = await stack.enter_async_context(anyio.create_task_group())
            ended = anyio.Event()

            async def serve(*, task_status: anyio.abc.TaskStatus[None]) -> None:
                try:
                    await peer.run(task_status=task_status)
                finally:
                    ended.set()

            await tg.start(serve)
            stack.push_async_callback(peer.aclose)  # runs first: ends peer.run, then tg
        except BaseException:
            await stack.aclose()
            raise
        self._peer = peer
        self._ended = ended
        self._stack = stack
        return self

    def _token_source(self) -> str:
        """Which token this console presented, and what to do about a refused one."""
        from runtime.node import token_path

        if self.token:
            return (
                "This console presented the token it was given (--token): pass the "
                "manager's current admin token (or its read token, to look only)."
            )
        if self.token_file is not None:
            return (
                f"This console presented the token of --token-file {self.token_file} (its "
                f"{'read' if self.read_only else 'admin'} entry, if it is a manager's token "
                "file): write the manager's current admin token (or its read token, to "
                "look only) in it; a manager makes new tokens each time it starts (unless "
                "started with --keep-tokens)."
            )
        if os.environ.get("CORRAL_TOKEN"):
            return (
                "This console presented CORRAL_TOKEN from the environment (it wins over the "
                "token file and --read-only): set it to the manager's current token, unset "
                "it to use the token file, or pass --token."
            )
        role = "read" if self.read_only else "admin"
        return (
            f"This console presented the {role} token of {token_path(self.address)}: "
            "stale if the manager was restarted since, or another manager's if it runs on "
            "another machine; pass --token TOKEN (or set CORRAL_TOKEN) with a token from "
            "the manager's current token file."
        )

    async def __aexit__(self, *exc_info: Any) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        if isinstance(exc_info[1], Exception):
            # The body's own error (a RemoteError, a ValueError of the user's) propagates
            # as itself: handed to the stack, the task group that serves the connection
            # would wrap it in an ExceptionGroup, and `except RemoteError` around the
            # block would catch nothing. Closing the peer ends that task group cleanly.
            await stack.aclose()
            return
        await stack.__aexit__(*exc_info)

    async def ask(self, msg: Message) -> Any:
        """Ask the manager; map a refusal of the read-only role to ``PermissionDenied``
        and the manager's ``ValueError``s and the like (they come as
        :class:`RemoteError`: the console unpickles nothing) to their built-in type."""
        if self._peer is None:
            raise CorralError("the console is not connected; use `async with ConsoleClient(...)`")
        try:
            return await self._peer.ref.ask(msg, timeout=self.timeout)
        except RemoteError as exc:
            raise _as_itself(exc, type(msg).__name__) from None
        except ActorStopped:
            why = self.closed_reason
            raise CorralError(
                f"the connection to the manager at {self.address} closed"
                + (f": {why}" if why else "")
            ) from None

    # -- commands as data ----------------------------------------------------------------

    async def status(self, categories: int = 0) -> dict[str, Any]:
        """The manager's status: scheduler, file registry and (if any) autoscaler, as the
        dict ``status --json`` shows (``StatusReply.to_dict()``). ``categories``: 0
        every category's statistics, ``n`` those of the ``n`` with the most task time
        (``categories_known`` counts them all)."""
        reply: StatusReply = await self.ask(StatusRequest(top_categories=categories))
        return reply.to_dict()

    async def tasks(
        self,
        state: str | None = None,
        category: str | None = None,
        limit: int = 100,
        offset: int = 0,
        client: str | None = None,
        pool: str | None = None,
    ) -> list[TaskRecord]:
        """Up to ``limit`` tasks (0: a page of ``MAX_LISTING``) in ``state`` and
        ``category``, submitted by the client named ``client`` and to ``pool`` (None:
        any), after the first ``offset`` that match. A ``pool`` that is no pool's
        name, or that the manager does not know, is a ``ValueError`` saying why."""
        return list(await self.ask(TasksQuery(state, category, limit, offset, client, pool)))

    async def story(self, *keys: str) -> list[list[str]]:
        """Transitions of the keys (as text, as :meth:`tasks` shows them):
        ``[key, start, finish, stimulus id, time]``."""
        return [list(entry) for entry in await self.ask(StoryQuery(tuple(keys)))]

    async def policies(self) -> list[PolicyInfo]:
        """Per kind: the policy in use and the available ones."""
        return list(await self.ask(PolicyQuery()))

    async def set_policy(
        self, kind: str, name: str, params: Mapping[str, Any] | None = None
    ) -> PolicyInfo:
        """Swap the ``kind`` policy for ``name`` (admin)."""
        info: PolicyInfo = await self.ask(
            SetPolicyRequest(kind, name, dict(params or {}), by=self.name)
        )
        return info

    async def drain(self, worker: str) -> dict[str, Any]:
        """Give ``worker`` no new tasks; it is stopped once its tasks finish (admin)."""
        return dict(await self.ask(DrainRequest(worker)))

    async def undrain(self, worker: str) -> dict[str, Any]:
        """Take draining ``worker`` back: it takes new tasks again and is not stopped
        (admin). Answer: ``{"worker", "undrained": True, "why": ""}``. A worker that
        cannot be taken back (not draining, told to stop already, leaving on its own,
        draining for its walltime or its pool's ``tasks_per_worker``) is a
        :class:`ConsoleError` saying why; an unknown worker a ValueError."""
        data = dict(await self.ask(UndrainRequest(worker)))
        if not data.get("undrained"):
            raise ConsoleError(
                f"undrain: worker {worker} cannot be taken back: {data.get('why') or 'refused'}. "
                "Only a draining worker that was not told to stop yet, does not leave on its "
                "own and drains neither for its walltime nor for its pool's tasks_per_worker "
                "can; see `story WORKER`"
            )
        return data

    async def forget_category(self, category: str) -> dict[str, Any]:
        """Start ``category``'s statistics afresh (admin): its tasks are placed as a new
        category's until its tries teach them again. Answer: ``{"category", "count",
        "rss_rise", "max_rss_growth"}``, what was forgotten. A category the scheduler
        keeps no statistics of: :class:`ConsoleError` (``UnknownCategory: ...``)."""
        try:
            return dict(await self.ask(ForgetCategoryRequest(category)))
        except RemoteError as exc:
            if getattr(exc, "kind", "") == "UnknownCategory":
                raise ConsoleError(f"UnknownCategory: {getattr(exc, 'text', exc)}") from None
            raise

    async def scale(self, pool: str, n: int) -> dict[str, int]:
        """Keep ``n`` blocks of workers in ``pool`` (admin; needs an autoscaler; a block
        is ``nodes_per_block`` x ``workers_per_node`` workers, one without pools). Answer,
        per pool: its blocks started or asked for and not being scaled in."""
        return dict(await self.ask(ScaleRequest(n, pool)))

    async def resume(self, pool: str) -> dict[str, Any]:
        """Resume ``pool`` (admin; needs an autoscaler): its provider submits again and
        the autoscaler asks for its blocks now. Answer: whether it was paused, backing
        off or given up, and its blocks now."""
        return dict(await self.ask(ResumeRequest(pool)))

    async def cancel(
        self, keys: Sequence[str] = (), run: str = "", key_or_run: str = ""
    ) -> dict[str, Any]:
        """Cancel keys (as text) and/or every key of ``run`` (admin); or what
        ``key_or_run`` names, a run or a key: the manager refuses it (``ValueError``,
        nothing cancelled) when it is both a run id and a key's text."""
        return dict(await self.ask(CancelKeysRequest(tuple(keys), run, key_or_run)))

    async def move(
        self, keys: Sequence[str], pool: str | None = None, priority: int | None = None
    ) -> dict[str, Any]:
        """Move the tasks of ``keys`` (as text) still waiting or queued to ``pool`` and/or
        ``priority`` (admin). Answer: ``{"moved": [key, ...], "left": {key: why}}``; a
        pool the scheduler does not know: ``ValueError`` naming the pools it knows."""
        return dict(await self.ask(MoveRequest((), tuple(keys), pool, priority)))

    async def alerts(self) -> AlertsReply:
        """The alerts (pending, firing, lately resolved), the rules as data and the
        latest remediation audit lines."""
        reply: AlertsReply = await self.ask(AlertsRequest())
        return reply

    async def watch_alerts(
        self, seconds: float, interval: float = 1.0
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Each change of an alert's state seen within ``seconds`` (asking every
        ``interval`` seconds), as it is seen; first the states at the start. The
        alerts of one look come in the order of their states' times."""
        async for _, change in self._alert_changes(seconds, interval):
            yield change

    async def _alert_changes(
        self, seconds: float, interval: float
    ) -> AsyncGenerator[tuple[bool, dict[str, Any]], None]:
        """:meth:`watch_alerts`, each with whether it is a state at the start."""
        changes = AlertChanges()
        deadline = time.monotonic() + seconds
        start = True
        while True:
            seen = [jsonable(a) for a in changes.changed((await self.alerts()).alerts)]
            for a in sorted(seen, key=lambda a: _state_since(a) or 0.0):
                yield start, a
            start = False
            if time.monotonic() + interval > deadline:
                return
            await anyio.sleep(interval)

    async def add_alert_rule(self, rule: Mapping[str, Any]) -> dict[str, Any]:
        """Add ``rule`` (its data; one of the same name is replaced, and nothing of it
        is kept) (admin). Answer: the rule as the monitor holds it, with ``warnings``
        (texts) when a ``pool="X"`` of it names no pool of the cluster's, and
        ``replaced`` when it replaced a rule: ``{"rule": NAME, "dropped_labels": {name:
        value}, "dropped_annotations": [names]}``, the replaced rule's labels and
        annotations the new one does not give (:func:`replaced_text` says it). A bad
        rule: :class:`ConsoleError` with the monitor's ``AlertConfigError`` text."""
        return dict(await self._alert_ask(AlertRuleAdd(dict(rule))))

    async def remove_alert_rule(self, name: str) -> list[str]:
        """Remove rule ``name`` (admin). Answer: the names of the rules left."""
        return list(await self._alert_ask(AlertRuleRemove(name)))

    async def _alert_ask(self, msg: Message) -> Any:
        try:
            return await self.ask(msg)
        except RemoteError as exc:
            if getattr(exc, "kind", "") == "AlertConfigError":
                raise ConsoleError(f"AlertConfigError: {getattr(exc, 'text', exc)}") from None
            raise

    # -- command lines -------------------------------------------------------------------

    async def run_command(self, line: str) -> str:
        """Run one command line; return what it prints (tables, or JSON with --json)."""
        return (await self.execute(line)).text()

    async def execute(self, line: str) -> Result:
        """Run one command line (``--json`` anywhere asks for JSON); return its result."""
        line, as_json = _split_json(line)
        match = re.match(r"(\S+)\s*(.*)$", line, re.S)
        if match is None:
            raise ConsoleError("no command; type `help` for the list")
        word, rest = match.group(1), match.group(2).strip()
        name = _ALIASES.get(word, word)
        handler = getattr(self, f"_cmd_{name}", None)
        if name not in COMMANDS or handler is None:
            close = [c for c in COMMANDS if c.startswith(word[:2])] if len(word) >= 2 else []
            hint = f" (did you mean {' or '.join(close)}?)" if close else ""
            raise ConsoleError(f"unknown command {word!r}{hint}; type `help` for the list")
        if _asks_help(name, rest):  # `tasks --help`: that command's usage, as `help tasks`
            handler, rest = self._cmd_help, name
        result: Result = await handler(rest)
        result.as_json = as_json
        return result

    async def _cmd_status(self, rest: str) -> Result:
        parser = _Parser("status")
        parser.add_argument("--categories", default=str(STATUS_CATEGORIES))
        args = parser.parse_args(_words(rest))
        top = 0 if args.categories == "all" else _count(args.categories)
        if top is None:
            _usage("status")
        data = jsonable(await self.status(top))
        return Result("status", data, render_status(data))

    async def _cmd_config(self, rest: str) -> Result:
        words = _words(rest)
        if len(words) > 1:
            _usage("config")
        data = dict((await self.status(categories=1)).get("config") or {})
        if not data:
            raise ConsoleError(
                "this cluster says no configuration: an embedded cluster (Cluster() in a "
                "program) has none to show, only a manager process does"
            )
        if words:
            every = data
            data = {s: keys for s, keys in every.items() if s == words[0] or
                    s.startswith(words[0] + ".")}  # fmt: skip
            if not data:
                raise ConsoleError(
                    f"config: no section {words[0]!r}; the sections: {', '.join(every)}"
                )
        return Result("config", data, render_config(data))

    async def _cmd_tasks(self, rest: str) -> Result:
        parser = _Parser("tasks")
        parser.add_argument("--state", choices=STATES)
        parser.add_argument("--category")
        parser.add_argument("--client")
        parser.add_argument("--pool")
        parser.add_argument("--limit", type=int, default=100)
        parser.add_argument("--offset", type=int, default=0)
        args = parser.parse_args(_words(rest))
        if not 0 <= args.limit <= MAX_LISTING:
            raise ConsoleError(f"--limit must be 0 to {MAX_LISTING} (0: {MAX_LISTING})")
        if args.offset < 0:
            raise ConsoleError("--offset must be >= 0")
        if args.pool is not None and (problem := pool_name_problem(args.pool)):
            raise ConsoleError(
                f"tasks: --pool {args.pool!r}: {problem}; name one pool (--pool gpu), or "
                "leave --pool out for the tasks of every pool"
            )
        records = await self.tasks(
            args.state, args.category, args.limit, args.offset, args.client, args.pool
        )
        data = [jsonable(r) for r in records]
        return Result("tasks", data, render_tasks(data, args.limit, args.offset))

    async def _cmd_story(self, rest: str) -> Result:
        key = _key_text(rest)
        if not key:
            _usage("story")
        entries = await self.story(key)
        if not entries:
            raise ConsoleError(
                f"no transitions recorded for {key!r}: give a key as `tasks` shows it, or a "
                "worker id"
            )
        data: dict[str, Any] = {"key": key, "transitions": entries}
        shown = render_story(key, entries)
        if _latest_state(entries) == "queued":
            data["waits"] = why = await self._why_waiting(key)
            shown = Group(shown, Text("why it waits now: " + " ".join(why)))
        return Result("story", data, shown)

    async def _why_waiting(self, key: str) -> list[str]:
        """Why the ready task ``key`` is sent to no worker yet, as sentences, from the
        status (its pool's workers and their cores busy, a placement stall, its blocks
        against ``max_blocks``) and the task's pool (looked up among the ready tasks of
        its category: unknown when the page does not hold it)."""
        st = jsonable(await self.status(categories=1))
        try:
            rows = await self.tasks("queued", category_of(key), 0)
        except (ValueError, CorralError):
            rows = []
        found = [r for r in rows if r.key == key]
        return why_waiting(st, pool_key(found[0].pool) if found else None)

    async def _cmd_policy(self, rest: str) -> Result:
        words = _words(rest)
        if not words or words == ["list"]:
            infos = [jsonable(i) for i in await self.policies()]
            return Result("policy", infos, render_policies(infos))
        if words[0] != "set" or len(words) < 3:
            _usage("policy")
        kind, name = words[1], words[2]
        params = _params(words[3:])
        before = (await self.status()).get("autoscaler") if kind == "scaling" else None
        info = jsonable(await self.set_policy(kind, name, params))
        # the parameters in force, as the policy has them (a default retry policy keeps
        # the pools' fallback: configuration.md)
        given = values_text(info.get("params"))
        text = f"{kind} policy is now {name}" + (f" ({given})" if given else "")
        if before:  # what the new scaling policy does to each pool's blocks, at once
            after = (await self.status()).get("autoscaler") or {}
            text = "\n".join([text, *scaling_swap_lines(before, after)])
        return Result("policy", info, Text(text))

    async def _cmd_drain(self, rest: str) -> Result:
        words = _words(rest)
        if len(words) != 1:
            _usage("drain")
        data = jsonable(await self.drain(words[0]))
        if data.get("retired"):
            text = f"worker {words[0]} runs nothing: told to stop"
        elif data.get("keeping") and not data.get("running"):
            text = (
                f"draining worker {words[0]}: no new tasks; it alone holds {data['keeping']} "
                "output(s) still needed: it is stopped once they are copied to another "
                "worker or released"
            )
        else:
            text = (
                f"draining worker {words[0]}: no new tasks; it is stopped once its "
                f"{data.get('running', 0)} running task(s) finish"
            )
        return Result("drain", data, Text(text))

    async def _cmd_undrain(self, rest: str) -> Result:
        words = _words(rest)
        if len(words) != 1:
            _usage("undrain")
        data = jsonable(await self.undrain(words[0]))
        text = f"worker {words[0]} taken back: it takes new tasks again"
        return Result("undrain", data, Text(text))

    async def _cmd_forget(self, rest: str) -> Result:
        words = _words(rest)
        if len(words) != 1:
            _usage("forget")
        data = jsonable(await self.forget_category(words[0]))
        text = (
            f"category {words[0]}: statistics of {data.get('count', 0)} ok tries forgotten "
            f"(memory admission's rise was {size_text(data.get('rss_rise') or 0)}, the "
            f"largest ever {size_text(data.get('max_rss_growth') or 0)}); its tasks are "
            "placed as a new category's until its tries teach them again"
        )
        return Result("forget", data, Text(text))

    async def _cmd_scale(self, rest: str) -> Result:
        words = _words(rest)
        if len(words) == 1:
            words = ["default", *words]
        if len(words) != 2:
            _usage("scale")
        pool, n_text = words
        try:
            n = int(n_text)
        except ValueError:
            raise ConsoleError(f"scale: N must be a whole number, not {n_text!r}") from None
        try:
            check_blocks(pool, n)  # as Cluster.scale: a message cannot carry a larger N
        except ValueError as exc:
            raise ConsoleError(f"scale: {exc}") from None
        live = jsonable(await self.scale(pool, n))
        # the target the autoscaler keeps: a configured pool's stays within its
        # min_blocks and max_blocks
        targets = ((await self.status()).get("autoscaler") or {}).get("targets") or {}
        target = targets.get(pool, n)
        data = {"pool": pool, "target": target, "asked": n, "live": live}
        # The autoscaler answers in blocks (a pool is sized in blocks), started or
        # asked for and not being scaled in: not workers (a block may hold several, and
        # a retiring block's workers stay in the status until they leave).
        shown = ", ".join(f"{p}: {c}" for p, c in live.items()) or "none"
        kept = "" if target == n else f" (asked {n}: kept within its min_blocks and max_blocks)"
        text = (
            f"pool {pool}: target {target} block(s){kept}; blocks now (started or asked "
            f"for, not being scaled in): {shown}"
        )
        return Result("scale", data, Text(text))

    async def _cmd_resume(self, rest: str) -> Result:
        words = _words(rest)
        if len(words) != 1:
            _usage("resume")
        data = jsonable(await self.resume(words[0]))
        return Result("resume", data, Text(resumed_text(words[0], data)))

    async def _cmd_cancel(self, rest: str) -> Result:
        run = key = either = ""
        if rest.startswith("--run"):
            run = _key_text(rest[len("--run") :])
        elif rest.startswith("--key"):
            key = _key_text(rest[len("--key") :])
        else:
            text = _key_text(rest)
            if _RUN.fullmatch(text):
                # A run id, or a task's key of that text: the manager knows which, and
                # refuses it when it is both (decided where the cancel is made: no race).
                either = text
            else:
                key = text
        if not (run or key or either):
            _usage("cancel")
        data = jsonable(await self.cancel((key,) if key else (), run, either))
        what = f"run {data['run']}" if data.get("run") else f"key {key or either}"
        return Result("cancel", data, Text(cancel_text(what, data)))

    async def _cmd_move(self, rest: str) -> Result:
        parser = _Parser("move")
        parser.add_argument("keys", nargs="+")
        parser.add_argument("--pool")
        parser.add_argument("--priority", type=int)
        args = parser.parse_args(_words(rest))
        if args.pool is None and args.priority is None:
            raise ConsoleError("move: give --pool POOL, --priority N or both")
        if args.pool is not None and (problem := pool_name_problem(args.pool)):
            raise ConsoleError(f"move: pool {args.pool!r}: {problem}; name one pool")
        data = jsonable(await self.move(args.keys, args.pool, args.priority))
        to = " and ".join(
            ([f"pool {args.pool}"] if args.pool is not None else [])
            + ([f"priority {args.priority}"] if args.priority is not None else [])
        )
        lines = [f"moved {len(data['moved'])} task(s) to {to}"]
        lines += [f"  {key}: not moved: {why}" for key, why in data["left"].items()]
        return Result("move", data, Text("\n".join(lines)))

    async def _cmd_alert(self, rest: str) -> Result:
        word, _, args = rest.strip().partition(" ")
        if word in ("", "list"):
            if args.strip():
                _usage("alert")
            reply = await self.alerts()
            data = jsonable(reply)
            return Result("alert", data, render_alerts(data))
        if word == "watch":
            return await self._watch(args)
        if word == "remove":
            names = _words(args)
            if len(names) != 1:
                _usage("alert")
            left = await self.remove_alert_rule(names[0])
            text = f"alert rule {names[0]} removed; rules: {', '.join(left)}"
            return Result("alert", {"removed": names[0], "rules": left}, Text(text))
        if word == "add":
            held = jsonable(await self.add_alert_rule(_alert_rule(args)))
            text = f"alert rule {held.get('name')} added: {held.get('expr')}"
            if held.get("replaced"):
                text += f"\n{replaced_text(held['replaced'])}"
            text += "".join(f"\nwarning: {w}" for w in held.get("warnings") or ())
            return Result("alert", held, Text(text))
        _usage("alert")

    async def _watch(self, args: str) -> Result:
        words = _words(args)
        if len(words) > 1:
            _usage("alert")
        try:
            seconds = float(words[0]) if words else 60.0
        except ValueError:
            raise ConsoleError(f"alert watch: SECONDS is a number, not {words[0]!r}") from None
        if not 0 < seconds <= 86400:
            raise ConsoleError("alert watch: SECONDS must be more than 0 and at most 86400")
        at_start: list[dict[str, Any]] = []
        changes: list[dict[str, Any]] = []
        async for start, change in self._alert_changes(seconds, 1.0):
            (at_start if start else changes).append(change)
            if self.emit is not None:
                self.emit(alert_line(change))
        text = (
            f"watched alerts for {seconds:g} s: {len(changes)} change(s) "
            f"({len(at_start)} alert(s) at the start)"
        )
        return Result("alert", {"start": at_start, "changes": changes}, Text(text))

    async def _cmd_help(self, rest: str) -> Result:
        word = rest.strip()
        if word:
            name = _ALIASES.get(word, word)
            if name not in COMMANDS:
                raise ConsoleError(f"unknown command {word!r}; type `help` for the list")
            usage, what, admin = COMMANDS[name]
            data = {name: {"usage": usage, "help": what, "admin": admin}}
            view = Group(Text(usage, style="bold"), Padding(Text(what), (0, 0, 0, 4), expand=False))
            return Result("help", data, view)
        data = {n: {"usage": u, "help": w, "admin": a} for n, (u, w, a) in COMMANDS.items()}
        return Result("help", data, render_help())

    async def _cmd_quit(self, rest: str) -> Result:
        return Result("quit", None, Text(""), quit=True)


# ----------------------------------------------------------------------------- parsing


class _Parser(argparse.ArgumentParser):
    """argparse for a console command: errors raise instead of exiting."""

    def __init__(self, name: str) -> None:
        super().__init__(prog=name, add_help=False, usage=COMMANDS[name][0])

    def error(self, message: str) -> NoReturn:
        raise ConsoleError(f"{self.prog}: {message}; usage: {self.usage}")


#: words that ask for a command's usage in place of running it
_HELP_FLAGS = ("-h", "--help")


def _asks_help(name: str, rest: str) -> bool:
    """Whether ``rest`` asks for ``name``'s usage: ``-h`` or ``--help`` among its words;
    for ``story`` and ``cancel``, whose rest is a key's text, only as the whole of it."""
    if name == "help":
        return False
    try:
        words = shlex.split(rest)
    except ValueError:
        return False
    if name in ("story", "cancel"):
        return len(words) == 1 and words[0] in _HELP_FLAGS
    return any(w in _HELP_FLAGS for w in words)


def _split_json(line: str) -> tuple[str, bool]:
    stripped, n = _JSON_FLAG.subn("", line)
    return stripped.strip(), n > 0


def resumed_text(pool: str, data: Mapping[str, Any]) -> str:
    """What ``resume POOL`` prints of the autoscaler's answer ``data``: how the pool was
    held back (paused, backing off, given up), and its blocks now."""
    was = [w.replace("_", " ") for w in ("paused", "backing_off") if data.get(w)]
    held = [f"was {' and '.join(was)}"] if was else []
    if data.get("gave_up"):
        held.append("had given up")
    how = f" (it {' and '.join(held)})" if held else " (it was not held back)"
    return f"pool {pool} resumed{how}; blocks now: {data.get('blocks', 0)}"


def _words(rest: str) -> list[str]:
    try:
        return shlex.split(rest)
    except ValueError as exc:
        raise ConsoleError(f"cannot read the arguments: {exc}") from None


def _key_text(rest: str) -> str:
    """A key as text: the rest of the line as typed (keys such as ``('x', 0)`` hold
    spaces and quotes), or its unquoted form when the whole of it is one quoted word."""
    rest = rest.strip()
    if rest[:1] in ("'", '"'):
        with contextlib.suppress(ValueError):
            words = shlex.split(rest)
            if len(words) == 1:
                return words[0]
    return rest


def _params(items: Iterable[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConsoleError(f"policy parameters are key=value, not {item!r}")
        try:
            params[key] = json.loads(value)
        except ValueError:
            params[key] = value
    return params


def _pairs(items: Iterable[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConsoleError(f"alert add: {what} are K=V, not {item!r}")
        out[key] = value
    return out


_ALERT_OPTIONS = ("--for", "--keep-firing-for", "--label", "--annotation", "--scale-out",
                  "--pool", "--max-blocks", "--max-cost", "--cooldown")  # fmt: skip


def _option_values(words: list[str]) -> list[str]:
    """``--for -5s`` as ``--for=-5s``: argparse takes a value that starts with '-' for
    an option, so a negative duration would fail as "expected one argument" instead of
    reaching the rule's own check (which says what a duration is)."""
    out: list[str] = []
    i = 0
    while i < len(words):
        w = words[i]
        nxt = words[i + 1] if i + 1 < len(words) else ""
        if w in _ALERT_OPTIONS and nxt.startswith("-") and not nxt.startswith("--"):
            out.append(f"{w}={nxt}")
            i += 2
        else:
            out.append(w)
            i += 1
    return out


def replaced_text(replaced: Mapping[str, Any]) -> str:
    """What ``alert add`` says of the rule it replaced (``replaced`` of its answer):
    ``replaces rule CorralQueueTime; dropped labels team=corral; dropped annotations
    summary, description: give them again with --label/--annotation to keep them``, or
    ``...; it drops none of its labels and annotations``."""
    labels = dict(replaced.get("dropped_labels") or {})
    notes = list(replaced.get("dropped_annotations") or ())
    text = f"replaces rule {replaced.get('rule')}"
    if not (labels or notes):
        return f"{text}; it drops none of its labels and annotations"
    if labels:
        text += "; dropped labels " + ", ".join(f"{k}={v}" for k, v in labels.items())
    if notes:
        text += "; dropped annotations " + ", ".join(notes)
    flags = "/".join(f for f, given in (("--label", labels), ("--annotation", notes)) if given)
    return f"{text}: give them again with {flags} to keep them"


def _alert_rule(args: str) -> dict[str, Any]:
    """The rule of ``alert add ...``: a JSON object as typed (or quoted as one word, as
    the one-shot command line passes it on), or NAME EXPR and options."""
    text = args.strip()
    if text[:1] in ("'", '"'):
        with contextlib.suppress(ValueError):  # not one quoted word: parsed below
            words = shlex.split(text)
            if len(words) == 1 and words[0].lstrip().startswith("{"):
                text = words[0].strip()
    if text.startswith("{"):
        try:
            given = json.loads(text)
        except ValueError as exc:
            raise ConsoleError(f"alert add: the rule is not valid JSON: {exc}") from None
        if not isinstance(given, dict):
            raise ConsoleError("alert add: the rule must be a JSON object")
        return given
    parser = _Parser("alert")
    parser.add_argument("name")
    parser.add_argument("expr")
    parser.add_argument("--for", dest="for_")
    parser.add_argument("--keep-firing-for")
    parser.add_argument("--label", action="append", default=[])
    parser.add_argument("--annotation", action="append", default=[])
    parser.add_argument("--scale-out")
    parser.add_argument("--pool")
    parser.add_argument("--max-blocks", type=int)
    parser.add_argument("--max-cost", type=float)
    parser.add_argument("--cooldown")
    a = parser.parse_args(_option_values(_words(text)))
    rule: dict[str, Any] = {"name": a.name, "expr": a.expr}
    if a.for_ is not None:
        rule["for"] = typed_duration(a.for_)
    if a.keep_firing_for is not None:
        rule["keep_firing_for"] = typed_duration(a.keep_firing_for)
    if a.label:
        rule["labels"] = _pairs(a.label, "labels")
    if a.annotation:
        rule["annotations"] = _pairs(a.annotation, "annotations")
    scale: dict[str, Any] = {}
    if a.scale_out is not None:
        if a.scale_out == "fit":
            scale["fit"] = True
        else:
            try:
                scale["by"] = int(a.scale_out)
            except ValueError:
                raise ConsoleError(
                    f"alert add: --scale-out takes a number of blocks or 'fit', not {a.scale_out!r}"
                ) from None
    extra = {"pool": a.pool, "max_blocks": a.max_blocks, "max_cost": a.max_cost,
             "cooldown": None if a.cooldown is None else typed_duration(a.cooldown)}  # fmt: skip
    given = {k: v for k, v in extra.items() if v is not None}
    if given and not scale:
        raise ConsoleError(
            f"alert add: {', '.join('--' + k.replace('_', '-') for k in given)} "
            "belong to --scale-out N|fit"
        )
    if scale:
        rule["action"] = {"scale_out": {**scale, **given}}
    return rule


def _count(word: str) -> int | None:
    """``word`` as a count of at least 1, else None."""
    return int(word) if word.isdigit() and int(word) > 0 else None


def _no_args(name: str, rest: str) -> None:
    if rest.strip():
        raise ConsoleError(f"{name} takes no arguments; usage: {COMMANDS[name][0]}")


def _usage(name: str) -> NoReturn:
    raise ConsoleError(f"usage: {COMMANDS[name][0]}")


# ----------------------------------------------------------------------------- rendering


def _policy_errors(st: Mapping[str, Any], head: str, label: str) -> Text:
    """The policy errors of a status (the scheduler's, per kind; the autoscaler's, per
    ``label`` pool), each with its count and latest problem."""
    problems = dict(st.get("policy_problems") or {})
    by = dict(st.get("policy_errors_by") or {})
    return Text(
        head.format(st["policy_errors"])
        + "".join(
            f"\n  {label}{key}: {by.get(key, 0)}, latest: {problem}"
            for key, problem in sorted(problems.items())
        )
    )


def _row(table: Table, *cells: str) -> None:
    """Add a row of plain text (never rich markup: keys may hold brackets)."""
    table.add_row(*(Text(c) for c in cells))


def _held_back(st: Mapping[str, Any]) -> str:
    """`` (N held back)`` when ready tasks are held back after failed fetches, and
    ``, N held for retry`` when retries wait for their backoff (not ready)."""
    n = int(st.get("held_back") or 0)
    text = f" ({n} held back: inputs unreachable)" if n else ""
    r = int(st.get("retry_held") or 0)
    return text + (f", {r} held for retry (backoff)" if r else "")


def _bytes(n: Any, zero: str = "-") -> str:
    if not isinstance(n, int | float) or n <= 0:
        return zero
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"  # pragma: no cover - the loop returns


def _seconds(s: Any) -> str:
    if not isinstance(s, int | float) or s <= 0:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1000:.1f} ms"
    return f"{s:.2f} s"


def _on_worker(sent: int, cores: int) -> tuple[int, int]:
    """A worker's tasks (sent to it, not finished) as (running, queued there): it runs
    at most one per core (running includes fetching its inputs)."""
    running = min(sent, cores)
    return running, sent - running


def _running_text(running: int, queued: int) -> str:
    return f"{running} (+{queued} queued)" if queued else str(running)


def _disk_stall_lines(st: Mapping[str, Any]) -> list[Text]:
    """A line per pool the disk watchdog finds stalled, and the tries that ended
    ``disk-full`` and the tasks that failed with ``DiskFull`` (none when there were
    none)."""
    lines = []
    for d in st.get("disk_stalls") or ():
        p = disk_stall_parts(stall := DiskStallInfo(**d))
        body = f"workers {p['workers']} ran nothing, {p['disk']}; {p['holding']}; {p['waiting']}"
        lines.append(_stall_line("disk", stall.pool, stall.stalled_for, body, p["advice"]))
    totals = dict(st.get("disk_stalls_total") or {})
    dropped = int(st.get("disk_dropped") or 0)
    if totals or dropped:
        lines.append(
            Text(
                f"disk stalls so far: {_per_pool(totals) or 'none'}; outputs dropped to make "
                f"room: {dropped} (made again when their readers run)"
            )
        )
    tries, failed = int(st.get("disk_full_tries") or 0), int(st.get("disk_full_failed") or 0)
    if tries or failed:
        lines.append(
            Text(
                f"disk full: {tries} tries ended disk-full (retried where they fit, up to the "
                f"retry policy's max_disk_full), "
                f"{failed} task(s) failed with DiskFull"
            )
        )
    return lines


def _blocks_text(seen: tuple[list[str], list[str], list[str], int] | None) -> str:
    """A pool's blocks for the status's pools table: running, those starting and those
    held, of its ``max_blocks`` (``3 of 3``, ``1 +2 starting of 3``, ``1 +1 held of 2``;
    ``-``: no autoscaler)."""
    if seen is None:
        return "-"
    running, pending, held, most = seen
    starting = f" +{len(pending)} starting" if pending else ""
    starting += f" +{len(held)} held" if held else ""
    return f"{len(running)}{starting} of {most}" if most else f"{len(running)}{starting}"


def _placement_stall_lines(st: Mapping[str, Any]) -> list[Text]:
    """A line per pool the placement watchdog finds stalled (ready tasks, an idle
    worker, nothing placed), and how many stalls each pool had (none: no line)."""
    lines = []
    for d in st.get("placement_stalls") or ():
        p = placement_stall_parts(stall := PlacementStallInfo(**d))
        body = f"{p['waiting']}; workers {p['workers']}; idle {p['idle']}"
        lines.append(_stall_line("placement", stall.pool, stall.stalled_for, body, p["advice"]))
    totals = dict(st.get("placement_stalls_total") or {})
    if totals:
        lines.append(Text(f"placement stalls so far: {_per_pool(totals)}"))
    return lines


def _stall_line(kind: str, pool: str, stalled_for: float, body: str, advice: str) -> Text:
    """A watchdog's stall in force, in red: what, for how long, and what to do."""
    return Text(
        f"{kind} stalled in pool {pool_name(pool)} for {stalled_for:.0f} s: {body}. {advice}.",
        style="red",
    )


def _per_pool(counts: Mapping[str, int]) -> str:
    """``{pool: n}`` for people, by pool (``"*"``: any)."""
    return ", ".join(f"pool {pool_name(p)} {n}" for p, n in sorted(counts.items()))


def _category_rank(name: str, c: Mapping[str, Any]) -> tuple[float, int, str]:
    """The categories' order in ``status``: most task time first (as the manager picks
    the top ones), then most tasks, then by name."""
    count = int(c.get("count", 0))
    return (-count * float(c.get("mean_duration") or 0.0), -count, name)


def render_status(st: Mapping[str, Any]) -> RenderableType:
    """Tables of a status dict (as ``jsonable`` made it)."""
    workers: list[dict[str, Any]] = list(st.get("workers") or [])
    processing: dict[str, int] = dict(st.get("processing") or {})
    draining = set(st.get("draining") or ())
    retired = set(st.get("retired") or ())
    away = set(st.get("away") or ())
    rss: dict[str, int] = dict(st.get("rss") or {})
    files: dict[str, Any] = dict(st.get("files") or {})
    stored: dict[str, int] = dict(files.get("stored_bytes") or {})
    queues: dict[str, int] = dict(st.get("queues") or {})
    oldest: dict[str, float] = dict(st.get("queue_oldest_wait") or {})
    autoscaler = st.get("autoscaler") or {}
    targets: dict[str, int] = dict(autoscaler.get("targets") or {})
    by_state: dict[str, int] = dict(st.get("tasks_by_state") or {})
    memory: dict[str, dict[str, Any]] = dict(st.get("memory") or {})
    throttled = set(st.get("throttled") or ())

    parts: list[RenderableType] = []
    # an away worker's cores are not counted (as in the metrics): it takes no task now
    cores = sum(int(w.get("cores", 0)) for w in workers if w.get("worker_id") not in away)
    # A worker is sent up to saturation x cores tasks: those past its cores wait there.
    cores_of = {str(w.get("worker_id")): int(w.get("cores", 0)) for w in workers}
    split = {wid: _on_worker(n, cores_of.get(wid, n)) for wid, n in processing.items()}
    running = sum(r for r, _ in split.values())
    waiting = sum(q for _, q in split.values())
    parts.append(
        Text(
            f"{len(workers)} worker(s), {cores} core(s)"
            + (f" ({len(away)} away: connection dropped, held for a rejoin)" if away else "")
            + f"; {running} task(s) running"
            + (f" and {waiting} queued on workers" if waiting else "")
            + f", {sum(queues.values())} ready{_held_back(st)}; {st.get('runs', 0)} run(s), "
            f"{st.get('wanted_keys', 0)} wanted key(s) ({st.get('wanted_pending', 0)} pending)"
        )
    )
    parts.extend(_disk_stall_lines(st))
    parts.extend(_placement_stall_lines(st))

    wt = Table(title="workers", title_justify="left")
    # the device each is pinned to: a column only when one is (a pool's accelerators)
    pinned = any(w.get("accelerator") for w in workers)
    cols = (
        "worker", "pool", *(("accelerator",) if pinned else ()), "cores", "memory",
        "running", "stored", "spilled", "files", "disk free", "RSS", "state",
    )  # fmt: skip
    for col in cols:
        wt.add_column(
            col, justify="right" if col in ("cores", "running") else "left", no_wrap=col == "worker"
        )
    for w in sorted(workers, key=lambda w: (str(w.get("pool")), str(w.get("worker_id")))):
        wid = str(w.get("worker_id"))
        state = "retired" if wid in retired else "draining" if wid in draining else "active"
        if wid in away:  # its connection dropped: no new task until it rejoins or is lost
            state = "away"
        if wid in throttled and state == "active":
            state = "throttled"
        # its bytes on disk are spill files (memory pressure) and file outputs (not)
        file_bytes = int(memory.get(wid, {}).get("file_bytes") or 0)
        spilled = int(memory.get(wid, {}).get("spilled_bytes") or 0) - file_bytes
        floor = memory.get(wid, {}).get("floor")  # its marks moved up over it
        disk, free = w.get("disk"), memory.get(wid, {}).get("disk_free")
        if free is None:  # no report yet: all of it
            free = disk
        disk_text = f"{_bytes(free, zero='0 B')} of {_bytes(disk)}" if disk else "-"
        if disk == 1:  # its file system had no room when it started (no --disk)
            disk_text = "0 B (none at start)"
        _row(
            wt,
            wid,
            str(w.get("pool", "")),
            *((str(w.get("accelerator") or "-"),) if pinned else ()),
            str(w.get("cores", "")),
            _bytes(w.get("memory"), zero="all"),
            _running_text(*split.get(wid, (0, 0))),
            _bytes(stored.get(wid)),
            _bytes(spilled) if spilled > 0 else "-",
            _bytes(file_bytes) if file_bytes else "-",
            disk_text,
            _bytes(rss.get(wid)) + (f" (floor {_bytes(floor)})" if floor else ""),
            state,
        )
    parts.append(wt)

    pools: dict[str, dict[str, int]] = {}
    for w in workers:
        p = pools.setdefault(str(w.get("pool")), {"workers": 0, "cores": 0, "running": 0})
        p["workers"] += 1
        p["cores"] += int(w.get("cores", 0))
        p["running"] += split.get(str(w.get("worker_id")), (0, 0))[0]
    lives: dict[str, dict[str, Any]] = dict(st.get("survival") or {})
    pt = Table(title="pools", title_justify="left")
    pcols = (
        "pool", "workers", "cores", "running", "ready", "oldest wait", "blocks", "target blocks",
        "lost/lives", "median life",
    )  # fmt: skip
    for col in pcols:
        pt.add_column(col, justify="left" if col == "pool" else "right")
    for pool in sorted(set(pools) | set(queues) | set(targets) | set(lives)):
        p = pools.get(pool, {"workers": 0, "cores": 0, "running": 0})
        target = targets.get(pool)
        life = lives.get(pool, {})
        _row(
            pt,
            "(any pool)" if pool == ANY_POOL else pool,
            str(p["workers"]),
            str(p["cores"]),
            str(p["running"]),
            str(queues.get(pool, 0)),
            _seconds(oldest.get(pool)),
            _blocks_text(_pool_blocks(st, pool)),
            "-" if target is None else str(target),
            f"{life.get('deaths', 0)}/{life.get('lives', 0)}" if life else "-",
            _seconds(life.get("median")) if life.get("median") is not None else "-",
        )
    parts.append(pt)
    desired: dict[str, int] = dict(autoscaler.get("desired") or {})
    for pool, problem in sorted(dict(autoscaler.get("policy_failing") or {}).items()):
        policy, kept = str(autoscaler.get("policy")), int(desired.get(pool, 0))
        parts.append(Text(policy_failing_text(policy, pool, problem, kept), style="bold yellow"))

    parts.extend(_render_blocks(autoscaler))

    order = [s for s in STATES if s in by_state] + sorted(set(by_state) - set(STATES))
    if order:
        tt = Table(title="tasks", title_justify="left")
        for s in order:
            tt.add_column(s, justify="right")
        _row(tt, *[str(by_state[s]) for s in order])
        parts.append(tt)
    else:
        parts.append(Text("tasks: none known to the scheduler"))

    cats: dict[str, dict[str, Any]] = dict(st.get("categories") or {})
    if cats:
        ct = Table(title="categories", title_justify="left")
        ccols = (
            "category", "done", "errors", "lost", "oom", "mean", "p90", "max", "output", "peak RSS"
        )  # fmt: skip
        for col in ccols:
            ct.add_column(col, justify="left" if col == "category" else "right")
        for name in sorted(cats, key=lambda n: _category_rank(n, cats[n])):
            c = cats[name]
            _row(
                ct,
                name,
                str(int(c.get("count", 0))),
                str(int(c.get("errors", 0))),
                str(int(c.get("lost", 0))),
                str(int(c.get("oom", 0))),
                _seconds(c.get("mean_duration")),
                _seconds(c.get("p90_duration")),
                _seconds(c.get("max_duration")),
                _bytes(c.get("total_nbytes")),
                _bytes(c.get("peak_rss")),
            )
        parts.append(ct)
        more = int(st.get("categories_known") or 0) - len(cats)
        if more > 0:
            parts.append(
                Text(
                    f"categories: {len(cats):,} with the most task time shown, {more:,} more "
                    "(status --categories all, or --categories N)"
                )
            )

    runs: dict[str, int] = dict(st.get("recent_runs") or {})
    if runs:
        clients: dict[str, str] = dict(st.get("run_clients") or {})
        rt = Table(title="latest runs", title_justify="left")
        rt.add_column("run")
        rt.add_column("keys", justify="right")
        rt.add_column("client")
        for run, n in runs.items():
            _row(rt, run, str(n), clients.get(run) or "-")
        parts.append(rt)

    mt = Table(title="memory", title_justify="left")
    for col in ("outputs", "stored", "released", "released bytes", "workers' RSS"):
        mt.add_column(col, justify="right")
    _row(
        mt,
        str(files.get("files", 0)),
        _bytes(sum(stored.values()), zero="0"),
        str(files.get("released", 0)),
        _bytes(files.get("released_bytes"), zero="0"),
        _bytes(sum(rss.values())) if rss else "unknown",
    )
    parts.append(mt)
    if files.get("file_outputs"):
        parts.append(
            Text(
                f"file outputs: {files['file_outputs']} on workers "
                f"({_bytes(files.get('file_bytes'), zero='0')} with their copies)"
            )
        )
    rep: dict[str, Any] = dict(st.get("replicas") or {})
    if rep.get("made") or rep.get("failed"):
        parts.append(
            Text(
                f"replicas: {rep.get('made', 0)} made "
                f"({_bytes(rep.get('copied_bytes'), zero='0')} copied), "
                f"{rep.get('failed', 0)} failed, {rep.get('outputs', 0)} outputs have "
                f"replicas now, {rep.get('recomputes_avoided', 0)} recomputes avoided"
            )
        )
    spec: dict[str, int] = dict(st.get("speculative") or {})
    if spec.get("started"):
        parts.append(
            Text(
                f"speculative copies: {spec['started']} started, {spec.get('won', 0)} won, "
                f"{spec.get('lost', 0)} lost, {spec.get('failed', 0)} failed"
            )
        )
    ckpt: dict[str, int] = dict(st.get("checkpoints") or {})
    if ckpt.get("saved"):
        parts.append(
            Text(
                f"checkpoints: {ckpt.get('held', 0)} held "
                f"({_bytes(ckpt.get('held_bytes'), zero='0')}), {ckpt['saved']} saved, "
                f"{ckpt.get('resumed', 0)} resumed, {ckpt.get('pruned', 0)} pruned, "
                f"{ckpt.get('refused', 0)} refused"
                + (
                    f", {_bytes(ckpt.get('disk_bytes'), zero='0')} on worker disks, "
                    f"{ckpt.get('copied', 0)} copied to peers, {ckpt.get('lost', 0)} lost"
                    if ckpt.get("disk_bytes") or ckpt.get("copied") or ckpt.get("lost")
                    else ""
                )
            )
        )

    pol = Table(title="policies", title_justify="left")
    pol.add_column("kind")
    pol.add_column("policy")
    pol.add_column("parameters")
    given = dict(st.get("policy_params") or {})
    rows = {k: (str(n), given.get(k)) for k, n in dict(st.get("policies") or {}).items()}
    auto = st.get("autoscaler")
    if isinstance(auto, Mapping) and auto.get("policy"):  # the autoscaler's: scaling
        rows["scaling"] = (str(auto["policy"]), auto.get("policy_params"))
    for kind, (name, params) in sorted(rows.items()):
        _row(pol, kind, name, values_text(params))
    parts.append(pol)
    if st.get("policy_errors"):
        parts.append(_policy_errors(st, "policy errors: {} (see the tasks' stories)", ""))
    if isinstance(auto, Mapping) and auto.get("policy_errors"):
        parts.append(_policy_errors(auto, "scaling policy errors: {} (see story -)", "pool "))
    for warning in st.get("warnings") or ():
        parts.append(Text(f"warning: {warning}", style="bold yellow"))
    if st.get("config"):
        parts.append(Text(config_line(st["config"])))
    proc = st.get("process")
    if isinstance(proc, Mapping) and proc.get("pid"):
        fds = int(proc.get("fds", -1))
        parts.append(
            Text(
                f"manager process {proc['pid']}: RSS {_bytes(proc.get('rss'))}, "
                f"{proc.get('threads', 0)} thread(s), "
                + (f"{fds} open file(s), " if fds >= 0 else "")
                + f"{proc.get('asyncio_tasks', 0)} asyncio task(s)"
                + (f"; {proc['clients']} client(s) connected" if "clients" in proc else "")
            )
        )
    return Group(*parts)


def _render_blocks(auto: Mapping[str, Any]) -> list[RenderableType]:
    """The autoscaler's blocks (live, then the latest ends), its budget and, per pool,
    the batch system's latest error."""
    parts: list[RenderableType] = []
    blocks: dict[str, str] = dict(auto.get("blocks") or {})
    ends: list[dict[str, Any]] = list(auto.get("ends") or [])
    if blocks or ends:
        incarnations: dict[str, int] = dict(auto.get("incarnations") or {})
        details: dict[str, str] = dict(auto.get("details") or {})
        retiring = set(auto.get("retiring") or ())
        bt = Table(title="blocks", title_justify="left")
        for col in ("block", "state", "run", "cause", "budget", "detail"):
            bt.add_column(col, justify="right" if col == "run" else "left", overflow="fold")
        bt.columns[0].no_wrap = True
        for bid, state in sorted(blocks.items()):
            detail = details.get(bid, "").split("\n", 1)[0]
            shown = f"{state} (retiring)" if bid in retiring else state
            _row(bt, bid, shown, str(incarnations.get(bid, 1)), "-", "-", detail)
        for e in ends[-10:]:
            charged = "spent" if e.get("charged") else "free"
            run = int(e.get("incarnation") or 1)
            if e.get("state") == "requeued":  # not an end: the same job runs again
                shown, charged = f"requeued: back as run {run + 1}", "-"
            else:
                shown = f"ended {e.get('state')}"
            _row(
                bt, str(e.get("block")), shown, str(run), str(e.get("cause")), charged,
                brief_detail(str(e.get("detail") or "")),
            )  # fmt: skip
        parts.append(bt)
    budget = auto.get("budget")
    if budget:
        by_pool = dict(auto.get("budget_by_pool") or {})
        spent = ", ".join(f"{p} {n}" for p, n in sorted(by_pool.items())) or "none"
        parts.append(
            Text(
                f"unasked ends in each pool's replacement window: {spent}; a pool gives up "
                f"at more than {budget} (preemption and walltime ends are free)"
            )
        )
    paused = set(auto.get("paused") or ())
    gave_up = set(auto.get("gave_up") or ())
    errors: dict[str, dict[str, Any]] = dict(auto.get("batch_errors") or {})
    for pool in sorted(set(errors) | paused | gave_up):
        err = errors.get(pool)
        if err is None:
            what = "paused" if pool in paused else "gave up: its workers kept ending"
            latest = str(dict(auto.get("last_failures") or {}).get(pool) or "")
            if pool in gave_up and latest:
                what += f" (the latest: {brief_detail(latest)})"
            parts.append(Text(f"pool {pool}: {what}; `resume {pool}` asks again", style="bold"))
            continue
        parts.append(Text(_batch_error_line(pool, err, pool in paused), style="bold"))
    return parts


#: when a failed operation of the batch system is tried again, with no back-off running
_TRIED_AGAIN = {
    "submit": "asked again when the pool needs a block",
    "poll": "the blocks' states are asked again at the next poll",
    "cancel": "the cancel is tried again at the next poll",
}


def _batch_error_line(pool: str, err: Mapping[str, Any], paused: bool) -> str:
    """The status's line of ``pool``'s batch system error ``err`` (a ``BatchErrorInfo``'s
    fields): when the failures in a row began (the latest's time and their count when
    there were more), when it is tried again, and the latest error."""

    def clock(at: Any) -> str:
        return time.strftime("%H:%M:%S", time.localtime(float(at or 0)))

    if err.get("suspended") or paused:
        state = f"suspended until an operator runs `resume {pool}`"
    elif err.get("retry_in") is not None:
        state = f"asking again in {float(err['retry_in']):.0f} s"
    elif err.get("asking"):
        state = "asking again now"
    else:  # no back-off running: said per operation
        state = _TRIED_AGAIN.get(str(err.get("operation") or "submit"), _TRIED_AGAIN["submit"])
    failures = int(err.get("failures") or 0)
    if failures > 1 and err.get("since"):
        when = f"failing since {clock(err['since'])} ({failures} failures in a row, the latest "
        when += f"at {clock(err.get('at'))}; {state})"
    else:
        when = f"error at {clock(err.get('at'))} ({state})"
    return f"pool {pool}: batch system {when}: {err.get('command')}: {err.get('error')}"


#: the most characters of its error a task's line shows (``tasks``; the rest: ``story``)
ERROR_WIDTH = 60


def render_tasks(
    records: Sequence[Mapping[str, Any]], limit: int = 0, offset: int = 0
) -> RenderableType:
    """The tasks listed (``limit``: the page asked for, 0 the largest; ``offset``: the
    matching tasks skipped before it), with a footer saying which rows these are when
    there may be more or some were skipped. When some erred or were cancelled, an
    ``error`` column says why (``Type: first line``, cut to the width)."""
    if not records:
        return Text(f"no tasks match after the first {offset}" if offset else "no tasks match")
    t = Table()
    errors = any(r.get("error") for r in records)
    for col in ("key", "state", "category", "pool", "worker", "tries", "client"):
        t.add_column(col, justify="right" if col == "tries" else "left", overflow="fold")
    t.columns[4].no_wrap = True
    if errors:  # its lines cut, not wrapped: the widest column, narrowed first
        t.add_column("error", max_width=ERROR_WIDTH)
    for r in records:
        cells = [
            Text(str(c)) for c in (
                r["key"], r["state"], r["category"], r.get("pool") or "(any pool)",
                r["worker"] or "-", r["tries"], r.get("client") or "-",
            )
        ]  # fmt: skip
        if errors:
            cells.append(Text(r.get("error") or "-", no_wrap=True, overflow="ellipsis"))
        t.add_row(*cells)
    last = offset + len(records)
    if len(records) >= (limit or MAX_LISTING):  # a full page: maybe more after it
        more = f"; --offset {last} shows the next ones, --limit N more at once"
    elif offset:
        more = ""
    else:
        return t  # all of them
    return Group(t, Text(f"(rows {offset + 1}-{last}{more})"))


def _latest_state(entries: Sequence[Sequence[str]]) -> str:
    """The state a task's story leaves it in: the ``to`` of its latest row that is a
    state change ("" when none is)."""
    for _, frm, to, _, _ in reversed(entries):
        if frm in STATES and to in (*STATES, "forgotten"):
            return to
        if frm == "new":
            return to
    return ""


def _pool_blocks(
    st: Mapping[str, Any], pool: str
) -> tuple[list[str], list[str], list[str], int] | None:
    """``pool``'s live blocks by id: running, starting (pending: asked for, not running
    yet) and held (the batch system holds or suspends them: they may run again), and
    its ``max_blocks`` (from the status's configuration; 0: not known), or None when the
    manager has no autoscaler or does not configure ``pool``. A block whose end is being
    decided (listed with its end state) is none of them."""
    autoscaler = st.get("autoscaler")
    config = dict(st.get("config") or {}).get(f"pools.{pool}")
    if not isinstance(autoscaler, Mapping) or not isinstance(config, Mapping):
        return None
    blocks = dict(autoscaler.get("blocks") or {})
    mine = sorted(b for b, p in dict(autoscaler.get("block_pools") or {}).items() if p == pool)
    most = str(dict(config.get("max_blocks") or {}).get("value", "0"))
    return (
        [b for b in mine if blocks.get(b) == "running"],
        [b for b in mine if blocks.get(b) == "pending"],
        [b for b in mine if blocks.get(b) == "held"],
        int(most) if most.isdigit() else 0,
    )


def why_waiting(st: Mapping[str, Any], pool: str | None) -> list[str]:
    """Why a ready task of pool key ``pool`` (None: not known) waits, in sentences, from
    the manager's status ``st``: its pool's ready tasks and oldest wait, its workers
    and their cores busy, a placement stall of the pool (why each idle worker takes
    nothing), and with an autoscaler its blocks: pending, or the pool at its
    ``max_blocks`` (read from the status's configuration)."""
    if pool is None:
        return [
            "its pool is not known (not among the first ready tasks of its category): "
            "`status` shows every pool's workers, ready tasks and blocks."
        ]
    queues, oldest = dict(st.get("queues") or {}), dict(st.get("queue_oldest_wait") or {})
    name = "any pool" if pool == ANY_POOL else f"pool {pool}"
    out = [
        f"it is ready (its inputs are computed) and sent to no worker yet, one of "
        f"{queues.get(pool, 0)} ready task(s) of {name} (the oldest waited "
        f"{_seconds(oldest.get(pool))})."
    ]
    processing: dict[str, int] = dict(st.get("processing") or {})
    workers = [w for w in st.get("workers") or () if pool == ANY_POOL or str(w.get("pool")) == pool]
    cores = sum(int(w.get("cores", 0)) for w in workers)
    busy = sum(
        min(processing.get(str(w.get("worker_id")), 0), int(w.get("cores", 0))) for w in workers
    )
    if not workers:
        out.append(f"No worker of {name} is connected.")
    else:
        out.append(
            f"Its {len(workers)} worker(s) have {cores} core(s), {busy} of them running tasks"
            + (": it waits for one to end." if busy >= cores else ".")
        )
    for d in st.get("placement_stalls") or ():
        if d.get("pool") == pool:
            p = placement_stall_parts(PlacementStallInfo(**d))
            out.append(f"Stalled for placement: idle {p['idle']}. {p['advice']}.")
    seen = _pool_blocks(st, pool)
    if seen is None:
        if not workers and pool != ANY_POOL:
            out.append(
                f"No pool {pool} is configured: it runs once a worker joins with --pool {pool}."
            )
        return out
    autoscaler = dict(st.get("autoscaler") or {})
    running, pending, held, most = seen
    mine = running + pending + held
    wanted = dict(autoscaler.get("desired") or {}).get(pool)
    at_work = f"{len(running)} running and {len(pending)} not running yet"
    if held:
        at_work += f" and {len(held)} held by the batch system ({', '.join(held)})"
    if pool in (autoscaler.get("gave_up") or ()) or pool in (autoscaler.get("paused") or ()):
        out.append(
            f"Pool {pool} asks for no block until resumed (`resume {pool}`): {at_work}; "
            "`status` says why."
        )
    elif pending:
        out.append(
            f"Blocks of pool {pool}: {at_work} ({', '.join(sorted(pending))}): it may run "
            "once they start."
        )
    elif held and not running:
        out.append(
            f"Blocks of pool {pool}: {at_work}: it may run once the batch system lets them "
            "run again (`blocks` shows why each is held)."
        )
    elif most and len(mine) >= most and busy >= cores:
        out.append(
            f"Pool {pool} is at its max_blocks ({most} blocks: {at_work}), so no block more is "
            f"asked for: raise max_blocks in [pools.{pool}] to run more at once."
        )
    else:
        out.append(
            f"Blocks of pool {pool}: {at_work}, of max_blocks {most}; its scaling policy "
            f"wants {wanted if wanted is not None else '-'}."
        )
    return out


def render_story(key: str, entries: Sequence[Sequence[str]]) -> RenderableType:
    """The transitions of ``key`` (at least one: ``story`` refuses a key with none)."""
    t = Table(title=Text(f"story of {key}"), title_justify="left")
    for col in ("time", "from", "to", "stimulus"):
        t.add_column(col, justify="right" if col == "time" else "left", overflow="fold")
    start = _float(entries[0][4])
    for _, frm, to, stim, now in entries:
        _row(t, f"+{_float(now) - start:.3f} s", frm, to, stim)
    return t


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def alert_line(a: Mapping[str, Any]) -> str:
    """One alert's state as a line: time, STATE, name, labels, value, fields. A resolved
    alert's value is the last while its rule held (``value_while_held=``), as
    Prometheus keeps it."""
    since = _state_since(a)
    labels = " ".join(f"{k}={v}" for k, v in (a.get("labels") or {}).items() if k != "alertname")
    fields = " ".join(f"{k}={v:g}" for k, v in (a.get("fields") or {}).items())
    value = "value_while_held" if a.get("state") == "resolved" else "value"
    return (
        f"{_when(since)} {str(a.get('state')).upper():8} {a.get('name')} {labels} "
        f"{value}={a.get('value', 0):g} {fields}"
    ).rstrip()


def _state_since(a: Mapping[str, Any]) -> Any:
    """Since when an alert (as data) is in its state: ``active_since`` while pending,
    ``fired_at`` firing, ``resolved_at`` resolved (None if unknown)."""
    return {"pending": a.get("active_since"), "firing": a.get("fired_at"),
            "resolved": a.get("resolved_at")}.get(str(a.get("state")))  # fmt: skip


def _when(t: Any) -> str:
    return "-" if t is None else time.strftime("%H:%M:%S", time.localtime(float(t)))


def render_alerts(data: Mapping[str, Any]) -> RenderableType:
    """``alert list``: the alerts, the rules in force, the latest audit lines."""
    parts: list[RenderableType] = []
    alerts = list(data.get("alerts") or [])
    if alerts:
        at = Table(title="alerts", title_justify="left")
        for col in ("alert", "state", "since", "labels", "value", "fields"):
            at.add_column(col, overflow="fold")
        at.columns[0].no_wrap = True
        for a in alerts:
            shown = {k: v for k, v in (a.get("labels") or {}).items() if k != "alertname"}
            fields = "\n".join(f"{k}={v:g}" for k, v in (a.get("fields") or {}).items())
            value = f"{a.get('value', 0):g}"
            if a["state"] == "resolved":  # the last while it held, above its threshold
                value += "\n(while held)"
            _row(
                at, str(a["name"]), str(a["state"]).upper(), _when(_state_since(a)),
                "\n".join(f"{k}={v}" for k, v in shown.items()), value, fields,
            )  # fmt: skip
        parts.append(at)
    else:
        parts.append(Text("no alerts pending or firing"))
    rules = list(data.get("rules") or [])
    rt = Table(title="rules", title_justify="left")
    for col in ("rule", "expr", "for", "keep firing", "labels", "annotations", "action"):
        rt.add_column(col, overflow="fold")
    rt.columns[0].no_wrap = True
    for r in rules:
        labels = ", ".join(f"{k}={v}" for k, v in (r.get("labels") or {}).items())
        notes = "\n".join(r.get("annotations") or {}) or "-"  # their names: --json has all
        scale = dict((r.get("action") or {}).get("scale_out") or {})
        how = ", ".join(f"{k} {v}" for k, v in scale.items())
        _row(rt, str(r.get("name")), str(r.get("expr")), f"{r.get('for', 0):g} s",
             f"{r.get('keep_firing_for', 0):g} s", labels, notes,
             f"scale out: {how}" if how else "-")  # fmt: skip
    parts.append(rt if rules else Text("no alert rules"))
    audit = list(data.get("audit") or [])
    if audit:
        parts.append(Text("remediation audit (latest):", style="bold"))
        parts.extend(Text(line) for line in audit[-10:])
    return Group(*parts)


def render_config(config: Mapping[str, Mapping[str, Mapping[str, str]]]) -> RenderableType:
    """The settings a manager runs with (``status()["config"]``): a row per setting,
    with its section, its value and where it came from."""
    t = Table(title="configuration", title_justify="left")
    for col in ("section", "key", "value", "from"):
        t.add_column(col, overflow="fold")
    for section, keys in config.items():
        for key, setting in keys.items():
            _row(t, section, key, str(setting.get("value")), str(setting.get("source")))
    return t


def config_line(config: Mapping[str, Mapping[str, Mapping[str, str]]]) -> str:
    """The status's line of the configuration: its file and how many settings are not
    at their default (the ``config`` command shows them)."""
    rows = [s for keys in config.values() for s in keys.values()]
    changed = sum(1 for s in rows if s.get("source") != "default")
    file = config.get("manager", {}).get("config", {}).get("value", "none")
    return (
        f"configuration: file {file}; {changed} of {len(rows)} settings not at their "
        "default (`config` shows them all, and where each came from)"
    )


def scaling_swap_lines(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """What a new scaling policy did at once to each pool's blocks, from the autoscaler's
    status before and after the swap (``status()["autoscaler"]``): the blocks it drains,
    and the target that would keep them (a policy that follows the target, as ``fixed``,
    drains a busy pool down to it: policies.md#scaling), or the blocks it asks for."""

    def live(auto: Mapping[str, Any], pool: str) -> set[str]:
        retiring = set(auto.get("retiring") or ())
        pools = dict(auto.get("block_pools") or {})
        return {b for b, p in pools.items() if p == pool and b not in retiring}

    lines = []
    pools = sorted(set(dict(after.get("desired") or {})) | set(dict(before.get("desired") or {})))
    for pool in pools:
        had, has = live(before, pool), live(after, pool)
        wants = dict(after.get("desired") or {}).get(pool, 0)
        drained = len(had - has)
        if drained:
            lines.append(
                f"pool {pool}: {len(had)} block(s) before, the policy wants {wants}: "
                f"{drained} being drained (no new tasks; each stops once its tasks are "
                f"done): `scale {pool} {len(had)}` keeps them (a draining block is taken back)"
            )
        elif wants > len(has):
            lines.append(
                f"pool {pool}: {len(has)} block(s), the policy wants {wants}: "
                f"{wants - len(has)} more asked for"
            )
    return lines


def render_policies(infos: Sequence[Mapping[str, Any]]) -> RenderableType:
    """Per kind: the policy in use, the parameters it was given (blank: its defaults),
    and each available policy on a line of its own with its parameters' defaults (what
    ``policy set KIND NAME`` makes, and what each ``key=value`` changes)."""
    t = Table()
    for col in ("kind", "in use", "parameters", "available (defaults)"):
        t.add_column(col)
    for i in infos:
        given = values_text(i.get("params"))
        defaults = dict(i.get("defaults") or {})
        available = "\n".join(
            f"{name} ({params_text(defaults[name])})" if defaults.get(name) else str(name)
            for name in i.get("available") or ()
        )
        _row(t, str(i["kind"]), str(i["name"]), given, available)
    return t


def render_help() -> RenderableType:
    parts: list[RenderableType] = []
    for usage, what, _ in COMMANDS.values():
        parts.append(Text(usage, style="bold"))
        parts.append(Padding(Text(what), (0, 0, 0, 4), expand=False))
    parts.append(
        Text(
            "\nAdd --json to any command for JSON. The read-only token allows status, config, "
            "tasks, story, policy list, alert list and alert watch."
        )
    )
    return Group(*parts)


# ----------------------------------------------------------------------------- the shell


def keep_history(readline: Any, history: Path) -> None:
    """Write ``readline``'s history to ``history``, making its directory as a manager
    makes ``~/.corral`` (0700: :func:`runtime.home.private_dir`); nothing if it
    cannot be written."""
    with contextlib.suppress(OSError):
        private_dir(history.parent)
        readline.write_history_file(history)


def history_path() -> Path:
    """``~/.corral/console_history`` (``$CORRAL_HOME/console_history`` if set)."""
    return corral_home() / "console_history"


def _innermost(exc: BaseException) -> BaseException:
    """The exception inside single-exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _one_line(exc: BaseException) -> str:
    exc = _innermost(exc)
    text = " ".join(str(exc).split()) or "(no message)"
    notes = " ".join(" ".join(n.split()) for n in getattr(exc, "__notes__", ()))
    return f"{type(exc).__name__}: {text}" + (f" {notes}" if notes else "")


class _ConnectionLost(BaseException):
    """Raised in the shell's main thread, waiting at the prompt, when the connection to
    the manager has ended (:meth:`ConsoleShell._interrupted`)."""


class ConsoleShell(cmd.Cmd):
    """The interactive console. ``onecmd(line)`` runs one line and returns ``True`` when
    the shell should end; errors print one line and the shell goes on.

    ``call(async_fn, *args)`` runs ``async_fn`` on the client's event loop and returns
    its result (``BlockingPortal.call``, or ``anyio.from_thread.run`` in a worker thread).
    """

    prompt = "corral> "

    def __init__(
        self,
        client: ConsoleClient,
        call: Callable[..., Any],
        *,
        console: Console | None = None,
        stdin: Any = None,
        stdout: Any = None,
    ) -> None:
        super().__init__(stdin=stdin, stdout=stdout)
        if stdin is not None:
            self.use_rawinput = False
        self.client = client
        client.emit = self._emit
        self.call = call
        #: print views fitted to their width off a terminal (the console is our own)
        self._fit = console is None
        self.out = console or Console()
        self.intro = (
            f"Corral console on {client.address}"
            f"{' (read-only)' if client.read_only else ''}. Type `help` for the commands."
        )
        #: Words for completion, learned from the answers: workers, pools, keys, ...
        self.known: dict[str, list[str]] = {"kinds": ["placement", "priority", "retry"]}
        #: what ``python -m runtime console`` exits with: 1 once the connection is lost
        self.exit_code = 0
        #: the shell waits for a line at the prompt (no command runs)
        self._at_prompt = False
        #: a thread waits for the connection to end, to wake the prompt (loop())
        self._watching = False
        #: that thread's SIGINT is on its way (not the user's Ctrl-C)
        self._woken = False
        self._watch_lock = threading.Lock()

    # -- running lines -------------------------------------------------------------------

    def onecmd(self, line: str) -> bool:
        line = line.strip()
        if not line:
            return False
        if line == "EOF":  # Ctrl-D
            self.out.print()
            return True
        try:
            result: Result = self.call(self.client.execute, line)
        except Exception as exc:
            if not self.client.closed:  # else postcmd says so, in one line
                self.out.print(
                    f"error: {_one_line(exc)}", markup=False, highlight=False, soft_wrap=True
                )
            return False
        if result.quit:
            return True
        self.learn(result)
        if result.as_json:
            self.out.print(result.json(), end="", markup=False, highlight=False, soft_wrap=True)
        elif self._fit and not self.out.is_terminal:
            print_view(result.view, self.out.file)
        else:
            self.out.print(result.view)
        return False

    def _emit(self, line: str) -> None:
        self.out.print(line, markup=False, highlight=False, soft_wrap=True)

    def precmd(self, line: str) -> str:
        self._at_prompt = False
        return line

    def postcmd(self, stop: bool, line: str) -> bool:
        if stop:
            return True
        self._at_prompt = True  # then look: the connection may end from here on
        if self.client.closed:
            self._at_prompt = False
            self._leave()
            return True
        return False

    def _leave(self) -> None:
        """Say that the connection to the manager ended (and why, when it is known);
        the shell then ends with exit code 1."""
        why = self.client.closed_reason
        self.out.print(
            f"the connection to the manager closed{f': {why}' if why else ''}; leaving",
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip
        self.exit_code = 1  # a failure, not a quit

    def refresh(self) -> None:
        """Learn workers, pools, categories and policy names for completion (quietly)."""
        for line in ("status", "policy list"):
            with contextlib.suppress(Exception):
                self.learn(self.call(self.client.execute, line))

    def learn(self, result: Result) -> None:
        data = result.data
        if result.command == "status" and isinstance(data, dict):
            workers = data.get("workers") or []
            self.known["workers"] = sorted(str(w.get("worker_id")) for w in workers)
            pools = {str(w.get("pool")) for w in workers}
            pools |= set((data.get("autoscaler") or {}).get("targets") or {})
            self.known["pools"] = sorted(pools)
            self.known["categories"] = sorted(data.get("categories") or {})
        elif result.command == "tasks" and isinstance(data, list):
            self.known["keys"] = [str(r["key"]) for r in data]
            cats = set(self.known.get("categories", [])) | {str(r["category"]) for r in data}
            self.known["categories"] = sorted(cats)
        elif result.command == "policy" and isinstance(data, list):
            self.known["kinds"] = sorted(str(i["kind"]) for i in data)
            for i in data:
                self.known[f"policy:{i['kind']}"] = list(i.get("available") or ())
        elif result.command == "alert" and isinstance(data, dict) and "rules" in data:
            rules = data["rules"]
            names = [str(r.get("name")) if isinstance(r, dict) else str(r) for r in rules]
            self.known["rules"] = sorted(names)

    # -- completion ----------------------------------------------------------------------

    def completenames(self, text: str, *ignored: Any) -> list[str]:
        return [c for c in [*COMMANDS, "exit"] if c.startswith(text)]

    def completedefault(self, text: str, line: str, begidx: int, endidx: int) -> list[str]:
        return [w for w in self.words_for(line[:begidx]) if w.startswith(text)]

    def words_for(self, before: str) -> list[str]:
        """The words that may follow ``before`` (the line up to the word being typed)."""
        words = before.split()
        if not words:
            return [*COMMANDS, "exit"]
        name, args = _ALIASES.get(words[0], words[0]), words[1:]
        if name == "help":
            return list(COMMANDS) if not args else []
        if name == "status":
            return ["all"] if args and args[-1] == "--categories" else ["--categories", "--json"]
        if name == "config":
            return ["manager", "scheduler", "pools", "alerting", "policies"] if not args else []
        if name == "tasks":
            if args and args[-1] == "--state":
                return list(STATES)
            if args and args[-1] == "--category":
                return self.known.get("categories", [])
            if args and args[-1] == "--limit":
                return []
            if args and args[-1] == "--pool":
                return self.known.get("pools", [])
            return ["--state", "--category", "--client", "--pool", "--limit", "--offset", "--json"]
        if name == "policy":
            if not args:
                return ["list", "set"]
            if args[0] == "set" and len(args) == 1:
                return self.known.get("kinds", [])
            if args[0] == "set" and len(args) == 2:
                return self.known.get(f"policy:{args[1]}", [])
            return []
        if name in ("drain", "undrain"):
            return self.known.get("workers", []) if not args else []
        if name in ("scale", "resume"):
            return self.known.get("pools", []) if not args else []
        if name == "forget":
            return self.known.get("categories", []) if not args else []
        if name == "story":
            return self.known.get("keys", []) + self.known.get("workers", []) if not args else []
        if name == "cancel":
            return ["--key", "--run", *self.known.get("keys", [])] if not args else []
        if name == "alert":
            if not args:
                return ["list", "watch", "add", "remove"]
            if args[0] == "remove" and len(args) == 1:
                return self.known.get("rules", [])
            if args[0] == "watch":
                return []
            if args[0] == "add" and len(args) >= 3:
                return [*_ALERT_OPTIONS]
            return []
        return []

    # -- the loop ------------------------------------------------------------------------

    def preloop(self) -> None:
        with contextlib.suppress(ImportError):  # no readline on this platform
            import readline

            readline.set_completer_delims(" \t\n")
        self._at_prompt = True  # then look: the connection may end from here on
        if self.client.closed:
            # Off the prompt before leaving, as _interrupted is: the watcher's SIGINT
            # may still come, and must not raise again in _leave's print.
            self._at_prompt = False
            raise _ConnectionLost

    def loop(self, history: Path | None = None) -> int:
        """Run until quit/exit/Ctrl-D (0) or the connection to the manager is lost (1);
        keep the readline history in ``history``. Returns that exit code."""
        readline: Any = None
        if history is not None:
            with contextlib.suppress(ImportError):  # no readline on this platform
                import readline as _readline

                readline = _readline
            if readline is not None:
                readline.set_history_length(1000)
                with contextlib.suppress(OSError):
                    readline.read_history_file(history)
        self.refresh()
        intro: str | None = self.intro
        try:
            with self._connection_watched():
                try:
                    while True:
                        try:
                            self.cmdloop(intro)
                            return self.exit_code
                        except KeyboardInterrupt:
                            self._at_prompt = False
                            self.out.print("^C")
                            intro = ""
                except _ConnectionLost:
                    self.out.print()  # off the prompt's line
                    self._leave()
                    return self.exit_code
        finally:
            if readline is not None and history is not None:
                keep_history(readline, history)

    def emptyline(self) -> bool:
        return False

    @contextlib.contextmanager
    def _connection_watched(self) -> Iterator[None]:
        """While the shell reads lines in the main thread (the command line tool): a
        thread waits for the connection to end and then sends the main thread a SIGINT,
        which :meth:`_interrupted` turns into :class:`_ConnectionLost` at the prompt, so
        the shell leaves at once, not at the next line typed. (A command that runs then
        fails, and ``postcmd`` leaves.) Elsewhere (tests drive the shell from a worker
        thread, with their own input) nothing is watched: ``postcmd`` looks after each
        line."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self._interrupted)
        self._watching = True
        main = threading.get_ident()
        threading.Thread(
            target=self._watch, args=(main,), name="console-connection", daemon=True
        ).start()
        try:
            yield
        finally:
            self._at_prompt = False
            with self._watch_lock:  # no SIGINT from the watcher after this
                self._watching = False
            # (a SIGINT still pending is handled by _interrupted, before the swap)
            signal.signal(
                signal.SIGINT, signal.default_int_handler if previous is None else previous
            )

    def _watch(self, main: int) -> None:
        """The watching thread: wait for the connection to end, then wake the main
        thread (:meth:`_connection_watched`)."""
        with contextlib.suppress(Exception):  # the portal stopped: the shell has ended
            self.call(self.client.wait_closed)
        with self._watch_lock:
            if self._watching:
                self._woken = True
                signal.pthread_kill(main, signal.SIGINT)

    def _interrupted(self, signum: int, frame: Any) -> None:
        """SIGINT in the shell's main thread: the user's Ctrl-C (``KeyboardInterrupt``:
        the line is abandoned), or the watcher's word that the connection ended."""
        woken, self._woken = self._woken, False
        if self._at_prompt and self.client.closed:
            self._at_prompt = False  # once
            raise _ConnectionLost
        if not woken:
            raise KeyboardInterrupt


# ----------------------------------------------------------------------------- entry point


def split_cli_options(words: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    """Pull the console's own options (``--token T``, ``--token=T``, ``--token-file P``,
    ``--token-file=P``, ``--tls-ca F``, ``--tls-ca=F``, ``--name N``, ``--name=N``,
    ``--log-level L``, ``--log-level=L``, ``--read-only``, ``--json``) out of the words
    after the address."""
    from runtime.log import level_name

    out: list[str] = []
    found: dict[str, Any] = {}
    it = iter(words)
    for w in it:
        flag, eq, given = w.partition("=")
        if flag in ("--token", "--token-file", "--tls-ca", "--name", "--log-level"):
            value = given if eq else next(it, None)
            if value is None:
                raise ConsoleError(f"{flag} needs a value")
            if flag != "--log-level":
                found[flag[2:].replace("-", "_")] = value
                continue
            try:
                found["log_level"] = level_name(value)
            except ValueError as exc:
                raise ConsoleError(f"--log-level: {exc}") from None
        elif w == "--read-only":
            found["read_only"] = True
        elif w == "--json":
            found["as_json"] = True
        elif w in _HELP_FLAGS and not out:  # `console ADDRESS --help`: the commands
            out.append("help")  # (after a command, that command's usage: _asks_help)
        else:
            out.append(w)
    return out, found


def one_shot_line(words: Sequence[str]) -> str:
    """The command line that the words after the address make. The rest of a
    ``story`` or ``cancel`` line is a key's text: the words joined by a space, as the
    user meant them (``story ('y', 2)`` unquoted, split by the shell), not each word
    quoted; the other commands' words are quoted one by one (``alert add NAME 'EXPR'``).
    A first word that holds several (``console ADDRESS "status --bogus"``: the command
    quoted as one argument) is a :class:`ConsoleError` saying so, not an unknown command
    ``"'status"`` with the quote its joining added."""
    name, rest = words[0], list(words[1:])
    if len(name.split()) > 1:
        raise ConsoleError(
            f'unknown command "{name}": the command and its words came as one quoted '
            "argument; pass them as separate words, without the quotes around them "
            f"(console ADDRESS {name})"
        )
    flags = [rest.pop(0)] if name == "cancel" and rest[:1] in (["--key"], ["--run"]) else []
    if name not in ("story", "cancel") or not rest:
        return shlex.join(words)
    return f"{shlex.join([name, *flags])} {shlex.quote(' '.join(rest))}"


def main(
    address: str,
    words: Sequence[str] = (),
    *,
    token: str | None = None,
    read_only: bool = False,
    as_json: bool = False,
    log_level: str | None = None,
    token_file: str | None = None,
    name: str | None = None,
) -> int:
    """``python -m runtime console``: run ``words`` (the command's, the console's own
    options already taken out by :func:`split_cli_options`) once (exit 0, or 1 after one
    line on stderr), or the interactive shell when there are none. Corral's records are
    logged at ``--log-level`` (``log_level``), by default at error: the console says what
    went wrong in its own one line, and a transport's warning (``peer silent; closing``)
    would only come between its lines. ``name`` names the operator (``--name``; default:
    the user name), a bad one is its one line and exit 1 before anything is dialled."""
    from runtime.log import configure

    configure(log_level or "ERROR")
    cmd_words = list(words)
    try:
        client = ConsoleClient(
            address, token=token, token_file=token_file, read_only=read_only, name=name
        )
    except ValueError as exc:
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 1
    if not cmd_words:
        return _interactive(client)
    line = one_shot_line(cmd_words) + (" --json" if as_json else "")
    if not as_json:
        client.emit = lambda text: print(text, flush=True)

    async def once() -> Result:
        async with client:
            return await client.execute(line)

    try:
        result = anyio.run(once, backend="asyncio")
    except Exception as exc:
        if isinstance(closed := _innermost(exc), BrokenPipeError):
            raise closed from None  # `alert watch | head`: python -m runtime ends quietly
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 1
    if result.as_json:
        sys.stdout.write(result.json())
    else:
        print_view(result.view)
    return 0


def _interactive(client: ConsoleClient) -> int:
    from anyio.from_thread import start_blocking_portal

    with start_blocking_portal(backend="asyncio") as portal:
        connection = portal.wrap_async_context_manager(client)
        try:
            connection.__enter__()
        except Exception as exc:
            print(f"error: {_one_line(exc)}", file=sys.stderr)
            return 1
        try:
            return ConsoleShell(client, portal.call).loop(history_path())
        finally:
            with contextlib.suppress(Exception):
                connection.__exit__(None, None, None)
