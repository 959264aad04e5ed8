"""The autoscaler actor: keeps the number of workers each pool should have.

What lives here: :class:`Autoscaler`. For now it keeps a configured number of workers
per pool (``ScaleRequest`` changes it at runtime) and replaces workers that end without
being asked to, within a replacement budget so a worker that crashes at start cannot
loop forever. Decisions from queue metrics and alerts come with the monitoring work;
they will only change how the target is computed, not how blocks are driven.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any

from actors.providers import Block, BlockSpec, BlockState, Provider
from runtime.kernel import Actor, ActorRef, handles
from runtime.messages import Message, ScaleRequest, StatusRequest, WorkerGone, message

__all__ = ["Autoscaler", "PoolTarget"]


@message(local=True)
class _BlockEnded(Message):
    block: Any
    state: str


@dataclasses.dataclass(slots=True)
class PoolTarget:
    n: int
    spec: BlockSpec


class Autoscaler(Actor):
    """Drives a :class:`Provider` so each pool has its target number of workers."""

    def __init__(
        self,
        provider: Provider,
        scheduler: ActorRef[Any],
        targets: dict[str, PoolTarget],
        *,
        max_replacements: int = 10,
        replacement_window: float = 60.0,
    ) -> None:
        self.provider = provider
        self.scheduler = scheduler
        self.targets = dict(targets)
        self.blocks: dict[str, Block] = {}  #: live blocks by id
        self.ended: list[Block] = []  #: blocks that ended, newest last
        self.max_replacements = max_replacements
        self.replacement_window = replacement_window
        self._replacements: deque[float] = deque()
        self.gave_up: set[str] = set()  #: pools whose workers kept dying

    async def on_start(self) -> None:
        await self._converge()

    async def on_stop(self) -> None:
        """Scale every pool in: stopping the autoscaler stops the workers it started."""
        blocks, self.blocks = list(self.blocks.values()), {}
        for block in blocks:
            await self.provider.stop_block(block)
            self.ended.append(block)

    def live(self, pool: str) -> list[Block]:
        return [b for b in self.blocks.values() if b.spec.pool == pool]

    async def _converge(self) -> None:
        for pool, target in self.targets.items():
            live = self.live(pool)
            while len(live) < target.n and pool not in self.gave_up:
                block = await self.provider.start_block(target.spec)
                self.blocks[block.block_id] = block
                self.start_soon(self._watch, block)
                live.append(block)
            for block in sorted(live, key=lambda b: b.block_id)[target.n :]:
                self.blocks.pop(block.block_id, None)
                for wid in block.workers:
                    await self.scheduler.tell(WorkerGone(wid, "drained"))
                await self.provider.stop_block(block)
                self.ended.append(block)

    async def _watch(self, block: Block) -> None:
        state = await self.provider.wait_ended(block)
        self.ref.post(_BlockEnded(block, state.value))

    @handles(_BlockEnded)
    async def block_ended(self, msg: _BlockEnded) -> None:
        block: Block = msg.block
        if self.blocks.pop(block.block_id, None) is None:
            return  # stopped on purpose
        block.state = BlockState(msg.state)
        self.ended.append(block)
        cause = "crash" if block.state == BlockState.FAILED else "unknown"
        for wid in block.workers:
            await self.scheduler.tell(WorkerGone(wid, cause))
        now = self.clock.now()
        self._replacements.append(now)
        while self._replacements and self._replacements[0] < now - self.replacement_window:
            self._replacements.popleft()
        if len(self._replacements) > self.max_replacements:
            self.gave_up.add(block.spec.pool)
            self.log.error(
                "workers keep ending; not replacing them any more",
                pool=block.spec.pool,
                ended=len(self._replacements),
                window=self.replacement_window,
            )
            return
        self.log.warning("worker block ended; replacing it", block=block.block_id, state=msg.state)
        await self._converge()

    @handles(ScaleRequest)
    async def scale(self, msg: ScaleRequest) -> dict[str, int]:
        if msg.n < 0:
            raise ValueError(f"cannot scale pool {msg.pool!r} to {msg.n} workers")
        target = self.targets.get(msg.pool)
        spec = target.spec if target is not None else BlockSpec(pool=msg.pool)
        self.targets[msg.pool] = PoolTarget(msg.n, spec)
        self.gave_up.discard(msg.pool)
        await self._converge()
        return {pool: len(self.live(pool)) for pool in self.targets}

    @handles(StatusRequest)
    def status(self, msg: StatusRequest) -> dict[str, Any]:
        return {
            "targets": {p: t.n for p, t in self.targets.items()},
            "blocks": {b.block_id: b.state.value for b in self.blocks.values()},
            "ended": len(self.ended),
            "gave_up": sorted(self.gave_up),
        }
