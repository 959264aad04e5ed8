"""Bad input to the Cluster API: each bad call raises a typed error whose message says
what the argument must be, and loses nothing: the same cluster then computes a good graph
(and no key stays held by the client for the bad call).

Every test is bounded with ``anyio.fail_after``.
"""

from __future__ import annotations

import re
from typing import Any

import anyio
import pytest

from runtime import Cluster
from runtime.errors import CorralError, GraphError, UnknownPolicyError

pytestmark = pytest.mark.anyio

BOUND = 15  # seconds any single test may take (they take well under one)


def inc(x: int) -> int:
    return x + 1


async def still_works(cluster: Cluster) -> None:
    """The cluster computes a good graph, by ``compute`` and by ``submit``."""
    assert await cluster.compute({"x": 1, "y": (inc, "x")}, "y") == 2
    assert await cluster.submit(inc, 41) == 42


def held_keys(cluster: Cluster) -> set[Any]:
    return set(cluster._client_actor.watches)


async def test_bad_resources_for_a_graph_are_a_graph_error() -> None:
    """``resources`` that is not a mapping, given to ``submit_graph`` or ``compute``,
    is a GraphError saying what resources must be, as from ``submit``."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            calls = [
                lambda: cluster.submit_graph({"a": 1}, ["a"], resources=5),
                lambda: cluster.compute({"a": 1}, "a", resources=5),
                lambda: cluster.compute({"a": 1}, ["a"], resources="gpu"),
            ]
            for call in calls:
                with pytest.raises(GraphError, match=r"resources a mapping of names to numbers"):
                    await call()
            with pytest.raises(GraphError, match=r"the submission has .*resources=5"):
                await cluster.submit_graph({"a": 1}, ["a"], resources=5)
            assert held_keys(cluster) == set()
            await still_works(cluster)
            # A good mapping still applies.
            assert await cluster.compute({"a": (inc, 1)}, "a", resources={"cores": 1}) == 2


async def test_unhashable_keys_are_a_graph_error() -> None:
    """A key that cannot be one (a dict) in ``compute``'s or ``submit_graph``'s keys, or
    a string where ``submit_graph`` wants a list of keys, is a GraphError saying what a
    key is; no key stays held."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            with pytest.raises(
                GraphError,
                match=r"got dict \{'x': 1\} as a key \(dict is not a key type\); a key is",
            ):
                await cluster.compute({"a": 1}, [["a"], {"x": 1}])
            with pytest.raises(
                GraphError,
                match=r"got dict \{'x': 1\} as a key \(dict is not a key type\); a key is",
            ):
                await cluster.compute({"a": 1}, {"x": 1})
            with pytest.raises(GraphError, match=r"submit_graph .*got dict .* as a key"):
                await cluster.submit_graph({"a": 1}, [{"x": 1}])
            with pytest.raises(GraphError, match=r"nested lists are for compute"):
                await cluster.submit_graph({"a": 1}, [["a"]])
            with pytest.raises(GraphError, match=r"takes a list of keys, got str 'a'"):
                await cluster.submit_graph({"a": 1}, "a")
            assert held_keys(cluster) == set()
            await still_works(cluster)


class _Token:
    """A hashable key of the user's own type: equal only to itself, so its copy in a
    worker process or a manager is another key."""


async def test_keys_that_cannot_cross_processes_are_a_graph_error_everywhere() -> None:
    """A hashable key whose copy in another process is not equal to it (an object(), a
    class of one's own, NaN, a tuple holding one) is a GraphError at the call, in-process
    as with worker processes or a manager (where it hung for ever): ``submit``'s key=,
    ``compute``'s keys and a graph's own keys. The keys dask allows all work."""
    bad: list[tuple[object, str]] = [
        (object(), r"object is not a key type"),
        (_Token(), r"_Token is not a key type"),
        (float("nan"), r"NaN is not equal to itself"),
        (("x", object()), r"its item 1 is not a key: object is not a key type"),
        (frozenset({1}), r"frozenset is not a key type"),
    ]
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            for key, why in bad:
                with pytest.raises(GraphError, match=rf"submit got .* as a key \({why}\); a key"):
                    cluster.submit(inc, 1, key=key)  # at the call, no await
                with pytest.raises(GraphError, match=rf"compute got .* as a key \({why}\)"):
                    await cluster.compute({key: (inc, 1)}, key)
            assert held_keys(cluster) == set()
            for key, why in bad:  # refused where the graph is taken in (also a manager)
                with pytest.raises(GraphError, match=rf"the graph has .* as a key \({why}\)"):
                    await cluster.submit_graph({key: (inc, 1), "b": (inc, 2)}, ["b"])
            good = [b"raw", 7, 2.5, ("x", 0), ("x", (1, 2.5), b"y"), ""]
            for i, key in enumerate(good):
                assert await cluster.submit(inc, i, key=key) == i + 1
            await still_works(cluster)


