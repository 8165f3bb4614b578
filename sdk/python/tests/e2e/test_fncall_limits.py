"""FnCall's limits as SandboxFusion clients send them (the pinned PyPI
``sandbox-fusion`` client and verl's reward payload), memory held at the
size asked for, and runners whose zygote dies under concurrent calls."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator

import pytest

import dsec
from dsec import DSecClient

from .conftest import Server, Tenant, serve_dsec

pytestmark = pytest.mark.e2e

# Touches every page: resident memory, not only address space.
ALLOCATE = "b = b'x' * ({mb} << 20)\nprint(len(b) >> 20)"


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def verl_payload(code: str, memory_limit_mb: int = 1024, timeout: int = 10, stdin: str | None = "None") -> dict:
    """What verl's SandboxFusion reward (call_sandbox_api) sends: every field,
    its config's default memory_limit_mb of 1024 and one timeout for both."""
    return {"compile_timeout": timeout, "run_timeout": timeout, "code": code, "stdin": stdin,
            "memory_limit_MB": memory_limit_mb, "language": "python", "files": {}, "fetch_files": []}


def test_verl_payloads_run_whatever_their_memory_limit(server: Server, tenant: Tenant) -> None:
    url = f"{server.url}/sandboxfusion/{tenant.token}/run_code"
    # verl's default, SandboxFusion's -1 (no limit of its own), 0, a small
    # limit and more than an ordinary runner holds: all run.
    for mb in (1024, -1, 0, 64, 2048):
        status, body = _post(url, verl_payload("print(input())", memory_limit_mb=mb))
        assert status == 200 and body["status"] == "Success", (mb, body)
        assert body["run_result"]["stdout"] == "None\n", (mb, body)
    # Absent altogether (what the sandbox-fusion client sends).
    payload = verl_payload("print(2)")
    del payload["memory_limit_MB"]
    status, body = _post(url, payload)
    assert status == 200 and body["status"] == "Success", body
    # Only more than the node has is refused, saying what it can give.
    status, body = _post(url, verl_payload("print(1)", memory_limit_mb=1 << 40))
    assert status == 400 and body["error"]["code"] == "invalid_limits", body
    assert "more than this node can give" in body["error"]["message"], body


def test_memory_is_held_at_the_size_asked_for(server: Server, tenant: Tenant) -> None:
    url = f"{server.url}/sandboxfusion/{tenant.token}/run_code"
    # Within a raised limit (a runner bigger than the ordinary ones): runs.
    status, body = _post(url, verl_payload(ALLOCATE.format(mb=900), memory_limit_mb=1024))
    assert status == 200 and body["status"] == "Success" and body["run_result"]["stdout"] == "900\n", body
    # Past it: killed for memory (MemoryError), not run on.
    status, body = _post(url, verl_payload(ALLOCATE.format(mb=1200), memory_limit_mb=1024))
    assert status == 200 and body["status"] == "Failed", body
    assert "MemoryError" in body["run_result"]["stderr"], body
    # The ordinary runners keep the small limit they always had.
    status, body = _post(url, verl_payload(ALLOCATE.format(mb=100), memory_limit_mb=64))
    assert status == 200 and body["status"] == "Failed" and "MemoryError" in body["run_result"]["stderr"], body


async def test_native_api_takes_the_same_range(client: DSecClient) -> None:
    big = await client.fncall("python", ALLOCATE.format(mb=1500), memory_limit_mb=2048)
    assert big.ok and big.stdout == "1500\n", big
    over = await client.fncall("python", ALLOCATE.format(mb=2200), memory_limit_mb=2048)
    assert over.status == "memory_limit", over
    cpp = await client.fncall("cpp", "#include <vector>\n#include <cstdio>\nint main(){std::vector<char> v(1200u<<20, 1);"
                              "std::printf(\"%d\\n\", (int)(v.size() >> 20));}", memory_limit_mb=1536)
    assert cpp.ok and cpp.stdout == "1200\n", cpp
    long = await client.fncall("python", "print('slow')", time_limit=600)
    assert long.ok, long
    with pytest.raises(dsec.errors.DSecError) as e:
        await client.fncall("python", "print(1)", memory_limit_mb=1 << 40)
    assert e.value.status == 400 and e.value.code == "invalid_limits" and "at most" in e.value.message, e.value
    pools = [p for p in await client.fncall_pools() if p["language"] == "python"]
    sizes = {p["runner_memory_mb"] for p in pools}
    assert 1024 in sizes and any(s > 2048 for s in sizes), pools


