"""The control console (runtime/console.py) against real managers and workers.

Everything runs in this process: a manager (``run_manager``) and workers
(``run_worker``) over ``inproc://`` with the codec on, as in tests/helpers.py, so
every console message is encoded and decoded as over a websocket. A second set-up
(``hosted``) serves a gateway in front of a control plane with an autoscaler, and can
make its connections read-only. The tests at the end need the websocket transport with
tokens (``ws://``): the read-only token and the one-shot command line.

Tasks that must stay running wait on a gate (a ``threading.Event``) that the test
opens; nothing sleeps and then asserts.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import operator
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest

from actors.autoscaler import PoolTarget
from actors.providers import Block, BlockSpec, BlockState, InProcessProvider, Provider
from policies import REGISTRY
from policies.scaling import PoolLimits
from runtime import Cluster
from runtime import client as client_module
from runtime.client import (
    _no_workers_news,
    _past_limit_news,
    _policies_left_news,
    _throttle_news,
    _ThrottleWatch,
)
from runtime.client_ids import client_name
from runtime.console import (
    COMMANDS,
    STATUS_CATEGORIES,
    ConsoleClient,
    ConsoleError,
    ConsoleShell,
    _ConnectionLost,
    resumed_text,
    split_cli_options,
)
from runtime.errors import CancelledError, CorralError, SubmissionsSuspended
from runtime.kernel import ActorSystem
from runtime.messages import (
    AlertInfo,
    DrainRequest,
    PolicyInfo,
    StatusReply,
    StatusRequest,
    TaskRecord,
    WorkerInfo,
    WorkerMemoryReport,
)
from runtime.monitor import alerting_config
from runtime.node import (
    DEAD_AFTER,
    Gateway,
    PermissionDenied,
    Tokens,
    run_manager,
    run_worker,
    start_control_plane,
    token_path,
    worker_factory,
)
from tests.helpers import ROOT, AsRole, Cli, log_lines, wait_until

LIMIT = 20

# ----------------------------------------------------------------------------- set-ups


class Node:
    """A worker started by :func:`nodes`: its id, a scope that kills it, and an event
    set when ``run_worker`` returned (it stopped)."""

    def __init__(self, worker_id: str, scope: anyio.CancelScope, ended: anyio.Event) -> None:
        self.id = worker_id
        self.scope = scope
        self.ended = ended


async def start_workers(
    tg: anyio.abc.TaskGroup, address: str, n: int, *, token: str | None = None
) -> list[Node]:
    """``n`` workers (``run_worker``) joined to the manager at ``address``."""
    options = {"codec": True} if address.startswith("inproc") else {}
    workers: list[Node] = []
    for _ in range(n):
        scope = anyio.CancelScope()
        ended = anyio.Event()
        ready = anyio.Event()
        ids: list[str] = []

        async def worker(
            scope: anyio.CancelScope = scope,
            ended: anyio.Event = ended,
            ready: anyio.Event = ready,
            ids: list[str] = ids,
        ) -> None:
            def on_ready(wid: str) -> None:
                ids.append(wid)
                ready.set()

            try:
                with scope:
                    await run_worker(address, listen_options=options, ready=on_ready, token=token)
            finally:
                ended.set()

        tg.start_soon(worker)
        await ready.wait()
        workers.append(Node(ids[0], scope, ended))
    return workers


@asynccontextmanager
async def nodes(n_workers: int = 2) -> AsyncIterator[tuple[str, list[Node]]]:
    """A manager and ``n_workers`` workers over inproc (as in tests/helpers.py)."""
    found = anyio.Event()
    where: dict[str, str] = {}

    def manager_ready(addr: str, tokens: Tokens) -> None:
        where["manager"] = addr
        found.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(
            lambda: run_manager(
                "inproc://", ready=manager_ready, listen_options={"codec": True},
                reconnect_timeout=0.5,
            )
        )  # fmt: skip
        await found.wait()
        workers = await start_workers(tg, where["manager"], n_workers)
        yield where["manager"], workers
        tg.cancel_scope.cancel()


@asynccontextmanager
async def ws_nodes(n_workers: int, tokens: Tokens) -> AsyncIterator[tuple[str, list[Node]]]:
    """A manager on ``ws://127.0.0.1:0`` with ``tokens`` (written to the token file
    under ``CORRAL_HOME``, as ``run_manager`` does) and ``n_workers`` workers.

    It ends gracefully, so every socket is closed (cancelling ``run_manager`` or
    ``run_worker`` leaves their listening sockets open): the workers are drained (they
    stop at once when idle), then the listener and the connections are closed."""
    from transport import listen

    async with ActorSystem() as system:
        plane = await start_control_plane(system)
        gateway = Gateway(plane, reconnect_timeout=0.5)
        listener = await listen("ws://127.0.0.1:0", tokens=tokens.roles())
        tokens.write(token_path(listener.address))
        await system.start_service(listener.serve, gateway.handle)
        async with anyio.create_task_group() as tg:
            workers = await start_workers(tg, listener.address, n_workers, token=tokens.admin)
            try:
                yield listener.address, workers
            finally:
                for w in workers:
                    if not w.ended.is_set():
                        with contextlib.suppress(ValueError):  # gone already
                            await plane.refs["scheduler"].ask(DrainRequest(w.id))
                    await w.ended.wait()
                await listener.aclose()
                for peer in list(gateway.peers.values()):
                    await peer.aclose()


@asynccontextmanager
async def hosted(
    n_workers: int = 1,
    *,
    role: str = "admin",
    wrap: Callable[[InProcessProvider], Provider] | None = None,
    workers_per_block: int = 1,
    alerting: dict[str, Any] | None = None,
    limits: PoolLimits | None = None,
    memory: int = 0,
) -> AsyncIterator[tuple[str, Any]]:
    """A control plane with an autoscaler (in-process workers, through ``wrap`` if
    given; ``n_workers`` blocks of ``workers_per_block`` workers) behind a gateway on
    ``inproc://`` with the codec; every connection gets ``role``. ``alerting``: the
    ``[alerting]`` settings of its alert monitor (the defaults otherwise); ``limits``:
    the pool's configured limits (none by default); ``memory``: each worker's memory
    limit (0: the machine's; an in-process worker's governor reads this process's RSS)."""
    from transport import listen

    async with ActorSystem() as system:

        def provider(plane: Any) -> Provider:
            inner = InProcessProvider(system, worker_factory(plane.refs["scheduler"]))
            return inner if wrap is None else wrap(inner)

        plane = await start_control_plane(
            system,
            provider=provider,
            targets={
                "default": PoolTarget(
                    n_workers, BlockSpec(workers_per_block, 1, memory, 0, "default"), limits
                )
            },
            **({} if alerting is None else {"alerting": alerting_config(alerting)}),
        )
        gateway = Gateway(plane, reconnect_timeout=0.5)
        listener = await listen("inproc://", codec=True)

        async def handle(conn: Any) -> None:
            await gateway.handle(conn if role == "admin" else AsRole(conn, role))

        await system.start_service(listener.serve, handle)
        try:
            yield listener.address, plane
        finally:
            await listener.aclose()
            for peer in list(gateway.peers.values()):
                await peer.aclose()


GATES: dict[str, threading.Event] = {}


def gated(name: str, x: int) -> int:
    """Runs until the test opens gate ``name``."""
    if not GATES[name].wait(LIMIT):
        raise TimeoutError(f"gate {name} never opened")
    return x


@pytest.fixture
def gate() -> Any:
    made: list[str] = []

    def make(name: str) -> threading.Event:
        GATES[name] = threading.Event()
        made.append(name)
        return GATES[name]

    yield make
    for name in made:  # never leave a worker thread blocked
        GATES.pop(name).set()


def add(x: int, y: int) -> int:
    return x + y


def fail(x: int) -> int:
    raise ValueError(f"bad input {x}")


# ----------------------------------------------------------------------------- status


@pytest.mark.anyio
async def test_status_shows_workers_pools_tasks_categories_memory_and_policies() -> None:
    with anyio.fail_after(LIMIT):
        async with (
            nodes(2) as (address, workers),
            Cluster(address) as cluster,
            ConsoleClient(address) as console,
        ):
            await cluster.wait_for_workers(2)
            futures = cluster.map(add, range(10), range(10))
            assert await cluster.gather(futures) == [2 * i for i in range(10)]
            with pytest.raises(ValueError):
                await cluster.submit(fail, 1)

            st = await console.status()
            assert sorted(w.worker_id for w in st["workers"]) == sorted(w.id for w in workers)
            assert st["tasks_by_state"]["memory"] == 10
            assert st["tasks_by_state"]["erred"] == 1
            assert st["categories"]["add"]["count"] == 10
            assert st["categories"]["fail"]["errors"] == 1
            assert st["policies"] == {
                "priority": "graph", "placement": "locality", "retry": "default",
                "memory": "producers-yield", "replication": "recompute-cost",
                "speculation": "idle-tail",
            }  # fmt: skip
            assert set(st["processing"]) == {w.id for w in workers}
            assert st["rss"] and all(v > 0 for v in st["rss"].values())  # measured per task
            assert st["draining"] == [] and st["queues"] == {}
            assert st["files"]["files"] == 10 and st["runs"] == 2
            assert "autoscaler" not in st  # a manager process has none
            # The manager's process (here this one): what tells a long-lived manager
            # filling its bounded stores from one that leaks.
            proc = st["process"]
            assert proc["pid"] == os.getpid() and proc["rss"] > 2**20
            assert proc["threads"] >= 1 and proc["fds"] > 0 and proc["asyncio_tasks"] > 0
            assert proc["clients"] == 1  # the Cluster(address); the console is no client

            text = await console.run_command("status")
            assert f"manager process {os.getpid()}: RSS " in text and "asyncio task(s)" in text
            assert "; 1 client(s) connected" in text
            for word in ("workers", "pools", "tasks", "categories", "memory", "policies"):
                assert word in text
            for w in workers:
                assert w.id in text
            assert "locality" in text and "add" in text and "MiB" in text  # RSS shown

            data = json.loads(await console.run_command("status --json"))
            assert {w["worker_id"] for w in data["workers"]} == {w.id for w in workers}
            assert data["tasks_by_state"]["memory"] == 10
            assert data["categories"]["add"]["count"] == 10


@asynccontextmanager
async def cluster_and_console() -> AsyncIterator[tuple[Cluster, ConsoleClient]]:
    """A manager with one worker (:func:`nodes`), a client and a console of it."""
    async with (
        nodes(1) as (address, _),
        Cluster(address) as cluster,
        ConsoleClient(address) as console,
    ):
        yield cluster, console


def nap(x: int, s: float = 0.0) -> int:
    time.sleep(s)
    return x


@pytest.mark.anyio
async def test_status_shows_the_categories_with_the_most_task_time_and_counts_the_rest() -> None:
    # A manager may know many thousands of categories: drawing them all took 8 s for
    # 5,260. status shows 20, those with the most task time, and says how many more.
    with anyio.fail_after(LIMIT):
        async with cluster_and_console() as (cluster, console):
            await cluster.wait_for_workers(1)
            futures = [cluster.submit(nap, i, key=f"cat{i:02d}x-{i}") for i in range(30)]
            futures.append(cluster.submit(nap, 99, 0.3, key="slowest-1"))
            await cluster.gather(futures)

            text = await console.run_command("status")
            shown = [c for c in ("slowest", *(f"cat{i:02d}x" for i in range(30))) if c in text]
            assert len(shown) == STATUS_CATEGORIES and shown[0] == "slowest"
            assert text.index("slowest") < text.index(shown[1])  # most task time first
            assert "11 more (status --categories all, or --categories N)" in text

            every = await console.run_command("status --categories all")
            assert all(f"cat{i:02d}x" in every for i in range(30)) and "more" not in every
            five = await console.run_command("status --categories 5")
            assert "26 more" in five
            data = json.loads(await console.run_command("status --json"))
            assert len(data["categories"]) == STATUS_CATEGORIES
            assert data["categories_known"] == 31 and "slowest" in data["categories"]
            assert len((await console.status())["categories"]) == 31  # the API's: every one
            with pytest.raises(ConsoleError, match="usage: status"):
                await console.run_command("status --categories none")


@pytest.mark.anyio
async def test_status_of_a_cluster_with_an_autoscaler_shows_its_targets() -> None:
    with anyio.fail_after(LIMIT):
        async with hosted(2) as (address, _), ConsoleClient(address) as console:
            st = await wait_until(
                lambda: _when(console.status(), lambda s: len(s["workers"]) == 2), "2 workers"
            )
            assert st["autoscaler"]["targets"] == {"default": 2}
            text = await console.run_command("status")
            assert "target" in text


async def _when(coro: Any, ok: Callable[[Any], bool]) -> Any:
    value = await coro
    return value if ok(value) else None


# ----------------------------------------------------------------------------- tasks, story


@pytest.mark.anyio
async def test_tasks_lists_filters_and_limits_and_story_shows_transitions(gate: Any) -> None:
    with anyio.fail_after(LIMIT):
        async with (
            nodes(1) as (address, (worker,)),
            Cluster(address, name="alice") as cluster,
            ConsoleClient(address) as console,
        ):
            opened = gate("tasks")
            done = cluster.map(add, range(5), range(5))
            await cluster.gather(done)
            # Tuple keys (as dask makes them) and a task held running by the gate.
            graph = {("x", 0): 1, ("x", 1): (operator.add, ("x", 0), 1)}
            (x1,) = await cluster.submit_graph(graph, [("x", 1)])
            await x1
            blocked = cluster.submit(gated, "tasks", 7)

            running = await wait_until(lambda: console.tasks(state="processing"), "running")
            # its try under way counts (it showed 0 tries)
            assert running == [
                TaskRecord(blocked.key, "processing", "gated", worker.id, 1, "alice")
            ]
            memory = await console.tasks(state="memory")
            assert {r.key for r in memory} >= {f.key for f in done} | {"('x', 1)"}
            assert all(r.worker == worker.id and r.tries == 1 for r in memory)
            adds = await console.tasks(category="add")
            assert sorted(r.key for r in adds) == sorted(f.key for f in done)
            assert len(await console.tasks(limit=2)) == 2
            assert len(await console.tasks(limit=0)) == len(await console.tasks(limit=1000))
            assert await console.tasks(state="erred") == []

            text = await console.run_command("tasks --state memory --category add --limit 3")
            assert text.count("memory") == 3 and "(rows 1-3; --offset 3 shows the next" in text
            data = json.loads(await console.run_command("tasks --state processing --json"))
            assert data == [
                {"key": blocked.key, "state": "processing", "category": "gated",
                 "worker": worker.id, "tries": 1, "client": "alice", "pool": None,
                 "error": ""}
            ]  # fmt: skip
            # who submitted: a column, and a filter
            assert len(await console.tasks(client="alice", limit=0)) == len(
                await console.tasks(limit=0)
            )
            assert await console.tasks(client="bob") == []
            text = await console.run_command("tasks --client alice --state processing")
            assert "alice" in text and "gated" in text
            assert (await console.run_command("tasks --client bob")).strip() == "no tasks match"
            status = await console.status(0)
            assert set(status["run_clients"].values()) == {"alice"}
            assert list(status["run_clients"]) == list(status["recent_runs"])
            with pytest.raises(ConsoleError, match="invalid choice"):
                await console.execute("tasks --state nonsense")
            with pytest.raises(ConsoleError, match="--limit must be 0 to 10000"):
                await console.execute("tasks --limit -1")
            with pytest.raises(ConsoleError, match="--limit must be 0 to 10000"):
                await console.execute("tasks --limit 10001")
            # pages: --offset skips what the page before showed
            page1 = await console.tasks(category="add", limit=3)
            page2 = await console.tasks(category="add", limit=3, offset=3)
            assert len(page1) == 3 and len(page2) == 2
            assert {r.key for r in page1 + page2} == {f.key for f in done}
            # the footer says which rows a page holds, not "first N"
            text = await console.run_command("tasks --category add --offset 2 --limit 2")
            assert text.count("memory") == 2 and "(rows 3-4; --offset 4 shows the next" in text
            assert "(rows 4-5)" in await console.run_command("tasks --category add --offset 3")
            text = await console.run_command("tasks --category add --offset 5")
            assert text.strip() == "no tasks match after the first 5"

            # story: by the key's text as `tasks` shows it, tuple keys typed as they are.
            story = await console.story("('x', 1)")
            moves = [(frm, to) for _, frm, to, _, _ in story]
            assert ("queued", "processing") in moves and ("processing", "memory") in moves
            assert all(entry[0] == "('x', 1)" for entry in story)
            text = await console.run_command("story ('x', 1)")
            assert "story of ('x', 1)" in text and "processing" in text
            quoted = json.loads(await console.run_command("story \"('x', 1)\" --json"))
            assert quoted["key"] == "('x', 1)" and quoted["transitions"] == story
            # A worker id has a story too: when it joined.
            assert [e[2] for e in await console.story(worker.id)][:1] == ["joined"]
            assert await console.story("no-such-key") == []
            with pytest.raises(ConsoleError, match="no transitions recorded for 'no-such-key'"):
                await console.execute("story no-such-key")
            with pytest.raises(ConsoleError, match="usage: story KEY"):
                await console.execute("story")

            opened.set()
            assert await blocked == 7


@pytest.mark.anyio
async def test_tasks_show_and_filter_by_pool_and_status_shows_each_pools_oldest_wait(
    gate: Any,
) -> None:
    """A user audit with a cpu and a gpu pool: the wait per pool was only in /metrics
    and the dashboard (`status` showed ready counts, no wait), and `tasks` had no pool
    column and refused `--pool gpu`. Now `tasks` shows each task's pool and `--pool
    NAME` keeps that pool's (a pool no pool may be named, or one the manager does not
    know: an error saying why), and `status` has each pool's oldest wait."""
    with anyio.fail_after(LIMIT):
        async with cluster_and_console() as (cluster, console):
            await cluster.wait_for_workers(1)  # its pool: default
            opened = gate("pools")
            running = cluster.submit(gated, "pools", 1, pool="default")
            anywhere = cluster.submit(add, 1, 2)  # any pool: waits behind the gated one
            stuck = cluster.submit(add, 3, 4, pool="gpu")  # no worker: it waits
            await wait_until(lambda: console.tasks(state="processing"), "running")
            await wait_until(lambda: _when(console.tasks(), lambda rs: len(rs) == 3), "all 3")

            gpu = await console.tasks(pool="gpu")
            assert [(r.key, r.state, r.pool) for r in gpu] == [(stuck.key, "queued", "gpu")]
            assert [r.key for r in await console.tasks(pool="default")] == [running.key]
            every = {r.key: r.pool for r in await console.tasks()}
            assert every == {running.key: "default", anywhere.key: None, stuck.key: "gpu"}
            text = await console.run_command("tasks --pool gpu")
            header = next(line for line in text.splitlines() if "key" in line)
            assert [c.strip() for c in header.strip("┃").split("┃")] == [
                "key", "state", "category", "pool", "worker", "tries", "client",
            ]  # fmt: skip
            assert stuck.key in text and running.key not in text
            assert "(any pool)" in await console.run_command("tasks --state queued")
            data = json.loads(await console.run_command("tasks --pool default --json"))
            assert [(r["key"], r["pool"]) for r in data] == [(running.key, "default")]
            # a pool the manager does not know: the pools it knows, and the closest
            with pytest.raises(ValueError, match=r"no pool 'gpux'.*did you mean 'gpu'\?"):
                await console.execute("tasks --pool gpux")
            with pytest.raises(ValueError, match="no pool 'gpux'"):
                await console.tasks(pool="gpux")
            # a name no pool has: said before asking
            with pytest.raises(ConsoleError, match=r"--pool '\*': '\*' is not a pool's name"):
                await console.execute("tasks --pool *")
            with pytest.raises(ValueError, match="a pool's name is not empty nor blank"):
                await console.tasks(pool=" ")

            st = await console.status()
            waits = st["queue_oldest_wait"]
            assert set(waits) == set(st["queues"]) >= {"gpu", "*"}, st["queues"]
            assert waits["gpu"] > 0 and waits["*"] > 0, waits
            text = await console.run_command("status")
            header = next(line for line in text.splitlines() if "target blocks" in line)
            assert "│ ready │ oldest wait │" in header.replace("┃", "│"), header
            row = next(line for line in text.splitlines() if line.startswith("│ gpu "))
            assert row.split("│")[6].strip() not in ("", "-"), row

            opened.set()
            assert await running == 1 and await anywhere == 3
            stuck.cancel()


def test_status_shows_each_pools_oldest_wait_from_the_status() -> None:
    """The pools table's `oldest wait`: the status reply's ``queue_oldest_wait`` of the
    pool (what /metrics' ``corral_queue_oldest_wait_seconds`` says), a dash where no
    task is ready."""
    from tests.helpers import status_text

    text = status_text({
        "workers": [{"worker_id": "g1", "pool": "gpu", "cores": 1},
                    {"worker_id": "c1", "pool": "cpu", "cores": 1}],
        "queues": {"gpu": 6, "*": 2},
        "queue_oldest_wait": {"gpu": 46.08, "*": 0.5},
    })  # fmt: skip
    rows = {line.split("│")[1].strip(): line.split("│") for line in text.splitlines()
            if line.startswith("│ ") and len(line.split("│")) == 12}  # fmt: skip
    assert rows["gpu"][5].strip() == "6" and rows["gpu"][6].strip() == "46.08 s", text
    assert rows["(any pool)"][6].strip() == "500.0 ms", text
    assert rows["cpu"][5].strip() == "0" and rows["cpu"][6].strip() == "-", text


def test_status_shows_each_workers_accelerator_when_one_is_pinned() -> None:
    """The workers table gets an ``accelerator`` column, the device each worker is
    pinned to (``WorkerInfo.accelerator``; a dash for one that is not), only when some
    worker is: a cluster without accelerators keeps its table as it was."""
    from tests.helpers import status_text

    workers = [{"worker_id": "g1", "pool": "gpu", "cores": 1, "accelerator": "MIG-7"},
               {"worker_id": "c1", "pool": "cpu", "cores": 1, "accelerator": ""}]  # fmt: skip
    text = status_text({"workers": workers})
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")]
            for line in text.splitlines() if line.startswith("│ ")}  # fmt: skip
    assert "accelerator" in text and rows["g1"][3] == "MIG-7" and rows["c1"][3] == "-", text
    assert rows["g1"][4] == "1", text  # then its cores
    plain = status_text({"workers": [{**w, "accelerator": ""} for w in workers]})
    assert "accelerator" not in plain, plain


