"""Corral's command line: ``python -m runtime [--log-level LEVEL] [COMMAND] [OPTIONS]``.

What lives here: the argument parser and :func:`main` (also the ``corral`` console
script). Commands:

- ``demo`` (the default when no command is given): run the physics-skim demo workflow
  in-process (see :mod:`runtime.demo`) and print a summary.
- ``manager``: run a manager process (scheduler, file registry, gateway) listening for
  workers, clients and consoles over websockets.
- ``worker``: run a worker process that joins a manager.
- ``console``: the control console of a running manager: an interactive shell, or one
  command (``python -m runtime console ADDRESS status --json``); see docs/console.md.
- ``check``: the pre-flight check of a pools file (``--config``): the batch system,
  each pool's partition, account and QOS, a probe job's versions, the directories'
  room (see :mod:`runtime.preflight`); exit 1 when a check fails.
- ``report``: an HTML report of a monitoring database (see :mod:`runtime.report`).
- ``version``: print the versions of Corral, Python and dask.

Exit codes: 0 on success; 1 when the run failed or an option is out of range (one line
on stderr says why); 2 for command-line usage errors (argparse's convention); 130 when
interrupted; 141 (128 + SIGPIPE), quietly, when what its output went to closed early
(``... | head``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actors.host import MemoryLimit
    from runtime.monitordb import MonitorWriter, Upgraded

__all__ = ["build_parser", "main"]

COMMANDS = ("demo", "manager", "worker", "console", "check", "report", "version")


class _StderrProxy:
    """Writes to whatever ``sys.stderr`` is at the time, so log lines go through rich's
    redirection while a progress display is live instead of tearing it."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _level(text: str) -> str:
    from runtime.log import level_name

    try:
        return level_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _deadline(text: str) -> float:
    """The worker's ``--deadline`` (or ``CORRAL_DEADLINE``, its default) as a number:
    a usage error that names both for one that is not."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} (from --deadline, or CORRAL_DEADLINE when it is not given) is not a "
            "time in seconds since the epoch; for an hour from now pass "
            "--deadline $(( $(date +%s) + 3600 )), or unset CORRAL_DEADLINE"
        ) from None


def _monitoring_options(parser: Any, prog: str, run: str = "<time>-<id>") -> None:
    """``--monitoring PATH`` or ``--no-monitoring`` (of the demo and the manager; ``run``:
    the name of a new run directory)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--monitoring",
        metavar="PATH",
        help="write the monitoring database (SQLite) to PATH (default: "
        f"~/.corral/runs/{run}/monitoring.db, or under $CORRAL_RUNS_DIR; printed); "
        f"`{prog} report PATH` makes a report of it",
    )
    group.add_argument("--no-monitoring", action="store_true", help="write no monitoring database")


def _tls_options(parser: Any, *, serves: bool = True) -> None:
    """``--tls-cert``, ``--tls-key``, ``--tls-ca`` (of the manager and the worker; the
    console, which ``serves`` nothing: ``--tls-ca`` only): set ``CORRAL_TLS_*`` for this
    process and its children (``transport/tls.py``, through :func:`_apply_tls`)."""
    if serves:
        parser.add_argument(
            "--tls-cert",
            metavar="FILE",
            help="PEM certificate chain to serve wss:// with (the manager's listener; a "
            "worker's listener for its peers), its key too unless --tls-key (default: "
            "$CORRAL_TLS_CERT; docs/security.md#tls)",
        )
        parser.add_argument(
            "--tls-key", metavar="FILE", help="its private key, if in a file of its own"
        )
    parser.add_argument(
        "--tls-ca",
        metavar="FILE",
        help="PEM CA certificates to verify the wss:// servers it connects to (for a "
        "self-signed certificate: that certificate; default: $CORRAL_TLS_CA, else the "
        "system's CAs)",
    )


def _apply_tls(args: argparse.Namespace, address: str, what: str) -> None:
    """Set ``CORRAL_TLS_*`` from the ``--tls-*`` flags, which only a ``wss://``
    ``address`` uses: with another one they are refused (:class:`ValueError`, before
    anything starts), rather than ignored while the process speaks plaintext."""
    from transport.tls import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV

    files = {name: getattr(args, f"tls_{name}", None) for name in ("cert", "key", "ca")}
    given = [f"--tls-{name}" for name, value in files.items() if value]
    scheme = address.partition("://")[0].lower() if "://" in address else "ws"
    if given and scheme != "wss":
        it = "them" if len(given) > 1 else "it"
        if args.command == "manager":
            does, fix = "serve plaintext ws://", "Use --listen wss://HOST:PORT"
        elif args.command == "console":
            does, fix = "connect over plaintext ws://", "Connect to wss://HOST:PORT"
        else:
            does, fix = "join and serve its peers over plaintext ws://", "Join wss://HOST:PORT"
        raise ValueError(
            f"{' and '.join(given)} given, but {what}: the {args.command} would {does} "
            f"(tokens in clear) and ignore {it}. {fix} for TLS, or drop the --tls-* flags "
            "(docs/security.md#tls)"
        )
    if args.command == "manager" and scheme != "wss":
        _plaintext_despite_tls_env(args.listen, explicit="://" in args.listen)
    for value, env in ((files["cert"], TLS_CERT_ENV), (files["key"], TLS_KEY_ENV),
                       (files["ca"], TLS_CA_ENV)):  # fmt: skip
        if value:
            os.environ[env] = os.path.abspath(value)


def _plaintext_despite_tls_env(listen: str, *, explicit: bool) -> None:
    """A manager about to listen on plaintext ``ws://`` while ``CORRAL_TLS_CERT`` or
    ``CORRAL_TLS_KEY`` is set (which only a ``wss://`` listener reads): whoever set them
    asked for TLS. With ``--listen HOST:PORT`` (no scheme, or the default) that is a
    :class:`ValueError` before anything starts, rather than tokens served in clear
    without a word; ``--listen ws://HOST:PORT`` chose plaintext in so many words, so it
    starts, with a warning that the variables are ignored."""
    from runtime.log import get_logger
    from transport.tls import TLS_CERT_ENV, TLS_KEY_ENV

    set_ = {env: os.environ[env] for env in (TLS_CERT_ENV, TLS_KEY_ENV) if os.environ.get(env)}
    if not set_:
        return
    missing = {env for env, path in set_.items() if not os.path.exists(path)}
    names = " and ".join(
        f"{env}={path!r}{' (no such file)' if env in missing else ''}" for env, path in set_.items()
    )
    hostport = listen.partition("://")[2] if "://" in listen else listen
    if explicit:
        get_logger("corral.manager").warning(
            "TLS variables ignored: this manager serves plaintext ws://, as --listen says; "
            "tokens travel in clear",
            listen=listen, ignored=sorted(set_),
            fix=f"--listen wss://{hostport} for TLS, or unset {' and '.join(set_)}",
        )  # fmt: skip
        return
    are, them = ("are", "them") if len(set_) > 1 else ("is", "it")
    raise ValueError(
        f"{names} {are} set, but --listen {listen} is not wss://: the manager would serve "
        f"plaintext ws:// (tokens in clear) and ignore {them}. For TLS, --listen "
        f"wss://{hostport}{' with files that are there' if missing else ''}; to serve "
        f"plaintext on purpose, --listen ws://{hostport} or unset {' and '.join(set_)} "
        "(docs/security.md#tls)"
    )


#: the demo runs (run directories, one per run) kept by default (``--keep-runs``)
DEMO_RUNS_KEPT = 5

#: The program's name when it is run as ``python -m runtime`` (or from a test).
MODULE_PROG = "python -m runtime"


def _prog(argv0: str) -> str:
    """The name the command line was invoked as: ``corral`` for the installed script,
    else ``python -m runtime``."""
    name = os.path.basename(argv0)
    return MODULE_PROG if name in ("", "__main__.py") or name.startswith("python") else name


