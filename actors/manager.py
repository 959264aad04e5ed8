"""The manager actor: the cluster's front door for clients and the console.

What lives here: :class:`Manager`. It validates submitted graphs (off the event loop
for large ones, while it goes on with other messages; a task asking for more than every
worker of its configured pool has (or, with no pool configured, than an embedded
cluster's workers have) is refused: ``runtime.graph.check_pool_fit``; one naming a pool
that is not configured and that no worker has joined is taken, and its client is told so
in the answer, unless no other worker can ever join: ``runtime.get``'s cluster; so is one
of no pool that no configured pool's worker nor any connected worker could run) and cuts
them into the pieces the scheduler takes them in by, owns runs and the keys clients
want, forwards key updates to the clients that want them, gathers results from the
workers holding them, and routes commands (cancel, release, policy changes, status) to
the actor that owns them.
"""

from __future__ import annotations

import dataclasses
import gc
import itertools
import math
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio

from actors import transfer
from actors.pools import check_fallback, pool_fallbacks
from actors.scheduler_events import KeyDone, KeysReused, KeyTaken
from actors.transfer import STREAM_BYTES, StreamInfo, UnknownStream
from policies import policies_toml, policy_change_fields, values_text
from runtime.client_ids import client_name
from runtime.errors import (
    ActorStopped,
    AskTimeout,
    CorralError,
    FrameTooLarge,
    GraphError,
    PermissionDenied,
    RunNoAnswer,
    RunNotSent,
    did_you_mean,
)
from runtime.graph import (
    Key,
    PoolShape,
    SpecPiece,
    TaskSpec,
    Unplaced,
    build_specs,
    check_pool_fit,
    in_pieces,
    known_size,
    reject_collection,
    unplaced_words,
)
from runtime.kernel import Actor, ActorRef, Later, handles
from runtime.messages import (
    GET_DATA_BYTES,
    AlertRuleAdd,
    AlertRuleRemove,
    AlertsReply,
    AlertsRequest,
    CancelKeysRequest,
    CancelRequest,
    ClientCame,
    ClientGone,
    CloseStream,
    DataDelivered,
    DataMissing,
    DataReply,
    DrainRequest,
    ForgetCategoryRequest,
    GatherRequest,
    GetData,
    KeyUpdates,
    Message,
    MetricsReply,
    MetricsRequest,
    MoveRequest,
    OperatorCancel,
    PolicyQuery,
    ProgressQuery,
    ReadStream,
    ReleaseKeysRequest,
    ResumeRequest,
    RunCall,
    RunOutcome,
    RunRequest,
    RunTargets,
    ScaleRequest,
    ScalingSwapped,
    SetPolicyRequest,
    SettingsAt,
    StatusReply,
    StatusRequest,
    StoryQuery,
    StoryRequest,
    StreamPart,
    SubmitGraphRequest,
    SubmitReply,
    SubmitRoleGraphRequest,
    SubmitSpecs,
    TasksQuery,
    UndrainRequest,
    WaitForWorkersRequest,
    get_data_batches,
    message,
)
from runtime.remote import check_run_timeout, pickled_call, run_failure

if TYPE_CHECKING:
    from actors.autoscaler import Autoscaler
    from actors.registry import FileRegistry
    from actors.scheduler import Scheduler

__all__ = ["GatherResult", "Manager"]

#: Graphs with at least this many tasks (and dask expressions, whose size is unknown
#: until they are materialized) are validated and ordered in a thread, so a big
#: submission never stalls the event loop, and the manager goes on meanwhile.
THREAD_THRESHOLD = 2_000


class _GcPause:
    """Python's automatic (cyclic) garbage collection paused while large graphs are
    built in threads (:func:`gc_paused`), then resumed as it was.

    Building a graph allocates a few container objects per task (dask's nodes, their
    arguments, the specs), which all live on: the collector's full collections over
    them found nothing to free and made up a third of the build's CPU (100,000-item
    bag: 12 full collections, 10 of 34 CPU seconds), each of the last ones holding the
    GIL, and so the event loop, for seconds (benchmarks/ingest.py). Reference counting
    frees everything that is not in a cycle meanwhile. Process-wide, like the
    collector: the first build pauses it (only if it is enabled), the last one to end
    resumes it, so a collector the program disabled stays disabled."""

    depth = 0
    paused = False
    lock = threading.Lock()


@contextmanager
def gc_paused() -> Iterator[None]:
    """Automatic garbage collection off for the ``with`` block (:class:`_GcPause`)."""
    with _GcPause.lock:
        if _GcPause.depth == 0 and gc.isenabled():
            gc.disable()
            _GcPause.paused = True
        _GcPause.depth += 1
    try:
        yield
    finally:
        with _GcPause.lock:
            _GcPause.depth -= 1
            if _GcPause.depth == 0 and _GcPause.paused:
                _GcPause.paused = False
                gc.enable()


#: The garbage collector's first-generation threshold to ask for on large graphs:
#: ``Cluster(gc_threshold=GC_THRESHOLD)``. Not the default: see :class:`GcTuning`.
GC_THRESHOLD = 50_000


class GcTuning:
    """Raise the garbage collector's first-generation threshold while clusters run, when
    a cluster is asked to (``gc_threshold``; off by default, since the threshold belongs
    to the whole process, not to a library running in it), and while a manager process
    runs (``python -m runtime manager --gc-threshold``, on by default: the process is
    the manager's).

    A scheduler makes several small container objects per task (task states, graph
    nodes, records). With Python's default threshold of 700, collections then run so
    often that they take about half of the scheduler's time on graphs of 20,000 tasks
    (measured: 35 µs against 18 µs per task in the scheduler core). The threshold is
    process-wide: it is raised when the first cluster starts, only if it is lower, and
    restored when the last one stops. Reference counting still frees everything that
    is not in a cycle at once; only cycles live a little longer.
    """

    _depth = 0
    _saved: tuple[int, int, int] | None = None
    _lock = threading.Lock()

    def __init__(self, threshold: int | None) -> None:
        self.threshold = threshold
        self.active = False

    def enter(self) -> None:
        if self.threshold is None or self.active:
            return
        with GcTuning._lock:
            if GcTuning._depth == 0:
                current = gc.get_threshold()
                if current[0] < self.threshold:
                    GcTuning._saved = current
                    gc.set_threshold(self.threshold, *current[1:])
            GcTuning._depth += 1
        self.active = True

    def exit(self) -> None:
        if not self.active:
            return
        self.active = False
        with GcTuning._lock:
            GcTuning._depth -= 1
            if GcTuning._depth == 0 and GcTuning._saved is not None:
                gc.set_threshold(*GcTuning._saved)
                GcTuning._saved = None


