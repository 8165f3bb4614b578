"""Fixtures of the unit tests: a fake dsec server on 127.0.0.1 and clients of it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from dsec import DSecClient

from .fake_server import TOKEN, FakeDSec


@pytest.fixture
def fake() -> Iterator[FakeDSec]:
    server = FakeDSec().start()
    try:
        yield server
    finally:
        server.stop()
    problems = server.contract.problems
    assert not problems, "the fake's traffic breaks dsec/openapi.json:\n" + "\n".join(problems)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's own settings must not leak into tests.
    for name in ("DSEC_ENDPOINT", "DSEC_TOKEN", "DSEC_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def client(fake: FakeDSec) -> AsyncIterator[DSecClient]:
    async with DSecClient(fake.url, TOKEN) as c:
        yield c
