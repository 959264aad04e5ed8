"""Task graphs: from what users write to the :class:`TaskSpec` the scheduler runs.

What lives here: normalizing dask graphs (legacy tuples, ``dask._task_spec`` nodes,
``HighLevelGraph`` with layer annotations, and the expressions ``dask.compute`` hands a
scheduler, with their ``__dask_annotations__``) and Corral's own ``submit``/``map`` tasks into
:class:`TaskSpec` objects; validation (missing keys, cycles, requested keys) with errors
that name the keys; graph-structure ordering (``dask.order``); categories from key
prefixes (``dask.utils.key_split``). No I/O, no event loop.

Execution format: every task carries a ``dask._task_spec.GraphNode``; a worker runs it as
``node(inputs)`` with ``inputs`` mapping dependency keys to their values. One format
serves dask graphs and Corral's own API alike.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import heapq
import math
import operator
import pickle
import sys
import types
from collections import OrderedDict
from collections.abc import Callable, Container, Hashable, Iterable, Iterator, Mapping, Sized
from typing import Any, NamedTuple

import dask
import dask._expr
from dask._expr import Expr
from dask._task_spec import (
    Alias,
    DataNode,
    GraphNode,
    NestedContainer,
    Task,
    TaskRef,
    _execute_subgraph,
    convert_legacy_graph,
    parse_input,
)
from dask.base import collections_to_expr, is_dask_collection, unpack_collections
from dask.core import flatten
from dask.order import order as dask_order
from dask.utils import apply, format_bytes, key_split

from runtime.errors import CycleError, GraphError, MissingKeysError, ShuffleMethodError
from runtime.messages import pool_name_problem

__all__ = [
    "ANY_POOL_RESOURCES",
    "INTAKE_PIECE",
    "SMALL_MEMORY",
    "Key",
    "PoolFit",
    "PoolShape",
    "SpecPiece",
    "TaskSpec",
    "Unplaced",
    "build_specs",
    "category_of",
    "check_graph_keys",
    "check_key",
    "check_keys",
    "check_pool_fit",
    "check_shuffle_method",
    "collections_expr",
    "flatten_keys",
    "holds_collection",
    "in_pieces",
    "is_key",
    "known_size",
    "make_task",
    "node_fingerprint",
    "normalize_graph",
    "persist_expr",
    "reject_collection",
    "short_repr",
    "small_memory_notes",
    "unpicklable_error",
    "unplaced_words",
]

#: A task key: a string or a tuple of a string and indices, as in dask (:func:`is_key`).
Key = Hashable

#: Annotations a dask ``HighLevelGraph`` layer may carry that Corral honours.
ANNOTATIONS = ("priority", "retries", "resources", "pool", "timeout")

#: What dask's annotation lookups return for a key that is not annotated.
_Tombstone: Any = getattr(dask._expr, "_AnnotationsTombstone", ())


@dataclasses.dataclass(slots=True)
class TaskSpec:
    """Everything the scheduler needs to know to run one task.

    ``order`` is the position from graph-structure ordering (lower runs first);
    ``priority`` is the user's priority (higher runs first); ``retries`` is the user's
    retry budget for errors raised by the task itself; ``timeout`` the seconds each try
    may execute on its worker (None: no limit), past which it fails with
    :class:`~runtime.errors.TaskTimeout`.
    """

    key: Key
    node: GraphNode
    deps: tuple[Key, ...]
    category: str
    order: int = 0
    priority: float = 0
    retries: int = 0
    resources: dict[str, float] = dataclasses.field(default_factory=dict)
    pool: str | None = None
    timeout: float | None = None


#: dask's ``key_split`` without its own cache. ``dask.utils.key_split`` keeps the
#: latest 100,000 keys it was given, with their prefixes, in a process-wide
#: ``lru_cache``: a manager serving one fresh graph after another (every key new, asked
#: once) filled it with keys of tasks long forgotten, about 17 MB once full (the longrun
#: audit's manager growth over its first 100,000 tasks; benchmarks/manager_growth.py),
#: and a miss there costs more than the split itself.
_key_split: Callable[[Any], Any] = getattr(key_split, "__wrapped__", key_split)


@functools.lru_cache(maxsize=65_536)
def _split(name: str) -> str:
    return str(_key_split(name))


def category_of(key: Key) -> str:
    """The task category: the key's prefix by dask's ``key_split`` convention."""
    if type(key) is tuple and key and type(key[0]) is str:
        return _split(key[0])  # ('x-<token>', 3): every chunk of a layer shares its name
    return str(_key_split(key))


def short_repr(obj: object, limit: int = 60) -> str:
    """``repr(obj)``, cut to ``limit`` characters: for error messages."""
    text = repr(obj)
    return text if len(text) <= limit else text[: limit - 3] + "..."


#: What a key may be, for the errors that say so.
KEYS_ARE = (
    "a key is a str, bytes, int or float (not NaN), or a tuple of those such as ('x', 0), "
    "as in dask: a key of another type (an object(), a class of your own) may not be equal "
    "to its copy in a worker process or a manager, where the task would then never be found"
)


def is_key(key: object) -> bool:
    """Whether ``key`` can be a task key: a str, bytes, int or float other than NaN, or a
    tuple of keys (dask's keys, ``dask.typing.Key``). Exactly these types, not
    subclasses: a key crosses process boundaries (to worker processes, to and from a
    manager) as a copy, and these are the types whose copy is always equal to it."""
    t = type(key)
    if t is str or t is int or t is bytes:
        return True
    if t is tuple:
        return all(is_key(k) for k in key)  # type: ignore[attr-defined]
    return t is float and key == key  # NaN is not equal to itself, nor to its copy


def _what_is_wrong(key: object) -> str:
    """Why ``key`` (one :func:`is_key` refuses) is not a key: its type, or the item of a
    tuple that is not one."""
    if type(key) is tuple:
        for i, item in enumerate(key):
            if not is_key(item):
                return f"its item {i} is not a key: {_what_is_wrong(item)}"
    if type(key) is float:
        return "NaN is not equal to itself"
    return f"{type(key).__name__} is not a key type"


def _bad_key(key: object, where: str, verb: str = "got") -> GraphError:
    return GraphError(
        f"{where} {verb} {type(key).__name__} {short_repr(key)} as a key ({_what_is_wrong(key)}); "
        f"{KEYS_ARE}",
        key=short_repr(key),
    )


def check_key(key: object, where: str) -> None:
    """:class:`GraphError` naming what is wrong if ``key`` (given to ``where``) cannot be
    a key (:func:`is_key`)."""
    if not is_key(key):
        raise _bad_key(key, where)


def flatten_keys(keys: Any) -> list[Key]:
    """All keys in a possibly nested list of keys, in order, without duplicates.
    :class:`GraphError` for a key that cannot be one (:func:`is_key`)."""
    if not isinstance(keys, list):
        check_key(keys, "compute")
        return [keys]
    out: dict[Key, None] = {}
    for k in flatten(keys):
        check_key(k, "compute")
        out[k] = None
    return list(out)


def check_keys(keys: Any) -> tuple[Key, ...]:
    """``submit_graph``'s keys, a flat list (or tuple) of keys, as a tuple;
    :class:`GraphError` saying what they must be otherwise."""
    if isinstance(keys, str | bytes) or not isinstance(keys, Iterable):
        raise GraphError(
            f"submit_graph takes a list of keys, got {type(keys).__name__} {short_repr(keys)}: "
            f"for one key pass [key]; {KEYS_ARE}"
        )
    out: tuple[Key, ...] = tuple(keys)
    for k in out:
        check_key(k, "submit_graph (a flat list of keys; nested lists are for compute)")
    return out


def check_graph_keys(graph: Mapping[Key, Any]) -> None:
    """:class:`GraphError` for the first key of ``graph`` that cannot be one
    (:func:`is_key`): checked where a graph is taken in, embedded or remote alike."""
    for k in graph:
        if type(k) is not str and not is_key(k):
            raise _bad_key(k, "the graph", "has")


def _layer_annotations(graph: Any) -> dict[Key, dict[str, Any]]:
    """Per-key annotations from a HighLevelGraph's layers (empty for a plain dict)."""
    layers = getattr(graph, "layers", None)
    if not isinstance(layers, Mapping):
        return {}
    out: dict[Key, dict[str, Any]] = {}
    for layer in layers.values():
        ann = getattr(layer, "annotations", None) or {}
        picked = {k: v for k, v in ann.items() if k in ANNOTATIONS}
        if not picked:
            continue
        for key in layer:
            values = {}
            for name, value in picked.items():
                v = value(key) if callable(value) else value
                if not isinstance(v, _Tombstone):  # dask's "not annotated" marker
                    values[name] = v
            if values:
                out[key] = values
    return out


def _expr_annotations(expr: Expr) -> dict[Key, dict[str, Any]]:
    """Per-key annotations of a dask expression (what ``dask.compute`` passes a
    scheduler): ``__dask_annotations__`` maps annotation -> {key: value}."""
    out: dict[Key, dict[str, Any]] = {}
    for name, per_key in (expr.__dask_annotations__() or {}).items():
        if name not in ANNOTATIONS:
            continue
        for key, value in per_key.items():
            v = value(key) if callable(value) else value
            if not isinstance(v, _Tombstone):
                out.setdefault(key, {})[name] = v
    return out


#: the resources a task may ask for (``resources=``): what a worker announces
RESOURCES = ("memory", "cores", "disk")


def _checked(key: Key, ann: Mapping[str, Any] | None, defaults: dict[str, Any]) -> dict[str, Any]:
    """The annotations of one task over the submission's defaults, checked, so a bad
    value is a :class:`GraphError` naming the task rather than a scheduler failure."""
    out = dict(defaults)
    out.update(ann or {})
    try:
        out["priority"] = float(out["priority"])
        out["retries"] = int(out["retries"])
        out["resources"] = {str(r): float(v) for r, v in dict(out["resources"] or {}).items()}
    except (TypeError, ValueError) as exc:
        given = ", ".join(f"{name}={out[name]!r}" for name in ("priority", "retries", "resources"))
        raise GraphError(
            f"{_subject(key)} has an invalid setting ({given}: {exc}): priority must be a "
            "number, retries an integer and resources a mapping of names to numbers, "
            "e.g. resources={'memory': 4e9, 'cores': 2}",
            key=key,
        ) from None
    if out["retries"] < 0:
        raise GraphError(f"{_subject(key)} has retries={out['retries']}; it must be >= 0", key=key)
    if out["priority"] != out["priority"]:
        raise GraphError(f"{_subject(key)} has priority=nan; it must be a number", key=key)
    bad = {r: v for r, v in out["resources"].items() if not 0 <= v < math.inf}
    if bad:
        raise GraphError(
            f"{_subject(key)} has resources {bad}: each amount must be a finite number >= 0 "
            "(what one try of the task takes of a worker's resource), e.g. "
            "resources={'memory': 4e9}",
            key=key,
        )
    unknown = sorted(set(out["resources"]) - set(RESOURCES))
    if unknown:
        raise GraphError(
            f"{_subject(key)} has resources {unknown}, which no worker announces: a worker "
            f"has only {', '.join(RESOURCES)} (resources={{'memory': 4e9, 'cores': 2}}). To "
            "send a task to workers of a kind, GPU nodes say, start those workers in a pool "
            "of their own (`--pool gpu`, or a [pools.gpu] table) and give the task "
            "pool='gpu'",
            key=key,
        )
    problem = "" if out["pool"] is None else pool_name_problem(out["pool"])
    if problem:
        raise GraphError(
            f"{_subject(key)} has pool={out['pool']!r}; it must be a pool's name, or None "
            f"(pool left out) for any worker: {problem}",
            key=key,
        )
    out["timeout"] = _timeout(key, out.get("timeout"))
    return out


def _timeout(key: Key, value: Any) -> float | None:
    """A task's ``timeout=``: None, or seconds as a positive finite float;
    :class:`GraphError` naming the task otherwise."""
    if value is None:
        return None
    try:  # a number (numpy's too); not a string, not True
        seconds = math.nan if isinstance(value, str | bytes | bool) else float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise GraphError(
            f"{_subject(key)} has timeout={short_repr(value)}; it must be a number of seconds "
            "> 0 and finite (how long each try may execute on its worker), or None for no "
            "limit, e.g. timeout=600",
            key=key,
        )
    return seconds


#: The "key" of a whole submission's options, in :func:`_checked`'s errors.
SUBMISSION = "(submission)"


def _subject(key: Key) -> str:
    return "the submission" if key == SUBMISSION else f"task {key!r}"


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """One ``submit`` call's settings, checked: what :class:`SubmitGraphRequest` takes
    for a whole submission (hashable, so calls with equal settings go as one graph)."""

    priority: float = 0.0
    retries: int = 0
    resources: tuple[tuple[str, float], ...] = ()
    pool: str | None = None
    timeout: float | None = None

    @classmethod
    def of(
        cls,
        key: Key,
        priority: float = 0,
        retries: int = 0,
        resources: Mapping[str, float] | None = None,
        pool: str | None = None,
        timeout: float | None = None,
    ) -> TaskOptions:
        """Checked as a graph's options are: :class:`GraphError` naming ``key``."""
        opts = _checked(
            key, None, {"priority": priority, "retries": retries, "resources": resources,
                        "pool": pool, "timeout": timeout}
        )  # fmt: skip
        return cls(
            opts["priority"], opts["retries"], tuple(sorted(opts["resources"].items())),
            opts["pool"], opts["timeout"],
        )  # fmt: skip


def _materialize(
    graph: Any, notes: list[str] | None = None
) -> tuple[Mapping[Key, Any], dict[Key, dict[str, Any]]]:
    """The graph as a mapping, and its per-key annotations.

    A dask expression whose graphs carry annotations Corral honours (``dask.annotate``)
    is optimized keeping them: without dask's low-level linear fusion, which drops every
    layer's annotations (blockwise fusion, which combines them, is kept), and the tasks
    fused all the same (a bag's, a delayed's with ``optimization.fuse.delayed``) take the
    annotations of the tasks they carry out (:func:`_carried`). What cannot be kept is
    said in ``notes``."""
    if not isinstance(graph, Expr):
        return graph, _layer_annotations(graph)
    graph, aliases = _task_shuffles(graph)
    given = _given_annotations(graph)
    # (dask's config is the process's: dask code in other threads meanwhile sees it too)
    with _task_shuffle_default():
        if not given:
            dsk = graph.__dask_graph__()
            return ({**dsk, **aliases} if aliases else dsk), _expr_annotations(graph)
        with dask.config.set({"optimization.fuse.active": False}):
            dsk = graph.__dask_graph__()  # optimized (once: dask caches it) without it
            annotations = _expr_annotations(graph)
    carried = _carried(dsk, annotations, given, notes)
    return ({**dsk, **aliases} if aliases else dsk), carried


# ----------------------------------------------------------------------------- shuffles
# dask's disk shuffle (partd) has tasks that append rows to a directory outside their
# outputs: a task run again (a lost worker's, a speculative copy) appends them twice,
# and workers on several machines do not share the directory. dask's p2p shuffle runs
# only on dask.distributed's workers. Corral runs dask's task shuffle instead, or refuses.

_SHUFFLE_METHOD = "dataframe.shuffle.method"


def _task_shuffle_default() -> contextlib.AbstractContextManager[Any]:
    """dask's shuffle method ``"tasks"`` while dask lowers an expression here, unless
    one is set (a method set that Corral cannot run is refused in the graph it gives,
    :func:`_refuse_unsafe_shuffles`): dask's default without a dask.distributed client
    is the disk shuffle."""
    if dask.config.get(_SHUFFLE_METHOD, None) is None:
        scoped: contextlib.AbstractContextManager[Any] = dask.config.set({_SHUFFLE_METHOD: "tasks"})
        return scoped
    return contextlib.nullcontext()


def _expr_nodes(expr: Expr, into: Callable[[Expr], bool] = lambda node: True) -> Iterable[Expr]:
    """Every node of ``expr`` once (also inside a list operand: dask's ``Fused``), but
    not below a node ``into`` says no to."""
    stack, seen = [expr], set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        if not into(node):
            continue
        for op in node.operands:
            if isinstance(op, Expr):
                stack.append(op)
            elif isinstance(op, list):
                stack.extend(o for o in op if isinstance(o, Expr))


def _lowered_shuffles(expr: Expr) -> tuple[list[Expr], list[Expr]]:
    """The disk shuffles and the p2p shuffles (and joins) of a lowered dataframe
    expression (what ``dask.compute`` hands a scheduler)."""
    if "dask.dataframe" not in sys.modules:  # no dataframe was made: none of them
        return [], []
    try:
        from dask.dataframe.dask_expr._merge import HashJoinP2P
        from dask.dataframe.dask_expr._shuffle import DiskShuffle, P2PShuffle
    except ImportError:  # pragma: no cover - a dask without them: nothing to find
        return [], []
    disk: list[Expr] = []
    p2p: list[Expr] = []
    for node in _expr_nodes(expr):
        if isinstance(node, DiskShuffle):
            disk.append(node)
        elif isinstance(node, P2PShuffle | HashJoinP2P):
            p2p.append(node)
    return disk, p2p


def check_shuffle_method(graph: object) -> None:
    """Refuse, in the client (whose dask config chose it), a dask expression lowered to
    a shuffle Corral cannot run: :class:`ShuffleMethodError` for a p2p shuffle, and for
    a disk shuffle when dask's config asks for it (with the method unset, the manager
    runs it as the task shuffle: :func:`_task_shuffles`)."""
    if not isinstance(graph, Expr):
        return
    disk, p2p = _lowered_shuffles(graph)
    chosen = dask.config.get(_SHUFFLE_METHOD, None)
    where = f"dask.config's {_SHUFFLE_METHOD} is {chosen!r}"
    if p2p:
        raise ShuffleMethodError("p2p", where if chosen == "p2p" else f"{p2p[0]._name!r}")
    if disk and chosen == "disk":
        raise ShuffleMethodError("disk", where)


def _task_shuffles(expr: Expr) -> tuple[Expr, dict[Key, Alias]]:
    """``expr`` with its disk shuffles made task shuffles (the same partitions of the
    same frame), and the aliases that give its output keys, which then change, their
    names of before. dask lowers a dataframe expression in the client, in
    ``dask.compute``, with dask's default method there: the disk shuffle."""
    disk, _ = _lowered_shuffles(expr)
    if not disk:
        return expr, {}
    from dask.dataframe.dask_expr._shuffle import TaskShuffle

    new = expr
    for node in disk:
        new = new.substitute(node, TaskShuffle(*node.operands))
    old_keys = list(flatten(expr.__dask_keys__()))
    new_keys = list(flatten(new.__dask_keys__()))
    if len(old_keys) != len(new_keys):  # pragma: no cover - dask changed: refuse
        raise ShuffleMethodError("disk", repr(disk[0]._name))
    aliases = {o: Alias(o, n) for o, n in zip(old_keys, new_keys, strict=True) if o != n}
    return new, aliases


def _shuffle_method_of(func: Any) -> str | None:
    """``"disk"`` or ``"p2p"`` for a task function of dask's disk or p2p shuffle (not a
    ``functools.partial``: the function it calls)."""
    kind = func if isinstance(func, type) else type(func)
    module = getattr(func, "__module__", None) or kind.__module__ or ""
    name = getattr(func, "__qualname__", None) or kind.__qualname__
    if (
        module.startswith("partd")  # makes the partd: partd.File, partd.Python, ...
        or kind.__name__ == "maybe_buffered_partd"
        or name.endswith("DiskShuffle._shuffle_group")
        or (module == "dask.bag.core" and name == "partition")
    ):
        return "disk"
    if module.startswith("distributed.shuffle"):
        return "p2p"
    return None


def _refuse_unsafe_shuffles(nodes: Mapping[Key, GraphNode]) -> None:
    """:class:`ShuffleMethodError` for a graph with a task of dask's disk or p2p shuffle
    (a graph made by dask with that method, as a dict or a ``HighLevelGraph``): known by
    the task's function, each distinct function looked at once."""
    seen: dict[int, str | None] = {}
    for key, node in nodes.items():
        func = getattr(node, "func", None)
        while isinstance(func, functools.partial):
            func = func.func
        if func is apply and node.args:  # (apply, partd.File, (), {...})
            first = node.args[0]
            func = first.value if isinstance(first, DataNode) else first
        if func is None:
            continue
        try:
            method = seen[id(func)]
        except KeyError:
            method = seen[id(func)] = _shuffle_method_of(func)
        if method is not None:
            raise ShuffleMethodError(method, f"task {key!r}")


def _given_annotations(expr: Expr) -> dict[Key, dict[str, Any]]:
    """The annotations the user gave (the layers of the not yet optimized graphs of
    ``expr``'s collections) that Corral honours, per key."""
    out: dict[Key, dict[str, Any]] = {}
    hlg = dask._expr.HLGExpr
    for node in _expr_nodes(expr, into=lambda node: not isinstance(node, hlg)):
        # optimized: what it may drop
        if isinstance(node, hlg) and node.low_level_optimizer is not None:
            out.update(_layer_annotations(node.hlg))
    return out


def _inner_keys(node: Any) -> Iterable[Key]:
    """The keys of the tasks a task fused by dask (``_execute_subgraph``) runs."""
    if not (isinstance(node, Task) and node.func is _execute_subgraph and node.args):
        return
    inner = node.args[0]
    inner = inner.value if isinstance(inner, DataNode) else inner
    if isinstance(inner, Mapping):
        for k, sub in inner.items():
            yield k
            yield from _inner_keys(sub)


def _carried(
    dsk: Mapping[Key, Any],
    annotations: dict[Key, dict[str, Any]],
    given: Mapping[Key, dict[str, Any]],
    notes: list[str] | None,
) -> dict[Key, dict[str, Any]]:
    """``annotations`` (what dask kept) with the ``given`` annotations of the tasks each
    task of ``dsk`` carries out: its own key's and, for a task dask fused, those of the
    tasks fused into it, combined (:func:`_combined`). An annotation given that no task
    of ``dsk`` carries is said in ``notes``."""
    out = dict(annotations)
    bounded: list[Key] = []  # fused tasks with a timeout: it now bounds all their work
    for k, node in dsk.items():
        carried = list(dict.fromkeys((k, *_inner_keys(node))))
        parts = [given[i] for i in carried if i in given]
        if not parts:
            continue
        own = annotations.get(k)
        out[k] = ann = _combined(k, [own, *parts] if own and k not in given else parts)
        if len(carried) > 1 and ann.get("timeout") is not None:
            bounded.append(k)
    if bounded:
        _note(
            notes,
            f"dask's graph optimization fused tasks, some with timeout= (dask.annotate), "
            f"into {_some(bounded)}: the timeout bounds each try of the fused task, all its "
            "work. Compute with optimize_graph=False to have it bound their own work only",
        )
    kept = {name for ann in out.values() for name in ann}
    for name in sorted({name for ann in given.values() for name in ann} - kept):
        keys = [k for k, ann in given.items() if name in ann]
        _note(
            notes,
            f"the annotation {name}= (dask.annotate) of {_some(keys)} applies to no task: "
            "dask's graph optimization dropped it. Compute with optimize_graph=False to "
            "have it apply",
        )
    return out


def _some(keys: list[Key], most: int = 3) -> str:
    shown = ", ".join(repr(k) for k in keys[:most])
    return f"task(s) {shown}" + (f" and {len(keys) - most} more" if len(keys) > most else "")


def _note(notes: list[str] | None, text: str) -> None:
    if notes is not None and text not in notes:
        notes.append(text)


def _combined(key: Key, parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The annotations of task ``key``, into which dask fused tasks annotated ``parts``:
    what is safe for all of them (the most retries, the highest priority, of each
    resource the most, the longest timeout). Different pools are a :class:`GraphError`."""
    if len(parts) == 1:
        return parts[0]
    out: dict[str, Any] = {}
    for name in ANNOTATIONS:
        values = [p[name] for p in parts if name in p]
        if not values:
            continue
        if name == "resources":
            merged: dict[str, Any] = {}
            for r in values:
                for res, amount in dict(r or {}).items():
                    merged[res] = amount if res not in merged else max(merged[res], amount)
            out[name] = merged
        elif name == "pool":
            pools = list(dict.fromkeys(values))
            if len(pools) > 1:
                raise GraphError(
                    f"task {key!r} runs the work of tasks annotated with different pools "
                    f"({', '.join(map(repr, pools))}): dask's graph optimization fused them "
                    "into one task, which runs in one pool. Compute with "
                    "optimize_graph=False, or give them the same pool",
                    key=key,
                )
            out[name] = pools[0]
        else:
            try:
                out[name] = (
                    max(v for v in values if v is not None) if name == "timeout" else max(values)
                )
            except ValueError:  # every timeout None
                out[name] = None
            except TypeError:  # not comparable: the odd one out, for _checked to refuse
                out[name] = next((v for v in values if not isinstance(v, int | float)), None)
    return out


class _KnownKeys:
    """``key in this``: a key of the graph, or one already on the cluster."""

    __slots__ = ("graph", "known")

    def __init__(self, graph: Mapping[Key, Any], known: Callable[[Key], bool]) -> None:
        self.graph = graph
        self.known = known

    def __contains__(self, key: object) -> bool:
        try:
            return key in self.graph or self.known(key)
        except TypeError:  # unhashable: a literal, not a key
            return False


def known_size(graph: object) -> int | None:
    """How many tasks ``graph`` has, where that is known without materializing it:
    ``len`` of a dict or ``HighLevelGraph``; None for a dask expression (the number of
    its tasks is known once dask made its graph, which may take a while: ``len`` of the
    ``_ExprSequence`` that ``dask.compute`` hands a scheduler is the number of
    collections in it) or anything else without a length."""
    if isinstance(graph, Expr) or not isinstance(graph, Sized):
        return None
    return len(graph)


def reject_collection(graph: object, *, values: bool = False) -> None:
    """Raise :class:`GraphError` for anything given where a graph belongs that is not
    one: a mapping (a dict, a ``HighLevelGraph``) or a dask expression. A dask
    collection (an array, a dataframe, a ``Delayed``, an xarray ``Dataset``, which is a
    mapping too: anything with ``__dask_graph__`` but an expression) gets its own
    message. Check it before anything else looks at the graph: ``len()`` of a 0-d array
    or a ``Delayed`` raises ``TypeError``, and ``len()`` of a dataframe computes it.

    ``values`` (a client's graph and keys): also a plain dict one of whose values is a
    dask collection, a dict of collections given with keys (``compute({"a": x.sum()},
    "a")``): read as a graph, the collection was taken for a literal, and the answer was
    the collection itself, not its value. One look at each value, no deeper."""
    if isinstance(graph, Expr):
        return
    if hasattr(graph, "__dask_graph__"):
        raise GraphError(
            "got a dask collection with keys, where a graph and its keys belong: give the "
            "collection alone, Cluster.compute(x) (its value) or Cluster.submit_graph(x), "
            "or call dask.compute(x, scheduler=get)"
        )
    if isinstance(graph, Mapping):
        if values and type(graph) in (dict, OrderedDict):
            _reject_collection_values(graph)
        return
    raise GraphError(
        f"got {type(graph).__name__} {short_repr(graph)} as a graph; a graph is a dict of "
        "keys to tasks, e.g. {'a': 1, 'b': (inc, 'a')}, a HighLevelGraph or a dask "
        "expression (for a dask collection x, x.__dask_graph__())"
    )


def _reject_collection_values(graph: Mapping[Any, Any]) -> None:
    """:func:`reject_collection`'s ``values``: a :class:`GraphError` naming the first
    key of ``graph`` whose value is a dask collection."""
    for key, value in graph.items():
        if not isinstance(value, Expr) and is_dask_collection(value):
            raise GraphError(
                f"the graph's value for key {key!r} is a dask collection "
                f"({type(value).__name__}), not a task: a dict of collections is computed "
                "alone, compute({'a': x.sum(), ...}), and gives a dict of their values; a "
                "graph and its keys, compute(graph, keys), holds tasks "
                "(e.g. {'a': 1, 'b': (inc, 'a')})"
            )


def _looked_into(obj: object, in_dicts: bool) -> Iterable[object] | None:
    """What :func:`holds_collection` looks into in ``obj`` (None: nothing, ``obj`` is
    itself a collection or not): a list's or tuple's items; with ``in_dicts``, also a
    plain dict's values, a set's items and a dataclass's fields, as
    ``unpack_collections`` does."""
    if isinstance(obj, list | tuple):
        return obj
    if not in_dicts:
        return None
    if isinstance(obj, set) and type(obj) is set:
        return obj
    if isinstance(obj, dict) and type(obj) in (dict, OrderedDict):
        return obj.values()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return (getattr(obj, f.name) for f in dataclasses.fields(obj))
    return None


def holds_collection(obj: object, *, in_dicts: bool = False) -> bool:
    """Whether ``obj`` is a dask collection (an array, a dataframe, a bag, a
    ``Delayed``, an xarray ``Dataset`` or ``DataArray``), or a list or tuple holding one
    (at any depth), as ``dask.compute`` takes them. A graph (a dict, a
    ``HighLevelGraph``, a dask expression) is none: its keys say what to compute. (A
    mapping may be a collection: an xarray ``Dataset`` is one.)

    ``in_dicts``: also look into the other containers ``dask.compute`` looks into
    (``unpack_collections``): a plain dict's values, a set's items, a dataclass's
    fields, as in ``dask.compute({"mean": x.mean(), "std": x.std()})``; only where a
    dict cannot be a graph."""
    items = _looked_into(obj, in_dicts)
    if items is not None:
        return any(holds_collection(item, in_dicts=in_dicts) for item in items)
    return not isinstance(obj, Expr) and is_dask_collection(obj)


def collections_expr(args: tuple[Any, ...]) -> tuple[Expr, list[Key], Callable[[Any], Any]]:
    """What ``dask.compute(*args)`` hands its scheduler, and how it makes its answer:
    the expression of the collections in ``args`` (lists, tuples, dicts, sets and
    dataclasses are looked into),
    optimized by dask and finalized (each collection's ``__dask_postcompute__``, as a
    task of its own), its keys (one per collection), and ``repack``, which makes the
    values of those keys the tuple ``dask.compute`` returns. Slow for a large
    collection (dask's optimization runs here, and may read a file's metadata): call
    it in a thread."""
    from dask._expr import FinalizeCompute

    collections, repack = unpack_collections(*args, traverse=True)
    expr = FinalizeCompute(collections_to_expr(collections, optimize_graph=True)).optimize()
    return expr, list(flatten(expr.__dask_keys__())), repack


def persist_expr(collections: list[Any]) -> tuple[Expr, list[Any]]:
    """What ``Cluster.persist`` submits for dask ``collections``: their expression,
    optimized by dask (not finalized: the tasks of their own keys, each a chunk), and
    each collection's keys (``__dask_keys__``, as nested as the collection makes
    them), in order. Slow for a large collection, as :func:`collections_expr`: call it in
    a thread."""
    expr = collections_to_expr(list(collections), optimize_graph=True).optimize()
    return expr, list(expr.__dask_keys__())


def normalize_graph(
    graph: Mapping[Key, Any], known: Callable[[Key], bool] | None = None
) -> dict[Key, GraphNode]:
    """Convert any dask graph form into ``{key: GraphNode}``.

    In legacy (tuple) graphs a string or tuple that names a key is a reference, anything
    else a literal; ``known(key)`` adds keys that live on the cluster already, so a new
    graph can refer to the results of earlier ones.
    """
    reject_collection(graph)
    if isinstance(graph, Expr):
        graph = graph.__dask_graph__()
    plain = dict(graph)
    if all(isinstance(v, GraphNode) for v in plain.values()):
        for k, v in plain.items():
            if (type(v) is Task or isinstance(v, NestedContainer)) and _holds_future(v):
                plain[k] = _future_args_as_refs(v)
        return plain
    if known is None:
        return dict(convert_legacy_graph(plain))
    return dict(convert_legacy_graph(plain, all_keys=_KnownKeys(plain, known)))


def _items(obj: Any) -> Any:
    return obj


#: type -> what _holds_future does with its objects: True, a future's (returns True);
#: a function, a container's, gives what it holds to look at; False, nothing
_BUILTIN_KINDS: dict[type, Any] = {list: _items, tuple: _items, set: _items, dict: dict.values}
_KINDS = dict(_BUILTIN_KINDS)
#: _KINDS holds at most this many types, then starts again: types made while a program
#: runs (a class defined in a function, a notebook cell run again) are not kept for ever
KINDS_KEPT = 1024


def _task_items(task: Task) -> Any:
    return (*task.args, *task.kwargs.values())


def _kind_of(t: type) -> Any:
    """``_KINDS[t]``, found once per type: every argument of every task of a graph is
    asked, and looking up ``__dask_future__`` each time made normalize_graph of 100k
    tasks take 0.84 s instead of 0.09 s (6 ms before it looked)."""
    if t in _BUILTIN_KINDS:  # a lookup that met the table emptied by another thread
        return _BUILTIN_KINDS[t]
    if issubclass(t, NestedContainer):  # dask's List, Dict...: a list or dict of a
        kind: Any = operator.attrgetter("args")  # delayed call that also holds a delayed
    elif issubclass(t, Task):  # an inline task: a tuple that holds a delayed is
        kind = _task_items  # tuple(List(...))
    else:
        kind = not issubclass(t, TaskRef) and bool(getattr(t, "__dask_future__", False))
    if len(_KINDS) >= KINDS_KEPT:
        _KINDS.clear()
        _KINDS.update(_BUILTIN_KINDS)
    _KINDS[t] = kind
    return kind


def _holds_future(task: Task) -> bool:
    """Whether a future is among ``task``'s arguments (also in lists, tuples, sets, dict
    values and dask's containers): dask's ``Task`` counts only ``TaskRef``s as
    dependencies, so ``dask.delayed(f)(fut)`` made one that ran ``f`` on the future
    object itself."""
    stack = [*task.args, *task.kwargs.values()]
    while stack:
        obj = stack.pop()
        kind = _KINDS.get(type(obj))
        if kind is None:
            kind = _kind_of(type(obj))
        if kind is True:
            return True
        if kind:
            stack.extend(kind(obj))
    return False


def _future_args_as_refs(task: Task) -> Task:
    """``task`` again, each future among its arguments a reference to its key (dask's
    ``parse_input``: an ``Alias``), so it is a dependency, its value the argument; also
    in dask's ``List``, ``Dict``, ... there (``[fut, dask.delayed(g)(1)]`` makes one)
    and in an inline task (``(fut, dask.delayed(g)(1))`` makes ``tuple(List(...))``)."""
    args = tuple(_arg_as_refs(a) for a in task.args)
    if isinstance(task, NestedContainer):  # (its kwargs: only its constructor, its class's)
        container = type(task)(*args)
        container.key = task.key  # a graph's own node: dask.delayed([fut, delayed(g)(1)])
        return container
    kwargs = {k: _arg_as_refs(v) for k, v in task.kwargs.items()}
    return Task(task.key, task.func, *args, _data_producer=task.data_producer, **kwargs)


def _arg_as_refs(arg: Any) -> Any:
    if isinstance(arg, Task):  # a List, Dict, ... or an inline task (a tuple's)
        return _future_args_as_refs(arg) if _holds_future(arg) else arg
    return parse_input(arg)


def _check_acyclic(nodes: Mapping[Key, GraphNode]) -> None:
    """Raise :class:`CycleError` naming one cycle, if the graph has any."""
    indeg = {k: 0 for k in nodes}
    dependents: dict[Key, list[Key]] = {k: [] for k in nodes}
    for k, node in nodes.items():
        for d in node.dependencies:
            if d in indeg:
                indeg[k] += 1
                dependents[d].append(k)
    ready = [k for k, n in indeg.items() if n == 0]
    seen = 0
    while ready:
        k = ready.pop()
        seen += 1
        for dep in dependents[k]:
            indeg[dep] -= 1
            if indeg[dep] == 0:
                ready.append(dep)
    if seen == len(nodes):
        return
    # Walk dependencies inside what is left until a key repeats: that is a cycle.
    left = {k for k, n in indeg.items() if n > 0}
    start = next(iter(left))
    path: list[Key] = [start]
    index = {start: 0}
    while True:
        nxt = next(d for d in nodes[path[-1]].dependencies if d in left)
        if nxt in index:
            cycle = [*path[index[nxt] :], nxt]
            raise CycleError([str(k) for k in reversed(cycle)])
        index[nxt] = len(path)
        path.append(nxt)


def _order(nodes: Mapping[Key, GraphNode], wanted: Iterable[Key] = ()) -> dict[Key, int]:
    """Graph-structure ordering of ``nodes`` (culled to ``wanted``, when given): lower
    runs first.

    The parts of the graph that share no task (the tasks of one ``map``, a batch of
    ``submit`` calls, independent delayeds) run in the order they were asked for: each
    part in the order of its first key in ``wanted``, then (parts with none) of its first
    task in ``nodes``. Within a part, ``dask.order``'s order: finish branches before
    starting new ones. A graph without edges has no structure to order by: the (costly)
    ordering pass is skipped.
    """
    asked = dict.fromkeys(k for k in wanted if k in nodes)
    if len(asked) == 1 and len(nodes) > 1:  # culled to one key's inputs: one part
        return dict(dask_order(nodes))
    asked.update(dict.fromkeys(nodes))  # the keys not asked for after, in graph order
    part = _parts_of(nodes)
    if not part:  # no edges: each task is a part
        return {k: i for i, k in enumerate(asked)}
    graph = dask_order(nodes)
    rank: dict[Key, int] = {}
    for k in asked:
        rank.setdefault(part.get(k, k), len(rank))
    if len(rank) == 1:
        return dict(graph)
    ordered = sorted(nodes, key=lambda k: (rank[part.get(k, k)], graph[k]))
    return {k: i for i, k in enumerate(ordered)}


def _parts_of(nodes: Mapping[Key, GraphNode]) -> dict[Key, Key]:
    """For each task of ``nodes`` with a dependency or a dependent in ``nodes``, the
    task that names its part: tasks linked by dependencies within ``nodes``, either way,
    are one part (a dependency outside ``nodes`` links nothing). Empty when no task is
    linked to another."""
    parent: dict[Key, Key] = {}

    def find(k: Key) -> Key:
        root = k
        while (up := parent.get(root, root)) != root:
            root = up
        while k != root:  # point the path walked at the root
            parent[k], k = root, parent[k]
        return root

    for k, node in nodes.items():
        for d in node.dependencies:
            if d in nodes:
                a, b = find(k), find(d)
                if a != b:
                    parent[a] = b
                parent.setdefault(b, b)
    return {k: find(k) for k in parent}


def _cull(nodes: Mapping[Key, GraphNode], wanted: Iterable[Key]) -> dict[Key, GraphNode]:
    """Only the tasks needed to produce ``wanted``."""
    out: dict[Key, GraphNode] = {}
    stack = list(wanted)
    while stack:
        k = stack.pop()
        if k in out:
            continue
        node = nodes[k]
        out[k] = node
        stack.extend(d for d in node.dependencies if d in nodes and d not in out)
    return out


def too_deep() -> GraphError:
    """The error of a graph whose tasks nest tasks in their arguments, ``(inc, (inc,
    (... 0)))``, more deeply than Python's recursion limit lets it be read or pickled."""
    return GraphError(
        "the graph nests tasks inside the arguments of tasks, (f, (f, (f, ...))), more "
        f"deeply than Python's recursion limit (sys.getrecursionlimit() = "
        f"{sys.getrecursionlimit()}) lets it be read, about that many levels (and a task "
        "nested more than a few hundred levels deep fails when it runs). Nothing ran. "
        "Give the inner calls keys of their own, a chain of tasks "
        "({'x0': (f, 0), 'x1': (f, 'x0'), ...}), which has no depth limit.",
        reason="nested too deeply",
    )


def build_specs(
    graph: Mapping[Key, Any],
    wanted: Iterable[Key],
    *,
    known: Callable[[Key], bool] = lambda key: False,
    priority: float = 0,
    retries: int = 0,
    resources: Mapping[str, float] | None = None,
    pool: str | None = None,
    timeout: float | None = None,
    notes: list[str] | None = None,
) -> dict[Key, TaskSpec]:
    """Validate a graph and build the specs of the tasks needed for ``wanted``.

    ``known(key)`` says whether a key the graph refers to already exists on the cluster
    (a result of an earlier submission); such keys are dependencies, not missing keys.
    Raises :class:`MissingKeysError` (a ``KeyError``) for unknown requested keys or
    dependencies, :class:`CycleError` for cycles, :class:`GraphError` for invalid
    priorities, retries, resources, pools or timeouts (options or annotations). Nothing is run
    when it raises. ``notes`` gets what the client is to be told of it: annotations
    dask's graph optimization made apply otherwise, or dropped (:func:`_materialize`),
    and tasks asking for so little memory that it is surely not bytes
    (:func:`small_memory_notes`).
    """
    graph, annotations = _materialize(graph, notes)
    check_graph_keys(graph)
    try:
        nodes = normalize_graph(graph, known)
    except RecursionError:
        raise too_deep() from None
    _refuse_unsafe_shuffles(nodes)
    wanted = list(wanted)
    unknown = [k for k in wanted if k not in nodes and not known(k)]
    if unknown:
        raise MissingKeysError(unknown, requested=True)
    missing: dict[Key, list[Key]] = {}
    for k, node in nodes.items():
        for d in node.dependencies:
            if d not in nodes and not known(d):
                missing.setdefault(d, []).append(k)
    if missing:
        raise MissingKeysError({str(d): [str(u) for u in users] for d, users in missing.items()})
    nodes = _cull(nodes, [k for k in wanted if k in nodes]) if wanted else nodes
    _check_acyclic(nodes)
    positions = _order(nodes, wanted)
    defaults = {
        "priority": priority, "retries": retries, "resources": resources, "pool": pool,
        "timeout": timeout,
    }  # fmt: skip
    plain = _checked(SUBMISSION, None, defaults)
    specs: dict[Key, TaskSpec] = {}
    for k, node in nodes.items():
        ann = annotations.get(k)
        opts = _checked(k, ann, defaults) if ann else plain
        specs[k] = TaskSpec(
            key=k,
            node=node,
            deps=tuple(node.dependencies),
            category=category_of(k),
            order=positions[k],
            priority=opts["priority"],
            retries=opts["retries"],
            resources=dict(opts["resources"]),
            pool=opts["pool"],
            timeout=opts["timeout"],
        )
    if notes is not None:
        notes.extend(small_memory_notes(specs))
    return specs


#: A task's ``resources={"memory": ...}`` below this (1 MiB), but above 0, is taken as
#: asked and said to the client (:func:`small_memory_notes`): no task needs so little
#: that it must ask for it, so it is almost surely a count of MB or MiB (Parsl's
#: ``parsl_resource_specification`` gives memory in MB), not of bytes.
SMALL_MEMORY = 2**20


def small_memory_notes(specs: Mapping[Key, TaskSpec]) -> list[str]:
    """What the client is told of tasks asking for between 0 and :data:`SMALL_MEMORY`
    bytes of memory: one sentence per amount, naming its first task and counting the
    others, each saying memory is in bytes and what was likely meant."""
    small: dict[float, tuple[Key, int]] = {}  # amount -> its first task, how many
    for key, spec in specs.items():
        memory = spec.resources.get("memory", 0)
        if 0 < memory < SMALL_MEMORY:
            first, count = small.get(memory, (key, 0))
            small[memory] = (first, count + 1)
    out = []
    for memory, (first, count) in small.items():
        others = f" (and {count - 1} other task{'s' * (count > 2)} of this submission)"
        others = others if count > 1 else ""
        amount = str(int(memory)) if memory.is_integer() else repr(memory)
        out.append(
            f"task {short_repr(first)}{others} asks for resources={{'memory': {amount}}}, "
            f"which is {amount} bytes: memory is in bytes: did you mean {amount} MiB = "
            f"{amount} * 2**20? (Parsl's memory is in MB.) The task runs as asked; to ask "
            f"for {amount} MiB, give resources={{'memory': {amount} * 2**20}}"
        )
    return out


#: Tasks per piece a large graph is taken in by the scheduler (:func:`in_pieces`): a
#: piece costs its core some tens of milliseconds, and other messages go between pieces.
INTAKE_PIECE = 500


class SpecPiece(NamedTuple):
    """One piece of a graph to take in (:func:`in_pieces`)."""

    #: its tasks: their inputs are earlier pieces' tasks, its own or keys known already
    specs: dict[Key, TaskSpec]
    keys: tuple[Key, ...] = ()  #: the requested keys among them
    hold: tuple[Key, ...] = ()  #: of ``specs``, the ones a later piece reads: kept for it
    #: of earlier pieces' tasks, the ones whose last reader is in ``specs``: let go
    unhold: tuple[Key, ...] = ()
    #: the inputs of ``specs`` that are not tasks of the graph (keys known already):
    #: the scheduler lets no other client's request that touches them go ahead
    reads: frozenset[Key] = frozenset()


def in_pieces(
    specs: Mapping[Key, TaskSpec], keys: Iterable[Key], size: int | None = None
) -> tuple[SpecPiece, ...]:
    """``specs`` cut into pieces of at most ``size`` tasks in dependency order (every
    task's inputs are in an earlier piece, its own, or not in ``specs``): in graph order
    (``TaskSpec.order``) where that is one, so the tasks that would run first come
    first. The requested ``keys`` go with the piece of their task; the ones not in
    ``specs`` (known already) with the first. A graph of at most ``size`` tasks is one
    piece, as given. ``size``: :data:`INTAKE_PIECE` when not given. Costs the graph's
    tasks and edges once: run it where the specs are built (off the event loop)."""
    size = size or INTAKE_PIECE
    keys = tuple(dict.fromkeys(keys))
    if len(specs) <= size:
        return (SpecPiece(dict(specs), keys, reads=_reads(specs.values(), specs)),)
    ordered = sorted(specs.values(), key=_graph_order)
    pos = {s.key: i for i, s in enumerate(ordered)}
    last = _last_readers(ordered, pos, size)
    if last is None:  # graph order is not a dependency order here: make one
        ordered = _dependency_order(ordered, pos)
        pos = {s.key: i for i, s in enumerate(ordered)}
        last = _last_readers(ordered, pos, size)
        assert last is not None
    return _cut(ordered, keys, size, pos, last)


def _last_readers(
    ordered: list[TaskSpec], pos: Mapping[Key, int], size: int
) -> dict[Key, int] | None:
    """The piece of each task's last reader, when later than the task's own; None if
    ``ordered`` is not a dependency order (a task before one of its inputs)."""
    last: dict[Key, int] = {}
    for i, s in enumerate(ordered):
        for d in s.deps:
            j = pos.get(d)
            if j is None:
                continue
            if j >= i:
                return None
            if j // size < i // size:
                last[d] = i // size
    return last


def _graph_order(spec: TaskSpec) -> int:
    return spec.order


def _cut(
    ordered: list[TaskSpec],
    keys: tuple[Key, ...],
    size: int,
    pos: Mapping[Key, int],
    last: dict[Key, int],
) -> tuple[SpecPiece, ...]:
    """:func:`in_pieces` of ``ordered``, a dependency order (``pos``: its positions;
    ``last``: :func:`_last_readers`)."""
    unhold: dict[int, list[Key]] = {}
    for d, p in last.items():
        unhold.setdefault(p, []).append(d)
    wanted = set(keys)
    pieces = []
    for p, start in enumerate(range(0, len(ordered), size)):
        part = {s.key: s for s in ordered[start : start + size]}
        mine = tuple(k for k in keys if k not in pos) if p == 0 else ()
        pieces.append(
            SpecPiece(
                part,
                mine + tuple(k for k in part if k in wanted),
                tuple(k for k in part if k in last),
                tuple(unhold.get(p, ())),
                _reads(part.values(), pos),
            )
        )
    return tuple(pieces)


def _reads(specs: Iterable[TaskSpec], graph: Container[Key]) -> frozenset[Key]:
    """The inputs of ``specs`` that are not in ``graph``."""
    return frozenset(d for s in specs for d in s.deps if d not in graph)


def _dependency_order(ordered: list[TaskSpec], pos: Mapping[Key, int]) -> list[TaskSpec]:
    """``ordered`` (graph order) rearranged so that every task comes after its inputs:
    each task as early as its inputs let it, ties in graph order (acyclic: checked)."""
    waiting = [0] * len(ordered)
    readers: list[list[int]] = [[] for _ in ordered]
    for i, s in enumerate(ordered):
        for d in s.deps:
            j = pos.get(d)
            if j is not None:
                waiting[i] += 1
                readers[j].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    heapq.heapify(ready)
    out: list[TaskSpec] = []
    while ready:
        i = heapq.heappop(ready)
        out.append(ordered[i])
        for r in readers[i]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, r)
    return out


#: What each worker of a configured pool has by its configuration: resource name (of
#: :data:`RESOURCES`) -> (the amount, the pool's setting that sets it, e.g.
#: ``"cores_per_worker"``). A resource left out is not known in advance (a worker's
#: memory when it is the machine's, its disk when it is the free space): not checked.
PoolShape = Mapping[str, tuple[float, str]]


#: The resources a worker of no pool in particular is checked for, at submit, by a task of
#: no pool (:class:`PoolFit`): the scheduler's own wait words say the same two.
ANY_POOL_RESOURCES = ("cores", "memory")


class Unplaced(NamedTuple):
    """The first task of no pool (``key``) asking for more (``asks``: resource ->
    amount, of :data:`ANY_POOL_RESOURCES`) than every worker of every configured pool
    has by its configuration (``has``: pool -> ``(resource, amount, setting)`` of the
    first resource it is short of); ``tasks``: how many tasks of the submission do so."""

    key: Key
    asks: tuple[tuple[str, float], ...]
    has: tuple[tuple[str, tuple[str, float, str]], ...]
    tasks: int


class PoolFit(NamedTuple):
    """What :func:`check_pool_fit` found, short of a refusal. ``unconfigured``: the
    pools the tasks name that are not configured, in the order first named.
    ``unplaced``: the first task of no pool no configured pool's worker could run (None:
    none); a worker joined by hand may have enough, so it is not refused."""

    unconfigured: tuple[str, ...]
    unplaced: Unplaced | None = None


def check_pool_fit(
    specs: Iterable[TaskSpec],
    shapes: Mapping[str, PoolShape],
    where: str = "",
    reserved: Container[str] = (),
) -> PoolFit:
    """Refuse a submission one of whose tasks names a configured pool (one of
    ``shapes``) and asks for more of a resource than every worker of that pool has by
    its configuration: no worker of it could ever run the task, which would wait
    forever. Raises :class:`GraphError` naming the first such task (``key``), what it
    asks (``resource``, ``asked``), what the pool's workers have (``pool``, ``has``)
    and the setting that says so (``setting``); ``count``: how many tasks of the
    submission ask too much. A task of a pool not in ``shapes`` (workers may join it by
    hand, ``--pool``) is not checked, nor, with configured pools (``where`` ""; their
    settings are in ``[pools.NAME]``), one of no pool. ``where`` given: ``shapes`` is
    an embedded cluster's one pool, whose settings are the arguments ``where`` names
    (``"Cluster(...)"``), and a task of no pool runs in it, so is checked too. One
    pass over the tasks.

    Returns (:class:`PoolFit`) the pools the tasks name that are not in ``shapes``, in
    the order first named (with no pool configured, ``shapes`` empty, every pool
    named): a misspelt pool's tasks wait for a worker of it, so the manager says so
    when none has joined. With configured pools (``where`` ""), also the first task of
    no pool asking for more cores or memory than every worker of every pool has: it
    waits for a worker joined by hand, so the manager says so when none has enough.
    The ``reserved`` pools (``any_pool_tasks = false``) never run a task of no pool:
    their shapes are left out of that test."""
    if not shapes:
        return PoolFit(tuple(dict.fromkeys(s.pool for s in specs if s.pool is not None)))
    first: tuple[TaskSpec, str, str, float, tuple[float, str]] | None = None
    count = 0
    others: dict[str, None] = {}
    own = next(iter(shapes)) if where else None  # where a task of no pool runs
    anywhere = {p: shape for p, shape in shapes.items() if p not in reserved}
    unplaced: Unplaced | None = None
    short: dict[tuple[tuple[str, float], ...], tuple[tuple[str, tuple[str, float, str]], ...]]
    short = {}  # the asks of tasks of no pool seen: the pools short of each (none: fits)
    n_unplaced = 0
    for spec in specs:
        pool = own if spec.pool is None else spec.pool
        if pool is None:
            if spec.resources:
                asks = tuple((r, spec.resources[r]) for r in ANY_POOL_RESOURCES
                             if r in spec.resources)  # fmt: skip
                pools_short = short.get(asks)
                if pools_short is None:
                    pools_short = short[asks] = _short_everywhere(asks, anywhere)
                if pools_short:
                    n_unplaced += 1
                    if unplaced is None:
                        unplaced = Unplaced(spec.key, asks, pools_short, 0)
            continue
        shape = shapes.get(pool)
        if shape is None:
            others[pool] = None
            continue
        if not spec.resources:
            continue
        for name, amount in spec.resources.items():
            has = shape.get(name)
            if has is not None and amount > has[0]:
                count += 1
                if first is None:
                    first = (spec, pool, name, amount, has)
                break
    if first is not None:
        raise _too_big_for_pool(*first, shapes, count, where)
    if unplaced is not None:
        unplaced = unplaced._replace(tasks=n_unplaced)
    return PoolFit(tuple(others), unplaced)


def _short_everywhere(
    asks: tuple[tuple[str, float], ...], shapes: Mapping[str, PoolShape]
) -> tuple[tuple[str, tuple[str, float, str]], ...]:
    """For each pool of ``shapes``, the first of ``asks`` its workers have less of, by
    their configuration: ``(pool, (resource, amount, setting))``; empty when the
    workers of some pool have enough (or do not say: memory of the machine's)."""
    has = []
    for pool, shape in shapes.items():
        for name, amount in asks:
            limit = shape.get(name)
            if limit is not None and amount > limit[0]:
                has.append((pool, (name, *limit)))
                break
        else:
            return ()
    return tuple(has)


def unplaced_words(unplaced: Unplaced, joined: str) -> str:
    """What the client is told of ``unplaced`` once no connected worker has enough
    (``joined``: what the connected workers have at most, words of the scheduler's): the
    task, what it asks, what each pool's workers have (the setting that says so), and
    what to do."""
    asks = " and ".join(_amount(r, a, "bytes" if r != "cores" else "") for r, a in unplaced.asks)
    pools = "; ".join(
        f"{pool!r}: {_amount(r, limit)} ({setting} = {limit:.0f} in [pools.{pool}])"
        for pool, (r, limit, setting) in unplaced.has
    )
    more = (
        f" ({unplaced.tasks} tasks of this submission do so; this is the first)"
        if unplaced.tasks > 1
        else ""
    )
    settings = " or ".join(dict.fromkeys(setting for _, (_, _, setting) in unplaced.has))
    flags = " ".join(f"--{r} {a:g}" if r == "cores" else f"--{r} {a:.0f}" for r, a in unplaced.asks)
    return (
        f"task {unplaced.key!r} names no pool and asks for {asks}{more}, more than every "
        f"worker of every configured pool has ({pools}), and {joined}: it waits until a "
        f"worker with enough joins. Give it a pool whose workers have enough (pool=), "
        f"raise {settings} of a pool, or start a worker by hand with enough "
        f"(`python -m runtime worker ADDRESS {flags}`)"
    )


def _amount(resource: str, value: float, how: str = "") -> str:
    """``value`` of ``resource`` in words: "8 cores", "59.60 GiB of memory"; ``how``
    "bytes": and "(64,000,000,000 bytes)"; "exact": "64,000,000,000 bytes of memory"."""
    if resource == "cores":
        return f"{value:g} core{'' if value == 1 else 's'}"
    if how == "exact":
        return f"{int(value):,} bytes of {resource}"
    exact = f" ({int(value):,} bytes)" if how == "bytes" else ""
    return f"{format_bytes(int(value))} of {resource}{exact}"


def _too_big_for_pool(
    spec: TaskSpec,
    pool: str,
    resource: str,
    asked: float,
    has: tuple[float, str],
    shapes: Mapping[str, PoolShape],
    count: int,
    where: str,
) -> GraphError:
    limit, setting = has
    fits = [  # enough of this resource, and of the others the task asks (or unknown)
        p
        for p, shape in shapes.items()
        if shape.get(resource, (-1.0, ""))[0] >= asked
        and all(shape.get(r, (math.inf, ""))[0] >= a for r, a in spec.resources.items())
    ]
    others = f" (configured so: {', '.join(map(repr, fits))})" if fits else ""
    # another pool for the task: configured pools only (an embedded cluster has one)
    elsewhere = "" if where else f"give the task a pool whose workers have enough{others}, "
    where = where or f"[pools.{pool}]"
    more = (
        f" {count} tasks of this submission ask for more than their pool's workers have; "
        "this is the first."
        if count > 1
        else ""
    )
    asks = _amount(resource, asked, "bytes")
    return GraphError(
        f"task {spec.key!r} asks for {asks} in pool {pool!r}, but each "
        f"worker of that pool has {_amount(resource, limit)} ({setting} = {limit:.0f} in "
        f"{where}), so none of them could ever run it: the submission was refused and "
        f"nothing of it was run.{more} Ask for at most {_amount(resource, limit, 'exact')}, "
        f"{elsewhere}or raise {setting} in {where}; then submit again.",
        key=spec.key,
        pool=pool,
        resource=resource,
        asked=asked,
        has=limit,
        setting=setting,
        count=count,
    )


#: whether a ``runtime.client.Future`` pickled now goes as a ``TaskRef`` to its key
#: (``Future.__reduce__``): only inside the tasks of a graph given as a graph or a dask
#: collection (compute, persist, submit_graph), where dask itself reads a nested future
#: as a reference; elsewhere a pickled future is refused (:func:`futures_as_refs`)
_FUTURES_AS_REFS: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "futures_as_refs", default=False
)


