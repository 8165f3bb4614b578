"""The transport: a keep-alive pool for calls, an aiohttp session for streams,
and requests that raise typed errors.

Everything that talks HTTP goes through :class:`Transport`, so the error
mapping (HTTP answer -> exception class, connection failure ->
:class:`DSecConnectionError`, deadline -> :class:`DSecTimeoutError`) lives in
one place. The per-call path is kept short on purpose: exec of ``true`` must
cost well under a millisecond of client time, so headers, URLs and timeout
objects are built once and reused. Request/answer calls go through
:mod:`._pool` (one pre-built write, the answer parsed in the protocol);
streams, WebSockets, uploads of unknown length and downloads use aiohttp.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, Union
from urllib.parse import quote, urlencode

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from . import _json
from ._pool import Pool, ProtocolError
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

#: Methods sent with ``Content-Length: 0`` when they have no body.
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
#: Methods a pooled call may send again on a fresh connection when the
#: reused one turns out closed (RFC 9110 9.2.2).
_IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})

#: Request heads kept at most (see `request`).
_HEAD_CACHE = 8192

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
        self._pool: Pool | None = None
        self._heads: dict[tuple[str, URL, bool], bytes] = {}
        # The headers every pooled request carries, encoded once.
        host = self.base.host or "127.0.0.1"
        port = self.base.port or (443 if self.base.scheme == "https" else 80)
        authority = host if self.base.is_default_port() else f"{host}:{port}"
        if ":" in host and not host.startswith("["):
            authority = f"[{host}]" if self.base.is_default_port() else f"[{host}]:{port}"
        self._host, self._port = host, port
        self._fixed_head = "".join(
            f"{k}: {v}\r\n" for k, v in {"Host": authority, **self.headers}.items())

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
        self._pool = Pool(self._host, self._port,
                          ssl=ssl.create_default_context() if self.base.scheme == "https"
                          else None,
                          limit=self.max_connections, connect_timeout=self.connect_timeout)

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
        if self._pool is not None:
            self._pool.close()
            self._pool = None
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
        if json_body is not None:
            data = _json.dumps(json_body)
            headers = _JSON_HEADERS if headers is None else {**headers, **_JSON_HEADERS}
        if streamed or not (data is None or isinstance(data, (bytes, bytearray))):
            return await self._request_aiohttp(method, url, data, params, headers, timeout,
                                               streamed)
        pool = self._pool
        if pool is None:
            await self.ensure_open()
            pool = self._pool
            assert pool is not None
        if params is None and (headers is None or headers is _JSON_HEADERS):
            # The request line and headers of a URL are the same every call:
            # built once (one entry per sandbox and call kind).
            key = (method, url, headers is not None)
            prefix = self._heads.get(key)
            if prefix is None:
                if len(self._heads) >= _HEAD_CACHE:
                    self._heads.clear()
                prefix = self._heads[key] = self._head(method, url.raw_path_qs, headers)
        else:
            target = url.raw_path_qs
            if params:
                target += (("&" if url.raw_query_string else "?") +
                           urlencode(params, quote_via=quote))
            prefix = self._head(method, target, headers)
        if data:
            wire = b"%sContent-Length: %d\r\n\r\n%s" % (prefix, len(data), data)
        else:
            wire = prefix + (b"Content-Length: 0\r\n\r\n" if method in _BODY_METHODS
                             else b"\r\n")
        total = (timeout or self._default_timeout).total
        try:
            status, raw_headers, body = await pool.request(
                wire, total, head_request=method == "HEAD", idempotent=method in _IDEMPOTENT)
        except asyncio.TimeoutError as e:
            raise DSecTimeoutError("timeout", f"{method} {url.path}: no answer in time") from e
        except (OSError, ProtocolError) as e:
            raise self.connection_error(e) from e
        if status >= 400:
            raise error_from_body(status, body, CIMultiDict(
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in raw_headers))
        if not body:
            return None
        return _json.loads(body)

    def _head(self, method: str, target: str, headers: Mapping[str, str] | None) -> bytes:
        """The request line and headers, up to the body's length."""
        head = f"{method} {target} HTTP/1.1\r\n{self._fixed_head}"
        if headers:
            for k, v in headers.items():
                if any(c in k or c in v for c in "\r\n"):
                    raise ValueError(f"header {k!r} has a line break in its name or value")
                head += f"{k}: {v}\r\n"
        return head.encode()

    async def _request_aiohttp(self, method: str, url: URL, data: Any, params: Params,
                               headers: Mapping[str, str] | None,
                               timeout: aiohttp.ClientTimeout | None, streamed: bool) -> Any:
        """A request whose body is a stream or a file: through aiohttp."""
        session = self._session
        if streamed:
            session = await self.streamed_session()
        elif session is None or session.closed:
            session = await self.ensure_open()
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
        return _json.loads(body)

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
        return _json.dumps(obj).decode()

    # Content types, shared so callers need not build dicts per call.
    JSON_HEADERS = _JSON_HEADERS
    OCTET_HEADERS = _OCTET_HEADERS
    TAR_HEADERS = _TAR_HEADERS
