"""Tests of runtime.codec: round trips of every registered message, rejections, fuzzing.

What lives here: ``strategy_for`` (a Hypothesis strategy for any wire annotation), a
few ``test.*`` message types that exercise every supported field shape, and the
codec's tests. Every registered, non-local message type is round-tripped, so new
messages are covered without touching this file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import struct
import typing
from typing import Any, Literal, Optional, Union

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime import messages
from runtime.codec import (
    KIND_BATCH,
    KIND_FRAME,
    MAGIC,
    MAX_FRAME_BYTES,
    VERSION,
    Frame,
    Pieces,
    decode,
    decode_batch,
    encode,
    encode_batch,
)
from runtime.errors import ProtocolError
from runtime.messages import MESSAGE_TYPES, Message, Outcome, message

INT_MIN = -(2**63)
INT_MAX = 2**64 - 1

# ----------------------------------------------------------------- test-only messages


@message("test.Leaf")
class Leaf(Message):
    blob: bytes
    n: int = 0


@message("test.Shapes")
class Shapes(Message):
    """One field of every supported shape."""

    flag: bool
    count: int
    ratio: float
    name: str
    blob: bytes
    nothing: None
    anything: Any
    homogeneous: tuple[int, ...]
    pair: tuple[str, bytes]
    blobs: list[bytes]
    blob_map: dict[str, bytes]
    maybe_blob: bytes | None
    either: int | str
    number: int | float
    choice: Literal["a", "b", 3, True, None]
    outcome: Outcome
    leaf: Leaf
    leaves: list[Leaf]
    maybe_leaf: Leaf | None
    nested: dict[str, list[tuple[int, bytes]]]
    blob_or_map: bytes | dict[str, int]
    map_or_leaf: dict[str, bytes] | Leaf
    legacy_optional: Optional[str]  # noqa: UP045
    legacy_union: Union[int, bytes, None]  # noqa: UP007
    bare_list: list  # type: ignore[type-arg]
    defaulted: tuple[str, ...] = ()
    factory: dict[str, float] = dataclasses.field(default_factory=dict)


@message("test.Chain")
class Chain(Message):
    """A recursive message type."""

    label: str
    next: Chain | None = None


@message("test.Envelope")
class Envelope(Message):
    """Carries any registered message."""

    inner: Message
    note: str = ""


@message("test.Local", local=True)
class LocalThing(Message):
    obj: Any = None


# ------------------------------------------------------------------------ strategies

_KEYS = st.text(max_size=8) | st.sampled_from(["__b", "__d", "t", "f"])
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(INT_MIN, INT_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.binary(max_size=16),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEYS, inner, max_size=3),
    max_leaves=8,
)
_MESSAGE_STRATEGIES: dict[type, st.SearchStrategy[Any]] = {}


def wire_classes() -> list[type[Message]]:
    """Every registered message type that may cross a process boundary."""
    return [cls for _, cls in sorted(MESSAGE_TYPES.items()) if not cls.local]


def message_strategy(cls: type[Message]) -> st.SearchStrategy[Any]:
    """Instances of ``cls`` (any registered non-local message if ``cls`` is Message)."""
    if cls not in _MESSAGE_STRATEGIES:
        if cls is Message:
            strategy = st.deferred(lambda: st.one_of([message_strategy(c) for c in wire_classes()]))
        else:

            def build() -> st.SearchStrategy[Any]:
                hints = typing.get_type_hints(cls)
                fields = [f for f in dataclasses.fields(cls) if f.init]  # type: ignore[arg-type]
                return st.builds(cls, **{f.name: strategy_for(hints[f.name]) for f in fields})

            strategy = st.deferred(build)
        _MESSAGE_STRATEGIES[cls] = strategy
    return _MESSAGE_STRATEGIES[cls]


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """A strategy of values of wire annotation ``tp`` (the codec's supported set)."""
    simple: dict[Any, st.SearchStrategy[Any]] = {
        type(None): st.none(),
        bool: st.booleans(),
        int: st.integers(INT_MIN, INT_MAX),
        float: st.floats(allow_nan=False, allow_infinity=False),
        str: st.text(max_size=12),
        bytes: st.binary(max_size=32),
        Any: _JSON,
        list: st.lists(_JSON, max_size=3),
        tuple: st.lists(_JSON, max_size=3).map(tuple),
        dict: st.dictionaries(_KEYS, _JSON, max_size=3),
    }
    if tp in simple:
        return simple[tp]
    if isinstance(tp, type) and issubclass(tp, Message):
        return message_strategy(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return st.sampled_from(args)
    if origin is Union or origin is typing.get_origin(int | None):
        return st.one_of([strategy_for(a) for a in args])
    if origin is list:
        return st.lists(strategy_for(args[0]), max_size=3)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return st.lists(strategy_for(args[0]), max_size=3).map(tuple)
    if origin is tuple:
        return st.tuples(*(strategy_for(a) for a in args))
    if origin is dict:
        return st.dictionaries(_KEYS, strategy_for(args[1]), max_size=3)
    raise NotImplementedError(f"strategy_for: no strategy for {tp!r}; extend it")


def frames(cls: type[Message] = Message) -> st.SearchStrategy[Frame]:
    return st.builds(
        Frame,
        message_strategy(cls),
        st.text(max_size=8),
        st.integers(0, INT_MAX),
        st.integers(0, INT_MAX),
    )


def raw(header: object, *buffers: bytes, kind: int = KIND_FRAME) -> bytes:
    """Hand-build a frame from a header object (to test what a bad peer may send)."""
    head = orjson.dumps(header)
    return struct.pack(">BBBBI", MAGIC, VERSION, kind, 0, len(head)) + head + b"".join(buffers)


def rejects(data: bytes, *fragments: str, **kwargs: Any) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        decode(data, **kwargs)
    for fragment in fragments:
        assert fragment in str(info.value)
    return info.value


def sample_shapes() -> Shapes:
    return Shapes(
        flag=True,
        count=-3,
        ratio=0.5,
        name="n",
        blob=b"\x00\x01",
        nothing=None,
        anything={"x": [1, b"raw", {"__b": 7}], "__b": b"y"},
        homogeneous=(1, 2),
        pair=("p", b"q"),
        blobs=[b"a", b"", b"c"],
        blob_map={"k": b"v"},
        maybe_blob=None,
        either="s",
        number=2.5,
        choice=3,
        outcome="worker-lost",
        leaf=Leaf(b"leaf", 1),
        leaves=[Leaf(b"l0"), Leaf(b"l1", 2)],
        maybe_leaf=Leaf(b"m"),
        nested={"z": [(1, b"one"), (2, b"two")]},
        blob_or_map={"__b": 3},
        map_or_leaf={"__d": b"d"},
        legacy_optional="o",
        legacy_union=b"u",
        bare_list=[1, "two", None],
        defaulted=("d",),
        factory={"f": 1.5},
    )


SAMPLES = [
    Frame(messages.Ping(7)),
    Frame(messages.TaskRecord("k", "running", "cat", None, 2), "cause", 3, 0),
    Frame(messages.ErrorReply("ValueError", "boom", b"pickle\x00data"), "", 0, 9),
    Frame(sample_shapes(), "c"),
    Frame(Envelope(Chain("a", Chain("b")), "note")),
]

# ------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("name", [c.wire_name for c in wire_classes()])
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_round_trip_every_registered_message(name: str, data: st.DataObject) -> None:
    frame = data.draw(frames(MESSAGE_TYPES[name]))
    assert decode(encode(frame)) == frame
    assert decode_batch(encode(frame)) == [frame]


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(frames(), max_size=5))
def test_round_trip_batches(batch: list[Frame]) -> None:
    assert decode_batch(encode_batch(batch)) == batch


@pytest.mark.parametrize("frame", SAMPLES, ids=lambda f: type(f.msg).wire_name)
def test_round_trip_samples(frame: Frame) -> None:
    data = encode(frame)
    assert decode(data) == frame
    assert decode(bytearray(data)) == frame
    assert decode(memoryview(b"xx" + data + b"yy")[2:-2]) == frame
    assert decode_batch(encode_batch([frame, frame])) == [frame, frame]


def test_bytes_are_raw_buffers_and_decode_as_bytes() -> None:
    frame = Frame(sample_shapes())
    data = encode(frame)
    assert b"AAEC" not in data  # base64 of b"\x00\x01" never appears
    msg = decode(memoryview(data)).msg
    assert isinstance(msg, Shapes)
    assert type(msg.blob) is bytes and type(msg.leaves[1].blob) is bytes
    assert type(msg.anything["x"][1]) is bytes


def pieces_of(data: bytes, size: int) -> Pieces:
    """``data`` as a transport's chunks of ``size`` bytes would bring it."""
    pieces = Pieces()
    for i in range(0, len(data), size):
        pieces.append(data[i : i + size])
    return pieces


@pytest.mark.parametrize("size", [1, 3, 64, 1000, 1 << 20])
def test_a_frame_in_pieces_decodes_from_them_as_from_the_whole(size: int) -> None:
    """A chunked message is decoded from its chunks as they came (each buffer copied
    out of them once), whatever the cuts: through the prefix, the header, a buffer."""
    frame = Frame(sample_shapes(), "cause", request_id=7)
    batch = [frame, Frame(messages.ErrorReply("E", "t", bytes(range(256)) * 900))]
    for data, frames in ((encode(frame), [frame]), (encode_batch(batch), batch)):
        pieces = pieces_of(data, size)
        assert len(pieces) == len(data)
        assert decode_batch(pieces) == frames
        assert decode(pieces_of(encode(frame), size)) == frame
        shapes = decode_batch(pieces)[0].msg
        assert isinstance(shapes, Shapes) and type(shapes.blob) is bytes
        for start, end in ((0, 1), (0, len(data)), (5, 9), (len(data) - 2, len(data))):
            assert pieces.cut(start, end) == data[start:end]


def test_pieces_keep_no_view_of_a_buffer_that_may_change() -> None:
    data = encode(Frame(messages.ErrorReply("E", "t", b"abc" * 1000)))
    writable = bytearray(data)
    pieces = Pieces()
    pieces.append(memoryview(writable)[:100])
    pieces.append(b"")  # nothing: kept as nothing
    pieces.append(memoryview(writable)[100:])
    writable[-3:] = b"xyz"  # its owner reuses it: the pieces hold what was appended
    assert decode(pieces) == decode(data)


def test_malformed_pieces_are_refused_as_the_whole_is() -> None:
    data = encode(Frame(messages.ErrorReply("E", "t", b"abc")))
    with pytest.raises(ProtocolError, match="1 unexpected trailing byte"):
        decode(pieces_of(data + b"x", 2))
    with pytest.raises(ProtocolError, match="truncated frame"):
        decode(pieces_of(data[:-1], 2))
    with pytest.raises(ProtocolError, match="not a Corral frame"):
        decode(pieces_of(b"\x00" + data[1:], 2))


def test_one_mebibyte_payload_is_not_inflated() -> None:
    payload = bytes(range(256)) * 4096
    frame = Frame(messages.ErrorReply("E", "t", payload))
    data = encode(frame)
    assert len(data) < len(payload) + 1024
    assert decode(data) == frame


def test_bytes_like_values_encode_as_bytes() -> None:
    frame = Frame(messages.ErrorReply("E", "t", bytearray(b"ab")))  # type: ignore[arg-type]
    assert decode(encode(frame)).msg == messages.ErrorReply("E", "t", b"ab")
    view = memoryview(b"xabcx")[1:4]
    frame = Frame(messages.ErrorReply("E", "t", view))  # type: ignore[arg-type]
    assert decode(encode(frame)).msg == messages.ErrorReply("E", "t", b"abc")


def test_escaped_dicts_round_trip() -> None:
    tricky = [{"__b": 0}, {"__d": {"__b": 1}}, {"__d": 5}, {"t": "Ping", "f": {}}, {"__b": b"x"}]
    for value in tricky:
        shapes = dataclasses.replace(sample_shapes(), anything=value, blob_or_map={"__b": 1})
        assert decode(encode(Frame(shapes))).msg == shapes


def test_int_goes_to_int_and_float_fields_take_ints() -> None:
    msg = decode(encode(Frame(dataclasses.replace(sample_shapes(), number=4)))).msg
    assert isinstance(msg, Shapes) and type(msg.number) is int
    record = decode(encode(Frame(messages.TryRecord("k", "w", 1, 2, "ok")))).msg
    assert isinstance(record, messages.TryRecord) and type(record.start) is float
    header = {"t": "TryRecord", "f": {"key": "k", "worker": "w", "start": 1, "stop": 2.5}}
    header["f"]["outcome"] = "ok"
    record = decode(raw(header)).msg
    assert isinstance(record, messages.TryRecord) and record.start == 1.0
    assert type(record.start) is float


def test_omitted_defaults_are_filled_in() -> None:
    frame = decode(raw({"t": "TaskRecord", "f": {"key": "k", "state": "s", "category": "c"}}))
    assert frame == Frame(messages.TaskRecord("k", "s", "c"))
    frame = decode(raw({"t": "SetPolicyRequest", "f": {"kind": "k", "name": "n"}, "c": "x"}))
    assert frame == Frame(messages.SetPolicyRequest("k", "n", {}), "x")


def test_empty_batch() -> None:
    assert decode_batch(encode_batch([])) == []


# ------------------------------------------------------------------ encode rejections


def encode_rejects(frame: Any, *fragments: str) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        encode(frame)
    for fragment in fragments:
        assert fragment in str(info.value)
    return info.value


def test_encode_rejects_wrong_field_types() -> None:
    err = encode_rejects(
        Frame(messages.TaskRecord("k", "s", "c", None, "3")),  # type: ignore[arg-type]
        "TaskRecord.tries: expected int, got str",
    )
    assert (err.field, err.type_name) == ("tries", "TaskRecord")
    encode_rejects(
        Frame(messages.TaskRecord("k", "s", "c", None, True)),
        "TaskRecord.tries: expected int, got bool",
    )
    encode_rejects(
        Frame(dataclasses.replace(sample_shapes(), flag=1)), "test.Shapes.flag: expected bool"
    )
    encode_rejects(
        Frame(messages.TryRecord("k", "w", 0.0, 1.0, "nope")),  # type: ignore[arg-type]
        "TryRecord.outcome: expected one of 'ok'",
    )
    bad_leaf = [Leaf(b"ok"), Leaf(b"ok", "2")]  # type: ignore[arg-type]
    err = encode_rejects(
        Frame(dataclasses.replace(sample_shapes(), leaves=bad_leaf)),
        "test.Shapes.leaves[1].n: expected int, got str",
    )
    assert err.field == "leaves[1].n"
    encode_rejects(
        Frame(dataclasses.replace(sample_shapes(), homogeneous=[1, 2])),
        "test.Shapes.homogeneous: expected tuple[int, ...], got list",
    )
    encode_rejects(
        Frame(dataclasses.replace(sample_shapes(), blob_map={1: b""})), "blob_map: dict key int"
    )
    encode_rejects(
        Frame(dataclasses.replace(sample_shapes(), either=1.5)),
        "test.Shapes.either: expected int | str, got float",
    )
    encode_rejects(
        Frame(dataclasses.replace(sample_shapes(), anything={"x": {1, 2}})),
        "test.Shapes.anything['x']: expected a JSON value",
    )


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_encode_rejects_non_finite_floats(value: float) -> None:
    encode_rejects(Frame(messages.TryRecord("k", "w", value, 0.0, "ok")), "TryRecord.start")
    encode_rejects(
        Frame(dataclasses.replace(sample_shapes(), anything=[value])), "anything[0]", "finite"
    )


@pytest.mark.parametrize("value", [INT_MAX + 1, INT_MIN - 1])
def test_encode_rejects_ints_beyond_64_bits(value: int) -> None:
    encode_rejects(Frame(messages.Ping(value)), "Ping.token", "64 bits")


def test_encode_rejects_surrogates_naming_the_field() -> None:
    err = encode_rejects(Frame(messages.TaskRecord("k", "s", "\ud800")), "TaskRecord.category")
    assert err.field == "category"
    err = encode_rejects(
        Frame(Envelope(Leaf(b""), note="ok"), causal_id="\udfff"), "causal_id", "UTF-8"
    )
    err = encode_rejects(Frame(Envelope(Chain("a", Chain("\ud800")))), "inner.next.label")


def test_encode_rejects_local_unregistered_and_non_messages() -> None:
    encode_rejects(Frame(LocalThing(object())), "test.Local is a process-local message")
    encode_rejects(Frame(Envelope(LocalThing())), "Envelope.inner", "process-local")

    @dataclasses.dataclass(frozen=True, slots=True)
    class Unregistered(Message):
        x: int = 0

    encode_rejects(Frame(Unregistered()), "not a registered message")
    encode_rejects(Frame("hello"), "expected a Message, got str")  # type: ignore[arg-type]
    encode_rejects(messages.Ping(), "expected a Frame")


def test_encode_rejects_bad_envelopes() -> None:
    encode_rejects(Frame(messages.Ping(), causal_id=3), "Frame.causal_id")  # type: ignore[arg-type]
    encode_rejects(Frame(messages.Ping(), request_id=-1), "Frame.request_id")
    encode_rejects(Frame(messages.Ping(), reply_to=True), "Frame.reply_to")


def test_encode_rejects_self_containing_values() -> None:
    loop: list[Any] = []
    loop.append(loop)
    encode_rejects(Frame(dataclasses.replace(sample_shapes(), anything=loop)), "nested too deeply")


def test_encode_respects_max_bytes() -> None:
    frame = Frame(messages.ErrorReply("E", "t", b"x" * 1000))
    with pytest.raises(ProtocolError, match="over the limit"):
        encode(frame, max_bytes=500)
    with pytest.raises(ProtocolError, match="over the limit"):
        encode_batch([frame], max_bytes=500)


def test_encode_batch_names_the_bad_frame() -> None:
    good = Frame(messages.Ping())
    bad = Frame(messages.TaskRecord("k", "s", "c", None, "3"))  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match=r"batch frame 1: TaskRecord\.tries"):
        encode_batch([good, bad])