# ----------------------------------------------------------------------------- policies


@pytest.mark.anyio
async def test_policy_list_shows_each_available_policys_parameters_with_their_defaults() -> None:
    """``policy list`` showed the names one may switch to, not what their parameters are
    by default: a user could not see what ``policy set`` with a ``key=value`` changes.
    Now each name comes with its parameters' defaults (``PolicyInfo.defaults``), in the
    table, in ``--json``, and in ``set_policy``'s answer."""
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), ConsoleClient(address) as console:
            infos = {i.kind: i for i in await console.policies()}
            retry = infos["retry"].defaults
            assert retry["never"] == {} and retry["default"]["max_lost"] == "5", retry
            assert retry["default"]["charge_lost"] == "False", retry
            assert set(infos["retry"].defaults) == set(infos["retry"].available)
            placement = infos["placement"].defaults["locality"]
            assert placement == {"bandwidth": "500000000.0", "min_duration": "0.001"}
            table = await console.run_command("policy list")
            assert "available (defaults)" in table, table
            for line in ("locality (bandwidth=500000000.0, min_duration=0.001)",
                         "default (max_lost=5, charge_lost=False,", "round-robin"):  # fmt: skip
                assert line in table, (line, table)
            data = json.loads(await console.run_command("policy list --json"))
            by_kind = {d["kind"]: d for d in data}
            assert by_kind["memory"]["defaults"]["producers-yield"] == {
                "ratio": "2.0", "min_nbytes": "1048576",
            }  # fmt: skip
            info = await console.set_policy("retry", "default", {"max_lost": 2})
            assert info.params == {"max_lost": 2} and info.defaults == REGISTRY.defaults("retry")


def test_a_parameter_without_a_default_is_listed_as_required() -> None:
    from policies.base import defaults_of

    def factory(ratio: float, limit: int = 3, *, mode: str = "x", **extra: object) -> None: ...

    assert defaults_of(factory) == {"ratio": "(required)", "limit": "3", "mode": "'x'"}


@pytest.mark.anyio
async def test_policy_list_and_set() -> None:
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), ConsoleClient(address) as console:
            infos = {i.kind: i for i in await console.policies()}
            assert infos["placement"] == PolicyInfo(
                "placement", "locality", tuple(REGISTRY.names("placement")),
                defaults=REGISTRY.defaults("placement"),
            )  # fmt: skip
            assert {"least-loaded", "locality", "round-robin"} <= set(infos["placement"].available)
            assert infos["priority"].name == "graph" and "long-first" in infos["priority"].available
            assert infos["retry"].name == "default" and "never" in infos["retry"].available
            assert "round-robin" in await console.run_command("policy list")

            info = await console.set_policy("placement", "round-robin")
            assert info.kind == "placement" and info.name == "round-robin"
            assert (await console.status())["policies"]["placement"] == "round-robin"

            data = json.loads(
                await console.run_command(
                    "policy set retry default max_lost=2 charge_lost=true --json"
                )
            )
            # the parameters in force, as values (what set_policy takes back)
            assert data["name"] == "default" and data["params"] == {
                "max_lost": 2, "charge_lost": True,
            }  # fmt: skip
            assert "retry policy is now default (charge_lost=True, max_lost=2)" in (
                await console.run_command("policy set retry default max_lost=2 charge_lost=true")
            )
            text = await console.run_command("policy set placement least-loaded")
            assert "placement policy is now least-loaded" in text
            text = await console.run_command("policy set memory blind")
            assert "memory policy is now blind" in text
            assert {i.kind: i.name for i in await console.policies()} == {
                "priority": "graph", "placement": "least-loaded", "retry": "default",
                "memory": "blind", "replication": "recompute-cost",
                "speculation": "idle-tail",
            }  # fmt: skip

            with pytest.raises(CorralError, match="no-such"):
                await console.execute("policy set placement no-such")
            with pytest.raises(CorralError, match="bogus"):
                await console.execute("policy set retry default bogus=1")
            with pytest.raises(ConsoleError, match="key=value"):
                await console.execute("policy set retry default max_lost")
            with pytest.raises(ConsoleError, match="usage: policy"):
                await console.execute("policy frobnicate")
            assert (await console.status())["policies"]["placement"] == "least-loaded"


# ----------------------------------------------------------------------------- drain


