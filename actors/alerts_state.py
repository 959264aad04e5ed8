"""Alert rules' pure core: expressions over the metrics, alert states, remediation.

What lives here: :class:`AlertRule` (a rule as data, :func:`parse_rule` /
:func:`parse_rules` from TOML tables or dicts), the expression language, and
:class:`AlertState`, whose ``handle(*events) -> list[Command]`` is the only way to change
it. No clock, no event loop: :class:`Evaluate` carries ``now`` (wall-clock seconds) and
the metrics as flat samples, ``{(name, ((label, value), ...)): value}``, exactly the
names and labels ``GET /metrics`` shows (``runtime.metrics.samples`` makes them from a
``MetricsReply``). The shell (the alert monitor) evaluates on a timer, sends
:class:`Notify` and :class:`Refresh` to the notifiers, :class:`Scale` to the autoscaler
and logs :class:`Audit` lines; tests and benchmarks drive it with a virtual clock.

**Expressions** (docs/monitoring.md, "Alert rules")::

    expr    := and ("or" and)*
    and     := term ("and" term)*
    term    := "(" expr ")" | vector OP NUMBER          OP: > >= < <= == !=
    vector  := SELECTOR
             | "sum" ["by" "(" label, ... ")"] "(" vector ")"
             | "increase" "(" SELECTOR "[" DURATION "]" ")"
    SELECTOR:= name ["{" label ("=" | "!=") "text", ... "}"]

An expression is at most :data:`MAX_EXPR_CHARS` characters, nests parentheses and
``sum`` at most :data:`MAX_EXPR_NESTING` levels and joins at most
:data:`MAX_EXPR_COMPARES` comparisons (refused at parse otherwise), so nothing that
walks its tree recurses without a bound.

A comparison keeps the instances (label sets, e.g. one per pool) whose value passes.
``a and b`` keeps the instances of ``a`` that agree with an instance of ``b`` on the
labels both have (a term without labels agrees with all), ``a or b`` adds the instances
of ``b`` that agree with none of ``a``. ``increase(x[10m])`` is how much counter ``x``
grew over the latest 10 minutes of the samples this core saw (a drop is a restart of
the counter, counted from 0).

**States**, per rule and instance: *pending* when the condition starts to hold, *firing*
once it held for ``for`` seconds (at once with ``for = 0``), *resolved* when it no longer
holds (``keep_firing_for``: that long after it stopped holding). A pending alert whose
condition stops holding is dropped without a notification. A resolved alert stays
visible for ``resolved_for`` seconds, then is forgotten; if its condition holds again
meanwhile, the new alert is listed after it while pending (a pending span that ends
leaves the resolved one listed), and replaces it once it fires. Each change is a
:class:`Notify`; after an evaluation, each firing alert whose value, fields or
annotations moved since it was last given out is a :class:`Refresh` (its current
snapshot: what a notifier sends again while it fires). When the samples say the
autoscaler did not answer (``corral_autoscaler_busy`` 1), a rule that reads a metric
missing from them is not evaluated that time: its alerts keep their state.

An alert's value is the expression's at the latest evaluation where it held: a resolved
alert keeps the last one, past its threshold (as Prometheus keeps a resolved alert's
value).

Each alert carries ``fields``: per comparison the largest value seen while the alert
was active and its threshold, and ``threshold_breached`` (1 while pending or firing, 0
once resolved); for the queue metrics they have the names of the users' own alert
(``max_queue_size``, ``max_queue_time_mins``, ``queue_size_threshold``,
``queue_time_threshold``; the times in minutes, to a tenth from a minute on and to two
significant digits below it).

**A stop** (:class:`Stopping`, an orderly stop's first step): the alerts hold still from
then on; evaluations change nothing, so the stop itself (its tasks cancelled, its workers
stopped) neither resolves, fires nor scales. The firing alerts end with the run, by the
notifiers' ``close`` and the monitoring database's end of the run.

**Remediation**: a rule may carry a :class:`ScaleOut` action. While its alert fires and
its condition holds, the core asks for more blocks of the pool (:class:`Scale`: by N, or
enough in all for its running and ready tasks), at most ``max_blocks`` and within ``max_cost``
worker-hours per hour, then waits ``cooldown`` seconds before the next step: level
triggered, always bounded. Every decision and every refusal is an :class:`Audit` line
(who: the rule; what: pool, from -> to blocks; why: the values against the thresholds).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import re
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import Any, Literal

from runtime.errors import AlertConfigError, did_you_mean
from runtime.messages import ANY_POOL, AlertInfo, pool_name_problem

__all__ = [
    "AUDIT_ACTIONS",
    "DEFAULT_RULES",
    "DUPLICATE_RULE",
    "MAX_EXPR_CHARS",
    "MAX_EXPR_COMPARES",
    "MAX_EXPR_NESTING",
    "NOTES",
    "AlertRule",
    "AlertState",
    "Audit",
    "Command",
    "Evaluate",
    "Event",
    "Expr",
    "Labels",
    "Notify",
    "Refresh",
    "RuleAdded",
    "RuleRemoved",
    "Samples",
    "Scale",
    "ScaleDone",
    "ScaleOut",
    "Stopping",
    "parse_duration",
    "parse_expr",
    "parse_rule",
    "parse_rules",
    "pool_warnings",
    "pools_in",
    "typed_duration",
]

#: a label set, as sorted ``(label, value)`` pairs
Labels = tuple[tuple[str, str], ...]
#: metrics as ``GET /metrics`` shows them: ``{(sample name, labels): value}``
Samples = Mapping[tuple[str, Labels], float]
#: metric name -> the labels its samples have (``runtime.metrics.SAMPLE_LABELS``)
MetricNames = Mapping[str, Collection[str]]

#: how long a resolved alert stays visible by default (seconds)
RESOLVED_FOR = 900.0
#: points kept per series for ``increase``: samples closer together than window / this
#: are merged (their growth added up), so the window stays whole however often it is read
MAX_HISTORY = 1000
#: audit lines kept for the status
MAX_AUDIT = 200
#: the bounds of an expression, far beyond any real rule's, so that neither parsing nor
#: evaluating it recurses without a bound: its length in characters, how deep
#: parentheses and ``sum(...)`` nest, and how many comparisons it joins
MAX_EXPR_CHARS = 10_000
MAX_EXPR_NESTING = 100
MAX_EXPR_COMPARES = 200

#: comparisons on these metrics give fields named as in the users' queue alert:
#: metric -> (field stem, scale, suffix of the max field)
_FIELD_NAMES: Mapping[str, tuple[str, float, str]] = {
    "corral_queue_depth": ("queue_size", 1.0, ""),
    "corral_queue_oldest_wait_seconds": ("queue_time", 1 / 60, "_mins"),
}

# ----------------------------------------------------------------------------- durations

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def typed_duration(text: str) -> float | str:
    """A duration as typed (a command line): seconds as a number when it is one, else
    the text (``5m``), for :func:`parse_duration`."""
    try:
        return float(text)
    except ValueError:
        return text


def parse_duration(value: object) -> float:
    """Seconds from a number >= 0 or a text like ``"90s"``, ``"5m"``, ``"1h30m"``
    (units ms, s, m, h, d); ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError("a number of seconds or a duration like '5m'")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise ValueError("a number of seconds >= 0 or a duration like '5m'")
        return float(value)
    if isinstance(value, str) and value.strip().startswith("-"):
        raise ValueError("a number of seconds >= 0 or a duration like '5m'")
    if isinstance(value, str) and _DURATION.fullmatch(value.strip()):
        return sum(float(n) * _UNITS[u] for n, u in _DURATION_PART.findall(value))
    raise ValueError("a number of seconds or a duration like '5m' (units ms, s, m, h, d)")


# ----------------------------------------------------------------------------- expressions


class _Syntax(Exception):
    """A problem in an expression, before the rule's name is known."""


@dataclasses.dataclass(frozen=True, slots=True)
class Selector:
    """``name{label="v", label2!="w"}``: the samples of ``name`` whose labels match."""

    name: str
    matchers: tuple[tuple[str, str, str], ...] = ()  #: (label, "=" or "!=", value)

    def matches(self, labels: Labels) -> bool:
        have = dict(labels)
        return all((have.get(k, "") == v) == (op == "=") for k, op, v in self.matchers)

    def names(self) -> Iterable[str]:
        yield self.name

    def stem(self) -> str:
        return self.name.removeprefix("corral_")


@dataclasses.dataclass(frozen=True, slots=True)
class Sum:
    """``sum by (labels) (vector)``; ``by`` None: ``sum(vector)``, one value."""

    by: tuple[str, ...] | None
    inner: Vector

    def names(self) -> Iterable[str]:
        return self.inner.names()

    def stem(self) -> str:
        return self.inner.stem()


@dataclasses.dataclass(frozen=True, slots=True)
class Increase:
    """``increase(selector[window])``: growth over the latest ``window`` seconds."""

    selector: Selector
    window: float

    def names(self) -> Iterable[str]:
        yield self.selector.name

    def stem(self) -> str:
        return self.selector.stem() + "_increase"


Vector = Selector | Sum | Increase


@dataclasses.dataclass(frozen=True, slots=True)
class Compare:
    """``vector OP threshold``; ``index``: its place among the rule's comparisons;
    ``text``: the vector as written."""

    vector: Vector
    op: str
    threshold: float
    index: int
    text: str


@dataclasses.dataclass(frozen=True, slots=True)
class BoolOp:
    op: Literal["and", "or"]
    left: Expr
    right: Expr