def test_unsupported_annotations_are_reported() -> None:
    try:

        @message("test.Unsupported")
        class Unsupported(Message):
            values: set[int]

        encode_rejects(Frame(Unsupported({1})), "test.Unsupported.values", "not supported")
    finally:
        MESSAGE_TYPES.pop("test.Unsupported", None)


# ------------------------------------------------------------------ decode rejections


def test_decode_rejects_unknown_type() -> None:
    err = rejects(raw({"t": "NoSuchMessage", "f": {}}), "unknown message type 'NoSuchMessage'")
    assert err.type_name == "NoSuchMessage"


def test_decode_rejects_missing_field() -> None:
    err = rejects(
        raw({"t": "TaskRecord", "f": {"key": "k", "state": "s"}}),
        "TaskRecord.category: required field is missing",
    )
    assert (err.field, err.type_name) == ("category", "TaskRecord")


def test_decode_rejects_extra_field() -> None:
    err = rejects(raw({"t": "Ping", "f": {"token": 1, "zzz": 2}}), "Ping.zzz: unknown field")
    assert err.field == "zzz"


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"tries": "3"}, "TaskRecord.tries: expected int, got str"),
        ({"tries": True}, "TaskRecord.tries: expected int, got bool"),
        ({"tries": 1.0}, "TaskRecord.tries: expected int, got float"),
        ({"worker": 5}, "TaskRecord.worker: expected str | None, got int"),
        ({"key": None}, "TaskRecord.key: expected str, got None"),
    ],
)
def test_decode_rejects_wrong_field_types(fields: dict[str, Any], fragment: str) -> None:
    header = {"t": "TaskRecord", "f": {"key": "k", "state": "s", "category": "c", **fields}}
    err = rejects(raw(header), fragment, "same Corral version")
    assert err.field == next(iter(fields))


