"""How long process workers' event loops stall under a dask.array std that spills:
two source trees side by side in one run (say ``main`` and a change), each with its
own manager and 3 workers of ``--execution process --cores 1 --memory 1GiB`` on
127.0.0.1, running ``(x - x.mean(axis=0)).std()`` of a 40000x40000 array in chunks of
5000 (200 MB each), a memprio audit's run, at the same time.

    git archive main | tar -x -C /tmp/old
    python benchmarks/worker_stalls.py --old /tmp/old --new .
    python benchmarks/worker_stalls.py --old /tmp/old --new . --n 20000 --port 35000

Each worker runs under a watchdog: its event loop re-arms faulthandler's timer every
0.1 s, so a loop that did not run for 1 s has every thread's stack dumped (from C:
it works while another thread holds Python's GIL), again each second it lasts.
Printed per tree: how the run ended, the one-second dumps per worker and the frames
they caught most (what held the loop), and the workers' ``event loop blocked``
warnings (5 s or more) with their ``why``. The run may end in TaskOutOfMemory (a
``var`` task past the terminate fence of a 1 GiB worker): the stalls before it count.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WATCH = """
import asyncio, faulthandler, os, runpy, sys
if __name__ == "__main__":
    out = open(os.path.join(os.environ["WATCH_DIR"], f"stall-{os.getpid()}.txt"), "w")
    run = asyncio.BaseEventLoop.run_forever
    def run_forever(self):
        def tick():
            faulthandler.dump_traceback_later(1.0, repeat=True, file=out)
            self.call_later(0.1, tick)
        self.call_soon(tick)
        return run(self)
    asyncio.BaseEventLoop.run_forever = run_forever
    sys.argv = ["runtime", *sys.argv[1:]]
    runpy.run_module("runtime", run_name="__main__")
"""

COMPUTE = """
import sys, time, dask.array as da, runtime
port, n, chunk, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
x = da.random.default_rng(42).random((n, n), chunks=(chunk, chunk))
t = time.time()
try:
    r = (x - x.mean(axis=0)).std().compute(
        scheduler=runtime.get, address=f"ws://127.0.0.1:{port}", token_file=tokens)
    print(f"result {float(r):.6f} in {time.time() - t:.1f} s")
except Exception as e:
    print(f"{type(e).__name__} after {time.time() - t:.1f} s")
"""


def log_fd(path: Path) -> int:
    """A descriptor of ``path``, made empty, for a process's stderr (the caller closes
    it once the process has its own)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)


def start(tree: str, port: int, where: Path, watch: Path) -> list[subprocess.Popen[bytes]]:
    env = {**os.environ, "PYTHONPATH": tree, "WATCH_DIR": str(where)}
    tokens = where / "tokens.json"
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "runtime", "manager", "--listen", f"127.0.0.1:{port}",
             "--token-file", str(tokens), "--no-monitoring"],
            env=env, stdout=subprocess.DEVNULL, stderr=(fd := log_fd(where / "manager.log")),
        )
    ]  # fmt: skip
    os.close(fd)
    deadline = time.monotonic() + 30
    while not tokens.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    for i in (1, 2, 3):
        procs.append(
            subprocess.Popen(
                [sys.executable, str(watch), "worker", f"ws://127.0.0.1:{port}",
                 "--token-file", str(tokens), "--memory", "1GiB", "--execution", "process",
                 "--cores", "1", "--name", f"p{i}", "--host", "127.0.0.1",
                 "--port-range", f"{port + 10}-{port + 40}"],
                env=env, stdout=subprocess.DEVNULL,
                stderr=(fd := log_fd(where / f"worker{i}.log")),
            )
        )  # fmt: skip
        os.close(fd)
    return procs


def frames(dump: str) -> str:
    """The busy threads' top frames of one dump (idle waits left out)."""
    busy = []
    for thread in dump.split("\n\n"):
        lines = [s.strip() for s in thread.splitlines() if s.strip().startswith("File")]
        if not lines:
            continue
        top = re.sub(r'File ".*/([^/]+)", line (\d+) in (\S+)', r"\1:\2 \3", lines[0])
        if not any(idle in top for idle in ("selectors.py", "threading.py", "queue.py")):
            busy.append(top)
    return " + ".join(sorted(busy)) or "(the loop in select: the process had no CPU)"


def report(name: str, where: Path, outcome: str) -> None:
    print(f"== {name}: {outcome.strip()}")
    caught: collections.Counter[str] = collections.Counter()
    counts = []
    for path in sorted(where.glob("stall-*.txt")):
        dumps = path.read_text().split("Timeout (0:00:0")[1:]
        counts.append(len(dumps))
        caught.update(frames(d) for d in dumps)
    print(f"   one-second stall dumps per worker: {counts} (total {sum(counts)})")
    for what, n in caught.most_common(4):
        print(f"   {n:4d} x {what}")
    for log in sorted(where.glob("worker*.log")):
        for line in log.read_text().splitlines():
            if "event loop blocked" in line:
                seconds = re.search(r"seconds=([\d.]+)", line)
                why = re.search(r"why=[\"'](.{0,110})", line)
                print(
                    f"   {log.stem}: blocked {seconds.group(1) if seconds else '?'} s: "
                    f"{why.group(1) if why else ''}..."
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="the source tree to compare against")
    ap.add_argument("--new", required=True, help="the source tree of the change")
    ap.add_argument("--n", type=int, default=40000, help="the array's side")
    ap.add_argument("--chunk", type=int, default=5000, help="the chunks' side")
    ap.add_argument("--port", type=int, default=35000, help="new's; old's is 100 more")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="worker-stalls-") as tmp:
        watch = Path(tmp, "watch.py")
        watch.write_text(WATCH)
        runs = {}
        procs = []
        for name, tree, port in (("old", args.old, args.port + 100), ("new", args.new, args.port)):
            where = Path(tmp, name)
            where.mkdir()
            runs[name] = (tree, port, where)
            procs += start(os.path.abspath(tree), port, where, watch)
        time.sleep(15)  # the workers join
        print(f"load average before: {os.getloadavg()}")
        computes = {
            name: subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    COMPUTE,
                    str(port),
                    str(args.n),
                    str(args.chunk),
                    str(where / "tokens.json"),
                ],
                env={**os.environ, "PYTHONPATH": os.path.abspath(tree)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for name, (tree, port, where) in runs.items()
        }
        outcomes = {name: c.communicate(timeout=900)[0].decode() for name, c in computes.items()}
        print(f"load average after: {os.getloadavg()}")
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        for name, (_, _, where) in runs.items():
            report(name, where, outcomes[name].strip().splitlines()[-1] if outcomes[name] else "")


if __name__ == "__main__":
    main()