Expr = Compare | BoolOp

_OPS: Mapping[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<duration>\d+(?:\.\d+)?(?:ms|s|m|h|d)(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))*(?![\w.]))
    | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
    | (?P<name>[A-Za-z_:][A-Za-z0-9_:]*)
    | (?P<string>"[^"\\]*"|'[^'\\]*')
    | (?P<op>>=|<=|==|!=|=~|>|<|=)
    | (?P<punct>[(){}\[\],])
    )""",
    re.VERBOSE,
)


class _Parser:
    """Recursive descent over the tokens of one expression (grammar: module doc)."""

    def __init__(self, text: str, names: MetricNames | None) -> None:
        if len(text) > MAX_EXPR_CHARS:
            raise _Syntax(
                f"is {len(text)} characters long, more than the {MAX_EXPR_CHARS} allowed; "
                "split it into several rules"
            )
        self.text = text
        self.names = names
        self.depth = 0  #: how deep parentheses and sum(...) nest where the parser is
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None or m.lastgroup is None:
                at = len(text) - len(text[pos:].lstrip())
                word = _NON_FINITE.match(text, at)
                if word is not None:  # '-inf', '+nan': only a threshold could mean them
                    kind, op, _ = self.tokens[-1] if self.tokens else ("", "", 0)
                    raise _Syntax(_not_finite(word.group(), at, op if kind == "op" else ""))
                raise _Syntax(f"cannot read {text[pos:].strip()[:20]!r} at character {pos}")
            start = m.start(m.lastgroup)
            self.tokens.append((m.lastgroup, m.group(m.lastgroup), start))
            pos = m.end()
        self.i = 0
        self.compares = 0

    # tokens
    def peek(self) -> tuple[str, str, int]:
        if self.i < len(self.tokens):
            return self.tokens[self.i]
        return ("end", "", len(self.text))

    def take(self) -> tuple[str, str, int]:
        tok = self.peek()
        self.i += 1
        return tok

    def expect(self, value: str) -> None:
        kind, got, pos = self.take()
        if got != value or kind == "string":
            raise _Syntax(f"expected {value!r} at character {pos}, got {_shown(kind, got)}")

    def need(self, kind: str, what: str, after: str = "") -> str:
        """The next token, which must be a ``kind`` (described as ``what``)."""
        got_kind, got, pos = self.take()
        if got_kind != kind:
            raise _Syntax(f"expected {what}{after} at character {pos}, got {_shown(got_kind, got)}")
        return got

    def at(self, value: str) -> bool:
        kind, got, _ = self.peek()
        return got == value and kind in ("name", "punct", "op")

    def nest(self, pos: int) -> None:
        """One level deeper (parentheses, ``sum(...)``), within :data:`MAX_EXPR_NESTING`."""
        self.depth += 1
        if self.depth > MAX_EXPR_NESTING:
            raise _Syntax(
                f"nests parentheses and sum(...) more than {MAX_EXPR_NESTING} levels deep "
                f"(at character {pos}); flatten it or split it into several rules"
            )

    # grammar
    def parse(self) -> Expr:
        if not self.tokens:
            raise _Syntax("is empty; write e.g. 'corral_queue_depth > 0'")
        expr = self.or_()
        kind, got, pos = self.peek()
        if kind != "end":
            raise _Syntax(
                f"unexpected {_shown(kind, got)} at character {pos}; join comparisons "
                "with 'and' / 'or'"
            )
        return expr

    def or_(self) -> Expr:
        left = self.and_()
        while self.at("or"):
            self.take()
            left = BoolOp("or", left, self.and_())
        return left

    def and_(self) -> Expr:
        left = self.term()
        while self.at("and"):
            self.take()
            left = BoolOp("and", left, self.term())
        return left

    def term(self) -> Expr:
        if self.at("("):
            self.nest(self.take()[2])
            inner = self.or_()
            self.expect(")")
            self.depth -= 1
            return inner
        start = self.peek()[2]
        vector = self.vector()
        text = self.text[start : self.peek()[2]].strip()
        kind, op, pos = self.take()
        if kind != "op" or op not in _OPS:
            raise _Syntax(
                f"expected a comparison (> >= < <= == !=) after {text!r} at character "
                f"{pos}, got {_shown(kind, op)}"
            )
        kind, num, pos = self.peek()
        if kind == "name" and _NON_FINITE.fullmatch(num):
            raise _Syntax(_not_finite(num, pos, op))
        num = self.need("number", "a number", f" after {op!r}")
        threshold = float(num)
        if not math.isfinite(threshold):  # 1e400: beyond a float's range
            raise _Syntax(_not_finite(num, pos, op, threshold))
        index = self.compares
        self.compares += 1
        if self.compares > MAX_EXPR_COMPARES:
            raise _Syntax(
                f"joins more than {MAX_EXPR_COMPARES} comparisons (the one at character "
                f"{start} is one too many); split it into several rules"
            )
        return Compare(vector, op, threshold, index, text)

    def vector(self) -> Vector:
        kind, word, pos = self.peek()
        if kind == "name" and word == "sum":
            self.nest(pos)
            self.take()
            by: tuple[str, ...] | None = None
            if self.at("by"):
                self.take()
                self.expect("(")
                labels = []
                while not self.at(")"):
                    labels.append(self.need("name", "a label"))
                    if not self.at(")"):
                        self.expect(",")
                self.take()
                by = tuple(labels)
            self.expect("(")
            inner = self.vector()
            self.expect(")")
            self.depth -= 1
            if by is not None:
                self.check_labels(inner, by)
            return Sum(by, inner)
        if kind == "name" and word == "increase":
            self.take()
            self.expect("(")
            sel = self.selector()
            self.expect("[")
            dur = self.need("duration", "a duration like '10m'")
            window = parse_duration(dur)
            if window <= 0:
                raise _Syntax(f"the window of increase() must be longer than 0, got {dur!r}")
            self.expect("]")
            self.expect(")")
            return Increase(sel, window)
        return self.selector()

    def selector(self) -> Selector:
        kind, name, pos = self.take()
        if kind != "name" or name in ("and", "or", "by"):
            raise _Syntax(f"expected a metric name at character {pos}, got {_shown(kind, name)}")
        if (self.names is None or name not in self.names) and (
            self.at("(") or self.at("by") or self.at("without")
        ):
            raise _Syntax(_no_function(name, pos))
        if self.names is not None and name not in self.names:
            if name.startswith(_NOTIFICATIONS):
                raise _Syntax(
                    f"names {name!r} at character {pos}, which is one of the "
                    f"{_NOTIFICATIONS}* metrics: alert rules cannot use them (an alert about "
                    "Alertmanager would have to reach it); alert on them in Prometheus"
                )
            if name + "_total" in self.names:
                hint = f"; did you mean {name + '_total'!r}? (a counter's samples end in _total)"
            else:
                hint = did_you_mean(name, list(self.names), "; docs/monitoring.md lists them")
            raise _Syntax(f"names an unknown metric {name!r}{hint}")
        matchers: list[tuple[str, str, str]] = []
        if self.at("{"):
            self.take()
            while not self.at("}"):
                label = self.need("name", "a label")
                self.check_label(name, label)
                ok, op, opos = self.take()
                if op not in ("=", "!="):
                    raise _Syntax(f"expected '=' or '!=' after {label!r} at character {opos}, "
                                  f"got {_shown(ok, op)}")  # fmt: skip
                value = self.need("string", "a quoted value")
                matchers.append((label, op, value[1:-1]))
                if not self.at("}"):
                    self.expect(",")
            self.take()
        return Selector(name, tuple(matchers))

    def check_label(self, name: str, label: str) -> None:
        if self.names is None:
            return
        known = sorted(self.names[name])
        if label not in known:
            have = ", ".join(known) if known else "none"
            raise _Syntax(
                f"metric {name!r} has no label {label!r}"
                + did_you_mean(label, known)
                + f" (its labels: {have})"
            )

    def check_labels(self, vector: Vector, labels: Iterable[str]) -> None:
        for name in vector.names():
            for label in labels:
                self.check_label(name, label)


#: the prefix of the series on Alertmanager's notifiers (``runtime.metrics``), which
#: ``/metrics`` shows and rules cannot read
_NOTIFICATIONS = "corral_notifications_"

#: the functions of the expression language
FUNCTIONS = "sum(...), sum by (label, ...) (...) and increase(metric[duration])"


def _no_function(name: str, pos: int) -> str:
    """The problem of a function the language does not have (PromQL's ``rate()``, ...)."""
    if name in ("rate", "irate", "delta", "idelta"):
        instead = (
            f"; instead of {name}(x[5m]) > r write increase(x[5m]) > r * 300 (the growth "
            "over the window), e.g. increase(corral_tasks_finished_total[5m]) > 0"
        )
    else:
        instead = did_you_mean(name, ("sum", "increase"))
    return (
        f"uses {name}() at character {pos}, a function alert expressions do not support: "
        f"the functions are {FUNCTIONS}{instead}"
    )


#: the words Python's float() reads as a non-finite number
_NON_FINITE = re.compile(r"[-+]?(?:inf(?:inity)?|nan)(?![\w.])", re.IGNORECASE)


def _not_finite(text: str, pos: int, op: str = "", value: float | None = None) -> str:
    """The problem of a threshold that is not a finite number (inf, -inf, nan)."""
    after = f" after {op!r}" if op else ""
    reads = f", which reads as {value}" if value is not None else ""
    return (
        f"the threshold{after} at character {pos} must be a finite number, got {text!r}"
        f"{reads}; give a number such as 0, 60 or 1.5e3"
    )


def _shown(kind: str, value: str) -> str:
    return "the end" if kind == "end" else repr(value)


def parse_expr(text: str, names: MetricNames | None = None) -> Expr:
    """The expression ``text``, parsed; ``names``: the known metrics and their labels
    (None: any). Raises ValueError saying what is wrong where."""
    try:
        return _Parser(text, names).parse()
    except _Syntax as err:
        raise ValueError(str(err)) from None


def compares(expr: Expr) -> list[Compare]:
    """The comparisons of ``expr``, left to right (without recursion: a long chain of
    ``or`` is a deep tree)."""
    out: list[Compare] = []
    todo: list[Expr] = [expr]
    while todo:
        e = todo.pop()
        if isinstance(e, Compare):
            out.append(e)
        else:
            todo += (e.right, e.left)
    return out


def _field_names(terms: Mapping[int, Compare]) -> dict[int, tuple[str, str, float, bool]]:
    """Per comparison (by index): its max field, its threshold field, the scale of
    both, and whether they are rounded. Comparisons of the same metric with the same
    operator and threshold share their fields (one on each side of an ``or``, for
    different labels); with another operator or threshold (``corral_queue_depth > 5
    and corral_queue_depth < 100``) the later one's are numbered:
    ``max_queue_size_2``, ``queue_size_threshold_2``."""
    out: dict[int, tuple[str, str, float, bool]] = {}
    taken: Counter[str] = Counter()
    seen: dict[tuple[str, str, float], tuple[str, str, float, bool]] = {}
    for i in sorted(terms):
        v: Vector = terms[i].vector
        while isinstance(v, Sum):
            v = v.inner
        name = v.selector.name if isinstance(v, Increase) else v.name
        stem, scale, suffix = _FIELD_NAMES.get(name, (v.stem(), 1.0, ""))
        if isinstance(v, Increase):
            stem, scale, suffix = v.stem(), 1.0, ""
        same = (stem, terms[i].op, terms[i].threshold)
        if same not in seen:
            taken[stem] += 1
            n = f"_{taken[stem]}" if taken[stem] > 1 else ""
            seen[same] = (f"max_{stem}{suffix}{n}", f"{stem}_threshold{n}", scale, scale != 1.0)
        out[i] = seen[same]
    return out


def _vectors(expr: Expr) -> Iterable[Vector]:
    for c in compares(expr):
        v: Vector = c.vector
        while isinstance(v, Sum):
            yield v
            v = v.inner
        yield v


# ----------------------------------------------------------------------------- rules


@dataclasses.dataclass(frozen=True, slots=True)
class ScaleOut:
    """Scale a pool out while the alert fires: ``by`` blocks more than its target, or
    (``fit``) enough blocks in all for the tasks it runs and those ready,
    ``ceil((running + ready) / slots_per_block)``, pending blocks counting as capacity
    (never below the target: when that covers it, nothing). ``pool``: None is the
    alert's ``pool`` label. Then wait ``cooldown`` seconds. Never above ``max_blocks``
    (None: the pool's own) nor ``max_cost`` worker-hours per hour (blocks x workers per
    block; None: no cap).
    ``restore`` (default): once the alerts that scaled the pool out resolved, set its
    target back to what it was before (unless someone else changed it since); without
    it the raised target stays, a floor, until someone lowers it."""

    by: int | None = None
    fit: bool = False
    pool: str | None = None
    cooldown: float = 300.0
    max_blocks: int | None = None
    max_cost: float | None = None
    restore: bool = True

    def __post_init__(self) -> None:
        if (self.by is None) != self.fit or (self.by is not None and self.by < 1):
            raise ValueError(f"scale_out needs by >= 1 or fit, not both: got by={self.by!r}, "
                             f"fit={self.fit!r}")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"fit": True} if self.fit else {"by": self.by}
        if self.pool is not None:
            d["pool"] = self.pool
        d["cooldown"] = self.cooldown
        if self.max_blocks is not None:
            d["max_blocks"] = self.max_blocks
        if self.max_cost is not None:
            d["max_cost"] = self.max_cost
        if not self.restore:
            d["restore"] = False
        return {"scale_out": d}