class _Parser(argparse.ArgumentParser):
    """argparse's parser (each subcommand's too) whose usage errors say the close match:
    a misspelt choice (``--execution processes``: "did you mean 'process'?") and a
    misspelt option of a subcommand, refused with that subcommand's usage
    (``manager --listne``: "did you mean --listen?"), not the top-level one."""

    #: More of the description, made only when the help is shown: the console's command
    #: list, from ``runtime.console`` (an import too slow for every command line).
    description_more: Callable[[], str] | None = None

    def format_help(self) -> str:
        if self.description_more is not None:
            self.description = f"{self.description} {self.description_more()}"
            self.description_more = None
        return super().format_help()

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        from runtime.errors import did_you_mean

        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as exc:
            hint = did_you_mean(value, map(str, action.choices or ()))
            raise argparse.ArgumentError(action, exc.message + hint) from None

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> argparse.Namespace:
        from runtime.errors import did_you_mean

        parsed: argparse.Namespace
        parsed, extras = self.parse_known_args(args, namespace)
        if not extras:
            return parsed
        commands = next(
            (a.choices for a in self._actions if isinstance(a, argparse._SubParsersAction)),
            None,
        )
        command = getattr(parsed, "command", None)
        target: argparse.ArgumentParser = (
            commands.get(command, self) if commands and command else self
        )
        options = [s for a in target._actions for s in a.option_strings if s.startswith("--")]
        hints = "".join(
            did_you_mean(word.partition("=")[0], options)
            for word in extras
            if word.startswith("--")
        )
        target.error(f"unrecognized arguments: {' '.join(extras)}{hints}")


