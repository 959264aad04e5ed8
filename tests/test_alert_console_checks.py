"""The console's ``alert`` commands on the rules refused when made: ``alert list``'s rules
table shows ``keep_firing_for`` and the annotations' names; ``alert add --for -5s``
reaches the rule's own check (not argparse's "expected one argument"); against a real
manager (``--config`` with a pool), an expression too deep, a scale-out of a pool the
cluster does not have, ``rate()`` and an annotation naming a label no alert carries are
each an ``AlertConfigError`` naming the rule and saying what to do."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from rich.console import Console

from actors.alerts_state import AlertState, Evaluate, parse_rule
from runtime.console import (
    ConsoleClient,
    ConsoleError,
    _alert_rule,
    alert_line,
    jsonable,
    render_alerts,
)
from runtime.errors import AlertConfigError
from runtime.messages import AlertInfo, AlertsReply
from runtime.metrics import SAMPLE_LABELS
from tests.helpers import Cli

LIMIT = 60

CONFIG = """
[pools.ci]
provider = "local"
init_blocks = 0
max_blocks = 1

[alerting]
interval = 0.2

[[alerts]]
name = "Held"
expr = "corral_queue_depth > 5"
keep_firing_for = "20s"
annotations = {summary = "pool {{ $labels.pool }} waits", description = "long"}
"""


def _text(view: object) -> str:
    console = Console(width=200, color_system=None, record=True)
    console.print(view)
    return console.export_text()


@pytest.mark.timeout(30)
def test_the_rules_table_shows_keep_firing_for_and_the_annotations() -> None:
    rules = [
        {"name": "Held", "expr": "corral_queue_depth > 5", "for": 0.0, "keep_firing_for": 20.0,
         "labels": {}, "annotations": {"summary": "s", "description": "d"}},
        {"name": "Bare", "expr": "corral_workers_connected == 0", "for": 60.0,
         "keep_firing_for": 0.0, "labels": {}, "annotations": {}},
    ]  # fmt: skip
    text = _text(render_alerts({"alerts": [], "rules": rules, "audit": []}))
    header = next(line for line in text.splitlines() if "rule" in line and "expr" in line)
    assert "keep firing" in header and "annotations" in header
    held = next(line for line in text.splitlines() if "Held" in line)
    assert "20 s" in held and "summary" in held
    bare = next(line for line in text.splitlines() if "Bare" in line)
    assert "60 s" in bare and "0 s" in bare.split("60 s", 1)[1] and "-" in bare


@pytest.mark.timeout(30)
@pytest.mark.parametrize("flag", ["--for", "--keep-firing-for", "--cooldown"])
def test_a_negative_duration_reaches_the_rules_check(flag: str) -> None:
    line = f"Bad5 'corral_queue_depth > 0' {flag} -5s"
    if flag == "--cooldown":
        line += " --scale-out 1"
    rule = _alert_rule(line)  # argparse would say "expected one argument"
    with pytest.raises(AlertConfigError, match=r">= 0 or a duration like '5m', got '-5s'"):
        parse_rule(rule, SAMPLE_LABELS)
    with pytest.raises(AlertConfigError, match=r"must be a number of seconds >= 0"):
        parse_rule(_alert_rule(line.replace("-5s", "-5")), SAMPLE_LABELS)
    # an option given where its value should be is still argparse's error
    with pytest.raises(ConsoleError, match="expected one argument"):
        _alert_rule(f"Bad5 'corral_queue_depth > 0' {flag} --label a=b")


@pytest.mark.timeout(30)
def test_a_resolved_alert_s_value_is_shown_as_the_last_while_its_rule_held() -> None:
    """A user audit: ``RESOLVED QueueSlow pool=ci ... value=38.8245
    queue_time_threshold=0.1 threshold_breached=0`` for a rule ``> 5`` s. A resolved
    alert keeps the last value while its rule held (as Prometheus does, and as it goes
    to Alertmanager); the console says so: ``value_while_held=`` in a line, ``(while
    held)`` in the table. A firing alert's value is its value."""
    rule = parse_rule(
        {"name": "QueueSlow", "expr": 'corral_queue_oldest_wait_seconds{pool="ci"} > 5'},
        SAMPLE_LABELS,
    )
    st = AlertState([rule])
    wait = ("corral_queue_oldest_wait_seconds", (("pool", "ci"),))
    (fired,) = [c.alert for c in st.handle(Evaluate(10.0, {wait: 38.8245}))]
    (resolved,) = [c.alert for c in st.handle(Evaluate(20.0, {wait: 0.0}))]
    assert (resolved.state, resolved.value) == ("resolved", 38.8245)  # the last while held
    line = alert_line(jsonable(resolved))
    assert "RESOLVED QueueSlow pool=ci value_while_held=38.8245 " in line
    assert "threshold_breached=0" in line
    assert "FIRING   QueueSlow pool=ci value=38.8245 " in alert_line(jsonable(fired))
    table = _text(render_alerts({"alerts": [jsonable(resolved)], "rules": [], "audit": []}))
    row = next(line for line in table.splitlines() if "QueueSlow" in line)
    assert "38.8245" in row and "(while held)" in table


