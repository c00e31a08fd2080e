"""What a candidate rules file would have decided on recorded history (`recoveryd replay`).

Pure: the recorded decisions come in a page at a time, in the order they were received
(`Store.replay_rows`), and each is decided again by the candidate's compiled rules from
the facts it kept (`fields.unkept`). Nothing is held per record: the report's groups are
keyed by rules, and each keeps its count and a few example dlqIds; budgets are simulated
per workflow over the entries of their window only. So memory follows the number of
rules and the traffic of one budget window, never the size of the store.

A record *changes* when the candidate decides it by another rule or action, or, both
sides being a resume or restart, with other overrides. Budgets are the candidate's own,
simulated in received order: a recovery it would decide, of a workflow it recovered
`maxRecoveries` times within the rule's window already, is stopped, as the store stops
one (store/sqlite/pipeline.py).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from daemon.rules.fields import BULKY, unkept
from daemon.rules.model import RECOVERIES
from daemon.rules.ruleset import Decision, Rule, Ruleset
from daemon.store.records import OVER_BUDGET, ReplayRow


@dataclass
class _Tally:
    """A count and the first dlqIds counted."""

    room: int
    count: int = 0
    examples: list[str] = field(default_factory=list)

    def add(self, dlq_id: str) -> None:
        self.count += 1
        if len(self.examples) < self.room:
            self.examples.append(dlq_id)

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "examples": self.examples}


class _Side(NamedTuple):
    """One side of a comparison: the rule that decided, its action, and the overrides of
    its resume or restart (None for another action)."""

    rule: str | None
    action: str | None
    overrides: str | None


class _Budgets:
    """The candidate's recoveries within its longest budget window, per workflow, in
    received order: what its budgets count. Older entries are dropped as time moves on."""

    def __init__(self, longest: float) -> None:
        self._longest = longest
        self._recent: deque[tuple[float, str]] = deque()
        self._by_key: dict[str, deque[float]] = {}

    def moved_to(self, now: float) -> None:
        """Forget the recoveries older than the longest window: no budget counts them."""
        while self._recent and self._recent[0][0] < now - self._longest:
            _, key = self._recent.popleft()
            times = self._by_key[key]
            times.popleft()
            if not times:
                del self._by_key[key]

    def spent(self, rule: Rule, key: str, now: float) -> bool:
        """Whether `rule`'s budget for workflow `key` is spent at `now`."""
        budget = rule.spec.budget
        if budget is None:
            return False
        made = 0
        for at in reversed(self._by_key.get(key, ())):
            if at < now - budget.within or made >= budget.max_recoveries:
                break
            made += 1
        return made >= budget.max_recoveries

    def recovered(self, key: str, now: float) -> None:
        if self._longest > 0:
            self._recent.append((now, key))
            self._by_key.setdefault(key, deque()).append(now)

    @property
    def size(self) -> int:
        return len(self._recent)


