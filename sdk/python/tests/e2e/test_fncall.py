"""FnCall against the real server: warm runners, cleanup between calls,
misbehaving code, judge verdicts, batches, and the SandboxFusion client."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

import dsec
from dsec import DSecClient, TestCase

from .conftest import Server, Tenant, serve_dsec

pytestmark = pytest.mark.e2e

# The runner pools of the e2e server serve these; compiled programs need the
# `judge` image, which `dsec image setup` builds.
ADD_CPP = """#include <iostream>
int main() { long a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }
"""


async def call(client: DSecClient, code: str, language: str = "python", **kw: object) -> dsec.FnCallResult:
    return await client.fncall(language, code, **kw)


async def test_each_python_call_gets_its_own_random_sequence(client: DSecClient) -> None:
    # Every worker is forked from the same warm interpreter; the zygote's
    # after-fork reseed (random's, by its C method) must still give each
    # call a fresh seed, as a fresh interpreter would, and a process the
    # call forks its own sequence, as under `python3 main.py`.
    # (And, as under `python3 main.py`, the script's directory first on sys.path.)
    code = "import os, random, sys\nprint(random.getrandbits(64), sys.path[0] == os.getcwd())"
    calls = [await call(client, code) for _ in range(3)]
    assert all(c.ok and c.stdout.endswith(" True\n") for c in calls), calls
    assert len({c.stdout for c in calls}) == 3, calls
    forked = await call(client, """
import os, random
r, w = os.pipe()
if os.fork() == 0:
    os.write(w, b"%d" % random.getrandbits(64))
    os._exit(0)
os.wait()
print(int(os.read(r, 64)) != random.getrandbits(64))
""")
    assert forked.ok and forked.stdout == "True\n", forked


async def test_python_snippet_stdin_and_errors(client: DSecClient) -> None:
    r = await call(client, "import sys\nprint(input()[::-1], sys.argv[0].endswith('main.py'))", stdin="abc\n")
    assert r.ok and r.stdout == "cba True\n", r
    assert r.run is not None and r.run.exit_code == 0 and r.run.peak_memory_kb > 0
    r = await call(client, "print('out')\n1/0")
    assert r.status == "runtime_error" and r.stdout == "out\n" and r.exit_code == 1
    assert r.stderr.startswith("Traceback") and "ZeroDivisionError" in r.stderr
    assert "zygote" not in r.stderr, "the runner's own frames stay out of tracebacks"
    r = await call(client, "x = (1,\nprint(x")
    assert (r.status, r.exit_code) == ("runtime_error", 1) and "SyntaxError" in r.stderr, r
    assert 'main.py", line 2' in r.stderr and r.stdout == ""
    r = await call(client, "import sys; sys.exit(3)")
    assert (r.status, r.exit_code) == ("runtime_error", 3)
    r = await call(client, "echo $((6 * 7)); echo err >&2", language="bash")
    assert r.ok and r.stdout == "42\n" and r.stderr == "err\n"


async def test_sources_the_worker_compiles(client: DSecClient) -> None:
    # The worker compiles a Python call itself (the monitor is not Python):
    # a source too big for its message is read from main.py instead, and a
    # NUL byte is the SyntaxError `python3 main.py` reports.
    big = "x = 6 * 7\n" + "#" * (200 << 10) + "\nprint(x)\n"
    r = await call(client, big)
    assert r.ok and r.stdout == "42\n", r
    r = await call(client, "print(1)\0")
    assert (r.status, r.exit_code, r.stdout) == ("runtime_error", 1, ""), r
    assert "SyntaxError" in r.stderr and "null bytes" in r.stderr and "Traceback" not in r.stderr, r


async def test_files_env_and_fetch(client: DSecClient) -> None:
    r = await call(client, "import os\nprint(open('data/in.txt').read(), os.environ['K'])\n"
                           "open('out.bin', 'wb').write(bytes(range(5)))",
                   files={"data/in.txt": "hello"}, env={"K": "v"}, fetch_files=["out.bin", "missing"])
    assert r.ok and r.stdout == "hello v\n", r
    assert r.files == {"out.bin": bytes(range(5))}


async def test_a_request_of_megabytes_then_small_ones(client: DSecClient) -> None:
    # The monitor reads requests into a buffer that grows for a big one
    # (here ~4 MiB of JSON, many of its reads) and shrinks back after it.
    data = os.urandom(3 << 20)
    code = "import hashlib\nprint(hashlib.sha256(open('big.bin', 'rb').read()).hexdigest())"
    big = await call(client, code, files={"big.bin": data})
    assert big.ok and big.stdout.strip() == hashlib.sha256(data).hexdigest(), big
    for _ in range(4):
        small = await call(client, "print(input())", stdin="after\n")
        assert small.ok and small.stdout == "after\n", small


async def warm_pools(client: DSecClient, timeout: float = 60) -> None:
    """Waits until no runner is starting: a runner that becomes ready
    between two calls would take the second one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        pools = await client.fncall_pools()
        if all(p["starting"] == 0 and p["runners"] >= p["min_runners"] for p in pools):
            return
        assert loop.time() < deadline, f"the pools did not warm up: {pools}"
        await asyncio.sleep(0.1)


