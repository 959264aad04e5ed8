"""The autoscaler actor with a provider whose blocks wait before they run
(``LocalProcessProvider(provision_delay=...)``, a stand-in for a batch queue) and a
pool's ``provisioning_timeout``: the shell tells the core when a pending block runs
(``BlockRunning``, from the provider's state each tick), and a block still pending at
the timeout is cancelled through the real scheduler's drain path (it knows none of
the block's workers) and replaced. Bounded waits on conditions, no sleeps.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.autoscaler import Autoscaler, PoolTarget
from actors.processes import LocalProcessProvider
from actors.providers import BlockSpec, BlockState
from actors.scheduler import Scheduler
from policies.scaling import PoolLimits
from runtime.kernel import ActorSystem
from runtime.messages import AutoscalerStatus, StatusRequest
from tests.helpers import wait_until

pytestmark = pytest.mark.anyio

LIMIT = 30.0  # seconds any test may take
CHILD = [sys.executable, str(Path(__file__).with_name("helpers_child.py"))]


def sleeper(block_id: str, index: int) -> list[str]:
    return [*CHILD, "sleep"]


def _nobody() -> Any:
    raise AssertionError("the scheduler of this test has no manager or registry")


async def _autoscaler(
    system: ActorSystem, provider: LocalProcessProvider, provisioning: float
) -> Autoscaler:
    scheduler = await system.spawn(Scheduler(_nobody, _nobody), "scheduler")
    limits = PoolLimits(
        min_blocks=1, max_blocks=1, init_blocks=1, provisioning_timeout=provisioning
    )
    autoscaler = Autoscaler(
        provider, scheduler, {"default": PoolTarget(1, BlockSpec(), limits)}, tick=0.1
    )
    await system.spawn(autoscaler, "autoscaler")
    return autoscaler


async def test_a_pending_block_that_runs_in_time_is_kept() -> None:
    with anyio.fail_after(LIMIT):
        async with (
            LocalProcessProvider(sleeper, provision_delay=0.3) as provider,
            ActorSystem() as system,
        ):
            autoscaler = await _autoscaler(system, provider, provisioning=20.0)
            await provider.wait_blocks_started(1)
            state = autoscaler.state
            (bid,) = state.blocks
            await wait_until(
                lambda: state.blocks[bid].state == "running",
                "the core to hear that the block runs",
                limit=LIMIT,
            )
            assert autoscaler.blocks[bid].state is BlockState.RUNNING
            assert state.stuck == {} and provider.blocks_started == 1


async def test_a_block_pending_past_its_timeout_is_cancelled_and_replaced() -> None:
    with anyio.fail_after(LIMIT):
        # Blocks would wait 60 s; the pool allows 0.5 s.
        async with (
            LocalProcessProvider(sleeper, provision_delay=60.0) as provider,
            ActorSystem() as system,
        ):
            autoscaler = await _autoscaler(system, provider, provisioning=0.5)
            await provider.wait_blocks_started(2)
            state = autoscaler.state
            await wait_until(
                lambda: any(e.block == "block-1" for e in state.ends),
                "block-1 to end",
                limit=LIMIT,
            )
            first = provider.blocks["block-1"]
            assert first.state is BlockState.SCALED_IN  # cancelled at the batch system
            assert provider.pids(first) == {}  # while pending: nothing ran
            assert state.stuck["default"] >= 1
            assert list(state.replacements) == [] and state.gave_up == set()
            end = next(e for e in state.ends if e.block == "block-1")
            assert (end.cause, end.charged) == ("stuck", False)
            status = await autoscaler.ref.ask(StatusRequest())
            assert isinstance(status, AutoscalerStatus)
            assert "block-1" not in status.blocks
            assert any(e.block == "block-1" and e.cause == "stuck" for e in status.ends)
