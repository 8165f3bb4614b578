"""The transport: a keep-alive pool for calls, an aiohttp session for streams,
and requests that raise typed errors.

Everything that talks HTTP goes through :class:`Transport`, so the error
mapping (HTTP answer -> exception class, connection failure ->
:class:`DSecConnectionError`, deadline -> :class:`DSecTimeoutError`) lives in
one place. A client may know several endpoints (apiserver replicas, any of which
serves any request): a call that cannot reach one goes to the next when
sending it again is safe (see :meth:`Transport.request`). The per-call path
is kept short on purpose: exec of ``true`` must
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

__all__ = ["Transport", "Params", "DEFAULT_ENDPOINT", "resolve_endpoint", "resolve_endpoints",
           "resolve_token"]

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
#: Headers that make any request safe to send again, to any replica: the
#: server answers a repeat with the first request's result.
_REPLAY_HEADERS = ("idempotency-key", "x-dsec-step-id")

#: Request heads kept at most (see `request`).
_HEAD_CACHE = 8192

#: Query parameters: a mapping, or pairs (pairs allow repeated keys).
Params = Union[Mapping[str, str], Sequence[tuple[str, str]], None]


def _normalize(ep: str) -> str:
    ep = ep.strip().rstrip("/")
    if "://" not in ep:
        # Let "host:port" work as people type it.
        ep = "http://" + ep
    return ep


def resolve_endpoints(endpoint: str | Sequence[str] | None) -> list[str]:
    """The endpoints to use, in order of preference: the argument (a URL,
    several separated by commas, or a list of them), else ``DSEC_ENDPOINT``
    (one or several, comma-separated), else the default."""
    raw: str | Sequence[str] = endpoint or os.environ.get("DSEC_ENDPOINT") or DEFAULT_ENDPOINT
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    eps = [_normalize(e) for e in items if e and e.strip()]
    if not eps:
        raise ValueError(f"no endpoint in {raw!r}")
    return eps


def resolve_endpoint(endpoint: str | None) -> str:
    """The (first) endpoint to use: the argument, else ``DSEC_ENDPOINT``,
    else the default."""
    return resolve_endpoints(endpoint)[0]


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


class _Origin:
    """One endpoint: where its connections go and the head they carry."""

    __slots__ = ("endpoint", "base", "host", "port", "fixed_head", "pool", "heads")

    def __init__(self, endpoint: str, headers: Mapping[str, str]) -> None:
        self.endpoint = endpoint
        self.base = URL(endpoint)
        host = self.base.host or "127.0.0.1"
        port = self.base.port or (443 if self.base.scheme == "https" else 80)
        authority = host if self.base.is_default_port() else f"{host}:{port}"
        if ":" in host and not host.startswith("["):
            authority = f"[{host}]" if self.base.is_default_port() else f"[{host}]:{port}"
        self.host, self.port = host, port
        # The headers every pooled request carries, encoded once.
        self.fixed_head = "".join(
            f"{k}: {v}\r\n" for k, v in {"Host": authority, **headers}.items())
        self.pool: Pool | None = None
        self.heads: dict[tuple[str, str, bool], bytes] = {}


class Transport:
    """An aiohttp session bound to a token and one or more endpoints.

    Args:
        endpoint: base URL of the dsec API (``http://host:port``), or a list
            of them (replicas of one cluster, tried in turn).
        token: bearer token, or ``None`` to send no Authorization header.
        timeout: default deadline in seconds for control calls (create, get,
            list, stop, files...). ``None`` waits forever.
        connect_timeout: deadline for opening a TCP connection.
        max_connections: size of the connection pool (0 = unlimited).
        ca_cert: PEM file of the CA ``https://`` endpoints are checked
            against; ``None``: the system's trusted roots.
    """

    def __init__(self, endpoint: str | Sequence[str], token: str | None, *,
                 timeout: float | None, connect_timeout: float, max_connections: int,
                 ca_cert: str | None = None) -> None:
        endpoints = [endpoint] if isinstance(endpoint, str) else list(endpoint)
        if not endpoints:
            raise ValueError("no endpoint given")
        #: Every endpoint, in order of preference.
        self.endpoints = endpoints
        self.base = URL(endpoints[0])
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
        self._origins = [_Origin(e, self.headers) for e in endpoints]
        # One TLS context for every connection (pooled calls, aiohttp's
        # streams): made once, since loading roots costs milliseconds. A
        # bad CA file fails here, at construction, with its path.
        self._ssl: ssl.SSLContext | None = None
        if any(o.base.scheme == "https" for o in self._origins):
            self._ssl = ssl.create_default_context(cafile=ca_cert) if ca_cert else ssl.create_default_context()
        # aiohttp's form of it: True is its own default context.
        self._aiohttp_ssl: ssl.SSLContext | bool = self._ssl or True
        # The endpoint calls go to: the last one that answered.
        self._current = 0

    @property
    def endpoint(self) -> str:
        """The endpoint calls go to now."""
        return self._origins[self._current].endpoint

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
            ssl=self._aiohttp_ssl,
        )
        self._session = self._new_session(connector)
        for o in self._origins:
            o.pool = Pool(o.host, o.port,
                          ssl=self._ssl if o.base.scheme == "https" else None,
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
                aiohttp.TCPConnector(limit=self.max_connections, force_close=True,
                                     ssl=self._aiohttp_ssl))
        return s

    async def close(self) -> None:
        """Close the sessions and every pooled connection."""
        for o in self._origins:
            if o.pool is not None:
                o.pool.close()
                o.pool = None
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
        """An absolute URL for an API path that is already percent-encoded
        (on the first endpoint: calls send it to the current one)."""
        return self.base.with_path(self.base.path.rstrip("/") + path, encoded=True)

    def _target(self, o: _Origin, url: URL) -> str:
        """``url``'s path and query as endpoint ``o`` serves them."""
        target = url.raw_path_qs
        first = self.base.raw_path.rstrip("/")
        here = o.base.raw_path.rstrip("/")
        if here != first and target.startswith(first):
            target = here + target[len(first):]
        return target

    def on_current(self, url: URL) -> URL:
        """``url`` (built by :meth:`url`) sent to the current endpoint."""
        return self._on(self._origins[self._current], url)

    def _on(self, o: _Origin, url: URL) -> URL:
        """``url`` (built by :meth:`url`) sent to endpoint ``o``."""
        if o is self._origins[0] or url.origin() != self.base.origin():
            return url
        return URL(str(o.base.origin()) + self._target(o, url), encoded=True)

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
        origins = self._origins
        if len(origins) == 1:
            return await self._send(origins[0], method, url, data, params, headers, timeout,
                                    streamed)
        # Several replicas: a call that cannot reach one goes to the next
        # if sending it twice is harmless (or it was never sent at all).
        safe = not streamed and (method in _IDEMPOTENT or (headers is not None and any(
            h in headers for h in _REPLAY_HEADERS)))
        first = self._current
        for attempt in range(len(origins)):
            i = (first + attempt) % len(origins)
            try:
                answer = await self._send(origins[i], method, url, data, params, headers,
                                          timeout, streamed)
            except DSecConnectionError as e:
                # Refused at connect: the request never left.
                unsent = isinstance(e.__cause__, (ConnectionRefusedError,
                                                  aiohttp.ClientConnectorError))
                if attempt + 1 == len(origins) or not (safe or unsent):
                    raise
                continue
            except DSecError:
                # The replica answered (with an error): it stays current.
                self._current = i
                raise
            self._current = i
            return answer
        raise AssertionError("unreachable")

    async def _send(self, o: _Origin, method: str, url: URL, data: Any, params: Params,
                    headers: Mapping[str, str] | None, timeout: aiohttp.ClientTimeout | None,
                    streamed: bool) -> Any:
        """One request to endpoint ``o``."""
        if streamed or not (data is None or isinstance(data, (bytes, bytearray))):
            return await self._request_aiohttp(method, self._on(o, url), data, params, headers,
                                               timeout, streamed)
        pool = o.pool
        if pool is None:
            await self.ensure_open()
            pool = o.pool
            assert pool is not None
        if params is None and (headers is None or headers is _JSON_HEADERS):
            # The request line and headers of a URL are the same every call:
            # built once (one entry per sandbox and call kind).
            key = (method, url.raw_path_qs, headers is not None)
            prefix = o.heads.get(key)
            if prefix is None:
                if len(o.heads) >= _HEAD_CACHE:
                    o.heads.clear()
                prefix = o.heads[key] = self._head(o, method, self._target(o, url), headers)
        else:
            target = self._target(o, url)
            if params:
                target += (("&" if url.raw_query_string else "?") +
                           urlencode(params, quote_via=quote))
            prefix = self._head(o, method, target, headers)
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
            raise self.connection_error(e, o.endpoint) from e
        if status >= 400:
            raise error_from_body(status, body, CIMultiDict(
                (k.decode("latin-1"), v.decode("latin-1")) for k, v in raw_headers))
        if not body:
            return None
        return _json.loads(body)

    @staticmethod
    def _head(o: _Origin, method: str, target: str, headers: Mapping[str, str] | None) -> bytes:
        """The request line and headers, up to the body's length."""
        head = f"{method} {target} HTTP/1.1\r\n{o.fixed_head}"
        if headers:
            for k, v in headers.items():
                if any(c in k or c in v for c in "\r\n"):
                    raise ValueError(f"header {k!r} has a line break in its name or value")
                head += f"{k}: {v}\r\n"
        return head.encode()

    async def _request_aiohttp(self, method: str, url: URL, data: Any, params: Params,
                               headers: Mapping[str, str] | None,
                               timeout: aiohttp.ClientTimeout | None, streamed: bool) -> Any:
        """A request whose body is a stream or a file: through aiohttp
        (``url`` already on the endpoint it goes to)."""
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
            raise self.connection_error(e, str(url.origin())) from e
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
                method, self.on_current(url), params=params, data=data, headers=headers,
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

    def connection_error(self, e: BaseException, endpoint: str | None = None
                         ) -> DSecConnectionError:
        """The SDK's error for a transport failure ``e`` (at ``endpoint``,
        by default the current one)."""
        return DSecConnectionError(
            "edge_unavailable", f"cannot reach the dsec server at {endpoint or self.endpoint}: "
            f"{type(e).__name__}: {e}")

    @staticmethod
    def dumps(obj: Any) -> str:
        """Compact JSON, as every request body is sent."""
        return _json.dumps(obj).decode()

    # Content types, shared so callers need not build dicts per call.
    JSON_HEADERS = _JSON_HEADERS
    OCTET_HEADERS = _OCTET_HEADERS
    TAR_HEADERS = _TAR_HEADERS