def shapes_header(**changes: Any) -> tuple[dict[str, Any], list[bytes]]:
    """The decoded header of the sample Shapes frame with some fields replaced."""
    data = encode(Frame(sample_shapes()))
    head_len = struct.unpack_from(">I", data, 4)[0]
    header = orjson.loads(data[8 : 8 + head_len])
    header["f"].update(changes)
    bufs, offset = [], 8 + head_len
    for n in header["b"]:
        bufs.append(data[offset : offset + n])
        offset += n
    return header, bufs


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"flag": 1}, "test.Shapes.flag: expected bool, got int"),
        ({"choice": "c"}, "test.Shapes.choice: expected one of 'a', 'b', 3, True, None"),
        ({"choice": 1}, "test.Shapes.choice: expected one of"),
        ({"outcome": "fine"}, "test.Shapes.outcome: expected one of 'ok'"),
        ({"nothing": 0}, "test.Shapes.nothing: expected None"),
        ({"ratio": "1"}, "test.Shapes.ratio: expected float, got str"),
        ({"pair": ["p"]}, "test.Shapes.pair: expected tuple[str, bytes]"),
        ({"homogeneous": [1, "2"]}, "test.Shapes.homogeneous[1]: expected int"),
        ({"blob": "AAE="}, "test.Shapes.blob: expected bytes"),
        ({"blob": {"__b": 99}}, "test.Shapes.blob: buffer reference 99 is out of range"),
        ({"blobs": [{"__b": -1}]}, "test.Shapes.blobs[0]: buffer reference -1"),
        ({"anything": {"__b": 50}}, "test.Shapes.anything: buffer reference 50"),
        ({"leaf": {"t": "Ping", "f": {}}}, "test.Shapes.leaf: expected Leaf message, got Ping"),
        ({"leaf": {"t": "test.Leaf", "f": {"blob": 1}}}, "test.Shapes.leaf.blob: expected"),
        ({"leaf": {"t": "test.Leaf"}}, "test.Shapes.leaf: expected Leaf message"),
        ({"leaf": {"t": "Nope", "f": {}}}, "test.Shapes.leaf: unknown message type 'Nope'"),
        ({"leaves": [{"t": "test.Leaf", "f": {}}]}, "test.Shapes.leaves[0].blob: required"),
        ({"nested": {"z": [[1, 2]]}}, "test.Shapes.nested['z'][0][1]: expected bytes"),
        ({"either": None}, "test.Shapes.either: expected int | str, got None"),
        (
            {"maybe_leaf": {"t": "test.Local", "f": {}}},
            "maybe_leaf: expected Leaf message | None, got test.Local message",
        ),
        ({"map_or_leaf": {"k": 1}}, "test.Shapes.map_or_leaf: expected"),
        ({"map_or_leaf": {"t": [1], "f": {}}}, "test.Shapes.map_or_leaf: expected"),
        ({"map_or_leaf": {"__d": []}}, "test.Shapes.map_or_leaf: expected dict"),
        ({"blob_or_map": {"__d": {"k": "v"}}}, "test.Shapes.blob_or_map['k']: expected int"),
        ({"anything": {"__d": 1}}, "test.Shapes.anything: expected an object"),
    ],
)
def test_decode_rejects_bad_values(changes: dict[str, Any], fragment: str) -> None:
    header, bufs = shapes_header(**changes)
    rejects(raw(header, *bufs), fragment)


