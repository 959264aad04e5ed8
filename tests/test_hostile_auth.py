"""Hostile and mistaken connections against authorization at the door (issue 9).

Real manager and worker processes over websockets on 127.0.0.1 where the problems were
found with processes (tells that crashed the manager, worker ids taken over, a worker
with the read token reconnecting for ever, a 403 logged as "unreachable", a first frame
that is not a Hello); in-process tests for the kernel rule and the table.

Process output goes to files: the manager logs every refusal, and a pipe nobody reads
would fill and stall it. Where a test must see a line another process logged, it polls
that file within a bound: no event crosses the process boundary.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.codec import Frame
from runtime.errors import ActorCrashed, CorralError
from runtime.kernel import Actor, ActorSystem, Later, handles
from runtime.messages import (
    ClientGone,
    DrainRequest,
    Message,
    Ping,
    ScaleRequest,
    StatusRequest,
    TasksDone,
    WorkerGone,
    WorkerInfo,
    message,
)
from runtime.node import (
    ALLOWED,
    MAX_REFUSED,
    OWN_CLIENT,
    Hello,
    PermissionDenied,
    Tokens,
    Welcome,
    _Door,
)
from runtime.remote import Refused, to_wire
from tests.helpers import free_port, wait_until

LIMIT = 60
PY = sys.executable


# ----------------------------------------------------------------------------- processes


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def count(self, needle: str) -> int:
        return self.text().count(needle)


def _env(home: Path) -> dict[str, str]:
    e = dict(os.environ)
    e["CORRAL_HOME"] = str(home)  # token files of these tests only
    e.pop("CORRAL_TOKEN", None)
    e["PYTHONUNBUFFERED"] = "1"
    e["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1]), e.get("PYTHONPATH", "")]
    )
    return e


def _start(args: list[str], env: dict[str, str], log: Path) -> Proc:
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [PY, "-m", "runtime", *args], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    return Proc(popen, log)


def _line_with(proc: Proc, needle: str, limit: float = 30) -> str:
    """The first line of the process's output that contains ``needle`` (bounded poll)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for line in proc.text().splitlines():
            if needle in line:
                return line
        if proc.popen.poll() is not None:
            raise AssertionError(f"process ended before printing {needle!r}: {proc.text()}")
        time.sleep(0.02)
    raise AssertionError(f"no {needle!r} within {limit} s: {proc.text()}")


async def _until_logged(proc: Proc, needle: str, n: int) -> None:
    """Wait (bounded by the caller's fail_after) until ``needle`` is in the log n times."""

    def logged() -> bool:
        if proc.count(needle) >= n:
            return True
        assert proc.popen.poll() is None, proc.text()
        return False

    await wait_until(logged, step=0.02)


def _stop(procs: list[Proc]) -> None:
    for p in procs:
        if p.popen.poll() is None:
            p.popen.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.popen.wait(10)
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait(5)


def _tokens(home: Path, address: str) -> dict[str, str]:
    import json

    from runtime.node import token_path

    old = os.environ.get("CORRAL_HOME")
    os.environ["CORRAL_HOME"] = str(home)
    try:
        return dict(json.loads(token_path(address).read_text()))
    finally:
        if old is None:
            del os.environ["CORRAL_HOME"]
        else:
            os.environ["CORRAL_HOME"] = old


@dataclass
class Site:
    address: str
    tokens: dict[str, str]
    env: dict[str, str]
    manager: Proc
    worker: Proc
    worker_id: str
    tmp: Path


def _manager(tmp: Path, env: dict[str, str], listen: str = "127.0.0.1:0") -> tuple[Proc, str]:
    manager = _start(["manager", "--listen", listen], env, tmp / f"manager-{time.time_ns()}.log")
    line = _line_with(manager, "manager listening on")
    return manager, line.split("manager listening on", 1)[1].strip()


@pytest.fixture(scope="module")
def site(tmp_path_factory: Any) -> Iterator[Site]:
    """A manager process and one worker process, shared by the tests that leave both
    running (each checks that they still do)."""
    tmp = tmp_path_factory.mktemp("hostile")
    env = _env(tmp / "home")
    manager, address = _manager(tmp, env)
    procs = [manager]
    try:
        worker = _start(["worker", address, "--cores", "2"], env, tmp / "worker.log")
        procs.append(worker)
        worker_id = _line_with(worker, "joined").split()[1]
        yield Site(address, _tokens(tmp / "home", address), env, manager, worker, worker_id, tmp)
    finally:
        _stop(procs)


