"""Files on worker disks (issue 13): pruning and replicas on a physics-style workflow,
on real worker processes.

The workflow is many homogeneous subgraphs, one per dataset: each of its ``files``
files is loaded (``load``: a seeded array, ``nbytes``), skimmed (``skim``: the values
above 0.75, about a quarter) and the skims of a dataset are merged (``merge``: their
sum). Only the merges are wanted. The expected sums are computed here in this process,
so every run is checked. With ``file_outputs`` (``Workflow(file_outputs=True)``) the
loads and skims write their arrays as file outputs (``output_path``, ``File``: real
files in the workers' sandboxes, as the users' ROOT or Parquet files) and each merge
reads its inputs' files on its own worker and returns the sha256 of their bytes, checked
against the same computed here. After every run all outputs are released, and no file
may stay in a surviving worker's sandbox (``Result.left``).

Each run is a ``Cluster(processes=N)`` of one-thread worker processes that spill every
output to disk (a spill fence far below a worker's resting memory), each with a
monitoring database; the ``consumers-first`` priority (docs/files.md). Measured:

(a) **peak per-worker disk**, pruning (``prune_depth=1``) against none
    (``prune_depth=0``), without replicas and without a loss: the most bytes of outputs
    any worker reported on its disk (the scheduler's storage ledger, as
    ``status()["storage"]`` shows it, read once the cluster stopped: every report of
    the workers, those after the results too, when spilling catches up; the monitoring
    database samples the same reports, so its figure never exceeds it). The issue's
    target: pruning's peak <= 60% of no pruning's. Measured twice: with Python outputs
    spilled, and with file outputs (``files-prune-*``).
(b) **makespan under a worker loss**: one worker killed with SIGKILL once a seeded
    number of skims has finished (the victim seeded too; ``Cluster(processes=N)``
    starts a replacement), with temporary replicas (``recompute-cost`` with a
    threshold between a load's cost and a skim's cost to make again, its load included:
    skims and merges get a replica, loads none) against without
    (``replication none``: lost outputs are computed again, all at once). Beside:
    the same workflow without a loss, with replicas (``replicas-no-loss``) and without
    (``prune-1``). Recomputes: tries that ended ok beyond the first
    of each task (the database's ``tries``); recoveries: ``status()["storage"]``.
(c) **tail makespan with speculative copies** (the default policy, ``idle-tail``)
    against none (``speculation off``), on a heavy-tailed duration mix of independent
    tasks (:class:`Tail`): log-normal durations, and a seeded share of stragglers whose
    first try is 20-80x slower (the host is slow, not the work: a later try of the same
    task runs at its speed). Measured: makespan, and the tail (from the end of the 90th
    percentile task to the last), with the copies started, won and lost.

    python benchmarks/files.py            # 20 datasets x 10 files, 3 workers, seed 1
    python benchmarks/files.py --quick    # small: the test's size
    python benchmarks/files.py --seed 2 --json

Every run of a table is in this one process invocation, one after the other.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if importlib.util.find_spec("runtime") is None:
    sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402
import cloudpickle  # noqa: E402
import numpy as np  # noqa: E402
import psutil  # noqa: E402

from runtime.files import File, output_path  # noqa: E402

if __name__ != "__main__":  # loaded by a test: the tasks travel by value to the workers
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

TARGET_DISK = 0.60  #: the issue's target: pruned peak / unpruned peak


# ----------------------------------------------------------------------------- tasks


def load(
    dataset: int, file: int, seed: int, nbytes: int, seconds: float, to_file: bool = False
) -> Any:
    """Read one file of a dataset: a seeded array of ``nbytes``; with ``to_file``, written
    as a file output (its raw float64 bytes) and returned as its :class:`File`."""
    time.sleep(seconds)
    events = np.random.default_rng([seed, dataset, file]).random(nbytes // 8)
    return _write(f"load-{dataset}-{file}.bin", events) if to_file else events


def skim(events: Any, seconds: float, to_file: bool = False) -> Any:
    """Keep the events that pass the cut (about a quarter); an input :class:`File` is
    read from its path, and with ``to_file`` the kept events are a file output."""
    time.sleep(seconds)
    if isinstance(events, File):
        events = np.fromfile(events.path, dtype=np.float64)
    kept = events[events > 0.75]
    return _write("skim.bin", kept) if to_file else kept


def merge(*skims: Any) -> float | str:
    """The fan-in: the sum of the skims' values; of skims that are file outputs, the
    sha256 (hex) of their files' bytes, read in order from their paths on this worker."""
    if skims and all(isinstance(s, File) for s in skims):
        h = hashlib.sha256()
        for s in skims:
            with open(s.path, "rb") as f:
                while chunk := f.read(2**16):
                    h.update(chunk)
        return h.hexdigest()
    return float(sum(float(s.sum()) for s in skims))