def sample_status() -> messages.StatusReply:
    return messages.StatusReply(
        workers=(messages.WorkerInfo("w1", 4, 2**30), messages.WorkerInfo("w2", 2, 0, pool="gpu")),
        processing={"w1": 3},
        draining=("w2",),
        rss={"w1": 2**28},
        memory={"w1": messages.WorkerMemoryReport("w1", False, 2**28, 2**29, 2**30)},
        tasks_by_state={"memory": 10, "processing": 3},
        queued=2,
        queues={"*": 2},
        categories={"inc": messages.CategoryStatus(count=10, mean_duration=0.5, peak_rss=7)},
        policies={"placement": "locality"},
        files=messages.FilesStatus(10, {"memory": 10}, {"w1": 800}, 1, 80),
        runs=1,
        recent_runs={"run-1": 13},
        wanted_keys=1,
        autoscaler=messages.AutoscalerStatus({"default": 2}, {"default": 2}, {"b-1": "running"}),
    )


def test_a_status_reply_decodes_to_typed_records() -> None:
    status = sample_status()
    msg = decode(encode(Frame(status, reply_to=4))).msg
    assert msg == status
    assert isinstance(msg, messages.StatusReply)
    assert isinstance(msg.workers[1], messages.WorkerInfo) and msg.workers[1].pool == "gpu"
    assert isinstance(msg.memory["w1"], messages.WorkerMemoryReport)
    assert isinstance(msg.categories["inc"].mean_duration, float)
    assert isinstance(msg.files, messages.FilesStatus)
    assert msg.to_dict()["autoscaler"]["blocks"] == {"b-1": "running"}
    assert msg.to_dict()["draining"] == ["w2"]


