"""Tests of the worker's spillable store, ``SpillStore`` (actors/store.py).

Real spill files in pytest's ``tmp_path``; no mocks. Sizes are given explicitly
(``put(key, value, nbytes)``) wherever a test checks counters exactly.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Hashable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from dask.sizeof import sizeof
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.store import SpillStore
from tests.helpers import GATE, Gated


def files(store: SpillStore) -> list[Path]:
    """Every file in the store's spill directory (none if it has not been made) but
    its lock file (``.owner``, empty: tests/test_sandbox_sweep.py)."""
    if store.directory is None:
        return []
    return sorted(p for p in Path(store.directory).iterdir() if p.name != ".owner")


def file_bytes(store: SpillStore) -> int:
    return sum(p.stat().st_size for p in files(store))


def owns_bytearray(arr: np.ndarray[Any, Any]) -> bool:
    """Whether ``arr``'s memory is the buffer it was read into (read back without an
    extra copy): a bytearray, or from 1 MiB on the bytes of an uninitialised array
    (``runtime.unpickling.buffer``)."""
    base: Any = arr
    while True:
        while isinstance(base, np.ndarray) and base.base is not None:
            base = base.base
        if not isinstance(base, memoryview):
            break
        base = base.obj
    return isinstance(base, bytearray) or (
        isinstance(base, np.ndarray) and base.dtype == np.uint8 and base.nbytes >= 2**20
    )


def unpicklable() -> dict[str, Any]:
    return {"lock": threading.Lock()}  # neither pickle nor cloudpickle can do a lock


# -- recency -------------------------------------------------------------------------


def test_spills_least_recently_used_first_and_access_refreshes(tmp_path: Path) -> None:
    with SpillStore(tmp_path) as store:
        for key in "abcde":
            store.put(key, key * 10, nbytes=100)
        assert store["a"] == "a" * 10  # a becomes the most recently used
        store.put("b", "B", nbytes=100)  # so does b, overwritten
        assert list(store.keys_in_memory()) == ["c", "d", "e", "a", "b"]
        assert store.spill(150) == 200  # at least 150: c and d
        assert list(store.keys_on_disk()) == ["c", "d"]
        assert list(store.keys_in_memory()) == ["e", "a", "b"]
        assert store["c"] == "c" * 10  # read back: now the most recently used
        assert list(store.keys_in_memory()) == ["e", "a", "b", "c"]
        assert store.spill(1) == 100
        assert list(store.keys_on_disk()) == ["d", "e"]


def test_values_kept_stay_and_values_read_soon_go_last(tmp_path: Path) -> None:
    with SpillStore(tmp_path) as store:
        for key in "abcde":
            store.put(key, key * 10, nbytes=100)
        # a: an input of a running task (writing it frees nothing); b: of a waiting one.
        assert store.spill_keys(250, keep={"a"}, last={"b"}) == ["c", "d", "e"]
        assert store.spill_keys(10**6, keep={"a"}, last={"b"}) == ["b"]
        assert list(store.keys_in_memory()) == ["a"]


def test_get_raw_and_nbytes_leave_recency_alone(tmp_path: Path) -> None:
    with SpillStore(tmp_path) as store:
        store.put("a", 1, nbytes=10)
        store.put("b", 2, nbytes=20)
        assert pickle.loads(store.get_raw("a")) == 1
        assert store.nbytes("a") == 10
        assert "a" in store
        assert store.spill(1) == 10
        assert list(store.keys_on_disk()) == ["a"]


# -- reading back ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "arr",
    [
        np.arange(12_000, dtype=np.float32).reshape(30, 400),
        np.asfortranarray(np.arange(600, dtype=np.int16).reshape(20, 30)),
        np.array([[1 + 2j, 3 - 4j]], dtype=np.complex128),
        np.zeros((0, 5), dtype=np.uint8),
    ],
    ids=["c-order", "f-order", "complex", "empty"],
)
def test_numpy_array_reads_back_writable_and_equal(
    tmp_path: Path, arr: np.ndarray[Any, Any]
) -> None:
    with SpillStore(tmp_path) as store:
        store["x"] = arr.copy()
        assert store.spill(1) == arr.nbytes
        assert "x" in store and list(store.keys_on_disk()) == ["x"]
        back = store["x"]
        assert isinstance(back, np.ndarray)
        np.testing.assert_array_equal(back, arr)
        assert back.dtype == arr.dtype and back.shape == arr.shape
        assert back.flags.writeable
        if arr.size:
            assert owns_bytearray(back)  # out-of-band buffer, no copy after readinto
            back.flat[0] = 7  # writable for real
            assert back.flat[0] == 7
        assert list(store.keys_in_memory()) == ["x"] and store.n_spilled == 0
        assert files(store) == []


def test_non_contiguous_array_reads_back(tmp_path: Path) -> None:
    arr = np.arange(100, dtype=np.int64).reshape(10, 10)[::2, ::3]
    with SpillStore(tmp_path) as store:
        store["x"] = arr
        store.spill(1)
        np.testing.assert_array_equal(store["x"], arr)


def test_python_objects_read_back(tmp_path: Path) -> None:
    obj = {"a": [1, 2.5, "three", (4, None)], "b": {b"bytes", frozenset({5})}}
    offset = 3
    with SpillStore(tmp_path) as store:
        store[("obj", 0)] = obj
        store[("fn", 1)] = lambda x: x + offset  # only cloudpickle can do this one
        store.spill(10**9)
        assert store.n_spilled == 2 and store.unpicklable == 0
        assert store[("obj", 0)] == obj
        assert store[("fn", 1)](1) == 4
        assert store.n_spilled == 0 and files(store) == []


def test_unreadable_spill_file_raises_and_keeps_the_key(tmp_path: Path) -> None:
    with SpillStore(tmp_path) as store:
        store["x"] = np.arange(1000)
        store.spill(1)
        (path,) = files(store)
        with path.open("r+b") as f:
            f.truncate(100)
        with pytest.raises(EOFError):
            store["x"]
        assert "x" in store and list(store.keys_on_disk()) == ["x"]
        assert path.exists()  # not deleted: nothing is thrown away silently


# -- counters --------------------------------------------------------------------------


def test_counters_exact_after_a_sequence(tmp_path: Path) -> None:
    with SpillStore(tmp_path) as store:
        store.put("a", np.ones(100), nbytes=100)
        store.put("b", list(range(50)), nbytes=200)
        store.put("c", "c" * 300, nbytes=300)
        assert (store.memory_bytes, store.disk_bytes) == (600, 0)
        assert (store.spilled_total, store.unspilled_total, store.spill_count) == (0, 0, 0)

        assert store.spill(250) == 300  # a and b
        assert store.memory_bytes == 300
        assert store.disk_bytes == file_bytes(store) > 0
        assert (store.spilled_total, store.spill_count, store.n_spilled) == (300, 2, 2)
        assert store.nbytes("a") == 100 and store.nbytes("b") == 200

        np.testing.assert_array_equal(store["a"], np.ones(100))
        assert store.memory_bytes == 400
        assert store.unspilled_total == 100
        assert store.disk_bytes == file_bytes(store) > 0 and store.n_spilled == 1

        del store["b"]
        assert (store.disk_bytes, store.n_spilled, store.memory_bytes) == (0, 0, 400)
        assert store.spill(10**6) == 400
        assert (store.spilled_total, store.spill_count, store.memory_bytes) == (700, 4, 0)
        assert store.disk_bytes == file_bytes(store)
        assert store["c"] == "c" * 300
        assert (store.unspilled_total, store.memory_bytes) == (400, 300)
        assert len(store) == 2 and set(store) == {"a", "c"}
        assert store.spill(0) == 0


def test_sizeof_used_when_nbytes_not_given_and_zero_when_it_raises(tmp_path: Path) -> None:
    def picky(value: Any) -> int:
        if isinstance(value, str):
            raise TypeError("no strings")
        return 42

    with SpillStore(tmp_path, sizeof=picky) as store:
        store["n"] = 1
        store["s"] = "text"
        store.put("given", "text", nbytes=7)
        assert (store.nbytes("n"), store.nbytes("s"), store.nbytes("given")) == (42, 0, 7)
        assert store.memory_bytes == 49
    with SpillStore(tmp_path) as store:
        arr = np.zeros(1000)
        store["arr"] = arr
        assert store.nbytes("arr") == sizeof(arr)
        with pytest.raises(ValueError):
            store.put("bad", 1, nbytes=-1)


# -- delete, overwrite, missing ----------------------------------------------------------


def test_delete_of_a_spilled_key_removes_its_file(tmp_path: Path) -> None:
    with SpillStore(tmp_path) as store:
        store.put("keep", np.arange(10), nbytes=80)
        store.put("drop", np.arange(20), nbytes=160)
        store.spill(10**6)
        assert len(files(store)) == 2
        keep_file = [p for p in files(store)]
        del store["drop"]
        assert "drop" not in store and len(store) == 1
        assert len(files(store)) == 1 and files(store)[0] in keep_file
        assert store.disk_bytes == file_bytes(store) and store.n_spilled == 1
        with pytest.raises(KeyError):
            del store["drop"]
        np.testing.assert_array_equal(store["keep"], np.arange(10))


def test_overwrite_of_a_spilled_key_replaces_its_file(tmp_path: Path) -> None:
    with SpillStore(tmp_path) as store:
        store.put("k", "old", nbytes=10)
        store.spill(1)
        assert len(files(store)) == 1
        store.put("k", "new", nbytes=20)
        assert files(store) == [] and store.disk_bytes == 0 and store.n_spilled == 0
        assert store["k"] == "new" and store.nbytes("k") == 20
        assert (store.memory_bytes, store.unspilled_total, store.spilled_total) == (20, 0, 10)
        assert list(store.keys_in_memory()) == ["k"]


def test_missing_key_raises_key_error(tmp_path: Path) -> None:
    with SpillStore(tmp_path) as store:
        for call in (store.__getitem__, store.__delitem__, store.nbytes, store.get_raw):
            with pytest.raises(KeyError):
                call("nope")
        assert "nope" not in store and store.get("nope", 5) == 5


# -- what cannot move --------------------------------------------------------------------


def test_unpicklable_value_stays_in_memory_and_others_move(tmp_path: Path) -> None:
    with SpillStore(tmp_path) as store:
        locked = unpicklable()
        store.put("locked", locked, nbytes=1000)  # the least recently used
        store.put("a", [1, 2], nbytes=10)
        store.put("b", {"x": 1}, nbytes=10)
        assert store.spill(15) == 20  # skips "locked", moves a and b
        assert list(store.keys_in_memory()) == ["locked"]
        assert list(store.keys_on_disk()) == ["a", "b"]
        assert store.unpicklable == 1 and not store.disk_full
        assert store.spill(10**6) == 0  # nothing more can move; not retried
        assert store["locked"] is locked
        assert store.memory_bytes == 1000 and store.spill_count == 2
        assert not [p for p in files(store) if p.suffix != ".spill"]  # no partial files
        with pytest.raises(TypeError):
            store.get_raw("locked")

        store.put("locked", "fine now", nbytes=5)  # an overwrite clears the mark
        assert store.unpicklable == 0
        assert store.spill(1) == 5 and store["locked"] == "fine now"
        assert store["a"] == [1, 2] and store["b"] == {"x": 1}


# -- no room -------------------------------------------------------------------------------


def test_disk_limit_stops_spilling_and_loses_nothing(tmp_path: Path) -> None:
    arrays = {k: np.full(1000, i, dtype=np.float64) for i, k in enumerate("abc")}  # 8 kB
    with SpillStore(tmp_path, disk_limit=10_000) as store:
        for k, arr in arrays.items():
            store.put(k, arr, nbytes=arr.nbytes)
        assert store.spill(10**6) == 8000  # a fits, b would pass the limit
        assert store.disk_full
        assert list(store.keys_on_disk()) == ["a"]
        assert list(store.keys_in_memory()) == ["b", "c"]
        assert store.disk_bytes == file_bytes(store) <= 10_000
        assert [p.suffix for p in files(store)] == [".spill"]  # the partial file is gone
        assert store.spill(10**6) == 0 and store.disk_full
        for k, arr in arrays.items():
            np.testing.assert_array_equal(store[k], arr)
        assert not store.disk_full  # reading a back freed its file
        assert store.spill(1) == 8000 and store.n_spilled == 1


def test_write_error_keeps_value_and_sets_disk_full(tmp_path: Path) -> None:
    with SpillStore(tmp_path) as store:
        store.put("a", "a", nbytes=1)
        store.put("b", "b", nbytes=1)
        assert store.spill(1) == 1
        assert store["a"] == "a"  # back in memory, its file gone
        assert store.directory is not None
        os.unlink(os.path.join(store.directory, ".owner"))
        os.rmdir(store.directory)  # every write now fails with FileNotFoundError
        assert store.spill(10) == 0
        assert store.disk_full
        assert list(store.keys_in_memory()) == ["b", "a"] and store.memory_bytes == 2
        assert store["a"] == "a" and store["b"] == "b"

    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    with SpillStore(blocker) as store:  # the spill directory cannot be made
        store.put("x", 1, nbytes=1)
        assert store.spill(1) == 0 and store.disk_full and store["x"] == 1


# -- get_raw -----------------------------------------------------------------------------


def test_get_raw_round_trips_from_memory_and_disk(tmp_path: Path) -> None:
    arr = np.arange(5000, dtype=np.int32).reshape(50, 100)
    obj = {"k": ["v", 1, 2.0]}
    with SpillStore(tmp_path) as store:
        store.put("arr", arr, nbytes=arr.nbytes)
        store.put("obj", obj, nbytes=100)
        store.put("fn", lambda: 3, nbytes=10)
        assert pickle.loads(store.get_raw("fn"))() == 3
        np.testing.assert_array_equal(pickle.loads(store.get_raw("arr")), arr)
        assert pickle.loads(store.get_raw("obj")) == obj

        store.spill(10**6)
        before = (store.memory_bytes, store.disk_bytes, store.unspilled_total, files(store))
        raw_arr = store.get_raw("arr")  # has an out-of-band buffer: decoded, re-pickled
        raw_obj = store.get_raw("obj")  # none: the file's own pickle stream
        back = pickle.loads(raw_arr)
        np.testing.assert_array_equal(back, arr)
        assert back.dtype == arr.dtype and back.shape == arr.shape
        assert pickle.loads(raw_obj) == obj
        assert pickle.loads(store.get_raw("fn"))() == 3
        # Nothing came back into the store.
        assert list(store.keys_on_disk()) == ["arr", "obj", "fn"]
        assert (store.memory_bytes, store.disk_bytes, store.unspilled_total) == before[:3]
        assert files(store) == before[3]


# -- directory and close --------------------------------------------------------------------


def test_close_removes_the_directory_and_is_idempotent(tmp_path: Path) -> None:
    store = SpillStore(tmp_path / "spill")
    assert store.directory is None  # made lazily
    store.put("a", np.arange(100), nbytes=800)
    store.put("b", "b", nbytes=1)
    store.spill(10**6)
    directory = store.directory
    assert directory is not None and Path(directory).parent == tmp_path / "spill"
    assert len(files(store)) == 2
    store.close()
    assert not Path(directory).exists()
    assert (tmp_path / "spill").exists()  # the parent is not ours to remove
    assert len(store) == 0 and store.disk_bytes == 0 and store.memory_bytes == 0
    store.close()  # again: nothing happens


def test_default_directory_and_shared_parent(tmp_path: Path) -> None:
    with SpillStore() as store:
        store["x"] = 1
        store.spill(1)
        assert store.directory is not None
        default = Path(store.directory)
        assert default.name.startswith("corral-spill-") and default.exists()
    assert not default.exists()

    with SpillStore(tmp_path) as one, SpillStore(tmp_path) as two:
        one.put("k", "one", nbytes=1)
        two.put("k", "two", nbytes=1)
        one.spill(1)
        two.spill(1)
        assert one.directory != two.directory
        assert one["k"] == "one" and two["k"] == "two"


# -- a model -----------------------------------------------------------------------------

KEYS: list[Hashable] = ["a", "b", "c", ("x", 0), ("x", 1)]

values = st.one_of(
    st.integers(),
    st.lists(st.text(max_size=5), max_size=20),
    st.builds(
        lambda n, dtype: np.arange(n).astype(dtype),
        st.integers(0, 300),
        st.sampled_from(["i1", "f8", "u4"]),
    ),
    st.just("lock"),  # stands for an unpicklable value
)
operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"),
            st.sampled_from(KEYS),
            values,
            st.none() | st.integers(0, 2000),
        ),
        st.tuples(st.just("get"), st.sampled_from(KEYS)),
        st.tuples(st.just("del"), st.sampled_from(KEYS)),
        st.tuples(st.just("raw"), st.sampled_from(KEYS)),
        st.tuples(st.just("spill"), st.integers(0, 5000)),
    ),
    max_size=25,
)


def steady_sizeof(value: Any) -> int:
    """Deterministic sizes (dask's ``sizeof`` samples long lists at random)."""
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    return len(repr(value))


def same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool((a == b).all())
        )
    return bool(a == b)


