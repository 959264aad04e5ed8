"""Behaviour tests for the actor kernel (runtime/kernel.py).

Every test is bounded with ``anyio.fail_after(5)``. Nothing waits on the wall clock
except the small ``ask`` timeouts and the "still pending" bounds, which assert that
something did *not* happen; everything that must happen is gated on ``anyio.Event``s
the test controls or on a fake :class:`Clock`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Iterator

import anyio
import pytest
from anyio.lowlevel import checkpoint
from hypothesis import given
from hypothesis import strategies as st

from runtime.errors import ActorCrashed, ActorStopped, AskTimeout, MailboxFull
from runtime.kernel import (
    Actor,
    ActorRef,
    ActorSystem,
    Clock,
    Envelope,
    Later,
    Mailbox,
    Timer,
    current_causal_id,
    handles,
    new_causal_id,
)
from runtime.messages import Message, message
from tests.helpers import log_lines, wait_until

LIMIT = 5.0  # seconds; the bound on every test
PENDING = 0.05  # seconds; how long "still pending" is checked

# ----------------------------------------------------------------------------- messages


@message("test.kernel.Note")
class Note(Message):
    value: int = 0


@message("test.kernel.Get")
class Get(Message):
    pass


@message("test.kernel.Block")
class Block(Message):
    value: int = 0


@message("test.kernel.Boom")
class Boom(Message):
    text: str = "boom"


@message("test.kernel.AskBoom")
class AskBoom(Message):
    text: str = "ask boom"


@message("test.kernel.Unhandled")
class Unhandled(Message):
    pass


@message("test.kernel.Base")
class Base(Message):
    value: int = 0


@message("test.kernel.SubA")
class SubA(Base):
    pass


@message("test.kernel.SubB")
class SubB(Base):
    pass


@message("test.kernel.SubSubA")
class SubSubA(SubA):
    pass


@message("test.kernel.Double")
class Double(Message):
    value: int = 0


@message("test.kernel.Echo")
class Echo(Message):
    pass


@message("test.kernel.Forward")
class Forward(Message):
    value: int = 0


@message("test.kernel.AskForward")
class AskForward(Message):
    pass


@message("test.kernel.Hello")
class Hello(Message):
    value: int = 0


@message("test.kernel.StartTimer")
class StartTimer(Message):
    delay: float = 1.0
    cancel_at_once: bool = False


@message("test.kernel.CancelTimer")
class CancelTimer(Message):
    pass


@message("test.kernel.Tick")
class Tick(Message):
    pass


@message("test.kernel.StartHelper")
class StartHelper(Message):
    pass


@message("test.kernel.StopSelf")
class StopSelf(Message):
    pass


# ----------------------------------------------------------------------------- helpers


async def still_pending(event: anyio.Event) -> bool:
    """True if ``event`` is not set within the small PENDING bound."""
    with anyio.move_on_after(PENDING):
        await event.wait()
    return not event.is_set()


class Recorder(Actor):
    """A general-purpose test actor; records what it handles and its lifecycle."""

    def __init__(self, gate: anyio.Event | None = None) -> None:
        self.gate = gate
        self.entered = anyio.Event()
        self.notes: list[int] = []
        self.causes: list[str] = []
        self.blocks_done: list[int] = []
        self.events: list[str] = []
        self.failures: list[tuple[BaseException, Message]] = []

    @handles(Note)
    def note(self, msg: Note) -> None:
        self.notes.append(msg.value)
        self.causes.append(current_causal_id())

    @handles(Get)
    def get(self, msg: Get) -> list[int]:
        return list(self.notes)

    @handles(Echo)
    def echo(self, msg: Echo) -> str:
        return current_causal_id()

    @handles(Block)
    async def block(self, msg: Block) -> int:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        self.blocks_done.append(msg.value)
        return msg.value

    @handles(Boom)
    def boom(self, msg: Boom) -> None:
        raise ValueError(msg.text)

    @handles(AskBoom)
    async def ask_boom(self, msg: AskBoom) -> None:
        await checkpoint()
        raise KeyError(msg.text)

    @handles(StopSelf)
    def stop_self(self, msg: StopSelf) -> None:
        self.stop("asked to")

    async def on_start(self) -> None:
        self.events.append("start")

    async def on_stop(self) -> None:
        self.events.append("stop")

    async def on_failure(self, error: BaseException, msg: Message) -> None:
        self.events.append("failure")
        self.failures.append((error, msg))

    async def on_restart(self) -> None:
        self.events.append("restart")
        await super().on_restart()


class FakeClock(Clock):
    """A clock the test drives: ``now()`` is ``t``; ``sleep`` waits for ``fire``."""

    def __init__(self) -> None:
        self.t = 0.0
        self.delays: list[float] = []
        self.fire = anyio.Event()
        self.cancelled = 0
        self.exited = 0

    def now(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        try:
            await self.fire.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        finally:
            self.exited += 1


@pytest.fixture
def corral_log() -> Iterator[list[str]]:
    """Rendered lines written to the stdlib ``corral`` logger, at DEBUG and above."""
    with log_lines(level=logging.DEBUG) as lines:
        yield lines.lines


# ----------------------------------------------------------------------------- dispatch


class Dispatcher(Actor):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    @handles(Base)
    def on_base(self, msg: Base) -> str:
        self.seen.append(("base", type(msg).__name__))
        return f"base:{msg.value}"

    @handles(SubB)
    async def on_sub_b(self, msg: SubB) -> str:
        await checkpoint()
        self.seen.append(("sub_b", type(msg).__name__))
        return f"sub_b:{msg.value}"

    @handles(Double, Note)
    def on_two(self, msg: Double | Note) -> int:
        return msg.value * 2


@pytest.mark.anyio
async def test_typed_dispatch_sync_async_and_subclasses() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            actor = Dispatcher()
            ref = await system.spawn(actor, "dispatcher")
            assert await ref.ask(Base(1)) == "base:1"
            # A subclass with no handler of its own goes to its base's handler (sync).
            assert await ref.ask(SubA(2)) == "base:2"
            assert await ref.ask(SubSubA(3)) == "base:3"
            # The most specific handler wins (async).
            assert await ref.ask(SubB(4)) == "sub_b:4"
            # One handler for several types.
            assert await ref.ask(Double(5)) == 10
            assert await ref.ask(Note(6)) == 12
            assert actor.seen == [
                ("base", "Base"),
                ("base", "SubA"),
                ("base", "SubSubA"),
                ("sub_b", "SubB"),
            ]


class Parent(Actor):
    @handles(Note)
    async def note(self, msg: Note) -> str:
        await checkpoint()
        return "parent"

    @handles(Get)
    def get(self, msg: Get) -> str:
        return "parent-get"


class Child(Parent):
    # Overrides without re-decorating, and switches sync/async.
    def note(self, msg: Note) -> str:  # type: ignore[override]
        return "child"

    async def get(self, msg: Get) -> str:  # type: ignore[override]
        await checkpoint()
        return "child-get"


@pytest.mark.anyio
async def test_overridden_handler_may_change_sync_async() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            parent = await system.spawn(Parent())
            child = await system.spawn(Child())
            assert await parent.ask(Note()) == "parent"
            assert await parent.ask(Get()) == "parent-get"
            assert await child.ask(Note()) == "child"
            assert await child.ask(Get()) == "child-get"


def test_handles_needs_a_type() -> None:
    with pytest.raises(TypeError):
        handles()


@pytest.mark.anyio
async def test_tell_order_is_kept() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            actor = Recorder()
            ref = await system.spawn(actor)
            for i in range(300):  # more than one batch
                if i % 2:
                    await ref.tell(Note(i))
                else:
                    ref.tell_nowait(Note(i))
            assert await ref.ask(Get()) == list(range(300))


@pytest.mark.anyio
async def test_ask_returns_handler_value() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            ref = await system.spawn(Recorder())
            await ref.tell(Note(7))
            assert await ref.ask(Get()) == [7]  # sync handler
            assert await ref.ask(Block(9)) == 9  # async handler
            assert await ref.ask(Block(10), timeout=None) == 10


# ----------------------------------------------------------------------------- rule 1


@pytest.mark.anyio
async def test_ask_handler_raises_original_type_and_actor_continues() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            actor = Recorder()
            ref = await system.spawn(actor)
            with pytest.raises(ValueError, match="sync failure"):
                await ref.ask(Boom("sync failure"))
            with pytest.raises(KeyError, match="async failure"):
                await ref.ask(AskBoom("async failure"))
            await ref.tell(Note(1))
            assert await ref.ask(Get()) == [1]
            # Not restarted, on_failure not called: the asker got the failure.
            assert actor.events == ["start"]
            assert not ref.stopped


# ----------------------------------------------------------------------------- rule 2


@pytest.mark.anyio
async def test_told_handler_raises_restarts_and_keeps_queue(corral_log: list[str]) -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            actor = Recorder()
            ref = await system.spawn(actor, "restarter")
            boom = Boom("told failure")
            # All queued before the actor runs: the failure must not lose the rest.
            ref.tell_nowait(Note(1))
            ref.tell_nowait(boom, causal_id="cause-of-boom")
            ref.tell_nowait(Note(2))
            ref.tell_nowait(Note(3))
            assert await ref.ask(Get()) == [1, 2, 3]
            assert actor.events == ["start", "failure", "restart", "stop", "start"]
            [(error, msg)] = actor.failures
            assert isinstance(error, ValueError) and str(error) == "told failure"
            assert msg is boom
            assert not ref.stopped
            assert ref.dropped == 0
        failed = [line for line in corral_log if "event='handler failed'" in line]
        assert len(failed) == 1
        assert "level='error'" in failed[0]
        assert "actor='restarter'" in failed[0]
        assert "causal_id='cause-of-boom'" in failed[0]
        assert any("event='restarting actor'" in line for line in corral_log)


@pytest.mark.anyio
async def test_restart_budget_exceeded_escalates() -> None:
    with anyio.fail_after(LIMIT):
        actor = Recorder()
        with pytest.raises(ActorCrashed) as info:
            async with ActorSystem() as system:
                ref = await system.spawn(actor, "crasher", max_restarts=2)
                for _ in range(3):
                    ref.tell_nowait(Boom("again"))
                ref.tell_nowait(Note(1))
                await anyio.sleep_forever()  # cancelled by the escalation
        assert info.value.actor == "crasher"
        assert info.value.restarts == 2
        assert "again" in info.value.cause
        assert ref.stopped
        assert ref.dropped == 1  # the Note queued behind the fatal failure
        # Two restarts (stop+start each), then the final on_stop exactly once.
        assert actor.events == ["start"] + ["failure", "restart", "stop", "start"] * 2 + [
            "failure",
            "stop",
        ]


@pytest.mark.anyio
async def test_crash_escalates_while_body_waits_on_an_event() -> None:
    with anyio.fail_after(LIMIT):
        never = anyio.Event()
        with pytest.raises(ActorCrashed):
            async with ActorSystem() as system:
                ref = await system.spawn(Recorder(), max_restarts=0)
                ref.tell_nowait(Boom())
                await never.wait()


@pytest.mark.anyio
async def test_crash_escalates_when_body_finishes_first() -> None:
    with anyio.fail_after(LIMIT):
        with pytest.raises(ActorCrashed):
            async with ActorSystem() as system:
                ref = await system.spawn(Recorder(), max_restarts=0)
                ref.tell_nowait(Boom())
                await ref.wait_stopped()


@pytest.mark.anyio
async def test_crash_during_shutdown_still_raises_actor_crashed() -> None:
    with anyio.fail_after(LIMIT):
        with pytest.raises(ActorCrashed) as info:
            async with ActorSystem() as system:
                first = await system.spawn(Recorder(), "first", max_restarts=0)
                await system.spawn(Recorder(), "second")
                # Handled only while the block's exit is shutting the system down.
                first.tell_nowait(Boom("late"))
        assert info.value.actor == "first"


@pytest.mark.anyio
async def test_crash_without_escalation_answers_queued_asks(corral_log: list[str]) -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            gate = anyio.Event()
            bad_actor = Recorder(gate)
            bad = await system.spawn(bad_actor, "bad", max_restarts=0, escalate=False)
            good = await system.spawn(Recorder(), "good")
            bad.tell_nowait(Block())
            await bad_actor.entered.wait()
            bad.tell_nowait(Boom())
            outcome: list[BaseException] = []

            async def asker() -> None:
                try:
                    await bad.ask(Get())
                except Exception as exc:
                    outcome.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(asker)
                await wait_until(lambda: len(bad.mailbox) == 2, step=0)
                gate.set()
            assert len(outcome) == 1
            assert type(outcome[0]) is ActorStopped
            assert bad.stopped
            assert bad_actor.events == ["start", "failure", "stop"]
            # The system keeps running; the other actor still answers.
            await good.tell(Note(5))
            assert await good.ask(Get()) == [5]
            assert set(system.actors) == {"good"}
            with pytest.raises(ActorStopped):
                bad.tell_nowait(Note())
            # Its log line does not say the system was shut down (a user audit: it did)
            (crashed,) = [ln for ln in corral_log if "actor crashed (not escalated)" in ln]
            assert "actor='bad'" in crashed and "the other actors go on" in crashed
            assert "shut down" not in crashed
            with pytest.raises(ActorStopped):
                await bad.ask(Get())


@pytest.mark.anyio
async def test_restart_window_uses_the_actor_clock() -> None:
    with anyio.fail_after(LIMIT):
        clock = FakeClock()
        async with ActorSystem(clock=clock) as system:
            actor = Recorder()
            ref = await system.spawn(actor, max_restarts=1, restart_window=10.0, escalate=False)
            # One failure per window, three times: always restarted.
            for t in (0.0, 20.0, 40.0):
                clock.t = t
                await ref.tell(Boom())
                await ref.tell(Note(int(t)))
                assert await ref.ask(Get()) == list(range(0, int(t) + 1, 20))
            assert not ref.stopped
            # A second failure within 10 s of the last one exceeds the budget.
            clock.t = 45.0
            await ref.tell(Boom())
            await ref.wait_stopped()
            assert actor.events.count("failure") == 4
            assert actor.events.count("restart") == 3


# ----------------------------------------------------------------------------- rule 3


@pytest.mark.anyio
async def test_messages_to_a_stopped_actor_raise_actor_stopped() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            actor = Recorder()
            ref = await system.spawn(actor, "gone")
            ref.stop()
            ref.stop()  # idempotent
            await ref.wait_stopped()
            assert ref.stopped
            assert "stopped" in repr(ref)
            with pytest.raises(ActorStopped) as info:
                ref.tell_nowait(Note())
            assert info.value.actor == "gone"
            assert info.value.message_type == "Note"
            with pytest.raises(ActorStopped):
                await ref.tell(Note())
            with pytest.raises(ActorStopped):
                await ref.ask(Get())
            assert actor.events == ["start", "stop"]
            assert system.actors == {}


@pytest.mark.anyio
async def test_queued_asks_get_actor_stopped_and_queued_tells_are_counted() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            gate = anyio.Event()
            actor = Recorder(gate)
            ref = await system.spawn(actor)
            ref.tell_nowait(Block(1))
            await actor.entered.wait()
            ref.stop()  # queued behind Block(1); everything after it is not handled
            ref.tell_nowait(Note(1))
            ref.tell_nowait(Note(2))
            outcome: list[BaseException] = []

            async def asker() -> None:
                try:
                    await ref.ask(Get())
                except Exception as exc:
                    outcome.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(asker)
                tg.start_soon(asker)
                await wait_until(lambda: len(ref.mailbox) == 5, step=0)
                gate.set()
            assert [type(e) for e in outcome] == [ActorStopped, ActorStopped]
            assert outcome[0] is not outcome[1]
            assert ref.dropped == 2
            assert actor.blocks_done == [1]  # queued before the stop: handled
            assert actor.notes == []


@message("test.kernel.AnswerLater")
class AnswerLater(Message):
    pass


class Deferring(Actor):
    """Answers AnswerLater with a Later coroutine that waits for ``release`` (never set
    by the tests below: the actor stops first) and records its cancellation."""

    def __init__(self) -> None:
        self.waiting = anyio.Event()
        self.release = anyio.Event()
        self.cancelled = anyio.Event()

    @handles(AnswerLater)
    def answer_later(self, msg: AnswerLater) -> Later:
        return Later(self._answer())

    async def _answer(self) -> str:
        self.waiting.set()
        try:
            await self.release.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled.set()
            raise
        return "answered"

    @handles(Boom)
    def boom(self, msg: Boom) -> None:
        raise RuntimeError(msg.text)


async def _ask_while_it_stops(stop: Callable[[ActorRef[Deferring]], None]) -> ActorStopped:
    """Ask a Deferring actor, stop it with ``stop`` once its Later coroutine waits, and
    return what the asker got (the ask's own timeout is far beyond the test's bound)."""
    async with ActorSystem() as system:
        actor = Deferring()
        ref = await system.spawn(actor, "deferring", max_restarts=0, escalate=False)
        outcome: list[BaseException] = []

        async def asker() -> None:
            try:
                outcome.append(await ref.ask(AnswerLater(), timeout=10 * LIMIT))
            except Exception as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(asker)
            await actor.waiting.wait()
            stop(ref)
        assert actor.cancelled.is_set()
        assert ref.stopped
        [error] = outcome
        assert isinstance(error, ActorStopped), error
        return error


@pytest.mark.anyio
async def test_an_ask_answered_later_gets_actor_stopped_when_the_actor_stops() -> None:
    with anyio.fail_after(LIMIT):
        error = await _ask_while_it_stops(lambda ref: ref.stop("done"))
    assert error.actor == "deferring"
    assert error.message_type == "AnswerLater"
    assert "deferring" in str(error)


@pytest.mark.anyio
async def test_an_ask_answered_later_gets_actor_stopped_when_the_actor_crashes() -> None:
    with anyio.fail_after(LIMIT):
        error = await _ask_while_it_stops(lambda ref: ref.tell_nowait(Boom("crash")))
    assert error.actor == "deferring"


@pytest.mark.anyio
async def test_actor_can_stop_itself() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            actor = Recorder()
            ref = await system.spawn(actor)
            ref.tell_nowait(Note(1))
            ref.tell_nowait(StopSelf())
            ref.tell_nowait(Note(2))  # queued before the stop signal: still handled
            await ref.wait_stopped()
            assert actor.notes == [1, 2]
            assert ref.dropped == 0
            assert actor.events == ["start", "stop"]


# ----------------------------------------------------------------------------- rule 4


@pytest.mark.anyio
async def test_ask_timeout_and_late_processing() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            gate = anyio.Event()
            actor = Recorder(gate)
            ref = await system.spawn(actor, "slow")
            with pytest.raises(AskTimeout) as info:
                await ref.ask(Block(1), timeout=PENDING)
            assert isinstance(info.value, TimeoutError)
            assert info.value.actor == "slow"
            assert info.value.message_type == "Block"
            assert info.value.timeout == PENDING
            assert actor.blocks_done == []
            gate.set()
            # The message is still processed after the timeout.
            await ref.tell(Note(1))
            assert await ref.ask(Get()) == [1]
            assert actor.blocks_done == [1]


@pytest.mark.anyio
async def test_post_ask_queues_at_once_and_answers_later() -> None:
    """``post_ask`` puts the request in the mailbox when called (ahead of what the
    caller sends next, even a full mailbox: as ``post``), and its coroutine waits for
    the answer, the handler's error, or ``AskTimeout``."""
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            gate = anyio.Event()
            actor = Recorder(gate)
            ref = await system.spawn(actor, "slow", capacity=1)
            blocked = ref.post_ask(Block(1), timeout=None)
            got = ref.post_ask(Get(), timeout=None)  # the mailbox is full: queued anyway
            ref.post(Note(2))  # after both
            late = ref.post_ask(Block(3), timeout=PENDING)
            with pytest.raises(AskTimeout):
                await late  # the gate holds Block(1)
            gate.set()
            assert await blocked == 1
            assert await got == []  # before Note(2): in the order they were sent
            assert await ref.ask(Get()) == [2]
            with pytest.raises(ValueError, match="no"):
                await ref.post_ask(Boom("no"))


