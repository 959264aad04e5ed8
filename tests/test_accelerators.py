"""Each worker pinned to one accelerator, as Parsl's ``available_accelerators``: a
pool's ``accelerators`` key (checked when the pool is read), the variables a Slurm
block's script sets for each worker of a node, the devices a local pool's provider
hands out and takes back, and the worker's ``--accelerator`` for a worker started by
hand. No GPU is needed: what is tested is what each worker process sees in its
environment (``CUDA_VISIBLE_DEVICES`` and the like), and what the status shows of it.
Ports: 60100-60999 and 55000-55199 of 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.pools import pools_from_dicts
from actors.processes import LocalProcessProvider
from actors.providers import ACCELERATOR_VARIABLES, BlockSpec, BlockState
from actors.slurm import TOO_FEW_GPUS, SlurmProvider
from runtime import Cluster
from runtime.cli_processes import Cli
from runtime.errors import PoolConfigError
from runtime.preflight import FAIL, PASS, WARN, check_gpus
from tests.helpers import ROOT, free_port_between, wait_until

LIMIT = 60


def pinned_to() -> tuple[str, dict[str, str]]:
    """A task: the worker it ran on and the accelerator variables it saw."""
    return os.environ.get("CORRAL_WORKER_ID", ""), {
        k: os.environ.get(k, "") for k in ACCELERATOR_VARIABLES
    }


# ----------------------------------------------------------------------------- the key


def test_a_number_is_that_many_devices_from_0_and_a_list_is_taken_as_written() -> None:
    pools = pools_from_dicts({
        "gpu": {"accelerators": 4, "workers_per_node": 4},
        "mig": {"provider": "slurm", "accelerators": ["MIG-a", "MIG-b"], "workers_per_node": 2},
        "cpu": {},
    })  # fmt: skip
    assert pools["gpu"].accelerators == ("0", "1", "2", "3")
    assert pools["mig"].accelerators == ("MIG-a", "MIG-b")
    assert pools["mig"].slurm_options().accelerators == ("MIG-a", "MIG-b")
    assert pools["cpu"].accelerators == ()


@pytest.mark.parametrize(
    ("pool", "says"),
    [
        ({"accelerators": 0}, 'or a whole number N >= 1 for "0" to "N-1", got 0'),
        ({"accelerators": [0, 1]}, "did you mean accelerators = ['0', '1'] (strings)?"),
        ({"accelerators": []}, "got []"),
        ({"accelerators": ["0", ""]}, "'' is not one device id"),
        ({"accelerators": ["0,1"]}, "'0,1' is not one device id (each worker gets exactly one"),
        ({"accelerators": ["0", "1", "0"]}, "names '0' twice: each device goes to one worker"),
        # a Slurm node's workers: one device each
        (
            {"provider": "slurm", "workers_per_node": 4, "accelerators": ["0", "1"]},
            "has 2 (0, 1) but workers_per_node = 4 workers run on each node, each pinned to "
            "one of its own: list 4 device ids, or run at most 2 workers there",
        ),
        # a local pool's workers at max_blocks: one device each
        (
            {"max_blocks": 3, "workers_per_node": 2, "accelerators": 4},
            "has 4 (0, 1, 2, 3) but max_blocks (3) x workers_per_node (2) = 6 workers may run "
            "at once on this machine",
        ),
    ],
)
def test_a_bad_accelerators_key_is_refused_saying_what_to_write(
    pool: dict[str, Any], says: str
) -> None:
    with pytest.raises(PoolConfigError, match="accelerators") as info:
        pools_from_dicts({"gpu": pool})
    assert says in str(info.value), info.value
    assert info.value.key == "accelerators"


def test_two_local_pools_may_not_list_one_device() -> None:
    with pytest.raises(PoolConfigError, match="which local pool 'a' lists too") as info:
        pools_from_dicts({"a": {"accelerators": 2}, "b": {"accelerators": ["1", "2"]}})
    assert info.value.pool == "b"
    # Slurm pools' devices are their nodes': they may be named alike
    pools_from_dicts({"a": {"accelerators": 2}, "s": {"provider": "slurm", "accelerators": 2}})


def test_in_process_workers_take_no_accelerators() -> None:
    with pytest.raises(PoolConfigError, match="processes=True"):
        Cluster(pools={"gpu": {"accelerators": 1}})


# ----------------------------------------------------------------------------- Slurm


#: a worker stand-in: prints its id and its accelerator variables, one write a line (the
#: workers of a node print at once)
SHOW = (
    "import os; os.write(1, ' '.join([os.environ['CORRAL_WORKER_ID'], "
    f"*(os.environ[k] for k in {ACCELERATOR_VARIABLES!r})]).encode() + b'\\n')"
)


def run_block_script(
    tmp_path: Path, pool: dict[str, Any], node: int = 0, **slurm_env: str
) -> subprocess.CompletedProcess[str]:
    """Pool ``pool``'s block script, run by bash on this machine as Slurm's node ``node``
    would run it (``--node`` past the batch shell's srun), in an environment without the
    accelerator variables but ``slurm_env``: what Slurm sets in a job (its GPUs)."""
    config = pools_from_dicts({"gpu": {"provider": "slurm", **pool}})["gpu"]
    argv = [sys.executable, "-c", SHOW]
    provider = SlurmProvider(lambda b, i: argv, config.slurm_options(), run_dir=tmp_path)
    _, script = provider.block_script(1, config.block_spec())
    path = tmp_path / "block-1.sh"
    path.write_text(script)
    env = {k: v for k, v in os.environ.items() if k not in ACCELERATOR_VARIABLES}
    env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    env.update(SLURM_NODEID=str(node), **slurm_env)
    return subprocess.run(
        ["bash", str(path), "--node"], capture_output=True, text=True, timeout=LIMIT, env=env
    )


def started(done: subprocess.CompletedProcess[str]) -> list[str]:
    """What each worker the script started saw, sorted: ``wid device device device``."""
    assert done.returncode == 0, done.stderr
    return sorted(done.stdout.split("\n")[:-1])


def test_each_worker_of_a_slurm_node_is_pinned_to_its_own_device(tmp_path: Path) -> None:
    """Two nodes of three workers: on each node, worker i has device i."""
    pool = {"nodes_per_block": 2, "workers_per_node": 3, "accelerators": ["0", "1", "2", "3"]}
    for node in (0, 1):
        assert started(run_block_script(tmp_path, pool, node)) == [
            f"slurm-1.{3 * node + i} {i} {i} {i}" for i in range(3)
        ]
    # without the key, no worker is pinned
    plain = pools_from_dicts({"cpu": {"provider": "slurm", "workers_per_node": 2}})["cpu"]
    _, text = SlurmProvider(
        lambda b, i: ["w"], plain.slurm_options(), run_dir=tmp_path
    ).block_script(1, plain.block_spec())
    assert "CUDA_VISIBLE_DEVICES" not in text


def test_the_slurm_script_run_by_bash_starts_each_worker_with_its_device(tmp_path: Path) -> None:
    """The generated script itself, run by bash on this machine as Slurm's node 0 would
    run it: each worker (here a program printing its variables) sees its own device."""
    pool = {"workers_per_node": 2, "accelerators": ["GPU-a", "GPU-b"]}
    assert started(run_block_script(tmp_path, pool)) == [
        "slurm-1.0 GPU-a GPU-a GPU-a",
        "slurm-1.1 GPU-b GPU-b GPU-b",
    ]


@pytest.mark.parametrize(
    ("job_gpus", "pinned"),
    [
        # Slurm does not confine the job to its GPUs: they are the node's GPUs 2 and 3,
        # taken by no other job, not 0 and 1 (a user audit: two blocks on a node both
        # pinned their workers to GPUs 0 and 1)
        ("2,3", ["2", "3"]),
        # ConstrainDevices=yes: the job's GPUs are numbered from 0
        ("0,1", ["0", "1"]),
        # more than the workers: the first ones
        ("1,4,6", ["1", "4"]),
    ],
)
def test_a_slurm_workers_numeric_device_is_the_jobs_gpu_of_that_number(
    tmp_path: Path, job_gpus: str, pinned: list[str]
) -> None:
    pool = {"workers_per_node": 2, "accelerators": 2}
    done = run_block_script(tmp_path, pool, SLURM_JOB_GPUS=job_gpus, CUDA_VISIBLE_DEVICES=job_gpus)
    assert started(done) == [f"slurm-1.{i} {d} {d} {d}" for i, d in enumerate(pinned)]
    said = f"corral: Slurm gave this job the GPUs {job_gpus} here; workers pinned to "
    assert said + " ".join(pinned) in done.stderr
    # a step's (srun, a block of several nodes) are SLURM_STEP_GPUS; AMD's: ROCR_...
    done = run_block_script(tmp_path, pool, SLURM_STEP_GPUS=job_gpus, ROCR_VISIBLE_DEVICES=job_gpus)
    assert started(done) == [f"slurm-1.{i} {d} {d} {d}" for i, d in enumerate(pinned)]


def test_device_uuids_and_a_job_without_slurms_gpus_take_the_ids_as_written(
    tmp_path: Path,
) -> None:
    uuids = {"workers_per_node": 2, "accelerators": ["MIG-a", "MIG-b"]}
    done = run_block_script(tmp_path, uuids, SLURM_JOB_GPUS="0", CUDA_VISIBLE_DEVICES="0")
    assert started(done) == ["slurm-1.0 MIG-a MIG-a MIG-a", "slurm-1.1 MIG-b MIG-b MIG-b"]
    # a CUDA_VISIBLE_DEVICES not of Slurm's (no SLURM_JOB_GPUS): not the job's GPUs
    done = run_block_script(
        tmp_path, {"workers_per_node": 2, "accelerators": 2}, CUDA_VISIBLE_DEVICES="5,6"
    )
    assert started(done) == ["slurm-1.0 0 0 0", "slurm-1.1 1 1 1"]


def test_a_slurm_job_given_too_few_gpus_starts_no_worker_and_says_what_to_ask(
    tmp_path: Path,
) -> None:
    pool = {"workers_per_node": 3, "accelerators": 3}
    done = run_block_script(tmp_path, pool, SLURM_JOB_GPUS="2,3", CUDA_VISIBLE_DEVICES="2,3")
    assert done.returncode == 1
    assert done.stdout == ""  # no worker started
    assert (
        f"{TOO_FEW_GPUS}: worker 2 of this node is pinned to the job's GPU 2 (its "
        "accelerators, counted from 0), but Slurm gave this job 2 GPU(s) here "
        "(CUDA_VISIBLE_DEVICES=2,3): ask for 3 GPUs a node (#SBATCH --gres=gpu:3 in the pool's "
        "scheduler_options) or run fewer workers per node; no worker started"
    ) in done.stderr


# ----------------------------------------------------------------------------- local


def _child(gate: Path) -> list[str]:
    """A worker stand-in: prints its CUDA_VISIBLE_DEVICES, then waits for ``gate``."""
    code = (
        "import os, sys, time\n"
        "print(os.environ.get('CUDA_VISIBLE_DEVICES', '-'), flush=True)\n"
        "for _ in range(600):\n"
        "    if os.path.exists(sys.argv[1]): break\n"
        "    time.sleep(0.05)\n"
    )
    return [sys.executable, "-c", code, str(gate)]


@pytest.mark.anyio
async def test_a_local_provider_gives_each_process_a_free_device_and_takes_it_back(
    tmp_path: Path,
) -> None:
    """Two devices: a block of two takes both; a block started meanwhile waits, pending,
    and starts on a device the first block's exit frees (before: it failed at once,
    and a pool's replacement of a drained block, each next one too, until the pool gave
    up); one stopped while it waits starts nothing; the next takes a device again."""
    gate, logs = tmp_path / "gate", tmp_path / "logs"

    def printed(wid: str) -> str:
        path = logs / f"{wid}.stdout"
        return path.read_text().strip() if path.exists() else ""

    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(
            lambda b, i: _child(gate), log_dir=logs, accelerators=["0", "1"], grace=1
        ) as provider:
            first = await provider.start_block(BlockSpec(2))
            await wait_until(lambda: printed("worker-1.0") and printed("worker-1.1"),
                             "the first block's processes", limit=LIMIT)  # fmt: skip
            assert {printed("worker-1.0"), printed("worker-1.1")} == {"0", "1"}
            late = await provider.start_block(BlockSpec(1))
            stopped = await provider.start_block(BlockSpec(2))
            assert late.state is stopped.state is BlockState.PENDING
            await provider.stop_block(stopped)
            assert provider.pids(stopped) == {}  # nothing started
            assert not printed("worker-2")
            gate.touch()
            assert await provider.wait_ended(first) is BlockState.COMPLETED
            assert await provider.wait_ended(late) is BlockState.COMPLETED
            assert printed("worker-2") in ("0", "1")
            again = await provider.start_block(BlockSpec(1))
            assert await provider.wait_ended(again) is BlockState.COMPLETED
            assert printed("worker-4") == "0"


@pytest.mark.anyio
async def test_two_blocks_that_wait_for_devices_never_share_them_out_short(
    tmp_path: Path,
) -> None:
    """Three devices, two blocks of two that start together (after a provision delay):
    the first takes two, the second waits for the first's exits. The first's devices
    were taken one spawn at a time, so the second, looking while the first spawned its
    first worker, saw two free, started, and one of them failed 'no free accelerator'."""
    gate, logs = tmp_path / "gate", tmp_path / "logs"
    with anyio.fail_after(LIMIT):
        async with LocalProcessProvider(
            lambda b, i: _child(gate), log_dir=logs, accelerators=["0", "1", "2"], grace=1,
            provision_delay=0.2,
        ) as provider:  # fmt: skip
            blocks = [await provider.start_block(BlockSpec(2)) for _ in range(2)]
            await wait_until(lambda: any(b.state is BlockState.RUNNING for b in blocks),
                             "a block to start", limit=LIMIT)  # fmt: skip
            gate.touch()  # the first one's workers end: the other starts on their devices
            ended = [await provider.wait_ended(b) for b in blocks]
            assert ended == [BlockState.COMPLETED] * 2, blocks


@pytest.mark.anyio
async def test_a_local_pools_two_workers_run_tasks_on_two_devices() -> None:
    """``Cluster(pools=..., processes=True)`` (a manager's local pool too): a pool of two
    blocks of one worker with ``accelerators = 2``; a task on each worker sees its
    worker's device, 0 on one and 1 on the other."""
    pools = {"gpu": {
        "min_blocks": 2, "max_blocks": 2, "init_blocks": 2, "accelerators": 2,
        "worker_port_range": "60900-60949",
    }}  # fmt: skip
    port = free_port_between(60100, 60199)
    with anyio.fail_after(LIMIT):
        async with Cluster(
            pools=pools, processes=True, port=port, policies={"placement": "round-robin"}
        ) as cluster:
            await cluster.wait_for_workers(2)
            futures = [cluster.submit(pinned_to, pure=False) for _ in range(2)]
            seen = [await f.result() for f in futures]
    assert {wid for wid, _ in seen} == {"gpu-1", "gpu-2"}, seen
    assert {env["CUDA_VISIBLE_DEVICES"] for _, env in seen} == {"0", "1"}, seen
    for _, env in seen:  # each variable names the worker's one device
        assert len(set(env.values())) == 1, env


# ----------------------------------------------------------------------------- by hand


@pytest.mark.anyio
async def test_a_worker_started_by_hand_with_accelerator_runs_its_tasks_pinned(
    tmp_path: Path,
) -> None:
    port = free_port_between(60200, 60299)
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager(port=port)
        cli.env.pop("CUDA_VISIBLE_DEVICES", None)
        worker = cli.start(
            "worker", address, "--accelerator", "MIG-7", "--name", "by-hand",
            "--port-range", "60950-60999",
        )  # fmt: skip
        assert "worker accelerator MIG-7 (CUDA_VISIBLE_DEVICES)" in cli.line_with(
            worker, "worker accelerator"
        )
        cli.line_with(worker, "joined")
        async with Cluster(address) as c:
            await c.wait_for_workers(1)
            _, env = await c.submit(pinned_to, pure=False).result()
    assert env == dict.fromkeys(ACCELERATOR_VARIABLES, "MIG-7"), env


@pytest.mark.anyio
async def test_the_status_shows_a_workers_accelerator_and_execution(tmp_path: Path) -> None:
    """``WorkerInfo.accelerator`` (the device its environment pins it to at start) and
    ``WorkerInfo.execution``, as ``status()["workers"]`` shows them: a worker started
    with ``--accelerator MIG-7 --execution process``, and one with neither."""
    port = free_port_between(55000, 55099)
    with Cli(tmp_path / "home") as cli, anyio.fail_after(LIMIT):
        _, address = cli.manager(port=port)
        for k in ACCELERATOR_VARIABLES:
            cli.env.pop(k, None)
        pinned = cli.start(
            "worker", address, "--accelerator", "MIG-7", "--execution", "process",
            "--name", "pinned", "--port-range", "55100-55149",
        )  # fmt: skip
        plain = cli.start("worker", address, "--name", "plain", "--port-range", "55150-55199")
        cli.line_with(pinned, "joined")
        cli.line_with(plain, "joined")
        async with Cluster(address) as c:
            await c.wait_for_workers(2)
            workers = {w.worker_id: w for w in (await c.status())["workers"]}
    assert (workers["pinned"].accelerator, workers["pinned"].execution) == ("MIG-7", "process")
    assert (workers["plain"].accelerator, workers["plain"].execution) == ("", "thread")


@pytest.mark.parametrize("device", ["", " 0"])
def test_a_blank_accelerator_flag_is_refused(device: str) -> None:
    """Before it reaches for a manager (none listens there)."""
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "worker", "ws://127.0.0.1:60999",
         "--accelerator", device],
        capture_output=True, text=True, timeout=LIMIT, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 1
    says = (
        f"--accelerator must name one device, e.g. --accelerator 0 (or a MIG UUID), got {device!r}"
    )
    assert says in done.stderr, done.stderr


