"""The demo behind ``python -m runtime``: a physics skim of synthetic collision events.

What lives here: the task functions of the workflow, :func:`build_graph` (a plain dask
graph), :func:`run_demo` (runs it on an embedded :class:`~runtime.client.Cluster` with a
live progress display), :func:`render_summary` (the closing table) and
:func:`check_against_dask` (the same graph through dask's synchronous scheduler, which
must give an identical result). The command line itself is in ``runtime/__main__.py``.

The workflow has the shape of the skim in seed 002: several homogeneous subgraphs, one
per dataset. Per dataset, every chunk is

    load-<token>       make a chunk of events: two muons each, as 4-vectors (E, px, py, pz)
    transform-<token>  per event: transverse momenta, pseudorapidities and the invariant
                       mass of the pair; keep events whose muons both pass the cut

and the chunks of a dataset are reduced by a tree of ``histogram-<token>`` tasks (fan-in
``fan_in``: the first level fills mass histograms, the others add them up) to one
histogram per dataset; ``merge-<token>`` combines the datasets. Keys carry dask-style
prefixes, so Corral's per-category statistics come out as ``load``, ``transform``,
``histogram`` and ``merge`` (``dask.utils.key_split``).

The events are random but seeded per (seed, dataset, chunk): the same options give the
same result on any scheduler, in any order, which is what ``--check`` verifies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import numpy as np
from dask.base import tokenize
from dask.utils import format_bytes, format_time, key_split
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

__all__ = [
    "DemoCheckError",
    "DemoConfig",
    "DemoRun",
    "add_histograms",
    "build_graph",
    "category_totals",
    "check_against_dask",
    "demo_run_path",
    "fill_histogram",
    "make_events",
    "merge_datasets",
    "physics_summary",
    "prune_demo_runs",
    "render_summary",
    "run_demo",
    "select_events",
]

# ----------------------------------------------------------------------------- physics

Z_MASS = 91.1876  #: GeV, the resonance the signal events come from
Z_WIDTH = 2.4952  #: GeV, its natural width (Breit-Wigner)
RESOLUTION = 0.01  #: relative momentum smearing of the "detector"
PT_CUT = 25.0  #: GeV, both muons need at least this transverse momentum
ETA_CUT = 2.4  #: both muons need |pseudorapidity| below this
MASS_RANGE = (60.0, 120.0)  #: GeV, the histogram range
N_BINS = 60  #: 1 GeV bins

#: Categories in the order they appear in the workflow (for tables and progress bars).
CATEGORIES = ("load", "transform", "histogram", "merge")


def signal_fraction(dataset: int) -> float:
    """Share of resonance decays among the events of ``dataset`` (the rest is background)."""
    return 0.1 + 0.1 * (dataset % 3)


def _massless(px: np.ndarray, py: np.ndarray, pz: np.ndarray) -> np.ndarray:
    """4-vectors (E, px, py, pz) of massless particles, stacked on the last axis."""
    return np.stack([np.sqrt(px * px + py * py + pz * pz), px, py, pz], axis=-1)


def _resonance_decays(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` decays of a Z-like resonance into two muons, shape (n, 2, 4)."""
    mass = np.clip(Z_MASS + 0.5 * Z_WIDTH * rng.standard_cauchy(n), 40.0, 200.0)
    # The parent's momentum in the lab.
    pt = rng.exponential(15.0, n)
    phi = rng.uniform(-math.pi, math.pi, n)
    p = np.stack([pt * np.cos(phi), pt * np.sin(phi), rng.normal(0.0, 60.0, n)], axis=1)
    energy = np.sqrt(mass**2 + np.einsum("ij,ij->i", p, p))
    # Back to back in the rest frame, isotropic.
    cos_t = rng.uniform(-1.0, 1.0, n)
    sin_t = np.sqrt(1.0 - cos_t**2)
    phi_d = rng.uniform(-math.pi, math.pi, n)
    half = mass / 2.0
    k = half[:, None] * np.stack([sin_t * np.cos(phi_d), sin_t * np.sin(phi_d), cos_t], axis=1)
    # Boost both daughters by beta = p / E:  p' = p + (g^2/(g+1) (b.p) + g E) b.
    beta = p / energy[:, None]
    gamma = 1.0 / np.sqrt(1.0 - np.einsum("ij,ij->i", beta, beta))
    out = np.empty((n, 2, 4))
    for i, sign in enumerate((1.0, -1.0)):
        kk = sign * k
        bk = np.einsum("ij,ij->i", beta, kk)
        lab = kk + ((gamma**2 / (gamma + 1.0)) * bk + gamma * half)[:, None] * beta
        lab *= 1.0 + RESOLUTION * rng.standard_normal((n, 1))  # detector smearing
        out[:, i, :] = _massless(lab[:, 0], lab[:, 1], lab[:, 2])
    return out


