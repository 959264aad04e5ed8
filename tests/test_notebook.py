"""A ``Cluster`` as a notebook shows it (docs/api.md#cluster; notebook audit 4): its repr
says where it runs, its workers, its tasks by state and its dashboard;
``dashboard_link`` opens the page the worker processes' gateway serves, and ``/metrics``
answers there to the read token.
"""

from __future__ import annotations

import http.cookiejar
import urllib.request

import anyio
import pytest

from runtime import Cluster
from tests.helpers import free_port_between

LIMIT = 60.0


def _port() -> int:
    return free_port_between(58_500, 58_999)


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
