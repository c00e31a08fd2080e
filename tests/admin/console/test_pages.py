"""The console's pages (daemon/admin/console/app.py) on a running daemon: each answers
with its data, and a callback's hostile fields show as text."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

import pytest
from markupsafe import escape

from tests.account.support import rotation_settings
from tests.admin.console.support import (
    HOSTILE,
    HOSTILE_ID,
    MARKUP,
    RULES,
    Console,
    console,
    post_hostile,
)
from tests.support import TOKEN, callback_json

# The tests that only read share a console started once for the module (conftest.py),
# with the one dlqId done; those that add to it or change it start their own.
pytestmark = pytest.mark.asyncio(loop_scope="module")

NAV = ("Overview", "Failures", "Groups", "Batches", "Removals", "Sweeps", "Rules")


async def test_the_overview_shows_the_backlog_breakers_rules_and_replicas(
    open_console: Console,
) -> None:
    """The overview's sections, with the count of the dlqId done and the rules' digest."""
    page = await open_console.ui.get("/ui/")
    digest = open_console.daemon.daemon.rules.current.digest
    assert page.status_code == 200
    for section in ("backlog", "breakers", "rules-status", "replicas"):
        assert f'<section id="{section}"' in page.text
    assert '<a href="/ui/failures?state=done">done</a></th><td class="num">1</td>' in page.text
    assert digest[:12] in page.text
    assert "<polyline" in page.text
    assert page.text.count("<h1>") == 1
    assert all(f">{name}</a>" in page.text for name in NAV)


async def test_the_overview_shows_the_tokens_last_rotation_and_age(tmp_path: Path) -> None:
    """After a rotation: when, and how old the token in use is; the token never shown."""
    settings = rotation_settings(tmp_path / "credentials.json", ROTATE_SCHEDULE="0 4 * * *")
    async with console(tmp_path, **settings) as c:
        before = await c.ui.get("/ui/")
        assert (await c.ui.post("/-/rotate-token", timeout=30)).status_code == 200
        after = await c.ui.get("/ui/")
    assert "old)" not in before.text
    assert re.search(r"\(token \d+s old\)", after.text)
    assert "<code>0 4 * * *</code>" in after.text
    assert TOKEN not in after.text


async def test_the_overview_fragment_is_the_live_part_alone(open_console: Console) -> None:
    """/ui/fragments/overview answers the sections the overview page polls, no page."""
    fragment = await open_console.ui.get("/ui/fragments/overview")
    assert fragment.status_code == 200
    assert '<section id="backlog"' in fragment.text
    assert "<html" not in fragment.text


async def test_the_failures_list_shows_each_failure_linked_to_its_page(
    open_console: Console,
) -> None:
    """A row per dlqId, its id a link to its page, with its state and rule."""
    page = await open_console.ui.get("/ui/failures", params={"rule": "resume-workflows"})
    assert page.status_code == 200
    assert f'<tr data-dlq-id="{open_console.done}">' in page.text
    assert f'href="/ui/failures/{open_console.done}"' in page.text
    assert "resume-workflows" in page.text
    assert '<form id="filter" method="get"' in page.text


async def test_the_failures_fragment_is_the_table_alone(open_console: Console) -> None:
    """/ui/fragments/failures, with the page's filters, answers the rows the list polls."""
    fragment = await open_console.ui.get("/ui/fragments/failures", params={"state": "done"})
    assert fragment.status_code == 200
    assert fragment.text.startswith('<table id="failures">')
    assert f'<tr data-dlq-id="{open_console.done}">' in fragment.text


async def test_a_long_list_pages_by_cursor_and_a_later_page_stays_put(tmp_path: Path) -> None:
    """51 failures: the first page has 50 and a Next page link, which leads to the one
    left; only the first page is live (a later one would be overwritten by the newest)."""
    async with console(tmp_path) as c:
        for number in range(50):
            body = callback_json(f"1763712{number:06d}-0")
            assert (await c.daemon.post(body)).status_code == 200
        first = await c.ui.get("/ui/failures")
        following = re.search(r'<a href="([^"]+)" rel="next">Next page</a>', first.text)
        assert following is not None
        second = await c.ui.get(following.group(1).replace("&amp;", "&"))
    assert first.text.count("<tr data-dlq-id=") == 50
    assert "data-live=" in first.text
    assert second.text.count("<tr data-dlq-id=") == 1
    assert "data-live=" not in second.text
    assert "Next page" not in second.text


