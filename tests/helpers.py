"""Helpers more than one test module uses; test modules import from here, never from
each other.

- :func:`wait_until`: the one bounded poll, for state a test can only observe from
  outside (another process's pid or file, a queue's length); where an event signals the
  change, wait on the event instead.
- :func:`nodes` and :data:`GATEWAYS`: a manager and workers as separate actor systems
  joined over ``inproc://`` with the codec on.
- :class:`Cli` (from ``runtime/cli_processes.py``, which the benchmarks share): manager
  and worker processes started through the CLI, their output read all along, stopped at
  the end.
- :func:`external_binary` (a program a test needs, e.g. Prometheus or Alertmanager:
  skipped without it locally, a failure in CI), :func:`free_port`,
  :func:`free_port_between`, :func:`http_get`.
- Builders for tests of the scheduler's pure core: :func:`event`, :func:`run`,
  :func:`submit`, :func:`join`, :func:`finish`, ... and the ``make_state`` fixture (a
  module that uses it imports it by name; it validates every state it made).
"""

from __future__ import annotations

import dataclasses
import datetime
import fcntl
import functools
import inspect
import ipaddress
import itertools
import logging
import os
import shutil
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.protocol import FileFact, TaskResult
from actors.registry import DropReplicas, FilesDropped, FileTable
from actors.scheduler_events import (
    CancelRequested,
    Command,
    Event,
    Execute,
    FileFacts,
    FilesReleased,
    GraphSubmitted,
    KeysReleased,
    TasksFinished,
    WorkerJoined,
    WorkerLeft,
)
from actors.scheduler_records import SchedulerConfig
from actors.scheduler_state import SchedulerState
from policies import REGISTRY
from runtime.cli_processes import Cli
from runtime.graph import Key, Task, TaskRef, build_specs
from runtime.kernel import Actor, handles
from runtime.messages import (
    OutputUnpicklable,
    RegisterWorker,
    StatusRequest,
    TasksDone,
    WorkerMemoryReport,
)
from runtime.node import Gateway, Tokens, run_manager, run_worker


async def wait_until(
    condition: Callable[[], Any],
    what: str = "the condition",
    *,
    limit: float | None = None,
    step: float = 0.01,
) -> Any:
    """Poll ``condition`` until it returns something true, and return that value.

    ``condition`` is a plain function or an async one. ``step`` seconds pass between
    tries (``0`` only yields to the event loop). With ``limit`` the wait is bounded here
    and running out is an ``AssertionError`` naming ``what``; without it the caller
    bounds the wait with its own ``fail_after``.
    """

    async def poll() -> Any:
        while True:
            value = condition()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await anyio.sleep(step)

    if limit is None:
        return await poll()
    try:
        with anyio.fail_after(limit):
            return await poll()
    except TimeoutError:
        raise AssertionError(f"timed out after {limit} s waiting for {what}") from None


def autoscalers_made(
    monkeypatch: pytest.MonkeyPatch, wrap: Callable[[Any], Any] | None = None
) -> list[Any]:
    """The autoscaler actors made from now on (a ``Cluster`` makes its own), in order,
    so a test can read its core; ``wrap`` replaces each one's scheduler reference."""
    from actors.autoscaler import Autoscaler

    made: list[Any] = []
    real_init = Autoscaler.__init__

    def init(self: Autoscaler, *args: Any, **kwargs: Any) -> None:
        real_init(self, *args, **kwargs)
        if wrap is not None:
            self.scheduler = wrap(self.scheduler)
        made.append(self)

    monkeypatch.setattr(Autoscaler, "__init__", init)
    return made


async def block_end(cluster: Any, block: str, *, limit: float) -> dict[str, Any]:
    """The autoscaler's record of ``block``'s end (``status()["autoscaler"]["ends"]``),
    once there (an ``AssertionError`` after ``limit`` seconds)."""

    async def ended() -> dict[str, Any] | None:
        auto = (await cluster.status())["autoscaler"]
        return next((e for e in auto["ends"] if e["block"] == block), None)

    end: dict[str, Any] = await wait_until(ended, f"{block} ended", limit=limit)
    return end


