"""An aiohttp application with Corral embedded: a cluster and a user-defined actor.

    python demos/aiohttp_app.py --port 8080
    curl 'http://127.0.0.1:8080/sum?n=100'      # maps square() over range(n) on the cluster
    curl http://127.0.0.1:8080/status           # the cluster's status as JSON
    curl http://127.0.0.1:8080/metrics          # per-endpoint request metrics (an actor)

    python demos/aiohttp_app.py --self-test     # start on 127.0.0.1:0, query, exit 0

What it shows:

- A :class:`~runtime.client.Cluster` started in a ``cleanup_ctx``: its actors run in the
  application's own event loop, next to the request handlers; nothing else is started
  (no threads besides the workers' executors, no processes). It stops when the
  application is cleaned up.
- Request handlers using the cluster (``map`` + ``gather``) without blocking the loop.
- A user-defined actor (:class:`RequestMetrics`, a ``runtime.kernel.Actor`` with
  ``@handles``) in its own :class:`~runtime.kernel.ActorSystem` beside the cluster: a
  middleware ``tell``s it about every request, ``GET /metrics`` ``ask``s it.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web

from runtime import Cluster
from runtime.kernel import Actor, ActorRef, ActorSystem, handles
from runtime.log import configure
from runtime.messages import Message, message

MAX_N = 100_000  #: largest n /sum accepts

# ----------------------------------------------------------------------------- the actor


@message("demo.RequestServed")
class RequestServed(Message):
    """Middleware -> metrics actor: one request was answered."""

    path: str
    status: int
    seconds: float


@message("demo.MetricsQuery")
class MetricsQuery(Message):
    """-> metrics actor: reply with the metrics per path."""


class RequestMetrics(Actor):
    """Counts requests per path: how many, how many failed, mean and max latency.

    Its state is touched only by its own handlers, one message at a time, so no lock is
    needed even though every request handler reports to it.
    """

    def __init__(self) -> None:
        self.paths: dict[str, dict[str, float]] = {}  #: path -> counters
        self.started = time.time()

    @handles(RequestServed)
    def served(self, msg: RequestServed) -> None:
        p = self.paths.setdefault(msg.path, {"requests": 0, "errors": 0, "total": 0.0, "max": 0.0})
        p["requests"] += 1
        p["errors"] += msg.status >= 400
        p["total"] += msg.seconds
        p["max"] = max(p["max"], msg.seconds)

    @handles(MetricsQuery)
    def query(self, msg: MetricsQuery) -> dict[str, Any]:
        return {
            "uptime_seconds": round(time.time() - self.started, 3),
            "paths": {
                path: {
                    "requests": int(p["requests"]),
                    "errors": int(p["errors"]),
                    "mean_seconds": p["total"] / p["requests"],
                    "max_seconds": p["max"],
                }
                for path, p in sorted(self.paths.items())
            },
        }


# ----------------------------------------------------------------------------- the app

CLUSTER = web.AppKey("cluster", Cluster)
METRICS = web.AppKey("metrics", ActorRef)
OPTIONS = web.AppKey("options", dict)


def square(x: int) -> int:
    """The function /sum maps over range(n)."""
    return x * x


def jsonable(obj: Any) -> Any:
    """``cluster.status()`` (messages, tuples, non-str keys, inf) as plain JSON values."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, str | int | bool):
        return obj
    if isinstance(obj, bytes):
        return {"bytes": len(obj)}
    if hasattr(obj, "item"):  # numpy scalars
        return jsonable(obj.item())
    return repr(obj)


def _bad_request(text: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"error": text}), content_type="application/json")


async def sum_handler(request: web.Request) -> web.Response:
    """``GET /sum?n=100``: sum of squares of range(n), computed as n tasks."""
    raw = request.query.get("n", "100")
    try:
        n = int(raw)
    except ValueError:
        raise _bad_request(f"n must be an integer, got {raw!r}") from None
    if not 0 <= n <= MAX_N:
        raise _bad_request(f"n must be between 0 and {MAX_N}, got {n}")
    cluster = request.app[CLUSTER]
    t0 = time.perf_counter()
    futures = cluster.map(square, range(n))
    try:
        values = await cluster.gather(futures)
    finally:
        for f in futures:  # let the cluster forget the results now, not at GC time
            f.release()
    return web.json_response(
        {
            "n": n,
            "function": "square",
            "tasks": n,
            "sum": sum(values),
            "seconds": round(time.perf_counter() - t0, 6),
        }
    )


async def status_handler(request: web.Request) -> web.Response:
    """``GET /status``: ``cluster.status()`` as JSON."""
    return web.json_response(jsonable(await request.app[CLUSTER].status()))


