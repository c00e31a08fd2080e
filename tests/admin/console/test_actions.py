"""The console's actions: each confirmed first, done with the admin API's logic, and
logged as the API logs it with via="console" (the audit)."""

from __future__ import annotations

from pathlib import Path

from markupsafe import escape
from structlog.testing import capture_logs

from tests.admin.console.support import (
    HOSTILE_ID,
    RULES,
    console,
    csrf_of,
    post_hostile,
    settled,
)
from tests.endpoints.support import (
    dead_letter,
    endpoints,
    fail,
    finished_removals,
    group_endpoints,
    put_group,
    rules,
)
from tests.pipeline.support import harness


async def test_redrive_asks_first_then_puts_the_dlq_id_back(tmp_path: Path) -> None:
    """Redrive: the confirmation lists the dlqId and changes nothing; Confirm redrive
    sends it through again (done again, redriven in its history), logged via console."""
    async with console(tmp_path) as c:
        confirm = await c.ui.get("/ui/redrive", params={"dlqId": c.done})
        unchanged = (await c.ui.get(f"/api/v1/dlq/{c.done}")).json()
        with capture_logs() as logs:
            done = await c.ui.post(
                "/ui/redrive", data={"csrf": csrf_of(confirm.text), "dlqId": c.done}
            )
        record = await settled(c.daemon, c.done)
    assert confirm.status_code == 200
    assert ">Confirm redrive</button>" in confirm.text
    assert unchanged["state"] == "done"
    assert done.status_code == 200
    assert "1 dlqId went back" in done.text
    assert [event["state"] for event in record["history"]].count("redriven") == 1
    assert {"event": "redriven", "via": "console", "dlq_ids": 1}.items() <= next(
        log for log in logs if log["event"] == "redriven"
    ).items()


async def test_a_selection_is_confirmed_whole(tmp_path: Path) -> None:
    """Two final dlqIds ticked on the list: the confirmation carries both."""
    async with console(tmp_path) as c:
        await post_hostile(c.daemon)
        listed = await c.ui.get("/ui/failures")
        confirm = await c.ui.get("/ui/redrive", params=[("dlqId", c.done), ("dlqId", HOSTILE_ID)])
    assert f'name="dlqId" value="{c.done}"' in listed.text
    assert ">Redrive selected</button>" in listed.text
    assert "These 2 dlqIds go back" in confirm.text
    assert f'<input type="hidden" name="dlqId" value="{c.done}">' in confirm.text
    assert f'<input type="hidden" name="dlqId" value="{escape(HOSTILE_ID)}">' in confirm.text


async def test_redrive_of_a_dlq_id_not_final_offers_nothing(tmp_path: Path) -> None:
    async with console(tmp_path) as c:
        confirm = await c.ui.get("/ui/redrive", params={"dlqId": "never-seen"})
    assert confirm.status_code == 200
    assert "Confirm redrive" not in confirm.text


async def test_a_reload_refused_shows_the_problem_at_its_line(tmp_path: Path) -> None:
    """An invalid file: the running rules stay, the page and the overview show the
    problem with its line and column; logged via console."""
    async with console(tmp_path) as c:
        c.rules.write_text(RULES.replace("maxSize: 10", "maxSize: 0"))
        with capture_logs() as logs:
            page = await c.post_form("/ui/reload", "/ui/reload")
        overview = await c.ui.get("/ui/")
    assert page.status_code == 200
    assert "1 problem in the rules file" in page.text
    assert "rules.yaml:6:" in page.text
    assert "rules.yaml:6:" in overview.text
    assert any(log.get("via") == "console" for log in logs if log["event"].startswith("rules"))


async def test_a_reload_puts_the_new_rules_in_force(tmp_path: Path) -> None:
    async with console(tmp_path) as c:
        c.rules.write_text(RULES.replace("maxSize: 10", "maxSize: 20"))
        page = await c.post_form("/ui/reload", "/ui/reload")
        digest = c.daemon.daemon.rules.current.digest
    assert page.status_code == 200
    assert f'Rules <code class="id">{digest[:12]}</code> in force' in page.text


async def test_a_sweep_dry_run_lists_what_it_would_select(tmp_path: Path) -> None:
    """The sweep's filter against the emulator's DLQ: the entry still there is listed
    (the run of the recovered one left it), and nothing is resumed."""
    async with console(tmp_path) as c:
        seeded = await c.service.post(
            "/_emulator/dlq",
            json={"messages": [{"url": "https://app.example.com/wf", "workflowRunId": "wfr_9"}]},
        )
        [waiting] = seeded.json()["dlqIds"]
        with capture_logs() as logs:
            page = await c.post_form("/ui/sweeps/dry-run", "/ui/sweeps", sweep="nightly")
        journal = (await c.service.get("/_emulator/journal")).json()
    assert page.status_code == 200
    assert waiting in page.text
    assert "1 workflow run would be resumed" in page.text
    resumes = [call for call in journal if call["path"].endswith("/resume")]
    assert waiting not in str(resumes)
    assert {"event": "sweep dry run", "sweep": "nightly", "via": "console"} in [
        {key: log.get(key) for key in ("event", "sweep", "via")} for log in logs
    ]


async def test_restoring_an_endpoint_never_removed_is_refused(tmp_path: Path) -> None:
    """Nothing recorded: the confirmation says so, and a confirmed POST is a 409 page."""
    async with console(tmp_path) as c:
        confirm = await c.ui.get("/ui/restore", params={"group": "orders", "name": "a"})
        page = await c.post_form("/ui/restore", "/ui/sweeps", group="orders", name="a")
    assert "No removal of endpoint" in confirm.text
    assert "Confirm restore" not in confirm.text
    assert page.status_code == 409
    assert "no removal of endpoint" in page.text


async def test_restore_asks_first_then_puts_the_endpoint_back(tmp_path: Path) -> None:
    """A removed endpoint's row has Restore; the confirmation names it and changes
    nothing; Confirm restore puts it back in its group, logged via console."""
    members = endpoints("orders", "a", "b", "c")
    async with harness(tmp_path, rules(failures=1)) as h:
        ui = h.recoveryd.admin
        await put_group(h.control, "orders", members)
        await fail(h, dead_letter("orders", members[2]))
        await finished_removals(ui, 1)
        listed = await ui.get("/ui/removals")
        confirm = await ui.get("/ui/restore", params={"group": "orders", "name": "c"})
        still_out = await group_endpoints(h.control, "orders")
        with capture_logs() as logs:
            done = await ui.post(
                "/ui/restore",
                data={"csrf": csrf_of(confirm.text), "group": "orders", "name": "c"},
            )
        back = await group_endpoints(h.control, "orders")
    assert '<tr data-endpoint="orders/c">' in listed.text
    assert ">Restore</button>" in listed.text
    assert ">Confirm restore</button>" in confirm.text
    assert still_out == members[:2]
    assert done.status_code == 200
    assert back == members
    assert {"event": "endpoint restored", "url_group": "orders", "via": "console"}.items() <= next(
        log for log in logs if log["event"] == "endpoint restored"
    ).items()