async def no_ticks(self: Any) -> None:
    """In place of ``Autoscaler._ticks`` (monkeypatched): the autoscaler reads no count
    of the scheduler by itself; a test ticks it when it chooses (``_Tick``), or never."""


async def worker_statuses(cluster: Any) -> list[Any]:
    """Each live worker's ``WorkerStatus`` (what it stores), asked of the worker itself
    (an embedded ``Cluster``'s in-process workers)."""
    out = []
    for wid in list(cluster.scheduler_state.workers):
        ref = cluster._provider.ref(wid)
        if ref is not None and not ref.stopped:
            out.append(await ref.ask(StatusRequest()))
    return out


def held_at_gate(gate: str, started: str, limit: float = 60.0) -> str:
    """A task body: say it started (touch ``started``), then wait, at most ``limit``
    seconds, until the test opens the gate (creates ``gate``). A test waits for
    ``started`` to know the task is running, and opens the gate to let it finish."""
    Path(started).touch()
    deadline = time.monotonic() + limit
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.005)
    return "opened"


#: Cluster options of one worker with one slot, by execution mode (thread, process)
ONE_SLOT = {
    "thread": {"workers": 1, "threads_per_worker": 1},
    "process": {
        "processes": 1,
        "threads_per_worker": 1,
        "memory_options": {"execution": "process"},
    },
}


@asynccontextmanager
async def gated_cluster(
    tmp_path: Path, limit: float, **options: Any
) -> AsyncIterator[tuple[Any, Path, Path]]:
    """A ``Cluster(**options)`` with its worker joined, and the gate and started files
    of :func:`held_at_gate` tasks (in ``tmp_path``), all within ``limit`` seconds; the
    gate is opened on the way out, whatever happened, so no task waits on it after."""
    from runtime import Cluster

    gate, started = tmp_path / "gate", tmp_path / "started"
    try:
        with anyio.fail_after(limit):
            async with Cluster(**options) as c:
                await c.wait_for_workers(1, timeout=60)
                yield c, gate, started
    finally:
        gate.touch()


GATEWAYS: list[Gateway] = []  #: every gateway :func:`nodes` started, newest last


class AsRole:
    """A connection that claims ``role`` (what a token-checking transport sets)."""

    def __init__(self, conn: Any, role: str) -> None:
        self._conn = conn
        self.role = role

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


@asynccontextmanager
async def nodes(n_workers: int = 2) -> AsyncIterator[tuple[str, list[anyio.CancelScope]]]:
    """A manager and ``n_workers`` workers; yields the manager's address and one cancel
    scope per worker (cancelling one is a worker that vanishes)."""
    address = anyio.Event()
    where: dict[str, str] = {}

    def manager_ready(addr: str, tokens: Tokens) -> None:
        where["manager"] = addr
        address.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: run_manager(
                "inproc://", ready=manager_ready, listen_options={"codec": True},
                reconnect_timeout=0.5, on_gateway=GATEWAYS.append,
            )
        )  # fmt: skip
        await address.wait()
        scopes: list[anyio.CancelScope] = []
        for _ in range(n_workers):
            scope = anyio.CancelScope()
            scopes.append(scope)

            async def worker(scope: anyio.CancelScope = scope) -> None:
                with scope:
                    await run_worker(where["manager"], listen_options={"codec": True})

            tg.start_soon(worker)
        yield where["manager"], scopes
        tg.cancel_scope.cancel()


# ----------------------------------------------------------------------------- CLI processes

ROOT = Path(__file__).resolve().parents[1]  #: this checkout


def scraped(text: str, name: str) -> dict[str, float]:
    """The samples of metric ``name`` in an exposition ``text``, by their pool label."""
    return {
        s.labels.get("pool", ""): s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == name
        for s in fam.samples
    }