@pytest.mark.anyio
async def test_ask_timeout_while_waiting_for_mailbox_room() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            gate = anyio.Event()
            actor = Recorder(gate)
            ref = await system.spawn(actor, capacity=1)
            ref.tell_nowait(Block())
            await actor.entered.wait()
            ref.tell_nowait(Note(1))
            with pytest.raises(AskTimeout):
                await ref.ask(Get(), timeout=PENDING)
            assert len(ref.mailbox._putters) == 0
            gate.set()
            assert await ref.ask(Get()) == [1]


# ----------------------------------------------------------------------------- rule 5


@pytest.mark.anyio
async def test_message_without_handler(corral_log: list[str]) -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            actor = Recorder()
            ref = await system.spawn(actor, "picky")
            with pytest.raises(TypeError) as info:
                await ref.ask(Unhandled())
            assert "picky" in str(info.value)
            assert "Unhandled" in str(info.value)
            ref.tell_nowait(Unhandled(), causal_id="lost-one")
            ref.tell_nowait(Note(1))
            assert await ref.ask(Get()) == [1]
            assert actor.events == ["start"]  # no failure, no restart
            assert not ref.stopped
        lines = [line for line in corral_log if "no handler" in line]
        assert len(lines) == 1
        assert "level='error'" in lines[0]
        assert "message='Unhandled'" in lines[0]
        assert "actor='picky'" in lines[0]
        assert "causal_id='lost-one'" in lines[0]


