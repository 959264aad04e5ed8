"""Fleets that come and go, on a real Slurm cluster (``.ci/slurm up``), end to end:
``python -m runtime manager --config corral.toml`` keeps configured Slurm pools, a
``Cluster(address)`` runs graphs on them, and the batch system does what it does to
checkpoint users: takes blocks back, ends them at their walltime, stops answering.

- A ``ckpt`` pool (preemptible partition, max 2 blocks) with an ``owner`` fallback: an
  owner job preempts its blocks mid-task. The answers are right, the lost tries say
  ``preempted``, ``retries=0`` is untouched, the blocks show PREEMPTED (free: no
  replacement budget spent) and are replaced, and a long task lost this way finishes on
  ``owner``.
- A block with a 3-minute walltime is drained before it and ends COMPLETED, no task
  killed.
- A pool with ``tasks_per_worker = 1`` (fresh, short-lived blocks where preemption
  grows likelier with a job's age): each task runs in a Slurm job of its own, each job
  ends COMPLETED once its task is done and its result fetched, ``drained`` and free,
  and the next task in line gets a new job.
- A command-line tool a task runs, killed by a preemption's SIGTERM with its worker:
  the try is a free retry, not the task's ``CalledProcessError``.
- A block on a requeueing partition comes back as a new incarnation of the same block
  (no replacement, no budget spent), and its worker rejoins.
- ``slurmctld`` stopped mid-run is a clear error in the status, and never suspends the
  pool however many sbatch calls fail; the run finishes once it is back, unasked.
- A block suspended (``scontrol suspend``) long enough that its workers are lost: the
  loss is ``suspended`` (free, no suspect), nothing goes to its suspended sibling, and
  the task finishes once the block is resumed.

Same rules as tests/test_slurm.py, whose fixtures these tests use: without a cluster
that answers they skip (with ``CI=true`` they fail), and they hold the machine-wide
test lock. Every wait is bounded and gated on what the status or Slurm says.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.console import ConsoleClient
from tests import test_slurm as base
from tests.helpers import ROOT, Cli, wait_until

# The cluster, its machine-wide test lock (autouse) and the Slurm command runner.
slurm_conf = base.slurm_conf
one_test_at_a_time = base.one_test_at_a_time
slurm = base.slurm
NODE_CPUS, OWNER_JOB = base.NODE_CPUS, base.OWNER_JOB

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.timeout(420)]


def slow_square(i: int) -> int:
    time.sleep(3.0)
    return i * i


def total(values: list[int]) -> int:
    return sum(values)


def long_task(seconds: float) -> str:
    time.sleep(seconds)
    return f"slept {seconds:g} s"


def quick(i: int) -> int:
    time.sleep(4.0)
    return i + 1000


@contextmanager
def manager(tmp_path: Path, conf: str, config: str) -> Iterator[tuple[Cli, Any, str, Path]]:
    """A manager process with the pools of ``config``, run from its own directory
    (its Slurm scripts and job output go there)."""
    path = tmp_path / "corral.toml"
    path.write_text(config)
    work = tmp_path / "work"
    work.mkdir()
    with Cli(tmp_path / "home") as cli:
        cli.env["SLURM_CONF"] = conf
        proc = cli.spawn(
            ["/bin/sh", "-c", 'cd "$0" && exec "$1" -m runtime manager --listen 127.0.0.1:0 '
             '--config "$2"', str(work), sys.executable, str(path)]
        )  # fmt: skip
        line = cli.line_with(proc, "manager listening on", limit=60)
        address = line.split("manager listening on", 1)[1].strip()
        try:
            yield cli, proc, address, work
        finally:
            cli.stop([proc])


@asynccontextmanager
async def fleet(
    tmp_path: Path, conf: str, config: str, workers: int, limit: float
) -> AsyncIterator[tuple[Cluster, str]]:
    """A manager with the pools of ``config`` and a client of it, once ``workers``
    workers joined; everything inside is bounded by ``limit`` seconds."""
    with manager(tmp_path, conf, config) as (_, _, address, _), anyio.fail_after(limit):
        async with Cluster(address) as cluster:
            await cluster.wait_for_workers(workers, timeout=120)
            yield cluster, address


def owner_job(slurm: Callable[..., str], cpus: int, seconds: int) -> str:
    """An owner-partition job that needs ``cpus`` CPUs: it preempts ckpt blocks."""
    return slurm(
        "sbatch", "--parsable", "-p", "owner", f"-n{cpus}", f"--job-name={OWNER_JOB}",
        "-o", "/dev/null", "--wrap", f"sleep {seconds}",
    ).strip()  # fmt: skip


async def retry_lines(cluster: Cluster, keys: list[Any]) -> list[tuple[str, str]]:
    return [(str(t[0]), str(t[2])) for t in await cluster.story(*keys) if t[1] == "retry"]


async def status_where(cluster: Cluster, ok: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        st = await cluster.status()
        return st if st.get("autoscaler") and ok(st) else None

    found: dict[str, Any] = await wait_until(check, step=0.25)
    return found


CKPT_OWNER = """
[pools.ckpt]
provider = "slurm"
partition = "ckpt-cancel"   # preemptible; a preempted job ends PREEMPTED
max_blocks = 2
init_blocks = 2
workers_per_node = 2
cores_per_worker = 1
walltime = "00:30:00"
fallback = "owner"

