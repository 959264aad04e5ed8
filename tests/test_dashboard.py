"""The live dashboard (runtime/dashboard.py): the failure groups and recent tries the
scheduler core keeps, the snapshot built from the manager's answers, its auth and its
shared feed over real HTTP on a real manager process, and the page itself in a real
headless Chromium driving a real run (queue rising and draining, a failure group, a
task's story), which saves a screenshot."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import json
import os
import re
import shutil
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

import actors.scheduler
from actors import scheduler_state
from actors.scheduler import _failure_groups, format_error
from actors.scheduler_records import SchedulerConfig, error_record
from actors.scheduler_state import SchedulerState
from policies import REGISTRY
from runtime import Cluster
from runtime.dashboard import (
    FEED_PATH,
    MAX_PAGES,
    PAGE,
    STORY_PATH,
    build_snapshot,
    dashboard_url,
)
from runtime.files import File, output_path
from runtime.messages import (
    AlertInfo,
    AlertsReply,
    AutoscalerStatus,
    BlockMetrics,
    FailureGroupInfo,
    MetricsReply,
    PoolMetrics,
    RecentTry,
    StatusReply,
    WorkerInfo,
    WorkerMemoryReport,
)
from tests.helpers import (
    GB,
    Cli,
    finish,
    free_port_between,
    held_at_gate,
    http_get,
    join,
    leave,
    submit,
    wait_until,
)

# ----------------------------------------------------------------------------- the core


def test_failure_groups_keep_the_count_and_the_latest_try() -> None:
    st = SchedulerState(SchedulerConfig(saturation=1.0))
    keys = ["parse-0", "parse-1", "load-0"]
    submit(st, {k: [] for k in keys}, keys)
    join(st, "w", cores=3)
    finish(st, "w", "parse-0", "error", error=ValueError("first"), start=1.0, duration=2.0)
    finish(st, "w", "parse-1", "error", error=ValueError("second"), start=3.0, duration=1.0)
    leave(st, "w", cause="crash")

    parse = st.failure_groups[("parse", "ValueError")]
    assert (parse.n, parse.key, parse.worker, parse.outcome) == (2, "parse-1", "w", "error")
    assert parse.error is not None and parse.error.summary == "ValueError: second"
    lost = st.failure_groups[("load", "crash")]
    assert (lost.n, lost.key, lost.outcome, lost.error) == (1, "load-0", "worker-lost", None)
    ended = [(r.key, r.outcome, category) for r, category, _ in st.recent_tries]
    assert ended == [
        ("parse-0", "error", "parse"),
        ("parse-1", "error", "parse"),
        ("load-0", "worker-lost", "load"),
    ]

    groups = _failure_groups(st, now=lost.at + 5.0)
    assert [(g.category, g.cause, g.n) for g in groups] == [
        ("load", "crash", 1),  # the most recent first
        ("parse", "ValueError", 2),
    ]
    assert groups[0].ago == 5.0 and groups[0].traceback == ""
    assert "w was lost (crash)" in groups[0].error and "load-0" in groups[0].error
    assert groups[1].error == "ValueError: second"
    assert groups[1].traceback.rstrip().endswith("ValueError: second")
    assert st.free_groups == {}


def test_a_failure_group_says_of_how_many_tasks_and_how_many_of_them_erred() -> None:
    """A user audit: "flaky / ConnectionError: 4" read the same whether both tasks then
    finished after their retries or failed for good. Each group counts its tries, its
    tasks (each once) and the tasks that erred in the end."""
    st = SchedulerState(SchedulerConfig(saturation=1.0))
    keys = ["flaky-0", "flaky-1", "flaky-2"]
    submit(st, {k: [] for k in keys}, keys, retries=2)
    join(st, "w", cores=3)
    for key in keys[:2]:  # twice each, then finished
        finish(st, "w", key, "error", error=ConnectionError(key), start=1.0, duration=1.0)
        finish(st, "w", key, "error", error=ConnectionError(key), start=2.0, duration=1.0)
        finish(st, "w", key, "ok", start=3.0, duration=1.0)
    for _ in range(3):  # three times: its budget spent, it erred
        finish(st, "w", "flaky-2", "error", error=ConnectionError("2"), start=4.0, duration=1.0)
    assert st.tasks["flaky-2"].state == "erred"
    group = st.failure_groups[("flaky", "ConnectionError")]
    assert (group.n, group.tasks, group.erred) == (7, 3, 1)
    (shown,) = _failure_groups(st, now=10.0)
    assert (shown.n, shown.tasks, shown.erred) == (7, 3, 1)
    metrics, status, alerts = _answers()
    metrics = dataclasses.replace(metrics, failure_groups=(shown,))
    snap = build_snapshot(metrics, status, alerts, now=1000.0)
    assert [(g["n"], g["tasks"], g["erred"]) for g in snap["failures"]] == [(7, 3, 1)]


@pytest.mark.parametrize("charge_lost", [False, True], ids=["free", "charged"])
def test_tries_lost_to_preemption_and_retried_free_are_not_failure_groups(
    charge_lost: bool,
) -> None:
    """A try lost with its preempted worker and retried free is in its own groups
    (the dashboard's "Tries lost with their worker"), not among the failures; one whose
    retry spent the task's budget (``charge_lost``) stays a failure. Both count in the
    failures by outcome and cause (the metrics' counters), as before."""
    retry = REGISTRY.create("retry", "default", {"charge_lost": charge_lost})
    st = SchedulerState(SchedulerConfig(saturation=1.0), retry=retry)
    submit(st, {"load-0": [], "load-1": []}, ["load-0", "load-1"], retries=2)
    join(st, "w", cores=2)
    leave(st, "w", cause="preempted")
    free, failed = st.free_groups, st.failure_groups
    assert (free, failed)[charge_lost][("load", "preempted")].n == 2
    assert ("load", "preempted") not in (failed, free)[charge_lost]
    assert st.failures["load"] == {("worker-lost", "preempted"): 2}
    shown = _failure_groups(st, now=10.0, free=True)
    assert [(g.category, g.cause, g.n) for g in shown] == ([] if charge_lost else [
        ("load", "preempted", 2)
    ])  # fmt: skip
    assert [g.cause for g in _failure_groups(st, now=10.0)] == (
        ["preempted"] if charge_lost else []
    )


class _Big:
    """A task's large input, held by a frame's locals."""


def _fails_holding(big: _Big) -> None:
    prices: dict[str, float] = {}
    try:
        prices["missing"]
    except KeyError as exc:
        raise ValueError(f"no price for {len(repr(big))} items") from exc


def test_an_error_record_keeps_the_traceback_as_text_and_no_frame() -> None:
    big = _Big()
    alive = weakref.ref(big)
    try:
        _fails_holding(big)
    except ValueError as exc:
        record = error_record(exc)
    del big
    gc.collect()
    assert alive() is None  # the frames (and the input in their locals) were let go
    assert record.summary.startswith("ValueError: no price for")
    assert [(name, relation) for name, _, _, relation in record.chain] == [
        ("KeyError", ""),
        ("ValueError", "cause"),
    ]
    text = format_error(record)
    assert (
        text.index("KeyError: 'missing'")
        < text.index("direct cause")
        < text.index("ValueError: no price for")
    )
    assert "in _fails_holding" in text and 'prices["missing"]' in text  # the source line


def test_failure_groups_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scheduler_state, "MAX_FAILURE_GROUPS", 1)
    st = SchedulerState(SchedulerConfig(saturation=1.0))
    keys = ["a-0", "b-0", "c-0"]
    submit(st, {k: [] for k in keys}, keys)
    join(st, "w", cores=3)
    for key, error in zip(keys, (ValueError("x"), KeyError("y"), OSError("z")), strict=True):
        finish(st, "w", key, "error", error=error)
    assert {k: g.n for k, g in st.failure_groups.items()} == {
        ("a", "ValueError"): 1,
        ("(other)", "(other)"): 2,
    }
    assert st.failures["c"][("error", "OSError")] == 1  # the counters stay exact
    monkeypatch.setattr(actors.scheduler, "MAX_FAILURE_GROUPS_SHOWN", 1)
    (latest,) = _failure_groups(st, now=100.0)  # the dashboard gets the most recent
    assert (latest.category, latest.key, latest.error) == ("(other)", "c-0", "OSError: z")


# ----------------------------------------------------------------------------- the snapshot


def _answers() -> tuple[MetricsReply, StatusReply, AlertsReply]:
    metrics = MetricsReply(
        pools={
            "*": PoolMetrics(queue_depth=2, oldest_wait=4.0, disk_stalled=1, disk_stalls=1),
            "cpu": PoolMetrics(
                queue_depth=7,
                oldest_wait=62.0,
                wait_quantiles={"0.5": 3.0, "0.9": 30.0},
                running=3,
                workers={"idle": 0, "busy": 2},
                throttled=1,
                held_back=2,
                cores=3,  # as the scheduler counts them: w1 runs 3 on 2 cores, 2 busy
                cores_busy=2,
            ),
        },
        blocks={"cpu": BlockMetrics({"running": 2, "pending": 1}, 40.0, 3, 4)},
        tasks_by_state={"queued": 9, "processing": 3},
        tasks_created=20,
        failure_groups=(
            FailureGroupInfo("parse", "ValueError", 3, "parse-7", "w1", "error", 2.0, "E"),
        ),
        failure_groups_total=4,
        free_groups=(
            FailureGroupInfo("deep", "preempted", 8, "deep-3", "w2", "worker-lost", 1.0, "lost"),
        ),
        free_groups_total=1,
        recent_tries=(RecentTry("parse-7", "parse", "w1", "error", 0.5, 2.0),),
    )
    workers = (
        WorkerInfo("w1", 2, 4 * GB, pool="cpu", host="box/1"),
        WorkerInfo("w2", 1, 2 * GB, pool="cpu", host="box/2"),
    )
    status = StatusReply(
        workers=workers,
        processing={"w1": 3, "w2": 0},
        memory={"w1": WorkerMemoryReport("w1", True, 3 * GB, 2 * GB, 4 * GB, spilled_bytes=5)},
        rss={"w2": GB},
        throttled=("w1",),
        warnings=("host box/1: too much",),
        policies={"placement": "spread", "retry": "default"},
        policy_params={"placement": {"bandwidth": 2e8}},
        autoscaler=AutoscalerStatus(policy="demand", policy_params={"spare": 2, "lookahead": 60}),
    )
    alert = AlertInfo(
        "QueueTimeHigh", "firing", labels={"alertname": "QueueTimeHigh", "pool": "cpu"},
        annotations={"dashboard": "/"}, fields={"max_queue_size": 7.0},
    )  # fmt: skip
    return metrics, status, AlertsReply(alerts=(alert,), rules=({"name": "q"},))


def test_the_snapshot_shows_pools_capacity_workers_failures_alerts_policies() -> None:
    snap = build_snapshot(*_answers(), now=1000.0)
    json.dumps(snap)  # what the feed sends
    assert snap["warnings"] == ["host box/1: too much"]  # the capacity panel shows them
    assert snap["time"] == 1000.0 and snap["queue_depth"] == 9
    assert [(g["category"], g["n"]) for g in snap["free"]] == [("deep", 8)]  # not failures
    assert snap["free_groups"] == 1 and len(snap["failures"]) == 1
    assert [p["name"] for p in snap["pools"]] == ["cpu", "*"]  # "any pool" last
    cpu = snap["pools"][0]
    assert (cpu["queue_depth"], cpu["oldest_wait"], cpu["held_back"]) == (7, 62.0, 2)
    assert (cpu["wait_p50"], cpu["wait_p90"]) == (3.0, 30.0)
    assert (cpu["cores"], cpu["cores_busy"]) == (3, 2)  # /metrics' corral_cores{,_busy}
    assert (cpu["memory_limit"], cpu["rss"]) == (6 * GB, 4 * GB)
    assert cpu["hosts"] == 2  # how many machines (a user audit, monitor 7: not answerable)
    assert cpu["blocks"] == {"running": 2, "pending": 1} and cpu["blocks_pending"] == 1
    assert (cpu["oldest_pending"], cpu["target"], cpu["desired"]) == (40.0, 3, 4)
    assert snap["pools"][1]["label"] == "any pool (no pool=)"
    # the tasks of no pool, which cpu's workers may run too, are said beside its own
    assert (cpu["any_pool_queued"], snap["pools"][1]["any_pool_queued"]) == (2, 0)
    assert (cpu["disk_stalled"], snap["pools"][1]["disk_stalled"]) == (0, 1)  # the page says so
    w1, w2 = snap["workers"]
    assert (w1["host"], w2["host"]) == ("box/1", "box/2")
    assert (w1["rss"], w1["limit"], w1["throttle_at"]) == (3 * GB, 4 * GB, 2 * GB)
    assert w1["throttled"] and not w2["throttled"]
    assert (w1["spilled_bytes"], w2["rss"], w2["limit"]) == (5, GB, 2 * GB)
    assert snap["failures"][0]["n"] == 3 and snap["failures"][0]["key"] == "parse-7"
    assert snap["failure_groups"] == 4  # the page says: the most recent 1 of 4
    assert snap["stream"][0]["outcome"] == "error"
    (alert,) = snap["alerts"]
    assert alert["state"] == "firing" and alert["fields"] == {"max_queue_size": 7.0}
    assert snap["alert_rules"] == 1
    assert snap["policies"] == {
        "placement": "spread (bandwidth=200000000.0)",
        "retry": "default",
        "scaling": "demand (spare=2, lookahead=60)",
    }


def test_a_pool_with_no_queue_of_its_own_says_the_tasks_of_no_pool_it_may_run() -> None:
    """The scale audit: 27,226 tasks submitted without ``pool=`` waited, and the one
    pool's row read "0 queued" while they sat under ``*``. ``queue_depth`` stays what
    ``corral_queue_depth`` says per pool (those tasks counted once, in ``*``, and in the
    total); each pool's row also says how many of them its workers may run."""
    metrics, status, alerts = _answers()
    metrics = dataclasses.replace(
        metrics,
        pools={"*": PoolMetrics(queue_depth=27226), "default": PoolMetrics(queue_depth=0)},
        blocks={},
    )
    status = dataclasses.replace(status, workers=(WorkerInfo("w1", 2, GB, pool="default"),))
    snap = build_snapshot(metrics, status, alerts, now=1.0)
    rows = [(p["name"], p["label"], p["queue_depth"], p["any_pool_queued"]) for p in snap["pools"]]
    assert rows == [
        ("default", "default", 0, 27226),
        ("*", "any pool (no pool=)", 27226, 0),
    ]
    assert snap["queue_depth"] == 27226  # counted once
    # no task of no pool waiting: nothing said beside a pool's own queue
    metrics = dataclasses.replace(metrics, pools={"default": PoolMetrics(queue_depth=3)})
    (row,) = build_snapshot(metrics, status, alerts, now=2.0)["pools"]
    assert (row["queue_depth"], row["any_pool_queued"]) == (3, 0)


def test_the_snapshot_shows_each_workers_disk_and_its_file_outputs_apart() -> None:
    """Disk used and its limit per worker (used plus free; None: not counted), and of
    its bytes on disk the file outputs apart from the spill files: before, only
    ``spilled_bytes``, file outputs counted as spilled."""
    metrics, status, alerts = _answers()
    workers = (
        WorkerInfo("w1", 1, GB, disk=10 * GB), WorkerInfo("w2", 1, GB, disk=0),
        WorkerInfo("w3", 1, GB, disk=5 * GB),
    )  # fmt: skip
    memory = {
        # 3 GB on disk, 1 GB of it file outputs; its file system has 2 GB free
        "w1": WorkerMemoryReport(
            "w1", False, GB, GB, GB, spilled_bytes=3 * GB, disk_used=3 * GB,
            disk_free=2 * GB, file_bytes=GB,
        ),
        "w2": WorkerMemoryReport("w2", False, GB, GB, GB, spilled_bytes=7, disk_free=None),
    }  # fmt: skip
    status = dataclasses.replace(status, workers=workers, memory=memory, throttled=())
    snap = json.loads(json.dumps(build_snapshot(metrics, status, alerts, now=1.0)))
    w1, w2, w3 = snap["workers"]
    assert (w1["disk_used"], w1["disk_limit"], w1["disk_free"]) == (3 * GB, 5 * GB, 2 * GB)
    assert (w1["spilled_bytes"], w1["file_bytes"]) == (2 * GB, GB)
    assert (w2["disk_used"], w2["disk_limit"], w2["spilled_bytes"]) == (0, None, 7)  # off
    assert (w3["disk_used"], w3["disk_limit"]) == (0, 5 * GB)  # no report yet: its --disk


def file_output(nbytes: int) -> File:
    path = output_path("part.bin")
    Path(path).write_bytes(b"x" * nbytes)
    return File(path)


@pytest.mark.anyio
async def test_a_workers_memory_report_counts_its_file_outputs_apart() -> None:
    """What the page's file outputs come from: the worker's report says which of its
    bytes on disk are file outputs (before, they were all "spilled")."""
    with anyio.fail_after(60):
        async with Cluster(workers=1, disk_per_worker="64MiB") as c:
            await c.submit(file_output, 100_000)

            async def reported() -> Any:
                (mem,) = (await c.status())["memory"].values()
                return mem if mem["file_bytes"] else None

            mem = await wait_until(reported, "a report with the file output", limit=30)
            assert (mem["file_bytes"], mem["spilled_bytes"]) == (100_000, 100_000)
            assert mem["disk_used"] >= 100_000 and mem["disk_free"] is not None


def test_the_dashboard_url_carries_the_token() -> None:
    assert dashboard_url("ws://127.0.0.1:8786", "ab") == "http://127.0.0.1:8786/?token=ab"
    assert dashboard_url("wss://h:1/", "a b") == "https://h:1/?token=a%20b"


# ----------------------------------------------------------------------------- over HTTP


def _base(address: str) -> str:
    return address.replace("ws://", "http://", 1).rstrip("/")


def _session() -> aiohttp.ClientSession:
    # A browser keeps cookies of 127.0.0.1; aiohttp only with unsafe=True.
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


@pytest.mark.slow
@pytest.mark.anyio
async def test_only_the_read_and_admin_tokens_open_the_dashboard(tmp_path: Path) -> None:
    with Cli(tmp_path) as cli:
        proc, address = cli.manager()
        url = cli.line_with(proc, "dashboard on").split("dashboard on", 1)[1].strip()
        tokens = cli.tokens(address)
        base = _base(address)
        assert url == f"{base}/?token={tokens['read']}"
        async with aiohttp.ClientSession() as s:
            for path in ("/", FEED_PATH, f"{STORY_PATH}?key=x"):
                async with s.get(base + path) as r:  # no token
                    assert r.status == 401, path
                    assert "open the URL the manager printed" in await r.text()
                async with s.get(base + path, params={"token": "f" * 64}) as r:
                    assert r.status == 403, path
                bad = {"Cookie": f"corral_token_{urlsplit(address).port}={'f' * 64}"}
                async with s.get(base + path, headers=bad) as r:
                    assert r.status == 403, path
        for role in ("read", "admin"):
            async with _session() as s:
                async with s.get(f"{base}/", params={"token": tokens[role]},
                                 allow_redirects=False) as r:  # fmt: skip
                    assert r.status == 303 and r.headers["Location"] == "/"
                    cookie = r.headers["Set-Cookie"]
                    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
                async with s.get(f"{base}/") as r:  # the cookie now
                    assert r.status == 200 and "Corral dashboard" in await r.text()
                    assert "default-src 'none'" in r.headers["Content-Security-Policy"]
                async with s.ws_connect(base + FEED_PATH) as ws:
                    snap = await ws.receive_json(timeout=10)
                    assert snap["tasks_created"] == 0 and snap["workers"] == []
                async with s.get(f"{base}{STORY_PATH}") as r:
                    assert r.status == 400 and "say which task" in await r.text()
                async with s.get(f"{base}{STORY_PATH}", params={"key": "<b>nope</b>"}) as r:
                    text = await r.text()
                    assert r.status == 200 and "story-empty" in text
                    assert "&lt;b&gt;nope&lt;/b&gt;" in text and "<b>nope" not in text
                # The cookie opens the dashboard only: not /metrics, not the gateway.
                async with s.get(f"{base}/metrics") as r:
                    assert r.status == 401
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await s.ws_connect(f"{base}/")
                assert refused.value.status == 401
                # A page of another origin may not use this browser's cookie.
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await s.ws_connect(base + FEED_PATH, origin="http://evil.example")
                assert refused.value.status == 403


@pytest.mark.slow
@pytest.mark.anyio
async def test_one_snapshot_per_interval_is_shared_by_every_page(tmp_path: Path) -> None:
    with Cli(tmp_path) as cli:
        manager, address = cli.manager()
        cli.worker(address, "--disk", "64MiB")
        base, read = _base(address), cli.tokens(address)["read"]
        async with _session() as s:
            async with s.get(f"{base}/", params={"token": read}) as r:
                assert r.status == 200
            pages = [await s.ws_connect(base + FEED_PATH) for _ in range(3)]
            try:
                seen: list[list[tuple[int, float]]] = []
                with anyio.fail_after(30):
                    for ws in pages:
                        snaps = [await ws.receive_json() for _ in range(4)]
                        seen.append([(snap["seq"], snap["time"]) for snap in snaps])
                        (worker,) = snaps[-1]["workers"]
                        # its disk: nothing on it yet, and its --disk as the limit
                        assert (worker["disk_used"], worker["disk_limit"]) == (0, 64 << 20)
                        assert (worker["spilled_bytes"], worker["file_bytes"]) == (0, 0)
                # Each page got the same snapshots (same number, same time), one by one.
                common = set.intersection(*(set(s) for s in seen))
                assert len(common) >= 2, seen
                for got in seen:
                    seqs = [n for n, _ in got]
                    assert seqs == list(range(seqs[0], seqs[0] + 4)), seen
                times = sorted(t for _, t in common)
                assert all(b - a >= 0.9 for a, b in itertools.pairwise(times)), times

                # The manager stops at once with pages open; they learn it (close 1001).
                await anyio.to_thread.run_sync(cli.stop, [manager])
                assert manager.returncode == 0  # not killed after Cli.stop's 10 s
                with anyio.fail_after(10):
                    for ws in pages:
                        while (await ws.receive()).type not in CLOSED:
                            pass
            finally:
                for ws in pages:
                    await ws.close()


CLOSED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED)


