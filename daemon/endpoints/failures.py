"""What a DLQ message decided by a remove-endpoint rule tells about its endpoint: pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from daemon.rules import Rule
from daemon.store.records import EndpointFailure
from daemon.upstream.models import usable_in_path


def endpoint_failure(rule: Rule, facts: Mapping[str, Any]) -> EndpointFailure | str:
    """The failure of the message's endpoint that `rule` counts, or why there is none to
    count: the message was not sent through a URL Group, or does not say to which of its
    endpoints."""
    threshold = rule.spec.threshold
    assert threshold is not None  # the rules file cannot leave it out
    group = _text(facts.get("topicName"))
    if group is None:
        return (
            "remove-endpoint applies to messages sent to a URL Group, and this one has no topicName"
        )
    if not usable_in_path(group):
        return f"remove-endpoint cannot act on URL Group {group!r}: not a usable name"
    name, url = _text(facts.get("endpointName")), _text(facts.get("url"))
    endpoint = name or url
    if endpoint is None:
        return "remove-endpoint needs the endpoint's name or url, and the message has neither"
    status = facts.get("responseStatus")
    known = isinstance(status, int) and not isinstance(status, bool)
    return EndpointFailure(
        url_group=group,
        endpoint=endpoint,
        name=name,
        url=url,
        response_status=status if known else None,
        failures=threshold.failures,
        within=threshold.within,
        keep_last=rule.spec.keep_last_endpoint,
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
