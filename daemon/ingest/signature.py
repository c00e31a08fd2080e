"""Verify the JWT (HS256) that signs every failure callback (docs/api.md#post-callbacks).

Hand-written rather than PyJWT's `decode` because this runs once per callback on the hot
path: PyJWT spends ~175 µs a token, mostly checking segment characters one by one in
Python; this takes ~20 µs. It follows PyJWT's rules exactly (canonical base64url
segments, `crit` and `kid` header checks, integer time claims with leeway), and
tests/ingest/test_signature_differential.py checks that it agrees with PyJWT.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Claims without which a callback token is refused (`body` is checked on its own below).
REQUIRED_CLAIMS = ("exp", "iat", "nbf", "iss", "sub")
_BASE64URL_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_BASE64URL_VALUE = {char: value for value, char in enumerate(_BASE64URL_ALPHABET)}
_TO_STANDARD_ALPHABET = bytes.maketrans(b"-_", b"+/")
# By the length of the last group: 2 characters carry 1 byte (4 spare bits), 3 carry 2 (2).
_UNUSED_BITS = {2: 0b1111, 3: 0b11}
# The only critical header extension PyJWT understands; anything else is refused.
_SUPPORTED_CRIT = frozenset({"b64"})


class SignatureError(Exception):
    """The callback's signature is missing or does not hold; `str()` says why."""


@dataclass(frozen=True, slots=True)
class Verifier:
    """Checks callback tokens against the signing keys, current first, then next.

    `subject`, when set, is the URL the service calls (RECOVERYD_PUBLIC_URL), which the
    token's `sub` must equal. `leeway` absorbs clock skew between the service and us.
    """

    keys: tuple[bytes, ...]
    issuer: str
    subject: str | None = None
    leeway: float = 5.0

    def verify(self, token: str | bytes, body: bytes, now: float) -> dict[str, Any]:
        """The token's claims if it signs `body` and is valid at `now`; else SignatureError."""
        claims = self.claims(token, now)
        check_body(claims, body)
        return claims

    def claims(self, token: str | bytes, now: float) -> dict[str, Any]:
        """The token's claims if it is well formed, signed by a key, issued by the service
        for us and valid at `now`: everything but the body, so that a request can be
        refused from its headers before its body is read. SignatureError otherwise."""
        raw = token.encode("utf-8") if isinstance(token, str) else token
        if not raw.isascii():
            raise SignatureError("the signature is not a JWT")
        signing_input, _, signature = raw.rpartition(b".")
        header_segment, dot, payload_segment = signing_input.partition(b".")
        if not dot:
            raise SignatureError("the signature is not a JWT")
        _check_header_segment(header_segment)
        payload = _decode_segment(payload_segment)
        self._check_signature(signing_input, signature)
        # Only now, with the signature known good, is the payload worth parsing.
        claims = _json_object(payload, "payload")
        self._check_claims(claims, now)
        return claims

    def _check_signature(self, signing_input: bytes, signature: bytes) -> None:
        # The canonical base64url of the expected MAC is compared with the segment, which
        # is the same as decoding the segment canonically and comparing bytes, only cheaper.
        stripped = signature.rstrip(b"=")
        padding = len(signature) - len(stripped)
        if padding and (padding > 2 or len(signature) % 4):
            raise SignatureError("the signature is not a well-formed JWT")
        for key in self.keys:
            mac = hmac.digest(key, signing_input, "sha256")
            if hmac.compare_digest(base64.urlsafe_b64encode(mac).rstrip(b"="), stripped):
                return
        raise SignatureError("the signature does not match any signing key")

    def _check_claims(self, claims: Mapping[str, Any], now: float) -> None:
        for claim in REQUIRED_CLAIMS:
            if claims.get(claim) is None:
                raise SignatureError(f"the token has no {claim!r} claim")
        self._check_times(claims, now)
        self._check_names(claims)

    def _check_times(self, claims: Mapping[str, Any], now: float) -> None:
        if _integer(claims, "iat") > now + self.leeway:
            raise SignatureError("the token is not yet valid (iat)")
        if _integer(claims, "nbf") > now + self.leeway:
            raise SignatureError("the token is not yet valid (nbf)")
        if _integer(claims, "exp") <= now - self.leeway:
            raise SignatureError("the token has expired")

    def _check_names(self, claims: Mapping[str, Any]) -> None:
        if claims["iss"] != self.issuer:
            raise SignatureError(f"the token's issuer is not {self.issuer}")
        if claims.get("aud"):
            raise SignatureError("the token is for an audience; callbacks carry none")
        subject = claims["sub"]
        if not isinstance(subject, str):
            raise SignatureError("the token's subject is not a string")
        if self.subject is not None and subject != self.subject:
            raise SignatureError("the token was issued for another URL")
        if "jti" in claims and not isinstance(claims["jti"], str):
            raise SignatureError("the token's id (jti) is not a string")


