"""Counts with their noun, as every line a person reads says them."""

from __future__ import annotations

import pytest

from daemon.foundation.words import counted, plural, with_guess


@pytest.mark.parametrize(
    ("n", "expected"), [(0, "0 rules"), (1, "1 rule"), (2, "2 rules"), (1000, "1000 rules")]
)
def test_one_is_singular_and_every_other_count_plural(n: int, expected: str) -> None:
    """`1 rule`, `0 rules`, `2 rules`."""
    assert counted(n, "rule") == expected


def test_a_noun_whose_plural_is_not_s_is_given_its_plural() -> None:
    """`summary`, `summaries`: the plural is said when it is not the noun and an s."""
    assert [plural(n, "summary", "summaries") for n in (1, 2)] == ["summary", "summaries"]
    assert counted(1, "dlqId") == "1 dlqId"
    assert counted(3, "dlqId") == "3 dlqIds"


def test_a_message_gets_a_guess_only_for_a_word_near_a_known_one() -> None:
    """`; did you mean 'restart'?` after the message for a near word, and nothing after
    it for a far one or a value that is no word."""
    known = ["resume", "restart"]
    assert with_guess("bad", "restrat", known) == "bad; did you mean 'restart'?"
    assert with_guess("bad", "zzz", known) == "bad"
    assert with_guess("bad", 5, ["5"]) == "bad"
