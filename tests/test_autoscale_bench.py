"""``benchmarks/autoscale.py`` at its ``--quick`` size: what must hold whatever the
figures are.

The three systems (Corral's autoscaler core with the ``demand`` strategy, Parsl's
``simple`` strategy, a KEDA-style queue-length scaler) run on the same jobs and the
same provisioning delays with a virtual clock. Every job must finish; Corral never
stops a block that runs a job; the table has one row per system. The figures
themselves are for ``benchmarks/README.md``, not asserted here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import load_bench

ROOT = Path(__file__).resolve().parents[1]


bench = load_bench("autoscale")
SEED = 1


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    out: dict[str, Any] = bench.run_all(bench.QUICK, [SEED], list(bench.SCENARIOS))
    return out


def test_every_job_finishes_and_corral_never_stops_a_busy_block(runs: dict[str, Any]) -> None:
    jobs = len(bench.make_jobs(bench.QUICK, SEED))
    assert jobs > 50
    for scenario, (per_system,) in runs.items():
        assert set(per_system) == {"corral", "parsl", "keda"}
        for system, res in per_system.items():
            assert (res.jobs, res.unfinished) == (jobs, 0), (scenario, system)
            assert res.worker_hours > 0 and res.p95_wait <= res.max_wait, (scenario, system)
        corral = per_system["corral"]
        assert corral.busy_stops == 0 and corral.jobs_cut == 0, scenario
        assert per_system["parsl"].jobs_cut == 0, scenario  # it scales in only when idle
        # The alert rule ran on the real alert core: the bursts make it fire and act.
        assert corral.alerts_fired > 0 and corral.scale_outs > 0, scenario


def test_stuck_blocks_are_replaced_only_where_some_block_is_stuck(runs: dict[str, Any]) -> None:
    assert runs["healthy"][0]["corral"].stuck_replaced == 0
    assert runs["stuck"][0]["corral"].stuck_replaced > 0
    for scenario in runs:
        assert runs[scenario][0]["parsl"].stuck_replaced == 0  # no such thing


def test_every_system_gets_the_same_jobs_and_delays() -> None:
    one, two = bench.make_jobs(bench.QUICK, SEED), bench.make_jobs(bench.QUICK, SEED)
    assert [(j.pool, j.ready, j.duration) for j in one] == [
        (j.pool, j.ready, j.duration) for j in two
    ]
    s = bench.dataclasses.replace(bench.QUICK, stuck_share=0.5)
    a, b = bench.Delays(s, SEED), bench.Delays(s, SEED)
    in_order = [b("gpu", n) for n in range(4)]
    assert [a("gpu", n) for n in (3, 0, 1)] == [in_order[3], in_order[0], in_order[1]]
    low, high = s.provisioning
    for n in range(40):
        delay, stuck = a("cpu", n)
        assert (s.stuck_delay[0] <= delay <= s.stuck_delay[1]) if stuck else low <= delay <= high
    # Run for real: a block of the same id came up after the same delay in each system.
    delays: dict[str, dict[str, float]] = {}
    for system in bench.SYSTEMS:
        cluster = bench.Cluster(s, bench.make_jobs(s, SEED), bench.Delays(s, SEED))
        cluster.run(bench.FACTORIES[system](cluster))
        delays[system] = {blk.bid: blk.up_at - blk.requested for blk in cluster.ended}
    for system in ("parsl", "keda"):
        common = delays["corral"].keys() & delays[system].keys()
        assert len(common) >= 10, system
        assert [delays["corral"][k] for k in sorted(common)] == pytest.approx(
            [delays[system][k] for k in sorted(common)]
        ), system


def test_the_table_has_one_row_per_system(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick", "--scenario", "stuck"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()]
    systems = [r[0] for r in rows if len(r) == len(bench.COLUMNS) + 1 and r[0] in bench.SYSTEMS]
    assert systems == ["corral", "parsl", "keda"]
    assert "corral / best peer" in out and "target" in out
    assert bench.main(["--quick", "--json", "--scenario", "healthy"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["healthy"]
    assert set(run["ratios"]) == {"p95_wait", "max_wait", "worker_hours", "makespan"}
    assert run["corral"]["unfinished"] == run["parsl"]["unfinished"] == 0


def test_the_knob_rows_run_with_their_knobs() -> None:
    """``--systems all``'s extra rows: the forecast and the warm scarce pool (4 blocks
    from the start, kept by each system's own knob) finish every job too."""
    jobs = len(bench.make_jobs(bench.QUICK, SEED))
    for system in bench.KNOBS:
        cluster = bench.Cluster(bench.QUICK, bench.make_jobs(bench.QUICK, SEED),
                                bench.Delays(bench.QUICK, SEED))  # fmt: skip
        cluster.run(bench.FACTORIES[system](cluster))
        assert cluster.unfinished == 0, system
        if system.startswith("corral"):
            assert cluster.busy_stops == 0, system
        at_start = [b for b in cluster.ended if b.pool == "gpu" and b.requested == 0.0]
        assert len(at_start) == (4 if system.endswith("-warm") else 0), system
    assert jobs > 50