def status_header(**changes: Any) -> dict[str, Any]:
    header = orjson.loads(encode(Frame(sample_status()))[8:])
    header["f"].update(changes)
    return dict(header)


def _worker(**fields: Any) -> dict[str, Any]:
    return {"t": "WorkerInfo", "f": {"worker_id": "w", "cores": 1, "memory": 0, **fields}}


@pytest.mark.parametrize(
    ("changes", "fragment", "field"),
    [
        ({"workers": [_worker(cores="4")]}, "workers[0].cores: expected int, got str", ""),
        ({"workers": [_worker(x=1)]}, "workers[0].x: unknown field", "workers[0].x"),
        ({"workers": [{"t": "Ping", "f": {}}]},
         "workers[0]: expected WorkerInfo message, got Ping", ""),
        ({"workers": [{"worker_id": "w"}]}, "workers[0]: expected WorkerInfo message", ""),
        ({"memory": {"w": {"t": "WorkerMemoryReport", "f": {"worker_id": "w", "rss": 1}}}},
         "memory[...].throttled: required field is missing", ""),
        ({"categories": {"c": {"t": "CategoryStatus", "f": {"mean_duration": "1s"}}}},
         "categories[...].mean_duration: expected float, got str", ""),
        ({"queued": None}, "queued: expected int, got None", "queued"),
        ({"draining": "w2"}, "draining: expected array, got str", "draining"),
        ({"files": {"t": "FilesStatus", "f": {"states": {"memory": 1.5}}}},
         "files.states[...]: expected int, got float", ""),
        ({"autoscaler": {"t": "AutoscalerStatus", "f": {"retiring": [1]}}},
         "autoscaler.retiring[0]: expected str, got int", "autoscaler.retiring[0]"),
    ],
)  # fmt: skip
def test_a_malformed_status_field_is_a_protocol_error(
    changes: dict[str, Any], fragment: str, field: str
) -> None:
    err = rejects(raw(status_header(**changes)), "StatusReply." + fragment, "same Corral version")
    assert err.type_name == "StatusReply"
    if field:
        assert err.field == field