@pytest.mark.anyio
async def test_drain_gives_a_worker_no_new_tasks_and_stops_it_once_idle(gate: Any) -> None:
    with anyio.fail_after(LIMIT):
        async with (
            nodes(2) as (address, workers),
            Cluster(address) as cluster,
            ConsoleClient(address) as console,
        ):
            await cluster.wait_for_workers(2)
            opened = gate("drain")
            blocked = cluster.submit(gated, "drain", 1)
            (running,) = await wait_until(lambda: console.tasks(state="processing"), "running")
            busy = next(w for w in workers if w.id == running.worker)
            other = next(w for w in workers if w is not busy)

            answer = await console.drain(busy.id)
            assert answer == {"worker": busy.id, "running": 1, "retired": False, "keeping": 0}
            st = await console.status()
            assert st["draining"] == [busy.id] and st["retired"] == []
            assert "draining" in await console.run_command("status")

            # New work goes to the other worker only, while the drained one still runs.
            futures = cluster.map(add, range(20), range(20))
            assert await cluster.gather(futures) == [2 * i for i in range(20)]
            adds = await console.tasks(category="add", limit=0)
            assert len(adds) == 20 and {r.worker for r in adds} == {other.id}
            assert not busy.ended.is_set()
            story = await console.story(busy.id)
            assert [e[2] for e in story] == ["joined", "draining"]

            # Its task finishes: it is told to stop (Stop), ends, and leaves the cluster.
            opened.set()
            assert await blocked == 1
            await busy.ended.wait()
            st = await wait_until(
                lambda: _when(console.status(), lambda s: len(s["workers"]) == 1), "gone"
            )
            assert [w.worker_id for w in st["workers"]] == [other.id]
            story = await console.story(busy.id)
            # It alone held the result the client holds: copied to the other first.
            assert [e[2] for e in story] == [
                "joined",
                "draining",
                "keeping:1",
                "retired",
                "left:drained",
            ]
            assert not other.ended.is_set()
            # The cluster goes on with the other worker.
            assert await cluster.submit(add, 1, 2) == 3


@pytest.mark.anyio
async def test_draining_an_idle_worker_stops_it_and_unknown_workers_are_errors() -> None:
    with anyio.fail_after(LIMIT):
        async with nodes(2) as (address, workers), ConsoleClient(address) as console:
            text = await console.run_command(f"drain {workers[0].id}")
            assert "runs nothing: told to stop" in text
            await workers[0].ended.wait()
            assert not workers[1].ended.is_set()
            with pytest.raises(ValueError, match="no worker 'nobody'"):
                await console.execute("drain nobody")
            with pytest.raises(ConsoleError, match="usage: drain WORKER"):
                await console.execute("drain")


@pytest.mark.anyio
async def test_undrain_takes_a_draining_worker_back_and_it_takes_queued_tasks(gate: Any) -> None:
    """The only worker is drained while it runs a task; a task sent then waits in the
    queue (no worker takes new tasks). `undrain` takes the worker back before it was
    retired: it runs the queued task, is not stopped, and its story says so. Before,
    a drain could not be undone from the console: the worker was retired once its task
    ended and the queued task waited for a worker that never came."""
    with anyio.fail_after(LIMIT):
        async with (
            nodes(1) as (address, (worker,)),
            Cluster(address) as cluster,
            ConsoleClient(address) as console,
        ):
            await cluster.wait_for_workers(1)
            opened = gate("undrain")
            blocked = cluster.submit(gated, "undrain", 1)
            await wait_until(lambda: console.tasks(state="processing"), "running")
            await console.drain(worker.id)
            waiting = cluster.submit(add, 20, 22)
            await wait_until(lambda: console.tasks(state="queued"), "queued")

            text = await console.run_command(f"undrain {worker.id}")
            assert text == f"worker {worker.id} taken back: it takes new tasks again\n"
            st = await console.status()
            assert st["draining"] == [] and st["retired"] == []
            opened.set()
            assert await blocked == 1 and await waiting == 42
            (done,) = await console.tasks(category="add")
            assert done.worker == worker.id and not worker.ended.is_set()
            story = await console.story(worker.id)
            assert [e[2] for e in story] == ["joined", "draining", "undrained"]
            # It drains as any worker again, and can be taken back again, as JSON too.
            await console.drain(worker.id)
            answer = json.loads(await console.run_command(f"undrain {worker.id} --json"))
            assert answer == {"worker": worker.id, "undrained": True, "why": ""}
            assert await cluster.submit(add, 1, 2) == 3


@pytest.mark.anyio
async def test_undrain_of_an_unknown_or_undrainable_worker_is_a_clear_error() -> None:
    with anyio.fail_after(LIMIT):
        async with nodes(2) as (address, workers), ConsoleClient(address) as console:
            with pytest.raises(ValueError, match="no worker 'nobody' \\(known workers: "):
                await console.execute("undrain nobody")
            with pytest.raises(
                ConsoleError,
                match=f"undrain: worker {workers[0].id} cannot be taken back: it is not draining",
            ):
                await console.execute(f"undrain {workers[0].id}")
            with pytest.raises(ConsoleError, match="usage: undrain WORKER"):
                await console.execute("undrain")
            assert not workers[0].ended.is_set()


# ----------------------------------------------------------------------------- forget


@pytest.mark.anyio
async def test_forget_starts_a_category_afresh_and_an_unknown_one_is_a_clear_error() -> None:
    """User audit (memprio, defect 3): one oversized try kept its category's statistics
    (and its memory admission) for the manager's life, with no way to reset them. Now
    `forget CATEGORY` starts them afresh: the category's count is 0 in the status, the
    answer says what was forgotten; a category the scheduler does not know is an error
    that names the closest one; a read-only console may not (``MUTATING_COMMANDS``)."""
    with anyio.fail_after(LIMIT):
        async with (
            nodes(1) as (address, _),
            Cluster(address) as cluster,
            ConsoleClient(address) as console,
        ):
            await cluster.wait_for_workers(1)
            assert await cluster.gather(cluster.map(add, range(3), range(3))) == [0, 2, 4]
            assert (await console.status(0))["categories"]["add"]["count"] == 3
            text = await console.run_command("forget add")
            assert text.startswith("category add: statistics of 3 ok tries forgotten"), text
            st = await console.status(0)
            assert st["categories"]["add"]["count"] == 0
            assert st["categories"]["add"]["rss_rise"] == 0
            answer = json.loads(await console.run_command("forget add --json"))
            assert answer == {"category": "add", "count": 0, "rss_rise": 0, "max_rss_growth": 0}
            assert await cluster.submit(add, 1, 2) == 3  # learnt again
            assert (await console.status(0))["categories"]["add"]["count"] == 1
            with pytest.raises(ConsoleError, match="UnknownCategory: no task category 'ad' "):
                await console.execute("forget ad")
            with pytest.raises(ConsoleError, match="did you mean 'add'"):
                await console.forget_category("ad")
            with pytest.raises(ConsoleError, match="usage: forget CATEGORY"):
                await console.execute("forget")


# ----------------------------------------------------------------------------- scale


@pytest.mark.anyio
async def test_scale_without_an_autoscaler_is_a_clear_error() -> None:
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), ConsoleClient(address) as console:
            with pytest.raises(RuntimeError, match="no autoscaler"):
                await console.scale("default", 3)
            # a scaling policy needs pools, which come from the manager's --config
            with pytest.raises(RuntimeError, match=r"--config FILE .*configuration.md#pools"):
                await console.set_policy("scaling", "queue")
            with pytest.raises(ConsoleError, match="whole number"):
                await console.execute("scale default many")
            # more than a message carries: the range, not the codec's "see messages.py"
            with pytest.raises(ConsoleError, match=r"scale: .* blocks from 0 to 9,223,372,"):
                await console.execute("scale default 99999999999999999999999")


@pytest.mark.anyio
async def test_scale_changes_the_autoscaler_s_target() -> None:
    with anyio.fail_after(LIMIT):
        async with hosted(1) as (address, _), ConsoleClient(address) as console:
            assert await console.scale("default", 3) == {"default": 3}
            data = json.loads(await console.run_command("scale default 2 --json"))
            assert data == {"pool": "default", "target": 2, "asked": 2, "live": {"default": 2}}
            st = await wait_until(
                lambda: _when(console.status(), lambda s: len(s["workers"]) == 2), "2 workers"
            )
            assert st["autoscaler"]["targets"] == {"default": 2}


@pytest.mark.anyio
async def test_scale_keeps_a_configured_pools_target_within_its_limits() -> None:
    """`scale cpu 99999999999` with max_blocks 2 answered `target 99999999999` and the
    status and corral_blocks_target said so; `scale cpu 0` with min_blocks 1, 0."""
    limits = PoolLimits(min_blocks=1, max_blocks=2, init_blocks=1)
    with anyio.fail_after(LIMIT):
        async with hosted(1, limits=limits) as (address, _), ConsoleClient(address) as console:
            text = await console.run_command("scale default 99999999999")
            assert "target 2 block(s) (asked 99999999999: kept within its min_blocks" in text
            data = json.loads(await console.run_command("scale default 0 --json"))
            assert (data["target"], data["asked"]) == (1, 0)
            assert (await console.status())["autoscaler"]["targets"] == {"default": 1}


@pytest.mark.anyio
async def test_scale_counts_blocks_and_says_so() -> None:
    """A pool is sized in blocks: ``scale default 2`` with 2 workers a block keeps 2
    blocks, 4 workers; the answer says blocks, and counts blocks."""
    with anyio.fail_after(LIMIT):
        async with (
            hosted(1, workers_per_block=2) as (address, _),
            ConsoleClient(address) as console,
        ):
            text = await console.run_command("scale default 2")
            assert "target 2 block(s)" in text and "default: 2" in text, text
            assert "worker" not in text, text
            st = await wait_until(
                lambda: _when(console.status(), lambda s: len(s["workers"]) == 4), "4 workers"
            )
            assert st["autoscaler"]["targets"] == {"default": 2}
            assert "target blocks" in (await console.execute("status")).text(width=200)


# ----------------------------------------------------------------------------- move


@pytest.mark.anyio
async def test_move_sends_a_queued_task_to_a_pool_with_a_worker_and_its_dependent_runs(
    gate: Any,
) -> None:
    """A user audit: a queued task's pool could not be changed; cancelling it to submit
    it elsewhere failed its dependents. `move KEY --pool P` moves it (keys kept); a
    running task is left, saying so; an unknown pool is an error naming the pools."""
    with anyio.fail_after(LIMIT):
        async with cluster_and_console() as (cluster, console):
            await cluster.wait_for_workers(1)  # its pool: default
            opened = gate("move")
            running = cluster.submit(gated, "move", 1, pool="default")
            stuck = cluster.submit(add, 3, 4, pool="gpu")  # no worker: it waits
            after = cluster.submit(add, stuck, 1, pool="default")
            await wait_until(lambda: console.tasks(state="processing"), "running")
            await wait_until(lambda: _when(console.tasks(), lambda rs: len(rs) == 3), "all 3")
            with pytest.raises(ValueError, match=r"no pool 'defualt'.*did you mean 'default'"):
                await console.execute(f"move {stuck.key} --pool defualt")
            with pytest.raises(ConsoleError, match="give --pool POOL, --priority N or both"):
                await console.execute(f"move {stuck.key}")
            with pytest.raises(ValueError, match="unknown key 'nope'"):
                await console.execute("move nope --pool default")
            text = await console.run_command(f"move {stuck.key} {running.key} --pool default")
            lines = text.splitlines()
            assert lines[0] == "moved 1 task(s) to pool default"
            assert lines[1].startswith(f"  {running.key}: not moved: running on ")
            assert stuck.key in [r.key for r in await console.tasks(pool="default")]
            opened.set()
            assert await after == 8 and await stuck == 7
            story = [(t[1], t[2]) for t in await cluster.story(stuck.key)]
            assert ("pool", "gpu->default") in story


# ----------------------------------------------------------------------------- cancel


@pytest.mark.anyio
async def test_cancel_a_key_or_a_whole_run(gate: Any) -> None:
    with anyio.fail_after(LIMIT):
        async with cluster_and_console() as (cluster, console):
            opened = gate("cancel")
            blocked = cluster.submit(gated, "cancel", 1)
            after = cluster.submit(add, blocked, 1)
            await wait_until(lambda: console.tasks(state="processing"), "running")
            text = await console.run_command(f"cancel {blocked.key}")
            assert f"key {blocked.key}: 1 of 1 key(s) still to do; cancelled 1" in text
            with pytest.raises(CancelledError):
                await blocked
            with pytest.raises(CancelledError):
                await after  # what depends on it goes too
            opened.set()

            # A run: every key of it, by the run id `status` lists.
            opened2 = gate("cancel-run")
            graph = {
                "r-a": (gated, "cancel-run", 1),
                "r-b": (add, "r-a", 1),
                "r-c": (add, "r-b", 1),
            }
            futures = await cluster.submit_graph(graph, ["r-b", "r-c"])
            st = await console.status()
            run = list(st["recent_runs"])[-1]
            assert st["recent_runs"][run] == 3
            data = json.loads(await console.run_command(f"cancel {run} --json"))
            assert data["run"] == run and data["count"] == 3 and data["to_do"] == 3
            assert sorted(data["keys"]) == ["r-a", "r-b", "r-c"]
            for f in futures:
                with pytest.raises(CancelledError):
                    await f
            opened2.set()
            states = {r.key: r.state for r in await console.tasks(limit=0)}
            assert all(states.get(k, "cancelled") == "cancelled" for k in ("r-a", "r-b", "r-c"))

            with pytest.raises(ValueError, match="unknown key 'nope'"):
                await console.execute("cancel nope")
            with pytest.raises(ValueError, match="no run 'run-99'"):
                await console.execute("cancel run-99")
            with pytest.raises(ValueError, match="unknown key 'run-99'"):
                await console.execute("cancel --key run-99")
            with pytest.raises(ConsoleError, match="usage: cancel"):
                await console.execute("cancel")
            # Cluster still healthy.
            assert await cluster.submit(add, 2, 2) == 4


