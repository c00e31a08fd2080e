"""SIGKILL between a removal's intent and its DELETE's outcome, then a restart: the next
start reads the group and settles the removal; the endpoint is never removed twice, and
the record that restores it is never lost."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from tests.endpoints.support import dead_letter, endpoints, named, rules, topic_calls
from tests.processes import Served, serving
from tests.support import (
    LOOPBACK_TLS,
    callback_json,
    emulator_config,
    faults_taken,
    signed,
    wait_for,
)


def removals_of(served: Served) -> list[dict[str, Any]]:
    answer = httpx.get(f"{served.admin_url}/api/v1/removals", timeout=5, verify=LOOPBACK_TLS).json()
    found: list[dict[str, Any]] = answer["removals"]
    return found


def fail_once(control: httpx.Client, served: Served, message: dict[str, Any]) -> str:
    """Dead-letter `message` and send its failure callback, signed, to `served`."""
    [dlq_id] = control.post("/_emulator/dlq", json={"messages": [message]}).json()["dlqIds"]
    body = callback_json(dlq_id)
    response = httpx.post(
        f"{served.url}/callbacks", content=body, headers=signed(body), verify=LOOPBACK_TLS
    )
    assert response.status_code == 200
    return str(dlq_id)


def members_of(control: httpx.Client, group: str) -> list[dict[str, str]]:
    groups = control.get("/_emulator/url-groups").json()
    return next(found["endpoints"] for found in groups if found["name"] == group)


@contextlib.contextmanager
def orders_under_fault(
    tmp_path: Path, fault: dict[str, Any]
) -> Iterator[tuple[httpx.Client, dict[str, str], list[dict[str, str]]]]:
    """The emulator with the URL Group orders (a, b, c) and `fault` armed on its endpoints'
    path: a client for its control API, the daemon's settings, and the group's members."""
    members = endpoints("orders", "a", "b", "c")
    path = tmp_path / "rules.yaml"
    path.write_text(rules(failures=1))
    with (
        serve_in_thread(create_app(emulator_config(execute_runs=False))) as service_url,
        httpx.Client(base_url=service_url, timeout=10) as control,
    ):
        control.post("/_emulator/url-groups", json={"name": "orders", "endpoints": members})
        control.post("/_emulator/faults", json=fault).raise_for_status()
        yield control, {"SERVICE_URL": service_url, "RULES": str(path)}, members


def test_a_kill_while_the_delete_is_in_flight_neither_removes_twice_nor_loses_the_record(
    tmp_path: Path,
) -> None:
    """The service holds the DELETE; the daemon is killed meanwhile, and the service
    carries the DELETE out for no one. The next start finds the removal under way, reads
    the group, sees the endpoint gone and records it removed, sending nothing again; the
    endpoint can then be restored from the record."""
    fault = {"kind": "latency", "seconds": 6, "paths": ["/v2/topics/orders/endpoints"]}
    with orders_under_fault(tmp_path, fault) as (control, settings, members):
        with serving(tmp_path, **settings) as served:
            dlq_id = fail_once(control, served, dead_letter("orders", members[2]))
            wait_for(lambda: [r["state"] for r in removals_of(served)] == ["removing"])
            wait_for(lambda: faults_taken(control))  # the DELETE is out; the emulator holds it
            exit_status, _ = served.stop(signal.SIGKILL)
        assert exit_status == -signal.SIGKILL
        wait_for(lambda: members_of(control, "orders") == members[:2])  # carried out

        with serving(tmp_path, **settings) as served:
            wait_for(lambda: removals_of(served)[0]["state"] == "removed")
            [removal] = removals_of(served)
            record = httpx.get(
                f"{served.admin_url}/api/v1/dlq/{dlq_id}", verify=LOOPBACK_TLS
            ).json()
            restored = httpx.post(
                f"{served.admin_url}/api/v1/removals/orders/c/restore", verify=LOOPBACK_TLS
            )
            served.stop()
        journal = control.get("/_emulator/journal").json()
        assert members_of(control, "orders") == members

    [delete] = topic_calls(journal, "DELETE")
    assert (named(delete), delete["fault"]) == ([{"name": "c"}], "latency")
    assert removal["endpoint"] == members[2]
    assert removal["reason"] == (
        "removed endpoint c from URL Group orders (not in the group when read again after its "
        "DELETE was interrupted)"
    )
    assert (record["state"], record["reason"]) == ("done", f"{removal['reason']} (removal 1)")
    assert restored.status_code == 200, restored.text


def test_a_kill_before_the_delete_was_carried_out_removes_the_endpoint_once_at_the_next_start(
    tmp_path: Path,
) -> None:
    """The intent is recorded, but the service refuses the DELETE (429) until the daemon is
    killed. The next start reads the group, finds the endpoint still there and removes it:
    one DELETE carried out in all."""
    fault = {"kind": "rate_limit", "times": 1000, "paths": ["/v2/topics/orders/endpoints"]}
    with orders_under_fault(tmp_path, fault) as (control, settings, members):
        with serving(tmp_path, **settings) as served:
            fail_once(control, served, dead_letter("orders", members[2]))
            wait_for(lambda: [r["state"] for r in removals_of(served)] == ["removing"])
            wait_for(lambda: topic_calls(control.get("/_emulator/journal").json(), "DELETE"))
            exit_status, _ = served.stop(signal.SIGKILL)
        assert exit_status == -signal.SIGKILL
        control.delete("/_emulator/faults").raise_for_status()
        assert members_of(control, "orders") == members  # refused: nothing removed yet

        with serving(tmp_path, **settings) as served:
            wait_for(lambda: removals_of(served)[0]["state"] == "removed")
            [removal] = removals_of(served)
            served.stop()
        journal = control.get("/_emulator/journal").json()
        assert members_of(control, "orders") == members[:2]

    deletes = topic_calls(journal, "DELETE")
    assert [call["status"] for call in deletes if call["status"] != 429] == [200]
    assert removal["reason"] == "removed endpoint c from URL Group orders"
    assert removal["endpoint"] == members[2]
