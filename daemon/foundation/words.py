"""How messages name things: the known word a typo was meant as, lists, and counts with
their noun (`1 rule`, `2 rules`, never `1 rules` or `rule(s)`)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


def nearest(word: object, known: Iterable[str]) -> str | None:
    """The known word `word` is most likely a typo of, None when none is close. Case is
    ignored in the comparison (`RESTART` means `restart`) but kept in the answer."""
    by_folded = {name.casefold(): name for name in known}
    found = difflib.get_close_matches(str(word).casefold(), list(by_folded), n=1)
    return by_folded[found[0]] if found else None


def did_you_mean(word: object, known: Iterable[str]) -> str:
    """`did you mean 'restart'?` for the nearest known word; "" when none is close."""
    guess = nearest(word, known)
    return f"did you mean {guess!r}?" if guess is not None else ""


def with_guess(message: str, word: object, known: Iterable[str]) -> str:
    """`message`, then `; did you mean 'restart'?` when `word` is a string near a known
    word (a number or a list is no typo of one)."""
    hint = did_you_mean(word, known) if isinstance(word, str) else ""
    return f"{message}; {hint}" if hint else message


def unknown_key(key: object, known_keys: Iterable[str], otherwise: str = "") -> str:
    """`unknown key 'x'; did you mean 'y'?`, or `otherwise` after the `;` when no key is
    near: the one wording of a key that is not taken, wherever keys are checked."""
    hint = did_you_mean(key, known_keys) or otherwise
    return f"unknown key {key!r}" + (f"; {hint}" if hint else "")


def either(words: Sequence[str]) -> str:
    """`a, b or c`."""
    return ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`noun` for one thing, else `nouns` (the noun and an s, unless said)."""
    return noun if count == 1 else nouns or f"{noun}s"


def counted(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 rule`, `0 rules`, `2 summaries` (with `nouns`)."""
    return f"{count} {plural(count, noun, nouns)}"
