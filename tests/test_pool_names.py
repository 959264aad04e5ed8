"""No pool is named ``""`` or ``"*"``: refused at every entry, each with its own error.

``"*"`` (``runtime.messages.ANY_POOL``) is the key the tasks of any pool (submitted
without ``pool=``) are counted under. Before, a pool literally named ``"*"`` passed
``submit(pool="*")``, a worker's ``--pool '*'``, ``Cluster(pool="*")``, ``scale``, a
retry policy's move and an alert's scale-out, and collided with that key: its tasks were
counted as any pool's, and the autoscaler counted them toward every pool's demand. A pool
``""`` came from a retry policy's ``RetryDecision(pool="")`` on a manager without
configured pools and from ``run_worker(pool="")``: the scheduler counted its tasks under
``"*"`` while their queue and placement used ``""``. In-process cores and actors, and one
manager's gateway on 127.0.0.1 (ports 53500 to 53999 only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from actors.alerts_state import parse_rule
from actors.autoscaler_state import check_blocks
from actors.pools import load_config, pools_from_dicts
from actors.scheduler_events import KeyErred
from policies import REGISTRY
from runtime import Cluster
from runtime.__main__ import main
from runtime.errors import (
    AlertConfigError,
    GraphError,
    PolicyParamsError,
    PoolConfigError,
    PoolNameError,
)
from runtime.graph import TaskOptions, build_specs
from runtime.messages import ResumeRequest, WorkerInfo
from runtime.metrics import SAMPLE_LABELS
from runtime.node import Hello, Tokens, run_worker
from tests.helpers import Factory, assigned, finish, join, make_state, of, submit
from tests.test_hostile_auth import _refused, in_process_gateway, raw
from tests.test_policy_guards import ToPool

__all__ = ["make_state"]

LIMIT = 10.0
PORTS = (53500, 53999)

#: what every refusal of "*" says of it (runtime.messages.pool_name_problem)
STAR = (
    "'*' is not a pool's name: it is the key of any pool, under which the tasks "
    "submitted without pool= are counted"
)
EMPTY = "a pool's name is not empty nor blank"


def _inc(x: int) -> int:
    return x + 1


# ----------------------------------------------------------------------------- submit


def test_submit_refuses_the_any_pool_key_and_an_empty_pool() -> None:
    with pytest.raises(GraphError) as info:
        TaskOptions.of("the-key", pool="*")
    assert str(info.value) == (
        f"task 'the-key' has pool='*'; it must be a pool's name, or None (pool left out) "
        f"for any worker: {STAR}"
    )
    with pytest.raises(GraphError) as info:
        TaskOptions.of("the-key", pool="")
    assert str(info.value) == (
        "task 'the-key' has pool=''; it must be a pool's name, or None (pool left out) "
        f"for any worker: {EMPTY}"
    )
    assert TaskOptions.of("the-key", pool="gpu").pool == "gpu"


@pytest.mark.parametrize("how", ["option", "annotation"])
def test_a_graph_refuses_the_any_pool_key(how: str) -> None:
    graph = {"a": (_inc, 1)}
    with pytest.raises(GraphError) as info:
        if how == "option":
            build_specs(graph, ["a"], pool="*")
        else:
            import dask
            from dask.highlevelgraph import HighLevelGraph

            with dask.annotate(pool="*"):
                layer = HighLevelGraph.from_collections("a", graph)
            build_specs(layer, ["a"])
    subject = "the submission" if how == "option" else "task 'a'"
    assert str(info.value) == (
        f"{subject} has pool='*'; it must be a pool's name, or None (pool left out) for "
        f"any worker: {STAR}"
    )


# ----------------------------------------------------------------------------- config


def test_a_pools_table_named_like_the_any_pool_key_is_refused_saying_why(tmp_path: Path) -> None:
    path = tmp_path / "corral.toml"
    path.write_text('[pools."*"]\nmax_blocks = 1\n')
    with pytest.raises(PoolConfigError) as info:
        load_config(path)
    assert str(info.value) == (
        f"pool '*' in {path}: the pool's name (its table's, [pools.NAME]) must be letters, "
        f"digits, '_', '.' and '-', starting with a letter or digit, got '*' ({STAR}): "
        "rename the table, e.g. [pools.cpu]. See docs/configuration.md#pools for every key."
    )
    with pytest.raises(PoolConfigError) as info:
        pools_from_dicts({"": {}})
    assert str(info.value) == (
        "the pool configuration: the pool's name (its table's, [pools.NAME]) must be "
        "letters, digits, '_', '.' and '-', starting with a letter or digit, got '' "
        f"({EMPTY}): rename the table, e.g. [pools.cpu]. See docs/configuration.md#pools "
        "for every key."
    )


# ----------------------------------------------------------------------------- workers


@pytest.mark.parametrize(("pool", "problem"), [("*", STAR), ("", EMPTY)])
def test_a_worker_command_refuses_the_any_pool_key_and_an_empty_pool(
    capsys: Any, monkeypatch: Any, pool: str, problem: str
) -> None:
    joined: list[Any] = []
    monkeypatch.setattr("runtime.__main__._run_worker", lambda *a: joined.append(a))
    monkeypatch.delenv("CORRAL_DEADLINE", raising=False)
    argv = ["worker", "ws://127.0.0.1:53500", "--memory", "1GiB", "--pool", pool]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        f"error: PoolNameError: --pool must name a pool, got {pool!r}: {problem}. Name the "
        "pool its workers serve (--pool gpu), or leave it out for the pool 'default'\n"
    )
    assert joined == []


@pytest.mark.anyio
@pytest.mark.parametrize(("pool", "problem"), [("*", STAR), ("", EMPTY)])
async def test_run_worker_refuses_the_any_pool_key_before_it_connects(
    pool: str, problem: str
) -> None:
    with anyio.fail_after(LIMIT), pytest.raises(PoolNameError) as info:
        await run_worker(
            "ws://127.0.0.1:53500", pool=pool, token="t" * 64, port=53501, reconnect=0.1
        )
    assert str(info.value) == (
        f"run_worker(pool=...) must name a pool, got {pool!r}: {problem}. Name the pool "
        "its workers serve (pool='gpu'), or leave it out for the pool 'default'"
    )
    assert isinstance(info.value, ValueError) and info.value.name == pool


@pytest.mark.parametrize(("pool", "problem"), [("*", STAR), ("", EMPTY)])
def test_an_embedded_cluster_refuses_the_any_pool_key_as_its_pool(pool: str, problem: str) -> None:
    with pytest.raises(PoolNameError) as info:
        Cluster(workers=0, pool=pool)
    assert str(info.value) == (
        f"Cluster(pool=...) must name a pool, got {pool!r}: {problem}. Name the pool its "
        "workers serve (pool='gpu'), or leave it out for the pool 'default'"
    )


@pytest.mark.anyio
@pytest.mark.parametrize(("pool", "problem"), [("*", STAR), ("", EMPTY)])
async def test_the_manager_refuses_a_worker_hello_of_the_any_pool_key(
    pool: str, problem: str
) -> None:
    """A worker that skipped run_worker's check (another program, an older Corral) is
    refused at the door, told why, and never registered."""
    tokens = Tokens.generate()
    info = WorkerInfo("star-1", 1, 0, pool=pool)
    with anyio.fail_after(LIMIT):
        async with (
            in_process_gateway(tokens, PORTS) as (gateway, address),
            raw(address, tokens.worker, Hello("worker", "star-1", info)) as conn,
        ):
            refused = await _refused(conn)
            assert "star-1" not in gateway.infos
    assert refused.kind == "PoolNameError"
    assert refused.text == (
        f"a worker's pool must name a pool, got {pool!r}: {problem}. Name the pool its "
        "workers serve (--pool gpu), or leave it out for the pool 'default'"
    )


# ----------------------------------------------------------------------------- retry


@pytest.mark.parametrize(("pool", "problem"), [("*", STAR), ("", EMPTY)])
@pytest.mark.parametrize("configured", [(), ("cpu", "gpu")])
def test_a_retry_moving_a_task_to_the_any_pool_key_is_a_policy_error_and_it_stays(
    make_state: Factory, pool: str, problem: str, configured: tuple[str, ...]
) -> None:
    """Policies propose, the core decides: the move is refused (a policy error told
    once), the retry stays in the task's own pool, counted there."""
    s = make_state(retry=ToPool(pool), pools=configured)
    join(s, "w1", pool="cpu")
    submit(s, {"a": []}, ["a"], retries=1, pool="cpu")
    cmds = finish(s, "w1", "a", "error", error=ValueError())
    assert assigned(cmds) == {"w1": ["a"]} and not of(cmds, KeyErred)  # retried in cpu
    assert s.tasks["a"].spec.pool == "cpu" and s.policy_errors == 1
    assert s.pool_tasks == {"cpu": 1}
    (line,) = [e[2] for e in s.story("a") if e[1] == "policy-error"]
    assert line == (
        f"retry moved the task to pool {pool!r}, a name no pool may have ({problem}): it "
        "stays in pool cpu; a retry policy keeps a task in its pool with "
        "RetryDecision(pool=None)"
    )