def build_parser(prog: str = MODULE_PROG) -> argparse.ArgumentParser:
    """The parser of ``python -m runtime`` (``prog``: the name it was invoked as, which
    its usage lines and help show)."""
    common = _Parser(add_help=False)
    common.add_argument(
        "--log-level",
        type=_level,
        default=argparse.SUPPRESS,
        metavar="LEVEL",
        help="log Corral's records at LEVEL and above to stderr "
        "(debug, info, warning, error, critical; default: warning; error in the console)",
    )

    parser = _Parser(
        prog=prog,
        usage="%(prog)s [-h] [--version] [--log-level LEVEL] [COMMAND] [OPTIONS]",
        description="Corral: run task graphs on workers that come and go. "
        "With no command, runs `demo`.",
        epilog=f"Run `{prog} demo --help` for the demo's options.",
        parents=[common],
    )
    parser.add_argument(
        "--version", action="store_true", help="print the versions, as the version command does"
    )
    # No ``set_defaults(log_level=...)`` here: the subcommands share the ``common``
    # action, so a default set on it would overwrite a ``--log-level`` given before the
    # command; ``main`` falls back to warning instead.
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND", prog=prog)

    from actors.host import host_cpus  # (not actors.worker: a second to import)

    cpus = host_cpus() or 1
    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="run a demo workflow (a physics skim on synthetic events) in-process",
        description="Run a physics skim on synthetic collision events on an in-process "
        "Corral cluster: per dataset, load -> transform (invariant mass, cut) per chunk, "
        "a tree of histogram tasks, then one merge of all datasets. Shows live progress "
        "and a summary per task category.",
    )
    size = demo.add_argument_group("workflow size")
    size.add_argument(
        "--datasets",
        type=int,
        default=4,
        metavar="N",
        help="homogeneous subgraphs, one per dataset (default: 4)",
    )
    size.add_argument(
        "--chunks", type=int, default=48, metavar="N", help="chunks per dataset (default: 48)"
    )
    size.add_argument(
        "--events", type=int, default=10_000, metavar="N", help="events per chunk (default: 10000)"
    )
    size.add_argument(
        "--fan-in",
        type=int,
        default=8,
        metavar="N",
        help="inputs per histogram task of the reduction tree (default: 8)",
    )
    size.add_argument(
        "--seed", type=int, default=0, help="random seed of the synthetic events (default: 0)"
    )
    run = demo.add_argument_group("cluster")
    run.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="run N worker processes on this machine, joined over loopback websockets "
        f"(default: no processes; {cpus} in-process workers, one per core)",
    )
    run.add_argument(
        "--threads", type=int, default=1, metavar="N", help="threads per worker (default: 1)"
    )
    out = demo.add_argument_group("output")
    out.add_argument(
        "--no-progress", action="store_true", help="do not show the live progress display"
    )
    _monitoring_options(out, prog, "<time>-<id>-demo")
    out.add_argument(
        "--keep-runs",
        type=int,
        default=DEMO_RUNS_KEPT,
        metavar="N",
        help="each run makes a run directory (~/.corral/runs/<time>-<id>-demo): keep the "
        f"newest N of the demo's, removing older ones after a run (default: {DEMO_RUNS_KEPT}; "
        "0 keeps all). A manager's runs and a --monitoring PATH are never removed",
    )
    out.add_argument(
        "--check",
        action="store_true",
        help="also compute the graph with dask's synchronous scheduler and "
        "fail unless the results are identical",
    )

    mgr = sub.add_parser(
        "manager",
        parents=[common],
        help="run a manager process that workers, clients and consoles join",
        description="Run the control plane (scheduler, file registry, manager) and a "
        f"websocket gateway. Workers join with `{prog} worker ws://HOST:PORT`, "
        "clients with Cluster('ws://HOST:PORT'). Stops gracefully on SIGINT/SIGTERM/SIGHUP.",
    )
    mgr.add_argument(
        "--listen",
        default="127.0.0.1:8786",
        metavar="HOST:PORT",
        help="address to listen on (default: 127.0.0.1:8786; port 0 picks a free one)",
    )
    mgr.add_argument(
        "--token-file",
        metavar="PATH",
        help="where to write the cluster tokens (mode 0600; default: "
        "~/.corral/tokens/HOST_PORT.json, where local workers and consoles look)",
    )
    mgr.add_argument(
        "--keep-tokens",
        action="store_true",
        help="take up the admin, read, submit and worker tokens of its token file when it is there "
        "(the manager's own, mode 0600), instead of making new ones at each start: "
        "workers, clients and Prometheus holding copies keep working across a restart; "
        "remove the file to rotate them (docs/security.md#keeping-tokens-across-restarts)",
    )
    mgr.add_argument(
        "--config",
        metavar="PATH",
        help="a TOML file of pools ([pools.NAME] tables: provider local or slurm, "
        "min/max/init blocks, block shape, ...; docs/configuration.md#pools): the "
        "manager then starts and scales their workers itself; of alert rules "
        "([[alerts]] tables, [alerting] settings; docs/monitoring.md); of the "
        "policies it starts with ([policies]: one key per kind; docs/configuration.md#policies); "
        "and of the scheduler's settings ([scheduler]; the flags below override it)",
    )
    mgr.add_argument(
        "--alertmanager",
        metavar="URL",
        help="send firing and resolved alerts to the Alertmanager at URL (e.g. "
        "http://127.0.0.1:9093; overrides [alerting] alertmanager in --config)",
    )
    mgr.add_argument(
        "--prune-depth",
        type=int,
        default=None,  # 1, or [scheduler] prune_depth of --config
        metavar="N",
        help="drop an output from the workers once the tasks that read it are done (1, "
        "the default, or --config's [scheduler] prune_depth), once their readers are done "
        "too (2), ...; 0 never "
        "(docs/files.md#pruning-depth)",
    )
    mgr.add_argument(
        "--long-task",
        type=float,
        default=None,  # 1, or [scheduler] long_task of --config
        metavar="SECONDS",
        help="a task expected to run this long or longer (its category's mean duration) "
        "goes only to a worker with a core free of tasks (default: 1, or --config's "
        "[scheduler] long_task; inf: none by its duration; docs/configuration.md#scheduler)",
    )
    mgr.add_argument(
        "--unknown-long",
        action=argparse.BooleanOptionalAction,
        default=None,  # on, or [scheduler] unknown_long of --config
        help="count a task of a category with no finished try as long, as above "
        "(default); --no-unknown-long counts it as short, so a worker takes up to "
        "saturation tasks per core of new categories (graphs of nearly one category per "
        "task); either wins over --config's [scheduler] unknown_long",
    )
    _policy_module_option(
        mgr, "before the manager starts, so that the policies it registers "
        "(policies.register) can be set by clients and named in --config's [policies]"
    )  # fmt: skip
    mgr.add_argument(
        "--worker-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="count a worker silent for longer than this as lost (default: 10). A task "
        "that holds Python's GIL (one long call into compiled code) silences its worker "
        "meanwhile: raise this above its longest such call, or run it with execution "
        "'process' (docs/deployment.md#when-workers-come-and-go)",
    )
    mgr.add_argument(
        "--reconnect-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="hold the id (and the work) of a worker whose connection dropped this long "
        "for it to rejoin before counting it lost and retrying its tasks elsewhere "
        "(default: 10). Raise it for networks that drop connections for longer "
        "(docs/deployment.md#when-workers-come-and-go)",
    )
    mgr.add_argument(
        "--client-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="drop a client or console silent for longer than this (default: 120; never "
        "less than --worker-timeout). A client's heartbeats stop while its own code holds "
        "its event loop (building or hashing a large graph): raise this above the "
        "longest such stretch (docs/deployment.md#when-workers-come-and-go)",
    )
    mgr.add_argument(
        "--gc-threshold",
        type=int,
        default=50_000,
        metavar="N",
        help="run Python's garbage collector after N new container objects instead of "
        "its 700 (default: 50000): full collections over a large run's objects hold the "
        "manager's event loop, for seconds at 100,000s of tasks (docs/deployment.md)",
    )
    mgr.add_argument(
        "--metrics-listen",
        metavar="HOST:PORT",
        help="also serve Prometheus metrics (GET /metrics) on HOST:PORT without a token "
        "(default: only on the manager's own address, with the read or admin token; "
        "docs/monitoring.md)",
    )
    _monitoring_options(mgr, prog)
    _tls_options(mgr)
    mgr.add_argument(
        "--monitoring-interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="how often the monitoring database is written (default: 2)",
    )
    mgr.add_argument(
        "--monitoring-keep",
        metavar="DURATION",
        help="keep this much history in the monitoring database, e.g. 7d or 12h (older "
        "rows are deleted every 10 minutes; default: all of it); docs/monitoring.md",
    )
    rep_ = sub.add_parser(
        "report",
        parents=[common],
        help="make an HTML report of a monitoring database",
        description="Make one self-contained HTML file (it opens offline) of a monitoring "
        "database: task timeline per worker, queues and waits per pool, workers and "
        "blocks, memory per worker, durations per category, alerts, a summary "
        "(docs/monitoring.md#report).",
    )
    rep_.add_argument("db", metavar="RUN.db", help="the monitoring database")
    rep_.add_argument(
        "-o", "--output", default="report.html", metavar="PATH",
        help="the HTML file to write (default: report.html); an SQLite file there, the "
        "database itself above all, is refused",
    )  # fmt: skip
    rep_.add_argument(
        "--text", action="store_true",
        help="print the report as plain text to stdout (the summary's tables and the "
        "durations per category: to paste into a chat or a terminal), no plot; writes no "
        "HTML file",
    )  # fmt: skip
    rep_.add_argument(
        "--list", action="store_true",
        help="list the database's runs (id, started, ended, duration, tasks, erred, failed "
        "tries, workers, host, command) and write no report",
    )  # fmt: skip
    rep_.add_argument(
        "--run", default=None, metavar="RUN_ID",
        help="which run of the database (default: the latest, or the one run --since and "
        "--until overlap); --list shows them",
    )  # fmt: skip
    rep_.add_argument(
        "--since", default=None, metavar="TIME",
        help="report only what overlaps the window from TIME: a UTC date and time "
        "(2026-12-05 14:00, 2026-12-05T14:00:30, an ISO time with an offset), a UTC time of "
        "day, today (14:00:30), Unix seconds, +DURATION from the run's start (+90m), or "
        "-DURATION before its end (--since=-1h, with the =: the run's last hour)",
    )  # fmt: skip
    rep_.add_argument(
        "--until", default=None, metavar="TIME",
        help="report only what overlaps the window up to TIME (as --since)",
    )  # fmt: skip
    rep_.add_argument(
        "--last", default=None, metavar="DURATION",
        help="report only the run's last DURATION (1h, 30m): --since=-DURATION; for a run "
        "still going, up to its latest record",
    )  # fmt: skip
    wrk = sub.add_parser(
        "worker",
        parents=[common],
        help="run a worker process that joins a manager",
        description="Join the manager at ADDRESS and run its tasks. The worker listens on "
        "a free port of --host for its peers (they fetch inputs from each other directly; "
        "--port or --port-range to choose it). "
        "Stops gracefully on SIGINT/SIGTERM/SIGHUP: its running tasks go back to the scheduler.",
    )
    wrk.add_argument("address", metavar="ADDRESS", help="the manager, e.g. ws://127.0.0.1:8786")
    wrk.add_argument("--cores", type=int, default=1, metavar="N", help="task threads (default: 1)")
    wrk.add_argument(
        "--memory",
        default="0",
        metavar="SIZE",
        help="memory it offers, e.g. 4GiB (default: the least of the machine's, its "
        "cgroup's limit and, in a Slurm job, the job's memory on the node, or its share: "
        "--memory-share); give each of several workers on one machine its share",
    )
    wrk.add_argument(
        "--memory-share",
        type=int,
        default=1,
        metavar="N",
        help="without --memory: offer 1/N of the machine's memory (or of the less its "
        "cgroup or Slurm job has), as one of N workers sharing it (local and Slurm pools "
        "pass it; default: 1, the whole machine)",
    )
    wrk.add_argument(
        "--disk",
        default="0",
        metavar="SIZE",
        help="disk it offers for outputs on disk (spilled or written), e.g. 20GiB; "
        "default: the free space of its spill directory's file system less a tenth (at most "
        "1 GiB); off: not counted (no disk-aware placement for it)",
    )
    wrk.add_argument(
        "--disk-share",
        type=int,
        default=1,
        metavar="N",
        help="without --disk: offer 1/N of that free space, as one of N workers keeping their "
        "outputs there (local pools pass it; default: 1); the scheduler may give it less while "
        "other workers without --disk keep theirs there too",
    )
    fence = "fraction of --memory"
    wrk.add_argument(
        "--spill", default=None, metavar="F", help=f"spill fence, {fence}, or 'off' (0.6)"
    )
    wrk.add_argument(
        "--throttle", type=float, default=None, metavar="F", help=f"throttle fence, {fence} (0.7)"
    )
    wrk.add_argument(
        "--terminate", default=None, metavar="F", help=f"terminate fence, {fence}, or 'off' (0.95)"
    )
    wrk.add_argument(
        "--execution",
        choices=("thread", "process"),
        default=None,
        help="run tasks in threads (default) or in task processes that can be killed",
    )
    wrk.add_argument("--spill-dir", default=None, metavar="DIR", help="where spill files go")
    wrk.add_argument(
        "--memory-options",
        default=None,
        metavar="JSON",
        help="every memory setting as a JSON object, e.g. '{\"interval\": 0.02}' "
        "(docs/memory.md); the flags above override it",
    )
    wrk.add_argument(
        "--pool", default="default", metavar="NAME", help="its pool (default: default)"
    )
    wrk.add_argument(
        "--accelerator",
        default=None,
        metavar="ID",
        help="pin it to this one accelerator (a GPU's id, e.g. 0, or a MIG UUID): it sets "
        "CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES and ZE_AFFINITY_MASK to ID before any "
        "task runs, for its tasks and task processes; give each worker on a machine its own "
        "(a pool's accelerators key does it for its workers)",
    )
    wrk.add_argument(
        "--host", default="127.0.0.1", help="address its peers reach it on (default: 127.0.0.1)"
    )
    ports = wrk.add_mutually_exclusive_group()
    ports.add_argument(
        "--port",
        type=int,
        default=0,
        metavar="PORT",
        help="the port of --host it listens on for its peers (default: 0, a free one); in "
        "use: exit 1 (AddressInUse)",
    )
    ports.add_argument(
        "--port-range",
        default=None,
        metavar="LO-HI",
        help="listen for its peers on the first free port from LO to HI (for a firewall "
        "that opens only those; several workers on one machine take one each)",
    )
    wrk.add_argument(
        "--token",
        default=None,
        help="the worker token (or the admin token; default: CORRAL_TOKEN, which the worker "
        "takes out of its environment, else the worker entry of the manager's token file on "
        "this machine); ps shows it to every user: prefer --token-file",
    )
    wrk.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="read the worker token (or the admin token) from PATH (mode 0600: one token, or "
        "the manager's own token file, its worker entry, or its admin entry if it has none); "
        "wins over CORRAL_TOKEN; not with --token; read again at each try to reach the "
        "manager (after its restart, the new token)",
    )
    wrk.add_argument(
        "--connect-retry",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="keep trying to reach the manager for this long, when it starts (a manager "
        "not up yet) and each time it loses it (a manager restarting, after a crash or "
        "stopped on purpose), with backoff and a log line per try (default: one try at "
        "start, 10 s after a crash, none after the manager's goodbye: it exits 0)",
    )
    wrk.add_argument(
        "--name",
        default=os.environ.get("CORRAL_WORKER_ID") or None,
        metavar="ID",
        help="its worker id (default: CORRAL_WORKER_ID, which a process provider sets, so "
        "the autoscaler knows the worker's block; else the address it listens on)",
    )
    wrk.add_argument(
        "--deadline",
        type=_deadline,
        # A string: argparse converts it with ``_deadline`` only when ``worker`` is the
        # command, so a stray CORRAL_DEADLINE is a usage error of the worker alone.
        default=os.environ.get("CORRAL_DEADLINE") or None,
        metavar="EPOCH",
        help="when its walltime ends (seconds since the epoch; default: CORRAL_DEADLINE, "
        "which a Slurm block's script sets): the worker is drained before it, and a stop "
        "signal within a minute of it is reported as walltime, not preemption",
    )
    wrk.add_argument(
        "--grace",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="time it has between a stop signal and being killed (default 5): it copies "
        "outputs other workers still need in all but the last second of it",
    )
    _tls_options(wrk)

    con = sub.add_parser(
        "console",
        parents=[common],
        usage="%(prog)s [-h] [--log-level LEVEL] [--token TOKEN | --token-file PATH] "
        "[--read-only] [--json] [--name NAME] [--tls-ca FILE] ADDRESS [COMMAND ...]",
        help="the control console of a running manager (a shell, or one command)",
        description="Look at and steer the cluster whose manager listens at ADDRESS. "
        "Without COMMAND: an interactive shell (history, tab completion; `help` lists the "
        "commands). With one (e.g. `status`, `tasks --state erred`, `drain WORKER`): run "
        "it once and exit (1 on error).",
    )
    con.description_more = _console_commands
    # Optional to argparse, so that a console with nothing after it is told the one
    # argument it lacks: with REMAINDER after it, argparse calls COMMAND required too.
    con.add_argument(
        "address", metavar="ADDRESS", nargs="?", help="the manager, e.g. ws://127.0.0.1:8786"
    )
    con.set_defaults(usage_error=con.error)
    con.add_argument(
        "--token",
        default=None,
        help="the token (default: CORRAL_TOKEN or the manager's token file on this machine); "
        "ps shows it to every user: prefer --token-file",
    )
    con.add_argument(
        "--token-file",
        default=None,
        metavar="PATH",
        help="read the token from PATH (mode 0600: one token, or the manager's own token "
        "file, whose read entry --read-only takes); wins over CORRAL_TOKEN; not with --token",
    )
    con.add_argument(
        "--read-only",
        action="store_true",
        help="use the read-only token of the token file (look, do not change)",
    )
    con.add_argument("--json", action="store_true", help="print JSON instead of tables")
    con.add_argument(
        "--name",
        default=None,
        help="who operates, as a policy change's records show it (`by console:NAME`): 1 to "
        "40 letters, digits, '.', '_' or '-' (default: your user name, as a client's)",
    )
    _tls_options(con, serves=False)
    con.add_argument(
        "words", nargs=argparse.REMAINDER, metavar="COMMAND", help="a command to run once"
    )

    chk = sub.add_parser(
        "check",
        parents=[common],
        help="check a pools file before submitting anything (Slurm, versions, disk)",
        description="Pre-flight check of the pools in --config, before anything is "
        "submitted: the batch system answers; each Slurm pool's partition exists and is "
        "up; Slurm accepts a block of the pool (sbatch --test-only: account, QOS, "
        "limits); a short probe job per pool (a local pool: a subprocess) reports the "
        "Python, Corral and dask versions the workers would run, which must match this "
        "manager's; the run, spill and output directories exist or can be created and "
        "have room; the [policies] table is what the manager accepts (a policy that is "
        "not built in needs --policy-module); the [alerting] alertmanager URL answers "
        "(GET URL/-/ready, 3 s at most). Prints PASS / WARN / FAIL per check with "
        "what to do; exit 1 when a check fails.",
    )
    chk.add_argument("--config", required=True, metavar="PATH", help="the TOML file of pools")
    chk.add_argument("--json", action="store_true", help="print the results as JSON")
    chk.add_argument(
        "--no-probe", action="store_true", help="do not run probe jobs (nor local probes)"
    )
    chk.add_argument(
        "--probe-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="how long to wait for the probe jobs (default: 300); then they are cancelled",
    )
    chk.add_argument(
        "--run-dir",
        default=None,
        metavar="DIR",
        help="where the manager keeps Slurm scripts and job output (default: ./corral-slurm)",
    )
    chk.add_argument(
        "--spill-dir",
        default=None,
        metavar="DIR",
        help="where workers spill (default: the system's temporary directory): checked "
        "for every pool but one with a spill_dir of its own, checked apart",
    )
    chk.add_argument(
        "--output-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a directory the run writes its outputs to (repeatable)",
    )
    _policy_module_option(
        chk, "before checking --config's [policies], as the manager does: a policy it "
        "registers can then be checked (without it, a name that is not built in cannot be)"
    )  # fmt: skip

    sub.add_parser(
        "version",
        parents=[common],
        help="print the versions of Corral, Python and dask",
    )
    return parser