@pytest.mark.anyio
async def test_cancel_of_a_finished_run_says_nothing_was_left_to_cancel() -> None:
    """A soak audit: `cancel run-1` on a run finished long ago said "cancel requested
    for run run-1: 201 key(s)", though every task had finished. Now the scheduler
    counts, in the turn it cancels, the keys still to do, and the console says so."""
    with anyio.fail_after(LIMIT):
        async with cluster_and_console() as (cluster, console):
            graph = {"f-a": (add, 1, 1), "f-b": (add, "f-a", 1), "f-c": (add, "f-b", 1)}
            futures = await cluster.submit_graph(graph, ["f-b", "f-c"])
            assert [await f for f in futures] == [3, 4]
            run = list((await console.status())["recent_runs"])[-1]
            text = await console.run_command(f"cancel {run}")
            assert f"run {run}: 0 of 3 key(s) still to do; nothing cancelled" in text, text
            data = json.loads(await console.run_command(f"cancel --run {run} --json"))
            assert data["count"] == 3 and data["to_do"] == 0
            assert [await f for f in futures] == [3, 4]  # finished tasks are not affected


def test_the_cancel_line_says_what_was_still_to_do() -> None:
    from runtime.console import cancel_text

    data: dict[str, Any] = {"run": "run-1", "count": 201, "to_do": 0}
    assert cancel_text("run run-1", data) == (
        "run run-1: 0 of 201 key(s) still to do; nothing cancelled"
    )
    data["to_do"] = 5
    assert cancel_text("run run-1", data) == (
        "run run-1: 5 of 201 key(s) still to do; cancelled 5 (and what depends on them)"
    )
    # a manager older than the count says only how many keys it named
    assert cancel_text("key x", {"count": 1}) == "cancel requested for key x: 1 key(s)"


@pytest.mark.anyio
async def test_cancel_of_a_text_that_is_a_run_and_a_key_is_refused(gate: Any) -> None:
    """A user audit: with a task whose key is another run's id, `cancel run-N`
    cancelled that run (another user's task) and left the task shown as run-N running,
    without a word. Now the manager, which knows both, refuses it and cancels nothing;
    `cancel --key` and `cancel --run` say which."""
    with anyio.fail_after(LIMIT):
        async with cluster_and_console() as (cluster, console):
            opened = gate("both")
            (alice,) = await cluster.submit_graph({"alice-1": (gated, "both", 1)}, ["alice-1"])
            run = list((await console.status())["recent_runs"])[-1]
            (named,) = await cluster.submit_graph({run: (gated, "both", 2)}, [run])
            with pytest.raises(ValueError, match=rf"'{run}' is both a run id") as refused:
                await console.execute(f"cancel {run}")
            assert f"`cancel --run {run}`" in str(refused.value)
            assert f"`cancel --key {run}`" in str(refused.value)
            # nothing was cancelled (the scheduler answers in order after the manager)
            states = {r.key: r.state for r in await console.tasks(limit=0)}
            assert "cancelled" not in (states["alice-1"], states[run]), states
            assert not alice.done() and not named.done()

            text = await console.run_command(f"cancel --key {run}")
            assert f"key {run}: 1 of 1 key(s) still to do; cancelled 1" in text
            with pytest.raises(CancelledError):
                await named
            assert not alice.done()
            data = json.loads(await console.run_command(f"cancel --run {run} --json"))
            assert data["run"] == run and data["keys"] == ["alice-1"]
            with pytest.raises(CancelledError):
                await alice
            opened.set()
            # a text that is only a run id (or only a key) needs no flag
            gate("only-run")
            (last,) = await cluster.submit_graph({"r-x": (gated, "only-run", 3)}, ["r-x"])
            only_run = list((await console.status())["recent_runs"])[-1]
            text = await console.run_command(f"cancel {only_run}")
            assert f"run {only_run}: 1 of 1 key(s) still to do; cancelled 1" in text
            with pytest.raises(CancelledError):
                await last


def test_the_manager_remembers_the_latest_runs_within_bounds() -> None:
    from actors.manager import Manager

    def nothing() -> Any:
        return None

    m = Manager(nothing, nothing, nothing, lambda name: None, max_runs=3, max_run_keys=10)
    for i in range(5):
        m._remember_run(f"run-{i}", ("a", "b"))
    assert list(m.run_keys) == ["run-2", "run-3", "run-4"]
    m._remember_run("run-5", tuple(range(9)))  # 15 keys in all: the oldest runs go
    assert list(m.run_keys) == ["run-5"] and m._n_run_keys == 9
    m._remember_run("run-6", tuple(range(20)))  # over the bound alone: still kept
    assert list(m.run_keys) == ["run-6"] and m._n_run_keys == 20


class SuspendedProvider(Provider):
    """In-process blocks behind a batch system that stopped taking submissions (as
    SlurmProvider does after too many failed sbatch calls) until resumed."""

    def __init__(self, inner: InProcessProvider) -> None:
        self.inner = inner
        self.held = True
        self.refused = 0
        self.resumed = 0

    async def start_block(self, spec: BlockSpec) -> Block:
        if self.held:
            self.refused += 1
            raise SubmissionsSuspended(
                "Slurm", 3, 5, "'sbatch --parsable' failed with exit code 1: sbatch: error: "
                "Batch job submission failed: Unable to contact slurm controller",
            )  # fmt: skip
        return await self.inner.start_block(spec)

    async def stop_block(self, block: Block) -> None:
        await self.inner.stop_block(block)

    def poll(self, block: Block) -> BlockState:
        return self.inner.poll(block)

    async def wait_ended(self, block: Block) -> BlockState:
        return await self.inner.wait_ended(block)

    def resume(self) -> None:
        self.held = False
        self.resumed += 1

    def suspended(self) -> bool:
        return self.held


@pytest.mark.anyio
async def test_a_suspended_pool_shows_its_error_and_resume_brings_its_blocks() -> None:
    made: list[SuspendedProvider] = []

    def wrap(inner: InProcessProvider) -> Provider:
        made.append(SuspendedProvider(inner))
        return made[0]

    with anyio.fail_after(LIMIT):
        async with hosted(1, wrap=wrap) as (address, _), ConsoleClient(address) as console:
            (provider,) = made
            st = await wait_until(
                lambda: _when(
                    console.status(), lambda s: "default" in s["autoscaler"]["batch_errors"]
                ),
                "the error in status",
            )
            err = st["autoscaler"]["batch_errors"]["default"]
            assert err["suspended"] is True and err["command"] == "sbatch"
            assert "Unable to contact slurm controller" in err["error"]
            assert st["autoscaler"]["paused"] == ["default"]
            text = await console.run_command("status")
            assert "pool default: batch system error at" in text
            assert "suspended until an operator runs `resume default`" in text
            # Paused: not asked again (tests/test_autoscaler_preemption.py shows it over
            # time, with a virtual clock).
            assert provider.refused == 1 and not st["workers"]

            out = await console.run_command("resume default")
            assert "pool default resumed (it was paused); blocks now: 1" in out, out
            assert provider.resumed == 1
            st = await wait_until(
                lambda: _when(console.status(), lambda s: len(s["workers"]) == 1), "a worker"
            )
            assert st["autoscaler"]["batch_errors"] == {} and st["autoscaler"]["paused"] == []
            data = json.loads(await console.run_command("resume default --json"))
            assert data == {
                "pool": "default", "paused": False, "backing_off": False, "gave_up": False,
                "blocks": 1,
            }  # fmt: skip
            with pytest.raises(ValueError, match="no pool 'nope'"):
                await console.resume("nope")


def test_resume_says_how_the_pool_was_held_back_in_english() -> None:
    """Audit slurmscale F5: `resume scav` after the pool gave up printed `(it was gave
    up)`."""
    assert resumed_text("scav", {"gave_up": True, "blocks": 3}) == (
        "pool scav resumed (it had given up); blocks now: 3"
    )
    assert resumed_text("p", {"paused": True, "backing_off": True, "gave_up": True}) == (
        "pool p resumed (it was paused and backing off and had given up); blocks now: 0"
    )
    assert resumed_text("p", {"backing_off": True, "blocks": 1}) == (
        "pool p resumed (it was backing off); blocks now: 1"
    )
    assert resumed_text("p", {}) == "pool p resumed (it was not held back); blocks now: 0"


@pytest.mark.anyio
async def test_a_client_of_the_manager_warns_at_once_that_no_worker_is_there() -> None:
    """The physics audit: every worker died, none came, and the client printed nothing
    for 88 s (the CorralNoWorkers alert fires after 2 minutes; pending, it was an info
    line in the manager's log). Now the client warns at its next look at the alerts."""
    with anyio.fail_after(LIMIT), log_lines("corral.client", logging.WARNING) as log:
        async with (
            hosted(0, alerting={"interval": 0.1}) as (address, _),
            Cluster(address, manager_alerts=0.1) as cluster,
        ):
            fut = cluster.submit(operator.add, 1, 2)
            line = await wait_until(
                lambda: log.with_("no worker to run the ready tasks"), "the warning"
            )
            assert "pool='*'" in line and "ready=1" in line and "level='warning'" in line
            assert f"manager='{address}'" in line and "anyio.fail_after" in line
            assert not fut.done()


def test_a_no_workers_episode_is_told_once() -> None:
    def alert(state: str, since: float, name: str = "CorralNoWorkers") -> AlertInfo:
        return AlertInfo(name, state, {"pool": "p"}, value=3, active_since=since)  # type: ignore[arg-type]

    with log_lines("corral.client", logging.WARNING) as log:
        said = _no_workers_news([alert("pending", 1.0)], set(), "m")
        said = _no_workers_news([alert("pending", 1.0), alert("pending", 1.0, "X")], said, "m")
        told = [ln for ln in log.lines if "no worker" in ln]
        assert len(told) == 1 and "ready=3" in told[0] and "pool='p'" in told[0]
        said = _no_workers_news([alert("firing", 1.0)], said, "m")  # its own line says it
        assert said == set() and log.lines == told
        _no_workers_news([alert("pending", 9.0)], said, "m")  # a new episode
        assert len(log.lines) == 2 and "no worker" in log.lines[1]


MiB = 2**20


@pytest.mark.anyio
async def test_a_client_warns_once_that_memory_throttling_holds_its_tasks_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The physics audit: process workers at --memory 200MiB took 146.8 s for a run of 9
    s, throttled 18-20 times each; the workers warned in their logs, the user's script
    said nothing. Now the client warns, once an episode, when most workers were
    throttled long enough (here 0.3 s instead of 30) while its tasks wait. By
    construction: an in-process worker's governor reads this whole process's RSS,
    far past a 64 MiB limit's fences, so the root task waits."""
    monkeypatch.setattr(client_module, "THROTTLE_HINT_AFTER", 0.3)
    hint = "workers throttled for memory hold this client's tasks back"
    with anyio.fail_after(LIMIT), log_lines("corral.client", logging.WARNING) as log:
        async with (
            hosted(1, memory=64 * MiB, alerting={"interval": 0.1}) as (address, _),
            Cluster(address, manager_alerts=0.1) as cluster,
        ):

            async def throttled() -> bool:
                return bool((await cluster.status())["throttled"])

            await wait_until(throttled, "the worker throttled")
            fut = cluster.submit(operator.add, 1, 2)  # a root: a producer, held back
            line = await wait_until(lambda: log.with_(hint), "the throttle hint")
            assert not fut.done()
            (worker,) = (await cluster.status())["memory"]
            assert "level='warning'" in line and "throttled='1 of 1 workers'" in line
            assert f"{worker} (limit 64.0 MiB, " in line and "throttles at " in line
            assert "--memory" in line and "memory_per_worker" in line
            assert "docs/memory.md#the-floor-memory-that-is-not-outputs" in line
            assert "docs/memory.md#the-fences" in line and f"manager='{address}'" in line
            # Once for the episode: more looks, still throttled, nothing said again.
            looks = cluster._throttle.looks
            await wait_until(lambda: cluster._throttle.looks >= looks + 5, "five more looks")
            assert [ln for ln in log.lines if hint in ln] == [line]
            fut.cancel()


@pytest.mark.anyio
async def test_a_client_whose_workers_are_not_throttled_gets_no_throttle_hint(
    monkeypatch: pytest.MonkeyPatch, gate: Callable[[str], threading.Event]
) -> None:
    monkeypatch.setattr(client_module, "THROTTLE_HINT_AFTER", 0.0)
    opened = gate("unthrottled")
    with anyio.fail_after(LIMIT), log_lines("corral.client", logging.WARNING) as log:
        async with (
            hosted(1, alerting={"interval": 0.1}) as (address, _),
            Cluster(address, manager_alerts=0.1) as cluster,
        ):
            fut = cluster.submit(gated, "unthrottled", 7)
            # the looks made while the task waits (its worker runs it, unthrottled)
            await wait_until(lambda: cluster._throttle.looks >= 5, "five looks")
            opened.set()
            assert await fut.result() == 7
    assert not [ln for ln in log.lines if "throttled for memory" in ln], log.lines


def _status(throttled: dict[str, float], now_throttled: tuple[str, ...], n: int) -> StatusReply:
    workers = tuple(WorkerInfo(f"w{i}", 1, 200 * MiB) for i in range(n))
    memory = {
        w.worker_id: WorkerMemoryReport(
            w.worker_id, w.worker_id in now_throttled, 190 * MiB, 180 * MiB, 200 * MiB,
            floor=170 * MiB if w.worker_id == "w0" else 0,
        )
        for w in workers
    }  # fmt: skip
    return StatusReply(
        workers=workers, memory=memory, throttled=now_throttled, throttled_seconds=throttled
    )