# ----------------------------------------------------------------------------- rule 6


@pytest.mark.anyio
async def test_backpressure_tell_waits_and_tell_nowait_raises() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            gate = anyio.Event()
            actor = Recorder(gate)
            ref = await system.spawn(actor, "narrow", capacity=2)
            ref.tell_nowait(Block(1))
            await actor.entered.wait()  # Block(1) is out of the mailbox, being handled
            ref.tell_nowait(Note(1))
            ref.tell_nowait(Note(2))
            with pytest.raises(MailboxFull) as info:
                ref.tell_nowait(Note(3))
            assert info.value.actor == "narrow"
            assert info.value.capacity == 2
            sent = anyio.Event()

            async def producer() -> None:
                await ref.tell(Note(3))
                sent.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(producer)
                assert await still_pending(sent)
                assert len(ref.mailbox) == 2
                gate.set()
                await sent.wait()
            assert await ref.ask(Get()) == [1, 2, 3]


@pytest.mark.anyio
async def test_kernel_messages_bypass_the_bound() -> None:
    with anyio.fail_after(LIMIT):
        clock = FakeClock()
        async with ActorSystem(clock=clock) as system:
            gate = anyio.Event()
            actor = TimerActor(gate)
            ref = await system.spawn(actor, capacity=1)
            await ref.tell(StartTimer(5.0))
            await wait_until(lambda: len(clock.delays) == 1, step=0)  # the timer is sleeping
            ref.tell_nowait(Block())
            await actor.entered.wait()  # Block is being handled, gate closed
            ref.tell_nowait(Note(1))  # the mailbox is full
            with pytest.raises(MailboxFull):
                ref.tell_nowait(Note(2))
            clock.fire.set()  # timer fires into a full mailbox
            await wait_until(lambda: len(ref.mailbox) == 2, step=0)
            ref.stop()  # so does the stop signal
            assert len(ref.mailbox) == 3
            gate.set()
            await ref.wait_stopped()
            assert actor.ticks == 1
            assert actor.notes == [1]


