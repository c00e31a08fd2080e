"""The fixed one-second window of the account's rate limit."""

from __future__ import annotations

from daemon.emulator.ratelimit import BurstLimit, CallLimits


def test_requests_over_the_limit_are_refused_until_the_window_ends() -> None:
    """The third call of a 2/s window is refused; the next window starts afresh."""
    window = BurstLimit(2)
    verdicts = [window.hit(100.1), window.hit(100.5), window.hit(100.9), window.hit(101.0)]
    assert [v.allowed for v in verdicts] == [True, True, False, True]
    assert [v.remaining for v in verdicts] == [1, 0, 0, 1]
    assert [v.reset for v in verdicts] == [101, 101, 101, 102]


def test_most_requests_in_any_window_is_remembered() -> None:
    """max_in_window counts arrivals, refused ones included, even with no limit set."""
    window = BurstLimit(None)
    for now in (5.0, 5.1, 5.2, 6.0):
        assert window.hit(now).allowed
    assert (window.max_in_window, window.calls) == (3, 4)


def test_no_limit_no_headers() -> None:
    """Without a limit the answers carry no Burst-RateLimit headers."""
    assert BurstLimit(None).hit(1.0).headers() == {}


def test_headers_announce_limit_remaining_and_reset() -> None:
    """The three Burst-RateLimit headers."""
    assert BurstLimit(10).hit(7.5).headers() == {
        "Burst-RateLimit-Limit": "10",
        "Burst-RateLimit-Remaining": "9",
        "Burst-RateLimit-Reset": "8",
    }


def test_a_sliding_second_counts_across_the_edge_of_a_clock_second() -> None:
    """Two calls late in one second and one early in the next: the third is refused,
    as it is the third within one second (refused, it still counts); a second after the
    second call, there is room again."""
    window = BurstLimit(2, counting="sliding")
    verdicts = [window.hit(100.8), window.hit(100.9), window.hit(101.1), window.hit(101.95)]
    assert [v.allowed for v in verdicts] == [True, True, False, True]
    assert [v.reset for v in verdicts] == [102, 102, 102, 103]
    assert window.max_in_window == 3


def test_the_limit_announced_on_429s_only() -> None:
    """With announce="on_429", an answer let through carries no Burst-RateLimit header,
    a 429 carries them all."""
    window = BurstLimit(1, announce="on_429")
    let_through = CallLimits(burst=window.hit(5.0), daily=None)
    refused = CallLimits(burst=window.hit(5.1), daily=None)
    assert let_through.headers(200) == {}
    assert refused.headers(429) == {
        "Burst-RateLimit-Limit": "1",
        "Burst-RateLimit-Remaining": "0",
        "Burst-RateLimit-Reset": "6",
    }
