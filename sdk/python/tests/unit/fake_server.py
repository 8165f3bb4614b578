"""A small in-memory stand-in for the dsec API, for unit tests only.

It follows docs/api.md closely enough to exercise the SDK's wire handling
(bodies, query strings, status codes, error bodies, WebSocket frames, tar
streams). It runs in its own thread with its own event loop, so both the
asyncio SDK and the blocking wrapper can talk to it from the test thread.
It does not run anything: commands are answered from a tiny script table.

Every request it gets and every answer it gives is checked against the
API's OpenAPI document (``openapi_contract``); the ``fake`` fixture fails a
test whose traffic the document does not allow.
"""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
import threading
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web

from .openapi_contract import Contract

TOKEN = "good-token"


def err(status: int, code: str, message: str, headers: dict[str, str] | None = None
        ) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status,
                             headers=headers)


def exec_response(exit_code: int = 0, stdout: str = "", stderr: str = "", **kw: Any
                  ) -> dict[str, Any]:
    d = {"exit_code": exit_code, "signal": None, "stdout": stdout, "stderr": stderr,
         "encoding": "utf8", "duration_ms": 1.5, "truncated": False, "timed_out": False}
    d.update(kw)
    return d


@dataclass
class FakeSandbox:
    id: str
    body: dict[str, Any]
    state: str = "running"
    files: dict[str, bytes] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=lambda: {"/", "/tmp"})
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        b = self.body
        return {
            "id": self.id, "backend": b.get("backend", "container"), "image": b["image"],
            "workspace": b.get("workspace"), "toolkits": b.get("toolkits", []),
            "state": self.state, "state_reason": None, "node": "node-1",
            "limits": {"memory_limit_mb": b.get("memory_limit_mb", 512),
                       "cpu_cores_limit": b.get("cpu_cores_limit", 1.0),
                       "disk_limit_mb": 1024, "pids_limit": 256},
            "qos_class": b.get("qos_class", "latency_sensitive"),
            "init_user": b.get("init_user", "root"),
            "ttl_running_stop": b.get("ttl_running_stop", 600), "max_lifetime_s": 0,
            "labels": b.get("labels", {}), "job": b.get("job"),
            "created_at": "2026-01-01T00:00:00Z", "last_active_at": "2026-01-01T00:00:00Z",
            "stopped_at": None, "create_ms": 12.5,
            "a_field_from_a_newer_server": True,
        }


