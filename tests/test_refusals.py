"""Refused handshakes are logged a few at a time, then as a summary (security audit,
finding 1: any local user could write a warning line per refused connection, ~1,400
lines a second, without a token).

The pure :class:`transport.refusals.RefusalLog` is fed refusals with the time as data;
one test floods a real listener on 127.0.0.1 (ports 44000-44999) and reads its log.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from aiohttp import web

import transport
from tests.helpers import free_port_between, log_lines, wait_until
from transport.refusals import RefusalLog, Refused, RefusedSummary
from transport.ws import WebSocketListener

TOKENS = {"secret-a": "admin", "secret-r": "read"}


def test_the_first_refusals_per_peer_and_reason_get_lines_the_rest_a_summary() -> None:
    log = RefusalLog(first=2, most=10, interval=60.0)
    assert log.refused(0.0, "127.0.0.1", "bad token") == [Refused("127.0.0.1", "bad token")]
    assert log.refused(1.0, "127.0.0.1", "bad token") == [Refused("127.0.0.1", "bad token")]
    assert log.due is None  # nothing unlogged yet: no summary to write
    for t in range(2, 12):
        assert log.refused(float(t), "127.0.0.1", "bad token") == []
    assert log.refused(12.0, "127.0.0.1", "no token") == [Refused("127.0.0.1", "no token")]
    assert log.refused(13.0, "::1", "bad token") == [Refused("::1", "bad token")]
    assert log.due == 60.0
    assert log.flush(59.9) == []
    summary = RefusedSummary(
        total=14,
        unlogged=10,
        seconds=60.0,
        counts=(
            ("bad token", "127.0.0.1", 12),
            ("bad token", "::1", 1),
            ("no token", "127.0.0.1", 1),
        ),
    )
    assert log.flush(60.0) == [summary]
    assert summary.text() == (
        "refused 14 connections in the last 60 s: bad token 12 from 127.0.0.1, "
        "bad token 1 from ::1, no token 1 from 127.0.0.1"
    )
    assert log.due is None and log.flush(500.0) == []
    # a new window: its first refusals get lines again
    assert log.refused(500.0, "127.0.0.1", "bad token") == [Refused("127.0.0.1", "bad token")]


def test_a_refusal_after_the_window_brings_its_summary_first() -> None:
    log = RefusalLog(first=1, most=10, interval=10.0)
    log.refused(0.0, "a", "bad token")
    assert log.refused(5.0, "a", "bad token") == []
    assert log.refused(10.0, "a", "bad token") == [
        RefusedSummary(total=2, unlogged=1, seconds=10.0, counts=(("bad token", "a", 2),)),
        Refused("a", "bad token"),
    ]


def test_most_bounds_the_lines_of_many_peers_and_the_summary_names_the_largest() -> None:
    log = RefusalLog(first=3, most=4, interval=10.0)
    lines = [line for n in range(100) for line in log.refused(0.0, f"10.0.0.{n}", "no token")]
    assert len(lines) == 4
    (summary,) = log.flush(3.0, closing=True)  # a closing listener says what it has
    assert (summary.total, summary.unlogged, summary.seconds) == (100, 96, 3.0)
    assert summary.text(shown=2) == (
        "refused 100 connections in the last 3 s: no token 1 from 10.0.0.0, "
        "no token 1 from 10.0.0.1, 98 other peer and reason pairs"
    )


def test_bad_settings_are_a_value_error_naming_them() -> None:
    with pytest.raises(ValueError, match="interval > 0, got first=1, most=1, interval=0"):
        RefusalLog(first=1, most=1, interval=0)


@pytest.mark.anyio
async def test_a_flood_of_refused_handshakes_is_a_few_lines_and_one_summary() -> None:
    """300 handshakes with a wrong token against a real listener: 3 lines of their own
    and one summary counting all of them, here at the listener's close (before: 300
    lines)."""
    port = free_port_between(44000, 44999)
    with anyio.fail_after(8), log_lines("corral.transport") as logs:
        async with await transport.listen(f"ws://127.0.0.1:{port}/c", tokens=TOKENS) as listener:
            assert isinstance(listener, WebSocketListener)
            for _ in range(300):
                with pytest.raises(transport.AuthenticationFailed):
                    await transport.connect(listener.address, token="deadbeef")
            assert listener.refused == 300
            assert listener.refused_by == {"bad token": 300}
    single = [ln for ln in logs.lines if "event='refused a websocket handshake'" in ln]
    assert len(single) == 3, logs.lines
    assert all("reason='bad token'" in ln and "status=403" in ln for ln in single), single
    summaries = [ln for ln in logs.lines if "event='refused 300 connections" in ln]
    assert len(summaries) == 1, logs.lines
    assert " s: bad token 300 from 127.0.0.1'" in summaries[0], summaries
    assert "not_logged_one_by_one=297" in summaries[0], summaries


@pytest.mark.anyio
async def test_the_summary_comes_when_the_window_ends_without_another_refusal() -> None:
    port = free_port_between(44000, 44999)
    with anyio.fail_after(8), log_lines("corral.transport") as logs:
        async with await transport.listen(f"ws://127.0.0.1:{port}/c", tokens=TOKENS) as listener:
            assert isinstance(listener, WebSocketListener)
            listener.refusal_log = RefusalLog(first=1, interval=0.3)
            for _ in range(5):
                with pytest.raises(transport.AuthenticationFailed):
                    await transport.connect(listener.address)
            await wait_until(lambda: logs.has("refused 5 connections"), "the summary")
            assert logs.has("refused 5 connections in the last 0.3 s: no token 5 from 127.0.0.1")
            assert len([ln for ln in logs.lines if "refused a websocket handshake" in ln]) == 1


async def _raw_status(port: int, request: bytes) -> bytes:
    """The status line a raw HTTP ``request`` to 127.0.0.1:``port`` gets."""
    stream = await anyio.connect_tcp("127.0.0.1", port)
    async with stream:
        await stream.send(request)
        answer = b""
        while b"\r\n" not in answer:
            answer += await stream.receive()
        return answer.split(b"\r\n", 1)[0]


@pytest.mark.anyio
async def test_a_token_that_is_not_utf8_is_refused_as_unknown_without_a_traceback() -> None:
    """Bytes that are not UTF-8 in the Authorization header (websocket handshake, a plain
    route such as /metrics) or in the dashboard's cookie are an unknown token: 403, and
    no 500 with a traceback in the log (security audit, finding 2)."""

    async def metrics(role: str | None) -> tuple[int, bytes, str]:
        return 200, b"ok\n", "text/plain"

    async def page(request: Any, role: str | None) -> Any:
        return web.Response(text="page")

    port = free_port_between(44000, 44999)
    upgrade = (
        b"GET /c HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    )
    requests = [
        upgrade + b"Authorization: Bearer \xff\xfe\r\n\r\n",
        upgrade + b"Authorization: Bearer \xed\xa0\x80\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer \xff\xfe\xed\xa0\x80\r\n\r\n",
        b"GET /page HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Cookie: corral_token_%d=\xed\xa0\x80\r\n\r\n" % port,
    ]
    with anyio.fail_after(8), log_lines("aiohttp") as aio, log_lines("corral.transport") as logs:
        async with await transport.listen(
            f"ws://127.0.0.1:{port}/c",
            tokens=TOKENS,
            http_routes={"/metrics": metrics},
            web_routes={"/page": page},
        ) as listener:
            for request in requests:
                assert await _raw_status(port, request) == b"HTTP/1.1 403 Forbidden", request
            assert listener.refused == len(requests)
    assert listener.refused_by == {"bad token": len(requests)}
    assert not [ln for ln in aio.lines + logs.lines if "Error handling request" in ln], aio.lines


def test_the_refusals_by_reason_are_a_counter_of_the_metrics() -> None:
    from runtime.messages import MetricsReply
    from runtime.metrics import RefusalCollector, render

    counts = {"bad token": 12_300, "no token": 45}
    text = render(MetricsReply(), [RefusalCollector(lambda: counts)]).decode()
    assert "# TYPE corral_refused_connections_total counter" in text, text
    assert 'corral_refused_connections_total{reason="bad token"} 12300.0' in text, text
    assert 'corral_refused_connections_total{reason="no token"} 45.0' in text, text
