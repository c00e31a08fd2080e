"""Counts with their noun, as every line a person reads says them."""

from __future__ import annotations

import pytest

from daemon.words import counted, plural


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