def test_decode_rejects_local_messages() -> None:
    rejects(raw({"t": "test.Local", "f": {}}), "process-local")
    rejects(
        raw({"t": "test.Envelope", "f": {"inner": {"t": "test.Local", "f": {}}}}),
        "test.Envelope.inner",
        "process-local",
    )


def test_decode_rejects_bad_prefix_and_header() -> None:
    good = encode(Frame(messages.Ping(1)))
    rejects(b"\x00" + good[1:], "not a Corral frame")
    rejects(good[:1] + b"\x09" + good[2:], "unsupported wire format version 9")
    rejects(good[:2] + b"\x07" + good[3:], "unknown frame kind 7")
    rejects(good[:3] + b"\x01" + good[4:], "reserved prefix byte")
    rejects(good + b"!", "trailing")
    rejects(struct.pack(">BBBBI", MAGIC, VERSION, KIND_FRAME, 0, 3) + b"{x}", "not valid JSON")
    rejects(raw([1, 2]), "must be a JSON object")
    rejects(raw({"t": 1, "f": {}}), '"t"')
    rejects(raw({"t": "Ping"}), 'no "f"')
    rejects(raw({"t": "Ping", "f": [1]}), "Ping: expected an object holding the fields")
    rejects(raw({"t": "Ping", "f": {}, "x": 1}), "unknown key(s) 'x'")
    rejects(raw({"t": "Ping", "f": {}, "c": 1}), "causal_id")
    rejects(raw({"t": "Ping", "f": {}, "q": -1}), "request_id")
    rejects(raw({"t": "Ping", "f": {}, "r": "1"}), "reply_to")
    rejects(raw({"t": "Ping", "f": {}, "b": {}}), "list of buffer lengths")
    rejects(raw({"t": "Ping", "f": {}, "b": [-1]}), "non-negative")
    rejects(raw({"t": "Ping", "f": {}, "b": [4]}, b"ab"), "truncated")
    rejects("text", "expected bytes")  # type: ignore[arg-type]


