"""A ``Cluster`` as a notebook uses it (docs/api.md#in-a-jupyter-notebook; notebook
audit 3, 4, 5):

- a start that fails says so (and why) when the object is used, not that it was closed,
  and the object may be started again;
- an embedded cluster starting while another of this process runs (a cell run again)
  logs a warning naming the one running and how to close it, and closes nothing;
- a start while another start of the same object is under way (a task still starting
  it), or once it runs, is refused with ``ClusterAlreadyStarted`` and starts nothing;
  once it was closed, with ``ClusterClosed``, saying to make a new Cluster;
- the cluster's repr says where it runs, its workers, its tasks by state and its
  dashboard; ``dashboard_link`` opens the page the worker processes' gateway serves,
  and ``/metrics`` answers there to the read token;
- where an event loop runs in the thread (a notebook), ``with Cluster()`` and a call on a
  cluster not started say to ``await cluster.start()``, not to use ``asyncio.run``.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import logging
import urllib.request

import anyio
import pytest

import runtime
from runtime import Cluster
from runtime.errors import AddressInUse, ClusterAlreadyStarted, ClusterClosed, CorralError
from tests.helpers import free_port_between

LIMIT = 60.0


def _port() -> int:
    return free_port_between(58_500, 58_999)


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "a Cluster starts while another" in r.getMessage()
    ]


@pytest.mark.anyio
async def test_a_failed_start_says_it_failed_and_the_cluster_may_start_again() -> None:
    """Before, the second object's error said it "was closed (its `async with` block
    was left, or close() was called)": start() closes what it started on failure."""
    port = _port()
    with anyio.fail_after(LIMIT):
        first = Cluster(processes=1, port=port)
        await first.start()
        try:
            again = Cluster(processes=1, port=port)  # the cell run again
            with pytest.raises(AddressInUse) as caught:
                await again.start()
            why = str(caught.value).splitlines()[0]
            with pytest.raises(CorralError) as used:
                again.submit(abs, -1)
            assert str(used.value) == (
                f"the cluster is not running: its start failed (AddressInUse: {why}), and "
                "nothing of it runs. Remove the cause and start it again (`await "
                "cluster.start()`), or drop this Cluster."
            )
            notes = getattr(caught.value, "__notes__", [])
            # (its workers may have joined since: the repr of that moment)
            assert notes[1].startswith(f"(it is <Cluster running: address ws://127.0.0.1:{port};")
            assert notes[1].endswith(
                "(cluster.dashboard_link opens it: it carries the read token)>, started "
                "earlier in this process and still running: `await old.close()` frees the "
                "port, old being the variable that held it, or Cluster.running()[i]; a "
                "runtime.Client: `old.close()`, not awaited)"
            )
            assert repr(again) == (
                f"<Cluster start failed: error AddressInUse: {why}; next remove the cause "
                "and `await cluster.start()` again, or drop it>"
            )
            assert Cluster.running() == [first]  # the failed one is not listed
        finally:
            await first.close()
        await again.start()  # the port is free now: the same object starts
        try:
            assert await again.submit(abs, -2) == 2
            assert repr(again).startswith(f"<Cluster running: address ws://127.0.0.1:{port};")
        finally:
            await again.close()
    assert repr(again) == "<Cluster closed>"


@pytest.mark.anyio
async def test_a_second_running_cluster_is_warned_of_and_the_first_keeps_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="corral")
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as first:
            assert _warnings(caplog) == []
            assert Cluster.running() == [first]
            # runtime.get's own cluster (in a helper thread) is no cell run again
            assert runtime.get({"x": (abs, -3)}, "x") == 3
            assert _warnings(caplog) == []
            shown = repr(first)
            async with Cluster(workers=1) as second:
                (said,) = _warnings(caplog)
                assert (
                    "event='a Cluster starts while another started in this process still "
                    "runs: each keeps its workers'"
                ) in said
                assert f"running=[{shown!r}]" in said
                assert (
                    "advice='a notebook cell run again makes a new Cluster and leaves the "
                    "old one running. Close the old one with `await old.close()` (old: the "
                    "variable that held it, or Cluster.running()[i]; a runtime.Client: "
                    "`old.close()`, not awaited); it is not closed for you'"
                ) in said
                assert Cluster.running() == [first, second]
                assert await first.submit(abs, -1) == 1  # not closed for the user
                assert await second.submit(abs, -2) == 2
            assert Cluster.running() == [first]
    assert Cluster.running() == []


