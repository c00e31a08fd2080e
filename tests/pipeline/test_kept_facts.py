"""Every decision is recorded with the facts it read (fields.kept), "no rule matched"
included: replay reads them back from the store and decides as the daemon did."""

from __future__ import annotations

from pathlib import Path

from daemon.rules import parse_rules
from daemon.rules.fields import unkept
from tests.pipeline.support import harness
from tests.support import workflows

BY_BODY = """\
version: 1
rules:
  - name: invoices
    match: {workflow: true, body: {contains: invoice}}
    action: resume
    batch: {maxSize: 10, maxWait: 100ms}
  - name: health
    match: {url: {suffix: /health}}
    action: ignore
"""


async def test_the_decisions_keep_the_facts_they_were_made_from(
    tmp_path: Path, store: dict[str, str]
) -> None:
    """On both stores: the kept facts decide each record as its recorded rule did."""
    messages = [
        *workflows(3, body='{"invoice": 7}'),
        {"url": "https://app.example.com/health", "body": "ping"},
        {"url": "https://app.example.com/other", "responseStatus": 500},
    ]
    async with harness(tmp_path, BY_BODY, **store) as h:
        dlq_ids = await h.seed(messages)
        await h.send_callbacks(dlq_ids)
        await h.settled(len(dlq_ids))
        rows = await h.recoveryd.daemon.store.replay_rows(None, None, 100)
    ruleset = parse_rules(BY_BODY)
    assert sorted(row.dlq_id for row in rows) == sorted(dlq_ids)
    recorded = {row.dlq_id: row.rule for row in rows}
    assert sorted(map(str, recorded.values())) == ["None", "health", *["invoices"] * 3]
    for row in rows:
        facts = unkept(row.facts)
        assert facts["dlqId"] == row.dlq_id
        decided = ruleset.decide(facts).rule
        assert (decided.name if decided else None) == row.rule
        if row.rule == "invoices":  # a rule reads the body: it is kept
            assert facts["body"] == '{"invoice": 7}'
            assert row.overrides == "{}"