@dataclasses.dataclass(frozen=True, slots=True)
class AlertRule:
    """One rule: ``expr`` (text; ``parsed``: its tree), pending ``for_`` seconds before
    firing, firing ``keep_firing_for`` seconds after the condition stops holding, the
    ``labels`` and ``annotations`` its alerts carry, an optional ``action``."""

    name: str
    expr: str
    for_: float = 0.0
    keep_firing_for: float = 0.0
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    action: ScaleOut | None = None
    parsed: Expr = dataclasses.field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.parsed is None:
            try:
                object.__setattr__(self, "parsed", parse_expr(self.expr))
            except ValueError as err:
                raise AlertConfigError(self.name, "expr", str(err)) from None

    def to_dict(self) -> dict[str, Any]:
        """The rule as data: :func:`parse_rule` of it gives it back."""
        d: dict[str, Any] = {
            "name": self.name,
            "expr": self.expr,
            "for": self.for_,
            "keep_firing_for": self.keep_firing_for,
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
        }
        if self.action is not None:
            d["action"] = self.action.to_dict()
        return d


RULE_KEYS = ("name", "expr", "for", "keep_firing_for", "labels", "annotations", "action")
ACTION_KEYS = ("scale_out",)
SCALE_OUT_KEYS = ("by", "fit", "pool", "cooldown", "max_blocks", "max_cost", "restore")
_RULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_NAME_CHARS = "letters, digits, '_', '.' and '-' (not first)"
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _unknown(rule: str, key: str, known: Iterable[str], where: str = "") -> AlertConfigError:
    known = list(known)
    return AlertConfigError(
        rule, where + key,
        f"is unknown{did_you_mean(key, known, '.', prefix=where)} The keys are: "
        f"{', '.join(known)}",
    )  # fmt: skip


def _strings(rule: str, key: str, value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise AlertConfigError(rule, key, f"must be a table of texts, got {value!r}")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not _LABEL_NAME.fullmatch(k):
            raise AlertConfigError(
                rule, key, f"names are letters, digits and '_' (not first), got {k!r}"
            )
        if not isinstance(v, str):
            raise AlertConfigError(rule, f"{key}.{k}", f"must be a text, got {v!r}")
        out[k] = v
    return out


def _seconds(rule: str, key: str, value: object) -> float:
    try:
        return parse_duration(value)
    except ValueError as err:
        raise AlertConfigError(rule, key, f"must be {err}, got {value!r}") from None


def _scale_out(rule: str, raw: object, pools: Collection[str] | None = None) -> ScaleOut:
    key = "action.scale_out"
    if not isinstance(raw, Mapping):
        raise AlertConfigError(rule, key, f"must be a table (by or fit, ...), got {raw!r}")
    for k in raw:
        if k not in SCALE_OUT_KEYS:
            raise _unknown(rule, str(k), SCALE_OUT_KEYS, key + ".")
    by, fit, restore = raw.get("by"), raw.get("fit", False), raw.get("restore", True)
    for name, flag in (("fit", fit), ("restore", restore)):
        if not isinstance(flag, bool):
            raise AlertConfigError(rule, f"{key}.{name}", f"must be true or false, got {flag!r}")
    if (by is None) == (not fit):
        raise AlertConfigError(
            rule, key, "needs exactly one of 'by = N' (blocks more) and 'fit = true' (blocks "
            "for the running and ready tasks)",
        )  # fmt: skip
    if by is not None and (isinstance(by, bool) or not isinstance(by, int) or by < 1):
        raise AlertConfigError(rule, key + ".by", f"must be a whole number >= 1, got {by!r}")
    pool = raw.get("pool")
    problem = "" if pool is None else pool_name_problem(pool)
    if problem:
        raise AlertConfigError(
            rule, key + ".pool",
            f"must be a pool's name, got {pool!r} ({problem}): name the pool to scale out, "
            "or leave it out for the pool the alert's pool label names",
        )  # fmt: skip
    if pool is not None and pools is not None and pool not in pools:
        raise AlertConfigError(rule, key + ".pool", _no_pool(pool, pools))
    cooldown = _seconds(rule, key + ".cooldown", raw.get("cooldown", 300.0))
    mb = raw.get("max_blocks")
    if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or mb < 1):
        raise AlertConfigError(
            rule, key + ".max_blocks", f"must be a whole number >= 1, got {mb!r}"
        )
    cost = raw.get("max_cost")
    if cost is not None and (
        isinstance(cost, bool) or not isinstance(cost, int | float) or not cost > 0
        or not math.isfinite(cost)
    ):  # fmt: skip
        raise AlertConfigError(
            rule, key + ".max_cost", f"must be worker-hours per hour > 0, got {cost!r}"
        )
    return ScaleOut(by, fit, pool, cooldown, mb, None if cost is None else float(cost), restore)


def _no_pool(pool: str, pools: Collection[str]) -> str:
    """The problem of a scale-out of ``pool``, not one of ``pools``."""
    known = list(pools)
    listed = ", ".join(known) or "none"
    return f"names no pool: {pool!r}{did_you_mean(pool, known, '.')} The pools are: {listed}"


