"""``alert add`` of a rule that replaces one says which labels and annotations of the
replaced rule the new one drops (a user audit, sre finding 2: monitoring.md's way to
raise ``CorralQueueTime``'s threshold dropped its ``team="corral"`` label and its
summary and description without a word, and Alertmanager's routes on ``team`` stopped
matching). Nothing is kept implicitly; the reply (text, JSON, ``add_alert_rule``) says
what is gone. monitoring.md's example gives them again and drops nothing."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import pytest

from actors.alerts_state import DEFAULT_RULES, parse_rule
from runtime.console import ConsoleClient, replaced_text
from runtime.metrics import SAMPLE_LABELS
from runtime.monitor import alerting_config, replaced_rule
from tests.helpers import nodes

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]

LIMIT = 20

RAISED = "corral_queue_depth > 0 and corral_queue_oldest_wait_seconds > 600"
DOCS = Path(__file__).resolve().parent.parent / "docs"


def _default(name: str) -> dict[str, object]:
    return next(dict(r) for r in DEFAULT_RULES if r["name"] == name)


def test_what_a_replacing_rule_drops_and_how_it_is_said() -> None:
    old = parse_rule(_default("CorralQueueTime"), SAMPLE_LABELS)
    new = parse_rule(
        {"name": "CorralQueueTime", "expr": RAISED, "labels": {"priority": "P3"}}, SAMPLE_LABELS
    )
    dropped = replaced_rule(old, new)
    assert dropped == {
        "rule": "CorralQueueTime",
        "dropped_labels": {"team": "corral"},
        "dropped_annotations": ["summary", "description"],
    }
    assert replaced_text(dropped) == (
        "replaces rule CorralQueueTime; dropped labels team=corral; dropped annotations "
        "summary, description: give them again with --label/--annotation to keep them"
    )
    # a label of another value is given, not dropped; only what is left out is said
    kept = parse_rule({**_default("CorralQueueTime"), "labels": {"team": "ml"}}, SAMPLE_LABELS)
    assert replaced_text(replaced_rule(old, kept)) == (
        "replaces rule CorralQueueTime; dropped labels priority=P2: give them again with "
        "--label to keep them"
    )
    bare = parse_rule({**_default("CorralQueueTime"), "annotations": {}}, SAMPLE_LABELS)
    assert replaced_text(replaced_rule(old, bare)) == (
        "replaces rule CorralQueueTime; dropped annotations summary, description: give them "
        "again with --annotation to keep them"
    )
    assert replaced_text(replaced_rule(old, old)) == (
        "replaces rule CorralQueueTime; it drops none of its labels and annotations"
    )


def test_a_config_rule_named_as_a_default_is_said_to_replace_it() -> None:
    """An ``[[alerts]]`` rule of a default rule's name replaces that default whole, and
    neither the manager nor ``check --config`` said so: a user who meant to add a rule
    beside the default lost the default. Now ``check --config`` warns (these lines),
    naming the default and what of it the rule drops, and how to keep both."""
    mine = {"name": "Mine", "expr": "corral_workers > 1"}
    raised = {"name": "CorralQueueTime", "expr": RAISED, "labels": {"team": "corral"}}
    config = alerting_config(rules=[raised, mine])
    assert config.replaced_defaults() == [(
        "alert rule 'CorralQueueTime' replaces the default rule 'CorralQueueTime': the "
        "default does not run, and nothing of it is kept; yours drops its labels "
        "priority=P2 and its annotations summary, description",
        "To run both, give yours another name than 'CorralQueueTime'; to replace it, give "
        "again what you keep of it (its labels and annotations: "
        "docs/monitoring.md#default-rules)",
    )]  # fmt: skip
    whole = alerting_config(rules=[{**_default("CorralQueueTime"), "expr": RAISED}])
    ((said, _),) = whole.replaced_defaults()
    assert said.endswith("nothing of it is kept; yours gives all its labels and annotations again")
    assert alerting_config(rules=[mine]).replaced_defaults() == []
    assert alerting_config({"default_rules": False}, [raised]).replaced_defaults() == []


def _doc_sample(doc: str, prompt: str) -> tuple[str, list[str]]:
    """The command of the ``corral> PROMPT...`` line of ``doc`` and the reply lines
    under it (to the next prompt or the fence)."""
    text = (DOCS / doc).read_text()
    start = text.index(f"corral> {prompt}")
    block = text[start : text.index("\n```", start)].split("\ncorral> ", 1)[0]
    command, *reply = block.removeprefix("corral> ").splitlines()
    return command, reply


async def test_alert_add_says_what_the_rule_it_replaces_loses() -> None:
    """The audit's command, then monitoring.md's: the first says what it drops (exact
    text, and as data in its JSON), the second drops nothing and keeps ``team``."""
    with anyio.fail_after(LIMIT):
        async with nodes(0) as (address, _), ConsoleClient(address) as console:
            dropped, said = _doc_sample("console.md", "alert add CorralQueueTime")
            result = await console.execute(dropped)
            assert said == [
                f"alert rule CorralQueueTime added: {RAISED}",
                "replaces rule CorralQueueTime; dropped labels team=corral; dropped "
                "annotations summary, description: give them again with "
                "--label/--annotation to keep them",
            ]
            assert result.text(width=1000).splitlines() == said
            assert result.data["replaced"] == {
                "rule": "CorralQueueTime",
                "dropped_labels": {"team": "corral"},
                "dropped_annotations": ["summary", "description"],
            }
            assert result.data["labels"] == {"priority": "P3"}  # nothing kept implicitly

            # monitoring.md's example gives them again: nothing dropped, team kept
            command, said = _doc_sample("monitoring.md", "alert add CorralQueueTime")
            assert "--label team=corral" in command
            back = await console.add_alert_rule(_default("CorralQueueTime"))  # the default
            assert back["replaced"]["dropped_labels"] == {}
            result = await console.execute(command)
            assert said == [
                f"alert rule CorralQueueTime added: {RAISED}",
                "replaces rule CorralQueueTime; it drops none of its labels and annotations",
            ]
            assert result.text(width=1000).splitlines() == said
            (held,) = [r for r in (await console.alerts()).rules if r["name"] == "CorralQueueTime"]
            assert held["labels"] == {"team": "corral", "priority": "P3"}
            assert set(held["annotations"]) == {"summary", "description"}
            assert re.search(r"over 10 minutes", held["annotations"]["description"])

            # a new rule replaces nothing: no such line, no such key (the Python API alike)
            added = await console.add_alert_rule({"name": "Fresh", "expr": "corral_workers > 1"})
            assert "replaced" not in added
            text = await console.run_command("alert add Fresh2 'corral_workers > 1'")
            assert text.strip() == "alert rule Fresh2 added: corral_workers > 1"
            again = await console.add_alert_rule({"name": "Fresh", "expr": "corral_workers > 2"})
            assert again["replaced"] == {
                "rule": "Fresh", "dropped_labels": {}, "dropped_annotations": []
            }  # fmt: skip