def test_decode_rejects_batch_shape_errors() -> None:
    single = encode(Frame(messages.Ping()))
    batch = encode_batch([Frame(messages.Ping())])
    rejects(batch, "decode_batch")
    assert decode_batch(single) == [Frame(messages.Ping())]
    with pytest.raises(ProtocolError, match=r"batch frame 1: TaskRecord\.tries"):
        good = {"t": "Ping", "f": {}}
        bad = {"t": "TaskRecord", "f": {"key": "k", "state": "s", "category": "c", "tries": ""}}
        decode_batch(raw({"n": [good, bad]}, kind=KIND_BATCH))
    for header in ({"n": {}}, {"n": [], "x": 1}, {"n": [{"t": "Ping", "f": {}, "b": []}]}):
        with pytest.raises(ProtocolError):
            decode_batch(raw(header, kind=KIND_BATCH))


def test_every_truncation_is_rejected() -> None:
    for frame_bytes in (
        encode(SAMPLES[2]),
        encode(Frame(sample_shapes())),
        encode_batch(SAMPLES),
    ):
        for cut in range(len(frame_bytes)):
            with pytest.raises(ProtocolError):
                decode_batch(frame_bytes[:cut])


def test_oversize_input_is_rejected() -> None:
    data = encode(Frame(messages.ErrorReply("E", "t", b"x" * 100)))
    assert decode(data, max_bytes=len(data)).msg == messages.ErrorReply("E", "t", b"x" * 100)
    rejects(data, "over the limit", max_bytes=len(data) - 1)
    with pytest.raises(ProtocolError, match="over the limit"):
        decode_batch(data, max_bytes=10)
    assert MAX_FRAME_BYTES == 256 * 1024 * 1024


