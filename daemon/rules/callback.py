"""A failure callback read as the DLQ message it reports (spec 2.1 and the samples).

The service's failure callback carries nearly every field of the DLQ message under other
names: its own `status`, `header` and `body` are the failed delivery's response, the
message's are `sourceHeader` and `sourceBody`, and both bodies are base64. `message_of`
maps it back, so that rules test the same facts either way; `CARRIED` names the fields a
callback can carry. A rule that reads only those can be decided from the callback
(RECOVERYD_FETCH=needed); one that reads another field (`callback`, `failureCallback`,
`queueName`...) needs the DLQ message itself.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

from daemon.rules.fields import FIELDS

# Callback field -> DLQ message field, for those carried as they are.
_SAME = (
    "topicName", "endpointName", "url", "method", "maxRetries", "notBefore", "createdAt",
    "scheduleId", "callerIP", "dlqId", "workflowRunId", "queueName", "label", "labels",
    "flowControlKey",
)  # fmt: skip
_RENAMED = {"sourceMessageId": "messageId", "status": "responseStatus"}
_HEADERS = {"sourceHeader": "header", "header": "responseHeader"}
_BODIES = {"sourceBody": ("body", "bodyBase64"), "body": ("responseBody", "responseBodyBase64")}
_NUMBERS = ("maxRetries", "notBefore", "createdAt", "responseStatus")

# The fields a rule may test that a callback can carry; `workflow` and `labels` are
# derived from the headers, as for a DLQ message (fields.facts).
CARRIED: frozenset[str] = frozenset(
    {*_SAME, *_RENAMED.values(), *_HEADERS.values(), "workflow"}
    | {field for pair in _BODIES.values() for field in pair}
) & frozenset(FIELDS)


def told(callback: Mapping[str, Any]) -> frozenset[str]:
    """The DLQ message fields whose value `callback` tells, an empty one included: those
    it has a key for, and those derived from the headers it carries. A field it has no
    key for may still be set on the message, so a rule that reads one needs the GET."""
    fields = {name for name in _SAME if callback.get(name) is not None}
    fields |= {renamed for name, renamed in (_RENAMED | _HEADERS).items()
               if callback.get(name) is not None}  # fmt: skip
    for name, pair in _BODIES.items():
        if callback.get(name) is not None:
            fields.update(pair)  # one of the two is set, on the message as here
    if "header" in fields:  # as fields.facts derives them when the message lacks its own
        fields |= {"workflowRunId", "flowControlKey", "labels"}
    if "workflowRunId" in fields:
        fields.add("workflow")
    return frozenset(fields) & CARRIED


def message_of(callback: Mapping[str, Any]) -> dict[str, Any]:
    """The DLQ message fields `callback` carries, named and shaped as the message has
    them: bodies decoded to text when they are UTF-8 (else kept base64, as
    `bodyBase64`), numbers sent as digit strings (the documentation's form) read as
    numbers."""
    message: dict[str, Any] = {name: callback[name] for name in _SAME if name in callback}
    for name, renamed in _RENAMED.items():
        if name in callback:
            message[renamed] = callback[name]
    for name, renamed in _HEADERS.items():
        if name in callback:
            message[renamed] = callback[name]
    for name, (text, encoded) in _BODIES.items():
        value = callback.get(name)
        if isinstance(value, str) and value:
            decoded = _text(value)
            if decoded is None:
                message[encoded] = value
            else:
                message[text] = decoded
    for name in _NUMBERS:
        value = message.get(name)
        if isinstance(value, str) and value.isdigit():
            message[name] = int(value)
    return message


def _text(encoded: str) -> str | None:
    """The base64 body as text; None when it is not base64 of UTF-8."""
    try:
        return base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
