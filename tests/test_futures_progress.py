"""The progress of futures (``submit``, ``map``): ``cluster.progress(futures)``, which
waits and draws a bar (a terminal) or lines (anything else), and ``gather`` under dask
callbacks (a ``ProgressBar``), both counted from what the client learns of its futures
(runtime/progress.py's ``Tally`` and ``TextBar``; ``runtime.client._Ends``)."""

from __future__ import annotations

import functools
import io
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from dask.diagnostics import ProgressBar

from runtime import Cluster
from runtime.client import _Ends
from runtime.errors import CorralError
from runtime.progress import LINE_EVERY, Hooks, Tally, TextBar, bar_text
from tests.helpers import ROOT, Cli, wait_until
from tests.test_dask_callbacks import Record

LIMIT = 60


def gated(i: int, gate: str) -> int:
    """Wait (bounded) for the file ``gate``, then return ``i``; ``i`` ending in 7
    fails."""
    deadline = time.monotonic() + LIMIT
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    if i % 10 == 7:
        raise ValueError(f"task {i} fails")
    return i


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def _ends_left(cluster: Cluster) -> int:
    """The progress followers still among the client's waiters."""
    waiters = cluster._client_actor.waiters
    return sum(isinstance(w, _Ends) for ws in waiters.values() for w in ws)


# ----------------------------------------------------------------------- pure parts


def test_a_tally_answers_in_the_shape_of_a_progress_query_and_hands_each_end_once() -> None:
    tally = Tally(4)
    tally.end("a", "w1", "memory")
    tally.end("b", "w2", "erred")
    first = tally.answer()
    assert first == {
        "total": 4, "finished": 2, "erred": 1, "cancelled": 0, "released": 0,
        "waiting": 2, "ready": 0, "running": 0, "complete": True,
        "ended": [("a", "w1", "memory"), ("b", "w2", "erred")],
    }  # fmt: skip
    tally.end("c", "", "cancelled")
    tally.end("d", "", "released")
    second = tally.answer()
    assert second["ended"] == [("c", "", "cancelled"), ("d", "", "released")]
    assert (second["finished"], second["cancelled"], second["released"]) == (4, 1, 1)
    assert tally.pending == 0
    # Hooks take it as they take the scheduler's counts: a dask callback's view
    rec = Record()
    hooks = Hooks([rec._callback], {})
    tally = Tally(2)
    tally.end("x", "w", "memory")
    hooks.update(tally.answer())
    assert rec.calls == [("pretask", "x"), ("posttask", "x", 1, 1, "w")]


def test_bar_text_says_ended_of_total_and_the_failures() -> None:
    counts = Tally(10_000).answer() | {"finished": 4500, "erred": 3}
    assert bar_text(counts, 12.34, width=10) == (
        "[####      ] |  45% | 4500 of 10000 ended, 3 failed | 12.3 s"
    )
    assert bar_text(counts | {"erred": 0, "cancelled": 2}, 125, width=0) == (
        " 45% | 4500 of 10000 ended, 2 cancelled | 2 min 05 s"
    )
    assert bar_text(Tally(0).answer(), 3 * 3600 + 60, width=4).startswith("[####] | 100%")


def test_a_text_bar_redraws_in_place_on_a_terminal_and_writes_lines_elsewhere() -> None:
    counts = Tally(4).answer()
    tty = Tty()
    bar = TextBar(tty, started=100.0)
    assert (bar.tty, bar.every) == (True, 0.2)
    bar.draw(counts, 100.0)
    bar.draw(counts | {"finished": 1}, 100.1)  # within 0.2 s: not drawn
    bar.draw(counts | {"finished": 2}, 100.3)
    bar.draw(counts | {"finished": 4}, 100.35, final=True)  # the end: always drawn
    draws = tty.getvalue().split("\r")[1:]
    assert [d.split(" | ")[2] for d in draws] == ["0 of 4 ended", "2 of 4 ended", "4 of 4 ended"]
    assert tty.getvalue().endswith(" s\n") and tty.getvalue().count("\n") == 1  # ended once
    log = io.StringIO()
    bar = TextBar(log, started=0.0)
    assert (bar.tty, bar.every) == (False, LINE_EVERY)
    for now in (0.0, 5.0, 10.0, 19.0, 20.5):
        bar.draw(counts, now)
    bar.draw(counts | {"finished": 4}, 21.0, final=True)
    assert log.getvalue().splitlines() == [
        "progress:   0% | 0 of 4 ended | 0.0 s",
        "progress:   0% | 0 of 4 ended | 10.0 s",
        "progress:   0% | 0 of 4 ended | 20.5 s",
        "progress: 100% | 4 of 4 ended | 21.0 s",
    ]
    with pytest.raises(ValueError, match="every must be a number of seconds above 0"):
        TextBar(log, 0.0, every=0)