@pytest.mark.anyio
async def test_past_max_pages_a_page_is_refused_until_one_closes(tmp_path: Path) -> None:
    """Each open page holds a connection (a file) of the manager: a read-token holder
    opening 1,100 ran a manager under the usual limit of 1024 files out of them (its
    accept: Too many open files). MAX_PAGES are served; the next is refused with 503
    saying why; once one closes, a page opens again."""
    with Cli(tmp_path) as cli, anyio.fail_after(60):
        manager, address = cli.manager()
        url = _base(address) + FEED_PATH
        headers = {"Authorization": f"Bearer {cli.tokens(address)['read']}"}
        async with _session() as s:
            pages = [await s.ws_connect(url, headers=headers) for _ in range(MAX_PAGES)]
            try:
                with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                    await s.ws_connect(url, headers=headers)
                assert refused.value.status == 503
                async with s.get(url, headers={**headers, **UPGRADE}) as r:
                    assert r.status == 503
                    assert f"{MAX_PAGES} dashboard pages are open" in await r.text()
                await pages.pop().close()

                async def opens() -> bool:
                    try:
                        pages.append(await s.ws_connect(url, headers=headers))
                    except aiohttp.WSServerHandshakeError:
                        return False
                    return True

                await wait_until(opens, "a page opening once one closed", step=0.05)
            finally:
                for ws in pages:
                    await ws.close()
        assert manager.poll() is None