# ----------------------------------------------------------------------------- raw peers


@asynccontextmanager
async def raw(address: str, token: str, first: Message, **options: Any) -> AsyncIterator[Any]:
    """A bare connection that sends ``first`` (a Hello, or not) and nothing else
    (``options``: the transport's, e.g. ``max_buffer``)."""
    from transport import connect

    conn = await connect(address, token=token, **options)
    try:
        await conn.send(Frame(first))
        yield conn
    finally:
        await conn.aclose()


async def _next(conn: Any) -> Any:
    """The next message the manager sends, heartbeats skipped."""
    while True:
        frame = await conn.receive()
        if type(frame.msg) is not Ping:
            return frame.msg


async def _refused(conn: Any) -> Refused:
    """The manager's Refused frame; the connection must close right after it."""
    from transport import ConnectionClosed

    msg = await _next(conn)
    assert isinstance(msg, Refused), msg
    with pytest.raises(ConnectionClosed):
        await _next(conn)
    return msg


async def _run_is_correct(site: Site) -> dict[str, Any]:
    """A small graph runs right through the manager; returns its status afterwards."""
    async with Cluster(site.address, token=site.tokens["admin"]) as cluster:
        await cluster.wait_for_workers(1)
        futures = [cluster.submit(square, i) for i in range(8)]
        total = cluster.submit(sum, futures)
        assert await total == sum(i * i for i in range(8))
        status = await cluster.status()
    assert site.manager.popen.poll() is None, site.manager.text()
    assert site.worker.popen.poll() is None, site.worker.text()
    return status


def square(x: int) -> int:
    return x * x


def slow_square(x: int) -> int:
    time.sleep(0.05)
    return x * x


# ----------------------------------------------------------------------------- the kernel


@message("test.Boom")
class Boom(Message):
    later: bool = False


class Fragile(Actor):
    def __init__(self) -> None:
        self.restarts = 0

    async def on_restart(self) -> None:
        self.restarts += 1

    @handles(Boom)
    def boom(self, msg: Boom) -> Any:
        if msg.later:
            return Later(self._fail())
        raise ValueError("bad input")

    async def _fail(self) -> None:
        raise ValueError("bad input, later")

    @handles(StatusRequest)
    def status(self, msg: StatusRequest) -> int:
        return self.restarts


@pytest.mark.anyio
async def test_a_failing_remote_tell_is_the_message_s_failure_not_the_actor_s() -> None:
    """Kernel rule 2's exception: tells from another process (``origin``) that raise are
    logged and counted, with no restart, even past a budget of 0; a local one still
    crashes the actor."""
    with anyio.fail_after(LIMIT):
        with pytest.raises(ActorCrashed, match="fragile"):
            async with ActorSystem() as system:
                actor = Fragile()
                ref = await system.spawn(actor, "fragile", max_restarts=0)
                for i in range(20):
                    await ref.tell(Boom(later=i % 2 == 1), origin="ws://elsewhere")
                assert await ref.ask(StatusRequest()) == 0  # alive, never restarted
                # The deferred (Later) failures land after the handler returned.
                await anyio.wait_all_tasks_blocked()
                assert ref.remote_failures == 20 and not ref.stopped
                await ref.tell(Boom())  # the actor's own message: rule 2 as before
                await ref.wait_stopped()


# ----------------------------------------------------------------------------- the table