def _console_commands() -> str:
    """``Commands: ...`` of ``console --help``: those the shell's ``help`` lists."""
    from runtime.console import command_forms

    return f"Commands: {', '.join(command_forms())}."


def _policy_module_option(parser: argparse.ArgumentParser, why: str) -> None:
    """``--policy-module``, the same for the manager and the check: imported by
    :func:`_import_policy_module`."""
    parser.add_argument(
        "--policy-module",
        action="append",
        default=[],
        metavar="MODULE",
        help=f"import MODULE (a dotted name on sys.path: the working directory and "
        f"PYTHONPATH; or a path to a .py file) {why}; repeatable "
        "(docs/policies.md#writing-and-registering-your-own)",
    )


def _with_default_command(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``demo`` is the default command: insert it unless a command (or a request for the
    top-level help) is already there. A first word that is no option and no command
    (after a ``--log-level LEVEL``) is an unknown command: a usage error (exit 2)
    listing the commands, not an unknown argument of the demo."""
    if any(a in COMMANDS for a in argv) or any(a in ("-h", "--help") for a in argv):
        return argv
    first = (
        2
        if argv[:1] == ["--log-level"]
        else 1
        if argv[:1] and argv[0].startswith("--log-level=")
        else 0
    )
    if argv[first : first + 1] == ["--version"]:  # `corral --version`: the version command
        return argv
    if first < len(argv) and not argv[first].startswith("-"):
        parser.error(
            f"unknown command {argv[first]!r}; the commands are {', '.join(COMMANDS)} "
            f"(`{parser.prog} --help` says what each does)"
        )
    return ["demo", *argv]


def _one_line(exc: BaseException) -> str:
    """``Type: message (notes)`` on one line, from the innermost single exception."""
    exc = _innermost(exc)
    text = " ".join(str(exc).split()) or "(no message)"
    notes = " ".join(" ".join(n.split()) for n in getattr(exc, "__notes__", ()))
    return f"{type(exc).__name__}: {text}" + (f" {notes}" if notes else "")


def _cmd_version(args: argparse.Namespace) -> int:
    import platform

    import dask

    from runtime import __version__
    from runtime.messages import PROTOCOL_VERSION

    # The protocol version tells two checkouts of one release apart (deployment.md,
    # Upgrading Corral): a manager serves only workers, clients and consoles of its own.
    print(
        f"corral {__version__} (protocol {PROTOCOL_VERSION}, Python "
        f"{platform.python_version()}, dask {dask.__version__})"
    )
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    import anyio
    from rich.console import Console

    from actors.worker import host_cpus
    from runtime.demo import (
        DemoConfig,
        check_against_dask,
        demo_run_path,
        prune_demo_runs,
        render_summary,
        run_demo,
    )

    try:
        cfg = DemoConfig(args.datasets, args.chunks, args.events, args.fan_in, args.seed)
        processes = args.workers is not None
        workers = args.workers if processes else (host_cpus() or 1)
        if workers < 1 or args.threads < 1:
            raise ValueError("--workers and --threads must be at least 1")
        if args.keep_runs < 0:
            raise ValueError(
                f"--keep-runs must be >= 0 (the demo runs kept; 0 keeps all), got {args.keep_runs}"
            )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = Console()
    progress = None if args.no_progress else Console(stderr=True)
    own_run = not args.monitoring and not args.no_monitoring  #: a run directory of its own
    monitoring = demo_run_path() if own_run else _monitoring_path(args)

    async def go() -> Any:
        return await run_demo(
            cfg,
            workers=workers,
            threads=args.threads,
            progress_console=progress,
            processes=processes,
            monitoring=monitoring,
        )

    run = anyio.run(go, backend="asyncio")
    if own_run and args.keep_runs:  # after a run that finished: it is one of those kept
        run.runs_removed = len(prune_demo_runs(monitoring, args.keep_runs))
        run.runs_kept = args.keep_runs
    render_summary(run, out)
    if args.check:
        check_against_dask(run.graph, run.final, run.result)
        out.print("check: result identical to dask.compute(..., scheduler='sync')")
    return 0


def _monitoring_path(args: argparse.Namespace) -> Any:
    """The monitoring database of a demo or manager: ``--monitoring PATH`` (made
    absolute: the report command printed with it works from any directory, also for a
    manager started elsewhere, under systemd), none with ``--no-monitoring``, else a new
    run directory."""
    if args.no_monitoring:
        return None
    from pathlib import Path

    from runtime.monitordb import default_path

    return Path(args.monitoring).absolute() if args.monitoring else default_path()


def _cmd_manager(args: argparse.Namespace) -> int:
    from pathlib import Path

    import anyio

    from actors.pools import load_config, load_policies, load_scheduler
    from policies import REGISTRY
    from runtime.monitor import alerting_config, load_alerting
    from runtime.node import (
        Gateway,
        Tokens,
        check_client_timeout,
        check_gc_threshold,
        check_reconnect_timeout,
        check_worker_timeout,
        run_manager,
        warn_ignored_settings,
    )

    # Every option is checked before anything starts (run_manager checks the rest:
    # --prune-depth, --long-task, --listen, --metrics-listen); the monitoring database is only made,
    # and printed, once the manager listens: one that cannot start leaves no run behind.
    check_worker_timeout(args.worker_timeout, "--worker-timeout")
    check_client_timeout(args.client_timeout, "--client-timeout")
    check_reconnect_timeout(args.reconnect_timeout, "--reconnect-timeout")
    check_gc_threshold(args.gc_threshold, "--gc-threshold")
    if args.monitoring_interval <= 0:
        raise ValueError("--monitoring-interval must be positive")
    keep = None
    if args.monitoring_keep is not None:
        from actors.alerts_state import parse_duration, typed_duration

        try:
            keep = parse_duration(typed_duration(args.monitoring_keep))
        except ValueError as exc:
            raise ValueError(f"--monitoring-keep {args.monitoring_keep!r}: {exc}") from None
        if keep <= 0:
            raise ValueError(f"--monitoring-keep {args.monitoring_keep!r}: a positive duration")
    listen = args.listen if "://" in args.listen else f"ws://{args.listen}"
    _apply_tls(args, listen, f"--listen {args.listen} is not wss://")
    token_file = Path(args.token_file) if args.token_file else None
    for module in args.policy_module:  # their policies.register calls run now
        _import_policy_module(module)
    pools = load_config(args.config) if args.config else None  # refused before it starts
    scheduler = load_scheduler(args.config) if args.config else {}
    policies = None
    if args.config:  # its [policies], once the --policy-module ones are registered
        policies = load_policies(args.config, REGISTRY)
        alerting = load_alerting(args.config, alertmanager=args.alertmanager)
        warn_ignored_settings(args.config, pools or {}, policies)
    else:
        alerting = alerting_config(alertmanager=args.alertmanager)
    monitoring = _monitoring_path(args)  # a path: nothing is created yet

    gateways: list[Gateway] = []  # its token file, known once it is written
    writers: list[MonitorWriter] = []  # its monitoring database's, once it is open

    def ready(address: str, tokens: Tokens) -> None:
        if monitoring is not None:
            print(f"monitoring database: {monitoring}", flush=True)
            upgraded = writers[0].upgraded if writers else None
            if upgraded is not None:
                print(f"  {_upgraded_line(upgraded)}", flush=True)
            print(f"  report: {args.prog} report {monitoring} -o report.html", flush=True)
            print(f"  {_history_kept(args.monitoring_keep)}", flush=True)
            removed = []
            if keep is not None and not args.monitoring:
                # a run directory per start: the ended ones older than the history kept go
                from runtime.monitordb import prune_runs

                removed = prune_runs(monitoring, keep)
            if removed:
                dirs = "directory" if len(removed) == 1 else "directories"
                print(
                    f"  removed {len(removed)} ended run {dirs} older than "
                    f"{args.monitoring_keep} under {monitoring.parent.parent}",
                    flush=True,
                )
        # On stdout, as a worker's join line: an informational line, not a warning record.
        print(f"manager listening on {address}", flush=True)
        if gateways and gateways[0].token_file:
            print(f"  token file: {gateways[0].token_file}", flush=True)
        if address.startswith(("ws://", "wss://")):
            from runtime.dashboard import dashboard_url

            print(f"dashboard on {dashboard_url(address, tokens.read)}", flush=True)

    def metrics_ready(url: str) -> None:
        print(f"metrics on {url}", flush=True)

    anyio.run(
        lambda: run_manager(
            args.listen, token_file=token_file, ready=ready, config=pools, policies=policies,
            metrics_listen=args.metrics_listen, metrics_ready=metrics_ready, alerting=alerting,
            monitoring=monitoring, monitoring_interval=args.monitoring_interval,
            monitoring_keep=keep, prune_depth=args.prune_depth, long_task=args.long_task,
            unknown_long=args.unknown_long,
            worker_timeout=args.worker_timeout, client_timeout=args.client_timeout,
            reconnect_timeout=args.reconnect_timeout, keep_tokens=args.keep_tokens,
            on_gateway=gateways.append, on_monitoring=writers.append, scheduler=scheduler,
            config_file=args.config,
            sources=_manager_sources(args), gc_threshold=args.gc_threshold,
        ),
        backend="asyncio",
    )  # fmt: skip
    return 0


def _upgraded_line(upgraded: Upgraded) -> str:
    """The manager's line under its monitoring database's path when it upgraded an older
    file in place: from which version, and the copy kept of it as it was."""
    from runtime.monitordb import SCHEMA_VERSION

    return (
        f"upgraded from schema {upgraded.was} to {SCHEMA_VERSION}; the file as it was: "
        f"{upgraded.copy} (an older Corral reads that copy)"
    )


def _history_kept(keep: str | None) -> str:
    """The manager's third start line about its monitoring database: how much history
    it keeps (``--monitoring-keep``, as given), and, keeping all of it, that it grows
    for as long as the manager runs and how to bound it."""
    if keep is not None:
        return f"history kept: {keep} (older rows deleted every 10 minutes)"
    return (
        "history kept: all of it (about 0.5 KB a task, for as long as the manager runs); "
        "--monitoring-keep DURATION, e.g. 7d, bounds it"
    )


#: the manager's flags of each setting its configuration shows (``manager.KEY``,
#: ``scheduler.KEY``, ``alerting.KEY``), by its argparse name
_MANAGER_FLAGS = {
    "config": "manager.config", "listen": "manager.listen",
    "token_file": "manager.token_file", "keep_tokens": "manager.keep_tokens",
    "metrics_listen": "manager.metrics_listen", "worker_timeout": "manager.worker_timeout",
    "client_timeout": "manager.client_timeout",
    "reconnect_timeout": "manager.reconnect_timeout", "monitoring": "manager.monitoring",
    "no_monitoring": "manager.monitoring", "monitoring_interval": "manager.monitoring_interval",
    "monitoring_keep": "manager.monitoring_keep", "tls_cert": "manager.tls_cert",
    "tls_key": "manager.tls_key", "tls_ca": "manager.tls_ca",
    "prune_depth": "scheduler.prune_depth", "long_task": "scheduler.long_task",
    "unknown_long": "scheduler.unknown_long", "alertmanager": "alerting.alertmanager",
    "gc_threshold": "manager.gc_threshold",
}  # fmt: skip


def _manager_sources(args: argparse.Namespace) -> dict[str, str]:
    """Where the manager's settings not at their default came from (the configuration
    it logs and shows: ``runtime.settings``): ``flag --NAME`` for each flag whose value
    is not its default, ``env NAME`` for a setting a variable gave (the token file's and
    the monitoring database's directory, the TLS files)."""
    from transport.tls import TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV

    defaults = vars(build_parser(args.prog).parse_args(["manager"]))
    out = {}
    for name, setting in _MANAGER_FLAGS.items():
        if getattr(args, name, None) != defaults.get(name):
            negated = getattr(args, name) is False and name == "unknown_long"
            out[setting] = f"flag --{'no-' if negated else ''}{name.replace('_', '-')}"
    envs = {
        "manager.token_file": ["CORRAL_HOME"],
        "manager.monitoring": ["CORRAL_RUNS_DIR", "CORRAL_HOME"],
        "manager.tls_cert": [TLS_CERT_ENV], "manager.tls_key": [TLS_KEY_ENV],
        "manager.tls_ca": [TLS_CA_ENV],
    }  # fmt: skip
    for setting, names in envs.items():
        variable = next((n for n in names if os.environ.get(n)), None)
        if variable is not None and setting not in out:
            out[setting] = f"env {variable}"
    return out


def _import_policy_module(spec: str) -> None:
    """Import ``--policy-module`` ``spec``: a dotted module name, or the path of a
    ``.py`` file, imported under a private name of its own
    (``_corral_policy_module_<stem>_<hash of its path>``), so that a file named like a
    module Corral imports (``policies.py``) does not replace it. ``ImportError`` naming
    the module and what its import raised, if it raised anything."""
    import hashlib
    import importlib
    import importlib.util
    import re
    from pathlib import Path

    path = Path(spec)
    try:
        if spec.endswith(".py") or os.sep in spec:
            digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:10]
            stem = re.sub(r"\W", "_", path.stem)
            name = f"_corral_policy_module_{stem}_{digest}"
            found = importlib.util.spec_from_file_location(name, path)
            if found is None or found.loader is None:
                raise ImportError(f"{spec} is not a Python file")
            module = importlib.util.module_from_spec(found)
            sys.modules[name] = module
            try:
                found.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        else:
            importlib.import_module(spec)
    except Exception as exc:
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name and spec.startswith(exc.name):
            hint = (
                ". A module name is looked up on the manager's sys.path (its working "
                "directory and PYTHONPATH): add the module's directory to PYTHONPATH, or "
                "give the path of its .py file"
            )
        elif isinstance(exc, FileNotFoundError):
            hint = ". Give the path of an existing .py file, or an importable module name"
        raise ImportError(
            f"--policy-module {spec!r} could not be imported: {type(exc).__name__}: {exc}{hint}",
            name=spec,
        ) from exc