@pytest.mark.anyio
async def test_waiting_tell_on_a_stopping_actor_raises_actor_stopped() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            gate = anyio.Event()
            actor = Recorder(gate)
            ref = await system.spawn(actor, capacity=1)
            ref.tell_nowait(Block())
            await actor.entered.wait()
            ref.tell_nowait(StopSelf())
            outcome: list[BaseException] = []

            async def producer() -> None:
                try:
                    await ref.tell(Note(1))
                except Exception as exc:
                    outcome.append(exc)

            async with anyio.create_task_group() as tg:
                tg.start_soon(producer)
                await wait_until(lambda: len(ref.mailbox._putters) == 1, step=0)
                gate.set()
            await ref.wait_stopped()
            # The waiting tell is never handled: it is refused with ActorStopped, or (if
            # it got in while the actor was winding down) dropped and counted.
            if outcome:
                assert [type(e) for e in outcome] == [ActorStopped]
                assert ref.dropped == 0
            else:
                assert ref.dropped == 1
            assert actor.notes == []


@pytest.mark.anyio
async def test_cancelled_putter_does_not_strand_others() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            gate = anyio.Event()
            actor = Recorder(gate)
            ref = await system.spawn(actor, capacity=1)
            ref.tell_nowait(Block())
            await actor.entered.wait()
            ref.tell_nowait(Note(0))  # full
            first_scope = anyio.CancelScope()
            second_done = anyio.Event()

            async def first() -> None:
                with first_scope:
                    await ref.tell(Note(1))

            async def second() -> None:
                await ref.tell(Note(2))
                second_done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(first)
                await wait_until(lambda: len(ref.mailbox._putters) == 1, step=0)
                tg.start_soon(second)
                await wait_until(lambda: len(ref.mailbox._putters) == 2, step=0)
                first_scope.cancel()
                await wait_until(lambda: len(ref.mailbox._putters) == 1, step=0)
                gate.set()
                await second_done.wait()
            assert await ref.ask(Get()) == [0, 2]