async def test_the_failures_filter_leaves_out_other_rules(open_console: Console) -> None:
    """Filtered by a rule that decided nothing, the list has no row."""
    page = await open_console.ui.get("/ui/failures", params={"rule": "leave-the-rest"})
    assert page.status_code == 200
    assert "data-dlq-id" not in page.text


@pytest.mark.parametrize(("field", "value"), [("state", "sleeping"), ("since", "yesterday")])
async def test_a_bad_filter_is_a_400_naming_it(
    open_console: Console, field: str, value: str
) -> None:
    """A state that is not one, or an age that is not a duration: 400, the field named."""
    page = await open_console.ui.get("/ui/failures", params={field: value})
    assert page.status_code == 400
    assert f"{field}: " in page.text


@pytest.mark.parametrize("path", ["/ui/failures", "/ui/batches"])
async def test_a_cursor_no_listing_gave_is_a_400_naming_it(
    open_console: Console, path: str
) -> None:
    page = await open_console.ui.get(path, params={"cursor": "not-a-cursor"})
    assert page.status_code == 400
    assert "cursor: " in page.text


async def test_a_failure_shows_its_summary_timeline_reasoning_and_batch(
    open_console: Console,
) -> None:
    """State and rule in the summary, the timeline to done, the rule explain names, and
    the batch with its call's status."""
    page = await open_console.ui.get(f"/ui/failures/{open_console.done}")
    assert page.status_code == 200
    assert '<dd data-field="state" class="state-done">done</dd>' in page.text
    assert '<dd data-field="rule">resume-workflows</dd>' in page.text
    assert '<ol id="timeline">' in page.text
    assert "callback received" in page.text
    assert "POST /v2/workflows/dlq/resume" in page.text
    assert "status 200" in page.text
    assert ">Redrive</button>" in page.text


async def test_an_unknown_dlq_id_is_a_404_page(open_console: Console) -> None:
    page = await open_console.ui.get("/ui/failures/no-such-id")
    assert page.status_code == 404
    assert "no-such-id" in page.text


async def test_hostile_callback_fields_show_as_text_on_the_list(tmp_path: Path) -> None:
    """<script>, an attribute break-out and a javascript: URL are escaped on the list."""
    async with console(tmp_path) as c:
        await post_hostile(c.daemon)
        page = await c.ui.get("/ui/failures")
    assert page.status_code == 200
    assert not [markup for markup in MARKUP if markup in page.text]
    assert escape(HOSTILE["topicName"]) in page.text
    assert f'data-dlq-id="{escape(HOSTILE_ID)}"' in page.text


async def test_hostile_callback_fields_show_as_text_on_the_failure_page(tmp_path: Path) -> None:
    """The same fields on the failure's page: escaped; a secret header masked."""
    async with console(tmp_path) as c:
        await post_hostile(c.daemon)
        page = await c.ui.get(f"/ui/failures/{quote(HOSTILE_ID, safe='')}")
    assert page.status_code == 200
    assert not [markup for markup in MARKUP if markup in page.text]
    assert escape(HOSTILE["endpointName"]) in page.text
    assert "javascript:alert(1)" in page.text  # as text, in a <code>, never an href
    assert "endpoint-s3cret" not in page.text


async def test_groups_list_failures_by_what_they_share(open_console: Console) -> None:
    """The group of the recovered run, with its count and a link to its failures."""
    page = await open_console.ui.get("/ui/groups")
    assert page.status_code == 200
    assert '<table id="groups">' in page.text
    assert "resume-workflows" in page.text
    assert "/ui/failures?" in page.text


async def test_batches_list_the_batch_sent(open_console: Console) -> None:
    page = await open_console.ui.get("/ui/batches")
    assert page.status_code == 200
    assert "data-batch-id=" in page.text
    assert f">{open_console.done}</a>" in page.text


async def test_removals_answer_with_none_recorded(open_console: Console) -> None:
    page = await open_console.ui.get("/ui/removals")
    assert page.status_code == 200
    assert '<table id="removals">' in page.text
    assert "No endpoint has been removed." in page.text


async def test_sweeps_show_each_sweep_with_a_dry_run_button(open_console: Console) -> None:
    page = await open_console.ui.get("/ui/sweeps")
    assert page.status_code == 200
    assert "nightly" in page.text
    assert ">Dry run</button>" in page.text


async def test_rules_show_the_file_and_each_rules_counts(open_console: Console) -> None:
    """The file's text, its digest, and resume-workflows' one dlqId done."""
    page = await open_console.ui.get("/ui/rules")
    digest = open_console.daemon.daemon.rules.current.digest
    assert page.status_code == 200
    assert digest in page.text
    assert "schedule: &#34;0 3 * * *&#34;" in page.text
    assert ">resume-workflows</a></td><td>resume</td>" in page.text
    assert ">Reload rules</button>" in page.text