def _cmd_report(args: argparse.Namespace) -> int:
    from runtime.report import build_report, format_runs, list_runs, write_report

    if args.last is not None and args.since is not None:
        raise ValueError(
            f"--last {args.last} is --since=-{args.last}: give one of --last and --since"
        )
    if args.list:
        chosen = [f for f, v in (("--run", args.run), ("--since", args.since),
                                 ("--last", args.last), ("--until", args.until),
                                 ("--text", args.text or None))
                  if v is not None]  # fmt: skip
        if chosen:
            raise ValueError(
                f"--list lists every run and writes no report: leave out {' and '.join(chosen)}, "
                "or --list to write the report"
            )
        print(format_runs(list_runs(args.db)), flush=True)
        return 0

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    since = args.since if args.last is None else f"-{args.last.strip()}"
    if args.text:
        text = build_report(
            args.db, run_id=args.run, since=since, until=args.until, progress=progress, text=True
        )
        print(text, end="", flush=True)
        return 0
    out = write_report(
        args.db, args.output, run_id=args.run, since=since, until=args.until,
        progress=progress,
    )  # fmt: skip
    # on stderr, as the progress: with -o /dev/stdout the report itself is on stdout
    print(f"report written to {out}", file=sys.stderr)
    return 0


def _memory_share(n: int) -> MemoryLimit:
    """The memory limit of a worker given no ``--memory``, one of ``n`` sharing this
    machine (``--memory-share n``): 1/``n`` of the least of the machine's memory, its
    cgroup's limit and a Slurm job's memory on this node (:func:`actors.host.memory_limit`,
    which says where it came from); a :class:`MemoryConfigError` saying what to do
    when it is under a worker's least."""
    from actors.host import memory_limit
    from actors.memory import MIN_LIMIT
    from actors.worker import host_identity
    from runtime.errors import MemoryConfigError

    found = memory_limit(n, machine=host_identity()[1])
    if found.limit < MIN_LIMIT:
        raise MemoryConfigError(
            f"--memory-share {n}: 1/{n} of {found.source} is {found.limit // 2**20} MiB, "
            f"under a worker's least ({MIN_LIMIT // 2**20} MiB); run fewer workers here (a "
            "local pool's max_blocks or workers_per_node) or give each a --memory "
            "(memory_per_worker)"
        )
    return found


