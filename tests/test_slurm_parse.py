"""The pure parts of the Slurm provider (actors/slurm.py), fed with output recorded from
a real Slurm 22.05 (Debian bookworm's): squeue and scontrol parsing, the state mapping,
requeues as incarnations, vanished jobs, preemption, the batch script, and the windowed
stop on submission failures with a fake clock. No Slurm needed."""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from actors.providers import Block, BlockSpec, BlockState
from actors.slurm import (
    SQUEUE_FORMAT,
    WORKER_INIT_FAILED,
    FailureWindow,
    JobInfo,
    JobRecord,
    SlurmOptions,
    SlurmProvider,
    batch_script,
    block_state,
    exit_text,
    head_tail,
    own_lines_advice,
    parse_scontrol_job,
    parse_squeue,
)
from runtime.errors import BatchSystemError, SubmissionsSuspended

# `squeue -h -t all -O JobID:|,State:|,Reason:|,RestartCnt:|,Exit_Code:|,NodeList:|` right
# after an owner job preempted job 1 (partition ckpt, PreemptMode=REQUEUE) and job 2
# (partition ckpt-cancel, PreemptMode=CANCEL).
SQUEUE_PREEMPTED = """\
1|PENDING|BeginTime|1|15||
2|PREEMPTED|None|0|15|vm|
3|RUNNING|None|0|0|vm|
"""

# `scontrol show job 1` of the requeued job (abridged to its first lines, as printed).
SCONTROL_REQUEUED = """\
JobId=1 JobName=wrap
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   Priority=4294901759 Nice=0 Account=(null) QOS=(null)
   JobState=PENDING Reason=BeginTime Dependency=(null)
   Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0
   RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A
   Partition=ckpt AllocNode:Sid=localhost:8320
   NodeList=
   StdErr=/tmp/slurm-1.out
"""

SCONTROL_COMPLETED = """\
JobId=3 JobName=wrap
   JobState=COMPLETED Reason=None Dependency=(null)
   Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0
"""

SCONTROL_UNKNOWN = "slurm_load_jobs error: Invalid job id specified\n"

PREEMPTION_1 = (
    "slurmstepd-vm: error: *** JOB 1 ON vm CANCELLED AT 2026-12-01T17:50:30 DUE TO PREEMPTION ***\n"
)


def info(state: str, job: str = "7", restarts: int = 0, reason: str = "None") -> JobInfo:
    return JobInfo(job, state, reason, restarts)


# ----------------------------------------------------------------------------- parsing


def test_squeue_format_asks_for_the_fields_the_parser_reads() -> None:
    assert SQUEUE_FORMAT == "JobID:|,State:|,Reason:|,RestartCnt:|,Exit_Code:|,NodeList:|"


def test_parse_squeue_reads_every_job() -> None:
    jobs = parse_squeue(SQUEUE_PREEMPTED)
    assert jobs == {
        "1": JobInfo("1", "PENDING", "BeginTime", 1, "15", ""),
        "2": JobInfo("2", "PREEMPTED", "None", 0, "15", "vm"),
        "3": JobInfo("3", "RUNNING", "None", 0, "0", "vm"),
    }


def test_parse_squeue_skips_lines_without_the_fields() -> None:
    text = "squeue: warning: something\n\n12|RUNNING|None|0|0|vm|\n"
    assert list(parse_squeue(text)) == ["12"]


def test_parse_scontrol_reads_state_and_restarts() -> None:
    job = parse_scontrol_job(SCONTROL_REQUEUED)
    assert job == JobInfo("1", "PENDING", "BeginTime", 1, "0:0", "")
    done = parse_scontrol_job(SCONTROL_COMPLETED)
    assert done is not None and done.state == "COMPLETED" and done.restarts == 0


def test_parse_scontrol_of_an_unknown_job_is_none() -> None:
    assert parse_scontrol_job(SCONTROL_UNKNOWN) is None
    assert parse_scontrol_job("") is None


# ----------------------------------------------------------------------------- states


@pytest.mark.parametrize(
    ("slurm", "state"),
    [
        ("PENDING", BlockState.PENDING),
        ("PD", BlockState.PENDING),
        ("CONFIGURING", BlockState.PENDING),
        ("REQUEUED", BlockState.PENDING),
        ("RUNNING", BlockState.RUNNING),
        ("R", BlockState.RUNNING),
        ("COMPLETING", BlockState.RUNNING),
        ("CG", BlockState.RUNNING),
        ("SUSPENDED", BlockState.HELD),
        ("REQUEUE_HOLD", BlockState.HELD),
        ("COMPLETED", BlockState.COMPLETED),
        ("CANCELLED", BlockState.CANCELLED),
        ("CANCELLED+", BlockState.CANCELLED),
        ("FAILED", BlockState.FAILED),
        ("NODE_FAIL", BlockState.FAILED),
        ("NF", BlockState.FAILED),
        ("OUT_OF_MEMORY", BlockState.OOM),
        ("OOM", BlockState.OOM),
        ("BOOT_FAIL", BlockState.FAILED),
        ("TIMEOUT", BlockState.TIMEOUT),
        ("DEADLINE", BlockState.TIMEOUT),
        ("PREEMPTED", BlockState.PREEMPTED),
        ("PR", BlockState.PREEMPTED),
    ],
)
def test_every_slurm_state_has_a_block_state(slurm: str, state: BlockState) -> None:
    assert block_state(slurm) is state


def test_an_unknown_state_is_none_and_the_record_keeps_its_state() -> None:
    assert block_state("WHATEVER") is None
    rec = JobRecord("7")
    rec.observe(info("RUNNING"))
    assert rec.observe(info("WHATEVER")) is BlockState.RUNNING
    assert "WHATEVER" in rec.detail