def _write(name: str, values: Any) -> File:
    path = output_path(name)
    values.tofile(path)
    return File(path)


@dataclasses.dataclass(frozen=True)
class Workflow:
    datasets: int = 20
    files: int = 10
    seed: int = 1
    load_s: float = 0.1
    skim_s: float = 0.03
    nbytes: int = 256 * 1024
    file_outputs: bool = False  #: loads and skims write file outputs (``File``)

    @property
    def n_files(self) -> int:
        return self.datasets * self.files

    @property
    def wanted(self) -> list[str]:
        return [f"merge-{d}" for d in range(self.datasets)]

    def graph(self) -> dict[Hashable, Any]:
        g: dict[Hashable, Any] = {}
        out = self.file_outputs
        for d in range(self.datasets):
            for f in range(self.files):
                g[f"load-{d}-{f}"] = (load, d, f, self.seed, self.nbytes, self.load_s, out)
                g[f"skim-{d}-{f}"] = (skim, f"load-{d}-{f}", self.skim_s, out)
            g[f"merge-{d}"] = (merge, *[f"skim-{d}-{f}" for f in range(self.files)])
        return g

    def expected(self) -> dict[str, float | str]:
        """The merges' values, computed here: with file outputs, the sha256 of the bytes
        of the files the dataset's skims write."""
        out: dict[str, float | str] = {}
        for d in range(self.datasets):
            skims = [skim(load(d, f, self.seed, self.nbytes, 0), 0) for f in range(self.files)]
            if self.file_outputs:
                out[f"merge-{d}"] = hashlib.sha256(b"".join(s.tobytes() for s in skims)).hexdigest()
            else:
                out[f"merge-{d}"] = merge(*skims)
        return out


@dataclasses.dataclass
class Result:
    makespan: float
    correct: bool
    #: most bytes on one worker's disk: the highest of its reports, every one until the
    #: cluster stopped (the scheduler's ledger then; a name that comes back with a new
    #: worker starts a new peak)
    peak_disk: int
    #: the same from the database's samples (of those same reports: never more)
    peak_disk_db: int
    recomputes: int  #: ok tries beyond the first of each task
    recoveries: dict[str, int]
    transfers: dict[str, int]
    copied: int  #: bytes copied between workers (fetches, replicas, evacuations)
    killed: str | None
    status: dict[str, Any] = dataclasses.field(repr=False)
    #: the monitoring database the caller gave (None: the run made one, and removed it)
    db: Path | None = None
    #: files left in the sandboxes of the workers that stopped with the cluster, once
    #: every output was released (should be none; not looked at with prune_depth=0)
    left: list[str] = dataclasses.field(default_factory=list)
    #: sandboxes left once the cluster stopped: none, the workers that stopped removed
    #: theirs and the replacements of the killed ones removed the killed ones'
    stale_sandboxes: int = 0


def kill_one_worker(rng: random.Random) -> int:
    """SIGKILL one of this process's worker processes (chosen with ``rng``); its pid."""
    procs = sorted(
        (p for p in psutil.Process().children(recursive=True) if _is_worker(p)),
        key=lambda p: p.pid,
    )
    victim = rng.choice(procs)
    os.kill(victim.pid, signal.SIGKILL)
    return int(victim.pid)


def _is_worker(p: psutil.Process) -> bool:
    try:
        argv = p.cmdline()
    except psutil.Error:
        return False
    return "runtime" in argv and "worker" in argv