def _check_deadline(deadline: float, now: float) -> None:
    """``ValueError`` for a ``--deadline`` that is not a time to come (at least a second
    ahead of ``now``): the worker would join only to retire at once and exit 0. A
    duration given where the epoch time belongs (``--deadline 3600``) is the likely
    mistake, and the message says how to write one."""
    if not math.isfinite(deadline):
        raise ValueError(
            f"--deadline must be a time, in seconds since the epoch, got {deadline}; "
            "leave it out for a worker without a walltime"
        )
    if deadline >= now + 1:
        return
    try:
        when = datetime.datetime.fromtimestamp(deadline, datetime.UTC)
        date = f"{when:%Y-%m-%d %H:%M:%S} UTC, "
    except (OverflowError, ValueError, OSError):  # out of the calendar's range
        date = ""
    ago = f"{now - deadline:,.0f} s ago" if deadline <= now else "under a second from now"
    raise ValueError(
        f"--deadline {deadline:.0f} (or CORRAL_DEADLINE) is {date}{ago}: the worker would "
        "retire as it joined. It is the time its walltime ends, in seconds since the "
        "epoch, not a duration: for an hour from now pass "
        "--deadline $(( $(date +%s) + 3600 ))"
    )


def _check_worker_name(name: str | None) -> None:
    """``worker --name``: None (the default id) or 1 to ``MAX_NAME`` characters, not all
    blank, as the manager takes a worker's ``Hello`` (refused here, before it connects)."""
    from runtime.node import MAX_NAME

    if name is None:
        return
    if not name.strip():
        raise ValueError(
            f"--name must name the worker, got {name!r}; leave it out for the default id "
            "($CORRAL_WORKER_ID, else the address it listens on)"
        )
    if len(name) > MAX_NAME:
        raise ValueError(
            f"--name must be at most {MAX_NAME} characters (the manager refuses a longer "
            f"worker id), got {len(name)}: {name[:40]!r}..."
        )


