"""The memory of ``process`` workers under a dask.dataframe pipeline (a user audit).

    python benchmarks/process_floor.py                                   # this tree
    python benchmarks/process_floor.py --trees old=/tmp/old,new=. --repeat 2 --port 23100

A manager and ``--workers`` worker processes (``--execution process --cores 1 --memory
MEMORY``) run ``benchmarks/dataframe.py``'s pipeline (``--partitions`` x ``--rows``
events; four outputs in one ``dask.compute`` through ``runtime.get``) from a client
process, all with ``PYTHONPATH`` at one tree; with several ``--trees`` (``label=path``),
the trees take turns run by run. Every quarter second the RSS of each worker process and
of each of its task processes is sampled (psutil). Per run: whether the pipeline
finished (or the first line of its error), its wall time, and per worker the peak RSS
of the worker process, its RSS at the end (the run over: nothing running, no output
left), the peak of its task processes, the floors it logged (``memory that is not
outputs ... marks moved up``), the tasks killed at the terminate fence, the times it
spared them (``no running task's process grew``) and the task processes replaced for
memory they kept. The results are not compared with dask's (``dataframe.py`` does).

Ports: the manager listens on ``--port``, worker ``i`` on ``--port + 10 + 5 i`` to
``+ 4``. The processes' logs (``--log-level info``) stay under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from runtime.cli_processes import stop_processes

sys.path.insert(0, str(Path(__file__).resolve().parent))

MiB = 2**20
HERE = Path(__file__).resolve().parent

CLIENT = """
import sys, time
sys.path.insert(0, {bench!r})
import cloudpickle, dask, runtime
import dataframe
from dataframe import build
cloudpickle.register_pickle_by_value(dataframe)  # the manager and workers lack it
colls = build({partitions}, {rows}, {users})
t = time.time()
try:
    dask.compute(*colls, scheduler=runtime.get, address={address!r})
    print("ok", round(time.time() - t, 1))
except Exception as exc:
    print("failed", round(time.time() - t, 1), type(exc).__name__ + ": " + str(exc)[:300])
"""


def run(label: str, tree: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One run of the pipeline on a fresh manager and workers importing ``tree``."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, CORRAL_HOME=str(out / "home"), PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = tree
    address = f"ws://127.0.0.1:{args.port}"

    def start(log: str, *argv: str) -> subprocess.Popen[bytes]:
        with open(out / log, "w") as f:
            return subprocess.Popen([sys.executable, "-m", "runtime", *argv], env=env,
                                    cwd=tree, stdout=f, stderr=subprocess.STDOUT)  # fmt: skip

    manager = start("manager.log", "manager", "--listen", f"127.0.0.1:{args.port}",
                    "--log-level", "info", "--no-monitoring")  # fmt: skip
    procs, workers = [manager], []
    try:
        deadline = time.monotonic() + 60
        while "listening on" not in (out / "manager.log").read_text():
            if time.monotonic() > deadline or manager.poll() is not None:
                raise RuntimeError(f"the manager did not start: see {out}/manager.log")
            time.sleep(0.2)
        for i in range(args.workers):
            lo = args.port + 10 + 5 * i
            w = start(f"w{i + 1}.log", "worker", address, "--name", f"w{i + 1}",
                      "--memory", args.memory, "--cores", "1", "--execution", "process",
                      "--port-range", f"{lo}-{lo + 4}", "--spill-dir", str(out / f"spill{i}"),
                      "--log-level", "info", "--connect-retry", "30")  # fmt: skip
            workers.append(w)
            procs.append(w)
        deadline = time.monotonic() + 60
        while not all("joined" in (out / f"w{i + 1}.log").read_text() for i in range(len(workers))):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the workers did not join: see {out}")
            time.sleep(0.2)
        samples: list[list[tuple[int, list[int]]]] = []
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                row = []
                for w in workers:
                    try:
                        p = psutil.Process(w.pid)
                        kids = [k.memory_info().rss for k in p.children()]
                        row.append((p.memory_info().rss, kids))
                    except psutil.Error:
                        row.append((0, []))
                samples.append(row)
                stop.wait(0.25)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = CLIENT.format(bench=str(HERE), partitions=args.partitions, rows=args.rows,
                             users=args.users, address=address)  # fmt: skip
        client = subprocess.run([sys.executable, "-c", code], env=env, cwd=tree,
                                capture_output=True, text=True, timeout=args.timeout)  # fmt: skip
        time.sleep(2.0)  # the end: what the workers keep once the run is over
        stop.set()
        sampler.join()
    finally:
        stop_processes(procs[::-1], grace=20.0)  # the workers first, then the manager
    said = (client.stdout.strip().splitlines() or [client.stderr.strip()[-300:]])[-1]
    per, floor = [], re.compile(r"marks moved up.*?floor=(\d+)")
    for i in range(len(workers)):
        log = (out / f"w{i + 1}.log").read_text()
        own = [row[i][0] for row in samples]
        tasks = [max((k for k in row[i][1] if k > 20 * MiB), default=0) for row in samples]
        per.append({
            "peak": max(own) / MiB, "end": own[-1] / MiB, "task_peak": max(tasks) / MiB,
            "floors": [round(int(f) / MiB) for f in floor.findall(log)],
            "kills": log.count("killed a task past the terminate fence"),
            "spared": log.count("no running task's process grew"),
            "replaced": log.count("task process replaced"),
        })  # fmt: skip
    return {"label": label, "said": said, "workers": per}


def show(r: dict[str, Any]) -> None:
    print(f"{r['label']}: {r['said']}")
    for i, w in enumerate(r["workers"]):
        print(f"  w{i + 1}: worker process peak {w['peak']:.0f} MiB, end {w['end']:.0f} MiB; "
              f"task process peak {w['task_peak']:.0f} MiB; floors {w['floors']} MiB; "
              f"killed {w['kills']}, spared {w['spared']}, replaced {w['replaced']}")  # fmt: skip
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trees", default=f"this={HERE.parent}", help="label=path,...")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--memory", default="500MiB")
    p.add_argument("--partitions", type=int, default=24)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--users", type=int, default=200_000)
    p.add_argument("--port", type=int, default=23100)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--out", default=None, help="where the logs go (default: a temp dir)")
    args = p.parse_args(argv)
    trees = [t.split("=", 1) for t in args.trees.split(",")]
    out = Path(args.out or tempfile.mkdtemp(prefix="process_floor-"))
    print(f"logs under {out}")
    for n in range(args.repeat):
        for label, tree in trees:
            show(run(label, str(Path(tree).resolve()), args, out / f"{label}-{n}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