async def test_nothing_of_one_call_reaches_the_next(client: DSecClient) -> None:
    # Sequential calls go to the most recently freed runner: the same one.
    await warm_pools(client)
    first = await call(client, """
import os, subprocess
open('/tmp/secret', 'w').write('s')
open('/dev/shm/secret', 'w').write('s')
os.makedirs('/var/tmp/d', exist_ok=True)
subprocess.Popen(['sleep', '1000'])                      # a child left running
subprocess.Popen(['setsid', 'sleep', '1001'])            # a detached one
if os.fork() == 0:                                       # a double-forked daemon
    os.setsid()
    if os.fork() == 0:
        import time; time.sleep(1002)
    os._exit(0)
print(os.getuid())
""")
    assert first.ok and first.stdout == "65534\n", first
    second = await call(client, """
import os
left = [p for p in os.listdir('/proc') if p.isdigit() and os.stat('/proc/' + p).st_uid == os.getuid()
        and int(p) != os.getpid()]
print(os.path.exists('/tmp/secret'), os.path.exists('/dev/shm/secret'), os.path.exists('/var/tmp/d'), left)
print(sorted(os.environ))
import sys
print(sys.flags.no_user_site, sys.flags.ignore_environment, sys.flags.safe_path, sys.path[0] != '')
""")
    assert second.runner == first.runner, "sequential calls should reuse the warm runner"
    lines = second.stdout.splitlines()
    assert lines[0] == "False False False []", second
    assert "K" not in lines[1], "the environment is reset"
    # The zygote's own allocator settings (spawn.rs ZYGOTE_ENV) are not the calls'.
    assert not {"PYTHONMALLOC", "GLIBC_TUNABLES", "LD_BIND_NOW"} & set(eval(lines[1])), lines[1]
    # Isolated like `python3 -I` (user site off, no current directory on
    # the path), without -E's effect on the zygote's own variables.
    assert lines[2] == "1 0 True True", second


async def test_a_call_cannot_reach_the_monitors_socket(client: DSecClient) -> None:
    # The edge talks to the monitor over a Unix socket in the runner; it
    # exists only until the edge has connected, before any call runs.
    r = await call(client, """
import os, socket
print(os.path.exists('/var/lib/dsec-fncall/edge'))
s = socket.socket(socket.AF_UNIX)
try:
    s.connect('/var/lib/dsec-fncall/edge/monitor.sock')
    print('connected')
except OSError as e:
    print(type(e).__name__)
""")
    assert r.ok and r.stdout == "False\nFileNotFoundError\n", r
    # Requests still go through it: the runner answers the next call.
    again = await call(client, "print(6 * 7)")
    assert again.ok and again.stdout == "42\n", again


