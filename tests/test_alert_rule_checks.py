"""Alert rules refused when they are made, naming the rule and saying what to do: an
expression too long or too deep (bounded, so nothing recurses without a bound: no raw
RecursionError), a scale-out of a pool the cluster does not have, an annotation naming
a label no alert of the rule carries, a PromQL function the language does not have, a
negative duration. And at fire time: a pool that is gone is said to be no pool of the
cluster's; a dashboard link that renders empty falls back to the manager's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from actors.alerts_state import (
    DEFAULT_RULES,
    MAX_EXPR_CHARS,
    MAX_EXPR_COMPARES,
    MAX_EXPR_NESTING,
    AlertRule,
    AlertState,
    Audit,
    Evaluate,
    compares,
    parse_duration,
    parse_rule,
    parse_rules,
    pool_warnings,
)
from runtime import Cluster
from runtime.errors import AlertConfigError
from runtime.log import get_logger
from runtime.messages import (
    AlertInfo,
    AlertRuleAdd,
    AlertRuleRemove,
    AlertsRequest,
    BlockMetrics,
    MetricsReply,
    PoolMetrics,
)
from runtime.metrics import SAMPLE_LABELS, samples
from runtime.monitor import AlertingConfig, Monitor, alerting_config, load_alerting
from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(60)

TERM = "corral_queue_depth > 0"


def refused(raw: dict[str, Any], **kw: Any) -> AlertConfigError:
    with pytest.raises(AlertConfigError) as info:
        parse_rule(raw, SAMPLE_LABELS, **kw)
    return info.value


# ----------------------------------------------------------------------------- size bounds


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        ("(" * 1000 + TERM + ")" * 1000, f"more than {MAX_EXPR_NESTING} levels deep"),
        ("sum(" * 300 + "corral_queue_depth" + ")" * 300 + " > 0", "levels deep"),
        (" or ".join([TERM] * 1000), f"is {len(' or '.join([TERM] * 1000))} characters long"),
        (" or ".join([TERM] * 300), f"joins more than {MAX_EXPR_COMPARES} comparisons"),
        (" and ".join([TERM] * 3000), f"more than the {MAX_EXPR_CHARS} allowed"),
    ],
    ids=["parens", "sums", "long-or", "many-or", "huge-and"],
)
def test_an_expression_too_long_or_deep_is_refused_with_the_rule_and_the_limit(
    expr: str, problem: str
) -> None:
    err = refused({"name": "Huge", "expr": expr})
    assert (err.rule, err.key) == ("Huge", "expr")
    assert problem in err.problem and "split it into several rules" in err.problem
    assert str(err).startswith("alert rule 'Huge': key 'expr' ")
    with pytest.raises(AlertConfigError, match="alert rule 'Huge'"):
        AlertRule("Huge", expr)  # a rule built directly: the same bounds
    with pytest.raises(AlertConfigError, match="alert rule 'Huge'"):
        alerting_config({}, [{"name": "Huge", "expr": expr}])


def test_a_deep_expression_in_a_config_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "corral.toml"
    expr = "(" * 1000 + TERM + ")" * 1000
    path.write_text(f'[pools.ci]\nprovider = "local"\n\n[[alerts]]\nname = "X"\nexpr = "{expr}"\n')
    with pytest.raises(AlertConfigError) as info:
        load_alerting(path)
    assert info.value.source == str(path) and info.value.rule == "X"
    assert f"more than {MAX_EXPR_NESTING} levels deep" in str(info.value)


def test_expressions_at_the_bounds_parse_and_evaluate() -> None:
    chain = " or ".join(f'corral_queue_depth{{pool="p{i}"}} > 0' for i in range(MAX_EXPR_COMPARES))
    deep = "(" * MAX_EXPR_NESTING + TERM + ")" * MAX_EXPR_NESTING
    sums = "sum(" * (MAX_EXPR_NESTING - 1) + "corral_queue_depth" + ")" * 99 + " > 0"
    for expr in (chain, deep, sums):
        assert len(expr) <= MAX_EXPR_CHARS
        rule = parse_rule({"name": "Big", "expr": expr}, SAMPLE_LABELS)
        st = AlertState([rule])
        reply = MetricsReply(pools={"p7": PoolMetrics(queue_depth=3, oldest_wait=1.0)})
        st.handle(Evaluate(0.0, samples(reply)))
        assert [a.state for a in st.alerts()] == ["firing"]
    assert len(compares(parse_rule({"name": "C", "expr": chain}, SAMPLE_LABELS).parsed)) == 200


# ----------------------------------------------------------------------------- functions


def test_rate_is_refused_as_a_function_the_language_lacks_with_what_to_use() -> None:
    err = refused({"name": "Bad10", "expr": "rate(corral_tasks_finished_total[5m]) > 0"})
    assert err.rule == "Bad10"
    assert "uses rate()" in err.problem and "unknown metric" not in err.problem
    assert "sum(...), sum by (label, ...) (...) and increase(metric[duration])" in err.problem
    assert "increase(x[5m])" in err.problem
    err = refused({"name": "Avg", "expr": "avg by (pool) (corral_queue_depth) > 0"})
    assert "uses avg()" in err.problem and "increase(metric[duration])" in err.problem
    err = refused({"name": "Typo", "expr": "increse(corral_blocks_failed_total[5m]) > 0"})
    assert "did you mean 'increase'?" in err.problem


# ----------------------------------------------------------------------------- pools


def scaling(pool: str) -> dict[str, Any]:
    return {"name": "Grow", "expr": TERM, "action": {"scale_out": {"fit": True, "pool": pool}}}


def test_a_scale_out_of_an_unknown_pool_is_refused_with_the_closest_one() -> None:
    err = refused(scaling("nosuch"), pools=["ci", "gpu"])
    assert (err.rule, err.key) == ("Grow", "action.scale_out.pool")
    assert err.problem == "names no pool: 'nosuch'. The pools are: ci, gpu"
    err = refused(scaling("cii"), pools=["ci", "gpu"])
    assert "names no pool: 'cii'; did you mean 'ci'? The pools are: ci, gpu" in err.problem
    with pytest.raises(AlertConfigError, match="names no pool: 'cii'"):
        parse_rules([scaling("cii")], SAMPLE_LABELS, pools=["ci"])
    assert parse_rule(scaling("ci"), SAMPLE_LABELS, pools=["ci"]).action is not None
    assert parse_rule(scaling("nosuch"), SAMPLE_LABELS).action is not None  # pools unknown


def test_a_config_file_checks_the_scale_out_pool_against_its_pools(tmp_path: Path) -> None:
    path = tmp_path / "corral.toml"
    path.write_text(
        '[pools.ci]\nprovider = "local"\n\n'
        '[[alerts]]\nname = "X"\nexpr = "corral_queue_depth > 0"\n'
        'action = {scale_out = {fit = true, pool = "cii"}}\n'
    )
    with pytest.raises(AlertConfigError) as info:
        load_alerting(path)
    assert info.value.source == str(path)
    assert "names no pool: 'cii'; did you mean 'ci'? The pools are: ci" in str(info.value)
    path.write_text(path.read_text().replace('"cii"', '"ci"'))
    assert load_alerting(path).pools == ("ci",)
    # a file without pools: their names are not known there, nothing is checked
    path.write_text(path.read_text().split("\n\n", 1)[1])
    assert load_alerting(path).pools is None


def _monitor(config: AlertingConfig, *notifiers: Any) -> Monitor:
    """A monitor driven by hand (no actor system): its handlers called directly."""
    monitor = Monitor(_no_metrics, lambda: None, config, notifiers=list(notifiers))
    monitor._log = get_logger("corral", actor="monitor")
    return monitor


def test_a_live_rule_is_checked_against_the_pools_of_the_config_or_of_the_samples() -> None:
    monitor = _monitor(AlertingConfig(pools=("ci",)))
    with pytest.raises(AlertConfigError, match=r"names no pool: 'nosuch'\. The pools are: ci"):
        monitor.add_rule(AlertRuleAdd(scaling("nosuch")))
    # without a config's pools: those the autoscaler reported, once it did
    monitor = _monitor(AlertingConfig())
    assert monitor.add_rule(AlertRuleAdd(scaling("nosuch")))["name"] == "Grow"
    reply = MetricsReply(blocks={"ci": BlockMetrics(target=1)})
    monitor._run(Evaluate(0.0, samples(reply)))
    with pytest.raises(AlertConfigError, match="names no pool: 'cii'; did you mean 'ci'"):
        monitor.add_rule(AlertRuleAdd({**scaling("cii"), "name": "Grow2"}))


async def _no_metrics() -> MetricsReply:
    return MetricsReply()


def test_a_scale_out_of_a_pool_that_is_gone_says_it_is_no_pool_of_the_cluster() -> None:
    rule = parse_rule(
        {**scaling("cpu"), "action": {"scale_out": {"by": 1, "pool": "cpu", "max_blocks": 4}}},
        SAMPLE_LABELS,
    )
    st = AlertState([rule])
    reply = MetricsReply(
        pools={"cpu": PoolMetrics(queue_depth=2)}, blocks={"ci": BlockMetrics(target=1)}
    )
    (line,) = [c.line for c in st.handle(Evaluate(0.0, samples(reply))) if isinstance(c, Audit)]
    assert "no scale-out of pool cpu: it is not one of the cluster's pools (ci)" in line
    assert "no autoscaler answer" not in line
    assert st.pools() == ["ci"]


# ----------------------------------------------------------------------------- templates


def test_an_annotation_naming_a_label_no_alert_carries_is_refused() -> None:
    err = refused(
        {"name": "Bad11", "expr": TERM, "annotations": {"dashboard": "{{ $labels.pol }}"}}
    )
    assert (err.rule, err.key) == ("Bad11", "annotations.dashboard")
    assert err.problem == (
        "names the label 'pol', which no alert of this rule carries (their labels: "
        "alertname, pool), so it would be empty; did you mean 'pool'?"
    )
    err = refused(
        {"name": "Sum", "expr": "sum(corral_queue_depth) > 0",
         "annotations": {"summary": "pool {{ $labels.pool }}"}}
    )  # fmt: skip
    assert "(their labels: alertname)" in err.problem
    ok = parse_rule(
        {"name": "Ok", "expr": "sum by (pool) (corral_workers) == 0", "labels": {"team": "ci"},
         "annotations": {"summary": "{{ $labels.alertname }} {{ $labels.pool }} "
                         "{{ $labels.team }} {{ $value }}"}},
        SAMPLE_LABELS,
    )  # fmt: skip
    assert ok.annotations["summary"].startswith("{{ $labels.alertname }}")
    assert len(parse_rules(DEFAULT_RULES, SAMPLE_LABELS)) == len(DEFAULT_RULES)


class _Recorder:
    def __init__(self) -> None:
        self.alerts: list[AlertInfo] = []

    def notify(self, alert: AlertInfo) -> None:
        self.alerts.append(alert)

    async def run(self) -> None:
        pass


def test_a_dashboard_link_that_renders_empty_falls_back_to_the_managers() -> None:
    # the instance of the right side of the `or` has no pool label: its link is empty
    rule = {
        "name": "Link",
        "expr": "corral_queue_depth > 0 or corral_workers_connected == 0",
        "annotations": {"dashboard": "{{ $labels.pool }}"},
    }
    config = AlertingConfig(rules=(rule,), default_rules=False, dashboard_url="http://dash/")
    recorder = _Recorder()
    monitor = _monitor(config, recorder)
    monitor._run(Evaluate(0.0, samples(MetricsReply(workers=0))))
    (alert,) = recorder.alerts
    assert alert.annotations["dashboard"] == "http://dash/"
    (listed,) = monitor.alerts(AlertsRequest()).alerts
    assert listed.annotations["dashboard"] == "http://dash/"


# ----------------------------------------------------------------------------- durations


def test_a_negative_duration_text_says_it_must_be_at_least_zero() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        parse_duration("-5s")
    err = refused({"name": "Neg", "expr": TERM, "for": "-5s"})
    assert err.key == "for" and ">= 0" in err.problem and "'-5s'" in err.problem


# ----------------------------------------------------------------------------- notifications


def test_the_notification_metrics_are_refused_as_ones_rules_cannot_use() -> None:
    err = refused({"name": "L10", "expr": "corral_notifications_sent_total > 0"})
    assert (err.rule, err.key) == ("L10", "expr")
    assert err.problem.startswith(
        "names 'corral_notifications_sent_total' at character 0, which is one of the "
        "corral_notifications_* metrics: alert rules cannot use them"
    )
    assert "alert rules cannot use them" in err.problem and "in Prometheus" in err.problem
    assert "did you mean" not in err.problem and "unknown metric" not in err.problem
    err = refused({"name": "Q", "expr": "increase(corral_notifications_dropped_total[5m]) > 0"})
    assert "alert rules cannot use them" in err.problem


# ----------------------------------------------------------------------------- rule shapes


def test_a_rule_that_is_not_a_table_is_refused_with_its_position(tmp_path: Path) -> None:
    path = tmp_path / "corral.toml"
    path.write_text('alerts = ["corral_queue_depth > 0"]\n')
    with pytest.raises(AlertConfigError) as info:
        load_alerting(path)
    assert info.value.source == str(path) and info.value.rule == ""
    assert str(info.value).startswith(
        f"the alerting configuration in {path}: the rule at position 1 is "
        "'corral_queue_depth > 0', not a table: a rule is a table with a name and an expr"
    )
    path.write_text(f'alerts = [{{name = "Ok", expr = "{TERM}"}}, 1]\n')
    with pytest.raises(AlertConfigError, match="the rule at position 2 is 1, not a table"):
        load_alerting(path)
    with pytest.raises(AlertConfigError, match="position 1 is 'corral_queue_depth > 0', not a"):
        alerting_config({}, [TERM])  # type: ignore[list-item]
    with pytest.raises(AlertConfigError, match="position 1 is 'corral_queue_depth > 0', not a"):
        Cluster(alerts=[TERM])  # type: ignore[list-item]


def test_a_rule_without_a_name_says_so_with_its_position_and_expr(tmp_path: Path) -> None:
    path = tmp_path / "corral.toml"
    path.write_text(
        f'[[alerts]]\nname = "Ok"\nexpr = "{TERM}"\n\n[[alerts]]\nexpr = "{TERM}"\nfor = "1m"\n'
    )
    with pytest.raises(AlertConfigError) as info:
        load_alerting(path)
    assert (info.value.rule, info.value.key, info.value.source) == ("", "name", str(path))
    assert info.value.problem == (
        "is missing from the rule at position 2 (expr 'corral_queue_depth > 0'): give each "
        "rule a name: letters, digits, '_', '.' and '-' (not first)"
    )
    assert "None" not in str(info.value)
    err = refused({"expr": TERM})  # the console's `alert add {JSON}`: no position
    assert err.problem.startswith("is missing from the rule (expr 'corral_queue_depth > 0'):")


# ----------------------------------------------------------------------------- scale-out pools


@pytest.mark.parametrize(
    "expr", ["corral_workers_connected > 0", "sum(corral_queue_depth) > 0",
             "sum by (state) (corral_workers) == 0 or corral_workers_connected == 0"],
)  # fmt: skip
def test_a_scale_out_that_could_name_no_pool_is_refused(expr: str) -> None:
    act = {"scale_out": {"by": 1, "max_blocks": 2}}
    err = refused({"name": "L7", "expr": expr, "action": act})
    assert (err.rule, err.key) == ("L7", "action.scale_out.pool")
    assert "no alert of this rule carries a pool label" in err.problem
    assert "set scale_out.pool in the rule's action (--pool POOL in the console)" in err.problem
    with pytest.raises(AlertConfigError, match="no alert of this rule carries a pool label"):
        alerting_config({}, [{"name": "L7", "expr": expr, "action": act}])
    named = {"scale_out": {"by": 1, "max_blocks": 2, "pool": "ci"}}
    assert parse_rule({"name": "L7", "expr": expr, "action": named}, SAMPLE_LABELS).action


@pytest.mark.parametrize(
    "expr",
    [TERM, 'corral_queue_depth{pool="ci"} > 0', "sum by (pool) (corral_workers) == 0",
     "corral_workers_connected == 0 and corral_queue_depth > 0",
     "corral_workers_connected == 0 or corral_queue_depth > 0",
     "increase(corral_blocks_failed_total[5m]) > 0"],
)  # fmt: skip
def test_a_scale_out_whose_alerts_may_carry_a_pool_needs_none_named(expr: str) -> None:
    rule = {"name": "L8", "expr": expr, "action": {"scale_out": {"fit": True}}}
    assert parse_rule(rule, SAMPLE_LABELS).action is not None


# ----------------------------------------------------------------------------- --alertmanager


def test_a_bad_alertmanager_url_names_the_flag_or_key_and_the_notifiers_section(
    tmp_path: Path,
) -> None:
    see = "See docs/monitoring.md#notifiers-and-alertmanager."
    headings = (ROOT / "docs" / "monitoring.md").read_text().splitlines()
    assert "## Notifiers and Alertmanager" in headings  # the anchor's heading
    with pytest.raises(AlertConfigError) as info:
        alerting_config(alertmanager="notaurl")  # the manager's --alertmanager flag
    assert str(info.value) == (
        "the alerting configuration: --alertmanager must be Alertmanager's base URL, e.g. "
        f"'http://127.0.0.1:9093', got 'notaurl'. {see}"
    )
    path = tmp_path / "corral.toml"
    path.write_text('[alerting]\nalertmanager = "notaurl"\n')
    with pytest.raises(AlertConfigError) as info:
        load_alerting(path)
    assert str(info.value).startswith(
        f"the alerting configuration in {path}: key 'alerting.alertmanager' must be"
    )
    assert str(info.value).endswith(see)
    path.write_text("[alerting]\ninterval = 5\n")
    with pytest.raises(AlertConfigError) as info:
        load_alerting(path, alertmanager="http://h:9093/api/v2/alerts")  # the flag, not the file
    assert str(info.value).startswith("the alerting configuration: --alertmanager must be")
    assert "leave out the API path" in str(info.value) and str(info.value).endswith(see)
    with pytest.raises(AlertConfigError, match=r"^the alerting configuration: Cluster\(alertm"):
        Cluster(alertmanager="notaurl")


# ----------------------------------------------------------------------------- pool warnings


def test_a_pool_label_of_no_configured_pool_is_a_warning_not_a_refusal(tmp_path: Path) -> None:
    def warned(expr: str, pools: list[str] | None = ["ci", "gpu"]) -> list[str]:  # noqa: B006
        return pool_warnings(parse_rule({"name": "P2", "expr": expr}, SAMPLE_LABELS), pools)

    assert warned('corral_queue_depth{pool="cii"} > 0') == [
        "no pool 'cii' is configured (pools: ci, gpu); did you mean 'ci'? The rule can fire "
        "only if workers join with --pool cii or tasks ask for pool cii"
    ]
    (line,) = warned(
        'increase(corral_blocks_failed_total{pool="zzz"}[5m]) > 0 and '
        'sum by (pool) (corral_workers{pool="zzz"}) == 0'
    )  # once per pool
    assert line.startswith("no pool 'zzz' is configured (pools: ci, gpu). The rule can fire")
    for expr in ('corral_queue_depth{pool="ci"} > 0', 'corral_queue_depth{pool="*"} > 0',
                 'corral_queue_depth{pool!="cii"} > 0', TERM):  # fmt: skip
        assert warned(expr) == [], expr
    assert warned('corral_queue_depth{pool="cii"} > 0', None) == []  # pools not known
    # a file with pools: the rule is kept, its warning is there to log and show
    path = tmp_path / "corral.toml"
    path.write_text(
        '[pools.ci]\nprovider = "local"\n\n'
        '[[alerts]]\nname = "P2"\nexpr = \'corral_queue_depth{pool="cii"} > 0\'\n'
    )
    config = load_alerting(path)
    assert "P2" in [r.name for r in config.all_rules()]
    assert config.warnings() == [
        "alert rule 'P2': no pool 'cii' is configured (pools: ci); did you mean 'ci'? The rule "
        "can fire only if workers join with --pool cii or tasks ask for pool cii"
    ]
    path.write_text(path.read_text().split("\n\n", 1)[1])
    assert load_alerting(path).warnings() == []  # no pools in the file: nothing known
    # a rule added live: its warnings come back with it
    monitor = _monitor(AlertingConfig(pools=("ci", "gpu")))
    rule = {"name": "P2", "expr": 'corral_queue_depth{pool="cii"} > 0'}
    added = monitor.add_rule(AlertRuleAdd(rule))
    assert added["warnings"] == warned(rule["expr"]) and "P2" in monitor.state.rules
    assert "warnings" not in monitor.add_rule(AlertRuleAdd({**rule, "expr": TERM}))


@pytest.mark.anyio
async def test_a_stop_warns_of_the_rules_the_console_changed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Rules added, replaced or removed from the console are not kept: an orderly stop
    says which, and where to keep them. Before, they were dropped without a word."""
    keep = {"name": "Keep", "expr": TERM}
    config = AlertingConfig(rules=(keep, {"name": "Gone", "expr": TERM}), default_rules=False)
    monitor = _monitor(config)
    assert monitor.console_changes() == []
    monitor.add_rule(AlertRuleAdd({"name": "ScarceQueue", "expr": TERM}))
    monitor.add_rule(AlertRuleAdd({**keep, "for": "5m"}))
    monitor.remove_rule(AlertRuleRemove("Gone"))
    assert monitor.console_changes() == ["added ScarceQueue", "replaced Keep", "removed Gone"]
    with caplog.at_level("WARNING"):
        await monitor.on_stop()
    assert "alert rules changed from the console are lost at this stop" in caplog.text
    assert "added ScarceQueue" in caplog.text and "--config" in caplog.text