UPGRADE = {
    "Upgrade": "websocket",
    "Connection": "Upgrade",
    "Sec-WebSocket-Version": "13",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
}


# ----------------------------------------------------------------------------- Chromium

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def _chromium() -> None:
    """Chromium, its driver and Selenium; without them the test skips here and fails in
    CI."""
    why = ""
    if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
        why = (
            "Chromium is not installed: on Debian, `apt-get install -y "
            "--no-install-recommends chromium chromium-driver`"
        )
    else:
        try:
            import selenium  # noqa: F401
        except ImportError:
            why = "Selenium is not installed: `pip install -e '.[test]'`"
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(why + "; CI must run this test (.ci/run installs it)")
        pytest.skip(why)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    _chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
        "--window-size=1400,1150", f"--user-data-dir={tmp_path / 'chromium'}",
    ):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


class Dashboard:
    """The page in the browser, read through its DOM; every wait is bounded."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def wait(self, script: str, what: str, limit: float = 60.0) -> Any:
        """Until ``script`` (a JS expression's body, ``return ...``) is true; its value."""
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, limit, poll_frequency=0.05).until(
            lambda d: d.execute_script(script), message=f"timed out waiting for {what}"
        )

    def queue_depth(self) -> int:
        return int(
            self.driver.execute_script(
                "return document.getElementById('queue-depth-total').dataset.value"
            )
        )

    def wait_for_queue_depth(self, at_least: int, limit: float = 60.0) -> int:
        script = (
            "const v = Number(document.getElementById('queue-depth-total').dataset.value);"
            f"return v >= {at_least} ? v : false;"
        )
        return int(self.wait(script, f"a queue depth of {at_least} or more", limit))

    def wait_for_empty_queue(self, limit: float = 60.0) -> None:
        self.wait(
            "return document.getElementById('queue-depth-total').dataset.value === '0'",
            "the queue depth to fall back to 0",
            limit,
        )

    def wait_for_failure_group(self, category: str, cause: str, limit: float = 60.0) -> str:
        """The text of the failure group of ``category`` and ``cause``, once shown."""
        script = (
            f"const g = document.querySelector('.failure[data-category={json.dumps(category)}]"
            f"[data-cause={json.dumps(cause)}]'); return g ? g.innerText : false;"
        )
        return str(self.wait(script, f"the failure group {category}/{cause}", limit))

    def wait_for_alert(self, name: str, state: str = "firing", limit: float = 60.0) -> str:
        """The text of alert ``name`` once shown in ``state`` (for the alert monitor's
        end-to-end test: a firing alert is one more wait of this)."""
        script = (
            f"const a = document.querySelector('.alert[data-name={json.dumps(name)}]"
            f"[data-state={json.dumps(state)}]'); return a ? a.innerText : false;"
        )
        return str(self.wait(script, f"alert {name} {state}", limit))

    def screenshot(self, path: Path) -> None:
        """Save the page as PNG at ``path`` and, with env CORRAL_SCREENSHOTS=DIR, in DIR."""
        assert self.driver.save_screenshot(str(path)), "the screenshot failed"
        wanted = os.environ.get("CORRAL_SCREENSHOTS")
        if wanted:
            Path(wanted).mkdir(parents=True, exist_ok=True)
            shutil.copy(path, Path(wanted) / path.name)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_a_dashboard_link_followed_from_another_site_opens_the_page(
    browser: Any, tmp_path: Path
) -> None:
    """An alert's dashboard link is clicked in a chat, a mail or Alertmanager's page:
    another site. In a browser that opened the printed URL once, the page opens. With
    a ``SameSite=Strict`` cookie it did not (the browser kept the cookie back on a
    navigation that began on another site, and the page answered 401)."""
    from aiohttp import web

    with Cli(tmp_path / "home") as cli:
        proc, address = cli.manager()
        url = cli.line_with(proc, "dashboard on").split("dashboard on", 1)[1].strip()
        base = _base(address)  # http://127.0.0.1:PORT
        app = web.Application()
        page = f"<html><body><a id='go' href='{base}/'>dashboard</a></body></html>"

        async def link(_: web.Request) -> web.Response:
            return web.Response(text=page, content_type="text/html")

        app.router.add_get("/", link)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            port = runner.addresses[0][1]
            await anyio.to_thread.run_sync(browser.get, url)  # the printed URL, once
            assert browser.current_url == base + "/"
            # another site: localhost is not 127.0.0.1
            await anyio.to_thread.run_sync(browser.get, f"http://localhost:{port}/")
            await anyio.to_thread.run_sync(lambda: browser.find_element("id", "go").click())
            Dashboard(browser).wait(
                f"return location.href === {json.dumps(base + '/')} && "
                "document.readyState === 'complete'",
                "the link's page to load",
                30,
            )
            shown = browser.execute_script("return document.body.innerText.slice(0, 300)")
            assert browser.title == "Corral dashboard", shown
        finally:
            await runner.cleanup()