def test_the_door_lets_through_exactly_what_the_table_allows() -> None:
    """Every role: the allowed types pass, every other wire or local message type is
    refused with PermissionDenied; a worker speaks for itself only."""
    from runtime.messages import MESSAGE_TYPES

    class _Gateway:
        refused_messages = 0
        progress_runs = {"w": "w"}  # run "w" is the door's own (a ProgressQuery's)

    def sample(kind: type[Message]) -> Message:
        import dataclasses

        values = {"str": "w", "int": 1, "bool": False, "float": 0.0, "bytes": b""}
        args = {}
        for f in dataclasses.fields(kind):  # type: ignore[arg-type]
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                args[f.name] = values.get(str(f.type), ())
        return kind(**args)

    for role, allowed in ALLOWED.items():
        door = _Door(_Gateway(), None, role, "w")  # type: ignore[arg-type]
        for kind in set(MESSAGE_TYPES.values()):
            try:
                msg = sample(kind)
            except TypeError:
                continue  # needs a nested message: not constructible blind, skip
            if role == "submit" and kind in OWN_CLIENT:  # its own client's (the door's name)
                msg = dataclasses.replace(msg, client="w")  # type: ignore[type-var]
            if kind in allowed:
                door.check(msg)
            else:
                with pytest.raises(PermissionDenied):
                    door.check(msg)
    assert ScaleRequest not in ALLOWED["read"] and ClientGone not in ALLOWED["admin"]
    assert DrainRequest not in ALLOWED["worker"]
    door = _Door(_Gateway(), None, "worker", "ws://me:1")  # type: ignore[arg-type]
    door.check(WorkerGone("ws://me:1", "drained"))
    with pytest.raises(PermissionDenied, match="speaks for that worker only"):
        door.check(WorkerGone("ws://someone-else:1", "crash"))


# ----------------------------------------------------------------------------- processes


@pytest.mark.anyio
async def test_refused_and_failing_tells_from_every_role_leave_the_manager_serving(
    site: Site,
) -> None:
    from transport import connect

    with anyio.fail_after(LIMIT):
        failed_before = site.manager.count("remote message failed")
        # Read-only console: the tells that used to take the manager down (ScaleRequest,
        # ClientGone) are refused at the door; the one past MAX_REFUSED closes the
        # connection, saying why.
        async with raw(site.address, site.tokens["read"], Hello("console", "c-read")) as conn:
            assert await _next(conn) == Welcome("")  # a console is welcomed as a client
            for i in range(MAX_REFUSED + 1):
                await conn.send(Frame(ScaleRequest(50) if i % 2 else ClientGone("c-other")))
            refused = await _refused(conn)
        assert refused.kind == "PermissionDenied"
        assert f"closed after {MAX_REFUSED + 1} refused messages" in refused.text
        # Admin client: tells whose handler fails (drain an unknown worker), twice the
        # manager's restart budget of 3.
        async with raw(site.address, site.tokens["admin"], Hello("client", "c-admin")) as conn:
            for _ in range(6):
                await conn.send(Frame(DrainRequest("ws://127.0.0.1:1")))
        # A worker connection: an allowed tell whose handler fails (results that are not
        # results) and two refused ones (a drain; the real worker's departure).
        info = WorkerInfo("ws://127.0.0.1:2", 1, 0, pool="hostile-nowhere")
        conn = await connect(site.address, token=site.tokens["admin"])
        try:
            await conn.send(Frame(Hello("worker", info.worker_id, info)))
            assert isinstance(await _next(conn), Welcome)
            await conn.send(Frame(to_wire(TasksDone(info.worker_id, ("not a result",)))))
            await conn.send(Frame(DrainRequest(site.worker_id)))
            await conn.send(Frame(WorkerGone(site.worker_id, "crash")))
            await _until_logged(site.manager, "remote message failed", failed_before + 7)
            # Its own departure is allowed: the run below need not wait for it to be
            # declared lost (it would still be right, 10 s later).
            await conn.send(Frame(WorkerGone(info.worker_id, "drained")))
        finally:
            await conn.aclose()
        await _until_logged(site.manager, "speaks for that worker only", 1)
        text = site.manager.text()
        assert "actor='scheduler'" in text and "actor='manager'" in text
        assert "restarting actor" not in text and "ActorCrashed" not in text
        status = await _run_is_correct(site)
        assert site.worker_id in [w.worker_id for w in status["workers"]]