async def run_workflow(
    wf: Workflow,
    *,
    workers: int = 3,
    prune_depth: int = 1,
    replicas: bool = False,
    monitoring: Path | None = None,
    kill_after: int | Sequence[int] | None = None,
    kill: Callable[[random.Random], int] = kill_one_worker,
    kill_seed: int = 0,
    limit: float = 300.0,
) -> Result:
    """Run ``wf`` once on ``workers`` worker processes; with ``kill_after``, SIGKILL one
    worker once that many skims have finished (a list: one kill per number, each
    after the one before was seen; ``killed`` names the workers lost, by ``,``).

    The workers' sandboxes (spill directories) are in ``spill`` beside ``monitoring``.
    Once the results are in, every output is released and, with pruning (``prune_depth``
    1 or more; with 0 every output stays while the cluster runs, by design), when the
    workers report nothing left on their disks, the files still in their sandboxes are
    looked at: the sandboxes the workers remove when the cluster stops are the
    survivors' (a killed worker's is removed by the next worker that starts: the run
    waits for the last one's replacement), and a file left in one of them is in
    ``left``."""
    from runtime import Cluster

    made_here = monitoring is None
    if monitoring is None:
        monitoring = Path(tempfile.mkdtemp(prefix="corral-files-")) / "monitoring.db"
    spill = monitoring.parent / "spill"
    # Replicas for outputs costlier to make again than a load: skims (a skim and its
    # pruned load) and merges, not the loads themselves.
    threshold = wf.load_s + wf.skim_s / 2
    replication: Any = ("recompute-cost", {"threshold": threshold}) if replicas else "none"
    policies: dict[str, Any] = {"priority": "consumers-first", "replication": replication}
    expected = wf.expected()
    killed: list[str] = []
    kills = [kill_after] if isinstance(kill_after, int) else list(kill_after or ())
    rng = random.Random(kill_seed)
    with anyio.fail_after(limit):
        async with Cluster(
            processes=workers,
            threads_per_worker=1,
            memory_per_worker="2GiB",
            memory_options={
                "spill": 0.01,
                "throttle": 0.9,
                "terminate": None,
                "spill_dir": str(spill),
            },
            disk_per_worker="512MiB",
            prune_depth=prune_depth,
            policies=policies,
            monitoring=monitoring,
            monitoring_interval=0.2,
        ) as c:
            await c.wait_for_workers(workers)
            # The scheduler's ledger of the workers' disks, read once the cluster has
            # stopped: by then it has every report the database could have sampled.
            ledger = c.scheduler_state.storage
            t0 = time.perf_counter()
            futures = await c.submit_graph(wf.graph(), wf.wanted)
            for n in sorted(kills):
                await _until(lambda n=n: _skims_done(c, n))  # type: ignore[misc]
                await c.wait_for_workers(workers)  # the replacement of the one before
                before = {w.worker_id for w in (await c.status())["workers"]}
                kill(rng)
                killed.append(await _until(lambda b=before: _gone(c, b)))  # type: ignore[misc]
            values = await c.gather(futures)
            makespan = time.perf_counter() - t0
            if kills:  # the last one's replacement, which removes the killed sandboxes
                await c.wait_for_workers(workers)
            status = await c.status()
            for fut in futures:
                fut.release()
            del futures
            held = await _after_release(c, spill) if prune_depth else {}
    # The survivors removed their sandboxes as they stopped, replacements the killed ones'.
    left = sorted(str(f) for sandbox, files in held.items() if not sandbox.exists() for f in files)
    stale = len(_sandboxes(spill))
    got = dict(zip(wf.wanted, values, strict=True))
    storage = status["storage"]
    # Every report to the end, not status()'s at the results: spills go on after them
    # (behind, under load), and the database samples those reports too.
    peak = max(ledger.disk_peak.values(), default=0)
    conn = sqlite3.connect(monitoring)
    try:
        (peak_db,) = conn.execute("SELECT coalesce(max(spilled_bytes), 0) FROM resource_samples"
                                  ).fetchone()  # fmt: skip
        (recomputes,) = conn.execute(
            "SELECT count(*) - count(DISTINCT key) FROM tries WHERE outcome = 'ok'"
        ).fetchone()
    finally:
        conn.close()
        if made_here:  # the database and the spill directory, all of this run's
            shutil.rmtree(monitoring.parent, ignore_errors=True)
    return Result(
        makespan, got == expected, peak, int(peak_db), int(recomputes),
        dict(storage["recoveries"]), dict(storage["transfers"]),
        sum(storage["transfer_bytes"].values()), ",".join(killed) or None,
        status, None if made_here else monitoring, left, stale,
    )  # fmt: skip


