"""A task asking for more than every worker of its configured pool has is refused at
submit (``runtime.graph.check_pool_fit``, called by the manager with the shapes
``runtime.node.pool_shapes`` takes of the configured pools): a ``GraphError`` naming
the task, what it asks, what the pool's workers have and the setting that says so, and
what to do. Before, it was accepted, waited "for a worker" forever and scaled its pool
to ``max_blocks``. Nothing of a refused submission is run or kept. Tasks of no pool,
of a pool not configured, or asking for what the configuration leaves unknown (memory
with ``memory_per_worker = 0``, disk not given as a size) are not checked. Also:
``Cluster(pools=..., alerts=...)`` refuses a rule scaling out a pool it does not have,
as a configuration file does. A task naming a pool that is not configured and that no
worker has joined (a misspelt pool, most likely) is taken, and the client is told at once
(a warning in its log) and the task's story says so.
"""

from __future__ import annotations

import logging
import operator
from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.pools import pools_from_dicts
from actors.scheduler_events import GraphSubmitted
from runtime import Cluster
from runtime.errors import AlertConfigError, GraphError, PolicyParamsError
from runtime.graph import DataNode, PoolFit, TaskSpec, Unplaced, check_pool_fit, unplaced_words
from runtime.node import Tokens, pool_shapes, run_manager, run_worker
from tests.helpers import (
    Factory,
    assigned,
    event,
    free_port_between,
    join,
    log_lines,
    make_state,
    run,
    specs_for,
    wait_until,
)

__all__ = ["make_state"]  # the autouse fixture, used by name

#: one worker of 2 cores in ``cpu`` (started at once); ``big``: 8 cores, none started
POOLS: dict[str, Any] = {
    "cpu": {"min_blocks": 1, "max_blocks": 1, "cores_per_worker": 2},
    "big": {"min_blocks": 0, "init_blocks": 0, "max_blocks": 1, "cores_per_worker": 8},
}


def refused_parts(err: GraphError, key: str) -> None:
    """The parts every refusal of 8 cores in ``cpu`` (2 cores a worker) says."""
    text = str(err)
    assert f"task {key!r} asks for 8 cores in pool 'cpu'" in text
    assert "each worker of that pool has 2 cores (cores_per_worker = 2 in [pools.cpu])" in text
    assert "the submission was refused and nothing of it was run" in text
    assert "Ask for at most 2 cores" in text
    assert "give the task a pool whose workers have enough (configured so: 'big')" in text
    assert "or raise cores_per_worker in [pools.cpu]" in text
    fields = err.fields
    assert (fields["key"], fields["pool"], fields["resource"]) == (key, "cpu", "cores")
    assert (fields["asked"], fields["has"], fields["setting"]) == (8, 2, "cores_per_worker")


@pytest.mark.anyio
async def test_more_cores_than_the_pools_workers_have_is_refused_and_the_cluster_goes_on() -> None:
    with anyio.fail_after(30):
        async with Cluster(pools=POOLS) as cluster:
            await cluster.wait_for_workers(1)
            runs = (await cluster.status())["runs"]
            fut = cluster.submit(
                operator.add, 1, 2, key="add-8", resources={"cores": 8}, pool="cpu"
            )
            with pytest.raises(GraphError) as info:
                await fut
            refused_parts(info.value, "add-8")
            # submit_graph: refused at once, the whole graph (its fitting task too)
            graph: dict[Any, Any] = {"x": 1, "y": (operator.add, "x", 1)}
            with pytest.raises(GraphError) as info:
                await cluster.submit_graph(graph, ["y"], resources={"cores": 8}, pool="cpu")
            assert "2 tasks of this submission ask for more" in str(info.value)
            assert info.value.fields["count"] == 2
            # nothing kept: no run, no task at the scheduler, no block asked for
            status = await cluster.status()
            assert status["runs"] == runs
            assert not {"add-8", "x", "y"} & set(cluster.scheduler_state.tasks)
            assert sorted(status["autoscaler"]["blocks"]) == ["cpu/block-1"]
            # fixed, it runs on the same cluster (other settings: another key)
            fits = cluster.submit(operator.add, 1, 2, resources={"cores": 2}, pool="cpu")
            assert await fits == 3
            (y,) = await cluster.submit_graph(graph, ["y"], resources={"cores": 1}, pool="cpu")
            assert await y == 2


