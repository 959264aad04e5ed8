"""Memory admission in the scheduler core (actors/scheduler_state.py): a task whose
inputs alone are larger than the memory limit of every worker that could run it is not
placed and fails with TaskTooLarge, as soon as the inputs computed so far are too large;
where only some workers fit it, it goes only to them. Pure-core tests: events in, exact
commands and states out (the ``make_state`` fixture validates every state at the end).

The rules when workers come and go (docs/memory.md, "Memory admission"):

- a pool with no worker (taking new tasks) decides nothing: its tasks wait;
- the first worker to join a pool decides for the tasks already waiting there;
- a worker joining later with a larger limit helps the tasks still waiting, never
  revives one that failed (resubmitting it does);
- when the only worker that fits leaves or starts draining, the tasks that fitted only
  it fail at once (those it was running too), unless it was the pool's last worker.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest

from actors.scheduler_events import (
    CancelOnWorker,
    Execute,
    GraphSubmitted,
    KeyErred,
    WorkerDraining,
    WorkerLeft,
)
from actors.scheduler_state import SchedulerState
from runtime.errors import DependencyFailed, TaskTooLarge
from tests.helpers import (
    GB,
    MB,
    Cli,
    Factory,
    Loop,
    assigned,
    event,
    facts,
    finish,
    join,
    leave,
    make_state,
    of,
    on,
    run,
    specs_for,
    states,
    submit,
)

__all__ = ["make_state"]  # the fixture, used by name


def chunks_and_concat(n: int) -> dict[str, list[str]]:
    """``chunk-0 .. chunk-(n-1)`` (roots), all read by ``concat``, read by ``after``."""
    table: dict[str, list[str]] = {f"chunk-{i}": [] for i in range(n)}
    table["concat"] = list(table)
    table["after"] = ["concat"]
    return table


def submitted(s: SchedulerState, table: dict[str, list[str]], wanted: list[str]) -> Any:
    """The GraphSubmitted event for ``table`` (for a Loop to run)."""
    return event(GraphSubmitted, specs=specs_for(s, table, wanted), wanted=tuple(wanted))


def running(s: SchedulerState) -> list[str]:
    return sorted(ts.key for ws in s.workers.values() for ts in ws.processing)


def finish_running(s: SchedulerState, nbytes: int) -> None:
    """Finish whatever runs, each with ``nbytes``, until nothing does."""
    while keys := running(s):
        for key in keys:
            finish(s, s.tasks[key].worker or "", key, nbytes=nbytes)


def erred(cmds: list[Any]) -> dict[str, KeyErred]:
    return {c.key: c for c in of(cmds, KeyErred)}


def two_inputs_on(s: SchedulerState, worker: str, nbytes: int) -> None:
    """Submit ``a`` and ``b`` (pool ``left``) and ``both`` reading them (any pool);
    finish ``a`` and ``b`` on ``worker`` (the only worker of pool ``left``)."""
    submit(
        s,
        {"a": [], "b": [], "both": ["a", "b"]},
        ["both"],
        attrs={"a": {"pool": "left"}, "b": {"pool": "left"}},
    )
    while s.tasks["a"].state != "memory" or s.tasks["b"].state != "memory":
        keys = sorted(on(s, worker) & {"a", "b"})
        assert keys, s.story("a", "b")
        finish(s, worker, keys[0], nbytes=nbytes)


# ----------------------------------------------------------------------------- fails early


def test_fails_as_soon_as_the_finished_inputs_pass_every_limit(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    loop = Loop(s)  # the file registry too: outputs nothing needs any more are dropped
    join(s, "w1", memory=GB)
    join(s, "w2", memory=GB)
    loop.run(submitted(s, chunks_and_concat(10), ["concat", "after"]))
    finished: list[str] = []
    # 3 x 300 MiB = 900 MiB fit under 1 GiB; the 4th chunk makes 1200 MiB: too large,
    # with 6 chunks not computed yet.
    for _ in range(3):
        key = running(s)[0]
        cmds = loop.finish(s.tasks[key].worker or "", key, nbytes=300 * MB)
        finished.append(key)
        assert not of(cmds, KeyErred)
        assert s.tasks["concat"].state == "waiting"
    still_running = running(s)
    key = still_running[0]
    cmds = loop.finish(s.tasks[key].worker or "", key, nbytes=300 * MB)
    finished.append(key)

    bad = erred(cmds)
    assert sorted(bad) == ["after", "concat"]
    err = bad["concat"].error
    assert isinstance(err, TaskTooLarge)
    assert (err.key, err.needed, err.largest, err.pool) == ("concat", 1200 * MB, GB, None)
    assert bad["concat"].root == "concat" and bad["concat"].root_error is err
    assert "'concat' needs at least 1.17 GiB" in str(err) and "(1.00 GiB)" in str(err)
    assert (err.inputs, err.done) == (10, 4)
    assert (
        "needs at least 1.17 GiB (of its 10 inputs, 4 finished so far: about 2.93 GiB if "
        "the rest are as large) of inputs in memory at once" in str(err)
    )
    assert "gather its blocks" not in str(err)  # not a dask collection's result
    assert "to_zarr" in str(err) and "--memory" in str(err)
    # Its dependent fails as dependents do, naming the root and its error.
    assert isinstance(bad["after"].error, DependencyFailed)
    assert bad["after"].root == "concat" and bad["after"].root_error is err
    # Nothing is started for it any more: the chunks still running are cancelled on
    # their workers, the queued ones cancelled (as unneeded), the finished ones dropped.
    assert of(cmds, Execute) == []
    cancelled = sorted(k for c in of(cmds, CancelOnWorker) for k in c.keys)
    assert cancelled == sorted(set(still_running) - {key})
    chunk_states = {k: v for k, v in states(s).items() if k.startswith("chunk")}
    assert {k for k, v in chunk_states.items() if v == "released"} == set(finished)
    assert {k for k, v in chunk_states.items() if v == "cancelled"} == (
        set(chunk_states) - set(finished)
    )
    assert all(s.tasks[k].unneeded for k, v in chunk_states.items() if v == "cancelled")
    assert sorted(loop.dropped) == sorted(finished)
    assert all(f.consumers == 0 for f in facts(cmds).values())
    assert ("concat", "admission", f"too large: {1200 * MB} > {GB}") in [
        e[:3] for e in s.story("concat")
    ]
    assert s.count("waiting") == s.count("queued") == s.count("processing") == 0


def test_a_new_task_on_inputs_already_in_memory_fails_on_submission(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "w1", memory=GB)
    submit(s, {"x": [], "y": []}, ["x", "y"])  # kept: a client holds them
    finish_running(s, 600 * MB)
    cmds = submit(s, {"sum": ["x", "y"]}, ["sum"])
    assert assigned(cmds) == {}
    (bad,) = of(cmds, KeyErred)
    assert bad.key == "sum" and isinstance(bad.error, TaskTooLarge)
    assert (bad.error.needed, bad.error.largest) == (1200 * MB, GB)
    assert states(s) == {"x": "memory", "y": "memory", "sum": "erred"}


def test_inputs_that_fit_exactly_are_admitted(make_state: Factory) -> None:
    s = make_state(unknown_long=False, saturation=1.0)
    join(s, "w1", memory=GB)
    submit(s, {"x": [], "y": [], "sum": ["x", "y"]}, ["sum"])
    finish(s, "w1", "x", nbytes=GB // 2)
    cmds = finish(s, "w1", "y", nbytes=GB // 2)
    assert assigned(cmds) == {"w1": ["sum"]}
    assert s.tasks["sum"].in_nbytes == GB


# ----------------------------------------------------------------------------- placement


def test_goes_only_to_a_worker_it_fits_even_when_its_data_is_elsewhere(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "small", memory=GB, pool="left")
    join(s, "big", memory=4 * GB, pool="right")
    submit(s, {"busy": []}, ["busy"], pool="right")  # the big worker's only slot
    assert on(s, "big") == {"busy"}
    two_inputs_on(s, "small", 600 * MB)
    # 1.2 GB of inputs, all on the small worker, which is free: too small for them.
    # The task waits for the big worker's slot instead of joining its data there.
    assert s.tasks["both"].state == "queued"
    assert "small" in s.free and on(s, "small") == set()
    cmds = finish(s, "big", "busy")
    (ex,) = of(cmds, Execute)
    assert ex.worker == "big" and [t.key for t in ex.tasks] == ["both"]
    assert dict(ex.tasks[0].deps) == {"a": ("small",), "b": ("small",)}
    assert ex.tasks[0].dep_nbytes == (600 * MB, 600 * MB)


def test_where_every_worker_fits_the_usual_placement_holds(make_state: Factory) -> None:
    s = make_state(saturation=1.0)
    join(s, "small", memory=2 * GB, pool="left")
    join(s, "big", memory=4 * GB, pool="right")
    two_inputs_on(s, "small", 600 * MB)
    assert s.tasks["both"].worker == "small"  # locality: where both inputs are


def test_workers_without_a_limit_always_fit(make_state: Factory) -> None:
    s = make_state(unknown_long=False, saturation=1.0)
    join(s, "small", memory=GB, pool="left")
    join(s, "unlimited", memory=0, pool="right")
    assert s.largest == {"left": GB, "right": float("inf"), None: float("inf")}
    two_inputs_on(s, "small", 600 * GB)
    assert s.tasks["both"].worker == "unlimited"

    # Alone, an unlimited worker takes anything.
    s = make_state(unknown_long=False, saturation=1.0)
    join(s, "w", memory=0)
    submit(s, {"x": [], "y": [], "sum": ["x", "y"]}, ["sum"])
    finish(s, "w", "x", nbytes=10**15)
    assert assigned(finish(s, "w", "y", nbytes=10**15)) == {"w": ["sum"]}


# ----------------------------------------------------------------------------- come and go


def test_with_no_worker_in_its_pool_a_task_waits_and_the_first_worker_decides(
    make_state: Factory,
) -> None:
    for memory, fits in ((2 * GB, True), (512 * MB, False)):
        s = make_state(unknown_long=False, saturation=1.0)
        join(s, "small", memory=GB, pool="left")
        submit(
            s,
            {"a": [], "b": [], "both": ["a", "b"]},
            ["both"],
            attrs={"both": {"pool": "gpu"}},
            pool="left",
        )
        finish(s, "small", "a", nbytes=600 * MB)
        finish(s, "small", "b", nbytes=600 * MB)
        # Too large for every worker there is, but none is in its pool: it waits.
        assert s.tasks["both"].state == "queued"
        cmds = join(s, "gpu-1", memory=memory, pool="gpu")
        if fits:
            assert assigned(cmds) == {"gpu-1": ["both"]}
            continue
        assert assigned(cmds) == {}
        (bad,) = of(cmds, KeyErred)
        assert isinstance(bad.error, TaskTooLarge)
        assert (bad.error.largest, bad.error.pool) == (512 * MB, "gpu")
        assert "a worker in pool 'gpu' (512.0 MiB)" in str(bad.error)


def test_a_whole_collection_too_large_says_how_much_is_known_and_to_gather_its_blocks() -> None:
    """A user audit's ``cluster.compute(cube)`` of an 800 MiB cube on 400 MiB workers
    read "needs at least 440.0 MiB": 11 of its 20 chunks. The message counts the
    inputs, extrapolates, and offers the gather of the blocks into the client, which
    has no worker's limit (api.md's ``submit_graph(x.__dask_graph__(), keys)``)."""
    key = "finalize-hlgfinalizecompute-534de5e426c147d28a56ccb49d00e9d6"  # the audit's
    text = str(TaskTooLarge(key, 440 * MB, 400 * MB, None, inputs=20, done=11))
    assert (
        "needs at least 440.0 MiB (of its 20 inputs, 11 finished so far: about 800.0 MiB "
        "if the rest are as large) of inputs in memory at once, more than the largest "
        "memory limit of any worker (400.0 MiB); it was not started." in text
    ), text
    assert (
        "reduce them before gathering, gather its blocks into this client instead, where "
        "no worker's limit applies (futures = await cluster.submit_graph(x.__dask_graph__(), "
        "list(dask.core.flatten(x.__dask_keys__()))), then await cluster.gather(futures), "
        "and assemble them there), or start workers with a larger --memory." in text
    ), text
    every = str(TaskTooLarge(key, 440 * MB, 400 * MB, None, inputs=2, done=2))
    assert "finished so far" not in every  # all known: the size is the size


def test_waits_while_its_pool_has_no_worker_after_the_last_one_left(
    make_state: Factory,
) -> None:
    s = make_state(unknown_long=False, saturation=1.0)
    join(s, "w1", memory=GB)
    submit(s, {"x": [], "y": [], "sum": ["x", "y"]}, ["sum"])
    finish(s, "w1", "x", nbytes=600 * MB)
    assert s.tasks["y"].worker == "w1"
    leave(s, "w1")  # x is lost with it, y goes back to the queue
    assert s.largest == {}
    assert states(s) == {"x": "queued", "y": "queued", "sum": "waiting"}
    assert s.tasks["sum"].in_nbytes == 600 * MB  # x's size is still known
    # A worker that cannot hold even x: the sum fails at once, x and y are not run.
    cmds = join(s, "tiny", memory=512 * MB)
    (bad,) = of(cmds, KeyErred)
    assert isinstance(bad.error, TaskTooLarge) and bad.error.needed == 600 * MB
    assert assigned(cmds) == {}
    assert states(s) == {"x": "cancelled", "y": "cancelled", "sum": "erred"}


def test_a_bigger_worker_joining_later_does_not_revive_a_failed_task(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "small", memory=GB, pool="left")
    submit(s, {"x": [], "y": []}, ["x", "y"], pool="left")
    finish_running(s, 600 * MB)
    cmds = submit(s, {"sum": ["x", "y"]}, ["sum"])
    assert isinstance(erred(cmds)["sum"].error, TaskTooLarge)
    cmds = join(s, "big", memory=4 * GB, pool="right")
    assert assigned(cmds) == {} and s.tasks["sum"].state == "erred"
    # Submitting it again decides again: now it fits the big worker.
    cmds = submit(s, {"sum": ["x", "y"]}, ["sum"])
    assert assigned(cmds) == {"big": ["sum"]}


@pytest.mark.parametrize("how", ["leaves", "drains"])
def test_when_the_only_worker_that_fits_goes_the_tasks_only_it_fitted_fail(
    make_state: Factory, how: str
) -> None:
    s = make_state(saturation=1.0)
    join(s, "small", memory=GB, pool="left")
    join(s, "big", memory=4 * GB, pool="right")
    submit(s, {"busy": []}, ["busy"], pool="right")
    two_inputs_on(s, "small", 600 * MB)  # both: 1.2 GB, queued for the busy big worker
    submit(s, {"c": [], "d": []}, ["c", "d"], pool="left")  # c runs on small, d queued
    submit(s, {"later": ["a", "c"], "fine": ["d"]}, ["later", "fine"])  # waiting on c, d
    assert states(s)["both"] == "queued" and states(s)["later"] == "waiting"
    gone = (
        event(WorkerLeft, worker="big") if how == "leaves" else event(WorkerDraining, worker="big")
    )
    cmds = run(s, gone)
    assert s.largest == {"left": GB, None: GB}
    bad = erred(cmds)
    # ``both`` fitted the big worker only: it fails at once. ``later`` (600 MB known so
    # far) and ``fine`` still fit the small worker: they wait for their inputs.
    assert sorted(bad) == ["both"]
    err = bad["both"].error
    assert isinstance(err, TaskTooLarge)
    assert (err.needed, err.largest, err.pool) == (1200 * MB, GB, None)
    assert states(s)["later"] == "waiting" and states(s)["fine"] == "waiting"
    if how == "drains":  # its running task finishes; it is retired
        assert states(s)["busy"] == "processing"
    else:  # its running task is queued again, with no worker in its pool: it waits
        assert states(s)["busy"] == "queued"


def test_a_task_running_on_the_only_worker_that_fits_fails_when_it_is_lost(
    make_state: Factory,
) -> None:
    s = make_state(saturation=1.0)
    join(s, "small", memory=GB, pool="left")
    join(s, "big", memory=4 * GB, pool="right")
    two_inputs_on(s, "small", 600 * MB)
    assert s.tasks["both"].worker == "big"
    cmds = leave(s, "big")
    # Its worker-lost try would be retried for free; but no worker left can hold it.
    bad = erred(cmds)
    assert sorted(bad) == ["both"] and isinstance(bad["both"].error, TaskTooLarge)
    assert [t.outcome for t in s.tasks["both"].tries] == ["worker-lost"]
    assert assigned(cmds) == {}


# ----------------------------------------------------------------------------- recompute


def test_an_input_recomputed_with_another_size_counts_once_with_its_new_size(
    make_state: Factory,
) -> None:
    s = make_state(unknown_long=False, long_task=float("inf"), saturation=1.0)
    join(s, "w1", memory=GB)
    submit(s, {"x": [], "y": [], "sum": ["x", "y"]}, ["sum"])
    assert "x" in on(s, "w1")
    finish(s, "w1", "x", nbytes=300 * MB)
    assert s.tasks["sum"].in_nbytes == 300 * MB
    leave(s, "w1")  # x's output is lost with it: x is recomputed when a worker joins
    join(s, "w2", memory=GB)
    finish(s, "w2", "x", nbytes=700 * MB)  # 700 + 300 would not fit; 700 alone does
    assert s.tasks["sum"].in_nbytes == 700 * MB
    assert s.tasks["sum"].state == "waiting"
    cmds = finish(s, "w2", "y", nbytes=200 * MB)
    assert assigned(cmds) == {"w2": ["sum"]}
    assert s.tasks["sum"].in_nbytes == 900 * MB


# ----------------------------------------------------------------------------- end to end

PY = sys.executable
ROOT = str(Path(__file__).resolve().parents[1])  #: the repository, for the processes
WORKER_MEMORY = 512 * MB


def _rss(pid: int) -> int:
    """RSS of a process and its children (0 once it is gone)."""
    try:
        proc = psutil.Process(pid)
        return int(proc.memory_info().rss + sum(c.memory_info().rss for c in proc.children(True)))
    except psutil.Error:
        return 0


@pytest.mark.slow
@pytest.mark.anyio
async def test_the_issue_case_through_the_cli_fails_within_seconds_with_task_too_large(
    tmp_path: Path,
) -> None:
    """Issue 8's case scaled down at the same ratio of sizes to limits: two CLI workers
    of 512 MiB (1 GiB in the issue) and a 12000 x 12000 float64 array (1.15 GB; 2.3 GB
    in the issue) computed back to the client with ``dask.compute``. The concatenation
    that would hold it all fails with TaskTooLarge once 512 MiB of chunks exist, no
    worker passes its limit, and the cluster lives on."""
    import dask
    import dask.array as da

    import runtime
    from runtime import Cluster

    peaks: dict[int, int] = {}
    with Cli(tmp_path / "home") as cli:
        with anyio.fail_after(60):
            manager, address = await anyio.to_thread.run_sync(cli.manager)
            token = cli.tokens(address)["admin"]
            flags = ["--memory", "512MiB", "--cores", "1"]
            workers = [
                await anyio.to_thread.run_sync(cli.worker, address, *flags) for _ in range(2)
            ]
            peaks.update(dict.fromkeys((w.pid for w in workers), 0))

            x = da.random.random((12000, 12000), chunks=(500, 500))  # 576 chunks of 2 MB
            done = anyio.Event()

            async def sample_rss() -> None:
                # Another process's memory has no event to wait for: a bounded poll.
                while not done.is_set():
                    for pid in peaks:
                        peaks[pid] = max(peaks[pid], _rss(pid))
                    await anyio.sleep(0.005)

            def compute() -> Any:
                return dask.compute(x, scheduler=runtime.get, address=address, token=token)

            async with anyio.create_task_group() as tg:
                tg.start_soon(sample_rss)
                start = time.monotonic()
                with pytest.raises(TaskTooLarge) as info:
                    await anyio.to_thread.run_sync(compute, abandon_on_cancel=True)
                took = time.monotonic() - start
                done.set()

            # The manager and both workers live on and answer.
            assert manager.poll() is None and all(w.poll() is None for w in workers)
            async with Cluster(address, token=token) as cluster:
                status = await cluster.status()
                assert await cluster.submit(sum, [1, 2, 3]) == 6
    err = info.value
    print(f"failed after {took:.2f} s; worker RSS peaks (MiB):", [p / MB for p in peaks.values()])
    assert str(err.key).startswith("finalize-"), err.key
    assert err.needed > WORKER_MEMORY and err.largest == WORKER_MEMORY and err.pool is None
    assert err.needed < 12000 * 12000 * 8  # failed before every chunk was computed
    assert took < 20, took
    assert len(status["workers"]) == 2
    assert all(0 < peak < WORKER_MEMORY for peak in peaks.values()), peaks


def test_too_large_advice_fits_the_kind_of_task() -> None:
    """Audit memory F4: a task inside a dask graph (a ``rechunk-merge`` of chunks larger
    than a worker) was told to write results to storage and reduce them before
    gathering; its chunks are what is too large. A ``finalize`` task (the result being
    gathered) and a ``submit``'s own key keep the advice about results."""
    token = "d489c2ccf69001ced682c234b6e12028"
    start = (
        "task {!r} needs at least 600.0 MiB of inputs in memory at once, more than the "
        "largest memory limit of any worker (400.0 MiB); it was not started. "
    )
    key = f"('rechunk-merge-sum-{token}', 0, 1)"
    assert str(TaskTooLarge(key, 600 * 2**20, 400 * 2**20, None)) == start.format(key) + (
        "Make the chunks (or partitions) it reads smaller, or start workers with a larger "
        "--memory. ('rechunk-merge-sum' is the dask operation this task belongs to: where "
        "your code does not call it, dask made it from your collection; its memory follows "
        "the partitions (chunks) it reads and writes, set where the collection is made or "
        "reshaped: npartitions, partition_size, a groupby's split_out for a dask.dataframe, "
        "chunks for a dask.array.)"
    )
    results = (
        "Write large results to storage from the workers (for example dask.array's to_zarr "
        "or dask.dataframe's to_parquet) instead of computing them into one value, reduce "
        "them before gathering{}, or start workers with a larger --memory."
    )
    blocks = (
        ", gather its blocks into this client instead, where no worker's limit applies "
        "(futures = await cluster.submit_graph(x.__dask_graph__(), "
        "list(dask.core.flatten(x.__dask_keys__()))), then await cluster.gather(futures), "
        "and assemble them there)"
    )
    for key in (f"('finalize-{token}', 0)", f"finalize-hlgfinalizecompute-{token}", "use-1"):
        text = str(TaskTooLarge(key, 600 * 2**20, 400 * 2**20, None))
        gather = blocks if "finalize" in key else ""  # a collection's result: its blocks
        assert text == start.format(key) + results.format(gather), key
