"""File outputs (issue 13 item 1, docs/files.md "File outputs").

- the file stream: parts written at their offsets into a ``.part`` file (never the whole
  file in memory), a broken stream resumed from the bytes written (same holder, or the
  next one) re-reading only what was missing, a checksum mismatch caught and the copy
  removed;
- the store: file entries count on disk, never in memory, are never spilled, and go
  with their key;
- end to end on worker processes: load -> skim -> merge of real files, a consumer
  reading its inputs on its own worker's disk, sizes in the registry, files removed
  when the outputs are dropped, a worker killed with SIGKILL mid-run;
- one disk budget: spilled values and file outputs; a file output that does not fit
  ends its try disk-full and the worker goes on;
- bad input: typed errors that say what to do.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import itertools
import os
import random
import time
import tracemalloc
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from actors.store import SpillStore
from actors.transfer import StreamBroken, StreamInfo, StreamTable, fetch_file
from runtime import Cluster
from runtime.client import get
from runtime.errors import AskTimeout, DiskFull, FileChecksumError, FileOutputError
from runtime.files import File, TaskOutputs, digest, output_path, task_outputs
from runtime.kernel import ActorRef, ActorSystem, handles
from runtime.messages import (
    CheckpointSaved,
    CopyFrom,
    DropCheckpointsMsg,
    FetchCheckpoint,
    GetCheckpoint,
    GetData,
    ReadStream,
    RunTasks,
    StreamPart,
)
from tests.helpers import SchedulerRecorder, load_bench, wait_until

pytestmark = pytest.mark.anyio

KiB = 1024
MiB = 1024 * KiB


# ------------------------------------------------------------------ a holder, in memory


class Holder:
    """The sending side of a file stream as a worker has it (a StreamTable over the
    file's FileSegments), with the asks it answered recorded and faults injected:
    ``fail_from``: asks at or past that offset fail (AskTimeout), ``fail_asks`` times
    at most; ``short``: an answer to an ask at that offset comes back one byte short."""

    def __init__(self, file: File, *, fail_from: int | None = None, fail_asks: int = 0) -> None:
        self.file = file
        self.table = StreamTable()
        self.asked: list[tuple[int, int, int]] = []  #: (stream, offset, length) answered
        self.fail_from = fail_from
        self.fail_asks = fail_asks
        self.short: int | None = None
        self.in_flight = 0
        self.most_in_flight = 0
        self.opened = 0

    def open(self) -> StreamInfo:
        from actors.transfer import FileSegments

        assert self.file.size is not None
        self.opened += 1
        info = self.table.start("k", FileSegments(self.file.path, [(0, self.file.size)]), 0.0)
        return info._replace(file=self.file)

    async def reopen(self, offset: int) -> StreamInfo | None:
        return self.open()

    async def ask(self, msg: ReadStream) -> StreamPart:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await anyio.lowlevel.checkpoint()  # let the other parts in flight start
            if self.fail_from is not None and msg.offset >= self.fail_from and self.fail_asks:
                self.fail_asks -= 1
                raise AskTimeout("holder", "ReadStream", 1.0)
            data = self.table.read(msg.stream, msg.offset, msg.length, 0.0)
            self.asked.append((msg.stream, msg.offset, msg.length))
            if self.short == msg.offset:
                self.short = None
                data = data[:-1]
            return StreamPart(data)
        finally:
            self.in_flight -= 1


def source(tmp_path: Path, nbytes: int, seed: int = 0) -> File:
    path = tmp_path / "src" / "events.root"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(random.Random(seed).randbytes(nbytes))
    size, checksum = digest(str(path))
    return File(str(path), "events.root", size, checksum)


def read(path: str) -> bytes:
    return Path(path).read_bytes()


def exists(path: str) -> bool:
    return os.path.exists(path)


def size_of(path: str) -> int:
    return os.path.getsize(path)


def copy_file(src: str, dest: Path) -> None:
    dest.write_bytes(read(src))


def flip_a_byte(path: str, at: int) -> bytes:
    """Change one byte of the file at ``path`` (its size stays); its new bytes."""
    data = bytearray(read(path))
    data[at] ^= 0xFF
    Path(path).write_bytes(bytes(data))
    return bytes(data)


def dest_dir(tmp_path: Path) -> str:
    d = tmp_path / "dest"
    d.mkdir(exist_ok=True)
    return str(d)


def dest(tmp_path: Path) -> str:
    """Where a copy goes: a file in :func:`dest_dir`."""
    return os.path.join(dest_dir(tmp_path), "events.root")


# ------------------------------------------------------------------ the file stream


async def test_a_file_arrives_part_by_part_at_its_offsets_never_whole_in_memory(
    tmp_path: Path,
) -> None:
    src = source(tmp_path, 16 * MiB + 123)
    holder = Holder(src)
    part = 64 * KiB
    tracemalloc.start()
    try:
        with anyio.fail_after(60):
            got = await fetch_file(
                holder.ask,
                holder.open(),
                dest(tmp_path),
                reopen=holder.reopen,
                part_bytes=part,
                window=3,
            )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (got.name, got.size, got.checksum) == ("events.root", src.size, src.checksum)
    assert read(got.path) == read(src.path)
    assert Path(got.path).parent == tmp_path / "dest" and got.path != src.path
    assert os.listdir(dest_dir(tmp_path)) == [os.path.basename(got.path)]  # no .part left
    # Parts of at most part_bytes, at most `window` in flight, every byte asked once.
    assert max(n for _, _, n in holder.asked) == part
    assert holder.most_in_flight <= 3
    assert sum(n for _, _, n in holder.asked) == src.size
    # The 16 MiB file was never held whole: the peak of Python allocations while it was
    # copied (the parts in flight, the checksum's read buffer) is a small part of it.
    assert peak < 4 * MiB, peak


@pytest.mark.parametrize("window", [1, 4])
async def test_a_broken_stream_resumes_from_the_bytes_written_and_rereads_nothing_else(
    tmp_path: Path, window: int
) -> None:
    src = source(tmp_path, 1 * MiB + 5)
    part = 32 * KiB
    k = 11  # parts from the k-th on fail on the first stream (a broken connection)
    holder = Holder(src, fail_from=k * part, fail_asks=100)
    first = holder.open()
    closed: list[int] = []
    resumed_at: list[int] = []

    async def reopen(offset: int) -> StreamInfo | None:
        resumed_at.append(offset)
        holder.fail_asks = 0  # the new connection works
        return holder.open()

    with anyio.fail_after(30):
        got = await fetch_file(
            holder.ask,
            first,
            dest(tmp_path),
            reopen=reopen,
            close=lambda m: closed.append(m.stream),
            part_bytes=part,
            window=window,
        )
    assert got.checksum == src.checksum
    assert read(got.path) == read(src.path)
    assert holder.opened == 2 and first.stream in closed  # the broken one given up
    (prefix,) = resumed_at
    before = [(o, n) for s, o, n in holder.asked if s == first.stream]
    after = sorted((o, n) for s, o, n in holder.asked if s != first.stream)
    assert all(o < k * part for o, _ in before)
    # At most the parts in flight when it broke are lost; with one in flight, none.
    assert (k - window) * part <= prefix <= k * part
    assert prefix == k * part if window == 1 else True
    # The new stream is read from the first byte not written, to the end, once.
    assert after[0][0] == prefix
    assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(after))
    assert after[-1][0] + after[-1][1] == src.size
    reread = sum(n for _, n in before) + sum(n for _, n in after) - src.size
    assert 0 <= reread <= (window - 1) * part


async def test_a_copy_broken_past_its_resumes_goes_on_from_the_next_holder(
    tmp_path: Path,
) -> None:
    src = source(tmp_path, 512 * KiB)
    part = 16 * KiB
    dead = Holder(src, fail_from=10 * part, fail_asks=10_000)  # never recovers
    with anyio.fail_after(30), pytest.raises(StreamBroken) as info:
        await fetch_file(
            dead.ask,
            dead.open(),
            dest(tmp_path),
            reopen=dead.reopen,
            resumes=2,
            part_bytes=part,
            window=1,
        )
    broken = info.value
    assert broken.prefix == 10 * part and dead.opened == 3  # the first, then 2 resumes
    assert size_of(broken.part) >= broken.prefix  # kept for the next holder
    # The next holder has the same file (its own copy): only the rest is read from it.
    copy = tmp_path / "other.root"
    copy_file(src.path, copy)
    other = Holder(File(str(copy), src.name, src.size, src.checksum))
    with anyio.fail_after(30):
        got = await fetch_file(
            other.ask,
            other.open(),
            dest(tmp_path),
            reopen=other.reopen,
            part=broken.part,
            offset=broken.prefix,
            part_bytes=part,
        )
    assert read(got.path) == read(src.path)
    assert sum(n for _, _, n in other.asked) == (src.size or 0) - broken.prefix
    assert not exists(broken.part)


async def test_a_short_part_is_a_broken_stream_and_is_read_again(tmp_path: Path) -> None:
    src = source(tmp_path, 200 * KiB)
    holder = Holder(src)
    holder.short = 64 * KiB
    with anyio.fail_after(30):
        got = await fetch_file(
            holder.ask,
            holder.open(),
            dest(tmp_path),
            reopen=holder.reopen,
            part_bytes=32 * KiB,
            window=1,
        )
    assert got.checksum == src.checksum and holder.opened == 2


async def test_a_checksum_mismatch_is_a_typed_error_and_leaves_no_file(tmp_path: Path) -> None:
    src = source(tmp_path, 300 * KiB)
    # The holder's file changed on its disk after it was measured (same size).
    data = flip_a_byte(src.path, 1000)
    holder = Holder(src)
    with anyio.fail_after(30), pytest.raises(FileChecksumError) as info:
        await fetch_file(
            holder.ask,
            holder.open(),
            dest(tmp_path),
            reopen=holder.reopen,
            holder="worker-7",
            part_bytes=64 * KiB,
        )
    assert info.value.fields["expected"] == src.checksum
    assert info.value.fields["got"] == hashlib.sha256(data).hexdigest()
    assert "worker-7" in str(info.value)
    assert os.listdir(dest_dir(tmp_path)) == []  # neither the .part nor the file


# ------------------------------------------------------------------ the store


def test_file_entries_count_on_disk_never_in_memory_and_go_with_their_key(
    tmp_path: Path,
) -> None:
    store = SpillStore(tmp_path, disk_limit=10 * MiB)
    sandbox = store.sandbox()
    path = os.path.join(sandbox, "a.bin")
    Path(path).write_bytes(b"x" * 3000)
    size, checksum = digest(path)
    f = File(path, "a.bin", size, checksum)
    store.put_file("f", f)
    store.put("v", b"y" * 5000, 5000)
    assert store.is_file("f") and not store.on_disk("f")
    assert store["f"] is f and store.peek("f") is f and store.nbytes("f") == 3000
    assert store.memory_bytes == 5000 and store.disk_bytes == 3000
    assert (store.n_files, store.file_bytes) == (1, 3000)
    segs = store.segments("f")
    assert segs.sizes == (3000,) and segs.read(100, 10) == b"x" * 10
    segs.close()
    # Spilling moves values, never file entries; both share the disk budget.
    assert store.spill_keys(10**9) == ["v"]
    assert store.disk_bytes > 3000 + 5000 and store.is_file("f")
    del store["f"]
    assert not os.path.exists(path) and store.disk_bytes < 3000 + 5000 + 1000
    store.close()
    assert not os.path.exists(sandbox)


def test_the_bytes_of_a_store_s_file_outputs_are_counted_not_summed_at_each_read(
    tmp_path: Path,
) -> None:
    """A user audit (parsl): the worker reads ``file_bytes`` for every report, one per
    task that made a file, and it was summed over every file output held, so a worker
    holding 100,000 file outputs spent some 10 ms of its event loop per report (a
    workflow of many per-sample files slowed as its files piled up). Now it is a count
    kept as they come and go: reading it costs nothing however many there are, and it
    stays right through replacing, removing and closing."""
    store = SpillStore(tmp_path)
    sandbox = store.sandbox()
    n = 100_000
    for i in range(n):  # measured handles; put_file does not read the files
        store.put_file(i, File(os.path.join(sandbox, f"f{i}"), f"f{i}", 10, "0" * 64))
    assert (store.n_files, store.file_bytes, store.disk_bytes) == (n, 10 * n, 10 * n)
    began = time.process_time()
    for _ in range(1000):  # summed: 1,000 reads of 100,000 sizes took 4 s of CPU here
        assert store.file_bytes == 10 * n
    assert time.process_time() - began < 0.2
    store.put_file(0, File(os.path.join(sandbox, "f0"), "f0", 25, "0" * 64))  # replaced
    del store[1]
    store.put("v", b"y" * 5000, 5000)
    store.spill_keys(10**9)  # a spilled value is on disk, not a file output
    assert store.file_bytes == 10 * n + 15 - 10 and store.disk_bytes > store.file_bytes
    store.close()
    assert (store.n_files, store.file_bytes) == (0, 0)


# ------------------------------------------------------------------ bad input


def test_output_path_outside_a_task_is_a_typed_error() -> None:
    with pytest.raises(FileOutputError, match="outside a running task"):
        output_path("x.root")


def test_bad_names_and_files_outside_the_sandbox_are_typed_errors(tmp_path: Path) -> None:
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    with task_outputs(str(sandbox), "t") as out:
        for bad in ("", "..", "a/b", "/etc/passwd"):
            with pytest.raises(FileOutputError, match="plain file name"):
                output_path(bad)
        outside = tmp_path / "elsewhere.root"
        outside.write_bytes(b"1")
        with pytest.raises(FileOutputError, match="outside its worker's sandbox"):
            out.finish(File(str(outside)))
        with pytest.raises(FileOutputError, match="not a regular file"):
            out.finish(File(output_path("never-written.root")))
        p = output_path("ok.root")
        Path(p).write_bytes(b"abc")
        done = out.finish(File(p))
        assert done.size == 3 and done.checksum == hashlib.sha256(b"abc").hexdigest()
        assert Path(done.path).parent == sandbox and not os.path.exists(p)
        # A File of the try inside a list or a dict: its file would go with the try.
        q = output_path("q.root")
        Path(q).write_bytes(b"q")
        with pytest.raises(FileOutputError, match=r"returned a list holding File.*of its own"):
            out.finish([1, File(q)])
        with pytest.raises(FileOutputError, match="returned a dict holding File"):
            out.finish({"q": File(q)})
        # Kept files (the output just made, an input's) and other values pass through.
        assert out.finish((done, 2, "q.root")) == (done, 2, "q.root")
    assert os.listdir(sandbox / "out") == []  # the try's directory went with the try
    assert TaskOutputs(None, "t").finish(42) == 42  # other values pass through
    with pytest.raises(FileOutputError, match="plain file name"):
        File(str(sandbox / "x"), name="../y")
    with pytest.raises(FileOutputError, match="non-empty"):
        File("")


def test_a_file_written_next_to_an_input_is_the_try_s_own(tmp_path: Path) -> None:
    """Two skims write next to their input (``events.path + ".skim"``, in the sandbox
    but not at ``output_path``): each output keeps its own bytes, and the path they
    wrote at is not left behind; an input returned unchanged is a copy of its own."""
    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    events = sandbox / "0123456789ab-events.bin"
    events.write_bytes(b"e" * 10)
    old = time.time_ns() - 10**9  # the input was written before the tries began
    os.utime(events, ns=(old, old))
    done = []
    for cut in (b"2", b"4"):
        with task_outputs(str(sandbox), f"skim-{cut!r}") as out:
            path = str(events) + ".skim"
            Path(path).write_bytes(cut * 5)
            done.append(out.finish(File(path)))
    assert [read(d.path) for d in done] == [b"22222", b"44444"]
    assert [d.checksum for d in done] == [hashlib.sha256(c * 5).hexdigest() for c in (b"2", b"4")]
    assert not os.path.exists(str(events) + ".skim")
    with task_outputs(str(sandbox), "same") as out:
        same = out.finish(File(str(events)))
    assert read(same.path) == b"e" * 10 and events.exists()
    events.write_bytes(b"changed")  # what is written at the input's path later
    assert read(same.path) == b"e" * 10  # does not change the output


# ------------------------------------------------------------------ tasks that write files


def payload(i: int, nbytes: int) -> bytes:
    return random.Random(i).randbytes(nbytes)


def load(i: int, nbytes: int) -> File:
    """A loader: writes a file of random bytes in its sandbox, returns it."""
    path = output_path(f"load-{i}.root")
    with open(path, "wb") as f:
        f.write(payload(i, nbytes))
    return File(path)


def skim(f: File, pause: float = 0.0) -> File:
    """Reads its input from the path on its own worker; writes every other byte."""
    if pause:
        import time

        time.sleep(pause)
    data = Path(f.path).read_bytes()
    assert len(data) == f.size, (f, len(data))
    path = output_path("skim.root")
    Path(path).write_bytes(data[::2])
    return File(path)


def exist(*paths: str) -> bool:
    return all(os.path.exists(p) for p in paths)


async def test_a_file_computed_stays_while_its_file_object_lives(tmp_path: Path) -> None:
    """compute() releases its results once returned, but a File result stays on its
    worker's disk while the returned File object lives; runtime.get() copies File
    results here before its cluster stops."""
    dsk = {"a": (load, 1, 4 * KiB), "b": (skim, "a")}
    with anyio.fail_after(60):
        async with Cluster(workers=1) as cluster:
            a, b = await cluster.compute(dsk, ["a", "b"])
            path = b.path
            assert read(path) == payload(1, 4 * KiB)[::2]
            # held while the object lives, past later work that prunes what is unheld
            assert await cluster.compute({"c": (sum, [1, 2])}, "c") == 3
            assert exist(path, a.path)
            del b
            gc.collect()
            await wait_until(lambda: not exist(path), "the file removed", limit=30)
            assert exist(a.path)
    got = await anyio.to_thread.run_sync(
        functools.partial(get, dsk, ["b", "a"], files_to=tmp_path / "here")
    )
    assert [os.path.dirname(f.path) for f in got] == [str(tmp_path / "here")] * 2
    assert read(got[0].path) == payload(1, 4 * KiB)[::2]
    assert read(got[1].path) == payload(1, 4 * KiB)
    assert got[0].checksum == hashlib.sha256(payload(1, 4 * KiB)[::2]).hexdigest()


def sandbox_of(path: str) -> str:
    """The sandbox of an output_path (``SANDBOX/out/try-XXXX/name``)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(path)))