@pytest.mark.anyio
async def test_memory_and_disk_given_as_sizes_are_checked() -> None:
    pools = {
        "small": {"init_blocks": 0, "memory_per_worker": "1GB", "disk_per_worker": "2GB"},
        "large": {"init_blocks": 0, "memory_per_worker": "8GB"},
    }
    with anyio.fail_after(30):
        async with Cluster(pools=pools) as cluster:
            graph: dict[Any, Any] = {"m": (operator.neg, 1)}
            with pytest.raises(GraphError) as info:
                await cluster.submit_graph(graph, ["m"], resources={"memory": 4e9}, pool="small")
            text = str(info.value)
            assert "task 'm' asks for 3.73 GiB of memory (4,000,000,000 bytes)" in text
            assert "memory_per_worker = 1000000000 in [pools.small]" in text
            assert "Ask for at most 1,000,000,000 bytes of memory" in text
            assert "(configured so: 'large')" in text
            assert info.value.fields["setting"] == "memory_per_worker"
            with pytest.raises(
                GraphError, match=r"disk_per_worker = 2000000000 in \[pools.small\]"
            ):
                await cluster.submit_graph(graph, ["m"], resources={"disk": 3e9}, pool="small")
            assert (await cluster.status())["runs"] == 0
            assert "m" not in cluster.scheduler_state.tasks


@pytest.mark.anyio
async def test_what_the_configuration_does_not_fix_is_not_checked() -> None:
    """No pool, a pool not configured (workers may join it by hand), memory with
    ``memory_per_worker = 0`` (the machine's) and disk not given as a size are accepted:
    the tasks wait for a worker that has enough, as before."""
    pools: dict[str, Any] = {
        "cpu": {"init_blocks": 0, "cores_per_worker": 1},
        "off": {"init_blocks": 0, "disk_per_worker": "off"},
    }
    asks: list[tuple[dict[str, float], str | None]] = [
        ({"cores": 64}, None),
        ({"cores": 64}, "gpu"),
        ({"memory": 1e18}, "cpu"),
        ({"disk": 1e18}, "cpu"),
        ({"disk": 1e18}, "off"),
    ]
    with anyio.fail_after(30):
        async with Cluster(pools=pools) as cluster:
            futures = []
            for i, (resources, pool) in enumerate(asks):
                # submit_graph returns once the manager took the submission
                task: dict[Any, Any] = {f"t-{i}": (operator.neg, i)}
                futures += await cluster.submit_graph(
                    task, [f"t-{i}"], resources=resources, pool=pool
                )
            # the manager posted them to the scheduler before it asks for this status
            assert (await cluster.status())["wanted_keys"] == len(asks)
            assert {f"t-{i}" for i in range(len(asks))} <= set(cluster.scheduler_state.tasks)
            await cluster.cancel(futures)


@pytest.mark.anyio
async def test_a_manager_with_a_config_file_refuses_over_a_connection(tmp_path: Path) -> None:
    """The manager process (``--config FILE``) refuses the same way; the error reaches a
    remote client as itself."""
    config = tmp_path / "corral.toml"
    config.write_text(
        "[pools.cpu]\ninit_blocks = 0\ncores_per_worker = 2\n\n"
        "[pools.big]\ninit_blocks = 0\ncores_per_worker = 8\n"
    )
    where: dict[str, str] = {}
    up = anyio.Event()

    def ready(address: str, tokens: Tokens) -> None:
        where["address"] = address
        up.set()

    with anyio.fail_after(60):
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_manager(
                    "inproc://", ready=ready, listen_options={"codec": True}, config=config
                )
            )
            await up.wait()
            async with Cluster(where["address"]) as cluster:
                fut = cluster.submit(
                    operator.add, 1, 2, key="add-8", resources={"cores": 8}, pool="cpu"
                )
                with pytest.raises(GraphError) as info:
                    await fut
                refused_parts(info.value, "add-8")
                assert (await cluster.status())["runs"] == 0
            tg.cancel_scope.cancel()


