"""Pre-flight checks: what ``python -m runtime check --config corral.toml`` says before
anything is submitted, and what the manager logs as warnings when it starts with pools.

What lives here: :class:`CheckResult` (one check of one pool: PASS, WARN or FAIL, what
was seen and what to do), the checks as functions that return them, and
:func:`run_checks` (all of them, in order) and :func:`log_quick_checks` (the ones that
submit nothing, as warnings, for the manager's start).

The checks:

- ``batch system``: the Slurm commands are installed and the controller answers
  (``sinfo``; ``scontrol ping`` to tell a controller that is down).
- ``partition``: each Slurm pool's partition exists; its state (up, drain, down,
  inactive) and its nodes (idle, allocated, down, drained).
- ``test-only``: ``sbatch --test-only`` of the pool's own block script (the one
  :func:`actors.slurm.batch_script` writes for a block): accepted, with Slurm's estimated
  start, or refused, with Slurm's reason. ``account/qos``: whether this cluster checks the
  pool's account and QOS at all (``AccountingStorageEnforce``).
- ``probe``: a short job on the pool's partition with its options and ``worker_init``,
  whose script is a block's with one "worker" that imports Corral and prints Python's,
  Corral's and dask's versions as JSON to its output file; a ``local`` pool runs the same
  code in a subprocess (``sys.executable -c``). A version that differs from the manager's
  (Python's major.minor, Corral's, dask's) is a FAIL naming both sides.
- ``accelerators``: a local pool's ``accelerators`` are devices of this machine
  (``nvidia-smi -L`` lists them, or at least a device node shows an accelerator), and
  within this process's ``CUDA_VISIBLE_DEVICES`` when it has one.
- ``drain``: how long before its walltime each pool with one has its workers drained;
  a WARN when, without a ``drain_period``, the default margin would be capped at half
  a short walltime. ``signal warning``: a WARN for a Slurm pool whose
  ``signal_warning`` is not shorter than its drain (the SIGTERM comes first and cuts
  the running tasks).
- ``any-pool tasks``: with two pools or more, a WARN for each pool at ``min_blocks = 0``
  that tasks of no pool may run on (``any_pool_tasks``, the default): they scale it
  (:func:`check_any_pool`); and one when every pool has ``any_pool_tasks = false``:
  a task without ``pool=`` could never run.
- ``memory limit``: a WARN for each pool that sets ``memory_per_worker`` with thread
  execution (the default), where the limit is not enforced on a task (only
  ``execution = "process"`` kills a task past it).
- ``gpus``: each Slurm pool with ``accelerators`` asks Slurm for GPUs (``--gres=gpu:N``
  or ``--gpus...`` in its ``scheduler_options``: a WARN when not), at least as many a
  node as its workers there are pinned to (a FAIL when fewer: each block would end
  before its workers start).
- ``policies``: the ``[policies]`` table, loaded as the manager loads it
  (:func:`actors.pools.load_policies`: each policy made once, with its parameters); a
  name that is not built in cannot be checked without the ``--policy-module`` that
  registers it, and fails saying so.
- ``directory``: the run, spill and output directories exist or can be created, and have
  room: free space against the pools' ``memory_per_worker`` x workers (a conservative
  guess at what may be spilled).
- ``alertmanager``: the ``[alerting] alertmanager`` URL answers (:func:`check_alertmanager`:
  one bounded GET of ``URL/-/ready``); a WARN saying why not. The manager's alert monitor
  runs the same probe once as it starts, in the background (``runtime/monitor.py``).

Synchronous (``subprocess``): the command runs them directly; the manager runs them in a
thread once it listens (:func:`log_quick_checks`), and stops a command still running when
it stops. A command that does not answer within its time limit is killed (with what it
started) and the check says which one, what it printed first and what to look at.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc
import anyio.to_thread

from actors.pools import PoolConfig, load_policies, local_workers
from actors.providers import ACCELERATOR_VARIABLES, BlockSpec
from actors.scheduler_records import SchedulerConfig
from actors.slurm import (
    SQUEUE_FORMAT,
    TOO_FEW_GPUS,
    WORKER_INIT_FAILED,
    SlurmOptions,
    batch_script,
    block_state,
    exit_text,
    gpus_asked,
    head_tail,
    own_lines_advice,
    parse_scontrol_job,
    parse_squeue,
    run_dir_problem,
)
from actors.worker import host_cpus
from policies.base import PolicyRegistry
from runtime.errors import (
    AlertConfigError,
    BatchSystemError,
    CorralError,
    PolicyConfigError,
    PoolConfigError,
    Refusals,
    UnknownPolicyError,
    did_you_mean,
    size_text,
)
from runtime.log import get_logger
from runtime.messages import PROTOCOL_VERSION

__all__ = [
    "ALERTMANAGER_ADVICE",
    "ALERTMANAGER_TIMEOUT",
    "FAIL",
    "PASS",
    "PROBE_CODE",
    "WARN",
    "CheckResult",
    "Partition",
    "Versions",
    "check_alertmanager",
    "check_batch_system",
    "check_directories",
    "check_drain",
    "check_gpus",
    "check_local",
    "check_memory_limit",
    "check_partition",
    "check_policies",
    "check_run_dir",
    "check_signal_warning",
    "check_test_only",
    "compare_versions",
    "exit_code",
    "log_quick_checks",
    "parse_probe_output",
    "parse_test_only",
    "probe_alertmanager",
    "probe_slurm_pools",
    "quick_checks_service",
    "refused",
    "render",
    "run_checks",
]

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"
ALL = "*"  #: the pool of a check that is about the whole configuration

_log = get_logger("corral", component="preflight")

#: What a probe prints (one line) before its JSON.
PROBE_MARK = "CORRAL-PROBE "

#: What a probe runs: import Corral and dask the way a worker does; print the versions,
#: the protocol version too (``PROTOCOL_VERSION``, in runtime/messages.py, and in
#: runtime/node.py in the first checkouts that had one: two checkouts of one release
#: differ only there; absent in a Corral from before them, which the manager counts as
#: protocol 0).
PROBE_CODE = (
    "import json, os, platform, sys\n"
    "out = {'python': platform.python_version(), 'executable': sys.executable}\n"
    # the accelerator this worker's line pinned it to, as a worker tells it (its first
    # accelerator variable set), and the GPUs Slurm gave the job (SLURM_JOB_GPUS)
    f"out['accelerator'] = next((os.environ[k] for k in {ACCELERATOR_VARIABLES!r} "
    "if os.environ.get(k)), '')\n"
    "out['job_gpus'] = os.environ.get('SLURM_JOB_GPUS', '')\n"
    "try:\n"
    "    import dask, runtime, runtime.messages\n"
    "    out.update(corral=runtime.__version__, dask=dask.__version__)\n"
    "    protocol = getattr(runtime.messages, 'PROTOCOL_VERSION', None)\n"
    "    if protocol is None:\n"
    "        import runtime.node\n"
    "        protocol = getattr(runtime.node, 'PROTOCOL_VERSION', 0)\n"
    "    out['protocol'] = protocol\n"
    "except Exception as exc:\n"
    "    out['error'] = f'{type(exc).__name__}: {exc}'\n"
    f"print({PROBE_MARK!r} + json.dumps(out), flush=True)\n"
)

#: less free space than this, or than a hundredth of its size if that is less: the file
#: system is full (a small file system with room is not: it may be too small, a WARN)
_FULL = 100 * 2**20


@dataclasses.dataclass(frozen=True, slots=True)
class CheckResult:
    """One check of one pool (``pool`` is ``"*"`` for the whole configuration)."""

    pool: str
    check: str
    status: str  #: PASS, WARN or FAIL
    detail: str  #: what was seen
    advice: str = ""  #: what to do (empty on PASS)

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def exit_code(results: Sequence[CheckResult]) -> int:
    """0 when no check failed, 1 otherwise."""
    return 1 if any(r.status == FAIL for r in results) else 0


def render(results: Sequence[CheckResult]) -> str:
    """The results as text: one line per check, its advice indented below."""
    if not results:
        return "no checks to run\n"
    pw = max(len(r.pool) for r in results)
    cw = max(len(r.check) for r in results)
    lines = []
    for r in results:
        lines.append(f"{r.status}  {r.pool:<{pw}}  {r.check:<{cw}}  {r.detail}")
        if r.advice:
            lines.append(f"      {'':<{pw}}  {'':<{cw}}  -> {r.advice}")
    fails = sum(r.status == FAIL for r in results)
    warns = sum(r.status == WARN for r in results)
    lines.append(f"{len(results)} checks: {fails} failed, {warns} warnings")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- versions


@dataclasses.dataclass(frozen=True, slots=True)
class Versions:
    """The versions a worker must share with the manager."""

    python: str
    corral: str
    dask: str
    protocol: int = PROTOCOL_VERSION  #: what a manager and its peers speak (Hello)

    @classmethod
    def here(cls) -> Versions:
        import dask

        # The package `runtime` (loaded before this module) re-exports the user API:
        # its version is read from the loaded module, not imported from this layer.
        corral = str(sys.modules["runtime"].__version__)
        return cls(platform.python_version(), corral, str(dask.__version__), PROTOCOL_VERSION)


def parse_probe_output(text: str) -> dict[str, Any] | None:
    """The probe's report (the last line it marked), or None if it printed none."""
    reports = parse_probe_reports(text)
    return reports[-1] if reports else None


