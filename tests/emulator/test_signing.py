"""The JWT on everything the service sends."""

from __future__ import annotations

import base64
import hashlib

import jwt

from daemon.emulator.signing import body_hash, sign
from tests.emulator.support import SIGNING_KEY_CURRENT


def test_signature_verifies_with_the_required_claims() -> None:
    """HS256 with iss, sub, iat, nbf, exp, jti and the body hash."""
    token = sign(b"{}", url="https://r.example.com/cb", key=SIGNING_KEY_CURRENT, issuer="Service",
                 now=1_700_000_000)  # fmt: skip
    claims = jwt.decode(
        token,
        SIGNING_KEY_CURRENT,
        algorithms=["HS256"],
        issuer="Service",
        options={"verify_exp": False, "verify_nbf": False, "verify_iat": False},
    )
    assert claims["sub"] == "https://r.example.com/cb"
    assert claims["exp"] - claims["nbf"] == 300
    assert claims["iat"] == claims["nbf"] == 1_700_000_000
    assert claims["body"] == body_hash(b"{}")


def test_body_hash_is_padded_url_safe_sha256() -> None:
    """The body claim keeps base64's `=` padding, as the service's Go signer writes it."""
    digest = hashlib.sha256(b"payload").digest()
    assert body_hash(b"payload") == base64.urlsafe_b64encode(digest).decode()
    assert body_hash(b"payload").endswith("=")


def test_every_signature_has_its_own_id() -> None:
    """jti differs between two signatures of the same body."""
    first, second = (
        jwt.decode(
            sign(b"", url="https://x", key=SIGNING_KEY_CURRENT, issuer="Upstash", now=0),
            options={"verify_signature": False},
        )
        for _ in range(2)
    )
    assert first["jti"] != second["jti"]


def test_short_keys_sign_without_a_warning() -> None:
    """An operator's short key is theirs to choose; signing must not raise under -W error."""
    assert sign(b"", url="https://x", key="short", issuer="Service", now=0).count(".") == 2