def test_the_check_reads_the_pools_shapes_in_one_pass() -> None:
    """``pool_shapes``: cores always; memory and disk only as sizes. ``check_pool_fit``
    counts every task that asks too much and names the first, and answers the pools
    the tasks name that are not configured."""
    pools = pools_from_dicts(
        {
            "a": {"cores_per_worker": 2, "memory_per_worker": "1GB", "disk_per_worker": "off"},
            "b": {"disk_per_worker": "5GB"},
        }
    )
    assert pool_shapes(pools) == {
        "a": {"cores": (2.0, "cores_per_worker"), "memory": (1e9, "memory_per_worker")},
        "b": {"cores": (1.0, "cores_per_worker"), "disk": (5e9, "disk_per_worker")},
    }

    def spec(key: str, pool: str | None, **resources: float) -> TaskSpec:
        return TaskSpec(key, DataNode(key, 1), (), key, resources=resources, pool=pool)

    shapes = pool_shapes(pools)
    fine = [
        spec("f1", "a", cores=2, memory=1e9),
        spec("f2", None, cores=9),
        spec("f3", "z", cores=9),
    ]
    assert check_pool_fit(fine, shapes).unconfigured == ("z",)  # the pools named not configured
    # no pool configured: nothing checked, and every pool named is said
    assert check_pool_fit([spec("g", "a", cores=9), spec("h", None)], {}) == PoolFit(("a",))
    bad = [*fine, spec("b1", "b", disk=6e9), spec("b2", "a", cores=3), spec("b3", "a", memory=2e9)]
    with pytest.raises(GraphError) as info:
        check_pool_fit(bad, shapes)
    fields = info.value.fields
    assert (fields["key"], fields["count"], fields["setting"]) == ("b1", 3, "disk_per_worker")
    assert "3 tasks of this submission ask for more than their pool's workers have" in str(
        info.value
    )
    # The pools suggested have enough of everything the task asks (or do not say).
    wide = {
        **shapes,
        "big": {"cores": (8.0, "cores_per_worker"), "memory": (1e9, "memory_per_worker")},
        "fat": {"cores": (8.0, "cores_per_worker"), "memory": (64e9, "memory_per_worker")},
        "open": {"cores": (8.0, "cores_per_worker")},  # its memory: the machine's
    }
    with pytest.raises(GraphError, match=r"\(configured so: 'fat', 'open'\)"):
        check_pool_fit([spec("c", "a", cores=8, memory=8e9)], wide)


def test_an_alert_rule_scaling_out_a_pool_the_cluster_does_not_have_is_refused() -> None:
    def rule(pool: str) -> dict[str, Any]:
        return {
            "name": "Grow",
            "expr": "corral_queue_depth > 0",
            "action": {"scale_out": {"fit": True, "pool": pool}},
        }

    with pytest.raises(AlertConfigError) as info:
        Cluster(pools=POOLS, alerts=[rule("cpuu")])
    assert (info.value.rule, info.value.key) == ("Grow", "action.scale_out.pool")
    assert "names no pool: 'cpuu'; did you mean 'cpu'? The pools are: cpu, big" in str(info.value)
    assert Cluster(pools=POOLS, alerts=[rule("big")]).alerting.pools == ("cpu", "big")
    # without pools, the pools are not known here (workers may join any): not checked
    Cluster(workers=0, alerts=[rule("anything")])


@pytest.mark.anyio
async def test_a_retry_fallback_to_a_pool_the_cluster_does_not_have_is_refused() -> None:
    """``fallback`` moves a pool's long tasks to another pool: with configured pools,
    both must be among them (a task moved to a pool no block serves would wait for
    good), at start (``Cluster(policies=...)``) and live (``policy set``); the policy in
    force stays. Without configured pools nothing is checked."""
    bad = ("default", {"fallback": {"cpu": "bgi"}})
    with anyio.fail_after(30):
        with pytest.raises(PolicyParamsError, match=r"'bgi' \(to\) is not a configured pool; "
                           r"did you mean 'big'\? The pools are: cpu, big"):  # fmt: skip
            async with Cluster(pools=POOLS, policies={"retry": bad}):
                pass
        async with Cluster(pools=POOLS) as cluster:
            await cluster.wait_for_workers(1)
            with pytest.raises(PolicyParamsError, match=r"'gpu' \(from\) is not a configured"):
                await cluster.set_policy("retry", "default", fallback={"gpu": "cpu"})
            info = await cluster.set_policy("retry", "default", fallback={"cpu": "big"})
            assert info.name == "default"
            assert await cluster.submit(operator.add, 1, 2, pool="cpu") == 3
        async with Cluster(workers=1) as cluster:  # pools joined by hand: not checked
            await cluster.set_policy("retry", "default", fallback={"cpu": "bgi"})