class Replay:
    """The candidate's decisions on recorded ones, added in received order, and the
    report of how they differ. `rule`: report only the records that rule decided, or
    would decide (the others are still decided, for the budgets they spend). `since`:
    records received earlier only count towards the candidate's budgets (the budget
    windows reaching back before the report's start)."""

    def __init__(
        self,
        candidate: Ruleset,
        *,
        rule: str | None = None,
        examples: int = 5,
        since: float | None = None,
    ) -> None:
        self.candidate = candidate
        self.rule = rule
        self.since = since
        self._room = examples
        self._reads = candidate.reads_all & BULKY
        # Each rule's decision as the store records one (pipeline/decide.py), and the rules
        # that would make a recovery (resume or restart, not in a dry run).
        self._sides: dict[Rule | None, _Side] = {None: _Side(None, None, None)}
        self._sides |= {rule: _side(rule) for rule in candidate.rules}
        self._acting = frozenset(
            rule for rule in candidate.rules
            if rule.action in RECOVERIES and not (candidate.dry_run or rule.spec.dry_run)
        )  # fmt: skip
        self._budgets = _Budgets(candidate.longest_budget_window())
        self.examined = 0
        self.changed = 0
        self._groups: dict[tuple[_Side, _Side], _Tally] = {}
        self._overrides: dict[tuple[_Side, _Side], _Tally] = {}
        self._stopped = _Tally(examples)
        self._recovered_again = _Tally(examples)
        self._live_stopped = 0
        self._not_replayable = _Tally(examples)
        self._unkept: set[str] = set()

    def add(self, row: ReplayRow) -> None:
        # The per-record path, kept lean: a million records go through it (bench/replay.py).
        facts = unkept(row.facts)
        decision = self.candidate.decide(facts)
        rule = decision.rule
        after = self._sides[rule]
        reported = (self.since is None or row.received_at >= self.since) and (
            self.rule is None or self.rule in (row.rule, after.rule)
        )
        if self._reads and self._missing(decision, facts, row, reported):
            return
        recovers = stopped = False
        if rule in self._acting and facts.get("workflow"):
            recovers, stopped = True, self._stopped_by_budget(rule, row)
        if not reported:
            return
        self.examined += 1
        live_stopped = row.state == "skipped" and (row.reason or "").startswith(OVER_BUDGET)
        if live_stopped:
            self._live_stopped += 1
            if recovers and not stopped:
                self._recovered_again.add(row.dlq_id)
        elif stopped:
            self._stopped.add(row.dlq_id)
        moved = row.rule != after.rule or row.action != after.action
        # Overrides compare where both sides are recoveries: the action may change too
        # (restart to resume), and the overrides each sends are part of the change.
        differ = (
            row.overrides is not None
            and after.overrides is not None
            and row.overrides != after.overrides
        )
        if moved or differ:
            self.changed += 1
            before = _Side(row.rule, row.action, row.overrides)
            if moved:
                self._tally(self._groups, (_decided(before), _decided(after)), row.dlq_id)
            if differ:
                self._tally(self._overrides, (before, after), row.dlq_id)

    def _missing(
        self, decision: Decision, facts: dict[str, Any], row: ReplayRow, reported: bool
    ) -> bool:
        """Whether the candidate's decision read a body `row` did not keep (counted)."""
        missing = (self.candidate.reads(decision) & self._reads) - facts.keys()
        if missing and reported:
            self.examined += 1
            self._not_replayable.add(row.dlq_id)
            self._unkept |= missing
        return bool(missing)

    def _stopped_by_budget(self, rule: Rule, row: ReplayRow) -> bool:
        """Whether `rule`'s budget stops its recovery of `row`, as the store would stop it
        (store/sqlite/pipeline.py); one it lets through counts against the next."""
        key = row.workflow_key
        if key is None:
            return False
        self._budgets.moved_to(row.received_at)
        if self._budgets.spent(rule, key, row.received_at):
            return True
        self._budgets.recovered(key, row.received_at)
        return False

    def _tally(self, groups: dict[tuple[_Side, _Side], _Tally], key: tuple[_Side, _Side],
               dlq_id: str) -> None:  # fmt: skip
        tally = groups.get(key)
        if tally is None:
            tally = groups[key] = _Tally(self._room)
        tally.add(dlq_id)

    @property
    def held(self) -> int:
        """Entries held for the budgets: bounded by the traffic of one budget window."""
        return self._budgets.size

    def report(self) -> dict[str, Any]:
        return {
            "candidate": {"source": self.candidate.source, "sha256": self.candidate.digest},
            "since": self.since,
            "rule": self.rule,
            "examined": self.examined,
            "changed": self.changed,
            "groups": [
                {"before": _named(before), "after": _named(after), **tally.to_json()}
                for (before, after), tally in _most_first(self._groups)
            ],
            "overrides": [
                {
                    "before": {**_named(before), "overrides": json.loads(before.overrides or "")},
                    "after": {**_named(after), "overrides": json.loads(after.overrides or "")},
                    **tally.to_json(),
                }
                for (before, after), tally in _most_first(self._overrides)
            ],
            "budget": {
                "stopped": self._stopped.to_json(),
                "recoveredAgain": self._recovered_again.to_json(),
                "liveStopped": self._live_stopped,
            },
            "notReplayable": {"fields": sorted(self._unkept), **self._not_replayable.to_json()},
        }


def would_change(report: dict[str, Any]) -> bool:
    """Whether the candidate decides any record otherwise, or budgets one otherwise."""
    budget = report["budget"]
    return bool(report["changed"] or budget["stopped"]["count"]
                or budget["recoveredAgain"]["count"])  # fmt: skip


def replay(candidate: Ruleset, rows: Iterable[ReplayRow], **options: Any) -> dict[str, Any]:
    """The report of `rows` (in received order) replayed at once: for tests and callers
    whose rows are at hand."""
    replaying = Replay(candidate, **options)
    for row in rows:
        replaying.add(row)
    return replaying.report()


def _decided(side: _Side) -> _Side:
    return _Side(side.rule, side.action, None)


def _side(rule: Rule) -> _Side:
    return _Side(rule.name, rule.action, rule.overrides_key)


def _named(side: _Side) -> dict[str, Any]:
    return {"rule": side.rule, "action": side.action}


def _most_first(
    groups: dict[tuple[_Side, _Side], _Tally],
) -> list[tuple[tuple[_Side, _Side], _Tally]]:
    return sorted(groups.items(), key=lambda item: (-item[1].count, repr(item[0])))