async def _after_release(
    c: Any, spill: Path, limit: float = 30.0, settle: float = 2.0
) -> dict[Path, list[Path]]:
    """The files in each worker sandbox under ``spill`` once every worker reports no
    output on its disk and the registry no file output (or after ``limit`` seconds),
    and what a deletion under way removes has gone (within ``settle`` seconds)."""

    async def emptied() -> bool:
        st = await c.status()
        on_disk = [st["memory"].get(w.worker_id) for w in st["workers"]]
        return st["files"]["file_outputs"] == 0 and all(
            m is not None and m["spilled_bytes"] == 0 for m in on_disk
        )

    def listed() -> dict[Path, list[Path]]:
        return {  # a sandbox's lock file (.owner) is no output
            d: [f for f in d.rglob("*") if not f.is_dir() and f.name != ".owner"]
            for d in _sandboxes(spill)
        }

    with anyio.move_on_after(limit):
        await _until(emptied)
    # A store deletes a spill file from a thread of its own and reports it gone at once:
    # a file may still be there for a moment. A file left behind is there for good, so
    # a grace of `settle` seconds for the listing to empty hides no leak. (A killed
    # worker's sandbox keeps its files: the caller leaves those out.)
    found = listed()
    with anyio.move_on_after(settle):
        while any(found.values()):
            await anyio.sleep(0.05)
            found = listed()
    return found


def _sandboxes(spill: Path) -> list[Path]:
    return sorted(spill.glob("corral-spill-*")) if spill.is_dir() else []


async def _until(check: Callable[[], Awaitable[Any]], step: float = 0.05) -> Any:
    while True:
        got = await check()
        if got:
            return got
        await anyio.sleep(step)


async def _skims_done(c: Any, n: int) -> bool:
    cat = (await c.status())["categories"].get("skim")
    return cat is not None and cat["count"] >= n


async def _gone(c: Any, before: set[str]) -> str | None:
    now = {w.worker_id for w in (await c.status())["workers"]}
    gone = sorted(before - now)
    return gone[0] if gone else None


# ----------------------------------------------------------------------------- (c) the tail


def work(i: int, seconds: float, slow: float, markers: str) -> int:
    """A task of the heavy-tailed mix. Its first try runs ``slow`` times longer (a
    straggler's host is slow, not its work): the first try to start takes a marker
    file; a later try (a speculative copy, a retry) finds it and runs at its speed."""
    try:
        os.close(os.open(os.path.join(markers, f"work-{i}"), os.O_CREAT | os.O_EXCL))
        first = True
    except FileExistsError:
        first = False
    time.sleep(seconds * (slow if first else 1.0))
    return i * i


@dataclasses.dataclass(frozen=True)
class Tail:
    """``tasks`` independent tasks of durations drawn from a log-normal (median
    ``median`` s); a seeded ``stragglers`` share of them has a first try slower by a
    Pareto-distributed factor (at least ``min_slow``, at most ``max_slow``)."""

    tasks: int = 60
    seed: int = 1
    median: float = 0.1
    stragglers: float = 0.08
    min_slow: float = 20.0
    max_slow: float = 80.0

    def mix(self) -> list[tuple[float, float]]:
        rng = random.Random(self.seed)
        out = []
        for _ in range(self.tasks):
            seconds = min(rng.lognormvariate(0.0, 0.5) * self.median, 4 * self.median)
            slow = 1.0
            if rng.random() < self.stragglers:
                slow = min(self.min_slow * rng.paretovariate(1.5), self.max_slow)
            out.append((seconds, slow))
        return out


@dataclasses.dataclass
class TailResult:
    makespan: float
    tail: float  #: from the 90th percentile task's end to the last one's
    speculative: dict[str, int]
    correct: bool


async def run_tail(
    tail: Tail, *, workers: int = 3, speculation: bool = True, limit: float = 300.0
) -> TailResult:
    """Run the heavy-tailed mix once, with the default speculation policy or none."""
    markers = tempfile.mkdtemp(prefix="corral-tail-")
    try:
        return await _run_tail(tail, markers, workers, speculation, limit)
    finally:
        shutil.rmtree(markers, ignore_errors=True)


