"""SlurmProvider against a real single-node Slurm cluster (``.ci/slurm up``).

The session fixture uses the cluster that ``SLURM_CONF`` (or ``CORRAL_SLURM_CONF``)
names, else the one ``.ci/slurm up`` starts by default in /tmp/corral-slurm. Without a
cluster that answers, these tests skip with a message saying to run ``.ci/slurm up``;
with ``CI=true`` they fail instead (CI starts the cluster, so it must never skip them).

Each test starts a manager process (``python -m runtime manager``), a SlurmProvider in
this process whose blocks' workers join that manager, and runs tasks through
``Cluster(address)``. The node declares 8 CPUs; an ``owner`` job asking for all 8
preempts ``ckpt`` blocks. Every wait is bounded and gated on what is observed.
"""

from __future__ import annotations

import operator
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import NoReturn

import anyio
import pytest

from actors.providers import Block, BlockSpec, BlockState
from actors.slurm import SlurmOptions, SlurmProvider
from runtime import Cluster
from runtime.errors import BatchSystemError, SubmissionsSuspended
from tests.helpers import ROOT, Cli, slurm_test_lock, wait_until

# Each test bounds itself (fail_after); pytest's own limit also covers waiting for the
# cluster's test lock (one_test_at_a_time: up to 100 s).
pytestmark = [pytest.mark.anyio, pytest.mark.timeout(240)]

DEFAULT_CONF = "/tmp/corral-slurm/slurm.conf"  #: where `.ci/slurm up` puts it
NODE_CPUS = 8  #: what `.ci/slurm up` declares (an owner job asks for all of them)
OWNER_JOB = f"corral-test-owner-{os.getpid()}"  #: the name of this run's owner jobs


def _slurm(conf: str, *argv: str, check: bool = True) -> str:
    env = dict(os.environ, SLURM_CONF=conf)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise AssertionError(f"{argv} failed ({done.returncode}): {done.stderr}")
    return done.stdout


def _unavailable() -> tuple[str | None, str]:
    """(the config, "") when a cluster answers, else (None, why not)."""
    conf = os.environ.get("CORRAL_SLURM_CONF") or os.environ.get("SLURM_CONF")
    if not conf and Path(DEFAULT_CONF).exists():
        conf = DEFAULT_CONF
    if not conf:
        return None, "no SLURM_CONF and no cluster in /tmp/corral-slurm"
    if not Path(conf).is_file():
        return None, f"there is no {conf}"
    for command in ("sbatch", "squeue", "scancel", "scontrol", "sinfo"):
        if shutil.which(command) is None:
            return None, f"the Slurm command {command!r} is not installed"
    env = dict(os.environ, SLURM_CONF=conf)
    try:
        ping = subprocess.run(
            ["scontrol", "ping"], env=env, capture_output=True, text=True, timeout=30
        )
        parts = subprocess.run(
            ["sinfo", "-h", "-o", "%P"], env=env, capture_output=True, text=True, timeout=30
        )
    except subprocess.TimeoutExpired:
        return None, f"the Slurm controller of {conf} does not answer"
    if "is UP" not in ping.stdout:
        return None, f"the Slurm controller of {conf} is down: {ping.stdout}{ping.stderr}"
    names = {p.strip().rstrip("*") for p in parts.stdout.split()}
    if not {"ckpt", "ckpt-cancel", "owner"} <= names:
        return None, f"{conf} lacks the partitions ckpt, ckpt-cancel and owner: {names}"
    return conf, ""


def not_here(message: str) -> NoReturn:
    """A test cluster lacks what a test needs: skip, saying ``message``; under
    ``CI=true`` fail instead (CI starts the cluster, so it must never skip them)."""
    if os.environ.get("CI") == "true":
        pytest.fail(message + " CI must run these tests, not skip them.")
    pytest.skip(message)


@pytest.fixture(scope="session")
def slurm_conf() -> Iterator[str]:
    conf, why = _unavailable()
    if conf is None:
        not_here(
            f"Slurm is not available here ({why}). Run `.ci/slurm up` (as root: it installs "
            "and starts a one-node cluster) and export the SLURM_CONF it prints."
        )
    yield conf


@pytest.fixture(autouse=True)
def one_test_at_a_time(slurm_conf: str) -> Iterator[None]:
    """Hold the cluster's test lock: test runs of other checkouts on this machine use
    the same cluster, and one's owner job (or stopped slurmctld) would upset another's
    test. Waits at most 100 s (about two of the longest tests)."""
    with slurm_test_lock(slurm_conf):
        yield