def test_an_out_of_memory_job_ends_the_block_oom() -> None:
    # squeue -t all prints the job that the cgroup's OOM killer ended; the block ends
    # OOM (its workers' loss cause is then ``oom``, see test_autoscaler_state), not
    # FAILED (which would say ``crash``).
    jobs = parse_squeue("9|OUT_OF_MEMORY|OutOfMemory|0|0:125|vm|\n")
    rec = JobRecord("9")
    rec.observe(info("RUNNING", job="9"))
    assert rec.observe(jobs["9"]) is BlockState.OOM
    assert BlockState.OOM.terminal
    assert "OUT_OF_MEMORY" in rec.detail and "OutOfMemory" in rec.detail
    short = parse_squeue("9|OOM|None|0|0:125|vm|\n")
    assert JobRecord("9").observe(short["9"]) is BlockState.OOM


def test_preempted_is_terminal() -> None:
    assert BlockState.PREEMPTED.terminal
    assert BlockState.MISSING.terminal


# ----------------------------------------------------------------------------- records


def test_pending_running_completed() -> None:
    rec = JobRecord("7")
    assert rec.observe(info("PENDING", reason="Resources")) is BlockState.PENDING
    assert "Resources" in rec.detail
    assert rec.observe(info("RUNNING")) is BlockState.RUNNING
    assert rec.observe(info("COMPLETING")) is BlockState.RUNNING
    assert rec.observe(info("COMPLETED")) is BlockState.COMPLETED
    assert rec.incarnations == []
    # Terminal stays terminal.
    assert rec.observe(info("RUNNING")) is BlockState.COMPLETED


def test_a_requeue_is_a_new_incarnation_of_the_same_block() -> None:
    rec = JobRecord("1")
    rec.observe(info("RUNNING", job="1"))
    # R -> CG -> PD with Restarts=1, as squeue showed after the owner job preempted it.
    assert rec.observe(info("COMPLETING", job="1")) is BlockState.RUNNING
    state = rec.observe(parse_squeue(SQUEUE_PREEMPTED)["1"], PREEMPTION_1)
    assert state is BlockState.PENDING
    assert rec.restarts == 1
    assert [(i.number, i.cause, i.slurm_state) for i in rec.incarnations] == [
        (0, "preempted", "COMPLETING")
    ]
    assert "incarnation 2" in rec.detail and "preempted" in rec.detail
    # The same observation again is not a second requeue (no double counting).
    rec.observe(parse_squeue(SQUEUE_PREEMPTED)["1"], PREEMPTION_1)
    assert len(rec.incarnations) == 1
    # It runs again, then is preempted again.
    assert rec.observe(info("RUNNING", job="1", restarts=1)) is BlockState.RUNNING
    assert len(rec.incarnations) == 1
    again = PREEMPTION_1 + PREEMPTION_1.replace("17:50:30", "17:59:00")
    assert rec.observe(info("PENDING", job="1", restarts=2), again) is BlockState.PENDING
    assert [i.cause for i in rec.incarnations] == ["preempted", "preempted"]
    assert rec.restarts == 2


def test_completing_with_the_next_restart_count_is_the_new_incarnation_pending() -> None:
    # Seen on Slurm 22.05: right after the preemption squeue shows the job still
    # COMPLETING but with RestartCnt already 1.
    rec = JobRecord("1")
    rec.observe(info("RUNNING", job="1"))
    state = rec.observe(info("COMPLETING", job="1", restarts=1), PREEMPTION_1)
    assert state is BlockState.PENDING
    assert rec.restarts == 1 and [i.cause for i in rec.incarnations] == ["preempted"]
    assert rec.observe(info("PENDING", job="1", restarts=1)) is BlockState.PENDING
    assert len(rec.incarnations) == 1
    assert rec.observe(info("RUNNING", job="1", restarts=1)) is BlockState.RUNNING


def test_a_requeue_seen_only_through_the_restart_count() -> None:
    # Requeued and running again between two refreshes: never seen pending.
    rec = JobRecord("1")
    rec.observe(info("RUNNING", job="1"))
    assert rec.observe(info("RUNNING", job="1", restarts=1)) is BlockState.RUNNING
    assert [i.cause for i in rec.incarnations] == ["requeued"]  # no preemption line


def test_a_requeue_without_the_restart_count_is_seen_by_running_then_pending() -> None:
    rec = JobRecord("1")
    rec.observe(info("RUNNING", job="1"))
    rec.observe(info("PENDING", job="1", restarts=0))
    assert rec.restarts == 1 and len(rec.incarnations) == 1


def test_preempted_by_cancel_is_preempted() -> None:
    rec = JobRecord("2")
    rec.observe(info("RUNNING", job="2"))
    stderr = PREEMPTION_1.replace("JOB 1", "JOB 2")
    assert rec.observe(parse_squeue(SQUEUE_PREEMPTED)["2"], stderr) is BlockState.PREEMPTED
    assert "DUE TO PREEMPTION" in rec.detail  # the stderr is in the detail


def test_cancelled_with_the_preemption_line_is_preempted() -> None:
    rec = JobRecord("1")
    rec.observe(info("RUNNING", job="1"))
    assert rec.observe(info("CANCELLED", job="1"), PREEMPTION_1) is BlockState.PREEMPTED
    other = JobRecord("5")  # another job's line does not count
    other.observe(info("RUNNING", job="5"))
    assert other.observe(info("CANCELLED", job="5"), PREEMPTION_1) is BlockState.CANCELLED


def test_a_requeued_then_cancelled_job_is_not_preempted_by_its_old_line() -> None:
    rec = JobRecord("1")
    rec.observe(info("RUNNING", job="1"))
    rec.observe(info("PENDING", job="1", restarts=1), PREEMPTION_1)
    assert rec.observe(info("CANCELLED", job="1", restarts=1), PREEMPTION_1) is (
        BlockState.CANCELLED
    )