async def test_ipc_objects_and_clone_parent_children_do_not_survive(client: DSecClient) -> None:
    # System V IPC objects (removed as the call user: the runner has no
    # CAP_SYS_ADMIN), a process made the zygote's child with
    # clone(CLONE_PARENT) (not reparented to the monitor), and a file
    # renamed into /tmp (the sweep's inotify watch sees IN_MOVED_TO).
    await warm_pools(client)
    first = await call(client, """
import ctypes, os, time
libc = ctypes.CDLL(None, use_errno=True)
ids = [libc.shmget(0, 4096, 0o1600), libc.msgget(0, 0o1600), libc.semget(0, 1, 0o1600)]
pid = libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0)   # clone(CLONE_PARENT | SIGCHLD)
if pid == 0:
    time.sleep(1000)
    os._exit(0)
open('moved', 'w').write('m')
os.rename('moved', '/tmp/moved')
print(all(i >= 0 for i in ids), pid > 0)
""")
    assert first.ok and first.stdout == "True True\n", first
    second = await call(client, """
import os
left = [p for p in os.listdir('/proc') if p.isdigit() and os.stat('/proc/' + p).st_uid == os.getuid()
        and int(p) != os.getpid()]
ipc = [len(open('/proc/sysvipc/' + k).read().splitlines()) - 1 for k in ('shm', 'msg', 'sem')]
print(os.path.exists('/tmp/moved'), left, ipc)
""")
    assert second.runner == first.runner, "sequential calls should reuse the warm runner"
    assert second.ok and second.stdout == "False [] [0, 0, 0]\n", second


async def test_misbehaving_code_gets_a_verdict_and_the_runner_recovers(client: DSecClient) -> None:
    fork_bomb = await call(client, "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass",
                           time_limit=2)
    assert fork_bomb.status in ("timeout", "runtime_error"), fork_bomb
    memory = await call(client, "x = bytearray(512 << 20)", memory_limit_mb=64)
    assert memory.status == "memory_limit", memory
    flood = await call(client, "while True: print('y' * 1000)", output_limit_bytes=10000, time_limit=5)
    assert flood.status == "output_limit" and flood.run is not None and flood.run.truncated, flood
    assert len(flood.stdout) <= 10000
    sleeper = await call(client, "import time; time.sleep(100)", time_limit=1)
    assert sleeper.status == "timeout" and sleeper.run is not None
    assert 900 <= sleeper.run.duration_ms < 5000, sleeper.run
    spin = await call(client, "while True: pass", time_limit=1)
    assert spin.status == "timeout", spin
    net = await call(client, """
import socket
s = socket.socket()
s.settimeout(2)
try:
    s.connect(('10.255.255.1', 80))   # no route out of the runner's network namespace
    print('connected')
except OSError as e:
    print('refused', e.errno)
""")
    assert net.ok and net.stdout.startswith("refused"), net
    writes = await call(client, """
for p in ('/etc/passwd', '/usr/bin/python3', '/usr/local/lib/x', '/var/lib/dsec-fncall/x', '/root/x'):
    try:
        open(p, 'a').write('x')
        print('wrote', p)
    except OSError as e:
        print('denied', p)
""")
    assert writes.ok and "wrote" not in writes.stdout, writes
    after = await call(client, "print('still fine')")
    assert after.ok and after.stdout == "still fine\n", after


