"""A wrong or unreachable Alertmanager URL is said before the first alert fires (a user
audit, sre finding 3: nothing was said until the first post failed, during the
incident): ``python -m runtime check --config`` has an ``alertmanager`` row (PASS when it
answers ``GET URL/-/ready``, WARN with why not), and the alert monitor probes it once as
it starts, in the background (a WARNING naming the URL and what to do, an INFO when it
answers), without holding up the start. Real HTTP servers on 127.0.0.1 stand in for
Alertmanager's readiness endpoint (ports 49500-49999); one check runs against a real
Alertmanager."""

from __future__ import annotations

import contextlib
import http.server
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import runtime.preflight
from runtime import Cluster
from runtime.preflight import (
    ALERTMANAGER_ADVICE,
    PASS,
    WARN,
    CheckResult,
    check_alertmanager,
    probe_alertmanager,
)
from tests.helpers import Cli, free_port_between, start_alertmanager, wait_until

LIMIT = 30  # seconds any test here may take (a loaded machine starts processes slowly)

PORTS = (49500, 49999)


class _Ready(http.server.BaseHTTPRequestHandler):
    """Alertmanager's readiness endpoint under a path per behaviour: ``/up/-/ready``
    answers 200 ``OK``, ``/starting/-/ready`` 503 (not ready yet), ``/api/...`` only under
    ``/proxied`` (a proxy that passes only the API), anything else 404."""

    def do_GET(self) -> None:
        answers = {
            "/up/-/ready": (200, "OK"),
            "/starting/-/ready": (503, "Service Unavailable"),
            "/proxied/api/v2/status": (200, "{}"),
        }
        status, text = answers.get(self.path, (404, "404 page not found"))
        body = text.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def ready_server() -> Iterator[str]:
    """A real HTTP server on 127.0.0.1 (a port of this file's range) serving
    :class:`_Ready` from a thread: its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port_between(*PORTS)), _Ready)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(LIMIT)


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT + 1)
async def test_the_probe_says_whether_alertmanager_answers_and_why_not() -> None:
    with ready_server() as base, anyio.fail_after(LIMIT):
        assert await check_alertmanager(base + "/up") == CheckResult(
            "*", "alertmanager", PASS, f"Alertmanager at {base}/up answers (GET /-/ready: HTTP 200)"
        )
        # a trailing slash is the same base URL
        assert await probe_alertmanager(base + "/up/") == (True, "GET /-/ready: HTTP 200")
        assert await probe_alertmanager(base + "/starting") == (
            False, "GET /-/ready: HTTP 503 Service Unavailable"
        )  # fmt: skip
        # no /-/ready behind a proxy: the API's status answers
        assert await probe_alertmanager(base + "/proxied") == (True, "GET /api/v2/status: HTTP 200")
        assert await probe_alertmanager(base + "/elsewhere") == (
            False,
            "GET /-/ready: HTTP 404 404 page not found; GET /api/v2/status: HTTP 404 404 page "
            "not found: is this Alertmanager's base URL (no path)?",
        )
        nobody = f"http://127.0.0.1:{free_port_between(*PORTS)}"
        result = await check_alertmanager(nobody)
    assert (result.status, result.advice) == (WARN, ALERTMANAGER_ADVICE)
    assert result.detail.startswith(f"Alertmanager at {nobody} does not answer: ClientConnector")
    assert "--alertmanager" in result.advice and "[alerting] alertmanager" in result.advice


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT + 1)
async def test_an_alertmanager_that_never_answers_is_said_within_the_probe_s_bound() -> None:
    import socket

    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", free_port_between(*PORTS)))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        with anyio.fail_after(LIMIT):
            assert await probe_alertmanager(url, 0.3) == (False, "no answer within 0.3 s")


def _check(tmp_path: Path, url: str) -> list[dict[str, str]]:
    """``python -m runtime check --config FILE --no-probe --json`` of a file whose
    ``[alerting]`` names ``url``: its ``alertmanager`` rows."""
    config = tmp_path / "corral.toml"
    config.write_text(f'[alerting]\nalertmanager = "{url}"\n')
    done = subprocess.run(
        [sys.executable, "-m", "runtime", "check", "--config", str(config), "--no-probe",
         "--json", "--spill-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=LIMIT, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr  # a WARN: the check passes
    report = json.loads(done.stdout)
    return [r for r in report["results"] if r["check"] == "alertmanager"]


@pytest.mark.timeout(LIMIT + 1)
def test_check_passes_an_alertmanager_that_answers(tmp_path: Path) -> None:
    with ready_server() as base:
        assert _check(tmp_path, base + "/up") == [
            {"pool": "*", "check": "alertmanager", "status": "PASS",
             "detail": f"Alertmanager at {base}/up answers (GET /-/ready: HTTP 200)",
             "advice": ""},
        ]  # fmt: skip


@pytest.mark.timeout(LIMIT + 1)
def test_check_warns_of_an_alertmanager_url_where_nothing_listens(tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port_between(*PORTS)}"
    (row,) = _check(tmp_path, nobody)
    assert (row["status"], row["advice"]) == ("WARN", ALERTMANAGER_ADVICE)
    assert row["detail"].startswith(f"Alertmanager at {nobody} does not answer: ClientConnector")


def _port() -> str:
    return f"127.0.0.1:{free_port_between(*PORTS)}"


@pytest.mark.slow
@pytest.mark.timeout(LIMIT + 1)
def test_a_manager_warns_at_start_of_an_alertmanager_that_does_not_answer(tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port_between(*PORTS)}"
    with Cli(tmp_path / "home") as cli:
        manager = cli.start("manager", "--listen", _port(), "--alertmanager", nobody,
                            "--no-monitoring")  # fmt: skip
        line = cli.line_with(manager, "Alertmanager does not answer", limit=LIMIT - 5)
    assert "level='warning'" in line and f"url='{nobody}'" in line
    assert "ClientConnectorError" in line and "[alerting] alertmanager in --config" in line


@pytest.mark.slow
@pytest.mark.timeout(LIMIT + 1)
def test_a_manager_says_at_start_that_a_real_alertmanager_answers(tmp_path: Path) -> None:
    with Cli(tmp_path / "home") as cli:
        url = start_alertmanager(cli, tmp_path / "am", free_port_between(*PORTS))
        manager = cli.start("manager", "--listen", _port(), "--alertmanager", url,
                            "--no-monitoring", "--log-level", "info")  # fmt: skip
        line = cli.line_with(manager, "Alertmanager answers", limit=LIMIT - 10)
    assert "level='info'" in line and f"url='{url}'" in line
    assert "answer='GET /-/ready: HTTP 200'" in line


@pytest.mark.anyio
@pytest.mark.timeout(LIMIT + 1)
async def test_the_probe_does_not_hold_up_the_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The probe runs in the monitor's own task: a cluster whose Alertmanager has not
    answered yet is up and evaluating its rules; the WARNING comes once the probe ends."""
    gate = anyio.Event()
    probing = anyio.Event()
    real = runtime.preflight.probe_alertmanager

    async def held(url: str, within: float) -> tuple[bool, str]:
        probing.set()
        await gate.wait()
        return await real(url, within)

    # (the monitor imports it from there as it probes)
    monkeypatch.setattr(runtime.preflight, "probe_alertmanager", held)
    nobody = f"http://127.0.0.1:{free_port_between(*PORTS)}"
    with caplog.at_level(logging.INFO), anyio.fail_after(LIMIT):
        async with Cluster(
            workers=0, alertmanager=nobody, alerting={"interval": 0.05, "default_rules": False}
        ) as cluster:
            monitor = cluster._plane.monitor
            await probing.wait()
            await wait_until(lambda: monitor.evaluations >= 2, "two evaluations")
            assert "Alertmanager" not in caplog.text  # the probe has said nothing yet
            gate.set()
            await wait_until(lambda: "Alertmanager does not answer" in caplog.text, "the warning")
    (record,) = [r for r in caplog.records if "Alertmanager does not answer" in r.getMessage()]
    assert record.levelno == logging.WARNING and nobody in record.getMessage()
