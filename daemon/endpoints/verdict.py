"""What to do with an endpoint whose failures reached the threshold, given its group as just
read: remove it, or not and why. Pure, so that every case reads and tests alone."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from daemon.store.removals import Removal, shown
from daemon.upstream import EndpointRef, URLGroup


@dataclass(frozen=True)
class Verdict:
    """`remove` the endpoint (by `ref`), or leave it: `gone` (not in the group any more)
    or `kept_last` (the group's last endpoint). `reason` says it for the records."""

    result: Literal["remove", "gone", "kept_last"]
    reason: str
    ref: EndpointRef | None = None  # what the DELETE names: the name, else the url
    name: str | None = None  # the endpoint as read from the group
    url: str | None = None
    empties_group: bool = False


def judge(group: URLGroup, removal: Removal) -> Verdict:
    """The verdict on `removal`'s endpoint in `group`. The endpoint is found by the name
    its messages gave, else by their url; it is removed by name when it has one in the
    group (its url may be shared with another), by url otherwise."""
    where = f"URL Group {group.name}"
    if not group.endpoints:  # the service deletes a group with its last endpoint
        return Verdict("gone", f"{where} does not exist any more: nothing to remove")
    found = find(group.endpoints, removal)
    if found is None:
        return Verdict("gone", f"endpoint {removal.shown} is not in {where} any more: "
                       "nothing to remove")  # fmt: skip
    ref = EndpointRef(name=found.name) if found.name else EndpointRef(url=found.url)
    left = [endpoint for endpoint in group.endpoints if not _named_by(ref, endpoint)]
    what = f"endpoint {shown(found.name, found.url)}"
    if not left and removal.keep_last:
        return Verdict(
            "kept_last",
            f"kept {what}: it is the last endpoint of {where}, and removing it would delete "
            "the group (keepLastEndpoint)",
            name=found.name,
            url=found.url,
        )
    reason = f"removed {what} from {where}"
    if not left:
        reason += (
            ": it was the last one, so the service deleted the group (keepLastEndpoint is off)"
        )
    return Verdict("remove", reason, ref, found.name, found.url, empties_group=not left)


def find(endpoints: Sequence[EndpointRef], removal: Removal) -> EndpointRef | None:
    """The group's endpoint that `removal` is about, if it is still there."""
    if removal.name:
        return next((e for e in endpoints if e.name == removal.name), None)
    return next((e for e in endpoints if e.url == removal.url), None)


def _named_by(ref: EndpointRef, endpoint: EndpointRef) -> bool:
    """Whether a DELETE naming `ref` takes `endpoint` out (the service matches a name to
    names and a url to urls)."""
    if ref.name is not None:
        return endpoint.name == ref.name
    return endpoint.url == ref.url
