"""A GPU pool on a real Slurm cluster with GPUs (``.ci/slurm up`` declares four fake
ones, ``Gres=gpu:4``): each block asks ``--gres=gpu:2``, Slurm gives its job two of the
node's GPUs and sets its ``CUDA_VISIBLE_DEVICES``, and each worker of the block is pinned
to one of those two (a pool's ``accelerators``), never to another block's GPU. A block
whose job got fewer GPUs than its node's workers fails before any worker starts, saying
what to ask for. A GPU block preempted mid-trial by an ``owner`` job comes back as the
same block (requeued), its trials resume from their checkpoints, and each trial ran on
a GPU Slurm gave its own job at that run, never one another trial held.

Like tests/test_slurm.py: without a cluster that answers these tests skip, with
``CI=true`` they fail (CI starts the cluster); a cluster without GPUs (started by an older
``.ci/slurm``) is the same. They hold the cluster's test lock; every wait is bounded.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.providers import ACCELERATOR_VARIABLES, BlockSpec, BlockState
from actors.slurm import TOO_FEW_GPUS, SlurmOptions
from runtime import Cluster, checkpoint, restore
from runtime.cli_processes import Cli
from runtime.errors import BatchSystemError
from runtime.preflight import FAIL, PASS
from tests.test_preflight import slurm_check
from tests.test_slurm import (  # noqa: F401  (fixtures: skip, or fail under CI; the lock)
    OWNER_JOB,
    cli,
    not_here,
    one_test_at_a_time,
    provider_for,
    slurm,
    slurm_conf,
    state_of,
)
from tests.test_slurm_fleet import fleet, retry_lines, status_where

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

LIMIT = 90  #: two blocks of two workers start on the node


def pinned_to() -> tuple[str, ...]:
    """What a worker's process sees: its accelerator variables."""
    return tuple(os.environ.get(k, "") for k in ACCELERATOR_VARIABLES)


def job_gpus(run: Callable[..., str], job: str) -> set[str]:
    """The GPUs Slurm gave ``job`` (``scontrol show job -d``: ``GRES=gpu:2(IDX:1,3)``)."""
    text = run("scontrol", "show", "job", "-d", job)
    found = re.search(r"GRES=\S*gpu\S*\(IDX:([0-9,-]+)\)", text)
    assert found, f"no GPU of job {job} in scontrol show job -d:\n{text}"
    ids: set[str] = set()
    for part in found.group(1).split(","):
        lo, _, hi = part.partition("-")
        ids.update(str(i) for i in range(int(lo), int(hi or lo) + 1))
    return ids


@pytest.fixture
def node_gpus(slurm: Callable[..., str]) -> int:  # noqa: F811 (the fixture)
    """The GPUs of the test cluster's node (4): fail under CI, else skip, without."""
    gres = slurm("sinfo", "-h", "-N", "-o", "%G").strip()
    found = re.search(r"gpu:(\d+)", gres)
    if not found:
        not_here(
            f"The Slurm test cluster's node has no GPUs (sinfo %G: {gres!r}): it was started "
            "by an older .ci/slurm; run `.ci/slurm down && .ci/slurm up` for its fake GPUs."
        )
    return int(found.group(1))


async def test_two_gpu_blocks_on_one_node_pin_each_worker_to_a_gpu_of_its_own_job(
    cli: Cli,  # noqa: F811
    slurm_conf: str,  # noqa: F811
    slurm: Callable[..., str],  # noqa: F811
    node_gpus: int,
    tmp_path: Path,
) -> None:
    """The node's four GPUs shared by two blocks of two workers: Slurm does not confine
    a job to its GPUs here, so the ids its workers see are the node's: the second block's
    workers must get the second job's GPUs, not ``0`` and ``1`` again (a user audit:
    both blocks' workers were pinned to GPUs 0 and 1, the first job's)."""
    options = SlurmOptions(
        partition="ckpt", accelerators=("0", "1"), scheduler_options="#SBATCH --gres=gpu:2"
    )
    with anyio.fail_after(LIMIT):
        async with provider_for(cli, slurm_conf, tmp_path / "run", options) as (provider, address):
            blocks = [await provider.start_block(BlockSpec(workers=2)) for _ in range(2)]
            for block in blocks:
                await state_of(provider, block, BlockState.RUNNING)
            async with Cluster(address) as cluster:
                await cluster.wait_for_workers(4, timeout=LIMIT)
                seen = await cluster.run(pinned_to)
                told = {w.worker_id: w.accelerator for w in (await cluster.status())["workers"]}
            for block in blocks:
                job = provider.record(block).job_id
                given = job_gpus(slurm, job)
                mine = {seen[w][0] for w in block.workers}
                assert mine == given, (block.block_id, job, seen, given)
                for w in block.workers:  # one device, in every variable, told as its own
                    assert seen[w] == (seen[w][0],) * len(ACCELERATOR_VARIABLES), seen
                    assert told[w] == seen[w][0], told
                stderr = (tmp_path / "run" / f"{block.block_id}.err").read_text()
                assert "corral: Slurm gave this job the GPUs" in stderr, stderr
    devices = [v[0] for v in seen.values()]
    assert sorted(devices) == [str(i) for i in range(4)], seen  # four workers, four GPUs