def test_a_bar_on_a_terminal_fits_its_width_and_covers_a_longer_line() -> None:
    """A 10,000-task bar took 81 columns (at 100%; 92 with failures past a minute): on
    an 80-column terminal each draw wrapped, and ``\\r`` drew the next on a row of its
    own, a new row five times a second. It fits; and the elapsed time going from
    ``59 min 59 s`` to ``1 h 00 min`` (shorter) left an ``s`` of the line before."""
    counts = Tally(10_000).answer() | {"finished": 10_000, "erred": 3, "cancelled": 12}
    tty = Tty()
    bar = TextBar(tty, started=0.0, columns=80)
    bar.draw(counts | {"finished": 9_000}, 3599.0)
    bar.draw(counts, 3600.0, final=True)
    first, last = tty.getvalue().split("\r")[1:]
    assert len(first) <= 79 and first.startswith("[") and first.endswith("| 59 min 59 s")
    assert last == last.rstrip(" \n").ljust(len(first)) + "\n"  # padded over the first
    said = "| 100% | 10000 of 10000 ended, 3 failed, 12 cancelled | 1 h 00 min"
    assert last.startswith("[") and last.rstrip().endswith(said)
    narrow = Tty()
    bar = TextBar(narrow, started=0.0, columns=30)  # no room for a bar: the text, cut
    bar.draw(counts, 5.0, final=True)
    assert narrow.getvalue() == "\r100% | 10000 of 10000 ended, \n"  # (29 columns)