@pytest.mark.anyio
async def test_the_repr_says_workers_tasks_and_where_the_dashboard_is() -> None:
    cluster = Cluster(workers=2)
    assert repr(cluster) == "<Cluster not started: start `await cluster.start()`>"
    with anyio.fail_after(LIMIT):
        async with cluster:
            await cluster.wait_for_workers(2, timeout=LIMIT)
            no_dashboard = "dashboard none (in-process workers: Cluster(processes=N) serves one)"
            assert repr(cluster) == (
                "<Cluster running: address in-process; workers 2: worker-1, worker-2; tasks "
                f"none; {no_dashboard}>"
            )
            future = cluster.submit(abs, -1)
            assert repr(cluster) == (
                "<Cluster running: address in-process; workers 2: worker-1, worker-2; tasks "
                "1 not sent yet (sent once the event loop runs: an await, or the cell's "
                f"end); {no_dashboard}>"
            )
            assert await future == 1
            assert repr(cluster) == (
                "<Cluster running: address in-process; workers 2: worker-1, worker-2; tasks "
                f"1 memory; {no_dashboard}>"
            )
            assert cluster.dashboard_link is None
            html = cluster._repr_html_()
            assert "<strong>Corral Cluster</strong> running" in html
            assert '<td style="text-align:left">1 memory</td>' in html
    assert repr(cluster) == "<Cluster closed>"
    assert cluster.dashboard_link is None


@pytest.mark.anyio
async def test_the_repr_never_raises_while_a_start_is_under_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review 1206e F6: between the start of the cluster's actor system and its last
    step (seconds, while worker processes start) the repr read the scheduler and client
    actors, which are not there yet, and raised AttributeError: a notebook showing a
    cluster whose start runs in a task, a debugger, a log. It says ``starting``: taken
    at that last step here (the real one runs after it), once in a start made to fail
    there and once in the start that follows."""
    shown: list[str] = []
    real = Cluster._finish_start

    async def finish(self: Cluster, system: object, plane: object) -> None:
        shown.append(repr(self))
        if len(shown) == 1:
            raise OSError("the first start fails here")
        await real(self, system, plane)

    monkeypatch.setattr(Cluster, "_finish_start", finish)
    cluster = Cluster(workers=1)
    assert repr(cluster) == "<Cluster not started: start `await cluster.start()`>"
    with anyio.fail_after(LIMIT):
        with pytest.raises(OSError, match="the first start fails here"):
            await cluster.start()
        assert shown == ["<Cluster starting>"]
        assert repr(cluster) == (
            "<Cluster start failed: error OSError: the first start fails here; next remove "
            "the cause and `await cluster.start()` again, or drop it>"
        )
        async with cluster:
            assert shown == ["<Cluster starting>", "<Cluster starting>"]
            await cluster.wait_for_workers(1, timeout=LIMIT)
            assert repr(cluster).startswith("<Cluster running: address in-process; workers 1:")
            assert "<strong>Corral Cluster</strong> running" in cluster._repr_html_()
    assert repr(cluster) == "<Cluster closed>"

    # A client of a manager process: starting while it joins (it said running).
    async def connect(self: Cluster, system: object, address: str) -> None:
        shown.append(repr(self))
        raise ConnectionRefusedError(f"nothing at {address} (none is started here)")

    monkeypatch.setattr(Cluster, "_connect", connect)
    client = Cluster(address="ws://127.0.0.1:62001")
    with anyio.fail_after(LIMIT), pytest.raises(ConnectionRefusedError):
        await client.start()
    assert shown[-1] == "<Cluster starting: address ws://127.0.0.1:62001>"
    assert repr(client).startswith("<Cluster start failed: error ConnectionRefusedError:")


@pytest.mark.anyio
async def test_a_start_while_one_is_under_way_is_refused_and_starts_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two starts of one object at once (``gather(c.start(), c.start())``, a task still
    starting it while a cell starts it again): before, both went through, each started a
    set of actors and a worker, ``Cluster.running()`` listed the cluster twice and
    ``close()`` stopped the second set only, leaving the first's actors running for
    good. The second is refused at once, starts nothing and leaves the first going,
    as a start of a running cluster is (``async with`` it too, which would close it)."""
    before = set(asyncio.all_tasks())
    cluster = Cluster(workers=1)
    with anyio.fail_after(LIMIT):
        first, second = await asyncio.gather(
            cluster.start(), cluster.start(), return_exceptions=True
        )
        assert first is None
        assert isinstance(second, ClusterAlreadyStarted)
        assert second.state == "starting"
        assert str(second) == (
            "this cluster is starting already: another start() of it (or `async with` it) "
            "is under way, in another task. Await that one, then use the cluster. Nothing "
            "was started; for a second cluster, make a new Cluster(...)"
        )
        assert Cluster.running() == [cluster]
        assert await cluster.submit(abs, -1) == 1
        await cluster.close()
    assert Cluster.running() == []
    assert set(asyncio.all_tasks()) - before == set()  # no actor of a first set left

    # Refused at the start's last step too (its actor system runs then), gated there.
    reached, go = anyio.Event(), anyio.Event()
    real = Cluster._finish_start

    async def finish(self: Cluster, system: object, plane: object) -> None:
        reached.set()
        await go.wait()
        await real(self, system, plane)

    monkeypatch.setattr(Cluster, "_finish_start", finish)
    cluster = Cluster(workers=1)
    with anyio.fail_after(LIMIT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(cluster.start)
            await reached.wait()
            with pytest.raises(ClusterAlreadyStarted) as starting:
                async with cluster:
                    raise AssertionError("entered a cluster whose start is under way")
            assert starting.value.state == "starting"
            assert repr(cluster) == "<Cluster starting>"  # the refused one left it so
            go.set()
        try:
            with pytest.raises(ClusterAlreadyStarted) as running:
                await cluster.start()
            assert running.value.state == "running"
            assert isinstance(running.value, RuntimeError)
            assert str(running.value) == (
                "this cluster is already running (an earlier start() or `async with` "
                "started it): use it as it is; `async with` it again would close it when "
                "its block is left. Nothing was started; for a second cluster, make a new "
                "Cluster(...)"
            )
            assert Cluster.running() == [cluster]
            assert await cluster.submit(abs, -2) == 2
        finally:
            await cluster.close()
    assert set(asyncio.all_tasks()) - before == set()


@pytest.mark.anyio
async def test_a_start_after_close_is_refused_and_starts_nothing() -> None:
    """Before, ``start()`` (or ``async with``) on a closed cluster started it afresh,
    silently, with none of its old futures' results. Now it raises ``ClusterClosed``,
    saying to make a new Cluster, and starts nothing: no actor, not listed as running,
    still shown closed, and its calls still say it was closed."""
    before = set(asyncio.all_tasks())
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=1) as cluster:
            assert await cluster.submit(abs, -1) == 1
        for start in (cluster.start, cluster.__aenter__):
            with pytest.raises(ClusterClosed) as refused:
                await start()
            assert isinstance(refused.value, RuntimeError)
            assert str(refused.value) == (
                "this cluster was closed (close() was called, or its `async with` block "
                "was left) and does not start again: its futures' results went with it. "
                "Nothing was started; make a new Cluster(...) (the same arguments give the "
                "same kind of cluster) and submit the work to it"
            )
        assert Cluster.running() == []
        assert repr(cluster) == "<Cluster closed>"
        with pytest.raises(CorralError, match="it was closed"):
            cluster.submit(abs, -2)
        await cluster.close()  # closing it again is still nothing
    assert set(asyncio.all_tasks()) - before == set()


