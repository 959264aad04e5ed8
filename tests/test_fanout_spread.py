"""A fan-out whose consumers all read every root (the resilience audit's D3, against
the scheduler's pure core: events in, exact assignments out).

Six roots of 8 KB feed 45 consumers of a category with no finished task (so each is
expected to take ``unknown_duration``, 0.5 s, past the ``backlog``) on three one-core
workers. Once one worker holds every root (its first consumer fetched them), it was the
only "data holder" while the other two were busy at their two slots, and the locality
rules sent it every queued consumer at once (39 of 45, the audit saw): the other two
then idled. The holder may take a consumer past its slots only as far as a consumer
that stays with its data may (``stay_factor`` times its slots)."""

from __future__ import annotations

from actors.scheduler_events import TasksFinished
from tests.helpers import (
    Factory,
    assigned,
    event,
    finish_all,
    join,
    make_state,
    on,
    result,
    run,
    submit,
)

__all__ = ["make_state"]  # the fixture, used by name

ROOTS = [f"root-{i}" for i in range(6)]
CONSUMERS = [f"cons-{j}" for j in range(45)]


def test_a_fan_out_is_not_piled_on_the_worker_that_holds_every_input(
    make_state: Factory,
) -> None:
    s = make_state(unknown_long=False, long_task=float("inf"))  # else the defaults
    for w in ("w1", "w2", "w3"):
        join(s, w)
    table: dict[str, list[str]] = {r: [] for r in ROOTS}
    table.update({c: ROOTS for c in CONSUMERS})
    cmds = submit(s, table, CONSUMERS)
    roots = assigned(cmds)
    assert sorted(len(keys) for keys in roots.values()) == [2, 2, 2]  # paired roots
    sent: dict[str, list[str]] = {}
    for w, keys in roots.items():
        for k, v in assigned(finish_all(s, w, keys, nbytes=8000)).items():
            sent.setdefault(k, []).extend(v)
    # Every worker got its two slots of consumers, no more.
    assert {w: len(v) for w, v in sent.items()} == {"w1": 2, "w2": 2, "w3": 2}
    # w1's first consumer ends: it fetched every root, so w1 now holds them all.
    first = sent["w1"][0]
    others = tuple(r for r in ROOTS if r not in roots["w1"])
    done = result(first, nbytes=8, fetched=others)
    cmds = run(s, event(TasksFinished, worker="w1", results=(done,)))
    # It takes the next consumer in its free slot, and (as one that stays with its data
    # would) up to twice its slots in all: not every queued consumer.
    got = assigned(cmds)
    assert list(got) == ["w1"]
    assert len(on(s, "w1")) == 4, got
    assert sum(ts.state == "queued" for ts in s.tasks.values()) == 45 - 6 - 3