@pytest.mark.anyio
async def test_no_other_connection_can_claim_a_worker_id(site: Site) -> None:
    """The worker's id is in status; a read console, an admin connection without the
    worker's secret or with a wrong one, and a client under that name are all refused
    with a clear reason. 300 rapid attempts during a run leave the worker connected and
    no task stuck "processing"."""
    admin, read = site.tokens["admin"], site.tokens["read"]
    wid = site.worker_id
    info = WorkerInfo(wid, 2, 0)
    attempts = [
        (read, Hello("worker", wid, info), "this token is read-only; workers need the worker"),
        (admin, Hello("worker", wid, info), "needs the secret that worker was given"),
        (site.tokens["worker"], Hello("worker", wid, info), "needs the secret that worker was"),
        (admin, Hello("worker", wid, info, "0" * 32), "needs the secret that worker was given"),
        (admin, Hello("console", wid), "is in use"),
        (admin, Hello("client", wid), "is in use"),
        (read, Hello("console", wid), "is in use"),
        (admin, Hello("worker", "ws://127.0.0.1:3", info), "info does not match"),
    ]
    with anyio.fail_after(LIMIT):
        for token, hello, reason in attempts:
            async with raw(site.address, token, hello) as conn:
                refused = await _refused(conn)
            assert reason in refused.text, (hello, refused)

        refusals = site.manager.count("refused a connection")
        async with Cluster(site.address, token=admin) as cluster:
            await cluster.wait_for_workers(1)
            futures = [cluster.submit(slow_square, i) for i in range(40)]

            # 16 at a time: the listener closes the oldest of more than 64 connections
            # still in their HTTP handshake (slowloris guard), which is not what this
            # test is about.
            limit = anyio.CapacityLimiter(16)

            async def kick(i: int) -> None:
                token, hello, reason = attempts[i % 3]
                async with limit, raw(site.address, token, hello) as conn:
                    assert reason in (await _refused(conn)).text

            async with anyio.create_task_group() as tg:
                for i in range(300):
                    tg.start_soon(kick, i)
            results = [await f for f in futures]
            assert results == [i * i for i in range(40)]
            status = await cluster.status()
        assert status["processing"].get(wid) == 0, status["processing"]
        assert "processing" not in status["tasks_by_state"], status["tasks_by_state"]
        assert site.manager.count("refused a connection") >= refusals + 300
        assert "lost the manager" not in site.worker.text()
        assert site.worker.popen.poll() is None and site.manager.popen.poll() is None


@pytest.mark.anyio
async def test_a_first_frame_that_is_not_a_hello_is_closed_with_the_hello_rules(
    site: Site,
) -> None:
    with anyio.fail_after(LIMIT):
        for first in (Ping(1), StatusRequest(), Hello("root", "x"), Hello("client", "n" * 300)):
            async with raw(site.address, site.tokens["admin"], first) as conn:
                refused = await _refused(conn)
                # and the websocket close itself says why (policy violation, 1008)
                assert "websocket close code 1008" in (conn.close_reason or "")
                assert "must be a Hello" in (conn.close_reason or "")
            assert refused.kind == "ProtocolError"
            assert "must be a Hello" in refused.text and "'console'" in refused.text
        await _run_is_correct(site)


def _wall(t0: float) -> float:
    return round(time.monotonic() - t0, 2)


@pytest.mark.anyio
async def test_a_worker_with_the_read_token_exits_1_at_once_saying_why(site: Site) -> None:
    with anyio.fail_after(LIMIT):
        t0 = time.monotonic()
        worker = _start(
            ["worker", site.address, "--token", site.tokens["read"]],
            site.env,
            site.tmp / "read-worker.log",
        )
        await anyio.to_thread.run_sync(worker.popen.wait, LIMIT)
        took = _wall(t0)
        out = worker.text()
        assert worker.popen.returncode == 1, out
        assert (
            "this token is read-only; workers need the worker token (the 'worker' entry" in out
        ), out
        assert len(out.splitlines()) <= 3, out  # said once, no reconnect loop
        assert took < 15, took
        print(f"read-token worker exited 1 after {took} s (process start included)")