#: The manager remembers the keys of its latest runs (for the console's ``cancel RUN``
#: and ``cancel KEY``): at most this many runs, holding at most ``MAX_RUN_KEYS`` keys in
#: all (the oldest runs are forgotten first; the latest one is always kept).
MAX_RUNS = 1_000
MAX_RUN_KEYS = 1_000_000
#: ``Cluster.run``: the seconds a worker is told are left of a call's timeout, at least
#: (a call sent just as its deadline comes: the manager stops waiting for it then)
RUN_LEAST = 0.001
#: seconds between the manager's words to the scheduler of the values gathers gave to
#: clients (``DataDelivered``): one word for all the gathers of that time, not one each
DELIVERED_EVERY = 0.25


@dataclasses.dataclass(slots=True)
class _KeyState:
    clients: set[str]  #: clients that want it (each counts once at the scheduler)
    update: Any = None  #: the latest KeyDone / KeyErred / KeyCancelled
    #: of ``clients``, those told their cancel is theirs alone: they let it go next
    leaving: set[str] = dataclasses.field(default_factory=set)

    def others(self, client: str) -> int:
        """How many clients besides ``client`` want it and are not leaving it."""
        return sum(c != client and c not in self.leaving for c in self.clients)


@message(local=True)
class _Gathered(Message):
    """Manager-internal: what a gather found, reported to the manager's own handler.
    ``lost``: ``(key, the KeyDone the gather went by)`` for keys not where it said;
    ``not_on``: ``(worker, keys)`` a worker answered it does not hold; ``unreached``:
    ``(worker, keys)`` of a worker the gather could not ask (gone, or away)."""

    lost: tuple[tuple[Key, Any], ...]
    not_on: tuple[tuple[str, tuple[Key, ...]], ...]
    unreached: tuple[tuple[str, tuple[Key, ...]], ...] = ()


class _Graph(NamedTuple):
    """A submitted graph validated (``Manager._build``)."""

    specs: dict[Key, TaskSpec]
    pieces: tuple[SpecPiece, ...]  #: how the scheduler takes it in
    run_keys: tuple[Key, ...]  #: its tasks' keys, then the other keys it asks for
    #: the pools its tasks name that are not configured (none when no pool is)
    unconfigured: tuple[str, ...] = ()
    #: what the client is told of the graph (annotations dask's optimization changed,
    #: a memory resource too small to be bytes)
    notes: tuple[str, ...] = ()
    #: its first task of no pool that no configured pool's worker could run
    unplaced: Unplaced | None = None


@message(local=True)
class _Built(Message):
    """Manager-internal: a submission validated off the handlers, to be registered in
    turn (:meth:`Manager.built`)."""

    request: Any  #: the SubmitGraphRequest
    graph: Any  #: its ``_Graph``


#: what the manager carries out in the order it came, behind submissions under way
_Ordered = ReleaseKeysRequest | ClientCame | ClientGone | CancelRequest


@message(local=True)
class _SendDelivered(Message):
    """Manager-internal: tell the scheduler the values gathers gave to clients since
    the last time (:meth:`Manager.send_delivered`)."""


@message(local=True)
class _InTurn(Message):
    """Manager-internal: a release, client come or gone, or cancel that came while
    submissions before it were being built, carried out in turn (:meth:`Manager.in_turn`)."""

    request: Any


@dataclasses.dataclass(frozen=True, slots=True)
class GatherResult:
    """Values of the keys that could be gathered; ``missing`` were not where expected
    (their worker was lost meanwhile; the scheduler recomputes them)."""

    data: dict[Key, Any]
    missing: tuple[Key, ...]
    raw: bool = False  #: values are the workers' pickles (the manager did not open them)
    #: their worker did not answer (yet): still where they were; ask again
    unreachable: tuple[Key, ...] = ()
    #: ``transfer.StreamInfo`` of large values (raw only): read them through the manager
    #: with ``ReadStream(..., worker=info.worker)``
    streams: tuple[Any, ...] = ()
    #: not fetched: this answer holds as much inline as one frame should (raw only).
    #: Still where they were: ask for them now
    later: tuple[Key, ...] = ()