@pytest.fixture
def slurm(slurm_conf: str) -> Iterator[Callable[..., str]]:
    """Run a Slurm command against the test cluster; cancels the owner jobs the test
    submitted (:func:`owner_job`) at the end."""

    def run(*argv: str, check: bool = True) -> str:
        return _slurm(slurm_conf, *argv, check=check)

    yield run
    run("scancel", f"--name={OWNER_JOB}", check=False)


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    with Cli(tmp_path / "home") as c:
        yield c


@asynccontextmanager
async def provider_for(
    cli: Cli,
    conf: str,
    run_dir: Path,
    options: SlurmOptions,
    argv: Callable[[str, str, int], Sequence[str]] | None = None,
    **kw: object,
) -> AsyncIterator[tuple[SlurmProvider, str]]:
    """A manager process and a SlurmProvider whose workers join it."""
    _, address = cli.manager()
    token = cli.tokens(address)["admin"]

    def worker_argv(block_id: str, index: int) -> list[str]:
        if argv is not None:
            return list(argv(address, block_id, index))
        return [sys.executable, "-m", "runtime", "worker", address, "--cores", "1"]

    provider = SlurmProvider(
        worker_argv, options, env={"CORRAL_TOKEN": token}, run_dir=run_dir, chdir=ROOT,
        slurm_conf=conf, status_interval=0.2, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    async with provider.running():
        yield provider, address


async def state_of(provider: SlurmProvider, block: Block, *states: BlockState) -> BlockState:
    """Wait (the caller bounds it) until the provider reports one of ``states``."""
    while provider.poll(block) not in states:
        await provider.wait_refreshed()
    return provider.poll(block)


async def running_block(provider: SlurmProvider) -> Block:
    """A new block of one worker, once Slurm runs it."""
    block = await provider.start_block(BlockSpec())
    await state_of(provider, block, BlockState.RUNNING)
    return block


async def workers_of(cluster: Cluster) -> set[str]:
    return {w.worker_id for w in (await cluster.status())["workers"]}


async def wait_worker(cluster: Cluster, worker: str, present: bool = True) -> None:
    async def seen() -> bool:
        return (worker in await workers_of(cluster)) == present

    await wait_until(seen, step=0.1)


def owner_job(slurm: Callable[..., str], seconds: int = 60) -> str:
    """An owner-partition job that needs every CPU of the node: it preempts."""
    return slurm(
        "sbatch", "--parsable", "-p", "owner", f"-n{NODE_CPUS}", f"--job-name={OWNER_JOB}",
        "-o", "/dev/null", "--wrap", f"sleep {seconds}",
    ).strip()  # fmt: skip


# ----------------------------------------------------------------------------- tests


async def test_block_runs_tasks_then_an_operator_scancel_cancels_it(
    cli: Cli, slurm_conf: str, slurm: Callable[..., str], tmp_path: Path
) -> None:
    with anyio.fail_after(90):
        async with provider_for(
            cli, slurm_conf, tmp_path / "run", SlurmOptions(partition="ckpt", walltime=600)
        ) as (provider, address):
            block = await provider.start_block(BlockSpec(pool="default"))
            assert block.state is BlockState.PENDING and block.workers == ["slurm-1"]
            script = provider.script_path(block)
            text = script.read_text()  # kept on disk, readable
            assert "#SBATCH --partition=ckpt" in text and "#SBATCH --time=00:10:00" in text
            assert "CORRAL_WORKER_ID=slurm-1" in text
            assert provider.env["CORRAL_TOKEN"] not in text  # it is in the 0600 env file
            assert (script.with_suffix(".env").stat().st_mode & 0o077) == 0

            assert await state_of(provider, block, BlockState.RUNNING) is BlockState.RUNNING
            job = provider.record(block).job_id
            async with Cluster(address) as cluster:
                await wait_worker(cluster, "slurm-1")  # joined under the block's id
                futures = [cluster.submit(operator.add, i, 100) for i in range(10)]
                assert await cluster.gather(futures) == [i + 100 for i in range(10)]

                slurm("scancel", job)  # an operator, not Corral
                assert await provider.wait_ended(block) is BlockState.CANCELLED
                assert provider.record(block).slurm_state == "CANCELLED"
                await wait_worker(cluster, "slurm-1", present=False)
            # One squeue per refresh for all blocks, never one per block.
            assert provider.squeue_calls <= provider.refreshes + 1
            assert provider.error is None


async def test_stop_block_cancels_the_job_and_ends_scaled_in(
    cli: Cli, slurm_conf: str, slurm: Callable[..., str], tmp_path: Path
) -> None:
    with anyio.fail_after(60):
        async with provider_for(
            cli, slurm_conf, tmp_path / "run", SlurmOptions(partition="ckpt")
        ) as (provider, _):
            blocks = [await provider.start_block(BlockSpec()) for _ in range(2)]
            for b in blocks:
                await state_of(provider, b, BlockState.RUNNING)
            refreshes, calls = provider.refreshes, provider.squeue_calls
            await provider.wait_refreshed()
            await provider.wait_refreshed()
            # Two live blocks, one squeue per refresh.
            assert provider.squeue_calls - calls == provider.refreshes - refreshes
            await provider.stop_block(blocks[0])
            assert blocks[0].state is BlockState.SCALED_IN
            assert await provider.wait_ended(blocks[0]) is BlockState.SCALED_IN
            job = provider.record(blocks[0]).job_id

            async def gone_from_slurm() -> bool:
                out = slurm("squeue", "-h", "-t", "all", "-j", job, "-o", "%T")
                return out.strip() == "CANCELLED"

            await wait_until(gone_from_slurm, step=0.1)
            assert provider.poll(blocks[1]) is BlockState.RUNNING
        # Leaving the provider cancels what is still live.
        assert blocks[1].state is BlockState.SCALED_IN
        job1 = provider.record(blocks[1]).job_id
        await wait_until(
            lambda: (
                slurm("squeue", "-h", "-t", "all", "-j", job1, "-o", "%T").strip() == "CANCELLED"
            ),
            step=0.1,
        )


async def test_owner_job_preempts_a_ckpt_block_and_its_requeue_is_a_new_incarnation(
    cli: Cli, slurm_conf: str, slurm: Callable[..., str], tmp_path: Path
) -> None:
    with anyio.fail_after(110):
        async with provider_for(
            cli, slurm_conf, tmp_path / "run", SlurmOptions(partition="ckpt")
        ) as (provider, address):
            block = await running_block(provider)
            rec = provider.record(block)
            async with Cluster(address) as cluster:
                await wait_worker(cluster, "slurm-1")
                assert await cluster.submit(operator.mul, 6, 7) == 42

                t0 = anyio.current_time()
                owner = owner_job(slurm)
                # PreemptMode=REQUEUE: R -> CG -> PD, same job id, Restarts=1.
                await wait_until(lambda: rec.restarts == 1, step=0.05)
                seen_after = anyio.current_time() - t0
                assert block.state is BlockState.PENDING  # not ended, not a second block
                # slurmstepd writes `DUE TO PREEMPTION` on its own time: the look that
                # saw the requeue may say `requeued`, a later one (the line in) corrects it.
                await wait_until(
                    lambda: [i.cause for i in rec.incarnations] == ["preempted"],
                    "the requeue's cause read from the stderr", limit=10, step=0.05,
                )  # fmt: skip
                assert block.requeue_cause == "preempted"
                assert "incarnation 2" in block.detail
                assert list(provider.blocks) == ["block-1"]
                assert not block.state.terminal
                await wait_worker(cluster, "slurm-1", present=False)  # the worker left

                # The owner is done: the requeued job runs again once it is eligible
                # (cred_expire=20 s in .ci/slurm's config; Slurm's default is 120 s).
                slurm("scancel", owner)
                await state_of(provider, block, BlockState.RUNNING)
                rerun_after = anyio.current_time() - t0
                assert rec.restarts == 1 and len(rec.incarnations) == 1
                await wait_worker(cluster, "slurm-1")  # the new incarnation rejoined
                assert await cluster.submit(operator.add, 40, 2) == 42
                stderr = (tmp_path / "run" / "block-1.err").read_text()
                assert "DUE TO PREEMPTION" in stderr and "incarnation 2" in stderr
            print(
                f"preemption seen after {seen_after:.2f} s, running again after {rerun_after:.1f} s"
            )


async def test_owner_job_preempts_a_cancel_mode_block_which_ends_preempted(
    cli: Cli, slurm_conf: str, slurm: Callable[..., str], tmp_path: Path
) -> None:
    with anyio.fail_after(60):
        async with provider_for(
            cli, slurm_conf, tmp_path / "run", SlurmOptions(partition="ckpt-cancel")
        ) as (provider, address):
            block = await running_block(provider)
            async with Cluster(address) as cluster:
                await wait_worker(cluster, "slurm-1")
                owner_job(slurm)
                assert await provider.wait_ended(block) is BlockState.PREEMPTED
                assert provider.record(block).slurm_state == "PREEMPTED"
                await wait_worker(cluster, "slurm-1", present=False)


async def test_failed_block_shows_its_stderr(cli: Cli, slurm_conf: str, tmp_path: Path) -> None:
    def failing(address: str, block_id: str, index: int) -> list[str]:
        code = "import sys; print('worker cannot start: no such env', file=sys.stderr); exit(3)"
        return [sys.executable, "-c", code]

    with anyio.fail_after(60):
        async with provider_for(
            cli, slurm_conf, tmp_path / "run", SlurmOptions(partition="ckpt"), failing
        ) as (provider, _):
            block = await provider.start_block(BlockSpec())
            assert await provider.wait_ended(block) is BlockState.FAILED
            assert "worker cannot start: no such env" in block.detail
            assert "exit code 3" in block.detail


async def test_a_failed_worker_init_says_why_and_where_its_stderr_is(
    cli: Cli, slurm_conf: str, tmp_path: Path
) -> None:
    """The user audit's pool: a ``module`` command the nodes do not have. The failed
    block's detail names its .err file and quotes the failure from it."""
    options = SlurmOptions(partition="ckpt", worker_init="echo setting up\nno-such-module-cmd x")
    with anyio.fail_after(60):
        async with provider_for(cli, slurm_conf, tmp_path / "run", options) as (provider, _):
            block = await provider.start_block(BlockSpec())
            assert await provider.wait_ended(block) is BlockState.FAILED
    err = tmp_path / "run" / "block-1.err"
    assert f"stderr ({err}):" in block.detail.splitlines()[0], block.detail
    assert "no-such-module-cmd: command not found" in block.detail
    assert "corral: worker_init failed (exit status 127): no worker started" in block.detail


async def test_rejected_submissions_back_off_then_stop_until_resumed(
    cli: Cli, slurm_conf: str, tmp_path: Path
) -> None:
    with anyio.fail_after(60):
        async with provider_for(
            cli, slurm_conf, tmp_path / "run", SlurmOptions(partition="no-such-partition"),
            max_failures=2, window=3, backoff=0.0,
        ) as (provider, _):  # fmt: skip
            with pytest.raises(BatchSystemError) as first:
                await provider.start_block(BlockSpec())
            assert first.value.command == "sbatch --parsable"
            assert first.value.exit_code == 1
            assert "invalid partition" in first.value.stderr.lower()
            assert provider.error is first.value
            with pytest.raises(BatchSystemError):
                await provider.start_block(BlockSpec())
            with pytest.raises(SubmissionsSuspended, match="2 of its last 3"):
                await provider.start_block(BlockSpec())
            assert provider.status()["suspended"] is True

            provider.options = SlurmOptions(partition="ckpt")  # the operator fixes it
            with pytest.raises(SubmissionsSuspended):
                await provider.start_block(BlockSpec())  # still stopped
            provider.resume()
            await running_block(provider)
            assert provider.status()["suspended"] is False


async def test_slurmctld_down_is_a_clear_error_and_the_provider_recovers(
    cli: Cli, slurm_conf: str, slurm: Callable[..., str], tmp_path: Path
) -> None:
    cluster_dir = Path(slurm_conf).parent
    script = ROOT / ".ci" / "slurm"
    if not (cluster_dir / "slurmctld.pid").exists():
        not_here(f"{slurm_conf} was not started by .ci/slurm: cannot stop its slurmctld.")

    def ctld(action: str) -> None:
        subprocess.run([str(script), action, str(cluster_dir)], check=True, timeout=60)

    with anyio.fail_after(110):
        async with provider_for(
            cli, slurm_conf, tmp_path / "run", SlurmOptions(partition="ckpt"), backoff=5.0
        ) as (provider, address):
            block = await running_block(provider)
            try:
                ctld("ctld-stop")
                # The refresher's squeue fails (after the client's own retries, ~18 s).
                await wait_until(lambda: provider.error is not None, step=0.1)
                err = provider.error
                assert isinstance(err, BatchSystemError)
                assert err.command in ("squeue", "scontrol") and err.exit_code == 1
                assert "Unable to contact slurm controller" in err.stderr
                assert "scontrol ping" in str(err)  # what to do
                assert block.state is BlockState.RUNNING  # the last state seen is kept
                with pytest.raises(BatchSystemError, match="sbatch") as caught:
                    await provider.start_block(BlockSpec())
                assert "Unable to contact slurm controller" in caught.value.stderr
                assert provider.status()["error"] is not None
            finally:
                ctld("ctld-start")
            await wait_until(lambda: provider.error is None, step=0.1)
            assert provider.poll(block) is BlockState.RUNNING  # the job lived on
            # Slurm answers again, but the provider backs off after the failed sbatch.
            with pytest.raises(BatchSystemError, match="backing off"):
                await provider.start_block(BlockSpec())
            await wait_until(lambda: anyio.current_time() >= provider.failures.retry_at, step=0.05)
            await running_block(provider)
            async with Cluster(address) as cluster:
                await wait_worker(cluster, "slurm-1")
                await wait_worker(cluster, "slurm-3")  # block-2 was never submitted
                futures = [cluster.submit(operator.add, i, 1) for i in range(6)]
                assert await cluster.gather(futures) == [i + 1 for i in range(6)]