RULE_TESTS = """\
tests:
  - name: a workflow is resumed
    message: {header: {Service-Workflow-RunId: [wfr_1]}, dlqId: d1}
    expect: {rule: resume-workflows, action: resume}
  - name: a plain message is resumed too (wrong on purpose)
    message: {url: "https://example.com/plain", dlqId: d2}
    expect: {action: resume}
"""


async def test_rules_show_the_rule_tests_beside_the_file_run_against_the_rules_in_force(
    tmp_path: Path,
) -> None:
    """rules.test.yaml beside rules.yaml: its one failing test named, with its line."""
    async with console(tmp_path) as c:
        before = (await c.ui.get("/ui/rules")).text
        (tmp_path / "rules.test.yaml").write_text(RULE_TESTS)
        after = (await c.ui.get("/ui/rules")).text
    assert "rules.test.yaml</code>: no rule tests there" in before
    assert "1 of 2 failed</span> against the rules in force" in after
    assert (
        "<code>rules.test.yaml:5</code> a plain message is resumed too (wrong on purpose): "
        "expected action &#39;resume&#39;, got &#39;ignore&#39;" in after
    )


# The console's rules with its workflows ignored instead of resumed.
IGNORING = RULES.replace(
    "action: resume\n    batch: {maxSize: 10, maxWait: 100ms}", "action: ignore"
)


async def test_rules_show_what_reloading_the_changed_file_would_change(tmp_path: Path) -> None:
    """The file on disk replayed on the records before the Reload button: the same file
    changes nothing; one that ignores workflows moves the done dlqId; one with problems
    says a reload would be refused."""
    async with console(tmp_path) as c:
        same = (await c.ui.get("/ui/rules")).text
        c.rules.write_text(IGNORING)
        changed = (await c.ui.get("/ui/rules")).text
        c.rules.write_text(RULES.replace("action: resume", "action: resum", 1))
        broken = (await c.ui.get("/ui/rules")).text
    assert "The file on disk is the rules in force: a reload would change nothing." in same
    section = changed[changed.index('id="reload-would"') : changed.index(">Reload rules</button>")]
    assert "1 decision would change, of 1 records" in section
    assert "<td>resume-workflows resume</td><td>resume-workflows ignore</td>" in section
    assert f'href="/ui/failures/{quote(c.done, safe="")}"' in section
    assert "a reload would be refused and the running rules stay" in broken
    assert "got &#39;resum&#39;; did you mean &#39;resume&#39;?" in broken


async def test_rules_show_no_shadow_rules_when_none_are_set(open_console: Console) -> None:
    page = (await open_console.ui.get("/ui/rules")).text
    assert "None: set <code>RECOVERYD_SHADOW_RULES</code>" in page


async def test_rules_show_the_shadow_rules_and_where_they_disagree(tmp_path: Path) -> None:
    """The shadow file loaded, with the done dlqId it would have ignored."""
    shadow = tmp_path / "shadow.yaml"
    shadow.write_text(IGNORING)
    async with console(tmp_path, SHADOW_RULES=str(shadow)) as c:
        page = (await c.ui.get("/ui/rules")).text
    section = page[page.index('id="shadow"') :]
    assert f"<code>{shadow}</code>" in section
    assert "loaded, sha256" in section
    assert "<td>resume-workflows resume</td><td>resume-workflows ignore</td>" in section
    assert f'href="/ui/failures/{quote(c.done, safe="")}"' in section


async def test_rules_show_shadow_rules_that_failed_to_load_and_why(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow.yaml"
    shadow.write_text(RULES.replace("match: {}", "mach: {}"))
    async with console(tmp_path, SHADOW_RULES=str(shadow)) as c:
        page = (await c.ui.get("/ui/rules")).text
    section = page[page.index('id="shadow"') :]
    assert '<span class="bad">not loaded</span>' in section
    assert "the rules in force are not affected" in section
    assert "rules[1].mach: unknown key &#39;mach&#39;" in section


async def test_the_static_files_are_served(open_console: Console) -> None:
    css = await open_console.ui.get("/ui/static/console.css")
    js = await open_console.ui.get("/ui/static/console.js")
    assert css.status_code == js.status_code == 200
    assert "prefers-color-scheme: dark" in css.text
    assert "data-live" in js.text