def _templates(
    rule: str, annotations: Mapping[str, str], parsed: Expr, names: MetricNames,
    labels: Mapping[str, str],
) -> None:  # fmt: skip
    """Refuse an annotation whose ``{{ $labels.x }}`` names a label no alert of the rule
    carries (it would render empty)."""
    can = sorted({"alertname", *_instance_labels(parsed, names), *labels})
    for key, text in annotations.items():
        for m in _TEMPLATE.finditer(text):
            note = m.group(3)
            if note is not None and note not in NOTES:
                raise AlertConfigError(
                    rule, f"annotations.{key}",
                    f"names the note {note!r}, which is not one Corral gives (the notes: "
                    f"{', '.join(NOTES)})" + did_you_mean(note, list(NOTES)),
                )  # fmt: skip
            label = m.group(2)
            if label is not None and label not in can:
                raise AlertConfigError(
                    rule, f"annotations.{key}",
                    f"names the label {label!r}, which no alert of this rule carries (their "
                    f"labels: {', '.join(can)}), so it would be empty"
                    + did_you_mean(label, can),
                )  # fmt: skip


def parse_rule(
    raw: Mapping[str, Any],
    names: MetricNames,
    name: str | None = None,
    *,
    pools: Collection[str] | None = None,
    position: int | None = None,
) -> AlertRule:
    """A rule from its table (keys: ``name``, ``expr``, ``for``, ``keep_firing_for``,
    ``labels``, ``annotations``, ``action``). ``names``: the metrics an expression may
    name, with their labels (``runtime.metrics.SAMPLE_LABELS``); ``name``: the rule's
    name when the table is keyed by it; ``pools``: the cluster's pools, which a
    scale-out action must name one of (None: not known, not checked); ``position``: the
    rule's place in a list (from 1), for a message about a rule without a name. Raises
    :class:`AlertConfigError`."""
    if name is None:
        name = raw.get("name") if isinstance(raw, Mapping) else None
    shown = name if isinstance(name, str) else ""
    at = "the rule" if position is None else f"the rule at position {position}"
    if not isinstance(raw, Mapping):
        raise AlertConfigError(
            shown, "",
            f"{at} is {raw!r}, not a table: a rule is a table with a name and an expr, e.g. "
            '{name = "QueueBusy", expr = "corral_queue_depth > 0"} (an [[alerts]] table in '
            "a file, a dict in Python)",
        )  # fmt: skip
    for key in raw:
        if key not in RULE_KEYS:
            raise _unknown(shown, str(key), RULE_KEYS)
    if "name" in raw and raw["name"] != name:
        raise AlertConfigError(shown, "name", f"differs from the table's name {raw['name']!r}")
    if name is None:
        expr = raw.get("expr")
        of = f" (expr {expr!r})" if isinstance(expr, str) else ""
        raise AlertConfigError(
            "", "name", f"is missing from {at}{of}: give each rule a name: {_NAME_CHARS}"
        )
    if not isinstance(name, str) or not _RULE_NAME.fullmatch(name):
        raise AlertConfigError(shown, "name", f"a rule's name is {_NAME_CHARS}, got {name!r}")
    expr = raw.get("expr")
    if not isinstance(expr, str):
        raise AlertConfigError(name, "expr", f"must be a text, got {expr!r}")
    try:
        parsed = parse_expr(expr, names)
    except ValueError as err:
        raise AlertConfigError(name, "expr", str(err)) from None
    labels = _strings(name, "labels", raw.get("labels", {}))
    if "alertname" in labels:
        raise AlertConfigError(name, "labels.alertname", "is the rule's name; leave it out")
    for key in sorted(labels.keys() & _instance_labels(parsed, names)):
        raise AlertConfigError(
            name, f"labels.{key}",
            f"is a label of the series the rule matches: each value of it is an alert of "
            f"its own, which this label would make one; name it otherwise (e.g. "
            f"'{key}_group')",
        )  # fmt: skip
    action = raw.get("action")
    scale: ScaleOut | None = None
    if action is not None:
        if not isinstance(action, Mapping) or not action:
            raise AlertConfigError(
                name, "action", f"must be {{scale_out = {{...}}}}, got {action!r}"
            )
        for key in action:
            if key not in ACTION_KEYS:
                raise _unknown(name, str(key), ACTION_KEYS, "action.")
        scale = _scale_out(name, action["scale_out"], pools)
        if scale.pool is None and "pool" not in _instance_labels(parsed, names):
            raise AlertConfigError(
                name, "action.scale_out.pool",
                "is needed: no alert of this rule carries a pool label (the series its "
                "expression matches have none, or a sum(...) without by (pool) drops it), so "
                "no scale-out could act; set scale_out.pool in the rule's action (--pool POOL "
                "in the console)",
            )  # fmt: skip
    annotations = _strings(name, "annotations", raw.get("annotations", {}))
    _templates(name, annotations, parsed, names, labels)
    return AlertRule(
        name=name,
        expr=expr,
        for_=_seconds(name, "for", raw.get("for", 0.0)),
        keep_firing_for=_seconds(name, "keep_firing_for", raw.get("keep_firing_for", 0.0)),
        labels=labels,
        annotations=annotations,
        action=scale,
        parsed=parsed,
    )


def _instance_labels(e: Expr, names: MetricNames) -> set[str]:
    """The labels an instance of expression ``e`` may carry (``and`` and ``or`` join
    both sides')."""
    out: set[str] = set()
    for c in compares(e):
        v: Vector = c.vector
        if isinstance(v, Sum):
            out.update(v.by or ())
        else:
            selector = v.selector if isinstance(v, Increase) else v
            out.update(names.get(selector.name, ()))
    return out


def pool_warnings(rule: AlertRule, pools: Collection[str] | None) -> list[str]:
    """What is valid in ``rule`` but likely a typo: a ``pool="X"`` matcher of its
    expression naming none of the cluster's ``pools`` (None or none: not known, nothing
    said). Not refused: workers may join later with ``--pool X``."""
    if not pools:
        return []
    out: list[str] = []
    for v in _vectors(rule.parsed):
        selector = v.selector if isinstance(v, Increase) else v
        for label, op, value in selector.matchers if isinstance(selector, Selector) else ():
            if label != "pool" or op != "=" or value in (ANY_POOL, "") or value in pools:
                continue
            text = (
                f"no pool {value!r} is configured (pools: {', '.join(pools)})"
                f"{did_you_mean(value, pools, '.')} The rule can fire only if workers join "
                f"with --pool {value} or tasks ask for pool {value}"
            )
            if text not in out:
                out.append(text)
    return out


#: the problem of a name two rules share
DUPLICATE_RULE = "is used by two rules; give each its own"


def parse_rules(
    raw: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]],
    names: MetricNames,
    *,
    pools: Collection[str] | None = None,
) -> list[AlertRule]:
    """Rules from a list of tables (``[[alerts.rules]]``, each with a ``name``) or a
    table of tables keyed by name (``[alerts.rules.QueueTime]``); two rules may not
    share a name; ``pools`` as for :func:`parse_rule`. Raises :class:`AlertConfigError`."""
    if isinstance(raw, Mapping):
        rules = [parse_rule(v, names, name=str(k), pools=pools) for k, v in raw.items()]
    elif isinstance(raw, str | bytes) or not isinstance(raw, Iterable):
        raise AlertConfigError("", "", f"rules must be a list of tables, got {raw!r}")
    else:
        rules = [parse_rule(r, names, pools=pools, position=i) for i, r in enumerate(raw, 1)]
    seen: set[str] = set()
    for r in rules:
        if r.name in seen:
            raise AlertConfigError(r.name, "name", DUPLICATE_RULE)
        seen.add(r.name)
    return rules


