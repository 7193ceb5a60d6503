"""The server under test comes from the environment: WARREN_URL and WARREN_TOKEN (the
Rust suite's `sdk_python` test starts one and runs pytest against it). Without them
these tests fail rather than skip: a suite that silently tests nothing is a defect."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from warren_sdk import AsyncWarren, Warren


def _server() -> tuple[str, str]:
    url, token = os.environ.get("WARREN_URL"), os.environ.get("WARREN_TOKEN")
    if not url or not token:
        raise RuntimeError("set WARREN_URL and WARREN_TOKEN to the warren server under test")
    return url, token


@pytest.fixture
def warren() -> Iterator[Warren]:
    url, token = _server()
    with Warren(url, token) as client:
        yield client


@pytest.fixture
async def awarren() -> AsyncIterator[AsyncWarren]:
    url, token = _server()
    async with AsyncWarren(url, token) as client:
        yield client


@pytest.fixture
def uid() -> str:
    """A user of this test alone."""
    return f"sdk-{uuid.uuid4().hex[:12]}"
