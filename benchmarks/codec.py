"""The wire codec alone: ``runtime.codec`` encode + decode of representative frames.

Each case is one frame (or one batch) as it crosses a connection; what goes into it is
built before the clock starts (process-local messages pickled by
``runtime.remote.to_wire``, as a connection does). Per case: microseconds per
encode + decode and how many frames per second that is, best of ``--repeat`` runs.

    python benchmarks/codec.py                   # every case, best of 5
    python benchmarks/codec.py --repeat 9 --cases typed-status heartbeat

Cases:

- ``heartbeat``: a ``Ping`` (the one-way heartbeat between processes);
- ``run-tasks``: a ``RunTasks`` of 100 ``ToRun`` with pickled nodes (a pickle on the
  wire, ``corral.Pickled``);
- ``tasks-done``: a ``TasksDone`` of 100 ``TaskResult`` (a pickle on the wire);
- ``data-reply``: a raw ``DataReply`` of two values, 4 MiB in all (a pickle holding
  the workers' pickles);
- ``task-records``: 100 typed ``TaskRecord`` messages, one frame each, as a batch;
- ``typed-status``: one typed message with nested typed records (64 ``WorkerInfo``,
  dicts of counts and of per-category floats): what the codec validates field by field;
- ``batch``: 64 mixed small frames (pings, memory reports, stream reads) in one batch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cloudpickle  # noqa: E402

from actors.protocol import TaskResult, ToRun  # noqa: E402
from runtime import codec  # noqa: E402
from runtime.codec import Frame  # noqa: E402
from runtime.graph import PickledNode  # noqa: E402
from runtime.messages import (  # noqa: E402
    DataReply,
    Message,
    Ping,
    ReadStream,
    RunTasks,
    TaskRecord,
    TasksDone,
    WorkerInfo,
    WorkerMemoryReport,
    message,
)
from runtime.remote import to_wire  # noqa: E402

MiB = 2**20


@message("bench.Status")
class BenchStatus(Message):
    """A status-like typed message (defined here so every version of the codec
    measures the same thing)."""

    workers: tuple[WorkerInfo, ...]
    tasks_by_state: dict[str, int]
    processing: dict[str, int]
    categories: dict[str, dict[str, float]]
    policies: dict[str, str]
    draining: tuple[str, ...]
    runs: int
    note: str | None = None


def _frame(msg: Any, request_id: int = 0) -> Frame:
    return Frame(to_wire(msg), "c-1234", request_id)


def _cases() -> dict[str, list[Frame]]:
    def node(i: int) -> PickledNode:
        return PickledNode(f"inc-{i}", cloudpickle.dumps((abs, -i), protocol=5))

    run = RunTasks(
        tuple(
            ToRun(f"inc-{i}", node(i), "inc", ((f"dep-{i}", ("worker-1",)),), dep_nbytes=(8,))
            for i in range(100)
        )
    )
    done = TasksDone(
        "worker-1",
        tuple(
            TaskResult(f"inc-{i}", "ok", 1.5e9 + i, 1.5e9 + i + 0.01, 28, 80 * MiB)
            for i in range(100)
        ),
    )
    values = {
        "x": cloudpickle.dumps(os.urandom(3 * MiB), protocol=5),
        "y": cloudpickle.dumps(os.urandom(MiB), protocol=5),
    }
    data = DataReply(values, raw=True)
    records = [
        Frame(TaskRecord(f"inc-{i}", "memory", "inc", "worker-1", 1), "", 0, i + 1)
        for i in range(100)
    ]
    status = BenchStatus(
        tuple(WorkerInfo(f"worker-{i}", 4, 16 * 2**30, 0, "default") for i in range(64)),
        {"waiting": 120, "ready": 30, "processing": 256, "memory": 4000, "released": 10},
        {f"worker-{i}": 4 for i in range(64)},
        {
            f"cat-{i}": {"count": 100.0, "mean_duration": 0.25, "max_duration": 1.5, "peak": 2e9}
            for i in range(16)
        },
        {"priority": "fifo", "placement": "locality", "retry": "limited"},
        ("worker-3", "worker-9"),
        42,
    )
    small: list[Frame] = []
    for i in range(64):
        kind = i % 3
        if kind == 0:
            small.append(Frame(Ping(i)))
        elif kind == 1:
            report = WorkerMemoryReport(f"worker-{i}", False, 2**30, 3 * 2**30, 4 * 2**30, 2**20)
            small.append(Frame(report, f"c-{i}"))
        else:
            small.append(Frame(ReadStream(i, i * MiB, MiB, "worker-1"), "", i + 1))
    return {
        "heartbeat": [Frame(Ping(7))],
        "run-tasks": [_frame(run, 11)],
        "tasks-done": [_frame(done)],
        "data-reply": [Frame(to_wire(data), "c-1", 0, 12)],
        "task-records": records,
        "typed-status": [Frame(status, "", 0, 13)],
        "batch": small,
    }


def _round_trip(frames: list[Frame]) -> Callable[[], object]:
    """One encode + decode of the case (a batch when it has several frames)."""
    if len(frames) == 1:
        frame = frames[0]

        def one() -> object:
            return codec.decode(codec.encode(frame))

        return one

    def batch() -> object:
        return codec.decode_batch(codec.encode_batch(frames))

    return batch


def measure(frames: list[Frame], repeat: int, budget: float) -> float:
    """Best seconds per round trip over ``repeat`` runs of about ``budget`` seconds."""
    fn = _round_trip(frames)
    out = fn()
    expected = frames if len(frames) > 1 else frames[0]
    assert out == expected, "the codec did not round-trip the case"
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    n = max(1, int(budget / once))
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=5, help="runs per case (best is kept)")
    parser.add_argument("--budget", type=float, default=0.2, help="seconds per run")
    parser.add_argument("--cases", nargs="*", help="only these cases")
    args = parser.parse_args(argv)
    cases = _cases()
    names = args.cases or list(cases)
    head = f"{'case':<14}{'frames':>7}{'bytes':>12}{'µs/round trip':>16}"
    print(f"{head}{'µs/frame':>11}{'frames/s':>13}")
    for name in names:
        frames = cases[name]
        size = len(codec.encode(frames[0]) if len(frames) == 1 else codec.encode_batch(frames))
        best = measure(frames, args.repeat, args.budget)
        per_frame = best / len(frames)
        print(
            f"{name:<14}{len(frames):>7}{size:>12,}{best * 1e6:>16,.1f}"
            f"{per_frame * 1e6:>11,.2f}{1 / per_frame:>13,.0f}"
        )


if __name__ == "__main__":
    main()