async def _run_tail(
    tail: Tail, markers: str, workers: int, speculation: bool, limit: float
) -> TailResult:
    from runtime import Cluster

    mix = tail.mix()
    graph: dict[Hashable, Any] = {
        f"work-{i}": (work, i, seconds, slow, markers) for i, (seconds, slow) in enumerate(mix)
    }
    keys = list(graph)
    ends: list[float] = []
    policies: dict[str, Any] = {"speculation": "idle-tail" if speculation else "off"}
    with anyio.fail_after(limit):
        async with Cluster(
            processes=workers, threads_per_worker=1, policies=policies, disk_per_worker="off"
        ) as c:
            await c.wait_for_workers(workers)
            t0 = time.perf_counter()
            futures = await c.submit_graph(graph, keys)

            async def one(f: Any) -> Any:
                value = await f
                ends.append(time.perf_counter() - t0)
                return value

            values: list[Any] = [None] * len(futures)

            async def put(i: int, f: Any) -> None:
                values[i] = await one(f)

            async with anyio.create_task_group() as tg:
                for i, f in enumerate(futures):
                    tg.start_soon(put, i, f)
            makespan = time.perf_counter() - t0
            speculative = dict((await c.status()).get("speculative", {}))
    ends.sort()
    p90 = ends[max(0, int(len(ends) * 0.9) - 1)]
    correct = values == [i * i for i in range(tail.tasks)]
    return TailResult(makespan, makespan - p90, speculative, correct)


# ----------------------------------------------------------------------------- tables