@pytest.mark.anyio
async def test_a_default_retry_policy_set_again_keeps_the_pools_fallback() -> None:
    """A pool's ``fallback`` lives in the default retry policy; setting that policy
    again (``policy set retry default max_lost=3``) keeps it, as the policy's
    parameters in force then show; a ``fallback`` given, or another retry policy,
    is taken as it is."""
    pools = {**POOLS, "cpu": {**POOLS["cpu"], "fallback": "big"}}
    with anyio.fail_after(30):
        async with Cluster(pools=pools) as cluster:
            await cluster.wait_for_workers(1)
            kept = {"fallback": {"cpu": "big"}, "max_lost": 3}
            info = await cluster.set_policy("retry", "default", max_lost=3)
            assert (info.name, info.params) == ("default", kept)
            # (the status gives the same values)
            assert (await cluster.status())["policy_params"]["retry"] == kept
            info = await cluster.set_policy("retry", "default", fallback={})
            assert info.params == {"fallback": {}}
            info = await cluster.set_policy("retry", "never")
            assert info.params == {}
            assert await cluster.submit(operator.add, 1, 2, pool="cpu") == 3


#: the pools of the misspelt-pool tests: none started (``ckpt`` when a task asks for it)
TYPO_POOLS: dict[str, Any] = {
    "ckpt": {"init_blocks": 0, "max_blocks": 1},
    "owner": {"init_blocks": 0, "max_blocks": 1},
}


def not_joined(pool: str, pools: str, hint: str = "") -> str:
    """What the manager says of ``pool``, not configured (``pools`` are) nor joined."""
    return (
        f"pool {pool!r}, which is not configured (pools: {pools}{hint}) and which no "
        "worker has joined"
    )


def told(log: Any, pool: str) -> list[str]:
    """The client's log lines about tasks of ``pool`` waiting for a worker of it."""
    return [ln for ln in log.lines if f"ask for pool {pool!r}" in ln]


@pytest.mark.anyio
async def test_a_task_of_a_misspelt_pool_is_told_to_the_client_at_once_and_in_its_story() -> None:
    """Before, ``submit(f, pool="ckpy")`` with pools ckpt and owner waited forever with
    nothing in the client's log and only ``new -> queued`` in its story. It is still
    taken (a worker may join ckpy by hand), but the client logs a warning at once, at
    the default level, and the task's story says the same, once. Configured pools say
    nothing."""
    why = not_joined("ckpy", "ckpt, owner", "; did you mean 'ckpt'?")
    with anyio.fail_after(30), log_lines("corral.client", logging.WARNING) as log:
        async with Cluster(pools=TYPO_POOLS) as cluster:
            fut = cluster.submit(operator.neg, 1, key="neg-1", pool="ckpy")
            await wait_until(lambda: told(log, "ckpy"), "the client's warning", limit=10)
            (line,) = told(log, "ckpy")
            assert (
                f"tasks of this submission ask for {why}: they wait until a worker joins "
                "with --pool ckpy"
            ) in line
            notes = [e[2] for e in await cluster.story("neg-1") if "not configured" in e[2]]
            assert notes == [f"waiting for a worker of {why}: it runs once a worker joins "
                             "with --pool ckpy"]  # fmt: skip
            # submit_graph is told the same, by the time it returns
            await cluster.submit_graph({"neg-2": (operator.neg, 2)}, ["neg-2"], pool="ckpy")
            assert len(told(log, "ckpy")) == 2
            # configured pools: nothing said, and the task runs (ckpt's block starts)
            before = list(log.lines)
            assert await cluster.submit(operator.neg, 3, pool="ckpt") == -3
            await cluster.submit_graph({"neg-4": (operator.neg, 4)}, ["neg-4"], pool="owner")
            assert log.lines == before
            await cluster.cancel([fut])