def _env(value: int) -> Envelope:
    return Envelope(Note(value), f"c{value}")


@pytest.mark.anyio
async def test_putter_cancelled_after_being_woken_passes_its_turn_on() -> None:
    # A native asyncio cancel lands even though the putter's wait already succeeded
    # (an anyio cancel scope would let the put finish instead); the putter must hand
    # the room it was given to the next one.
    with anyio.fail_after(LIMIT):
        box = Mailbox("box", 1)
        box.put_nowait(_env(0))
        first = asyncio.create_task(box.put(_env(1)))
        await wait_until(lambda: len(box._putters) == 1, step=0)
        second = asyncio.create_task(box.put(_env(2)))
        await wait_until(lambda: len(box._putters) == 2, step=0)
        assert box.get_nowait() is not None  # room: wakes the first putter...
        first.cancel()  # ...which is cancelled before it runs
        await asyncio.wait([first])
        assert first.cancelled()
        await second
        env = box.get_nowait()
        assert env is not None and env.causal_id == "c2"
        assert box.get_nowait() is None


@pytest.mark.anyio
async def test_putter_cancelled_by_scope_around_wakeup_strands_no_one() -> None:
    with anyio.fail_after(LIMIT):
        box = Mailbox("box", 1)
        box.put_nowait(_env(0))
        first_scope = anyio.CancelScope()
        first_done = anyio.Event()
        second_done = anyio.Event()

        async def first() -> None:
            with first_scope:
                await box.put(_env(1))
            first_done.set()

        async def second() -> None:
            await box.put(_env(2))
            second_done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            await wait_until(lambda: len(box._putters) == 1, step=0)
            tg.start_soon(second)
            await wait_until(lambda: len(box._putters) == 2, step=0)
            assert box.get_nowait() is not None
            first_scope.cancel()
            await first_done.wait()
            if not first_scope.cancelled_caught:  # the first put went through
                env = box.get_nowait()
                assert env is not None and env.causal_id == "c1"
            await second_done.wait()
        env = box.get_nowait()
        assert env is not None and env.causal_id == "c2"
        assert box.get_nowait() is None


@pytest.mark.anyio
async def test_closing_a_mailbox_releases_putters() -> None:
    with anyio.fail_after(LIMIT):
        box = Mailbox("box", 1)
        box.put_nowait(_env(0))
        outcome: list[BaseException] = []

        async def putter(i: int) -> None:
            try:
                await box.put(_env(i))
            except ActorStopped as exc:
                outcome.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(putter, 1)
            tg.start_soon(putter, 2)
            await wait_until(lambda: len(box._putters) == 2, step=0)
            left = box.close()
        assert [e.causal_id for e in left] == ["c0"]
        assert len(outcome) == 2
        assert len(box) == 0


def test_mailbox_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Mailbox("x", 0)