async def test_judge_cpp_verdicts_and_compile_cache(client: DSecClient) -> None:
    cases = [TestCase("1 2", "3"), TestCase("10 20\n", "30\n"), TestCase("2 2", "5")]
    r = await call(client, ADD_CPP, language="cpp", test_cases=cases)
    assert r.verdict == "WA" and r.status == "wrong_answer", r
    assert [c.verdict for c in r.cases] == ["AC", "AC", "WA"]
    assert r.compile is not None and r.compile.status == "ok"
    again = await call(client, ADD_CPP, language="cpp", test_cases=cases[:2])
    assert again.verdict == "AC" and again.compile_cached and again.compile is None, again
    stop = await call(client, ADD_CPP, language="cpp", test_cases=[TestCase("1 1", "3"), TestCase("1 1", "2")])
    assert [c.verdict for c in stop.cases] == ["WA", "SKIPPED"]
    run_all = await call(client, ADD_CPP, language="cpp", stop_on_first_failure=False,
                         test_cases=[TestCase("1 1", "3"), TestCase("1 1", "2")])
    assert [c.verdict for c in run_all.cases] == ["WA", "AC"]
    ce = await call(client, "int main() { return x; }", language="cpp", test_cases=cases)
    assert ce.verdict == "CE" and ce.status == "compile_error" and "error" in ce.compile.stderr, ce
    tle = await call(client, "int main() { for (;;) {} }", language="c", time_limit=1,
                     test_cases=[TestCase("", "")])
    assert tle.verdict == "TLE", tle
    re_ = await call(client, "int main() { int *p = 0; return *p; }", language="c", test_cases=[TestCase("", "")])
    assert re_.verdict == "RE", re_
    mle = await call(client, "#include <vector>\nint main() { std::vector<char> v(1L << 30, 1); return v[5]; }",
                     language="cpp", memory_limit_mb=64, test_cases=[TestCase("", "")])
    assert mle.verdict == "MLE", mle
    ole = await call(client, "#include <stdio.h>\nint main() { for (;;) puts(\"spam\"); }", language="c",
                     output_limit_bytes=4096, test_cases=[TestCase("", "")])
    assert ole.verdict == "OLE", ole


STDCPP_ADD = """#include <bits/stdc++.h>
using namespace std;
int main() { long a, b; cin >> a >> b; vector<long> v{a, b}; cout << accumulate(v.begin(), v.end(), 0L) << endl; }
"""


async def test_bits_stdcpp_is_precompiled_for_the_judges_cpp_options(client: DSecClient) -> None:
    # The judge image carries <bits/stdc++.h> precompiled for the options
    # C++ calls compile with (-O2 -std=gnu++17: dsec-fncall-runner's
    # CPP_FLAGS, which the image builder precompiles the header with). As
    # the call user, in a runner, g++ with those options uses it: `-H`
    # marks a valid precompiled header it reads with "!".
    probe = ("printf '#include <bits/stdc++.h>\\n' > probe.cpp\n"
             "g++ -O2 -std=gnu++17 -H -fsyntax-only probe.cpp 2>&1 | head -1\n")
    r = await call(client, probe, language="bash")
    assert r.status == "ok", r
    # (A `judge` image from before the precompiled header is kept by setup:
    # `dsec image rm judge` then `dsec image setup` replaces it.)
    assert r.stdout.startswith("! /usr/include/") and r.stdout.rstrip().endswith("/bits/stdc++.h.gch"), r
    # ... and a submission that includes it is judged as usual.
    cases = [TestCase("1 2", "3"), TestCase("10 20\n", "30\n")]
    ok = await call(client, STDCPP_ADD, language="cpp", test_cases=cases)
    assert ok.verdict == "AC" and ok.compile is not None and ok.compile.status == "ok", ok
    ce = await call(client, STDCPP_ADD.replace("cin >> a", "cin >> c"), language="cpp", test_cases=cases)
    assert ce.verdict == "CE" and "was not declared" in ce.compile.stderr, ce