class ArgumentTask(Task):  # type: ignore[misc]  # (dask is untyped)
    """A task :func:`make_task` made (``submit``, ``map``): its futures are its
    arguments, made dependencies; one hidden inside an object, a dict key or a closure
    is refused when the task is pickled (:func:`futures_as_refs`), as it would reach
    the task as a bare reference, without its value. The mark is the node's own, for
    as long as the node is: not its key's, which a client lets go of (a ``submit`` whose
    future is only another's argument) while the task is still to be sent. Pickled, it
    is a plain ``Task``: nothing new crosses to another process."""

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        return Task.__new__, (Task,), self.__getstate__()


class ScatteredData(DataNode):  # type: ignore[misc]  # (dask is untyped)
    """A value a client scattered (``scatter``): a future inside it is refused when it
    is pickled, as in an :class:`ArgumentTask`. Pickled, it is a plain ``DataNode``."""

    __slots__ = ()


@contextlib.contextmanager
def futures_as_refs(node: GraphNode | None = None) -> Iterator[None]:
    """Within it, a future pickles as a ``TaskRef`` to its key, unless ``node`` (the
    task being pickled) is a client's call or value (:class:`ArgumentTask`,
    :class:`ScatteredData`): :data:`_FUTURES_AS_REFS`."""
    token = _FUTURES_AS_REFS.set(not isinstance(node, ArgumentTask | ScatteredData))
    try:
        yield
    finally:
        _FUTURES_AS_REFS.reset(token)