def merge(*files: File) -> dict[str, Any]:
    """A fan-in: the sum of its inputs' bytes, and where it read them."""
    return {
        "sum": sum(sum(Path(f.path).read_bytes()) for f in files),
        "sandbox": sandbox_of(output_path("probe")),
        "paths": [f.path for f in files],
        "sizes": [os.path.getsize(f.path) for f in files],
        "checks": [digest(f.path)[1] == f.checksum for f in files],
    }


def expected_skim(i: int, nbytes: int) -> bytes:
    return payload(i, nbytes)[::2]


def graph(n: int, groups: int, nbytes: int, pause: float = 0.0) -> dict[str, Any]:
    g: dict[str, Any] = {}
    for i in range(n):
        g[f"load-{i}"] = (load, i, nbytes)
        g[f"skim-{i}"] = (skim, f"load-{i}", pause)
    for j in range(groups):  # interleaved: no merge is ready before most skims are done
        g[f"merge-{j}"] = (merge, *[f"skim-{i}" for i in range(j, n, groups)])
    return g


def expected_sums(n: int, groups: int, nbytes: int) -> list[int]:
    return [sum(sum(expected_skim(i, nbytes)) for i in range(j, n, groups)) for j in range(groups)]


def process_cluster(tmp_path: Path, n: int = 2) -> Any:
    from runtime import Cluster

    return Cluster(
        processes=n,
        threads_per_worker=1,
        memory_options={"spill_dir": str(tmp_path / "spill")},
        disk_per_worker="512MiB",
        policies={"replication": "none"},
    )