def parse_probe_reports(text: str) -> list[dict[str, Any] | None]:
    """Every report the probe's workers printed (a marked line each, in order; None for
    a marked line that is not a JSON object)."""
    out: list[dict[str, Any] | None] = []
    for line in text.splitlines():
        if line.startswith(PROBE_MARK):
            try:
                data = json.loads(line[len(PROBE_MARK) :])
            except ValueError:
                data = None
            out.append(data if isinstance(data, dict) else None)
    return out


def judge_probe_gpus(pool: PoolConfig, reports: Sequence[dict[str, Any] | None]) -> tuple[str, str]:
    """A Slurm pool with ``accelerators``: what its probe job's workers (one per worker a
    node, each on its block script's line) were pinned to, as text for the probe's
    detail, and what is wrong with it ("" when each took a GPU of its own)."""
    devices = sorted(str((r or {}).get("accelerator", "")) for r in reports)
    given = next((str(r.get("job_gpus")) for r in reports if r and r.get("job_gpus")), "")
    seen = (
        f"its {len(devices)} worker(s) pinned to GPU(s) {', '.join(d or '-' for d in devices)}"
        + (
            f" (Slurm gave the job the GPUs {given})"
            if given
            else " (Slurm named no GPU of the job)"
        )
    )
    wrong = ""
    if len(devices) < pool.workers_per_node:
        short = pool.workers_per_node - len(devices)
        wrong = f"{short} of its {pool.workers_per_node} workers printed no report"
    elif "" in devices:
        wrong = f"{devices.count('')} of its workers were pinned to no accelerator"
    elif len(set(devices)) < len(devices):
        twice = sorted({d for d in devices if devices.count(d) > 1})
        wrong = f"two workers of the node were pinned to one GPU ({', '.join(twice)})"
    return seen, wrong


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def compare_versions(mine: Versions, probe: Mapping[str, Any]) -> list[str]:
    """What differs between the manager (``mine``) and a probe's report: one text per
    mismatch naming both sides (Python by major.minor, Corral and dask exactly, and the
    protocol version: a report without one is of a Corral from before protocol
    versions, protocol 0). Two checkouts of one release say the same Corral version;
    only their protocol versions tell them apart, and the manager refuses workers of
    another one at their Hello."""
    out = []
    theirs = str(probe.get("python", "?"))
    if _minor(theirs) != _minor(mine.python):
        out.append(f"Python {theirs} on the workers, {mine.python} in the manager")
    for key, name, ours in (("corral", "Corral", mine.corral), ("dask", "dask", mine.dask)):
        got = str(probe.get(key, "?"))
        if got != ours:
            out.append(f"{name} {got} on the workers, {ours} in the manager")
    protocol = probe.get("protocol", 0)
    if protocol != mine.protocol:
        if not isinstance(protocol, int):
            age, todo = "another", "install the manager's Corral where the workers run"
        elif protocol < mine.protocol:
            age, todo = "an older", "install the manager's Corral where the workers run"
        else:
            age, todo = "a newer", "upgrade the manager first, or give the workers its Corral"
        out.append(
            f"Corral protocol {protocol} on the workers, {mine.protocol} in the manager: "
            f"the workers run {age} Corral checkout than the manager, which would refuse "
            f"them at their Hello; {todo}"
        )
    return out


_NAMES = (("python", "Python"), ("corral", "Corral"), ("dask", "dask"), ("protocol", "protocol"))


def _judge_probe(
    pool: str, report: dict[str, Any] | None, where: str, log: str, gpus: tuple[str, str] = ("", "")
) -> CheckResult:
    """The probe check's result from what the probe printed (None: nothing); ``gpus``:
    what :func:`judge_probe_gpus` saw of a pool with accelerators, and what is wrong."""
    if report is None:
        advice = (
            "A command of the pool's worker_init failed on the node (its stderr above): "
            "fix it, or end a command that may fail with `|| true`."
            if WORKER_INIT_FAILED in log
            else "The worker's Python does not start there: check that the manager's "
            "Python path exists on the nodes, and what the pool's worker_init sets."
        )
        return CheckResult(
            pool, "probe", FAIL,
            f"the probe printed no report ({where})" + (f":\n{head_tail(log)}" if log else ""),
            advice,
        )  # fmt: skip
    if "error" in report:
        return CheckResult(
            pool, "probe", FAIL,
            f"{report.get('executable', '?')} could not import Corral: {report['error']}",
            "Install Corral (the manager's version) into that Python, the manager's, "
            "which the workers run, or put it on PYTHONPATH in worker_init.",
        )  # fmt: skip
    mine = Versions.here()
    wrong = compare_versions(mine, report)
    seen = ", ".join(f"{n} {report.get(k)}" for k, n in _NAMES)
    if wrong:
        return CheckResult(
            pool, "probe", FAIL, f"version mismatch: {'; '.join(wrong)} ({where})",
            "Workers must run the manager's versions: install the same Corral and dask "
            "(Corral of the same release and checkout: the same protocol; a Python of "
            "the same major.minor) where the workers run, or fix what worker_init puts "
            "on PYTHONPATH or which venv it activates (docs/deployment.md, Upgrading "
            "Corral).",
        )  # fmt: skip
    pinned, wrong_gpus = gpus
    if wrong_gpus:
        return CheckResult(
            pool, "probe", FAIL, f"{seen}, as in the manager, but {wrong_gpus}: {pinned} ({where})",
            "Each worker of the pool is pinned to a GPU of its own job: give the pool as "
            "many accelerators as workers_per_node and ask Slurm for that many GPUs a node "
            "(#SBATCH --gres=gpu:N in scheduler_options); see the probe's .err "
            "(docs/deployment.md#gpus).",
        )  # fmt: skip
    return CheckResult(
        pool, "probe", PASS,
        f"{seen}, as in the manager" + (f"; {pinned}" if pinned else "") + f" ({where})",
    )  # fmt: skip