def test_vanished_job_is_missing_only_when_scontrol_does_not_know_it() -> None:
    rec = JobRecord("3")
    rec.observe(info("RUNNING", job="3"))
    # Gone from squeue; scontrol show job still knows it: its state wins.
    assert rec.observe(parse_scontrol_job(SCONTROL_COMPLETED)) is BlockState.COMPLETED
    lost = JobRecord("9")
    lost.observe(info("RUNNING", job="9"))
    assert lost.observe(parse_scontrol_job(SCONTROL_UNKNOWN)) is BlockState.MISSING
    assert "neither squeue nor scontrol" in lost.detail


def test_a_job_we_cancelled_ends_scaled_in() -> None:
    rec = JobRecord("4")
    rec.observe(info("RUNNING", job="4"))
    rec.stopping = True
    assert rec.observe(info("CANCELLED", job="4")) is BlockState.SCALED_IN


def test_failed_block_shows_stderr_head_and_tail() -> None:
    stderr = "".join(f"line {i}\n" for i in range(100))
    rec = JobRecord("8")
    rec.observe(info("RUNNING", job="8"))
    state = rec.observe(JobInfo("8", "FAILED", "NonZeroExitCode", 0, "1:0"), stderr)
    assert state is BlockState.FAILED
    assert "exit code 1" in rec.detail
    assert "line 0\n" in rec.detail and "line 99" in rec.detail
    assert "line 50" not in rec.detail and "[... 80 lines ...]" in rec.detail


def test_a_failed_blocks_detail_names_its_stderr_file_and_bounds_its_lines() -> None:
    """A user audit found a failed block's reason nowhere but in its .err file, whose
    path nothing named: the detail says where it is (and that it is empty, when it
    is), with the head and tail of it, each line cut to a bound."""
    stderr = (
        "corral: block block-1, Slurm job 8, incarnation 1, node 0 on vm\n"
        "/run/block-1.sh: line 12: module: command not found\n" + "x" * 5000 + "\n"
        "corral: worker_init failed (exit status 127): no worker started\n"
    )
    rec = JobRecord("8", stderr_path="/run/block-1.err")
    rec.observe(info("RUNNING", job="8"))
    rec.observe(JobInfo("8", "FAILED", "NonZeroExitCode", 0, "127:0"), stderr)
    first, *rest = rec.detail.splitlines()
    assert first == (
        "Slurm job 8 FAILED (NonZeroExitCode); exit code 127; stderr (/run/block-1.err):"
    )
    assert rest[1] == "/run/block-1.sh: line 12: module: command not found"
    assert rest[-1] == "corral: worker_init failed (exit status 127): no worker started"
    assert rest[2] == "x" * 300 + " [... 4700 characters]"
    quiet = JobRecord("9", stderr_path="/run/block-2.err")
    quiet.observe(JobInfo("9", "FAILED", "NonZeroExitCode", 0, "1:0"), "")
    assert quiet.detail.endswith("exit code 1; stderr (/run/block-2.err) is empty")


def test_a_controller_out_of_reach_is_no_refusal() -> None:
    """What Slurm 22.05's sbatch printed with slurmctld stopped, and when it refused,
    told apart: only a refusal (or a missing command) may suspend a pool."""
    from actors.slurm import unreachable

    down = (
        "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
        "(connect failure)\n"
    )
    assert unreachable(1, down)
    assert unreachable(1, "sbatch: error: Socket timed out on send/recv operation\n")
    assert unreachable(None, "no answer within 30 s")
    assert not unreachable(
        1, "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
    )
    assert not unreachable(
        1, "sbatch: error: Batch job submission failed: Invalid account or account/partition "
        "combination specified\n",
    )  # fmt: skip
    assert not unreachable(None, "sbatch: command not found")


def test_failures_to_reach_the_controller_back_off_but_never_trip_the_window() -> None:
    """A controller down for longer than three submissions (the audit: 39 s) suspended
    the pool until an operator resumed it; now it backs off, bounded, and the first
    submission that goes through ends it. Refusals still trip it."""
    w = FailureWindow(max_failures=3, window=5, backoff=1.0, max_backoff=4.0)
    for n in range(10):
        w.check(float(n * 10))
        w.record(float(n * 10), "connect failure", transient=True)
        assert not w.tripped
        assert w.retry_at - n * 10 == min(2.0**n, 4.0)
    w.check(100.0)
    w.record(100.0, None)
    assert (w.streak, w.retry_at, w.failures) == (0, float("-inf"), 0)
    for n in range(3):
        w.record(200.0 + 10 * n, "Invalid partition name specified")
    assert w.tripped


def test_exit_text_reads_both_forms() -> None:
    assert exit_text("3:0") == "exit code 3"  # scontrol
    assert exit_text("0:15") == "killed by signal 15"
    assert exit_text("768") == "exit code 3"  # squeue's wait status
    assert exit_text("15") == "killed by signal 15"
    assert exit_text("0") == "exit code 0"
    assert exit_text("odd") == "exit code odd"


def test_requeues_missed_between_two_looks_each_count() -> None:
    rec = JobRecord("1")
    rec.observe(info("RUNNING", job="1"))
    twice = PREEMPTION_1 + PREEMPTION_1.replace("17:50:30", "17:53:00")
    assert rec.observe(info("RUNNING", job="1", restarts=2), twice) is BlockState.RUNNING
    assert rec.restarts == 2
    assert [(i.number, i.cause) for i in rec.incarnations] == [(0, "preempted"), (1, "preempted")]


def causes(rec: JobRecord) -> list[tuple[int, str]]:
    return [(i.number, i.cause) for i in rec.incarnations]


def test_a_preemption_line_after_the_look_that_saw_the_requeue_makes_it_preempted() -> None:
    # CI: slurmstepd wrote `DUE TO PREEMPTION` after the refresh that saw the requeue,
    # which recorded it `requeued` for ever.
    rec = JobRecord("1")
    rec.observe(info("RUNNING", job="1"))
    assert rec.observe(info("COMPLETING", job="1", restarts=1), "") is BlockState.PENDING
    assert causes(rec) == [(0, "requeued")]
    assert "last requeued" in rec.detail
    assert rec.observe(info("PENDING", job="1", restarts=1), PREEMPTION_1) is BlockState.PENDING
    assert causes(rec) == [(0, "preempted")]
    assert rec.incarnations[0].slurm_state == "RUNNING"  # the rest of it is kept
    assert "last preempted" in rec.detail
    # Never back: a look without the stderr (or with less of it) changes nothing.
    rec.observe(info("PENDING", job="1", restarts=1), "")
    assert rec.observe(info("RUNNING", job="1", restarts=1)) is BlockState.RUNNING
    assert causes(rec) == [(0, "preempted")]