@pytest.mark.anyio
@pytest.mark.parametrize("configured", [True, False], ids=["pools", "no-pools"])
async def test_a_pool_a_worker_joined_by_hand_is_not_told_over_a_connection(
    tmp_path: Path, configured: bool
) -> None:
    """A manager with a pools file; a worker joined with ``--pool gpu`` by hand. A
    task of gpu runs and nothing is said; one of ``gpux`` (no worker, not configured)
    is told to the remote client (the manager's answer crosses the connection). Without
    configured pools (workers started by hand, each in its ``--pool``) the same: before,
    a manager with no pools said nothing of ``gpux``."""
    config = tmp_path / "corral.toml"
    config.write_text(
        "[pools.ckpt]\ninit_blocks = 0\n\n[pools.owner]\ninit_blocks = 0\n" if configured else ""
    )
    where: dict[str, str] = {}
    up = anyio.Event()

    def ready(address: str, tokens: Tokens) -> None:
        where["address"] = address
        up.set()

    with anyio.fail_after(60), log_lines("corral.client", logging.WARNING) as log:
        async with anyio.create_task_group() as tg:
            tg.start_soon(
                lambda: run_manager(
                    "inproc://",
                    ready=ready,
                    listen_options={"codec": True},
                    config=config if configured else None,
                )
            )
            await up.wait()
            tg.start_soon(
                lambda: run_worker(where["address"], pool="gpu", listen_options={"codec": True})
            )
            async with Cluster(where["address"]) as cluster:
                await cluster.wait_for_workers(1)
                assert await cluster.submit(operator.neg, 1, pool="gpu") == -1
                assert told(log, "gpu") == []
                (fut,) = await cluster.submit_graph({"x": (operator.neg, 2)}, ["x"], pool="gpux")
                (line,) = told(log, "gpux")
                why = (
                    not_joined("gpux", "ckpt, owner")
                    if configured
                    else "pool 'gpux', which no worker has joined (this manager configures no "
                    "pool: the pools are those its workers' --pool name)"
                )
                assert f"ask for {why}: they wait" in line
                await cluster.cancel([fut])
            tg.cancel_scope.cancel()


def test_a_new_task_of_a_pool_no_worker_joined_says_so_once_in_its_story(
    make_state: Factory,
) -> None:
    """The core: of the pools the manager says are not configured, those no worker
    belongs to now get a line in the story of each new task of theirs (waiting or
    queued), once; a pool a worker joined by hand, and tasks of no pool, get none."""
    s = make_state(saturation=1.0)
    join(s, "w", cores=2, pool="gpu")
    assert s.pools_without_worker(["ckpy", "gpu"]) == ["ckpy"]
    specs = specs_for(
        s, {"a": [], "b": [], "c": ["a"], "d": []}, ["b", "c", "d"],
        attrs={"a": {"pool": "ckpy"}, "b": {"pool": "gpu"}, "c": {"pool": "ckpy"}},
    )  # fmt: skip
    unconfigured = (("ckpy", "WHY-ckpy"), ("gpu", "WHY-gpu"))
    cmds = run(s, event(GraphSubmitted, specs=specs, wanted=("b", "c", "d"),
                        unconfigured=unconfigured))  # fmt: skip
    assert {w: sorted(keys) for w, keys in assigned(cmds).items()} == {"w": ["b", "d"]}

    def notes(key: str) -> list[tuple[str, str]]:
        return [(e[1], e[2]) for e in s.story_log if e[0] == key and "WHY" in e[2]]

    waits = "waiting for a worker of WHY-ckpy: it runs once a worker joins with --pool ckpy"
    assert notes("a") == [("queued", waits)]
    assert notes("c") == [("waiting", waits)]
    assert notes("b") == notes("d") == []
    # the same keys again: no new task, nothing said again
    run(s, event(GraphSubmitted, specs=specs, wanted=("c",), unconfigured=unconfigured))
    assert notes("a") == [("queued", waits)] and notes("c") == [("waiting", waits)]
    # once a worker joins ckpy by hand, its tasks run
    assert assigned(join(s, "hand", pool="ckpy")) == {"hand": ["a"]}


