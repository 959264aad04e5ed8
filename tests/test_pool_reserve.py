"""Tasks of no pool (``pool=`` not given) and a pool's own work (user audit "pools",
findings 1 and 2): a free worker runs a ready task of its own pool before a task of
no pool of the same ``priority=`` (a higher one goes first, review 1207b F2), and a
task of no pool goes first to a worker whose pool has no ready task of its own; a
pool with ``any_pool_tasks = false`` never gets a task of no pool, and its autoscaler
demand leaves them out. Pure cores: events in, exact commands out.
"""

from __future__ import annotations

from typing import Any

import pytest

import policies
from actors.autoscaler_state import AutoscalerConfig, AutoscalerState, QueuesSeen, StartBlock
from actors.autoscaler_state import TargetSet as PoolTarget
from actors.pools import pools_from_dicts
from actors.scheduler_events import KeyErred
from policies.scaling import PoolLimits
from runtime.errors import PoolConfigError
from runtime.graph import check_pool_fit
from runtime.node import pool_shapes
from runtime.preflight import WARN, check_any_pool
from tests.helpers import GB, Factory, assigned, finish, join, make_state, specs_for, submit

__all__ = ["make_state"]  # the autouse fixture, used by name

# Short tasks of known length: one per core (saturation 1), no "long task" rule.
SHORT = {"saturation": 1.0, "unknown_long": False, "long_task": float("inf")}


def _preps(n: int) -> dict[str, list[str]]:
    return {f"prep-{i}": [] for i in range(n)}


def test_a_free_gpu_worker_runs_the_gpu_task_before_an_earlier_task_of_no_pool(
    make_state: Factory,
) -> None:
    """The audit's repro: CPU preprocessing without pool= keeps every worker busy; the
    GPU step, ready later, gets the GPU worker as soon as it frees, not the next prep
    (which came first by submission order)."""
    s = make_state(**SHORT)
    join(s, "cpu-1", pool="cpu")
    join(s, "gpu-1", pool="gpu")
    preps = _preps(6)
    got = assigned(submit(s, preps, list(preps)))
    assert sorted(got) == ["cpu-1", "gpu-1"]  # no gpu task yet: the gpu worker helps
    (on_gpu,) = got["gpu-1"]
    assert assigned(submit(s, {"train": []}, ["train"], pool="gpu")) == {}  # all busy
    assert assigned(finish(s, "gpu-1", on_gpu)) == {"gpu-1": ["train"]}


def test_a_higher_priority_task_of_no_pool_goes_before_a_pools_stream(
    make_state: Factory,
) -> None:
    """The pool rule breaks ties only: with one pool, a ``priority=100`` task of no pool
    runs at the next free slot, not after a stream of the pool's ``priority=-10``
    tasks (before: it waited for as long as the stream lasted, review 1207b F2); at
    equal priority the pool's own task goes first (the test above)."""
    s = make_state(**SHORT)
    join(s, "w1", pool="cpu")
    bulk = {f"bulk-{i}": [] for i in range(3)}
    assert assigned(submit(s, bulk, list(bulk), pool="cpu", priority=-10)) == {"w1": ["bulk-0"]}
    assert assigned(submit(s, {"urgent": []}, ["urgent"], priority=100)) == {}
    assert assigned(submit(s, {"bulk-3": []}, ["bulk-3"], pool="cpu", priority=-10)) == {}
    assert assigned(finish(s, "w1", "bulk-0")) == {"w1": ["urgent"]}
    assert assigned(finish(s, "w1", "urgent")) == {"w1": ["bulk-1"]}


def test_a_task_of_no_pool_goes_first_to_a_worker_whose_pool_has_none_waiting(
    make_state: Factory,
) -> None:
    """The gpu pool's task waits for a larger gpu worker; the idle gpu worker would be
    the least busy, yet the task of no pool goes to the cpu worker, which has a core
    free and no task of its pool waiting."""
    s = make_state(**SHORT)
    join(s, "cpu-1", cores=2, pool="cpu")
    join(s, "gpu-1", cores=2, pool="gpu")
    assert assigned(submit(s, {"c0": []}, ["c0"], pool="cpu")) == {"cpu-1": ["c0"]}
    big = {"big": {"resources": {"memory": 4 * GB}}}
    assert assigned(submit(s, {"big": []}, ["big"], pool="gpu", attrs=big)) == {}
    assert assigned(submit(s, {"p": []}, ["p"])) == {"cpu-1": ["p"]}
    # With only the gpu worker free, it takes the task of no pool (nothing else can).
    assert assigned(submit(s, {"q": []}, ["q"])) == {"gpu-1": ["q"]}