def _pin_accelerator(device: str) -> None:
    """``worker --accelerator ID``: this process (and the task processes it starts) see
    only the accelerator ``ID`` (:func:`~actors.providers.accelerator_env`), set before
    any task runs; ``ValueError`` for an empty or blank ``ID``."""
    from actors.providers import accelerator_env

    if not device.strip() or device != device.strip():
        raise ValueError(
            f"--accelerator must name one device, e.g. --accelerator 0 (or a MIG UUID), got "
            f"{device!r}; leave it out for a worker that sees every device"
        )
    os.environ.update(accelerator_env(device))


def _cmd_worker(args: argparse.Namespace) -> int:
    from runtime.errors import MemoryConfigError, PermissionDenied
    from runtime.packages import working_directory_last

    working_directory_last()  # started with -P (worker_argv): task modules there load

    if args.cores < 1:
        raise ValueError("--cores must be at least 1")
    from actors.memory import limit_too_small
    from runtime.client import parse_bytes

    memory = parse_bytes(args.memory)
    if memory < 0:  # named here: 0 is allowed (the machine's memory)
        raise MemoryConfigError(
            f"--memory must be >= 0 (0: the default, the machine's memory or less), got "
            f"{args.memory!r}"
        )
    too_small = limit_too_small(args.memory, memory)
    if too_small:
        raise MemoryConfigError(f"--memory {args.memory} {too_small}")
    if args.memory_share < 1:
        raise MemoryConfigError(
            f"--memory-share must be a whole number >= 1 (the workers sharing this "
            f"machine's memory), got {args.memory_share}"
        )
    found = None  # the least of the machine's, its cgroup's and its Slurm job's
    if not memory:
        found = _memory_share(args.memory_share)
        args.memory = str(found.limit)
    if args.disk != "off" and parse_bytes(args.disk) < 0:
        raise ValueError(f"--disk must be >= 0 or 'off', got {args.disk!r}")
    if args.disk_share < 1:
        raise ValueError(
            f"--disk-share must be a whole number >= 1 (the workers keeping their outputs on "
            f"this file system), got {args.disk_share}"
        )
    from runtime.node import check_worker_pool

    check_worker_pool(args.pool, "--pool", "--pool gpu")
    _check_worker_name(args.name)
    if not args.grace >= 0:  # NaN too
        raise ValueError(
            f"--grace must be >= 0 (the seconds between a stop signal and being killed), "
            f"got {args.grace:g}"
        )
    if args.deadline is not None:
        _check_deadline(args.deadline, time.time())
    if args.accelerator is not None:
        _pin_accelerator(args.accelerator)
    args.peer_port = _peer_port(args.port, args.port_range)
    _apply_tls(args, args.address, f"the manager's address {args.address} is not wss://")
    memory_options = _memory_options(args)
    if not args.connect_retry >= 0:  # NaN too
        raise ValueError(
            f"--connect-retry must be >= 0 (the seconds it keeps trying to reach the "
            f"manager), got {args.connect_retry:g}"
        )
    if args.token_file is not None:  # read now: a bad file stops it before it starts
        from runtime.node import check_one_token, read_token_file

        check_one_token(args.token, args.token_file)
        if not args.connect_retry:  # (else: tried again until the manager wrote it)
            read_token_file(args.token_file, "worker")

    if found is not None:  # on stdout, as the join line: a Slurm block's .out has it
        print(f"worker memory limit {found.text()}", flush=True)
    accelerator = os.environ.get("CUDA_VISIBLE_DEVICES")
    if accelerator is not None:  # pinned (--accelerator, a pool's accelerators) or given
        print(f"worker accelerator {accelerator} (CUDA_VISIBLE_DEVICES)", flush=True)

    def ready(worker_id: str) -> None:
        print(f"worker {worker_id} joined {args.address}", flush=True)

    def left(worker_id: str, why: str) -> None:
        # On stdout as the join line (shown whatever the log level; the worker
        # processes Corral starts have it logged at info, not at each cluster's close)
        print(f"worker {worker_id} left {args.address}: {why}", flush=True)

    try:
        _run_worker(args, memory_options, ready, left)
    except Exception as exc:
        refused = _innermost(exc)
        if isinstance(refused, PermissionDenied) and getattr(refused, "what", "") == "worker id":
            # Another worker holds this id (docs/deployment.md: names are unique); the
            # refusal says whether it is joined or held for a rejoin, and until when.
            refused.add_note(
                "(Worker names are unique among the manager's workers: wait as said above, "
                "or choose another --name.)"
            )
        raise
    return 0


def _innermost(exc: BaseException) -> BaseException:
    """The exception inside single-exception groups (what ``_one_line`` prints)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _peer_port(port: int, port_range: str | None) -> int | tuple[int, int]:
    """The worker's ``--port`` or ``--port-range LO-HI``, checked: ``ValueError`` before
    it starts for a port out of 1..65535 (0: a free one) or a range that is not one."""
    if port_range is None:
        if not 0 <= port <= 65535:
            raise ValueError(f"--port must be a port from 1 to 65535 (0: a free one), got {port}")
        return port
    from actors.pools import port_range as parse_range

    try:
        return parse_range(port_range)
    except ValueError as exc:
        raise ValueError(f"--port-range takes {exc}") from None


def _run_worker(
    args: argparse.Namespace, memory_options: dict[str, Any], ready: Any, left: Any
) -> None:
    import anyio

    from actors.executor import (
        give_back_freed_memory,
        print_stacks_on_crash,
        stop_resource_tracker,
    )
    from runtime.client import parse_bytes
    from runtime.node import RECONNECT, run_worker

    give_back_freed_memory()  # outputs spilled or sent leave its RSS (docs/memory.md)
    print_stacks_on_crash()  # a task's segfault (thread execution) prints the task's stack
    try:
        anyio.run(
            lambda: run_worker(
                args.address,
                cores=args.cores,
                memory=parse_bytes(args.memory),
                disk=None if args.disk == "off" else parse_bytes(args.disk),
                disk_share=args.disk_share,
                pool=args.pool,
                host=args.host,
                port=args.peer_port,
                token=args.token,
                token_file=args.token_file,
                ready=ready,
                left=left,
                memory_options=memory_options,
                name=args.name,
                deadline=args.deadline,
                grace=args.grace,
                connect_retry=args.connect_retry,
                reconnect=args.connect_retry or RECONNECT,
            ),
            backend="asyncio",
        )
    finally:
        stop_resource_tracker()  # its task processes' (process execution): none is left


def _memory_options(args: argparse.Namespace) -> dict[str, Any]:
    """The worker's memory settings from --memory-options and the flags."""
    import json

    from runtime.errors import MemoryConfigError

    options: dict[str, Any] = {}
    if args.memory_options:
        try:
            options = json.loads(args.memory_options)
        except ValueError as exc:
            raise MemoryConfigError(f"--memory-options is not JSON ({exc})") from None
        if not isinstance(options, dict):
            raise MemoryConfigError("--memory-options must be a JSON object")

    def fence(text: str | None, name: str) -> None:
        if text is None:
            return
        if text == "off":
            options[name] = None
            return
        try:
            options[name] = float(text)
        except ValueError:
            raise MemoryConfigError(f"--{name} must be a fraction or 'off', got {text!r}") from None

    fence(args.spill, "spill")
    fence(args.terminate, "terminate")
    if args.throttle is not None:
        options["throttle"] = args.throttle
    if args.execution is not None:
        options["execution"] = args.execution
    if args.spill_dir is not None:
        options["spill_dir"] = args.spill_dir
    from actors.memory import MemoryConfig
    from runtime.client import parse_bytes

    MemoryConfig.of(parse_bytes(args.memory) or 1 << 30, options)  # bad settings: now
    return options


