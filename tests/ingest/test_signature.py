"""The callback signature: which tokens the verifier takes and which it refuses, and why."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import jwt
import pytest

from daemon.emulator.signing import SIGNATURE_LIFETIME, sign
from daemon.ingest.signature import SignatureError, Verifier
from tests.support import SIGNING_KEY_CURRENT, SIGNING_KEY_NEXT

ISSUER = "Service"
URL = "https://recoveryd.example.com/callbacks"
BODY = b'{"dlqId":"1763712000123-0","status":503}'
NOW = 1_763_712_000.0
LEEWAY = 5.0

VERIFIER = Verifier(
    keys=(SIGNING_KEY_CURRENT.encode(), SIGNING_KEY_NEXT.encode()), issuer=ISSUER, subject=URL
)


def signed(*, key: str = SIGNING_KEY_CURRENT, issuer: str = ISSUER, url: str = URL) -> str:
    """A token from the emulator's real signer, issued at NOW."""
    return sign(BODY, url=url, key=key, issuer=issuer, now=NOW)


def claims(**changes: Any) -> dict[str, Any]:
    """The claims `sign` would make at NOW, with `changes` (None deletes a claim)."""
    digest = base64.urlsafe_b64encode(hashlib.sha256(BODY).digest()).decode()
    base = {
        "iss": ISSUER,
        "sub": URL,
        "iat": int(NOW),
        "nbf": int(NOW),
        "exp": int(NOW) + SIGNATURE_LIFETIME,
        "jti": "jwt_0123",
        "body": digest,
    }
    base.update(changes)
    return {name: value for name, value in base.items() if value is not None}


def encoded(value: dict[str, Any] | bytes) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def crafted(header: dict[str, Any], payload: dict[str, Any], digestmod: str | None) -> str:
    """A token built by hand, MACed with the current key (`digestmod` None: no signature)."""
    signing_input = f"{encoded(header)}.{encoded(payload)}"
    mac = b""
    if digestmod is not None:
        mac = hmac.new(SIGNING_KEY_CURRENT.encode(), signing_input.encode(), digestmod).digest()
    return f"{signing_input}.{encoded(mac)}"


def test_token_signed_with_the_current_key_is_accepted() -> None:
    """A token from the service's signer, with the current key, gives back its claims."""
    verified = VERIFIER.verify(signed(), BODY, NOW)
    assert (verified["iss"], verified["sub"], verified["exp"]) == (ISSUER, URL, NOW + 300)


def test_token_signed_with_the_next_key_is_accepted() -> None:
    """During a key rotation the service signs with the next key, which is tried second."""
    assert VERIFIER.verify(signed(key=SIGNING_KEY_NEXT), BODY, NOW)["sub"] == URL


def test_token_signed_with_another_key_is_refused() -> None:
    """A key that is neither the current nor the next one does not verify."""
    with pytest.raises(SignatureError, match="does not match any signing key"):
        VERIFIER.verify(signed(key="someone_elses_key_0123456789abcdefgh"), BODY, NOW)


def test_body_changed_after_signing_is_refused() -> None:
    """The signed hash covers the body: one changed byte and the callback is refused."""
    with pytest.raises(SignatureError, match="body does not match"):
        VERIFIER.verify(signed(), BODY.replace(b"503", b"504"), NOW)


@pytest.mark.parametrize(
    ("after_expiry", "accepted"),
    [(0.0, True), (LEEWAY - 0.1, True), (LEEWAY, False), (60.0, False)],
)
def test_expiry_is_enforced_beyond_the_leeway(after_expiry: float, accepted: bool) -> None:
    """A token still verifies up to `leeway` seconds after `exp`, and not from then on."""
    now = NOW + SIGNATURE_LIFETIME + after_expiry
    if accepted:
        VERIFIER.verify(signed(), BODY, now)
    else:
        with pytest.raises(SignatureError, match="expired"):
            VERIFIER.verify(signed(), BODY, now)


@pytest.mark.parametrize("claim", ["iat", "nbf"])
@pytest.mark.parametrize(("ahead", "accepted"), [(LEEWAY, True), (LEEWAY + 1, False)])
def test_token_from_the_future_is_refused_beyond_the_leeway(
    claim: str, ahead: float, accepted: bool
) -> None:
    """An `iat` or `nbf` ahead of our clock is skew up to `leeway`, not yet valid after it."""
    token = jwt.encode(claims(**{claim: int(NOW + ahead)}), SIGNING_KEY_CURRENT)
    if accepted:
        VERIFIER.verify(token, BODY, NOW)
    else:
        with pytest.raises(SignatureError, match=rf"not yet valid \({claim}\)"):
            VERIFIER.verify(token, BODY, NOW)