def test_every_field_of_the_sandbox_fusion_client(server: Server, tenant: Tenant) -> None:
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code, set_endpoint

    set_endpoint(f"{server.url}/sandboxfusion/{tenant.token}")

    def ok(**kw: object) -> object:
        r = run_code(RunCodeRequest(**kw))
        assert r.status == RunStatus.Success, (kw, r)
        return r

    # Defaults of every field (timeouts 10 s, stdin None, no files).
    assert ok(code="print(1)", language="python").run_result.stdout == "1\n"
    # Timeouts: ints, fractions, long ones, and -1 / 0 (its default).
    for t in (1, 0.5, 120, 3600.0, 1e7, -1, 0):
        r = ok(code="print('t')", language="python", run_timeout=t, compile_timeout=t)
        assert r.run_result.stdout == "t\n", (t, r)
    r = ok(code="#include <cstdio>\nint main(){std::puts(\"c\");}", language="cpp", compile_timeout=-1, run_timeout=-1)
    assert r.compile_result.return_code == 0 and r.run_result.stdout == "c\n", r
    tle = run_code(RunCodeRequest(code="import time; time.sleep(5)", language="python", run_timeout=0.5))
    assert tle.status == RunStatus.Failed and tle.run_result.status == "TimeLimitExceeded", tle
    # stdin: absent, empty, text.
    assert ok(code="import sys; print(repr(sys.stdin.read()))", language="python", stdin="").run_result.stdout == "''\n"
    assert ok(code="print(input())", language="python", stdin="x\n").run_result.stdout == "x\n"
    # files: base64, null (an empty file), nested paths, "./" prefixes;
    # fetch_files: what the program wrote, nested too; a missing one is left out.
    r = ok(code="import os\nprint(open('a.txt').read(), os.path.getsize('e.bin'), open('d/b.txt').read(), open('c.txt').read())\n"
                "os.makedirs('out', exist_ok=True); open('out/r.txt', 'w').write('R')",
           language="python", files={"a.txt": "aGk=", "e.bin": None, "d/b.txt": "Yg==", "./c.txt": "Yw=="},
           fetch_files=["out/r.txt", "missing.txt"])
    assert r.run_result.stdout == "hi 0 b c\n" and r.files == {"out/r.txt": "Ug=="}, r
    # bash too (the client's names hold no `c`; the test server serves no
    # other language of its list).
    assert ok(code="echo b", language="bash").run_result.stdout == "b\n"


# --- runners whose zygote dies under load -----------------------------------

FORK_BOMB = "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"
ENDLESS_PRINTER = "while True: print('y' * 1000)"
# Fills the runner's pids limit with sleepers and returns at once: the
# zygote's fork of the next worker then meets a full limit, every time,
# until the monitor has killed and reaped them.
PIDS_FILLER = """import os, time
for _ in range(500):
    try:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    except OSError:
        break
print('full')"""