def _background_pairs(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` pairs of unrelated muons (a falling pT spectrum), shape (n, 2, 4)."""
    pt = 5.0 + rng.exponential(20.0, (n, 2))
    eta = rng.uniform(-3.0, 3.0, (n, 2))
    phi = rng.uniform(-math.pi, math.pi, (n, 2))
    return _massless(pt * np.cos(phi), pt * np.sin(phi), pt * np.sinh(eta))


def make_events(seed: int, dataset: int, chunk: int, n_events: int, fraction: float) -> np.ndarray:
    """The ``load`` task: a chunk of ``n_events`` events, shape (n_events, 2, 4).

    Seeded by ``(seed, dataset, chunk)``: the same arguments give the same events.
    """
    rng = np.random.default_rng([seed, dataset, chunk])
    n_signal = int(rng.binomial(n_events, fraction))
    events = np.concatenate(
        [_resonance_decays(rng, n_signal), _background_pairs(rng, n_events - n_signal)]
    )
    rng.shuffle(events)
    return events


def select_events(events: np.ndarray) -> dict[str, Any]:
    """The ``transform`` task: the pair mass of events whose two muons pass the cut.

    Returns ``{"mass": masses of selected events, "n_events": events looked at}``.
    """
    px, py, pz = events[..., 1], events[..., 2], events[..., 3]
    pt = np.hypot(px, py)
    eta = np.arcsinh(pz / pt)
    passed = np.all(pt > PT_CUT, axis=1) & np.all(np.abs(eta) < ETA_CUT, axis=1)
    pair = events[passed].sum(axis=1)
    m2 = pair[:, 0] ** 2 - pair[:, 1] ** 2 - pair[:, 2] ** 2 - pair[:, 3] ** 2
    return {"mass": np.sqrt(np.clip(m2, 0.0, None)), "n_events": len(events)}


def _histogram(counts: np.ndarray, n_events: int, n_selected: int) -> dict[str, Any]:
    return {"counts": counts, "n_events": int(n_events), "n_selected": int(n_selected)}


def fill_histogram(*selections: dict[str, Any]) -> dict[str, Any]:
    """First level of the reduction: one mass histogram of several selections."""
    masses = np.concatenate([s["mass"] for s in selections])
    counts, _ = np.histogram(masses, bins=N_BINS, range=MASS_RANGE)
    n_events = sum(s["n_events"] for s in selections)
    return _histogram(counts.astype(np.int64), n_events, len(masses))


def add_histograms(*hists: dict[str, Any]) -> dict[str, Any]:
    """Higher levels of the reduction: the sum of several histograms."""
    return _histogram(
        np.sum([h["counts"] for h in hists], axis=0),
        sum(h["n_events"] for h in hists),
        sum(h["n_selected"] for h in hists),
    )


def merge_datasets(*per_dataset: dict[str, Any]) -> dict[str, Any]:
    """The ``merge`` task: every dataset's histogram, and their sum."""
    total = add_histograms(*per_dataset)
    total["datasets"] = tuple(per_dataset)
    total["edges"] = np.linspace(*MASS_RANGE, N_BINS + 1)
    return total


# ----------------------------------------------------------------------------- the graph


@dataclasses.dataclass(frozen=True, slots=True)
class DemoConfig:
    """The size of the workflow."""

    datasets: int = 4  #: homogeneous subgraphs
    chunks: int = 48  #: load -> transform chains per dataset
    events: int = 10_000  #: events per chunk
    fan_in: int = 8  #: inputs per histogram task
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("datasets", "chunks", "events"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.fan_in < 2:
            raise ValueError(f"--fan-in must be at least 2, got {self.fan_in}")


def build_graph(cfg: DemoConfig) -> tuple[dict[Any, Any], str]:
    """The workflow as a dask graph (tuples with callables); returns it and its final key."""
    token = tokenize("corral-demo", dataclasses.astuple(cfg))
    load, transform, hist = f"load-{token}", f"transform-{token}", f"histogram-{token}"
    final = f"merge-{token}"
    graph: dict[Any, Any] = {}
    per_dataset = []
    for d in range(cfg.datasets):
        level: list[Any] = []
        fraction = signal_fraction(d)
        for c in range(cfg.chunks):
            graph[(load, d, c)] = (make_events, cfg.seed, d, c, cfg.events, fraction)
            graph[(transform, d, c)] = (select_events, (load, d, c))
            level.append((transform, d, c))
        func: Any = fill_histogram
        depth = 0
        while True:  # a tree: fill from the selections, then add up, fan_in at a time
            nxt = []
            for i in range(0, len(level), cfg.fan_in):
                key = (hist, d, depth, i // cfg.fan_in)
                graph[key] = (func, *level[i : i + cfg.fan_in])
                nxt.append(key)
            level, func, depth = nxt, add_histograms, depth + 1
            if len(level) == 1:
                break
        per_dataset.append(level[0])
    graph[final] = (merge_datasets, *per_dataset)
    return graph, final


def category_totals(graph: Mapping[Any, Any]) -> dict[str, int]:
    """Tasks per category (key prefix), in workflow order."""
    counts = Counter(key_split(k) for k in graph)
    order = [c for c in CATEGORIES if c in counts] + sorted(set(counts) - set(CATEGORIES))
    return {c: counts[c] for c in order}


# ----------------------------------------------------------------------------- running


@dataclasses.dataclass(slots=True)
class DemoRun:
    """What a run produced and measured."""

    config: DemoConfig
    graph: dict[Any, Any]
    final: str
    result: dict[str, Any]
    status: dict[str, Any]  #: ``cluster.status()`` right after the result came back
    totals: dict[str, int]  #: tasks per category in the graph
    workers: int
    threads: int
    startup: float  #: seconds to start the cluster
    wall: float  #: seconds from submitting the graph to having the result
    processes: bool = False  #: workers were separate processes
    monitoring: str | None = None  #: the monitoring database it wrote (None: none)
    #: the demo runs kept in the run directory's parent (0: none pruned there)
    runs_kept: int = 0
    runs_removed: int = 0  #: older demo runs removed after this one


def _progress_bars(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description:>10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]:>13}"),
        TimeElapsedColumn(),
        console=console,
        refresh_per_second=10,
    )


def _update_bars(
    progress: Progress,
    bars: dict[str, TaskID],
    totals: dict[str, int],
    status: Mapping[str, Any],
    elapsed: float,
) -> None:
    cats = status.get("categories", {})
    done_all = 0
    for cat, total in totals.items():
        # ``count`` is cumulative: a recomputed task counts again, so clamp.
        done = min(int(cats.get(cat, {}).get("count", 0)), total)
        done_all += done
        progress.update(bars[cat], completed=done)
    rate = f"{done_all / elapsed:,.0f} tasks/s" if elapsed > 0 else ""
    progress.update(bars["all"], completed=done_all, rate=rate)


async def _poll(
    cluster: Any,
    progress: Progress,
    bars: dict[str, TaskID],
    totals: dict[str, int],
    t0: float,
    every: float,
) -> None:
    while True:
        status = await cluster.status()
        _update_bars(progress, bars, totals, status, time.perf_counter() - t0)
        await anyio.sleep(every)


async def run_demo(
    cfg: DemoConfig,
    *,
    workers: int = 2,
    threads: int = 1,
    progress_console: Console | None = None,
    poll_every: float = 0.1,
    processes: bool = False,
    monitoring: str | os.PathLike[str] | None = None,
    monitoring_interval: float = 0.25,
) -> DemoRun:
    """Build the graph and run it on an in-process cluster; return what happened.

    With ``progress_console`` a live progress display (per category and in total) is
    drawn there, updated by polling ``cluster.status()`` every ``poll_every`` seconds.
    ``monitoring``: the monitoring database to write, every ``monitoring_interval``
    seconds (a short run: more often than a manager's default).
    """
    from runtime.client import GC_THRESHOLD, Cluster

    if workers < 1:
        raise ValueError(f"--workers must be at least 1, got {workers}")
    if threads < 1:
        raise ValueError(f"--threads must be at least 1, got {threads}")
    graph, final = build_graph(cfg)
    totals = category_totals(graph)
    t_start = time.perf_counter()
    options: dict[str, Any] = {"processes": workers} if processes else {"workers": workers}
    if monitoring is not None:
        options.update(monitoring=monitoring, monitoring_interval=monitoring_interval)
    # A program of its own, not a library: it asks for the collector tuning (as before).
    async with Cluster(threads_per_worker=threads, gc_threshold=GC_THRESHOLD, **options) as cluster:
        await cluster.wait_for_workers(workers)
        t0 = time.perf_counter()
        startup = t0 - t_start
        with contextlib.ExitStack() as stack:
            progress: Progress | None = None
            bars: dict[str, TaskID] = {}
            if progress_console is not None:
                progress = stack.enter_context(_progress_bars(progress_console))
                bars = {c: progress.add_task(c, total=n, rate="") for c, n in totals.items()}
                bars["all"] = progress.add_task("all", total=len(graph), rate="")
            async with anyio.create_task_group() as tg:
                if progress is not None:
                    tg.start_soon(_poll, cluster, progress, bars, totals, t0, poll_every)
                try:
                    (future,) = await cluster.submit_graph(graph, [final])
                    # root_errors: a failed task's own exception, not DependencyFailed.
                    (result,) = await cluster.gather([future], root_errors=True)
                finally:
                    tg.cancel_scope.cancel()
            wall = time.perf_counter() - t0
            # Statistics while the client still holds the result: what the registry
            # pruned by now are the intermediates.
            status = await cluster.status()
            future.release()
            if progress is not None:
                _update_bars(progress, bars, totals, status, wall)
    return DemoRun(
        cfg, graph, final, result, status, totals, workers, threads, startup, wall, processes,
        None if monitoring is None else str(monitoring),
    )  # fmt: skip


# ----------------------------------------------------------------------------- run directories

#: the name of a demo's run directory (``default_path``'s, with ``-demo`` after it)
_DEMO_RUN = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}-demo")


def demo_run_path() -> Path:
    """A new run directory's database for the demo: as a manager's
    (:func:`runtime.monitordb.default_path`, under ``$CORRAL_RUNS_DIR`` or
    ``$CORRAL_HOME/runs``), named ``<UTC time>-<id>-demo`` so that
    :func:`prune_demo_runs` knows it from a manager's."""
    from runtime.monitordb import default_path

    path = default_path()
    return path.parent.with_name(f"{path.parent.name}-demo") / path.name


def prune_demo_runs(current: Path, keep: int) -> list[Path]:
    """Remove the oldest demo run directories beside ``current`` (this run's database,
    from :func:`demo_run_path`), so that the newest ``keep`` remain, this one among
    them; the directories removed. Only directories named as a demo's are counted and
    removed, and only those holding nothing but a monitoring database (a manager's
    run, an older Corral's demo run, one where a file was put: left alone); one that
    cannot be removed is left too."""
    from runtime.monitordb import remove_run_dir, run_dirs

    others = [d for d in run_dirs(current.parent.parent, _DEMO_RUN) if d != current.parent]
    # (names sort by time)
    return [d for d in others[: max(0, len(others) - (keep - 1))] if remove_run_dir(d)]


# ----------------------------------------------------------------------------- summary


def physics_summary(result: Mapping[str, Any]) -> dict[str, float]:
    """Numbers that show real work happened: events, selection, the mass peak."""
    counts = np.asarray(result["counts"])
    edges = np.asarray(result["edges"])
    centers = (edges[:-1] + edges[1:]) / 2
    peak = int(np.argmax(counts)) if counts.size else 0
    window = (centers > Z_MASS - 10) & (centers < Z_MASS + 10)
    in_window = counts[window].sum()
    mean = float((counts[window] * centers[window]).sum() / in_window) if in_window else math.nan
    return {
        "n_events": result["n_events"],
        "n_selected": result["n_selected"],
        "in_range": int(counts.sum()),
        "peak_low": float(edges[peak]),
        "peak_high": float(edges[peak + 1]),
        "peak_count": int(counts[peak]) if counts.size else 0,
        "window_mean": mean,
    }


_SPARKS = " ▁▂▃▄▅▆▇█"


def sparkline(counts: np.ndarray) -> str:
    """The histogram as one line of block characters."""
    top = counts.max() if len(counts) else 0
    if top <= 0:
        return " " * len(counts)
    return "".join(_SPARKS[round(c / top * (len(_SPARKS) - 1))] for c in counts)


def render_summary(run: DemoRun, console: Console) -> None:
    """Print the closing table (per category) and the run's totals and physics."""
    cats = run.status.get("categories", {})
    table = Table(title="Corral demo: physics skim", title_justify="left")
    table.add_column("category")
    table.add_column("tasks", justify="right")
    table.add_column("mean", justify="right")
    table.add_column("max", justify="right")
    table.add_column("peak RSS", justify="right")
    table.add_column("output", justify="right")
    show_failures = any(s.get("errors") or s.get("lost") for s in cats.values())
    if show_failures:
        table.add_column("errors", justify="right")
        table.add_column("lost", justify="right")
    done = nbytes = 0
    peak_rss = 0
    for cat in list(run.totals) + sorted(set(cats) - set(run.totals)):
        s = cats.get(cat, {})
        count = int(s.get("count", 0))
        done += count
        nbytes += int(s.get("total_nbytes", 0))
        peak_rss = max(peak_rss, int(s.get("peak_rss", 0)))
        row = [
            cat,
            f"{count:,}",
            format_time(s.get("mean_duration", 0.0)),
            format_time(s.get("max_duration", 0.0)),
            format_bytes(int(s.get("peak_rss", 0))),
            format_bytes(int(s.get("total_nbytes", 0))),
        ]
        if show_failures:
            row += [str(int(s.get("errors", 0))), str(int(s.get("lost", 0)))]
        table.add_row(*row)
    table.add_section()
    total_row = ["total", f"{done:,}", "", "", format_bytes(peak_rss), format_bytes(nbytes)]
    table.add_row(*(total_row + (["", ""] if show_failures else [])), style="bold")
    console.print(table)

    rate = len(run.graph) / run.wall if run.wall > 0 else math.inf
    phys = physics_summary(run.result)
    share = phys["n_selected"] / phys["n_events"] if phys["n_events"] else 0.0
    files = run.status.get("files", {})
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row(
        "wall time", f"{run.wall:.2f} s for {len(run.graph):,} tasks ({rate:,.0f} tasks/s)"
    )
    grid.add_row(
        "cluster",
        f"{cluster_text(run.workers, run.threads, run.processes)}, started in "
        f"{run.startup * 1000:.0f} ms",
    )
    grid.add_row(
        "registry",
        f"pruned {files.get('released', 0):,} intermediates once consumed "
        f"({format_bytes(int(files.get('released_bytes', 0)))})",
    )
    grid.add_row(
        "events",
        f"{phys['n_events']:,} in {run.config.datasets} dataset(s); "
        f"{phys['n_selected']:,} ({share:.1%}) pass the cut",
    )
    grid.add_row("cut", f"both muons pT > {PT_CUT:g} GeV and |eta| < {ETA_CUT:g}")
    if phys["in_range"]:
        peak = (
            f"bin [{phys['peak_low']:g}, {phys['peak_high']:g}) GeV, {phys['peak_count']:,} "
            "events; mean within Z+-10 GeV: "
            + (f"{phys['window_mean']:.2f} GeV" if math.isfinite(phys["window_mean"]) else "n/a")
        )
    else:
        peak = f"no selected event in {MASS_RANGE[0]:g}-{MASS_RANGE[1]:g} GeV"
    grid.add_row("mass peak", peak)
    console.print(grid, highlight=False)
    spark = sparkline(np.asarray(run.result["counts"]))
    console.print(f"{MASS_RANGE[0]:g} GeV |{spark}| {MASS_RANGE[1]:g} GeV", highlight=False)
    if run.monitoring is not None:
        console.print(f"monitoring database: {run.monitoring}", highlight=False, soft_wrap=True)
        console.print(
            f"report: python -m runtime report {run.monitoring} -o report.html",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
        if run.runs_kept:
            where = Path(run.monitoring).parent.parent
            removed = f"removed {run.runs_removed} older, " if run.runs_removed else ""
            console.print(
                f"demo runs: {removed}keeping the newest {run.runs_kept} in {where} (--keep-runs "
                "N; 0 keeps all; a manager's runs are never removed)",
                highlight=False, soft_wrap=True,
            )  # fmt: skip
    console.print(next_step(run.processes), highlight=False, soft_wrap=True)


#: the demo's last line after a run on worker processes: across machines is what is left
NEXT_ACROSS_MACHINES = (
    "across machines: python -m runtime manager --listen 0.0.0.0:8786, and on each machine "
    "python -m runtime worker ws://HOST:8786 --token-file ~/.corral/worker.token (the "
    "worker token of the manager's token file, in a file of mode 0600; tokens, hosts: "
    "docs/deployment.md)"
)

#: the demo's last line after an in-process run: worker processes first, then machines
NEXT_STEP = (
    "next: the demo on worker processes: python -m runtime --workers 4; " + NEXT_ACROSS_MACHINES
)


def next_step(processes: bool) -> str:
    """The demo's last line: what to try next, not what this run just did (a run on worker
    processes, ``--workers N``, is not told to run on worker processes)."""
    return "next: " + NEXT_ACROSS_MACHINES if processes else NEXT_STEP


def cluster_text(workers: int, threads: int, processes: bool) -> str:
    """``2 in-process workers x 1 thread``, ``4 worker processes x 2 threads``."""
    kind = ("worker process" if processes else "in-process worker") + (
        "es" if processes and workers != 1 else "s" if workers != 1 else ""
    )
    return f"{workers} {kind} x {threads} thread{'s' if threads != 1 else ''}"


# ----------------------------------------------------------------------------- checking


class DemoCheckError(AssertionError):
    """Corral's result differs from dask's synchronous scheduler's."""


def _compare(a: Any, b: Any, where: str) -> str | None:
    """``None`` if ``a`` and ``b`` are identical (arrays bit for bit), else where not."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
            return f"{where}: {type(a).__name__} vs {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
            return f"{where}: arrays differ in {int(np.sum(a != b))} element(s)"
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            diff = _compare(a[k], b[k], f"{where}[{k!r}]")
            if diff:
                return diff
        return None
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        if type(a) is not type(b) or len(a) != len(b):
            return f"{where}: {type(a).__name__} of {len(a)} vs {type(b).__name__} of {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            diff = _compare(x, y, f"{where}[{i}]")
            if diff:
                return diff
        return None
    if type(a) is not type(b) or a != b:
        return f"{where}: {a!r} vs {b!r}"
    return None


def check_against_dask(graph: Mapping[Any, Any], key: Any, result: Any) -> Any:
    """Compute ``key`` of ``graph`` with ``dask.compute(..., scheduler="sync")`` and
    compare it with ``result`` (Corral's); raise :class:`DemoCheckError` naming the first
    difference. Returns dask's result."""
    import dask
    from dask.delayed import Delayed

    (expected,) = dask.compute(Delayed(key, dict(graph)), scheduler="sync")
    diff = _compare(result, expected, "result")
    if diff is not None:
        raise DemoCheckError(f"Corral's result differs from dask's sync scheduler: {diff}")
    return expected