async def metrics_handler(request: web.Request) -> web.Response:
    """``GET /metrics``: what the :class:`RequestMetrics` actor counted."""
    return web.json_response(await request.app[METRICS].ask(MetricsQuery(), timeout=5.0))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    t0 = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        ref = request.app.get(METRICS)
        if ref is not None and not ref.stopped:
            await ref.tell(RequestServed(request.path, status, time.perf_counter() - t0))


async def corral_ctx(app: web.Application) -> AsyncIterator[None]:
    """Start the cluster and the metrics actor with the app; stop them with it.

    Both host their actors in a task of their own (``Cluster.start``/``close``,
    ``ActorSystem.start``/``stop``), so it does not matter which tasks aiohttp uses to
    enter and leave this context, and a crash comes out of ``close`` as ``ActorCrashed``.
    """
    opts = app[OPTIONS]
    cluster = Cluster(workers=opts["workers"], threads_per_worker=opts["threads"])
    system = ActorSystem()
    await cluster.start()
    try:
        await system.start()
        try:
            await cluster.wait_for_workers(opts["workers"])
            app[CLUSTER] = cluster
            app[METRICS] = await system.spawn(RequestMetrics(), "metrics")
            yield
        finally:
            await system.stop()
    finally:
        await cluster.close()


def make_app(workers: int = 2, threads: int = 1) -> web.Application:
    """The application; the cluster starts when the app starts."""
    app = web.Application(middlewares=[metrics_middleware])
    app[OPTIONS] = {"workers": workers, "threads": threads}
    app.cleanup_ctx.append(corral_ctx)
    app.router.add_get("/sum", sum_handler)
    app.router.add_get("/status", status_handler)
    app.router.add_get("/metrics", metrics_handler)
    return app


# ----------------------------------------------------------------------------- self-test


async def self_test(workers: int, threads: int) -> int:
    """Serve on 127.0.0.1 port 0, request every endpoint, print the answers, check them."""
    runner = web.AppRunner(make_app(workers, threads))
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        base = f"http://{host}:{port}"
        print(f"serving on {base}")
        problems: list[str] = []
        async with aiohttp.ClientSession() as session:
            answers = {}
            for path in ("/sum?n=100", "/sum?n=oops", "/status", "/metrics"):
                async with session.get(base + path) as resp:
                    answers[path] = (resp.status, await resp.json())
                print(f"GET {path} -> {resp.status}")
                print(json.dumps(answers[path][1], indent=2))
        status, body = answers["/sum?n=100"]
        if status != 200 or body.get("sum") != sum(i * i for i in range(100)):
            problems.append(f"/sum?n=100 answered {status} {body}")
        if answers["/sum?n=oops"][0] != 400:
            problems.append(f"/sum?n=oops answered {answers['/sum?n=oops'][0]}, not 400")
        status, body = answers["/status"]
        if status != 200 or len(body.get("workers", ())) != workers:
            problems.append(
                f"/status answered {status} with {len(body.get('workers', ()))} workers"
            )
        elif body.get("categories", {}).get("square", {}).get("count", 0) < 100:
            problems.append("/status does not count the 100 square tasks")
        status, body = answers["/metrics"]
        if status != 200 or body["paths"].get("/sum", {}).get("requests") != 2:
            problems.append(f"/metrics answered {status} {body}")
    finally:
        await runner.cleanup()
    for p in problems:
        print(f"self-test failed: {p}", file=sys.stderr)
    if not problems:
        print("self-test passed")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python demos/aiohttp_app.py",
        description="An aiohttp app with an embedded Corral cluster: GET /sum?n=100, "
        "GET /status, GET /metrics.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on")
    parser.add_argument("--port", type=int, default=8080, help="port to serve on (default: 8080)")
    parser.add_argument("--workers", type=int, default=2, help="in-process workers (default: 2)")
    parser.add_argument("--threads", type=int, default=1, help="threads per worker (default: 1)")
    parser.add_argument("--log-level", default="WARNING", help="Corral's log level")
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="serve on 127.0.0.1 port 0, request every endpoint, print the answers and exit",
    )
    args = parser.parse_args(argv)
    if args.workers < 1 or args.threads < 1:
        print("error: --workers and --threads must be at least 1", file=sys.stderr)
        return 1
    configure(args.log_level)
    try:
        if args.self_test:
            return asyncio.run(self_test(args.workers, args.threads))
        web.run_app(make_app(args.workers, args.threads), host=args.host, port=args.port)
    except Exception as exc:  # one line and exit 1
        while isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]  # start-up errors come wrapped by the actor system
        print(f"error: {type(exc).__name__}: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
