"""A GPU pool on a real Slurm cluster with GPUs (``.ci/slurm up`` declares four fake
ones, ``Gres=gpu:4``): each block asks ``--gres=gpu:2``, Slurm gives its job two of the
node's GPUs and sets its ``CUDA_VISIBLE_DEVICES``, and each worker of the block is pinned
to one of those two (a pool's ``accelerators``), never to another block's GPU. A block
whose job got fewer GPUs than its node's workers fails before any worker starts, saying
what to ask for.

Like tests/test_slurm.py: without a cluster that answers these tests skip, with
``CI=true`` they fail (CI starts the cluster); a cluster without GPUs (started by an older
``.ci/slurm``) is the same. They hold the cluster's test lock; every wait is bounded.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from actors.providers import ACCELERATOR_VARIABLES, BlockSpec, BlockState
from actors.slurm import TOO_FEW_GPUS, SlurmOptions
from runtime import Cluster
from runtime.cli_processes import Cli
from runtime.errors import BatchSystemError
from runtime.preflight import FAIL, PASS
from tests.test_preflight import slurm_check
from tests.test_slurm import (  # noqa: F401  (fixtures: skip, or fail under CI; the lock)
    cli,
    not_here,
    one_test_at_a_time,
    provider_for,
    slurm,
    slurm_conf,
    state_of,
)

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


def test_check_passes_a_gpu_pool_the_node_fits_and_fails_one_asking_for_more(
    node_gpus: int, tmp_path: Path
) -> None:
    """``check --config``: the gpus check reads what the pools ask for; Slurm itself
    refuses a pool asking for more GPUs a node than the node has (test-only)."""
    config = f"""
[pools.gpu]
provider = "slurm"
partition = "ckpt"
workers_per_node = 2
accelerators = 2
scheduler_options = "#SBATCH --gres=gpu:2"
[pools.big]
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
