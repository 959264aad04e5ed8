"""Blocks of workers as Slurm batch jobs.

What lives here:

- :class:`SlurmProvider`, a :class:`~actors.providers.Provider`: each block is one batch
  job (``sbatch --parsable`` of a generated script kept on disk), stopped with
  ``scancel``; its state comes from a cache that ONE ``squeue`` call per status interval
  refreshes for all blocks (an async refresher, never one ``squeue`` per block).
- The pure parts, tested by feeding them recorded output (``tests/test_slurm_parse.py``):
  :func:`batch_script` (the script), :func:`parse_squeue` and :func:`parse_scontrol_job`
  (what Slurm printed), :func:`block_state` (Slurm's job states as block states),
  :class:`JobRecord.observe` (requeues as incarnations, vanished jobs, preemption),
  :class:`FailureWindow` (back-off and the windowed stop on submission failures) and
  :func:`parse_walltime`, the one reader of a walltime (seconds, or the forms of
  ``sbatch --time``; ``tests/test_walltime_format.py``).

Like :class:`~actors.processes.LocalProcessProvider`, the provider does not know what a
worker is: ``argv_for(block_id, index)`` gives the command line of each worker (``python
-m runtime worker ws://...``), and the script starts it with ``CORRAL_WORKER_ID`` (the
worker's ``--name`` default) set to the id the block records, so the worker registers
under an id the autoscaler maps to its block. ``env`` (e.g. ``CORRAL_TOKEN``) goes to a
file of the run directory readable by this user only, which the script sources: the
script itself holds no secret.

States. A job requeued by Slurm (preempted on a ``PreemptMode=REQUEUE`` partition, or
``scontrol requeue``) keeps its id and goes back to pending: that is a new *incarnation*
of the same block (``Restarts`` in ``scontrol show job``), not a second block, and not
an end; it was ``preempted`` if the job's stderr has a ``DUE TO PREEMPTION`` line for
it, else ``requeued``. slurmstepd writes that line on its own time, after the look that
saw the requeue at times: the stderr is read again at the next looks (while it grows,
until the job runs again), and a line found then makes the earliest ``requeued``
incarnation ``preempted`` (:meth:`JobRecord.observe`; never the other way), the block's
``requeue_cause`` too. A requeue with no such line yet is reported on the block (what
the autoscaler reads, and acts on at once) one look later. A job that is no longer in
``squeue`` is not taken as completed: ``scontrol show job`` is asked, and only if the
controller does not know it either is the block MISSING. A job ended by preemption
(``PREEMPTED``, or cancelled with the ``DUE TO PREEMPTION`` line in its stderr) is
PREEMPTED. A failed block's detail carries the head and tail of its stderr file.

Slurm unreachable (``slurmctld`` down, a command missing, ``sbatch`` refusing) is a
:class:`~runtime.errors.BatchSystemError` naming the command, its exit code and stderr:
``start_block`` raises it; the refresher records it (:attr:`SlurmProvider.error`) and
backs off; nothing here crashes whoever drives the provider (``stop_block`` retries a
failed ``scancel`` later instead of raising). After ``max_failures`` refused submissions
among the last ``window`` the provider stops submitting
(:class:`~runtime.errors.SubmissionsSuspended`) until :meth:`SlurmProvider.resume`; a
controller that cannot be reached (:func:`unreachable`: connection failures, no answer
in time) is no refusal: the provider backs off and submits again, however long it lasts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import re
import shlex
import stat
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import anyio
import anyio.abc

from actors.processes import run_command
from actors.providers import Block, BlockSpec, BlockState, Provider, accelerator_env
from runtime.errors import BatchSystemError, SubmissionsSuspended, WalltimeError
from runtime.log import get_logger

__all__ = [
    "HOST_PLACEHOLDER",
    "SQUEUE_FORMAT",
    "TOO_FEW_GPUS",
    "FailureWindow",
    "Incarnation",
    "JobInfo",
    "JobRecord",
    "SlurmOptions",
    "SlurmProvider",
    "batch_script",
    "block_state",
    "exit_text",
    "gpus_asked",
    "head_tail",
    "own_lines_advice",
    "parse_scontrol_job",
    "parse_seconds",
    "parse_squeue",
    "parse_walltime",
    "slurm_time",
    "unreachable",
    "walltime_seconds",
]

_log = get_logger("corral", component="slurm")

# ----------------------------------------------------------------------------- parsing

#: ``squeue -O`` fields, each followed by ``|`` (the ``:|`` suffix), in this order.
SQUEUE_FIELDS = ("JobID", "State", "Reason", "RestartCnt", "Exit_Code", "NodeList")
SQUEUE_FORMAT = ",".join(f"{name}:|" for name in SQUEUE_FIELDS)

#: What squeue and scontrol print for a job id the controller does not know.
_INVALID_JOB = "Invalid job id specified"

PREEMPTION_LINE = "DUE TO PREEMPTION"


@dataclasses.dataclass(frozen=True, slots=True)
class JobInfo:
    """One job as Slurm reports it."""

    job_id: str
    state: str  #: Slurm's long state name (RUNNING, PREEMPTED, ...), without "+"
    reason: str = ""
    restarts: int = 0  #: times Slurm requeued it
    exit_code: str = ""
    nodes: str = ""


def _state_name(raw: str) -> str:
    # scontrol may print e.g. "CANCELLED by 0"; squeue -t all prints long names.
    return raw.split()[0].rstrip("+").upper() if raw.strip() else ""


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        return 0


def parse_squeue(text: str) -> dict[str, JobInfo]:
    """Jobs by id from ``squeue -h -t all -O`` :data:`SQUEUE_FORMAT` output.

    Lines that do not have the fields are skipped (a warning Slurm printed on stdout).
    An array or heterogeneous job's sub-ids (``12_3``, ``12+1``) are kept as printed.
    """
    jobs: dict[str, JobInfo] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) < len(SQUEUE_FIELDS) or not fields[0]:
            continue
        job_id, state, reason, restarts, exit_code, nodes = fields[: len(SQUEUE_FIELDS)]
        if not state:
            continue
        jobs[job_id] = JobInfo(job_id, _state_name(state), reason, _int(restarts), exit_code, nodes)
    return jobs


_KV = re.compile(r"(?:^|\s)([A-Za-z][\w/:]*)=(\S*)")


def parse_scontrol_job(text: str) -> JobInfo | None:
    """The job in ``scontrol show job ID`` output, or None when the controller does not
    know it (``Invalid job id specified``) or the text holds no job."""
    if _INVALID_JOB in text:
        return None
    fields = dict(_KV.findall(text))
    job_id, state = fields.get("JobId"), fields.get("JobState")
    if not job_id or not state:
        return None
    return JobInfo(
        job_id,
        _state_name(state),
        fields.get("Reason", ""),
        _int(fields.get("Restarts", "0")),
        fields.get("ExitCode", ""),
        fields.get("NodeList", ""),
    )


#: Slurm job state -> block state. Not here: unknown names (the block keeps its state).
_STATES: Mapping[str, BlockState] = {
    "PENDING": BlockState.PENDING,
    "CONFIGURING": BlockState.PENDING,  # nodes allocated and booting: no worker yet
    "REQUEUED": BlockState.PENDING,
    "REQUEUE_FED": BlockState.PENDING,
    "RESIZING": BlockState.RUNNING,
    "RUNNING": BlockState.RUNNING,
    "COMPLETING": BlockState.RUNNING,  # still holds its nodes; a requeue passes here
    "SIGNALING": BlockState.RUNNING,
    "STAGE_OUT": BlockState.RUNNING,
    "SUSPENDED": BlockState.HELD,
    "STOPPED": BlockState.HELD,
    "REQUEUE_HOLD": BlockState.HELD,
    "RESV_DEL_HOLD": BlockState.HELD,
    "COMPLETED": BlockState.COMPLETED,
    "CANCELLED": BlockState.CANCELLED,
    "REVOKED": BlockState.CANCELLED,
    "FAILED": BlockState.FAILED,
    "BOOT_FAIL": BlockState.FAILED,
    "NODE_FAIL": BlockState.FAILED,
    "OUT_OF_MEMORY": BlockState.OOM,  # its workers are lost with cause ``oom``
    "SPECIAL_EXIT": BlockState.FAILED,
    "DEADLINE": BlockState.TIMEOUT,
    "TIMEOUT": BlockState.TIMEOUT,
    "PREEMPTED": BlockState.PREEMPTED,
}

#: Short codes (``squeue -t`` and ``%t``) for the long names above.
SHORT_STATES: Mapping[str, str] = {
    "PD": "PENDING", "CF": "CONFIGURING", "RQ": "REQUEUED", "RF": "REQUEUE_FED",
    "RS": "RESIZING", "R": "RUNNING", "CG": "COMPLETING", "SI": "SIGNALING",
    "SO": "STAGE_OUT", "S": "SUSPENDED", "ST": "STOPPED", "RH": "REQUEUE_HOLD",
    "RD": "RESV_DEL_HOLD", "CD": "COMPLETED", "CA": "CANCELLED", "RV": "REVOKED",
    "F": "FAILED", "BF": "BOOT_FAIL", "NF": "NODE_FAIL", "OOM": "OUT_OF_MEMORY",
    "SE": "SPECIAL_EXIT", "DL": "DEADLINE", "TO": "TIMEOUT", "PR": "PREEMPTED",
}  # fmt: skip


def block_state(slurm_state: str) -> BlockState | None:
    """The block state of a job in ``slurm_state`` (a long name, or a short code such as
    ``PR``); None for a state this version does not know."""
    name = _state_name(slurm_state)
    return _STATES.get(SHORT_STATES.get(name, name))


def exit_text(raw: str) -> str:
    """How a job exited, from scontrol's ``ExitCode=3:0`` (code:signal) or squeue's
    ``Exit_Code`` (a wait status: ``768`` is exit code 3, ``15`` is signal 15)."""
    code, _, sig = raw.partition(":")
    if not code.isdigit() or (sig and not sig.isdigit()):
        return f"exit code {raw}"
    if sig:
        status, signum = int(code), int(sig)
    else:
        status, signum = int(code) >> 8, int(code) & 0x7F
    return f"killed by signal {signum}" if signum else f"exit code {status}"


def head_tail(text: str, lines: int = 10, width: int = 300) -> str:
    """The first and last ``lines`` lines of ``text`` (all of it when short), each cut
    to ``width`` characters."""
    rows = [
        r if len(r) <= width else f"{r[:width]} [... {len(r) - width} characters]"
        for r in text.rstrip("\n").splitlines()
    ]
    if len(rows) <= 2 * lines:
        return "\n".join(rows)
    skipped = len(rows) - 2 * lines
    return "\n".join([*rows[:lines], f"[... {skipped} lines ...]", *rows[-lines:]])


#: what Slurm's commands print when the controller cannot be reached or is too busy to
#: answer (lower case): a failure that passes by itself, unlike a refusal
UNREACHABLE = (
    "unable to contact slurm controller",
    "connect failure",
    "connection refused",
    "connection timed out",
    "socket timed out",
    "zero bytes were transmitted or received",
    "backup controller in standby mode",
    "resource temporarily unavailable",
)


def unreachable(exit_code: int | None, stderr: str) -> bool:
    """Whether a Slurm command that failed with ``exit_code`` (None: it did not run or
    did not answer in time) and printed ``stderr`` failed because the controller could
    not be reached (down, restarting, too busy: it may answer the next time), rather
    than because it refused the request (a partition, account or QOS that does not
    exist or does not take the job) or the command is missing."""
    said = stderr.lower()
    if exit_code is None:
        return said.startswith("no answer within")
    return any(mark in said for mark in UNREACHABLE)


def _preemptions(stderr: str, job_id: str) -> int:
    """How many times the stderr of job ``job_id`` says it was preempted."""
    mark = f"JOB {job_id} "
    return sum(1 for line in stderr.splitlines() if PREEMPTION_LINE in line and mark in line)


# ----------------------------------------------------------------------------- job records


@dataclasses.dataclass(frozen=True, slots=True)
class Incarnation:
    """One run of a block's job that ended with the job requeued (same id)."""

    number: int  #: 0 for the first run
    cause: str  #: "preempted" or "requeued" (until a later look finds its preemption line)
    slurm_state: str  #: the last state seen in that run


