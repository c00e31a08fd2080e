"""The fixed one-second window of the account's rate limit."""

from __future__ import annotations

from daemon.emulator.ratelimit import FixedWindow


def test_requests_over_the_limit_are_refused_until_the_window_ends() -> None:
    """The third call of a 2/s window is refused; the next window starts afresh."""
    window = FixedWindow(2)
    verdicts = [window.hit(100.1), window.hit(100.5), window.hit(100.9), window.hit(101.0)]
    assert [v.allowed for v in verdicts] == [True, True, False, True]
    assert [v.remaining for v in verdicts] == [1, 0, 0, 1]
    assert [v.reset for v in verdicts] == [101, 101, 101, 102]


def test_most_requests_in_any_window_is_remembered() -> None:
    """max_in_window counts arrivals, refused ones included, even with no limit set."""
    window = FixedWindow(None)
    for now in (5.0, 5.1, 5.2, 6.0):
        assert window.hit(now).allowed
    assert (window.max_in_window, window.calls) == (3, 4)


def test_no_limit_no_headers() -> None:
    """Without a limit the answers carry no Burst-RateLimit headers."""
    assert FixedWindow(None).hit(1.0).headers() == {}


def test_headers_announce_limit_remaining_and_reset() -> None:
    """The three Burst-RateLimit headers."""
    assert FixedWindow(10).hit(7.5).headers() == {
        "Burst-RateLimit-Limit": "10",
        "Burst-RateLimit-Remaining": "9",
        "Burst-RateLimit-Reset": "8",
    }