async def test_what_is_not_a_graph_is_a_graph_error() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            for graph, name in (([1, 2, 3], "list"), (None, "NoneType"), ("ab", "str")):
                with pytest.raises(GraphError, match=rf"got {name} .* as a graph; a graph is"):
                    await cluster.compute(graph, "a")  # type: ignore[arg-type]
                with pytest.raises(GraphError, match=rf"got {name} .* as a graph"):
                    await cluster.submit_graph(graph, ["a"])  # type: ignore[arg-type]
            assert held_keys(cluster) == set()
            await still_works(cluster)


async def test_unknown_compute_option_is_a_type_error() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            with pytest.raises(TypeError, match=r"compute got unknown option\(s\) \['bogus'\]"):
                await cluster.compute({"a": 1}, "a", bogus=3)
            assert held_keys(cluster) == set()
            await still_works(cluster)


async def test_gather_and_cancel_take_futures() -> None:
    """Keys (or anything else that is not a Future) given to ``gather`` or ``cancel``
    are a TypeError saying they take Futures; a future of another cluster is a
    CorralError, as for ``submit``."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            fut = cluster.submit(inc, 1)
            assert await fut == 2
            with pytest.raises(TypeError, match=r"gather takes Futures .*got str 'a'"):
                await cluster.gather(["a"])  # type: ignore[list-item]
            with pytest.raises(TypeError, match=r"gather takes a list of Futures, got Future"):
                await cluster.gather(fut)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=r"cancel takes Futures .*got str 'nokey'"):
                await cluster.cancel(["nokey"])  # type: ignore[list-item]
            with pytest.raises(TypeError, match=r"cancel takes a list of Futures, got str"):
                await cluster.cancel("nokey")  # type: ignore[arg-type]
            async with Cluster(workers=1) as other:
                theirs = other.submit(inc, 10)
                with pytest.raises(CorralError, match=r"belongs to another cluster"):
                    await cluster.gather([theirs])
                with pytest.raises(CorralError, match=r"belongs to another cluster"):
                    await cluster.cancel(theirs)
                assert await theirs == 11
            assert fut.status == "finished" and await cluster.gather([fut]) == [2]
            await still_works(cluster)


async def test_scale_takes_a_whole_number() -> None:
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            for n in ("2", 1.5, True, None):
                with pytest.raises(TypeError, match=r"scale\(n\): n is the number of blocks of"):
                    await cluster.scale(n)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match=r"hold is a number of seconds"):
                await cluster.scale(2, hold="5")  # type: ignore[arg-type]
            with pytest.raises(ValueError, match=r"cannot scale pool 'default' to -1 blocks: give"):
                await cluster.scale(-1)
            # more than a message carries: refused at the call, in every deployment (a
            # manager's codec said "see runtime/messages.py"; in-process it hung)
            with pytest.raises(ValueError, match=r"blocks from 0 to 9,223,372,036,854,775,807"):
                await cluster.scale(2**70)
            assert await cluster.scale(1) == {"default": 1}
            await still_works(cluster)


async def test_set_policy_names_a_bad_kind_or_name_and_the_one_likely_meant() -> None:
    """``set_policy(None, ...)`` was a bare ``TypeError: 'NoneType' object is not
    iterable``; a misspelt policy name listed the names but, unlike a misspelt kind or
    parameter, did not say which was likely meant."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            with pytest.raises(UnknownPolicyError, match=r"no kind of policy named None\. The"):
                await cluster.set_policy(None, "default")  # type: ignore[arg-type]
            with pytest.raises(UnknownPolicyError, match=r"no priority policy named 3\. Avail"):
                await cluster.set_policy("priority", 3)  # type: ignore[arg-type]
            with pytest.raises(UnknownPolicyError) as info:
                await cluster.set_policy("placement", "round-robn")
            # (the available names as registered: other test modules register their own)
            assert str(info.value).startswith(
                "no placement policy named 'round-robn'; did you mean 'round-robin'? Available: "
            ), str(info.value)
            assert "least-loaded, locality, round-robin" in str(info.value)
            assert (await cluster.status())["policies"]["placement"] != "round-robn"
            await still_works(cluster)


