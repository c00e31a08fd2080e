"""The hand-written verifier against PyJWT: the same tokens must be accepted and refused.

The reference is PyJWT's `decode` with the current key, then the next one, plus the
`body` check PyJWT does not make. PyJWT reads the wall clock, so the verifier gets
`time.time()` too, and every time claim stays minutes away from any boundary.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable
from typing import Any

import jwt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.emulator.signing import sign
from daemon.ingest.signature import SignatureError, Verifier
from tests.support import SIGNING_KEY_CURRENT, SIGNING_KEY_NEXT

ISSUER = "Service"
SUBJECT = "https://recoveryd.example.com/callbacks"
LEEWAY = 5.0
KEYS = (SIGNING_KEY_CURRENT.encode(), SIGNING_KEY_NEXT.encode())
BODY = b'{"dlqId":"1763712000123-0","status":503}'
DIGEST = base64.urlsafe_b64encode(hashlib.sha256(BODY).digest()).rstrip(b"=").decode()
HS256 = {"alg": "HS256", "typ": "JWT"}
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def pyjwt_accepts(token: str, body: bytes) -> bool:
    """The reference: PyJWT accepts with either key, and `body` is the body's hash."""
    for key in KEYS:
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=["HS256"],
                issuer=ISSUER,
                subject=SUBJECT,
                leeway=LEEWAY,
                options={"require": ["exp", "iat", "nbf", "iss", "sub"]},
            )
        except jwt.InvalidTokenError:
            continue
        claimed = claims.get("body")
        return isinstance(claimed, str) and claimed.rstrip("=") == DIGEST
    return False


def verifier_accepts(token: str, body: bytes) -> bool:
    verifier = Verifier(keys=KEYS, issuer=ISSUER, subject=SUBJECT, leeway=LEEWAY)
    try:
        verifier.verify(token, body, now=time.time())
    except SignatureError:
        return False
    return True


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def segment(value: Any) -> str:
    """A JSON value as a segment; bytes are taken as the segment's raw content."""
    return b64(value if isinstance(value, bytes) else json.dumps(value).encode())


def mac(signing_input: str, key: bytes = KEYS[0], digestmod: str = "sha256") -> str:
    return b64(hmac.new(key, signing_input.encode(), digestmod).digest())


def token(
    header: Any = HS256, payload: Any = None, key: bytes = KEYS[0], digestmod: str = "sha256"
) -> str:
    """A token with a correct MAC over whatever header and payload it is given."""
    signing_input = f"{segment(header)}.{segment(claims() if payload is None else payload)}"
    return f"{signing_input}.{mac(signing_input, key, digestmod)}"


def claims(**changes: Any) -> dict[str, Any]:
    """Valid claims at the wall clock now, with `changes`."""
    now = int(time.time())
    base = {
        "iss": ISSUER,
        "sub": SUBJECT,
        "iat": now - 60,
        "nbf": now - 60,
        "exp": now + 240,
        "jti": "jwt_0123",
        "body": DIGEST + "=",
    }
    return base | changes


def minutes(n: int) -> int:
    return int(time.time()) + 60 * n


def resigned(tampered: str) -> str:
    """`tampered` header.payload with a fresh, correct MAC."""
    return f"{tampered}.{mac(tampered)}"


def replace_segment(original: str, index: int, new: str) -> str:
    parts = original.split(".")
    parts[index] = new
    return ".".join(parts)


def emulator_token() -> str:
    return sign(BODY, url=SUBJECT, key=SIGNING_KEY_CURRENT, issuer=ISSUER, now=time.time() - 60)