def parse_record(i: int) -> int:
    """A task that fails as a user's would."""
    raise ValueError(f"record {i}: unexpected field 'qty' in orders.csv")


def square(i: int) -> int:
    """A task that takes a moment (simulated work), so the task stream shows it."""
    time.sleep(0.2 + 0.05 * i)
    return i * i


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(240)
async def test_the_dashboard_in_chromium_follows_a_real_run(browser: Any, tmp_path: Path) -> None:
    gate, started = tmp_path / "gate", tmp_path / "started"
    page = Dashboard(browser)

    async def in_browser(fn: Any, *args: Any) -> Any:
        return await anyio.to_thread.run_sync(fn, *args)

    # Pool cpu: the two workers started below, and blocks the autoscaler asks for in
    # the burst, which stay pending (their provisioning delay outlasts the test), as a
    # batch queue's would. A queue-time rule short enough for a test.
    config = tmp_path / "corral.toml"
    config.write_text(
        '[pools.cpu]\nprovider = "local"\nmin_blocks = 0\ninit_blocks = 0\n'
        "max_blocks = 2\nprovision_delay = 3600\n\n"
        '[alerting]\ninterval = 0.5\n\n[[alerts]]\nname = "QueueTime"\n'
        "expr = 'corral_queue_depth > 0 and corral_queue_oldest_wait_seconds > 1'\n"
        'for = 1\nlabels = {team = "ci", priority = "P2"}\n'
    )
    with Cli(tmp_path / "home") as cli:
        proc, address = cli.manager("--config", str(config))
        url = cli.line_with(proc, "dashboard on").split("dashboard on", 1)[1].strip()
        cli.worker(address, "--cores", "1", "--pool", "cpu")
        cli.worker(address, "--cores", "1", "--pool", "cpu")
        await in_browser(browser.get, url)
        assert browser.current_url == _base(address) + "/"  # the token left the URL
        await in_browser(
            page.wait, "return document.getElementById('conn').className === 'live' && "
            "document.querySelectorAll('tr.worker').length === 2", "the page to go live",
        )  # fmt: skip
        assert page.queue_depth() == 0
        # Each worker's disk: a bar beside its memory bar, used / its limit.
        disks = await in_browser(
            page.wait, "const c = [...document.querySelectorAll('tr.worker td.disk')];"
            "return c.length === 2 && c.every(d => d.querySelector('svg.disk-bar') && "
            "Number(d.dataset.limit) > 0) ? c.map(d => d.innerText) : false;",
            "each worker's disk bar",
        )  # fmt: skip
        # (used: as /metrics counts it, which is more than 0 B when other programs
        # took some of the file system's free space since the worker joined)
        assert all(re.fullmatch(r"\s*[\d.]+ [KMGT]?i?B / [\d.]+ [KMGT]iB", t) for t in disks), disks

        with anyio.fail_after(200):
            async with Cluster(address) as c:
                done = await c.gather([c.submit(square, i) for i in range(6)])
                assert done == [i * i for i in range(6)]
                bad = c.submit(parse_record, 42)
                with pytest.raises(ValueError, match="unexpected field"):
                    await bad
                burst = [
                    c.submit(held_at_gate, str(gate), str(started), pure=False) for _ in range(12)
                ]
                await wait_until(started.exists, "a task of the burst to start", limit=30)
                peak = await in_browser(page.wait_for_queue_depth, 5)
                group = await in_browser(page.wait_for_failure_group, "parse_record", "ValueError")
                assert "1 x" in group and "unexpected field 'qty'" in group, group
                free = browser.find_element("id", "free").text  # no worker lost: none
                assert "no try lost with its worker for a reason that says nothing" in free, free
                await in_browser(
                    page.wait, "return document.querySelectorAll('rect.try').length >= 6",
                    "the task stream to show the finished tries",
                )  # fmt: skip
                # The burst waits: the queue-time rule goes pending, then fires.
                firing = await in_browser(page.wait_for_alert, "QueueTime")
                assert "max_queue_size" in firing and "P2" in firing, firing
                # The blocks asked for show as pending capacity, the strategy in force.
                capacity = await in_browser(
                    page.wait, "const c = document.getElementById('capacity').innerText;"
                    "return c.includes('2 pending (the oldest asked for ') ? c : false;",
                    "the pool's two pending blocks",
                )  # fmt: skip
                assert "1 host: " in capacity and "2 busy" in capacity, capacity  # one machine
                policies = browser.find_element("id", "policies").text
                assert re.search(r"scaling\s+demand", policies), policies
                await in_browser(page.screenshot, tmp_path / "dashboard.png")
                gate.touch()
                assert [await f for f in burst] == ["opened"] * 12
                await in_browser(page.wait_for_empty_queue)
                await in_browser(page.wait_for_alert, "QueueTime", "resolved")

                # One click from the failed task to its story.
                link = await in_browser(
                    browser.find_element, "css selector", ".failure .story-link"
                )
                assert link.text == bad.key
                await in_browser(link.click)
                await in_browser(
                    page.wait, "const k = document.getElementById('story-key');"
                    "return k && document.getElementById('story').innerText.includes('erred')",
                    "the story page",
                )  # fmt: skip
                assert browser.find_element("id", "story-key").text == bad.key
                text = browser.find_element("tag name", "body").text
                assert "ValueError: record 42: unexpected field 'qty'" in text
                assert "Traceback" in text
    assert peak >= 5 and (tmp_path / "dashboard.png").stat().st_size > 10_000