async def test_a_block_whose_job_got_too_few_gpus_fails_saying_what_to_ask_for(
    cli: Cli,  # noqa: F811
    slurm_conf: str,  # noqa: F811
    node_gpus: int,
    tmp_path: Path,
) -> None:
    """Two workers pinned to one GPU each, but ``--gres=gpu:1``: the block fails before
    its workers start (not two workers on one GPU, or one on a GPU of another job)."""
    options = SlurmOptions(
        partition="ckpt", accelerators=("0", "1"), scheduler_options="#SBATCH --gres=gpu:1"
    )
    with anyio.fail_after(LIMIT):
        async with provider_for(cli, slurm_conf, tmp_path / "run", options) as (provider, _):
            block = await provider.start_block(BlockSpec(workers=2))
            assert await provider.wait_ended(block) is BlockState.FAILED
    assert TOO_FEW_GPUS in block.detail, block.detail
    assert "Slurm gave this job 1 GPU(s) here" in block.detail, block.detail
    assert "#SBATCH --gres=gpu:2" in block.detail, block.detail
    out = (tmp_path / "run" / "block-1.out").read_text()
    assert "joined" not in out, out  # no worker started


#: a pool of two workers a node, each pinned to one of the two GPUs its job asks for
GPU_POOL = """
[pools.gpu]
provider = "slurm"
partition = "ckpt"
workers_per_node = 2
accelerators = 2
scheduler_options = "#SBATCH --gres=gpu:2"
"""


def test_check_passes_a_gpu_pool_the_node_fits_and_fails_one_asking_for_more(
    node_gpus: int, tmp_path: Path
) -> None:
    """``check --config``: the gpus check reads what the pools ask for; Slurm itself
    refuses a pool asking for more GPUs a node than the node has (test-only)."""
    config = f"""{GPU_POOL}[pools.big]
provider = "slurm"
partition = "ckpt"
workers_per_node = {node_gpus * 2}
accelerators = {node_gpus * 2}
scheduler_options = "#SBATCH --gres=gpu:{node_gpus * 2}"
[pools.few]
provider = "slurm"
partition = "ckpt"
workers_per_node = 2
accelerators = 2
scheduler_options = "#SBATCH --gres=gpu:1"
"""
    code, got, _ = slurm_check(tmp_path, config, "--no-probe")
    assert code == 1
    assert got[("gpu", "gpus")]["status"] == PASS
    assert got[("gpu", "test-only")]["status"] == PASS, got[("gpu", "test-only")]
    big = got[("big", "test-only")]
    assert big["status"] == FAIL
    assert "Requested node configuration is not available" in big["detail"], big
    assert f"#SBATCH --gres=gpu:{node_gpus * 2}" in big["advice"], big
    assert got[("big", "gpus")]["status"] == PASS  # it asks for what its workers take
    few = got[("few", "gpus")]
    assert few["status"] == FAIL and TOO_FEW_GPUS in few["detail"], few


