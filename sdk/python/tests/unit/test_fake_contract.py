"""The unit tests' fake server speaks the API of ``dsec/openapi.json``.

Every test's traffic with the fake is checked (the ``fake`` fixture fails a
test whose requests or answers the document does not allow). Here: every
route the fake serves is a route of the document, one run reaches every one
of them through the SDK, the SDK's requests to the other routes are checked
too, and the checks do notice what they are for.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dsec
from dsec import DSecClient, DSecRunArgs

from .fake_server import FakeDSec
from .openapi_contract import NOT_API_ROUTES, Contract


def fake_routes(fake: FakeDSec) -> set[tuple[str, str]]:
    assert fake.app is not None
    # aiohttp answers HEAD on every GET route by itself.
    return {(r.method, r.resource.canonical) for r in fake.app.router.routes()
            if r.method != "HEAD" and r.resource is not None
            and r.resource.canonical not in NOT_API_ROUTES}


def test_every_route_of_the_fake_is_in_the_document(fake: FakeDSec) -> None:
    routes = fake_routes(fake)
    assert len(routes) > 20
    missing = sorted(r for r in routes if fake.contract.operation(*r) is None)
    assert missing == []


def test_the_exempt_routes_are_served(fake: FakeDSec) -> None:
    assert fake.app is not None
    served = {r.resource.canonical for r in fake.app.router.routes() if r.resource is not None}
    assert set(NOT_API_ROUTES) <= served
    assert not any(fake.contract.route_of(route) for route in NOT_API_ROUTES)


async def test_every_route_answers_as_the_document_says(client: DSecClient, fake: FakeDSec,
                                                        tmp_path: Path) -> None:
    await client.health()
    await client.images()
    await client.create_tenant("team-a")
    sb = await client.run(DSecRunArgs(image="python", labels={"k": "v"}, job="j"))
    await client.list(state="running", job="j", labels={"k": "v"})
    await client.get(sb.id)
    r = await sb.run_shell("echo hi", timeout=5, env={"A": "1"}, stdin=b"\x00")
    assert r.stdout == "hi\n"
    async with sb.stream_exec(["cat"]) as stream:
        await stream.write("x")
        await stream.close_stdin()
        await stream.wait()
    async with sb.stream_shell("cat") as stream:
        await stream.send_signal(15)
        await stream.wait()
    async with sb.pty(rows=10, cols=20) as term:
        await term.resize(11, 21)
        await term.send("exit\n")
        await term.wait()
    async with await sb.create_session(cwd="/tmp", env={"A": "1"}, user="root"):
        pass
    await sb.write_file("/d/a.txt", "a", mode=0o600, owner="root", step_id="w")
    await sb.mkdir("/d/e", mode=0o700)
    assert await sb.read_file("/d/a.txt") == b"a"
    assert [e.name for e in await sb.list_dir("/d")] == ["a.txt", "e"]
    assert (await sb.stat("/d/a.txt")).size == 1
    assert (await sb.set_qos_class("best_effort")).qos_class == "best_effort"
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "b.txt").write_text("b")
    await sb.upload(tmp_path / "up", "/u")
    await sb.download("/u", tmp_path / "down")
    await sb.remove("/d", recursive=True)
    with pytest.raises(dsec.FileNotFound):
        await sb.stat("/d")
    assert (await sb.stop()).state == "stopped"
    await sb.delete()
    with pytest.raises(dsec.SandboxNotFound):
        await sb.refresh()
    await client.create_volume("data", size_mb=64)
    assert [v.name for v in await client.volumes()] == ["data"]
    await client.delete_volume("data")

    reached = {(method, route) for method, route, _ in fake.contract.seen}
    assert sorted(fake_routes(fake) - reached) == []
    assert fake.contract.problems == []


#: Operations of the document this SDK has no call for, and why.
NOT_CALLED_BY_THE_SDK = {
    ("GET", "/metrics"): "Prometheus scrapes it",
    ("DELETE", "/v1/nodes/{node}"): "an operator's removal of a node (dsec node rm)",
    ("POST", "/v1/cluster/join"): "an edge joining (dsec edge --join), not a client",
    ("POST", "/run_code"): "SandboxFusion's own client calls it (docs/fncall.md)",
    ("POST", "/sandboxfusion/{token}/run_code"): "likewise, with the token in the path",
    ("GET", "/v1/sandboxes/{id}/ports/{port}/{path}"): "the URL sandbox.expose() returns is for any HTTP client",
    ("GET", "/v1/port-urls/{token}/{path}"): "likewise, the base URL of sandbox.expose(base=True)",
}


async def test_every_request_of_the_sdk_is_in_the_document(client: DSecClient, fake: FakeDSec,
                                                           tmp_path: Path) -> None:
    # The calls the fake does not serve: their requests are still checked
    # (route, query parameters, body), and the fake's 404 is an error.
    sb = await client.run(DSecRunArgs(image="python"))
    (tmp_path / "Dockerfile").write_text("FROM python\n")
    calls = [
        client.build_image("img:1", tmp_path, build_args={"A": "1"}, target="t", no_cache=True,
                           network={"pypi": True}, memory_mb=64, cpu_cores=0.5, disk_mb=128,
                           step_timeout_s=10),
        client.fncall("python", "print(input())", stdin="x", files={"a.txt": "a"},
                      fetch_files=["a.txt"], env={"A": "1"}, time_limit=1.5, memory_limit_mb=64,
                      output_limit_bytes=100, compile_time_limit=2.0),
        client.fncall("cpp", "int main(){}", test_cases=[dsec.TestCase("1", "1")],
                      compare="float", float_tolerance=1e-6, checker=("python", "exit(0)"),
                      stop_on_first_failure=True),
        client.fncall_batch([{"language": "python", "code": "print(1)"}]),
        client.fncall_pools(), client.snapshots(), client.delete_snapshot("s"),
        client.pause_job("j", idempotent=True), client.resume_job("j"),
        client.delete_image("python:latest"), client.tenants(),
        sb.audit_events(after=3), sb.set_network_rules({"pypi": True}),
        sb.metrics(seconds=10), sb.metrics(), client.node_metrics("n", seconds=5),
        client.nodes(), client.drain_node("n"), client.undrain_node("n"), client.create_join_token(ttl_s=60),
        sb.pause(mode="freeze"), sb.resume(), sb.set_timeout(lifetime_s=60, ttl_running_stop=30),
        sb.snapshot("s", memory=True, idempotency_key="k"),
        sb.pack_diff("img:v1", scrub=["/tmp/*"], idempotency_key="k"),
        sb.trajectory(), sb.replay(keep=True), sb.screenshot(), sb.send_keys(["ctrl-c", "ret"]),
        sb.type_text("hi"), sb.move(1, 2), sb.click(3, 4, "right", True), sb.click(),
        sb.expose(8000), sb.expose(8000, ttl_s=60, base=True),
        sb.forward_tcp(8000, ttl_s=60, allow_from=["10.0.0.0/8"]),
        client.projects.create("team", {"sandboxes": 2, "cpu": 1.5}, overcommit=True),
        client.projects.list(), client.projects.show("team"),
        client.projects.set_quota("team", {"memory_mb": 512}), client.projects.set_quota("team", None),
        client.projects.delete("team"),
        client.tokens.create("team", role="solver", ttl_s=60), client.tokens.list(), client.tokens.revoke("ab12"),
    ]
    for call in calls:
        with pytest.raises(dsec.DSecError):
            await call
    with pytest.raises(dsec.DSecError):
        await anext(aiter(sb.events()))
    with pytest.raises(dsec.DSecError):
        await anext(aiter(client.job_events("j")))

    assert fake.contract.problems == []
    # With the routes the fake serves (all reached by the test above), every
    # operation of the document.
    paths = fake.contract.document["paths"]
    documented = {(method.upper(), route) for route, item in paths.items() for method in item}
    unreached = (documented - set(NOT_CALLED_BY_THE_SDK) - fake_routes(fake)
                 - fake.contract.requested)
    assert sorted(unreached) == []
    assert set(NOT_CALLED_BY_THE_SDK) <= documented


# --- the checks themselves ----------------------------------------------------------


@pytest.fixture(scope="module")
def contract() -> Contract:
    return Contract()


def sandbox_record(**changes: object) -> bytes:
    record = {"id": "sb-1", "backend": "container", "image": "python", "toolkits": [],
              "state": "running", "node": "n", "limits": {"memory_limit_mb": 1,
                                                          "cpu_cores_limit": 1.0,
                                                          "disk_limit_mb": 1, "pids_limit": 1},
              "qos_class": "latency_sensitive",
              "init_user": "root", "ttl_running_stop": 1, "max_lifetime_s": 0, "labels": {},
              "created_at": "t", "last_active_at": "t"}
    record.update(changes)
    return json.dumps({k: v for k, v in record.items() if v is not None}).encode()


def problems_of(contract: Contract, check: str, *args: object) -> list[str]:
    before = len(contract.problems)
    getattr(contract, check)(*args)
    found = contract.problems[before:]
    del contract.problems[before:]
    return found


def test_a_good_answer_passes(contract: Contract) -> None:
    assert problems_of(contract, "check_response", "GET", "/v1/sandboxes/{id}", 200,
                       "application/json", sandbox_record()) == []


@pytest.mark.parametrize("body,expected", [
    (sandbox_record(id=7), "$.id: 7 is not of type 'string'"),
    (sandbox_record(image=None), "'image' is a required property"),
    # Through two $refs: Sandbox.state -> SandboxState.
    (sandbox_record(state="sleeping"), "$.state: 'sleeping' is not one of"),
    (sandbox_record(limits={"memory_limit_mb": -1}), "$.limits"),
])
def test_a_wrong_answer_is_seen(contract: Contract, body: bytes, expected: str) -> None:
    found = problems_of(contract, "check_response", "GET", "/v1/sandboxes/{id}", 200,
                        "application/json", body)
    assert any(expected in p for p in found), found


def test_statuses_and_content_types(contract: Contract) -> None:
    error = json.dumps({"error": {"code": "sandbox_not_found", "message": "m"}}).encode()
    assert problems_of(contract, "check_response", "GET", "/v1/sandboxes/{id}", 404,
                       "application/json", error) == []
    found = problems_of(contract, "check_response", "GET", "/v1/sandboxes/{id}", 409,
                        "application/json", error)
    assert found and "status not declared" in found[0]
    found = problems_of(contract, "check_response", "GET", "/v1/sandboxes/{id}", 200,
                        "text/html", b"<html>")
    assert found and "content type 'text/html'" in found[0]
    found = problems_of(contract, "check_response", "DELETE", "/v1/sandboxes/{id}", 204,
                        "application/json", b"{}")
    assert found and "declares none" in found[0]
    unknown = json.dumps({"error": {"code": "teapot_overflow", "message": "m"}}).encode()
    found = problems_of(contract, "check_response", "POST", "/v1/sandboxes", 418,
                        "application/json", unknown)
    assert any("$.error.code: 'teapot_overflow' is not one of" in p for p in found), found


def test_requests(contract: Contract) -> None:
    exec_route = "/v1/sandboxes/{id}"

    def request(method: str, path: str, route: str | None, query: list[str],
                content_type: str | None, body: object) -> list[str]:
        raw = json.dumps(body).encode() if body is not None else None
        return problems_of(contract, "check_request", method, path, route, query, content_type,
                           raw)

    assert request("POST", "/v1/sandboxes/sb-1/exec", exec_route + "/exec", [],
                   "application/json", {"cmd": "true", "timeout": 2}) == []
    found = request("POST", "/v1/sandboxes/sb-1/exec", exec_route + "/exec", [],
                    "application/json", {"cmd": "true", "timeout": "soon"})
    assert any("'soon' is not of type" in p for p in found), found
    found = request("POST", "/v1/sandboxes", "/v1/sandboxes", [], "application/json",
                    {"image": "python", "bogus": 1})
    assert any("'bogus' was unexpected" in p for p in found), found
    found = request("POST", "/v1/sandboxes/sb-1/pause", exec_route + "/pause", ["mode", "force"],
                    None, None)
    assert found == ["POST /v1/sandboxes/sb-1/pause: query parameter 'force' is not declared"]
    found = request("POST", "/v1/sandboxes/sb-1/exec", exec_route + "/exec", [], "text/plain",
                    "true")
    assert found and "a text/plain body" in found[0]
    # A route the fake does not serve is looked up in the document.
    assert request("GET", "/v1/sandboxes/sb-1/trajectory", None, [], None, None) == []
    found = request("GET", "/v1/sandboxes/sb-1/nothing", None, [], None, None)
    assert found == ["GET /v1/sandboxes/sb-1/nothing: the document has no such route and method"]
    found = request("PUT", "/v1/sandboxes/sb-1", exec_route, [], None, None)
    assert found and "no such route and method" in found[0]


def test_websocket_messages(contract: Contract) -> None:
    assert problems_of(contract, "check_message", "m", "StreamMessage",
                       {"type": "resize", "rows": 1, "cols": 2}) == []
    assert problems_of(contract, "check_message", "m", "StreamMessage",
                       {"type": "exit", "exit_code": 0, "stdout": "", "stderr": "",
                        "encoding": "utf8", "duration_ms": 1.0, "truncated": False,
                        "timed_out": False}) == []
    assert problems_of(contract, "check_message", "m", "StreamMessage",
                       {"type": "progress"}) != []
    assert problems_of(contract, "check_message", "m", "StreamMessage",
                       {"type": "exit", "exit_code": 0}) != []
    with pytest.raises(KeyError):
        contract.component("NoSuchSchema")


def test_beyond_needs_a_breach(contract: Contract) -> None:
    with contract.beyond("an unknown field"):
        contract.check_message("m", "ExecRequest", {"bogus": 1})
    assert contract.problems == [] and contract.expected
    with pytest.raises(AssertionError, match="nothing went beyond the document: a reason"):
        with contract.beyond("a reason"):
            contract.check_message("m", "ExecRequest", {"cmd": "true"})