@dataclasses.dataclass(slots=True)
class JobRecord:
    """What the provider knows of one block's job. Pure: :meth:`observe` takes what
    Slurm said and returns the block state (it changes nothing outside the record)."""

    job_id: str
    state: BlockState = BlockState.PENDING
    slurm_state: str = "PENDING"
    reason: str = ""
    restarts: int = 0  #: the current incarnation (Slurm's Restarts)
    ran: bool = False  #: the current incarnation was seen running
    stopping: bool = False  #: we cancelled it (scancel): it ends SCALED_IN
    incarnations: list[Incarnation] = dataclasses.field(default_factory=list)
    detail: str = ""
    stderr_path: str = ""  #: the job's stderr file, named in the detail of a bad end

    def observe(self, info: JobInfo | None, stderr: str = "") -> BlockState:
        """Apply what Slurm says of the job: ``info`` from ``squeue`` or, for a job that
        vanished from ``squeue``, from ``scontrol show job`` (None: unknown there too).
        ``stderr`` is the job's stderr file (read when the job may have ended by
        preemption or failed, and after a requeue whose cause may still change): at every
        look its ``DUE TO PREEMPTION`` lines for this job make the earliest incarnations
        recorded ``requeued`` ``preempted`` while they outnumber the preempted ones (the
        line may come after the look that saw the requeue; a cause is never made
        ``requeued`` again). A block that reached a terminal state keeps it."""
        if self.state.terminal:
            return self.state
        if info is None:
            self.state = BlockState.SCALED_IN if self.stopping else BlockState.MISSING
            self.detail = (
                f"Slurm job {self.job_id} is in neither squeue nor scontrol show job: "
                "the controller no longer knows it (purged after MinJobAge, or the "
                "controller lost its state); how it ended is unknown"
            )
            return self.state
        lines = _preemptions(stderr, self.job_id)
        if info.restarts > self.restarts or (
            self.ran and block_state(info.state) == BlockState.PENDING
        ):
            ended = max(info.restarts - self.restarts, 1)  # requeues since the last look
            for k in range(ended):
                last = self.slurm_state if k == 0 else "unseen"
                self.incarnations.append(Incarnation(self.restarts + k, "requeued", last))
            self.restarts += ended
            self.ran = False
        mapped = block_state(info.state)
        # A preemption that ends the job (cancelled rather than requeued) has its line
        # too: that one is not an earlier requeue's.
        ends_preempted = mapped == BlockState.PREEMPTED or (
            mapped in (BlockState.CANCELLED, BlockState.FAILED) and lines > len(self.incarnations)
        )
        self._preempted(lines - 1 if ends_preempted else lines)
        self.slurm_state, self.reason = info.state, info.reason
        if mapped is None:  # a state this version does not know: keep ours
            self.detail = f"Slurm job {self.job_id} in state {info.state} (unknown to Corral)"
            return self.state
        if info.state == "COMPLETING" and not self.ran:
            # The end of the run just requeued (Restarts already counts the next
            # incarnation), or of one never seen running: no worker of this one runs.
            mapped = BlockState.PENDING
        elif mapped == BlockState.RUNNING:
            self.ran = True
        if mapped in (BlockState.CANCELLED, BlockState.FAILED) and ends_preempted:
            mapped = BlockState.PREEMPTED  # preempted, though the state says otherwise
        if mapped.terminal and self.stopping and mapped != BlockState.PREEMPTED:
            mapped = BlockState.SCALED_IN
        self.state = mapped
        self.detail = self._describe(info, stderr)
        return self.state

    def _preempted(self, lines: int) -> None:
        """Give the stderr's ``lines`` preemption lines to the requeues: the earliest
        incarnations still ``requeued`` become ``preempted`` while there are more lines
        than preempted incarnations. slurmstepd writes its line on its own time, so the
        look that sees a requeue may come before the line: a later look corrects the
        cause (never the other way: a line does not go away)."""
        preempted = sum(1 for i in self.incarnations if i.cause == "preempted")
        for n, inc in enumerate(self.incarnations):
            if preempted >= lines:
                return
            if inc.cause == "requeued":
                self.incarnations[n] = dataclasses.replace(inc, cause="preempted")
                preempted += 1

    def _describe(self, info: JobInfo, stderr: str) -> str:
        what = f"Slurm job {self.job_id} {info.state}"
        if info.reason and info.reason != "None":
            what += f" ({info.reason})"
        if self.restarts:
            last = self.incarnations[-1].cause if self.incarnations else "requeued"
            what += f"; incarnation {self.restarts + 1} (Restarts={self.restarts}, last {last})"
        if self.state in (BlockState.FAILED, BlockState.OOM, BlockState.TIMEOUT) and (
            info.exit_code
        ):
            what += f"; {exit_text(info.exit_code)}"
        ended_badly = (BlockState.FAILED, BlockState.OOM, BlockState.TIMEOUT, BlockState.PREEMPTED)
        if self.state not in ended_badly:
            return what
        where = f" ({self.stderr_path})" if self.stderr_path else ""
        if stderr.strip():
            what += f"; stderr{where}:\n{head_tail(stderr)}"
        elif where:
            what += f"; stderr{where} is empty"
        return what