@pytest.mark.slow
def test_chromium_renders_alerts_from_an_alerts_reply(browser: Any, tmp_path: Path) -> None:
    """The page draws what an AlertsReply holds (pending, firing, resolved; labels,
    fields, a dashboard link), checked in the browser right after it renders."""
    with Cli(tmp_path / "home") as cli:
        proc, _ = cli.manager()
        url = cli.line_with(proc, "dashboard on").split("dashboard on", 1)[1].strip()
        browser.get(url)
        page = Dashboard(browser)
        page.wait("return document.body.dataset.snapshots >= 1", "a first snapshot")
        metrics, status, alerts = _answers()
        more = (
            AlertInfo("StuckBlocks", "pending", labels={"pool": "gpu"}),
            AlertInfo("NoWorkers", "resolved", resolved_at=1.0),
        )
        alerts = AlertsReply(alerts=(*more, *alerts.alerts), audit=("scaled cpu out by 2",))
        status = dataclasses.replace(status, warnings=("host box/1: m1, m2 add up to 47.1 GiB",))
        snap = build_snapshot(metrics, status, alerts, now=1000.0)
        shown = browser.execute_script(
            "render(arguments[0]);"
            "return [...document.querySelectorAll('.alert')].map(a => [a.dataset.name,"
            " a.dataset.state, a.innerText]);",
            snap,
        )
        queues = browser.execute_script(
            "return [...document.querySelectorAll('.queue-depth')].map(q => q.innerText);"
        )
        warned = browser.execute_script(
            "return [...document.querySelectorAll('#capacity .warning')].map(w => w.innerText);"
        )
    assert [(n, s) for n, s, _ in shown] == [
        ("QueueTimeHigh", "firing"),  # firing first
        ("StuckBlocks", "pending"),
        ("NoWorkers", "resolved"),
    ]
    firing = shown[0][2]
    assert "FIRING" in firing and "pool=cpu" in firing and "max_queue_size=7" in firing
    assert "dashboard: /" in firing
    # cpu (and the 2 of any pool its workers may run), then any pool (none held back)
    assert queues == ["7 (2 held back) (+2 of any pool)", "2"]
    # the scheduler's warnings, above the capacity table (docs/memory.md)
    assert len(warned) == 1 and "m1, m2 add up to 47.1 GiB" in warned[0]


#: the ports of 127.0.0.1 the managers of the tests below that keep to a range listen on
PORTS = (53300, 53499)

#: Run in the page before its own script: the states the page shows, each change once
#: (a MutationObserver's callback runs after the task that changed the page, so each
#: state is one a screenshot could have taken), from its parsing on: the badge's text
#: and class, the total queue depth's text and value, the snapshots rendered.
RECORD_STATES = """
window.states = [];
function record() {
  const c = document.getElementById("conn"), d = document.getElementById("queue-depth-total");
  if (!c || !d) return;
  const s = [c.textContent, c.className, d.textContent, d.dataset.value ?? null,
             document.body.dataset.snapshots ?? null];
  const last = window.states[window.states.length - 1];
  if (JSON.stringify(last) !== JSON.stringify(s)) window.states.push(s);
}
new MutationObserver(record).observe(document, {subtree: true, childList: true,
                                               characterData: true, attributes: true});
"""


def test_the_page_as_served_shows_no_figure_before_its_first_snapshot() -> None:
    """What a browser shows of ``GET /`` before its script has a snapshot (a screenshot
    taken early, a slow link): a dash and a grey ``connecting`` badge, not the green
    ``live`` and a queue depth of 0 it showed as soon as its websocket opened."""
    header = re.search(r'<span id="conn"[^>]*>([^<]*)</span>', PAGE)
    total = re.search(r'<b id="queue-depth-total"([^>]*)>([^<]*)</b>', PAGE)
    assert header is not None and header.group(1) == "connecting"
    assert total is not None and total.group(2) == "&ndash;"
    assert "data-value" not in total.group(1)  # no number until a snapshot gives one
    # the socket's opening is no snapshot: the badge goes live in render() only
    opened = re.search(r"ws\.onopen = [^;]*;", PAGE)
    assert opened is not None and "live" not in opened.group(0), opened


@pytest.mark.slow
def test_chromium_shows_a_dash_and_connecting_until_the_first_snapshot(
    browser: Any, tmp_path: Path
) -> None:
    port = free_port_between(*PORTS)
    with Cli(tmp_path / "home") as cli:
        proc = cli.start("manager", "--listen", f"127.0.0.1:{port}")
        url = cli.line_with(proc, "dashboard on").split("dashboard on", 1)[1].strip()
        browser.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": RECORD_STATES})
        browser.get(url)
        Dashboard(browser).wait("return document.body.dataset.snapshots >= 1", "a snapshot")
        states = browser.execute_script("return window.states")
    first = next(i for i, st in enumerate(states) if st[4] is not None)
    # every state before the first snapshot: no figure, and not live
    assert first >= 1 and states[:first] == [["connecting", "", "\u2013", None, None]] * first
    # then the queue depth of a manager with no task, rightly 0, and live
    assert states[first] == ["live", "live", "0", "0", "1"], states


@pytest.mark.anyio
async def test_a_page_is_told_why_there_is_no_snapshot() -> None:
    """The manager does not answer in time: the page reads the real cause (the asks
    run in a task group, whose ExceptionGroup said nothing of it before)."""
    from runtime.dashboard import DashboardFeed, Sources
    from runtime.errors import AskTimeout

    async def metrics() -> MetricsReply:
        raise AskTimeout("manager", "MetricsRequest", 10.0)

    async def status() -> StatusReply:
        return StatusReply()

    async def alerts() -> AlertsReply:
        return AlertsReply()

    async def story(key: str) -> list[Any]:
        return []

    class Page:  # stands in for an open websocket
        def __init__(self) -> None:
            self.sent: list[str] = []

        async def send_str(self, text: str) -> None:
            self.sent.append(text)

    page = Page()
    feed = DashboardFeed(Sources(metrics, status, alerts, story), interval=0.05)
    feed.pages.add(page)
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(feed.run)
            await wait_until(lambda: page.sent, "a message to the page")
            tg.cancel_scope.cancel()
    error = json.loads(page.sent[0])["error"]
    assert error.startswith("no snapshot: AskTimeout: "), error
    assert "MetricsRequest" in error