async def test_judge_compare_modes_and_checker(client: DSecClient) -> None:
    prog = "print(1 / 3)"
    assert (await call(client, prog, test_cases=[TestCase("", "0.3333334")],
                       compare="float", float_tolerance=1e-6)).verdict == "AC"
    assert (await call(client, prog, test_cases=[TestCase("", "0.34")], compare="float")).verdict == "WA"
    assert (await call(client, "print('a  b')", test_cases=[TestCase("", "a b\n")])).verdict == "AC"
    assert (await call(client, "print('a  b')", test_cases=[TestCase("", "a b\n")],
                       compare="exact")).verdict == "WA"
    checker = ("python", "import sys\n"
                         "n = int(open('input.txt').read())\n"
                         "a, b = map(int, open('output.txt').read().split())\n"
                         "sys.exit(0 if a + b == n else 1)")
    ok = await call(client, "n = int(input()); print(1, n - 1)", checker=checker,
                    test_cases=[TestCase("5", "any split"), TestCase("9", "any split")])
    assert ok.verdict == "AC", ok
    bad = await call(client, "n = int(input()); print(1, n)", checker=checker, test_cases=[TestCase("5", "x")])
    assert bad.verdict == "WA", bad


async def test_a_python_submission_is_compiled_once_and_each_case_gets_its_input(client: DSecClient) -> None:
    # The monitor remembers what the compiler made of the sources it saw
    # last (compiled_cache.rs), so the runs after the first reuse it. Each
    # case keeps its own input, output and verdict.
    cases = [TestCase(str(i), str(i * 2)) for i in range(6)]
    ok = await call(client, "print(int(input()) * 2)", test_cases=cases)
    assert ok.verdict == "AC" and [c.verdict for c in ok.cases] == ["AC"] * 6, ok
    assert [c.run.stdout for c in ok.cases] == [f"{i * 2}\n" for i in range(6)], ok
    one_wrong = await call(client, "n = int(input())\nprint(0 if n == 3 else n * 2)", test_cases=cases,
                           stop_on_first_failure=False)
    assert [c.verdict for c in one_wrong.cases] == ["AC", "AC", "AC", "WA", "AC", "AC"], one_wrong
    broken = await call(client, "print(", test_cases=cases[:3], stop_on_first_failure=False)
    verdicts = [c.verdict for c in broken.cases]
    assert len(set(verdicts)) == 1 and verdicts[0] != "AC", broken
    assert all("SyntaxError" in c.run.stderr for c in broken.cases), broken
    # Another request with the same code, remembered or compiled again
    # (whichever runner takes it), is still right with its own input; so is
    # a source that differs by one character.
    again = await call(client, "print(int(input()) * 2)", test_cases=cases[:2])
    assert again.verdict == "AC", again
    single = await call(client, "print(int(input()) * 2)", stdin="21")
    assert single.stdout == "42\n", single
    other = await call(client, "print(int(input()) * 3)", stdin="21")
    assert other.stdout == "63\n", other


async def test_batch_and_concurrency(client: DSecClient) -> None:
    calls = [dict(language="python", code=f"print({i} * {i})") for i in range(40)]
    calls.append(dict(language="cobol", code="DISPLAY 'HI'."))
    results = await client.fncall_batch(calls)
    assert len(results) == 41
    for i, r in enumerate(results[:40]):
        assert isinstance(r, dsec.FnCallResult) and r.stdout == f"{i * i}\n", r
    assert isinstance(results[40], dsec.errors.DSecError) and results[40].code == "unsupported_language"
    many = await asyncio.gather(*(call(client, f"print({i})") for i in range(64)))
    assert [r.stdout for r in many] == [f"{i}\n" for i in range(64)]
    pools = {p["language"]: p for p in await client.fncall_pools()}
    assert pools["python"]["runners"] >= 1 and pools["python"]["calls"] >= 100, pools


