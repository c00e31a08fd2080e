"""POST /callbacks over a real socket: every status of PRODUCT.md §2, and what is stored."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import jwt
import pytest

from tests.support import (
    PUBLIC_URL,
    SIGNING_KEY_CURRENT,
    SIGNING_KEY_NEXT,
    Recoveryd,
    callback_json,
    running_recoveryd,
    signed,
    write_locked,
)


def _token(body_claim: str, **claims: object) -> str:
    now = int(time.time())
    payload = {"iss": "Service", "sub": PUBLIC_URL, "iat": now, "nbf": now, "exp": now + 300}
    payload.update(body=body_claim, **claims)
    return jwt.encode(payload, SIGNING_KEY_CURRENT, algorithm="HS256")


def _digest(body: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(body).digest()).decode()


async def test_a_signed_callback_is_stored_before_the_answer(recoveryd: Recoveryd) -> None:
    """200 accepted, and the exact signed bytes are in the store when the answer arrives."""
    body = callback_json("d-1")
    response = await recoveryd.post(body)
    assert response.status_code == 200
    assert response.json() == {"status": "accepted", "dlqId": "d-1"}
    stored = await recoveryd.daemon.store.get_callback("d-1")
    assert stored is not None
    assert stored.body == body


async def test_a_repeated_dlq_id_is_a_duplicate_and_stores_nothing_new(
    recoveryd: Recoveryd,
) -> None:
    """The second callback for a dlqId answers duplicate and leaves the first one stored."""
    first, second = callback_json("d-1"), callback_json("d-1", status=500)
    await recoveryd.post(first)
    response = await recoveryd.post(second)
    assert response.status_code == 200
    assert response.json() == {"status": "duplicate", "dlqId": "d-1"}
    stored = await recoveryd.daemon.store.get_callback("d-1")
    assert stored is not None
    assert stored.body == first
    assert await recoveryd.daemon.store.inbox_depth() == 1


async def test_a_callback_signed_with_the_next_key_is_accepted(recoveryd: Recoveryd) -> None:
    """During a key rotation the service may already sign with the next key."""
    body = callback_json("d-next")
    response = await recoveryd.post(body, signed(body, key=SIGNING_KEY_NEXT))
    assert response.json()["status"] == "accepted"


@pytest.mark.parametrize("body_claim", ["padded", "unpadded"])
async def test_the_body_hash_is_accepted_with_or_without_padding(
    recoveryd: Recoveryd, body_claim: str
) -> None:
    """The service pads the hash; QStash's SDKs strip the padding: both forms verify."""
    body = callback_json("d-hash")
    digest = _digest(body) if body_claim == "padded" else _digest(body).rstrip("=")
    headers = {"Content-Type": "application/json", "Service-Signature": _token(digest)}
    response = await recoveryd.post(body, headers)
    assert response.status_code == 200


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("body changed after signing", "body does not match"),
        ("expired", "expired"),
        ("signed for another URL", "another URL"),
        ("signed with an unknown key", "does not match any signing key"),
        ("not a JWT", "not a JWT"),
        ("missing", "missing Service-Signature"),
    ],
)
async def test_a_bad_signature_is_refused_and_nothing_is_stored(
    recoveryd: Recoveryd, case: str, reason: str
) -> None:
    """401 with the reason, for each way a signature can fail; the store stays empty."""
    body = callback_json("d-bad")
    headers = {
        "body changed after signing": signed(callback_json("d-other")),
        "expired": signed(body, now=time.time() - 3600),
        "signed for another URL": signed(body, url="https://attacker.example/callbacks"),
        "signed with an unknown key": signed(body, key="k" * 40),
        "not a JWT": {"Content-Type": "application/json", "Service-Signature": "abc"},
        "missing": {"Content-Type": "application/json"},
    }[case]
    response = await recoveryd.post(body, headers)
    assert response.status_code == 401
    assert reason in response.json()["error"]
    assert await recoveryd.daemon.store.inbox_depth() == 0
    assert recoveryd.metric("recoveryd_callbacks_total", result="unauthorized") == 1


async def test_a_body_over_the_limit_is_refused_by_its_length(tmp_path: Path) -> None:
    """413 when Content-Length is over RECOVERYD_MAX_BODY_BYTES, before reading the body."""
    async with running_recoveryd(tmp_path, MAX_BODY_BYTES="100") as recoveryd:
        body = callback_json("d-big")
        response = await recoveryd.post(body)
        assert response.status_code == 413
        assert "100 bytes" in response.json()["error"]
        assert recoveryd.metric("recoveryd_callbacks_total", result="too_large") == 1


async def test_a_chunked_body_over_the_limit_is_refused_while_reading(tmp_path: Path) -> None:
    """Without a Content-Length, a signed request's body is cut off as soon as it passes
    the limit (an unsigned one is refused before its body is read)."""

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(100):
            yield b" " * 100

    async with running_recoveryd(tmp_path, MAX_BODY_BYTES="1000") as recoveryd:
        response = await recoveryd.public.post(
            "/callbacks", content=chunks(), headers=signed(b" " * 10_000)
        )
        assert response.status_code == 413
        assert response.headers["connection"] == "close"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