class FakeDSec:
    """The fake server; ``url`` is its endpoint once started."""

    def __init__(self) -> None:
        self.sandboxes: dict[str, FakeSandbox] = {}
        self.volumes: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, Any]] = []  # (method, path_qs, body)
        self.headers: list[dict[str, str]] = []
        self.next_id = 0
        #: Idempotency key -> the sandbox its first creation made.
        self.keys: dict[str, str] = {}
        self.loop = asyncio.new_event_loop()
        self.url = ""
        #: The OpenAPI document's checks of this server's traffic.
        self.contract = Contract()
        self.app: web.Application | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._runner: web.AppRunner | None = None

    # --- plumbing ----------------------------------------------------------------

    def start(self) -> FakeDSec:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def stop(self) -> None:
        async def down() -> None:
            assert self._runner is not None
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(down(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._start())
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        app = self.app = web.Application(middlewares=[self._check, self._auth],
                                         client_max_size=64 << 20)
        r = app.router
        r.add_get("/healthz", self.healthz)
        r.add_post("/v1/sandboxes", self.create)
        r.add_get("/v1/sandboxes", self.list)
        r.add_get("/v1/sandboxes/{id}", self.get)
        r.add_delete("/v1/sandboxes/{id}", self.delete)
        r.add_patch("/v1/sandboxes/{id}", self.update)
        r.add_post("/v1/sandboxes/{id}/stop", self.stop_sb)
        r.add_post("/v1/sandboxes/{id}/exec", self.exec)
        r.add_get("/v1/sandboxes/{id}/exec/stream", self.exec_stream)
        r.add_get("/v1/sandboxes/{id}/pty", self.pty)
        r.add_post("/v1/sandboxes/{id}/sessions", self.create_session)
        r.add_delete("/v1/sandboxes/{id}/sessions/{sid}", self.delete_session)
        r.add_get("/v1/sandboxes/{id}/files", self.read_file)
        r.add_put("/v1/sandboxes/{id}/files", self.write_file)
        r.add_delete("/v1/sandboxes/{id}/files", self.remove)
        r.add_get("/v1/sandboxes/{id}/files/stat", self.stat)
        r.add_get("/v1/sandboxes/{id}/files/list", self.list_dir)
        r.add_post("/v1/sandboxes/{id}/files/mkdir", self.mkdir)
        r.add_get("/v1/sandboxes/{id}/archive", self.get_archive)
        r.add_put("/v1/sandboxes/{id}/archive", self.put_archive)
        r.add_post("/v1/tenants", self.create_tenant)
        r.add_get("/v1/images", self.images)
        r.add_post("/v1/volumes", self.create_volume)
        r.add_get("/v1/volumes", self.list_volumes)
        r.add_delete("/v1/volumes/{name}", self.delete_volume)
        r.add_get("/v1/proxy-page", self.proxy_page)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    @web.middleware
    async def _check(self, request: web.Request, handler: Any) -> web.StreamResponse:
        resource = request.match_info.route.resource
        route = None if resource is None else resource.canonical
        body = await request.read() if request.body_exists else None
        # The raw path keeps an escaped "/" inside its segment.
        self.contract.check_request(request.method, request.raw_path.split("?", 1)[0], route,
                                    list(request.query), request.headers.get("Content-Type"), body)
        resp: web.StreamResponse = await handler(request)
        if route is not None:
            # Streamed answers (downloads, WebSockets) went out already: only
            # their status and content type are checked.
            sent = resp.body if isinstance(resp, web.Response) else None
            kind = None if isinstance(resp, web.WebSocketResponse) else resp.content_type
            self.contract.check_response(request.method, route, resp.status, kind,
                                         sent if isinstance(sent, bytes) else None)
        return resp

    async def _send_message(self, ws: web.WebSocketResponse, message: dict[str, Any]) -> None:
        self.contract.check_message("message to the client", "StreamMessage", message)
        await ws.send_str(json.dumps(message))

    def _received_message(self, data: str) -> dict[str, Any]:
        message: dict[str, Any] = json.loads(data)
        self.contract.check_message("message from the client", "StreamMessage", message)
        return message

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.headers.append(dict(request.headers))
        if request.path not in ("/healthz", "/v1/proxy-page"):
            if request.headers.get("Authorization") != f"Bearer {TOKEN}":
                return err(401, "unauthorized", "bad token")
        return await handler(request)  # type: ignore[no-any-return]

    async def _json(self, request: web.Request, schema: str) -> dict[str, Any] | web.Response:
        """The JSON body, if it has only fields of ``schema`` (the server's
        rejection of unknown fields)."""
        if request.content_type != "application/json":
            return err(415, "unsupported_media_type", "JSON please")
        body = await request.json()
        self.requests.append((request.method, request.path_qs, body))
        allowed = self.contract.document["components"]["schemas"][schema]["properties"]
        unknown = set(body) - set(allowed)
        if unknown:
            return err(400, "invalid_request", f"unknown field(s) {sorted(unknown)}")
        return body  # type: ignore[no-any-return]

    def _sb(self, request: web.Request) -> FakeSandbox | web.Response:
        sb = self.sandboxes.get(request.match_info["id"])
        if sb is None:
            return err(404, "sandbox_not_found", "no such sandbox")
        return sb

    # --- routes ------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "version": "0.0-fake", "nodes": [
            {"name": "node-1", "healthy": True, "sandboxes": len(self.sandboxes),
             "cpu_reserved": 1.0, "cpu_capacity": 2.0, "memory_reserved_mb": 512,
             "memory_capacity_mb": 4096, "slots_used": len(self.sandboxes),
             "slots_capacity": 64, "cgroup_version": 2, "backends": ["container"]}]})

    async def proxy_page(self, request: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>bad gateway</html>", content_type="text/html")

    async def create(self, request: web.Request) -> web.Response:
        body = await self._json(request, "CreateSandboxRequest")
        if isinstance(body, web.Response):
            return body
        if body.get("image") == "no-such-image":
            return err(404, "image_not_found", "unknown image")
        if body.get("memory_limit_mb") == 0:
            return err(400, "invalid_limits", "memory_limit_mb must be positive")
        if body.get("image") == "slow":
            await asyncio.sleep(1)
        if body.get("image") == "busy":
            return err(503, "no_capacity", "full", headers={"Retry-After": "3"})
        if body.get("image") == "future":
            return err(418, "teapot_overflow", "a code from the future")
        key = request.headers.get("idempotency-key")
        if key is not None and key in self.keys:
            # A retry: the sandbox the first request made.
            return web.json_response(self.sandboxes[self.keys[key]].record(), status=201)
        first = body.get("first_exec")
        if first is not None:
            if key:
                return err(400, "invalid_request", "first_exec with an Idempotency-Key")
            if ("cmd" in first) == ("argv" in first):
                return err(400, "invalid_request", "exactly one of cmd and argv")
        self.next_id += 1
        sb = FakeSandbox(f"sb-{self.next_id}",
                         {k: v for k, v in body.items() if k != "first_exec"})
        self.sandboxes[sb.id] = sb
        if key is not None:
            self.keys[key] = sb.id
        if first is None:
            return web.json_response(sb.record(), status=201)
        answer = self._run(first)
        if answer.status != 200:
            # The real server deletes the sandbox and answers the error.
            del self.sandboxes[sb.id]
            return answer
        return web.json_response({**sb.record(), "first_exec": json.loads(answer.body)},
                                 status=201)

    async def list(self, request: web.Request) -> web.Response:
        self.requests.append(("GET", request.path_qs, None))
        q = request.query
        out = []
        for sb in self.sandboxes.values():
            rec = sb.record()
            if "state" in q and rec["state"] != q["state"]:
                continue
            if "job" in q and rec["job"] != q["job"]:
                continue
            want = [v.split("=", 1) for v in q.getall("label", [])]
            if any(rec["labels"].get(k) != v for k, v in want):
                continue
            out.append(rec)
        return web.json_response({"sandboxes": out})

    async def get(self, request: web.Request) -> web.Response:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        return web.json_response(sb.record())

    async def update(self, request: web.Request) -> web.Response:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        body = await request.json()
        if body.get("qos_class") not in (None, "latency_sensitive", "best_effort"):
            return web.json_response({"error": {"code": "invalid_request", "message": "unknown qos_class"}},
                                     status=400)
        if "qos_class" in body:
            sb.body["qos_class"] = body["qos_class"]
        return web.json_response(sb.record())

    async def stop_sb(self, request: web.Request) -> web.Response:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        sb.state = "stopped"
        return web.json_response(sb.record())

    async def delete(self, request: web.Request) -> web.Response:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        del self.sandboxes[sb.id]
        return web.Response(status=204)

    async def exec(self, request: web.Request) -> web.Response:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        body = await self._json(request, "ExecRequest")
        if isinstance(body, web.Response):
            return body
        if sb.state != "running":
            return err(409, "sandbox_not_running", "stopped")
        return self._run(body)

    @staticmethod
    def _run(body: dict[str, Any]) -> web.Response:
        """The answer to an ExecRequest, from the script table."""
        if ("cmd" in body) == ("argv" in body):
            return err(400, "invalid_request", "exactly one of cmd and argv")
        cmd = body.get("cmd") or " ".join(body["argv"])
        if cmd == "true":
            return web.json_response(exec_response())
        if cmd.startswith("echo "):
            return web.json_response(exec_response(stdout=cmd[5:] + "\n"))
        if cmd.startswith("exit "):
            return web.json_response(exec_response(exit_code=int(cmd[5:])))
        if cmd == "sleep-forever":
            return web.json_response(exec_response(exit_code=143, signal=15, timed_out=True))
        if cmd == "binary":
            return web.json_response(exec_response(stdout="aGk=", encoding="base64"))
        if cmd == "explode":
            return err(502, "agent_unavailable", "agent gone")
        return web.json_response(exec_response(stdout=json.dumps(body)))

    async def exec_stream(self, request: web.Request) -> web.StreamResponse:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        first = await ws.receive()
        body = json.loads(first.data)
        self.contract.check_message("exec stream's first frame", "ExecRequest", body)
        self.requests.append(("WS", request.path_qs, body))
        if sb.state != "running":
            # As the server does: the upgrade succeeds, the command does not start.
            await self._send_message(ws, {"type": "error", "code": "sandbox_not_running",
                                          "message": "stopped"})
            await ws.close()
            return ws
        cmd = body.get("cmd") or " ".join(body.get("argv", []))
        if cmd == "fail":
            await self._send_message(ws, {"type": "error", "code": "spawn_failed",
                                          "message": "no such program"})
            await ws.close()
            return ws
        if cmd == "drop":
            await ws.send_bytes(b"\x01partial")
            await ws.close()
            return ws
        if cmd == "cat":
            # Echo stdin to stdout until EOF; a signal ends it early.
            while True:
                msg = await ws.receive()
                if msg.type == WSMsgType.BINARY:
                    assert msg.data[0] == 0
                    await ws.send_bytes(b"\x01" + msg.data[1:])
                elif msg.type == WSMsgType.TEXT:
                    m = self._received_message(msg.data)
                    if m["type"] == "eof":
                        await self._send_message(ws, {"type": "exit", **exec_response()})
                        break
                    if m["type"] == "signal":
                        await self._send_message(
                            ws, {"type": "exit", **exec_response(128 + m["signal"],
                                                               signal=m["signal"])})
                        break
                else:
                    break
            await ws.close()
            return ws
        await ws.send_bytes(b"\x01line 1\n")
        await ws.send_bytes(b"\x02oops\n")
        await ws.send_bytes(b"\x07ignored tag")
        # Beyond the document on purpose: a message type of a newer server,
        # which the SDK must skip.
        await ws.send_str(json.dumps({"type": "progress", "what": "ignored"}))
        await ws.send_bytes(b"\x01line 2\n")
        await self._send_message(ws, {"type": "exit", **exec_response(3)})
        await ws.close()
        return ws

    async def pty(self, request: web.Request) -> web.StreamResponse:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        self.requests.append(("PTY", request.path_qs, None))
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_bytes(b"$ ")
        async for msg in ws:
            if msg.type == WSMsgType.BINARY:
                if msg.data == b"exit\n":
                    await self._send_message(ws, {"type": "exit", **exec_response(0)})
                    break
                await ws.send_bytes(msg.data)
            elif msg.type == WSMsgType.TEXT:
                m = self._received_message(msg.data)
                await ws.send_bytes(f"resized {m['rows']}x{m['cols']}".encode())
        await ws.close()
        return ws

    async def create_session(self, request: web.Request) -> web.Response:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        body = await self._json(request, "CreateSessionRequest")
        if isinstance(body, web.Response):
            return body
        sid = f"s{len(sb.sessions) + 1}"
        sb.sessions[sid] = body
        return web.json_response({"session_id": sid}, status=201)

    async def delete_session(self, request: web.Request) -> web.Response:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        if sb.sessions.pop(request.match_info["sid"], None) is None:
            return err(404, "session_not_found", "no session")
        return web.Response(status=204)

    @staticmethod
    def _path(request: web.Request) -> str | web.Response:
        path = request.query.get("path", "")
        if not path.startswith("/") or ".." in path.split("/"):
            return err(400, "invalid_path", f"bad path {path!r}")
        return path.rstrip("/") or "/"

    def _file_info(self, sb: FakeSandbox, path: str) -> dict[str, Any] | None:
        if path in sb.dirs:
            kind, size = "dir", 0
        elif path in sb.files:
            kind, size = "file", len(sb.files[path])
        else:
            return None
        return {"name": path.rsplit("/", 1)[-1], "path": path, "type": kind, "size": size,
                "mode": 0o755 if kind == "dir" else 0o644, "uid": 0, "gid": 0, "mtime": 1,
                "link_target": None}

    async def read_file(self, request: web.Request) -> web.StreamResponse:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        path = self._path(request)
        if isinstance(path, web.Response):
            return path
        if path in sb.dirs:
            return err(400, "is_a_directory", path)
        if path not in sb.files:
            return err(404, "file_not_found", path)
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        data = sb.files[path]
        for i in range(0, len(data), 100_000):
            await resp.write(data[i:i + 100_000])
        await resp.write_eof()
        return resp

    async def write_file(self, request: web.Request) -> web.Response:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        path = self._path(request)
        if isinstance(path, web.Response):
            return path
        self.requests.append(("PUT", request.path_qs, request.content_type))
        data = await request.read()
        sb.files[path] = data
        parent = path.rsplit("/", 1)[0] or "/"
        while parent not in sb.dirs:
            sb.dirs.add(parent)
            parent = parent.rsplit("/", 1)[0] or "/"
        return web.json_response({"path": path, "bytes": len(data)})

    async def remove(self, request: web.Request) -> web.Response:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        path = self._path(request)
        if isinstance(path, web.Response):
            return path
        recursive = request.query.get("recursive") == "true"
        if path in sb.files:
            del sb.files[path]
        elif path in sb.dirs:
            inside = [p for p in [*sb.files, *sb.dirs] if p.startswith(path + "/")]
            if inside and not recursive:
                return err(409, "directory_not_empty", path)
            for p in inside:
                sb.files.pop(p, None)
                sb.dirs.discard(p)
            sb.dirs.discard(path)
        else:
            return err(404, "file_not_found", path)
        return web.Response(status=204)

    async def stat(self, request: web.Request) -> web.Response:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        path = self._path(request)
        if isinstance(path, web.Response):
            return path
        info = self._file_info(sb, path)
        if info is None:
            return err(404, "file_not_found", path)
        return web.json_response(info)

    async def list_dir(self, request: web.Request) -> web.Response:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        path = self._path(request)
        if isinstance(path, web.Response):
            return path
        if path not in sb.dirs:
            return err(404, "file_not_found", path)
        prefix = path.rstrip("/") + "/"
        names = sorted(p for p in [*sb.files, *sb.dirs]
                       if p.startswith(prefix) and "/" not in p[len(prefix):] and p != path)
        return web.json_response({"path": path,
                                  "entries": [self._file_info(sb, p) for p in names]})

    async def mkdir(self, request: web.Request) -> web.Response:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        body = await self._json(request, "MkdirRequest")
        if isinstance(body, web.Response):
            return body
        sb.dirs.add(body["path"].rstrip("/"))
        return web.Response(status=204)

    async def get_archive(self, request: web.Request) -> web.StreamResponse:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        path = self._path(request)
        if isinstance(path, web.Response):
            return path
        buf = io.BytesIO()
        prefix = path.rstrip("/") + "/"
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for d in sorted(sb.dirs):
                if d.startswith(prefix):
                    ti = tarfile.TarInfo(d[len(prefix):])
                    ti.type = tarfile.DIRTYPE
                    ti.mode = 0o755
                    tf.addfile(ti)
            for p, data in sorted(sb.files.items()):
                if p.startswith(prefix):
                    ti = tarfile.TarInfo(p[len(prefix):])
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
        resp = web.StreamResponse(headers={"Content-Type": "application/x-tar"})
        await resp.prepare(request)
        raw = buf.getvalue()
        for i in range(0, len(raw), 65536):
            await resp.write(raw[i:i + 65536])
        await resp.write_eof()
        return resp

    async def put_archive(self, request: web.Request) -> web.Response:
        sb = self._sb(request)
        if isinstance(sb, web.Response):
            return sb
        path = self._path(request)
        if isinstance(path, web.Response):
            return path
        self.requests.append(("PUT", request.path_qs, request.content_type))
        raw = await request.read()
        sb.dirs.add(path)
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as tf:
            for m in tf:
                full = f"{path.rstrip('/')}/{m.name}"
                if m.isdir():
                    sb.dirs.add(full)
                elif m.isfile():
                    f = tf.extractfile(m)
                    assert f is not None
                    sb.files[full] = f.read()
        return web.json_response({"path": path, "bytes": len(raw)})

    async def create_tenant(self, request: web.Request) -> web.Response:
        body = await self._json(request, "CreateTenantRequest")
        if isinstance(body, web.Response):
            return body
        return web.json_response({"name": body["name"], "admin": False, "token": "t-123",
                                  "created_at": "2026-01-01T00:00:00Z"}, status=201)

    def _volume_users(self, name: str) -> list[str]:
        return sorted(sb.id for sb in self.sandboxes.values()
                      if any((v if isinstance(v, str) else v.get("name")) == name
                             for v in sb.body.get("volumes", {}).values()))

    async def create_volume(self, request: web.Request) -> web.Response:
        body = await self._json(request, "CreateVolumeRequest")
        if isinstance(body, web.Response):
            return body
        name = body["name"]
        if name in self.volumes:
            return err(409, "already_exists", f"a volume named {name!r} already exists")
        self.volumes[name] = {"name": name, "size_mb": body.get("size_mb") or 1024, "used_bytes": 0,
                              "created_at": "2026-01-01T00:00:00Z"}
        return web.json_response({**self.volumes[name], "sandboxes": []}, status=201)

    async def list_volumes(self, request: web.Request) -> web.Response:
        return web.json_response({"volumes": [{**v, "sandboxes": self._volume_users(v["name"])}
                                              for v in self.volumes.values()]})

    async def delete_volume(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.volumes:
            return err(404, "volume_not_found", f"no volume named {name!r}")
        if self._volume_users(name):
            return err(409, "volume_in_use", f"volume {name!r} is mounted")
        del self.volumes[name]
        return web.Response(status=204)

    async def images(self, request: web.Request) -> web.Response:
        return web.json_response({"images": [
            {"name": "python:latest", "layers": ["sha256:aa"], "size_bytes": 10,
             "created_at": "2026-01-01T00:00:00Z", "env": ["PATH=/usr/bin"],
             "workdir": "/", "user": "root"}]})


if __name__ == "__main__":
    # Run alone (for latency tests in a separate process): print the URL, then
    # serve until stdin closes.
    import sys

    server = FakeDSec().start()
    print(server.url, flush=True)
    sys.stdin.read()
    server.stop()