# ----------------------------------------------------------------------------- failures


class FailureWindow:
    """Back-off and the windowed stop for submissions, after Parsl's windowed error
    handler. Pure: the caller passes ``now``.

    Each submission's outcome is recorded; after a failure the next one waits
    ``backoff`` seconds, doubled after each further failure in a row up to
    ``max_backoff``. When ``max_failures`` of the last ``window`` outcomes are refusals
    the window *trips*: no submission until :meth:`resume`. A failure that is no
    refusal (``transient``: the batch system could not be reached) backs off the same
    way but never trips it: the next submission that goes through ends it.
    """

    def __init__(
        self,
        max_failures: int = 3,
        window: int = 5,
        *,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        name: str = "Slurm",
    ) -> None:
        if not 1 <= max_failures <= window:
            raise ValueError(f"need 1 <= max_failures <= window, got {max_failures}, {window}")
        self.max_failures = max_failures
        self.window = window
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.name = name
        self.outcomes: deque[bool] = deque(maxlen=window)  #: True: it failed
        self.streak = 0  #: failures in a row
        self.retry_at = -math.inf  #: no submission before this time
        self.tripped = False
        self.last_error = ""

    @property
    def failures(self) -> int:
        return sum(self.outcomes)

    def check(self, now: float, pool: str = "") -> None:
        """Raise if no submission may be made at ``now``: :class:`SubmissionsSuspended`
        (naming ``pool``, the one to resume) once tripped, :class:`BatchSystemError` while
        backing off."""
        if self.tripped:
            raise SubmissionsSuspended(self.name, self.failures, self.window, self.last_error, pool)
        if now < self.retry_at:
            raise BatchSystemError(
                "sbatch",
                None,
                "",
                f"Not submitting for another {self.retry_at - now:.1f} s: backing off after "
                f"{self.streak} failed submission(s) in a row (the last: {self.last_error})",
            )

    def record(self, now: float, error: str | None, transient: bool = False) -> None:
        """A submission at ``now`` succeeded (``error`` None) or failed with ``error``:
        refused, or (``transient``) not answered."""
        if not transient:
            self.outcomes.append(error is not None)
        if error is None:
            self.streak = 0
            self.retry_at = -math.inf
            return
        self.streak += 1
        self.last_error = error
        self.retry_at = now + min(self.backoff * 2 ** (self.streak - 1), self.max_backoff)
        if self.failures >= self.max_failures:
            self.tripped = True

    def resume(self) -> None:
        """An operator fixed the cause: submit again, with a clean window."""
        self.tripped = False
        self.outcomes.clear()
        self.streak = 0
        self.retry_at = -math.inf


# ----------------------------------------------------------------------------- the script


#: what a walltime may be (and any other duration of a pool's configuration)
TIME_FORMS = (
    "seconds (a number, e.g. 5400) or a Slurm time 'MM', 'MM:SS', 'HH:MM:SS', 'D-HH', "
    "'D-HH:MM' or 'D-HH:MM:SS' (sbatch --time's forms: e.g. '90' is 90 minutes, "
    "'1-12:00:00' a day and a half)"
)

# sbatch --time: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
# "days-hours:minutes", "days-hours:minutes:seconds" (man sbatch)
_SLURM_TIME = re.compile(r"(?:([0-9]+)-)?([0-9]+)(?::([0-9]+))?(?::([0-9]+))?")


def parse_seconds(value: object) -> float:
    """Seconds of a duration: a number (>= 0), or a Slurm time string read as ``sbatch
    --time`` reads it (:data:`TIME_FORMS`). Like Slurm, a field may be larger than its
    unit ("00:90:00" is 90 minutes, "1-24" two days): each counts for what it is.
    ValueError (what a duration may be, and the value) otherwise."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and value >= 0:
            return float(value)
    elif isinstance(value, str):
        m = _SLURM_TIME.fullmatch(value.strip())
        if m is not None:
            fields = [int(f) for f in m.groups()[1:] if f is not None]
            if m.group(1) is None and len(fields) < 3:  # MM, MM:SS: no hours
                fields.insert(0, 0)
            h, mins, secs = fields + [0] * (3 - len(fields))  # D-HH, D-HH:MM: no seconds
            return float(((int(m.group(1) or 0) * 24 + h) * 60 + mins) * 60 + secs)
    raise ValueError(f"must be {TIME_FORMS}, got {value!r}")


def parse_walltime(value: object) -> float:
    """Seconds of a walltime (:func:`parse_seconds`, more than 0), wherever it comes
    from: a pool's configuration, :class:`SlurmOptions`. WalltimeError otherwise."""
    try:
        seconds = parse_seconds(value)
    except ValueError as exc:
        raise WalltimeError(value, str(exc)) from None
    if seconds == 0:
        raise WalltimeError(
            value,
            "must be more than 0 (leave it out for no limit: on Slurm, the partition's "
            f"default): {TIME_FORMS}, got {value!r}",
        )
    return seconds