def test_a_worker_past_its_limit_is_told_once_per_worker_episode() -> None:
    """The user audit: a Cluster(address) script whose task took a 600 MiB thread
    worker to 1.5 GiB printed nothing (the manager logged 25 warnings). At its looks
    while its tasks wait, the client logs each worker past its limit once, while it
    stays so; a worker that left and came back past it again is told again."""

    def status(peaks: dict[str, int]) -> StatusReply:
        memory = {
            w: WorkerMemoryReport(w, False, peak, 420 * MiB, 600 * MiB, past_peak=peak)
            for w, peak in peaks.items()
        }
        return StatusReply(memory=memory)

    with log_lines("corral.client", logging.WARNING) as log:
        said = _past_limit_news(set(), status({"w0": 0, "w1": 0}), "m")
        assert said == set() and log.lines == []
        said = _past_limit_news(said, status({"w0": 612 * MiB, "w1": 0}), "m")
        (line,) = log.lines
        assert "a worker ran past its memory limit" in line and "worker='w0'" in line
        assert "limit='600.0 MiB'" in line and "peak='612.0 MiB'" in line
        assert "execution 'process'" in line
        for peak in range(642, 1600, 30):  # higher and higher: said already
            said = _past_limit_news(said, status({"w0": peak * MiB, "w1": 0}), "m")
        assert said == {"w0"} and len(log.lines) == 1
        said = _past_limit_news(said, None, "m")  # nothing waits: nothing said
        said = _past_limit_news(said, status({"w1": 0}), "m")  # w0 left
        said = _past_limit_news(said, status({"w0": 1024 * MiB, "w1": 0}), "m")
        assert len(log.lines) == 2 and "peak='1.00 GiB'" in log.lines[1]


def test_a_worker_whose_memory_came_back_down_is_not_told_of_to_a_new_client() -> None:
    """User audit "pools", finding 5: a thread worker went to 870 MiB of its 512 MiB
    minutes before; its past_peak stays while it is connected, but its latest memory
    report has it at 65 MiB, not throttled. A client connecting now says nothing of it;
    while it is still throttled, or back past its terminate fence, it is told of."""

    def status(rss: int, throttled: bool) -> StatusReply:
        report = WorkerMemoryReport(
            "cpu-1.0", throttled, rss, 358 * MiB, 512 * MiB, past_peak=870 * MiB,
            terminate_at=int(0.95 * 512 * MiB),
        )  # fmt: skip
        return StatusReply(memory={"cpu-1.0": report})

    with log_lines("corral.client", logging.WARNING) as log:
        assert _past_limit_news(set(), status(65 * MiB, False), "m") == set()
        assert log.lines == []
        assert _past_limit_news(set(), status(400 * MiB, True), "m") == {"cpu-1.0"}
        assert _past_limit_news(set(), status(500 * MiB, False), "m") == {"cpu-1.0"}
        assert len(log.lines) == 2 and "worker='cpu-1.0'" in log.lines[0]


def test_a_worker_past_its_limit_is_still_high_by_its_own_terminate_fence() -> None:
    """Review 1207b, finding 7: whether a worker past its limit is still high was its
    RSS against the default terminate fence (95% of its limit), not its own: a worker
    with ``terminate = 0.8`` (``memory_options``) at 85% of its limit, no longer
    throttled, was not told of. Now its memory report carries its fence
    (``terminate_at``); with the fence off (or not told) its limit is the mark."""

    def status(rss: int, terminate_at: int | None, throttled: bool = False) -> StatusReply:
        report = WorkerMemoryReport(
            "w0", throttled, rss, 358 * MiB, 1000 * MiB, past_peak=1100 * MiB,
            terminate_at=terminate_at,
        )  # fmt: skip
        return StatusReply(memory={"w0": report})

    with log_lines("corral.client", logging.WARNING) as log:
        # terminate = 0.8: at 850 MiB of 1000 it is past its fence, under the default's
        assert _past_limit_news(set(), status(850 * MiB, 800 * MiB), "m") == {"w0"}
        assert _past_limit_news(set(), status(790 * MiB, 800 * MiB), "m") == set()
        # terminate = 0.99: at 960 MiB (past the default's 950) it is under its own
        assert _past_limit_news(set(), status(960 * MiB, 990 * MiB), "m") == set()
        # terminate off (or not told): its limit; throttled, it is still high
        assert _past_limit_news(set(), status(999 * MiB, None), "m") == set()
        assert _past_limit_news(set(), status(1000 * MiB, None), "m") == {"w0"}
        assert _past_limit_news(set(), status(999 * MiB, None, True), "m") == {"w0"}
        assert len(log.lines) == 3 and all("worker='w0'" in ln for ln in log.lines)


def test_a_throttle_episode_is_told_once_and_only_when_most_workers_are_held() -> None:
    """The hint's pure rule: throttled seconds gained since the episode began (the
    first look with tasks waiting), by more than half of the workers present."""
    hint = "throttled for memory"
    with log_lines("corral.client", logging.WARNING) as log:
        w = _ThrottleWatch()
        assert not _throttle_news(w, _status({"w0": 100.0}, ("w0",), 2), 0.0, "m", 30)
        # w0 throttled 40 s since (its 100 s before the episode do not count), w1 20 s:
        # one of two workers is not most of them
        st = _status({"w0": 140.0, "w1": 20.0}, ("w0", "w1"), 2)
        assert not _throttle_news(w, st, 40.0, "m", 30)
        st = _status({"w0": 150.0, "w1": 31.0}, ("w0",), 2)
        assert _throttle_news(w, st, 50.0, "m", 30)
        (line,) = log.lines
        assert "throttled='2 of 2 workers'" in line and "waited=50" in line
        assert (
            "w0 (limit 200.0 MiB, floor 170.0 MiB, throttles at 180.0 MiB, throttled 50 s)" in line
        )
        assert "w1 (limit 200.0 MiB, floor under its resume mark" in line
        # the same episode: not again
        st = _status({"w0": 160.0, "w1": 41.0}, ("w0", "w1"), 2)
        assert not _throttle_news(w, st, 60.0, "m", 30)
        # no throttle since the last look: the episode is over; a new one counts anew
        assert not _throttle_news(w, _status({"w0": 160.0, "w1": 41.0}, (), 2), 70.0, "m", 30)
        st = _status({"w0": 180.0, "w1": 61.0}, ("w0", "w1"), 2)
        assert not _throttle_news(w, st, 90.0, "m", 30)  # 20 s each of the new episode
        st = _status({"w0": 200.0, "w1": 81.0}, ("w0", "w1"), 2)
        assert _throttle_news(w, st, 110.0, "m", 30) and len(log.lines) == 2
        # nothing waits: over too; the next wait begins another
        assert not _throttle_news(w, None, 120.0, "m", 30)
        assert w.start is None and not w.told
        assert [ln for ln in log.lines if hint in ln] == log.lines


def test_the_throttle_hint_counts_the_workers_of_the_pools_the_client_waits_on() -> None:
    """The diskfull audit: a client whose tasks wait on pool "spill", whose only worker
    was throttled, was never told (1 of 3 workers is not most of them: two workers of
    pool "default" idled). It counts the workers of the pools its waiting tasks were
    submitted to; a task of any pool counts every worker, as before."""
    workers = (
        WorkerInfo("w4", 1, 200 * MiB, pool="spill"),
        WorkerInfo("w1", 1, 200 * MiB),
        WorkerInfo("w2", 1, 200 * MiB),
    )
    memory = {"w4": WorkerMemoryReport("w4", True, 190 * MiB, 180 * MiB, 200 * MiB)}

    def reply(seconds: float) -> StatusReply:
        return StatusReply(
            workers=workers, memory=memory, throttled=("w4",), throttled_seconds={"w4": seconds}
        )

    with log_lines("corral.client", logging.WARNING) as log:
        for pools in (None, {"spill", None}, {"spill"}):
            w = _ThrottleWatch()
            assert not _throttle_news(w, reply(0.0), 0.0, "m", 30, pools=pools)
            told = _throttle_news(w, reply(40.0), 40.0, "m", 30, pools=pools)
            assert told == (pools == {"spill"})
        (line,) = log.lines
        assert "throttled='1 of 1 workers of pool spill'" in line and "w4 (limit" in line


@pytest.mark.anyio
async def test_a_client_that_leaves_its_policy_on_a_shared_manager_says_so() -> None:
    """A user on a shared manager set the retry policy, and every later run had it,
    silently. Now the manager's log says which client set a policy (a warning while
    other clients are connected; info for a client alone), and a client that closes
    while a policy it set is in force warns with the call that sets it back."""
    with anyio.fail_after(LIMIT), log_lines("corral", logging.INFO) as log:
        async with hosted(1) as (address, _):
            async with Cluster(address, manager_alerts=None) as cluster:
                await cluster.set_policy("retry", "default", max_crashes=5)
                name = cluster._client_actor.name
                set_line = log.with_("policy changed", "max_crashes")
                assert set_line is not None and f"by='{name}'" in set_line
                # alone on the manager: its own change, at info, naming the client
                assert "level='info'" in set_line and "others=" not in set_line
                assert f"client='{client_name(name)}'" in set_line
            line = log.with_("a policy this client set stays in force")
            assert line is not None and "level='warning'" in line
            assert "kind='retry'" in line and "name='default'" in line
            assert "'max_crashes': 5" in line
            assert "To set it back: await cluster.set_policy('retry', 'default')" in line
            assert "console: policy set retry default)" in line
            # Changed since by another client, or set back: nothing to say.
            async with Cluster(address, manager_alerts=None) as first:
                await first.set_policy("placement", "round-robin")
                async with Cluster(address, manager_alerts=None) as second:
                    await second.set_policy("placement", "locality")
                    # first is connected: a warning (the manager logs warnings by
                    # default) says who changed its policy
                    by = second._client_actor.name
                    changed = log.with_("policy changed", f"by='{by}'")
                    assert changed is not None and "level='warning'" in changed, log.lines
                    assert "others=1" in changed and "name='locality'" in changed
                    await second.set_policy("retry", "default", max_crashes=1)
                    await second.set_policy("retry", "default", max_crashes=5)
            told = [ln for ln in log.lines if "stays in force" in ln]
            assert len(told) == 2 and told[0] == line  # the second client's, of placement:
            assert "kind='placement'" in told[1] and "name='locality'" in told[1]
            assert "await cluster.set_policy('placement', 'round-robin')" in told[1]


@pytest.mark.anyio
async def test_a_policy_set_on_its_own_embedded_cluster_is_no_warning() -> None:
    """The README's first example set a policy on its own embedded cluster and got a
    ``policy changed`` WARNING, meant for the other clients of a shared manager: its
    own change, with no other client, is logged at info."""
    with anyio.fail_after(LIMIT), log_lines("corral", logging.INFO) as log:
        async with Cluster(workers=1) as cluster:
            await cluster.set_policy("placement", "round-robin")
            line = log.with_("policy changed", "round-robin")
            assert line is not None and "level='info'" in line, log.lines
            assert f"by='{cluster._client_actor.name}'" in line


def test_the_policies_left_in_force_are_told_with_the_call_that_sets_them_back() -> None:
    before = PolicyInfo("retry", "default", params={"max_lost": 20, "pool": "gpu"})
    mine = PolicyInfo("retry", "default", params={"max_crashes": 5})
    other = PolicyInfo("placement", "round-robin")
    with log_lines("corral.client", logging.WARNING) as log:
        told = _policies_left_news(
            {"retry": (before, mine), "placement": (None, other)}, [mine], "m"
        )
        assert told == ["retry"]  # placement: no longer in force
        (line,) = log.lines
        assert "await cluster.set_policy('retry', 'default', max_lost=20, pool='gpu')" in line
        assert "(console: policy set retry default max_lost=20 pool=gpu)" in line
        assert _policies_left_news({"placement": (None, other)}, [other], "m") == ["placement"]
        assert "the policy in force before it is not known" in log.lines[1]


@pytest.mark.anyio
async def test_a_client_of_the_manager_logs_that_its_pool_is_suspended() -> None:
    """A script waiting on a task of a suspended pool says why it waits: its client
    logs the manager's CorralPoolSuspended alert as it fires, and as it resolves once
    an operator resumes the pool; the task then runs."""
    made: list[SuspendedProvider] = []

    def wrap(inner: InProcessProvider) -> Provider:
        made.append(SuspendedProvider(inner))
        return made[0]

    with anyio.fail_after(LIMIT), log_lines("corral.client") as log:
        async with (
            hosted(1, wrap=wrap, alerting={"interval": 0.1}) as (address, _),
            Cluster(address, manager_alerts=0.1) as cluster,
        ):
            fut = cluster.submit(operator.add, 1, 2)
            fired = await wait_until(
                lambda: log.with_("alert firing", "CorralPoolSuspended"), "the alert logged"
            )
            assert "pool='default'" in fired and "priority='P2'" in fired
            assert "summary='Pool default asks for no block until an operator resumes it'" in fired
            assert f"manager='{address}'" in fired
            assert not fut.done()
            async with ConsoleClient(address) as console:
                listed = json.loads(await console.run_command("alert list --json"))["alerts"]
                (alert,) = [a for a in listed if a["name"] == "CorralPoolSuspended"]
                assert alert["annotations"]["description"].endswith(
                    "Why: its batch system refused its submissions: the Slurm provider stopped "
                    "submitting blocks: 3 of its last 5 submissions failed (the last: 'sbatch "
                    "--parsable' failed with exit code 1: sbatch: error: Batch job submission "
                    "failed: Unable to contact slurm controller). Fix the cause, then run "
                    "`resume POOL` in the console (or call the provider's resume() if you drive "
                    "it from Python); until then no block is requested."
                )
                await console.run_command("resume default")
            assert await fut == 3
            await wait_until(
                lambda: log.with_("alert resolved", "CorralPoolSuspended"), "the alert resolved"
            )
            assert made[0].resumed == 1


# ----------------------------------------------------------------------------- roles


READ_ONLY_COMMANDS = ("status", "tasks", "story {key}", "policy list", "policy", "help")
MUTATING_COMMANDS = (
    "policy set placement round-robin",
    "drain {worker}",
    "undrain {worker}",
    "scale default 5",
    "resume default",
    "forget ro",
    "cancel {key}",
)


