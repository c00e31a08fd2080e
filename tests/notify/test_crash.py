"""SIGKILL of `recoveryd serve` while notifications are being decided and delivered, then
a restart: none is lost, and none is delivered again to a receiver that answered 2xx."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from daemon.notify.summary import idempotency_key
from tests.notify.support import Receiver, notify_rule, receiving
from tests.processes import Served, serving
from tests.support import LOOPBACK_TLS, callback_json, emulator_config, signed, wait_for, workflows


def notifications(served: Served, dlq_id: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{served.admin_url}/api/v1/dlq/{dlq_id}", timeout=5, verify=LOOPBACK_TLS)
    if answer.status_code == 404:
        return []
    found: list[dict[str, Any]] = answer.json()["notifications"]
    return found


def send_callbacks(served: Served, dlq_ids: list[str]) -> None:
    for dlq_id in dlq_ids:
        body = callback_json(dlq_id, "failure-callback-workflow.json")
        answer = httpx.post(
            f"{served.url}/callbacks", content=body, headers=signed(body), verify=LOOPBACK_TLS
        )
        assert answer.status_code == 200


def test_a_kill_mid_way_loses_no_notification_and_repeats_none_answered_2xx(
    tmp_path: Path,
) -> None:
    """Each summary is answered 500 first. Ten are then answered 200 and recorded sent;
    the rest are held by the receiver when the kill comes, and more callbacks are still
    being decided. After the restart every dlqId's summary is answered 2xx exactly once,
    all of its attempts under one Idempotency-Key. The webhook's secret (in its query)
    is in no log line and no record."""
    receiver = Receiver(failures=1, answer_first=10)
    receiver.holding.set()
    config = emulator_config(execute_runs=False)
    with (
        receiving(receiver) as hook,
        serve_in_thread(create_app(config)) as service_url,
        httpx.Client(base_url=service_url, timeout=10) as control,
    ):
        rules = tmp_path / "rules.yaml"
        secret = "webhook-secret-0xC0FFEE"
        rules.write_text("version: 1\nrules:\n" + notify_rule("page", f"{hook}?token={secret}"))
        seeded = control.post("/_emulator/dlq", json={"messages": workflows(40)})
        dlq_ids: list[str] = seeded.json()["dlqIds"]
        first, late = dlq_ids[:30], dlq_ids[30:]
        settings = {"SERVICE_URL": service_url, "RULES": str(rules)}

        with serving(tmp_path, **settings) as served:
            send_callbacks(served, first)
            wait_for(lambda: len(receiver.answered_ok()) >= 10 and receiver.held() >= 1)
            answered = set(receiver.answered_ok())
            sent = [d for d in first if idempotency_key(d, "page") in answered]

            def recorded_sent() -> bool:
                return all(n["state"] == "sent" for d in sent for n in notifications(served, d))

            wait_for(recorded_sent)  # no 2xx is in flight when the kill comes
            send_callbacks(served, late)
            exit_status, _ = served.stop(signal.SIGKILL)
        assert exit_status == -signal.SIGKILL
        wait_for(lambda: receiver.held() == 0)  # the held requests saw the caller go
        before_restart = receiver.answered_ok()

        receiver.holding.clear()
        with serving(tmp_path, **settings) as served:
            wait_for(
                lambda: all(
                    [n["state"] for n in notifications(served, d)] == ["sent"] for d in dlq_ids
                )
            )
            shown = [
                httpx.get(f"{served.admin_url}/api/v1/dlq/{d}", verify=LOOPBACK_TLS).text
                for d in dlq_ids
            ]
            shown.append(httpx.get(f"{served.admin_url}/metrics", verify=LOOPBACK_TLS).text)
            served.stop()

    assert len(before_restart) >= 10
    assert receiver.answered_ok() == Counter(
        {idempotency_key(dlq_id, "page"): 1 for dlq_id in dlq_ids}
    )
    for dlq_id in dlq_ids:
        assert receiver.keys_of(dlq_id) == {idempotency_key(dlq_id, "page")}
    logs = "".join(log.read_text() for log in tmp_path.glob("serve-*.log"))
    assert "notification sent" in logs
    assert secret not in logs
    assert not [text for text in shown if secret in text]