def test_two_requeues_and_one_preemption_line_are_one_preempted_one_requeued() -> None:
    rec = JobRecord("1")
    rec.observe(info("RUNNING", job="1"))
    rec.observe(info("PENDING", job="1", restarts=1))
    rec.observe(info("RUNNING", job="1", restarts=1))
    rec.observe(info("PENDING", job="1", restarts=2))
    assert causes(rec) == [(0, "requeued"), (1, "requeued")]
    rec.observe(info("PENDING", job="1", restarts=2), PREEMPTION_1)
    assert causes(rec) == [(0, "preempted"), (1, "requeued")]  # the earliest first
    rec.observe(info("PENDING", job="1", restarts=2), PREEMPTION_1)  # the same line again
    assert causes(rec) == [(0, "preempted"), (1, "requeued")]
    second = PREEMPTION_1.replace("17:50:30", "17:53:00")
    rec.observe(info("RUNNING", job="1", restarts=2), PREEMPTION_1 + second)
    assert causes(rec) == [(0, "preempted"), (1, "preempted")]


def test_a_preemption_line_of_another_job_does_not_make_a_requeue_preempted() -> None:
    rec = JobRecord("1")
    rec.observe(info("RUNNING", job="1"))
    rec.observe(info("PENDING", job="1", restarts=1))
    for other in ("JOB 2 ", "JOB 11 ", "JOB 21 "):  # also ids that contain "1"
        rec.observe(info("PENDING", job="1", restarts=1), PREEMPTION_1.replace("JOB 1 ", other))
    assert causes(rec) == [(0, "requeued")]
    assert "last requeued" in rec.detail


def test_the_preemption_line_of_a_cancelled_end_is_not_an_earlier_requeues() -> None:
    # scontrol requeue (no line), then preempted on a PreemptMode=CANCEL partition: the
    # one line is the end's, the requeue stays `requeued`.
    rec = JobRecord("2")
    rec.observe(info("RUNNING", job="2"))
    rec.observe(info("PENDING", job="2", restarts=1))
    rec.observe(info("RUNNING", job="2", restarts=1))
    stderr = PREEMPTION_1.replace("JOB 1", "JOB 2")
    assert rec.observe(info("PREEMPTED", job="2", restarts=1), stderr) is BlockState.PREEMPTED
    assert causes(rec) == [(0, "requeued")]


def test_head_tail_keeps_short_text() -> None:
    assert head_tail("a\nb\n", 10) == "a\nb"


# ----------------------------------------------------------------------------- failures


def test_failure_window_backs_off_then_trips_until_resumed() -> None:
    w = FailureWindow(max_failures=3, window=5, backoff=1.0, max_backoff=4.0)
    w.check(0.0)
    w.record(0.0, "sbatch: error: Unable to contact slurm controller")
    with pytest.raises(BatchSystemError, match=r"'sbatch' was not run\. Not submitting") as e:
        w.check(0.5)
    assert e.value.exit_code is None and "Unable to contact" in str(e.value)
    w.check(1.0)  # the back-off is over
    w.record(1.0, "again")
    with pytest.raises(BatchSystemError):
        w.check(2.9)  # doubled: 2 s
    w.check(3.0)
    w.record(3.0, None)  # a success resets the back-off, not the window
    w.check(3.0)
    assert w.failures == 2 and not w.tripped
    w.record(3.0, "third")
    assert w.tripped
    with pytest.raises(SubmissionsSuspended, match="3 of its last 5") as caught:
        w.check(1000.0)  # no amount of time resumes it
    assert caught.value.last_error == "third"
    w.resume()
    w.check(1000.0)
    assert w.failures == 0


def test_failure_window_forgets_failures_that_left_the_window() -> None:
    w = FailureWindow(max_failures=2, window=3, backoff=0.0)
    w.record(0, "one")
    w.record(1, None)
    w.record(2, None)
    w.record(3, None)  # "one" left the window
    w.record(4, "two")
    assert not w.tripped
    w.record(5, "three")
    assert w.tripped


def test_backoff_is_capped() -> None:
    w = FailureWindow(max_failures=10, window=10, backoff=1.0, max_backoff=4.0)
    for t in range(6):
        w.record(float(t), "x")
    assert w.retry_at == 5.0 + 4.0


def test_failure_window_checks_its_limits() -> None:
    with pytest.raises(ValueError):
        FailureWindow(max_failures=6, window=5)


def test_batch_system_error_names_command_exit_code_and_stderr() -> None:
    err = BatchSystemError(
        "sbatch --parsable", 1, "sbatch: error: Batch job submission failed", "Check it."
    )
    text = str(err)
    assert "'sbatch --parsable' failed with exit code 1" in text
    assert "Batch job submission failed" in text and text.endswith("Check it.")
    missing = BatchSystemError("squeue", None, "squeue: command not found", "Install it.")
    assert "could not be run" in str(missing)


# ----------------------------------------------------------------------------- script


def _script(options: SlurmOptions, workers: int = 2, memory: int = 0) -> str:
    spec = BlockSpec(workers=workers, threads=2, memory=memory)
    return batch_script(
        block_id="block-3",
        job_name="corral-slurm-3",
        workers=[(f"slurm-3.{i}", ["python", "-m", "runtime", "worker", "ws://h:1"])
                 for i in range(workers)],
        spec=spec,
        options=options,
        output=Path("/run/block-3.out"),
        error=Path("/run/block-3.err"),
        env_file=Path("/run/block-3.env"),
        script=Path("/run/block-3.sh"),
    )  # fmt: skip