class PostedRef:
    """A stand-in actor reference: keeps what is posted to it (a scheduler shell's
    manager, registry or worker, driven without an actor system)."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    def post(self, msg: Any) -> None:
        self.got.append(msg)

    tell = post


class FixedClock:
    """A clock that always says ``10.0``."""

    def now(self) -> float:
        return 10.0


class SchedulerRecorder(Actor):
    """Stands for the scheduler of a worker actor under test: records what the worker
    tells it (the tries that ended by key, its memory reports, every message in the
    order it came) and wakes waiters on each."""

    def __init__(self) -> None:
        self.done: dict[Any, TaskResult] = {}
        self.reports: list[WorkerMemoryReport] = []
        self.messages: list[Any] = []
        self.changed = anyio.Event()

    def _wake(self) -> None:
        self.changed.set()
        self.changed = anyio.Event()

    @handles(RegisterWorker)
    def registered(self, msg: RegisterWorker) -> None:
        self._wake()

    @handles(TasksDone)
    def tasks_done(self, msg: TasksDone) -> None:
        self.messages.append(msg)
        self.done.update((r.key, r) for r in msg.results)
        self._wake()

    @handles(WorkerMemoryReport)
    def memory(self, msg: WorkerMemoryReport) -> None:
        self.messages.append(msg)
        self.reports.append(msg)
        self._wake()

    @handles(OutputUnpicklable)
    def unpicklable(self, msg: OutputUnpicklable) -> None:
        self.messages.append(msg)
        self._wake()

    async def until(self, condition: Callable[[], Any]) -> None:
        """Wait until ``condition()`` holds (the caller bounds the wait)."""
        while not condition():
            await self.changed.wait()

    def latest(self, worker: str) -> WorkerMemoryReport | None:
        """The latest memory report of ``worker`` (None: none yet)."""
        return next((r for r in reversed(self.reports) if r.worker_id == worker), None)

    async def result(self, key: Any) -> TaskResult:
        """How the try of ``key`` ended, once the worker says (the caller bounds it)."""
        await self.until(lambda: key in self.done)
        return self.done[key]


class LogLines(logging.Handler):
    """The rendered lines a stdlib logger writes, as they come (see :func:`log_lines`)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def with_(self, *parts: str) -> str | None:
        """The first line holding every one of ``parts`` (None: none yet)."""
        return next((ln for ln in self.lines if all(p in ln for p in parts)), None)

    def has(self, *parts: str) -> bool:
        return self.with_(*parts) is not None


async def closed_by_peer(ws: Any) -> tuple[int | None, str]:
    """Read (and drop) what the peer of the aiohttp websocket ``ws`` sends until it
    closes: (close code, reason)."""
    from aiohttp import WSMsgType

    while True:
        msg = await ws.receive()
        if msg.type is WSMsgType.CLOSE:
            return msg.data, str(msg.extra or "")
        if msg.type in (WSMsgType.CLOSED, WSMsgType.CLOSING, WSMsgType.ERROR):
            return ws.close_code, ""


@contextmanager
def registered(*policies: tuple[str, str, Any]) -> Iterator[None]:
    """The ``(kind, name, factory)`` policies registered while in it only: the
    registry is the process's, and other tests list a kind's built-in names."""
    for kind, name, factory in policies:
        REGISTRY.register(kind, name)(factory)
    try:
        yield
    finally:
        for kind, name, _ in policies:
            REGISTRY._factories[kind].pop(name, None)


@contextmanager
def log_lines(name: str = "corral", level: int = logging.INFO) -> Iterator[LogLines]:
    """Collect what logger ``name`` writes at ``level`` and above while in the block."""
    logger = logging.getLogger(name)
    handler, old_level = LogLines(), logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


# ----------------------------------------------------------------------------- external programs


def external_binary(name: str, package: str) -> str:
    """The path of program ``name`` (from Debian package ``package``). Without it a
    test skips with how to get it; with ``CI=true`` it fails (.ci/run installs it)."""
    found = shutil.which(name)
    if found is None:
        why = (
            f"{name} is not installed: on Debian or Ubuntu, `apt-get install -y "
            f"--no-install-recommends {package}` (or put a `{name}` binary on PATH)"
        )
        if os.environ.get("CI") == "true":
            pytest.fail(why + "; CI must run this test (.ci/run installs it)")
        pytest.skip(why)
    return found