#: the rules a manager runs unless configured otherwise (docs/monitoring.md lists them):
#: they notify only; add ``action = {scale_out = {...}}`` to a copy to remediate
DEFAULT_RULES: list[dict[str, Any]] = [
    {
        "name": "CorralQueueTime",
        "expr": "corral_queue_depth > 0 and corral_queue_oldest_wait_seconds > 60",
        "for": "1m",
        "labels": {"team": "corral", "priority": "P2"},
        "annotations": {
            "summary": "Tasks of pool {{ $labels.pool }} wait for a worker",
            # true while pending too: it does not say the minute of `for` has passed
            "description": "{{ $value }} ready tasks of pool {{ $labels.pool }}; the oldest "
            "has waited over a minute (the alert fires once that has held for a minute). "
            "Why one waits: `tasks --state queued` in the console lists them, and `story "
            "KEY` says why (every core of its pool busy, blocks not running yet, the pool "
            "at its max_blocks, no worker with the cores or memory it asks for). To scale "
            "the pool out on this alert, copy the rule under another name with a "
            "scale_out action.",
        },
    },
    {
        "name": "CorralTaskStuckOnWorker",
        "expr": "corral_worker_queue_oldest_seconds > 300",
        "for": "1m",
        "labels": {"team": "corral", "priority": "P2"},
        "annotations": {
            "summary": "A task of pool {{ $labels.pool }} waits on its worker",
            "description": "A try sent to a worker of pool {{ $labels.pool }} has waited "
            "there {{ $value }} s without starting: what runs before it on that worker "
            "runs long or hangs, and no other worker of the pool was free to take it.",
        },
    },
    {
        # a hung task with no timeout= said nothing anywhere (user audit failures, 6)
        "name": "CorralTaskRunningLong",
        "expr": "corral_task_longest_running_seconds > 3600",
        "for": "5m",
        "labels": {"team": "corral", "priority": "P3"},
        "annotations": {
            "summary": "A task of pool {{ $labels.pool }} has run over an hour",
            "description": "A try on a worker of pool {{ $labels.pool }} has executed for "
            "{{ $value }} s: it may hang (a deadlock, a read that never returns). The "
            "console's tasks --state processing lists the running tasks and their workers. "
            "Give such tasks a timeout= to have them failed (TaskTimeout) and retried; if "
            "tasks run this long on purpose, raise the threshold or remove the rule.",
        },
    },
    {
        "name": "CorralNoWorkers",
        "expr": '(corral_queue_depth{pool!="*"} > 0 and sum by (pool) (corral_workers) == 0)'
        ' or (corral_queue_depth{pool="*"} > 0 and corral_workers_connected == 0)',
        "for": "2m",
        "labels": {"team": "corral", "priority": "P2"},
        "annotations": {
            "summary": "Pool {{ $labels.pool }} has ready tasks and no worker",
            "description": "{{ $value }} ready tasks of pool {{ $labels.pool }} and no worker "
            "to run them for two minutes. {{ $notes.blocks_pending }}",
        },
    },
    {
        "name": "CorralProvisioningStuck",
        "expr": "corral_blocks_pending_oldest_seconds > 600",
        "for": "1m",
        "labels": {"team": "corral", "priority": "P3"},
        "annotations": {
            "summary": "A block of pool {{ $labels.pool }} is not running after 10 minutes",
            "description": "The oldest block of pool {{ $labels.pool }} not running yet was "
            "requested {{ $value }} s ago: check the batch system's queue. With "
            "tasks_per_worker, blocks kept up for outputs a waiting task reads (a placement "
            "stall of the pool whose idle workers are kept, CorralPlacementStalled) may hold "
            "the room it waits for: release the results you no longer need, or set a "
            "max_blocks the partition can run beside them.",
        },
    },
    {
        "name": "CorralBlocksStuck",
        "expr": "increase(corral_blocks_stuck_total[30m]) >= 2",
        "labels": {"team": "corral", "priority": "P3"},
        "annotations": {
            "summary": "Blocks of pool {{ $labels.pool }} do not come up in time",
            "description": "{{ $value }} blocks of pool {{ $labels.pool }} were not running "
            "by the pool's provisioning_timeout in the latest 30 minutes; each was cancelled "
            "and replaced. Check the batch system's queue (a partition with no free nodes, "
            "a quota, an image that fails to start).",
        },
    },
    {
        "name": "CorralBlocksFailing",
        "expr": "increase(corral_blocks_failed_total[10m]) >= 3",
        "labels": {"team": "corral", "priority": "P2"},
        "annotations": {
            "summary": "Blocks of pool {{ $labels.pool }} keep failing",
            "description": "{{ $value }} blocks of pool {{ $labels.pool }} failed or ended "
            "unasked in the latest 10 minutes. The latest: {{ $notes.last_block_failure }}",
        },
    },
    {
        "name": "CorralPoolSuspended",
        "expr": "corral_pool_suspended > 0",
        "labels": {"team": "corral", "priority": "P2"},
        "annotations": {
            "summary": "Pool {{ $labels.pool }} asks for no block until an operator resumes it",
            "description": "Pool {{ $labels.pool }} stopped asking for blocks: its batch "
            "system refused too many submissions, or its blocks kept ending. Its tasks wait "
            "until then. Fix its cause, then run `resume {{ $labels.pool }}` in the console "
            "(its status shows the latest error). Why: {{ $notes.suspended_why }}",
        },
    },
    {
        "name": "CorralSubmissionsFailing",
        "expr": "corral_pool_submit_failures >= 3 and corral_pool_suspended == 0",
        "labels": {"team": "corral", "priority": "P2"},
        "annotations": {
            "summary": "Pool {{ $labels.pool }} cannot submit blocks to its batch system",
            "description": "{{ $value }} block submissions of pool {{ $labels.pool }} failed "
            "in a row (its batch system does not answer, or refuses them). The pool asks "
            "again after a "
            "back-off and goes on by itself once a submission goes through; its tasks wait "
            "until then. The console's status shows the latest error.",
        },
    },
    {
        "name": "CorralInputsUnreachable",
        "expr": 'increase(corral_task_failures_total{outcome="missing"}[10m]) > 0',
        "labels": {"team": "corral", "priority": "P2"},
        "annotations": {
            "summary": "Tasks of {{ $labels.category }} fail: workers cannot fetch their "
            "inputs from each other",
            "description": "{{ $value }} tasks of category {{ $labels.category }} failed in "
            "the latest 10 minutes with InputsUnreachable: their inputs could not be fetched "
            "from workers still connected, for two minutes. Check that the workers can reach "
            "each other (each worker's --host, the address its peers reach it on; a firewall "
            "between hosts or pools; over wss://, each worker's certificate must name its "
            "--host); the workers' logs say why each fetch failed.",
        },
    },
    {
        "name": "CorralMemoryStalled",
        "expr": "corral_workers_throttled > 0",
        "for": "5m",
        "labels": {"team": "corral", "priority": "P3"},
        "annotations": {
            "summary": "Workers of pool {{ $labels.pool }} are throttled for memory",
            "description": "{{ $value }} workers of pool {{ $labels.pool }} have been past "
            "their throttle fence for five minutes: tasks there wait for memory.",
        },
    },
    {
        "name": "CorralDiskStalled",
        "expr": "corral_disk_stalled > 0 or increase(corral_disk_stalls_total[15m]) >= 3",
        "for": "1m",
        "labels": {"team": "corral", "priority": "P3"},
        "annotations": {
            "summary": "Tasks of pool {{ $labels.pool }} wait for disk that nothing frees",
            "description": "Every worker of pool {{ $labels.pool }} ran nothing while its "
            "ready tasks waited for disk (their disks are full of outputs that only those "
            "tasks would free), for a minute or three times in 15 minutes. Corral runs "
            "the waiting tasks whose run frees disk meanwhile and drops outputs it can "
            "make again to make room, which costs their work once more. Give the "
            "workers a larger --disk (disk_per_worker), run consumers first (`policy set "
            "priority consumers-first` in the console), or release the "
            "futures you no longer need. The manager's log names the workers, what fills "
            "their disks and what waits; the console's status shows the stall.",
        },
    },
    {
        "name": "CorralPlacementStalled",
        "expr": "corral_placement_stalled > 0",
        "for": "1m",
        "labels": {"team": "corral", "priority": "P3"},
        "annotations": {
            "summary": "Ready tasks of pool {{ $labels.pool }} go to no idle worker",
            "description": "Pool {{ $labels.pool }} has had ready tasks and an idle worker "
            "and placed or finished nothing for a minute past the scheduler's "
            "stall_timeout. The manager's log and the console's status say why each idle "
            "worker takes nothing (paused, draining, kept, throttled, full, resources, "
            "refused) and what to do: for resources, start workers with the cores and "
            "memory the tasks ask for or lower their resources=; for throttled, more memory "
            "per worker; for refused, read the first ready task's story; for kept (blocks "
            "of a tasks_per_worker pool kept up for outputs a waiting task reads, which "
            "may hold the room its pending blocks wait for), release the results you no "
            "longer need, set a max_blocks the partition can run beside them, or cancel a "
            "kept block (its outputs are computed again).",
        },
    },
]