@pytest.mark.parametrize(("to", "problem"), [("*", STAR), ("", EMPTY)])
def test_the_default_retry_policy_refuses_a_fallback_to_the_any_pool_key(
    to: str, problem: str
) -> None:
    with pytest.raises(PolicyParamsError) as info:
        REGISTRY.create("retry", "default", {"fallback": {"spot": to}})
    assert str(info.value) == (
        f"bad parameters for retry policy 'default': fallback maps pool names to pool "
        f"names, got 'spot': {to!r} ({problem}): map each pool to the pool its long tasks "
        "move to, e.g. fallback={'spot': 'owned'}. See docs/policies.md for the parameters "
        "each policy takes."
    )


# ----------------------------------------------------------------------------- scale


SCALE_TODO = (
    "Name one pool (scale(n, pool='gpu'), the console's `scale gpu N`); the tasks "
    "submitted without pool= run in any pool"
)


@pytest.mark.parametrize(("pool", "problem"), [("*", STAR), ("", EMPTY)])
def test_scale_refuses_the_any_pool_key(pool: str, problem: str) -> None:
    with pytest.raises(PoolNameError) as info:
        check_blocks(pool, 1)
    assert str(info.value) == f"scale must name a pool, got {pool!r}: {problem}. {SCALE_TODO}"