def body_digest(body: bytes) -> str:
    """URL-safe base64 of the SHA-256 of `body`, without `=` padding."""
    return base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode("ascii")


def check_body(claims: Mapping[str, Any], body: bytes) -> None:
    """SignatureError unless `body` is the one whose hash the token's claims carry."""
    claimed = claims.get("body")
    if not isinstance(claimed, str):
        raise SignatureError("the token has no 'body' claim")
    if not claimed.isascii():  # a base64 hash is ASCII; anything else cannot match
        raise SignatureError("the body does not match the signed hash")
    # The service pads the hash (Go's base64.URLEncoding); QStash's SDKs strip it.
    if not hmac.compare_digest(claimed.rstrip("=").encode("ascii"), body_digest(body).encode()):
        raise SignatureError("the body does not match the signed hash")


@functools.lru_cache(maxsize=32)
def _check_header_segment(segment: bytes) -> None:
    """The header segment is valid. The service sends the same few headers every time, so
    the answer is remembered (a failure raises and is not)."""
    _check_header(_json_object(_decode_segment(segment), "header"))


def _check_header(header: Mapping[str, Any]) -> None:
    if header.get("alg") != "HS256":
        raise SignatureError("the token is not signed with HS256")
    if "kid" in header and not isinstance(header["kid"], str):
        raise SignatureError("the token's key id (kid) is not a string")
    if "crit" in header:
        crit = header["crit"]
        if not isinstance(crit, list) or not crit:
            raise SignatureError("the token's 'crit' header is not a non-empty list")
        for extension in crit:
            if not isinstance(extension, str) or extension not in _SUPPORTED_CRIT:
                raise SignatureError("the token needs an unsupported critical extension")
            if extension not in header:
                raise SignatureError("the token's critical extension is missing")
    if header.get("b64", True) is False:
        raise SignatureError("the token has a detached payload")


def _decode_segment(segment: bytes) -> bytes:
    """Canonical base64url, optionally padded, as RFC 7515 and PyJWT require."""
    stripped = segment.rstrip(b"=")
    padding = len(segment) - len(stripped)
    tail = len(stripped) % 4
    if (
        (padding and (padding > 2 or len(segment) % 4))
        or tail == 1
        or b"+" in stripped  # the standard alphabet's two characters, valid only after
        or b"/" in stripped  # the translation below
        # Canonical: the bits of the last character that encode nothing are zero.
        or (tail and _BASE64URL_VALUE.get(stripped[-1], 0) & _UNUSED_BITS[tail])
    ):
        raise SignatureError("the signature is not a well-formed JWT")
    try:
        # strict_mode refuses any character outside the alphabet, in C.
        standard = stripped.translate(_TO_STANDARD_ALPHABET) + b"=" * (-len(stripped) % 4)
        return binascii.a2b_base64(standard, strict_mode=True)
    except binascii.Error:
        raise SignatureError("the signature is not a well-formed JWT") from None


def _json_object(data: bytes, part: str) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):
        raise SignatureError(f"the token's {part} is not JSON") from None
    if not isinstance(value, dict):
        raise SignatureError(f"the token's {part} is not a JSON object")
    return value


def _integer(claims: Mapping[str, Any], name: str) -> int:
    try:
        return int(claims[name])
    except (ValueError, TypeError, OverflowError):
        raise SignatureError(f"the token's {name!r} claim is not an integer") from None