# -- an embedded cluster without configured pools: its one pool's workers are known ----


@pytest.mark.anyio
async def test_an_embedded_cluster_refuses_a_task_bigger_than_its_workers() -> None:
    """``Cluster(workers=N, threads_per_worker=..., memory_per_worker=...)`` knows its
    workers: a task (of its pool, or of none) asking more cores, memory or disk than
    they have waited forever, silently. It is refused at submit now, as for configured
    pools, naming the ``Cluster`` argument to raise; what fits runs."""
    with anyio.fail_after(30):
        async with Cluster(
            workers=1, threads_per_worker=2, memory_per_worker="1GiB", disk_per_worker="1GiB"
        ) as cluster:
            with pytest.raises(GraphError) as info:
                await cluster.submit(operator.neg, 1, key="cores", resources={"cores": 3})
            fields, text = info.value.fields, str(info.value)
            assert (fields["pool"], fields["asked"], fields["has"]) == ("default", 3, 2)
            assert fields["setting"] == "threads_per_worker"
            assert "each worker of that pool has 2 cores (threads_per_worker = 2 in " in text
            assert "Ask for at most 2 cores, or raise threads_per_worker in Cluster(...)" in text
            assert "give the task a pool" not in text  # it has no other
            for resource, setting in (("memory", "memory_per_worker"), ("disk", "disk_per_worker")):
                with pytest.raises(GraphError) as info:
                    await cluster.submit_graph(
                        {"x": (operator.neg, 1)}, ["x"], resources={resource: 2 << 30},
                        pool="default",
                    )  # fmt: skip
                assert info.value.fields["setting"] == setting
                assert f"raise {setting} in Cluster(...)" in str(info.value)
            fits = {"cores": 2, "memory": 1 << 30, "disk": 1 << 30}
            assert await cluster.submit(operator.neg, 1, resources=fits) == -1


@pytest.mark.anyio
async def test_an_embedded_clusters_task_of_a_pool_no_worker_joined_is_told() -> None:
    """``Cluster(workers=2).submit(f, pool="gpu")`` stayed pending with nothing said;
    the client is told now, as with configured pools, in words that fit a cluster
    with none configured. Its own pool is never told, not even while its workers are
    still joining."""
    why = (
        "pool 'gpu', which no worker has joined (no pool is configured: this cluster's "
        "workers are in pool 'default'; scale(n, pool='gpu') starts workers in it)"
    )
    with anyio.fail_after(30), log_lines("corral.client", logging.WARNING) as log:
        async with Cluster(workers=2) as cluster:
            own = cluster.submit(operator.neg, 1, pool="default")  # before any joined
            fut = cluster.submit(operator.neg, 1, key="neg-gpu", pool="gpu")
            await wait_until(lambda: told(log, "gpu"), "the client's warning", limit=10)
            (line,) = told(log, "gpu")
            assert f"tasks of this submission ask for {why}: they wait" in line
            assert await own == -1
            assert told(log, "default") == []
            assert (await cluster.status())["queues"] == {"gpu": 1}
            await cluster.scale(1, "gpu")  # what the warning says to do
            assert await fut == -1


@pytest.mark.anyio
async def test_worker_processes_of_an_embedded_cluster_are_checked_the_same() -> None:
    """``Cluster(processes=N)``: the same refusal (its workers have the machine's
    memory shared among them), and no warning for its own pool while its worker
    process has not joined yet."""
    with anyio.fail_after(60), log_lines("corral.client", logging.WARNING) as log:
        async with Cluster(processes=1, threads_per_worker=1) as cluster:
            with pytest.raises(GraphError, match=r"raise memory_per_worker in Cluster\(\.\.\.\)"):
                await cluster.submit(sum, [1], resources={"memory": cluster.worker_memory() + 1})
            assert await cluster.submit(sum, [1, 2], pool="default") == 3
            assert told(log, "default") == []