def _cmd_check(args: argparse.Namespace) -> int:
    import anyio

    from actors.pools import ignored_settings, load_config, load_policies, load_scheduler
    from policies import REGISTRY
    from runtime.errors import AlertConfigError, PolicyConfigError, PoolConfigError, Refusals
    from runtime.monitor import load_alerting
    from runtime.node import pool_policies
    from runtime.preflight import (
        FAIL,
        WARN,
        CheckResult,
        check_alertmanager,
        check_policies,
        refused,
        run_checks,
    )

    if args.probe_timeout <= 0:
        raise ValueError("--probe-timeout must be more than 0")
    refuse = Refusals(keep=True)  # every section's refusals, each reported: not the first
    try:
        pools = load_config(args.config, refuse)
    except PoolConfigError as exc:  # the file itself: not TOML, not UTF-8, not readable
        if exc.pool or exc.key:
            raise
        # no section of it to check; the directories the flags name still are
        return _check_said(args, refused([exc], args.config) + run_checks({}, **_check_dirs(args)))
    load_scheduler(args.config, refuse)  # each refused [scheduler] key: a FAIL below
    results = []
    try:
        alerting = load_alerting(args.config, refuse=refuse)  # its alert rules and settings
        results += [CheckResult("*", "alert rule", WARN, line) for line in alerting.warnings()]
        results += [
            CheckResult("*", "alert rule", WARN, said, advice)
            for said, advice in alerting.replaced_defaults()
        ]
        if alerting.alertmanager:  # it answers (bounded): a WARN says why not
            results.append(anyio.run(check_alertmanager, alerting.alertmanager))
    except AlertConfigError as exc:
        refuse(exc)

    def progress(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    for module in args.policy_module:  # as the manager: then its [policies] are checked
        try:
            _import_policy_module(module)
        except ImportError as exc:
            results.append(CheckResult("*", "policy module", FAIL, str(exc), _MODULE_ADVICE))
    policies = check_policies(args.config, REGISTRY, args.policy_module, refuse)
    results += refused(refuse.errors, args.config, args.policy_module)
    if pools and not any(isinstance(e, PolicyConfigError) for e in refuse.errors):
        chosen = load_policies(args.config, REGISTRY, Refusals(keep=True))  # (said above)
        scaling = pool_policies(pools, chosen)["scaling"][0]
        results += [
            CheckResult(pool, "scaling", WARN, why, "")
            for pool, why in ignored_settings(args.config, pools, scaling)
        ]
    if policies is not None:
        results.append(policies)
    results += run_checks(
        pools,
        probe=not args.no_probe,
        probe_timeout=args.probe_timeout,
        progress=progress,
        **_check_dirs(args),
    )
    return _check_said(args, results)


def _check_dirs(args: argparse.Namespace) -> dict[str, Any]:
    """The directories ``check``'s flags name, as ``run_checks`` takes them."""
    from pathlib import Path

    return {
        "run_dir": Path(args.run_dir) if args.run_dir else None,
        "spill_dir": Path(args.spill_dir) if args.spill_dir else None,
        "output_dirs": [Path(d) for d in args.output_dir],
    }


def _check_said(args: argparse.Namespace, results: list[Any]) -> int:
    """``check``'s results printed (a table and its summary, or ``--json``); its exit code."""
    import json

    from runtime.preflight import exit_code, render

    code = exit_code(results)
    if args.json:
        print(json.dumps({"ok": code == 0, "results": [r.as_dict() for r in results]}, indent=2))
    else:
        sys.stdout.write(render(results))
    return code


_MODULE_ADVICE = (
    "the manager would stop with this error: fix the module, or give its .py file or a "
    "module name on PYTHONPATH (docs/policies.md#with-a-manager-process)"
)


def _cmd_console(args: argparse.Namespace) -> int:
    """The console's options may also come after the address (``split_cli_options``):
    those win over the ones before it. ``--tls-ca`` is the worker's, refused in the same
    way with a ``ws://`` address, before anything is dialled."""
    from runtime.console import ConsoleError, split_cli_options
    from runtime.console import main as console_main

    if args.address is None:
        args.usage_error(
            "the following argument is required: ADDRESS (the manager's, e.g. "
            "ws://127.0.0.1:8786); COMMAND is optional: without one the console is a shell"
        )
    try:
        words, found = split_cli_options(args.words)
    except ConsoleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    args.tls_ca = found.pop("tls_ca", args.tls_ca)
    _apply_tls(args, args.address, f"the manager's address {args.address} is not wss://")
    options = {
        "token": args.token, "token_file": args.token_file, "read_only": args.read_only,
        "as_json": args.json, "name": args.name,
        "log_level": getattr(args, "log_level", None),  # absent: not given before the address
    }  # fmt: skip
    return console_main(args.address, words, **(options | found))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    parser = build_parser(MODULE_PROG if argv is not None else _prog(sys.argv[0]))
    args = parser.parse_args(
        _with_default_command(parser, list(sys.argv[1:] if argv is None else argv))
    )
    args.prog = parser.prog
    from runtime.log import configure

    configure(getattr(args, "log_level", "WARNING"), stream=_StderrProxy())
    commands = {
        "demo": _cmd_demo,
        "manager": _cmd_manager,
        "worker": _cmd_worker,
        "console": _cmd_console,
        "check": _cmd_check,
        "report": _cmd_report,
        "version": _cmd_version,
    }
    try:
        from runtime.log import json_lines

        json_lines()  # a bad CORRAL_LOG_JSON: said as other bad values are, before it runs
        return commands[args.command or ("version" if args.version else "demo")](args)
    except KeyboardInterrupt:
        # The second Ctrl-C while an embedded cluster's monitoring database caught up
        # (the first one stopped the cluster): drop the rest, counted, and end the run.
        from runtime.monitordb import give_up_all

        with contextlib.suppress(KeyboardInterrupt):  # a third: leave at once
            dropped = give_up_all()
            if dropped is not None:
                print(f"interrupted; monitoring rows dropped: {dropped:,}", file=sys.stderr)
                return 130
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # What stdout went to closed early (`console ADDRESS tasks | head`): end quietly,
        # as cat or grep do, with the status of a death by SIGPIPE (128 + 13); the rest
        # of stdout goes to /dev/null, so the flush at exit finds no broken pipe either.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except Exception as exc:
        if logging.getLogger("corral").isEnabledFor(logging.DEBUG):
            traceback.print_exception(exc)
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