def _get(url: str, **headers: str) -> tuple[int, str]:
    """GET ``url`` as a browser does (its cookies kept across the redirect)."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    with opener.open(urllib.request.Request(url, headers=headers), timeout=10) as answer:
        return answer.status, answer.read().decode()


@pytest.mark.anyio
async def test_the_dashboard_link_of_worker_processes_opens_the_page() -> None:
    """Before, the gateway answered ``/`` 401 and ``/metrics`` 404 whatever the token,
    and nothing told a URL."""
    port = _port()
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1, port=port) as cluster:
            link = cluster.dashboard_link
            assert link is not None
            base, _, query = link.partition("?")
            assert base == f"http://127.0.0.1:{port}/"
            token = query.removeprefix("token=")
            assert token == cluster._tokens.read
            status, page = await anyio.to_thread.run_sync(_get, link)
            assert status == 200 and "<html" in page.lower()
            status, metrics = await anyio.to_thread.run_sync(
                lambda: _get(base + "metrics", Authorization=f"Bearer {token}")
            )
            assert status == 200 and "corral_" in metrics
            assert repr(cluster).endswith(
                f"dashboard http://127.0.0.1:{port}/ (cluster.dashboard_link opens it: it "
                "carries the read token)>"
            )  # the text repr, which logs may carry, has no token
            assert token not in repr(cluster)
            assert f'<a href="{link}" target="_blank">{base}</a>' in cluster._repr_html_()


@pytest.mark.anyio
async def test_with_in_a_running_loop_says_await_start() -> None:
    with pytest.raises(TypeError) as caught, Cluster(workers=1):  # type: ignore[misc]
        pass
    assert str(caught.value) == (
        "a Cluster runs in an event loop, and one runs in this thread already (a Jupyter "
        "notebook, or async code): not `with`, but start it with `await cluster.start()` "
        "(in a notebook, in one cell; use it in later cells; `await cluster.close()` stops "
        "it), or use `async with Cluster(...) as cluster:` around the work (in a notebook, "
        "at the top level of one cell); asyncio.run and anyio.run fail where a loop runs "
        "already. See docs/api.md#in-a-jupyter-notebook."
    )
    with pytest.raises(CorralError) as used:
        Cluster(workers=1).submit(abs, -1)
    assert str(used.value) == (
        "the cluster is not running: it was not started. An event loop runs in this thread (a "
        "Jupyter notebook, or async code): start it with `await cluster.start()` (in a "
        "notebook, in one cell; use it in later cells; `await cluster.close()` stops it), or "
        "use `async with Cluster(...) as cluster:` around the work (in a notebook, at the top "
        "level of one cell); asyncio.run and anyio.run fail where a loop runs already."
    )


def test_without_a_loop_the_errors_say_async_code() -> None:
    async_code = r"inside an async function \(run by anyio.run"
    with pytest.raises(TypeError, match=async_code), Cluster(workers=1):  # type: ignore[misc]
        pass
    with pytest.raises(CorralError) as used:
        Cluster(workers=1).submit(abs, -1)
    assert str(used.value) == (
        "the cluster is not running; use `async with Cluster() as c:` inside an async "
        "function, or `await cluster.start()` there (and `await cluster.close()` once done)"
    )