def walltime_seconds(walltime: object) -> int:
    """Whole seconds of a walltime (:func:`parse_walltime`), rounded up."""
    return math.ceil(parse_walltime(walltime))


def slurm_time(walltime: object) -> str:
    """``--time`` for a walltime (:func:`parse_walltime`): ``HH:MM:SS`` or
    ``D-HH:MM:SS``, whole seconds rounded up (Slurm rounds them up to minutes)."""
    days, rest = divmod(walltime_seconds(walltime), 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{days}-{h:02d}:{m:02d}:{s:02d}" if days else f"{h:02d}:{m:02d}:{s:02d}"


@dataclasses.dataclass(frozen=True, slots=True)
class SlurmOptions:
    """The ``#SBATCH`` side of a pool (Parsl's names where they mean the same)."""

    partition: str = ""
    account: str = ""
    qos: str = ""
    nodes_per_block: int = 1
    cores_per_node: int = 0  #: 0: workers per node x threads per worker
    mem_per_node: int = 0  #: bytes; 0: workers per node x the spec's memory (if set)
    #: seconds or a Slurm time (:func:`parse_walltime`); None: the partition's default
    walltime: float | str | None = None
    exclusive: bool = False
    #: ``#SBATCH`` lines (and ``#`` comments) put after the generated ones
    scheduler_options: str = ""
    #: shell lines run (under ``set -e``) before the workers start: modules, variables
    worker_init: str = ""
    signal_warning: int = 0  #: seconds: --signal=B:TERM@N (0: none)
    #: the accelerators of each node (device ids, e.g. ``("0", "1")``): the i-th worker
    #: on a node is pinned to the i-th (:func:`~actors.providers.accelerator_env`);
    #: empty: none pinned
    accelerators: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.nodes_per_block < 1:
            raise ValueError(f"nodes_per_block must be >= 1, got {self.nodes_per_block}")
        if self.walltime is not None:
            parse_walltime(self.walltime)
        problem = scheduler_options_problem(self.scheduler_options)
        if problem:
            raise ValueError(f"scheduler_options {problem}")


#: what a block's stderr says when a command of its ``worker_init`` failed
WORKER_INIT_FAILED = "corral: worker_init failed"

_DIRECTIVE = re.compile(r"#SBATCH\s+\S")
_NEAR_DIRECTIVE = re.compile(r"#\s*sbatch", re.IGNORECASE)


def scheduler_options_problem(text: str) -> str:
    """What is wrong with ``scheduler_options`` ("" for nothing). sbatch reads options
    only from lines starting ``#SBATCH`` before the script's first command: any other
    line would run as a shell command (and end the options), and a misspelt directive
    is a comment, so either way the option would be silently dropped."""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or _DIRECTIVE.match(stripped):
            continue
        near = _NEAR_DIRECTIVE.match(stripped)
        if stripped.startswith("#") and not near:
            continue  # a comment
        option = stripped[near.end() :].strip() if near else stripped
        fix = (
            f"write '#SBATCH {option or '--option'}'"
            if near or option.startswith("-")
            else "put shell commands in worker_init"
        )
        return (
            f"must be '#SBATCH ...' directives (or '#' comments), one a line: line {number}, "
            f"{stripped!r}, is not, and sbatch would not apply it: {fix}"
        )
    return ""


def batch_script(
    *,
    block_id: str,
    job_name: str,
    workers: Sequence[tuple[str, Sequence[str]]],
    spec: BlockSpec,
    options: SlurmOptions,
    output: Path,
    error: Path,
    env_file: Path | None,
    script: Path,
    chdir: Path | None = None,
) -> str:
    """The batch script of a block: ``#SBATCH`` lines, then the workers (``(worker id,
    argv)`` each, spread evenly over ``options.nodes_per_block`` nodes), started in the
    background with ``CORRAL_WORKER_ID`` and ``CORRAL_BLOCK_ID`` (and, with
    ``options.accelerators``, each node's i-th worker with the variables that pin it to
    the i-th accelerator: :func:`~actors.providers.accelerator_env`); SIGTERM to the batch
    shell is passed to them and the script waits for them all. Arguments are quoted
    for the shell, except that ``{host}`` in one becomes the node's address."""
    nodes = options.nodes_per_block
    if not workers or len(workers) % nodes:
        raise ValueError(f"{len(workers)} workers do not spread evenly over {nodes} nodes")
    per_node = len(workers) // nodes
    if options.accelerators and per_node > len(options.accelerators):
        raise ValueError(
            f"{per_node} workers per node but {len(options.accelerators)} accelerators: "
            "each worker needs one of its own"
        )
    cores = options.cores_per_node or per_node * max(spec.threads, 1)
    mem = options.mem_per_node or per_node * spec.memory
    q = shlex.quote
    sb = [
        f"--job-name={job_name}",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={cores}",
        f"--output={output}",
        f"--error={error}",
        "--open-mode=append",  # a requeued job keeps what the earlier runs wrote
    ]
    if chdir is not None:
        sb.append(f"--chdir={chdir}")
    if options.partition:
        sb.append(f"--partition={options.partition}")
    if options.account:
        sb.append(f"--account={options.account}")
    if options.qos:
        sb.append(f"--qos={options.qos}")
    if mem:
        sb.append(f"--mem={math.ceil(mem / 2**20)}M")
    if options.walltime:
        sb.append(f"--time={slurm_time(options.walltime)}")
    if options.exclusive:
        sb.append("--exclusive")
    if options.signal_warning:
        sb.append(f"--signal=B:TERM@{int(options.signal_warning)}")
    lines = ["#!/bin/bash", *(f"#SBATCH {s}" for s in sb)]
    # Each line unindented: sbatch ignores an indented #SBATCH line (and those after it).
    lines += [ln.strip() for ln in options.scheduler_options.splitlines() if ln.strip()]
    lines += [
        "",
        f"# Corral block {block_id}: {len(workers)} worker(s) on {nodes} node(s), written by",
        "# SlurmProvider. Each worker joins the manager under the id the block records.",
    ]
    if nodes > 1:
        lines += [
            'if [ "${1:-}" != --node ]; then  # the batch shell: one task per node',
            f"    exec srun --nodes={nodes} --ntasks={nodes} --ntasks-per-node=1 "
            f"--kill-on-bad-exit=1 /bin/bash {q(str(script))} --node",
            "fi",
        ]
    lines += [
        'echo "corral: block ' + block_id + ", Slurm job ${SLURM_JOB_ID:-?}, incarnation "
        '$(( ${SLURM_RESTART_COUNT:-0} + 1 )), node ${SLURM_NODEID:-0} on $(hostname)" >&2',
    ]
    if options.worker_init.strip():
        # A command of worker_init that fails ends the job (set -e) and says so: the
        # block fails with its stderr rather than starting workers in the wrong setting.
        lines += [
            "# worker_init (set -e: a command that fails stops the block)",
            f"trap 'echo \"{WORKER_INIT_FAILED} (exit status $?): no worker started\" >&2' EXIT",
            "set -e",
            options.worker_init.strip("\n"),
            "set +e",
            "trap - EXIT",
        ]
    if env_file is not None:
        lines.append(f". {q(str(env_file))}  # CORRAL_TOKEN and the rest of env (mode 0600)")
    lines += [
        "# {host} in a worker's arguments: this node's first address (hostname -I).",
        'CORRAL_NODE_HOST=$(hostname -I 2>/dev/null | cut -d" " -f1)',
        "export CORRAL_NODE_HOST=${CORRAL_NODE_HOST:-$(hostname)}",
        "export PYTHONUNBUFFERED=1",
    ]
    if options.walltime:
        # Each worker knows when its walltime ends (--deadline's default): it is
        # drained before it, and a signal near it is the walltime, not a preemption.
        seconds = walltime_seconds(options.walltime)
        lines.append(f"export CORRAL_DEADLINE=$(( $(date +%s) + {seconds} ))")
        if options.signal_warning:
            # Signalled this long before it: a stop from then on is the walltime too.
            lines.append(f"export CORRAL_SIGNAL_WARNING={int(options.signal_warning)}")
    if options.accelerators:
        lines += _gpu_lines(options.accelerators[:per_node])
    lines += [
        "pids=()",
        "# Preemption, scancel or --signal: pass SIGTERM to the workers (they leave cleanly).",
        "trap 'kill -TERM \"${pids[@]}\" 2>/dev/null' TERM INT",
        'case "${SLURM_NODEID:-0}" in',
    ]
    for node in range(nodes):
        lines.append(f"{node})")
        for place, (wid, argv) in enumerate(workers[node * per_node : (node + 1) * per_node]):
            cmd = " ".join(_shell_arg(a) for a in argv)
            # The node's place-th worker: the place-th accelerator, set before it starts.
            pin = "".join(
                f"{k}={v} " for k, v in accelerator_env(f'"${{{GPU_ARRAY}[{place}]}}"').items()
            ) if options.accelerators else ""  # fmt: skip
            lines.append(
                f"    {pin}CORRAL_WORKER_ID={q(wid)} CORRAL_BLOCK_ID={q(block_id)} {cmd} &"
            )
            lines.append("    pids+=($!)")
        lines.append("    ;;")
    lines += [
        "esac",
        "status=0",
        'for pid in "${pids[@]}"; do',
        "    while true; do",
        '        wait "$pid"',
        "        rc=$?",
        '        kill -0 "$pid" 2>/dev/null || break  # else a signal interrupted the wait',
        "    done",
        '    [ "$rc" -eq 0 ] || [ "$status" -ne 0 ] || status=$rc  # the first failure',
        "done",
        'exit "$status"',
        "",
    ]
    return "\n".join(lines)


def private_run_dir(path: Path) -> None:
    """Make ``path`` (and the directories missing above it) mode 0700, and check that it
    is this user's directory and that no other user can write in it or in the directory
    it is in: a block's job sources its env file (the worker token) from it when it
    starts, perhaps hours after sbatch, so whoever can write there, or rename it away
    and put a directory of theirs in its place, can run code as this user. Else
    ``PermissionError`` saying what to do (:func:`run_dir_problem`)."""
    missing = [d for d in (path, *path.parents) if not d.exists()]
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=0o700)
    problem = run_dir_problem(path)
    if problem is not None:
        raise PermissionError(problem)


