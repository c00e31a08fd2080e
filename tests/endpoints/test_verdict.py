"""What to do with an endpoint at its threshold, given its group: every case, no I/O."""

from __future__ import annotations

import pytest

from daemon.endpoints.verdict import judge
from daemon.store.removals import Removal
from daemon.upstream import EndpointRef, URLGroup

A = EndpointRef(name="a", url="https://a.example.com/")
B = EndpointRef(name="b", url="https://b.example.com/")
UNNAMED = EndpointRef(url="https://hooks.example.com/x")


def removal(name: str | None, url: str | None, keep_last: bool = True) -> Removal:
    endpoint = name or url or "?"
    return Removal(1, "orders", endpoint, name, url, "rule", keep_last, "pending", None, 0, "d1")


@pytest.mark.parametrize(
    ("members", "about", "result", "ref"),
    [
        # found by its name, removed by its name
        ((A, B), removal("b", "https://elsewhere/"), "remove", EndpointRef(name="b")),
        # a message without endpointName: found by url; it has a name, removed by it
        ((A, B), removal(None, B.url), "remove", EndpointRef(name="b")),
        # no name in the group either: removed by url
        ((A, UNNAMED), removal(None, UNNAMED.url), "remove", EndpointRef(url=UNNAMED.url)),
        ((A, B), removal("c", "https://c/"), "gone", None),
        ((), removal("a", A.url), "gone", None),
        ((A,), removal("a", A.url), "kept_last", None),
        # two unnamed endpoints with one url: a DELETE by url takes both, the last ones
        ((UNNAMED, UNNAMED), removal(None, UNNAMED.url), "kept_last", None),
        ((A,), removal("a", A.url, keep_last=False), "remove", EndpointRef(name="a")),
    ],
)
def test_the_verdict(
    members: tuple[EndpointRef, ...],
    about: Removal,
    result: str,
    ref: EndpointRef | None,
) -> None:
    verdict = judge(URLGroup(name="orders", endpoints=members), about)
    assert (verdict.result, verdict.ref) == (result, ref)


def test_each_verdict_says_why() -> None:
    group = URLGroup(name="orders", endpoints=(A, B))
    assert judge(group, removal("b", None)).reason == "removed endpoint b from URL Group orders"
    assert judge(group, removal("c", None)).reason == (
        "endpoint c is not in URL Group orders any more: nothing to remove"
    )
    assert judge(URLGroup(name="orders"), removal("c", None)).reason == (
        "URL Group orders does not exist any more: nothing to remove"
    )
    alone = judge(URLGroup(name="orders", endpoints=(A,)), removal("a", None, keep_last=False))
    assert alone.empties_group
    assert alone.reason.endswith("so the service deleted the group (keepLastEndpoint is off)")