@pytest.mark.anyio
async def test_a_client_with_the_read_token_is_refused_when_it_connects(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Cluster(address, token=READ)`` fails at connect, not at its first call: the
    gateway answers a client's Hello (``Welcome``, or ``Refused``) and the client waits
    for it. The error says the token only reads and which token to pass, and where it
    is; a console with the read token still looks."""
    import dask

    import runtime
    from runtime.console import ConsoleClient

    read = site.tokens["read"]
    # The manager's own token file, as the manager tells it: not one under this
    # client's CORRAL_HOME, which names no file of the manager's.
    monkeypatch.setenv("CORRAL_HOME", str(site.tmp / "clienthome"))
    port = site.address.rpartition(":")[2]
    manager_file = site.tmp / "home" / "tokens" / f"127.0.0.1_{port}.json"
    assert manager_file.is_file()
    fix = (
        ": pass the submit token instead (the admin token, if you are the cluster's "
        "operator), as token=... or CORRAL_TOKEN. It is the 'submit' entry of the "
        f"manager's token file, {manager_file} on the manager's machine (readable by that "
        "user only: ask them for it), where the read token is the 'read' entry. To only "
        f"look, use the console: python -m runtime console {site.address} --read-only"
    )
    refused = (
        "this token is read-only; clients (Cluster, runtime.get) need the submit token (or "
        "the admin token, the operator's): the read token only looks (a console with "
        "--read-only, GET /metrics, the dashboard), and a client submits work."
    )
    with anyio.fail_after(LIMIT):
        before = site.manager.count("refused a connection")
        with pytest.raises(PermissionDenied) as info:
            async with Cluster(site.address, token=read):
                pytest.fail("connected with the read token")  # pragma: no cover
        assert str(info.value) == (
            f"{refused} This client presented the token it was given (token=...){fix}"
        )
        assert info.value.what == "Hello as a client"
        assert info.value.token_file == str(manager_file)
        assert "clienthome" not in str(info.value)
        # The gateway refused its Hello: nothing was asked of the manager.
        await _until_logged(site.manager, "refused a connection", before + 1)

        monkeypatch.setenv("CORRAL_TOKEN", read)
        with pytest.raises(PermissionDenied) as info:
            async with Cluster(site.address):
                pytest.fail("connected with the read token")  # pragma: no cover
        assert str(info.value) == (
            f"{refused} This client presented CORRAL_TOKEN from the environment (it wins "
            f"over the token file){fix}"
        )
        monkeypatch.delenv("CORRAL_TOKEN")

        def compute() -> Any:
            x = dask.delayed(square)(4)
            return dask.compute(x, scheduler=runtime.get, address=site.address, token=read)

        with pytest.raises(PermissionDenied, match="this token is read-only; clients"):
            await anyio.to_thread.run_sync(compute)

        # What reads with the read token keeps working: a console.
        async with ConsoleClient(site.address, token=read) as console:
            assert site.worker_id in await console.run_command("status")
        # An admin client is welcomed first (an empty secret: it has no id to keep).
        async with raw(site.address, site.tokens["admin"], Hello("client", "c-hi")) as conn:
            assert await _next(conn) == Welcome("")
        await _run_is_correct(site)


def test_a_client_not_told_the_token_file_says_where_a_manager_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A manager that tells no token file (an embedded one has none): the client says
    where a manager keeps it, not a path built from its own CORRAL_HOME."""
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "clienthome"))
    address = "ws://127.0.0.1:28800"
    text = Cluster(address, token="0" * 64)._read_token_source(address, "")
    assert (
        "the manager's token file, $CORRAL_HOME/tokens/HOST_PORT.json of the manager's user "
        "on its machine (CORRAL_HOME is ~/.corral unless set; HOST and PORT those of the "
        "address it listens on; or the file its --token-file names)"
    ) in text, text
    assert "clienthome" not in text and "127.0.0.1_28800" not in text, text


