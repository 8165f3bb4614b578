"""Fixtures of the E2B compatibility tests: the unmodified ``e2b`` SDK from
PyPI, pointed at the server only through its environment (API and sandbox
URL on the same listener, a dsec token as the API key), exactly as a user of
E2B's SDK would. What is covered: docs/e2b.md.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2b import Sandbox

from ..conftest import Server, Tenant


@pytest.fixture(autouse=True)
def e2b_env(monkeypatch: pytest.MonkeyPatch, server: Server, tenant: Tenant) -> None:
    monkeypatch.setenv("E2B_API_URL", server.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", server.url)
    monkeypatch.setenv("E2B_API_KEY", tenant.token)
    monkeypatch.setenv("E2B_VALIDATE_API_KEY", "false")
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
    monkeypatch.delenv("E2B_DEBUG", raising=False)


@pytest.fixture
def sbx(image: str) -> Iterator[Sandbox]:
    s = Sandbox.create(template=image, timeout=120, metadata={"suite": "e2b"})
    try:
        yield s
    finally:
        s.kill()