CASES: dict[str, Callable[[], str]] = {
    # valid
    "emulator signer, current key": emulator_token,
    "emulator signer, next key": lambda: sign(
        BODY, url=SUBJECT, key=SIGNING_KEY_NEXT, issuer=ISSUER, now=time.time() - 60
    ),
    "hand-built, current key": token,
    "hand-built, next key": lambda: token(key=KEYS[1]),
    "body hash unpadded": lambda: token(payload=claims(body=DIGEST)),
    "header segment padded, MAC over it": lambda: resigned(
        f"{segment({**HS256, 'x': 'y'})}==.{segment(claims())}"
    ),
    "no jti": lambda: token(payload={k: v for k, v in claims().items() if k != "jti"}),
    "empty aud": lambda: token(payload=claims(aud="")),
    "signature segment padded": lambda: token() + "=",
    # tampered
    "payload changed": lambda: replace_segment(
        emulator_token(), 1, segment(claims(sub=SUBJECT + "x"))
    ),
    "signature changed": lambda: replace_segment(token(), 2, mac("something else")),
    "header changed": lambda: replace_segment(token(), 0, segment({**HS256, "kid": "k2"})),
    "body hash of another body": lambda: token(payload=claims(body=b64(b"other"))),
    "body claim missing": lambda: token(payload={k: v for k, v in claims().items() if k != "body"}),
    "body claim a number": lambda: token(payload=claims(body=42)),
    "body claim a lone surrogate": lambda: token(payload=claims(body="\ud800")),
    "signed with another key": lambda: token(key=b"k" * 40),
    # times
    "expired": lambda: token(payload=claims(iat=minutes(-10), nbf=minutes(-10), exp=minutes(-5))),
    "not yet valid (nbf)": lambda: token(payload=claims(nbf=minutes(5))),
    "not yet valid (iat)": lambda: token(payload=claims(iat=minutes(5))),
    # names
    "wrong issuer": lambda: token(payload=claims(iss="Upstash")),
    "wrong subject": lambda: token(payload=claims(sub="https://elsewhere.example.com/")),
    "has an audience": lambda: token(payload=claims(aud="recoveryd")),
    # algorithms
    "alg none, empty signature": lambda: f"{segment({'alg': 'none'})}.{segment(claims())}.",
    "alg RS256, HMAC signature": lambda: token(header={"alg": "RS256", "typ": "JWT"}),
    "alg HS384": lambda: token(header={"alg": "HS384", "typ": "JWT"}, digestmod="sha384"),
    "no alg": lambda: token(header={"typ": "JWT"}),
    # malformed
    "two segments": lambda: token().rsplit(".", 1)[0],
    "four segments": lambda: token() + ".AAAA",
    "bad base64 character": lambda: replace_segment(token(), 2, "+" + token().split(".")[2][1:]),
    "padding inside a segment": lambda: replace_segment(token(), 1, "ab=cd" + segment(claims())),
    "padding on an unaligned segment": lambda: token() + "==",
    "three padding characters": lambda: resigned(f"{segment(HS256)}===.{segment(claims())}"),
    "header not JSON": lambda: token(header=b"{alg: HS256}"),
    "header a JSON list": lambda: token(header=["HS256"]),
    "payload not JSON": lambda: token(payload=b"iss=Service"),
    "payload a JSON string": lambda: token(payload="claims"),
    # claim types
    "exp a string in the past": lambda: token(payload=claims(exp="123")),
    "exp a string in the future": lambda: token(payload=claims(exp=str(minutes(5)))),
    "exp a float": lambda: token(payload=claims(exp=minutes(5) + 0.5)),
    "exp not a number": lambda: token(payload=claims(exp="soon")),
    "iat a bool": lambda: token(payload=claims(iat=True)),
    "iss an int": lambda: token(payload=claims(iss=1)),
    "sub a list": lambda: token(payload=claims(sub=[SUBJECT])),
    "jti an int": lambda: token(payload=claims(jti=7)),
    # headers
    "kid an int": lambda: token(header={**HS256, "kid": 1}),
    "kid a string": lambda: token(header={**HS256, "kid": "current"}),
    "crit b64 with b64 true": lambda: token(header={**HS256, "crit": ["b64"], "b64": True}),
    "crit b64 without b64": lambda: token(header={**HS256, "crit": ["b64"]}),
    "crit exp": lambda: token(header={**HS256, "crit": ["exp"], "exp": 1}),
    "crit empty": lambda: token(header={**HS256, "crit": []}),
    "b64 false": lambda: token(header={**HS256, "crit": ["b64"], "b64": False}),
}


@pytest.mark.parametrize("make", CASES.values(), ids=CASES.keys())
def test_verifier_agrees_with_pyjwt(make: Callable[[], str]) -> None:
    """Each crafted token is accepted by both or refused by both."""
    candidate = make()
    assert verifier_accepts(candidate, BODY) == pyjwt_accepts(candidate, BODY)


# The cases both must accept; every other case in the table is one both must refuse.
ACCEPTED = {
    "emulator signer, current key",
    "emulator signer, next key",
    "hand-built, current key",
    "hand-built, next key",
    "body hash unpadded",
    "header segment padded, MAC over it",
    "no jti",
    "empty aud",
    "signature segment padded",
    "exp a string in the future",
    "exp a float",
    "iat a bool",
    "kid a string",
    "crit b64 with b64 true",
}


@pytest.mark.parametrize("name", CASES)
def test_reference_gives_the_expected_verdict(name: str) -> None:
    """The table means what it says: PyJWT accepts exactly the cases listed as accepted."""
    assert pyjwt_accepts(CASES[name](), BODY) == (name in ACCEPTED)


def mutated(original: str, kind: str, position: int, char: str) -> str:
    at = position % len(original)
    if kind == "flip":
        return original[:at] + char + original[at + 1 :]
    if kind == "insert":
        return original[:at] + char + original[at:]
    if kind == "delete":
        return original[:at] + original[at + 1 :]
    parts = original.split(".")
    i, j = [(0, 1), (0, 2), (1, 2)][position % 3]
    parts[i], parts[j] = parts[j], parts[i]
    return ".".join(parts)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(["flip", "insert", "delete", "swap"]),
    position=st.integers(min_value=0, max_value=10_000),
    char=st.sampled_from(ALPHABET + "=.+/ !é\n"),
    resign=st.booleans(),
)
def test_mutated_tokens_get_the_same_verdict(
    kind: str, position: int, char: str, resign: bool
) -> None:
    """One character flipped, inserted or deleted, or two segments swapped: same verdict,
    also when the mutant is MACed again, so that parsing is reached past the signature."""
    candidate = mutated(emulator_token(), kind, position, char)
    if resign:
        candidate = resigned(candidate.rsplit(".", 1)[0])
    assert verifier_accepts(candidate, BODY) == pyjwt_accepts(candidate, BODY)