@pytest.mark.anyio
async def test_a_cluster_without_pools_makes_no_pool_of_the_any_pool_key() -> None:
    """Before, scale(1, pool='*') made a pool '*' and started a worker in it; '' scaled
    the cluster's own pool."""
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=0) as cluster:
            for pool, problem in (("*", STAR), ("", EMPTY)):
                with pytest.raises(PoolNameError) as info:
                    await cluster.scale(1, pool=pool)
                assert str(info.value) == (
                    f"scale must name a pool, got {pool!r}: {problem}. {SCALE_TODO}"
                )
            with pytest.raises(PoolNameError) as resumed:
                await cluster._manager.ask(ResumeRequest("*"))
            assert str(resumed.value) == (
                f"resume must name a pool, got '*': {STAR}. Name one pool (the console's "
                "`resume gpu`, a pool status lists); the tasks submitted without pool= run "
                "in any pool"
            )
            assert (await cluster.scale(0)) == {"default": 0}


# ----------------------------------------------------------------------------- alerts


@pytest.mark.parametrize(("pool", "problem"), [("*", STAR), ("", EMPTY)])
def test_an_alert_scale_out_of_the_any_pool_key_is_refused(pool: str, problem: str) -> None:
    rule = {
        "name": "r",
        "expr": "corral_queue_depth > 0",
        "action": {"scale_out": {"by": 1, "pool": pool}},
    }
    with pytest.raises(AlertConfigError) as info:
        parse_rule(rule, SAMPLE_LABELS)
    assert (
        f"key 'action.scale_out.pool' must be a pool's name, got {pool!r} ({problem}): name "
        "the pool to scale out, or leave it out for the pool the alert's pool label names"
    ) in str(info.value)