def run_dir_problem(path: Path) -> str | None:
    """Why :func:`private_run_dir` refuses ``path`` as it is now, with what to do; None
    if it takes it. Changes nothing: a directory missing (``path``, or the one it is
    in) is not a problem, as it is made this user's, mode 0700 (so ``check`` says what
    the manager will do)."""
    for d, what in ((path, "the Slurm run directory"), (path.parent, "the directory it is in")):
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            continue
        why = ""
        if not stat.S_ISDIR(st.st_mode):
            why = "is not a directory (a symbolic link, say)"
        elif d == path and st.st_uid != os.geteuid():
            why = f"belongs to another user (uid {st.st_uid})"
        elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            why = f"lets other users write in it ({stat.filemode(st.st_mode)})"
        if why:
            return (
                f"{what}, {d}, {why}: the batch jobs read the workers' token and the "
                "commands they run from files there when they start, so another user "
                f"could run code as you. Run the manager with --run-dir DIR (run_dir=) in a "
                f"directory only you can write, or make it yours only (chmod go-w {d})"
            )
    return None


#: the script's array of the node's workers' devices, in order (``_gpu_lines``)
GPU_ARRAY = "corral_gpus"
#: what a block's stderr says when Slurm gave its job fewer GPUs than its node's workers
TOO_FEW_GPUS = "corral: too few GPUs"


def _gpu_lines(ids: Sequence[str]) -> list[str]:
    """The script lines that fill :data:`GPU_ARRAY` with the devices of a node's workers
    (``ids``: the pool's ``accelerators``, one per worker of the node, in order). A
    numeric id N is the job's N-th GPU on the node as Slurm lists them in the job's
    ``CUDA_VISIBLE_DEVICES`` (else ``ROCR_VISIBLE_DEVICES``): the GPUs themselves where
    Slurm does not confine a job to its GPUs (``ConstrainDevices``), so that two blocks
    sharing a node never share a GPU; ``0`` to ``N-1`` where it does, the same GPUs.
    A job Slurm gave no GPU (no ``SLURM_JOB_GPUS`` nor ``SLURM_STEP_GPUS``), and an id
    that is not a number (a MIG or GPU UUID), take the id as written. An id past the
    job's GPUs on the node ends the block before any worker starts, saying so."""
    q = shlex.quote
    return [
        "# accelerators: worker i of this node is pinned to the i-th id; a numeric id N is",
        "# the N-th GPU Slurm gave this job here (its CUDA_VISIBLE_DEVICES), so that the",
        "# workers of two blocks sharing a node never share a GPU.",
        f"{GPU_ARRAY}=({' '.join(q(i) for i in ids)})",
        "corral_job_gpus=${CUDA_VISIBLE_DEVICES:-${ROCR_VISIBLE_DEVICES:-}}",
        'if [ -n "${SLURM_JOB_GPUS:-}${SLURM_STEP_GPUS:-}" ] && [ -n "$corral_job_gpus" ]; then',
        '    IFS=, read -r -a corral_given <<<"$corral_job_gpus"',
        f'    for i in "${{!{GPU_ARRAY}[@]}}"; do',
        f"        id=${{{GPU_ARRAY}[$i]}}",
        '        case "$id" in *[!0-9]*) continue ;; esac  # a MIG or GPU UUID: as written',
        '        if [ "$id" -ge "${#corral_given[@]}" ]; then',
        f"            echo \"{TOO_FEW_GPUS}: worker $i of this node is pinned to the job's GPU"
        " $id (its accelerators, counted from 0), but Slurm gave this job"
        " ${#corral_given[@]} GPU(s) here (CUDA_VISIBLE_DEVICES=$corral_job_gpus): ask for"
        " $((id + 1)) GPUs a node (#SBATCH --gres=gpu:$((id + 1)) in the pool's"
        ' scheduler_options) or run fewer workers per node; no worker started" >&2',
        "            exit 1",
        "        fi",
        f"        {GPU_ARRAY}[$i]=${{corral_given[$id]}}",
        "    done",
        '    echo "corral: Slurm gave this job the GPUs $corral_job_gpus here; workers pinned'
        f' to ${{{GPU_ARRAY}[*]}}" >&2',
        "fi",
    ]


