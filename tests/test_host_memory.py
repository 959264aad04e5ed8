"""Workers sharing a machine (docs/memory.md#workers-sharing-a-machine): the scheduler
core warns when the memory limits of one machine's workers add up to more than it has
(``actors/host_memory.py``), once per change of the set, and clears the warning when it
no longer holds; the manager logs it and its status shows it; and the local and Slurm
pools give each of a machine's workers its share by default.

A user audit: two ``python -m runtime worker ... --pool manual --cores 1`` started by
hand on one 23.5 GiB machine without ``--memory`` each claimed all of it (``limit``
25276203008), so the pool showed 47 GiB and no fence could act before the machine ran
out; nothing warned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import psutil
import pytest

from actors.host_memory import MOST_WAIT, SETTLE, cores_overcommit_text, overcommit_text
from actors.pools import pools_from_dicts
from actors.scheduler_events import (
    HostOvercommitCleared,
    HostOvercommitted,
    Tick,
    WorkerJoined,
    WorkerLeft,
)
from actors.scheduler_state import SchedulerState
from actors.worker import host_cpus
from runtime import Cluster
from runtime.client import _cores_advice
from runtime.errors import size_text
from runtime.messages import WorkerInfo
from runtime.node import pool_worker_argv
from tests.helpers import ROOT, Cli, Factory, make_state, run, wait_until

__all__ = ["make_state"]  # the fixture, used by name

MACHINE = 25276203008  #: the audit's machine: 23.5 GiB
HOST = "box/0123456789ab"
LIMIT = 60.0  #: seconds, at most, of each wait in the tests with processes


_PIDS: dict[str, int] = {}  #: a process id of its own for each worker named


def joined(
    worker: str, now: float, *, host: str = HOST, memory: int = MACHINE, pid: int = 0
) -> WorkerJoined:
    process = pid or _PIDS.setdefault(worker, len(_PIDS) + 100)
    return WorkerJoined(
        f"join-{worker}-{now}", now, worker, 1, memory, "manual",
        host=host, host_memory=MACHINE, process=process,
    )  # fmt: skip


def tick(s: SchedulerState, now: float) -> list[object]:
    return [c for c in run(s, Tick(f"tick-{now}", now)) if "Host" in type(c).__name__]


def test_two_workers_claiming_the_whole_machine_are_warned_of_once_and_cleared(
    make_state: Factory,
) -> None:
    s = make_state()
    assert run(s, joined("m1", 0.0)) == [] and run(s, joined("m2", 0.2)) == []
    assert s.hosts.pending
    assert tick(s, 0.2 + SETTLE / 2) == []  # not settled yet: a join storm may go on
    warned = HostOvercommitted(
        f"tick-{0.2 + SETTLE}", HOST, MACHINE, 2 * MACHINE, (("m1", MACHINE), ("m2", MACHINE)), 2
    )
    assert tick(s, 0.2 + SETTLE) == [warned]
    assert not s.hosts.pending
    assert tick(s, 5.0) == []  # said once
    text = overcommit_text(warned)
    for part in ("m1 (23.54 GiB), m2 (23.54 GiB)", "47.08 GiB", "machine's 23.54 GiB",
                 f"--memory {MACHINE // 2 // 2**20}MiB", "Cluster(processes=2)"):  # fmt: skip
        assert part in text, (part, text)

    # m1 joins again under its id (a reconnection), same limit: the set did not change
    assert run(s, joined("m1", 6.0)) == []
    assert tick(s, 6.0 + SETTLE) == []

    # a third worker: the set changed while it holds, said again with the three
    run(s, joined("m3", 8.0, memory=MACHINE // 4))
    assert tick(s, 8.0 + SETTLE) == [
        HostOvercommitted(
            f"tick-{8.0 + SETTLE}", HOST, MACHINE, 2 * MACHINE + MACHINE // 4,
            (("m1", MACHINE), ("m2", MACHINE), ("m3", MACHINE // 4)), 3,
        )
    ]  # fmt: skip

    # m2 leaves: m1 and m3 still claim more than the machine (1.25x): said again
    run(s, WorkerLeft("left-m2", 10.0, "m2", "drained"))
    (again,) = tick(s, 10.0 + SETTLE)
    assert isinstance(again, HostOvercommitted) and again.workers == (
        ("m1", MACHINE),
        ("m3", MACHINE // 4),
    )
    # m3 leaves: m1 alone claims the machine, no more: cleared, naming who is left
    run(s, WorkerLeft("left-m3", 12.0, "m3", "drained"))
    assert tick(s, 12.0 + SETTLE) == [HostOvercommitCleared(f"tick-{12.0 + SETTLE}", HOST, ("m1",))]
    assert tick(s, 20.0) == []


def test_a_join_storm_gives_one_warning(make_state: Factory) -> None:
    """Ten workers joining a tenth of a second apart, ticked in between: one warning,
    once they stopped joining; a storm that never stops is looked at after MOST_WAIT."""
    s = make_state()
    out: list[object] = []
    for i in range(10):
        run(s, joined(f"w{i}", i * 0.1))
        out += tick(s, i * 0.1 + 0.05)
    assert out == []
    (warned,) = tick(s, 1.0 + SETTLE)
    assert isinstance(warned, HostOvercommitted) and len(warned.workers) == 10
    assert warned.processes == 10 and warned.claimed == 10 * MACHINE

    t = 100.0
    run(s, joined("w10", t))
    seen: list[object] = []
    while t < 100.0 + MOST_WAIT:  # one joins (and leaves) every half second, for ever
        t += SETTLE / 2
        run(s, joined(f"x{t}", t))
        run(s, WorkerLeft(f"left-{t}", t, f"x{t}", "drained"))
        seen += tick(s, t)
    assert len(seen) == 1 and isinstance(seen[0], HostOvercommitted)


def test_what_does_not_count(make_state: Factory) -> None:
    """Workers in one process (``Cluster(workers=N)``) share its RSS: they count once.
    Other machines are apart. A worker that does not say its host (an older one) is
    not counted. Workers whose limits fit say nothing."""
    s = make_state()
    run(s, joined("a", 0.0, pid=7), joined("b", 0.0, pid=7))  # one process
    run(s, joined("c", 0.0, host="other/1"))
    run(s, WorkerJoined("old", 0.0, "old", 1, MACHINE, "manual"))  # no host told
    run(s, joined("d", 0.0, host="half/2", memory=MACHINE // 2))
    run(s, joined("e", 0.0, host="half/2", memory=MACHINE // 2))
    assert tick(s, SETTLE) == []
    assert s.hosts.claimed(HOST) == (MACHINE, 1)
    assert not s.hosts.pending


def test_workers_declaring_more_cores_than_their_host_has_cpus_are_warned_of(
    make_state: Factory,
) -> None:
    """A user audit (monitor, 7): three workers declared 4 cores on a 2-CPU machine and
    nothing warned, though the dashboard's capacity counts them as CPUs. Now the cores of
    one machine's workers are added up (each worker: threads of one process run tasks side
    by side) against the CPUs it lets them use, warned of once and cleared like memory;
    their memory limits fit, so only the cores are said."""
    s = make_state()

    def on(worker: str, now: float, cores: int, cpus: int = 2, pid: int = 7) -> WorkerJoined:
        return WorkerJoined(
            f"join-{worker}-{now}", now, worker, cores, MACHINE // 4, "cpu",
            host=HOST, host_memory=MACHINE, process=pid, host_cpus=cpus,
        )  # fmt: skip

    run(s, on("w-cpu1", 0.0, 2), on("w-cpu2", 0.0, 1), on("w-big", 0.1, 1, pid=8))
    assert s.host_cores.pending
    warned = HostOvercommitted(
        f"tick-{0.1 + SETTLE}", HOST, 2, 4, (("w-big", 1), ("w-cpu1", 2), ("w-cpu2", 1)), 3,
        "cores",
    )  # fmt: skip
    assert tick(s, 0.1 + SETTLE) == [warned]
    assert tick(s, 5.0) == []  # said once
    text = cores_overcommit_text(warned)
    for part in ("w-big (1), w-cpu1 (2), w-cpu2 (1) add up to 4", "the 2 CPUs",
                 "only a warning", "--cores that add up to 2 or fewer"):  # fmt: skip
        assert part in text, (part, text)

    run(s, WorkerLeft("left-big", 6.0, "w-big", "drained"))  # 3 > 2: said again
    assert tick(s, 6.0 + SETTLE) == [
        HostOvercommitted(
            f"tick-{6.0 + SETTLE}", HOST, 2, 3, (("w-cpu1", 2), ("w-cpu2", 1)), 2, "cores"
        )
    ]
    run(s, WorkerLeft("left-cpu2", 8.0, "w-cpu2", "drained"))  # 2 CPUs for 2 cores
    assert tick(s, 8.0 + SETTLE) == [
        HostOvercommitCleared(f"tick-{8.0 + SETTLE}", HOST, ("w-cpu1",), "cores")
    ]
    assert tick(s, 20.0) == []


def test_two_hand_started_workers_without_memory_are_warned_of(tmp_path: Path) -> None:
    """The audit, with real processes over 127.0.0.1: a manager and two workers started
    by hand without --memory (each takes the whole machine). The manager logs the
    warning (the test waits for that line, bounded), and the console's status shows
    it; when one worker stops, the warning is cleared."""
    with Cli(tmp_path) as cli:
        manager, address = cli.manager("--no-monitoring")
        flags = ("--pool", "manual", "--cores", "1")
        m1 = cli.worker(address, "--name", "m1", *flags)
        cli.worker(address, "--name", "m2", *flags)
        line = cli.line_with(manager, "workers claim more memory than their host has", LIMIT)
        assert "warning" in line and "m1" in line and "m2" in line, line
        total = psutil.virtual_memory().total
        assert f"claimed={2 * total}" in line and f"host_memory={total}" in line, line

        status = cli.start("console", address, "status", "--json")
        st = json.loads("".join(cli.rest(status, LIMIT)))
        assert status.wait(LIMIT) == 0
        assert {w["worker_id"]: w["memory"] for w in st["workers"]} == {"m1": total, "m2": total}
        (host,) = {w["host"] for w in st["workers"]}
        assert host and all(w["host_memory"] == total for w in st["workers"])
        # (Without --disk, both count all of one file system too: warned of as well.)
        (warning,) = [w for w in st["warnings"] if "memory limits" in w]
        assert f"host {host}:" in warning and "m1" in warning and "--memory" in warning

        text = cli.start("console", address, "status")
        assert any("warning: host" in ln for ln in cli.rest(text, LIMIT))

        cli.stop([m1])
        line = cli.line_with(manager, "no longer claim more memory than their host has", LIMIT)
        assert "m2" in line


def test_hand_started_workers_with_more_cores_than_cpus_are_warned_of(tmp_path: Path) -> None:
    """The cores audit with real processes over 127.0.0.1: two workers, each declaring
    all the CPUs this process may use, their memory limits small. The manager logs the
    cores warning (bounded wait for the line), the console's status lists it, and it
    clears when one stops."""
    cpus = host_cpus()
    with Cli(tmp_path) as cli:
        manager, address = cli.manager("--no-monitoring")
        flags = ("--pool", "manual", "--cores", str(cpus), "--memory", "200MiB")
        c1 = cli.worker(address, "--name", "c1", *flags)
        cli.worker(address, "--name", "c2", *flags)
        line = cli.line_with(manager, "workers declare more cores than their host has CPUs", LIMIT)
        assert "warning" in line and f"claimed={2 * cpus}" in line and f"cpus={cpus}" in line
        status = cli.start("console", address, "status", "--json")
        st = json.loads("".join(cli.rest(status, LIMIT)))
        assert status.wait(LIMIT) == 0
        assert {w["host_cpus"] for w in st["workers"]} == {cpus}
        (warning,) = [w for w in st["warnings"] if "cores of its workers" in w]
        assert f"c1 ({cpus}), c2 ({cpus}) add up to {2 * cpus}" in warning, warning
        cli.stop([c1])
        line = cli.line_with(manager, "no longer declare more cores than their host has", LIMIT)
        assert "c2" in line


def test_local_pool_workers_share_the_machine_by_default() -> None:
    """A local pool without memory_per_worker: each of its workers takes its share of
    the machine (the machine's memory over the local pools' workers), not all of it;
    a Slurm pool's worker its node's over workers_per_node; a pool that sets
    memory_per_worker keeps it."""
    pools = pools_from_dicts(
        {
            "a": {"max_blocks": 2, "workers_per_node": 2},
            "b": {"max_blocks": 1, "memory_per_worker": "1GiB"},
            "s": {"provider": "slurm", "workers_per_node": 4, "nodes_per_block": 2},
        }
    )
    argv = pool_worker_argv(pools["a"], None, 5, "ws://127.0.0.1:1", "block-1", 0)
    assert argv[argv.index("--memory-share") + 1] == "5"
    assert "--memory-share" not in pool_worker_argv(pools["b"], None, 5, "ws://h:1", "b", 0)
    # A local worker takes that share of its spill directory's file system too (and
    # counts as sharing it: no --disk); a Slurm worker measures its node's.
    assert argv[argv.index("--disk-share") + 1] == "5" and "--disk" not in argv
    slurm = pool_worker_argv(pools["s"], None, 4, "ws://h:1", "s-1", 0)
    assert "--disk-share" not in slurm and "--disk" not in slurm
    given = pools_from_dicts({"g": {"max_blocks": 2, "disk_per_worker": "1GiB"}})["g"]
    argv = pool_worker_argv(given, None, 5, "ws://h:1", "g-1", 0)
    assert argv[argv.index("--disk") + 1] == str(2**30) and "--disk-share" not in argv


@pytest.mark.anyio
async def test_a_cluster_of_local_pool_processes_divides_the_machine() -> None:
    """``Cluster(pools=..., processes=True)`` (what a manager's ``--config`` local pool
    runs too): two worker processes of a pool without memory_per_worker each offer
    half the machine, and nothing is warned of."""
    import anyio

    total = psutil.virtual_memory().total
    with anyio.fail_after(LIMIT):
        pools = {"p": {"min_blocks": 2, "max_blocks": 2, "init_blocks": 2}}
        async with Cluster(pools=pools, processes=True) as cluster:
            await cluster.wait_for_workers(2)
            st = await cluster.status()
    assert [w.memory for w in st["workers"]] == [total // 2, total // 2]
    assert [w for w in st["warnings"] if "memory limits" in w] == []


def test_memory_and_disk_shares_are_checked() -> None:
    for flag in ("--memory-share", "--disk-share"):
        done = subprocess.run(
            [sys.executable, "-m", "runtime", "worker", "ws://127.0.0.1:9", flag, "0"],
            capture_output=True, text=True, timeout=60, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
        assert done.returncode != 0
        assert f"{flag} must be a whole number >= 1" in done.stderr + done.stdout


@pytest.mark.parametrize("n", [2, 3, 8, 11, 1000])
def test_a_memory_share_under_the_least_says_which_fraction_in_words_right_for_any_n(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--memory-share 1000`` said "an 1000th" (a user audit found it), and 2 or 3
    would have said "an 2th", "an 3th": the fraction is written 1/N."""
    import actors.worker
    from runtime.__main__ import _memory_share
    from runtime.errors import MemoryConfigError

    total = 24105 * 2**20 if n == 1000 else 100 * 2**20  # each share under 64 MiB
    monkeypatch.setattr(actors.worker, "host_identity", lambda: ("h", total))
    for name in ("SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(MemoryConfigError) as info:
        _memory_share(n)
    share = total // n // 2**20
    machine = f"the machine's memory ({size_text(total)})"  # or less: its cgroup's, Slurm's
    assert f"--memory-share {n}: 1/{n} of {machine} is {share} MiB," in str(info.value), info.value


def test_an_embedded_clusters_cores_warning_asks_for_its_own_keywords() -> None:
    """Audit memory F6: ``Cluster(processes=3)`` on a 2-CPU host was told to "give the
    workers --cores", a flag its user never passed: its workers' cores are its
    ``processes`` (or ``workers``) times ``threads_per_worker``."""
    warned = HostOvercommitted("t", HOST, 2, 3, (("worker-1", 1), ("worker-2", 1),
                                                 ("worker-3", 1)), 3, "cores")  # fmt: skip
    start = (
        f"host {HOST}: the cores of its workers worker-1 (1), worker-2 (1), worker-3 (1) add "
        "up to 3, more than the 2 CPUs it lets them use; their tasks share those CPUs and run "
        "slower than the dashboard's capacity says. If that is meant (tasks that mostly wait "
        "on I/O), this is only a warning; else "
    )
    for processes, count in ((True, "processes"), (False, "workers")):
        assert cores_overcommit_text(warned, _cores_advice(processes)) == start + (
            f"start the Cluster with {count} times threads_per_worker (each worker's cores) "
            "adding up to 2 or fewer"
        )
    assert cores_overcommit_text(warned) == start + (
        "give the workers --cores that add up to 2 or fewer"
    )


@pytest.mark.anyio
@pytest.mark.slow
async def test_a_cluster_of_worker_processes_on_too_few_cpus_names_its_keywords() -> None:
    """The same with real worker processes: this process (and so its workers) may use
    one CPU, and ``Cluster(processes=2)`` starts two workers of one core each. The
    warning the manager keeps for the status asks for the Cluster's keywords."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})  # the workers inherit it
    try:
        with anyio.fail_after(LIMIT):
            async with Cluster(processes=2, port=52020, memory_per_worker="200MiB") as c:
                warnings = c._scheduler_actor.host_warnings
                text = await wait_until(
                    lambda: next((w for k, w in warnings.items() if k.endswith(" cores")), "")
                )
    finally:
        os.sched_setaffinity(0, before)
    assert text.endswith(
        "else start the Cluster with processes times threads_per_worker (each worker's cores) "
        "adding up to 1 or fewer"
    ), text


# ------------------------------------------------ a worker's default limit (audit slurmscale F2)
#
# A Slurm worker without memory_per_worker (no --mem sent) took the node's whole RAM as
# its limit: nothing read the job's memory (SLURM_MEM_PER_NODE, SLURM_MEM_PER_CPU) nor
# its cgroup's limit, so on a site enforcing DefMemPerCPU through cgroups the job was
# killed OUT_OF_MEMORY (spending the replacement budget) before any fence acted.

GIB = 2**30


def fake_cgroups(
    root: Path, own: str, limits: dict[str, str], *, v2: bool = True, mount: str = ""
) -> Path:
    """A cgroup file system under ``root`` (v2 unified, else v1's memory controller,
    under ``mount`` when given: "unified" for a hybrid system) with ``limits``: cgroup
    path -> the limit file's text; and a ``/proc/self/cgroup`` naming ``own`` as this
    process's cgroup. Returns that file."""
    base = root / mount if v2 else root / "memory"
    base.mkdir(parents=True, exist_ok=True)
    if v2:
        (base / "cgroup.controllers").write_text("cpu memory pids\n")
    for path, text in limits.items():
        where = base.joinpath(*[p for p in path.split("/") if p])
        where.mkdir(parents=True, exist_ok=True)
        (where / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(text + "\n")
    self_cgroup = root / "self-cgroup"
    lines = ["0::" + own] if v2 else ["5:cpu,cpuacct:/x", "4:memory:" + own, "0::/"]
    self_cgroup.write_text("\n".join(lines) + "\n")
    return self_cgroup


JOB = "/system.slice/slurmstepd.scope/job_7"
TASK = JOB + "/step_batch/user/task_0"


@pytest.mark.parametrize("mount", ["", "unified"])
def test_a_workers_default_limit_is_its_cgroups_v2_memory_max(tmp_path: Path, mount: str) -> None:
    """Slurm's task/cgroup under cgroup v2 sets ``memory.max`` on the job (its steps and
    tasks say "max"): the least on the way up from the process's cgroup is its limit,
    and the worker says which file it came from."""
    from actors.host import memory_limit

    own = fake_cgroups(tmp_path, TASK, {TASK: "max", JOB: str(4 * GIB), "/system.slice": "max"},
                       mount=mount)  # fmt: skip
    found = memory_limit(machine=MACHINE, environ={}, cgroup_root=tmp_path, self_cgroup=own)
    assert found.limit == 4 * GIB
    path = tmp_path / mount / JOB.lstrip("/") / "memory.max"
    assert found.source == f"its cgroup's memory limit (4.00 GiB, {path})"
    assert found.text() == f"4.00 GiB: its cgroup's memory limit (4.00 GiB, {path})"
    # Two workers of the job on this node (--memory-share 2): half each.
    halves = memory_limit(2, machine=MACHINE, environ={}, cgroup_root=tmp_path, self_cgroup=own)
    assert halves.limit == 2 * GIB
    assert halves.text().endswith(", over the 2 workers sharing it (--memory-share 2)")


def test_a_workers_default_limit_is_its_cgroups_v1_limit_in_bytes(tmp_path: Path) -> None:
    """cgroup v1: ``memory.limit_in_bytes`` of the memory controller's hierarchy; its
    "no limit" (2**63 less a page) is none, and so is one above the machine's memory (the
    machine's is then the least)."""
    from actors.host import memory_limit

    def limit(limits: dict[str, str]) -> tuple[int, str]:
        own = fake_cgroups(tmp_path, TASK, limits, v2=False)
        found = memory_limit(machine=MACHINE, environ={}, cgroup_root=tmp_path, self_cgroup=own)
        return found.limit, found.source

    file = f"{tmp_path}/memory{JOB}/memory.limit_in_bytes"
    assert limit({TASK: "9223372036854771712", JOB: str(3 * GIB)}) == (
        3 * GIB, f"its cgroup's memory limit (3.00 GiB, {file})"
    )  # fmt: skip
    assert limit({TASK: "9223372036854771712", JOB: "9223372036854771712"}) == (
        MACHINE, "the machine's memory (23.54 GiB)"
    )  # fmt: skip
    assert limit({JOB: str(2 * MACHINE)})[0] == MACHINE


def test_a_container_sees_its_cgroup_at_the_mounts_root(tmp_path: Path) -> None:
    """In a container without a cgroup namespace, /proc/self/cgroup names the host's
    path, which its mount does not hold: the limit is read from what exists of it, the
    mount's root (the container's own cgroup). No cgroup file at all: the machine's."""
    from actors.host import memory_limit

    (tmp_path / "cgroup.controllers").write_text("memory\n")
    (tmp_path / "memory.max").write_text(f"{GIB}\n")
    own = tmp_path / "self-cgroup"
    own.write_text("0::/docker/0123abcd\n")
    found = memory_limit(machine=MACHINE, environ={}, cgroup_root=tmp_path, self_cgroup=own)
    assert (found.limit, found.source) == (GIB, f"its cgroup's memory limit (1.00 GiB, "
                                                f"{tmp_path}/memory.max)")  # fmt: skip
    nothing = memory_limit(machine=MACHINE, environ={}, cgroup_root=tmp_path / "none",
                           self_cgroup=tmp_path / "no-such-file")  # fmt: skip
    assert (nothing.limit, nothing.source) == (MACHINE, "the machine's memory (23.54 GiB)")


def test_a_slurm_workers_default_limit_is_its_jobs_memory_over_its_nodes_workers(
    tmp_path: Path,
) -> None:
    """Inside a Slurm job: ``SLURM_MEM_PER_NODE`` (MiB), else ``SLURM_MEM_PER_CPU`` times
    ``SLURM_CPUS_ON_NODE``, divided among the block's workers on the node (its
    ``--memory-share``, the pool's ``workers_per_node``, as its cores are), when it is
    less than the cgroup's and the machine's; a cgroup holding exactly the job's memory
    is said as the job's."""
    from actors.host import memory_limit

    own = fake_cgroups(tmp_path, TASK, {JOB: str(8 * GIB)})

    def limit(env: dict[str, str], share: int = 1) -> tuple[int, str]:
        found = memory_limit(share, machine=MACHINE, environ=env, cgroup_root=tmp_path,
                             self_cgroup=own)  # fmt: skip
        return found.limit, found.text()

    per_node = {"SLURM_JOB_ID": "7", "SLURM_MEM_PER_NODE": "6000"}
    assert limit(per_node, 2) == (3000 * 2**20, (
        "2.93 GiB: the Slurm job's memory on this node (5.86 GiB, SLURM_MEM_PER_NODE=6000 "
        "MiB), over the 2 workers sharing it (--memory-share 2)"
    ))  # fmt: skip
    per_cpu = {"SLURM_MEM_PER_CPU": "1000", "SLURM_CPUS_ON_NODE": "4"}
    assert limit(per_cpu) == (4000 * 2**20, (
        "3.91 GiB: the Slurm job's memory on this node (3.91 GiB, SLURM_MEM_PER_CPU=1000 MiB "
        "x SLURM_CPUS_ON_NODE=4)"
    ))  # fmt: skip
    assert limit({"SLURM_MEM_PER_NODE": "8192"})[1].startswith(
        "8.00 GiB: the Slurm job's memory on this node"
    )  # the job's cgroup holds what Slurm gave: said as the job's
    assert limit({"SLURM_MEM_PER_NODE": "20000"})[0] == 8 * GIB  # the cgroup's is less
    assert limit({"SLURM_MEM_PER_CPU": "1000"})[0] == 8 * GIB  # no CPU count: not known
    assert limit({"SLURM_MEM_PER_NODE": "0", "SLURM_MEM_PER_CPU": "x"})[0] == 8 * GIB


def test_a_worker_process_without_memory_takes_its_slurm_jobs_share_and_says_so(
    tmp_path: Path,
) -> None:
    """``python -m runtime worker`` in a Slurm block's environment, as its script starts
    it (``--memory 0 --memory-share 2``): it prints the limit it took and where it came
    from, on stdout as its join line (the block's .out). Its manager does not answer
    (nothing listens on the port): it exits 1 after one try."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLURM_JOB_ID": "7",
           "SLURM_MEM_PER_NODE": "2048", "CORRAL_HOME": str(tmp_path)}  # fmt: skip
    env.pop("SLURM_MEM_PER_CPU", None)
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "worker", "ws://127.0.0.1:61999", "--token", "t",
         "--memory", "0", "--memory-share", "2"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, env=env,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert (
        "worker memory limit 1.00 GiB: the Slurm job's memory on this node (2.00 GiB, "
        "SLURM_MEM_PER_NODE=2048 MiB), over the 2 workers sharing it (--memory-share 2)\n"
    ) in done.stdout, (done.stdout, done.stderr)


def test_a_pools_workers_are_told_to_set_its_keys_not_worker_flags() -> None:
    """Audit slurmscale F2: three 2-core blocks of pool ``scav`` on one node were told to
    give each worker ``--memory`` or ``Cluster(processes=2)``, and ``--cores``, which a
    pool's user never writes: the warnings now name ``memory_per_worker`` and
    ``cores_per_worker`` in ``[pools.scav]``, and the workers of no pool keep the flags."""
    from actors.scheduler import Scheduler
    from runtime.log import get_logger
    from runtime.messages import StatusRequest
    from tests.helpers import FixedClock, PostedRef

    s = Scheduler(lambda: PostedRef(), lambda: PostedRef(), pool_keys=("scav", "owner"))  # type: ignore[arg-type, return-value]
    s.clock = FixedClock()  # type: ignore[assignment]
    s._log = get_logger("corral", actor="scheduler")

    def join(worker: str, pool: str, block: str, now: float) -> None:
        s.infos[worker] = WorkerInfo(worker, 2, MACHINE, pool=pool, block=block, host=HOST)
        s.workers[worker] = PostedRef()  # type: ignore[assignment]
        s._handle(WorkerJoined(
            f"j-{worker}", now, worker, 2, MACHINE, pool, block=block, host=HOST,
            host_memory=MACHINE, process=len(s.infos), host_cpus=2,
        ))  # fmt: skip

    join("scav-1", "scav", "scav/block-1", 0.0)
    join("scav-3", "scav", "scav/block-3", 0.0)
    s._handle(Tick("t1", SETTLE))
    cores, memory = sorted(s.status(StatusRequest())["warnings"])  # "...cores" < "...memory"
    assert memory.endswith(
        'Give each worker its share: set memory_per_worker = "12052MiB" in [pools.scav] '
        "(the machine's memory / 2 worker processes)"
    ), memory
    assert "--memory" not in memory and "Cluster(" not in memory
    assert cores.endswith(
        "else set cores_per_worker in [pools.scav] so that the cores of the workers on this "
        "machine add up to 2 or fewer"
    ), cores

    join("manual", "scav", "", 2.0)  # started by hand (no block), though of pool scav
    s._handle(Tick("t2", 2.0 + SETTLE))
    cores, memory = sorted(s.status(StatusRequest())["warnings"])  # "...cores" < "...memory"
    assert memory.endswith(
        'set memory_per_worker = "8035MiB" in [pools.scav] (the machine\'s memory / 3 worker '
        "processes), and start the workers not of a pool with --memory 8035MiB"
    ), memory
    assert cores.endswith("(and give the workers not of a pool fewer --cores)"), cores