class Manager(Actor):
    """Front door: submissions, results, cancellation, policies and status."""

    def __init__(
        self,
        scheduler: Callable[[], ActorRef[Scheduler]],
        registry: Callable[[], ActorRef[FileRegistry]],
        autoscaler: Callable[[], ActorRef[Autoscaler] | None],
        # a client's or a worker's reference, local or a remote peer's (so not narrowed)
        resolve: Callable[[str], ActorRef[Any] | None],
        *,
        gather_timeout: float = 60.0,
        max_runs: int = MAX_RUNS,
        max_run_keys: int = MAX_RUN_KEYS,
        monitor: Callable[[], ActorRef[Any] | None] = lambda: None,
        pools: Mapping[str, PoolShape] | None = None,
        reserved: frozenset[str] = frozenset(),
        sizing: str = "",
        closed: str = "",
        fallback: Mapping[str, str] | None = None,
        submit_max_priority: float = math.inf,
    ) -> None:
        self._scheduler = scheduler
        #: the highest ``priority=`` a submit-token client's task may have
        #: (``[scheduler] submit_max_priority``): a graph with one above it is refused
        self.submit_max_priority = submit_max_priority
        #: the configured pools' ``fallback`` (``{pool: its fallback}``): put in the
        #: default retry policy whenever it is set without one (``pool_fallbacks``)
        self.fallback: dict[str, str] = dict(fallback or {})
        #: the configured pools' worker shapes (``runtime.node.pool_shapes``), or an
        #: embedded cluster's one pool's: a task of one of them asking for more than its
        #: workers have is refused at submit
        self.pools: dict[str, PoolShape] = dict(pools or {})
        #: the pools that never run a task of no pool (``any_pool_tasks = false``): left
        #: out of the shapes a task of no pool is checked against
        self.reserved = reserved
        #: where the shapes' settings are given: "" for configured pools
        #: (``[pools.NAME]``), else an embedded cluster's arguments (``"Cluster(...)"``),
        #: whose one pool ``pools`` holds while no pool is configured
        self.sizing = sizing
        #: who runs this cluster (``"runtime.get"``) when no worker but its own can ever
        #: join it: a task naming a pool it does not have is refused (""; it waits)
        self.closed = closed
        self._monitor = monitor  #: the alert monitor, when the cluster runs one
        self._registry = registry
        self._autoscaler = autoscaler
        self._resolve = resolve
        self.gather_timeout = gather_timeout
        self.keys: dict[Key, _KeyState] = {}  #: keys some client wants
        self.pending = 0  #: of those, the ones with no word from the scheduler yet
        self.runs = 0
        self._run_ids = itertools.count(1)
        self.max_runs = max_runs
        self.max_run_keys = max_run_keys
        #: run id -> every key of it (its tasks and the keys it wanted), latest runs only
        self.run_keys: dict[str, tuple[Key, ...]] = {}
        #: the name of the client that submitted each run of ``run_keys``
        self.run_clients: dict[str, str] = {}
        self._n_run_keys = 0  #: keys held in run_keys
        #: the clients connected now (``ClientCame`` to ``ClientGone``; an embedded
        #: cluster's own client too): whom a policy change affects
        self.connected: set[str] = set()
        #: set once the latest request taken in turn is done (None: none was): a
        #: submission built off the handlers, and the submissions, releases, client
        #: departures and cancels that came after it, each waits for the one before
        #: (:meth:`_in_turn`), so they happen in the order they came
        self._turn: anyio.Event | None = None
        #: the settings a manager process runs with (``SettingsAt``), for its status
        self.settings: SettingsAt = SettingsAt(())
        #: per kind, the policy set at runtime (``set_policy``, the console) now in
        #: force: its name and parameters (values), lost at a stop (:meth:`on_stop`)
        self.policies_set: dict[str, tuple[str, dict[str, Any]]] = {}
        #: keys whose values gathers gave to clients, not yet told to the scheduler (an
        #: ordered set), and whether the word that tells them is due already
        self._delivered: dict[Key, None] = {}
        #: the streams our gathers' clients read through us (``read_stream``): each
        #: value is noted given (``_delivered``) once all its bytes were passed on
        self._relayed = transfer.Relayed()
        self._delivered_due = False

    # -- submissions -----------------------------------------------------------------

    @handles(SubmitGraphRequest)
    def submit(self, msg: SubmitGraphRequest) -> SubmitReply | Later:
        """Validate, then register the run and hand the graph to the scheduler. A large
        graph is validated in a thread while other messages are handled: its answer
        comes later (:meth:`built`), and the requests that must follow it wait for it
        (:meth:`_in_turn`). A refused graph (``GraphError``...) is refused whole: none of
        it is kept."""
        reject_collection(msg.graph)  # before len(): a 0-d array or Delayed has none
        size = known_size(msg.graph)  # (None for a dask expression: it may be large)
        size = THREAD_THRESHOLD if size is None else size
        if size < THREAD_THRESHOLD and self._settled():
            return self._register(msg, self._build(msg))

        async def build() -> SubmitReply:
            if size >= THREAD_THRESHOLD:  # a dask expression is materialized in the thread
                built = await anyio.to_thread.run_sync(self._build_paused, msg)
            else:
                built = self._build(msg)
            reply: SubmitReply = await self.ref.ask(_Built(msg, built), timeout=None)
            return reply

        return self._in_turn(build)

    def _build_paused(self, msg: SubmitGraphRequest) -> _Graph:
        """:meth:`_build` of a large graph, the garbage collector paused (:func:`gc_paused`)."""
        with gc_paused():
            return self._build(msg)

    def _build(self, msg: SubmitGraphRequest) -> _Graph:
        """The graph's specs validated, cut in the pieces the scheduler takes them in by.
        In a thread for large graphs: it reads ``keys``, which only requests taken in
        turn change."""
        notes: list[str] = []
        specs = build_specs(
            msg.graph,
            msg.keys,
            known=self.keys.__contains__,
            priority=msg.priority,
            retries=msg.retries,
            resources=msg.resources,
            pool=msg.pool,
            timeout=msg.timeout,
            notes=notes,
        )
        if isinstance(msg, SubmitRoleGraphRequest):
            self._within_submit_cap(specs)
        # a task no worker of its configured pool could run: refused; the pools named
        # that are not configured: the client is told of those no worker has joined
        # (a task of no pool that no configured pool's worker could run: the client is
        # told, once no connected worker has enough either)
        fit = check_pool_fit(specs.values(), self.pools, self.sizing, self.reserved)
        if fit.unconfigured and self.closed:
            raise self._never_served(fit.unconfigured[0])
        run_keys = tuple(dict.fromkeys([*specs, *msg.keys]))
        pieces = in_pieces(specs, msg.keys)
        return _Graph(specs, pieces, run_keys, fit.unconfigured, tuple(notes), fit.unplaced)

    def _within_submit_cap(self, specs: Mapping[Key, TaskSpec]) -> None:
        """Refuse a submit-token client's graph with a task of a ``priority=`` above
        :attr:`submit_max_priority` (:class:`PermissionDenied`, nothing of it kept): on
        a shared manager, one person's raised priority would put all their work ahead
        of everyone else's, turns (the ``fair`` priority) or not."""
        cap = self.submit_max_priority
        if cap == math.inf:
            return
        above = [(key, spec.priority) for key, spec in specs.items() if spec.priority > cap]
        if not above:
            return
        key, priority = above[0]
        more = f" (and {len(above) - 1} more task(s) above it)" if len(above) > 1 else ""
        raise PermissionDenied(
            "SubmitGraphRequest",
            f"task {str(key)!r} has priority={priority:g}{more}, above {cap:g}, the highest "
            "this manager lets a client with the submit token give ([scheduler] "
            "submit_max_priority): a higher priority runs ahead of everyone else's work "
            "on the shared manager. Nothing of the graph was submitted. Submit it with "
            f"priority <= {cap:g} (to order your own tasks, give the later ones a lower "
            "priority, e.g. priority=-1), or ask the cluster's operator (who holds the "
            "admin token) to raise it (the console's move KEY --priority N)",
        )

    @handles(_Built)
    def built(self, msg: _Built) -> SubmitReply | Later:
        return self._register(msg.request, msg.graph)

    def _register(self, msg: SubmitGraphRequest, graph: _Graph) -> SubmitReply | Later:
        run = f"run-{next(self._run_ids)}"
        self.runs += 1
        self._remember_run(run, graph.run_keys, client_name(msg.client))
        # Failed or cancelled keys submitted again are run again: their last word is
        # stale. (The keys both wanted and in the graph: the fewer of the two walked.)
        specs, keys = graph.specs, self.keys
        for key in specs if len(specs) <= len(keys) else keys:
            ks = keys.get(key)
            if ks is None or key not in specs:
                continue
            if ks.update is not None and not isinstance(ks.update, KeyDone):
                self._set_update(ks, None)
        wanted = []
        #: wanted by the client already: what it was told of them may be older than this
        #: submission (a cancel's word still on its way when it submits again), so the
        #: scheduler says, in order with its other words, where each stands once the
        #: graph is in (a KeyTaken after it); the client knows from the answer to wait
        echo = []
        for key in dict.fromkeys(msg.keys):
            ks = self.keys.get(key)
            if ks is None:
                ks = self.keys[key] = _KeyState(set())
                self.pending += 1
            if msg.client not in ks.clients:
                ks.clients.add(msg.client)
                wanted.append(key)
                continue
            ks.leaving.discard(msg.client)  # wanted again since its cancel
            echo.append(key)
        echoed = tuple(echo)
        told = tuple((pool, self.not_configured(pool)) for pool in graph.unconfigured)
        unplaced = graph.unplaced
        asks = unplaced.asks if unplaced is not None else ()
        request = SubmitSpecs(
            run, graph.pieces, tuple(wanted), told, echoed, msg.client, asks, msg.progress
        )
        if not told and unplaced is None:
            self._scheduler().post(request)
            return SubmitReply(run, graph.notes, echoed)
        # A pool that is not configured: a worker may have joined it by hand (--pool),
        # which the scheduler knows; so may a worker with more than a configured pool's
        # (for a task of no pool too big for those). It answers which pools no worker
        # has joined and whether a worker has enough as it gets the specs (not once
        # they are taken in), in order with what comes next.
        answer = self._scheduler().post_ask(request, timeout=None)

        async def warnings() -> SubmitReply:
            empty, short = await answer
            said = tuple(
                f"tasks of this submission ask for {why}: they wait until a worker joins "
                f"with --pool {pool}"
                for pool, why in told
                if pool in empty
            )
            if unplaced is not None and short:
                said += (unplaced_words(unplaced, short),)
            return SubmitReply(run, graph.notes + said, echoed)

        return Later(warnings())

    def not_configured(self, pool: str) -> str:
        """What to say of ``pool``, which tasks name and which is not configured, once
        no worker has joined it either (a misspelt name, most likely)."""
        known = list(self.pools)
        if self.sizing:  # an embedded cluster's workers, in its one pool
            return (
                f"pool {pool!r}, which no worker has joined (no pool is configured: this "
                f"cluster's workers are in pool {', '.join(map(repr, known))}"
                f"{did_you_mean(pool, known)}; scale(n, pool={pool!r}) starts workers in it)"
            )
        if not known:  # hand-started workers only: each joins the pool its --pool names
            return (
                f"pool {pool!r}, which no worker has joined (this manager configures no "
                "pool: the pools are those its workers' --pool name)"
            )
        return (
            f"pool {pool!r}, which is not configured (pools: {', '.join(known)}"
            f"{did_you_mean(pool, known)}) and which no worker has joined"
        )

    def _never_served(self, pool: str) -> GraphError:
        """The refusal of tasks naming ``pool``, which no worker of this closed cluster
        is in nor can ever join."""
        own = ", ".join(map(repr, self.pools))
        return GraphError(
            f"tasks of this submission ask for pool {pool!r}, but {self.closed} runs a "
            f"cluster of its own whose workers are all in pool {own} and which no other "
            "worker can join, so they could never run: the submission was refused and "
            f"nothing of it was run. Leave pool out (or name {own}), or compute on a "
            f"manager with workers in pool {pool!r} ({self.closed}(..., address=ADDRESS), "
            f"with `python -m runtime worker ADDRESS --pool {pool}`; docs/deployment.md).",
            pool=pool,
        )

    def _settled(self) -> bool:
        """No request taken in turn is under way."""
        return self._turn is None or self._turn.is_set()

    def _in_turn(self, work: Callable[[], Awaitable[Any]]) -> Later:
        """``work()`` once every request taken in turn before it is done; its answer."""
        before = self._turn
        done = self._turn = anyio.Event()

        async def turn() -> Any:
            try:
                if before is not None:
                    await before.wait()
                return await work()
            finally:
                done.set()

        return Later(turn())

    @handles(ReleaseKeysRequest, ClientCame, ClientGone, CancelRequest)
    def in_order(self, msg: _Ordered) -> Any:
        """A release, a client come or gone, or a cancel: at once or, while requests
        taken in turn are under way, after them (``Later``). A client's coming is in
        turn too: a name that left and came back while a submission was under way is
        connected after both (not gone)."""
        if self._settled():
            return self._carry_out(msg)
        return self._in_turn(lambda: self.ref.ask(_InTurn(msg), timeout=None))

    @handles(_InTurn)
    def in_turn(self, msg: _InTurn) -> Any:
        return self._carry_out(msg.request)

    def _carry_out(self, request: _Ordered) -> Any:
        if isinstance(request, ReleaseKeysRequest):
            self._release(request)
        elif isinstance(request, ClientCame):
            self.connected.add(request.name)
        elif isinstance(request, ClientGone):
            self._client_gone(request)
        else:
            return self._cancel(request)
        return None

    def _remember_run(self, run: str, keys: tuple[Key, ...], client: str = "") -> None:
        self.run_keys[run] = keys
        self.run_clients[run] = client
        self._n_run_keys += len(keys)
        while len(self.run_keys) > 1 and (
            len(self.run_keys) > self.max_runs or self._n_run_keys > self.max_run_keys
        ):
            oldest = next(iter(self.run_keys))
            self._n_run_keys -= len(self.run_keys.pop(oldest))
            self.run_clients.pop(oldest, None)

    def _set_update(self, ks: _KeyState, upd: Any) -> None:
        """Every change of a wanted key's last word goes here (``pending`` counts)."""
        self.pending += (upd is None) - (ks.update is None)
        ks.update = upd

    @handles(KeyUpdates)
    def key_updates(self, msg: KeyUpdates) -> None:
        per_client: dict[str, list[Any]] = {}
        for upd in msg.updates:
            if type(upd) is KeysReused:  # once per submission: logged, and its client told
                self.log.warning(upd.text(), client=upd.client, keys=upd.count)
                per_client.setdefault(upd.client, []).append(upd)
                continue
            ks = self.keys.get(upd.key)
            if ks is None:
                continue
            if type(upd) is KeyTaken:  # for the client whose submission it was
                if upd.pending:  # runs (again): a failure or cancel said before is stale
                    self._set_update(ks, None)
                if upd.client in ks.clients:
                    per_client.setdefault(upd.client, []).append(upd)
                continue
            self._set_update(ks, upd)
            for client in ks.clients:
                per_client.setdefault(client, []).append(upd)
        for client, updates in per_client.items():
            self._send(client, updates)

    def _send(self, client: str, updates: list[Any]) -> None:
        ref = self._resolve(client)
        if ref is not None and not ref.stopped:
            ref.post(KeyUpdates(tuple(updates)))

    def _release(self, msg: ReleaseKeysRequest) -> None:
        released = []
        for key in msg.keys:
            ks = self.keys.get(key)
            if ks is None or msg.client not in ks.clients:
                continue
            ks.clients.discard(msg.client)
            ks.leaving.discard(msg.client)
            if not ks.clients:
                del self.keys[key]
                self.pending -= ks.update is None
            released.append(key)
        if released:
            self._scheduler().post(ReleaseKeysRequest(tuple(released), msg.client))

    def _client_gone(self, msg: ClientGone) -> None:
        """A client left without releasing its keys: release them for it (once its
        submissions under way are registered: theirs too)."""
        self.connected.discard(msg.name)
        held = tuple(k for k, ks in self.keys.items() if msg.name in ks.clients)
        if held:
            self._release(ReleaseKeysRequest(held, msg.name))

    def _cancel(self, msg: CancelRequest) -> tuple[Key, ...] | Later:
        """A client's cancel (``Cluster.cancel``, ``Future.cancel``). A key that no other
        client wants is cancelled, with everything that depends on it, except what keys
        other clients hold need (as dask's ``Client.cancel`` without ``force``). A key
        that other clients want, or that a key they hold needs, is not: the answer lists
        it, and the asking client ends its own interest in it (its
        ``ReleaseKeysRequest``) and cancels its own futures of it, while the task runs
        on for the others.

        A client asks only for keys it holds, after its submission of them went out
        (``ClientActor.cancel``), so when one client holds a key, that is the asker
        (``msg.client``, which older clients leave empty: then only keys more than one
        client holds are spared). The console's ``cancel`` (:meth:`cancel_keys`) is an
        operator's and cancels for every client. A ``Later`` when the scheduler must
        answer which keys it spared."""
        shared: list[Key] = []
        cancel: list[Key] = []
        for key in msg.keys:
            ks = self.keys.get(key)
            # (a client told so before leaves it: two cancels at once stop the task)
            if ks is not None and ks.others(msg.client) > (0 if msg.client else 1):
                shared.append(key)
                self._leaving(key, msg.client)
            else:
                cancel.append(key)
        if not cancel:
            return tuple(shared)
        others = self._held_by_others(msg.client) if msg.client else ()
        if not others:
            self._scheduler().post(CancelRequest(tuple(cancel), msg.reason))
            return tuple(shared)
        # Sent now, in order with what comes next; answered by the scheduler once the
        # graphs it is taking in are whole (seconds for a large one): meanwhile this
        # mailbox goes on (status, metrics, gathers). No time limit: the scheduler is
        # in this process, and its stop fails the ask (ActorStopped).
        request = CancelRequest(tuple(cancel), msg.reason, spare=others)
        answer = self._scheduler().post_ask(request, timeout=None)

        async def spared() -> tuple[Key, ...]:
            kept = await answer
            for key in kept:
                self._leaving(key, msg.client)
            return (*shared, *kept)

        return Later(spared())

    def _leaving(self, key: Key, client: str) -> None:
        """``client`` is told its cancel of ``key`` is its own: unless the task is done
        (a cancel changes nothing of it), it lets the key go next."""
        ks = self.keys.get(key)
        if ks is not None and ks.update is None and client in ks.clients:
            ks.leaving.add(client)

    def _held_by_others(self, client: str) -> tuple[Key, ...]:
        """The keys a client other than ``client`` holds (none while it is alone)."""
        return tuple(key for key, ks in self.keys.items() if ks.others(client))

    @handles(CancelKeysRequest)
    def cancel_keys(self, msg: CancelKeysRequest) -> Later:
        """Cancel keys given as text (``str(key)``) and/or every key of a run; or what
        ``key_or_run`` names, a run or a key, refused when it names both."""
        keys: dict[Key, None] = {}
        by_text = self._keys_by_text() if msg.keys or msg.key_or_run else {}
        run, texts = msg.run, msg.keys
        if msg.key_or_run:
            text = msg.key_or_run
            if text in self.run_keys and text in by_text:
                raise ValueError(
                    f"{text!r} is both a run id (run {text}: "
                    f"{len(self.run_keys[text])} key(s)) and the key of a task: nothing "
                    f"was cancelled; say which you mean: `cancel --run {text}` for every "
                    f"task of the run, `cancel --key {text}` for that task"
                )
            if text in by_text:
                texts = (*texts, text)
            else:
                run = text  # a run, or neither: the error says there is no such run
        if run:
            run_keys = self.run_keys.get(run)
            if run_keys is None:
                known = list(self.run_keys)[-5:]
                raise ValueError(
                    f"no run {run!r} known to the manager (latest: "
                    f"{', '.join(known) or 'none'})"
                    + (", and no key of that text" if msg.key_or_run else "")
                )
            keys.update(dict.fromkeys(run_keys))
        if texts:
            keys.update(dict.fromkeys(_keys_of_texts(texts, by_text, ", or a run id")))
        if not keys:
            raise ValueError("nothing to cancel: give keys or a run id")
        reason = f"cancelled from the console ({run})" if run else "cancelled from the console"
        # An operator's cancel: straight to the scheduler, for every client that wants
        # these keys (a client's own cancel, cancel() above, spares the others').
        # The scheduler counts the keys still to do in the turn it cancels them: the
        # rest (finished, or forgotten long ago) are not affected. Sent now, in order
        # with what comes next; no time limit: the scheduler is in this process, and
        # its stop fails the ask (ActorStopped).
        answer = self._scheduler().post_ask(OperatorCancel(tuple(keys), reason), timeout=None)
        named = [str(k) for k in keys]

        async def counted() -> dict[str, Any]:
            to_do = await answer
            return {"run": run, "count": len(named), "to_do": to_do, "keys": named[:20]}

        return Later(counted())

    def _keys_by_text(self) -> dict[str, Key]:
        """The keys the manager knows (its clients' and its runs'), by their text."""
        by_text: dict[str, Key] = {}
        for held in self.run_keys.values():
            for key in held:
                by_text[str(key)] = key
        for key in self.keys:
            by_text[str(key)] = key
        return by_text

    @handles(MoveRequest)
    async def move(self, msg: MoveRequest) -> Any:
        """Move keys (and keys given as text: the console's) to another pool and/or
        priority: the scheduler moves those still waiting or queued."""
        keys = tuple(msg.keys)
        if msg.texts:
            keys += tuple(_keys_of_texts(msg.texts, self._keys_by_text()))
        if not keys:
            raise ValueError("nothing to move: give the keys of tasks (as `tasks` shows them)")
        answer = await self._scheduler().ask(dataclasses.replace(msg, keys=keys, texts=()))
        self.log.info("tasks moved", pool=msg.pool, priority=msg.priority,
                      moved=len(answer["moved"]), left=len(answer["left"]))  # fmt: skip
        return answer

    # -- results ---------------------------------------------------------------------

    @handles(GatherRequest)
    def gather(self, msg: GatherRequest) -> Later:
        # Answered later: fetching from workers must not hold up the manager's mailbox.
        # What to fetch from whom is read here, in the handler; the fetch itself changes
        # nothing and reports what it found back to us (_Gathered).
        found: dict[Key, KeyDone] = {}
        missing: list[Key] = []
        for key in msg.keys:
            ks = self.keys.get(key)
            upd = ks.update if ks is not None else None
            if isinstance(upd, KeyDone):
                found[key] = upd
            else:
                missing.append(key)
        return Later(self._gather(msg, found, missing))

    async def _gather(
        self, msg: GatherRequest, found: dict[Key, KeyDone], missing: list[Key]
    ) -> GatherResult:
        """Fetch the values of ``found`` from their workers. Runs beside the handlers:
        it reads and writes none of the manager's state, and what it learned about
        keys goes through :meth:`gathered` before the answer goes out (but the keys
        whose values it gives, noted for :meth:`send_delivered`, and the streams it
        offers, noted for :meth:`read_stream`).

        The answer to a client in another process (``raw``) is one frame: it carries at
        most ``GET_DATA_BYTES`` of values inline, by their recorded sizes, as one
        ``GetData`` does. The keys of the ``GetData`` batches past that are not asked
        for: they are the answer's ``later``, which the client asks for next."""
        by_worker: dict[str, list[tuple[Key, int]]] = {}
        for key, upd in found.items():
            by_worker.setdefault(upd.worker, []).append((key, upd.nbytes))
        lost: list[Key] = []  #: not where their KeyDone said
        not_on: list[tuple[str, tuple[Key, ...]]] = []  #: the workers said so
        unreached: list[tuple[str, tuple[Key, ...]]] = []  #: their worker is gone
        unreachable: list[Key] = []
        streams: list[StreamInfo] = []
        data: dict[Key, Any] = {}
        later: list[Key] = []  #: not asked for: the answer is full (raw)
        inline = 0  #: bytes of the pickles in ``data`` (raw)
        for wid, sized in by_worker.items():
            ref = self._resolve(wid)
            if ref is None:  # gone: the scheduler makes again what it held
                lost.extend(k for k, _ in sized)
                unreached.append((wid, tuple(k for k, _ in sized)))
                continue
            # A worker in another process sends large values as streams: a remote
            # client reads them through us (ReadStream relayed), a local one gets them
            # read here.
            over = 0 if isinstance(ref, ActorRef) else STREAM_BYTES
            nbytes = dict(sized)
            for keys in get_data_batches(sized):
                recorded = sum(nbytes[k] for k in keys if not over or nbytes[k] < over)
                if msg.raw and data and inline + recorded > GET_DATA_BYTES:
                    later.extend(keys)
                    continue
                try:
                    reply = await self._get_data(ref, msg, keys, over)
                    if msg.raw:
                        got = sum(map(len, reply.data.values()))
                        if inline + got > 2 * GET_DATA_BYTES:
                            # Far more than recorded (sizes dask.sizeof cannot see):
                            # these too as streams, so the answer stays a frame.
                            again = await self._get_data(ref, msg, tuple(reply.data), 1)
                            reply = dataclasses.replace(
                                again,
                                missing=(*reply.missing, *again.missing),
                                streams=(*reply.streams, *again.streams),
                            )
                            got = sum(map(len, reply.data.values()))
                        inline += got
                    data.update(reply.data)
                    if reply.missing:
                        lost.extend(reply.missing)
                        not_on.append((wid, tuple(reply.missing)))
                    for info in reply.streams:
                        if msg.raw or info.file is not None:  # a file: the client reads it
                            streams.append(info._replace(worker=wid))
                        else:
                            data[info.key] = await self._read_stream(ref, info)
                except (ActorStopped, AskTimeout, UnknownStream) as exc:
                    self.log.warning("gather failed", worker=wid, error=str(exc))
                    unreachable.extend(k for k in keys if k not in data)
        if lost:  # before the asker hears of them, so it finds our table up to date
            await self.ref.ask(
                _Gathered(tuple((k, found[k]) for k in lost), tuple(not_on), tuple(unreached)),
                timeout=None,
            )
        now = anyio.current_time()
        # A stream is given once its client has read it all through us (read_stream):
        # a read that fails (its worker lost meanwhile) gives nothing.
        self._given((*data, *(k for info in streams for k in self._relayed.start(info, now))))
        return GatherResult(
            data, (*missing, *lost), msg.raw, tuple(unreachable), tuple(streams), tuple(later)
        )

    async def _get_data(
        self, ref: Any, msg: GatherRequest, keys: tuple[Key, ...], over: int
    ) -> DataReply:
        """``GetData(keys)`` of the worker ``ref``, values of ``over`` bytes or more as
        streams; asked again with every value as a stream if its reply could not come."""
        try:
            reply: DataReply = await ref.ask(
                GetData(keys, raw=msg.raw, stream_over=over, files=msg.files),
                timeout=self.gather_timeout,
            )
        except Exception as exc:
            # Sizes understated (FrameTooLarge), or a worker process whose reply did not
            # pickle (a value in it; the error names no key): every value as a stream,
            # serialized by the worker's handler, which names one that does not pickle
            # (ResultNotPicklable).
            unsent = over > 1 and not isinstance(exc, CorralError)
            if not (unsent or isinstance(exc, FrameTooLarge)):
                raise
            reply = await ref.ask(
                GetData(keys, raw=msg.raw, stream_over=1, files=msg.files),
                timeout=self.gather_timeout,
            )
        return reply

    def _given(self, keys: tuple[Key, ...]) -> None:
        """Clients were given the values of ``keys``: told to the scheduler with the
        others of this quarter second (:meth:`send_delivered`)."""
        if keys:
            self._delivered.update(dict.fromkeys(keys))
            if not self._delivered_due:
                self._delivered_due = True
                self.send_later(DELIVERED_EVERY, _SendDelivered())

    @handles(_SendDelivered)
    def send_delivered(self, msg: _SendDelivered) -> None:
        """The scheduler hears which values clients were given: each such output, if
        lost while only clients hold it, is made again only once something needs it."""
        keys, self._delivered, self._delivered_due = tuple(self._delivered), {}, False
        self._scheduler().post(DataDelivered(keys))

    @handles(_Gathered)
    def gathered(self, msg: _Gathered) -> None:
        """A gather found keys missing where their KeyDone said they were: forget that
        word, unless a newer one came meanwhile (the key was made again elsewhere while
        the gather waited); and tell the scheduler what the workers did not have, and
        what it could not ask for (an output lost already is made again)."""
        for wid, keys in msg.not_on:
            self._scheduler().post(DataMissing(wid, keys))
        for wid, keys in msg.unreached:  # lost with it, maybe: made again if so
            for key in keys:  # an earlier gather's word, not sent yet, is out of date
                self._delivered.pop(key, None)
            self._scheduler().post(DataMissing(wid, keys, reached=False))
        for key, upd in msg.lost:
            ks = self.keys.get(key)
            if ks is not None and ks.update is upd:
                self._set_update(ks, None)  # wait for the scheduler's next word on it

    async def _read_stream(self, ref: Any, info: StreamInfo) -> Any:
        return await transfer.receive(
            lambda part: ref.ask(part, timeout=self.gather_timeout), info, close=ref.post
        )

    @handles(ReadStream)
    def read_stream(self, msg: ReadStream) -> Later:
        """Relay a remote client's read of a stream open on ``msg.worker``."""
        ref = self._resolve(msg.worker)
        if ref is None:
            self._relayed.end(msg.worker, msg.stream)
            raise ActorStopped(msg.worker, "ReadStream")
        return Later(self._relay(ref, msg))

    async def _relay(self, ref: Any, msg: ReadStream) -> StreamPart:
        """One part of a stream a client reads through us; the value is given to the
        client once its last part is passed on (:class:`transfer.Relayed`)."""
        try:
            part: StreamPart = await ref.ask(
                ReadStream(msg.stream, msg.offset, msg.length), timeout=self.gather_timeout
            )
        except BaseException:
            self._relayed.end(msg.worker, msg.stream)  # (the read fails: nothing given)
            raise
        now = anyio.current_time()
        self._given(self._relayed.passed(msg.worker, msg.stream, len(part.data), now))
        return part

    @handles(CloseStream)
    def close_stream(self, msg: CloseStream) -> None:
        self._relayed.end(msg.worker, msg.stream)
        ref = self._resolve(msg.worker)
        if ref is not None:
            ref.post(CloseStream(msg.stream))

    # -- routing to the owners -------------------------------------------------------

    @handles(SetPolicyRequest)
    async def set_policy(self, msg: SetPolicyRequest) -> Any:
        if self.fallback:  # a retry policy set again keeps the pools' fallbacks
            params = pool_fallbacks(msg.kind, msg.name, msg.params, self.fallback)
            msg = dataclasses.replace(msg, params=params)
        # configured pools only: an embedded cluster's workers may be scaled in others
        check_fallback(msg.kind, msg.name, msg.params, () if self.sizing else self.pools)
        if msg.kind == "scaling":  # the autoscaler's policy; every other kind: scheduler
            autoscaler = self._autoscaler()
            if autoscaler is None:
                raise RuntimeError(
                    "this cluster has no autoscaler, so no scaling policy: its workers are "
                    "managed outside (they join by themselves). A manager process gets an "
                    "autoscaler from the pools of its configuration file: start it with "
                    "--config FILE with [pools.NAME] tables (docs/configuration.md#pools); "
                    "an embedded Cluster has one with workers= or processes="
                )
            answer = await autoscaler.ask(msg)
            self._scheduler().post(ScalingSwapped(answer.name, dict(answer.params), msg.by))
        else:
            answer = await self._scheduler().ask(msg)
        self._policy_changed(msg)
        self.policies_set[msg.kind] = (answer.name, dict(answer.params))
        return answer

    async def on_stop(self) -> None:
        """A manager process's stop: say which policies were set at runtime (they are
        not kept: the next start has its ``--config``'s), with the ``[policies]`` table
        that would keep them. An embedded cluster's own program sets its policies again."""
        if self.policies_set and not self.sizing:
            self.log.warning(
                "policies set at runtime are lost at this stop",
                policies={k: f"{n}({values_text(p)})" for k, (n, p) in self.policies_set.items()},
                advice="to keep them, put in the manager's --config file: "
                + policies_toml(self.policies_set)
                + " (docs/policies.md#with-a-manager-process)",
            )

    def _policy_changed(self, msg: SetPolicyRequest) -> None:
        """``policy changed``: a warning while other clients are connected, whose work
        it changes (on a shared manager the log says who changed it: the manager logs
        warnings by default); info when no other is (a client alone on its manager, an
        embedded cluster's own client): its own change, no news to anyone."""
        others = len(self.connected - {msg.by})
        if others:
            self.log.warning("policy changed", **policy_change_fields(msg), others=others)
        else:
            self.log.info("policy changed", **policy_change_fields(msg))

    @handles(
        StoryRequest,
        StoryQuery,
        TasksQuery,
        DrainRequest,
        UndrainRequest,
        ForgetCategoryRequest,
        ProgressQuery,
    )
    async def to_scheduler(self, msg: Any) -> Any:
        return await self._scheduler().ask(msg)

    @handles(PolicyQuery)
    async def policies(self, msg: PolicyQuery) -> tuple[Any, ...]:
        """The scheduler's policies, and the autoscaler's ``scaling`` one when the
        cluster has an autoscaler."""
        infos = tuple(await self._scheduler().ask(msg))
        autoscaler = self._autoscaler()
        if autoscaler is not None:
            infos += (await autoscaler.ask(msg),)
        return infos

    @handles(WaitForWorkersRequest)
    def wait_for_workers(self, msg: WaitForWorkersRequest) -> Later:
        return Later(self._scheduler().ask(msg, timeout=None))

    @handles(RunRequest)
    def run(self, msg: RunRequest) -> Later:
        """``Cluster.run``: the call on each worker the scheduler's core chooses, all at
        once, answered within ``msg.timeout`` whatever the scheduler and the workers do
        (the scheduler's choice and the pickling count in it). Answered later, as a
        gather is: the manager goes on with other messages meanwhile. The values and
        errors are the workers' pickles, relayed unopened."""
        check_run_timeout(msg.timeout)  # (a client of another process says any number)
        self.log.info("running a function on workers", func=msg.name,
                      workers=len(msg.workers) if msg.workers is not None else "all")  # fmt: skip
        return Later(self._run(msg))

    async def _run(self, msg: RunRequest) -> tuple[RunOutcome, ...]:
        """The outcomes, by worker; :class:`~runtime.errors.RunNotSent` when the
        timeout ran out before the call went to any worker (``stage``: where it was)."""
        deadline = anyio.current_time() + msg.timeout
        targets: tuple[tuple[str, Any], ...] = ()
        outcomes: dict[str, RunOutcome] = {}
        stage: str | None = "targets"
        with anyio.move_on_after(msg.timeout):
            targets = tuple(await self._scheduler().ask(RunTargets(msg.workers), timeout=None))
            # In-process workers get the call as it came; worker processes its pickle (the
            # remote client's, or made here, in a thread, from an embedded client's
            # objects), which they open in the thread that calls it.
            stage = "pickle"
            wire: Any = msg.call
            remote = any(ref is not None and not isinstance(ref, ActorRef) for _, ref in targets)
            if remote and not isinstance(wire, bytes):
                try:  # (a thread left to end by itself past the deadline: pickling ends)
                    wire = await anyio.to_thread.run_sync(
                        pickled_call, msg.call, msg.name, abandon_on_cancel=True
                    )
                except TypeError as exc:
                    wire = exc
            stage = None

            async def one(wid: str, ref: Any) -> None:
                call = msg.call if isinstance(ref, ActorRef) else wire
                if isinstance(call, BaseException):  # it does not pickle: no worker process gets it
                    outcomes[wid] = run_failure(call, msg.name, wid)
                    return
                sent = dataclasses.replace(msg, call=call)
                outcomes[wid] = await self._run_on(wid, ref, sent, deadline)

            async with anyio.create_task_group() as tg:
                for wid, ref in targets:
                    tg.start_soon(one, wid, ref)
        if stage is not None:
            self.log.warning("a run was sent to no worker in time", func=msg.name, stage=stage)
            raise RunNotSent(msg.name, msg.timeout, stage)
        # a worker whose answer did not come in time: RunNoAnswer in its place
        return tuple(outcomes.get(wid) or _no_answer(wid, msg, left=False) for wid, _ in targets)

    async def _run_on(self, wid: str, ref: Any, msg: RunRequest, deadline: float) -> RunOutcome:
        """Worker ``wid``'s outcome of the call: its answer, or the error its ask came to
        (it left, its connection dropped: :class:`~runtime.errors.RunNoAnswer`). The
        worker is told the seconds left until ``deadline``: a call that has no thread
        there by then is dropped, not run."""
        if ref is None:
            return _no_answer(wid, msg, left=True)
        left = max(deadline - anyio.current_time(), RUN_LEAST)
        try:
            outcome: RunOutcome = await ref.ask(RunCall(msg.call, msg.name, left), timeout=None)
        except ActorStopped:
            self.log.warning("a worker left before it answered a run", worker=wid, func=msg.name)
            return _no_answer(wid, msg, left=True)
        except Exception as exc:  # its answer could not come (too large for a frame, ...)
            return run_failure(exc, msg.name, wid)
        return outcome

    @handles(ScaleRequest, ResumeRequest)
    async def scale(self, msg: ScaleRequest | ResumeRequest) -> Any:
        autoscaler = self._autoscaler()
        if autoscaler is None:
            raise RuntimeError("this cluster has no autoscaler; workers are managed outside")
        return await autoscaler.ask(msg)

    @handles(MetricsRequest)
    async def metrics(self, msg: MetricsRequest) -> MetricsReply:
        sched = await self._scheduler().ask(dataclasses.replace(msg, pools=tuple(self.pools)))
        auto, busy = MetricsReply(), False
        autoscaler = self._autoscaler()
        if autoscaler is not None:
            try:  # it may be busy starting workers: do not hold the scrape up for it
                auto = await autoscaler.ask(msg, timeout=2.0)
            except (ActorStopped, AskTimeout):
                busy = True
        sched["policy_errors"] += auto.policy_errors  # the scaling policy's last
        return MetricsReply(**sched, blocks=auto.blocks, autoscaler_busy=busy)

    @handles(AlertsRequest)
    async def alerts(self, msg: AlertsRequest) -> AlertsReply:
        monitor = self._monitor()
        if monitor is None:
            return AlertsReply()
        reply: AlertsReply = await monitor.ask(msg)
        return reply

    @handles(AlertRuleAdd, AlertRuleRemove)
    async def alert_rule(self, msg: AlertRuleAdd | AlertRuleRemove) -> Any:
        monitor = self._monitor()
        if monitor is None:
            raise RuntimeError("this cluster runs no alert monitor; its rules cannot change")
        return await monitor.ask(msg)

    @handles(SettingsAt)
    def settings_at(self, msg: SettingsAt) -> None:
        self.settings = msg

    @handles(StatusRequest)
    async def status(self, msg: StatusRequest) -> StatusReply:
        sched = await self._scheduler().ask(msg)
        files = await self._registry().ask(msg)
        pending = self.pending
        mine: dict[str, Any] = {  # read before the autoscaler's answer, as the scheduler's was
            "runs": self.runs,
            "recent_runs": {r: len(k) for r, k in list(self.run_keys.items())[-10:]},
            "run_clients": {r: self.run_clients.get(r, "") for r in list(self.run_keys)[-10:]},
            "wanted_keys": len(self.keys),
            "wanted_pending": pending,
            # and the clients connected now (consoles are not clients)
            "process": {**process_figures(), "clients": len(self.connected)},
            "config": self.settings.settings,
        }
        auto, busy = None, False
        autoscaler = self._autoscaler()
        if autoscaler is not None:
            try:  # it may be busy starting workers: do not hold the status up for it
                auto = await autoscaler.ask(msg, timeout=2.0)
            except (ActorStopped, AskTimeout):
                busy = True
        return StatusReply(**sched, files=files, autoscaler=auto, autoscaler_busy=busy, **mine)