def _watched(looks: list[list[AlertInfo]]) -> ConsoleClient:
    """A console (not connected) whose manager answers ``looks``, one per ask (the last
    again after)."""
    console = ConsoleClient("ws://127.0.0.1:1")
    answers = iter(looks)
    last: list[AlertInfo] = []

    async def alerts() -> AlertsReply:
        nonlocal last
        last = next(answers, last)
        return AlertsReply(tuple(last))

    console.alerts = alerts  # type: ignore[method-assign]
    return console


@pytest.mark.anyio
@pytest.mark.timeout(30)
async def test_alert_watch_counts_only_changes_and_shows_the_start_in_time_order() -> None:
    """A user audit: ``alert watch 1`` printed the two alerts resolved before it began,
    the later one first (01:05:18, then 01:04:09), and said ``2 change(s)`` though
    nothing changed. The states at the start come in the order of their times and are
    not counted; a change seen later is."""
    labels = {"alertname": "CIQueueTime", "pool": "ci"}
    late = AlertInfo("QueueSlow", "resolved", {"alertname": "QueueSlow", "pool": "ci"},
                     active_since=3850.0, fired_at=3880.0, resolved_at=3918.0)  # fmt: skip
    early = AlertInfo("CIQueueTime", "resolved", labels, active_since=3800.0, fired_at=3815.0,
                      resolved_at=3849.0)  # fmt: skip
    lines: list[str] = []
    console = _watched([[late, early]])
    console.emit = lines.append
    with anyio.fail_after(LIMIT):
        result = await console.execute("alert watch 1")
    assert [a["resolved_at"] for a in result.data["start"]] == [3849.0, 3918.0]
    assert result.data["changes"] == []
    assert result.text().strip() == "watched alerts for 1 s: 0 change(s) (2 alert(s) at the start)"
    assert [line.split()[2] for line in lines] == ["CIQueueTime", "QueueSlow"]

    again = AlertInfo("CIQueueTime", "pending", labels, active_since=3930.0)
    console = _watched([[late, early], [late, early, again]])
    with anyio.fail_after(LIMIT):
        result = await console.execute("alert watch 1.5")  # two looks, a second apart
    assert [a["state"] for a in result.data["start"]] == ["resolved", "resolved"]
    assert [(a["name"], a["state"]) for a in result.data["changes"]] == [("CIQueueTime", "pending")]
    assert "1 change(s) (2 alert(s) at the start)" in result.text()