def http_get(url: str, token: str | None = None) -> tuple[int, str]:
    """GET ``url`` (with a bearer ``token``), bounded: its status and text."""
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def free_port() -> int:
    """A TCP port of 127.0.0.1 free just now (for a program that takes no port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_between(lo: int, hi: int) -> int:
    """A TCP port of 127.0.0.1 from ``lo`` to ``hi`` free just now (for tests held to a
    range of ports), tried from a random start."""
    import random

    start = random.randrange(lo, hi + 1)
    for n in range(hi - lo + 1):
        port = lo + (start - lo + n) % (hi - lo + 1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free port of 127.0.0.1 from {lo} to {hi}")


@functools.cache
def self_signed_pem(
    names: tuple[str, ...] = ("127.0.0.1", "localhost"), *, expired: bool = False
) -> tuple[bytes, bytes]:
    """A self-signed certificate for ``names`` (IP addresses and DNS names; by default
    127.0.0.1 and localhost), valid for a day from five minutes ago (``expired``: it
    ended a day ago), and its key, PEM (its own CA: a client trusts it by loading it as
    one)."""
    return _certificate_pem(names, expired, None)


@functools.cache
def ca_signed_pem(names: tuple[str, ...], issuer: tuple[bytes, bytes]) -> tuple[bytes, bytes]:
    """A certificate for ``names`` signed by ``issuer`` (its certificate and key, PEM,
    as :func:`self_signed_pem` or this gives them; it may sign others in turn), valid
    for a day from five minutes ago, and its key, PEM: chains of CAs."""
    return _certificate_pem(names, False, issuer)


def _certificate_pem(
    names: tuple[str, ...], expired: bool, issuer: tuple[bytes, bytes] | None
) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    common = "corral test" if issuer is None else f"corral test {names[0]}"
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])
    signer, issuer_name = key, name
    if issuer is not None:
        issuer_key = serialization.load_pem_private_key(issuer[1], None)
        assert isinstance(issuer_key, ec.EllipticCurvePrivateKey)
        signer, issuer_name = issuer_key, x509.load_pem_x509_certificate(issuer[0]).subject
    now = datetime.datetime.now(datetime.UTC)
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=2 if expired else 0, minutes=5))
        .not_valid_after(now + datetime.timedelta(days=-1 if expired else 1))
        .add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
            critical=False,
        )
        .sign(signer, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _san(name: str) -> Any:
    """A subjectAltName entry for ``name``: an IP address entry, else a DNS name."""
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def start_alertmanager(cli: Cli, workdir: Path, port: int | None = None) -> str:
    """A real Alertmanager on 127.0.0.1 (skipped without it, failing in CI) with a
    route to a receiver that sends nothing, started by ``cli`` (stopped with it);
    returns its base URL once it answers ``/-/ready`` (bounded)."""
    binary = external_binary("prometheus-alertmanager", "prometheus-alertmanager")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "alertmanager.yml"
    config.write_text('route: {receiver: "null"}\nreceivers: [{name: "null"}]\n')
    port = port or free_port()
    proc = cli.spawn(
        [
            binary, f"--config.file={config}", f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
        ]
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:  # bounded poll: its HTTP server comes up
        try:
            if http_get(url + "/-/ready")[0] == 200:
                return url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"Alertmanager did not start on {url} (exit {proc.poll()})")
        time.sleep(0.1)


# ----------------------------------------------------------------------------- scheduler core
# Builders for tests of the scheduler's pure core (actors/scheduler_state.py): they feed
# events to ``SchedulerState.handle`` and pick the commands apart.

GB = 2**30
MB = 2**20

_clock = itertools.count(1)


def event(cls: type[Event], /, **fields: Any) -> Any:
    """An event with a fresh stimulus id and a later ``now`` than the previous one."""
    n = next(_clock)
    return cls(stimulus_id=f"{cls.__name__}-{n}", now=float(n), **fields)


def run(state: SchedulerState, *events: Event, check: bool = True) -> list[Command]:
    """Handle ``events`` and check the invariants afterwards."""
    cmds = state.handle(*events)
    if check:
        state.validate()
    return cmds


def _fn(*args: Any) -> None:
    return None


def graph(table: Mapping[Key, Iterable[Key]]) -> dict[Key, Task]:
    """``{key: [deps]}`` -> a dask graph of Task nodes reading their dependencies."""
    return {k: Task(k, _fn, *(TaskRef(d) for d in deps)) for k, deps in table.items()}


def chain(prefix: str, n: int) -> dict[Key, list[Key]]:
    """``prefix-0 <- prefix-1 <- ... <- prefix-(n-1)``."""
    return {f"{prefix}-{i}": ([f"{prefix}-{i - 1}"] if i else []) for i in range(n)}


def specs_for(
    state: SchedulerState,
    table: Mapping[Key, Iterable[Key]],
    wanted: Sequence[Key],
    *,
    attrs: Mapping[Key, Mapping[str, Any]] | None = None,
    **kw: Any,
) -> dict[Key, Any]:
    specs = build_specs(graph(table), wanted, known=lambda k: k in state.tasks, **kw)
    for key, changes in (attrs or {}).items():
        specs[key] = dataclasses.replace(specs[key], **changes)
    return specs


def submit(
    state: SchedulerState,
    table: Mapping[Key, Iterable[Key]],
    wanted: Sequence[Key],
    *,
    check: bool = True,
    attrs: Mapping[Key, Mapping[str, Any]] | None = None,
    **kw: Any,
) -> list[Command]:
    specs = specs_for(state, table, wanted, attrs=attrs, **kw)
    return run(state, event(GraphSubmitted, specs=specs, wanted=tuple(wanted)), check=check)


def join(
    state: SchedulerState,
    worker: str,
    cores: int = 1,
    memory: int = GB,
    pool: str = "default",
) -> list[Command]:
    return run(state, event(WorkerJoined, worker=worker, cores=cores, memory=memory, pool=pool))


def leave(state: SchedulerState, worker: str, cause: str = "preempted") -> list[Command]:
    return run(state, event(WorkerLeft, worker=worker, cause=cause))


def result(
    key: Key,
    outcome: Any = "ok",
    *,
    start: float = 0.0,
    duration: float = 1.0,
    nbytes: int = 100,
    rss: int = 0,
    error: BaseException | None = None,
    missing: tuple[tuple[Key, str], ...] = (),
    fetched: tuple[Key, ...] = (),
    fetches: tuple[tuple[Key, str, int, float], ...] = (),
    attempt: int = 0,
    rss_peak: int = 0,
    rss_before: int = 0,
    file: bool = False,
    own_rss: int = 0,
) -> TaskResult:
    return TaskResult(
        key,
        outcome,
        start=start,
        stop=start + duration,
        nbytes=nbytes,
        rss=rss,
        error=error,
        missing=missing,
        fetched=fetched,
        fetches=fetches,
        attempt=attempt,
        rss_peak=rss_peak,
        rss_before=rss_before,
        file=file,
        own_rss=own_rss,
    )


def finish(
    state: SchedulerState,
    worker: str,
    key: Key,
    outcome: Any = "ok",
    *,
    check: bool = True,
    **kw: Any,
) -> list[Command]:
    """One task's try ended on ``worker`` with ``outcome``."""
    res = result(key, outcome, **kw)
    return run(state, event(TasksFinished, worker=worker, results=(res,)), check=check)