async def _check_read_only(console: ConsoleClient, worker: str, key: str) -> None:
    """Read commands work; mutating ones fail with PermissionDenied and change nothing."""
    for command in READ_ONLY_COMMANDS:
        line = command.format(key=key)
        await console.execute(line)
        json.loads(await console.run_command(f"{line} --json"))
    before = await console.status()
    for line in MUTATING_COMMANDS:
        with pytest.raises(PermissionDenied, match="needs the admin token"):
            await console.execute(line.format(worker=worker, key=key))
    with pytest.raises(PermissionDenied, match="SetPolicyRequest needs the admin token"):
        await console.set_policy("placement", "round-robin")
    after = await console.status()
    assert after["policies"] == before["policies"]
    assert after["draining"] == [] and after["workers"] == before["workers"]
    assert after.get("autoscaler") == before.get("autoscaler")
    assert {r.key: r.state for r in await console.tasks(limit=0)}[key] == "processing"
    assert not console.closed  # a refusal does not end the connection


@pytest.mark.anyio
async def test_a_read_only_console_can_look_but_not_change(gate: Any) -> None:
    """The gateway's read-only guard, with the role set on the connection (as a
    token-checking transport does), over inproc with the codec."""
    with anyio.fail_after(LIMIT):
        async with hosted(1, role="read") as (address, plane):
            # Clients need the admin role: submit through the control plane directly.
            opened = gate("read-only")
            from runtime.graph import Task
            from runtime.messages import SubmitGraphRequest

            graph = {"ro": Task("ro", gated, "read-only", 1)}
            await plane.manager.ask(SubmitGraphRequest(graph, ("ro",), "test-client"))
            async with ConsoleClient(address, read_only=True) as console:
                st = await wait_until(
                    lambda: _when(
                        console.status(), lambda s: s["tasks_by_state"].get("processing")
                    ),
                    "running",
                )
                worker = st["workers"][0].worker_id
                await _check_read_only(console, worker, "ro")
            opened.set()


# ----------------------------------------------------------------------------- the shell


@pytest.mark.anyio
async def test_the_shell_runs_lines_prints_errors_and_completes_words() -> None:
    import io

    from rich.console import Console

    with anyio.fail_after(LIMIT):
        async with (
            nodes(2) as (address, workers),
            Cluster(address) as cluster,
            ConsoleClient(address) as console,
        ):
            await cluster.wait_for_workers(2)
            futures = cluster.map(add, range(3), range(3))
            await cluster.gather(futures)
            buf = io.StringIO()
            shell = ConsoleShell(
                console, anyio.from_thread.run, console=Console(file=buf, width=120)
            )

            async def line(text: str) -> tuple[bool, str]:
                buf.seek(0)
                buf.truncate()
                stop = await anyio.to_thread.run_sync(shell.onecmd, text)
                stop = shell.postcmd(stop, text)
                return stop, buf.getvalue()

            await anyio.to_thread.run_sync(shell.refresh)
            stop, out = await line("status")
            assert not stop and all(w.id in out for w in workers) and "policies" in out
            stop, out = await line("tasks --state memory")
            assert not stop and all(f.key in out for f in futures)
            stop, out = await line("tasks --json")
            assert {r["key"] for r in json.loads(out)} == {f.key for f in futures}
            stop, out = await line(f"story {futures[0].key}")
            assert "processing" in out and "memory" in out
            stop, out = await line("policy list")
            assert "round-robin" in out

            # Errors: one line, and the shell goes on.
            stop, out = await line("frobnicate")
            assert not stop and out.startswith("error: ConsoleError: unknown command 'frobnicate'")
            assert out.count("\n") == 1
            stop, out = await line("drain nobody")
            assert not stop and out.startswith("error: ") and "no worker 'nobody'" in out
            stop, out = await line("undrain nobody")
            assert not stop and out.startswith("error: ") and "no worker 'nobody'" in out
            assert out.count("\n") == 1 and "Traceback" not in out
            stop, out = await line("stauts")
            assert "did you mean status or story?" in out
            stop, out = await line("")
            assert not stop and out == ""

            stop, out = await line("help")
            assert all(COMMANDS[c][0] in out for c in COMMANDS)
            stop, out = await line("help drain")
            assert out.startswith("drain WORKER")

            # Completion: commands, then each command's words.
            assert shell.completenames("st") == ["status", "story"]
            assert shell.completenames("ex") == ["exit"]
            assert shell.completedefault("", "policy ", 7, 7) == ["list", "set"]
            assert shell.completedefault("", "policy set ", 11, 11) == [
                "memory", "placement", "priority", "replication", "retry", "speculation",
            ]  # fmt: skip
            assert shell.completedefault("r", "policy set placement r", 21, 22) == ["round-robin"]
            assert sorted(shell.completedefault("", "drain ", 6, 6)) == sorted(
                w.id for w in workers
            )
            assert sorted(shell.completedefault("", "undrain ", 8, 8)) == sorted(
                w.id for w in workers
            )
            assert shell.completedefault("", "scale ", 6, 6) == ["default"]
            assert shell.completedefault("--s", "tasks --s", 6, 9) == ["--state"]
            assert shell.completedefault("me", "tasks --state me", 14, 16) == ["memory"]
            assert shell.completedefault("", "tasks --category ", 17, 17) == ["add"]
            keys = shell.completedefault("", "story ", 6, 6)
            assert {f.key for f in futures} <= set(keys)
            assert shell.completedefault("", "cancel ", 7, 7)[:2] == ["--key", "--run"]

            assert (await line("quit"))[0] is True
            assert (await line("exit"))[0] is True
            stop, out = await line("EOF")  # Ctrl-D
            assert stop is True


@pytest.mark.anyio
async def test_the_shell_leaves_when_the_manager_goes_away() -> None:
    import io

    from rich.console import Console

    found = anyio.Event()
    where: dict[str, str] = {}

    def ready(addr: str, tokens: Tokens) -> None:
        where["manager"] = addr
        found.set()

    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            manager = anyio.CancelScope()

            async def run() -> None:
                with manager:
                    await run_manager("inproc://", ready=ready, listen_options={"codec": True})

            tg.start_soon(run)
            await found.wait()
            async with ConsoleClient(where["manager"]) as console:
                buf = io.StringIO()
                shell = ConsoleShell(
                    console, anyio.from_thread.run, console=Console(file=buf, width=120)
                )
                assert await anyio.to_thread.run_sync(shell.onecmd, "status") is False

                def looped(lines: str) -> ConsoleShell:
                    return ConsoleShell(
                        console, anyio.from_thread.run, console=Console(file=io.StringIO()),
                        stdin=io.StringIO(lines), stdout=io.StringIO(),
                    )  # fmt: skip

                # quit (or Ctrl-D) is exit code 0
                assert await anyio.to_thread.run_sync(looped("status\nquit\n").loop) == 0
                assert await anyio.to_thread.run_sync(looped("status\n").loop) == 0  # EOF
                manager.cancel()  # the manager goes away
                await wait_until(lambda: _true(console.closed), "closed")
                # a lost connection is a failure: exit code 1 (before, 0); a cancelled
                # manager says goodbye first, and the console says why
                lost = looped("status\nstatus\n")
                assert await anyio.to_thread.run_sync(lost.loop) == 1
                gone = "stopped on purpose (cancelled by the program that runs it); leaving\n"
                assert lost.out.file.getvalue().endswith(gone), lost.out.file.getvalue()
                buf.seek(0)
                buf.truncate()
                # a command the lost connection fails: one line, the leaving one (it
                # was an `error: CorralError: ...closed` line, then that one)
                stop = await anyio.to_thread.run_sync(shell.onecmd, "status")
                assert stop is False and buf.getvalue() == ""
                assert shell.postcmd(stop, "status") is True
                assert buf.getvalue().endswith(gone), buf.getvalue()
                assert shell.exit_code == 1


async def _true(value: bool) -> bool:
    return value


class PtyShell:
    """``python -m runtime console ADDRESS`` as an operator runs it: the interactive
    shell on a terminal (a pty: readline reads the lines), started with ``cli``'s
    environment. :meth:`until` reads what it printed up to a text, bounded."""

    def __init__(self, cli: Cli, address: str, *flags: str) -> None:
        import pty

        self.fd, terminal = pty.openpty()
        env = {k: v for k, v in cli.env.items() if k != "CORRAL_TOKEN"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runtime", "console", address, *flags],
            stdin=terminal, stdout=terminal, stderr=terminal, env=env, cwd=ROOT,
        )  # fmt: skip
        os.close(terminal)
        cli.procs.append(self.proc)  # ended with the others (SIGTERM) if still running
        self.seen = ""  #: everything it printed so far
        self.read = 0  #: how much of it until() returned

    def until(self, text: str, limit: float = LIMIT) -> str:
        """What it printed after what the last call returned, up to and with ``text``."""
        import select

        deadline = time.monotonic() + limit
        while text not in self.seen[self.read :]:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                raise AssertionError(f"no {text!r} within {limit} s: {self.seen[-2000:]!r}")
            try:
                chunk = os.read(self.fd, 4096)
            except OSError:  # EIO: the shell has ended and closed the terminal
                chunk = b""
            if not chunk:
                raise AssertionError(f"ended before {text!r}: {self.seen[-2000:]!r}")
            self.seen += chunk.decode(errors="replace").replace("\r\n", "\n")
        start, self.read = self.read, self.seen.index(text, self.read) + len(text)
        return self.seen[start : self.read]

    def line(self, line: str) -> str:
        """Type ``line``; what it printed up to the next prompt."""
        os.write(self.fd, line.encode() + b"\r")
        return self.until("corral> ")

    def ended(self, limit: float = LIMIT) -> int:
        """Its exit code, once it has ended (within ``limit`` s)."""
        code = self.proc.wait(limit)
        os.close(self.fd)
        return code


def test_the_shell_leaves_at_the_prompt_when_the_manager_goes_away(tmp_path: Path) -> None:
    """A user audit: the shell waiting at `corral>` stayed silent after the manager
    was stopped (SIGTERM) until a command was typed. It says so at once, at the prompt
    (with the manager's word that it stopped on purpose), and ends with exit code 1. A
    read-only shell that the manager closes after too many refused commands says why,
    in one line: no transport log line, no error line besides."""
    with Cli(tmp_path) as cli:
        manager, address = cli.manager()
        admin = PtyShell(cli, address)
        admin.until("corral> ")
        looker = PtyShell(cli, address, "--read-only")
        looker.until("corral> ")
        for _ in range(10):  # MAX_REFUSED: refused, and the shell goes on
            assert "error: PermissionDenied: DrainRequest needs" in looker.line("drain w")
        os.write(looker.fd, b"drain w\r")
        said = looker.until("; leaving\n")
        assert looker.ended() == 1
        lines = [line for line in said.splitlines() if line.strip()]
        assert lines[0].endswith("drain w") and len(lines) == 2, said  # the echo, one line
        assert lines[1].startswith(
            "the connection to the manager closed: PermissionDenied: closed after 11 "
            "refused messages"
        ), said
        assert "level=" not in looker.seen and "error:" not in lines[1], looker.seen

        assert "worker" in admin.line("status")
        cli.stop([manager])  # SIGTERM; the shell waits at the prompt
        said = admin.until("; leaving\n")
        assert admin.ended() == 1
        assert [line for line in said.splitlines() if line.strip()] == [
            f"the connection to the manager closed: the manager at {address} "
            "stopped on purpose (SIGINT, SIGTERM or SIGHUP); leaving"
        ], said


def test_the_shell_leaves_a_frozen_manager_in_one_line(tmp_path: Path) -> None:
    """A user audit: with the manager frozen (SIGSTOP), the shell printed the
    transport's `peer silent; closing` log line, then `error: CorralError: ...closed`,
    then the leaving line. It says one line, with the reason, once the manager has
    been silent for DEAD_AFTER (10 s), and ends with exit code 1."""
    with Cli(tmp_path) as cli:
        manager, address = cli.manager()
        shell = PtyShell(cli, address)
        shell.until("corral> ")
        manager.send_signal(signal.SIGSTOP)
        said = shell.until("; leaving\n", limit=DEAD_AFTER + LIMIT)
        assert shell.ended() == 1
        (line,) = [line for line in said.splitlines() if line.strip()]
        assert line.startswith("the connection to the manager closed: no message for "), said
        assert line.endswith(" s (dead peer); leaving") and "level=" not in shell.seen, said


# ----------------------------------------------------------------------------- the CLI


def test_the_command_line_parses_options_before_and_after_the_address() -> None:
    from runtime.__main__ import build_parser

    parser = build_parser()
    args = parser.parse_args(["console", "--token", "T", "ws://h:1", "tasks", "--state", "memory"])
    assert args.command == "console" and args.address == "ws://h:1" and args.token == "T"
    assert args.words == ["tasks", "--state", "memory"]
    args = parser.parse_args(["console", "ws://h:1", "status", "--json", "--read-only"])
    words, found = split_cli_options(args.words)
    assert words == ["status"] and found == {"as_json": True, "read_only": True}
    words, found = split_cli_options(["--token=abc", "drain", "w", "--token", "xyz"])
    assert words == ["drain", "w"] and found == {"token": "xyz"}
    assert parser.parse_args(["console", "ws://h:1"]).words == []


