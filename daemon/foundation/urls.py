"""The one check of a user-given http(s) URL, shared by settings, overrides and rules."""

from __future__ import annotations

import re
from urllib.parse import unquote, urlsplit

# From after the scheme (or the start) to the last `@`: a password may hold `/`, `?`, `#`
# and `@` itself, so nothing shorter is sure to cover it. It hides more, never less.
_USERINFO = re.compile(r"^([a-zA-Z][\w+.-]*://)?.*@", re.DOTALL)


def without_credentials(url: str) -> str:
    """`url` safe to show in an error, even when it does not parse: whatever stands before
    its last `@` (user and password) is replaced by ***."""
    return _USERINFO.sub(lambda found: f"{found.group(1) or ''}***@", url)


def credentials_hidden(text: str, url: str) -> str:
    """`text`, a parser's message about `url`, with every part of the URL's user info it
    quotes (all of it, or the password alone, as written or percent-decoded) replaced by
    ***: a parser quotes the token it choked on, which can be the password."""
    found = _USERINFO.match(url)
    if found is None:
        return text
    userinfo = found.group(0)[len(found.group(1) or "") : -1]
    password = userinfo.partition(":")[2]
    parts = {userinfo, unquote(userinfo), password, unquote(password)} - {""}
    for part in sorted(parts, key=len, reverse=True):  # a whole before its pieces
        text = text.replace(part, "***")
    return text


def http_url(value: str) -> str:
    """`value` when it is an absolute http(s) URL with a host; a ValueError otherwise."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        shown = without_credentials(value)
        raise ValueError(f"must be an http(s) URL with a host, e.g. https://host; got {shown!r}")
    return value