def test_batch_script_has_the_pool_options() -> None:
    text = _script(
        SlurmOptions(
            partition="ckpt", account="astro", qos="low", walltime=3600, exclusive=True,
            scheduler_options="#SBATCH --constraint=haswell", worker_init="module load py",
            signal_warning=60,
        ),
        memory=2**30,
    )  # fmt: skip
    for line in [
        "#SBATCH --partition=ckpt",
        "#SBATCH --account=astro",
        "#SBATCH --qos=low",
        "#SBATCH --time=01:00:00",
        "#SBATCH --exclusive",
        "#SBATCH --signal=B:TERM@60",
        "#SBATCH --cpus-per-task=4",  # 2 workers x 2 threads
        "#SBATCH --mem=2048M",  # 2 workers x 1 GiB
        "#SBATCH --constraint=haswell",
        "#SBATCH --error=/run/block-3.err",
        "#SBATCH --open-mode=append",
        "module load py",
        ". /run/block-3.env  # CORRAL_TOKEN and the rest of env (mode 0600)",
        "    CORRAL_WORKER_ID=slurm-3.0 CORRAL_BLOCK_ID=block-3 python -m runtime worker "
        "ws://h:1 &",
        "    CORRAL_WORKER_ID=slurm-3.1 CORRAL_BLOCK_ID=block-3 python -m runtime worker "
        "ws://h:1 &",
    ]:
        assert line in text.splitlines(), line
    # #SBATCH lines must come before the first command, or sbatch ignores them.
    lines = text.splitlines()
    first_command = next(i for i, ln in enumerate(lines[1:], 1) if ln and ln[0] not in "#")
    assert all(i < first_command for i, ln in enumerate(lines) if ln.startswith("#SBATCH"))
    assert "srun" not in text


def test_scheduler_options_are_sbatch_directives_sbatch_reads() -> None:
    # Not a directive: it would run as a command ("--exclusive: command not found").
    for text in ("--exclusive", "#SBATCH --x=1\nmodule load gcc", "# SBATCH --exclusive"):
        with pytest.raises(ValueError, match=r"must be '#SBATCH \.\.\.' directives"):
            SlurmOptions(scheduler_options=text)
    # Indented lines (a TOML multi-line string) come out unindented: sbatch would ignore
    # an indented #SBATCH line, and every one after it.
    text = _script(SlurmOptions(scheduler_options="\n  #SBATCH --constraint=a\n  # why\n"))
    lines = text.splitlines()
    assert "#SBATCH --constraint=a" in lines and "# why" in lines
    first_command = next(i for i, ln in enumerate(lines[1:], 1) if ln and ln[0] not in "#")
    assert lines.index("#SBATCH --constraint=a") < first_command


def test_batch_script_without_options_asks_for_no_partition_or_time() -> None:
    text = _script(SlurmOptions(), workers=1)
    sbatch = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    for option in ("--partition", "--account", "--qos", "--time", "--mem", "--exclusive"):
        assert not any(option in ln for ln in sbatch), option
    assert not any("--signal" in ln for ln in sbatch)


def test_batch_script_spreads_workers_over_nodes_with_srun() -> None:
    text = _script(SlurmOptions(nodes_per_block=2), workers=4)
    assert "#SBATCH --nodes=2" in text
    assert "exec srun --nodes=2 --ntasks=2 --ntasks-per-node=1" in text
    body = text.split('case "${SLURM_NODEID:-0}" in', 1)[1]
    node0, node1 = body.split("0)\n", 1)[1].split("1)\n", 1)
    assert "slurm-3.0" in node0 and "slurm-3.1" in node0 and "slurm-3.2" not in node0
    assert "slurm-3.2" in node1 and "slurm-3.3" in node1
    with pytest.raises(ValueError, match="spread evenly"):
        _script(SlurmOptions(nodes_per_block=2), workers=3)