def test_the_probe_of_a_gpu_pool_says_which_gpu_each_worker_took(
    slurm: Callable[..., str],  # noqa: F811
    node_gpus: int,
    tmp_path: Path,
) -> None:
    """``check --config`` with its probe job: a pool of two workers a node pinned to one
    GPU each, while another job holds two of the node's GPUs. The probe's workers are
    pinned as the pool's blocks pin theirs, each to one of the GPUs Slurm gave the probe's
    job (the other two), and the check says which (a user audit: it said only the
    versions; which GPU a worker takes was seen only once it ran)."""
    holder = slurm(
        "sbatch", "--parsable", "-p", "ckpt", "--gres=gpu:2", f"--job-name={OWNER_JOB}",
        "-o", "/dev/null", "--wrap", "sleep 300",
    ).strip()  # fmt: skip
    for _ in range(600):  # at most 60 s until it runs
        if slurm("squeue", "-h", "-j", holder, "-o", "%T").strip() == "RUNNING":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"job {holder}, holding two GPUs, did not start within 60 s")
    free = {str(i) for i in range(node_gpus)} - job_gpus(slurm, holder)
    code, got, _ = slurm_check(tmp_path, GPU_POOL)
    probe = got[("gpu", "probe")]
    assert code == 0 and probe["status"] == PASS, probe
    found = re.search(r"its 2 worker\(s\) pinned to GPU\(s\) (\S+), (\S+) \(Slurm gave the "
                      r"job the GPUs (\S+)\)", probe["detail"])  # fmt: skip
    assert found, probe
    pinned = {found.group(1), found.group(2)}
    assert pinned == set(found.group(3).split(",")) == free, (probe, free)


async def test_a_block_asking_for_more_gpus_than_the_node_has_is_refused_naming_its_line(
    cli: Cli,  # noqa: F811
    slurm_conf: str,  # noqa: F811
    node_gpus: int,
    tmp_path: Path,
) -> None:
    """sbatch refuses the job at once; the error's advice names the pool's own #SBATCH
    line and how to see the GRES the nodes have (it named only the partition, account
    and QOS)."""
    line = f"#SBATCH --gres=gpu:{node_gpus * 2}"
    options = SlurmOptions(partition="ckpt", scheduler_options=line)
    with anyio.fail_after(LIMIT):
        async with provider_for(cli, slurm_conf, tmp_path / "run", options) as (provider, _):
            with pytest.raises(BatchSystemError) as refused:
                await provider.start_block(BlockSpec())
    assert "Requested node configuration is not available" in refused.value.stderr
    assert f"scheduler_options ({line}: features and GRES the nodes have: " in str(refused.value)
    assert "`sinfo -o '%P %f %G'`" in str(refused.value)