def test_a_reserved_pool_never_runs_a_task_of_no_pool(make_state: Factory) -> None:
    """any_pool_tasks = false: the gpu worker stays idle while tasks of no pool wait,
    takes its own pool's task, and a consumer of no pool of its output does not stay
    with its data there."""
    s = make_state(**SHORT, reserved_pools=frozenset({"gpu"}))
    join(s, "cpu-1", pool="cpu")
    join(s, "gpu-1", pool="gpu")
    preps = _preps(3)
    assert assigned(submit(s, preps, list(preps))) == {"cpu-1": ["prep-0"]}
    assert "gpu-1" in s.free and s.count("queued") == 2
    assert assigned(submit(s, {"train": []}, ["train"], pool="gpu")) == {"gpu-1": ["train"]}
    # A consumer of no pool of train's output waits for the cpu worker.
    assert assigned(submit(s, {"report": ["train"]}, ["report"])) == {}
    assert assigned(finish(s, "gpu-1", "train")) == {}
    assert s.tasks["report"].state == "queued"
    assert assigned(finish(s, "cpu-1", "prep-0")) == {"cpu-1": ["prep-1"]}
    # Once no task of no pool is placeable elsewhere, the gpu worker still takes none.
    assert "gpu-1" in s.free and s.tasks["report"].state == "queued"


# ----------------------------------------------------------------------------- autoscaler


def _limits(**kw: Any) -> PoolLimits:
    base: dict[str, Any] = dict(min_blocks=0, max_blocks=2, init_blocks=0, slots_per_block=1)
    return PoolLimits(**{**base, **kw})


def test_a_task_of_no_pool_killed_for_memory_fails_when_only_a_reserved_worker_is_larger(
    make_state: Factory,
) -> None:
    """``hog-0`` (no pool) is killed for memory on the 1 GiB cpu worker; the only larger
    workers are of the reserved gpu pool, which never run it: it fails now with
    ``TaskOutOfMemory`` (before: it waited for ever, the gpu workers counted as larger,
    review 1207b F4). Not reserved, the gpu pool's workers are where its retry goes."""
    for reserved, failed in ((frozenset(), False), (frozenset({"gpu"}), True)):
        s = make_state(reserved_pools=reserved)
        join(s, "cpu-1", cores=2, memory=GB, pool="cpu")
        join(s, "gpu-1", cores=2, memory=4 * GB, pool="gpu")
        gpu = {f"g{i}": [] for i in range(4)}  # the gpu workers busy with their own
        submit(s, gpu, list(gpu), pool="gpu")
        assert assigned(submit(s, {"hog-0": []}, ["hog-0"])) == {"cpu-1": ["hog-0"]}
        out = finish(s, "cpu-1", "hog-0", "oom", rss=int(0.95 * GB), rss_peak=int(0.95 * GB))
        erred = [c for c in out if isinstance(c, KeyErred)]
        assert [(c.key, type(c.error).__name__) for c in erred] == (
            [("hog-0", "TaskOutOfMemory")] if failed else []
        )
        assert s.tasks["hog-0"].state == ("erred" if failed else "queued")
        if failed:
            assert "the largest worker that takes tasks has" in str(erred[0].error)


def test_a_reserved_pools_demand_leaves_out_the_tasks_of_no_pool() -> None:
    """12 tasks of no pool: the cpu pool scales to its max_blocks; the gpu pool with
    any_pool_tasks = false stays at 0 blocks, and gets one for a task of its own. A
    gpu pool that takes tasks of no pool (the default) is scaled by them."""
    for reserved in (True, False):
        s = AutoscalerState(AutoscalerConfig(), policies.REGISTRY.create("scaling", "demand"))
        gpu = _limits(any_pool_tasks=not reserved)
        assert s.handle(PoolTarget(0.0, "gpu", 0, "g", gpu)) == []
        assert s.handle(PoolTarget(0.0, "cpu", 0, "c", _limits(max_blocks=3))) == []
        out = s.handle(QueuesSeen(1.0, {"*": 12}, {}, upcoming={"*": (1.0,) * 4}))
        want = [StartBlock(i, "cpu", "c") for i in (1, 2, 3)]
        if not reserved:
            want = [StartBlock(1, "gpu", "g"), StartBlock(2, "gpu", "g")] + [
                StartBlock(i, "cpu", "c") for i in (3, 4, 5)
            ]
        assert out == want
        assert s.active("gpu") == (0 if reserved else 12)
        assert s.upcoming_in("gpu") == (() if reserved else (1.0,) * 4)
        s.validate()
        if reserved:
            out = s.handle(QueuesSeen(2.0, {"*": 12, "gpu": 1}, {}))
            assert out == [StartBlock(4, "gpu", "g")]


