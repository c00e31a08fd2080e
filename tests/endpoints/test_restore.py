"""Undoing a removal: `recoveryd restore-endpoint` (a real process, asking a running daemon
or, with none, doing it itself), the admin route behind it, and `recoveryd removals`."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import httpx

from daemon.emulator import create_app
from daemon.http.serving import serve_in_thread
from tests.endpoints.support import (
    dead_letter,
    endpoints,
    fail,
    finished_removals,
    group_endpoints,
    named,
    put_group,
    rules,
    topic_calls,
)
from tests.pipeline.support import Harness, harness
from tests.processes import free_port, recoveryd
from tests.support import emulator_config, running_recoveryd


def admin_listen(h: Harness) -> str:
    url = h.recoveryd.admin.base_url
    return f"{url.host}:{url.port}"


async def test_the_admin_route_puts_a_removed_endpoint_back_with_its_name_and_url(
    tmp_path: Path,
) -> None:
    members = endpoints("orders", "a", "b", "c")
    async with harness(tmp_path, rules(failures=1)) as h:
        await put_group(h.control, "orders", members)
        await fail(h, dead_letter("orders", members[2]))
        await finished_removals(h.recoveryd.admin, 1)
        assert await group_endpoints(h.control, "orders") == members[:2]

        restored = await h.recoveryd.admin.post("/api/v1/removals/orders/c/restore")
        again = await h.recoveryd.admin.post("/api/v1/removals/orders/c/restore")
        unknown = await h.recoveryd.admin.post("/api/v1/removals/orders/nope/restore")
        assert await group_endpoints(h.control, "orders") == members
        [removal] = await finished_removals(h.recoveryd.admin, 1)
        [added] = topic_calls(await h.journal(), "POST")
        count = h.recoveryd.metric("recoveryd_endpoint_restores_total", result="restored")

    assert restored.status_code == 200, restored.text
    assert restored.json() == {
        "status": "restored", "removal": 1, "urlGroup": "orders", "endpoint": members[2],
    }  # fmt: skip
    assert (added["path"], named(added)) == ("/v2/topics/orders/endpoints", [members[2]])
    assert again.status_code == 409
    assert "was restored already" in again.json()["error"]
    assert unknown.status_code == 404
    assert "no removal of endpoint 'nope' from URL Group 'orders'" in unknown.json()["error"]
    assert removal["restore"]["state"] == "restored"
    assert count == 1


async def test_an_unnamed_last_endpoint_goes_with_its_group_and_comes_back_by_its_url(
    tmp_path: Path,
) -> None:
    """keepLastEndpoint off: the last endpoint goes, and the service deletes the group; the
    restore, by url (%2F-encoded in the path), creates the group again."""
    only = {"url": "https://hooks.example.com/only?for=solo"}
    async with harness(tmp_path, rules(failures=1, keep_last=False)) as h:
        await put_group(h.control, "solo", [only])
        [dlq_id] = await fail(h, dead_letter("solo", only))
        [removal] = await finished_removals(h.recoveryd.admin, 1)
        assert await group_endpoints(h.control, "solo") is None
        record = await h.record(dlq_id)
        path = f"/api/v1/removals/solo/{quote(only['url'], safe='')}/restore"
        restored = await h.recoveryd.admin.post(path)
        assert await group_endpoints(h.control, "solo") == [only]
        [delete] = topic_calls(await h.journal(), "DELETE")

    assert named(delete) == [only]
    assert removal["state"] == "removed"
    assert record["reason"] == (
        "removed endpoint https://hooks.example.com/only?for=solo from URL Group solo: it was "
        "the last one, so the service deleted the group (keepLastEndpoint is off) (removal 1)"
    )
    assert restored.status_code == 200, restored.text
    assert restored.json()["endpoint"] == only


async def test_a_restore_the_service_refuses_is_recorded_and_can_be_run_again(
    tmp_path: Path,
) -> None:
    members = endpoints("orders", "a", "b")
    async with harness(tmp_path, rules(failures=1)) as h:
        await put_group(h.control, "orders", members)
        await fail(h, dead_letter("orders", members[1]))
        await finished_removals(h.recoveryd.admin, 1)
        await h.fault(kind="status", status=400, times=1, paths=["/v2/topics/orders/endpoints"])
        refused = await h.recoveryd.admin.post("/api/v1/removals/orders/b/restore")
        [removal] = await finished_removals(h.recoveryd.admin, 1)
        assert await group_endpoints(h.control, "orders") == members[:1]
        restored = await h.recoveryd.admin.post("/api/v1/removals/orders/b/restore")
        assert await group_endpoints(h.control, "orders") == members
        failed = h.recoveryd.metric("recoveryd_endpoint_restores_total", result="failed")

    assert refused.status_code == 502
    assert refused.json()["error"].startswith(
        "restoring endpoint b of URL Group orders failed: add_endpoints: 400"
    )
    assert removal["restore"]["state"] is None
    assert removal["restore"]["reason"] == refused.json()["error"]
    assert restored.status_code == 200
    assert failed == 1


async def test_the_commands_ask_the_running_daemon(tmp_path: Path) -> None:
    """`recoveryd removals` and `recoveryd restore-endpoint` as processes, beside a
    running daemon: they go through its admin listener. Exit 0 on success, 1 with the
    reason otherwise."""
    members = endpoints("orders", "a", "b", "c")
    async with harness(tmp_path, rules(failures=2)) as h:
        await put_group(h.control, "orders", members)
        dlq_ids = await fail(h, *[dead_letter("orders", members[2])] * 2)
        await finished_removals(h.recoveryd.admin, 1)
        settings = {"ADMIN_LISTEN": admin_listen(h), "SERVICE_URL": "http://127.0.0.1:9"}
        # The store is the daemon's, but the commands must not read it: RECOVERYD_STORE
        # points elsewhere, so only the daemon can answer.
        settings["STORE"] = f"sqlite:///{tmp_path / 'not-the-daemons.db'}"
        listed = await recoveryd(tmp_path, "removals", **settings)
        restored = await recoveryd(tmp_path, "restore-endpoint", "orders", "c", **settings)
        again = await recoveryd(tmp_path, "restore-endpoint", "orders", "c", **settings)
        unknown = await recoveryd(tmp_path, "restore-endpoint", "other", "c", **settings)
        assert await group_endpoints(h.control, "orders") == members

    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith("removal 1  URL Group orders  endpoint c  removed  ")
    assert "  url       https://c.example.com/orders\n" in listed.stdout
    assert "  reason    removed endpoint c from URL Group orders\n" in listed.stdout
    assert "  rule      prune-dead-endpoints: 2 failures within 10m\n" in listed.stdout
    for dlq_id in dlq_ids:
        assert f"status 410  dlqId {dlq_id}\n" in listed.stdout
    assert "  undo      recoveryd restore-endpoint orders c" in listed.stdout
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout == (
        "restored endpoint c (https://c.example.com/orders) to URL Group orders (removal 1)\n"
    )
    assert again.returncode == 1
    assert "was restored already" in again.stderr
    assert unknown.returncode == 1
    assert "no removal of endpoint 'c' from URL Group 'other' is recorded" in unknown.stderr


async def test_with_no_daemon_running_the_commands_work_on_the_store(tmp_path: Path) -> None:
    members = endpoints("orders", "a", "b")
    path = tmp_path / "rules.yaml"
    path.write_text(rules(failures=1))
    app = create_app(emulator_config(execute_runs=False))
    with serve_in_thread(app) as service_url:
        async with (
            httpx.AsyncClient(base_url=service_url) as control,
            running_recoveryd(tmp_path, SERVICE_URL=service_url, RULES=str(path)) as daemon,
        ):
            h = Harness(daemon, control, app.state.emulator)
            await put_group(control, "orders", members)
            await fail(h, dead_letter("orders", members[1]))
            await finished_removals(daemon.admin, 1)
        # The daemon has stopped: nothing answers on its admin listener, so the commands
        # read the store and call the service themselves.
        settings = {
            "SERVICE_URL": service_url,
            "RULES": str(path),
            "ADMIN_LISTEN": f"127.0.0.1:{free_port()}",
        }
        listed = await recoveryd(tmp_path, "removals", "--json", **settings)
        restored = await recoveryd(tmp_path, "restore-endpoint", "orders", "b", **settings)
        again = await recoveryd(tmp_path, "restore-endpoint", "orders", "b", **settings)
        async with httpx.AsyncClient(base_url=service_url) as control:
            assert await group_endpoints(control, "orders") == members

    assert listed.returncode == 0, listed.stderr
    assert '"state": "removed"' in listed.stdout
    assert restored.returncode == 0, restored.stderr
    assert restored.stdout.startswith("restored endpoint b (https://b.example.com/orders)")
    assert again.returncode == 1
    assert "was restored already" in again.stderr
