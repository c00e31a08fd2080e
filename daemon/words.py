"""Counts with their noun, for the lines people read: `1 rule`, `2 rules`, never `1 rules`
or `rule(s)`."""

from __future__ import annotations


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`noun` for one thing, else `nouns` (the noun and an s, unless said)."""
    return noun if count == 1 else nouns or f"{noun}s"


def counted(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 rule`, `0 rules`, `2 summaries` (with `nouns`)."""
    return f"{count} {plural(count, noun, nouns)}"