def test_a_bar_on_a_terminal_follows_its_width_when_resized(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The width is asked at each draw (here ``$COLUMNS``: a StringIO has no size): a
    window made narrower gets lines that fit it, padded no wider than it."""
    counts = Tally(1000).answer() | {"finished": 500}
    tty = Tty()
    bar = TextBar(tty, started=0.0, every=1.0)
    monkeypatch.setenv("COLUMNS", "100")
    bar.draw(counts, 1.0)
    monkeypatch.setenv("COLUMNS", "40")
    bar.draw(counts, 2.0)
    wide, narrow = tty.getvalue().split("\r")[1:]
    assert len(wide) == 77 and wide.startswith("[" + "#" * 20 + " " * 20 + "]")  # 40 wide
    assert len(narrow) == 39 and narrow.startswith(" 50% | 500 of 1000 ended | 2.0 s")


# ------------------------------------------------------------------ on a cluster


async def _gated_progress(cluster: Cluster, tmp_path: Path) -> None:
    """20 tasks (2 fail) let go in two halves: the lines show the first half ended,
    and no more, before the second is let go; the counts end true."""
    gates = [tmp_path / "first", tmp_path / "second"]
    futures = cluster.map(gated, range(20), [str(gates[i >= 10]) for i in range(20)])
    out = io.StringIO()
    counts: dict[str, int] = {}

    async def follow() -> None:
        counts.update(await cluster.progress(futures + futures[:3], out=out, every=0.05))

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)
        await wait_until(lambda: "| 0 of 20 ended | " in out.getvalue(), "the first line")
        gates[0].touch()
        await wait_until(
            lambda: "10 of 20 ended, 1 failed" in out.getvalue(), "half ended", limit=30
        )
        assert "11 of 20" not in out.getvalue()
        gates[1].touch()
    assert counts == {"total": 20, "finished": 20, "erred": 2, "cancelled": 0, "released": 0}
    assert out.getvalue().splitlines()[-1].startswith("progress: 100% | 20 of 20 ended, 2 failed |")
    assert [f.status for f in futures].count("error") == 2
    assert _ends_left(cluster) == 0


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
@pytest.mark.parametrize(
    "workers",
    [{"workers": 1, "threads_per_worker": 4}, {"processes": 2, "threads_per_worker": 2}],
    ids=["in_process", "worker_processes"],
)
async def test_progress_of_futures_rises_and_counts_failures(
    tmp_path: Path, workers: dict[str, int]
) -> None:
    async with Cluster(**workers) as cluster:
        await _gated_progress(cluster, tmp_path)


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_progress_of_futures_through_a_manager_process(tmp_path: Path) -> None:
    """A manager and workers in processes of their own: the futures' words, which the
    counts come from, cross the connection as before (no message of its own)."""
    with Cli(tmp_path / "home") as cli:
        _, address = cli.manager()
        cli.worker(address, "--cores", "4")
        async with Cluster(address) as cluster:
            await cluster.wait_for_workers(1)
            await _gated_progress(cluster, tmp_path)


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_progress_on_a_narrow_terminal_draws_within_its_width(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The terminal's width (here ``$COLUMNS``: a StringIO has no size of its own) bounds
    every draw: ``[###...] | 100% | 20 of 20 ended, 2 failed | 0.1 s`` took 84."""
    monkeypatch.setenv("COLUMNS", "60")
    async with Cluster(workers=1, threads_per_worker=4) as cluster:
        out = Tty()
        futures = cluster.map(gated, range(20), [str(tmp_path)] * 20)
        counts = await cluster.progress(futures, out=out, every=0.01)
        assert counts["erred"] == 2
        draws = out.getvalue().split("\r")[1:]
        assert max(len(d.rstrip("\n")) for d in draws) <= 59, draws
        assert draws[-1].startswith("[") and "| 20 of 20 ended, 2 failed | " in draws[-1]


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_progress_holds_the_futures_it_follows(tmp_path: Path) -> None:
    """``await cluster.progress(cluster.map(...))``: the futures, given as a generator
    and held by nothing else, are held while it waits (their tasks not let go)."""
    async with Cluster(workers=1, threads_per_worker=2) as cluster:
        counts = await cluster.progress(
            (f for f in cluster.map(gated, range(3), [str(tmp_path)] * 3)), out=io.StringIO()
        )
        assert counts == {"total": 3, "finished": 3, "erred": 0, "cancelled": 0, "released": 0}


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_a_cancelled_progress_ends_its_line_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    gate = tmp_path / "gate"
    async with Cluster(workers=1, threads_per_worker=2) as cluster:
        futures = cluster.map(gated, range(4), [str(gate)] * 4)
        out = Tty()
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(cluster.progress, futures, out=out))
                await wait_until(lambda: "0 of 4 ended" in out.getvalue(), "the bar")
                assert _ends_left(cluster) == 4
                scope.cancel()
        assert _ends_left(cluster) == 0
        assert out.getvalue().endswith(" s\n")  # the line ended: the next output is on its own
        assert [f.status for f in futures] == ["pending"] * 4  # the tasks run on
        gate.touch()
        assert await cluster.gather(futures[:3]) == [0, 1, 2]


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_progress_raises_when_the_cluster_stops_while_it_waits(tmp_path: Path) -> None:
    """The cluster closed while progress waits: its error, as gather's, not counts with
    every pending task 'failed' (a review saw 181 of 200 'failed' and no error)."""
    gate = tmp_path / "gate"
    raised: list[BaseException] = []
    async with Cluster(processes=1) as cluster:
        futures = cluster.map(gated, range(4), [str(gate)] * 4)
        out = io.StringIO()

        async def follow() -> None:
            with pytest.raises(CorralError, match="the cluster stopped") as info:
                await cluster.progress(futures, out=out, every=0.05)
            raised.append(info.value)

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await wait_until(lambda: "0 of 4 ended" in out.getvalue(), "the first line")
            await cluster.close()
    assert len(raised) == 1
    assert out.getvalue().endswith(" s\n")  # its line ended all the same


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_cancelled_and_released_futures_count_as_ended(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    async with Cluster(workers=1, threads_per_worker=2) as cluster:
        done = cluster.submit(gated, 0, str(tmp_path))  # (tmp_path exists: at once)
        assert await done == 0
        futures = cluster.map(gated, range(6), [str(gate)] * 6, pure=False)
        out = io.StringIO()
        counts: dict[str, int] = {}

        async def follow() -> None:
            counts.update(await cluster.progress([*futures, done], out=out, every=0.05))

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await wait_until(lambda: "of 7 ended" in out.getvalue(), "the first line")
            await cluster.cancel(futures[:2])
            await wait_until(lambda: "2 cancelled" in out.getvalue(), "the cancels counted")
            futures[2].release()  # its last future: nothing more will be told of it
            gate.touch()
        assert counts == {"total": 7, "finished": 7, "erred": 0, "cancelled": 2, "released": 1}


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_progress_takes_a_list_of_this_clusters_futures() -> None:
    async with Cluster(workers=1) as cluster:
        fut = cluster.submit(abs, -1)
        with pytest.raises(
            TypeError, match=r"progress takes a list of Futures.*progress\(\[future\]\)"
        ):
            await cluster.progress(fut)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="every must be"):
            await cluster.progress([fut], every=-1)
        with pytest.raises(TypeError, match=r"every must be a number of seconds .* str '1'"):
            await cluster.progress([fut], every="1")  # type: ignore[arg-type]
        assert _ends_left(cluster) == 0  # refused before following anything
        fut.release()
        with pytest.raises(CorralError, match="released"):
            await cluster.progress([fut])
        assert await cluster.progress([], out=io.StringIO()) == {
            "total": 0, "finished": 0, "erred": 0, "cancelled": 0, "released": 0,
        }  # fmt: skip


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_gather_under_a_progress_bar_calls_it_as_the_futures_end(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    async with Cluster(workers=1, threads_per_worker=4) as cluster:
        futures = cluster.map(gated, [0, 1, 2, 3], [str(gate)] * 4)
        rec, out = Record(), io.StringIO()
        values: list[Any] = []

        async def gather() -> None:
            with ProgressBar(out=out, dt=0.05), rec:
                values.extend(await cluster.gather(futures))

        async with anyio.create_task_group() as tg:
            tg.start_soon(gather)
            await wait_until(lambda: "| 0% Completed" in out.getvalue(), "the bar drawn")
            assert rec.calls == [("start",), ("start_state", 0)]
            gate.touch()
        assert values == [0, 1, 2, 3]
        posts = [c for c in rec.calls if c[0] == "posttask"]
        assert sorted(c[1] for c in posts) == sorted(f.key for f in futures)
        assert [c[2] for c in posts] == [1, 2, 3, 4]  # (the counts of the answer they came in)
        assert posts[-1][3] == 0
        assert all(isinstance(c[4], str) and c[4] for c in posts)  # the worker it ran on
        assert rec.calls[-1] == ("finish", False, 4)
        assert out.getvalue().split("\r")[-1].startswith("[" + "#" * 40 + "] | 100% Completed")
        # a failure: finish errored, the error raised; one future awaited calls nothing
        bad = cluster.submit(gated, 7, str(gate))
        rec = Record()
        with rec, pytest.raises(ValueError, match="task 7 fails"):
            await cluster.gather([bad])
        assert rec.calls[-1] == ("finish", True, 1)
        rec = Record()
        with rec:
            assert await futures[0] == 0
        assert rec.calls == []
        assert _ends_left(cluster) == 0


INTERRUPTED = """
import asyncio, time
from runtime import Cluster
from runtime.client import _Ends


def nap(i):
    time.sleep(0.02)
    return i


async def main():
    async with Cluster(workers=1, threads_per_worker=1) as cluster:
        futures = cluster.map(nap, range(5000), pure=False)  # 100 s of naps
        try:
            await cluster.progress(futures, every=0.05)
        finally:
            waiters = cluster._client_actor.waiters.values()
            left = sum(isinstance(w, _Ends) for ws in waiters for w in ws)
            print(f"followers left: {left}", flush=True)


asyncio.run(main())
"""


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT)
async def test_ctrl_c_during_progress_ends_its_line_and_the_program(tmp_path: Path) -> None:
    """A script waiting in ``progress`` (its output a pipe: lines) is sent SIGINT: the
    wait ends with a last line, follows nothing more, and the program ends."""
    env = dict(os.environ, CORRAL_HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT))
    async with await anyio.open_process(
        [sys.executable, "-c", INTERRUPTED], env=env, stderr=None
    ) as proc:
        assert proc.stdout is not None
        out = b""
        with anyio.fail_after(30):
            while b"progress:" not in out:
                out += await proc.stdout.receive()
        proc.send_signal(signal.SIGINT)
        with anyio.fail_after(30):
            async for chunk in proc.stdout:
                out += chunk
            assert await proc.wait() != 0  # KeyboardInterrupt
    lines = out.decode().splitlines()
    assert lines[-1] == "followers left: 0", lines[-3:]
    assert lines[-2].startswith("progress: ") and " of 5000 ended | " in lines[-2]
    assert all(line.startswith("progress: ") for line in lines[:-1])