def check_local(pool: PoolConfig, timeout: float = 60.0) -> CheckResult:
    """A ``local`` pool: the worker's Python (``sys.executable``) imports Corral and
    reports the manager's versions."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE_CODE], capture_output=True, text=True, timeout=timeout
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return CheckResult(
            pool.name, "probe", FAIL, f"{sys.executable} did not run: {exc}",
            "Check that this Python starts (it is the one local workers run).",
        )  # fmt: skip
    report = parse_probe_output(done.stdout)
    return _judge_probe(pool.name, report, f"local, {sys.executable}", done.stderr)


#: ``nvidia-smi -L``'s lines: a GPU (its index and UUID) or a MIG device (its UUID)
_GPU_LINE = re.compile(r"^\s*(?:GPU (\d+):|MIG .*?Device\s+\d+:).*\(UUID: ([^)\s]+)\)")


def check_accelerators(
    pool: PoolConfig,
    timeout: float = 20.0,
    path: str | None = None,
    dev: Path = Path("/dev"),
    environ: Mapping[str, str] = os.environ,
) -> CheckResult | None:
    """A ``local`` pool with ``accelerators``: its device ids are this machine's. With
    ``nvidia-smi`` on ``path`` (None: ``PATH``), each id must be a GPU index or a GPU or
    MIG UUID it lists (FAIL naming the missing ones and the ones there); without it, a
    WARN when ``dev`` shows no accelerator at all (no ``nvidiaN``, ``kfd`` (ROCm) nor
    ``dri/renderD*``), since the workers would then be pinned to devices that are not
    there. A WARN too when this process runs limited to some GPUs
    (``CUDA_VISIBLE_DEVICES`` in ``environ``) that the ids go beyond: each worker's own
    id replaces that list, so it names a device of the whole machine. None: no such
    pool."""
    if pool.provider != "local" or not pool.accelerators:
        return None
    ids = list(pool.accelerators)
    where = f"accelerators = {ids} in [pools.{pool.name}]"
    limited = environ.get("CUDA_VISIBLE_DEVICES", "")
    allowed = [d.strip() for d in limited.split(",") if d.strip()]
    beyond = [i for i in ids if allowed and i not in allowed]
    smi = shutil.which("nvidia-smi", path=path)
    if smi is None:
        found = [
            str(p)
            for pattern in ("nvidia[0-9]*", "kfd", "dri/renderD*")
            for p in sorted(dev.glob(pattern))
        ]
        if found:
            return _accelerators_beyond(pool, where, limited, beyond, f"devices {found}")
        return CheckResult(
            pool.name, "accelerators", WARN,
            f"no accelerator on this machine: no nvidia-smi on PATH, and no {dev}/nvidiaN, "
            f"{dev}/kfd nor {dev}/dri/renderD*, yet {where} pins each worker to one",
            "Run this pool on a machine with those GPUs (their drivers installed: "
            "`nvidia-smi -L` lists them), or remove `accelerators` from the pool.",
        )  # fmt: skip
    try:
        done = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return CheckResult(
            pool.name, "accelerators", WARN, f"`nvidia-smi -L` did not answer: {exc}",
            "Check the GPU driver (`nvidia-smi` should list the GPUs).",
        )  # fmt: skip
    listed: dict[str, str] = {}
    for line in done.stdout.splitlines():
        m = _GPU_LINE.match(line)
        if m is not None:
            if m.group(1) is not None:
                listed[m.group(1)] = line.strip()
            listed[m.group(2)] = line.strip()
    missing = [i for i in ids if i not in listed]
    if done.returncode != 0 or missing:
        said = (done.stdout.strip() or done.stderr.strip() or "nothing").splitlines()
        return CheckResult(
            pool.name, "accelerators", FAIL,
            f"{where}, but `nvidia-smi -L` lists no {missing or ids} on this machine "
            f"(exit status {done.returncode}; it said: {' / '.join(said[:8])})",
            "List the indices (0, 1, ...) or UUIDs `nvidia-smi -L` shows, as many as "
            "the pool's workers (max_blocks x workers_per_node).",
        )  # fmt: skip
    return _accelerators_beyond(pool, where, limited, beyond, f"nvidia-smi lists {ids}")


def _accelerators_beyond(
    pool: PoolConfig, where: str, limited: str, beyond: list[str], seen: str
) -> CheckResult:
    """PASS (``seen``), or a WARN when this process's ``CUDA_VISIBLE_DEVICES``
    (``limited``) leaves out some of the pool's ids (``beyond``)."""
    if beyond:
        return CheckResult(
            pool.name, "accelerators", WARN,
            f"this process runs with CUDA_VISIBLE_DEVICES={limited}, and {where} goes "
            f"beyond it ({beyond}): each worker's id replaces that list, so it names a "
            "GPU of the whole machine, maybe one given to someone else",
            "List the GPUs this process may use (those of CUDA_VISIBLE_DEVICES) in the "
            "pool's accelerators.",
        )  # fmt: skip
    return CheckResult(pool.name, "accelerators", PASS, f"{where}: {seen}")


def check_drain(pools: Mapping[str, PoolConfig]) -> list[CheckResult]:
    """Each pool with a walltime: how long before it its workers are drained. Without
    a ``drain_period`` the margin is the scheduler's ``walltime_grace`` plus the pool's
    longest task, at most half the walltime: a WARN when the walltime is at most twice
    that grace, so that the cap always applies and a block works half its walltime at
    most. And a WARN (``signal warning``) for a Slurm pool whose ``signal_warning`` is
    not shorter than its drain margin (:func:`check_signal_warning`)."""
    grace = SchedulerConfig().walltime_grace
    results = []
    for pool in pools.values():
        walltime, period = pool.walltime, pool.drain_period
        if walltime is None:
            continue
        signal = check_signal_warning(pool, walltime, grace)
        if signal is not None:
            results.append(signal)
        if period is not None:
            seen = f"workers drained {period:g} s before their walltime of {walltime:g} s"
            results.append(CheckResult(pool.name, "drain", PASS, seen))
        elif walltime <= 2 * grace:
            results.append(CheckResult(
                pool.name, "drain", WARN,
                f"walltime {walltime:g} s and no drain_period: the default drain margin "
                f"({grace:g} s plus the pool's longest task) is capped at half the walltime, "
                f"so its workers are drained {walltime / 2:g} s after they start",
                f"Set drain_period in [pools.{pool.name}] to what its workers need to "
                "finish their last tasks and leave (less than the walltime), or give the "
                "pool a longer walltime.",
            ))  # fmt: skip
        else:
            seen = (
                f"no drain_period: workers drained {grace:g} s plus the pool's longest task "
                f"before their walltime of {walltime:g} s, at most half of it"
            )
            results.append(CheckResult(pool.name, "drain", PASS, seen))
    return results


def check_signal_warning(pool: PoolConfig, walltime: float, grace: float) -> CheckResult | None:
    """A WARN when ``pool``'s ``signal_warning`` (Slurm's SIGTERM that long before the
    walltime) comes at or before its drain: its ``drain_period``, or without one the
    least default margin (``grace``, the scheduler's ``walltime_grace``, at most half the
    ``walltime``). The workers then leave at the signal with their tasks still running
    (lost as ``walltime``), where the drain would have let them finish. None: no
    ``signal_warning``, or it comes after the drain."""
    signal, period = pool.signal_warning, pool.drain_period
    if not signal:
        return None
    drain = period if period is not None else min(grace, walltime / 2)
    if signal < drain:
        return None
    said = (
        f"drain_period {period:g} s"
        if period is not None
        else f"the default drain margin, which may be as short as {drain:g} s (no drain_period)"
    )
    return CheckResult(
        pool.name, "signal warning", WARN,
        f"signal_warning {signal} s is not shorter than {said}: Slurm's SIGTERM comes "
        f"{signal} s before the walltime, before the drain (or with it), so its workers "
        "leave with their tasks still running (lost as walltime, run again from the start "
        "or their checkpoint) where the drain would have let them finish",
        f"Set drain_period in [pools.{pool.name}] to more than signal_warning plus the "
        f"pool's longest task (e.g. drain_period = {signal + int(grace)} for tasks of up to "
        f"{grace:g} s), or leave signal_warning out: the drain already ends the workers "
        "cleanly before the walltime (signal_warning is for a batch system that may kill "
        "them sooner).",
    )  # fmt: skip


def check_any_pool(pools: Mapping[str, PoolConfig]) -> list[CheckResult]:
    """With more than one pool, each pool at ``min_blocks = 0`` that runs tasks of no
    pool (``any_pool_tasks`` true, the default): a WARN that such tasks (``pool=`` not
    given) count in its demand, so they start its blocks, up to ``max_blocks``, beside
    the pool meant for them (a GPU pool kept at 0 blocks scaled up by CPU work). And
    when every pool has ``any_pool_tasks = false``, one WARN (pool ``"*"``): a task
    submitted without ``pool=`` can never run (no worker may take it)."""
    results = []
    if pools and not any(pool.any_pool_tasks for pool in pools.values()):
        names = ", ".join(f"[pools.{name}]" for name in pools)
        results.append(CheckResult(
            ALL, "any-pool tasks", WARN,
            "every pool has any_pool_tasks = false: a task submitted without pool= (or a "
            "dask graph without dask.annotate(pool=...)) can never run, no worker may "
            "take it",
            f"Give every task a pool=, or set any_pool_tasks = true in one of {names} "
            "(docs/configuration.md#pools).",
        ))  # fmt: skip
    if len(pools) < 2:
        return results
    for pool in pools.values():
        if pool.min_blocks or not pool.any_pool_tasks:
            continue
        results.append(CheckResult(
            pool.name, "any-pool tasks", WARN,
            f"min_blocks = 0, and tasks submitted without pool= count in its demand: they "
            f"start its blocks (up to max_blocks = {pool.max_blocks}) and run on its "
            "workers beside the other pools'",
            f"If the pool is for the tasks that name it only (a scarce or costly one), set "
            f"any_pool_tasks = false in [pools.{pool.name}]; or give every task a pool= "
            "(docs/configuration.md#pools).",
        ))  # fmt: skip
    return results