def test_host_placeholder_becomes_the_nodes_address_and_the_rest_stays_quoted(
    tmp_path: Path,
) -> None:
    text = batch_script(
        block_id="block-1", job_name="j",
        workers=[("w-1", ["python", "--host", "{host}", "--x", "a b;$(rm -rf ~)", "{host}:1"])],
        spec=BlockSpec(), options=SlurmOptions(), output=tmp_path / "o",
        error=tmp_path / "e", env_file=None, script=tmp_path / "s.sh",
    )  # fmt: skip
    line = next(ln for ln in text.splitlines() if "CORRAL_WORKER_ID=w-1" in ln)
    assert "{host}" not in line and "'a b;$(rm -rf ~)'" in line
    # Run the script's worker line in bash, with a stand-in for python: what it gets.
    script = tmp_path / "s.sh"
    script.write_text(text.replace("python --host", "printf '%s\\n' --host", 1))
    done = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=30,
        env={"PATH": os.environ["PATH"], "CORRAL_NODE_HOST": "ignored"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    args = done.stdout.splitlines()
    host = args[1]
    assert host and host != "{host}"
    assert args == ["--host", host, "--x", "a b;$(rm -rf ~)", f"{host}:1"]


def test_the_job_exits_with_the_first_worker_failure(tmp_path: Path) -> None:
    """Three workers exit 3, 0 and 5 (in start order): the job's exit status is 3, the
    first non-zero one (docs/deployment.md), as Slurm then reports the job FAILED."""
    text = batch_script(
        block_id="block-1", job_name="j",
        workers=[("w-1", ["sh", "-c", "exit 3"]), ("w-2", ["true"]),
                 ("w-3", ["sh", "-c", "exit 5"])],
        spec=BlockSpec(), options=SlurmOptions(), output=tmp_path / "o",
        error=tmp_path / "e", env_file=None, script=tmp_path / "s.sh",
    )  # fmt: skip
    script = tmp_path / "s.sh"
    script.write_text(text)
    done = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, timeout=30,
        env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert done.returncode == 3, done.stderr


def test_a_failing_worker_init_fails_the_block_and_says_so(tmp_path: Path) -> None:
    """A command of worker_init that fails (a virtualenv that is not there) stops the
    job with its status before any worker starts, and stderr says why; the commands
    before it ran, and one that may fail is allowed with ``|| true``."""

    def run(worker_init: str) -> subprocess.CompletedProcess[str]:
        text = batch_script(
            block_id="block-1", job_name="j", workers=[("w-1", ["echo", "worker started"])],
            spec=BlockSpec(), options=SlurmOptions(worker_init=worker_init),
            output=tmp_path / "o", error=tmp_path / "e", env_file=None,
            script=tmp_path / "s.sh",
        )  # fmt: skip
        script = tmp_path / "s.sh"
        script.write_text(text)
        return subprocess.run(
            ["bash", str(script)], capture_output=True, text=True, timeout=30,
            env={"PATH": os.environ["PATH"]},
        )  # fmt: skip

    done = run("echo init ran >&2\nsource /nonexistent/bin/activate\necho not reached >&2")
    assert done.returncode == 1, done
    assert "worker started" not in done.stdout and "not reached" not in done.stderr
    assert "init ran" in done.stderr
    assert "/nonexistent/bin/activate: No such file or directory" in done.stderr
    assert f"{WORKER_INIT_FAILED} (exit status 1): no worker started" in done.stderr
    done = run("false || true\nexport X=1")
    assert done.returncode == 0, done
    assert done.stdout == "worker started\n" and WORKER_INIT_FAILED not in done.stderr


# ----------------------------------------------------------------------------- the provider
# SlurmProvider driven by stand-in Slurm commands (shell scripts on PATH that print what
# a real Slurm printed and log how they were called): batching, vanished jobs, missing
# commands. The real cluster is tests/test_slurm.py.


def put(path: Path, text: str) -> None:
    """Write ``path`` at once (a stand-in command never reads it half-written)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _fake_slurm(bin_dir: Path, state: Path) -> None:
    """sbatch answers job ids 101, 102, ...; squeue prints ``state/squeue.txt``; scontrol
    prints ``state/scontrol.txt`` (on stderr with exit 1 if it says the job is unknown,
    as Slurm does). Each call is appended to ``state/calls``."""
    bin_dir.mkdir()
    put(state / "squeue.txt", "")
    put(state / "scontrol.txt", SCONTROL_UNKNOWN)
    scripts = {
        "sbatch": 'n=$(( $(cat "$S/next" 2>/dev/null || echo 100) + 1 )); echo $n > "$S/next"; '
        "echo $n",
        "squeue": 'cat "$S/squeue.txt"',
        "scontrol": 'f="$S/scontrol.txt"; if grep -q "Invalid job id" "$f"; then cat "$f" >&2; '
        'exit 1; fi; cat "$f"',
        "scancel": "true",
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f'#!/bin/bash\nS={state}\necho "{name} $*" >> "$S/calls"\n{body}\n')
        path.chmod(0o755)


@pytest.mark.anyio
async def test_provider_batches_squeue_and_asks_scontrol_about_vanished_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    _fake_slurm(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    provider = SlurmProvider(lambda b, i: ["true"], run_dir=tmp_path / "run", status_interval=0.01)
    put(
        state / "squeue.txt",
        "101|RUNNING|None|0|0|vm|\n102|PENDING|Resources|0|0||\n103|RUNNING|None|0|0|vm|\n",
    )
    with anyio.fail_after(30):
        async with provider.running():
            blocks = [await provider.start_block(BlockSpec()) for _ in range(3)]
            assert [provider.record(b).job_id for b in blocks] == ["101", "102", "103"]
            await provider.wait_refreshed()
            await provider.wait_refreshed()
            assert [provider.poll(b) for b in blocks] == [
                BlockState.RUNNING, BlockState.PENDING, BlockState.RUNNING,
            ]  # fmt: skip
            calls = (state / "calls").read_text().splitlines()
            squeues = [c for c in calls if c.startswith("squeue")]
            assert squeues[-1] == "squeue -h -t all -j 101,102,103 -O " + SQUEUE_FORMAT
            assert len(squeues) <= provider.refreshes  # one per refresh, for all blocks
            assert not any(c.startswith("scontrol") for c in calls)

            # 103 leaves squeue: scontrol still knows it (completed), then 101 leaves
            # and scontrol does not know it: missing, not completed.
            put(state / "scontrol.txt", SCONTROL_COMPLETED.replace("=3 ", "=103 "))
            put(state / "squeue.txt", "101|RUNNING|None|0|0|vm|\n102|PENDING|Resources|0|0||\n")
            assert await provider.wait_ended(blocks[2]) is BlockState.COMPLETED
            put(state / "scontrol.txt", SCONTROL_UNKNOWN)
            put(state / "squeue.txt", "102|PENDING|Resources|0|0||\n")
            assert await provider.wait_ended(blocks[0]) is BlockState.MISSING
            assert "neither squeue nor scontrol" in blocks[0].detail
            assert provider.poll(blocks[1]) is BlockState.PENDING
            calls = (state / "calls").read_text().splitlines()
            assert "scontrol show job 103" in calls and "scontrol show job 101" in calls
            assert "scontrol show job 102" not in calls
            # Once a block ended, squeue asks only about the live ones.
            await provider.wait_refreshed()
            await provider.wait_refreshed()
            calls = (state / "calls").read_text().splitlines()
            assert [c for c in calls if c.startswith("squeue")][-1] == (
                "squeue -h -t all -j 102 -O " + SQUEUE_FORMAT
            )
        # Leaving cancels the live block.
        assert "scancel 102" in (state / "calls").read_text().splitlines()
        assert blocks[1].state is BlockState.SCALED_IN


@pytest.mark.anyio
async def test_the_providers_log_lines_name_the_pool(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each pool's provider numbers its blocks from block-1: its lines name the pool."""
    caplog.set_level(logging.INFO, logger="corral")
    state = tmp_path / "state"
    state.mkdir()
    _fake_slurm(tmp_path / "bin", state)
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    put(state / "squeue.txt", "101|RUNNING|None|0|0|vm|\n102|RUNNING|None|0|0|vm|\n")
    providers = {
        pool: SlurmProvider(
            lambda b, i: ["true"], run_dir=tmp_path / pool, status_interval=0.01, prefix=pool
        )
        for pool in ("ckpt", "owner")
    }
    with anyio.fail_after(30):
        async with providers["ckpt"].running(), providers["owner"].running():
            for pool, provider in providers.items():
                block = await provider.start_block(BlockSpec(pool=pool))
                while provider.poll(block) is not BlockState.RUNNING:
                    await provider.wait_refreshed()
            monkeypatch.setenv("PATH", str(tmp_path / "empty"))
            with pytest.raises(BatchSystemError):
                await providers["owner"].start_block(BlockSpec(pool="owner"))
    lines = [r.getMessage() for r in caplog.records]
    for pool, job in (("ckpt", "101"), ("owner", "102")):
        for event in ("block submitted", "block state"):
            assert any(
                f"event={event!r}" in ln and f"pool={pool!r} block='block-1' job={job!r}" in ln
                for ln in lines
            ), (pool, event, lines)
    assert any(
        "event='sbatch failed'" in ln and "pool='owner' block='block-2'" in ln for ln in lines
    ), lines


@pytest.mark.anyio
async def test_a_suspended_pool_says_to_resume_it_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three failed sbatch of five suspend the pool: the error names the pool and one way
    to resume it, and quotes the last failure without its advice ("requested again
    after a back-off", which a suspended pool is not)."""
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    provider = SlurmProvider(lambda b, i: ["true"], run_dir=tmp_path / "run", backoff=0.0)
    with anyio.fail_after(30):
        async with provider.running():
            for _ in range(3):
                with pytest.raises(BatchSystemError, match="requested again after a back-off"):
                    await provider.start_block(BlockSpec(pool="bad"))
            with pytest.raises(SubmissionsSuspended) as caught:
                await provider.start_block(BlockSpec(pool="bad"))
    err = caught.value
    last = "'sbatch --parsable' could not be run: sbatch: command not found"
    assert str(err) == (
        "the Slurm provider stopped submitting blocks for pool bad: 3 of its last 5 "
        f"submissions failed (the last: {last}). Fix the cause, then run "
        "`resume bad` in the console (or call the provider's resume() if you drive it from "
        "Python); until then no block is requested."
    )
    assert (err.pool, err.last_error) == ("bad", last)


@pytest.mark.anyio
async def test_missing_slurm_commands_are_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "empty").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    provider = SlurmProvider(lambda b, i: ["true"], run_dir=tmp_path / "run", backoff=0.0)
    with anyio.fail_after(30):
        async with provider.running():
            with pytest.raises(BatchSystemError) as caught:
                await provider.start_block(BlockSpec())
    err = caught.value
    assert err.command == "sbatch --parsable" and err.exit_code is None
    assert "sbatch: command not found" in str(err)
    assert "Install the Slurm client commands" in str(err)
    assert provider.error is err and provider.blocks == {}


@contextlib.asynccontextmanager
async def _running_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[SlurmProvider, Block, Path]]:
    """A provider over fake Slurm commands (their state directory too) whose one block
    (job 101, pool ``ckpt``) runs. Its stderr file holds the script's first line."""
    state = tmp_path / "state"
    state.mkdir()
    _fake_slurm(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    put(state / "squeue.txt", "101|RUNNING|None|0|0|vm|\n")
    provider = SlurmProvider(lambda b, i: ["true"], run_dir=tmp_path / "run", status_interval=0.01)
    async with provider.running():
        block = await provider.start_block(BlockSpec(pool="ckpt"))
        (tmp_path / "run" / "block-1.err").write_text("corral: block block-1, Slurm job 101\n")
        while provider.poll(block) is not BlockState.RUNNING:
            await provider.wait_refreshed()
        yield provider, block, state


@contextlib.asynccontextmanager
async def _requeued_block(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[SlurmProvider, Block]]:
    """:func:`_running_block`'s block requeued (no preemption line), seen: incarnation 2."""
    async with _running_block(tmp_path, monkeypatch) as (provider, block, state):
        put(state / "squeue.txt", "101|PENDING|BeginTime|1|0||\n")  # requeued
        while block.incarnation != 2:
            await provider.wait_refreshed()
        yield provider, block


@pytest.mark.anyio
async def test_a_requeue_is_no_warning_of_the_provider(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A user audit: every preemption on a requeueing partition logged the provider's
    ``block requeued: a new incarnation`` at warning, the only line shown at the default
    level, though a preemption's requeue is expected. The operator's line is the
    autoscaler's ``worker block requeued`` (info for a preemption, warning for another;
    tests/test_autoscaler_preemption.py); the provider's is a detail, at debug."""
    caplog.set_level(logging.DEBUG, logger="corral")
    with anyio.fail_after(30):
        async with _requeued_block(tmp_path, monkeypatch):
            pass
    requeued = [r for r in caplog.records if "a new incarnation" in r.getMessage()]
    assert [r.levelno for r in requeued] == [logging.DEBUG], [r.getMessage() for r in requeued]
    assert "pool='ckpt' block='block-1' job='101' incarnation=2" in requeued[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.anyio
async def test_a_preemption_line_written_after_the_requeue_was_seen_corrects_its_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The block's ``requeue_cause`` (what the autoscaler reads) follows the record's
    correction: the job's stderr is read again once it grows, until the job runs again."""
    caplog.set_level(logging.DEBUG, logger="corral")
    with anyio.fail_after(30):
        async with _requeued_block(tmp_path, monkeypatch) as (provider, block):
            assert block.requeue_cause == "requeued"  # no preemption line yet
            err = tmp_path / "run" / "block-1.err"
            with err.open("a") as f:  # slurmstepd's line, late
                f.write(PREEMPTION_1.replace("JOB 1 ", "JOB 101 "))
            while block.requeue_cause != "preempted":
                await provider.wait_refreshed()
            assert [i.cause for i in provider.record(block).incarnations] == ["preempted"]
            assert "last preempted" in block.detail
    fixed = [r.getMessage() for r in caplog.records if "cause corrected" in r.getMessage()]
    assert len(fixed) == 1 and "job='101' incarnations=[1]" in fixed[0], fixed


@pytest.mark.anyio
async def test_a_requeue_without_its_preemption_line_is_reported_a_look_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The autoscaler acts on a requeue's cause as soon as the block reports it (its log
    line, its listed end, the workers' loss cause): a requeue with no preemption line yet
    is reported one look later, so a line slurmstepd writes meanwhile is read first."""
    with anyio.fail_after(30):
        async with _running_block(tmp_path, monkeypatch) as (provider, block, state):
            rec = provider.record(block)
            put(state / "squeue.txt", "101|COMPLETING|None|1|0|vm|\n")  # requeued
            while rec.restarts != 1:
                await provider.wait_refreshed()
            assert [i.cause for i in rec.incarnations] == ["requeued"]
            assert (block.incarnation, block.state) == (1, BlockState.RUNNING)  # held
            with (tmp_path / "run" / "block-1.err").open("a") as f:  # slurmstepd's line
                f.write(PREEMPTION_1.replace("JOB 1 ", "JOB 101 "))
            while block.incarnation != 2:
                await provider.wait_refreshed()
            assert block.requeue_cause == "preempted"
            assert block.state is BlockState.PENDING and "last preempted" in block.detail


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("parent_mode", "run_mode", "why"),
    [
        (0o777, None, "the directory it is in, {parent}, lets other users write in it"),
        (0o755, 0o770, "the Slurm run directory, {run}, lets other users write in it"),
        (0o755, 0o777, "the Slurm run directory, {run}, lets other users write in it"),
    ],
)
async def test_a_run_dir_others_can_write_or_replace_is_refused_before_any_sbatch(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    parent_mode: int,
    run_mode: int | None,
    why: str,
) -> None:
    """A block's job sources the worker token's env file from the run dir when it starts
    (hours after sbatch, perhaps): another user who can write there, or rename it away
    in its parent and put a directory of theirs in its place (a group's project dir),
    could run code as the manager's user. Such a run dir is refused, saying what to do,
    before anything is submitted."""
    state = tmp_path / "state"
    state.mkdir()
    _fake_slurm(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    parent, run = tmp_path / "shared", tmp_path / "shared" / "run"
    parent.mkdir()
    parent.chmod(parent_mode)
    if run_mode is not None:
        run.mkdir()
        run.chmod(run_mode)
    provider = SlurmProvider(lambda b, i: ["true"], run_dir=run, env={"CORRAL_TOKEN": "t" * 64})
    with anyio.fail_after(30), pytest.raises(PermissionError) as refused:
        async with provider.running():
            await provider.start_block(BlockSpec())
    text = str(refused.value)
    assert text.startswith(why.format(parent=parent, run=run)), text
    assert "--run-dir DIR" in text and "chmod go-w" in text, text
    assert not (state / "calls").exists()  # no sbatch
    assert not run.exists() or not list(run.iterdir())  # no token written


@pytest.mark.anyio
async def test_a_run_dir_is_made_private_and_its_env_file_is_a_new_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run dir and the directories made above it are 0700 (a sticky parent such as
    /tmp is fine: nobody else can rename in it); the env file holding the worker token
    is a new file, mode 0600, never one that was there nor through a symbolic link (a
    run dir given again keeps its last run's files)."""
    state = tmp_path / "state"
    state.mkdir()
    _fake_slurm(tmp_path / "bin", state)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    run = sticky / "corral-slurm" / "run-1" / "default"
    stolen = tmp_path / "stolen"
    stolen.write_text("")
    stolen.chmod(0o666)
    provider = SlurmProvider(lambda b, i: ["true"], run_dir=run, env={"CORRAL_TOKEN": "t" * 64})
    with anyio.fail_after(30):
        async with provider.running():
            for d in (run, run.parent, run.parent.parent):
                assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
            (run / "block-1.env").symlink_to(stolen)
            await provider.start_block(BlockSpec())
    env = run / "block-1.env"
    assert not env.is_symlink()
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert "CORRAL_TOKEN=" + "t" * 64 in env.read_text()
    assert stolen.read_text() == ""


def test_a_refused_job_s_advice_quotes_only_the_pool_s_lines_that_ask_for_nodes() -> None:
    """An audit: the advice of a refused block (``sbatch``'s error, ``check
    --slurm``'s test-only) quoted every ``#SBATCH`` line of the pool's
    ``scheduler_options`` as the "features and GRES the nodes have" to check, a
    ``--job-name`` line (or ``--mail-user``, ``--output``) among them, though such a
    line never makes a job refused. Those lines are left out; none left, no quote."""
    options = (
        "#SBATCH --job-name=sky\n#SBATCH -J sky\n#SBATCH --constraint=haswell\n"
        "#SBATCH --mail-user=me@example.org\n#SBATCH --gres=gpu:2\n#SBATCH -o x.out"
    )
    assert own_lines_advice(options) == (
        ", and the pool's scheduler_options (#SBATCH --constraint=haswell #SBATCH "
        "--gres=gpu:2: features and GRES the nodes have: `sinfo -o '%P %f %G'`)"
    )
    assert own_lines_advice("#SBATCH --job-name=sky\n#SBATCH --mail-type=END") == ""
    assert own_lines_advice("#SBATCH --reservation=r1") == (
        ", and the pool's scheduler_options (#SBATCH --reservation=r1: features and GRES "
        "the nodes have: `sinfo -o '%P %f %G'`)"
    )