@pytest.mark.anyio
async def test_a_worker_refused_with_403_says_so_backs_off_and_exits_1(tmp_path: Path) -> None:
    """The manager crashes and restarts on the same port with new tokens: the worker's
    token, given as such (CORRAL_TOKEN; one read from a file is read again, and the new
    one joins: tests/test_token_file.py), is now unknown (HTTP 403). It logs that (not
    "unreachable"), retries with backoff within its reconnect window (10 s), then exits
    1 with the reason. (A manager stopped on purpose would tell it so, and it would
    leave instead of rejoining.)"""
    env = _env(tmp_path / "home")
    port = free_port()
    first, address = _manager(tmp_path, env, f"127.0.0.1:{port}")
    procs = [first]
    try:
        given = dict(env, CORRAL_TOKEN=_tokens(tmp_path / "home", address)["admin"])
        worker = _start(["worker", address, "--cores", "1"], given, tmp_path / "w.log")
        procs.append(worker)
        _line_with(worker, "joined")
        with anyio.fail_after(LIMIT):
            first.popen.kill()  # a crash: no goodbye, so the worker tries to rejoin
            await anyio.to_thread.run_sync(first.popen.wait, 20)
            second, again = _manager(tmp_path, env, f"127.0.0.1:{port}")  # new tokens
            procs.append(second)
            assert again == address
            t0 = time.monotonic()
            await anyio.to_thread.run_sync(worker.popen.wait, LIMIT)
            out = worker.text()
            assert worker.popen.returncode == 1, out
            refused = out.count("the manager refused our token")
            assert 1 <= refused <= 8, out  # backoff: a handful of tries, not hundreds
            assert "status=403" in out, out
            assert "manager unreachable" not in out, out
            assert re.search(r"error: AuthenticationFailed: .*403", out), out
            print(f"403: {refused} logged retries; exited 1 after {_wall(t0)} s")
    finally:
        _stop(procs)


