"""The JWT the service puts in `<Prefix>-Signature` on every request it sends out."""

from __future__ import annotations

import base64
import hashlib
import secrets
import warnings

import jwt

# QStash signs for five minutes.
SIGNATURE_LIFETIME = 300


def body_hash(body: bytes) -> str:
    """URL-safe base64 of the SHA-256 of `body`, WITH `=` padding.

    QStash's Go signer pads (base64.URLEncoding); its SDK verifiers strip the padding on both
    sides before comparing, and recoveryd accepts either form.
    """
    return base64.urlsafe_b64encode(hashlib.sha256(body).digest()).decode("ascii")


def sign(body: bytes, *, url: str, key: str, issuer: str, now: float) -> str:
    """The compact JWT (HS256) for a request carrying `body` to `url`, valid from `now`."""
    issued = int(now)
    claims = {
        "iss": issuer,
        "sub": url,
        "iat": issued,
        "nbf": issued,
        "exp": issued + SIGNATURE_LIFETIME,
        "jti": "jwt_" + secrets.token_hex(16),
        "body": body_hash(body),
    }
    # The key is whatever the operator configured; PyJWT's warning about short HMAC keys
    # would be an error under `-W error` and is not the emulator's to raise.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", jwt.InsecureKeyLengthWarning)
        return jwt.encode(claims, key, algorithm="HS256")