def test_console_help_lists_every_command_of_the_shells_help(capsys: Any) -> None:
    """``console --help`` lists the commands from the table the shell's ``help`` shows:
    every one (undrain and forget too), with its verbs (policy set, alert watch)."""
    from runtime.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["console", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    listed = text.split("Commands: ", 1)[1].split(".", 1)[0].split(", ")
    assert listed == [
        "status", "config", "tasks", "story", "policy list", "policy set", "drain", "undrain",
        "forget", "scale", "resume", "alert list", "alert watch", "alert add",
        "alert remove", "cancel", "move", "help", "quit",
    ]  # fmt: skip
    assert {form.split()[0] for form in listed} == set(COMMANDS)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "argv",
    [
        ["console", "inproc://nobody-listens-here", "--log-level", "debug", "status"],
        ["console", "inproc://nobody-listens-here", "status", "--log-level=DEBUG"],
        ["console", "--log-level", "debug", "inproc://nobody-listens-here", "status"],
    ],
)
async def test_log_level_goes_before_or_after_the_address(capsys: Any, argv: list[str]) -> None:
    """``--log-level`` is taken where --token, --read-only and --json are: before the
    address, after it, or after the command; not read as a command or its argument."""
    import logging

    from runtime.__main__ import main

    with anyio.fail_after(LIMIT):
        code = await anyio.to_thread.run_sync(main, argv)
    assert logging.getLogger("corral").level == logging.DEBUG
    err = capsys.readouterr().err
    assert code == 1 and "nobody-listens-here" in err.splitlines()[-1], err
    assert "--log-level" not in err and "takes no arguments" not in err
    with pytest.raises(ConsoleError, match=r"--log-level: choose from debug, info"):
        split_cli_options(["status", "--log-level", "loud"])
    with pytest.raises(ConsoleError, match=r"--log-level needs a value"):
        split_cli_options(["status", "--log-level"])


@pytest.mark.anyio
async def test_one_shot_errors_print_one_line_and_exit_1(capsys: Any) -> None:
    from runtime.__main__ import main

    with anyio.fail_after(LIMIT):
        code = await anyio.to_thread.run_sync(
            main, ["console", "inproc://nobody-listens-here", "status"]
        )
    assert code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "nobody-listens-here" in err


@pytest.mark.anyio
async def test_a_one_shot_command_quoted_as_one_argument_is_said_to_be(capsys: Any) -> None:
    """``console ADDRESS "status --bogus"`` said ``unknown command "'status"``, the quote
    that joining the words added hiding the real mistake (the quoting). It names the
    command as typed and says to pass its words unquoted, before connecting."""
    from runtime.__main__ import main

    for words in (["status --bogus"], ["tasks --limit 5", "--json"]):
        with anyio.fail_after(LIMIT):
            code = await anyio.to_thread.run_sync(
                main, ["console", "inproc://nobody-listens-here", *words]
            )
        assert code == 1
        err = capsys.readouterr().err
        assert err.startswith(
            f'error: ConsoleError: unknown command "{words[0]}": the command and its words '
            "came as one quoted argument; pass them as separate words"
        ), err
        assert f"(console ADDRESS {words[0]})" in err and "nobody-listens-here" not in err


# ----------------------------------------------------------------------------- websockets
# Over the websocket transport (transport/ws.py) with real tokens and the token file.


@pytest.fixture
def tokens(tmp_path: Path, monkeypatch: Any) -> Tokens:
    """Tokens for a ``ws://`` manager (``ws_nodes``), with a fresh ``CORRAL_HOME`` for
    its token file and no ``CORRAL_TOKEN``."""
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path))
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    return Tokens("admin-" + "a" * 20, "read-" + "r" * 20)


@pytest.mark.anyio
async def test_a_closed_pipe_ends_the_console_quietly(tokens: Tokens) -> None:
    """``console ADDRESS tasks | head -4``: once what stdout goes to is closed, the
    console ends as cat or grep do (exit 141, 128 + SIGPIPE) and prints nothing on
    stderr, not ``error: BrokenPipeError`` (nor Python's complaint at exit), tables and
    JSON alike."""

    def console(address: str, *words: str) -> subprocess.CompletedProcess[str]:
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first line is written
        try:
            return subprocess.run(
                [sys.executable, "-m", "runtime", "console", address, *words],
                stdout=write, stderr=subprocess.PIPE, text=True, timeout=LIMIT, cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )  # fmt: skip
        finally:
            os.close(write)

    with anyio.fail_after(2 * LIMIT):
        async with (
            ws_nodes(1, tokens) as (address, _),
            Cluster(address, token=tokens.admin) as cluster,
        ):
            assert await cluster.gather(cluster.map(operator.neg, range(5))) == [0, -1, -2, -3, -4]
            table = await anyio.to_thread.run_sync(console, address, "tasks")
            as_json = await anyio.to_thread.run_sync(console, address, "tasks", "--json")
    assert (table.returncode, table.stderr) == (141, "")
    assert (as_json.returncode, as_json.stderr) == (141, "")


@pytest.mark.anyio
async def test_ws_read_only_token_can_look_but_not_change(gate: Any, tokens: Tokens) -> None:
    with anyio.fail_after(LIMIT):
        async with (
            ws_nodes(1, tokens) as (address, (worker,)),
            Cluster(address, token=tokens.admin) as cluster,
        ):
            opened = gate("ws-read-only")
            blocked = cluster.submit(gated, "ws-read-only", 5)
            # --read-only: the read token from the token file the manager wrote.
            async with ConsoleClient(address, read_only=True) as console:
                await wait_until(lambda: console.tasks(state="processing"), "running")
                await _check_read_only(console, worker.id, blocked.key)
            # The same with the token given explicitly.
            async with ConsoleClient(address, token=tokens.read) as console:
                with pytest.raises(PermissionDenied):
                    await console.drain(worker.id)
            # The admin token (the default from the token file) may change things.
            async with ConsoleClient(address) as console:
                info = await console.set_policy("placement", "round-robin")
                assert info.name == "round-robin"
            opened.set()
            assert await blocked == 5


@pytest.mark.anyio
async def test_a_worker_that_left_is_not_logged_as_a_lost_connection(tokens: Tokens) -> None:
    """A drained worker says WorkerGone, then its connection closes: the manager logs
    its end at info at once (its id is free then), not the warning of a lost worker
    (before, every clean departure was followed by ``worker connection lost``)."""
    with anyio.fail_after(LIMIT), log_lines("corral.node") as log:
        async with ws_nodes(1, tokens) as (address, (worker,)):
            async with ConsoleClient(address) as console:
                await console.drain(worker.id)
            await worker.ended.wait()
            await wait_until(
                lambda: log.has("worker connection closed after it left"), "the info line"
            )
        assert not log.has("worker connection lost")


@pytest.mark.anyio
async def test_the_console_unpickles_nothing_yet_gets_every_answer_over_ws(
    gate: Any, tokens: Tokens
) -> None:
    """The console's connection refuses pickles; the status is a typed StatusReply and
    every other answer a wire message or JSON values, so every command still works."""
    with anyio.fail_after(LIMIT):
        async with (
            ws_nodes(1, tokens) as (address, (worker,)),
            Cluster(address, token=tokens.admin) as cluster,
            ConsoleClient(address) as console,
        ):
            assert console._peer.allow_pickle is False
            opened = gate("no-pickles")
            blocked = cluster.submit(gated, "no-pickles", 6)
            await wait_until(lambda: console.tasks(state="processing"), "running")
            reply = await console.ask(StatusRequest())
            assert isinstance(reply, StatusReply)
            assert [w.worker_id for w in reply.workers] == [worker.id]
            assert reply.processing == {worker.id: 1} and reply.files.files == 0
            st = await console.status()
            assert st["workers"] == reply.workers and st["tasks_by_state"]["processing"] == 1
            (record,) = await console.tasks(state="processing")
            assert isinstance(record, TaskRecord) and record.key == blocked.key
            story = [e[2] for e in await console.story(blocked.key)]
            assert story[-2:] == ["processing", f"runs-on:{worker.id}"]
            assert all(isinstance(i, PolicyInfo) for i in await console.policies())
            with pytest.raises(ValueError, match="no worker 'nobody'"):
                await console.drain("nobody")  # a ValueError, told without a pickle
            with pytest.raises(RuntimeError, match="no autoscaler"):
                await console.scale("default", 2)
            done = await console.cancel([blocked.key])
            assert done == {"run": "", "count": 1, "to_do": 1, "keys": [blocked.key]}
            with pytest.raises(CancelledError):
                await blocked
            opened.set()


@pytest.mark.anyio
async def test_ws_one_shot_command_line_prints_tables_or_json(tokens: Tokens, capsys: Any) -> None:
    from runtime.__main__ import main

    with anyio.fail_after(LIMIT):
        async with ws_nodes(1, tokens) as (address, (worker,)):
            code = await anyio.to_thread.run_sync(main, ["console", address, "status", "--json"])
            out = capsys.readouterr().out
            assert code == 0
            assert [w["worker_id"] for w in json.loads(out)["workers"]] == [worker.id]

            code = await anyio.to_thread.run_sync(
                main, ["console", address, "--read-only", "drain", worker.id]
            )
            (err,) = _error_lines(capsys.readouterr().err)
            assert code == 1
            assert "PermissionDenied" in err and "needs the admin token" in err

            code = await anyio.to_thread.run_sync(
                main, ["console", "--read-only", address, "policy", "list"]
            )
            assert code == 0 and "round-robin" in capsys.readouterr().out

            # a rule as one JSON word, as a shell passes it on (it was quoted again)
            rule = '{"name": "ManyReady", "expr": "corral_queue_depth > 5"}'
            code = await anyio.to_thread.run_sync(main, ["console", address, "alert", "add", rule])
            added = capsys.readouterr()
            assert code == 0 and "ManyReady" in added.out, added.err
            code = await anyio.to_thread.run_sync(
                main, ["console", address, "alert", "list", "--json"]
            )
            rules = json.loads(capsys.readouterr().out)["rules"]
            assert code == 0 and "ManyReady" in [r["name"] for r in rules]

            code = await anyio.to_thread.run_sync(
                main, ["console", address, "--token", "wrong", "status"]
            )
            assert code == 1
            errors = _error_lines(capsys.readouterr().err)
            assert len(errors) == 1 and "AuthenticationFailed" in errors[0]
            # what a command-line user does: where the tokens are, which one was sent
            assert "--token TOKEN or CORRAL_TOKEN" in errors[0], errors[0]
            assert "prints only the read token" in errors[0], errors[0]
            assert "presented the token it was given (--token)" in errors[0], errors[0]
            assert "Cluster(address, token_file=... or token=...)" in errors[0]  # a library user

            Tokens("stale-" + "s" * 20, "stale-read").write(token_path(address))
            code = await anyio.to_thread.run_sync(main, ["console", address, "status"])
            (err,) = _error_lines(capsys.readouterr().err)
            assert code == 1 and f"the admin token of {token_path(address)}" in err, err
            tokens.write(token_path(address))


@pytest.mark.anyio
async def test_one_shot_story_takes_a_split_key_and_fails_for_an_unknown_one(
    tokens: Tokens, capsys: Any
) -> None:
    """A user audit: `console ADDR story typo-key` exited 0 (cancel and drain of an
    unknown name exit 1), and `console ADDR story "('y'," "2)"` (a key the shell split
    in two words) looked up the words quoted again and echoed them garbled. The words
    are the key joined by a space; a key with no story is an error, exit 1."""
    from runtime.__main__ import main

    with anyio.fail_after(LIMIT):
        async with (
            ws_nodes(1, tokens) as (address, _),
            Cluster(address, token=tokens.admin) as cluster,
        ):
            (y,) = await cluster.submit_graph({("y", 2): (operator.neg, 2)}, [("y", 2)])
            assert await y == -2
            capsys.readouterr()
            code = await anyio.to_thread.run_sync(
                main, ["console", address, "story", "('y',", "2)"]
            )
            out = capsys.readouterr().out
            assert code == 0 and "story of ('y', 2)" in out and "memory" in out, out
            code = await anyio.to_thread.run_sync(
                main, ["console", address, "story", "('y', 2)", "--json"]
            )
            assert code == 0 and json.loads(capsys.readouterr().out)["key"] == "('y', 2)"

            for words in (["story", "typo-key"], ["story", "typo-key", "--json"]):
                code = await anyio.to_thread.run_sync(main, ["console", address, *words])
                got = capsys.readouterr()
                (err,) = _error_lines(got.err)
                assert code == 1 and got.out == "", got
                assert err.startswith("error: ConsoleError: no transitions recorded for 'typo-key'")
            code = await anyio.to_thread.run_sync(
                main, ["console", address, "story", "('y',", "3)"]
            )
            (err,) = _error_lines(capsys.readouterr().err)
            assert code == 1 and "no transitions recorded for \"('y', 3)\"" in err, err
            # cancel's key is the rest of the line too
            words = ["cancel", "--key", "('y',", "2)"]
            code = await anyio.to_thread.run_sync(main, ["console", address, *words])
            out = capsys.readouterr().out
            assert code == 0 and "key ('y', 2): " in out and "still to do" in out, out


@pytest.mark.anyio
async def test_one_shot_tables_off_a_terminal_are_not_cut_to_80_columns(
    tokens: Tokens, capsys: Any, monkeypatch: Any
) -> None:
    """``console ADDR tasks | cat``: a long key stays whole on one line (it can be
    copied into ``story``), and no column is cut short with an ellipsis."""
    from runtime.__main__ import main

    monkeypatch.delenv("COLUMNS", raising=False)
    key = "load-" + "0123456789abcdef" * 8
    with anyio.fail_after(LIMIT):
        async with (
            ws_nodes(1, tokens) as (address, _),
            Cluster(address, token=tokens.admin) as cluster,
        ):
            held = cluster.submit(add, 1, 2, key=key)
            assert await held == 3  # held: the key stays in memory
            code = await anyio.to_thread.run_sync(main, ["console", address, "tasks"])
            out = capsys.readouterr().out
            assert code == 0
            (line,) = [ln for ln in out.splitlines() if key in ln]
            assert "memory" in line and "load" in line, out  # the state, whole, beside it
            code = await anyio.to_thread.run_sync(main, ["console", address, "status"])
            out = capsys.readouterr().out
            assert code == 0
            assert "\N{HORIZONTAL ELLIPSIS}" not in out, out
            assert any("default" in ln and "active" in ln for ln in out.splitlines()), out


