"""Workers sharing a file system (docs/files.md#workers-sharing-a-file-system): worker
processes whose spill directories are on one file system each count its free space, so
the manager warns when their disk budgets add up to more than it has free, and clears
the warning when they no longer do.

A user audit: two workers (``--disk 300MiB``) sharing a 60 MB tmpfs spill directory
each reported 54 MiB free, so the scheduler counted 108 MB; tries ended disk-full, and
nothing said why."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any

from actors.host_memory import SETTLE, HostLedger, overcommit_text
from actors.scheduler_events import (
    DiskShared,
    DropData,
    HostOvercommitCleared,
    HostOvercommitted,
    WorkerJoined,
    WorkerLeft,
)
from actors.scheduler_state import SchedulerState
from actors.shared_disk import disk_claim, disk_key, disk_shared_text, shared_disk_text
from runtime.errors import size_text
from runtime.messages import WorkerInfo
from tests.helpers import Cli, Factory, assigned, event, make_state, of, on, run, submit
from tests.test_disk_placement import disk, disk_used, waits_for_disk

__all__ = ["make_state"]  # the fixture, used by name

LIMIT = 60.0  #: seconds, at most, of each wait
MiB = 2**20


def info(
    worker: str, disk: int, *, dev: int = 42, free: int = 54 * MiB, pid: int = 0
) -> WorkerInfo:
    return WorkerInfo(
        worker, 1, 2**30, disk, host="box/1", pid=pid or sum(map(ord, worker)),
        disk_device=dev, disk_fs_free=free,
    )  # fmt: skip


def test_a_worker_claims_its_budget_at_most_its_file_systems_free_space() -> None:
    assert disk_claim(info("a", 300 * MiB)) == 54 * MiB  # --disk past the file system
    assert disk_claim(info("a", 20 * MiB)) == 20 * MiB
    assert disk_claim(info("a", 0)) == 54 * MiB  # --disk off: places as if all of it
    assert disk_key(info("a", 1)) == "box/1 dev 42"
    assert disk_key(info("a", 1, dev=0)) == ""  # an older worker: not told
    assert disk_key(WorkerInfo("old", 1, 2**30, 1)) == ""


def test_the_ledger_warns_of_one_file_system_counted_twice_and_clears() -> None:
    """The audit's numbers: two workers, --disk 300MiB, on a file system with 54 MiB
    free: 108 MiB claimed. Another file system, budgets that fit, and workers of one
    process (one Cluster's, counted once) say nothing."""
    ledger = HostLedger()
    for i in (info("t1", 300 * MiB), info("t2", 300 * MiB)):
        ledger.joined(i.worker_id, disk_key(i), i.disk_fs_free, disk_claim(i), i.pid, 0.0)
    for i in (info("f1", 20 * MiB, dev=7), info("f2", 20 * MiB, dev=7)):  # 40 of 54: fits
        ledger.joined(i.worker_id, disk_key(i), i.disk_fs_free, disk_claim(i), i.pid, 0.0)
    for i in (info("c1", 0, dev=9, pid=5), info("c2", 0, dev=9, pid=5)):  # one process
        ledger.joined(i.worker_id, disk_key(i), i.disk_fs_free, disk_claim(i), i.pid, 0.0)
    (cmd,) = ledger.check(SETTLE, "tick")
    assert isinstance(cmd, HostOvercommitted) and cmd.host == "box/1 dev 42"
    assert (cmd.claimed, cmd.host_memory, cmd.processes) == (108 * MiB, 54 * MiB, 2)
    text = shared_disk_text(cmd)
    assert text.startswith("host box/1: 2 worker processes keep their outputs on one file")
    assert "t1 (54.0 MiB), t2 (54.0 MiB) add up to 108.0 MiB" in text, text
    assert "more than the 54.0 MiB it has free" in text and "--disk 27MiB" in text, text
    ledger.left("t2", 2 * SETTLE)
    (cleared,) = ledger.check(3 * SETTLE, "tick")
    assert isinstance(cleared, HostOvercommitCleared) and cleared.workers == ("t1",)


def test_sizes_are_told_as_every_message_tells_them() -> None:
    """One size formatter (``runtime.errors.size_text``) for the scheduler's warnings,
    the pre-flight checks and the errors: MiB to a tenth under a GiB, GiB to a hundredth
    from one. Before, this warning alone said MiB at any size ("24105.3 MiB") and the
    memory one GiB to a tenth ("0.1 GiB" for 54 MiB)."""
    assert (size_text(54 * MiB), size_text(1023 * MiB)) == ("54.0 MiB", "1023.0 MiB")
    assert (size_text(2**30), size_text(25276203008)) == ("1.00 GiB", "23.54 GiB")
    ws = (("t1", 25276203008), ("t2", 25276203008))
    cmd = HostOvercommitted("tick", "box/1 dev 42", 25276203008, 50552406016, ws, 2)
    text = shared_disk_text(cmd)
    assert "t1 (23.54 GiB), t2 (23.54 GiB) add up to 47.08 GiB" in text, text
    assert "more than the 23.54 GiB it has free" in text and "--disk 12052MiB" in text, text
    memory = overcommit_text(dataclasses.replace(cmd, host="box/1"))
    assert "t1 (23.54 GiB), t2 (23.54 GiB) add up to 47.08 GiB" in memory, memory
    small = dataclasses.replace(
        cmd, host="box/1", host_memory=54 * MiB, workers=(("t1", 54 * MiB),)
    )
    assert "t1 (54.0 MiB)" in overcommit_text(
        small
    ) and "the machine's 54.0 MiB" in overcommit_text(small)


def test_two_worker_processes_on_one_spill_directory_are_warned_of(tmp_path: Path) -> None:
    """The audit, with real processes over 127.0.0.1: a manager and two workers started
    by hand on one spill directory, each with a --disk of three quarters of its file
    system's free space. The manager logs the warning (the test waits for that line,
    bounded), naming the --disk that fits; the console's status shows it; when one
    worker stops, it is cleared."""
    spill = tmp_path / "spill"
    spill.mkdir()
    disk = str(shutil.disk_usage(spill).free * 3 // 4)
    with Cli(tmp_path) as cli:
        manager, address = cli.manager("--no-monitoring")
        flags = ("--pool", "manual", "--cores", "1", "--memory", "256MiB")
        w1 = cli.worker(address, "--name", "w1", *flags, "--disk", disk, "--spill-dir", str(spill))
        cli.worker(address, "--name", "w2", *flags, "--disk", disk, "--spill-dir", str(spill))
        line = cli.line_with(manager, "workers count more disk than their file system has", LIMIT)
        assert "warning" in line and "'w1'" in line and "'w2'" in line, line
        assert f"dev {os.stat(spill).st_dev}" in line and "--disk" in line, line

        status = cli.start("console", address, "status", "--json")
        st = json.loads("".join(cli.rest(status, LIMIT)))
        assert status.wait(LIMIT) == 0
        (warning,) = st["warnings"]
        assert "keep their outputs on one file system" in warning and "w2" in warning

        cli.stop([w1])
        line = cli.line_with(manager, "no longer count more disk than their file system", LIMIT)
        assert "w2" in line


def _disks_and_share(spill: Path, share_by: int, **cluster: Any) -> tuple[list[int], int]:
    """The disk budgets of the 2 workers of ``Cluster(**cluster)`` whose spill
    directory is ``spill``, and a ``1/share_by`` share of its free space less the margin
    (the highest free space seen around the run)."""
    import anyio

    from actors.shared_disk import DISK_MARGIN
    from runtime import Cluster

    async def main() -> list[int]:
        async with Cluster(memory_options={"spill_dir": str(spill)}, **cluster) as c:
            with anyio.fail_after(LIMIT):
                await c.wait_for_workers(2)
                status = await c.status()
        return [w.disk for w in status["workers"]]

    before = shutil.disk_usage(spill).free
    disks = anyio.run(main)
    high = max(before, shutil.disk_usage(spill).free)
    assert len(disks) == 2 and all(d > 0 for d in disks), disks
    # Other programs write to the file system meanwhile: its free space when the
    # share was measured may be a little above both figures seen here (by 1%, at most,
    # counted as the share; the old rule, all of it each, was 2-3 times the share).
    return disks, (high - min(DISK_MARGIN, high // 10)) // share_by * 101 // 100


def test_cluster_processes_share_their_file_system_evenly_by_default(tmp_path: Path) -> None:
    """``Cluster(processes=N)`` without ``disk_per_worker`` gives each worker process a
    ``1/N`` share of its spill directory's free space (less the margin), as it does the
    machine's memory: the budgets add up to no more than the file system has free, so
    the scheduler does not place twice the free space there and the manager has nothing
    to warn of. Before, each process counted all of it (a user's audit: every
    ``Cluster(processes=N)`` on one disk was warned of)."""
    disks, share = _disks_and_share(tmp_path, 2, processes=2)
    assert all(d <= share for d in disks), (disks, share)


def test_local_pools_workers_share_their_file_system_evenly_by_default(tmp_path: Path) -> None:
    """The workers of local pools without ``disk_per_worker`` get an even share of the
    spill directory's free space (less the margin) among the most workers all local
    pools may run at once (here 2 x 1 + 1 x 1 = 3), as they share the machine's
    memory: their budgets add up to no more than the file system has free, and the
    manager has nothing to warn of. Before, each counted all of it, and every
    multi-worker local setup was warned of at each start (a user's audit)."""
    pools = {"build": {"max_blocks": 2, "init_blocks": 1}, "scarce": {"max_blocks": 1}}
    disks, share = _disks_and_share(tmp_path, 3, pools=pools, processes=True)
    assert all(d <= share for d in disks), (disks, share)
    assert all(d >= share * 0.89 for d in disks), (disks, share)  # a share, not less


# ------------------------------------------------ workers without --disk share it (core)

FS = "node7/ab12 dev 2049"  #: the node's /tmp, as the workers tell it
D = 90 * MiB  #: each default budget: the free space each measured, less the margin
FREE = 100 * MiB  #: that file system's free space when they joined


def join(
    s: SchedulerState,
    worker: str,
    *,
    auto: bool = True,
    budget: int = D,
    process: int = 0,
    fs: str = FS,
) -> list[Any]:
    """A worker process joins with 4 cores, its outputs on ``fs``: without --disk
    (``auto``, its ``budget`` the free-space default) or with ``--disk budget``."""
    return run(
        s,
        event(
            WorkerJoined, worker=worker, cores=4, memory=0, disk=budget, host="node7/ab12",
            process=process or sum(map(ord, worker)), filesystem=fs, fs_free=FREE,
            disk_auto=auto,
        ),
    )  # fmt: skip


def said(cmds: list[Any]) -> list[tuple[tuple[str, int], ...]]:
    return [c.shares for c in of(cmds, DiskShared)]


def test_slurm_workers_on_one_node_divide_its_disk_and_take_what_fits(
    make_state: Factory,
) -> None:
    """The audit: three Slurm blocks' workers (no disk_per_worker) on one node each
    counted the whole free space of its /tmp, so the scheduler placed three times it
    there. Now each gets a share as they join (one alone keeps its own budget: nothing
    said), and placement holds to it: tasks of 20 MiB, 4 cores each, 90 MiB budgets
    shared by 3 (30 MiB): one task per worker, the rest wait for disk. Before, every
    worker took 4 (80 of its 90 MiB): 12 tasks, 240 MiB, on 100 MiB free."""
    s = make_state(saturation=1.0)
    assert said(join(s, "ckpt-1")) == []
    cmds = join(s, "ckpt-2")
    assert cmds == [
        DiskShared(cmds[0].stimulus_id, FS, D, 0, 2, (("ckpt-1", D // 2), ("ckpt-2", D // 2)))
    ]
    cmds = join(s, "owner-1")
    third = D // 3
    assert said(cmds) == [(("ckpt-1", third), ("ckpt-2", third), ("owner-1", third))]
    assert [s.workers[w].disk for w in ("ckpt-1", "ckpt-2", "owner-1")] == [third] * 3
    table: dict[str, list[str]] = {f"img-{i}": [] for i in range(12)}
    cmds = submit(s, table, list(table), attrs={k: disk(20 * MiB) for k in table})
    assert {w: len(keys) for w, keys in assigned(cmds).items()} == {
        "ckpt-1": 1, "ckpt-2": 1, "owner-1": 1,
    }  # fmt: skip
    waiting = sorted(k for k in table if s.tasks[k].state == "queued")
    assert len(waiting) == 9
    (story,) = waits_for_disk(s, waiting[0])  # its share less the task it runs
    assert story.startswith(f"waiting for disk: needs {20 * MiB} B, best worker "), story
    assert story.endswith(f" has {third - 20 * MiB} B free"), story


def test_the_shares_are_told_in_words() -> None:
    shares = (("ckpt-1", 30 * MiB), ("given", 30 * MiB))
    text = disk_shared_text(DiskShared("t", FS, D, 30 * MiB, 2, shares))
    assert text.startswith("host node7/ab12: the workers without --disk"), text
    assert "(device 2049) share it: ckpt-1 (30.0 MiB), given (30.0 MiB): 90.0 MiB" in text, text
    assert "less 30.0 MiB given by --disk, over 2 worker processes" in text, text
    assert "outputs beyond it stay until they are released" in text, text


def test_a_worker_leaving_grows_the_others_shares(make_state: Factory) -> None:
    """The owner block ends: the two left share the node's disk by two (45 MiB each),
    and the tasks waiting for disk go to them: two 20 MiB tasks fit each now."""
    s = make_state(saturation=1.0)
    for w in ("ckpt-1", "ckpt-2", "owner-1"):
        join(s, w)
    table: dict[str, list[str]] = {f"img-{i}": [] for i in range(6)}
    submit(s, table, list(table), attrs={k: disk(20 * MiB) for k in table})
    assert sorted(len(on(s, w)) for w in s.workers) == [1, 1, 1]
    cmds = run(s, event(WorkerLeft, worker="owner-1", cause="walltime"))
    assert said(cmds) == [(("ckpt-1", D // 2), ("ckpt-2", D // 2))]
    assert {w: len(on(s, w)) for w in s.workers} == {"ckpt-1": 2, "ckpt-2": 2}
    cmds = run(s, event(WorkerLeft, worker="ckpt-2", cause="walltime"))
    assert said(cmds) == [(("ckpt-1", D),)]  # alone again: its own budget, said once
    assert s.workers["ckpt-1"].disk == D


def test_an_explicit_disk_wins_and_the_others_share_the_rest(make_state: Factory) -> None:
    """A worker given --disk (disk_per_worker) keeps it; the ones without share what
    is left of the file system: (90 - 30) / 2. Workers of one process (one Cluster's
    in-process workers) take one share between them, as the warning counts them."""
    s = make_state(saturation=1.0)
    join(s, "given", auto=False, budget=30 * MiB)
    join(s, "a1")
    cmds = join(s, "a2")
    assert cmds == [
        DiskShared(cmds[0].stimulus_id, FS, D, 30 * MiB, 2, (("a1", 30 * MiB), ("a2", 30 * MiB)))
    ]
    assert s.workers["given"].disk == 30 * MiB
    s2 = make_state(saturation=1.0)
    assert said(join(s2, "c1", process=5)) == said(join(s2, "c2", process=5)) == []
    assert s2.workers["c1"].disk == s2.workers["c2"].disk == D


def test_a_local_pools_share_is_not_given_and_workers_started_by_hand_share_the_rest(
    make_state: Factory,
) -> None:
    """A local pool's worker takes a share of the file system (``--disk-share 3``: a
    third, as one of 3 local workers) and counts as sharing it, not as given a
    ``--disk``: two workers started by hand on the same file system share it with it
    (by 3: 30 MiB each; the pool's worker keeps its 30 MiB). Alone, the local pool's
    workers keep their own shares and nothing is said. Before, the pool passed its
    share as ``--disk``: with one local worker that was all of the free space, and
    the workers started by hand were each told to share what was left, 0.6 MiB."""
    s = make_state(saturation=1.0)
    assert said(join(s, "local-1", budget=D // 3)) == []
    assert said(join(s, "local-2", budget=D // 3)) == []  # one of their 3 each: no change
    s2 = make_state(saturation=1.0)
    join(s2, "local-1", budget=D // 3)
    cmds = join(s2, "w1")
    third = D // 2  # two processes share the 90 MiB: 45 each, the local one keeps 30
    assert cmds == [
        DiskShared(cmds[0].stimulus_id, FS, D, 0, 2, (("local-1", D // 3), ("w1", third)))
    ]
    cmds = join(s2, "w2")
    assert said(cmds) == [(("local-1", D // 3), ("w1", D // 3), ("w2", D // 3))]
    assert [s2.workers[w].disk for w in ("local-1", "w1", "w2")] == [D // 3] * 3


def test_outputs_past_a_shrunk_share_stay_and_only_new_work_waits(make_state: Factory) -> None:
    """ckpt-1 stores 40 MiB of outputs alone on the node; ckpt-2 joins and ckpt-1's
    share falls to 45 MiB. Nothing it stores is dropped (no DropData): the share limits
    what is placed there next, so a 20 MiB task goes to ckpt-2, not to ckpt-1 (5 MiB
    left of its share)."""
    s = make_state(saturation=1.0)
    join(s, "ckpt-1")
    disk_used(s, "ckpt-1", 40 * MiB)
    cmds = join(s, "ckpt-2")
    assert said(cmds) == [(("ckpt-1", D // 2), ("ckpt-2", D // 2))]
    assert not of(cmds, DropData)
    cmds = submit(s, {"t": []}, ["t"], attrs={"t": disk(20 * MiB)})
    assert assigned(cmds) == {"ckpt-2": ["t"]}
    assert not of(cmds, DropData)


def test_two_worker_processes_without_disk_on_one_directory_share_it(tmp_path: Path) -> None:
    """Real processes over 127.0.0.1: two workers started without --disk on one spill
    directory (as a Slurm pool's workers without disk_per_worker on one node's /tmp).
    The manager logs their shares (the test waits for that line, bounded), and the
    scheduler's budget for each (status()["storage"]) is half of what one of them
    counts alone, not all of it; when one stops, the other's share grows back."""
    spill = tmp_path / "spill"
    spill.mkdir()
    with Cli(tmp_path) as cli:
        manager, address = cli.manager("--no-monitoring", "--log-level", "info")
        flags = (
            "--pool",
            "manual",
            "--cores",
            "1",
            "--memory",
            "256MiB",
            "--spill-dir",
            str(spill),
        )
        w1 = cli.worker(address, "--name", "w1", *flags)
        cli.worker(address, "--name", "w2", *flags)
        said: list[str] = []  # the manager's lines from here on
        line = cli.line_with(manager, "workers share their file system's free space", LIMIT, said)
        assert "'w1'" in line and "'w2'" in line and "over 2 worker processes" in line, line
        assert f"dev {os.stat(spill).st_dev}" in line, line

        status = cli.start("console", address, "status", "--json")
        st = json.loads("".join(cli.rest(status, LIMIT)))
        assert status.wait(LIMIT) == 0
        own = {w["worker_id"]: w["disk"] for w in st["workers"]}  # what each counts
        budgets = {w: st["storage"]["workers"][w]["disk"] for w in ("w1", "w2")}
        assert budgets["w1"] == budgets["w2"] <= max(own.values()) // 2, (budgets, own)

        cli.stop([w1])
        line = cli.line_with(manager, "workers share their file system's free space", LIMIT, said)
        assert "'w2'" in line and "'w1'" not in line and "over 1 worker processes" in line, line
        # Nor were they warned of: their shares add up to the free space. (Before,
        # "workers count more disk than their file system has free" came a second after
        # w2 joined; w1 stays a status call and a graceful stop longer. An absence: it
        # cannot fail falsely, only miss if that were under a second.)
        cli.stop([manager])
        said += cli.rest(manager, LIMIT)
        assert not [x for x in said if "count more disk than their file system" in x], said