@given(
    capacity=st.integers(min_value=1, max_value=5),
    ops=st.lists(st.sampled_from(["put", "force", "get"]), max_size=60),
)
def test_mailbox_is_a_bounded_fifo(capacity: int, ops: list[str]) -> None:
    box = Mailbox("model", capacity)
    model: list[int] = []
    for i, op in enumerate(ops):
        if op == "get":
            env = box.get_nowait()
            if model:
                assert env is not None and env.causal_id == f"c{model.pop(0)}"
            else:
                assert env is None
        elif op == "force":
            box.put_nowait(_env(i), force=True)
            model.append(i)
        elif len(model) >= capacity:
            with pytest.raises(MailboxFull):
                box.put_nowait(_env(i))
        else:
            box.put_nowait(_env(i))
            model.append(i)
        assert len(box) == len(model)


# ----------------------------------------------------------------------------- causal ids


class Relay(Actor):
    def __init__(self, target: ActorRef[Recorder]) -> None:
        self.target = target
        self.seen: list[str] = []

    @handles(Forward)
    async def forward(self, msg: Forward) -> None:
        self.seen.append(current_causal_id())
        await self.target.tell(Note(msg.value))

    @handles(AskForward)
    async def ask_forward(self, msg: AskForward) -> tuple[str, str]:
        return current_causal_id(), await self.target.ask(Echo())


@pytest.mark.anyio
async def test_causal_ids_follow_messages() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            target_actor = Recorder()
            target = await system.spawn(target_actor, "target")
            relay_actor = Relay(target)
            relay = await system.spawn(relay_actor, "relay")
            assert current_causal_id() == ""

            # Explicit causal id: kept, and carried on by a tell made inside the handler.
            await relay.tell(Forward(1), causal_id="explicit-1")
            # Fresh tells from outside: a new id each.
            await relay.tell(Forward(2))
            await relay.tell(Forward(3))
            await wait_until(lambda: len(target_actor.notes) == 3, step=0)
            assert relay_actor.seen[0] == "explicit-1"
            assert target_actor.causes == relay_actor.seen
            fresh = relay_actor.seen[1:]
            assert all(fresh) and fresh[0] != fresh[1]
            assert "explicit-1" not in fresh

            # An ask inside a handler carries the handled message's id, too.
            outer, inner = await relay.ask(AskForward(), causal_id="ask-7")
            assert outer == inner == "ask-7"
            # A fresh ask from outside gets a new, non-empty id.
            a = await target.ask(Echo())
            b = await target.ask(Echo())
            assert a and b and a != b
            assert current_causal_id() == ""