# ----------------------------------------------------------------------------- the key


def test_any_pool_tasks_is_a_pool_key_and_its_limits_carry_it() -> None:
    pools = pools_from_dicts({"gpu": {"any_pool_tasks": False}, "cpu": {}})
    assert pools["gpu"].any_pool_tasks is False and pools["cpu"].any_pool_tasks is True
    assert pools["gpu"].limits().any_pool_tasks is False


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("false", "did you mean any_pool_tasks = false (a boolean, not a string)?"),
        (0, "got 0"),
    ],
)
def test_a_bad_any_pool_tasks_says_what_it_takes(value: object, said: str) -> None:
    with pytest.raises(PoolConfigError) as err:
        pools_from_dicts({"gpu": {"any_pool_tasks": value}})
    text = str(err.value)
    assert "pool 'gpu'" in text and "any_pool_tasks" in text and said in text
    assert "must be true or false (false: its workers run only the tasks that name" in text


def test_check_warns_of_a_pool_at_zero_blocks_that_tasks_of_no_pool_scale() -> None:
    """Two pools: the gpu pool at min_blocks = 0 that runs tasks of no pool is warned
    of, naming the key; with any_pool_tasks = false, or min_blocks > 0, or one pool
    alone, nothing is said."""
    pools = pools_from_dicts({"gpu": {"max_blocks": 2}, "cpu": {"min_blocks": 1}})
    (row,) = check_any_pool(pools)
    assert (row.pool, row.check, row.status) == ("gpu", "any-pool tasks", WARN)
    assert "start its blocks (up to max_blocks = 2)" in row.detail
    assert "any_pool_tasks = false in [pools.gpu]" in row.advice
    reserved = pools_from_dicts({"gpu": {"any_pool_tasks": False}, "cpu": {"min_blocks": 1}})
    assert check_any_pool(reserved) == []
    assert check_any_pool(pools_from_dicts({"gpu": {}})) == []


def test_check_warns_when_every_pool_is_reserved() -> None:
    """Every pool with any_pool_tasks = false: a task without pool= can never run, and
    the check says so once, for the whole configuration (review 1207b F3); one pool
    that takes them, nothing is said."""
    both = {"gpu": {"any_pool_tasks": False}, "fpga": {"any_pool_tasks": False}}
    (row,) = check_any_pool(pools_from_dicts(both))
    assert (row.pool, row.check, row.status) == ("*", "any-pool tasks", WARN)
    assert "a task submitted without pool=" in row.detail and "can never run" in row.detail
    assert "any_pool_tasks = true in one of [pools.gpu], [pools.fpga]" in row.advice
    (row,) = check_any_pool(pools_from_dicts({"gpu": {"any_pool_tasks": False}}))
    assert row.pool == "*"
    cpu = {"cpu": {"min_blocks": 1}}
    assert check_any_pool(pools_from_dicts({**both, **cpu})) == []


def test_a_task_of_no_pool_only_a_reserved_pool_is_large_enough_for_is_unplaced(
    make_state: Factory,
) -> None:
    """A task of no pool asks for 4 GiB: cpu workers have 1 GiB, the reserved gpu
    pool's 8 GiB. The gpu pool never runs it, so the submit-time fit check reports it
    unplaced, naming cpu only (before: gpu's 8 GiB counted and nothing was said,
    review 1207b F3); not reserved, gpu's workers fit it."""
    s = make_state()
    config = {"cpu": {"memory_per_worker": "1GiB"}, "gpu": {"memory_per_worker": "8GiB"}}
    shapes = pool_shapes(pools_from_dicts(config))
    big = {"big": {"resources": {"memory": 4 * GB}}}
    specs = specs_for(s, {"big": []}, ["big"], attrs=big)
    assert check_pool_fit(specs.values(), shapes).unplaced is None
    unplaced = check_pool_fit(specs.values(), shapes, reserved={"gpu"}).unplaced
    assert unplaced is not None
    assert (unplaced.key, unplaced.asks, unplaced.tasks) == ("big", (("memory", 4 * GB),), 1)
    assert [pool for pool, _ in unplaced.has] == ["cpu"]
    # the scheduler's "no connected worker has enough" leaves the gpu worker out too
    s = make_state(reserved_pools=frozenset({"gpu"}))
    join(s, "cpu-1", memory=GB, pool="cpu")
    join(s, "gpu-1", memory=8 * GB, pool="gpu")
    assert s.short_workers(unplaced.asks) == (
        f"no worker connected has enough (at most {GB:,} B of memory)"
    )