def futures_pickle_as_refs() -> bool:
    """Whether a future pickled now goes as a ``TaskRef`` (:func:`futures_as_refs`)."""
    return _FUTURES_AS_REFS.get()


def _to_refs(obj: Any, is_future: Callable[[Any], Key | None]) -> Any:
    """Replace futures inside (nested) arguments with ``TaskRef``s to their keys."""
    key = is_future(obj)
    if key is not None:
        return TaskRef(key)
    if type(obj) in (list, tuple, set):
        return type(obj)(_to_refs(o, is_future) for o in obj)
    if type(obj) is dict:
        return {k: _to_refs(v, is_future) for k, v in obj.items()}
    return obj


def make_task(
    key: Key,
    func: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    is_future: Callable[[Any], Key | None],
) -> GraphNode:
    """A ``Task`` node for ``func(*args, **kwargs)`` where futures become dependencies."""
    a = tuple(parse_input(_to_refs(x, is_future)) for x in args)
    kw = {k: parse_input(_to_refs(v, is_future)) for k, v in kwargs.items()}
    return ArgumentTask(key, func, *a, **kw)


class PickledNode:
    """A task node shipped to another process as its own pickle, opened only where it
    runs (by the worker's executor, :mod:`actors.executor`): a node that cannot be
    loaded there (a module the worker lacks, a class it does not know) fails that task
    with the loading error, instead of the whole batch of tasks it travelled with."""

    __slots__ = ("key", "payload")

    def __init__(self, key: Key, payload: bytes) -> None:
        self.key = key
        self.payload = payload

    @classmethod
    def of(cls, key: Key, node: GraphNode) -> PickledNode:
        """``node`` pickled; never raises: a node that cannot be pickled (an argument
        like a lock or an open connection) becomes one that fails its task alone, when
        run, with :func:`unpicklable_error`, instead of the message carrying it."""
        import pickle

        from runtime.pickling import cloudpickle_dumps

        try:
            with futures_as_refs(node):
                return cls(key, cloudpickle_dumps(node))
        except Exception as exc:
            stand_in = _Unpicklable(key, _describe(exc))
            return cls(key, pickle.dumps(stand_in, protocol=5))


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def unpicklable_error(key: Key, exc: BaseException | str) -> GraphError:
    """The error of a task whose function or arguments cannot be pickled (``exc``: why),
    so it cannot be sent to the process that would run it."""
    why = exc if isinstance(exc, str) else _describe(exc)
    return GraphError(
        f"task {key!r} cannot be sent to a worker: its function or arguments cannot be "
        f"pickled ({why}). Pass picklable arguments, or create the object (a lock, an "
        "open file or connection...) inside the task. A task dask made for a collection "
        "(its finalize step takes the collection itself: an xarray object, say) holds "
        "what the collection holds: make the collection of picklable parts, or run it on "
        "workers in the client's process (Cluster(workers=N)), which take tasks unpickled.",
        key=key,
        reason=why,
    )