def check_memory_limit(pools: Mapping[str, PoolConfig]) -> list[CheckResult]:
    """Each pool that sets ``memory_per_worker`` with thread execution (the default): a
    WARN that the limit is not enforced on a task. In threads the worker's fences only
    spill and throttle, and a task that grows past the limit runs on (warned of, never
    killed); only ``execution = "process"`` has the terminate fence kill the task that
    grew (its try ends ``oom``; ``TaskOutOfMemory`` when it has no retry left)."""
    results = []
    for pool in pools.values():
        if not pool.memory_per_worker or pool.execution not in ("", "thread"):
            continue
        results.append(CheckResult(
            pool.name, "memory limit", WARN,
            f"memory_per_worker = {size_text(pool.memory_per_worker)} with thread execution"
            f"{'' if pool.execution else ' (the default)'}: the limit is not enforced on "
            "a task: its workers spill and throttle at its fences and warn past it, but a "
            "task that grows past it runs on (a thread cannot be killed)",
            f'Set execution = "process" in [pools.{pool.name}] for a limit that kills the '
            "task that grew past it (TaskOutOfMemory), or keep threads if a warning is "
            "enough (they cost no copy of inputs and outputs).",
        ))  # fmt: skip
    return results


def check_gpus(pools: Mapping[str, PoolConfig]) -> list[CheckResult]:
    """Each Slurm pool with ``accelerators`` against the GPUs its ``scheduler_options``
    ask for a node (:func:`actors.slurm.gpus_asked`). FAIL: fewer than its workers there
    are pinned to (a numeric id N needs N+1: each block would end before its workers
    start, ``corral: too few GPUs``); WARN: no line asks for GPUs (the workers are pinned
    to GPUs the job may not have); PASS otherwise, saying how many."""
    results = []
    for pool in pools.values():
        if pool.provider != "slurm" or not pool.accelerators:
            continue
        per_node = pool.workers_per_node
        ids = pool.accelerators[:per_node]
        asked = gpus_asked(pool.scheduler_options, pool.nodes_per_block)
        numeric = [int(i) for i in ids if i.isdigit()]
        needed = max(numeric) + 1 if numeric else per_node
        line = f"#SBATCH --gres=gpu:{needed}"
        if asked is None:
            results.append(CheckResult(
                pool.name, "gpus", WARN,
                f"accelerators pins each of its {per_node} worker(s) a node to a GPU "
                f"({', '.join(ids)}), but its scheduler_options ask Slurm for no GPU (no "
                "--gres=gpu or --gpus line): its jobs get the partition's default, often "
                "none, and the workers are pinned to GPUs their job was not given",
                f"Add scheduler_options = \"{line}\" to [pools.{pool.name}] "
                "(docs/deployment.md#gpus), unless the partition gives every job its GPUs.",
            ))  # fmt: skip
        elif asked and numeric and asked < needed:
            results.append(CheckResult(
                pool.name, "gpus", FAIL,
                f"its scheduler_options ask Slurm for {asked} GPU(s) a node, but its "
                f"workers_per_node = {per_node} workers there are each pinned to one of "
                f"the job's GPUs ({', '.join(ids)}: {needed} needed): every block would "
                f"end before its workers start ({TOO_FEW_GPUS})",
                f"Ask for {needed} GPUs a node ({line} in scheduler_options), or set "
                f"workers_per_node = {asked} and accelerators = {asked} in "
                f"[pools.{pool.name}].",
            ))  # fmt: skip
        else:
            results.append(CheckResult(
                pool.name, "gpus", PASS,
                f"{per_node} worker(s) a node, each pinned to one of the "
                + (f"{asked} GPU(s) a node its job asks for" if asked else "GPUs its job asks for")
                + f" ({', '.join(ids)})",
            ))  # fmt: skip
    return results


#: local workers per CPU of this machine beyond which ``check_local_size`` warns
LOCAL_WORKERS_PER_CPU = 4


def check_local_size(pools: Mapping[str, PoolConfig]) -> CheckResult | None:
    """The ``local`` pools at ``max_blocks`` (and ``init_blocks``, which may be more)
    against this machine: worker processes per CPU (WARN past
    :data:`LOCAL_WORKERS_PER_CPU`), the cores they announce (WARN past its CPUs, as the
    manager's ``cores`` overcommit warning: their tasks would share the CPUs) and the
    memory they announce (WARN past the machine's). None without a local pool."""
    import psutil

    local = [p for p in pools.values() if p.provider == "local"]
    if not local:
        return None
    cpus = host_cpus() or 1
    memory = int(psutil.virtual_memory().total)
    workers = local_workers(pools)
    cores = sum(
        p.workers_per_block * p.cores_per_worker * max(p.max_blocks, p.init_blocks) for p in local
    )
    announced = sum(
        p.workers_per_block * p.memory_per_worker * max(p.max_blocks, p.init_blocks)
        for p in local
        if p.memory_per_worker
    )
    names = ", ".join(p.name for p in local)
    seen = (
        f"local pool(s) {names} at most: {workers} worker process(es) announcing {cores} "
        f"core(s) and {size_text(announced) if announced else 'an equal share of its memory'}"
        f"; this machine: {cpus} CPU(s), {size_text(memory)}"
    )
    advice = (
        "Lower max_blocks (or init_blocks), workers_per_node, cores_per_worker or "
        "memory_per_worker of the local pools, or put the work on a batch system's pool: "
        "local workers all run on this machine."
    )
    if workers > LOCAL_WORKERS_PER_CPU * cpus:
        return CheckResult(
            ALL, "local size", WARN,
            f"{seen}: more than {LOCAL_WORKERS_PER_CPU} worker processes per CPU", advice,
        )  # fmt: skip
    problems: list[str] = []
    advices: list[str] = []
    if cores > cpus:
        problems.append(
            f"they announce more cores than it has CPUs ({cores} > {cpus}): their tasks "
            "would share the CPUs and run slower than their cores say"
        )
        advices.append(
            f"Give the local workers fewer cores (cores_per_worker) or run fewer of them "
            f"(workers_per_node, max_blocks, init_blocks), so that their cores add up to "
            f"{cpus} or fewer; if their tasks mostly wait on I/O, more slots than CPUs may "
            "be meant, and this is only a warning."
        )
    if announced > memory:
        problems.append(
            "they announce more memory than it has (their fences would be past what it can give)"
        )
        advices.append(advice)
    if problems:
        return CheckResult(
            ALL, "local size", WARN, f"{seen}: {'; '.join(problems)}", " ".join(advices)
        )
    return CheckResult(ALL, "local size", PASS, seen)


# ----------------------------------------------------------------------------- Slurm


@dataclasses.dataclass(slots=True)
class Partition:
    """A partition as ``sinfo`` shows it."""

    name: str
    avail: str  #: up, down, drain, inactive
    default: bool = False
    nodes: dict[str, int] = dataclasses.field(default_factory=dict)  #: node state -> count


class _Stopped(Exception):
    """The checks were stopped while a command ran (the manager stopping): the command
    was killed."""


_TICK = 0.1  #: how often a running command looks at its ``stop`` event (seconds)


