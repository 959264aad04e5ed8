"""Policy problems, counted and told once: the one ledger of the cores that call policies.

A core that asks a policy and gets no usable answer (it raised, answered out of bounds, or
took longer than its budget) counts a *policy error* under a key (the autoscaler: the
pool; the scheduler: the policy's kind), keeps the key's latest problem for ``status()``
(``policy_problems``) and tells it, for the log, when it is new for the key: once per
distinct problem, and again after :data:`POLICY_ERROR_EVERY` seconds (on the core's
clock) while it goes on. Each error is also counted under its policy, its kind and
name, for ``/metrics`` (:meth:`PolicyProblems.counts`: ``corral_policy_errors_total``,
``corral_policy_slow_total``). Pure: the caller gives ``now``.
"""

from __future__ import annotations

from collections.abc import Iterable

from runtime.messages import PolicyErrorCount

#: seconds after which a problem still going on is told again
POLICY_ERROR_EVERY = 60.0


class PolicyProblems:
    """Policy errors per key, the latest problem of each, and what to tell."""

    def __init__(self, every: float = POLICY_ERROR_EVERY) -> None:
        self.every = every
        self.total = 0  #: policy errors over every key
        self.by: dict[str, int] = {}  #: key -> its policy errors
        self.problem: dict[str, str] = {}  #: key -> its latest problem
        #: (kind, policy name) -> its policy errors, and of them its slow turns and spells
        self.named: dict[tuple[str, str], int] = {}
        self.slow: dict[tuple[str, str], int] = {}
        #: key -> (what the problem told last is, when): ``same`` of :meth:`note`
        self._told: dict[str, tuple[str, float]] = {}

    def note(
        self,
        key: str,
        problem: str,
        now: float,
        same: str | None = None,
        *,
        policy: tuple[str, str],
        slow: bool = False,
    ) -> int | None:
        """Count a policy error of ``key``, and of ``policy`` (its kind and name;
        ``slow``: a slow turn or spell); return the key's error count if it is to be
        told now (a problem not told for the key, or told ``every`` seconds ago), else
        None. ``same``: what makes two problems the same, when not their whole text
        (a problem with figures that change at each error: its kind alone)."""
        self.total += 1
        self.named[policy] = self.named.get(policy, 0) + 1
        if slow:
            self.slow[policy] = self.slow.get(policy, 0) + 1
        errors = self.by[key] = self.by.get(key, 0) + 1
        self.problem[key] = problem
        what = problem if same is None else same
        told = self._told.get(key)
        if told is None or told[0] != what or now - told[1] >= self.every:
            self._told[key] = (what, now)
            return errors
        return None

    def counts(self, in_force: Iterable[tuple[str, str]]) -> tuple[PolicyErrorCount, ...]:
        """Per policy (kind, name) that had errors, and per one ``in_force`` (0 without
        any: its series is there from the start), its errors and slow turns and spells,
        in order: what ``/metrics`` counts."""
        named = {**dict.fromkeys(in_force, 0), **self.named}
        return tuple(
            PolicyErrorCount(kind, name, n, self.slow.get((kind, name), 0))
            for (kind, name), n in sorted(named.items())
        )

    def afresh(self, key: str | None = None) -> None:
        """A new policy: its problems (of ``key``; None: every key) are told afresh."""
        if key is None:
            self._told.clear()
        else:
            self._told.pop(key, None)