def test_new_causal_ids_are_unique() -> None:
    ids = {new_causal_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert new_causal_id("t").startswith("t-")


@pytest.mark.anyio
async def test_actor_log_carries_name_and_causal_id(corral_log: list[str]) -> None:
    class Logger(Actor):
        @handles(Hello)
        def hello(self, msg: Hello) -> None:
            self.log.info("hello", value=msg.value)

    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            ref = await system.spawn(Logger(), "chatty")
            await ref.tell(Hello(3), causal_id="cid-42")
            await ref.tell(Hello(4))
            ref.stop()
            await ref.wait_stopped()
        hellos = [line for line in corral_log if "event='hello'" in line]
        assert len(hellos) == 2
        assert "actor='chatty'" in hellos[0]
        assert "causal_id='cid-42'" in hellos[0]
        assert "value=3" in hellos[0]
        assert "level='info'" in hellos[0]
        assert "causal_id='c-" in hellos[1]
        assert any("event='actor stopped'" in line and "chatty" in line for line in corral_log)


# ----------------------------------------------------------------------------- timers


class TimerActor(Actor):
    def __init__(self, gate: anyio.Event | None = None) -> None:
        self.gate = gate
        self.entered = anyio.Event()
        self.timer: Timer | None = None
        self.ticks = 0
        self.tick_causes: list[str] = []
        self.ticked = anyio.Event()
        self.notes: list[int] = []

    @handles(StartTimer)
    def start_timer(self, msg: StartTimer) -> None:
        self.timer = self.send_later(msg.delay, Tick())
        if msg.cancel_at_once:
            self.timer.cancel()

    @handles(CancelTimer)
    def cancel_timer(self, msg: CancelTimer) -> None:
        assert self.timer is not None
        self.timer.cancel()

    @handles(Tick)
    def tick(self, msg: Tick) -> None:
        self.ticks += 1
        self.tick_causes.append(current_causal_id())
        self.ticked.set()

    @handles(Block)
    async def block(self, msg: Block) -> None:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()

    @handles(Note)
    def note(self, msg: Note) -> None:
        self.notes.append(msg.value)

    @handles(Get)
    def get(self, msg: Get) -> int:
        return self.ticks


@pytest.mark.anyio
async def test_send_later_delivers_on_the_injected_clock() -> None:
    with anyio.fail_after(LIMIT):
        clock = FakeClock()
        async with ActorSystem(clock=clock) as system:
            actor = TimerActor()
            ref = await system.spawn(actor)
            await ref.tell(StartTimer(30.0), causal_id="timer-cause")
            await wait_until(lambda: clock.delays == [30.0], step=0)
            assert await ref.ask(Get()) == 0
            clock.fire.set()
            await actor.ticked.wait()
            assert actor.ticks == 1
            assert actor.tick_causes == ["timer-cause"]


@pytest.mark.anyio
async def test_per_actor_clock_overrides_the_system_clock() -> None:
    with anyio.fail_after(LIMIT):
        clock = FakeClock()
        async with ActorSystem() as system:
            actor = TimerActor()
            actor.clock = clock
            ref = await system.spawn(actor)
            await ref.tell(StartTimer(2.0))
            await wait_until(lambda: clock.delays == [2.0], step=0)
            clock.fire.set()
            await actor.ticked.wait()


@pytest.mark.anyio
async def test_timer_cancel_prevents_delivery() -> None:
    with anyio.fail_after(LIMIT):
        clock = FakeClock()
        async with ActorSystem(clock=clock) as system:
            actor = TimerActor()
            ref = await system.spawn(actor)
            # Cancelled while sleeping.
            await ref.tell(StartTimer(1.0))
            await wait_until(lambda: len(clock.delays) == 1, step=0)
            await ref.tell(CancelTimer())
            await wait_until(lambda: clock.exited == 1, step=0)
            assert clock.cancelled == 1
            # Cancelled before the timer task even ran.
            await ref.tell(StartTimer(1.0, cancel_at_once=True))
            await wait_until(lambda: clock.exited == 2, step=0)
            assert clock.cancelled == 2
            clock.fire.set()
            assert await ref.ask(Get()) == 0
            assert actor.ticks == 0


@pytest.mark.anyio
async def test_timers_are_cancelled_when_the_actor_stops() -> None:
    with anyio.fail_after(LIMIT):
        clock = FakeClock()
        async with ActorSystem(clock=clock) as system:
            actor = TimerActor()
            ref = await system.spawn(actor)
            await ref.tell(StartTimer(1.0))
            await wait_until(lambda: len(clock.delays) == 1, step=0)
            ref.stop()
            await ref.wait_stopped()
            assert clock.cancelled == 1
            assert actor.ticks == 0


# ----------------------------------------------------------------------------- helpers


class Helper(Actor):
    def __init__(self) -> None:
        self.helper_started = anyio.Event()
        self.helper_cancelled = anyio.Event()
        self.helper_causes: list[str] = []

    @handles(StartHelper)
    def start_helper(self, msg: StartHelper) -> None:
        self.start_soon(self.helper, "arg")

    async def helper(self, arg: str) -> None:
        assert arg == "arg"
        self.helper_causes.append(current_causal_id())
        self.helper_started.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.helper_cancelled.set()
            raise


@pytest.mark.anyio
async def test_start_soon_tasks_are_cancelled_when_the_actor_stops() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            actor = Helper()
            ref = await system.spawn(actor)
            await ref.tell(StartHelper(), causal_id="helper-cause")
            await actor.helper_started.wait()
            assert actor.helper_causes == ["helper-cause"]
            ref.stop()
            await ref.wait_stopped()
            assert actor.helper_cancelled.is_set()
            with pytest.raises(RuntimeError):
                actor.start_soon(actor.helper, "arg")


# ----------------------------------------------------------------------------- system


class StopOrder(Actor):
    def __init__(self, log: list[str]) -> None:
        self._order = log

    @handles(Note)
    def note(self, msg: Note) -> None:
        pass

    async def on_stop(self) -> None:
        self._order.append(self.name)


@pytest.mark.anyio
async def test_shutdown_stops_newest_first_and_calls_on_stop_once() -> None:
    with anyio.fail_after(LIMIT):
        order: list[str] = []
        async with ActorSystem() as system:
            for name in ("a", "b", "c"):
                await system.spawn(StopOrder(order), name)
        assert order == ["c", "b", "a"]


@pytest.mark.anyio
async def test_shutdown_order_counts_a_reused_name_as_new() -> None:
    with anyio.fail_after(LIMIT):
        order: list[str] = []
        async with ActorSystem() as system:
            old = await system.spawn(StopOrder(order), "a")
            await system.spawn(StopOrder(order), "b")
            old.stop()
            await old.wait_stopped()
            assert order == ["a"]
            await system.spawn(StopOrder(order), "a")  # the newest actor now
        assert order == ["a", "a", "b"]


class SlowStop(StopOrder):
    """An on_stop that takes longer than the shutdown's timeout: it writes out what it
    holds (the monitoring recorder's writer does), so it says how long it needs."""

    stop_timeout = 5.0

    def __init__(self, log: list[str], release: threading.Event) -> None:
        super().__init__(log)
        self._release = release

    async def on_stop(self) -> None:
        await anyio.to_thread.run_sync(self._release.wait, 5.0)
        self._order.append(self.name)


@pytest.mark.anyio
async def test_an_actors_own_stop_timeout_outlasts_the_shutdowns() -> None:
    """shutdown(timeout=0.05) waits for an actor whose stop_timeout is 5 s (its on_stop
    finishes once released, 0.3 s later); an actor without one gets the shutdown's."""
    with anyio.fail_after(LIMIT):
        order: list[str] = []
        release = threading.Event()
        async with ActorSystem() as system:
            slow = await system.spawn(SlowStop(order, release), "slow")
            assert slow.stop_timeout == 5.0
            assert (await system.spawn(StopOrder(order), "plain")).stop_timeout is None
            threading.Timer(0.3, release.set).start()
            await system.shutdown([slow], timeout=0.05)
            assert order == ["slow"] and release.is_set()
            assert system.running  # not cancelled as an actor that did not stop in time


class HungStop(StopOrder):
    """An on_stop that never returns by itself (a wait without a bound)."""

    stop_timeout = 0.3

    async def on_stop(self) -> None:
        await self.wait_for_ever()

    async def wait_for_ever(self) -> None:
        await anyio.Event().wait()


class Stuck(StopOrder):
    """A handler that never returns by itself; its on_stop still records the stop."""

    stop_timeout = 0.3

    @handles(Block)
    async def block(self, msg: Block) -> None:
        await anyio.Event().wait()


class Counting(StopOrder):
    """Counts the Notes it handled before its on_stop."""

    def __init__(self, log: list[str]) -> None:
        super().__init__(log)
        self.notes = 0

    @handles(Note)
    def note(self, msg: Note) -> None:
        self.notes += 1

    async def on_stop(self) -> None:
        self._order.append(f"{self.name}:{self.notes}")


@pytest.mark.anyio
@pytest.mark.timeout(30)  # the old kernel waited for ever, shielded: only this could end it
async def test_a_hung_on_stop_is_cut_at_its_bound_and_the_others_still_stop() -> None:
    """ActorSystem.stop() with an actor whose on_stop hangs: the hook is cancelled after
    the actor's stop_timeout, an error names the actor and where the hook waited, and
    the older actor still stops in order, after the messages queued for it."""
    order: list[str] = []
    with log_lines() as logs, anyio.fail_after(LIMIT):
        system = ActorSystem()
        await system.start()
        first = await system.spawn(Counting(order), "first")
        await system.spawn(HungStop(order), "hung")
        await system.spawn(StopOrder(order), "last")
        for _ in range(3):
            first.post(Note())
        await system.stop()  # shielded: returns once every actor has stopped
        assert order == ["last", "first:3"], order
    line = logs.with_("on_stop did not finish in time", "hung")
    assert line is not None, logs.lines
    assert "doing='on_stop'" in line and "HungStop.wait_for_ever" in line, line
    assert "test_kernel.py" in line, line


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_a_stuck_handler_is_cut_alone_and_the_shutdown_goes_on() -> None:
    """A shutdown whose actor is stuck in a handler past its bound cancels that actor
    alone (its on_stop still runs) and says where it waited; the actors after it still
    stop in order, each after the messages queued for it (not cancelled with it)."""
    order: list[str] = []
    with log_lines() as logs, anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            first = await system.spawn(Counting(order), "first")
            stuck = await system.spawn(Stuck(order), "stuck")
            stuck.post(Block())
            for _ in range(3):
                first.post(Note())
            await system.shutdown([stuck, first])
            assert order == ["stuck", "first:3"], order
            assert system.running  # nothing else was cancelled
    line = logs.with_("actor did not stop in time; cancelled", "stuck")
    assert line is not None, logs.lines
    assert "Stuck.block" in line and "test_kernel.py" in line, line


@pytest.mark.anyio
async def test_explicit_shutdown_of_some_actors() -> None:
    with anyio.fail_after(LIMIT):
        order: list[str] = []
        async with ActorSystem() as system:
            a = await system.spawn(StopOrder(order), "a")
            await system.spawn(StopOrder(order), "b")
            await system.shutdown([a])
            assert order == ["a"]
            assert set(system.actors) == {"b"}
        assert order == ["a", "b"]


@pytest.mark.anyio
async def test_shutdown_finishes_queued_messages() -> None:
    with anyio.fail_after(LIMIT):
        actor = Recorder()
        async with ActorSystem() as system:
            ref = await system.spawn(actor)
            for i in range(5):
                ref.tell_nowait(Note(i))
        assert actor.notes == [0, 1, 2, 3, 4]
        assert ref.dropped == 0
        assert actor.events == ["start", "stop"]


@pytest.mark.anyio
async def test_actor_spawned_during_shutdown_does_not_hang_exit() -> None:
    class Spawner(Actor):
        def __init__(self, system: ActorSystem) -> None:
            self.system = system
            self.child = Recorder()

        async def on_stop(self) -> None:
            await self.system.spawn(self.child, "late-child")

    with anyio.fail_after(LIMIT):
        spawner = Spawner(ActorSystem())
        async with ActorSystem() as system:
            spawner.system = system
            await system.spawn(spawner)
        assert spawner.child.events == ["start", "stop"]


@pytest.mark.anyio
async def test_spawn_returns_after_on_start() -> None:
    class SlowStart(Actor):
        ready = False

        async def on_start(self) -> None:
            for _ in range(10):
                await checkpoint()
            self.ready = True

    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            actor = SlowStart()
            ref = await system.spawn(actor)
            assert actor.ready
            assert actor.ref is ref
            assert actor.name == ref.name
            assert ref.name.startswith("slowstart-")


@pytest.mark.anyio
async def test_duplicate_names_are_refused_while_running() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem() as system:
            first = await system.spawn(Recorder(), "dup")
            with pytest.raises(ValueError, match="dup"):
                await system.spawn(Recorder(), "dup")
            first.stop()
            await first.wait_stopped()
            second = await system.spawn(Recorder(), "dup")  # free again
            assert system.actors == {"dup": second}


@pytest.mark.anyio
async def test_mailbox_capacity_of_spawn() -> None:
    with anyio.fail_after(LIMIT):
        async with ActorSystem(default_capacity=7) as system:
            assert (await system.spawn(Recorder())).mailbox.capacity == 7
            assert (await system.spawn(Recorder(), capacity=3)).mailbox.capacity == 3
            with pytest.raises(ValueError):
                await system.spawn(Recorder(), "zero", capacity=0)
            assert "zero" not in system.actors


@pytest.mark.anyio
async def test_spawn_outside_a_running_system_is_refused() -> None:
    with pytest.raises(RuntimeError):
        await ActorSystem().spawn(Recorder())


@pytest.mark.anyio
async def test_body_exception_propagates_and_actors_stop() -> None:
    with anyio.fail_after(LIMIT):
        actor = Recorder()
        # The body's own exception comes out as itself, not wrapped in a group.
        with pytest.raises(LookupError, match="body"):
            async with ActorSystem() as system:
                await system.spawn(actor)
                raise LookupError("body")
        assert actor.events == ["start", "stop"]


@pytest.mark.anyio
async def test_outer_cancel_cuts_a_hanging_shutdown() -> None:
    with anyio.fail_after(LIMIT):
        gate = anyio.Event()  # never set: the actor would never finish its message
        actor = Recorder(gate)
        outer = anyio.CancelScope()
        refs: list[ActorRef[Recorder]] = []

        async def canceller() -> None:
            await wait_until(lambda: bool(refs) and len(refs[0].mailbox) == 1, step=0)  # stop
            outer.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(canceller)
            with outer:
                async with ActorSystem() as system:
                    ref = await system.spawn(actor)
                    ref.tell_nowait(Block())
                    await actor.entered.wait()
                    refs.append(ref)
        assert outer.cancelled_caught
        assert ref.stopped
        assert actor.events == ["start", "stop"]
