"""What the console's pages show, made from the store's values (daemon/admin/console/views.py)."""

from __future__ import annotations

import base64

from daemon.admin.console.views import (
    BODY_SHOWN,
    MASK,
    SPARK_HEIGHT,
    SPARK_WIDTH,
    age,
    body_text,
    masked,
    next_fire,
    sparkline,
    timeline,
)


def test_the_sparkline_spans_the_box_with_its_peak_at_the_top() -> None:
    points = [tuple(map(float, point.split(","))) for point in sparkline([0, 4, 2]).split()]
    assert [x for x, _ in points] == [0.0, SPARK_WIDTH / 2, SPARK_WIDTH]
    assert [y for _, y in points] == [SPARK_HEIGHT - 1, 1.0, SPARK_HEIGHT / 2]


def test_a_quiet_hour_is_a_flat_line_at_the_bottom() -> None:
    assert {point.split(",")[1] for point in sparkline([0] * 60).split()} == {"31.0"}


def test_headers_that_may_carry_a_secret_are_masked_and_the_rest_shown() -> None:
    headers = {
        "Authorization": ["Bearer s3cret"],
        "X-Api-Key": ["k"],
        "Cookie": ["a=b"],
        "Service-Forward-X-Token": ["t"],
        "Content-Type": ["application/json", "charset=utf-8"],
    }
    assert masked(headers) == [
        ("Authorization", MASK),
        ("X-Api-Key", MASK),
        ("Cookie", MASK),
        ("Service-Forward-X-Token", MASK),
        ("Content-Type", "application/json"),
        ("Content-Type", "charset=utf-8"),
    ]


def test_a_long_body_is_cut_and_says_so() -> None:
    encoded = base64.b64encode(b"x" * (BODY_SHOWN + 1)).decode()
    assert body_text(encoded) == ("x" * BODY_SHOWN, True)


def test_a_body_that_is_not_text_is_shown_as_sent() -> None:
    encoded = base64.b64encode(b"\xff\xfe").decode()
    assert body_text(encoded) == (encoded, False)


def test_ages_read_in_the_largest_units() -> None:
    assert [age(s) for s in (45, 720, 3 * 3600 + 300, 2 * 86400 + 4 * 3600)] == [
        "45s", "12m", "3h 5m", "2d 4h"
    ]  # fmt: skip


def test_the_timeline_orders_the_steps_by_time() -> None:
    record = {
        "receivedAt": 10.0,
        "history": [{"state": "decided", "at": 12.0, "rule": "r"}, {"state": "done", "at": 20.0}],
        "calls": [{"method": "GET", "path": "/v2/dlq/1", "status": 200, "seconds": 0.005,
                   "at": 11}],
        "batches": [{"id": 3, "calls": [{"method": "POST", "path": "/resume", "status": 200,
                                          "seconds": 0.01, "at": 15.0}]}],
    }  # fmt: skip
    assert [(step.what, step.detail) for step in timeline(record)] == [
        ("callback received", ""),
        ("fetched", "GET /v2/dlq/1 status 200 5 ms"),
        ("decided", "rule r"),
        ("batch 3 call", "POST /resume status 200 10 ms"),
        ("done", ""),
    ]


def test_the_next_rotation_follows_its_schedule() -> None:
    assert next_fire("0 3 * * *", 0.0) == 3 * 3600.0
    assert next_fire(None, 0.0) is None