@pytest.mark.anyio
async def test_a_story_the_manager_cannot_answer_in_time_is_a_503() -> None:
    """The story page of a task while the manager is too busy to answer: 503 with the
    reason (try again), not a 500 from an AskTimeout raised out of the handler."""
    from aiohttp.test_utils import make_mocked_request

    from runtime.dashboard import DashboardFeed, Sources, dashboard_routes
    from runtime.errors import AskTimeout

    async def busy(*args: Any) -> Any:
        raise AskTimeout("manager", "StoryQuery", 10.0)

    feed = DashboardFeed(Sources(busy, busy, busy, busy))
    story = dashboard_routes(feed)[STORY_PATH]
    with anyio.fail_after(30):
        reply = await story(make_mocked_request("GET", STORY_PATH + "?key=t-1"), "read")
    assert reply.status == 503 and "did not answer" in reply.text, (reply.status, reply.text)


# ----------------------------------------------------------------------------- the line's history


def test_the_feed_keeps_two_minutes_of_queue_depth() -> None:
    """The feed's samples of the total queue depth, by time (a virtual clock): the
    last HISTORY seconds, oldest first, whatever the interval."""
    from runtime.dashboard import HISTORY, MAX_DEPTHS, DashboardFeed, Sources

    async def never(*args: Any) -> Any:
        raise AssertionError("nothing is asked")

    feed = DashboardFeed(Sources(never, never, never, never))
    for t in range(300):  # one sample a second: a burst of 28 from 200 to 230 s
        feed.record_depth(float(t), 28 if 200 <= t < 230 else 0)
    assert [t for t, _ in feed.depths] == [float(t) for t in range(179, 300)]  # 120 s
    assert max(d for _, d in feed.depths) == 28
    feed.record_depth(299.5, 3)
    assert feed.depths[0] == (180.0, 0) and feed.depths[-1] == (299.5, 3)
    feed.record_depth(500.0, 0)  # after a gap: the old samples go
    assert list(feed.depths) == [(500.0, 0)]
    for i in range(3 * MAX_DEPTHS):  # many samples in a short time: bounded
        feed.record_depth(600.0 + i * HISTORY / (3 * MAX_DEPTHS), 1)
    assert len(feed.depths) == MAX_DEPTHS


@pytest.mark.anyio
async def test_with_no_page_open_the_feed_samples_only_the_queue_depth() -> None:
    """No page open: no snapshot is built, the feed asks the queue depth once per
    interval and keeps it (a page that opens gets them in its first snapshot)."""
    from runtime.dashboard import DashboardFeed, Sources

    depths = iter([0, 21, 28, 5, 0, 0, 0, 0, 0, 0, 0, 0])
    clock = itertools.count(1000.0)  # a virtual clock: one second a call

    async def depth() -> int:
        return next(depths)

    async def never(*args: Any) -> Any:
        raise AssertionError("no snapshot without a page")

    feed = DashboardFeed(
        Sources(never, never, never, never, depth), interval=0.001, clock=lambda: next(clock)
    )
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(feed.run)
            await wait_until(lambda: len(feed.depths) >= 6, "six samples")
            tg.cancel_scope.cancel()
    assert feed.builds == 0 and feed.errors == 0
    assert [d for _, d in feed.depths][:6] == [0, 21, 28, 5, 0, 0]
    assert [t for t, _ in feed.depths][:6] == [1000.0 + i for i in range(6)]


async def _depth_history(address: str, read: str) -> list[list[float]]:
    """The queue depth history a page gets with its first snapshot, less that
    snapshot's own sample (a page opened for it: it made the feed build one)."""
    base = _base(address)
    async with _session() as s:
        async with s.get(f"{base}/", params={"token": read}) as r:
            assert r.status == 200
        async with s.ws_connect(base + FEED_PATH) as ws:
            first = await ws.receive_json()
    history: list[list[float]] = first["depth_history"]
    assert history[-1] == [first["time"], first["queue_depth"]]
    return history[:-1]


async def _depth_history_until(
    address: str, read: str, ok: Callable[[list[int]], bool]
) -> list[int]:
    """The depths of :func:`_depth_history` once ``ok`` of them (asked every 0.2 s)."""
    while True:
        depths = [int(d) for _, d in await _depth_history(address, read)]
        if ok(depths):
            return depths
        await anyio.sleep(0.2)


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(180)
async def test_a_page_opened_after_a_burst_shows_it_on_the_line(
    browser: Any, tmp_path: Path
) -> None:
    """The audit: an alert's dashboard link followed after the queue had drained. The
    line of the last two minutes shows the burst (it began when the page opened, so it
    read 'max 1' with the queue at 0 all along)."""
    gate, started = tmp_path / "gate", tmp_path / "started"
    page = Dashboard(browser)
    with Cli(tmp_path / "home") as cli:
        proc, address = cli.manager()
        url = cli.line_with(proc, "dashboard on").split("dashboard on", 1)[1].strip()
        read = cli.tokens(address)["read"]
        cli.worker(address, "--cores", "1")
        with anyio.fail_after(120):
            async with Cluster(address) as c:
                burst = [
                    c.submit(held_at_gate, str(gate), str(started), pure=False) for _ in range(8)
                ]
                await wait_until(started.exists, "a task of the burst to start", limit=30)
                # No page open: the feed samples the queue by itself.
                seen = await _depth_history_until(address, read, lambda ds: any(ds))
                peak = max(seen)
                gate.touch()
                assert [await f for f in burst] == ["opened"] * 8
                # The queue is back to 0, and the feed has sampled it so.
                await _depth_history_until(address, read, lambda ds: ds[-1:] == [0])
            await anyio.to_thread.run_sync(browser.get, url)
            top = await anyio.to_thread.run_sync(
                page.wait, "const s = document.getElementById('depth-spark');"
                "return document.body.dataset.snapshots >= 1 && s.dataset.max;",
                "the page's first snapshot and line",
            )  # fmt: skip
            assert page.queue_depth() == 0
            label = browser.find_element("css selector", "#depth-spark text").text
    assert peak > 0 and int(top) >= peak, (peak, label)
    assert label == f"queue depth, last 2 min (max {top})"


SOAK_PORTS = (64000, 64499)  #: the ports the next test listens on


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_after_its_first_snapshot_a_page_gets_only_the_tries_new_since_the_last(
    tmp_path: Path,
) -> None:
    """A user audit (soak): the feed sent the last 300 tries whole every second, most
    of each message (40-55 KB at 20 tasks a second). A page's first snapshot has the
    whole stream; each later one only the tries that ended since (``stream_new``),
    numbered on (``n``), none twice; the page keeps the list."""
    port = free_port_between(*SOAK_PORTS)
    wport = free_port_between(*SOAK_PORTS)
    while wport == port:
        wport = free_port_between(*SOAK_PORTS)
    with Cli(tmp_path / "home") as cli:
        manager = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
        address = cli.line_with(manager, "manager listening on").split(" on ", 1)[1].strip()
        cli.worker(address, "--cores", "1", "--port-range", f"{wport}-{wport}")
        base, read = _base(address), cli.tokens(address)["read"]
        with anyio.fail_after(40):
            async with Cluster(address) as c, _session() as s:
                assert await c.gather(c.map(square, range(5))) == [0, 1, 4, 9, 16]
                async with s.get(f"{base}/", params={"token": read}) as r:
                    assert r.status == 200
                ws = await s.ws_connect(base + FEED_PATH)
                try:
                    first = await ws.receive_json()
                    assert "stream_new" not in first
                    assert [t["n"] for t in first["stream"]] == [1, 2, 3, 4, 5]
                    assert await c.gather(c.map(square, range(10, 13))) == [100, 121, 144]
                    new: list[dict[str, Any]] = []
                    while len(new) < 3:
                        snap = await ws.receive_json()
                        assert snap["stream_new"] is True, snap
                        new += snap["stream"]
                    assert [t["n"] for t in new] == [6, 7, 8]
                    assert all(t["key"].startswith("square-") for t in new), new
                    quiet = await ws.receive_json()  # nothing ended since: no try sent
                    assert (quiet["stream"], quiet["stream_new"]) == ([], True)
                finally:
                    await ws.close()


@contextlib.contextmanager
def _page_of_a_manager(browser: Any, tmp_path: Path) -> Iterator[Dashboard]:
    """The page of a manager of no worker, open in ``browser`` after its first snapshot
    (its ``render`` is then fed snapshots of a test's own)."""
    port = free_port_between(*SOAK_PORTS)
    with Cli(tmp_path / "home") as cli:
        proc = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
        url = cli.line_with(proc, "dashboard on").split("dashboard on", 1)[1].strip()
        browser.get(url)
        page = Dashboard(browser)
        page.wait("return document.body.dataset.snapshots >= 1", "a first snapshot")
        yield page