async def measure(wf: Workflow, workers: int, tail_tasks: int = 60) -> dict[str, Any]:
    rng = random.Random(wf.seed)
    kill_after = rng.randint(wf.n_files * 2 // 5, wf.n_files * 3 // 5)
    kill_seed = rng.randrange(1 << 30)
    runs: dict[str, Result] = {}
    runs["prune-1"] = await run_workflow(wf, workers=workers, prune_depth=1)
    runs["prune-0"] = await run_workflow(wf, workers=workers, prune_depth=0)
    files = dataclasses.replace(wf, file_outputs=True)  # (a) with real files on disk
    runs["files-prune-1"] = await run_workflow(files, workers=workers, prune_depth=1)
    runs["files-prune-0"] = await run_workflow(files, workers=workers, prune_depth=0)
    runs["replicas-no-loss"] = await run_workflow(wf, workers=workers, replicas=True)
    for name, replicas in (("loss+replicas", True), ("loss-no-replicas", False)):
        runs[name] = await run_workflow(
            wf, workers=workers, replicas=replicas, kill_after=kill_after, kill_seed=kill_seed
        )
    # (c) speculative copies (the default policy, idle-tail) vs none, heavy-tailed mix
    mix = Tail(seed=wf.seed, tasks=tail_tasks)
    tails = {
        "speculation": await run_tail(mix, workers=workers, speculation=True),
        "no-speculation": await run_tail(mix, workers=workers, speculation=False),
    }
    return {"runs": runs, "kill_after": kill_after, "tails": tails, "tail": mix}


def table(wf: Workflow, workers: int, got: dict[str, Any]) -> dict[str, Any]:
    runs: dict[str, Result] = got["runs"]
    p1, p0 = runs["prune-1"], runs["prune-0"]
    rep, none = runs["loss+replicas"], runs["loss-no-replicas"]
    base, base_rep = runs["prune-1"], runs["replicas-no-loss"]
    disk_ratio = _ratio(p1.peak_disk, p0.peak_disk)
    files_ratio = _ratio(runs["files-prune-1"].peak_disk, runs["files-prune-0"].peak_disk)
    return {
        "workflow": dataclasses.asdict(wf),
        "workers": workers,
        "kill_after_skims": got["kill_after"],
        "all_correct": all(r.correct for r in runs.values())
        and all(r.correct for r in got["tails"].values()),
        "tail_mix": dataclasses.asdict(got["tail"]),
        "tail_rows": {
            name: {
                "makespan_s": round(r.makespan, 2),
                "tail_s": round(r.tail, 2),
                "speculative": r.speculative,
                "correct": r.correct,
            }
            for name, r in got["tails"].items()
        },
        "tail_ratio": round(
            got["tails"]["speculation"].makespan / got["tails"]["no-speculation"].makespan, 3
        ),
        "rows": {
            name: {
                "makespan_s": round(r.makespan, 2),
                "peak_disk_mib": round(r.peak_disk / 2**20, 2),
                "peak_disk_db_mib": round(r.peak_disk_db / 2**20, 2),
                "recomputes": r.recomputes,
                "recoveries": r.recoveries,
                "transfers": r.transfers,
                "copied_mib": round(r.copied / 2**20, 2),
                "killed": r.killed,
                "correct": r.correct,
                "left": len(r.left),
            }
            for name, r in runs.items()
        },
        "disk_ratio": round(disk_ratio, 3),
        "disk_target_met": disk_ratio <= TARGET_DISK,
        "nothing_left": not any(r.left for r in runs.values()),
        "disk_ratio_files": round(files_ratio, 3),
        "disk_target_met_files": files_ratio <= TARGET_DISK,
        "makespan_ratio_replicas": round(rep.makespan / none.makespan, 3),
        "loss_cost_replicas_s": round(rep.makespan - base_rep.makespan, 2),
        "loss_cost_no_replicas_s": round(none.makespan - base.makespan, 2),
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def render(t: dict[str, Any]) -> str:
    wf = t["workflow"]
    lines = [
        f"workflow: {wf['datasets']} datasets x {wf['files']} files (load {wf['load_s']} s, "
        f"{wf['nbytes'] // 1024} KiB; skim {wf['skim_s']} s; merge), seed {wf['seed']}, "
        f"{t['workers']} worker processes; loss: SIGKILL after {t['kill_after_skims']} skims",
        "",
        f"{'run':<18}{'makespan s':>11}{'peak disk MiB':>15}{'copied MiB':>11}"
        f"{'recomputes':>11}{'recoveries':>24}  correct",
    ]
    for name, r in t["rows"].items():
        rec = ",".join(f"{k}={v}" for k, v in sorted(r["recoveries"].items())) or "-"
        lines.append(f"{name:<18}{r['makespan_s']:>11.2f}{r['peak_disk_mib']:>15.2f}"
                     f"{r['copied_mib']:>11.2f}{r['recomputes']:>11}{rec:>24}  "
                     f"{r['correct']}")  # fmt: skip
    lines += [
        "",
        f"(a) peak disk, prune_depth=1 / prune_depth=0: {t['disk_ratio']:.3f} "
        f"(target <= {TARGET_DISK}: {'met' if t['disk_target_met'] else 'NOT met'})",
        f"(a) the same with file outputs (files-prune-*: loads and skims write files): "
        f"{t['disk_ratio_files']:.3f} "
        f"(target <= {TARGET_DISK}: {'met' if t['disk_target_met_files'] else 'NOT met'})",
        "after release, files left on surviving workers: "
        + ("none" if t["nothing_left"] else "SOME (see the rows' left)"),
        f"(b) makespan under loss, replicas / none: {t['makespan_ratio_replicas']:.3f}; "
        f"loss cost over the same without a loss: {t['loss_cost_replicas_s']:+.2f} s with "
        f"replicas, {t['loss_cost_no_replicas_s']:+.2f} s without",
    ]
    mix = t["tail_mix"]
    lines += [
        "",
        f"(c) heavy-tailed mix: {mix['tasks']} independent tasks, log-normal durations "
        f"(median {mix['median']} s), {mix['stragglers']:.0%} stragglers whose first try "
        f"is {mix['min_slow']:g}-{mix['max_slow']:g}x slower (Pareto), seed {mix['seed']}",
        f"{'run':<18}{'makespan s':>11}{'tail s':>8}  speculative copies          correct",
    ]
    for name, r in t["tail_rows"].items():
        spec = ",".join(f"{k}={v}" for k, v in sorted(r["speculative"].items()) if v) or "-"
        lines.append(f"{name:<18}{r['makespan_s']:>11.2f}{r['tail_s']:>8.2f}  {spec:<26}  "
                     f"{r['correct']}")  # fmt: skip
    lines.append(f"(c) makespan, speculation / none: {t['tail_ratio']:.3f} "
                 "(tail: from the 90th percentile task's end to the last)")  # fmt: skip
    return "\n".join(lines)


QUICK = {"datasets": 4, "files": 5, "load_s": 0.05, "skim_s": 0.02, "nbytes": 64 * 1024}
QUICK_TAIL = 30  #: tasks of the heavy-tailed mix with --quick


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small workflow (the test's)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--datasets", type=int)
    ap.add_argument("--files", type=int)
    ap.add_argument("--json", action="store_true", help="print the table as JSON")
    args = ap.parse_args(argv)
    sizes: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.datasets:
        sizes["datasets"] = args.datasets
    if args.files:
        sizes["files"] = args.files
    wf = Workflow(seed=args.seed, **sizes)
    got = anyio.run(measure, wf, args.workers, QUICK_TAIL if args.quick else 60)
    t = table(wf, args.workers, got)
    print(json.dumps(t, indent=2) if args.json else render(t))
    return 0 if t["all_correct"] and t["nothing_left"] else 1


if __name__ == "__main__":
    sys.exit(main())