@pytest.mark.anyio
async def test_a_worker_whose_name_is_taken_is_told_to_choose_another(
    tokens: Tokens, capsys: Any
) -> None:
    """``python -m runtime worker ADDR --name ID`` with the id of a worker already there
    is refused, and told what to do about it (docs/deployment.md: names are unique)."""
    from runtime.__main__ import main

    with anyio.fail_after(LIMIT):
        async with ws_nodes(1, tokens) as (address, (worker,)):
            argv = ["worker", address, "--name", worker.id, "--token", tokens.admin]
            code = await anyio.to_thread.run_sync(main, argv, abandon_on_cancel=True)
            (err,) = _error_lines(capsys.readouterr().err)
            assert code == 1 and "PermissionDenied" in err and worker.id in err, err
            assert "belongs to a registered worker, connected now" in err, err
            assert "wait as said above, or choose another --name" in err, err


def _error_lines(err: str) -> list[str]:
    """The console's own error lines (the manager in this process may log to stderr)."""
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("error: ")]


def test_a_batch_error_with_no_back_off_running_says_when_it_is_asked_again() -> None:
    """A pool whose sbatch failed with no work waiting (``min_blocks = 0``) is asked
    again only when it needs a block: not "retrying", which it is not."""
    from rich.console import Console

    from runtime.console import _render_blocks

    def shown(retry_in: float | None, suspended: bool = False) -> str:
        err = {"command": "sbatch", "error": "Invalid partition", "at": 0.0,
               "suspended": suspended, "retry_in": retry_in}  # fmt: skip
        out = Console(width=200, record=True, file=io.StringIO())
        for part in _render_blocks({"batch_errors": {"nopart": err}}):
            out.print(part)
        return out.export_text()

    assert "(asked again when the pool needs a block): sbatch: Invalid partition" in shown(None)
    assert "(asking again in 4 s)" in shown(4.2)
    assert "(suspended until an operator runs `resume nopart`)" in shown(None, suspended=True)


def test_a_pool_asking_now_says_so() -> None:
    """A user audit: a pool with ready tasks whose sbatch was under way (a controller
    down takes 12 s to fail it) read "asked again when the pool needs a block"."""
    from rich.console import Console

    from runtime.console import _render_blocks

    err = {"command": "sbatch", "error": "Unable to contact slurm controller", "at": 0.0,
           "suspended": False, "retry_in": None, "asking": True}  # fmt: skip
    out = Console(width=200, record=True, file=io.StringIO())
    for part in _render_blocks({"batch_errors": {"ckpt": err}}):
        out.print(part)
    text = out.export_text()
    assert "(asking again now): sbatch: Unable to contact slurm controller" in text
    assert "when the pool needs a block" not in text


def test_ended_blocks_show_why_and_a_requeue_is_no_end() -> None:
    """A user audit: every ``ended failed`` row's detail was empty, a pool that gave up
    said only that its workers kept ending, and a requeued block (which comes back)
    was listed among the ends as ``requeued ... free``."""
    from tests.helpers import status_text

    why = (
        "Slurm job 42 FAILED (NonZeroExitCode); exit code 127; stderr (/run/block-2.err):\n"
        "corral: block block-2, Slurm job 42, incarnation 1, node 0 on vm\n"
        "/run/block-2.sh: line 12: module: command not found\n"
        "corral: worker_init failed (exit status 127): no worker started"
    )
    end = {"pool": "aud", "charged": True, "at": 0.0, "incarnation": 1}
    text = status_text({"autoscaler": {
        "blocks": {"aud/block-1": "pending"}, "incarnations": {"aud/block-1": 2},
        "ends": [
            {**end, "block": "aud/block-1", "state": "requeued", "cause": "preempted",
             "charged": False},
            {**end, "block": "aud/block-2", "state": "failed", "cause": "crash",
             "detail": why},
        ],
        "gave_up": ["aud"], "last_failures": {"aud": f"aud/block-2 ended failed (crash): {why}"},
        "budget": 10, "budget_by_pool": {"aud": 11},
    }})  # fmt: skip
    rows = text.splitlines()
    (failed,) = [r for r in rows if r.startswith("│ aud/block-2")]
    assert "ended failed" in failed and "Slurm job 42 FAILED (NonZeroExitCode)" in failed
    at = rows.index(failed)
    assert "module: command not found" in rows[at + 1]
    assert "worker_init failed (exit status 127)" in rows[at + 2]
    (requeued,) = [r for r in rows if r.startswith("│ aud/block-1") and "requeued" in r]
    assert "requeued: back as run 2" in requeued and "free" not in requeued, requeued
    assert "pool aud: gave up: its workers kept ending (the latest: aud/block-2 ended failed" in (
        text
    )
    assert "module: command not found" in text.split("pool aud: gave up")[1]
    # 11 ends gave the pool up at a budget of 10: said as such, not "11 of 10 spent"
    budget = (
        "unasked ends in each pool's replacement window: aud 11; a pool gives up at more "
        "than 10 (preemption and walltime ends are free)"
    )
    assert budget in " ".join(text.split())


def test_status_tells_tasks_queued_on_a_worker_from_those_it_runs() -> None:
    """A worker is sent up to saturation x cores tasks: with 2 cores and 4 tasks sent,
    2 run and 2 wait there; ``status`` said "4 running" (a user read it as
    oversubscribed)."""
    from tests.helpers import status_text

    text = status_text(
        {
            "workers": [
                {"worker_id": "w1", "pool": "p", "cores": 2},
                {"worker_id": "w2", "pool": "p", "cores": 2},
            ],
            "processing": {"w1": 4, "w2": 1},
            "queues": {"p": 3},
        }
    )
    assert "4 core(s); 3 task(s) running and 2 queued on workers, 3 ready;" in text
    rows = {line.split()[1]: line for line in text.splitlines() if line[2:4] == "w1"}
    assert "2 (+2 queued)" in rows["w1"], text
    pools = [line for line in text.splitlines() if "│ p " in line]
    assert pools and pools[-1].split("│")[4].strip() == "3", text


def test_no_token_file_says_to_copy_the_admin_token_not_the_printed_one(tmp_path: Path) -> None:
    """A manager prints only its read token; the admin token is in its token file. The
    error said to pass "the token the manager printed", which then failed on every
    admin command (a user audit found it)."""
    with pytest.raises(CorralError) as info:
        Tokens.read_file(tmp_path / "127.0.0.1_8786.json")
    text = str(info.value)
    assert f"no token file at {tmp_path / '127.0.0.1_8786.json'}" in text
    assert "copy the admin token from that file on the manager's machine" in text
    assert "pass the read token it printed (in its dashboard URL)" in text
    assert "the token the manager printed" not in text
    assert "other host names" not in text
    # A manager listening on 0.0.0.0 wrote its file under that name: it is named.
    (tmp_path / "0.0.0.0_8786.json").write_text('{"admin": "a", "read": "r"}')
    (tmp_path / "0.0.0.0_9999.json").write_text('{"admin": "a", "read": "r"}')
    with pytest.raises(CorralError) as info:
        Tokens.read_file(tmp_path / "127.0.0.1_8786.json")
    assert "under other host names: 0.0.0.0_8786.json (a file is named" in str(info.value)


def test_status_shows_a_workers_floor_beside_its_rss() -> None:
    """A worker whose floor (memory that is not outputs) moved its marks up says so in
    the workers table; one whose configured marks hold shows its RSS alone."""
    from tests.helpers import status_text

    text = status_text(
        {
            "workers": [
                {"worker_id": "w1", "pool": "p", "cores": 2},
                {"worker_id": "w2", "pool": "p", "cores": 2},
            ],
            "rss": {"w1": 240 * 2**20, "w2": 100 * 2**20},
            "memory": {"w1": {"floor": 240 * 2**20}, "w2": {"floor": 0}},
        }
    )
    rows = {line.split()[1]: line for line in text.splitlines() if line[2:3] == "w"}
    assert "(floor 240" in rows["w1"], text
    assert "floor" not in rows["w2"], text


def test_status_shows_file_outputs_apart_from_spilled_outputs() -> None:
    """A run with only file outputs and no memory pressure showed ``stored 6.0 MiB |
    spilled 6.0 MiB``, read as memory pressure: the bytes on disk (``spilled_bytes``)
    count the file outputs (``file_bytes``). Now ``spilled`` is spill files only and
    ``files`` the file outputs."""
    from tests.helpers import status_text

    mib = 2**20
    text = status_text(
        {
            "workers": [
                {"worker_id": "w1", "pool": "p", "cores": 1},
                {"worker_id": "w2", "pool": "p", "cores": 1},
                {"worker_id": "w3", "pool": "p", "cores": 1},
            ],
            "files": {"stored_bytes": {"w1": 6 * mib, "w2": 9 * mib, "w3": 2 * mib}},
            "memory": {
                "w1": {"spilled_bytes": 6 * mib, "file_bytes": 6 * mib},
                "w2": {"spilled_bytes": 9 * mib, "file_bytes": 3 * mib},
                "w3": {"spilled_bytes": 2 * mib},
            },
        }
    )
    header = next(line for line in text.splitlines() if "spilled" in line)
    names = [c.strip() for c in header.split("┃")[1:-1]]
    assert names[5:9] == ["stored", "spilled", "files", "disk free"], text
    rows = {line.split()[1]: line for line in text.splitlines() if line[2:3] == "w"}
    cells = {w: [c.strip() for c in row.split("│")[1:-1]] for w, row in rows.items()}
    assert cells["w1"][5:8] == ["6.0 MiB", "-", "6.0 MiB"], text
    assert cells["w2"][5:8] == ["9.0 MiB", "6.0 MiB", "3.0 MiB"], text
    assert cells["w3"][5:8] == ["2.0 MiB", "2.0 MiB", "-"], text


def test_status_shows_an_away_worker_as_away_and_leaves_its_cores_out() -> None:
    """A worker whose connection dropped (its id held for its rejoin) was shown
    ``active`` with its cores counted, though it takes no task until it is back."""
    from tests.helpers import status_text

    text = status_text(
        {
            "workers": [
                {"worker_id": "w1", "pool": "p", "cores": 2},
                {"worker_id": "w2", "pool": "p", "cores": 3},
            ],
            "processing": {"w1": 1},
            "away": ["w1"],
        }
    )
    assert "2 worker(s), 3 core(s) (1 away: connection dropped, held for a rejoin);" in text
    rows = {line.split()[1]: line for line in text.splitlines() if line[2:3] == "w"}
    assert rows["w1"].split("│")[-2].strip() == "away", text
    assert rows["w2"].split("│")[-2].strip() == "active", text


@pytest.mark.anyio
async def test_help_after_a_command_prints_that_commands_usage(tokens: Tokens) -> None:
    """``console ADDRESS tasks --help`` printed ``error: ConsoleError: tasks: unrecognized
    arguments: help`` (exit 1): the --help became the word ``help``. Now ``-h`` or
    ``--help`` after any command prints that command's usage and what it does, exit 0,
    in the shell as in one shot, with --json too; alone it still lists every command."""

    def console(address: str, *words: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "runtime", "console", address, *words],
            capture_output=True, text=True, timeout=LIMIT, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip

    asking = {name: [f"{name} --help", f"{name} -h"] for name in COMMANDS if name != "help"}
    asking["policy"] += ["policy set --help", "policy list -h"]
    asking["alert"] += ["alert add --help", "alert watch -h", "alert add NAME 'x > 1' -h"]
    asking["tasks"] += ["tasks --state erred --help"]
    with anyio.fail_after(3 * LIMIT):
        async with ws_nodes(1, tokens) as (address, _):
            async with ConsoleClient(address, read_only=True) as client:
                for name, lines in asking.items():
                    for line in lines:
                        result = await client.execute(line)
                        assert result.text().startswith(COMMANDS[name][0]), line
                        assert COMMANDS[name][1][:30] in " ".join(result.text().split())
                        as_json = await client.execute(f"{line} --json")
                        assert json.loads(as_json.text())[name]["usage"] == COMMANDS[name][0]
                # A key that merely holds the word is still a key.
                with pytest.raises(Exception, match="no transitions recorded"):
                    await client.execute("story ('x', '--help')")
            proc = await anyio.to_thread.run_sync(console, address, "tasks", "--help")
            everything = await anyio.to_thread.run_sync(console, address, "--help")
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert proc.stdout.startswith(COMMANDS["tasks"][0]) and "list tasks" in proc.stdout
    assert everything.returncode == 0 and all(
        u in everything.stdout for u, _, _ in COMMANDS.values()
    )


def test_a_shell_whose_connection_closed_before_its_prompt_leaves_off_the_prompt() -> None:
    """A user audit (upgrade F4): ``preloop`` found the connection closed and raised
    ``_ConnectionLost`` with the shell still marked at its prompt, so the watcher's
    SIGINT raised it again in ``_leave``'s print: two chained tracebacks. Now the shell
    is off its prompt when it leaves, and that SIGINT is only the watcher's word."""
    from rich.console import Console

    client = ConsoleClient("ws://127.0.0.1:9")  # never connected: closed
    shell = ConsoleShell(client, lambda *a: None, console=Console(file=io.StringIO()))
    with pytest.raises(_ConnectionLost):
        shell.preloop()
    assert not shell._at_prompt
    shell._woken = True  # the watcher's SIGINT, arriving as the shell leaves
    shell._interrupted(signal.SIGINT, None)  # raises nothing
    shell._leave()
    assert shell.exit_code == 1
