"""No input makes POST /callbacks answer 500: arbitrary bodies and headers, over a socket."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.support import Recoveryd, signed

# What the contract allows; anything else (a 500 above all) is a bug.
CONTRACT = {200, 400, 401, 413, 415}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
# Callback-shaped objects: each known field absent, well typed or of any type, plus unknown
# fields; so that many examples get past validation into the store.
timestamps = st.integers(min_value=0) | st.integers(min_value=0).map(str)
header_maps = st.dictionaries(st.text(), st.lists(st.text()) | st.text(), max_size=3)
FIELDS = {
    "dlqId": st.text(max_size=30),
    "status": st.integers(100, 599),
    "header": header_maps,
    "sourceHeader": header_maps,
    "body": st.text(),
    "retried": st.integers(0, 10),
    "createdAt": timestamps,
    "notBefore": timestamps,
    "callerIP": st.ip_addresses().map(str),
}
well_typed = st.fixed_dictionaries(
    {"dlqId": FIELDS["dlqId"]}, optional={k: v for k, v in FIELDS.items() if k != "dlqId"}
)
any_typed = st.fixed_dictionaries(
    {}, optional={name: valid | json_values for name, valid in FIELDS.items()}
)
known_fields = well_typed | any_typed
unknown_fields = st.dictionaries(st.text(max_size=8), json_values, max_size=3)
callback_like = st.builds(lambda unknown, known: unknown | known, unknown_fields, known_fields)
# Printable ASCII without surrounding spaces: what HTTP lets a client send as a header value.
header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80
).map(str.strip)
content_types = (
    st.sampled_from(
        ["application/json", "application/json; charset=utf-8", "text/plain", "", "application/"]
    )
    | header_text
)

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _assert_contract(status: int, body: bytes) -> None:
    event(f"answered {status}")  # --hypothesis-show-statistics: how deep the inputs got
    assert status in CONTRACT, (status, body)
    answer: dict[str, Any] = json.loads(body)
    assert "status" in answer if status == 200 else "error" in answer


@FUZZ
@given(body=st.binary(max_size=2000), content_type=content_types, signature=header_text)
async def test_arbitrary_bytes_and_headers_never_make_a_500(
    recoveryd: Recoveryd, body: bytes, content_type: str, signature: str
) -> None:
    """Unsigned garbage: refused with a contract status and a JSON error."""
    headers = {"Content-Type": content_type, "Service-Signature": signature}
    response = await recoveryd.post(body, headers)
    _assert_contract(response.status_code, response.content)


@FUZZ
@given(callback=callback_like)
async def test_arbitrary_signed_json_never_makes_a_500(
    recoveryd: Recoveryd, callback: dict[str, Any]
) -> None:
    """Validly signed JSON of any shape reaches the parser: 200 or a 400 naming a field."""
    body = json.dumps(callback).encode()
    response = await recoveryd.post(body, signed(body))
    _assert_contract(response.status_code, response.content)
    if response.status_code == 400 and "dlqId" not in callback:
        assert response.json()["field"] == "dlqId"


@FUZZ
@given(raw=st.binary(max_size=500))
async def test_signed_arbitrary_bytes_never_make_a_500(recoveryd: Recoveryd, raw: bytes) -> None:
    """Validly signed bytes that need not be JSON, or even UTF-8: a 400, never a 500."""
    response = await recoveryd.post(raw, signed(raw))
    _assert_contract(response.status_code, response.content)