# ----------------------------------------------------------------------------- events


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class Evaluate(Event):
    """Evaluate every rule at ``now`` (wall-clock seconds) on ``samples``. ``notes``:
    texts by name and labels, as samples are (e.g. ``("last_block_failure", (("pool",
    "ckpt"),))``, the latest failed block of a pool and why), which an annotation shows
    with ``{{ $notes.NAME }}`` (:data:`NOTES`)."""

    now: float
    samples: Samples
    notes: Mapping[tuple[str, Labels], str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class RuleAdded(Event):
    """Start evaluating ``rule``. A rule of the same name is refused unless ``replace``
    (its alerts then resolve at ``now``)."""

    rule: AlertRule
    replace: bool = False
    now: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class RuleRemoved(Event):
    """Stop evaluating rule ``name``: its firing alerts resolve at ``now``, its pending
    ones are dropped."""

    name: str
    now: float = 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class ScaleDone(Event):
    """How a :class:`Scale` went: ``ok``, or not and why (``detail``); ``rule``: the
    rule whose action it was, for the audit ("": not said)."""

    pool: str
    ok: bool
    detail: str = ""
    now: float = 0.0
    rule: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Stopping(Event):
    """The cluster stops on purpose (at ``now``): the alerts hold still from here on.
    An :class:`Evaluate` after it changes nothing and commands nothing (the stop ends
    the run's tasks and stops the workers: no alert resolves, fires or scales a pool
    for that); the firing alerts are ended by the notifiers' ``close``
    (``ended_by``) and the monitoring database's end of the run."""

    now: float = 0.0


# ----------------------------------------------------------------------------- commands


@dataclasses.dataclass(frozen=True, slots=True)
class Command:
    pass


@dataclasses.dataclass(frozen=True, slots=True)
class Notify(Command):
    """An alert changed state (pending, firing or resolved): tell the notifiers."""

    alert: AlertInfo


@dataclasses.dataclass(frozen=True, slots=True)
class Refresh(Command):
    """A firing alert's snapshot changed at an evaluation (its value, fields or
    annotations) without a change of state: its current one, for the notifiers that send
    firing alerts again (their resends and the stop-time end carry it). Not a
    notification of its own. Once per evaluation per firing alert that changed since its
    latest :class:`Notify` or :class:`Refresh`."""

    alert: AlertInfo


@dataclasses.dataclass(frozen=True, slots=True)
class Scale(Command):
    """Set ``pool``'s block target to ``target``: rule ``rule``'s action, for ``reason``
    (the values against the thresholds). More blocks than it has; or, for an action
    with ``restore`` whose alerts resolved, the target it had before (``restore``: the
    shell asks with ``RestoreRequest``, so that the blocks beyond it go as they go
    idle, not drained while they run tasks)."""

    pool: str
    target: int
    rule: str
    reason: str
    restore: bool = False


#: what an :class:`Audit` says was done: a scale-out, one refused (the cooldown,
#: max_blocks, the cost cap, ...), a target set back once the alerts resolved, one left
#: as someone else set it, one to set back once it is known, a scale that failed
AUDIT_ACTIONS = (
    "scale-out", "no-scale-out", "restore", "restore-left", "restore-later", "scale-failed",
)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class Audit(Command):
    """One line on a remediation decided or refused, or a scale that failed; and the
    same as data, for the monitoring database: the ``rule`` and the alert's ``labels``
    it came from (empty: not known), the ``pool``, the ``action`` (one of
    :data:`AUDIT_ACTIONS`), the pool's block target before it and the one set
    (``before``, ``after``: None where it names none) and ``why`` (the line's reason)."""

    line: str
    now: float
    rule: str = ""
    labels: Labels = ()
    pool: str = ""
    action: str = ""
    before: int | None = None
    after: int | None = None
    why: str = ""


# ----------------------------------------------------------------------------- state


@dataclasses.dataclass(slots=True)
class _Match:
    value: float
    terms: dict[int, float]


@dataclasses.dataclass(slots=True)
class _Alert:
    rule: str
    labels: Labels
    state: Literal["pending", "firing", "resolved"]
    rule_labels: Mapping[str, str]
    annotations: Mapping[str, str]
    active_since: float
    value: float = 0.0
    last_true: float = 0.0
    fired_at: float | None = None
    resolved_at: float | None = None
    fields: dict[str, float] = dataclasses.field(default_factory=dict)
    refused: str = ""  #: the latest refusal audited (said once until it changes)
    said: AlertInfo | None = None  #: its latest snapshot given out (Notify, Refresh)


_TEMPLATE = re.compile(
    r"\{\{\s*\$(labels\.([A-Za-z_][A-Za-z0-9_]*)|value|notes\.([A-Za-z_][A-Za-z0-9_]*))\s*\}\}"
)

#: the notes an annotation may show (``{{ $notes.NAME }}``, :class:`Evaluate`), with
#: what each says: the one whose labels the alert has too, "" when there is none
NOTES: Mapping[str, str] = {
    "last_block_failure": "per pool: its latest block that failed or ended unasked, and "
    "why (Slurm's state and exit code, the last lines of its stderr and where that file is)",
    "suspended_why": "per pool, while it asks for no block until resumed: why (its batch "
    "system's latest refusal, or the latest of the blocks that kept ending)",
    "blocks_pending": "per pool, while its autoscaler has blocks asked for and not running "
    "yet: how many, and how long the oldest has waited",
}


def _number(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    return f"{v:g}" if v != int(v) or abs(v) >= 1e15 else str(int(v))


def _minutes(value: float) -> float:
    """A time in minutes as an alert's fields carry it: to a tenth from a minute on
    (``62.1``), two significant digits below it (2 s: ``0.033``, 15 s: ``0.25``), so a
    threshold of seconds does not read as 0."""
    return float(f"{value:.2g}") if abs(value) < 1 else round(value, 1)


def _duration(seconds: float) -> str:
    """A duration as an audit line says it: whole seconds, one decimal under 10 s
    (``31``, ``2``, ``2.5``), not a clock's digits (``2.00211``)."""
    if not math.isfinite(seconds):
        return str(seconds)
    return _number(round(seconds, 1) if abs(seconds) < 10 else float(round(seconds)))


def _show_labels(labels: Labels) -> str:
    return "{" + ", ".join(f"{k}={v}" for k, v in labels) + "}" if labels else ""


def _who(rule: str, labels: Labels) -> str:
    """The alert an audit line is of: ``alert RULE{label=value, ...}``."""
    return f"alert {rule}{_show_labels(labels)}"


class AlertState:
    """The rules, their alerts, the history ``increase`` reads, the remediation audit."""

    def __init__(
        self,
        rules: Iterable[AlertRule] = (),
        *,
        resolved_for: float = RESOLVED_FOR,
        max_audit: int = MAX_AUDIT,
    ) -> None:
        self.rules: dict[str, AlertRule] = {}  #: by name, in the order added
        self.resolved_for = resolved_for
        self.audit: deque[Audit] = deque(maxlen=max_audit)  #: the latest audit lines
        #: by rule, labels and the rule's labels (as Alertmanager tells alerts apart):
        #: a rule replaced by one of other labels leaves its resolved alerts listed
        self._alerts: dict[tuple[str, Labels, Labels], _Alert] = {}
        #: by the same key: a resolved alert whose labels hold again, kept (listed before
        #: the new one) while the new one is pending, for its ``resolved_for`` at most: a
        #: pending span that ends before it fires leaves it listed, one that fires
        #: replaces it (the firing alert is what those labels are now)
        self._before: dict[tuple[str, Labels, Labels], _Alert] = {}
        #: per counter series ``increase`` reads: (time, value, growth since the point
        #: before), oldest first
        self._history: dict[tuple[str, Labels], deque[tuple[float, float, float]]] = {}
        #: per counter ``increase`` reads, when it was last recorded; and every series of
        #: them seen so far (a series first seen after a record counts from 0; one seen
        #: before, that went and came back, continues from its first sample back):
        #: those of a counter no rule reads any more are let go (:meth:`_record`)
        self._watched: dict[str, float] = {}
        self._seen: set[tuple[str, Labels]] = set()
        self._last_scale: dict[str, float] = {}  #: pool -> when an action last scaled it
        #: pools scaled out by actions that restore: (target before, target set, by alerts)
        self._restore: dict[str, tuple[int, int, set[tuple[str, Labels]]]] = {}
        #: pools whose restoring alert resolved while their target was unknown: (target
        #: before, target set, rule, the alert's labels), decided once the target is known
        self._restore_due: dict[str, tuple[int, int, str, Labels]] = {}
        self._samples: Samples = {}  #: the latest evaluated
        self._notes: Mapping[tuple[str, Labels], str] = {}  #: the latest notes given
        self._out: list[Command] = []
        #: when the cluster began to stop (:class:`Stopping`; None: it runs)
        self.stopped_at: float | None = None
        for rule in rules:
            self._add(rule, False, 0.0)

    # ----------------------------------------------------------------- API

    def handle(self, *events: Event) -> list[Command]:
        """Apply ``events`` in order; return the commands to carry out."""
        for ev in events:
            if isinstance(ev, Evaluate):
                if self.stopped_at is None:  # (stopping: the alerts hold still)
                    self._notes = ev.notes
                    self._evaluate(ev.now, ev.samples)
            elif isinstance(ev, Stopping):
                if self.stopped_at is None:
                    self.stopped_at = ev.now
            elif isinstance(ev, RuleAdded):
                self._add(ev.rule, ev.replace, ev.now)
            elif isinstance(ev, RuleRemoved):
                self._remove(ev.name, ev.now)
            elif isinstance(ev, ScaleDone):
                if not ev.ok:
                    self._audit(
                        f"scale-out of pool {ev.pool} failed: {ev.detail}", ev.now,
                        rule=ev.rule, pool=ev.pool, action="scale-failed", why=ev.detail,
                    )  # fmt: skip
            else:
                raise TypeError(f"AlertState cannot handle {type(ev).__name__}")
        out, self._out = self._out, []
        return out

    def alerts(self) -> list[AlertInfo]:
        """The alerts pending, firing or resolved lately, by rule and labels; a pending
        one whose labels resolved lately comes after that resolved one."""
        out = []
        for key, a in sorted(self._alerts.items()):
            before = self._before.get(key)
            if before is not None:
                out.append(self._info(before))
            out.append(self._info(a))
        return out

    def pools(self) -> list[str]:
        """The pools the latest evaluated samples give a block target for (none before
        the first evaluation, when the autoscaler did not answer, or without one)."""
        return pools_in(self._samples)

    # ----------------------------------------------------------------- rules

    def _add(self, rule: AlertRule, replace: bool, now: float) -> None:
        old = self.rules.get(rule.name)
        if old is not None:
            if not replace:
                raise AlertConfigError(
                    rule.name, "name", "is a rule already; remove it first or replace it"
                )
            if dict(old.labels) != dict(rule.labels):
                self._remove(rule.name, now)  # other labels: other alerts (Alertmanager's)
            else:
                # The same alerts under the new rule: a firing one goes on firing (its
                # scale-out, cooldown and restore with it) until the new expression no
                # longer holds, as at any evaluation; a pending one counts from when it
                # began, against the new ``for``.
                for a in itertools.chain(self._alerts.values(), self._before.values()):
                    if a.rule == rule.name:
                        a.annotations = rule.annotations
        self.rules[rule.name] = rule

    def _remove(self, name: str, now: float) -> None:
        if self.rules.pop(name, None) is None:
            raise AlertConfigError(
                name, "", f"there is no such rule (the rules: {', '.join(self.rules) or 'none'})"
                + did_you_mean(name, list(self.rules)),
            )  # fmt: skip
        for key, a in list(self._alerts.items()):
            if a.rule != name:
                continue
            if a.state == "pending":
                self._drop_pending(key)
            elif a.state == "firing":
                self._resolve(a, now)

    # ----------------------------------------------------------------- evaluation

    def _evaluate(self, now: float, samples: Samples) -> None:
        self._samples = samples
        self._record(now, samples)
        by_name: dict[str, list[tuple[Labels, float]]] = {}
        for (name, labels), v in samples.items():
            by_name.setdefault(name, []).append((labels, v))
        busy = samples.get(("corral_autoscaler_busy", ()), 0.0) >= 1
        for rule in self.rules.values():
            if busy and any(n not in by_name for v in _vectors(rule.parsed) for n in v.names()):
                continue  # the autoscaler did not answer: its series are unknown, not gone
            matches = self._expr(rule.parsed, by_name, now)
            self._step(rule, matches, now, samples)
        for a in (a for _, a in sorted(self._alerts.items()) if a.state == "firing"):
            info = self._info(a)
            if info != a.said:  # its numbers or texts moved: resends carry the new ones
                a.said = info
                self._out.append(Refresh(info))
        # After the rules: a scale-out just made took a due restore over.
        for pool, (before, set_to, rule_name, labels) in list(self._restore_due.items()):
            if self._restore_target(pool, before, set_to, rule_name, labels, now):
                del self._restore_due[pool]
        for alerts in (self._alerts, self._before):
            for key, a in list(alerts.items()):
                done = a.resolved_at is not None and now - a.resolved_at >= self.resolved_for
                if a.state == "resolved" and done:
                    del alerts[key]

    def _step(
        self, rule: AlertRule, matches: dict[Labels, _Match], now: float, samples: Samples
    ) -> None:
        terms = {c.index: c for c in compares(rule.parsed)}
        names = _field_names(terms)
        own = tuple(sorted(rule.labels.items()))  # the rule's labels: part of each key
        for labels, m in matches.items():
            key = (rule.name, labels, own)
            a = self._alerts.get(key)
            if a is None or a.state == "resolved":
                if a is not None:
                    self._before[key] = a  # listed until the new one fires
                a = self._alerts[key] = _Alert(
                    rule.name, labels, "pending", rule.labels, rule.annotations, now
                )
                self._seed_fields(a, terms, names)
                new = True
            else:
                new = False
            a.value, a.last_true = m.value, now
            for i, v in m.terms.items():
                self._field_max(a, names[i], v)
            if a.state == "pending" and now - a.active_since >= rule.for_:
                a.state, a.fired_at = "firing", now
                self._before.pop(key, None)
                self._notify(a)
            elif new:
                self._notify(a)
            if a.state == "firing" and rule.action is not None:
                self._act(rule, rule.action, a, m, terms, now, samples)
        for key, a in list(self._alerts.items()):
            if a.rule != rule.name or a.labels in matches:
                continue
            if a.state == "pending":
                self._drop_pending(key)
            elif a.state == "firing" and now - a.last_true >= rule.keep_firing_for:
                self._resolve(a, now)

    def _drop_pending(self, key: tuple[str, Labels, Labels]) -> None:
        """A pending alert stopped holding (or its rule went): gone, without a
        notification; the resolved one of its labels it followed stays listed."""
        before = self._before.pop(key, None)
        if before is None:
            del self._alerts[key]
        else:
            self._alerts[key] = before

    def _resolve(self, a: _Alert, now: float) -> None:
        a.state, a.resolved_at = "resolved", now
        a.fields["threshold_breached"] = 0.0
        self._notify(a)
        key = (a.rule, a.labels)
        for pool, (before, set_to, by) in list(self._restore.items()):
            if key not in by:
                continue
            by.discard(key)
            if by:
                continue  # another alert that scaled it still fires
            del self._restore[pool]
            if not self._restore_target(pool, before, set_to, a.rule, a.labels, now):
                # The autoscaler did not answer this time: whether someone changed the
                # target since is not known. Decide once it is.
                self._restore_due[pool] = (before, set_to, a.rule, a.labels)
                why = (
                    f"resolved: pool {pool}'s target is unknown (no autoscaler answer): set "
                    "back once it is known, unless someone changed it"
                )
                self._audit(
                    f"{_who(a.rule, a.labels)} {why}", now, rule=a.rule, labels=a.labels,
                    pool=pool, action="restore-later", before=set_to, after=before, why=why,
                )  # fmt: skip

    def _restore_target(
        self, pool: str, before: int, set_to: int, rule: str, labels: Labels, now: float
    ) -> bool:
        """Set ``pool``'s target back to ``before`` unless it is no longer the
        ``set_to`` a scale-out set (someone changed it since); False when the target is
        unknown (nothing decided)."""
        now_target = self._samples.get(("corral_blocks_target", (("pool", pool),)))
        if now_target is None:
            return False
        who = _who(rule, labels)
        if int(now_target) != set_to:
            why = (
                f"resolved: pool {pool}'s target is {int(now_target)}, not the {set_to} its "
                "scale-out set: left as it is"
            )
            self._audit(
                f"{who} {why}", now, rule=rule, labels=labels, pool=pool,
                action="restore-left", before=int(now_target), why=why,
            )  # fmt: skip
            return True
        reason = f"resolved: back to the target before the scale-out ({set_to} -> {before})"
        self._out.append(Scale(pool, before, rule, reason, restore=True))
        why = f"{reason}; blocks beyond it drain once idle, as the pool's scaling policy says"
        self._audit(
            f"{who} {why}", now, rule=rule, labels=labels, pool=pool, action="restore",
            before=set_to, after=before, why=why,
        )  # fmt: skip
        return True

    def _notify(self, a: _Alert) -> None:
        a.said = self._info(a)
        self._out.append(Notify(a.said))

    def _info(self, a: _Alert) -> AlertInfo:
        labels = {"alertname": a.rule, **dict(a.labels), **a.rule_labels}
        value = _number(a.value)

        def fill(m: re.Match[str]) -> str:
            if m.group(3) is not None:
                return self._note(m.group(3), labels)
            return value if m.group(2) is None else labels.get(m.group(2), "")

        return AlertInfo(
            name=a.rule,
            state=a.state,
            labels=labels,
            annotations={k: _TEMPLATE.sub(fill, v).rstrip() for k, v in a.annotations.items()},
            value=a.value,
            active_since=a.active_since,
            fired_at=a.fired_at,
            resolved_at=a.resolved_at,
            fields=dict(a.fields),
        )

    def _note(self, name: str, labels: Mapping[str, str]) -> str:
        """The note ``name`` whose labels ``labels`` has too ("" if none)."""
        for (n, pairs), text in self._notes.items():
            if n == name and all(labels.get(k) == v for k, v in pairs):
                return text
        return ""

    # ----------------------------------------------------------------- fields

    @staticmethod
    def _seed_fields(
        a: _Alert, terms: Mapping[int, Compare], names: Mapping[int, tuple[str, str, float, bool]]
    ) -> None:
        for i, c in terms.items():
            _, thr, scale, rounded = names[i]
            value = c.threshold * scale
            a.fields[thr] = _minutes(value) if rounded else value
        a.fields["threshold_breached"] = 1.0

    @staticmethod
    def _field_max(a: _Alert, names: tuple[str, str, float, bool], v: float) -> None:
        top, _, scale, rounded = names
        value = _minutes(v * scale) if rounded else v * scale
        if top not in a.fields or value > a.fields[top]:
            a.fields[top] = value

    # ----------------------------------------------------------------- expressions

    def _expr(
        self, e: Expr, by_name: Mapping[str, list[tuple[Labels, float]]], now: float
    ) -> dict[Labels, _Match]:
        if isinstance(e, Compare):
            test = _OPS[e.op]
            return {
                labels: _Match(v, {e.index: v})
                for labels, v in self._vector(e.vector, by_name, now).items()
                if test(v, e.threshold)
            }
        left = self._expr(e.left, by_name, now)
        right = self._expr(e.right, by_name, now)
        out: dict[Labels, _Match] = {}
        if e.op == "and":
            for ll, rl in _agreeing(left, right):
                lm, rm = left[ll], right[rl]
                merged = tuple(sorted({**dict(ll), **dict(rl)}.items()))
                out[merged] = _Match(lm.value, {**rm.terms, **lm.terms})
            return out
        for ll, lm in left.items():
            out[ll] = _Match(lm.value, dict(lm.terms))
        matched: set[Labels] = set()
        for rl, ll in _agreeing(right, left):
            matched.add(rl)
            out[ll].terms = {**right[rl].terms, **out[ll].terms}
        for rl, rm in right.items():
            if rl not in matched:
                out[rl] = rm
        return out

    def _vector(
        self, v: Vector, by_name: Mapping[str, list[tuple[Labels, float]]], now: float
    ) -> dict[Labels, float]:
        if isinstance(v, Selector):
            return {labels: x for labels, x in by_name.get(v.name, ()) if v.matches(labels)}
        if isinstance(v, Sum):
            sums: dict[Labels, float] = {}
            for labels, x in self._vector(v.inner, by_name, now).items():
                key = () if v.by is None else tuple((k, s) for k, s in labels if k in v.by)
                sums[key] = sums.get(key, 0.0) + x
            return sums
        out: dict[Labels, float] = {}
        horizon = now - v.window
        for (name, labels), points in self._history.items():
            if name != v.selector.name or not v.selector.matches(labels):
                continue
            # each point's growth since the point before it; the first is the base
            out[labels] = sum(g for t, _, g in itertools.islice(points, 1, None) if t > horizon)
        return out

    def _record(self, now: float, samples: Samples) -> None:
        """Keep the samples ``increase`` needs: per series, those within its window and
        one just before it (the base), each as ``(time, value, growth since the point
        before)`` (a counter that went down restarted from 0: its value is its growth).
        About :data:`MAX_HISTORY` points cover the window: while the latest point is
        closer than window / MAX_HISTORY to the one before it, a sample is merged into
        it (its growth added), so a long window evaluated often stays whole, to within
        one such span at its start. A series that appears after the counter was
        recorded, and was never seen before, gets the base 0 at that record: Corral's
        counters appear at their first count (a task's first failure of a cause), so
        all of their value is growth (Prometheus would need two samples of it). A counter
        that no rule reads any more is let go whole: its history and its series seen (a
        rule reading it again starts afresh, as at the manager's start)."""
        windows: dict[str, float] = {}
        for rule in self.rules.values():
            for v in _vectors(rule.parsed):
                if isinstance(v, Increase):
                    name = v.selector.name
                    windows[name] = max(windows.get(name, 0.0), v.window)
        for key, x in samples.items():
            name = key[0]
            if name in windows:
                points = self._history.get(key)
                if points is None:
                    points = self._history[key] = deque()
                    since = self._watched.get(name)
                    if since is not None and key not in self._seen:
                        points.append((since, 0.0, 0.0))
                    self._seen.add(key)
                if not points:
                    points.append((now, x, 0.0))
                    continue
                _, last, _ = points[-1]
                grown = x - last if x >= last else x
                step = windows[name] / (MAX_HISTORY - 2)
                if len(points) >= 2 and points[-1][0] - points[-2][0] < step:
                    points[-1] = (now, x, points[-1][2] + grown)
                else:
                    points.append((now, x, grown))
        if self._watched.keys() - windows.keys():  # no rule reads these counters now
            self._seen = {key for key in self._seen if key[0] in windows}
        self._watched = dict.fromkeys(windows, now)
        for key, points in list(self._history.items()):
            window = windows.get(key[0])
            if window is None or points[-1][0] < now - window:
                del self._history[key]  # no rule reads it, or the series went
                continue
            while len(points) > 1 and points[1][0] <= now - window:
                points.popleft()

    # ----------------------------------------------------------------- remediation

    def _act(
        self,
        rule: AlertRule,
        act: ScaleOut,
        a: _Alert,
        m: _Match,
        terms: Mapping[int, Compare],
        now: float,
        samples: Samples,
    ) -> None:
        who = _who(rule.name, a.labels)
        why = " and ".join(
            f"{terms[i].text} = {_number(v)} {terms[i].op} {_number(terms[i].threshold)}"
            for i, v in sorted(m.terms.items())
        )
        pool = act.pool or dict(a.labels).get("pool")
        target: float | None = None  #: the pool's block target, once read

        def refuse(reason: str, kind: str = "") -> None:
            """Audit a refusal once, until its kind (default: its text) changes."""
            if a.refused != (kind or reason):
                a.refused = kind or reason
                self._audit(
                    f"{who}: no scale-out{reason} ({why})", now, rule=rule.name,
                    labels=a.labels, pool=pool or "", action="no-scale-out",
                    before=None if target is None else int(target),
                    why=f"no scale-out{reason} ({why})",
                )  # fmt: skip

        if pool is None or pool == ANY_POOL:
            refuse(": the alert names no pool; set scale_out.pool in the rule's action")
            return

        def gauge(name: str, extra: Labels = ()) -> float | None:
            return samples.get((name, tuple(sorted((("pool", pool), *extra)))))

        target = gauge("corral_blocks_target")  # (a refusal's audit says it too)
        last = self._last_scale.get(pool)
        if last is not None and now - last < act.cooldown:
            refuse(
                f" of pool {pool}: cooldown, scaled {_duration(now - last)} s ago, waits "
                f"{_duration(act.cooldown)} s",
                "cooldown",
            )
            return
        if target is None:
            known = pools_in(samples)
            if known:  # the autoscaler answered, for other pools (this one was removed)
                refuse(
                    f" of pool {pool}: it is not one of the cluster's pools ({', '.join(known)})"
                    + did_you_mean(pool, known)
                )
            else:
                refuse(f" of pool {pool}: its blocks are unknown (no autoscaler answer)")
            return
        current = int(target)
        running = pending = 0
        for (name, labels), x in samples.items():
            if name == "corral_blocks" and ("pool", pool) in labels:
                if ("state", "running") in labels:
                    running += int(x)
                else:
                    pending += int(x)
        if act.fit:
            slots = gauge("corral_pool_slots_per_block") or 0
            if slots < 1:
                refuse(f" of pool {pool}: its slots per block are unknown")
                return
            queued = (gauge("corral_queue_depth") or 0) + (
                samples.get(("corral_queue_depth", (("pool", ANY_POOL),))) or 0
            )
            busy = gauge("corral_tasks_running") or 0
            # Blocks for all the pool's work, running and ready, the pending blocks
            # counted as capacity: the autoscaler's strategy has already asked for blocks
            # for the ready tasks, and those must not be asked for twice.
            wanted = math.ceil((busy + queued) / slots)
            how = (
                f"fit {_number(busy)} running and {_number(queued)} ready tasks at "
                f"{_number(slots)} per block, with {running} running and {pending} pending "
                "blocks"
            )
        else:
            wanted = current + (act.by or 0)
            how = f"by {act.by}"
        caps: list[tuple[int, str]] = []
        pool_max = gauge("corral_pool_max_blocks") or 0
        if act.max_blocks is not None:
            caps.append((act.max_blocks, f"max_blocks {act.max_blocks}"))
        if pool_max >= 1:
            caps.append((int(pool_max), f"the pool's max_blocks {int(pool_max)}"))
        if not caps:
            refuse(f" of pool {pool}: no max_blocks known; set scale_out.max_blocks")
            return
        if act.max_cost is not None:
            per_block = gauge("corral_pool_workers_per_block") or 1
            blocks = math.floor(act.max_cost / per_block + 1e-9)
            caps.append((
                blocks,
                f"cost cap {_number(act.max_cost)} worker-hours per hour "
                f"({_number(per_block)} workers per block)",
            ))  # fmt: skip
        cap, cap_why = min(caps)
        new = min(wanted, cap)
        if wanted <= current:
            refuse(
                f" of pool {pool}: its target {current} already covers it ({how})",
                f"covered at {current}",
            )  # once, not at each count of tasks
            return
        if new <= current:
            refuse(
                f" of pool {pool} beyond {current} blocks: {cap_why}",
                f"capped at {current}: {cap_why}",
            )
            return
        desired = int(gauge("corral_blocks_desired") or 0)
        if act.fit and new <= desired:
            # The scaling policy wants these blocks already (it keeps or asks for them):
            # a target of ``new`` would add none, only a floor that keeps them idle
            # after the queue is gone. Audited once, however its count moves.
            capped = f", capped by {cap_why}" if new < wanted else ""
            refuse(
                f" of pool {pool}: its scaling policy wants {desired} blocks already "
                f"({how}{capped})",
                "covered by the policy",
            )
            return
        capped = f", capped by {cap_why}" if new < wanted else ""
        reason = f"{how}{capped}: {why}"
        a.refused = ""
        self._last_scale[pool] = now
        # A restore still due (its alert resolved while the target was unknown) and the
        # target its scale-out set: this one restores to where that one would have.
        due = self._restore_due.pop(pool, None)
        if act.restore:
            start = due[0] if due is not None and due[1] == current else current
            before, _, by = self._restore.get(pool, (start, new, set()))
            by.add((rule.name, a.labels))
            self._restore[pool] = (before, new, by)
        elif pool in self._restore:
            del self._restore[pool]  # a scale-out that stays: nothing to restore
        self._out.append(Scale(pool, new, rule.name, reason))
        self._audit(
            f"{who}: scale pool {pool} out from {current} to {new} blocks ({reason})", now,
            rule=rule.name, labels=a.labels, pool=pool, action="scale-out", before=current,
            after=new, why=reason,
        )  # fmt: skip

    def _audit(self, line: str, now: float, **data: Any) -> None:
        entry = Audit(line, now, **data)
        self.audit.append(entry)
        self._out.append(entry)


def pools_in(samples: Samples) -> list[str]:
    """The pools ``samples`` give a block target for: the autoscaler's pools, when it
    answered (none otherwise, or without an autoscaler)."""
    return sorted(
        dict(labels).get("pool", "") for name, labels in samples if name == "corral_blocks_target"
    )


def _agreeing(left: Iterable[Labels], right: Iterable[Labels]) -> Iterator[tuple[Labels, Labels]]:
    """The pairs of label sets, one of ``left`` and one of ``right``, that agree on the
    labels both have; through an index per pair of label names, not every pair."""
    groups: dict[tuple[str, ...], list[Labels]] = {}
    for rl in right:
        groups.setdefault(tuple(k for k, _ in rl), []).append(rl)
    indexes: dict[tuple[tuple[str, ...], tuple[str, ...]], dict[tuple[str, ...], list[Labels]]]
    indexes = {}
    for ll in left:
        lkeys = tuple(k for k, _ in ll)
        lvalues = dict(ll)
        for rkeys, members in groups.items():
            common = [k for k in lkeys if k in rkeys]
            index = indexes.get((lkeys, rkeys))
            if index is None:
                index = indexes[(lkeys, rkeys)] = {}
                for rl in members:
                    rvalues = dict(rl)
                    index.setdefault(tuple(rvalues[k] for k in common), []).append(rl)
            for rl in index.get(tuple(lvalues[k] for k in common), ()):
                yield ll, rl