async def test_a_body_that_is_not_json_by_its_content_type_is_refused(
    recoveryd: Recoveryd, content_type: str
) -> None:
    """415 for any Content-Type but JSON, or none."""
    body = callback_json("d-type")
    headers = signed(body) | {"Content-Type": content_type}
    response = await recoveryd.post(body, headers)
    assert response.status_code == 415
    assert response.json() == {"error": "Content-Type must be application/json"}


async def test_json_with_a_charset_is_json(recoveryd: Recoveryd) -> None:
    """`application/json; charset=utf-8` is accepted."""
    body = callback_json("d-charset")
    headers = signed(body) | {"Content-Type": "application/json; charset=utf-8"}
    assert (await recoveryd.post(body, headers)).status_code == 200


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"status": 503}', "dlqId"),
        (b'{"dlqId": 17}', "dlqId"),
        (b'{"dlqId": ""}', "dlqId"),
        (b'{"dlqId": "d-1", "createdAt": "yesterday"}', "createdAt"),
        (b'{"dlqId": "d-1", "header": {"Retry-After": [30]}}', "header.Retry-After.0"),
        (b"[]", None),
        (b"{not json", None),
    ],
)
async def test_a_body_that_is_not_a_failure_callback_is_refused_naming_the_field(
    recoveryd: Recoveryd, body: bytes, field: str | None
) -> None:
    """400 with a JSON error that names the field, when one applies."""
    response = await recoveryd.post(body)
    assert response.status_code == 400
    error = response.json()
    assert error.get("field") == field
    assert error["error"]


@pytest.mark.parametrize(
    "sample",
    ["failure-callback.json", "failure-callback-docs-form.json", "failure-callback-workflow.json"],
)
async def test_every_form_the_service_sends_is_accepted(recoveryd: Recoveryd, sample: str) -> None:
    """The samples, including QStash's documented form with timestamps as strings."""
    body = (Path(__file__).parents[1] / "testdata" / "samples" / sample).read_bytes()
    response = await recoveryd.post(body)
    assert response.status_code == 200
    assert response.json()["dlqId"] == json.loads(body)["dlqId"]


async def test_callbacks_is_post_only(recoveryd: Recoveryd) -> None:
    """GET /callbacks is 405 with a JSON error and an Allow header."""
    response = await recoveryd.public.get("/callbacks")
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"
    assert "error" in response.json()


async def test_an_unknown_path_is_a_json_404(recoveryd: Recoveryd) -> None:
    """Every error body is JSON, routing errors included."""
    response = await recoveryd.public.get("/nothing-here")
    assert response.status_code == 404
    assert response.json() == {"error": "Not Found"}


async def test_a_locked_store_answers_503_and_the_retry_is_accepted(tmp_path: Path) -> None:
    """503 while another writer holds the database; the service's retry then gets through."""
    options = {"busy_timeout": 0.05}
    async with running_recoveryd(tmp_path, store_options=options) as recoveryd:
        body = callback_json("d-locked")
        with write_locked(tmp_path / "recoveryd.db"):
            response = await recoveryd.post(body)
            assert response.status_code == 503
            assert "cannot store the callback" in response.json()["error"]
        retried = await recoveryd.post(body)
        assert retried.json() == {"status": "accepted", "dlqId": "d-locked"}
        assert recoveryd.metric("recoveryd_callbacks_total", result="unavailable") == 1


async def test_unsigned_callbacks_are_accepted_only_when_allowed(tmp_path: Path) -> None:
    """RECOVERYD_ALLOW_UNSIGNED=true with no keys takes callbacks with no signature."""
    settings = {"ALLOW_UNSIGNED": "true", "SIGNING_KEY_CURRENT": "", "SIGNING_KEY_NEXT": ""}
    async with running_recoveryd(tmp_path, **settings) as recoveryd:
        body = callback_json("d-unsigned")
        response = await recoveryd.post(body, {"Content-Type": "application/json"})
        assert response.json() == {"status": "accepted", "dlqId": "d-unsigned"}


async def test_with_keys_and_unsigned_allowed_a_bad_signature_is_still_refused(
    tmp_path: Path,
) -> None:
    """Allowing unsigned callbacks does not make a forged signature acceptable."""
    async with running_recoveryd(tmp_path, ALLOW_UNSIGNED="true") as recoveryd:
        unsigned = callback_json("d-unsigned")
        assert (await recoveryd.post(unsigned, {"Content-Type": "application/json"})).is_success
        forged = callback_json("d-forged")
        response = await recoveryd.post(forged, signed(forged, key="k" * 40))
        assert response.status_code == 401


async def test_the_upstash_prefix_names_the_header_and_the_issuer(tmp_path: Path) -> None:
    """With RECOVERYD_HEADER_PREFIX=Upstash the signature is Upstash-Signature, iss Upstash."""
    async with running_recoveryd(tmp_path, HEADER_PREFIX="Upstash") as recoveryd:
        body = callback_json("d-upstash")
        assert (await recoveryd.post(body, signed(body, prefix="Upstash"))).is_success
        wrong = callback_json("d-service")
        response = await recoveryd.post(wrong, signed(wrong))
        assert response.json()["error"] == "missing Upstash-Signature header"