def _zygotes(node: str) -> list[int]:
    """PIDs of the zygotes of the runners of the server on `node` (its
    sandboxes' cgroups carry the node's name)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            with open(f"/proc/{entry}/cgroup") as f:
                cgroup = f.read()
        except OSError:
            continue
        is_zygote = b"--zygote" in argv or b"fncall-exec-zygote" in argv
        if is_zygote and f"/{node}/" in cgroup:
            found.append(int(entry))
    return found


@pytest.fixture(scope="module")
def zygote_server() -> Iterator[tuple[Server, str]]:
    node = f"e2e-zyg-{uuid.uuid4().hex[:8]}"
    for srv in serve_dsec(["--fncall-pools", "python=2:3,bash=1:2"], node=node):
        yield srv, node


async def test_killed_zygotes_never_reach_callers(zygote_server: tuple[Server, str]) -> None:
    srv, node = zygote_server
    async with DSecClient(srv.url, srv.admin_token) as c:
        for _ in range(300):  # the minimum runners are warm
            pools = {p["language"]: p for p in await c.fncall_pools()}
            if pools["python"]["idle"] >= 2 and pools["bash"]["idle"] >= 1:
                break
            await asyncio.sleep(0.1)
        killed: list[int] = []
        stop = threading.Event()

        def killer() -> None:
            # Kills the zygote of a runner now and then while calls run
            # (each zygote once: processes of the server this test started).
            while not stop.wait(1.5) and len(killed) < 4:
                for pid in _zygotes(node):
                    if pid not in killed:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
                        break

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            calls = []
            for i in range(40):
                calls.append(c.fncall("python", f"import time; time.sleep(0.2); print({i} * 2)"))
                calls.append(c.fncall("bash", f"sleep 0.2; echo {i}"))
            results = await asyncio.gather(*calls, return_exceptions=True)
        finally:
            stop.set()
            thread.join()
        assert len(killed) >= 2, "the test killed zygotes while calls ran"
        for i in range(40):
            py, sh = results[2 * i], results[2 * i + 1]
            assert isinstance(py, dsec.FnCallResult) and py.ok and py.stdout == f"{i * 2}\n", py
            assert isinstance(sh, dsec.FnCallResult) and sh.ok and sh.stdout == f"{i}\n", sh
        # Runners whose zygote was killed under a call were replaced (one
        # killed while idle is replaced under its next call).
        assert sum(p["runners_replaced"] for p in await c.fncall_pools()) >= 1
        after = await asyncio.gather(*(c.fncall("python", f"print({i})") for i in range(8)))
        assert [r.stdout for r in after] == [f"{i}\n" for i in range(8)], after


async def test_a_call_that_leaves_the_pids_limit_full(zygote_server: tuple[Server, str]) -> None:
    srv, _ = zygote_server
    async with DSecClient(srv.url, srv.admin_token) as c:
        before = sum(p["runners_replaced"] for p in await c.fncall_pools())
        for _ in range(3):
            r = await c.fncall("python", PIDS_FILLER)
            assert r.ok and r.stdout == "full\n", r
            r = await c.fncall("python", "print('next')")
            assert r.ok and r.stdout == "next\n", r
        replaced = sum(p["runners_replaced"] for p in await c.fncall_pools()) - before
        assert replaced == 0, f"{replaced} runners were lost to a full pids limit"
        for _ in range(2):
            # (bash itself retries a fork that fails: Python fills the limit.)
            r = await c.fncall("bash", f"python3 - <<'EOF'\n{PIDS_FILLER}\nEOF")
            assert r.ok and r.stdout == "full\n", r
            r = await c.fncall("bash", "echo next")
            assert r.ok and r.stdout == "next\n", r
        replaced = sum(p["runners_replaced"] for p in await c.fncall_pools()) - before
        assert replaced == 0, f"{replaced} runners were lost to a full pids limit"


async def test_fork_bombs_and_printers_then_ordinary_calls(zygote_server: tuple[Server, str]) -> None:
    # The sequence that once in four runs answered "the zygote died": the
    # next worker's fork met a pids limit still full of the bomb's processes.
    srv, _ = zygote_server
    async with DSecClient(srv.url, srv.admin_token) as c:
        for _ in range(3):
            bursts = [c.fncall("python", FORK_BOMB, time_limit=1), c.fncall("python", ENDLESS_PRINTER, time_limit=1),
                      c.fncall("bash", ":(){ :|:& };:", time_limit=1)]
            bursts += [c.fncall("python", f"print({i})") for i in range(12)]
            results = await asyncio.gather(*bursts, return_exceptions=True)
            assert all(isinstance(r, dsec.FnCallResult) for r in results), results
            bomb, printer, bash_bomb, *ordinary = results
            # (bash's bomb may return at once, leaving its processes to the cleanup.)
            assert bomb.status == "timeout" and bash_bomb.status in ("ok", "timeout", "runtime_error"), (bomb, bash_bomb)
            assert printer.status == "output_limit", printer
            assert [r.stdout for r in ordinary] == [f"{i}\n" for i in range(12)], ordinary
            assert not any("zygote" in (r.stderr or "") for r in results), results
        started = time.monotonic()
        r = await c.fncall("python", "print('after')")
        assert r.ok and r.stdout == "after\n" and time.monotonic() - started < 30, r