def _text(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def _run(
    argv: Sequence[str],
    timeout: float,
    *,
    stdin: str | None = None,
    cwd: str | None = None,
    stop: threading.Event | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a session of its own and capture its output (text). When it has
    not finished within ``timeout`` seconds it is killed with everything it started and
    :class:`subprocess.TimeoutExpired` carries what it printed so far (text); when
    ``stop`` is set meanwhile, the same and :class:`_Stopped`."""
    proc = subprocess.Popen(
        list(argv), cwd=cwd, text=True, start_new_session=True,
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    finished = False
    send = stdin
    try:
        while True:
            try:
                wait = max(0.01, min(_TICK, deadline - time.monotonic()))
                out, err = proc.communicate(send, timeout=wait)
            except subprocess.TimeoutExpired as exc:
                send = None  # written once: communicate() goes on with it
                if stop is not None and stop.is_set():
                    raise _Stopped(" ".join(argv[:2])) from None
                if time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(
                        proc.args, timeout, _text(exc.output), _text(exc.stderr)
                    ) from None
                continue
            finished = True
            return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    finally:
        if not finished:  # its session: a shell's children too, which hold its pipes
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()


#: How :func:`_slurm` starts what it says of a command that did not answer.
_NO_ANSWER = "no answer within"


def _no_answer(timeout: float, stderr: str | bytes | None) -> str:
    """What to say of a command killed after ``timeout`` seconds without an answer: the
    first distinct lines it printed on stderr (Slurm prints why it waits, e.g. a
    configuration file it cannot read, and then retries for a minute)."""
    lines = [" ".join(line.split()) for line in _text(stderr).splitlines()]
    first = list(dict.fromkeys(line[:200] for line in lines if line))[:3]
    said = f"; it printed: {' | '.join(first)}" if first else "; it printed nothing"
    return f"{_NO_ANSWER} {timeout:g} s (killed){said}"


def _no_answer_advice() -> str:
    """Where to look when a Slurm command does not answer: which slurm.conf it reads
    (SLURM_CONF) and whether the controller answers."""
    conf = os.environ.get("SLURM_CONF")
    which = (
        f"SLURM_CONF={conf}: check that this file exists and is this cluster's slurm.conf"
        if conf
        else "SLURM_CONF is not set: Slurm reads its built-in default slurm.conf"
    )
    return (
        f"The Slurm commands here read {which}. Check that the controller answers "
        "(`scontrol ping`) and how long `sinfo` takes to answer, and what it prints."
    )


def _slurm(
    argv: Sequence[str],
    timeout: float,
    stdin: str | None = None,
    stop: threading.Event | None = None,
) -> str:
    """Run a Slurm command; its stdout and stderr. :class:`BatchSystemError` when it is
    missing, does not answer within ``timeout`` (killed: the error quotes the first
    lines it printed and names SLURM_CONF) or exits non-zero; :class:`_Stopped` when
    ``stop`` is set while it runs."""
    command = " ".join(argv[:2])
    try:
        done = _run(argv, timeout, stdin=stdin, stop=stop)
    except FileNotFoundError:
        raise BatchSystemError(
            command, None, f"{argv[0]}: command not found",
            "Install the Slurm client commands here or put them on PATH (`module load slurm`).",
        ) from None  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise BatchSystemError(
            command, None, _no_answer(timeout, exc.stderr), _no_answer_advice()
        ) from None
    except OSError as exc:
        raise BatchSystemError(
            command, None, str(exc),
            f"Check that {argv[0]!r} on PATH is the Slurm command and may be run by this "
            "user (its permissions).",
        ) from None  # fmt: skip
    if done.returncode != 0:
        raise BatchSystemError(
            command, done.returncode, done.stderr or done.stdout,
            "Fix what Slurm printed; if it says it cannot reach the controller, "
            + _no_answer_advice(),
        )  # fmt: skip
    return done.stdout + done.stderr


def parse_sinfo(text: str) -> dict[str, Partition]:
    """Partitions from ``sinfo -h -a -o '%P|%a|%D|%T'`` (one line per node state)."""
    parts: dict[str, Partition] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4 or not fields[0]:
            continue
        name, avail, count, state = fields
        default = name.endswith("*")
        name = name.rstrip("*")
        part = parts.setdefault(name, Partition(name, avail, default))
        try:
            part.nodes[state] = part.nodes.get(state, 0) + int(count)
        except ValueError:
            continue
    return parts


def check_batch_system(
    timeout: float = 20.0, stop: threading.Event | None = None
) -> tuple[CheckResult, dict[str, Partition] | None]:
    """The Slurm commands are here and the controller answers; the partitions it shows
    (None when it does not answer). When ``sinfo`` fails, ``scontrol ping`` says
    whether the controller is down; when ``sinfo`` does not answer at all, the result
    says so, with what it printed, and nothing more is asked (``scontrol ping`` would
    wait as long)."""
    missing = [c for c in ("sinfo", "squeue", "sbatch", "scontrol") if shutil.which(c) is None]
    if missing:
        return CheckResult(
            ALL, "batch system", FAIL,
            f"Slurm command(s) not found on PATH: {', '.join(missing)}",
            "Run the check (and the manager) where Slurm's client commands are installed "
            "(a login node), or put them on PATH (`module load slurm`).",
        ), None  # fmt: skip
    try:
        text = _slurm(["sinfo", "-h", "-a", "-o", "%P|%a|%D|%T"], timeout, stop=stop)
    except BatchSystemError as err:
        if err.exit_code is None and err.stderr.startswith(_NO_ANSWER):
            return CheckResult(
                ALL, "batch system", FAIL, f"`sinfo` gave {err.stderr}", err.advice
            ), None  # fmt: skip
        down = ""
        try:
            down = _slurm(["scontrol", "ping"], timeout, stop=stop)
        except BatchSystemError as ping:
            down = ping.stderr
        return CheckResult(
            ALL, "batch system", FAIL,
            f"the Slurm controller does not answer: {err.stderr.strip()[-300:]}"
            + (f" (scontrol ping: {' '.join(down.split())[:200]})" if down.strip() else ""),
            "Check that slurmctld runs and that SLURM_CONF names this cluster's "
            "slurm.conf (`scontrol ping`, `sinfo`); ask the cluster's admins if it is down.",
        ), None  # fmt: skip
    parts = parse_sinfo(text)
    where = os.environ.get("SLURM_CONF", "the default slurm.conf")
    return CheckResult(
        ALL, "batch system", PASS,
        f"Slurm answers ({where}): partitions {', '.join(parts) or 'none'}",
    ), parts  # fmt: skip


_USABLE = ("idle", "mixed", "mix", "allocated", "alloc", "completing")
_FREE = ("idle", "mixed", "mix")  #: nodes with CPUs free for a new job


def check_partition(pool: PoolConfig, parts: Mapping[str, Partition]) -> CheckResult:
    """The pool's partition (or the default one) exists, is up and has usable nodes."""
    name = pool.partition or next((p.name for p in parts.values() if p.default), "")
    if not name:
        return CheckResult(
            pool.name, "partition", FAIL, "the pool names no partition and Slurm has no default",
            "Set `partition` in the pool.",
        )  # fmt: skip
    part = parts.get(name)
    if part is None:
        return CheckResult(
            pool.name, "partition", FAIL,
            f"partition {name!r} does not exist (Slurm has: {', '.join(parts) or 'none'})",
            "Set the pool's `partition` to one that `sinfo` lists.",
        )  # fmt: skip
    nodes = ", ".join(f"{n} {s}" for s, n in sorted(part.nodes.items())) or "no nodes"
    label = f"{name}{' (default)' if not pool.partition else ''}"
    seen = f"partition {label} is {part.avail}; nodes: {nodes}"
    if part.avail != "up":
        why = {
            "drain": "it takes no new jobs",
            "down": "jobs queue but do not start",
            "inact": "it takes no jobs",  # sinfo's short name for inactive
            "inactive": "it takes no jobs",
        }.get(part.avail.rstrip("*"), "it may not run jobs")
        return CheckResult(
            pool.name, "partition", FAIL, f"{seen}: {why}",
            "Use another partition, or wait until the admins bring it up (`sinfo -p NAME`).",
        )  # fmt: skip
    usable = sum(n for s, n in part.nodes.items() if s.rstrip("*~#!%$@^-") in _USABLE)
    if not usable:
        return CheckResult(
            pool.name, "partition", FAIL, f"{seen}: no node can run jobs",
            "Every node is down or drained: use another partition or ask the admins.",
        )  # fmt: skip
    free = sum(n for s, n in part.nodes.items() if s.rstrip("*~#!%$@^-") in _FREE)
    if not free:
        return CheckResult(
            pool.name, "partition", WARN, f"{seen}: no idle node",
            "Blocks will wait behind other jobs; expect workers to come late.",
        )  # fmt: skip
    return CheckResult(pool.name, "partition", PASS, seen)


def _script(pool: PoolConfig, base: Path, options: SlurmOptions, spec: BlockSpec) -> str:
    """A block script for ``pool`` whose workers run the probe code."""
    argv = [sys.executable, "-c", PROBE_CODE]
    workers = [(f"{pool.name}-probe.{i}", argv) for i in range(spec.workers)]
    return batch_script(
        block_id="probe", job_name=f"corral-probe-{pool.name}", workers=workers, spec=spec,
        options=options, output=base.with_suffix(".out"), error=base.with_suffix(".err"),
        env_file=None, script=base.with_suffix(".sh"),
    )  # fmt: skip


_START = re.compile(r"Job \d+ to start at (\S+)(?: using (\d+) processors)?(?: on nodes (\S+))?")
#: Where Slurm says why it refuses a job, most specific first.
_REASONS = [
    re.compile(rf"{what}:\s*(.+)")
    for what in ("Batch job submission failed", "allocation failure", "sbatch: error")
]


def parse_test_only(returncode: int, output: str) -> tuple[bool, str]:
    """(accepted, what Slurm said) from ``sbatch --test-only``: the estimated start when
    accepted, Slurm's reason when refused."""
    m = _START.search(output)
    if returncode == 0 and m is not None:
        start, cpus, nodes = m.groups()
        said = f"estimated start {start}"
        if cpus:
            said += f" using {cpus} CPUs"
        if nodes:
            said += f" on {nodes}"
        return True, said
    for pattern in _REASONS:
        reasons = [r.strip() for r in pattern.findall(output) if r.strip()]
        if reasons:
            return False, "; ".join(dict.fromkeys(reasons))
    return False, " ".join(output.split())[-400:] or f"exit code {returncode}, no message"


def check_test_only(
    pool: PoolConfig, timeout: float = 20.0, stop: threading.Event | None = None
) -> CheckResult:
    """``sbatch --test-only`` of the pool's block script: does Slurm accept the
    partition, account, QOS, walltime and shape?"""
    argv = ["sbatch", "--test-only"]
    with tempfile.TemporaryDirectory(prefix="corral-check-") as tmp:
        text = _script(pool, Path(tmp) / "block", pool.slurm_options(), pool.block_spec())
        try:
            done = _run(argv, timeout, stdin=text, cwd=tmp, stop=stop)
        except subprocess.TimeoutExpired as exc:
            return CheckResult(
                pool.name, "test-only", FAIL,
                f"sbatch --test-only gave {_no_answer(timeout, exc.stderr)}",
                _no_answer_advice(),
            )  # fmt: skip
        except OSError as exc:
            return CheckResult(
                pool.name, "test-only", FAIL, f"sbatch --test-only did not run: {exc}",
                "Check that the Slurm controller answers (`scontrol ping`).",
            )  # fmt: skip
    accepted, said = parse_test_only(done.returncode, done.stdout + done.stderr)
    asked = ", ".join(f"{k} {v}" for k, v in (("account", pool.account), ("qos", pool.qos)) if v)
    asked = f" ({asked})" if asked else ""
    if accepted:
        return CheckResult(pool.name, "test-only", PASS, f"a block is accepted{asked}: {said}")
    # the pool's own #SBATCH lines are asked too: a constraint, a GRES, a reservation
    return CheckResult(
        pool.name, "test-only", FAIL, f"Slurm refuses a block{asked}: {said}",
        "Fix what Slurm names: the account and QOS you may use (`sacctmgr show assoc "
        "user=$USER`), the partition's limits (`scontrol show partition`), the block's "
        f"size, memory and walltime{own_lines_advice(pool.scheduler_options)}.",
    )  # fmt: skip


def check_accounting(
    pool: PoolConfig, timeout: float = 20.0, stop: threading.Event | None = None
) -> CheckResult | None:
    """Whether this cluster checks the pool's account and QOS at all (None: the pool
    sets neither). Without ``AccountingStorageEnforce``, any name is accepted."""
    if not pool.account and not pool.qos:
        return None
    try:
        config = _slurm(["scontrol", "show", "config"], timeout, stop=stop)
    except BatchSystemError as err:
        return CheckResult(pool.name, "account/qos", WARN, f"not known: {err.failure}", err.advice)
    m = re.search(r"^AccountingStorageEnforce\s*=\s*(\S+)", config, re.MULTILINE)
    enforce = m.group(1) if m else "none"
    named = ", ".join(f"{k} {v!r}" for k, v in (("account", pool.account), ("qos", pool.qos)) if v)
    if enforce in ("none", "0", "(null)"):
        return CheckResult(
            pool.name, "account/qos", WARN,
            f"this cluster does not check accounts or QOS (AccountingStorageEnforce={enforce}): "
            f"{named} is accepted whatever it is",
            "Make sure the names are the ones you mean; a typo is not caught here.",
        )  # fmt: skip
    return CheckResult(
        pool.name, "account/qos", PASS, f"{named} checked by Slurm (enforce: {enforce})"
    )


@dataclasses.dataclass(slots=True)
class _Probe:
    pool: PoolConfig
    job: str
    out: Path
    err: Path
    state: str = "PENDING"
    reason: str = ""
    result: CheckResult | None = None


def probe_slurm_pools(
    pools: Sequence[PoolConfig],
    run_dir: Path,
    *,
    timeout: float = 300.0,
    progress: Callable[[str], None] | None = None,
    command_timeout: float = 20.0,
    interval: float = 1.0,
) -> list[CheckResult]:
    """Submit one probe job per pool (its partition, options and ``worker_init``, one
    node, walltime at most 10 minutes), wait for them all (at most ``timeout`` seconds,
    saying what they wait for through ``progress``) and compare what they report with
    the manager's versions. The scripts and outputs stay in ``run_dir``."""
    say = progress or (lambda text: None)
    probes: list[_Probe] = []
    results: dict[str, CheckResult] = {}
    try:
        run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        advice = (
            "Choose a run directory you can write (--run-dir), on a file system the "
            "compute nodes see."
        )
        why = f"no probe job: cannot create {run_dir}: {exc}"
        return [CheckResult(pool.name, "probe", FAIL, why, advice) for pool in pools]
    for pool in pools:
        base = run_dir / pool.name
        walltime = min(pool.walltime or 600.0, 600.0)
        # One worker, or with accelerators one a node, each pinned on its own line as
        # the pool's blocks pin theirs: the probe says what each was pinned to.
        workers = pool.workers_per_node if pool.accelerators else 1
        spec = BlockSpec(workers, pool.cores_per_worker, pool.memory_per_worker, 0, pool.name)
        options = dataclasses.replace(pool.slurm_options(), walltime=walltime, nodes_per_block=1)
        script = base.with_suffix(".sh")
        script.write_text(_script(pool, base, options, spec))
        script.chmod(0o700)
        try:
            out = _slurm(["sbatch", "--parsable", str(script)], command_timeout)
        except BatchSystemError as err:
            results[pool.name] = CheckResult(
                pool.name, "probe", FAIL, f"the probe job was refused: {err.stderr.strip()}",
                "Fix what Slurm names (see the test-only check).",
            )  # fmt: skip
            continue
        job = out.strip().split(";")[0]
        say(f"probe of pool {pool.name}: Slurm job {job} submitted ({script})")
        probes.append(_Probe(pool, job, base.with_suffix(".out"), base.with_suffix(".err")))
    start = time.monotonic()
    last_said = 0.0
    while any(p.result is None for p in probes):
        waiting = [p for p in probes if p.result is None]
        ids = ",".join(p.job for p in waiting)
        try:
            seen = parse_squeue(
                _slurm(["squeue", "-h", "-t", "all", "-j", ids, "-O", SQUEUE_FORMAT], 20)
            )
        except BatchSystemError:
            seen = {}
        for p in waiting:
            info = seen.get(p.job)
            if info is None:
                try:
                    info = parse_scontrol_job(_slurm(["scontrol", "show", "job", p.job], 20))
                except BatchSystemError:
                    info = None
            if info is None:
                continue
            p.state, p.reason = info.state, info.reason
            state = block_state(info.state)
            if state is not None and state.terminal:
                p.result = _finished(p, info.exit_code)
        elapsed = time.monotonic() - start
        if any(p.result is None for p in probes) and elapsed > timeout:
            for p in probes:
                if p.result is None:
                    _slurm_quietly(["scancel", p.job])
                    p.result = CheckResult(
                        p.pool.name, "probe", WARN,
                        f"Slurm job {p.job} did not finish within {timeout:g} s "
                        f"(state {p.state}{_reason(p.reason, ', reason ')}): "
                        "versions not checked; cancelled",
                        "The partition is busy: run the check again with a longer "
                        "--probe-timeout, or skip the probe (--no-probe).",
                    )  # fmt: skip
            break
        if time.monotonic() - last_said >= 5 and any(p.result is None for p in probes):
            last_said = time.monotonic()
            pending = ", ".join(
                f"{p.pool.name} job {p.job} {p.state}" + _reason(p.reason, " (", ")")
                for p in probes
                if p.result is None
            )
            say(f"waiting for the probe(s) ({elapsed:.0f}/{timeout:g} s): {pending}")
        if any(p.result is None for p in probes):
            time.sleep(interval)
    for p in probes:
        assert p.result is not None
        results[p.pool.name] = p.result
    return [results[pool.name] for pool in pools if pool.name in results]


def _reason(reason: str, before: str, after: str = "") -> str:
    """Slurm's pending reason as text, "" for none."""
    return f"{before}{reason}{after}" if reason not in ("", "None") else ""


def _finished(p: _Probe, exit_code: str) -> CheckResult:
    out = _read(p.out)
    reports = parse_probe_reports(out)
    report = reports[-1] if reports else None
    where = f"Slurm job {p.job} {p.state}"
    if report is None and exit_code:
        where += f", {exit_text(exit_code)}"
    gpus = judge_probe_gpus(p.pool, reports) if p.pool.accelerators else ("", "")
    return _judge_probe(p.pool.name, report, f"{where}, {p.out}", _read(p.err), gpus)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _slurm_quietly(argv: Sequence[str]) -> None:
    try:
        _slurm(argv, 20)
    except BatchSystemError as err:
        _log.warning("could not cancel a probe job", error=str(err))


# ----------------------------------------------------------------------------- directories


def expected_spill(pools: Mapping[str, PoolConfig]) -> tuple[int, list[str]]:
    """A conservative guess at what the workers may spill (bytes): every worker of every
    block at ``max_blocks`` filling its ``disk_per_worker`` (the most it keeps on disk),
    or else spilling its ``memory_per_worker`` (local workers without either share this
    machine's memory: it counts once); and the pools it could not count (a Slurm pool
    with neither)."""
    import psutil

    total, unknown, shared = 0, [], False
    for pool in pools.values():
        per_worker = max(0, pool.disk_per_worker) or pool.memory_per_worker
        if per_worker:
            total += per_worker * pool.workers_per_block * pool.max_blocks
        elif pool.provider == "local":
            shared = True
        else:
            unknown.append(pool.name)
    if shared:
        total += int(psutil.virtual_memory().total)
    return total, unknown


def _a(noun: str) -> str:
    """``noun`` with its indefinite article: "an output directory", "a run directory"."""
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def _cannot_create_in(directory: Path) -> str | None:
    """Why nothing can be created in ``directory``, or None: a probe directory was made
    there and removed. A real write, not ``os.access``, which says yes to root anywhere
    (``/proc`` too) and knows nothing of read-only mounts. A full file system is not
    this (None): the free space says so."""
    try:
        probe = tempfile.mkdtemp(prefix=".corral-check-", dir=directory)
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            return None
        return exc.strerror or type(exc).__name__
    with contextlib.suppress(OSError):
        os.rmdir(probe)
    return None


def check_directory(what: str, path: Path, needed: int) -> CheckResult:
    """``path`` is a directory or can be created, is writable (a probe directory is
    made in it, or in the nearest existing parent, and removed), and has ``needed``
    bytes free (WARN below it, saying so of the file system's size when that is less;
    FAIL when the file system is full: less free than :data:`_FULL`, or than a
    hundredth of its size if that is less)."""
    path = path.absolute()
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return CheckResult(
            ALL, what, FAIL, f"{path} cannot be created: {existing} is not a directory",
            f"Choose another {what}, or remove or rename {existing}.",
        )  # fmt: skip
    why = _cannot_create_in(existing)
    if why is not None:
        return CheckResult(
            ALL, what, FAIL,
            f"{path}: {existing} is not writable (creating a directory there: {why})",
            f"Choose {_a(what)} you can write, on a disk (not /proc, /sys or a read-only "
            f"mount), or fix the permissions of {existing}.",
        )  # fmt: skip
    usage = shutil.disk_usage(existing)
    free, size = usage.free, usage.total
    made = "" if existing == path else f" (will be created in {existing})"
    seen = f"{path}{made}: {size_text(free)} free"
    if free < min(_FULL, size // 100):
        return CheckResult(
            ALL, what, FAIL,
            f"{seen}: the file system is full ({size_text(usage.used)} used of "
            f"{size_text(size)})",
            f"Free space there, or choose {_a(what)} on another file system.",
        )  # fmt: skip
    if free < needed:
        small = f" (the file system is {size_text(size)} in all: too small for them)"
        return CheckResult(
            ALL, what, WARN,
            f"{seen}, less than the {size_text(needed)} the pools may spill"
            + (small if size < needed else ""),
            f"Free space, or choose another {what} on a larger file system (the estimate is "
            "memory_per_worker x workers of every block at max_blocks, or disk_per_worker x "
            "workers where a pool sets it).",
        )  # fmt: skip
    return CheckResult(ALL, what, PASS, seen + (f" (needs {size_text(needed)})" if needed else ""))


def _on_nodes(result: CheckResult, path: Path) -> CheckResult:
    """A Slurm pool's ``spill_dir``, checked on this machine (``result``): its nodes see
    their own file systems, so a path none of which exists here (its nearest existing
    parent is ``/``) may exist there: a WARN saying so, not a FAIL; otherwise the result
    as it is, its advice naming the pool key (every block would fail at start)."""
    existing = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if result.status == FAIL and existing == existing.parent and existing != path.absolute():
        return dataclasses.replace(
            result, status=WARN,
            detail=f"{path}: nothing of it exists on this machine; it must on the pool's nodes",
            advice="Make sure the nodes can create it (their workers' --spill-dir), or set "
            "the pool's spill_dir to a directory this machine shares with them.",
        )  # fmt: skip
    if result.status == FAIL:
        return dataclasses.replace(
            result, advice=f"{result.advice} It is the pool's spill_dir (its workers' "
            "--spill-dir): as it is, every block of the pool fails as it starts.",
        )  # fmt: skip
    return result


def check_run_dir(path: Path | None, pools: Sequence[str]) -> CheckResult:
    """The Slurm run directory (``path``: ``--run-dir``; None: the manager's default,
    ``./corral-slurm``): :func:`check_directory`, and a WARN when the manager would
    refuse the directory it keeps a pool's files in, ``<path>/<pool>``
    (:func:`actors.slurm.run_dir_problem`: another user's, or one that others can write
    in, or whose parent they can). The default's is a new directory of each run, made
    0700 (``run-<time>-<pid>/<pool>``): nothing there to refuse."""
    result = check_directory("run directory", path or Path("corral-slurm"), 0)
    if result.status == FAIL or path is None:
        return result
    for name in pools:
        problem = run_dir_problem(path.absolute() / name)
        if problem is not None:
            what, _, advice = problem.partition(". Run the manager")
            return CheckResult(
                ALL, "run directory", WARN,
                f"the manager would refuse pool {name}'s: {what}",
                f"Run the manager{advice}; give check the same --run-dir.",
            )  # fmt: skip
    return result


def check_directories(
    pools: Mapping[str, PoolConfig],
    *,
    run_dir: Path | None = None,
    spill_dir: Path | None = None,
    output_dirs: Sequence[Path] = (),
) -> list[CheckResult]:
    """The run directory (Slurm pools' scripts and job output), the spill directory
    (default: the system's temporary directory; only when a pool has no ``spill_dir``
    of its own, there are no pools, or ``spill_dir`` is given), each pool's own
    ``spill_dir`` (for that pool: a Slurm pool's checked here, as its nodes will see
    it: :func:`_on_nodes`) and each output directory."""
    own = {n: p for n, p in pools.items() if p.spill_dir}
    needed, unknown = expected_spill({n: p for n, p in pools.items() if n not in own})
    results = []
    if any(p.provider == "slurm" for p in pools.values()):
        slurm = sorted(n for n, p in pools.items() if p.provider == "slurm")
        results.append(check_run_dir(run_dir, slurm))
    for name, pool in own.items():
        room = expected_spill({name: pool})[0]
        mine = check_directory("spill directory", Path(pool.spill_dir), room)
        if pool.provider != "local":
            mine = _on_nodes(mine, Path(pool.spill_dir))
        results.append(dataclasses.replace(mine, pool=name))
    if spill_dir is not None or not pools or len(own) < len(pools):  # someone spills there
        where = spill_dir or Path(tempfile.gettempdir())
        spill = check_directory("spill directory", where, needed)
        if unknown and spill.status == PASS:
            spill = dataclasses.replace(
                spill, detail=f"{spill.detail}; not counted: pool(s) {', '.join(unknown)} "
                "(no disk_per_worker or memory_per_worker)",
            )  # fmt: skip
        results.append(spill)
    results += [check_directory("output directory", d, needed) for d in output_dirs]
    return results


# ----------------------------------------------------------------------------- policies


def check_policies(
    path: str | os.PathLike[str],
    registry: PolicyRegistry,
    modules: Sequence[str] = (),
    refuse: Refusals | None = None,
) -> CheckResult | None:
    """The ``[policies]`` table of the configuration file at ``path``, checked by the
    manager's own :func:`~actors.pools.load_policies` against ``registry`` (the built-in
    policies and those the ``modules``, the check's ``--policy-module``s, registered):
    a PASS naming the policies it takes, None when it takes none. What it refuses goes
    to ``refuse`` (:func:`refused` makes them results); without one the first raises."""
    given = f" (with --policy-module {', '.join(modules)})" if modules else ""
    chosen = load_policies(path, registry, refuse)
    if not chosen:
        return None
    said = ", ".join(
        f"{kind} = {name}" + (f" ({', '.join(f'{k}={v!r}' for k, v in params.items())})"
                              if params else "")
        for kind, (name, params) in chosen.items()
    )  # fmt: skip
    return CheckResult(ALL, "policies", PASS, f"{said}{given}")


# ----------------------------------------------------------------------------- alertmanager

#: seconds the Alertmanager probe waits for an answer, all tries together
ALERTMANAGER_TIMEOUT = 3.0

#: what to do about an Alertmanager that does not answer
ALERTMANAGER_ADVICE = (
    "until it answers, alerts reach only the manager's log (each post to it is retried "
    "and logged when an alert fires): check the URL ([alerting] alertmanager in --config, "
    "or --alertmanager), that Alertmanager runs there and that this machine can reach it "
    "(docs/monitoring.md#notifiers-and-alertmanager)"
)

#: the readiness endpoint, then the API's status (for a proxy that passes only the API)
_READY_PATHS = ("/-/ready", "/api/v2/status")


async def probe_alertmanager(url: str, within: float = ALERTMANAGER_TIMEOUT) -> tuple[bool, str]:
    """Whether the Alertmanager at base URL ``url`` answers: ``GET URL/-/ready`` (where
    that is not found, HTTP 404, ``GET URL/api/v2/status``), at most ``within`` seconds
    in all, without a proxy (as the notifier posts). ``(True, what answered)``, e.g.
    ``GET /-/ready: HTTP 200``, or ``(False, why not)``: the connection's error, the HTTP
    status and the start of the page, or ``no answer within 3 s``. Never raises for the
    network."""
    base = url.rstrip("/")
    why = f"no answer within {within:g} s"
    found: list[str] = []
    with anyio.move_on_after(within):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=within)) as session:
            for path in _READY_PATHS:
                try:
                    async with session.get(base + path, allow_redirects=False) as resp:
                        page = " ".join((await resp.text(errors="replace"))[:200].split())
                        status = resp.status
                except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                    return False, f"{type(exc).__name__}: {exc}"
                if status < 300:
                    return True, f"GET {path}: HTTP {status}"
                found.append(f"GET {path}: HTTP {status}" + (f" {page}" if page else ""))
                if status != 404:
                    break
            why = "; ".join(found)
            if all(" HTTP 404" in f for f in found):
                why += ": is this Alertmanager's base URL (no path)?"
    return False, why


async def check_alertmanager(url: str, within: float = ALERTMANAGER_TIMEOUT) -> CheckResult:
    """The ``alertmanager`` check of ``check --config``: PASS when the Alertmanager at
    ``url`` answers (:func:`probe_alertmanager`), else a WARN saying why not and what to
    do (a manager starts anyway, and sends alerts once it answers)."""
    answers, said = await probe_alertmanager(url, within)
    if answers:
        return CheckResult(ALL, "alertmanager", PASS, f"Alertmanager at {url} answers ({said})")
    return CheckResult(
        ALL, "alertmanager", WARN, f"Alertmanager at {url} does not answer: {said}",
        ALERTMANAGER_ADVICE,
    )  # fmt: skip


def _policy_refused(
    exc: PolicyConfigError, path: str | os.PathLike[str], modules: Sequence[str]
) -> CheckResult:
    cause = exc.__cause__
    if isinstance(cause, UnknownPolicyError) and cause.kind != "kind of" and not modules:
        close = did_you_mean(cause.name, cause.available)
        if close:  # a misspelt built-in name, as the manager would say it
            return CheckResult(
                ALL, "policies", FAIL,
                f"[policies] {exc.key}: no {cause.kind} policy named {cause.name!r}{close}",
                f"fix [policies] in {path}: a manager started with it stops with this "
                "error (if a module of yours registers that name, check it with "
                "--policy-module MODULE)",
            )  # fmt: skip
        return CheckResult(
            ALL, "policies", FAIL,
            f"[policies] {exc.key}: {cause.name!r} is not a built-in {cause.kind} "
            "policy, so it cannot be verified without the module that registers it "
            f"(built in: {', '.join(cause.available) or 'none'})",
            "check it with the manager's module: python -m runtime check --config "
            f"{path} --policy-module MODULE; or pick a built-in policy "
            "(docs/policies.md#with-a-manager-process)",
        )  # fmt: skip
    return CheckResult(
        ALL, "policies", FAIL, exc.message,
        f"fix [policies] in {path}: a manager started with it stops with this error",
    )  # fmt: skip


def refused(
    errors: Sequence[CorralError], path: str | os.PathLike[str], modules: Sequence[str] = ()
) -> list[CheckResult]:
    """A FAIL for each thing the loaders of the configuration file at ``path`` refused
    (a :class:`~runtime.errors.Refusals` that keeps them): every unknown key of every
    section, with its did-you-mean, so that one run of the check shows them all."""
    out = []
    for exc in errors:
        if isinstance(exc, PolicyConfigError):
            out.append(_policy_refused(exc, path, modules))
            continue
        pool = exc.pool if isinstance(exc, PoolConfigError) and exc.pool else ALL
        check = "alerting" if isinstance(exc, AlertConfigError) else "config"
        out.append(CheckResult(
            pool, check, FAIL, exc.message,
            f"fix it in {path}: a manager started with it stops with this error",
        ))  # fmt: skip
    return out


# ----------------------------------------------------------------------------- all of them


def run_checks(
    pools: Mapping[str, PoolConfig],
    *,
    probe: bool = True,
    probe_timeout: float = 300.0,
    run_dir: Path | None = None,
    spill_dir: Path | None = None,
    output_dirs: Sequence[Path] = (),
    progress: Callable[[str], None] | None = None,
    command_timeout: float = 20.0,
    stop: threading.Event | None = None,
) -> list[CheckResult]:
    """Every check, in order: the batch system (if a pool is on Slurm), then per pool its
    partition, ``--test-only``, account/QOS and (``probe``) its probe, then the
    directories. A pool whose partition or ``--test-only`` failed gets no probe job.
    ``stop`` set: a Slurm command still running is killed and :class:`_Stopped` raised
    (the probes do not look at it)."""
    results: list[CheckResult] = []
    slurm_pools = [p for p in pools.values() if p.provider == "slurm"]
    parts: dict[str, Partition] | None = None
    if slurm_pools:
        answer, parts = check_batch_system(command_timeout, stop)
        results.append(answer)
    to_probe: list[PoolConfig] = []
    size = check_local_size(pools)
    if size is not None:
        results.append(size)
    results += check_drain(pools)
    results += check_any_pool(pools)
    results += check_memory_limit(pools)
    results += check_gpus(pools)
    for pool in pools.values():
        if pool.provider == "local":
            if probe:
                results.append(check_local(pool))
            gpus = check_accelerators(pool, command_timeout)
            if gpus is not None:
                results.append(gpus)
            continue
        if parts is None:
            continue
        mine = [check_partition(pool, parts)]
        if mine[0].status != FAIL:
            mine.append(check_test_only(pool, command_timeout, stop))
            accounting = check_accounting(pool, command_timeout, stop)
            if accounting is not None:
                mine.append(accounting)
        results += mine
        if all(r.status != FAIL for r in mine):
            to_probe.append(pool)
    if probe and to_probe:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        base = (run_dir or Path("corral-slurm")).absolute() / f"check-{stamp}-{os.getpid()}"
        results += probe_slurm_pools(
            to_probe, base, timeout=probe_timeout, progress=progress,
            command_timeout=command_timeout,
        )  # fmt: skip
    results += check_directories(
        pools, run_dir=run_dir, spill_dir=spill_dir, output_dirs=output_dirs
    )
    return results


async def log_quick_checks(
    pools: Mapping[str, PoolConfig], run_dir: Path | None = None, limit: float = 30.0
) -> list[CheckResult]:
    """What the manager runs once it listens (:func:`quick_checks_service`): the checks
    that submit nothing (no probe), in a thread, each WARN or FAIL logged as a warning.
    Never raises, and runs at most ``limit`` seconds; a Slurm command still running
    then, or when this is cancelled (the manager stops), is killed."""
    results: list[CheckResult] | None = None
    stop = threading.Event()
    try:
        with anyio.move_on_after(limit):
            results = await anyio.to_thread.run_sync(
                lambda: run_checks(
                    pools, probe=False, run_dir=run_dir, command_timeout=10.0, stop=stop
                ),
                abandon_on_cancel=True,
            )
    except Exception as exc:
        _log.warning("pre-flight checks could not run", error=repr(exc))
        return []
    finally:
        stop.set()  # the abandoned thread kills its command and ends at once
    if results is None:
        _log.warning(f"pre-flight checks did not finish within {limit:g} s: stopped")
        return []
    for r in results:
        if r.status != PASS:
            _log.warning(
                f"pre-flight {r.status}: {r.detail}", pool=r.pool, check=r.check, advice=r.advice
            )
    return results


async def quick_checks_service(
    pools: Mapping[str, PoolConfig],
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """:func:`log_quick_checks` as a service of the manager's actor system (started
    once it listens): started at once, it logs the results when they come while the
    manager answers, and is cancelled (its command killed) when the manager stops.
    Nothing waits for it: the checks only warn."""
    task_status.started()
    await log_quick_checks(pools)