def finish_all(state: SchedulerState, worker: str, keys: Iterable[Key], **kw: Any) -> list[Command]:
    results = tuple(result(k, **kw) for k in keys)
    return run(state, event(TasksFinished, worker=worker, results=results))


def cancel(
    state: SchedulerState, *keys: Key, reason: str = "by test", spare: Iterable[Key] = ()
) -> list[Command]:
    """A cancel of ``keys``; ``spare``: the keys other clients hold."""
    return run(state, event(CancelRequested, keys=keys, reason=reason, spare=frozenset(spare)))


def release(state: SchedulerState, *keys: Key) -> list[Command]:
    return run(state, event(KeysReleased, keys=keys))


def files_released(state: SchedulerState, *keys: Key) -> list[Command]:
    return run(state, event(FilesReleased, keys=keys))


def of(cmds: Iterable[Command], cls: type[Any]) -> list[Any]:
    return [c for c in cmds if isinstance(c, cls)]


def assigned(cmds: Iterable[Command]) -> dict[str, list[Key]]:
    """Keys sent to each worker by the ``Execute`` commands, in order."""
    out: dict[str, list[Key]] = {}
    for c in of(cmds, Execute):
        out.setdefault(c.worker, []).extend(t.key for t in c.tasks)
    return out


def facts(cmds: Iterable[Command]) -> dict[Key, FileFact]:
    """The latest FileFact per key."""
    return {f.key: f for c in of(cmds, FileFacts) for f in c.facts}