def _failures(*groups: tuple[str, str, str]) -> MetricsReply:
    """The metrics of :func:`_answers` with failure groups (category, its latest key,
    its traceback) of cause ``KeyError``."""
    metrics, _, _ = _answers()
    return dataclasses.replace(metrics, failure_groups=tuple(
        FailureGroupInfo(cat, "KeyError", 1, key, "w1", "error", 1.0, f"KeyError: {key}", tb)
        for cat, key, tb in groups
    ))  # fmt: skip


@pytest.mark.anyio
async def test_after_its_first_snapshot_a_page_gets_a_groups_traceback_only_when_it_changes() -> (
    None
):
    """The scale audit: a failure group's error and traceback (up to 8,000 characters
    each) went to every page every second, though nothing failed since: 60 groups of
    deep tracebacks made each message 245 KB. After the first snapshot, a group whose
    texts are those of the snapshot before comes without them (``same``); a group with
    a new latest failure, or a new group, comes whole; a page that opens gets all."""
    from runtime.dashboard import DashboardFeed, Sources

    deep, other = "Traceback ...\n" + "  frame\n" * 1000, "Traceback ...\n  other\n"
    answers = iter([
        _failures(("etl0", "etl0-1", deep), ("etl1", "etl1-1", deep)),
        _failures(("etl0", "etl0-1", deep), ("etl1", "etl1-1", deep)),  # nothing new
        _failures(("etl0", "etl0-2", other), ("etl1", "etl1-1", deep), ("etl2", "etl2-1", deep)),
    ])  # fmt: skip
    _, status_reply, alerts_reply = _answers()
    got = anyio.Event()

    async def metrics() -> MetricsReply:
        try:
            return next(answers)
        except StopIteration:
            got.set()
            await anyio.sleep_forever()
            raise

    async def status() -> StatusReply:
        return status_reply

    async def alerts() -> AlertsReply:
        return alerts_reply

    async def story(key: str) -> list[Any]:
        return []

    class Page:  # stands in for an open websocket
        def __init__(self) -> None:
            self.sent: list[dict[str, Any]] = []

        async def send_str(self, text: str) -> None:
            self.sent.append(json.loads(text))

    page = Page()
    feed = DashboardFeed(Sources(metrics, status, alerts, story), interval=0.01)
    feed.pages.add(page)  # type: ignore[arg-type]
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            await tg.start(feed.run)
            await got.wait()
            tg.cancel_scope.cancel()
    first, quiet, changed = ([(g["key"], g.get("traceback"), g.get("error"), g.get("same"))
                              for g in snap["failures"]] for snap in page.sent)  # fmt: skip
    assert first == [("etl0-1", deep, "KeyError: etl0-1", None),
                     ("etl1-1", deep, "KeyError: etl1-1", None)]  # fmt: skip
    assert quiet == [("etl0-1", None, None, True), ("etl1-1", None, None, True)]
    assert changed == [("etl0-2", other, "KeyError: etl0-2", None),
                       ("etl1-1", None, None, True),
                       ("etl2-1", deep, "KeyError: etl2-1", None)]  # fmt: skip
    assert len(json.dumps(page.sent[1])) < 4_000 < len(deep)
    opened = json.loads(feed._with_history(feed._latest or {}))  # a page opening now
    assert [g["traceback"] for g in opened["failures"]] == [other, deep, deep]


def test_chromium_keeps_a_groups_traceback_from_the_snapshot_that_sent_it(
    browser: Any, tmp_path: Path
) -> None:
    """A group that comes without its error and traceback (``same``) shows those of
    the snapshot before; one that comes with new ones shows them."""
    with _page_of_a_manager(browser, tmp_path):
        _, status, alerts = _answers()

        def snap(*groups: tuple[str, str, str], same: tuple[str, ...] = ()) -> dict[str, Any]:
            got = build_snapshot(_failures(*groups), status, alerts, now=1000.0)
            for g in got["failures"]:
                if g["category"] in same:
                    del g["error"], g["traceback"]
                    g["same"] = True
            return got

        shown = browser.execute_script(
            "return arguments[0].map(s => { render(s); return [...document."
            "querySelectorAll('.failure')].map(g => [g.dataset.category, "
            "g.querySelector('.err').textContent, g.querySelector('pre').textContent]); });",
            [
                snap(("etl0", "etl0-1", "tb one"), ("etl1", "etl1-1", "tb two")),
                snap(
                    ("etl0", "etl0-1", "tb one"),
                    ("etl1", "etl1-1", "tb two"),
                    same=("etl0", "etl1"),
                ),
                snap(("etl0", "etl0-2", "tb three"), ("etl1", "etl1-1", "tb two"), same=("etl1",)),
            ],
        )
    assert shown == [
        [["etl0", "KeyError: etl0-1", "tb one"], ["etl1", "KeyError: etl1-1", "tb two"]],
        [["etl0", "KeyError: etl0-1", "tb one"], ["etl1", "KeyError: etl1-1", "tb two"]],
        [["etl0", "KeyError: etl0-2", "tb three"], ["etl1", "KeyError: etl1-1", "tb two"]],
    ]


def test_chromium_keeps_the_tries_of_each_snapshot_for_a_minute(
    browser: Any, tmp_path: Path
) -> None:
    """The page keeps the stream's tries: those of a whole snapshot (a page's first),
    plus those new in each later one (``stream_new``), each drawn for 60 s from its end;
    a whole snapshot (after a reconnect) replaces them."""
    with _page_of_a_manager(browser, tmp_path):
        metrics, status, alerts = _answers()

        def snap(now: float, *tries: tuple[int, float], new: bool = True) -> dict[str, Any]:
            ended = tuple(RecentTry(f"inc-{n}", "inc", "w1", "ok", 0.5, ago, "", n)
                          for n, ago in tries)  # fmt: skip
            got = build_snapshot(dataclasses.replace(metrics, recent_tries=ended), status,
                                 alerts, now=now)  # fmt: skip
            return {**got, "stream_new": True} if new else got

        shown = browser.execute_script(
            "return arguments[0].map(s => { render(s); return [...document."
            "querySelectorAll('rect.try title')].map(t => t.textContent.split(' ')[0]); });",
            [
                snap(1000.0, (1, 5.0), (2, 3.0), new=False),  # ended at 995 and 997
                snap(1001.0, (3, 0.5)),
                snap(1002.0),  # none new
                snap(1056.0),  # 995 is 61 s ago
                snap(1100.0, (9, 1.0), new=False),
            ],
        )
    assert shown == [
        ["inc-1", "inc-2"],
        ["inc-1", "inc-2", "inc-3"],
        ["inc-1", "inc-2", "inc-3"],
        ["inc-2", "inc-3"],
        ["inc-9"],
    ]


