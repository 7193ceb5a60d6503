"""The transport's own rules, on httpx's in-process transport: a 503 is asked again with
backoff, other errors are not, and an answer that is not warren's JSON still raises."""

from __future__ import annotations

import httpx
import pytest

from warren_sdk import AsyncWarren, Warren, WarrenError

UNAVAILABLE = {"error": {"code": "state_store_unavailable", "message": "try again shortly"}}


def _client(answers: list[httpx.Response], seen: list[httpx.Request]) -> Warren:
    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    http = httpx.Client(transport=httpx.MockTransport(handler))
    return Warren("http://warren.test", "t" * 40, backoff=0.001, retries=3, http_client=http)


def test_a_503_is_retried_until_an_answer_comes():
    seen: list[httpx.Request] = []
    client = _client([httpx.Response(503, json=UNAVAILABLE)] * 2 + [httpx.Response(200, json={"status": "ok"})], seen)
    assert client.server.health() == {"status": "ok"}
    assert len(seen) == 3
    assert all(r.headers["authorization"] == "Bearer " + "t" * 40 for r in seen)


def test_retries_end_with_the_last_errors_code():
    seen: list[httpx.Request] = []
    client = _client([httpx.Response(503, json=UNAVAILABLE)] * 4, seen)
    with pytest.raises(WarrenError) as failed:
        client.server.health()
    assert (failed.value.status, failed.value.code, len(seen)) == (503, "state_store_unavailable", 4)


def test_a_refusal_is_not_retried_and_a_foreign_error_body_still_raises():
    seen: list[httpx.Request] = []
    client = _client([httpx.Response(409, json={"error": {"code": "fence_stale", "message": "m"}}),
                      httpx.Response(502, text="bad gateway")], seen)
    with pytest.raises(WarrenError) as refused:
        client.sandboxes.kill("sbx-1")
    assert (refused.value.code, len(seen)) == ("fence_stale", 1)
    with pytest.raises(WarrenError) as foreign:
        client.sandboxes.kill("sbx-1")
    assert (foreign.value.status, foreign.value.code) == (502, "http_502")


def test_path_segments_and_query_values_are_encoded():
    seen: list[httpx.Request] = []
    client = _client([httpx.Response(200, json={"env": {}})] * 2, seen)
    client.env.get("a/b c")
    assert seen[0].url.raw_path == b"/v1/users/a%2Fb%20c/env"
    client.transport.request("GET", "/v1/x", params={"recursive": True, "label": ["a=1", "b=2"]}, expect="json")
    assert seen[1].url.query == b"recursive=true&label=a%3D1&label=b%3D2"


def test_a_client_without_a_token_is_refused_at_once(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("WARREN_TOKEN", raising=False)
    with pytest.raises(ValueError, match="WARREN_TOKEN"):
        Warren("http://warren.test")


async def test_the_async_client_retries_too():
    answers = [httpx.Response(503, json=UNAVAILABLE), httpx.Response(200, json={"status": "ok"})]

    async def handler(request: httpx.Request) -> httpx.Response:
        return answers.pop(0)

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    async with AsyncWarren("http://warren.test", "t" * 40, backoff=0.001, http_client=http) as client:
        assert await client.server.health() == {"status": "ok"}
    assert answers == []