def test_docs_security_md_lists_exactly_what_the_table_allows() -> None:
    """docs/security.md's "What each role may send" table is ALLOWED, role by role."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "security.md").read_text()
    section = doc.split("## What each role may send", 1)[1].split("\n## ", 1)[0]
    listed = {}
    for line in section.splitlines():
        m = re.match(r"\| `(\w+)` \| (.+) \|$", line)
        if m:
            listed[m.group(1)] = set(re.findall(r"`(\w+)`", m.group(2)))
    assert listed == {role: {t.__name__ for t in kinds} for role, kinds in ALLOWED.items()}


def test_a_token_file_that_cannot_be_written_is_a_clear_error_leaving_no_copy(
    tmp_path: Path,
) -> None:
    """`--token-file DIR` stopped the manager with IsADirectoryError and left DIR.tmp
    holding the admin token. Now: a CorralError saying to give a file's path, nothing
    left behind; the same where the parent cannot be made (a file in the way)."""
    tokens = Tokens.generate()
    folder = tmp_path / "adir"
    folder.mkdir()
    with pytest.raises(CorralError, match=r"is a directory: give --token-file a file's path"):
        tokens.write(folder)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(CorralError, match=r"cannot write the token file .*--token-file a path"):
        tokens.write(blocker / "tokens.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "adir"]
    assert not any(folder.iterdir())
    tokens.write(tmp_path / "ok" / "tokens.json")  # a good path still works, 0600
    assert (tmp_path / "ok" / "tokens.json").stat().st_mode & 0o777 == 0o600
    assert Tokens.read_file(tmp_path / "ok" / "tokens.json") == tokens


def test_the_token_file_is_written_through_a_new_file_no_one_else_made(tmp_path: Path) -> None:
    """Tokens.write made ``<file>.tmp`` with O_TRUNC, following what was there: another
    user with write access to the directory could plant a symlink (or a file they keep
    open) and get the tokens. Now the copy is a new file under a random name (O_EXCL,
    never following a link), 0600 whatever the umask, renamed over the token file
    (security audit, finding 7)."""
    folder = tmp_path / "shared"
    folder.mkdir()
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("")
    (folder / "tokens.tmp").symlink_to(theirs)  # the old code's fixed temporary name
    tokens = Tokens.generate()
    old = os.umask(0)
    try:
        tokens.write(folder / "tokens.json")
    finally:
        os.umask(old)
    assert theirs.read_text() == ""  # nothing written through the link
    assert (folder / "tokens.json").stat().st_mode & 0o777 == 0o600
    assert not (folder / "tokens.json").is_symlink()
    assert Tokens.read_file(folder / "tokens.json") == tokens
    assert sorted(p.name for p in folder.iterdir()) == ["tokens.json", "tokens.tmp"]


@asynccontextmanager
async def in_process_gateway(
    tokens: Tokens, ports: tuple[int, int] = (44000, 44999), **options: Any
) -> AsyncIterator[tuple[Any, str]]:
    """A control plane and its gateway in this process, listening on a port of
    127.0.0.1 from ``ports`` (44000 to 44999 unless told; ``options``: the listener's):
    (the gateway, its address)."""
    from runtime.node import serve_gateway, start_control_plane
    from tests.helpers import free_port_between

    async with ActorSystem() as system:
        plane = await start_control_plane(system, alerting=None)
        port = free_port_between(*ports)
        gateway, listener = await serve_gateway(
            plane, f"ws://127.0.0.1:{port}", tokens, listen_options=options
        )
        yield gateway, listener.address


@pytest.mark.anyio
@pytest.mark.parametrize(("role", "kind"), [("read", "console"), ("submit", "client")])
async def test_a_console_under_a_worker_id_gives_way_to_that_worker(role: str, kind: str) -> None:
    """A console (read token) or a client that took a worker's id before the worker
    joined (pool workers' ids, local-1 and on, are easy to guess) does not keep the
    worker out: the worker's Hello is welcomed and the other is closed, told why
    (security audit, finding 3; before, the worker was refused "the name 'local-1' is
    in use"). A console may still not take the id of a worker that joined."""
    tokens = Tokens.generate()
    info = WorkerInfo("local-1", 1, 0)
    with anyio.fail_after(8):
        async with (
            in_process_gateway(tokens) as (gateway, address),
            raw(address, tokens.of(role), Hello(kind, "local-1")) as squat,
        ):
            await wait_until(lambda: "local-1" in gateway.peers, f"the {kind} joined")
            async with raw(address, tokens.admin, Hello("worker", "local-1", info)) as worker:
                welcome = await _next(worker)
                assert isinstance(welcome, Welcome) and welcome.secret, welcome
                assert await _next(squat) == Welcome("")  # a client's, a console's alike
                refused = await _refused(squat)
                assert refused.kind == "PermissionDenied", refused
                assert "'local-1' is the id of a worker that joined" in refused.text
                assert f"this {kind} connection gave way to the worker" in refused.text
                await wait_until(lambda: "local-1" in gateway.infos, "the worker joined")
                async with raw(address, tokens.read, Hello("console", "local-1")) as again:
                    assert "is in use" in (await _refused(again)).text


#: the give-way tests' ports, and the frames a connection may have unread (both ways)
GIVE_WAY_PORTS = (49000, 49999)
WINDOW = 4


@asynccontextmanager
async def squatted(role: str, kind: str) -> AsyncIterator[tuple[Any, Tokens, str, Any]]:
    """A gateway (windows of ``WINDOW`` frames) where a ``kind`` connection with the
    ``role`` token holds the name ``local-1`` and reads nothing: its window is full, so
    the gateway can send it nothing more. Yields (the gateway, the tokens, its address,
    the squatter's connection)."""
    tokens = Tokens.generate()
    async with (
        in_process_gateway(tokens, GIVE_WAY_PORTS, max_buffer=WINDOW) as (gateway, address),
        raw(address, tokens.of(role), Hello(kind, "local-1"), max_buffer=WINDOW) as squat,
    ):
        await wait_until(lambda: "local-1" in gateway.peers, f"the {kind} joined")
        for i in range(WINDOW + 2):  # each answered: more than its window
            await squat.send(Frame(to_wire(StatusRequest()), request_id=i + 1))
        await wait_until(lambda: squat.unread >= WINDOW, f"the {kind}'s window is full")
        yield gateway, tokens, address, squat


async def _told_it_gave_way(squat: Any, kind: str) -> None:
    """The squatter's connection closes saying it gave way: in a Refused frame if it
    read in time for it, else in the close."""
    from transport import ConnectionClosed

    told = ""
    with pytest.raises(ConnectionClosed):
        while True:
            msg = await _next(squat)
            if isinstance(msg, Refused):
                told = msg.text
    told = told or str(squat.close_reason)
    assert f"this {kind} connection gave way to the worker" in told, told


@pytest.mark.anyio
@pytest.mark.parametrize(("role", "kind"), [("read", "console"), ("submit", "client")])
async def test_a_worker_is_welcomed_at_once_under_the_name_of_one_that_reads_nothing(
    role: str, kind: str
) -> None:
    """The worker's Hello waited while the gateway told the squatter it gave way, and a
    squatter that reads nothing never took that frame: the worker got no Welcome (it
    gives up after 10 s). Now the squatter is told in its own connection's task, within
    a second, and the worker is welcomed at once (review 1206d, finding 2 (b))."""
    info = WorkerInfo("local-1", 1, 0)
    with anyio.fail_after(8):
        async with squatted(role, kind) as (gateway, tokens, address, squat):
            worker_hello = Hello("worker", "local-1", info)
            async with raw(address, tokens.admin, worker_hello) as worker:
                with anyio.fail_after(2):
                    welcome = await _next(worker)
                assert isinstance(welcome, Welcome) and welcome.secret, welcome
                await wait_until(lambda: "local-1" in gateway.infos, "the worker joined")
                await _told_it_gave_way(squat, kind)


@pytest.mark.anyio
@pytest.mark.parametrize(("role", "kind"), [("read", "console"), ("submit", "client")])
async def test_hellos_under_the_name_a_worker_takes_are_refused_while_it_takes_it(
    role: str, kind: str, managers: list[Any]
) -> None:
    """A worker's Hello under a squatter's name reserved the id only once the squatter
    was told it gave way: meanwhile a second client (or console) under the name joined,
    to be replaced by the worker without a ClientGone (its wanted keys kept, a phantom
    in the manager's connected clients), and a second worker under the id was welcomed
    with the same secret as the first. Now the id is reserved as the Hello is read:
    both are refused, and the manager counts no client under the name (review 1206d,
    finding 2 (a))."""
    info = WorkerInfo("local-1", 1, 0)
    with anyio.fail_after(8):
        async with squatted(role, kind) as (gateway, tokens, address, squat):
            held = gateway.peers["local-1"]
            async with raw(address, tokens.admin, Hello("worker", "local-1", info)) as first:
                await wait_until(
                    lambda: gateway.peers.get("local-1") is not held, "the worker's Hello read"
                )
                async with (
                    raw(address, tokens.of(role), Hello(kind, "local-1")) as second,
                    raw(address, tokens.admin, Hello("worker", "local-1", info)) as twin,
                ):
                    assert "is in use" in (await _refused(second)).text
                    refused = await _refused(twin)
                    assert refused.kind == "PermissionDenied", refused
                    assert "worker id 'local-1' belongs to a registered worker" in refused.text
                welcome = await _next(first)
                assert isinstance(welcome, Welcome) and welcome.secret, welcome
                await _told_it_gave_way(squat, kind)
                await wait_until(lambda: "local-1" in gateway.infos, "the worker joined")
                # Asked after the gateway told the manager: answered after that is done.
                await gateway.plane.manager.ask(StatusRequest())
                assert managers[0].connected == set()


@pytest.mark.anyio
async def test_a_read_token_asking_for_results_is_told_the_read_token_may_not() -> None:
    """A read-only console that asks for results (a pickled GatherRequest) is refused
    saying that its token is the read token and reading results needs the submit token;
    it said "accepted only from authenticated peers. Connect with the cluster token",
    though the console was authenticated (security audit, finding 8)."""
    from runtime.messages import ErrorReply, GatherRequest

    tokens = Tokens.generate()
    with anyio.fail_after(8):
        async with (
            in_process_gateway(tokens) as (_, address),
            raw(address, tokens.read, Hello("console", "looker")) as conn,
        ):
            assert await _next(conn) == Welcome("")
            await conn.send(Frame(to_wire(GatherRequest(("k",))), request_id=7))
            reply = await _next(conn)
    assert isinstance(reply, ErrorReply), reply
    assert "this connection has the read token" in reply.text, reply.text
    assert "use the submit token" in reply.text, reply.text
    assert "authenticated peers" not in reply.text and "cluster token" not in reply.text


def test_a_manager_warns_when_it_listens_without_tls_where_other_machines_reach_it() -> None:
    """`--listen 0.0.0.0:8786` started without a word (security audit, finding 6)."""
    from runtime.node import cleartext_warning

    for address in ("ws://0.0.0.0:8786", "ws://10.1.2.3:8786", "ws://login1.cluster:8786"):
        text = cleartext_warning(address)
        assert text is not None and f"listening on {address} without TLS" in text, text
        assert "wss://" in text and "SSH tunnel" in text
    for address in ("ws://127.0.0.1:8786", "ws://localhost:8786", "ws://[::1]:8786"):
        assert cleartext_warning(address) is None, address
    assert cleartext_warning("wss://0.0.0.0:8786") is None
    assert cleartext_warning("inproc://x") is None