class _Unpicklable:
    """What runs in place of a task node that could not be pickled: it raises
    :func:`unpicklable_error` (a plain class of this module: it loads on any worker)."""

    __slots__ = ("key", "reason")

    def __init__(self, key: Key, reason: str) -> None:
        self.key = key
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Unpicklable, (self.key, self.reason))

    def __call__(self, inputs: Any) -> Any:
        raise unpicklable_error(self.key, self.reason)


# Re-exported for modules that build nodes directly.
__all__ += ["Alias", "ArgumentTask", "DataNode", "GraphNode", "PickledNode", "ScatteredData"]
__all__ += ["Task", "TaskRef"]


class _Fingerprinter(pickle.Pickler):
    """Pickles a task node for :func:`node_fingerprint`: a function by its module,
    qualified name and code (not by value, nor by a reference that must load), so that
    the same function gives the same bytes however it reached this process (a
    ``__main__`` function of a remote client, unpickled by value here, included)."""

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.FunctionType:
            return tuple, ((obj.__module__, obj.__qualname__, _code_id(obj.__code__)),)
        return NotImplemented


#: The constants of a function's code that :func:`_code_id` keeps as they are (and code)
_PLAIN_CONSTS = (str, bytes, int, float, complex, tuple, frozenset, types.CodeType)