async def test_malformed_calls_are_clear_4xx(client: DSecClient) -> None:
    with pytest.raises(dsec.errors.DSecError) as e:
        await call(client, "x", language="cobol")
    assert e.value.code == "unsupported_language" and e.value.status == 400
    with pytest.raises(dsec.InvalidLimits):
        await call(client, "x", time_limit=0)
    with pytest.raises(dsec.InvalidLimits):
        await call(client, "x", memory_limit_mb=10**6)
    with pytest.raises(dsec.InvalidRequest):
        await call(client, "x", files={"/etc/passwd": "x"})
    with pytest.raises(dsec.InvalidRequest):
        await call(client, "x", files={"../up": "x"})
    with pytest.raises(dsec.InvalidRequest):
        await client.fncall_batch([dict(language="python", code="1")] * 1001)


def _post(url: str, body: object, token: str | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_raw_http_bad_bodies(server: Server, tenant: Tenant) -> None:
    url = f"{server.url}/v1/fncall"
    assert _post(url, b"{not json", tenant.token)[0] == 400
    status, body = _post(url, {"language": "python", "code": "1", "bogus": 1}, tenant.token)
    assert status == 400 and body["error"]["code"] == "invalid_request"
    assert _post(url, {"language": "python", "code": "1"})[0] == 401
    status, body = _post(url, {"language": "python", "code": "1", "files": {"a": "!!"}}, tenant.token)
    assert status == 400 and "base64" in body["error"]["message"]


def test_sandboxfusion_client_unchanged(server: Server, tenant: Tenant) -> None:
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code, set_endpoint

    set_endpoint(f"{server.url}/sandboxfusion/{tenant.token}")
    ok = run_code(RunCodeRequest(code="print(input() * 2)", stdin="ab", language="python"))
    assert ok.status == RunStatus.Success and ok.run_result.stdout == "abab\n", ok
    assert ok.run_result.return_code == 0 and ok.run_result.execution_time is not None
    cpp = run_code(RunCodeRequest(code=ADD_CPP, stdin="2 3", language="cpp"))
    assert cpp.status == RunStatus.Success and cpp.run_result.stdout == "5\n", cpp
    assert cpp.compile_result is not None and cpp.compile_result.return_code == 0
    failed = run_code(RunCodeRequest(code="import sys; sys.exit(2)", language="python"))
    assert failed.status == RunStatus.Failed and failed.run_result.return_code == 2
    tle = run_code(RunCodeRequest(code="while True: pass", language="python", run_timeout=1))
    assert tle.status == RunStatus.Failed and tle.run_result.status == "TimeLimitExceeded"
    files = run_code(RunCodeRequest(code="print(open('in.txt').read()); open('o.txt','w').write('r')",
                                    language="python", files={"in.txt": "aGk="}, fetch_files=["o.txt"]))
    assert files.run_result.stdout == "hi\n" and files.files == {"o.txt": "cg=="}, files

    # verl's own request shape: a full URL, memory_limit_MB, stdin "None".
    status, body = _post(f"{server.url}/sandboxfusion/{tenant.token}/run_code", {
        "compile_timeout": 10, "run_timeout": 10, "code": "print(input())", "stdin": "None",
        "memory_limit_MB": 512, "language": "python", "files": {}, "fetch_files": []})
    assert status == 200 and body["status"] == "Success" and body["run_result"]["stdout"] == "None\n", body

    # Access control: a wrong token is refused; the bare path is closed.
    status, body = _post(f"{server.url}/sandboxfusion/not-a-token/run_code", {"code": "1", "language": "python"})
    assert status == 401, body
    status, body = _post(f"{server.url}/run_code", {"code": "1", "language": "python"})
    assert status == 404 and "sandboxfusion" in body["error"]["message"], body
    status, body = _post(f"{server.url}/sandboxfusion/{tenant.token}/run_code", {"code": "1", "language": "cobol"})
    assert status == 400 and body["error"]["code"] == "unsupported_language"


@pytest.fixture(scope="module")
def one_runner_server() -> Iterator[Server]:
    """A server with one Python runner and room for two waiting calls."""
    yield from serve_dsec(["--fncall-pools", "python=1:1", "--fncall-queue-limit", "2"])


async def test_a_full_queue_is_429_and_sandboxfusion_504(one_runner_server: Server) -> None:
    srv = one_runner_server
    async with DSecClient(srv.url, srv.admin_token) as c:
        for _ in range(300):  # the pool's one runner is warm before the burst
            if (await c.fncall_pools())[0]["idle"] == 1:
                break
            await asyncio.sleep(0.1)
        slow = [c.fncall("python", "import time; time.sleep(1.5); print('done')") for _ in range(8)]
        results = await asyncio.gather(*slow, return_exceptions=True)
        done = [r for r in results if isinstance(r, dsec.FnCallResult)]
        full = [r for r in results if isinstance(r, dsec.errors.DSecError)]
        # One runs, two wait, the rest are turned away at once.
        assert len(done) == 3 and all(r.stdout == "done\n" for r in done), results
        assert len(full) == 5 and all(e.code == "queue_full" and e.status == 429 for e in full), full
        assert all(e.retry_after is not None and e.retry_after >= 1 for e in full)
        assert max(r.queued_ms for r in done) > 2000, "the last one waited for two calls"
        # The SandboxFusion door answers overload with 504 (what verl retries).
        busy = [asyncio.create_task(c.fncall("python", "import time; time.sleep(1.5)")) for _ in range(3)]
        await asyncio.sleep(0.3)
        loop = asyncio.get_running_loop()
        sf = loop.run_in_executor(None, _post, f"{srv.url}/sandboxfusion/{srv.admin_token}/run_code",
                                  {"code": "print(1)", "language": "python"})
        await asyncio.sleep(0.3)
        status, body = await sf
        await asyncio.gather(*busy, return_exceptions=True)
        assert status == 504, body
        pools = {p["language"]: p for p in await c.fncall_pools()}
        assert pools["python"]["runners"] == 1 and pools["python"]["queued"] == 0


def test_cli_fncall(server: Server, tenant: Tenant, tmp_path) -> None:
    binary = os.environ.get("DSEC_BIN") or str(Path(__file__).resolve().parents[4] / "target" / "release" / "dsec")
    env = dict(os.environ, DSEC_ENDPOINT=server.url, DSEC_TOKEN=tenant.token)
    out = subprocess.run([binary, "fncall", "-l", "python", "--code", "print(input() * 3)", "--stdin", "ab"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout) == (0, "ababab\n"), out
    src = tmp_path / "add.cpp"
    src.write_text(ADD_CPP)
    (tmp_path / "1.in").write_text("1 2")
    (tmp_path / "1.out").write_text("3")
    (tmp_path / "2.out").write_text("4")
    ok = subprocess.run([binary, "fncall", "-l", "cpp", str(src), "--case", f"{tmp_path}/1.in:{tmp_path}/1.out"],
                        env=env, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "verdict: AC" in ok.stdout, ok
    wa = subprocess.run([binary, "fncall", "-l", "cpp", str(src), "--case", f"{tmp_path}/1.in:{tmp_path}/2.out"],
                        env=env, capture_output=True, text=True, timeout=120)
    assert wa.returncode == 1 and "verdict: WA" in wa.stdout, wa
    fail = subprocess.run([binary, "fncall", "-l", "python", "--code", "import sys; sys.exit(4)"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert fail.returncode == 4, fail


@pytest.fixture(scope="module")
def elastic_server() -> Iterator[Server]:
    """A server whose Python pool starts empty and gives runners back fast."""
    yield from serve_dsec(["--fncall-pools", "python=0:3", "--fncall-idle-s", "1"])


async def test_pools_grow_with_load_and_shrink_when_idle(elastic_server: Server) -> None:
    srv = elastic_server
    async with DSecClient(srv.url, srv.admin_token) as c:
        pool = (await c.fncall_pools())[0]
        assert (pool["runners"], pool["min_runners"], pool["max_runners"]) == (0, 0, 3), pool
        first = await c.fncall("python", "print('cold')")
        assert first.ok and first.stdout == "cold\n"
        burst = await asyncio.gather(*(c.fncall("python", "import time; time.sleep(0.5)") for _ in range(6)))
        assert all(r.ok for r in burst)
        assert len({r.runner for r in burst}) >= 2, "six slow calls at once grew the pool"
        deadline = asyncio.get_running_loop().time() + 20
        # The pool forgets a runner before its sandbox is gone: wait for both
        # (on a loaded machine the removal can trail by a moment).
        while ((await c.fncall_pools())[0]["runners"] > 0
               or await c.list(labels={"dsec.fncall": "python"}) != []):
            assert asyncio.get_running_loop().time() < deadline, (
                await c.fncall_pools(), await c.list(labels={"dsec.fncall": "python"}))
            await asyncio.sleep(0.5)
        again = await c.fncall("python", "print('again')")
        assert again.ok and again.stdout == "again\n"


def _runner_monitor_pid(runner: str) -> int:
    """The pid of a runner's monitor (the zygote script's process whose
    parent is the runner's guest agent), found through its cgroup."""
    node = runner.split(".")[0]
    for procs in Path("/sys/fs/cgroup").glob(f"**/dsec/{node}/{runner}/cgroup.procs"):
        for pid in procs.read_text().split():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
                parent = Path(f"/proc/{ppid}/comm").read_text().strip()
            except OSError:
                continue
            if b"dsec-fncall-zygote.py" in cmdline and parent == "dsec-agent":
                return int(pid)
    raise AssertionError(f"no monitor process found for runner {runner}")


def _runner_cpu_quota_cores(runner: str) -> float:
    """A runner's CPU quota in cores, from its cgroup (v1 or v2)."""
    node = runner.split(".")[0]
    for f in Path("/sys/fs/cgroup").glob(f"**/dsec/{node}/{runner}/cpu.cfs_quota_us"):
        period = int((f.parent / "cpu.cfs_period_us").read_text())
        return int(f.read_text()) / period
    for f in Path("/sys/fs/cgroup").glob(f"**/dsec/{node}/{runner}/cpu.max"):
        quota, period = f.read_text().split()
        return int(quota) / int(period)
    raise AssertionError(f"no CPU controller found for runner {runner}")


async def test_a_runner_reserves_one_core_and_may_use_every_core(one_runner_server: Server) -> None:
    # A call is a pipeline of processes that overlap on several cores; a
    # one-core quota throttled a runner serving a single client.
    srv = one_runner_server
    async with DSecClient(srv.url, srv.admin_token) as c:
        r = await c.fncall("python", "print('q')")
        assert r.ok, r
        cores = os.cpu_count() or 1
        assert _runner_cpu_quota_cores(r.runner) == pytest.approx(max(cores, 1))
        info = await c.get(r.runner)
        assert info.limits.cpu_cores_limit == pytest.approx(min(1.0, cores)), "the reservation stays one core"


async def test_a_runner_that_dies_is_replaced(one_runner_server: Server) -> None:
    srv = one_runner_server
    async with DSecClient(srv.url, srv.admin_token) as c:
        first = await c.fncall("python", "print('before')")
        assert first.ok, first
        os.kill(_runner_monitor_pid(first.runner), 9)
        # The call that meets the dead runner runs again on its replacement:
        # the caller gets the program's result, not the runner's fault.
        during = await c.fncall("python", "print('during')")
        assert during.ok and during.stdout == "during\n" and during.runner != first.runner, during
        after = await c.fncall("python", "print('after')")
        assert after.ok and after.stdout == "after\n" and after.runner == during.runner, after
        pool = (await c.fncall_pools())[0]
        assert pool["runners_replaced"] >= 1 and pool["runners"] == 1, pool
        assert first.runner not in {s.id for s in await c.list(labels={"dsec.fncall": "python"})}
