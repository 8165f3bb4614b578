"""The transport: one aiohttp session, and requests that raise typed errors.

Everything that talks HTTP goes through :class:`Transport`, so the error
mapping (HTTP answer -> exception class, connection failure ->
:class:`DSecConnectionError`, deadline -> :class:`DSecTimeoutError`) lives in
one place. The per-call path is kept short on purpose: exec of ``true`` must
cost well under a millisecond of client time, so headers, URLs and timeout
objects are built once and reused.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Union
from urllib.parse import quote

import aiohttp
from yarl import URL

from .errors import (
    DSecConnectionError,
    DSecError,
    DSecTimeoutError,
    Unauthorized,
    error_from_body,
)

__all__ = ["Transport", "Params", "DEFAULT_ENDPOINT", "resolve_endpoint", "resolve_token"]

#: Used when neither the ``endpoint`` argument nor ``DSEC_ENDPOINT`` is set.
DEFAULT_ENDPOINT = "http://127.0.0.1:8080"

_USER_AGENT = "dsec-python/0.1"
_JSON_HEADERS = {"Content-Type": "application/json"}
_OCTET_HEADERS = {"Content-Type": "application/octet-stream"}
_TAR_HEADERS = {"Content-Type": "application/x-tar"}

#: Query parameters: a mapping, or pairs (pairs allow repeated keys).
Params = Union[Mapping[str, str], Sequence[tuple[str, str]], None]


def resolve_endpoint(endpoint: str | None) -> str:
    """The endpoint to use: the argument, else ``DSEC_ENDPOINT``, else the default."""
    ep = endpoint or os.environ.get("DSEC_ENDPOINT") or DEFAULT_ENDPOINT
    ep = ep.strip().rstrip("/")
    if "://" not in ep:
        # Let "host:port" work as people type it.
        ep = "http://" + ep
    return ep


def resolve_token(token: str | None) -> str | None:
    """The token to use: the argument, else ``DSEC_TOKEN``, else the content of
    the file named by ``DSEC_TOKEN_FILE``, else ``None`` (no Authorization)."""
    if token:
        return token
    env = os.environ.get("DSEC_TOKEN")
    if env:
        return env.strip()
    path = os.environ.get("DSEC_TOKEN_FILE")
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                value = f.read().strip()
        except OSError as e:
            raise Unauthorized("unauthorized", f"cannot read DSEC_TOKEN_FILE {path!r}: {e}") from e
        return value or None
    return None


def _raise_nofile_limit(wanted: int) -> None:
    """Raise the soft open-files limit towards ``wanted`` (best effort).

    One connection per concurrent sandbox call means a process driving 1,000
    sandboxes needs more descriptors than the common default soft limit of 1024.
    """
    if sys.platform == "win32":
        return
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < wanted:
            target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
            if target > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ImportError, ValueError, OSError):
        pass


class Transport:
    """An aiohttp session bound to one endpoint and token.

    Args:
        endpoint: base URL of the dsec API (``http://host:port``).
        token: bearer token, or ``None`` to send no Authorization header.
        timeout: default deadline in seconds for control calls (create, get,
            list, stop, files...). ``None`` waits forever.
        connect_timeout: deadline for opening a TCP connection.
        max_connections: size of the connection pool (0 = unlimited).
    """

    def __init__(self, endpoint: str, token: str | None, *, timeout: float | None,
                 connect_timeout: float, max_connections: int) -> None:
        self.endpoint = endpoint
        self.base = URL(endpoint)
        self.token = token
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        # Chunked uploads get connections of their own, never pooled: see
        # `streamed_session`.
        self._streamed_session: aiohttp.ClientSession | None = None
        self._default_timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=connect_timeout)
        # For calls whose length the caller bounds some other way (exec without
        # a timeout, streams, big downloads): only connecting is bounded.
        self.unbounded_timeout = aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout)
        self.connect_timeout = connect_timeout
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self.headers: dict[str, str] = {"User-Agent": _USER_AGENT}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"

    # --- lifecycle -----------------------------------------------------------

    @property
    def is_open(self) -> bool:
        """True between :meth:`open` and :meth:`close`."""
        return self._session is not None and not self._session.closed

    async def open(self) -> None:
        """Create the session (idempotent). Must run inside the event loop that
        will use it."""
        if self.is_open:
            return
        if self.max_connections:
            _raise_nofile_limit(self.max_connections + 256)
        connector = aiohttp.TCPConnector(
            limit=self.max_connections,
            limit_per_host=0,
            keepalive_timeout=60,
            ttl_dns_cache=300,
        )
        self._session = self._new_session(connector)

    def _new_session(self, connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            headers=self.headers,
            timeout=self._default_timeout,
            # The SDK handles statuses itself and needs no proxy or netrc
            # look-ups on every request.
            raise_for_status=False,
            trust_env=False,
            auto_decompress=True,
        )

    async def streamed_session(self) -> aiohttp.ClientSession:
        """The session for request bodies of unknown length (chunked).

        The server may answer such an upload before its end (413 at the size
        limit) and close the connection. aiohttp (3.14) then still puts that
        connection back in its pool, and the next request on it (an exec,
        say) fails with "Server disconnected". Here every connection closes
        after its request: one more TCP handshake per upload, nothing shared.
        """
        s = self._streamed_session
        if s is None or s.closed:
            await self.ensure_open()
            s = self._streamed_session = self._new_session(
                aiohttp.TCPConnector(limit=self.max_connections, force_close=True))
        return s

    async def close(self) -> None:
        """Close the sessions and every pooled connection."""
        for session in (self._session, self._streamed_session):
            if session is not None and not session.closed:
                await session.close()
        self._session = self._streamed_session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The open session (raises if the client was not opened)."""
        s = self._session
        if s is None or s.closed:
            raise RuntimeError("the dsec client is not open: call `await client.open()` "
                               "or use `async with DSecClient() as client`")
        return s

    async def ensure_open(self) -> aiohttp.ClientSession:
        """The session, opening it first if needed (the SDK opens lazily too)."""
        s = self._session
        if s is None or s.closed:
            await self.open()
            s = self._session
            assert s is not None
        return s

    # --- URLs ----------------------------------------------------------------

    def url(self, path: str) -> URL:
        """An absolute URL for an API path that is already percent-encoded."""
        return self.base.with_path(self.base.path.rstrip("/") + path, encoded=True)

    @staticmethod
    def quote(segment: str) -> str:
        """Percent-encode one path segment (ids, image names)."""
        return quote(segment, safe="")

    # --- requests --------------------------------------------------------------

    def timeout_for(self, seconds: float | None, grace: float = 0.0) -> aiohttp.ClientTimeout:
        """A request deadline of ``seconds + grace``; ``None`` = the unbounded one."""
        if seconds is None:
            return self.unbounded_timeout
        key = seconds + grace
        t = self._timeouts.get(key)
        if t is None:
            # Callers reuse a handful of deadlines; keep one object per value.
            if len(self._timeouts) > 256:
                self._timeouts.clear()
            t = self._timeouts[key] = aiohttp.ClientTimeout(total=key,
                                                            sock_connect=self.connect_timeout)
        return t

    async def request(
        self,
        method: str,
        url: URL,
        *,
        json_body: Any = None,
        data: Any = None,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
        streamed: bool = False,
    ) -> Any:
        """Send a request and return the decoded JSON answer (``None`` if empty).

        ``streamed``: ``data`` is a stream of unknown length (see
        :meth:`streamed_session`). Raises the exception class of the answer's
        error code for any status of 400 and above.
        """
        session = self._session
        if streamed:
            session = await self.streamed_session()
        elif session is None or session.closed:
            session = await self.ensure_open()
        if json_body is not None:
            data = json.dumps(json_body, separators=(",", ":")).encode()
            headers = _JSON_HEADERS if headers is None else {**headers, **_JSON_HEADERS}
        try:
            async with session.request(
                method, url, data=data, params=params, headers=headers,
                timeout=timeout or self._default_timeout,
            ) as resp:
                body = await resp.read()
                if resp.status >= 400:
                    raise error_from_body(resp.status, body, resp.headers)
        except DSecError:
            raise
        except asyncio.TimeoutError as e:
            raise DSecTimeoutError("timeout", f"{method} {url.path}: no answer in time") from e
        except aiohttp.ClientError as e:
            raise self.connection_error(e) from e
        if not body:
            return None
        return json.loads(body)

    @asynccontextmanager
    async def stream(
        self,
        method: str,
        url: URL,
        *,
        params: Params = None,
        data: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: aiohttp.ClientTimeout | None = None,
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """Send a request and yield the response with its body still unread,
        for downloads that go to disk chunk by chunk. Errors are raised before
        the body is yielded."""
        session = await self.ensure_open()
        try:
            async with session.request(
                method, url, params=params, data=data, headers=headers,
                timeout=timeout or self.unbounded_timeout,
            ) as resp:
                if resp.status >= 400:
                    raise error_from_body(resp.status, await resp.read(), resp.headers)
                yield resp
        except DSecError:
            raise
        except asyncio.TimeoutError as e:
            raise DSecTimeoutError("timeout", f"{method} {url.path}: no answer in time") from e
        except aiohttp.ClientError as e:
            raise self.connection_error(e) from e

    def connection_error(self, e: BaseException) -> DSecConnectionError:
        """The SDK's error for a transport failure ``e``."""
        return DSecConnectionError(
            "edge_unavailable", f"cannot reach the dsec server at {self.endpoint}: "
            f"{type(e).__name__}: {e}")

    @staticmethod
    def dumps(obj: Any) -> str:
        """Compact JSON, as every request body is sent."""
        return json.dumps(obj, separators=(",", ":"))

    # Content types, shared so callers need not build dicts per call.
    JSON_HEADERS = _JSON_HEADERS
    OCTET_HEADERS = _OCTET_HEADERS
    TAR_HEADERS = _TAR_HEADERS