#: ``#SBATCH`` options that never make Slurm refuse a job for its nodes (its name,
#: where its output goes, whom it mails...): :func:`own_lines_advice` leaves them out
_NOT_FOR_NODES = frozenset(
    {"job-name", "J", "output", "o", "error", "e", "open-mode", "mail-type", "mail-user",
     "comment", "chdir", "D", "requeue", "no-requeue", "signal", "export", "get-user-env",
     "parsable", "quiet", "Q", "verbose", "v"}
)  # fmt: skip


def _asks_for_nodes(directive: str) -> bool:
    """Whether an ``#SBATCH`` line may be why Slurm refuses a job (not one of
    :data:`_NOT_FOR_NODES`)."""
    option = directive[len("#SBATCH") :].split()[0]
    name = option.lstrip("-").split("=", 1)[0]
    if not option.startswith("--"):
        name = name[:1]  # a short option and its value: -Jsky
    return name not in _NOT_FOR_NODES


def own_lines_advice(scheduler_options: str) -> str:
    """What to check of a refused job's own ``#SBATCH`` lines (``scheduler_options``):
    ", and the pool's scheduler_options (LINES: features and GRES the nodes have:
    `sinfo -o '%P %f %G'`)", or "" without any; a line that cannot be why (its
    ``--job-name``, ``--output``, ``--mail-user``: :data:`_NOT_FOR_NODES`) is left out."""
    directives = [ln.strip() for ln in scheduler_options.splitlines()]
    lines = " ".join(ln for ln in directives if _DIRECTIVE.match(ln) and _asks_for_nodes(ln))
    if not lines:
        return ""
    return (
        f", and the pool's scheduler_options ({lines}: features and GRES the nodes have: "
        "`sinfo -o '%P %f %G'`)"
    )


_GPU_OPTION = re.compile(
    r"(?<!\S)(?:--(?P<name>gres|gpus-per-node|gpus-per-task|gpus)|-G)(?:=|\s+)?(?P<value>\S+)"
)


def gpus_asked(scheduler_options: str, nodes: int = 1) -> int | None:
    """The GPUs a node of a block with these ``scheduler_options`` asks Slurm for:
    ``--gres=gpu:N`` (or ``gpu:TYPE:N``, ``gpu`` alone: 1), ``--gpus-per-node=N``,
    ``--gpus-per-task=N`` (a block runs one task per node), ``--gpus=N`` or ``-G N``
    (the job's, over its ``nodes``). None: no ``#SBATCH`` line asks for GPUs; 0: one
    does, in a form whose count is not read here."""
    asked: int | None = None
    for line in scheduler_options.splitlines():
        line = line.strip()
        if not _DIRECTIVE.match(line):
            continue
        for m in _GPU_OPTION.finditer(line[len("#SBATCH") :]):
            name, value = m.group("name") or "gpus", m.group("value")
            if name == "gres":
                items = [i for i in value.split(",") if i.split(":")[0] == "gpu"]
                if not items:
                    continue
                count = items[0].split(":")[-1] if ":" in items[0] else "1"
            else:
                count = value.split(":")[-1]
            n = int(count) if count.isdigit() else 0
            if name == "gpus" and n:
                n = n // max(nodes, 1)
            asked = n
    return asked


HOST_PLACEHOLDER = "{host}"
"""In a worker's argument, stands for the address of the node it runs on (e.g.
``["--host", "{host}"]``, so that its peers on other nodes reach it)."""


def _shell_arg(arg: str) -> str:
    """``arg`` quoted for the shell, with :data:`HOST_PLACEHOLDER` left to expand."""
    parts = arg.split(HOST_PLACEHOLDER)
    if len(parts) == 1:
        return shlex.quote(arg)
    return '"$CORRAL_NODE_HOST"'.join(shlex.quote(p) if p else "" for p in parts)


# ----------------------------------------------------------------------------- the provider


@dataclasses.dataclass(slots=True)
class _Job:
    block: Block
    record: JobRecord
    script: Path
    stdout: Path
    stderr: Path
    ended: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    cancel_pending: bool = False  #: scancel failed: retried by the refresher
    stderr_size: int = -1  #: the stderr file's size when it was last read
    held: int = 0  #: the block's incarnation when a requeue's report was held a look


_ADVICE = {
    "sbatch": "The Slurm controller does not answer (check `scontrol ping`, `sinfo`): the "
    "pool's blocks are requested again after a back-off, and the run goes on once it "
    "answers.",
    "squeue": "The Slurm controller does not answer (`scontrol ping`); block states are "
    "the last ones seen until it does. Asking again after a back-off.",
    "scancel": "The job will be cancelled again once the controller answers.",
    "scontrol": "Could not ask the controller about a job that left squeue; asking again "
    "at the next status interval.",
}


