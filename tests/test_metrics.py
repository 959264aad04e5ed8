"""Metrics: computed by the pure cores from their counters at chosen times (exact values),
rendered in Prometheus' text format, and served by a real manager process on
``GET /metrics`` (with the read token, or on ``--metrics-listen`` without one)."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.autoscaler_state import (
    AutoscalerState,
    BlockEnded,
    BlockRequeued,
    BlockStarted,
    BlockStartFailed,
    Resumed,
    StartBlock,
    TargetSet,
)
from actors.scheduler import Scheduler
from actors.scheduler_events import (
    CancelRequested,
    Execute,
    GraphSubmitted,
    KeysReleased,
    TasksFinished,
    WorkerAway,
    WorkerDraining,
    WorkerJoined,
    WorkerLeft,
)
from actors.scheduler_records import SchedulerConfig
from actors.scheduler_state import SchedulerState, quantile
from runtime import Cluster
from runtime.messages import (
    BlockMetrics,
    CategoryMetrics,
    FailureCount,
    MetricsReply,
    MetricsRequest,
    MonitorFeed,
    PoolMetrics,
    StatusRequest,
    TasksDone,
    WorkerMemoryReport,
)
from runtime.metrics import render
from tests.helpers import (
    GB,
    Cli,
    FixedClock,
    PostedRef,
    external_binary,
    free_port,
    held_at_gate,
    http_get,
    registered,
    result,
    scraped,
    specs_for,
    wait_until,
)
from tests.test_policy_swaps import Raises

# ----------------------------------------------------------------------------- cores


def _submit(st: SchedulerState, keys: list[str], now: float, **attrs: Any) -> None:
    specs = specs_for(st, {k: [] for k in keys}, keys, attrs={k: attrs for k in keys})
    st.handle(GraphSubmitted(f"s{now}", now, specs=specs, wanted=tuple(keys)))


def _executed(cmds: list[Any]) -> list[str]:
    return [str(t.key) for c in cmds if isinstance(c, Execute) for t in c.tasks]


def test_quantile_is_nearest_rank() -> None:
    assert quantile([], 0.9) == 0.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 3.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.9) == 4.0
    assert quantile([5.0], 0.99) == 5.0


def test_queue_depth_oldest_wait_and_wait_quantiles_at_chosen_times() -> None:
    st = SchedulerState(SchedulerConfig(saturation=1.0))
    _submit(st, ["a-0", "a-1", "a-2"], 10.0)
    _submit(st, ["b-0", "b-1"], 20.0)
    pools = st.pool_metrics(25.0)
    assert pools["*"]["queue_depth"] == 5
    assert pools["*"]["oldest_wait"] == 15.0  # a-* became ready at 10
    assert pools["*"]["wait_quantiles"] == {}  # none served yet

    cmds = st.handle(WorkerJoined("j", 30.0, worker="w", cores=2, memory=GB, pool="cpu"))
    ran = _executed(cmds)
    assert len(ran) == 2 and all(k.startswith("a-") for k in ran)  # oldest submission first
    (left,) = {"a-0", "a-1", "a-2"} - set(ran)
    pools = st.pool_metrics(30.0)
    assert pools["*"]["queue_depth"] == 3
    assert pools["*"]["oldest_wait"] == 20.0  # the third a-*, ready since 10
    # served waits count in the pool of the worker that took them, as the monitoring
    # database's tries and workers rows count them (docs/monitoring.md)
    assert pools["cpu"]["waits"] == 2 and pools["cpu"]["wait_sum"] == 40.0
    assert pools["*"]["waits"] == 0
    assert pools["cpu"]["running"] == 2
    assert pools["cpu"]["workers"] == {"idle": 0, "busy": 1, "draining": 0, "away": 0}

    res = result(ran[0], start=30.0, duration=10.0)
    cmds = st.handle(TasksFinished("f", 40.0, worker="w", results=(res,)))
    assert _executed(cmds) == [left]  # waited 30 s
    pools = st.pool_metrics(45.0)
    assert pools["*"]["queue_depth"] == 2
    assert pools["*"]["oldest_wait"] == 25.0  # b-*, ready since 20
    # waits served: 20, 20, 30
    assert pools["cpu"]["waits"] == 3 and pools["cpu"]["wait_sum"] == 70.0
    assert pools["cpu"]["wait_quantiles"] == {"0.5": 20.0, "0.9": 30.0, "0.99": 30.0}
    assert pools["*"]["waits"] == 0 and pools["*"]["wait_quantiles"] == {}
    assert st.stats["a"].count == 1 and st.stats["a"].total_duration == 10.0


def test_a_draining_worker_running_tasks_counts_its_cores_busy() -> None:
    # The operator's scarce pool: its only worker drained while it ran its tasks read
    # 0 busy workers (the states are exclusive); its cores say what it did.
    # (new-category tasks counted short, so the 1-core worker takes 2: busy stays 1)
    st = SchedulerState(SchedulerConfig(saturation=2.0, unknown_long=False))
    _submit(st, ["test-0", "test-1", "test-2", "test-3"], 1.0, pool="scarce")
    cmds = st.handle(WorkerJoined("j", 2.0, worker="s1", cores=1, memory=GB, pool="scarce"))
    assert len(_executed(cmds)) == 2  # 2 slots on 1 core: one runs, one waits on it
    st.handle(WorkerJoined("j2", 2.0, worker="c1", cores=4, memory=GB, pool="cpu"))
    pools = st.pool_metrics(3.0)
    assert (pools["scarce"]["cores"], pools["scarce"]["cores_busy"]) == (1, 1)
    assert (pools["cpu"]["cores"], pools["cpu"]["cores_busy"]) == (4, 0)
    st.handle(WorkerDraining("d", 4.0, "s1"))
    pools = st.pool_metrics(5.0)
    assert pools["scarce"]["workers"] == {"idle": 0, "busy": 0, "draining": 1, "away": 0}
    assert (pools["scarce"]["cores"], pools["scarce"]["cores_busy"]) == (1, 1)
    snap = MetricsReply(pools={p: PoolMetrics(**m) for p, m in pools.items()})
    got = _samples(render(snap).decode())
    scarce = (("pool", "scarce"),)
    assert got[("corral_cores", scarce)] == 1 and got[("corral_cores_busy", scarce)] == 1
    assert got[("corral_cores_busy", (("pool", "cpu"),))] == 0
    assert got[("corral_workers", (("pool", "scarce"), ("state", "busy")))] == 0
    # their memory limits, as their RSS: the dashboard's bar (a user audit could not
    # make it from /metrics); a worker away is not counted
    assert got[("corral_worker_memory_limit_bytes", scarce)] == GB
    assert got[("corral_worker_memory_limit_bytes", (("pool", "cpu"),))] == GB
    st.handle(WorkerAway("a", 6.0, "c1"))
    assert st.pool_metrics(7.0)["cpu"]["memory_limit_bytes"] == 0


def test_worker_rss_is_the_latest_batch_of_results_or_memory_report_s() -> None:
    """A worker that never throttles or spills sends no memory report: its RSS comes
    with its batches of results (the RSS after each), summed per pool."""
    st = SchedulerState(SchedulerConfig(saturation=1.0))
    _submit(st, ["a-0", "a-1"], 1.0)
    st.handle(WorkerJoined("j1", 2.0, worker="w1", cores=1, memory=GB, pool="cpu"))
    st.handle(WorkerJoined("j2", 2.0, worker="w2", cores=1, memory=GB, pool="cpu"))
    assert st.pool_metrics(2.0)["cpu"]["rss_bytes"] == 0
    on = {str(t.key): ws.id for ws in st.workers.values() for t in ws.processing}
    for key, rss in (("a-0", 300), ("a-1", 500)):
        res = result(key, start=2.0, rss=rss)
        st.handle(TasksFinished("f", 3.0, worker=on[key], results=(res,), rss=rss))
    assert st.pool_metrics(3.0)["cpu"]["rss_bytes"] == 800
    st.handle(WorkerLeft("l", 4.0, worker=on["a-0"], cause="drained"))
    assert st.pool_metrics(4.0)["cpu"]["rss_bytes"] == 500


def test_a_process_worker_s_rss_is_its_whole_rss_not_one_task_process_s() -> None:
    """User audit (monitor, defect 2): on an ``--execution process`` worker each
    result's RSS is its task process's (44 MiB), while its memory reports carry the
    worker's with its task processes (164 MiB). Both overwrote the worker's RSS, so
    ``corral_worker_rss_bytes``, ``status()["rss"]`` and the monitoring database's
    ``resource_samples`` (the scheduler's feed) flapped between the two. Now the
    worker's RSS is the one its batch of results comes with (``TasksDone.rss``: its
    sample right after them, what its fences act on) or its memory report's, and a
    result's own RSS stays the task's (its category's ``peak_rss``)."""
    mb = 2**20
    s = Scheduler(lambda: PostedRef(), lambda: PostedRef())  # type: ignore[arg-type, return-value]
    s.clock = FixedClock()  # type: ignore[assignment]
    core = s.state
    keys = [f"a-{i}" for i in range(4)]
    _submit(core, keys, 1.0)
    core.handle(WorkerJoined("j", 2.0, worker="w1", cores=2, memory=GB, pool="cpu"))
    s.workers["w1"] = PostedRef()  # type: ignore[assignment]

    def seen() -> tuple[float, ...]:
        """The worker's RSS, in MiB, as /metrics, status() and the database see it."""
        pool = s.metrics(MetricsRequest())["pools"]["cpu"].rss_bytes
        status = s.status(StatusRequest())["rss"].get("w1", 0)
        feed = s.monitor_feed(MonitorFeed()).workers.get("w1", (0,))[0]
        return (pool / mb, status / mb, feed / mb)

    def report(rss: int) -> None:
        s.worker_memory(WorkerMemoryReport("w1", False, rss * mb, int(0.7 * GB), GB))

    def done(rss: int) -> None:
        """The two tries running on w1 end, each task process at 44 MiB."""
        running = [t.key for t in core.workers["w1"].processing]
        results = tuple(result(k, start=2.0, rss=44 * mb, rss_peak=46 * mb) for k in running)
        s.tasks_done(TasksDone("w1", results, rss * mb))

    values = []
    report(160)
    values.append(seen())
    done(164)
    values.append(seen())
    report(150)
    values.append(seen())
    done(0)  # not measured (a report made for tries that could not be sent): kept
    values.append(seen())
    assert values == [(160.0,) * 3, (164.0,) * 3, (150.0,) * 3, (150.0,) * 3]
    assert core.count("memory") == 4
    assert core.stats["a"].peak_rss == 46 * mb  # the task's own, as before


def test_the_oldest_wait_follows_the_tasks_that_leave_the_queue() -> None:
    st = SchedulerState(SchedulerConfig(saturation=1.0))
    _submit(st, ["x-0"], 1.0, pool="gpu")
    _submit(st, ["y-0"], 3.0, pool="gpu")
    assert st.pool_metrics(4.0)["gpu"]["oldest_wait"] == 3.0
    st.handle(WorkerJoined("j", 5.0, worker="g", cores=1, memory=GB, pool="gpu"))
    pools = st.pool_metrics(6.0)
    assert pools["gpu"]["queue_depth"] == 1
    assert pools["gpu"]["oldest_wait"] == 3.0  # y-0 now, ready since 3
    assert pools["gpu"]["wait_quantiles"] == {"0.5": 4.0, "0.9": 4.0, "0.99": 4.0}


def test_waits_count_in_the_pool_of_the_worker_that_took_the_task() -> None:
    """Tasks any pool may run (``*``) wait in that queue, but a served wait counts in
    the pool of the worker that took it: the waits the monitoring database's documented
    query gives (``tries.sent - tries.queued`` joined to the worker's pool)."""
    st = SchedulerState(SchedulerConfig(saturation=1.0, monitor=True))
    _submit(st, ["a-0", "a-1", "a-2"], 1.0)
    _submit(st, ["s-0"], 2.0, pool="small")
    st.handle(WorkerJoined("j1", 4.0, worker="d", cores=2, memory=GB, pool="default"))
    st.handle(WorkerJoined("j2", 7.0, worker="s", cores=2, memory=GB, pool="small"))
    on = {str(t.key): ws.id for ws in st.workers.values() for t in ws.processing}
    assert sorted(on.values()) == ["d", "d", "s", "s"]  # an a-* ran on the small worker
    for key, wid in on.items():
        st.handle(TasksFinished("f", 9.0, worker=wid, results=(result(key, start=8.0),)))
    pools = st.pool_metrics(10.0)
    assert pools["default"]["waits"] == 2 and pools["default"]["wait_sum"] == 6.0
    assert pools["small"]["waits"] == 2 and pools["small"]["wait_sum"] == 5.0 + 6.0
    assert pools["*"]["waits"] == 0 and pools["*"]["queue_depth"] == 0
    # the database's side: each ended try's wait, in its worker's pool
    items, _, _ = st.feed_since(0, 1_000)
    records = [r for _, rs in items for r in rs]
    pool_of = {r[1]: r[2] for r in records if r[0] == "joined"}
    waits: dict[str, list[float]] = {}
    for r in records:
        if r[0] == "try":
            waits.setdefault(pool_of[r[3]], []).append(r[5] - r[12])
    for pool, ws in waits.items():
        assert (pools[pool]["waits"], pools[pool]["wait_sum"]) == (len(ws), sum(ws)), pool


def test_a_pool_with_no_task_no_worker_and_no_configuration_leaves_the_metrics() -> None:
    """A misspelt pool's task, released: the pool's series go, unless it is configured
    (the manager names its configured pools)."""
    st = SchedulerState(SchedulerConfig(saturation=1.0))
    _submit(st, ["x-0"], 1.0, pool="smal")
    assert st.pool_metrics(2.0)["smal"]["queue_depth"] == 1
    st.handle(CancelRequested("c", 3.0, keys=("x-0",)))
    assert st.pool_metrics(4.0)["smal"]["queue_depth"] == 0  # the task is still known
    st.handle(KeysReleased("r", 5.0, keys=("x-0",)))
    assert "smal" not in st.pool_metrics(6.0)
    assert "*" not in st.pool_metrics(6.0)
    assert st.pool_metrics(6.0, ("smal", "gpu"))["smal"]["queue_depth"] == 0
    assert st.pool_metrics(6.0, ("smal", "gpu"))["gpu"]["waits"] == 0
    text = render(
        MetricsReply(pools={p: PoolMetrics(**m) for p, m in st.pool_metrics(6.0).items()})
    )
    assert b'pool="smal"' not in text


def test_failures_by_outcome_and_cause() -> None:
    st = SchedulerState(SchedulerConfig(saturation=1.0))
    _submit(st, ["bad-0", "lost-0"], 1.0, retries=0)
    cmds = st.handle(WorkerJoined("j", 2.0, worker="w", cores=2, memory=GB, pool="cpu"))
    assert sorted(_executed(cmds)) == ["bad-0", "lost-0"]
    res = result("bad-0", "error", start=2.0, error=ValueError("no"))
    st.handle(TasksFinished("f", 3.0, worker="w", results=(res,)))
    st.handle(WorkerLeft("l", 4.0, worker="w", cause="preempted"))
    assert st.failure_counts() == {
        ("bad", "error", "ValueError"): 1,
        ("lost", "worker-lost", "preempted"): 1,
    }
    assert "cpu" not in st.pool_metrics(5.0)  # its only worker left


def test_pending_blocks_count_apart_with_their_age() -> None:
    st = AutoscalerState()
    cmds = st.handle(TargetSet(0.0, "p", 2, "spec"))
    requests = [c.request for c in cmds if isinstance(c, StartBlock)]
    assert len(requests) == 2
    blocks = st.block_metrics(5.0, {})
    assert blocks["p"]["states"] == {"requested": 2}
    assert blocks["p"]["oldest_pending"] == 5.0
    assert blocks["p"]["target"] == 2
    st.handle(BlockStarted(8.0, requests[0], "b1", ("w1",), "pending"))
    st.handle(BlockStarted(9.0, requests[1], "b2", ("w2",), "running"))
    blocks = st.block_metrics(12.0, {"b1": "pending", "b2": "running"})
    assert blocks["p"]["states"] == {"pending": 1, "running": 1}
    assert blocks["p"]["oldest_pending"] == 12.0  # b1, counted from its request at 0
    blocks = st.block_metrics(12.0, {"b1": "running", "b2": "running"})
    assert blocks["p"]["states"] == {"running": 2}
    assert blocks["p"]["oldest_pending"] == 0.0


def test_a_paused_pool_is_suspended_until_resumed() -> None:
    """A pool whose provider stopped submitting asks for no block: the gauge
    ``corral_pool_suspended`` says so (the default rule CorralPoolSuspended reads it)
    until an operator resumes the pool."""
    st = AutoscalerState()
    cmds = st.handle(TargetSet(0.0, "p", 1, "spec"))
    (request,) = [c.request for c in cmds if isinstance(c, StartBlock)]
    assert st.block_metrics(1.0, {})["p"]["suspended"] == 0
    failed = BlockStartFailed(
        1.0, request, "sbatch: error: Batch job submission failed", batch=True,
        command="sbatch", suspended=True,
    )  # fmt: skip
    st.handle(failed)
    blocks = st.block_metrics(2.0, {})
    assert blocks["p"]["suspended"] == 1
    text = render(MetricsReply(blocks={"p": BlockMetrics(**blocks["p"])})).decode()
    assert _samples(text)[("corral_pool_suspended", (("pool", "p"),))] == 1.0
    st.handle(Resumed(3.0, "p"))
    assert st.block_metrics(3.0, {})["p"]["suspended"] == 0


def test_block_ends_are_counted_per_pool_and_cause() -> None:
    """``corral_block_ends_total{pool, cause}``: each end and requeue the autoscaler
    lists counts under its cause, so an operator can graph how often the batch system's
    owners preempt a pool's blocks (a requeue and an end both count as ``preempted``)."""
    st = AutoscalerState()
    cmds = st.handle(TargetSet(0.0, "p", 2, "spec"))
    requests = [c.request for c in cmds if isinstance(c, StartBlock)]
    st.handle(BlockStarted(1.0, requests[0], "b1", ("w1",), "running"))
    st.handle(BlockStarted(1.0, requests[1], "b2", ("w2",), "running"))
    assert st.block_metrics(2.0, {})["p"]["ends"] == {}
    st.handle(BlockRequeued(3.0, "b1", 2, "preempted"))
    st.handle(BlockEnded(4.0, "b2", "preempted"))
    st.handle(BlockEnded(5.0, "b1", "failed"))
    blocks = st.block_metrics(6.0, {})
    text = render(MetricsReply(blocks={"p": BlockMetrics(**blocks["p"])})).decode()
    got = _samples(text)
    assert got[("corral_block_ends_total", (("cause", "preempted"), ("pool", "p")))] == 2
    assert got[("corral_block_ends_total", (("cause", "crash"), ("pool", "p")))] == 1


# ----------------------------------------------------------------------------- exposition


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_render_follows_prometheus_names() -> None:
    cpu_pool = PoolMetrics(
        queue_depth=7, oldest_wait=62.0, wait_quantiles={"0.9": 30.0}, waits=3,
        wait_sum=70.0, running=2, workers={"busy": 1}, spilled_total=5,
    )  # fmt: skip
    snap = MetricsReply(
        pools={"cpu": cpu_pool},
        categories={"inc": CategoryMetrics(4, 2.5, 400, 0, 10)},
        failures=(FailureCount("inc", "error", "ValueError", 2),),
        tasks_by_state={"queued": 7},
        blocks={
            "cpu": BlockMetrics(
                {"pending": 1}, 12.0, 2, 3, stuck=2, taken_back=3, taken_back_by_operator=1
            )
        },
    )
    got = _samples(render(snap).decode())
    cpu = (("pool", "cpu"),)
    assert got[("corral_queue_depth", cpu)] == 7
    assert got[("corral_queue_oldest_wait_seconds", cpu)] == 62.0
    assert got[("corral_queue_wait_seconds", (("pool", "cpu"), ("quantile", "0.9")))] == 30.0
    assert got[("corral_queue_wait_seconds_count", cpu)] == 3
    assert got[("corral_queue_wait_seconds_sum", cpu)] == 70.0
    assert got[("corral_workers", (("pool", "cpu"), ("state", "busy")))] == 1
    assert got[("corral_spilled_bytes_total", cpu)] == 5
    inc = (("category", "inc"),)
    assert got[("corral_task_duration_seconds_count", inc)] == 4
    assert got[("corral_task_duration_seconds_sum", inc)] == 2.5
    assert got[("corral_tasks_finished_total", inc)] == 4
    assert got[("corral_task_output_bytes_total", inc)] == 400
    failed = (("category", "inc"), ("cause", "ValueError"), ("outcome", "error"))
    assert got[("corral_task_failures_total", failed)] == 2
    assert got[("corral_blocks", (("pool", "cpu"), ("state", "pending")))] == 1
    assert got[("corral_blocks_pending_oldest_seconds", cpu)] == 12.0
    assert got[("corral_blocks_stuck_total", cpu)] == 2
    by = (("by", "autoscaler"), ("pool", "cpu"))
    assert got[("corral_blocks_taken_back_total", by)] == 3
    assert got[("corral_blocks_taken_back_total", (("by", "operator"), ("pool", "cpu")))] == 1
    assert got[("corral_tasks", (("state", "queued"),))] == 7


# ----------------------------------------------------------------------------- a real manager


def _http(address: str) -> str:
    return address.replace("ws://", "http://", 1).rstrip("/") + "/metrics"


@pytest.mark.slow
def test_a_manager_serves_metrics_to_the_read_token_only(tmp_path: Path) -> None:
    with Cli(tmp_path) as cli:
        _, address = cli.manager()
        tokens = cli.tokens(address)
        url = _http(address)
        status, body = http_get(url)
        assert status == 401, body
        status, body = http_get(url, "not-a-token-of-this-manager-0123456789abcdef")
        assert status == 403, body
        for role in ("read", "admin"):
            status, body = http_get(url, tokens[role])
            assert status == 200, body
            got = _samples(body)
            assert got[("corral_tasks_submitted_total", ())] == 0
            assert got[("corral_workers_connected", ())] == 0


@pytest.mark.slow
def test_metrics_listen_serves_without_a_token_and_counts_workers(tmp_path: Path) -> None:
    with Cli(tmp_path) as cli:
        proc, address = cli.manager("--metrics-listen", "127.0.0.1:0")
        url = cli.line_with(proc, "metrics on").split("metrics on", 1)[1].strip()
        cli.worker(address, "--pool", "cpu")
        deadline = time.monotonic() + 30
        while True:  # bounded poll: the worker's registration reaches the scheduler
            status, body = http_get(url)
            assert status == 200, body
            got = _samples(body)
            if got.get(("corral_workers_connected", ()), 0) == 1:
                break
            assert time.monotonic() < deadline, body
            time.sleep(0.1)
        assert got[("corral_workers", (("pool", "cpu"), ("state", "idle")))] == 1


# ----------------------------------------------------------------------------- a real Prometheus


def _prometheus(cli: Cli, tmp_path: Path, address: str) -> tuple[Any, str]:
    """A real Prometheus scraping the manager at ``address`` every second with its read
    token: its process and its API's URL."""
    binary = external_binary("prometheus", "prometheus")
    read = cli.tokens(address)["read"]
    target = address.removeprefix("ws://").rstrip("/")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: corral\n"
        f"    authorization: {{credentials: {read}}}\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    prom = cli.spawn(
        [
            binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
    )  # fmt: skip
    return prom, f"http://127.0.0.1:{port}/api/v1"


@contextlib.contextmanager
def _scraped(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A manager process with a worker of one core, and a real Prometheus scraping it
    every second: the manager's address and Prometheus' API URL."""
    with Cli(tmp_path / "home") as cli:
        _, address = cli.manager()
        cli.worker(address, "--cores", "1")
        prom, api = _prometheus(cli, tmp_path, address)
        try:
            yield address, api
        finally:
            cli.stop([prom])


def _promql(api: str, query: str) -> list[tuple[dict[str, str], float]] | None:
    """The instant vector ``query`` gives now (None: Prometheus does not answer yet)."""
    try:
        status, body = http_get(f"{api}/query?{urllib.parse.urlencode({'query': query})}")
    except urllib.error.URLError:  # Prometheus not listening yet
        return None
    if status != 200:
        return None
    return [(r["metric"], float(r["value"][1])) for r in json.loads(body)["data"]["result"]]


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(150)
async def test_prometheus_scrapes_the_queue_depth_of_a_running_graph(tmp_path: Path) -> None:
    gate, started = tmp_path / "gate", tmp_path / "started"
    with _scraped(tmp_path) as (address, api):
        with anyio.fail_after(120):
            async with Cluster(address) as c:
                await c.wait_for_workers(1)
                futures = [
                    c.submit(held_at_gate, str(gate), str(started), pure=False) for _ in range(6)
                ]
                await wait_until(started.exists, "a task to start", limit=30)

                def depth() -> float:
                    result = _promql(api, "corral_queue_depth") or []
                    return max((v for _, v in result), default=0.0)

                # Prometheus' first scrape comes a few seconds after its start.
                seen = await wait_until(
                    lambda: anyio.to_thread.run_sync(depth),
                    "Prometheus to have scraped a queue depth above 0",
                    limit=60,
                    step=0.5,
                )
                assert seen >= 1
                gate.touch()
                assert [await f for f in futures] == ["opened"] * 6
        status, body = http_get(f"{api}/targets")
        assert status == 200, body
        health = [t["health"] for t in json.loads(body)["data"]["activeTargets"]]
        assert health == ["up"], body


def bad_input(i: int) -> int:
    raise ValueError(f"bad input {i}")


@pytest.mark.slow
@pytest.mark.anyio
@pytest.mark.timeout(150)
async def test_the_documented_failures_query_counts_a_burst_of_a_new_kind_of_failure(
    tmp_path: Path,
) -> None:
    """A user audit: five tasks of a new category failing within one scrape interval
    made a series whose first sample is 5, and the docs' "failures per cause in the
    last hour", ``increase(corral_task_failures_total[1h])``, read 0 (Prometheus needs
    two samples of a series). The query the docs give now counts the 5, in a real
    Prometheus, and ``increase()`` alone still reads 0, as the docs say."""
    text = (Path(__file__).parent.parent / "docs" / "monitoring.md").read_text()
    at = text.index("failures per cause in the last hour")
    start = text.index("```promql\n", at) + len("```promql\n")
    documented = " ".join(text[start : text.index("```", start)].split())
    start = text.index("alert on a new kind of failure:", at)
    start = text.index("`", start) + 1
    alert = " ".join(text[start : text.index("`", start)].split())
    with _scraped(tmp_path) as (address, api):
        with anyio.fail_after(120):
            up = "up{job='corral'} == 1"
            await wait_until(
                lambda: anyio.to_thread.run_sync(_promql, api, up),
                "Prometheus to scrape the manager", limit=60, step=0.5,
            )  # fmt: skip
            async with Cluster(address) as c:
                burst = [c.submit(bad_input, i, key=f"bad-{i}") for i in range(5)]
                for f in burst:
                    with pytest.raises(ValueError, match="bad input"):
                        await f
            bad = 'corral_task_failures_total{category="bad"}'
            scraped = f"count_over_time({bad}[1m]) >= 3"  # three samples of it, all 5
            await wait_until(lambda: anyio.to_thread.run_sync(_promql, api, scraped),
                             "Prometheus to scrape the failures thrice", limit=60,
                             step=0.5)  # fmt: skip
        assert [v for _, v in _promql(api, bad) or []] == [5.0]
        plain = _promql(api, "increase(corral_task_failures_total[1h])") or []
        assert [v for m, v in plain if m.get("category") == "bad"] == [0.0]
        counted = _promql(api, documented)
        assert counted is not None
        assert [(m["category"], m["cause"], v) for m, v in counted] == [("bad", "ValueError", 5.0)]
        fires = _promql(api, alert)  # the documented alert's expression holds
        assert fires is not None and [m["category"] for m, _ in fires] == ["bad"], alert


@pytest.mark.slow
def test_a_manager_with_a_pool_exports_its_blocks(tmp_path: Path) -> None:
    config = tmp_path / "corral.toml"
    config.write_text(
        '[pools.local]\nprovider = "local"\nmin_blocks = 1\ninit_blocks = 1\n'
        "max_blocks = 2\ncores_per_worker = 1\n"
    )
    with Cli(tmp_path / "home") as cli:
        proc, _ = cli.manager("--config", str(config), "--metrics-listen", "127.0.0.1:0")
        url = cli.line_with(proc, "metrics on").split("metrics on", 1)[1].strip()
        deadline = time.monotonic() + 60
        while True:  # bounded poll: the block's worker process starts and joins
            status, body = http_get(url)
            assert status == 200, body
            got = _samples(body)
            if got.get(("corral_workers", (("pool", "local"), ("state", "idle")))) == 1:
                break
            assert time.monotonic() < deadline, body
            time.sleep(0.2)
        local = (("pool", "local"),)
        assert got[("corral_blocks_target", local)] == 1
        assert got[("corral_blocks", (("pool", "local"), ("state", "running")))] == 1
        assert got[("corral_blocks_pending_oldest_seconds", local)] == 0
        assert got[("corral_autoscaler_busy", ())] == 0


@pytest.mark.anyio
async def test_a_scrape_the_scheduler_cannot_answer_in_time_is_a_503_that_says_why() -> None:
    from runtime.errors import AskTimeout
    from runtime.metrics import UNAVAILABLE, serve_metrics

    async def busy() -> MetricsReply:
        raise AskTimeout("manager", "MetricsRequest", 10.0)

    runner, port = await serve_metrics("127.0.0.1", 0, busy)
    try:
        with anyio.fail_after(30):
            status, body = await anyio.to_thread.run_sync(
                http_get, f"http://127.0.0.1:{port}/metrics"
            )
        assert (status, body.encode()) == (503, UNAVAILABLE)
    finally:
        await runner.cleanup()


@pytest.mark.anyio
async def test_the_spilled_bytes_counter_never_goes_down_when_workers_leave() -> None:
    """Two workers report bytes spilled; one leaves, the other's count starts again
    (its store restarted): ``corral_spilled_bytes_total`` keeps what was spilled.
    Before, it was the sum of the current workers' reports: it fell by the leaver's
    share (Prometheus' rate() reads that as a counter reset)."""
    with anyio.fail_after(30):
        async with Cluster(workers=2, pool="cpu") as c:
            await c.wait_for_workers(2)

            async def counter() -> float:
                reply = await c._manager.ask(MetricsRequest())
                return scraped(render(reply).decode(), "corral_spilled_bytes")["cpu"]

            async def at(value: float) -> bool:
                return await counter() == value

            def report(worker: str, total: int) -> WorkerMemoryReport:
                return WorkerMemoryReport(worker, False, 1 << 20, 1 << 30, 1 << 31,
                                          spilled_total=total)  # fmt: skip

            c._refs["scheduler"].post(report("worker-1", 1000))
            c._refs["scheduler"].post(report("worker-2", 2000))
            await wait_until(lambda: at(3000), "the reports", limit=10)
            await c.scale(1)
            await wait_until(
                lambda: "worker-2" not in c.scheduler_state.workers, "worker-2 gone", limit=10
            )
            assert await counter() == 3000
            c._refs["scheduler"].post(report("worker-1", 1500))
            await wait_until(lambda: at(3500), "the growth counted", limit=10)
            c._refs["scheduler"].post(report("worker-1", 200))  # started again from 0
            await wait_until(lambda: at(3700), "the new count added", limit=10)


def _twice(i: int) -> int:
    if i == 5:
        raise ValueError("five")
    return 2 * i


@pytest.mark.anyio
async def test_categories_past_the_cap_count_under_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys that make a category per task (``part_0``, ``part_1``, ...): the first
    ``MAX_METRIC_CATEGORIES`` are labelled by name, the rest count under ``(other)``,
    failures too, so the series stay bounded. Before, each task added six series."""
    import actors.scheduler_state

    monkeypatch.setattr(actors.scheduler_state, "MAX_METRIC_CATEGORIES", 3)
    with anyio.fail_after(30):
        async with Cluster(workers=1) as c:
            await c.wait_for_workers(1)
            keys = [f"part_{i}" for i in range(6)]
            futures = await c.submit_graph(
                {k: (_twice, i) for i, k in enumerate(keys)}, keys, retries=0
            )
            for f in futures[:5]:
                await f
            with pytest.raises(ValueError, match="five"):
                await futures[5]
            text = render(await c._manager.ask(MetricsRequest())).decode()

            def samples(name: str) -> list[tuple[dict[str, str], float]]:
                return [
                    (s.labels, s.value)
                    for fam in text_string_to_metric_families(text)
                    if fam.name == name
                    for s in fam.samples
                ]

            finished = {labels["category"]: v for labels, v in samples("corral_tasks_finished")}
            named = set(finished) - {"(other)"}
            assert len(named) == 3 and named <= set(keys) and "(other)" in finished
            assert sum(finished.values()) == 5
            (failure,) = samples("corral_task_failures")
            label = "part_5" if "part_5" in named else "(other)"
            assert (failure[0]["category"], failure[0]["outcome"], failure[1]) == (
                label,
                "error",
                1,
            )
            # A later scrape labels them the same way: each counter only grows.
            again = render(await c._manager.ask(MetricsRequest())).decode()
            assert again.count('category="(other)"') == text.count('category="(other)"')


@pytest.mark.anyio
async def test_a_task_state_that_empties_reads_zero() -> None:
    """Once a graph is done no task is queued or processing: ``corral_tasks`` says 0
    for those states rather than leaving them out of the scrape (a series that goes
    missing reads as stale, not as none)."""
    with anyio.fail_after(30):
        async with Cluster(workers=1) as c:
            await c.wait_for_workers(1)
            (f,) = await c.submit_graph({"t-1": (_twice, 1)}, ["t-1"])
            assert await f == 2
            text = render(await c._manager.ask(MetricsRequest())).decode()
            states = {
                s.labels["state"]: s.value
                for fam in text_string_to_metric_families(text)
                if fam.name == "corral_tasks"
                for s in fam.samples
            }
            assert states["queued"] == 0 and states["processing"] == 0, states
            assert states["memory"] == 1, states


@pytest.mark.anyio
async def test_each_worker_s_disk_is_a_gauge_labelled_by_pool_and_worker() -> None:
    """A worker with a disk limit: its limit, the bytes counted used and its disk left,
    as its latest memory report says. Before, /metrics had no disk series."""
    gib = 1 << 30
    with anyio.fail_after(30):
        async with Cluster(workers=1, pool="cpu", disk_per_worker=10 * gib) as c:
            await c.wait_for_workers(1)
            (wid,) = c.scheduler_state.workers

            async def disk() -> dict[str, dict[tuple[str, str], float]]:
                text = render(await c._manager.ask(MetricsRequest())).decode()
                return {
                    fam.name: {(s.labels["pool"], s.labels["worker"]): s.value for s in fam.samples}
                    for fam in text_string_to_metric_families(text)
                    if fam.name.startswith("corral_worker_disk")
                }

            got = await disk()
            assert got["corral_worker_disk_bytes"] == {("cpu", wid): 10 * gib}
            assert 0 < got["corral_worker_disk_free_bytes"][("cpu", wid)] <= 10 * gib
            report = WorkerMemoryReport(wid, False, 1 << 20, 1 << 30, 1 << 31,
                                        disk_free=500_000, disk_used=3 * gib)  # fmt: skip
            c._refs["scheduler"].post(report)

            async def reported() -> bool:
                got = await disk()
                # used: what the worker says is no longer free, as placement counts it
                return got["corral_worker_disk_free_bytes"] == {("cpu", wid): 500_000} and (
                    got["corral_worker_disk_used_bytes"] == {("cpu", wid): 10 * gib - 500_000}
                )

            await wait_until(reported, "the report's disk", limit=10)


class _RaisingScaling:
    def desired(self, pool: Any) -> int:
        raise RuntimeError("no answer")


@pytest.fixture
def _raising_policies() -> Iterator[None]:
    """Two policies that raise, registered for the test below only."""
    with registered(
        ("priority", "test-metrics-raises", Raises),
        ("scaling", "test-metrics-raises", _RaisingScaling),
    ):
        yield


def _policy_samples(text: str, name: str) -> dict[tuple[str, str], float]:
    return {
        (s.labels["kind"], s.labels["policy"]): s.value
        for fam in text_string_to_metric_families(text)
        if fam.name == name
        for s in fam.samples
    }


@pytest.mark.anyio
@pytest.mark.usefixtures("_raising_policies")
async def test_policy_errors_are_counted_per_kind_and_policy() -> None:
    """A policy that raises is counted in ``corral_policy_errors_total{kind, policy}``,
    the scheduler's kinds and the autoscaler's scaling policy alike (before, only the
    status said so: no series to alert on); each policy in force has its series at 0,
    and a policy swapped out keeps its count."""
    with anyio.fail_after(30):
        async with Cluster(workers=1, manager_alerts=None) as c:
            await c.wait_for_workers(1)

            async def scrape(name: str = "corral_policy_errors") -> dict[tuple[str, str], float]:
                return _policy_samples(
                    render(await c._manager.ask(MetricsRequest())).decode(), name
                )

            first = await scrape()
            assert first[("priority", "graph")] == 0 and first[("scaling", "fixed")] == 0
            assert set(first) == {(k, n) for k, n in (await c.status())["policies"].items()} | {
                ("scaling", "fixed")
            }
            await c.set_policy("priority", "test-metrics-raises")
            futures = await c.submit_graph({"a": (_twice, 1), "b": (_twice, 2)}, ["a", "b"])
            assert [await f for f in futures] == [2, 4]  # the fallback ranked them
            errors = await scrape()
            by_kind = (await c.status())["policy_errors_by"]
            assert errors[("priority", "test-metrics-raises")] == by_kind["priority"] >= 2
            await c.set_policy("scaling", "test-metrics-raises")

            async def scaling_counted() -> bool:
                return (await scrape()).get(("scaling", "test-metrics-raises"), 0) >= 1

            await wait_until(scaling_counted, "the scaling policy's errors", limit=10)
            await c.set_policy("priority", "graph")
            after = await scrape()
            assert after[("priority", "test-metrics-raises")] == by_kind["priority"]
            assert after[("priority", "graph")] == 0
            slow = await scrape("corral_policy_slow")
            assert set(slow) == set(after) and set(slow.values()) == {0.0}


@pytest.mark.anyio
async def test_concurrent_scrapes_share_one_metrics_call() -> None:
    """/metrics and the dashboard's metrics go through shared_call: a flood of 2,000
    scrapes once queued as many MetricsRequests at the manager (503s, a client's 21
    tasks took 12 s). Callers while one call runs share its value or its error; the
    next caller after it makes a new one; a call cancelled lets a waiter make its own."""
    from runtime.node import shared_call

    calls = 0
    gate = anyio.Event()
    fail = False

    @shared_call
    async def fetch() -> int:
        nonlocal calls
        calls += 1
        n = calls
        await gate.wait()
        if fail:
            raise RuntimeError(f"call {n} failed")
        return n

    got: list[Any] = []

    async def scrape() -> None:
        try:
            got.append(await fetch())
        except RuntimeError as exc:
            got.append(str(exc))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for _ in range(50):
                tg.start_soon(scrape)
            await wait_until(lambda: calls == 1, "the first call")
            await anyio.wait_all_tasks_blocked()
            gate.set()
        assert (calls, got) == (1, [1] * 50)

        gate, fail, got = anyio.Event(), True, []
        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(scrape)
            await anyio.wait_all_tasks_blocked()
            gate.set()
        assert (calls, got) == (2, ["call 2 failed"] * 3)

        gate, fail, got = anyio.Event(), False, []
        first = anyio.CancelScope()

        async def cancelled() -> None:
            with first:
                await fetch()

        async with anyio.create_task_group() as tg:
            tg.start_soon(cancelled)
            await wait_until(lambda: calls == 3, "the third call")
            tg.start_soon(scrape)
            await anyio.wait_all_tasks_blocked()
            first.cancel()
            await wait_until(lambda: calls == 4, "the waiter's own call")
            gate.set()
        assert got == [4]