@pytest.mark.timeout(200)  # a backstop: the run is bounded below
async def test_load_skim_merge_of_real_files_on_worker_processes(tmp_path: Path) -> None:
    n, groups, nbytes = 8, 2, 256 * KiB
    with anyio.fail_after(150):
        async with process_cluster(tmp_path) as cluster:
            await cluster.wait_for_workers(2)
            skims = [f"skim-{i}" for i in range(n)]
            merges = [f"merge-{j}" for j in range(groups)]
            futures = await cluster.submit_graph(graph(n, groups, nbytes), [*skims, *merges])
            values = await cluster.gather(futures)
            handles: list[File] = values[:n]
            results: list[dict[str, Any]] = values[n:]
            # A client gets the handle: metadata, and the path on the worker holding it.
            for i, h in enumerate(handles):
                want = expected_skim(i, nbytes)
                assert (h.name, h.size) == ("skim.root", len(want))
                assert h.checksum == hashlib.sha256(want).hexdigest()
                assert read(h.path) == want  # same machine: readable here
                assert str(tmp_path / "spill") in h.path
            # Each merge read its inputs on its own worker's disk, whole and checked.
            assert [r["sum"] for r in results] == expected_sums(n, groups, nbytes)
            for r in results:
                assert all(p.startswith(r["sandbox"] + os.sep) for p in r["paths"])
                assert all(r["checks"]) and r["sizes"] == [nbytes // 2] * (n // groups)
            holders = {os.path.dirname(h.path) for h in handles}  # the workers' sandboxes
            status = await cluster.status()
            # The registry and the category statistics know the files' sizes.
            assert status["categories"]["skim"]["max_nbytes"] == nbytes // 2
            assert status["categories"]["load"]["max_nbytes"] == nbytes
            stored = sum(status["files"]["stored_bytes"].values())
            assert stored >= n * nbytes // 2
            # The skims are file outputs (the loads were pruned, the merges are values),
            # with their copies on the merges' workers.
            assert status["files"]["file_outputs"] == n
            assert status["files"]["file_bytes"] >= n * nbytes // 2
            copied = status["storage"]["transfer_bytes"].get("fetch", 0)
            if len(holders) > 1:  # skims on both workers: merges copied some over
                assert copied >= nbytes // 2
            on_disk = [h.path for h in handles]
            copies = [p for r in results for p in r["paths"] if p not in on_disk]
            assert len(copies) * (nbytes // 2) <= copied
            # A download copies a file output here, through the manager, part by part.
            dest = tmp_path / "downloads" / "first.root"
            dest.parent.mkdir()
            got = await cluster.download(futures[0], dest)
            assert (got.path, got.size, got.checksum) == (str(dest), handles[0].size,
                                                          handles[0].checksum)  # fmt: skip
            assert read(str(dest)) == expected_skim(0, nbytes)
            assert os.listdir(dest.parent) == ["first.root"]
            # Dropping the outputs removes their files (holders' and copies) from disk.
            for fut in futures:
                fut.release()
            del futures
            await wait_until(
                lambda: not any(os.path.exists(p) for p in [*on_disk, *copies]),
                "the released files removed",
                limit=30,
            )


@pytest.mark.timeout(120)  # a backstop: the run is bounded below
async def test_loads_do_not_fill_the_disks_their_skims_need() -> None:
    """Small disks (8 MiB a worker), 2 MiB loads and their skims (1 MiB). A skim's
    output is guessed (half a disk beside its input) until one has finished, so the
    first skims wait for disk; the loads after them would fit in that room, and
    before they were kept out of it they filled every disk: the skims, which prune
    the loads they read, could never run, and the run failed with DiskFull."""
    n, groups, nbytes = 24, 6, 2 * MiB
    with anyio.fail_after(90):
        async with Cluster(workers=2, disk_per_worker="8MiB") as cluster:
            await cluster.wait_for_workers(2)
            merges = [f"merge-{j}" for j in range(groups)]
            futures = await cluster.submit_graph(graph(n, groups, nbytes), merges)
            results = await cluster.gather(futures)
            assert [r["sum"] for r in results] == expected_sums(n, groups, nbytes)
            categories = (await cluster.status())["categories"]
            assert {c: categories[c]["disk_full"] for c in ("load", "skim", "merge")} == {
                "load": 0, "skim": 0, "merge": 0,
            }  # fmt: skip


@pytest.mark.timeout(200)
async def test_a_worker_killed_mid_run_has_its_files_made_again(tmp_path: Path) -> None:
    bench = load_bench("files")
    n, groups, nbytes = 12, 3, 128 * KiB
    with anyio.fail_after(150):
        async with process_cluster(tmp_path) as cluster:
            await cluster.wait_for_workers(2)
            merges = [f"merge-{j}" for j in range(groups)]
            futures = await cluster.submit_graph(graph(n, groups, nbytes, pause=0.3), merges)

            async def skims_done() -> bool:
                cat = (await cluster.status())["categories"].get("skim")
                return cat is not None and cat["count"] >= 4

            await wait_until(skims_done, "4 skims done", step=0.05)
            before = {w.worker_id for w in (await cluster.status())["workers"]}
            bench.kill_one_worker(random.Random(7))

            async def gone() -> Any:
                now = {w.worker_id for w in (await cluster.status())["workers"]}
                return before - now

            await wait_until(gone, "the killed worker gone", step=0.05)
            results = await cluster.gather(futures)
            status = await cluster.status()
    assert [r["sum"] for r in results] == expected_sums(n, groups, nbytes)
    for r in results:
        assert all(r["checks"]) and all(p.startswith(r["sandbox"]) for p in r["paths"])
    # Skims held by the killed worker, not yet merged, were made again.
    assert status["storage"]["recoveries"].get("recomputed", 0) >= 1


async def test_file_outputs_in_task_processes(tmp_path: Path) -> None:
    from runtime import Cluster

    with anyio.fail_after(60):
        async with Cluster(
            workers=1,
            memory_options={"execution": "process", "spill_dir": str(tmp_path / "spill")},
        ) as cluster:
            (h,) = await cluster.submit_graph(
                {"load-0": (load, 0, 100_000), "skim-0": (skim, "load-0")}, ["skim-0"]
            )
            got = await h.result()
            assert read(got.path) == expected_skim(0, 100_000)
            assert got.size == 50_000 and str(tmp_path / "spill") in got.path


# ------------------------------------------------------------------ one disk budget


def blob(nbytes: int) -> bytes:
    return b"v" * nbytes


def write(name: str, nbytes: int) -> File:
    path = output_path(name)
    Path(path).write_bytes(b"f" * nbytes)
    return File(path)


def outside(path: str) -> File:
    Path(path).write_bytes(b"1")
    return File(path)


def bad_name() -> str:
    return output_path("../escape.root")


def two_files() -> list[File]:
    return [write("a.root", 1), write("b.root", 2)]


async def test_spilled_values_and_file_outputs_share_the_disk_and_a_file_that_does_not_fit_ends_disk_full(  # noqa: E501
    tmp_path: Path,
) -> None:
    from runtime import Cluster

    spill = tmp_path / "spill"
    with anyio.fail_after(90):
        async with Cluster(
            workers=1,
            threads_per_worker=1,
            memory_per_worker="2GiB",
            # past the spill fence from the start: values go to disk
            memory_options={
                "spill": 0.01,
                "throttle": 0.9,
                "terminate": None,
                "spill_dir": str(spill),
            },
            disk_per_worker="4MiB",
        ) as cluster:
            wid = "worker-1"

            async def on_disk() -> int:
                report = (await cluster.status())["memory"].get(wid)
                return int(report["spilled_bytes"]) if report else 0

            async def one(key: str, task: Any, **options: Any) -> Any:
                (fut,) = await cluster.submit_graph({key: task}, [key], **options)
                return fut

            value = await one("blob-1", (blob, 2 * MiB))
            await value.result()
            await wait_until(lambda: _at_least(on_disk(), 2 * MiB), "spilled", limit=20)
            small = await one("write-1", (write, "small.bin", 512 * KiB), resources={"disk": 1})
            assert (await small.result()).size == 512 * KiB
            await wait_until(lambda: _at_least(on_disk(), 2 * MiB + 512 * KiB), "file", limit=20)
            # About 1.5 MiB left: a 2 MiB file output does not fit. Its try ends
            # disk-full, the file is removed, and it waits for room.
            big = await one("write-2", (write, "big.bin", 2 * MiB), resources={"disk": 1})

            async def disk_full() -> bool:
                cat = (await cluster.status())["categories"].get("write", {})
                return bool(cat.get("disk_full"))

            await wait_until(disk_full, "the disk-full try", limit=30)
            sandbox = Path((await small.result()).path).parent
            assert not [p for p in sandbox.rglob("*") if "big" in p.name]
            assert await on_disk() < 3 * MiB
            # The worker keeps working meanwhile.
            other = await one("tiny-1", (blob, 10), resources={"disk": 1})
            assert await other.result() == b"v" * 10
            assert not big.done()
            # Freeing the spilled value makes room: the retry fits.
            value.release()
            del value
            got = await big.result()
            assert got.size == 2 * MiB and size_of(got.path) == 2 * MiB
            story = " ".join(map(str, await cluster.story("write-2")))
            assert "waiting for disk" in story, story


async def _at_least(value: Any, n: int) -> bool:
    return bool(await value >= n)


# ------------------------------------------------------------------ bad input, in a task


async def test_a_task_returning_a_file_outside_its_sandbox_fails_with_what_to_do(
    tmp_path: Path,
) -> None:
    from runtime import Cluster

    with anyio.fail_after(60):
        async with Cluster(workers=1) as cluster:
            fut = cluster.submit(outside, str(tmp_path / "shared.root"))
            with pytest.raises(FileOutputError, match="output_path") as info:
                await fut
            assert "outside its worker's sandbox" in str(info.value)
            with pytest.raises(FileOutputError, match="plain file name"):
                await cluster.submit(bad_name)
            with pytest.raises(FileOutputError, match="returned a list holding File"):
                await cluster.submit(two_files)
            with pytest.raises(FileOutputError, match="is a bytes, not a file output"):
                await cluster.download(cluster.submit(blob, 10), tmp_path / "x")


async def test_a_download_into_a_missing_directory_is_a_file_output_error(
    tmp_path: Path,
) -> None:
    """``download(fut, "/tmp/x/nodir/got.bin")`` raised a bare FileNotFoundError naming
    the ``.part`` file; a directory given as ``dest`` failed as obscurely. Both are a
    FileOutputError saying what is wrong with ``dest``, nothing is created, and the same
    output then downloads to a good path."""
    from runtime import Cluster

    with anyio.fail_after(60):
        async with Cluster(workers=1) as cluster:
            fut = cluster.submit(write, "got.bin", 1000)
            dest = tmp_path / "nodir" / "got.bin"
            with pytest.raises(FileOutputError, match="does not exist") as info:
                await cluster.download(fut, dest)
            assert f"the directory {str(dest.parent)!r} does not exist" in str(info.value)
            assert "os.makedirs" in str(info.value)
            with pytest.raises(FileOutputError, match=r"is a directory; give the path of the"):
                await cluster.download(fut, tmp_path)
            assert os.listdir(tmp_path) == []  # no directory made, no .part file left
            got = await cluster.download(fut, tmp_path / "got.bin")
            assert got.size == 1000 and (tmp_path / "got.bin").read_bytes() == b"f" * 1000


async def test_a_download_of_another_clusters_future_says_so(tmp_path: Path) -> None:
    """``a.download(fut_of_b, dest)`` said "could not download ...: its file kept
    disappearing (workers lost while reading it)" at once (it waited on ``b``, then
    asked ``a``'s manager, which has no such key): a CorralError saying the future is
    another cluster's, nothing written; ``b`` downloads it."""
    from runtime import Cluster
    from runtime.errors import CorralError

    with anyio.fail_after(60):
        async with Cluster(workers=1) as a, Cluster(workers=1) as b:
            fut = b.submit(write, "got.bin", 1000)
            with pytest.raises(CorralError, match="belongs to another cluster"):
                await a.download(fut, tmp_path / "got.bin")
            assert os.listdir(tmp_path) == []
            got = await b.download(fut, tmp_path / "got.bin")
            assert got.size == 1000


# ------------------------------------------------------------------ the scheduler core


@pytest.mark.parametrize("file", [True, False])
def test_memory_admission_leaves_out_inputs_that_are_file_outputs(file: bool) -> None:
    """A 5 GiB input on a 1 GiB worker: a file output is read from disk, so its reader
    runs; the same bytes as a Python value would not fit in memory (TaskTooLarge)."""
    from actors.protocol import TaskResult
    from actors.scheduler_events import Execute, KeyErred, TasksFinished
    from actors.scheduler_state import SchedulerState
    from runtime.errors import TaskTooLarge
    from tests.helpers import GB, event, join, of, run, submit

    s = SchedulerState()
    join(s, "w", memory=GB)
    submit(s, {"a": [], "b": ["a"]}, ["b"])
    res = TaskResult("a", "ok", 0.0, 1.0, 5 * GB, file=file)
    cmds = run(s, event(TasksFinished, worker="w", results=(res,)))
    b = s.tasks["b"]
    if file:
        assert [t.key for c in of(cmds, Execute) for t in c.tasks] == ["b"]
        assert (s.tasks["a"].file, b.in_nbytes, b.in_files) == (True, 0, 5 * GB)
    else:
        (erred,) = of(cmds, KeyErred)
        assert isinstance(erred.error, TaskTooLarge)


def find(root: Path, pattern: str) -> list[Path]:
    return sorted(root.rglob(pattern))


async def test_a_replica_of_a_file_output_is_a_copy_of_its_file_on_another_worker(
    tmp_path: Path,
) -> None:
    from runtime import Cluster

    spill = tmp_path / "spill"
    with anyio.fail_after(60):
        async with Cluster(
            workers=2,
            memory_options={"spill_dir": str(spill)},
            policies={"replication": ("fixed", {"replicas": 1})},
        ) as cluster:
            await cluster.wait_for_workers(2)
            (fut,) = await cluster.submit_graph({"load-0": (load, 0, 300 * KiB)}, ["load-0"])
            handle = await fut.result()

            async def made() -> bool:
                return bool((await cluster.status())["replicas"]["made"])

            await wait_until(made, "the replica", limit=30)
            copies = find(spill, "*-load-0.root")
            assert len(copies) == 2 and copies[0].parent != copies[1].parent
            assert Path(handle.path) in copies
            assert all(digest(str(p)) == (handle.size, handle.checksum) for p in copies)
            assert not find(spill, "*.part")
            status = await cluster.status()
            assert status["storage"]["transfer_bytes"]["replica"] == 300 * KiB
            fut.release()
            del fut
            await wait_until(lambda: not find(spill, "*-load-0.root"), "both removed", limit=30)


# ------------------------------------------------------------------ workers, a broken link


class Recorder(SchedulerRecorder):
    """The scheduler, as far as workers tell it (:class:`SchedulerRecorder`), and the
    checkpoints saved."""

    def __init__(self) -> None:
        super().__init__()
        self.saved: list[CheckpointSaved] = []

    @handles(CheckpointSaved)
    def checkpoint_saved(self, msg: CheckpointSaved) -> None:
        self.saved.append(msg)
        self._wake()

    async def until(self, key: str) -> Any:
        while key not in self.done:
            await self.changed.wait()
        return self.done[key]


class BrokenLink:
    """A peer worker's reference over a link that breaks: while ``broken``, a read of
    the file's bytes past ``cut`` times out (once the bytes before it came through).
    ``heals``: the next stream asked for (a resume) works. Counts the bytes read."""

    def __init__(self, ref: ActorRef[Any], cut: int, *, heals: bool) -> None:
        self.ref = ref
        self.cut = cut
        self.heals = heals
        self.broken = True
        self.streams = 0
        self.read = 0
        self.before_cut = anyio.Event()

    async def ask(self, msg: Any, timeout: float | None = None) -> Any:  # noqa: ASYNC109
        if isinstance(msg, (GetData, GetCheckpoint)):  # a new stream: a file's, a checkpoint's
            self.streams += 1
            if self.heals and self.streams > 1:
                self.broken = False
        if isinstance(msg, ReadStream) and self.broken and msg.offset >= self.cut:
            await self.before_cut.wait()
            raise AskTimeout("w1", "ReadStream", 1.0)
        reply = await self.ref.ask(msg, timeout=timeout)
        if isinstance(msg, ReadStream):
            self.read += len(reply.data)
            if msg.offset < self.cut:
                self.before_cut.set()
        return reply

    def post(self, msg: Any) -> None:
        self.ref.post(msg)


def big_file() -> File:
    """A 20 MiB file output: three parts of a stream."""
    path = output_path("big.root")
    with open(path, "wb") as f:
        f.write(payload(99, 20 * MiB))
    return File(path)


def checksum_of(f: File) -> tuple[str, str]:
    return digest(f.path)[1], f.path


async def start_worker(
    system: ActorSystem,
    sched: ActorRef[Any],
    wid: str,
    tmp_path: Path,
    resolve: Any,
    disk: int = 0,
    execution: str = "thread",
) -> tuple[Any, ActorRef[Any]]:
    """A worker actor ``wid`` (its sandbox in ``tmp_path / wid``) and its reference."""
    from actors.worker import Worker

    w = Worker(
        wid, sched, resolve, memory=2**30, disk=disk,
        memory_options={"spill_dir": str(tmp_path / wid), "execution": execution},
    )  # fmt: skip
    return w, await system.spawn(w, wid)


async def holder_and_small_disk(
    system: ActorSystem, sched: ActorRef[Any], tmp_path: Path, disk: int
) -> tuple[dict[str, Any], dict[str, ActorRef[Any]]]:
    """Workers w1 (no disk limit: it makes the files) and w2 (a ``disk`` limit), each
    reaching the other (actors, references)."""
    refs: dict[str, ActorRef[Any]] = {}
    workers: dict[str, Any] = {}
    for wid, limit in (("w1", 0), ("w2", disk)):
        workers[wid], refs[wid] = await start_worker(system, sched, wid, tmp_path, refs.get, limit)
    return workers, refs


async def three_workers(
    system: ActorSystem, sched: ActorRef[Any], tmp_path: Path
) -> tuple[dict[str, Any], dict[str, ActorRef[Any]], dict[str, BrokenLink]]:
    """Workers w1, w2, w3 (actors, references) and the links a test may put between
    them: a worker's peer is reached through ``links[peer]`` once the test sets it."""
    refs: dict[str, ActorRef[Any]] = {}
    workers: dict[str, Any] = {}
    links: dict[str, BrokenLink] = {}

    def resolve(wid: str) -> Any:
        return links.get(wid) or refs.get(wid)

    for wid in ("w1", "w2", "w3"):
        workers[wid], refs[wid] = await start_worker(system, sched, wid, tmp_path, resolve)
    return workers, refs, links


def to_run(key: str, func: Any, *deps: tuple[str, tuple[str, ...], int]) -> Any:
    from actors.protocol import ToRun
    from runtime.graph import Task, TaskRef

    args = [TaskRef(k) for k, _, _ in deps]
    holders = tuple((k, h) for k, h, _ in deps)
    sizes = tuple(n for _, _, n in deps)
    return ToRun(key, Task(key, func, *args), key.split("-")[0], holders, False, sizes)


@pytest.mark.parametrize("heals", [True, False])
async def test_a_worker_resumes_a_file_copy_after_a_broken_link(
    tmp_path: Path, heals: bool
) -> None:
    """w3 copies a 20 MiB file output (three parts of 8 MiB) from w1 over a link that
    breaks after the first part. If the link heals, w3 resumes from w1 at 8 MiB; if not,
    it gives up on w1 after its resumes and goes on from the same byte with w2, the next
    holder (a replica). Either way the bytes before the break are read once."""
    from actors.transfer import PART_BYTES, RESUMES

    size = 20 * MiB
    sched = Recorder()
    with anyio.fail_after(60):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            workers, refs, links = await three_workers(system, sref, tmp_path)
            refs["w1"].post(RunTasks((to_run("big-0", big_file),)))
            assert (await sched.until("big-0")).outcome == "ok"
            held: File = workers["w1"].data["big-0"]
            assert held.size == size and workers["w1"].data.is_file("big-0")
            reply = await refs["w2"].ask(CopyFrom("w1", (("big-0", size),)), timeout=30)
            assert reply.got == ("big-0",)  # w2 has a replica
            link = links["w1"] = BrokenLink(refs["w1"], PART_BYTES, heals=heals)
            links["w2"] = BrokenLink(refs["w2"], size, heals=True)  # never breaks
            refs["w3"].post(
                RunTasks((to_run("read-0", checksum_of, ("big-0", ("w1", "w2"), size)),))
            )
            res = await sched.until("read-0")
            assert res.outcome == "ok", res.error
            got, path = workers["w3"].data["read-0"]
            assert got == held.checksum and path.startswith(str(tmp_path / "w3"))
            assert not find(tmp_path / "w3", "*.part")
            if heals:
                assert link.streams == 2 and link.read == size  # nothing read twice
                assert links["w2"].read == 0 and res.fetches[0][1] == "w1"
            else:
                assert link.streams == 1 + RESUMES and link.read == PART_BYTES
                # The rest came from the next holder, from where the copy broke.
                assert links["w2"].read == size - PART_BYTES
                assert res.fetches[0][1] == "w2"
            assert res.fetches[0][2] == size


async def test_a_worker_without_the_disk_for_a_file_input_refuses_it_before_writing(
    tmp_path: Path,
) -> None:
    sched = Recorder()
    with anyio.fail_after(60):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            _, refs = await holder_and_small_disk(system, sref, tmp_path, 4 * MiB)
            refs["w1"].post(RunTasks((to_run("big-0", big_file),)))
            assert (await sched.until("big-0")).outcome == "ok"
            dep = ("big-0", ("w1",), 20 * MiB)
            refs["w2"].post(RunTasks((to_run("read-0", checksum_of, dep),)))
            res = await sched.until("read-0")
            assert res.outcome == "disk-full" and isinstance(res.error, DiskFull)
            # It names the task whose fetch failed and the input, not the input's task
            # as if that had written something here, and says what helps a fetch.
            err = res.error
            assert (err.key, err.input, err.worker, err.nbytes) == ("read-0", "big-0", "w2",
                                                                     20 * MiB)  # fmt: skip
            text = str(err)
            assert text.startswith("task 'read-0' could not fetch its input 'big-0' (20.0 MiB)")
            assert "nothing was written: the copy was refused before its first byte" in text
            assert "larger --disk (disk_per_worker)" in text and "release the futures" in text
            assert "wrote an output" not in text and 'resources={"disk"' not in text
            left = [p.name for p in (tmp_path / "w2").rglob("*") if p.is_file()]
            assert left == [".owner"]  # its sandbox's lock file only
    # A copy the file system stopped partway (ENOSPC) says its partial file went.
    text = str(DiskFull("read-0", "w2", 20 * MiB, 0, 4 * MiB, input="big-0", partial=True))
    assert "the file system filled during the copy; its partial file was removed" in text


def sized_file(i: int, nbytes: int) -> File:
    """A file output of ``nbytes`` random bytes."""
    path = output_path(f"part-{i}.root")
    Path(path).write_bytes(payload(i, nbytes))
    return File(path)


def sizes(*files: File) -> int:
    return sum(os.path.getsize(f.path) for f in files)


async def test_file_inputs_copied_in_one_batch_count_until_the_store_has_them(
    tmp_path: Path,
) -> None:
    """w2 (a 5 MiB --disk) runs a task reading three 2 MiB file outputs of w1, copied
    one after the other in one fetch. A copy that has landed is on w2's disk before its
    batch ends and the store counts it: the third copy, which would take w2 to 6 MiB,
    is refused before its first byte, not made (each copy used to see only the copies
    still under way, and the task ran with 6 MiB on a 5 MiB disk)."""
    from actors.protocol import ToRun
    from runtime.graph import Task

    sched = Recorder()
    with anyio.fail_after(60):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            workers, refs = await holder_and_small_disk(system, sref, tmp_path, 5 * MiB)
            keys = [f"part-{i}" for i in range(3)]
            made = tuple(
                ToRun(k, Task(k, sized_file, i, 2 * MiB), "part", (), False, ())
                for i, k in enumerate(keys)
            )
            refs["w1"].post(RunTasks(made))
            for k in keys:
                assert (await sched.until(k)).outcome == "ok"
            deps = [(k, ("w1",), 2 * MiB) for k in keys]
            refs["w2"].post(RunTasks((to_run("all-0", sizes, *deps),)))
            res = await sched.until("all-0")
            assert res.outcome == "disk-full" and isinstance(res.error, DiskFull), res
            err = res.error
            assert (err.key, err.worker, err.nbytes) == ("all-0", "w2", 2 * MiB)
            assert err.input in keys and err.room < 2 * MiB
            assert "nothing was written" in str(err)
            held = sum(p.stat().st_size for p in (tmp_path / "w2").rglob("*") if p.is_file())
            assert held <= 5 * MiB
            w2 = workers["w2"]
            assert w2._disk_used() <= 5 * MiB and w2._incoming == 0


def test_the_registry_counts_file_outputs_and_their_copies() -> None:
    from actors.protocol import FileFact
    from actors.registry import FileTable

    t = FileTable()
    t.handle(
        (
            FileFact("f", "created", 100, ("w1",), 1, False, True),
            FileFact("v", "created", 7, ("w1",), 1, False),  # a value: not counted
        )
    )
    assert (t.file_outputs, t.file_bytes) == (1, 100)
    t.handle((FileFact("f", "created", 100, ("w1", "w2"), 1, False, True),))  # a replica
    assert (t.file_outputs, t.file_bytes) == (1, 200)
    t.handle((FileFact("f", "created", 100, ("w1", "w2"), 0, False, True),))  # pruned
    assert t.files["f"].state == "released"
    summary = t.summary()
    assert (summary["file_outputs"], summary["file_bytes"]) == (0, 0)


# ------------------------------------------------------------------ the executor


def gated_file(gate: str, started: str) -> File:
    """Waits at the gate, then writes a file output."""
    from tests.helpers import held_at_gate

    held_at_gate(gate, started)
    path = output_path("late.bin")
    Path(path).write_bytes(b"z" * 1000)
    return File(path)


async def test_the_file_of_a_try_cancelled_while_it_ran_is_removed(tmp_path: Path) -> None:
    """A thread running a cancelled task is abandoned; the file it still writes and
    returns is removed, and so is its try's directory: nothing stays in the sandbox."""
    from actors.executor import Executor
    from runtime.graph import Task

    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    delivered: list[Any] = []
    ex = Executor(1, "w1", delivered.extend, sandbox=str(sandbox))
    gate, started = tmp_path / "gate", tmp_path / "started"
    try:
        task = Task("late-0", gated_file, str(gate), str(started))
        from actors.protocol import ToRun

        ex.submit(ToRun("late-0", task, "late", ()), {})
        await wait_until(started.exists, "the task running", limit=15)
        ex.cancel("late-0")
        await wait_until(lambda: delivered, "the cancelled try", limit=15)
        assert delivered[0][0].outcome == "cancelled" and ex.abandoned == 1
        gate.touch()
        await wait_until(lambda: ex.abandoned == 0, "the abandoned thread's end", limit=15)
        await wait_until(
            lambda: not [p for p in sandbox.rglob("*") if p.is_file()], "no file left", limit=15
        )
        assert delivered[1:] == []  # its late result was dropped
    finally:
        gate.touch()
        ex.shutdown(wait=True)


def writes_then_waits(gate: str, started: str) -> File:
    """Writes part of a file output, then waits at the gate (killed there)."""
    from tests.helpers import held_at_gate

    path = output_path("partial.bin")
    Path(path).write_bytes(b"p" * 1000)
    held_at_gate(gate, started)
    return File(path)


async def test_a_task_process_killed_mid_write_leaves_nothing_in_the_sandbox(
    tmp_path: Path,
) -> None:
    """Process execution: a task killed (cancelled) while it writes its file output
    never reaches the end of its try, where the try's directory is removed; the worker
    removes what the dead task process left instead, before the try is reported."""
    from actors.executor import ProcessExecutor
    from actors.protocol import ToRun
    from runtime.graph import Task

    sandbox = tmp_path / "sandbox"
    sandbox.mkdir()
    delivered: list[Any] = []
    ex = ProcessExecutor(1, "w1", delivered.extend, sandbox=str(sandbox))
    gate, started = tmp_path / "gate", tmp_path / "started"
    try:
        task = Task("partial-0", writes_then_waits, str(gate), str(started))
        ex.submit(ToRun("partial-0", task, "partial", ()), {})
        await wait_until(started.exists, "the task running", limit=60)
        assert find(sandbox, "partial.bin")  # written in its try's directory
        ex.cancel("partial-0")
        await wait_until(lambda: delivered, "the killed try", limit=30)
        assert delivered[0][0].outcome == "cancelled"
        assert not [p for p in sandbox.rglob("*") if p.is_file()]
        assert not list((sandbox / "out").iterdir())  # no try directory left either
    finally:
        gate.touch()
        ex.shutdown(wait=True)


async def test_a_broken_copy_nothing_resumes_is_removed_after_a_while(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The only holder's link stays broken: the reading task reports its input missing
    (the scheduler would make it again), the bytes copied so far stay for a resume, and
    go once nothing resumed them for the streams' idle time."""
    import actors.transfer

    monkeypatch.setattr(actors.transfer, "IDLE_SECONDS", 2.0)
    sched = Recorder()
    with anyio.fail_after(60):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            refs: dict[str, Any] = {}
            links: dict[str, BrokenLink] = {}
            _, refs["w1"] = await start_worker(system, sref, "w1", tmp_path, refs.get)
            _, refs["w3"] = await start_worker(
                system, sref, "w3", tmp_path, lambda wid: links.get(wid) or refs.get(wid)
            )
            refs["w1"].post(RunTasks((to_run("big-0", big_file),)))
            assert (await sched.until("big-0")).outcome == "ok"
            links["w1"] = BrokenLink(refs["w1"], actors.transfer.PART_BYTES, heals=False)
            dep = ("big-0", ("w1",), 20 * MiB)
            refs["w3"].post(RunTasks((to_run("read-0", checksum_of, dep),)))
            res = await sched.until("read-0")
            assert res.outcome == "missing" and res.missing == (("big-0", "w1"),)
            (part,) = find(tmp_path / "w3", "*.part")
            assert size_of(str(part)) >= actors.transfer.PART_BYTES
            await wait_until(lambda: not exists(str(part)), "the .part file removed", limit=20)


def test_the_console_status_counts_the_file_outputs() -> None:
    from runtime.messages import FilesStatus, StatusReply
    from tests.helpers import status_text as text

    assert "file outputs:" not in text(StatusReply().to_dict())
    st = StatusReply(files=FilesStatus(files=4, file_outputs=3, file_bytes=3 * MiB)).to_dict()
    assert "file outputs: 3 on workers (3.0 MiB with their copies)" in text(st)


# ------------------------------------------------------------------ with checkpoints


def state_and_file(nbytes: int) -> File:
    """A task that saves its own state file as a checkpoint, then a small one, and
    returns that state file as its file output."""
    from runtime import checkpoint, checkpoint_file

    path = output_path("state.bin")
    with open(path, "wb") as f:
        f.write(payload(7, nbytes))
    assert checkpoint_file(path) == 1
    assert checkpoint({"done": True}) == 2
    return File(path)


@pytest.mark.parametrize("execution", ["thread", "process"])
async def test_checkpoints_and_file_outputs_share_one_sandbox_and_one_disk_count(
    tmp_path: Path, execution: str
) -> None:
    """A task checkpoints (a copy of its state file, then an object) and returns the
    state file as a File, in a thread and in a task process. Its worker keeps both in
    one sandbox, counts both (and nothing else) in the disk it reports to the scheduler
    and in its status, counts a dropped checkpoint out, and removes the sandbox with
    everything in it when it stops."""
    from runtime.messages import StatusRequest

    nbytes, disk = 3 * MiB, 64 * MiB
    sched = Recorder()
    with anyio.fail_after(90):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            w, ref = await start_worker(
                system, sref, "w1", tmp_path, lambda _: None, disk, execution=execution
            )
            ref.post(RunTasks((to_run("state-0", functools.partial(state_and_file, nbytes)),)))
            res = await sched.until("state-0")
            assert res.outcome == "ok", res.error
            sandbox = Path(w.data.sandbox())
            held: File = w.data["state-0"]
            assert w.data.is_file("state-0") and Path(held.path).parent == sandbox
            assert held.size == nbytes and digest(held.path)[1] == held.checksum
            ckpts = {seq: path for (_, seq), (path, _) in w.checkpoints.files.items()}
            assert set(ckpts) == {1, 2}
            assert all(Path(p).parent == sandbox / "checkpoints" for p in ckpts.values())
            assert read(ckpts[1]) == read(held.path)  # a copy: the output was moved on
            ckpt_bytes = sum(size_of(p) for p in ckpts.values())
            assert w.checkpoints.nbytes == ckpt_bytes and not w.checkpoints.pending
            assert [(m.seq, m.nbytes) for m in sched.saved] == [
                (1, nbytes), (2, size_of(ckpts[2]))
            ]  # fmt: skip
            used = nbytes + ckpt_bytes  # the file output and both checkpoint files

            async def reported(n: int) -> bool:
                report = sched.latest("w1")
                return report is not None and report.disk_used == n

            await wait_until(lambda: reported(used), "the disk use reported", limit=20)
            report = sched.latest("w1")
            assert report is not None
            assert report.spilled_bytes == nbytes  # the store's bytes on disk
            assert report.disk_free is not None and report.disk_free <= disk - used
            st = await ref.ask(StatusRequest(), timeout=10)
            assert (st.files, st.file_bytes, st.spilled_bytes) == (1, nbytes, nbytes)
            assert (st.checkpoint_bytes, st.disk_used) == (ckpt_bytes, used)
            # A dropped checkpoint leaves the disk count, and the scheduler is told.
            ref.post(DropCheckpointsMsg((("state-0", 1),)))
            await wait_until(lambda: reported(used - nbytes), "the drop reported", limit=20)
            assert not exists(ckpts[1]) and exists(ckpts[2]) and exists(held.path)
            # Stopping removes the sandbox: the file output and the checkpoint left.
            w.stop("test")
            await wait_until(lambda: not sandbox.exists(), "the sandbox removed", limit=20)
    assert not find(tmp_path, "*.ckpt*") and not find(tmp_path, "*state.bin")


def saves_big(nbytes: int) -> int:
    from runtime import checkpoint

    return checkpoint(payload(3, nbytes))


async def test_a_checkpoint_copy_is_checksummed_and_resumed_like_a_file_output(
    tmp_path: Path,
) -> None:
    """w2 copies a 20 MiB checkpoint file from w1 (three parts of 8 MiB) over a link
    that breaks after the first part: the copy resumes from 8 MiB, reads nothing twice,
    and has the holder's sha256. Then w1's file changes on its disk: w3's copy fails
    with FileChecksumError and leaves nothing on w3's disk."""
    from actors.transfer import PART_BYTES

    sched = Recorder()
    with anyio.fail_after(60):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            workers, refs, links = await three_workers(system, sref, tmp_path)
            refs["w1"].post(RunTasks((to_run("ckpt-0", functools.partial(saves_big, 20 * MiB)),)))
            assert (await sched.until("ckpt-0")).outcome == "ok"
            path, nbytes = workers["w1"].checkpoints.find("ckpt-0", 1)
            assert nbytes > 20 * MiB
            link = links["w1"] = BrokenLink(refs["w1"], PART_BYTES, heals=True)
            got = await refs["w2"].ask(FetchCheckpoint("w1", "ckpt-0", 1, nbytes), timeout=30)
            assert got.ok, got.reason
            copy, size = workers["w2"].checkpoints.find("ckpt-0", 1)
            assert size == nbytes and read(copy) == read(path)
            assert link.streams == 2 and link.read == nbytes  # resumed, nothing read twice
            checksum = digest(path)[1]
            assert workers["w1"].checkpoints.checksum("ckpt-0", 1) == checksum
            assert workers["w2"].checkpoints.checksum("ckpt-0", 1) == checksum
            assert not find(tmp_path / "w2", "*.part")
            # The holder's file changed after it was measured: the copy is refused.
            flip_a_byte(path, 12 * MiB)
            link.broken = False
            got = await refs["w3"].ask(FetchCheckpoint("w1", "ckpt-0", 1, nbytes), timeout=30)
            assert not got.ok and "FileChecksumError" in got.reason
            w3 = workers["w3"]
            assert w3.checkpoints.find("ckpt-0", 1) is None and w3.checkpoints.nbytes == 0
            assert not find(tmp_path / "w3", "*.ckpt*")


async def test_a_checkpoint_whose_sha256_takes_longer_than_an_ask_is_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """w1's checkpoint file was never measured, and its sha256 takes 3 s (a large file
    on a slow or busy disk), three times w2's and w3's fetch_timeout. Both copy it at
    once: w1 measures it once, answering "measuring" meanwhile, and both copies land
    with its sha256. Before, the ask for it timed out: no copy of a checkpoint whose
    sha256 took longer than fetch_timeout was ever made, so a preempted task lost
    every step since its start."""
    import actors.worker

    measured: list[str] = []
    real = actors.worker.digest

    def slow(path: str) -> tuple[int, str]:
        measured.append(path)
        time.sleep(3.0)  # the disk is slow: the read takes this long
        return real(path)

    sched = Recorder()
    with anyio.fail_after(60):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            workers, refs, _ = await three_workers(system, sref, tmp_path)
            refs["w1"].post(RunTasks((to_run("ckpt-0", functools.partial(saves_big, MiB)),)))
            assert (await sched.until("ckpt-0")).outcome == "ok"
            path, nbytes = workers["w1"].checkpoints.find("ckpt-0", 1)
            assert workers["w1"].checkpoints.checksum("ckpt-0", 1) == ""  # not measured
            monkeypatch.setattr(actors.worker, "digest", slow)
            got: dict[str, Any] = {}

            async def copy(wid: str) -> None:
                workers[wid].fetch_timeout = 1.0
                ask = FetchCheckpoint("w1", "ckpt-0", 1, nbytes)
                got[wid] = await refs[wid].ask(ask, timeout=30)

            async with anyio.create_task_group() as tg:
                tg.start_soon(copy, "w2")
                tg.start_soon(copy, "w3")
            assert got["w2"].ok and got["w3"].ok, (got["w2"].reason, got["w3"].reason)
            assert measured == [path]  # once, for both
            checksum = real(path)[1]
            for wid in ("w2", "w3"):
                copy_path, size = workers[wid].checkpoints.find("ckpt-0", 1)
                assert size == nbytes and read(copy_path) == read(path)
                assert workers[wid].checkpoints.checksum("ckpt-0", 1) == checksum


async def test_a_checkpoint_file_changed_on_disk_is_never_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """w1's checkpoint file grew on disk after it was saved (something else wrote to
    it): the copy a peer asks for fails, at once and each time, without measuring the
    file again; once the file is dropped, w1 forgets it."""
    import actors.worker

    measured: list[str] = []
    real = actors.worker.digest

    def counted(path: str) -> tuple[int, str]:
        measured.append(path)
        return real(path)

    sched = Recorder()
    with anyio.fail_after(60):
        async with ActorSystem() as system:
            sref = await system.spawn(sched, "scheduler")
            workers, refs, _ = await three_workers(system, sref, tmp_path)
            refs["w1"].post(RunTasks((to_run("ckpt-0", functools.partial(saves_big, MiB)),)))
            assert (await sched.until("ckpt-0")).outcome == "ok"
            path, nbytes = workers["w1"].checkpoints.find("ckpt-0", 1)
            await anyio.Path(path).write_bytes(read(path) + b"not saved by the task")
            monkeypatch.setattr(actors.worker, "digest", counted)
            for _ in range(2):
                got = await refs["w2"].ask(FetchCheckpoint("w1", "ckpt-0", 1, nbytes), timeout=30)
                assert not got.ok
                assert workers["w2"].checkpoints.find("ckpt-0", 1) is None
            assert measured == [path]  # measured once: the second ask is refused at once
            assert workers["w1"]._unservable == {("ckpt-0", 1)}
            refs["w1"].post(DropCheckpointsMsg((("ckpt-0", 0),)))
            await wait_until(lambda: not workers["w1"]._unservable, "forgotten", limit=20)
            assert workers["w1"].checkpoints.find("ckpt-0", 1) is None


def outlives_its_worker(gate: str, started: str, out: str) -> None:
    """Waits at the gate, then tries to make a file output and a checkpoint; writes
    which errors it got to ``out`` (outside the sandbox)."""
    from runtime import CheckpointError, checkpoint
    from tests.helpers import held_at_gate

    held_at_gate(gate, started)
    errors = []
    try:
        output_path("late.bin")
    except FileOutputError as exc:
        errors.append(type(exc).__name__)
    try:
        checkpoint("late")
    except CheckpointError as exc:
        errors.append(type(exc).__name__)
    Path(out).write_text(" ".join(errors))


async def test_a_thread_still_running_when_its_worker_stops_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    """A thread cannot be killed: its task runs on after the worker stopped and removed
    its sandbox. A file output or a checkpoint it then asks for is refused with a typed
    error; neither makes the sandbox again."""
    sched = Recorder()
    gate, started, out = tmp_path / "gate", tmp_path / "started", tmp_path / "out"
    try:
        with anyio.fail_after(60):
            async with ActorSystem() as system:
                sref = await system.spawn(sched, "scheduler")
                w, ref = await start_worker(system, sref, "w1", tmp_path, lambda _: None)
                task = functools.partial(outlives_its_worker, str(gate), str(started), str(out))
                ref.post(RunTasks((to_run("late-0", task),)))
                await wait_until(started.exists, "the task running", limit=30)
                sandbox = Path(w.data.sandbox())
                w.stop("test")
                await wait_until(lambda: not sandbox.exists(), "the sandbox removed", limit=20)
                gate.touch()
                await wait_until(out.exists, "the task's end", limit=30)
        assert read(str(out)) == b"FileOutputError CheckpointError"
        assert not exists(str(sandbox)) and not find(tmp_path / "w1", "*")
    finally:
        gate.touch()
