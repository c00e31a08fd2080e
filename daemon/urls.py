"""The one check of a user-given http(s) URL, shared by settings, overrides and rules."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

_USERINFO = re.compile(r"[^/@\s]+@")


def without_credentials(url: str) -> str:
    """`url` safe to show in an error, even when it does not parse: whatever stands before
    an `@` (user and password) is replaced by ***."""
    return _USERINFO.sub("***@", url)


def http_url(value: str) -> str:
    """`value` when it is an absolute http(s) URL with a host; a ValueError otherwise."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = without_credentials(value)
        raise ValueError(f"must be an http(s) URL with a host, e.g. https://host; got {shown!r}")
    return value