def _no_answer(wid: str, msg: RunRequest, *, left: bool) -> RunOutcome:
    """Worker ``wid``'s outcome of ``msg`` when no answer came: it ``left``, or not in time."""
    return run_failure(RunNoAnswer(wid, msg.name, msg.timeout, left=left), msg.name, wid)


def process_figures() -> dict[str, int]:
    """The process that runs the manager, for ``status()["process"]``: its ``pid``, its
    ``rss`` (bytes), ``threads``, open file descriptors (``fds``; -1 where the system
    does not say) and the asyncio tasks of its event loop: what tells a long-lived
    manager filling its bounded stores from one that leaks (docs/deployment.md)."""
    import asyncio
    import os

    import psutil

    me = psutil.Process()
    with me.oneshot():
        rss, threads = me.memory_info().rss, me.num_threads()
        try:
            fds = me.num_fds()
        except (AttributeError, psutil.Error):  # not on every system
            fds = -1
    try:
        tasks = len(asyncio.all_tasks())
    except RuntimeError:  # no running loop (a test's bare call)
        tasks = 0
    return {"pid": os.getpid(), "rss": rss, "threads": threads, "fds": fds,
            "asyncio_tasks": tasks}  # fmt: skip


def _keys_of_texts(texts: Iterable[str], by_text: Mapping[str, Key], other: str = "") -> list[Key]:
    """The keys ``texts`` name (``by_text``: the keys known, by their text); a text no
    known key has is a ``ValueError`` naming it (``other``: what else may be given)."""
    unknown = [text for text in texts if text not in by_text]
    if unknown:
        raise ValueError(
            f"unknown key{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(repr(t) for t in unknown[:5])}: give keys as `tasks` shows them{other}"
        )
    return [by_text[text] for text in texts]