def test_the_gpu_pool_of_deployment_md_pins_its_four_workers(tmp_path: Path) -> None:
    """docs/deployment.md#gpus: its pool reads as written, asks Slurm for the GPUs
    (``--gres``) and gives worker i of its node the job's GPU i."""
    import tomllib

    text = (ROOT / "docs" / "deployment.md").read_text().split("\n### GPUs\n", 1)[1]
    raw = tomllib.loads(text.split("```toml\n")[1].split("```")[0])["pools"]["gpu"]
    gpu = pools_from_dicts({"gpu": raw})["gpu"]
    _, script = SlurmProvider(
        lambda b, i: ["worker"], gpu.slurm_options(), run_dir=tmp_path
    ).block_script(1, gpu.block_spec())
    assert "\n#SBATCH --gres=gpu:4\n" in script
    # what its workers see in a job Slurm gave the node's GPUs 4 to 7
    done = run_block_script(tmp_path, raw, SLURM_JOB_GPUS="4-7", CUDA_VISIBLE_DEVICES="4,5,6,7")
    assert started(done) == [f"slurm-1.{i} {i + 4} {i + 4} {i + 4}" for i in range(4)]


# ----------------------------------------------------------------------------- check


@pytest.mark.parametrize(
    ("options", "status", "says"),
    [
        ("#SBATCH --gres=gpu:4", PASS, "4 worker(s) a node, each pinned to one of the 4 GPU(s)"),
        ("#SBATCH --gpus-per-node=a100:4", PASS, "one of the 4 GPU(s) a node its job asks for"),
        (
            "#SBATCH --gres=gpu:2",
            FAIL,
            "ask Slurm for 2 GPU(s) a node, but its workers_per_node = 4 workers there are "
            "each pinned to one of the job's GPUs (0, 1, 2, 3: 4 needed): every block would "
            "end before its workers start (corral: too few GPUs)",
        ),
        ("", WARN, "ask Slurm for no GPU (no --gres=gpu or --gpus line)"),
        ("#SBATCH --constraint=a100", WARN, "ask Slurm for no GPU"),
    ],
)
def test_check_says_whether_a_slurm_gpu_pool_asks_for_the_gpus_its_workers_take(
    options: str, status: str, says: str
) -> None:
    pool = {"provider": "slurm", "workers_per_node": 4, "accelerators": 4}
    (row,) = check_gpus(pools_from_dicts({"gpu": {**pool, "scheduler_options": options}}))
    assert (row.pool, row.check, row.status) == ("gpu", "gpus", status)
    assert says in row.detail, row.detail
    if status != PASS:
        assert "#SBATCH --gres=gpu:4" in row.advice, row.advice
    # pools without accelerators, or local ones, are not checked
    assert (
        check_gpus(pools_from_dicts({"cpu": {"provider": "slurm"}, "l": {"accelerators": 1}})) == []
    )
