"""Files on worker disks (issue 13): pruning and replicas on a physics-style workflow,
on real worker processes.

The workflow is many homogeneous subgraphs, one per dataset: each of its ``files``
files is loaded (``load``: a seeded array, ``nbytes``), skimmed (``skim``: the values
above 0.75, about a quarter) and the skims of a dataset are merged (``merge``: their
sum). Only the merges are wanted. The expected sums are computed here in this process,
so every run is checked.

Each run is a ``Cluster(processes=N)`` of one-thread worker processes that spill every
output to disk (a spill fence far below a worker's resting memory), each with a
monitoring database; the ``consumers-first`` priority (docs/files.md). Measured:

(a) **peak per-worker disk**, pruning (``prune_depth=1``) against none
    (``prune_depth=0``), without replicas and without a loss: the most bytes of outputs
    any worker reported on its disk (the scheduler's ``status()["storage"]``, every
    report of the workers; the monitoring database's samples are checked not to
    exceed it). The issue's target: pruning's peak <= 60% of no pruning's.
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
import importlib.util
import json
import os
import random
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

if __name__ != "__main__":  # loaded by a test: the tasks travel by value to the workers
    cloudpickle.register_pickle_by_value(sys.modules[__name__])

TARGET_DISK = 0.60  #: the issue's target: pruned peak / unpruned peak


# ----------------------------------------------------------------------------- tasks


def load(dataset: int, file: int, seed: int, nbytes: int, seconds: float) -> Any:
    """Read one file of a dataset: a seeded array of ``nbytes``."""
    time.sleep(seconds)
    rng = np.random.default_rng([seed, dataset, file])
    return rng.random(nbytes // 8)


def skim(events: Any, seconds: float) -> Any:
    """Keep the events that pass the cut (about a quarter)."""
    time.sleep(seconds)
    return events[events > 0.75]


def merge(*skims: Any) -> float:
    return float(sum(float(s.sum()) for s in skims))


@dataclasses.dataclass(frozen=True)
class Workflow:
    datasets: int = 20
    files: int = 10
    seed: int = 1
    load_s: float = 0.1
    skim_s: float = 0.03
    nbytes: int = 256 * 1024

    @property
    def n_files(self) -> int:
        return self.datasets * self.files

    @property
    def wanted(self) -> list[str]:
        return [f"merge-{d}" for d in range(self.datasets)]

    def graph(self) -> dict[Hashable, Any]:
        g: dict[Hashable, Any] = {}
        for d in range(self.datasets):
            for f in range(self.files):
                g[f"load-{d}-{f}"] = (load, d, f, self.seed, self.nbytes, self.load_s)
                g[f"skim-{d}-{f}"] = (skim, f"load-{d}-{f}", self.skim_s)
            g[f"merge-{d}"] = (merge, *[f"skim-{d}-{f}" for f in range(self.files)])
        return g

    def expected(self) -> dict[str, float]:
        out = {}
        for d in range(self.datasets):
            skims = [skim(load(d, f, self.seed, self.nbytes, 0), 0) for f in range(self.files)]
            out[f"merge-{d}"] = merge(*skims)
        return out


@dataclasses.dataclass
class Result:
    makespan: float
    correct: bool
    peak_disk: int  #: most bytes on one worker's disk (its reports)
    peak_disk_db: int  #: the same from the database's samples
    recomputes: int  #: ok tries beyond the first of each task
    recoveries: dict[str, int]
    transfers: dict[str, int]
    copied: int  #: bytes copied between workers (fetches, replicas, evacuations)
    killed: str | None
    status: dict[str, Any] = dataclasses.field(repr=False)
    db: Path | None = None


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
    after the one before was seen; ``killed`` names the workers lost, by ``,``)."""
    from runtime import Cluster

    if monitoring is None:
        monitoring = Path(tempfile.mkdtemp(prefix="corral-files-")) / "monitoring.db"
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
            memory_options={"spill": 0.01, "throttle": 0.9, "terminate": None},
            disk_per_worker="512MiB",
            prune_depth=prune_depth,
            policies=policies,
            monitoring=monitoring,
            monitoring_interval=0.2,
        ) as c:
            await c.wait_for_workers(workers)
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
            status = await c.status()
    got = dict(zip(wf.wanted, values, strict=True))
    storage = status["storage"]
    peak = max((w["disk_peak"] for w in storage["workers"].values()), default=0)
    conn = sqlite3.connect(monitoring)
    try:
        (peak_db,) = conn.execute("SELECT coalesce(max(spilled_bytes), 0) FROM resource_samples"
                                  ).fetchone()  # fmt: skip
        (recomputes,) = conn.execute(
            "SELECT count(*) - count(DISTINCT key) FROM tries WHERE outcome = 'ok'"
        ).fetchone()
    finally:
        conn.close()
    return Result(
        makespan, got == expected, peak, int(peak_db), int(recomputes),
        dict(storage["recoveries"]), dict(storage["transfers"]),
        sum(storage["transfer_bytes"].values()), ",".join(killed) or None,
        status, monitoring,
    )  # fmt: skip


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
    from runtime import Cluster

    markers = tempfile.mkdtemp(prefix="corral-tail-")
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
    disk_ratio = p1.peak_disk / p0.peak_disk if p0.peak_disk else float("nan")
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
            }
            for name, r in runs.items()
        },
        "disk_ratio": round(disk_ratio, 3),
        "disk_target_met": disk_ratio <= TARGET_DISK,
        "makespan_ratio_replicas": round(rep.makespan / none.makespan, 3),
        "loss_cost_replicas_s": round(rep.makespan - base_rep.makespan, 2),
        "loss_cost_no_replicas_s": round(none.makespan - base.makespan, 2),
    }


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
    return 0 if t["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