class SlurmProvider(Provider):
    """Blocks of workers as Slurm batch jobs (see the module's docstring).

    Run it with ``async with provider.running():`` (or ``await tg.start(provider.run)``),
    which runs
    the refresher, one ``squeue`` every ``status_interval`` seconds for all live blocks
    (backing off up to ``max_status_interval`` while Slurm does not answer). Leaving it
    cancels the jobs of every live block (``scancel``) unless ``cancel_on_exit=False``.

    ``argv_for(block_id, index)`` is each worker's command line; ``env`` is exported to
    the workers from a file of ``run_dir`` readable by this user only. Scripts and the
    jobs' stdout/stderr files are kept in ``run_dir`` (default ``./corral-slurm/run-<time>-
    <pid>``); with several nodes per block it must be on a file system every node sees.
    ``slurm_conf`` sets ``SLURM_CONF`` for the commands (default: the environment's).
    """

    slow_start = True

    def __init__(
        self,
        argv_for: Callable[[str, int], Sequence[str]],
        options: SlurmOptions | None = None,
        *,
        env: Mapping[str, str] | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        chdir: str | os.PathLike[str] | None = None,
        prefix: str = "slurm",
        status_interval: float = 5.0,
        max_status_interval: float = 60.0,
        command_timeout: float = 30.0,
        max_failures: int = 3,
        window: int = 5,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        slurm_conf: str | os.PathLike[str] | None = None,
        cancel_on_exit: bool = True,
    ) -> None:
        self.argv_for = argv_for
        self.options = options or SlurmOptions()
        self.env = dict(env or {})
        if run_dir is None:
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            run_dir = Path.cwd() / "corral-slurm" / f"run-{stamp}-{os.getpid()}"
        self.run_dir = Path(run_dir).absolute()
        self.chdir = None if chdir is None else Path(chdir).absolute()
        self.prefix = prefix
        self.status_interval = status_interval
        self.max_status_interval = max_status_interval
        self.command_timeout = command_timeout
        self.failures = FailureWindow(
            max_failures, window, backoff=backoff, max_backoff=max_backoff, name="Slurm"
        )
        self.slurm_conf = None if slurm_conf is None else str(slurm_conf)
        self.cancel_on_exit = cancel_on_exit
        self.blocks: dict[str, Block] = {}  #: every block started, by id
        self.error: BatchSystemError | None = None  #: the latest failure; None once fine
        self.squeue_calls = 0  #: how many times the refresher ran squeue
        self.refreshes = 0  #: completed refreshes (successful or not)
        self._jobs: dict[str, _Job] = {}
        self._ids = 0
        self._tg: anyio.abc.TaskGroup | None = None
        self._refreshed = anyio.Event()
        self._log = _log

    # -- lifetime ------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Self]:
        """Run the refresher while entered (``async with provider.running():``). On
        leaving, the jobs of live blocks are cancelled (unless ``cancel_on_exit`` is
        False) and those blocks end SCALED_IN."""
        if self._tg is not None:
            raise RuntimeError("this SlurmProvider is already running")
        private_run_dir(self.run_dir)
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self._refresher)
            try:
                yield self
            finally:
                self._tg = None
                with anyio.CancelScope(shield=True):
                    await self._cancel_live()
                tg.cancel_scope.cancel()

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Provide until cancelled (``await tg.start(provider.run)``)."""
        async with self.running():
            task_status.started()
            await anyio.sleep_forever()

    async def _cancel_live(self) -> None:
        live = [j for j in self._jobs.values() if not j.block.state.terminal]
        if not live or not self.cancel_on_exit:
            return
        with anyio.move_on_after(self.command_timeout):
            try:
                await self._run("scancel", *(j.record.job_id for j in live))
            except BatchSystemError as err:
                self._log.error("could not cancel the jobs at exit", error=str(err))
        for job in live:
            job.record.stopping = True
            self._set(job, BlockState.SCALED_IN, "cancelled: the provider stopped")

    # -- Provider ------------------------------------------------------------------------

    async def start_block(self, spec: BlockSpec) -> Block:
        """Write the block's script and submit it; return the block, PENDING.

        Raises :class:`BatchSystemError` when ``sbatch`` fails (or while backing off
        after failures) and :class:`SubmissionsSuspended` once too many were refused
        (:class:`FailureWindow`; not answered is no refusal)."""
        if self._tg is None:
            raise RuntimeError("SlurmProvider is not running; use `provider.running()` or run()")
        if spec.workers < 1:
            raise ValueError(f"a block needs at least one worker, got {spec.workers}")
        self.failures.check(anyio.current_time(), spec.pool)
        self._ids += 1
        n = self._ids
        block_id = f"block-{n}"
        wids, text = self.block_script(n, spec)
        base = self.run_dir / block_id
        script = base.with_suffix(".sh")
        stdout, stderr = base.with_suffix(".out"), base.with_suffix(".err")
        if self.env:
            self._write_env(base.with_suffix(".env"))
        script.write_text(text)
        script.chmod(0o700)
        try:
            out = await self._run("sbatch", "--parsable", str(script))
        except BatchSystemError as err:
            self.failures.record(  # its advice: not now
                anyio.current_time(), err.failure, unreachable(err.exit_code, err.stderr)
            )
            self.error = err
            self._log.error("sbatch failed", pool=spec.pool, block=block_id, error=str(err))
            raise
        job_id = out.strip().split(";")[0]  # "ID" or "ID;cluster"
        if not job_id.isdigit():
            odd = BatchSystemError(
                "sbatch --parsable", 0, f"unexpected answer {out!r}", self._sbatch_advice(False)
            )
            self.failures.record(anyio.current_time(), odd.failure)
            self.error = odd
            raise odd
        self.failures.record(anyio.current_time(), None)
        self.error = None  # Slurm answered
        block = Block(block_id, spec, BlockState.PENDING, wids, f"Slurm job {job_id} submitted")
        self.blocks[block_id] = block
        record = JobRecord(job_id, stderr_path=str(stderr))
        self._jobs[block_id] = _Job(block, record, script, stdout, stderr)
        self._log.info(
            "block submitted", pool=spec.pool, block=block_id, job=job_id, script=str(script)
        )
        return block

    def block_script(self, n: int, spec: BlockSpec) -> tuple[list[str], str]:
        """The worker ids and the batch script of block ``block-<n>`` of ``spec``: what
        :meth:`start_block` writes to ``run_dir/block-<n>.sh`` (nothing is written here)."""
        block_id = f"block-{n}"
        wids = [
            f"{self.prefix}-{n}" if spec.workers == 1 else f"{self.prefix}-{n}.{i}"
            for i in range(spec.workers)
        ]
        base = self.run_dir / block_id
        text = batch_script(
            block_id=block_id, job_name=f"corral-{self.prefix}-{n}",
            workers=[(w, list(self.argv_for(block_id, i))) for i, w in enumerate(wids)],
            spec=spec, options=self.options, output=base.with_suffix(".out"),
            error=base.with_suffix(".err"), env_file=base.with_suffix(".env") if self.env else None,
            script=base.with_suffix(".sh"), chdir=self.chdir,
        )  # fmt: skip
        return wids, text

    async def stop_block(self, block: Block) -> None:
        """``scancel`` the block's job; SCALED_IN. A block that already ended keeps its
        state. If ``scancel`` fails (Slurm unreachable) the error is recorded and the
        refresher cancels the job once Slurm answers; this never raises for it."""
        job = self._job(block)
        if block.state.terminal:
            return
        job.record.stopping = True
        try:
            await self._run("scancel", job.record.job_id)
        except BatchSystemError as err:
            self.error = err
            job.cancel_pending = True
            block.detail = f"Slurm job {job.record.job_id}: scancel failed, retrying: {err}"
            self._log.error(
                "scancel failed; will retry", pool=block.spec.pool, block=block.block_id,
                error=str(err),
            )  # fmt: skip
        self._set(job, BlockState.SCALED_IN, f"Slurm job {job.record.job_id} cancelled by Corral")

    def poll(self, block: Block) -> BlockState:
        """The block's state as of the latest refresh (no Slurm command is run)."""
        return self._job(block).block.state

    async def wait_ended(self, block: Block) -> BlockState:
        job = self._job(block)
        await job.ended.wait()
        return block.state

    # -- extras --------------------------------------------------------------------------

    def record(self, block: Block) -> JobRecord:
        """The block's job: id, Slurm state, incarnations."""
        return self._job(block).record

    def script_path(self, block: Block) -> Path:
        return self._job(block).script

    def resume(self) -> None:
        """Submit again after the failure window stopped submissions."""
        if self.failures.tripped:
            self._log.warning("submissions resumed by an operator")
        self.failures.resume()

    def retry_in(self) -> float | None:
        left = self.failures.retry_at - anyio.current_time()
        return left if left > 0 else None

    def batch_error(self) -> Exception | None:
        return self.error

    def suspended(self) -> bool:
        return self.failures.tripped

    def status(self) -> dict[str, Any]:
        """What an operator needs: the latest error, whether submitting is suspended,
        and each block's job, Slurm state and incarnation."""
        return {
            "error": None if self.error is None else str(self.error),
            "suspended": self.failures.tripped,
            "recent_failures": self.failures.failures,
            "blocks": {
                bid: {
                    "job": j.record.job_id,
                    "state": j.block.state.value,
                    "slurm_state": j.record.slurm_state,
                    "incarnation": j.record.restarts + 1,
                    "detail": j.block.detail,
                }
                for bid, j in self._jobs.items()
            },
        }

    async def wait_refreshed(self) -> None:
        """Return after the next refresh (successful or not) has completed."""
        await self._refreshed.wait()

    # -- internals -----------------------------------------------------------------------

    def _job(self, block: Block) -> _Job:
        job = self._jobs.get(block.block_id)
        if job is None or job.block is not block:
            raise ValueError(f"block {block.block_id!r} does not come from this provider")
        return job

    def _write_env(self, path: Path) -> None:
        # A new file (never one that was there, nor through a link): a run dir given
        # again keeps the last run's files, and only this user may write in it.
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            for k, v in self.env.items():
                f.write(f"export {k}={shlex.quote(v)}\n")
        os.chmod(path, 0o600)

    def _set(self, job: _Job, state: BlockState, detail: str) -> None:
        block = job.block
        if block.state.terminal:
            return
        if state != block.state or detail != block.detail:
            self._log.info(
                "block state", pool=block.spec.pool, block=block.block_id,
                job=job.record.job_id, state=state.value, slurm=job.record.slurm_state,
            )  # fmt: skip
        block.state, block.detail = state, detail
        job.record.state = state
        if state.terminal:
            job.ended.set()

    async def _run(self, *argv: str) -> str:
        """Run a Slurm command; its stdout. :class:`BatchSystemError` if it cannot run,
        does not answer within ``command_timeout`` or exits non-zero."""
        env = None
        if self.slurm_conf is not None:
            env = dict(os.environ, SLURM_CONF=self.slurm_conf)
        command = " ".join(argv[:2]) if argv[0] == "sbatch" else argv[0]
        advice = _ADVICE.get(argv[0], "")
        if argv[0] == "sbatch":
            advice = self._sbatch_advice(False)
        try:
            with anyio.fail_after(self.command_timeout):
                done = await run_command(argv, env=env)
        except FileNotFoundError:
            raise BatchSystemError(
                command, None, f"{argv[0]}: command not found",
                f"Install the Slurm client commands on this machine or put them on PATH. "
                f"{advice}",
            ) from None  # fmt: skip
        except TimeoutError:
            raise BatchSystemError(
                command, None, f"no answer within {self.command_timeout:g} s",
                self._sbatch_advice(True) if argv[0] == "sbatch" else advice,
            ) from None  # fmt: skip
        except OSError as exc:
            raise BatchSystemError(command, None, str(exc), advice) from None
        out = done.stdout.decode(errors="replace")
        err = done.stderr.decode(errors="replace")
        if done.returncode != 0:
            if argv[0] in ("squeue", "scontrol") and _INVALID_JOB in out + err:
                return out + err  # the ids asked about are all unknown: not a failure
            if argv[0] == "sbatch":
                advice = self._sbatch_advice(unreachable(done.returncode, err))
            raise BatchSystemError(command, done.returncode, err, advice)
        return out

    def _sbatch_advice(self, transient: bool) -> str:
        """What to do about a failed ``sbatch``, and what happens next: the controller
        not answering passes by itself; a refusal stops the pool after a few."""
        if transient:
            return _ADVICE["sbatch"]
        f = self.failures
        return (
            "Check that the partition, account and QOS of the pool exist and accept this "
            f"job{own_lines_advice(self.options.scheduler_options)} (`sbatch --test-only`); "
            "the pool's blocks are requested again after a "
            f"back-off, until {f.max_failures} refusals among its last {f.window} "
            "submissions stop them until an operator resumes the pool (`resume POOL` in "
            "the console)."
        )

    async def _refresher(self) -> None:
        interval = self.status_interval
        while True:
            ok = await self._refresh()
            self.refreshes += 1
            done, self._refreshed = self._refreshed, anyio.Event()
            done.set()
            interval = self.status_interval if ok else min(interval * 2, self.max_status_interval)
            await anyio.sleep(interval)

    async def _refresh(self) -> bool:
        """One squeue for every live block; scontrol for those it no longer lists.
        False if Slurm did not answer (the error is recorded, states are kept)."""
        live = [j for j in self._jobs.values() if not j.block.state.terminal or j.cancel_pending]
        try:
            pending = [j for j in live if j.cancel_pending]
            if pending:
                await self._run("scancel", *(j.record.job_id for j in pending))
                for j in pending:
                    j.cancel_pending = False
                self.error = None  # Slurm answered
            watched = [j for j in live if not j.block.state.terminal]
            if not watched:
                return True  # no Slurm command ran: an error recorded stands
            ids = ",".join(j.record.job_id for j in watched)
            self.squeue_calls += 1
            text = await self._run("squeue", "-h", "-t", "all", "-j", ids, "-O", SQUEUE_FORMAT)
            seen = parse_squeue(text)
            for job in watched:
                info = seen.get(job.record.job_id)
                if info is None:
                    shown = await self._run("scontrol", "show", "job", job.record.job_id)
                    info = parse_scontrol_job(shown)
                    if info is not None and info.job_id != job.record.job_id:
                        self._log.warning(
                            "scontrol answered about another job", asked=job.record.job_id,
                            answered=info.job_id,
                        )  # fmt: skip
                        continue  # an odd answer is no news: ask again next time
                self._apply(job, info)
        except BatchSystemError as err:
            if self.error is None or str(self.error) != str(err):
                self._log.error("Slurm does not answer", error=str(err))
            self.error = err
            return False
        self.error = None
        return True

    def _apply(self, job: _Job, info: JobInfo | None) -> None:
        rec = job.record
        stderr = ""
        mapped = None if info is None else block_state(info.state)
        requeued = info is not None and (
            info.restarts > rec.restarts or (rec.ran and mapped == BlockState.PENDING)
        )
        # A requeue recorded `requeued` may be a preemption whose stderr line came after
        # the look (slurmstepd writes it on its own time): read the file again while the
        # job has not run again (its next run starts after that line), when it grew.
        unsure = not rec.ran and any(i.cause == "requeued" for i in rec.incarnations)
        grew = unsure and _size(job.stderr) != job.stderr_size
        if requeued or grew or (mapped is not None and mapped.terminal):
            stderr = self._read_stderr(job)
        causes = [i.cause for i in rec.incarnations]
        state = rec.observe(info, stderr)
        block = job.block
        corrected = [  # the runs (from 1) reported requeued whose end was a preemption
            i.number + 1
            for i, was in zip(rec.incarnations, causes, strict=False)
            if i.cause != was and i.number + 1 < block.incarnation
        ]
        if corrected:
            block.requeue_cause = rec.incarnations[block.incarnation - 2].cause
            self._log.debug(
                "block requeue cause corrected: preempted, the stderr says so now",
                pool=block.spec.pool, block=block.block_id, job=rec.job_id,
                incarnations=corrected,
            )  # fmt: skip
        if rec.restarts + 1 > block.incarnation:  # a requeue not reported yet
            last = rec.incarnations[-1]
            if last.cause != "preempted" and job.held != block.incarnation and not state.terminal:
                # No preemption line yet: it may come after this look. The block (what
                # the autoscaler reads) says nothing of the requeue until the next look.
                job.held = block.incarnation
                return
            block.incarnation, block.requeue_cause = rec.restarts + 1, last.cause
            # At debug: the autoscaler's `worker block requeued` is the line an operator
            # reads (info for a preemption's requeue, expected; warning for another).
            self._log.debug(
                "block requeued: a new incarnation", pool=block.spec.pool,
                block=block.block_id, job=rec.job_id, incarnation=rec.restarts + 1,
                cause=last.cause,
            )  # fmt: skip
        self._set(job, state, rec.detail)

    def _read_stderr(self, job: _Job) -> str:
        job.stderr_size = _size(job.stderr)
        return _read_text(job.stderr)


def _size(path: Path) -> int:
    """The file's size, or -1 if it cannot be read."""
    try:
        return path.stat().st_size
    except OSError:
        return -1


def _read_text(path: Path, limit: int = 1 << 20) -> str:
    """The file's text (its last ``limit`` bytes), or "" if it cannot be read."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""