def states(state: SchedulerState) -> dict[Key, str]:
    return {k: ts.state for k, ts in state.tasks.items()}


def on(state: SchedulerState, worker: str) -> set[Key]:
    return {ts.key for ts in state.workers[worker].processing}


def by_order(state: SchedulerState, keys: Iterable[Key]) -> list[Key]:
    return sorted(keys, key=lambda k: state.tasks[k].spec.order)


def only_running(state: SchedulerState) -> Key:
    (ts,) = (t for ws in state.workers.values() for t in ws.processing)
    return ts.key


def worker_of(state: SchedulerState, key: Key) -> str:
    w = state.tasks[key].worker
    assert w is not None
    return w


class Loop:
    """A scheduler core wired to the file registry's core, as the actors wire them:
    FileFacts go to the FileTable, its FilesDropped come back as FilesReleased (with
    ``hold``, only at :meth:`deliver`: what the scheduler may handle meanwhile)."""

    def __init__(self, state: SchedulerState, *, hold: bool = False) -> None:
        self.state = state
        self.table = FileTable()
        self.hold = hold
        self.answers: list[tuple[Key, ...]] = []  #: FilesDropped held back (``hold``)
        self.dropped: list[Key] = []  #: every key the registry released, in order
        #: every DropKeys the registry sent, ``(worker, keys)``, in order
        self.drops: list[tuple[str, tuple[Key, ...]]] = []

    def run(self, *events: Event, check: bool = True) -> list[Command]:
        out: list[Command] = []
        todo: list[Event] = list(events)
        while todo:
            cmds = run(self.state, todo.pop(0), check=check)
            out.extend(cmds)
            for c in of(cmds, FileFacts):
                for rc in self.table.handle(c.facts):
                    if isinstance(rc, DropReplicas):
                        self.drops.append((rc.worker, rc.keys))
                    if isinstance(rc, FilesDropped):
                        self.dropped.extend(rc.keys)
                        if self.hold:
                            self.answers.append(rc.keys)
                        else:
                            todo.append(event(FilesReleased, keys=rc.keys))
        return out

    def deliver(self) -> list[Command]:
        """The registry's answers held back (``hold``), in order."""
        answers, self.answers = self.answers, []
        return self.run(*(event(FilesReleased, keys=keys) for keys in answers))

    def finish(self, worker: str, key: Key, **kw: Any) -> list[Command]:
        res = result(key, **kw)
        return self.run(event(TasksFinished, worker=worker, results=(res,)))


Factory = Callable[..., SchedulerState]


@pytest.fixture(autouse=True)
def make_state() -> Iterator[Factory]:
    """A factory of scheduler states; every state it made is validated at teardown."""
    made: list[SchedulerState] = []

    def make(
        *,
        priority: Any = None,
        placement: Any = None,
        retry: Any = None,
        memory: Any = None,
        replication: Any = None,
        speculation: Any = None,
        timer: Any = None,
        **config: Any,
    ) -> SchedulerState:
        def policy(kind: str, p: Any) -> Any:
            return REGISTRY.create(kind, p) if isinstance(p, str) else p

        state = SchedulerState(
            SchedulerConfig(**config),
            priority=policy("priority", priority),
            placement=policy("placement", placement),
            retry=policy("retry", retry),
            memory=policy("memory", memory),
            replication=policy("replication", replication),
            speculation=policy("speculation", speculation),
            **({} if timer is None else {"timer": timer}),
        )
        made.append(state)
        return state

    yield make
    for state in made:
        state.validate()