[pools.owner]
provider = "slurm"
partition = "owner"
init_blocks = 0
max_blocks = 1
workers_per_node = 1
cores_per_worker = 1
walltime = "00:30:00"
"""


async def test_preemption_costs_nothing_and_a_long_task_moves_to_owner(
    slurm_conf: str, slurm: Callable[..., str], tmp_path: Path
) -> None:
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    async with fleet(tmp_path, slurm_conf, CKPT_OWNER, 4, 300) as (cluster, address):
        marks["4 ckpt workers"] = time.monotonic() - t0
        # ~27 tasks on ckpt, nothing spare from the user: retries=0.
        graph: dict[Any, Any] = {f"sq-{i}": (slow_square, i) for i in range(26)}
        graph["total"] = (total, [f"sq-{i}" for i in range(26)])
        keys = [*(f"sq-{i}" for i in range(26)), "total"]
        futures = await cluster.submit_graph(graph, keys, pool="ckpt", retries=0)

        # Mid-task: a dozen finished, four running. The owner takes the whole node
        # back. (Later than the first tasks: the workers' life, which sets the median
        # that makes a task "long" for this pool, should not be shorter than a short
        # task and its wait in the worker's queue.)
        await status_where(
            cluster, lambda s: s["tasks_by_state"].get("memory", 0) >= 12
            and sum(s["processing"].values()) >= 4,
        )  # fmt: skip
        first = owner_job(slurm, NODE_CPUS, 12)
        marks["owner job 1"] = time.monotonic() - t0
        st = await status_where(
            cluster,
            lambda s: sum(e["state"] == "preempted" for e in s["autoscaler"]["ends"]) >= 2,
        )
        marks["both blocks PREEMPTED"] = time.monotonic() - t0
        auto = st["autoscaler"]
        ends = [e for e in auto["ends"] if e["state"] == "preempted"]
        assert {e["block"] for e in ends} == {"ckpt/block-1", "ckpt/block-2"}, auto
        assert all(e["cause"] == "preempted" and not e["charged"] for e in ends), ends
        assert auto["budget_spent"] == 0 and auto["gave_up"] == []
        # Replacements are asked for at once (they wait for the owner's CPUs).
        st = await status_where(
            cluster,
            lambda s: {"ckpt/block-3", "ckpt/block-4"} <= set(s["autoscaler"]["blocks"]),
        )
        marks["replacements submitted"] = time.monotonic() - t0

        results = await cluster.gather(futures)
        marks["graph done"] = time.monotonic() - t0
        assert results == [i * i for i in range(26)] + [sum(i * i for i in range(26))]
        lost = await retry_lines(cluster, keys)
        assert lost, "no try was running when the owner job came"
        assert all("preempted" in why and "free retry" in why for _, why in lost), lost
        assert any("worker lost (preempted); free retry" in why for _, why in lost), lost
        st = await cluster.status()
        assert "erred" not in st["tasks_by_state"]
        ckpt_life = st["survival"]["ckpt"]
        assert ckpt_life["deaths"] >= 4 and ckpt_life["median"] is not None, ckpt_life
        median = float(ckpt_life["median"])
        for f in futures:  # fetched: not to be computed again when their holders go
            f.release()
        slurm("scancel", first)

        # A long task on a replacement block: once it has run past the median life
        # of a ckpt worker, the owner comes back (leaving one CPU for the owner pool).
        (fut,) = await cluster.submit_graph(
            {"long": (long_task, 30.0)}, ["long"], pool="ckpt", retries=0
        )

        async def running() -> bool:
            return any(t[2] == "processing" for t in await cluster.story("long"))

        await wait_until(running, step=0.1)
        started = time.monotonic()
        marks["long task running on ckpt"] = started - t0
        await wait_until(lambda: time.monotonic() - started > median + 3, step=0.25)
        owner_job(slurm, NODE_CPUS - 1, 120)
        marks["owner job 2"] = time.monotonic() - t0
        assert await fut == "slept 30 s"
        marks["long task done on owner"] = time.monotonic() - t0
        story = [(str(t[1]), str(t[2])) for t in await cluster.story("long")]
        assert ("pool", "ckpt->owner") in story, story
        (why,) = [w for _, w in await retry_lines(cluster, ["long"])]
        assert "a long task, moved to 'owner'; free retry" in why, why
        st = await cluster.status()
        auto = st["autoscaler"]
        assert "owner/block-1" in auto["blocks"] or any(
            e["block"] == "owner/block-1" for e in auto["ends"]
        ), auto
        assert auto["budget_spent"] == 0, auto
        assert "erred" not in st["tasks_by_state"]
        async with ConsoleClient(address) as console:
            print((await console.execute("status")).text(160))
    print({k: round(v, 1) for k, v in marks.items()})


WALLTIME = """
[pools.short]
provider = "slurm"
partition = "ckpt"
max_blocks = 1
init_blocks = 1
workers_per_node = 1
cores_per_worker = 1
walltime = "00:03:00"
drain_period = "00:02:30"   # drained 30 s after the job starts
"""


async def test_a_block_drains_before_its_walltime_and_ends_completed(
    slurm_conf: str, slurm: Callable[..., str], tmp_path: Path
) -> None:
    t0 = time.monotonic()
    async with fleet(tmp_path, slurm_conf, WALLTIME, 1, 240) as (cluster, _):
        keys = [f"q-{i}" for i in range(12)]  # 48 s of work for one worker
        futures = await cluster.submit_graph(
            {k: (quick, i) for i, k in enumerate(keys)}, keys, pool="short", retries=0
        )
        # Each result is fetched, then released, as soon as it is done: a drained
        # worker has no peer to hand the outputs to, so outputs still wanted when it
        # leaves would be computed again on the next block.
        results: dict[int, int] = {}

        async def fetch(i: int) -> None:
            results[i] = await futures[i]
            futures[i].release()

        async with anyio.create_task_group() as tg:
            for i in range(len(futures)):
                tg.start_soon(fetch, i)
        assert [results[i] for i in range(12)] == [i + 1000 for i in range(12)]
        st = await status_where(
            cluster,
            lambda s: any(e["block"] == "short/block-1" for e in s["autoscaler"]["ends"]),
        )
        ended = time.monotonic() - t0
        (end,) = [e for e in st["autoscaler"]["ends"] if e["block"] == "short/block-1"]
        assert end["state"] == "completed" and end["cause"] == "walltime", end
        assert not end["charged"] and st["autoscaler"]["budget_spent"] == 0
        job = slurm("squeue", "-h", "-t", "all", "-n", "corral-short-1", "-o", "%T").split()
        assert job[-1] == "COMPLETED", job
        assert await retry_lines(cluster, keys) == []  # no task was killed
        st = await cluster.status()
        assert st["tasks_by_state"].get("erred", 0) == 0
        assert "short/block-2" in st["autoscaler"]["blocks"] or any(
            e["block"] == "short/block-2" for e in st["autoscaler"]["ends"]
        )
    print(f"block-1 ended COMPLETED (walltime drain) after {ended:.1f} s")


FRESH = """
[pools.fresh]
provider = "slurm"
partition = "ckpt"
max_blocks = 2
init_blocks = 1
workers_per_node = 1
cores_per_worker = 1
walltime = "00:10:00"
tasks_per_worker = 1          # each job runs one task, then ends; a new one runs the next
"""


def where_run(i: int) -> tuple[int, str]:
    return i, os.environ["CORRAL_WORKER_ID"]


async def test_one_task_per_block_each_in_a_job_of_its_own(
    slurm_conf: str, slurm: Callable[..., str], tmp_path: Path
) -> None:
    async with fleet(tmp_path, slurm_conf, FRESH, 1, 240) as (cluster, _):
        t0 = time.monotonic()
        futures = await cluster.submit_graph(
            {f"w-{i}": (where_run, i) for i in range(4)}, [f"w-{i}" for i in range(4)]
        )
        results = []
        for f in futures:  # fetched, then released: nothing keeps its worker after
            results.append(await f)
            f.release()
        done = time.monotonic() - t0
        assert [i for i, _ in results] == [0, 1, 2, 3]
        workers = [w for _, w in results]
        assert len(set(workers)) == 4, workers  # four workers, one task each
        blocks = {f"fresh/block-{w.rsplit('-', 1)[1]}" for w in workers}
        st = await status_where(
            cluster, lambda s: blocks <= {e["block"] for e in s["autoscaler"]["ends"]}
        )
        ends = [e for e in st["autoscaler"]["ends"] if e["block"] in blocks]
        assert {(e["state"], e["cause"], e["charged"]) for e in ends} == {
            ("completed", "drained", False)
        }, ends
        assert st["autoscaler"]["budget_spent"] == 0
        for w in workers:  # each block a Slurm job of its own, COMPLETED
            job = slurm("squeue", "-h", "-t", "all", "-n", f"corral-{w}", "-o", "%T").split()
            assert job[-1] == "COMPLETED", (w, job)
    print(f"4 one-task blocks: every result back {done:.1f} s after submitting")


CTLD = """
[pools.c]
provider = "slurm"
partition = "ckpt"
min_blocks = 0
init_blocks = 0
max_blocks = 1
workers_per_node = 2
cores_per_worker = 1
walltime = "00:10:00"
"""


@pytest.fixture
def ctld(slurm_conf: str) -> Callable[[str], None]:
    """Stop or start the test cluster's slurmctld (``.ci/slurm ctld-stop|ctld-start``);
    only a cluster that ``.ci/slurm`` started can (it has the pid file)."""
    where = Path(slurm_conf).parent
    if not (where / "slurmctld.pid").is_file():
        why = f"cannot stop the slurmctld of {slurm_conf}: .ci/slurm did not start it"
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(why)

    def run(action: str) -> None:
        subprocess.run([str(ROOT / ".ci" / "slurm"), action, str(where)], check=True, timeout=60)

    return run


async def test_slurmctld_down_is_a_clear_error_and_the_run_finishes_once_it_is_back(
    slurm_conf: str, ctld: Callable[[str], None], tmp_path: Path
) -> None:
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    with manager(tmp_path, slurm_conf, CTLD) as (_, _, address, _), anyio.fail_after(300):
        async with Cluster(address) as cluster:
            try:
                ctld("ctld-stop")
                keys = [f"c-{i}" for i in range(8)]
                futures = await cluster.submit_graph(
                    {k: (slow_square, i) for i, k in enumerate(keys)}, keys, pool="c"
                )
                # The pool wants a block; sbatch cannot reach the controller.
                st = await status_where(cluster, lambda s: s["autoscaler"]["batch_errors"].get("c"))
                marks["error in status"] = time.monotonic() - t0
                err = st["autoscaler"]["batch_errors"]["c"]
                assert err["command"] == "sbatch --parsable", err
                assert "scontrol ping" in err["error"], err  # says what to check
                assert (
                    "Unable to contact slurm controller" in err["error"]
                    or "no answer within" in err["error"]
                ), err
                assert st["autoscaler"]["budget_spent"] == 0 and st["autoscaler"]["gave_up"] == []
                async with ConsoleClient(address) as console:
                    text = (await console.execute("status")).text(200)
                assert (
                    "pool c: batch system error at" in text
                    or "pool c: batch system failing since" in text
                ), text
                print(text)
                # A user audit: the third failed sbatch of an outage (39 s) suspended the
                # pool until an operator typed `resume`. A controller out of reach is no
                # refusal: the pool backs off and is never suspended.
                st = await status_where(
                    cluster, lambda s: s["autoscaler"]["batch_errors"]["c"]["failures"] >= 3
                )
                marks["3 failed sbatch"] = time.monotonic() - t0
                err = st["autoscaler"]["batch_errors"]["c"]
                assert not err["suspended"] and st["autoscaler"]["paused"] == [], err
            finally:
                ctld("ctld-start")
            marks["slurmctld back"] = time.monotonic() - t0
            # It goes on by itself once a submission goes through: no `resume`.
            assert await cluster.gather(futures) == [i * i for i in range(8)]
            marks["run done"] = time.monotonic() - t0
            st = await status_where(cluster, lambda s: not s["autoscaler"]["batch_errors"])
            assert st["autoscaler"]["budget_spent"] == 0
    print({k: round(v, 1) for k, v in marks.items()})


REQUEUE = """
[pools.rq]
provider = "slurm"
partition = "ckpt"   # PreemptMode=REQUEUE: a preempted job runs again, same id
walltime = "00:10:00"
init_blocks = 1
max_blocks = 1
workers_per_node = 1
"""


async def test_a_requeued_block_is_a_new_incarnation_of_the_same_block(
    slurm_conf: str, slurm: Callable[..., str], tmp_path: Path
) -> None:
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    async with fleet(tmp_path, slurm_conf, REQUEUE, 1, 240) as (cluster, _):
        keys = [f"r-{i}" for i in range(6)]
        futures = await cluster.submit_graph(
            {k: (slow_square, i) for i, k in enumerate(keys)}, keys, pool="rq", retries=0
        )
        await status_where(
            cluster, lambda s: s["tasks_by_state"].get("memory", 0) >= 1
            and sum(s["processing"].values()) >= 1,
        )  # fmt: skip
        owner = owner_job(slurm, NODE_CPUS, 10)
        st = await status_where(
            cluster, lambda s: any(e["state"] == "requeued" for e in s["autoscaler"]["ends"])
        )
        marks["requeue seen"] = time.monotonic() - t0
        auto = st["autoscaler"]
        (end,) = auto["ends"]
        assert (end["block"], end["state"], end["cause"]) == (
            "rq/block-1", "requeued", "preempted",
        ), end  # fmt: skip
        assert not end["charged"] and end["incarnation"] == 1
        assert auto["incarnations"] == {"rq/block-1": 2}
        assert list(auto["blocks"]) == ["rq/block-1"], auto  # the same block, not a new one
        assert auto["budget_spent"] == 0
        slurm("scancel", owner)
        # Slurm runs it again once the credential of the first run expires (20 s here).
        st = await status_where(
            cluster,
            lambda s: (
                s["autoscaler"]["blocks"].get("rq/block-1") == "running" and len(s["workers"]) == 1
            ),
        )
        marks["incarnation 2 running"] = time.monotonic() - t0
        assert "incarnation 2" in st["autoscaler"]["details"]["rq/block-1"]
        assert await cluster.gather(futures) == [i * i for i in range(6)]
        lost = await retry_lines(cluster, keys)
        assert lost and all("worker lost (preempted); free retry" in w for _, w in lost), lost
        st = await cluster.status()
        assert "erred" not in st["tasks_by_state"] and st["autoscaler"]["budget_spent"] == 0
    print({k: round(v, 1) for k, v in marks.items()})


SUSPEND = """
[pools.ckpt]
provider = "slurm"
partition = "ckpt"
walltime = "00:10:00"
init_blocks = 1
max_blocks = 1
workers_per_node = 2
cores_per_worker = 1
"""


async def test_a_suspended_block_s_lost_workers_cost_nothing_and_take_no_task(
    slurm_conf: str, slurm: Callable[..., str], tmp_path: Path
) -> None:
    """The audit's repro: before, the provider saw the block held and nobody was told;
    each worker was lost (``unknown``) 20 s into the suspension, the task went to the
    suspended sibling and was lost again at once (two retries in 0.1 s), and losses
    like these made it a suspect (TaskCrashedWorkers)."""
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    async with fleet(tmp_path, slurm_conf, SUSPEND, 2, 240) as (cluster, _):
        (fut,) = await cluster.submit_graph(
            {"long": (long_task, 15.0)}, ["long"], pool="ckpt", retries=0
        )

        async def running() -> bool:
            return any(t[2] == "processing" for t in await cluster.story("long"))

        await wait_until(running, step=0.1)
        job = slurm("squeue", "-h", "-n", "corral-ckpt-1", "-o", "%i").strip()
        slurm("scontrol", "suspend", job)
        try:
            await status_where(
                cluster, lambda s: s["autoscaler"]["blocks"].get("ckpt/block-1") == "held"
            )
            marks["held"] = time.monotonic() - t0
            # Silent past the heartbeat and the manager's grace: both workers lost.
            await status_where(cluster, lambda s: not s["workers"])
            marks["workers lost"] = time.monotonic() - t0
            lost = await retry_lines(cluster, ["long"])
            assert lost == [("long", "worker lost (suspended); free retry")], lost
            story = [str(t[2]) for t in await cluster.story("long")]
            assert story[-1] == "queued", story  # not sent to the suspended sibling
        finally:
            slurm("scontrol", "resume", job)
        marks["resumed"] = time.monotonic() - t0
        assert await fut == "slept 15 s"
        marks["done"] = time.monotonic() - t0
        assert len(await retry_lines(cluster, ["long"])) == 1
        st = await cluster.status()
        assert "erred" not in st["tasks_by_state"] and st["autoscaler"]["budget_spent"] == 0
        assert st["autoscaler"]["blocks"] == {"ckpt/block-1": "running"}, st["autoscaler"]
    print({k: round(v, 1) for k, v in marks.items()})


TOOL = """
[pools.tool]
provider = "slurm"
partition = "ckpt-cancel"   # preemptible; a preempted job ends PREEMPTED, replaced at once
max_blocks = 1
init_blocks = 1
cores_per_worker = 1
walltime = "00:10:00"
execution = "process"
"""


def run_tool(started: str, gate: str) -> str:
    """A bash_app-like task: a command-line tool (a shell waiting for ``gate``), which
    the job's SIGTERM reaches as it reaches the worker; ``started`` says it runs."""
    tool = ["sh", "-c", f'touch "{started}"; while [ ! -e "{gate}" ]; do sleep 0.1; done']
    subprocess.run(tool, capture_output=True, text=True, check=True)
    return "tool done"


async def test_a_tool_a_preemption_killed_is_a_free_retry_not_the_task_s_error(
    slurm_conf: str, slurm: Callable[..., str], tmp_path: Path
) -> None:
    """A user audit (astro): a preemption's SIGTERM killed the tool a task ran at once;
    its ``CalledProcessError`` ("died with SIGTERM") reached the scheduler before the
    worker's leave and spent a retry (with ``retries=0``: the task failed). The try is
    lost with the worker instead: free, and the task finishes on the next block."""
    started, gate = tmp_path / "started", tmp_path / "gate"
    async with fleet(tmp_path, slurm_conf, TOOL, 1, 300) as (cluster, _):
        fut = cluster.submit(run_tool, str(started), str(gate), retries=0, pool="tool")
        await wait_until(started.exists, limit=120)
        owner_job(slurm, NODE_CPUS, 10)
        await status_where(
            cluster, lambda s: any(e["state"] == "preempted" for e in s["autoscaler"]["ends"])
        )
        gate.touch()  # the next try's tool ends at once
        assert await fut == "tool done"
        whys = [why for _, why in await retry_lines(cluster, [fut.key])]
        assert whys == ["worker lost (preempted); free retry"], whys
