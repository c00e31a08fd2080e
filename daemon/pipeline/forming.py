"""Forming batches: decided dlqIds grouped by batch key, and when a group is due to go.

dlqIds decided for the same action and the same overrides share a batch, flushed at
the tightest `maxSize` or `maxWait` among their rules, at most 50 per call
(docs/pipeline.md, Batches). No I/O and no clock: the caller passes the time in. It
uses the rules' batch policy and the client's page size, nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from daemon.rules import BatchPolicy
from daemon.store.records import Pending
from daemon.upstream import MAX_BULK

Key = tuple[str, str]  # action, overrides (canonical JSON)


@dataclass
class Group:
    """dlqIds waiting for one batch, with the tightest policy among their rules."""

    action: str
    overrides: str
    dlq_ids: list[str]
    started: float  # monotonic time the first of them was decided
    max_size: int
    max_wait: float

    def due(self, now: float, everything: bool) -> bool:
        full = len(self.dlq_ids) >= self.max_size
        return bool(self.dlq_ids) and (everything or full or now >= self.started + self.max_wait)


@dataclass(frozen=True)
class Formed:
    """A batch the forming let go, for the sender to persist and send."""

    action: str
    overrides: str
    dlq_ids: list[str]


class Forming:
    """The groups waiting for their batches."""

    def __init__(self, policy_of: Callable[[str], BatchPolicy]) -> None:
        """`policy_of(rule name)` is the batch policy of a rule in force."""
        self._policy_of = policy_of
        self._groups: dict[Key, Group] = {}

    def add(self, pending: Sequence[Pending], now: float, wall: float, held: set[str]) -> None:
        """Group decided dlqIds not in `held`, adding them to it; `now` is monotonic and
        `wall` the wall clock's time, which the decisions' times are in."""
        for item in pending:
            if item.dlq_id in held:
                continue
            policy = self._policy_of(item.rule)
            key = (item.action, item.overrides)
            group = self._groups.get(key)
            if group is None:
                started = now - max(0.0, wall - item.decided_at)  # maxWait survives a restart
                group = Group(item.action, item.overrides, [], started, MAX_BULK, policy.max_wait)
                self._groups[key] = group
            group.max_size = min(group.max_size, policy.max_size)
            group.max_wait = min(group.max_wait, policy.max_wait)
            group.dlq_ids.append(item.dlq_id)
            held.add(item.dlq_id)

    def due(self, now: float, everything: bool) -> Iterator[Formed]:
        """The batches due at `now` (every dlqId waiting, when `everything`), each at most
        its group's `maxSize`; a group's next batch waits its `maxWait` from `now`."""
        for key, group in list(self._groups.items()):
            while group.due(now, everything):
                dlq_ids = group.dlq_ids[: group.max_size]
                del group.dlq_ids[: group.max_size]
                group.started = now
                yield Formed(group.action, group.overrides, dlq_ids)
            if not group.dlq_ids:
                del self._groups[key]

    def deadlines(self) -> list[float]:
        """When each group waiting is due at the latest (monotonic)."""
        return [group.started + group.max_wait for group in self._groups.values()]