@contextmanager
def slurm_test_lock(conf: str, limit: float = 100.0) -> Iterator[None]:
    """Hold the test Slurm cluster's machine-wide test lock (next to its ``conf``): test
    runs of other checkouts on this machine use the same cluster, and one's owner job
    (or stopped slurmctld) would upset another's test. Waits at most ``limit`` seconds
    (about two of the longest tests), then fails the test."""
    path = Path(conf).parent / "corral-tests.lock"
    with path.open("a") as lock:
        deadline = time.monotonic() + limit
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another test run held {path} for {limit:.0f} s")
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def load_script(relpath: str, modname: str) -> Any:
    """The script at ``relpath`` (from the project's root; benchmarks and the docs'
    screenshot maker are scripts, not packages), loaded once as ``modname``."""
    import importlib.util

    module = sys.modules.get(modname)
    if module is not None:
        return module
    path = Path(__file__).resolve().parents[1] / relpath
    spec = importlib.util.spec_from_file_location(modname, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module  # dataclasses look their module up while it is made
    spec.loader.exec_module(module)
    return module


def load_bench(name: str) -> Any:
    """The module ``benchmarks/<name>.py``, loaded once as ``corral_bench_<name>``."""
    return load_script(f"benchmarks/{name}.py", f"corral_bench_{name}")


def status_text(st: dict[str, Any]) -> str:
    """The console's status view of ``st`` (a StatusReply as a dict), as plain text."""
    import io

    from rich.console import Console

    from runtime.console import render_status

    buf = io.StringIO()
    Console(file=buf, width=200, color_system=None).print(render_status(st))
    return buf.getvalue()


class _Captured(Exception):
    pass


def captured(*collections: Any) -> tuple[Any, list[Any]]:
    """What ``dask.compute`` hands a scheduler: the (not yet materialized) expression
    and the keys."""
    import dask

    got: list[Any] = []

    def scheduler(dsk: Any, keys: Any, **kwargs: Any) -> Any:
        got.extend([dsk, keys])
        raise _Captured

    with pytest.raises(_Captured):
        dask.compute(*collections, scheduler=scheduler)
    return got[0], got[1]


GATE = 10.0  #: seconds a gated pickling waits for its test at most


class Gated:
    """A value whose pickling (a spill's) waits for the test's ``go``: the spill is
    under way for as long as the test says. ``waited`` records whether ``go`` came
    (True) or the wait ran out (False)."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.pickling = threading.Event()
        self.go = threading.Event()
        self.waited: list[bool] = []

    def __reduce__(self) -> tuple[Any, ...]:
        self.pickling.set()
        self.waited.append(self.go.wait(GATE))
        return (bytes, (self.payload,))


#: the :class:`GatedLoad` values by token (reading one back finds its gate here)
_GATED_LOADS: dict[int, GatedLoad] = {}


class GatedLoad:
    """A value whose unpickling (reading it back from a spill file) waits for the
    test's ``go``, as :class:`Gated` does its pickling; what is read back is
    ``payload``. ``waited``: whether ``go`` came (True) or the wait ran out."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.loading = threading.Event()
        self.go = threading.Event()
        self.waited: list[bool] = []
        _GATED_LOADS[id(self)] = self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_load_gated, (id(self), self.payload))


def _load_gated(token: int, payload: bytes) -> bytes:
    gated = _GATED_LOADS[token]
    gated.loading.set()
    gated.waited.append(gated.go.wait(GATE))
    return payload


def manager_with_a_worker(cli: Cli, port: int, worker_ports: str) -> tuple[str, str]:
    """A manager process listening on 127.0.0.1:``port`` (no monitoring) and a worker of
    one core joined to it: the manager's address and its submit token."""
    proc = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
    line = cli.line_with(proc, "manager listening on")
    address = line.split("manager listening on", 1)[1].strip()
    cli.worker(address, "--cores", "1", "--port-range", worker_ports)
    return address, cli.tokens(address)["submit"]