def trial(n: int, steps: int, locks: str) -> dict[str, Any]:
    """A training trial of a sweep: it holds its GPU's lock while it runs (another
    trial on the same GPU fails at once), saves a checkpoint after each one-second step
    and resumes from the latest; it says where it ran and from which step it started."""
    gpu = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    with open(Path(locks) / f"gpu{gpu or 'none'}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AssertionError(f"trial {n}: GPU {gpu!r} is held by another trial") from None
        start = restore() or 0
        for step in range(start, steps):
            time.sleep(1.0)
            checkpoint(step + 1)
    return {
        "trial": n, "gpu": gpu, "job": os.environ.get("SLURM_JOB_ID", ""),
        "run": int(os.environ.get("SLURM_RESTART_COUNT") or 0) + 1, "resumed_from": start,
    }  # fmt: skip


def gpus_by_run(run_dir: Path) -> tuple[dict[tuple[str, int], set[str]], dict[str, str]]:
    """What each run of each block's job was given, from the blocks' ``.err`` (appended
    at each run: ``corral: block block-1, Slurm job 5, incarnation 2, node 0 on vm``,
    then ``corral: Slurm gave this job the GPUs 0,1 here; ...``): (job, run) -> GPUs,
    and each block's job (``gpu/block-1`` -> ``5``)."""
    given: dict[tuple[str, int], set[str]] = {}
    jobs: dict[str, str] = {}
    for err in run_dir.glob("corral-slurm/*/gpu/*.err"):
        at: tuple[str, int] | None = None
        for line in err.read_text().splitlines():
            head = re.match(r"corral: block \S+, Slurm job (\d+), incarnation (\d+)", line)
            if head:
                at = (head.group(1), int(head.group(2)))
                jobs[f"gpu/{err.stem}"] = at[0]
            gave = re.match(r"corral: Slurm gave this job the GPUs (\S+) here", line)
            if gave and at is not None:
                given[at] = set(gave.group(1).split(","))
    return given, jobs


GPU_SWEEP = """
[pools.gpu]
provider = "slurm"
partition = "ckpt"               # PreemptMode=REQUEUE: a preempted block runs again
min_blocks = 2
init_blocks = 2
max_blocks = 2
workers_per_node = 2
cores_per_worker = 1
accelerators = 2
scheduler_options = "#SBATCH --gres=gpu:2"
any_pool_tasks = false
walltime = "00:15:00"
"""


@pytest.mark.slow
@pytest.mark.timeout(420)
async def test_a_preempted_gpu_block_comes_back_and_its_trials_resume_on_its_own_gpus(
    slurm_conf: str,  # noqa: F811
    slurm: Callable[..., str],  # noqa: F811
    node_gpus: int,
    tmp_path: Path,
) -> None:
    """A sweep of six trials on two blocks of two GPU workers (the node's four GPUs):
    mid-trial an ``owner`` job asking for two GPUs preempts one block. Its trials go
    back to the queue free and resume from their checkpoints, the block comes back as
    the same block (requeued, no budget spent) with its workers pinned to the GPUs of
    its job's new run, and every trial finishes, each on a GPU of its own job's run,
    no two at once on one GPU (their lock), with ``retries=0`` untouched."""
    locks = tmp_path / "locks"
    locks.mkdir()
    async with fleet(tmp_path, slurm_conf, GPU_SWEEP, 4, 360) as (cluster, _):
        keys = [f"trial-{n}" for n in range(6)]
        graph = {k: (trial, n, 25, str(locks)) for n, k in enumerate(keys)}
        futures = await cluster.submit_graph(graph, keys, pool="gpu", retries=0)
        # Four trials running, each some steps in: then the owner takes two GPUs. (A
        # trial that failed, two workers pinned to one GPU, raises its error here.)
        st = await status_where(
            cluster, lambda s: s["tasks_by_state"].get("erred")
            or (sum(s["processing"].values()) == 4 and s["checkpoints"]["saved"] >= 8),
        )  # fmt: skip
        if st["tasks_by_state"].get("erred"):
            await cluster.gather(futures)
        owner = slurm(
            "sbatch", "--parsable", "-p", "owner", "--gres=gpu:2", f"--job-name={OWNER_JOB}",
            "-o", "/dev/null", "--wrap", "sleep 300",
        ).strip()  # fmt: skip
        st = await status_where(
            cluster, lambda s: any(e["state"] == "requeued" for e in s["autoscaler"]["ends"])
        )
        slurm("scancel", owner)  # its GPUs free: the block runs again (cred_expire, 20 s)
        st = await status_where(
            cluster, lambda s: list(s["autoscaler"]["blocks"].values()) == ["running"] * 2
            and len(s["workers"]) == 4,
        )  # fmt: skip
        told = {w.worker_id: w.accelerator for w in st["workers"]}
        results = await cluster.gather(futures)
        lost = await retry_lines(cluster, keys)
        st = await cluster.status()
    given, jobs = gpus_by_run(tmp_path / "work")
    ends = st["autoscaler"]["ends"]
    assert ends and {(e["state"], e["cause"], e["charged"]) for e in ends} == {
        ("requeued", "preempted", False),
    }, ends  # fmt: skip
    assert st["autoscaler"]["budget_spent"] == 0, st["autoscaler"]
    assert sorted(r["trial"] for r in results) == list(range(6)), results
    for r in results:  # on a GPU of its own job's run
        assert r["gpu"] in given[(r["job"], r["run"])], (r, given)
    # Each block's job ran once more than it was requeued; the preempted block's workers
    # rejoined pinned to the GPUs of its job's latest run.
    for block, job in jobs.items():
        runs = [run for (j, run) in given if j == job]
        assert max(runs) == 1 + sum(e["block"] == block for e in ends), (block, given, ends)
        for w in (f"{block.replace('/block', '')}.{i}" for i in range(2)):
            assert told[w] in given[(job, max(runs))], (w, told, given)
    assert len({told[w] for w in told}) == 4, told  # never two workers on one GPU
    assert lost and all("worker lost (preempted); free retry" in why for _, why in lost), lost
    resumed = {k for k, _ in lost}
    assert all(r["resumed_from"] > 0 for r in results if f"trial-{r['trial']}" in resumed), (
        results, lost,
    )  # fmt: skip
    assert st["checkpoints"]["resumed"] >= len(resumed), st["checkpoints"]
    assert "erred" not in st["tasks_by_state"], st["tasks_by_state"]
