"""What the store keeps about endpoints that keep failing and their removal from URL Groups.

A dlqId decided by a remove-endpoint rule is one failure of its endpoint. When the
failures of one (URL Group, endpoint) reach the rule's threshold within its window, a
removal is recorded, with the failures as its evidence, and then carried out:

    pending  -> removing -> removed                      (the DELETE went through)
             -> gone | kept_last | capped | read_failed  (nothing removed, and why)
    removing -> failed                                   (the service refused the DELETE)

`pending`: the group is still to be read. `removing`: the removal is intended, counted
against the hourly cap, and its DELETE is about to go out or may have gone out; it is
committed before the DELETE, so a crash leaves a record that the next start resolves by
reading the group again. A removed endpoint can be restored from its record.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from daemon.urls import without_credentials

RemovalState = Literal[
    "pending", "removing", "removed", "gone", "kept_last", "capped", "read_failed", "failed"
]
# How a removal ended: the label values of recoveryd_endpoint_removals_total{result}.
RemovalResult = Literal["removed", "gone", "kept_last", "capped", "read_failed", "failed"]
OPEN: tuple[RemovalState, ...] = ("pending", "removing")
# Removals that count against RECOVERYD_MAX_REMOVALS_PER_HOUR: made, or about to be.
COUNTED: tuple[RemovalState, ...] = ("removing", "removed")


@dataclass(frozen=True)
class EndpointFailure:
    """One failed delivery to an endpoint of a URL Group, as its DLQ message tells it, and
    the rule that counts it. `endpoint` is how it is known: its name, else its url."""

    url_group: str
    endpoint: str
    name: str | None
    url: str | None
    response_status: int | None
    failures: int  # the rule's threshold
    within: float  # seconds
    keep_last: bool


@dataclass(frozen=True)
class Evidence:
    """A failure that led to a removal."""

    dlq_id: str
    response_status: int | None
    at: float  # when its failure callback arrived (Unix time)

    def to_json(self) -> dict[str, object]:
        return {"dlqId": self.dlq_id, "responseStatus": self.response_status, "at": self.at}


@dataclass(frozen=True)
class Removal:
    """A threshold reached for one endpoint, and what became of it. `name` and `url` are
    the endpoint's as the message told them, then as read from the group once intended."""

    id: int
    url_group: str
    endpoint: str
    name: str | None
    url: str | None
    rule: str
    keep_last: bool
    state: RemovalState
    reason: str | None
    tries: int  # reads or DELETEs tried and deferred
    dlq_id: str  # the failure that reached the threshold

    @property
    def shown(self) -> str:
        """The endpoint as a person names it: its name, else its url (without the user
        info a url may carry, since this goes to logs and reasons)."""
        return shown(self.name, self.url or self.endpoint)


def shown(name: str | None, url: str | None) -> str:
    """An endpoint as reasons and logs show it: its name, else its url (without the user
    info a url may carry)."""
    return name or without_credentials(url or "?")


class RestoreRefused(Exception):
    """There is nothing to restore: no removal of that endpoint is recorded (`unknown`),
    or the last one has been restored already (`restored`). `str()` says which."""

    def __init__(self, message: str, kind: Literal["unknown", "restored"]) -> None:
        super().__init__(message)
        self.kind = kind
