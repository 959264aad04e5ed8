"""The manager's own health in ``/metrics`` and at its start (a user audit, soak: a
manager run for hours with a stream of graphs grew its monitoring database 546 MB an
hour, said nothing of it at start, and ``/metrics`` had no series of the manager
itself): its RSS (``process_*``), its event loop's lag, the database's bytes on disk,
its writer's backlog and the rows it dropped (docs/monitoring.md, Metrics), and a start
line saying how much history the database keeps."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from runtime.__main__ import _history_kept
from runtime.cli_processes import Cli
from runtime.messages import MetricsReply
from runtime.metrics import ManagerCollector, render
from runtime.node import LoopLag
from tests.helpers import free_port_between, http_get, wait_until

PORTS = (64000, 64499)  #: the ports these tests may listen on
LIMIT = 30  #: seconds a test may take, however it fails


def _values(text: str) -> dict[str, float]:
    """The samples of an exposition ``text`` without labels, by sample name."""
    return {
        s.name: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if not s.labels
    }


def test_the_loop_lag_is_the_most_a_tick_woke_late_in_the_latest_minute() -> None:
    lag = LoopLag(window=60.0)
    assert lag.recent(0.0) == 0.0
    lag.note(1.0, 0.002)
    lag.note(2.0, 0.8)
    lag.note(3.0, 0.01)
    lag.note(4.0, -0.001)  # (woke a hair early: not late)
    assert lag.recent(30.0) == 0.8
    lag.note(50.0, 0.3)
    assert lag.recent(61.9) == 0.8
    assert lag.recent(62.0) == 0.3  # the 0.8 of t=2 is a minute old
    assert lag.recent(110.0) == 0.0  # every tick of the latest minute was on time


class _Writer:
    """What the collector reads of a ``MonitorWriter``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.dropped: Counter[str] = Counter({"metric_samples": 7, "tasks": 2})
        self.pending = 1234


def test_the_collector_shows_the_database_its_backlog_and_drops(tmp_path: Path) -> None:
    db = tmp_path / "monitoring.db"
    db.write_bytes(b"x" * 4096)
    Path(f"{db}-wal").write_bytes(b"w" * 1000)
    text = render(MetricsReply(), [ManagerCollector(lambda: 0.25, lambda: _Writer(db))]).decode()
    got = _values(text)
    assert got["corral_manager_loop_lag_seconds"] == 0.25
    assert got["corral_monitoring_db_bytes"] == 5096  # the file and its -wal
    assert got["corral_monitoring_rows_pending"] == 1234
    assert got["corral_monitoring_rows_dropped_total"] == 9
    assert "# TYPE corral_monitoring_rows_dropped_total counter" in text
    # no database (--no-monitoring): no database series, the loop's lag still
    text = render(MetricsReply(), [ManagerCollector(lambda: 0.0, lambda: None)]).decode()
    assert "corral_monitoring" not in text
    assert _values(text)["corral_manager_loop_lag_seconds"] == 0.0


@pytest.mark.anyio
async def test_a_stalled_loop_shows_in_the_lag_the_gateway_scrape_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 0.5 s stall of the manager's loop (a long synchronous call) reads as its lag in
    what ``/metrics`` shows (the gateway's collectors), with the process's RSS."""
    from runtime.kernel import ActorSystem
    from runtime.node import Gateway, gateway_routes, start_control_plane

    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            plane = await start_control_plane(system)
            routes = await gateway_routes(plane, [], web=False)
            gateway = Gateway(plane)
            ticked = anyio.Event()  # the loop's watcher noted a tick: it is watching
            note = plane.loop_lag.note

            def noted(now: float, late: float) -> None:
                note(now, late)
                ticked.set()

            monkeypatch.setattr(plane.loop_lag, "note", noted)
            await system.start_service(gateway.watch_loop)
            with anyio.fail_after(10):
                await ticked.wait()
            time.sleep(0.5)  # noqa: ASYNC251 - the stall under test

            def lag() -> float | None:
                got = _values(render(MetricsReply(), routes.extra).decode())
                late = got["corral_manager_loop_lag_seconds"]
                return late if late >= 0.4 else None

            assert 0.4 <= await wait_until(lag, "the stall in the loop lag", limit=10) < 5
            after = _values(render(MetricsReply(), routes.extra).decode())
    assert 10e6 < after["process_resident_memory_bytes"] < 4e9


@pytest.mark.anyio
@pytest.mark.timeout(60)
async def test_a_manager_process_says_the_history_it_keeps_and_shows_its_health(
    tmp_path: Path,
) -> None:
    db = tmp_path / "runs" / "monitoring.db"
    with Cli(tmp_path / "home") as cli:
        port, metrics_port = free_port_between(*PORTS), free_port_between(*PORTS)
        if port == metrics_port:
            metrics_port = free_port_between(*PORTS)
        manager = cli.start(
            "manager", "--listen", f"127.0.0.1:{port}",
            "--metrics-listen", f"127.0.0.1:{metrics_port}",
            "--monitoring", str(db), "--monitoring-interval", "0.2",
        )  # fmt: skip
        seen: list[str] = []
        cli.line_with(manager, "manager listening on", seen=seen)
        kept = [ln for ln in seen if "history kept" in ln]
        assert kept == [
            "  history kept: all of it (about 0.5 KB a task, for as long as the manager "
            "runs); --monitoring-keep DURATION, e.g. 7d, bounds it\n"
        ], seen
        (report,) = [i for i, ln in enumerate(seen) if ln.startswith("  report: ")]
        assert seen[report - 1] == f"monitoring database: {db}\n"
        assert seen.index(kept[0]) == report + 1  # after the database's path and its report

        def scrape() -> dict[str, float] | None:
            status, text = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
            assert status == 200, text
            got = _values(text)
            # once the recorder has written its first rows (the run, metric samples)
            return got if got.get("corral_monitoring_db_bytes", 0) > 0 else None

        got = await wait_until(
            lambda: anyio.to_thread.run_sync(scrape), "the database's first rows", limit=LIMIT
        )
        assert 10e6 < got["process_resident_memory_bytes"] < 4e9
        assert 0 <= got["corral_manager_loop_lag_seconds"] < 5
        on_disk = sum(os.stat(p).st_size for p in (db, Path(f"{db}-wal")) if p.exists())
        assert 0 < got["corral_monitoring_db_bytes"] <= on_disk
        assert got["corral_monitoring_rows_pending"] >= 0
        assert got["corral_monitoring_rows_dropped_total"] == 0
        cli.stop([manager])
        with contextlib.closing(sqlite3.connect(db)) as conn:
            assert conn.execute("SELECT dropped_rows FROM runs").fetchall() == [(0,)]


def test_a_manager_with_a_history_kept_says_how_much() -> None:
    """(The line a manager with ``--monitoring-keep 12h`` prints third.)"""
    assert _history_kept("12h") == "history kept: 12h (older rows deleted every 10 minutes)"