def _code_id(code: types.CodeType) -> tuple[Any, ...]:
    """What a function's code does, as plain data: its bytecode, names, line and
    constants (a nested function's code likewise; not the file name, which a copy
    pickled by value may not keep)."""
    consts = tuple(
        _code_id(c) if isinstance(c, types.CodeType) else c
        for c in code.co_consts
        if c is None or isinstance(c, _PLAIN_CONSTS)
    )
    return code.co_code, code.co_names, code.co_firstlineno, consts


#: Pickled bytes past which :func:`node_fingerprint` gives up (a task carrying large
#: data, a numpy array say): such a task is not compared, so that a comparison costs
#: little whatever the task holds.
FINGERPRINT_BYTES = 1 << 20


class _TooLarge(Exception):
    pass


class _Digest:
    """The file :func:`node_fingerprint` pickles into: hashes what it is given, and stops
    the pickle past ``FINGERPRINT_BYTES`` (before a large buffer is copied anywhere)."""

    __slots__ = ("hash", "left")

    def __init__(self) -> None:
        self.hash = hashlib.blake2b(digest_size=16)
        self.left = FINGERPRINT_BYTES

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        self.left -= n
        if self.left < 0:
            raise _TooLarge
        self.hash.update(data)
        return n


def node_fingerprint(node: object) -> bytes | None:
    """A digest of what ``node`` computes (its function, arguments and inputs' keys), to
    tell whether a task submitted again under a key the cluster has is the task known
    by it; None when it cannot be made (an argument that does not pickle, or a pickle
    past :data:`FINGERPRINT_BYTES`): unknown.

    Equal for the same call made again (the same function and equal arguments, also
    from another client); it costs a pickle of the node, so the scheduler core makes
    it only for a key submitted again (``actors.scheduler_state.REUSE_CHECKS``)."""
    out = _Digest()
    try:
        _Fingerprinter(out, protocol=5).dump(node)
    except Exception:
        return None
    return out.hash.digest()