def _framed(head: bytes) -> bytes:
    return struct.pack(">BBBBI", MAGIC, VERSION, KIND_FRAME, 0, len(head)) + head


@pytest.mark.parametrize("depth", [100, 900, 5000])
def test_deep_nesting_never_leaks_other_errors(depth: int) -> None:
    lists = b"[" * depth + b"]" * depth
    _decode_anything(_framed(b'{"t":"test.Shapes","f":{"anything":' + lists + b"}}"))
    link = b'{"label":"x","next":{"t":"test.Chain","f":'
    chain = link * depth + b'{"label":"end"}' + b"}}" * depth
    _decode_anything(_framed(b'{"t":"test.Chain","f":' + chain + b"}"))


def test_encode_rejects_too_deep_nesting() -> None:
    chain = Chain("end")
    for _ in range(300):
        chain = Chain("x", chain)
    encode_rejects(Frame(chain), "nested too deeply")
    assert decode(encode(Frame(Chain("a", Chain("b", Chain("c")))))).msg == Chain(
        "a", Chain("b", Chain("c"))
    )


# --------------------------------------------------------------------------- fuzzing


def _decode_anything(data: bytes) -> None:
    for fn in (decode, decode_batch):
        with contextlib.suppress(ProtocolError):
            fn(data)


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(data: bytes) -> None:
    _decode_anything(data)


@settings(max_examples=300)
@given(st.sampled_from([KIND_FRAME, KIND_BATCH]), st.binary(max_size=200), st.integers(0, 300))
def test_fuzz_random_headers_behind_a_valid_prefix(kind: int, body: bytes, head_len: int) -> None:
    _decode_anything(struct.pack(">BBBBI", MAGIC, VERSION, kind, 0, head_len) + body)


_NAMES = st.sampled_from(sorted(MESSAGE_TYPES)) | st.text(max_size=5)
_FIELD_NAMES = sorted(
    {f.name for cls in MESSAGE_TYPES.values() for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
)
_WIRE_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(INT_MIN, INT_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5)
    | st.builds(lambda i: {"__b": i}, st.integers(-2, 4)),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(_KEYS, inner, max_size=3)
        | st.fixed_dictionaries(
            {"t": _NAMES | inner, "f": st.dictionaries(st.sampled_from(_FIELD_NAMES), inner)}
        )
        | st.fixed_dictionaries({"__d": inner})
    ),
    max_leaves=10,
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    _NAMES,
    st.dictionaries(st.sampled_from(_FIELD_NAMES), _WIRE_JSON),
    st.lists(st.binary(max_size=4), max_size=3),
)
def test_fuzz_structured_headers(name: str, fields: dict[str, Any], bufs: list[bytes]) -> None:
    header = {"t": name, "f": fields, "b": [len(b) for b in bufs]}
    _decode_anything(raw(header, *bufs))
    _decode_anything(raw({"n": [header], "b": header.pop("b")}, *bufs, kind=KIND_BATCH))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from([f.name for f in dataclasses.fields(Shapes)]), _WIRE_JSON)
def test_fuzz_one_field_of_a_valid_frame(field: str, value: Any) -> None:
    header, bufs = shapes_header(**{field: value})
    _decode_anything(raw(header, *bufs))


_VALID = [encode(f) for f in SAMPLES] + [encode_batch(SAMPLES)]


@settings(max_examples=500)
@given(st.sampled_from(_VALID), st.data())
def test_fuzz_single_byte_mutations(data: bytes, draw: st.DataObject) -> None:
    pos = draw.draw(st.integers(0, len(data) - 1))
    value = draw.draw(st.integers(0, 255))
    _decode_anything(data[:pos] + bytes([value]) + data[pos + 1 :])
    _decode_anything(data[:pos] + data[pos + 1 :])