async def test_a_policies_entry_is_a_name_or_a_name_and_params() -> None:
    """``Cluster(policies=...)``: an entry that is neither a policy name nor a pair
    (name, params) is a TypeError at construction saying what it must be."""
    with anyio.fail_after(BOUND):
        for bad in (5, None, ("default",), ("default", 5), ("default", {}, 3), (3, {})):
            with pytest.raises(TypeError, match=r"policies\['retry'\] is .* a policy name or"):
                Cluster(workers=1, policies={"retry": bad})  # type: ignore[dict-item]
        with pytest.raises(TypeError, match=r"policies must be a dict of kind to policy"):
            Cluster(workers=1, policies=["retry"])  # type: ignore[arg-type]
        async with Cluster(
            workers=1, policies={"retry": ("default", {"max_lost": 2}), "priority": "long-first"}
        ) as cluster:
            policies = (await cluster.status())["policies"]
            assert (policies["retry"], policies["priority"]) == ("default", "long-first")
            await still_works(cluster)


async def test_negative_or_endless_amounts_and_a_nan_priority_are_refused() -> None:
    """resources={'memory': -1} was taken (a task asking for less than nothing), and so
    were an infinite amount and a NaN priority, which orders nothing."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            for resources in ({"memory": -1}, {"cores": float("inf")}, {"disk": float("nan")}):
                with pytest.raises(GraphError, match=r"each amount must be a finite number >= 0"):
                    cluster.submit(inc, 1, resources=resources)
                with pytest.raises(GraphError, match=r"each amount must be a finite number >= 0"):
                    await cluster.compute({"a": (inc, 1)}, "a", resources=resources)
            with pytest.raises(GraphError, match=r"priority=nan; it must be a number"):
                cluster.submit(inc, 1, priority=float("nan"))
            await still_works(cluster)


async def test_a_resource_no_worker_announces_is_refused_with_the_way_to_a_pool() -> None:
    """resources={'gpu': 1} (as dask's workers take it) was taken and ignored: the
    "GPU" task ran on a CPU worker. Workers announce memory, cores and disk only; the
    error says so and how to reach workers of a kind (a pool)."""
    with anyio.fail_after(BOUND):
        async with Cluster(workers=1) as cluster:
            for resources in ({"gpu": 1}, {"GPU": 1, "memory": 1e6}):
                with pytest.raises(GraphError, match=r"which no worker announces: .*pool='gpu'"):
                    cluster.submit(inc, 1, resources=resources)
                with pytest.raises(GraphError, match=r"a worker has only memory, cores, disk"):
                    await cluster.compute({"a": (inc, 1)}, "a", resources=resources)
            assert await cluster.submit(inc, 1, resources={"memory": 1e6, "cores": 1})
            await still_works(cluster)


def test_saturation_must_be_a_positive_number() -> None:
    for bad in (0, -1, float("inf"), "2", True):
        with pytest.raises(ValueError, match=r"saturation must be a number > 0"):
            Cluster(workers=1, saturation=bad)  # type: ignore[arg-type]


def test_manager_alerts_must_be_positive_seconds_or_none() -> None:
    for bad in (0, -1.0, float("inf"), float("nan"), "10", True):
        with pytest.raises(ValueError, match=r"manager_alerts must be a number of seconds > 0"):
            Cluster("ws://127.0.0.1:1", manager_alerts=bad)  # type: ignore[arg-type]
    Cluster("ws://127.0.0.1:1", manager_alerts=None)  # it does not look


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"policies": {"priority": "long-first"}}, "policies= is for an embedded cluster"),
        ({"policies": {"priority": "nope"}}, "set_policy(kind, name, **params)"),
        ({"pools": {"cpu": {}}}, "pools= is for an embedded cluster; with an address, a "
         "manager process has its own pools: give it --config FILE"),
        ({"saturation": 4.0}, "saturation= is for an embedded cluster"),
        ({"stall_timeout": 60.0, "saturation": 1.0}, "saturation= and stall_timeout= are"),
        ({"prune_depth": 2}, "manager --prune-depth N"),
        ({"unknown_long": False}, "unknown_long= is for an embedded cluster; with an "
         "address, a manager process has its own: python -m runtime manager --long-task "
         "SECONDS, --no-unknown-long"),
        ({"long_task": 5.0}, "long_task= is for an embedded cluster"),
        ({"monitoring_interval": 5.0}, "--monitoring-interval SECONDS"),
        ({"alertmanager": "http://127.0.0.1:9093"}, "alertmanager= is for an embedded"),
        ({"workers": 3}, "workers= is for an embedded cluster; with an address, a manager "
         "process's workers are started on their own: python -m runtime worker ADDRESS"),
        ({"processes": 2, "threads_per_worker": 2}, "processes= and threads_per_worker= are"),
        ({"memory_per_worker": "1GiB"}, "memory_per_worker= is for an embedded cluster"),
        ({"disk_per_worker": "off"}, "disk_per_worker= is for an embedded cluster"),
        ({"memory_options": {"spill": None}}, "memory_options= is for an embedded cluster"),
    ],
)  # fmt: skip
def test_a_client_is_refused_what_the_manager_holds_for_all_clients(
    options: dict[str, Any], says: str
) -> None:
    """With an address, an option that sets what a manager process holds for all its
    clients (its policies, pools, scheduler settings, monitoring, alerting) raises
    ValueError saying where the manager takes it from, when the Cluster is made; it
    was ignored without a word (a user's policies={"priority": "nope"} too). So do the
    worker options (workers=3 was ignored too: a client starts no worker)."""
    with pytest.raises(ValueError, match=re.escape(says)):
        Cluster("ws://127.0.0.1:1", **options)
    # The defaults given again set nothing: no error.
    Cluster(
        "ws://127.0.0.1:1", workers=None, threads_per_worker=1, memory_options={}, saturation=2.0
    )


@pytest.mark.parametrize("bad", [-5, "-5MB", -1.5])
def test_a_negative_memory_per_worker_is_refused_at_construction(bad: Any) -> None:
    """``Cluster(workers=1, memory_per_worker=-5)`` was taken: every worker then failed
    to start (the memory limit must be positive), the pool was suspended and a submit
    never completed. It is a MemoryConfigError when the Cluster is made, as a negative
    ``disk_per_worker`` is a ValueError."""
    from runtime.errors import MemoryConfigError

    with pytest.raises(MemoryConfigError, match=r"memory_per_worker must be >= 0 .*machine's"):
        Cluster(workers=1, memory_per_worker=bad)
    with pytest.raises(MemoryConfigError, match=r"memory_per_worker must be >= 0"):
        Cluster(processes=1, memory_per_worker=bad)
    assert Cluster(workers=1, memory_per_worker=0).memory_per_worker == 0  # the machine's


def test_a_spill_fence_above_the_throttle_fence_is_refused_at_construction() -> None:
    """``Cluster(memory_options={"spill": 0.9, "throttle": 0.7})`` was taken: a worker
    then throttled before it spilled, and a persist larger than the fences stalled with
    MemoryStalled advising to "allow spilling", which was on. Refused now, saying
    what to change."""
    from runtime.errors import MemoryConfigError

    options = {"spill": 0.9, "throttle": 0.7}
    with pytest.raises(MemoryConfigError, match=r"spill \(0\.9\) is above throttle \(0\.7\)"):
        Cluster(workers=1, memory_options=options)
    with pytest.raises(MemoryConfigError, match=r"Lower spill to at most 0\.7"):
        Cluster(processes=1, memory_options=options)
    Cluster(workers=1, memory_options={"spill": 0.7, "throttle": 0.7})  # equal: fine


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"workers": 1.5}, r"workers must be a whole number >= 0, got 1.5"),
        ({"workers": "2"}, r"workers must be a whole number >= 0, got '2'"),
        ({"threads_per_worker": 2.5}, r"threads_per_worker must be a whole number >= 1"),
        ({"processes": 1.5}, r"processes must be a whole number >= 0"),
        ({"processes": True}, r"processes must .*True only with pools=.*processes=N.*got True"),
        ({"processes": False}, r"processes must .*True only with pools=.*got False"),
        ({"gc_threshold": 0}, r"gc_threshold must be a whole number >= 1 or None, got 0"),
        ({"gc_threshold": -3}, r"gc_threshold must be a whole number >= 1 or None"),
    ],
)
def test_counts_that_are_not_whole_numbers_are_refused_at_construction(
    kwargs: dict[str, Any], says: str
) -> None:
    """A count given as a fraction or a string (``workers=1.5``), or a gc_threshold
    that is no threshold (0, negative: silently nothing), is a ValueError saying what it
    must be, when the Cluster is made, not a failure once it starts."""
    with pytest.raises(ValueError, match=says):
        Cluster(**kwargs)


def test_a_plain_with_says_to_use_async_with_or_get() -> None:
    """``with Cluster(...)`` in synchronous code gave Python's bare "does not support
    the context manager protocol"; the TypeError now says to use ``async with`` inside
    async code, or ``runtime.get`` from synchronous code, and nothing is started."""
    cluster = Cluster(workers=1)
    says = r"use `async with Cluster\(\.\.\.\) as cluster:`"
    with pytest.raises(TypeError, match=says) as info, cluster:
        pass
    assert "scheduler=runtime.get" in str(info.value) and "docs/api.md" in str(info.value)
    assert cluster._system is None  # nothing started


@pytest.mark.parametrize(
    ("size", "says"),
    [
        (512, r"memory_per_worker=512 is 512 bytes; did you mean 512MiB\?"),
        (1.5, r"memory_per_worker=1\.5 is 1 byte; did you mean 1\.5GiB\?"),
        ("300KB", r"memory_per_worker='300KB' is 300,000 bytes; did you mean 300MiB\?"),
    ],
)
def test_a_memory_limit_below_a_worker_alone_is_refused_naming_the_unit(
    size: object, says: str
) -> None:
    """``memory_per_worker=1.5`` (GiB meant) was 1 byte: every producer then failed with
    ``MemoryStalled``, whose message never named the limit. A limit under 64 MiB (less
    than a worker process alone) is refused when the Cluster is made; 64 MiB and 0 (the
    machine's memory) are taken."""
    from runtime.errors import MemoryConfigError

    for kwargs in ({"workers": 1}, {"processes": 2}):
        with pytest.raises(MemoryConfigError, match=says) as info:
            Cluster(**kwargs, memory_per_worker=size)  # type: ignore[arg-type]
        assert "at least 64 MiB" in str(info.value)
    assert Cluster(workers=1, memory_per_worker="64MiB").memory_per_worker == 64 * 2**20


@pytest.mark.parametrize(
    ("size", "says"),
    [
        (float("inf"), "is not a size: give a finite number of bytes"),
        (float("nan"), "is not a size: give a finite number of bytes"),
        (0.5, "is less than one byte"),
        ("0.4B", "is less than one byte"),
        ("4 parsecs", "cannot read '4 parsecs' as a size"),
    ],
)
def test_a_size_that_is_not_one_is_refused_not_read_as_zero_or_a_raw_error(
    size: Any, says: str
) -> None:
    """Sizes (memory_per_worker, disk_per_worker, --memory, --disk): below one byte was
    read as 0, which means "the machine's" where 0 is allowed, and inf or nan raised a
    bare OverflowError or ValueError from int()."""
    from runtime.client import parse_bytes

    with pytest.raises(ValueError, match=says):
        parse_bytes(size)
    assert [parse_bytes(v) for v in (0, 1, "1B", "1.5KiB", "1e9", 2.9, None)] == [
        0, 1, 1, 1536, 1_000_000_000, 2, 0,
    ]  # fmt: skip