@pytest.mark.anyio
async def test_two_workers_sharing_a_disk_each_show_their_share_as_the_metrics_do(
    tmp_path: Path,
) -> None:
    """A user audit (analyst, 5): two worker processes started by hand, without
    ``--disk``, on one file system: ``/metrics`` and the database gave each its share
    (what placement counts), the dashboard the whole file system each (used plus the
    free its report measured), twice the metrics' figure. Now the page shows the
    scheduler's figures, the metrics'."""
    port = free_port_between(63000, 63999)
    with Cli(tmp_path) as cli:
        _, address = cli.manager("--listen", f"127.0.0.1:{port}")
        for name in ("d1", "d2"):
            cli.worker(address, "--name", name)
        base, read = _base(address), cli.tokens(address)["read"]
        async with _session() as s:
            async with s.get(f"{base}/", params={"token": read}) as r:
                assert r.status == 200
            ws = await s.ws_connect(base + FEED_PATH)
            try:
                with anyio.fail_after(30):
                    while True:  # until both workers reported their disk
                        snap = await ws.receive_json()
                        workers = {w["id"]: w for w in snap["workers"]}
                        if len(workers) == 2 and all(
                            w["disk_free"] is not None for w in workers.values()
                        ):
                            break
            finally:
                await ws.close()
        _, text = await anyio.to_thread.run_sync(http_get, f"{base}/metrics", read)
    limits = {
        s.labels["worker"]: s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "corral_worker_disk_bytes"
        for s in fam.samples
    }
    assert sorted(limits) == ["d1", "d2"]
    for name, w in workers.items():
        assert w["disk_limit"] == limits[name] > 0  # the share, as /metrics has it
    # the share: the two add up to no more than their file system has free
    assert sum(limits.values()) <= shutil.disk_usage(tempfile.gettempdir()).free


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_an_open_page_says_why_it_cannot_reconnect_and_comes_back_by_itself(
    browser: Any, tmp_path: Path
) -> None:
    """A user audit (a notebook's cluster restarted on its ``port=``): the page open on
    it said "reconnecting" for ever, its figures those of the cluster gone, while the
    new one refused its token. It says why it is down (nothing answers; then its token
    refused: open the printed URL), and once a tab opened the new URL it reconnects."""
    port = free_port_between(*PORTS)
    page = Dashboard(browser)
    with Cli(tmp_path / "home") as cli:
        first = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
        url = cli.line_with(first, "dashboard on").split("dashboard on", 1)[1].strip()
        browser.get(url)
        page.wait("return document.body.dataset.snapshots >= 1", "a first snapshot")
        assert browser.execute_script("return document.getElementById('down').hidden")
        cli.stop([first])
        said = page.wait(
            "return document.body.dataset.down === 'unreachable' && "
            "document.getElementById('down').textContent",
            "the page to say that nothing answers",
        )
        assert f"nothing answers at 127.0.0.1:{port}" in said, said
        assert "cluster.dashboard_link" in said, said

        again = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
        new_url = cli.line_with(again, "dashboard on").split("dashboard on", 1)[1].strip()
        assert new_url != url  # new tokens
        said = page.wait(
            "return document.body.dataset.down === 'token' && "
            "document.getElementById('down').textContent",
            "the page to say that its token is refused",
        )
        assert "started again, with new tokens" in said and "cluster.dashboard_link" in said
        assert browser.execute_script("return document.getElementById('conn').textContent") == (
            "reconnecting"
        )
        # the new URL opened in another tab: its cookie serves this page too
        old = browser.current_window_handle
        browser.switch_to.new_window("tab")
        browser.get(new_url)
        page.wait("return document.body.dataset.snapshots >= 1", "the new tab's snapshot")
        browser.switch_to.window(old)
        page.wait(
            "return document.getElementById('conn').textContent === 'live' && "
            "document.getElementById('down').hidden && !document.body.dataset.down",
            "the old page to reconnect by itself",
        )


def fails_deep(depth: int) -> None:
    """A task that fails with a traceback longer than its box on the page."""
    if depth:
        fails_deep(depth - 1)
    raise ValueError("bad row 7 of orders.csv")


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(150)
async def test_a_traceback_opened_stays_open_and_scrolled_across_snapshots(
    browser: Any, tmp_path: Path
) -> None:
    """A user audit: a failure group's *traceback* clicked open closed within the
    second, each snapshot drawing the panel anew (and a scrolled traceback went back to
    its top). Opened, it stays open where it was scrolled; closed, it stays closed."""
    port = free_port_between(*PORTS)
    page = Dashboard(browser)
    with Cli(tmp_path / "home") as cli:
        proc, address = cli.manager("--listen", f"127.0.0.1:{port}", "--no-monitoring")
        url = cli.line_with(proc, "dashboard on").split("dashboard on", 1)[1].strip()
        cli.worker(address, "--cores", "1")
        with anyio.fail_after(120):
            async with Cluster(address) as c:
                with pytest.raises(ValueError, match="bad row 7"):
                    await c.submit(fails_deep, 40)
            await anyio.to_thread.run_sync(browser.get, url)
            await anyio.to_thread.run_sync(page.wait_for_failure_group, "fails_deep", "ValueError")
            details = "document.querySelector('.failure[data-category=fails_deep] details')"
            scrolled = await anyio.to_thread.run_sync(
                browser.execute_script,
                f"const d = {details}; d.querySelector('summary').click();"
                "const pre = d.querySelector('pre'); pre.scrollTop = 300; return pre.scrollTop;",
            )
            assert scrolled == 300  # longer than its box: it scrolls
            drawn = int(browser.execute_script("return document.body.dataset.snapshots"))
            await anyio.to_thread.run_sync(
                page.wait, f"return document.body.dataset.snapshots >= {drawn + 2}",
                "two more snapshots",
            )  # fmt: skip
            kept = browser.execute_script(
                f"const d = {details}; return [d.open, d.querySelector('pre').scrollTop];"
            )
            assert kept == [True, 300]
            browser.execute_script(f"{details}.querySelector('summary').click()")  # closed
            drawn = int(browser.execute_script("return document.body.dataset.snapshots"))
            await anyio.to_thread.run_sync(
                page.wait, f"return document.body.dataset.snapshots >= {drawn + 2}",
                "two more snapshots",
            )  # fmt: skip
            assert browser.execute_script(f"return {details}.open") is False


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_page_whose_feed_falls_silent_stops_saying_live(browser: Any, tmp_path: Path) -> None:
    """A user audit: a notebook cell blocked the event loop of an embedded cluster's
    manager for 16 s; the open page said "live" (green) all along, its figures frozen.
    Here the manager process is stopped (SIGSTOP: its connections stay open, it sends
    nothing): after 5 s with no snapshot the badge says so, and "live" again once
    snapshots come back."""
    import signal

    port = free_port_between(*PORTS)
    page = Dashboard(browser)
    badge = "document.getElementById('conn')"
    with Cli(tmp_path / "home") as cli:
        proc = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
        url = cli.line_with(proc, "dashboard on").split("dashboard on", 1)[1].strip()
        browser.get(url)
        page.wait(f"return {badge}.textContent === 'live'", "a first snapshot")
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            said = page.wait(
                f"const c = {badge}.textContent; return c.startsWith('no update') && c;",
                "the badge to say the feed fell silent", limit=30,
            )  # fmt: skip
            title = browser.execute_script(f"return {badge}.title")
            assert browser.execute_script(f"return {badge}.className") == "stale"
        finally:
            os.kill(proc.pid, signal.SIGCONT)
        assert re.fullmatch(r"no update for \d+ s", said), said
        assert "event loop is blocked" in title and "notebook cell" in title, title
        page.wait(f"return {badge}.textContent === 'live'", "snapshots again")


def test_chromium_draws_a_full_stream_over_the_seconds_its_tries_cover(
    browser: Any, tmp_path: Path
) -> None:
    """A user audit (10k small tasks, 300 ending a second): the stream keeps the latest
    300 tries, all of the last second, and drew them on a 10 s axis, its workers idle
    for the 9 s before. A full stream is drawn over the seconds it covers, and says
    that it holds the latest 300 only; one that is not full keeps its 10 s steps."""
    port = free_port_between(*SOAK_PORTS)
    with Cli(tmp_path / "home") as cli:
        proc = cli.start("manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring")
        url = cli.line_with(proc, "dashboard on").split("dashboard on", 1)[1].strip()
        browser.get(url)
        Dashboard(browser).wait("return document.body.dataset.snapshots >= 1", "a snapshot")
        metrics, status, alerts = _answers()

        def snap(count: int, span: float) -> dict[str, Any]:
            ended = tuple(
                RecentTry(f"inc-{n}", "inc", f"w{n % 2}", "ok", 0.004, span * (count - n) / count,
                          "", n + 1)
                for n in range(count)
            )  # fmt: skip
            return build_snapshot(dataclasses.replace(metrics, recent_tries=ended), status,
                                  alerts, now=1000.0)  # fmt: skip

        shown = browser.execute_script(
            "return arguments[0].map(s => { render(s); const note = "
            "document.getElementById('stream-capped'); return [document.querySelectorAll("
            "'rect.try').length, [...document.querySelectorAll('#stream svg > text')]."
            "map(t => t.textContent).filter(t => t.endsWith(' s'))[0], note && "
            "note.textContent]; });",
            [snap(300, 0.8), snap(40, 0.8)],
        )
    assert shown == [
        [300, "-0.8 s", "the latest 300 tries only, which ended in the last 800 ms: more end "
                        "than the stream keeps (the pools' figures count them all)"],
        [40, "-10 s", None],
    ]  # fmt: skip