@pytest.mark.timeout(60)
def test_runtime_get_refuses_what_its_own_cluster_could_never_run() -> None:
    """``runtime.get(dsk, key, pool="gpu")`` and a ``resources`` larger than its one
    worker hung forever: its cluster is its own, and no other worker can join it. Both
    raise GraphError at once now, saying what to do; its own pool runs."""
    import dask

    from runtime import get

    with pytest.raises(GraphError) as info:
        get({"a": 1}, "a", pool="gpu")
    text = str(info.value)
    assert info.value.fields["pool"] == "gpu"
    assert "runtime.get runs a cluster of its own whose workers are all in pool 'default'" in text
    assert "Leave pool out" in text and "--pool gpu" in text
    task = dask.delayed(sum)([1, 2])
    with pytest.raises(GraphError, match=r"asks for 64 cores in pool 'default'"):
        dask.compute(task, scheduler=get, resources={"cores": 64}, num_workers=2)
    with pytest.raises(GraphError, match=r"raise memory_per_worker"):
        dask.compute(task, scheduler=get, resources={"memory": 10e12})
    with dask.annotate(pool="gpu"):
        annotated = dask.delayed(sum)([1, 2])
    with pytest.raises(GraphError, match="pool 'gpu'"):
        dask.compute(annotated, scheduler=get)
    assert get({"a": 1}, "a", pool="default") == 1


def test_a_task_of_no_pool_no_configured_pools_worker_could_run_is_found() -> None:
    """``check_pool_fit`` answers the first task of no pool asking for more cores or
    memory than every worker of every configured pool has, what each pool's workers
    have (the setting that says so), and how many; a pool that has enough (or does not
    say: the machine's memory) leaves it out. Disk is not checked for it."""
    shapes = {
        "cpu": {"cores": (1.0, "cores_per_worker"), "memory": (2e9, "memory_per_worker")},
        "mem": {"cores": (2.0, "cores_per_worker"), "memory": (8e9, "memory_per_worker")},
    }

    def spec(key: str, **resources: float) -> TaskSpec:
        return TaskSpec(key, DataNode(key, 1), (), key, resources=resources)

    fits = [spec("a", cores=2), spec("b", memory=8e9), spec("c"), spec("d", disk=1e18)]
    assert check_pool_fit(fits, shapes) == PoolFit(())
    found = check_pool_fit([*fits, spec("e", cores=4), spec("f", cores=2, memory=9e9)], shapes)
    assert found == PoolFit(
        (),
        Unplaced(
            "e",
            (("cores", 4.0),),
            (
                ("cpu", ("cores", 1.0, "cores_per_worker")),
                ("mem", ("cores", 2.0, "cores_per_worker")),
            ),
            2,
        ),
    )
    open_memory = {**shapes, "open": {"cores": (8.0, "cores_per_worker")}}
    assert check_pool_fit([spec("g", cores=4, memory=1e12)], open_memory).unplaced is None
    # an embedded cluster (where given): its one pool refuses the task, as before
    with pytest.raises(GraphError):
        check_pool_fit([spec("h", cores=4)], {"cpu": shapes["cpu"]}, "Cluster(...)")
    assert found.unplaced is not None
    words = unplaced_words(found.unplaced, "no worker connected has enough (at most 1 core)")
    assert words == (
        "task 'e' names no pool and asks for 4 cores (2 tasks of this submission do so; "
        "this is the first), more than every worker of every configured pool has ('cpu': "
        "1 core (cores_per_worker = 1 in [pools.cpu]); 'mem': 2 cores (cores_per_worker "
        "= 2 in [pools.mem])), and no worker connected has enough (at most 1 core): it "
        "waits until a worker with enough joins. Give it a pool whose workers have enough "
        "(pool=), raise cores_per_worker of a pool, or start a worker by hand with enough "
        "(`python -m runtime worker ADDRESS --cores 4`)"
    )


def test_the_scheduler_says_whether_a_connected_worker_has_enough(make_state: Factory) -> None:
    """``SchedulerState.short_workers``: "" once a worker that takes tasks has every
    resource asked; else what the connected ones have at most."""
    state = make_state()
    assert state.short_workers((("cores", 4.0),)) == "no worker that takes tasks is connected"
    join(state, "w1", cores=2, memory=4_000_000_000)
    assert state.short_workers((("cores", 4.0), ("memory", 1e9))) == (
        "no worker connected has enough (at most 2 cores and 4,000,000,000 B of memory)"
    )
    join(state, "w2", cores=4, memory=0)  # no memory limit
    assert state.short_workers((("cores", 4.0), ("memory", 1e12))) == ""


