"""The autoscaler over a SlurmProvider whose Slurm commands are stand-ins (shell scripts
on PATH that print what Slurm 22.05 printed): a controller that cannot be reached is
not a refusal. A user audit stopped slurmctld while a workflow needed a block: after
three failed sbatch calls the pool was suspended until an operator typed ``resume``,
though the controller was back; a refusal (a partition that does not exist) is what
suspends a pool, and then at once, with text that says so. The real cluster:
tests/test_slurm.py and tests/test_slurm_fleet.py. Bounded waits on conditions.
"""

from __future__ import annotations

import io
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from rich.console import Console

from actors.autoscaler import Autoscaler, PoolTarget
from actors.providers import BlockSpec
from actors.scheduler import Scheduler
from actors.slurm import SlurmProvider
from runtime.console import _render_blocks, jsonable
from runtime.kernel import ActorSystem
from runtime.messages import AutoscalerStatus, MetricsRequest, StatusRequest
from tests.helpers import wait_until

pytestmark = pytest.mark.anyio

LIMIT = 30.0  # seconds any test may take

DOWN = (
    "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
    "(connect failure)"
)
REFUSED = "sbatch: error: Batch job submission failed: Invalid partition name specified"


def _stand_ins(bin_dir: Path, state: Path) -> None:
    """sbatch prints ``state/fail`` on stderr and exits 1 while that file exists, else
    answers job ids 101, 102, ...; squeue prints ``state/squeue.txt``, or while
    ``state/squeue_fail`` exists prints it on stderr, exits 1 and appends a line to
    ``state/squeue_calls``. Each sbatch call is appended to ``state/calls``."""
    bin_dir.mkdir()
    (state / "squeue.txt").write_text("")
    scripts = {
        "sbatch": 'echo sbatch >> "$S/calls"; if [ -e "$S/fail" ]; then cat "$S/fail" >&2; '
        'exit 1; fi; n=$(( $(cat "$S/next" 2>/dev/null || echo 100) + 1 )); '
        'echo $n > "$S/next"; echo $n',
        "squeue": 'if [ -e "$S/squeue_fail" ]; then echo squeue >> "$S/squeue_calls"; '
        'cat "$S/squeue_fail" >&2; exit 1; fi; cat "$S/squeue.txt"',
        "scontrol": 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1',
        "scancel": "true",
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/bash\nS={state}\n{body}\n")
        path.chmod(0o755)


def _nobody() -> Any:
    raise AssertionError("the scheduler of this test has no manager or registry")


@asynccontextmanager
async def _pool(tmp_path: Path, fail: str, **slurm: Any) -> AsyncIterator[tuple[Autoscaler, Path]]:
    """An autoscaler keeping one block of pool ``ckpt`` from a SlurmProvider over the
    stand-ins, whose sbatch fails with ``fail`` from the start; yields it and the
    stand-ins' state directory."""
    state = tmp_path / "state"
    state.mkdir()
    _stand_ins(tmp_path / "bin", state)
    (state / "fail").write_text(fail + "\n")
    provider = SlurmProvider(
        lambda b, i: ["true"], run_dir=tmp_path / "run", status_interval=0.05, **slurm
    )
    async with provider.running(), ActorSystem() as system:
        scheduler = await system.spawn(Scheduler(_nobody, _nobody), "scheduler")
        target = {"ckpt": PoolTarget(1, BlockSpec(pool="ckpt"))}
        autoscaler = Autoscaler({"ckpt": provider}, scheduler, target, tick=0.05)
        await system.spawn(autoscaler, "autoscaler")
        yield autoscaler, state


async def _status(autoscaler: Autoscaler) -> AutoscalerStatus:
    st = await autoscaler.ref.ask(StatusRequest())
    assert isinstance(st, AutoscalerStatus)
    return st


def _shown(st: AutoscalerStatus) -> str:
    """The console's status lines of ``st``'s pools in trouble, as plain text."""
    out = Console(width=400, record=True, file=io.StringIO())
    for part in _render_blocks(jsonable(st.to_fields())):
        out.print(part)
    return out.export_text()


def _calls(state: Path) -> int:
    calls = state / "calls"
    return len(calls.read_text().splitlines()) if calls.exists() else 0


async def test_a_controller_out_of_reach_backs_the_pool_off_and_it_goes_on_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with anyio.fail_after(LIMIT):
        async with _pool(tmp_path, DOWN, backoff=0.2, max_backoff=0.4) as (autoscaler, state):
            # Twice the failures that suspended the pool before (3 of 5).
            await wait_until(lambda: _calls(state) >= 6, "six failed sbatch calls")
            st = await _status(autoscaler)
            err = st.batch_errors["ckpt"]
            assert DOWN in err.error and err.failures >= 5
            assert not err.suspended and st.paused == () and st.gave_up == ()
            assert "resume" not in err.error  # nothing for an operator to do
            line = _shown(st)
            # The outage's start is kept while failures come (before, the time moved).
            assert err.since < err.at and "pool ckpt: batch system failing since" in line
            assert f"({err.failures} failures in a row, the latest at" in line, line
            assert "asking again in" in line or "asking again now)" in line, line
            metrics = await autoscaler.ref.ask(MetricsRequest())
            blocks = metrics.blocks
            assert blocks["ckpt"].submit_failures >= 3 and blocks["ckpt"].suspended == 0

            # The controller is back: the next submission goes through, unasked.
            (state / "squeue.txt").write_text("101|RUNNING|None|0|0|vm|\n")
            (state / "fail").unlink()
            await wait_until(lambda: autoscaler.state.blocks, "a block of the pool")
            st = await _status(autoscaler)
            assert st.batch_errors == {} and st.paused == ()
            metrics = await autoscaler.ref.ask(MetricsRequest())
            assert metrics.blocks["ckpt"].submit_failures == 0


async def test_a_refusal_that_suspends_submissions_pauses_the_pool_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The refusal that stops the provider's submissions pauses the pool then, and the
    status says so: not "suspended" beside an error promising a request after a
    back-off, and no request after it (before, the pool backed off first)."""
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with anyio.fail_after(LIMIT):
        async with _pool(tmp_path, REFUSED, max_failures=1, window=1, backoff=5.0) as (
            autoscaler,
            state,
        ):
            st = await wait_until(
                lambda: _when(_status(autoscaler), lambda s: "ckpt" in s.batch_errors),
                "the refusal in the status",
            )
            err = st.batch_errors["ckpt"]
            assert st.paused == ("ckpt",) and err.suspended and err.retry_in is None
            assert REFUSED in err.error
            assert "until an operator resumes the pool (`resume POOL`" in err.error
            assert "(suspended until an operator runs `resume ckpt`)" in _shown(st)
            assert _calls(state) == 1


async def _when(status: Any, test: Any) -> Any:
    st = await status
    return st if test(st) else None


SQUEUE_DOWN = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


async def test_a_failing_squeue_keeps_when_the_outage_began_and_says_it_polls_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user audit: while the controller was down, the status's ``batch system error
    at T`` moved T with each failed ``squeue`` and said "(asked again when the pool
    needs a block)", which is about submissions. Now it keeps when the failures began,
    with the latest error and how many, and says the states are asked again."""
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    with anyio.fail_after(LIMIT):
        async with _pool(tmp_path, DOWN, max_status_interval=0.1) as (autoscaler, state):
            (state / "squeue.txt").write_text("101|RUNNING|None|0|0|vm|\n")
            (state / "fail").unlink()  # the block is submitted, then runs
            await wait_until(lambda: autoscaler.state.blocks, "a block of the pool")
            (state / "squeue_fail").write_text(SQUEUE_DOWN + " (1)\n")
            await wait_until(lambda: (state / "squeue_calls").exists(), "a failed squeue")

            async def failed(n: int) -> AutoscalerStatus:
                async def seen() -> AutoscalerStatus | None:
                    st = await _status(autoscaler)
                    err = st.batch_errors.get("ckpt")
                    return st if err is not None and err.failures >= n else None

                return await wait_until(seen, f"{n} failed squeue calls seen")

            first = (await failed(1)).batch_errors["ckpt"]
            (state / "squeue_fail").write_text(SQUEUE_DOWN + " (2)\n")
            st = await failed(3)
            err = st.batch_errors["ckpt"]
            assert err.operation == "poll" and err.command.startswith("squeue"), err
            assert err.since == first.since < err.at, (first, err)
            assert "(2)" in err.error  # the latest error's text
            line = _shown(st)
            assert "pool ckpt: batch system failing since" in line, line
            assert "the blocks' states are asked again at the next poll" in line, line
            assert "when the pool needs a block" not in line, line

            (state / "squeue_fail").unlink()  # the controller is back
            await wait_until(lambda: not autoscaler._watch_errors, "the failures in a row to end")
