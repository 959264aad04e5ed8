"""What an embedded cluster runs on the host's event loop (docs/embedding.md, "Your event
loop takes the graph in"; embed audit D3, D10, D11):

- a graph of 10,000 tasks reaches the scheduler core in slices of ``INTAKE_PIECE`` (500)
  tasks, one per turn of the loop;
- to a manager in another process, a large graph is pickled in a thread, not in the
  loop's thread;
- a first ``Cluster()`` imports nothing heavy in the loop's thread: what ``Cluster()``
  needs comes with ``runtime.client``, the rest of a start in a thread;
- ``Cluster(processes=N, port=P)``: the workers join on that port; a port in use is
  ``AddressInUse`` saying what to do, and a port without worker processes a ValueError.

Timing is not asserted here (benchmarks/embed_stall.py measures the stalls).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Hashable
from typing import Any

import anyio
import pytest

import runtime.graph
import runtime.remote
from actors.scheduler_events import GraphSubmitted
from actors.scheduler_state import SchedulerState
from runtime import Cluster
from runtime.errors import AddressInUse
from runtime.messages import SubmitGraphRequest
from tests.helpers import ROOT, free_port_between, nodes

LIMIT = 120.0


def inc(x: int) -> int:
    return x + 1


def chains(n: int, length: int = 5) -> tuple[dict[Hashable, Any], list[str]]:
    dsk: dict[Hashable, Any] = {}
    for c in range(n):
        dsk[f"c{c}-0"] = (inc, c)
        for i in range(1, length):
            dsk[f"c{c}-{i}"] = (inc, f"c{c}-{i - 1}")
    return dsk, [f"c{c}-{length - 1}" for c in range(n)]


@pytest.mark.anyio
async def test_a_graph_of_10000_tasks_reaches_the_core_in_slices_of_500(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default slice (no setting changed): 20 ``GraphSubmitted`` of 500 tasks, each
    in a turn of its own; before, 5 of 2,000 (some tens of milliseconds each, more on a
    busy machine)."""
    assert runtime.graph.INTAKE_PIECE == 500
    dsk, ends = chains(2_000)
    pieces: list[int] = []
    handle = SchedulerState.handle

    def counting(self: SchedulerState, *events: Any) -> Any:
        pieces.extend(len(ev.specs) for ev in events if isinstance(ev, GraphSubmitted))
        return handle(self, *events)

    monkeypatch.setattr(SchedulerState, "handle", counting)
    with anyio.fail_after(LIMIT):
        async with Cluster(workers=2) as cluster:
            got = await cluster.compute(dsk, ends)
    assert got == tuple(c + 5 for c in range(2_000))  # the same results
    assert pieces == [500] * 20