def start_manager(cli: Any, tmp_path: Path, pools: str, ports: tuple[int, int]) -> str:
    """A manager process with the configuration ``pools`` (TOML), listening on a free
    port of ``ports``: its address."""
    config = tmp_path / "corral.toml"
    config.write_text(pools)
    port = free_port_between(*ports)
    proc = cli.start(
        "manager", "--listen", f"127.0.0.1:{port}", "--no-monitoring", "--config", str(config)
    )
    return cli.line_with(proc, "manager listening on").split("listening on", 1)[1].strip()


def test_a_manager_process_warns_of_a_task_of_no_pool_no_worker_could_run(
    tmp_path: Path,
) -> None:
    """Before, ``submit(f, resources={"cores": 4})`` on a manager whose one pool has
    ``cores_per_worker = 1`` waited forever with nothing in the client's log. It is
    still taken (a worker joined by hand could run it), but the client logs a warning
    at submit; once a worker with enough joined by hand, nothing is said and it runs."""
    from runtime.cli_processes import Cli

    with Cli(tmp_path / "home") as cli:
        pools = "[pools.cpu]\ninit_blocks = 0\ncores_per_worker = 1\n"
        address = start_manager(cli, tmp_path, pools, (61000, 61249))

        async def main() -> None:
            with anyio.fail_after(30), log_lines("corral.client", logging.WARNING) as log:
                async with Cluster(address) as cluster:
                    (fut,) = await cluster.submit_graph(
                        {"big": (operator.neg, 1)}, ["big"], resources={"cores": 4}
                    )
                    (line,) = [ln for ln in log.lines if "names no pool" in ln]
                    assert "task 'big' names no pool and asks for 4 cores, more than " in line
                    assert "'cpu': 1 core (cores_per_worker = 1 in [pools.cpu])" in line
                    assert "no worker that takes tasks is connected" in line
                    assert "--cores 4`" in line
                    worker_port = free_port_between(61250, 61499)
                    cli.worker(address, "--cores", "4", "--port", str(worker_port))
                    await cluster.wait_for_workers(1)
                    assert await fut == -1
                    before = list(log.lines)
                    again = cluster.submit(operator.neg, 2, resources={"cores": 4})
                    assert await again == -2
                    assert log.lines == before

        anyio.run(main)


def test_a_task_no_pools_workers_could_run_keeps_no_block_past_its_idle_time(
    tmp_path: Path,
) -> None:
    """Before, a task of no pool asking for 4 cores on a manager whose one pool has
    ``cores_per_worker = 1`` counted as that pool's demand: its idle block was kept
    past ``max_idletime`` for ever (and with none running, one was asked for) for work
    it could never run. Now the scheduler counts such tasks per pool
    (``DemandRequest``), the autoscaler leaves them out of the pool's demand, the block
    is scaled in at its idle time, and the task's story says why no block comes."""
    from runtime.cli_processes import Cli

    pools = "[pools.cpu]\ninit_blocks = 1\nmax_blocks = 2\ncores_per_worker = 1\nmax_idletime = 1\n"
    with Cli(tmp_path / "home") as cli:
        address = start_manager(cli, tmp_path, pools, (60500, 60749))

        async def main() -> None:
            with anyio.fail_after(60):
                async with Cluster(address) as cluster:
                    await cluster.wait_for_workers(1)
                    (fut,) = await cluster.submit_graph(
                        {"big": (operator.neg, 1)}, ["big"], resources={"cores": 4}
                    )

                    async def no_block() -> bool:
                        return not (await cluster.status())["autoscaler"]["blocks"]

                    await wait_until(no_block, "cpu's idle block scaled in", step=0.2)
                    status = await cluster.status()
                    assert status["queues"] == {"*": 1}
                    assert status["autoscaler"]["desired"] == {"cpu": 0}
                    (story,) = [r[2] for r in await cluster.story("big") if "no block" in r[2]]
                    assert "no configured pool it may run in has workers with enough " in story
                    assert "('cpu': 1 core), so no block is started or kept for it" in story
                    fut.cancel()

        anyio.run(main)