def test_token_from_another_issuer_is_refused() -> None:
    """A token issued under another header prefix (Upstash instead of Service) is refused."""
    with pytest.raises(SignatureError, match="issuer is not Service"):
        VERIFIER.verify(signed(issuer="Upstash"), BODY, NOW)


def test_token_for_another_url_is_refused_when_the_subject_is_set() -> None:
    """With RECOVERYD_PUBLIC_URL set, a token issued for another URL is refused."""
    with pytest.raises(SignatureError, match="another URL"):
        VERIFIER.verify(signed(url="https://elsewhere.example.com/hook"), BODY, NOW)


def test_any_subject_is_accepted_when_none_is_set() -> None:
    """Without RECOVERYD_PUBLIC_URL the `sub` claim is not checked against anything."""
    verifier = Verifier(keys=VERIFIER.keys, issuer=ISSUER)
    token = signed(url="https://elsewhere.example.com/hook")
    assert verifier.verify(token, BODY, NOW)["sub"] == "https://elsewhere.example.com/hook"


@pytest.mark.parametrize("claim", ["exp", "iat", "nbf", "iss", "sub", "body"])
def test_token_without_a_required_claim_is_refused(claim: str) -> None:
    """Each required claim missing is refused, and the reason names it."""
    token = jwt.encode(claims(**{claim: None}), SIGNING_KEY_CURRENT)
    with pytest.raises(SignatureError, match=f"no '{claim}' claim"):
        VERIFIER.verify(token, BODY, NOW)


@pytest.mark.parametrize("strip", [False, True], ids=["padded", "unpadded"])
def test_body_hash_is_accepted_with_or_without_padding(strip: bool) -> None:
    """The Go signer pads the hash with '=' and the SDKs do not: both forms verify."""
    digest = claims()["body"]
    assert digest.endswith("=")
    body_claim = digest.rstrip("=") if strip else digest
    token = jwt.encode(claims(body=body_claim), SIGNING_KEY_CURRENT)
    assert VERIFIER.verify(token, BODY, NOW)["body"] == body_claim


@pytest.mark.parametrize(
    ("alg", "digestmod"), [("none", None), ("RS256", "sha256"), ("HS512", "sha512")]
)
def test_token_with_another_algorithm_is_refused(alg: str, digestmod: str | None) -> None:
    """Only HS256 is accepted: `none`, an asymmetric alg and another HMAC are refused."""
    token = crafted({"alg": alg, "typ": "JWT"}, claims(), digestmod)
    with pytest.raises(SignatureError, match="not signed with HS256"):
        VERIFIER.verify(token, BODY, NOW)


@pytest.mark.parametrize("shape", ["", "abc", "abc.def", "{token}.abc"])
def test_token_that_is_not_three_segments_is_refused(shape: str) -> None:
    """Fewer or more than three dot-separated segments is not a JWT."""
    with pytest.raises(SignatureError, match=r"not a(?: well-formed)? JWT"):
        VERIFIER.verify(shape.format(token=signed()), BODY, NOW)


def test_non_ascii_token_is_refused() -> None:
    """A token with a non-ASCII character is refused as malformed, not with a crash."""
    token = signed()
    with pytest.raises(SignatureError, match="not a JWT"):
        VERIFIER.verify(token[:10] + "é" + token[10:], BODY, NOW)


def test_non_canonical_base64_signature_is_refused() -> None:
    """A signature segment whose unused low bits are set decodes to the same MAC but is
    not canonical base64url, and is refused as PyJWT refuses it."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    token = signed()
    tweaked = token[:-1] + alphabet[alphabet.index(token[-1]) ^ 1]
    assert base64.urlsafe_b64decode(tweaked.rsplit(".", 1)[1] + "=") == base64.urlsafe_b64decode(
        token.rsplit(".", 1)[1] + "="
    )
    with pytest.raises(SignatureError, match=r"not a well-formed JWT|does not match any"):
        VERIFIER.verify(tweaked, BODY, NOW)
