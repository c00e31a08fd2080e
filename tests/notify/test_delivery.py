"""What an answer means and when to try again: one table, no network, no clock."""

from __future__ import annotations

import httpx
import pytest

from daemon.notify.delivery import NotifyTiming, judge_answer, judge_error, next_step, retry_delay
from daemon.notify.summary import idempotency_key, receiver_of, without_query

TIMING = NotifyTiming(base=1.0, cap=60.0, max_attempts=5, max_age=3600.0)


def no_jitter() -> float:
    return 1.0  # the longest of the jittered range


@pytest.mark.parametrize(
    ("status", "result"),
    [
        (200, "sent"),
        (202, "sent"),
        (204, "sent"),
        (500, "retry"),
        (502, "retry"),
        (503, "retry"),
        (408, "retry"),
        (425, "retry"),
        (429, "retry"),
        (301, "failed"),
        (307, "failed"),
        (400, "failed"),
        (401, "failed"),
        (404, "failed"),
        (410, "failed"),
        (413, "failed"),
        (422, "failed"),
    ],
)
def test_each_answer_is_sent_retried_or_final(status: int, result: str) -> None:
    assert judge_answer(status).result == result


def test_a_redirect_says_why_it_is_not_followed() -> None:
    assert "put the final URL in the rule" in judge_answer(308).reason


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (httpx.ConnectError("[Errno 111] Connection refused"), "could not connect"),
        (httpx.ReadTimeout("timed out"), "no answer in time"),
        (TimeoutError(), "no answer in time"),
        (httpx.RemoteProtocolError("Server disconnected"), "the connection broke"),
        (httpx.UnsupportedProtocol("https://user:pw@host/x"), "no answer: UnsupportedProtocol"),
    ],
)
def test_no_answer_is_retried_and_the_reason_is_ours(error: Exception, reason: str) -> None:
    """The library's message may name the URL (a webhook's secret): never repeated."""
    verdict = judge_error(error)
    assert (verdict.result, verdict.status, verdict.reason) == ("retry", None, reason)


def test_the_delay_doubles_up_to_the_cap_and_honours_retry_after() -> None:
    delays = [retry_delay(attempt, TIMING, no_jitter) for attempt in range(1, 9)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60]
    assert retry_delay(1, TIMING, lambda: 0.0) == 0.5  # jittered down to half at most
    assert retry_delay(1, TIMING, no_jitter, retry_after=30) == 30
    assert retry_delay(1, TIMING, no_jitter, retry_after=3600) == 60  # capped


def test_retry_after_as_seconds_or_a_date() -> None:
    assert judge_answer(429, "12").retry_after == 12
    date = "Wed, 21 Oct 2015 07:28:00 GMT"
    assert judge_answer(503, date, now=1445412470.0).retry_after == 10
    assert judge_answer(503, "soon").retry_after is None


def test_a_retry_is_scheduled_until_a_limit_then_it_fails_with_the_last_reason() -> None:
    verdict = judge_answer(503)
    step = next_step(verdict, 2, queued_at=0.0, now=10.0, timing=TIMING, rand=no_jitter)
    assert (step.result, step.next_at) == ("retry", 12.0)
    last = next_step(verdict, 5, queued_at=0.0, now=10.0, timing=TIMING, rand=no_jitter)
    assert last.result == "failed"
    assert last.reason == "gave up after 5 attempts over 10s; the last answered 503"
    old = next_step(verdict, 1, queued_at=0.0, now=3600.0, timing=TIMING, rand=no_jitter)
    assert old.result == "failed"  # past max_age, whatever the attempts


def test_a_final_verdict_ends_at_once() -> None:
    step = next_step(judge_answer(404), 1, queued_at=0.0, now=1.0, timing=TIMING, rand=no_jitter)
    assert (step.result, step.reason, step.next_at) == ("failed", "refused: answered 404", None)


def test_the_idempotency_key_is_one_per_dlq_id_and_rule() -> None:
    key = idempotency_key("d-1", "page")
    assert key == idempotency_key("d-1", "page")
    assert len({key, idempotency_key("d-2", "page"), idempotency_key("d-1", "audit")}) == 3


@pytest.mark.parametrize(
    ("url", "receiver"),
    [
        ("https://hooks.example.com/services/T0/B0/secret", "https://hooks.example.com"),
        ("http://user:pw@127.0.0.1:8080/hook?token=x", "http://127.0.0.1:8080"),
        ("http://[::1]:9/hook", "http://[::1]:9"),
    ],
)
def test_what_is_shown_of_a_webhook_is_its_origin(url: str, receiver: str) -> None:
    assert receiver_of(url) == receiver


def test_a_message_url_is_shown_without_credentials_query_or_fragment() -> None:
    shown = without_query("https://u:p@api.example.com/wf/step?apiKey=s#frag")
    assert shown == "https://api.example.com/wf/step"