@settings(
    max_examples=75,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=operations, disk_limit=st.sampled_from([0, 600, 3000]))
def test_never_loses_a_value_against_a_dict_model(
    tmp_path: Path, ops: list[tuple[Any, ...]], disk_limit: int
) -> None:
    model: dict[Hashable, Any] = {}
    sizes: dict[Hashable, int] = {}
    lru: list[Hashable] = []  # keys in memory, least recently used first
    locked: set[Hashable] = set()
    spilled_total = unspilled_total = spill_count = 0
    store = SpillStore(tmp_path, disk_limit=disk_limit, sizeof=steady_sizeof)

    def touch(key: Hashable) -> None:
        if key in lru:
            lru.remove(key)
        lru.append(key)

    try:
        for op in ops:
            kind = op[0]
            if kind == "put":
                _, key, value, nbytes = op
                if isinstance(value, str) and value == "lock":
                    value = unpicklable()
                    locked.add(key)
                else:
                    locked.discard(key)
                store.put(key, value, nbytes)
                model[key] = value
                sizes[key] = steady_sizeof(value) if nbytes is None else nbytes
                touch(key)
            elif kind == "get":
                key = op[1]
                if key not in model:
                    with pytest.raises(KeyError):
                        store[key]
                    continue
                if key not in lru:
                    unspilled_total += sizes[key]
                got = store[key]
                assert (got is model[key]) if key in locked else same(got, model[key])
                touch(key)
            elif kind == "del":
                key = op[1]
                if key not in model:
                    with pytest.raises(KeyError):
                        del store[key]
                    continue
                del store[key]
                del model[key], sizes[key]
                locked.discard(key)
                if key in lru:
                    lru.remove(key)
            elif kind == "raw":
                key = op[1]
                if key not in model or key in locked:
                    with pytest.raises((KeyError, TypeError)):
                        store.get_raw(key)
                    continue
                assert same(pickle.loads(store.get_raw(key)), model[key])
            else:
                want = op[1]
                movable = [k for k in lru if k not in locked]
                moved = store.spill(want)
                went = [k for k in movable if k not in set(store.keys_in_memory())]
                assert went == movable[: len(went)]  # least recently used first
                assert moved == sum(sizes[k] for k in went)
                if moved < want and want > 0:  # stopped early: for a reason
                    assert store.disk_full or went == movable
                lru = [k for k in lru if k not in went]
                spilled_total += moved
                spill_count += len(went)

            # Nothing lost, and the books agree with the model and with the disk.
            assert set(store) == set(model) and len(store) == len(model)
            assert list(store.keys_in_memory()) == lru
            assert set(store.keys_on_disk()) == set(model) - set(lru)
            assert store.n_spilled == len(model) - len(lru)
            assert store.memory_bytes == sum(sizes[k] for k in lru)
            assert all(store.nbytes(k) == sizes[k] for k in model)
            assert store.unpicklable <= len(locked)
            spill_files = files(store)
            assert all(p.suffix == ".spill" for p in spill_files)
            assert len(spill_files) == store.n_spilled
            assert store.disk_bytes == file_bytes(store)
            assert not disk_limit or store.disk_bytes <= disk_limit
            assert (store.spilled_total, store.unspilled_total, store.spill_count) == (
                spilled_total,
                unspilled_total,
                spill_count,
            )
        for key, value in model.items():
            got = store[key]
            assert (got is value) if key in locked else same(got, value)
    finally:
        directory = store.directory
        store.close()
    assert directory is None or not os.path.exists(directory)


