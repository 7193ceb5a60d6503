"""How a request travels: the Bearer token, the base URL, 503s retried with backoff, and
every error answer turned into a `WarrenError` carrying warren's stable code.

One rule for both clients: `SyncTransport` and `AsyncTransport` share `_prepare`,
`_retry_delay` and `_result`; only the I/O differs.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any, AsyncIterator, Iterator
from urllib.parse import quote

import httpx

# Answers worth asking again: warren says "nothing was half-done, try again shortly"
# (state_store_unavailable, node_unreachable, runtime_moved ...).
RETRYABLE_STATUS = frozenset({503})


class WarrenError(Exception):
    """An error answer of warren's API: `status` (HTTP), `code` (stable, snake_case; the
    list is docs/errors.md) and `message` (what went wrong and what to do)."""

    def __init__(self, status: int, code: str, message: str, detail: dict[str, Any] | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.detail = detail or {}


class Body(bytes):
    """A response's bytes, with the headers that describe them (`etag`, `content_type`)."""

    etag: str | None
    content_type: str | None
    headers: httpx.Headers

    @classmethod
    def of(cls, response: httpx.Response) -> "Body":
        body = cls(response.content)
        body.headers = response.headers
        etag = response.headers.get("etag")
        body.etag = etag.strip('"') if etag else None
        body.content_type = response.headers.get("content-type")
        return body


def _seg(value: object) -> str:
    """A path segment, percent-encoded."""
    return quote(str(value), safe="")


def _clean(mapping: dict[str, Any] | None) -> dict[str, Any] | None:
    if mapping is None:
        return None
    return {key: value for key, value in mapping.items() if value is not None}


def _params(params: dict[str, Any] | None) -> httpx.QueryParams | None:
    if params is None:
        return None
    out: list[tuple[str, str | int | float | bool | None]] = []
    for key, value in params.items():
        if value is None:
            continue
        for item in value if isinstance(value, (list, tuple)) else [value]:
            out.append((key, json.dumps(item) if isinstance(item, bool) else str(item)))
    return httpx.QueryParams(out)


def error_of(response: httpx.Response) -> WarrenError:
    """The `WarrenError` of an error answer (`{"error":{"code","message",...}}`)."""
    try:
        detail = response.json()["error"]
        code, message = detail["code"], detail["message"]
    except (ValueError, KeyError, TypeError):
        code = f"http_{response.status_code}"
        message = response.text[:500] or response.reason_phrase
        detail = {}
    return WarrenError(response.status_code, code, message, detail)


class _Base:
    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float,
        retries: int,
        backoff: float,
        requested_by: str | None,
    ) -> None:
        if not token:
            raise ValueError("a token is needed: pass token= or set WARREN_TOKEN")
        self.url = url.rstrip("/")
        self._token = token
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.requested_by = requested_by

    def __repr__(self) -> str:
        # Never the token.
        return f"{type(self).__name__}(url={self.url!r})"

    def _headers(self, extra: dict[str, Any] | None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self._token}", "User-Agent": "warren-sdk-python"}
        if self.requested_by:
            headers["X-Warren-Requested-By"] = self.requested_by
        for key, value in (extra or {}).items():
            if value is not None:
                headers[key] = str(value)
        return headers

    def _retry_delay(self, attempt: int) -> float:
        return self.backoff * (1 << attempt) * (0.5 + random.random() / 2)

    @staticmethod
    def _result(response: httpx.Response, expect: str) -> Any:
        if response.status_code >= 400:
            raise error_of(response)
        if expect == "none":
            return None
        if expect == "bytes":
            return Body.of(response)
        if expect == "json" or response.headers.get("content-type", "").startswith("application/json"):
            return response.json() if response.content else None
        return Body.of(response)


class SyncTransport(_Base):
    """Blocking requests on one `httpx.Client` (its connections kept alive)."""

    def __init__(self, url: str, token: str, *, timeout: float = 300.0, retries: int = 4,
                 backoff: float = 0.25, requested_by: str | None = None,
                 client: httpx.Client | None = None) -> None:
        super().__init__(url, token, timeout=timeout, retries=retries, backoff=backoff,
                         requested_by=requested_by)
        self._client = client or httpx.Client(timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def send(self, method: str, path: str, *, params: dict[str, Any] | None = None,
             json: dict[str, Any] | None = None, content: bytes | None = None,
             headers: dict[str, Any] | None = None) -> httpx.Response:
        for attempt in range(self.retries + 1):
            response = self._client.request(
                method, self.url + path, params=_params(params), json=_clean(json),
                content=content, headers=self._headers(headers))
            if response.status_code not in RETRYABLE_STATUS or attempt == self.retries:
                return response
            time.sleep(self._retry_delay(attempt))
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, *, expect: str, **kwargs: Any) -> Any:
        return self._result(self.send(method, path, **kwargs), expect)

    def stream_lines(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                     json: dict[str, Any] | None = None, headers: dict[str, Any] | None = None
                     ) -> Iterator[dict[str, Any]]:
        """The NDJSON events of a streaming answer, as they arrive."""
        all_headers = self._headers({**(headers or {}), "Accept": "application/x-ndjson"})
        with self._client.stream(method, self.url + path, params=_params(params), json=_clean(json),
                                 headers=all_headers, timeout=httpx.Timeout(self.timeout, read=None)) as response:
            if response.status_code >= 400:
                response.read()
                raise error_of(response)
            for line in response.iter_lines():
                if line.strip():
                    yield _loads(line)


class AsyncTransport(_Base):
    """Requests on one `httpx.AsyncClient`."""

    def __init__(self, url: str, token: str, *, timeout: float = 300.0, retries: int = 4,
                 backoff: float = 0.25, requested_by: str | None = None,
                 client: httpx.AsyncClient | None = None) -> None:
        super().__init__(url, token, timeout=timeout, retries=retries, backoff=backoff,
                         requested_by=requested_by)
        self._client = client or httpx.AsyncClient(timeout=timeout)

    async def close(self) -> None:
        await self._client.aclose()

    async def send(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                   json: dict[str, Any] | None = None, content: bytes | None = None,
                   headers: dict[str, Any] | None = None) -> httpx.Response:
        for attempt in range(self.retries + 1):
            response = await self._client.request(
                method, self.url + path, params=_params(params), json=_clean(json),
                content=content, headers=self._headers(headers))
            if response.status_code not in RETRYABLE_STATUS or attempt == self.retries:
                return response
            await asyncio.sleep(self._retry_delay(attempt))
        raise AssertionError("unreachable")

    async def request(self, method: str, path: str, *, expect: str, **kwargs: Any) -> Any:
        return self._result(await self.send(method, path, **kwargs), expect)

    async def stream_lines(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                           json: dict[str, Any] | None = None, headers: dict[str, Any] | None = None
                           ) -> AsyncIterator[dict[str, Any]]:
        """The NDJSON events of a streaming answer, as they arrive."""
        all_headers = self._headers({**(headers or {}), "Accept": "application/x-ndjson"})
        async with self._client.stream(method, self.url + path, params=_params(params), json=_clean(json),
                                       headers=all_headers, timeout=httpx.Timeout(self.timeout, read=None)) as response:
            if response.status_code >= 400:
                await response.aread()
                raise error_of(response)
            async for line in response.aiter_lines():
                if line.strip():
                    yield _loads(line)


def _loads(line: str) -> dict[str, Any]:
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ValueError(f"a streamed event is not an object: {line[:200]}")
    return value
