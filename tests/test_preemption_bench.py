"""``benchmarks/preemption.py`` at its ``--quick`` size: what must hold whatever the
figures are.

Both systems (the Parsl-style baseline and Corral's defaults) run on the real scheduler
and autoscaler cores with a virtual clock. Every task must end done or failed; the lost
work of both must come from the same sampled worker lives; Corral's defaults never
fail a good task for an error or a spent retry budget, and fail a bad one at its first
error. The figures themselves are for ``benchmarks/README.md``, not asserted here.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import load_bench

ROOT = Path(__file__).resolve().parents[1]


bench = load_bench("preemption")
SEED = 3


@pytest.fixture(scope="module")
def runs() -> dict[str, Any]:
    t0 = time.perf_counter()
    out = {s: bench.simulate(s, bench.QUICK, SEED) for s in bench.SYSTEMS}
    assert time.perf_counter() - t0 < 30, "the --quick size must stay quick"
    return out


def test_every_task_ends_done_or_failed(runs: dict[str, Any]) -> None:
    assert set(runs) == {"parsl-style", "corral", "corral-drain"}
    keys = set(bench.make_workload(bench.QUICK, SEED).seconds)
    assert len(keys) == bench.QUICK.n_tasks
    for res in runs.values():
        assert res.unfinished == 0, res.system
        assert not res.done & res.failed, res.system
        assert res.done | res.failed == keys, res.system
        assert not res.done & res.bad, (res.system, "a bad task finished ok")
        assert res.gave_up == 0, (res.system, "the autoscaler stopped replacing blocks")


def test_lost_work_comes_from_the_same_sampled_lives(runs: dict[str, Any]) -> None:
    base, corral = runs["parsl-style"], runs["corral"]
    lives = bench.Lives(bench.QUICK, SEED)
    for res in (base, corral):
        blocks = {f"ckpt-{n}": (joined, life) for n, joined, life in res.blocks}
        for n, _joined, life in res.blocks:
            assert life == lives[n][1], (res.system, n)
        for wid, _key, start, stop in res.cut:
            joined, life = blocks[wid]
            assert stop == pytest.approx(joined + life), (res.system, wid)  # cut at its death
            assert joined <= start <= stop, (res.system, wid)
        assert res.lost_core_hours == pytest.approx(
            sum(stop - start for *_, start, stop in res.cut) / bench.HOUR
        )
        assert sum(res.lost_by_kind().values()) == pytest.approx(res.lost_core_hours)
    # The blocks are the same in both: the n-th joined at the same time, lived as long.
    common = min(len(base.blocks), len(corral.blocks))
    assert common >= bench.QUICK.ckpt_workers
    assert sorted(base.blocks)[:common] == sorted(corral.blocks)[:common]
    # Both ran on the same task durations and the same bad tasks.
    assert base.bad == corral.bad == bench.make_workload(bench.QUICK, SEED).bad


def test_corral_fails_bad_tasks_fast_and_good_ones_only_past_max_lost(
    runs: dict[str, Any],
) -> None:
    corral = runs["corral"]
    assert corral.bad <= corral.failed
    for key in corral.bad:
        assert corral.errors[key] == "BadInput", key
        cut = sum(1 for _, k, _, _ in corral.cut if k == key)
        assert corral.tries[key] == cut + 1, (key, "one error is enough")
    # A good task never fails for an error or a spent budget under Corral's defaults;
    # the only way is losing more than max_lost tries to preemption (the figures say
    # how often that happens on this pool).
    max_lost = bench.corral_retry().max_lost
    cuts = Counter(k for _, k, _, _ in corral.cut)
    for key in corral.failed - corral.bad:
        assert corral.errors[key] == "WorkerLost", key
        assert cuts[key] == corral.tries[key] == max_lost + 1, key
    # Without the cap on free retries, no good task fails at all.
    uncapped = bench.simulate(
        "corral", bench.dataclasses.replace(bench.QUICK, max_lost=10_000), SEED
    )
    assert uncapped.failed == uncapped.bad


def test_the_baseline_spends_retries_on_preemptions_and_bad_tasks(runs: dict[str, Any]) -> None:
    base = runs["parsl-style"]
    budget = bench.QUICK.retries + 1
    for key in base.bad:
        assert base.tries[key] == budget, key  # retried until the budget is spent
    cuts = Counter(k for _, k, _, _ in base.cut)
    for key in base.failed - base.bad:
        assert cuts[key] == base.tries[key] == budget, key
    assert not base.on_owner  # no fallback pool


def test_the_command_line_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--quick", "--json", "--seed", str(SEED)]) == 0
    out = json.loads(capsys.readouterr().out)
    (run,) = out["runs"]
    assert run["seed"] == SEED
    assert set(run["targets"]["corral"]) == {
        "lost_at_least_30pct_less", "no_good_task_failed", "bad_failed_within_2_tries"
    }  # fmt: skip
    assert run["corral"]["unfinished"] == run["parsl-style"]["unfinished"] == 0