def test_peek_reads_without_moving_anything(tmp_path: Path) -> None:
    with SpillStore(tmp_path) as store:
        store.put("a", np.arange(10), nbytes=80)
        store.put("b", [1, 2], nbytes=10)
        assert store.spill(80) == 80  # "a" goes to disk
        assert np.array_equal(store.peek("a"), np.arange(10))
        assert list(store.keys_on_disk()) == ["a"] and store.unspilled_total == 0
        assert store.peek("b") == [1, 2]
        assert list(store.keys_in_memory()) == ["b"]
        with pytest.raises(KeyError):
            store.peek("missing")


# -- spilling off the event loop ----------------------------------------------------------


async def spill_gated(store: SpillStore, value: Gated, meanwhile: Any) -> list[Hashable]:
    """Spill everything with ``value``'s pickling gated; run ``meanwhile()`` on the
    event loop while it is, then open the gate; return the keys moved."""
    import anyio
    import anyio.to_thread

    moved: list[Hashable] = []

    async def spill() -> None:
        moved.extend(await store.spill_keys_off_loop(10**9))

    with anyio.fail_after(GATE * 2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(spill)
            await anyio.to_thread.run_sync(value.pickling.wait, GATE)
            meanwhile()
            value.go.set()
    assert value.waited == [True]  # the loop ran while the value was pickled
    return moved


@pytest.mark.anyio
async def test_a_value_spilled_off_the_loop_is_served_from_memory_until_its_file_is_in_place(
    tmp_path: Path,
) -> None:
    store = SpillStore(tmp_path)
    value = Gated(b"x" * 1000)
    store.put("a", value, 1000)
    seen: list[Any] = []

    def meanwhile() -> None:
        seen.append((store["a"], store.peek("a"), store.on_disk("a"), store.n_spilled))
        assert [p.suffix for p in files(store)] == [".tmp"]  # half written: not the key's

    assert await spill_gated(store, value, meanwhile) == ["a"]
    assert seen == [(value, value, False, 0)]
    assert store.on_disk("a") and store.memory_bytes == 0 and store.spilled_total == 1000
    assert [p.suffix for p in files(store)] == [".spill"]
    assert store.peek("a") == b"x" * 1000
    store.close()


def change_key_a(store: SpillStore, change: str) -> None:
    """Delete ``"a"``, replace its value, or close ``store`` (``change``)."""
    if change == "delete":
        del store["a"]
    elif change == "replace":
        store.put("a", b"new", 3)
    else:
        store.close()


@pytest.mark.anyio
@pytest.mark.parametrize("change", ["delete", "replace", "close"])
async def test_a_value_deleted_or_replaced_while_spilled_off_the_loop_leaves_no_file(
    tmp_path: Path, change: str
) -> None:
    store = SpillStore(tmp_path)
    value = Gated(b"x" * 1000)
    store.put("a", value, 1000)

    assert await spill_gated(store, value, lambda: change_key_a(store, change)) == []
    assert store.n_spilled == 0 and store.disk_bytes == 0 and store.spilled_total == 0
    assert [p for p in files(store) if p.suffix == ".spill"] == []
    if change == "replace":
        assert store["a"] == b"new" and store.memory_bytes == 3
    else:
        assert "a" not in store and store.memory_bytes == 0
    store.close()


@pytest.mark.anyio
async def test_a_spill_off_the_loop_that_fails_to_write_keeps_the_value_in_memory(
    tmp_path: Path,
) -> None:
    store = SpillStore(tmp_path, disk_limit=100)
    store.put("a", np.ones(1000), 8000)
    store.put("b", np.ones(10), 80)
    assert await store.spill_keys_off_loop(10**9) == []  # "a" has no room: stop
    assert store.disk_full and store.n_spilled == 0 and store.memory_bytes == 8080
    assert np.array_equal(store["a"], np.ones(1000))
    assert files(store) == []  # the partial file went
    store.close()


@pytest.mark.anyio
async def test_a_spill_file_is_deleted_off_the_event_loop(tmp_path: Path) -> None:
    """Unlinking a 200 MB spill file just written took a worker's event loop for over a
    second on a loaded machine. On an event loop, the store deletes a spill file from a
    thread (the loop's default executor), and counts its bytes gone at once; with no
    loop running, it deletes it there and then."""
    import anyio

    from tests.helpers import wait_until

    loop_thread = threading.get_ident()
    unlinked: list[int] = []
    real_unlink = os.unlink

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        unlinked.append(threading.get_ident())
        real_unlink(path, *args, **kwargs)

    with anyio.fail_after(20):
        with SpillStore(tmp_path) as store:
            store.put("a", np.ones(1000), nbytes=8000)
            assert store.spill(1) == 8000 and store.on_disk("a")
            (name,) = (n for n in os.listdir(store.directory or "") if n.endswith(".spill"))
            path = Path(store.directory or "", name)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(os, "unlink", unlink)
                assert store.discard("a") and store.disk_bytes == 0
                await wait_until(lambda: not path.exists(), "the spill file deleted")
            assert unlinked and loop_thread not in unlinked


@pytest.mark.anyio
@pytest.mark.parametrize("change", ["delete", "replace", "close"])
async def test_a_spill_stops_writing_a_value_deleted_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A chaos audit's 800 MB output, dropped while a 30-40 s spill wrote it, stayed in
    the worker's memory until the whole file was written (and was taken for the
    worker's floor). The write stops at the next WRITE_CHUNK once the value is no
    longer its key's, and the value leaves memory with it."""
    import actors.store as store_mod

    written: list[int] = []

    class Counting:
        def __init__(self, file: Any) -> None:
            self.file = file

        def write(self, data: Any) -> int:
            written.append(memoryview(data).nbytes)
            return int(self.file.write(data))

        def __getattr__(self, name: str) -> Any:
            return getattr(self.file, name)

    class CountingSink(store_mod._Sink):
        def __init__(self, file: Any, *args: Any) -> None:
            super().__init__(Counting(file), *args)

    monkeypatch.setattr(store_mod, "_Sink", CountingSink)
    monkeypatch.setattr(store_mod, "WRITE_CHUNK", 1000, raising=False)
    store = SpillStore(tmp_path)
    value = Gated(b"x" * 100_000)
    store.put("a", value, 100_000)

    assert await spill_gated(store, value, lambda: change_key_a(store, change)) == []
    assert sum(written) < 100_000  # the rest was not written
    assert [p for p in files(store) if p.suffix in (".spill", ".tmp")] == []
    store.close()
