"""URL Groups: remove endpoints (spec 4.3), and QStash's read and add."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.emulator.support import START

GROUP = {
    "name": "orders",
    "endpoints": [
        {"name": "fulfilment", "url": "https://f.example.com/hook"},
        {"url": "https://legacy.example.com/hook"},
    ],
}


@pytest.fixture
async def orders(client: httpx.AsyncClient) -> None:
    response = await client.post("/_emulator/url-groups", json=GROUP)
    assert response.status_code == 200


async def remove(client: httpx.AsyncClient, name: str, body: Any) -> httpx.Response:
    return await client.request("DELETE", f"/v2/topics/{name}/endpoints", json=body)


@pytest.mark.usefixtures("orders")
async def test_group_reads_with_name_dates_and_endpoints(client: httpx.AsyncClient) -> None:
    """QStash's group record; an endpoint without a name has no name field."""
    group = (await client.get("/v2/topics/orders")).json()
    assert group == {
        "name": "orders",
        "createdAt": int(START * 1000),
        "updatedAt": int(START * 1000),
        "endpoints": GROUP["endpoints"],
    }


async def test_unknown_group_is_404(client: httpx.AsyncClient) -> None:
    """Reading a group that does not exist."""
    assert (await client.get("/v2/topics/none")).status_code == 404


@pytest.mark.usefixtures("orders")
async def test_endpoint_is_removed_by_name(client: httpx.AsyncClient) -> None:
    """An item with a name removes the endpoint of that name."""
    assert (await remove(client, "orders", {"endpoints": [{"name": "fulfilment"}]})).is_success
    endpoints = (await client.get("/v2/topics/orders")).json()["endpoints"]
    assert endpoints == [{"url": "https://legacy.example.com/hook"}]


@pytest.mark.usefixtures("orders")
async def test_endpoint_is_removed_by_url(client: httpx.AsyncClient) -> None:
    """An item with a url removes the endpoint at that url."""
    body = {"endpoints": [{"url": "https://legacy.example.com/hook"}]}
    assert (await remove(client, "orders", body)).is_success
    endpoints = (await client.get("/v2/topics/orders")).json()["endpoints"]
    assert [e["name"] for e in endpoints] == ["fulfilment"]


@pytest.mark.usefixtures("orders")
async def test_removal_answers_an_empty_200(client: httpx.AsyncClient) -> None:
    """As QStash, the removal's answer has no body."""
    response = await remove(client, "orders", {"endpoints": [{"name": "fulfilment"}]})
    assert (response.status_code, response.content) == (200, b"")


@pytest.mark.usefixtures("orders")
async def test_removing_the_last_endpoint_deletes_the_group(client: httpx.AsyncClient) -> None:
    """With all its endpoints gone, the group is gone (spec 4.3)."""
    body = {"endpoints": [{"name": "fulfilment"}, {"url": "https://legacy.example.com/hook"}]}
    assert (await remove(client, "orders", body)).status_code == 200
    assert (await client.get("/v2/topics/orders")).status_code == 404
    assert (await client.get("/_emulator/url-groups")).json() == []


@pytest.mark.usefixtures("orders")
async def test_endpoint_not_in_the_group_is_ignored(client: httpx.AsyncClient) -> None:
    """As QStash, naming an endpoint the group lacks is no error and changes nothing."""
    response = await remove(client, "orders", {"endpoints": [{"name": "ghost"}]})
    assert response.status_code == 200
    assert len((await client.get("/v2/topics/orders")).json()["endpoints"]) == 2


async def test_removing_from_a_missing_group_is_404(client: httpx.AsyncClient) -> None:
    """The group must exist."""
    response = await remove(client, "none", {"endpoints": [{"name": "a"}]})
    assert response.status_code == 404


@pytest.mark.usefixtures("orders")
@pytest.mark.parametrize(
    "body", [{}, {"endpoints": "fulfilment"}, {"endpoints": [{}]}, {"endpoints": [{"x": 1}]}]
)
async def test_malformed_removal_is_400(client: httpx.AsyncClient, body: Any) -> None:
    """Without an `endpoints` list of items with name or url, nothing is removed."""
    response = await remove(client, "orders", body)
    assert response.status_code == 400
    assert "error" in response.json()


@pytest.mark.usefixtures("orders")
async def test_removal_body_that_is_not_json_is_400(client: httpx.AsyncClient) -> None:
    """A body that does not parse is a 400."""
    response = await client.request("DELETE", "/v2/topics/orders/endpoints", content=b"{nope")
    assert response.status_code == 400


async def test_adding_endpoints_creates_the_group(client: httpx.AsyncClient) -> None:
    """QStash's add makes a missing group."""
    body = {"endpoints": [{"name": "a", "url": "https://a.example.com"}]}
    assert (await client.post("/v2/topics/new/endpoints", json=body)).status_code == 200
    group = (await client.get("/v2/topics/new")).json()
    assert group["endpoints"] == [{"name": "a", "url": "https://a.example.com"}]


async def test_adding_an_endpoint_without_url_is_400(client: httpx.AsyncClient) -> None:
    """An endpoint to add needs its url."""
    response = await client.post("/v2/topics/new/endpoints", json={"endpoints": [{"name": "a"}]})
    assert response.status_code == 400


async def test_group_routes_need_the_token(anonymous: httpx.AsyncClient) -> None:
    """Group operations are message operations: bearer auth."""
    response = await anonymous.request(
        "DELETE", "/v2/topics/orders/endpoints", json={"endpoints": [{"name": "a"}]}
    )
    assert response.status_code == 401
