"""The console's ``alert`` commands against a real manager process (``python -m runtime
manager --config FILE`` with ``[alerting]`` and ``[[alerts]]``): ``alert list`` shows
the alerts, the rules and the audit to the read token too; ``alert add`` (options or a
JSON rule) and ``alert remove`` change the rules live with the admin token; bad rules
and unknown names are errors that say what to do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime.console import ConsoleClient, ConsoleError
from runtime.errors import PermissionDenied
from tests.helpers import Cli, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.slow]

LIMIT = 60

CONFIG = """
[alerting]
interval = 0.2

[[alerts]]
name = "NoWorkersYet"
expr = "corral_workers_connected == 0"
labels = {team = "ci", priority = "P3"}
annotations = {summary = "nobody joined"}
"""


async def _firing(console: ConsoleClient, name: str) -> dict[str, Any] | None:
    data = json.loads(await console.run_command("alert list --json"))
    for a in data["alerts"]:
        if a["name"] == name and a["state"] == "firing":
            return dict(a)
    return None


async def test_alert_list_add_and_remove_live(tmp_path: Path) -> None:
    config = tmp_path / "corral.toml"
    config.write_text(CONFIG)
    with Cli(tmp_path / "home") as cli:
        _, address = cli.manager("--config", str(config))
        with anyio.fail_after(LIMIT):
            async with ConsoleClient(address) as console:
                alert = await wait_until(
                    lambda: _firing(console, "NoWorkersYet"), "NoWorkersYet firing", step=0.1
                )
                assert alert["labels"] == {
                    "alertname": "NoWorkersYet", "team": "ci", "priority": "P3"
                }  # fmt: skip
                # its link: the manager's own page, on its listener
                http = address.replace("ws://", "http://", 1).rstrip("/")
                assert alert["annotations"]["dashboard"] == http + "/"
                text = await console.run_command("alert list")
                assert "NoWorkersYet" in text and "FIRING" in text
                assert "CorralQueueTime" in text  # the default rules run beside it

                added = json.loads(
                    await console.run_command(
                        "alert add SlowCpu 'corral_queue_oldest_wait_seconds{pool=\"cpu\"} > 60'"
                        " --for 2m --label team=ci --annotation summary='cpu waits'"
                        " --scale-out fit --pool cpu --max-blocks 3 --cooldown 1m --json"
                    )
                )
                assert added["name"] == "SlowCpu" and added["for"] == 120.0
                assert added["labels"] == {"team": "ci"}
                assert added["annotations"] == {"summary": "cpu waits"}
                assert added["action"]["scale_out"]["fit"] is True
                assert added["action"]["scale_out"]["max_blocks"] == 3
                assert added["action"]["scale_out"]["cooldown"] == 60.0

                # alert watch: each change as it comes (the states at the start first)
                lines: list[str] = []
                console.emit = lines.append
                watch = console.watch_alerts(LIMIT, interval=0.1)
                first = await anext(watch)
                assert (first["name"], first["state"]) == ("NoWorkersYet", "firing")
                await console.run_command(
                    'alert add {"name": "Submitted", "expr": "corral_tasks_submitted_total >= 0"}'
                )
                change = await anext(watch)  # the new rule's alert: pending, then firing
                while change["state"] != "firing":
                    change = await anext(watch)
                assert change["name"] == "Submitted"
                await watch.aclose()
                result = await console.execute("alert watch 0.2")
                # the states at the start, in time order, are not changes
                assert [c["name"] for c in result.data["start"]] == ["NoWorkersYet", "Submitted"]
                assert "0 change(s) (2 alert(s) at the start)" in result.text()
                assert lines[0].split()[1:3] == ["FIRING", "NoWorkersYet"]
                assert "team=ci priority=P3" in lines[0] and "threshold_breached=1" in lines[0]
                with pytest.raises(ConsoleError, match="SECONDS"):
                    await console.execute("alert watch soon")
                rules = {r["name"] for r in (await console.alerts()).rules}
                assert {"NoWorkersYet", "SlowCpu", "Submitted", "CorralQueueTime"} <= rules

                with pytest.raises(ConsoleError, match="did you mean 'corral_queue_depth'"):
                    await console.run_command("alert add Bad 'corral_queue_dept > 0'")
                # the threshold is read by the manager's parser, as from a file: a
                # number beyond a float's range (infinity) or nan is refused there
                for endless in ("1e400", "nan"):
                    with pytest.raises(
                        ConsoleError,
                        match=rf"alert rule 'Endless': key 'expr' the threshold after '>' at "
                        rf"character 21 must be a finite number, got '{endless}'",
                    ):
                        await console.run_command(
                            f"alert add Endless 'corral_queue_depth > {endless}'"
                        )
                    with pytest.raises(ConsoleError, match="must be a finite number"):
                        await console.run_command(
                            "alert add "
                            + json.dumps({"name": "Endless", "expr": f"corral_workers > {endless}"})
                        )
                with pytest.raises(ConsoleError, match="belong to --scale-out"):
                    await console.run_command("alert add X 'corral_queue_depth > 0' --pool cpu")
                with pytest.raises(ConsoleError, match="no such rule"):
                    await console.run_command("alert remove Nope")

                out = await console.run_command("alert remove Submitted")
                assert "Submitted removed" in out
                reply = await console.alerts()
                assert "Submitted" not in {r["name"] for r in reply.rules}
                # its firing alert resolved with it
                assert {a.state for a in reply.alerts if a.name == "Submitted"} <= {"resolved"}

            async with ConsoleClient(address, read_only=True) as reader:
                assert await _firing(reader, "NoWorkersYet") is not None
                with pytest.raises(PermissionDenied):
                    await reader.run_command("alert remove SlowCpu")
                with pytest.raises(PermissionDenied):
                    await reader.run_command("alert add Y 'corral_queue_depth > 0'")