@pytest.mark.anyio
async def test_a_large_graph_for_a_manager_process_is_pickled_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``Cluster(address)``: the SubmitGraphRequest of a graph of 2,000 tasks or more is
    pickled in a worker thread (before: in the loop's, by the connection); a small one
    still goes as it is. Results are the same."""
    made: list[tuple[int, bool]] = []  #: (tasks, pickled in the loop's thread)
    to_wire = runtime.remote.to_wire
    loop_thread = threading.get_ident()

    def spying(msg: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(msg, SubmitGraphRequest):
            made.append((len(msg.graph), threading.get_ident() == loop_thread))
        return to_wire(msg, *args, **kwargs)

    monkeypatch.setattr(runtime.remote, "to_wire", spying)
    big, big_ends = chains(600)  # 3,000 tasks
    with anyio.fail_after(LIMIT):
        async with nodes(1) as (address, _), Cluster(address) as c:
            assert await c.compute(big, big_ends) == tuple(x + 5 for x in range(600))
            assert await c.compute({"a": (inc, 1)}, "a") == 2
            futures = c.map(inc, range(2_500), pure=False)  # submit()'s graph, flushed
            assert await c.gather(futures) == [x + 1 for x in range(2_500)]
    assert made == [(3_000, False), (1, True), (2_500, False)]


#: A child process: a first Cluster (workers, then processes) in a running loop; prints
#: the modules imported in the loop's thread while it started, ran a task and stopped.
_IMPORTS_ON_THE_LOOP = """
import sys, threading, anyio
from runtime import Cluster  # as a service's module does, before its loop runs

MAIN = threading.main_thread()
seen = []

class Spy:
    recording = False
    @staticmethod
    def find_spec(name, path=None, target=None):
        if Spy.recording and threading.current_thread() is MAIN and name not in sys.modules:
            seen.append(name)
        return None

sys.meta_path.insert(0, Spy)

async def main():
    Spy.recording = True
    for kw in ({"workers": 1}, {"processes": 1}):
        async with Cluster(**kw) as c:
            assert await c.submit(sum, [1, 2]) == 3
    Spy.recording = False

anyio.run(main)
print(" ".join(seen))
"""


def test_a_first_cluster_imports_nothing_heavy_in_the_loop_thread() -> None:
    """Before, ``Cluster()`` imported runtime.node (and with it aiohttp, prometheus_client
    and the alert monitor) in the caller's loop, and its start runtime.preflight and,
    with processes, transport.ws: 0.3-0.8 s of the loop at a service's first start."""
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS_ON_THE_LOOP],
        cwd=ROOT, capture_output=True, text=True, timeout=LIMIT, check=True,
    )  # fmt: skip
    on_loop = set(done.stdout.split())
    heavy = {
        "aiohttp", "prometheus_client", "runtime.node", "runtime.monitor", "runtime.metrics",
        "runtime.notify", "runtime.preflight", "runtime.monitordb", "transport.ws",
        "actors.processes",
    }  # fmt: skip
    assert not on_loop & heavy, sorted(on_loop)


def test_importing_the_client_leaves_the_preflight_checks_to_the_first_start() -> None:
    """``runtime.preflight`` is one of ``_START_MODULES``: a cluster's first start
    imports it, in a thread. Importing ``runtime.client`` (a client of a manager that
    never starts an embedded cluster, say) does not: the alert monitor imports it only
    where it probes the Alertmanager."""
    script = "import sys, runtime.client; print('runtime.preflight' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT, capture_output=True, text=True, timeout=LIMIT, check=True,
    )  # fmt: skip
    assert done.stdout.split() == ["False"], done.stderr[-2000:]


def _free_port() -> int:
    """A port of 37000-37999 free on 127.0.0.1 just now."""
    return free_port_between(37_000, 37_999)


@pytest.mark.anyio
async def test_processes_join_on_the_port_given_and_a_taken_port_says_so() -> None:
    port = _free_port()
    with anyio.fail_after(LIMIT):
        async with Cluster(processes=1, port=port) as c:
            assert c.gateway_address == f"ws://127.0.0.1:{port}"
            await c.wait_for_workers(1, timeout=LIMIT)
            assert await c.submit(sum, [1, 2]) == 3
            with pytest.raises(AddressInUse) as caught:
                async with Cluster(processes=1, port=port):
                    pass
    notes = " ".join(getattr(caught.value, "__notes__", []))
    assert f"port={port}" in notes and "choose another port" in notes, notes


@pytest.mark.anyio
async def test_pools_with_processes_take_the_port_too() -> None:
    port = _free_port()
    pools = {"cpu": {"provider": "local", "init_blocks": 1, "min_blocks": 1, "max_blocks": 1}}
    with anyio.fail_after(LIMIT):
        async with Cluster(pools=pools, processes=True, port=port) as c:
            assert c.gateway_address == f"ws://127.0.0.1:{port}"
            assert await c.submit(sum, [1, 2]) == 3


@pytest.mark.parametrize(
    ("kw", "says"),
    [
        ({"port": 37001}, "give it with processes=N"),
        ({"workers": 2, "port": 37001}, "give it with processes=N"),
        ({"processes": 1, "port": -1}, "0-65535"),
        ({"processes": 1, "port": 70000}, "0-65535"),
        ({"processes": 1, "port": True}, "0-65535"),
        ({"processes": 1, "port": "37001"}, "0-65535"),
    ],
)
def test_a_bad_port_is_a_value_error_saying_what_to_give(kw: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        Cluster(**kw)


def test_a_port_with_an_address_is_the_manager_s_business() -> None:
    with pytest.raises(ValueError, match="port="):
        Cluster("ws://127.0.0.1:37002", port=37003)
