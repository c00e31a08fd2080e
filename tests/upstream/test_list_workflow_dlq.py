"""The client's listing of failed workflow runs, against the emulator: the bulk filter as
query parameters, the cursor followed, the answer typed."""

from __future__ import annotations

import pytest

from daemon.upstream import BulkFilter
from tests.support import Service, workflows


async def test_lists_what_the_filter_selects_page_by_page(service: Service) -> None:
    """Labels OR-ed, dates inclusive, only workflow runs; the cursor walks to the end."""
    await service.seed(
        *workflows(3, labels=["billing"], createdAt=1000),
        *workflows(2, labels=["search"], createdAt=2000),
        *workflows(2, labels=["other"], createdAt=1500),
        *workflows(1, labels=["billing"], createdAt=2001),
        {"url": "https://a.example.com/plain", "labels": ["billing"], "createdAt": 1500},
    )
    selection = BulkFilter(label=("billing", "search"), from_date=1000, to_date=2000)
    first = await service.client.list_workflow_dlq(selection, count=4)
    assert not first.done
    rest = await service.client.list_workflow_dlq(selection, cursor=first.cursor, count=4)
    assert rest.done
    listed = [*first.messages, *rest.messages]
    assert len(listed) == 5
    assert all(message.workflow_run_id and message.created_at for message in listed)
    assert {message.created_at for message in listed} == {1000, 2000}
    assert not [call for call in await service.journal() if call["method"] == "POST"]


async def test_count_is_checked_before_any_call(service: Service) -> None:
    """The listing answers at most 100 a page: asking for more is a mistake of ours."""
    with pytest.raises(ValueError, match="count"):
        await service.client.list_workflow_dlq(BulkFilter(label=("a",)), count=101)
    assert await service.journal() == []