@pytest.mark.slow
@pytest.mark.anyio
async def test_rules_refused_by_the_manager_say_what_to_do(tmp_path: Path) -> None:
    config = tmp_path / "corral.toml"
    config.write_text(CONFIG)
    with Cli(tmp_path / "home") as cli:
        _, address = cli.manager("--config", str(config))
        with anyio.fail_after(LIMIT):
            async with ConsoleClient(address) as console:
                text = await console.run_command("alert list")
                held = next(line for line in text.splitlines() if "Held" in line)
                assert "20 s" in held and "summary" in held

                deep = "(" * 1000 + "corral_queue_depth > 0" + ")" * 1000
                with pytest.raises(
                    ConsoleError,
                    match=r"AlertConfigError: alert rule 'Deep': key 'expr' nests parentheses "
                    r"and sum\(\.\.\.\) more than 100 levels deep",
                ):
                    await console.run_command(f"alert add Deep '{deep}'")
                chain = " or ".join(["corral_queue_depth > 0"] * 1000)
                with pytest.raises(ConsoleError, match="alert rule 'Long': key 'expr' is "):
                    await console.run_command(
                        "alert add " + json.dumps({"name": "Long", "expr": chain})
                    )

                with pytest.raises(
                    ConsoleError,
                    match=r"alert rule 'P': key 'action.scale_out.pool' names no pool: "
                    r"'nosuch'. The pools are: ci",
                ):
                    await console.run_command(
                        "alert add P 'corral_queue_depth > 0' --scale-out fit --pool nosuch "
                        "--max-blocks 4"
                    )
                with pytest.raises(ConsoleError, match=r"did you mean 'ci'\?"):
                    await console.run_command(
                        "alert add P 'corral_queue_depth > 0' --scale-out 1 --pool cii"
                    )

                with pytest.raises(
                    ConsoleError,
                    match=r"alert rule 'L7': key 'action.scale_out.pool' is needed: no alert",
                ):
                    await console.run_command(
                        "alert add L7 'corral_workers_connected > 0' --scale-out 1 --max-blocks 2"
                    )

                with pytest.raises(ConsoleError, match=r"uses rate\(\) at character 0") as info:
                    await console.run_command(
                        "alert add Bad10 'rate(corral_tasks_finished_total[5m]) > 0'"
                    )
                assert "increase(metric[duration])" in str(info.value)
                assert "unknown metric" not in str(info.value)

                with pytest.raises(
                    ConsoleError,
                    match=r"alert rule 'Bad11': key 'annotations.dashboard' names the label "
                    r"'pol', .* did you mean 'pool'\?",
                ):
                    await console.run_command(
                        "alert add Bad11 'corral_queue_depth > 0' "
                        "--annotation 'dashboard={{ $labels.pol }}'"
                    )
                with pytest.raises(
                    ConsoleError, match=r"key 'for' must be a number of seconds >= 0"
                ):
                    await console.run_command("alert add Bad5 'corral_queue_depth > 0' --for -5s")

                rules = {r["name"] for r in (await console.alerts()).rules}
                assert not rules & {"Deep", "Long", "P", "L7", "Bad10", "Bad11", "Bad5"}


@pytest.mark.slow
@pytest.mark.anyio
async def test_a_rule_on_a_pool_not_configured_is_warned_of_at_start_and_when_added(
    tmp_path: Path,
) -> None:
    """A rule on `pool="cii"` (the manager's file configures `ci`) was taken without a
    word, at start and from `alert add`: it can fire only if workers join that pool."""
    config = tmp_path / "corral.toml"
    typo = 'corral_queue_depth{pool="cii"} > 0'
    config.write_text(CONFIG + f"\n[[alerts]]\nname = \"Typo\"\nexpr = '{typo}'\n")
    warning = (
        "no pool 'cii' is configured (pools: ci); did you mean 'ci'? The rule can fire only "
        "if workers join with --pool cii or tasks ask for pool cii"
    )
    with Cli(tmp_path / "home") as cli:
        manager = cli.start(
            "manager", "--listen", "127.0.0.1:0", "--config", str(config), "--log-level", "info"
        )
        assert f"alert rule 'Typo': {warning}" in cli.line_with(manager, "alert rule 'Typo'")
        address = cli.line_with(manager, "manager listening on").split(" on ", 1)[1].strip()
        with anyio.fail_after(LIMIT):
            async with ConsoleClient(address) as console:
                result = await console.execute(f"alert add P2 '{typo}'")
                assert result.text(width=1000).splitlines() == [
                    f"alert rule P2 added: {typo}",
                    f"warning: {warning}",
                ]
                assert result.data["warnings"] == [warning]
                rules = {r["name"] for r in (await console.alerts()).rules}
                assert {"Typo", "P2"} <= rules  # warned of, not refused
                text = await console.run_command(
                    "alert add Ok 'corral_queue_depth{pool=\"ci\"} > 0'"
                )
                assert "warning" not in text
                # An operator's routine changes are logged at info, a rule added with
                # a warning at warning (a user audit: every alert add/remove and resume
                # was a WARNING, paging whoever alerts on them)
                added = cli.line_with(manager, "event='alert rule added'")
                assert "rule='P2'" in added and "level='warning'" in added
                added = cli.line_with(manager, "event='alert rule added'")
                assert "rule='Ok'" in added and "level='info'" in added
                await console.run_command("alert remove Ok")
                removed = cli.line_with(manager, "event='alert rule removed'")
                assert "level='info'" in removed
                await console.run_command("resume ci")
                resumed = cli.line_with(manager, "event='pool resumed by an operator'")
                assert "level='info'" in resumed
