"""envd's process service through the unmodified SDK: foreground and
background commands, stdin, signals, reconnecting, the access token."""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import CommandExitException, PtySize, Sandbox
from e2b.exceptions import InvalidArgumentException, SandboxException, TimeoutException

from ..conftest import Server

pytestmark = pytest.mark.e2e


def test_foreground_commands(sbx: Sandbox) -> None:
    r = sbx.commands.run("echo out; echo err >&2; pwd", cwd="/tmp")
    assert (r.exit_code, r.stdout, r.stderr) == (0, "out\n/tmp\n", "err\n")
    with pytest.raises(CommandExitException) as e:
        sbx.commands.run("exit 3")
    assert e.value.exit_code == 3
    assert sbx.commands.run("id -u", user="root").stdout == "0\n"
    assert sbx.commands.run("echo $A$B", envs={"A": "x", "B": "y"}).stdout == "xy\n"
    seen: list[str] = []
    sbx.commands.run("for i in 1 2 3; do echo $i; done", on_stdout=seen.append)
    assert "".join(seen) == "1\n2\n3\n"


def test_background_commands_stdin_signals_connect(sbx: Sandbox) -> None:
    h = sbx.commands.run("cat", background=True, stdin=True)
    procs = sbx.commands.list()
    assert h.pid in [p.pid for p in procs]
    mine = next(p for p in procs if p.pid == h.pid)
    assert mine.cmd == "/bin/bash" and mine.args[-1] == "cat"
    sbx.commands.send_stdin(h.pid, "echoed\n")
    sbx.commands.close_stdin(h.pid)
    r = h.wait()
    assert (r.exit_code, r.stdout) == (0, "echoed\n")
    assert h.pid not in [p.pid for p in sbx.commands.list()]

    # A background command outlives its stream: disconnect, reconnect, kill.
    long = sbx.commands.run("sleep 1; echo late; sleep 60", background=True)
    long.disconnect()
    again = sbx.commands.connect(long.pid)
    out: list[str] = []
    for stdout, _, _ in again:
        if stdout:
            out.append(stdout)
            break
    assert out == ["late\n"]
    assert sbx.commands.kill(long.pid) is True
    with pytest.raises(CommandExitException) as e:
        again.wait()
    assert e.value.exit_code == -1
    assert sbx.commands.kill(long.pid) is False, "an ended process is not found"


def test_killed_sandbox_drops_streams(image: str) -> None:
    s = Sandbox.create(template=image, timeout=60)
    h = s.commands.run("sleep 300", background=True)
    Sandbox.kill(s.sandbox_id)
    with pytest.raises(SandboxException):
        h.wait()
    assert not s.is_running()


def test_access_token_is_required(server: Server, sbx: Sandbox) -> None:
    url = f"{server.url}/process.Process/List"
    base = {"E2b-Sandbox-Id": sbx.sandbox_id, "Content-Type": "application/json"}
    r = httpx.post(url, headers=base, content=b"{}")
    assert r.status_code == 401 and r.json()["code"] == "unauthenticated"
    r = httpx.post(url, headers={**base, "X-Access-Token": "wrong"}, content=b"{}")
    assert r.status_code == 401
    r = httpx.post(
        url, headers={**base, "X-Access-Token": sbx._envd_access_token or ""}, content=b"{}"
    )
    assert r.status_code == 200 and r.json() == {"processes": []}
    r = httpx.post(url, headers={**base, "X-Access-Token": sbx._envd_access_token or ""},
                   content=b" " * (17 << 20))
    assert r.status_code == 413, "an envd call's body is bounded"


def test_pty(sbx: Sandbox) -> None:
    term = sbx.pty.create(PtySize(rows=24, cols=80), cwd="/tmp", envs={"PS1": "$ "})
    sbx.pty.resize(term.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(term.pid, b"stty size; echo marker-$((6*7)); exit 5\n")
    seen = bytearray()
    with pytest.raises(CommandExitException) as e:
        term.wait(on_pty=seen.extend)
    assert e.value.exit_code == 5
    out = seen.decode(errors="replace")
    assert "30 100" in out, "Update resized the terminal"
    assert "marker-42" in out
    # A process without a PTY cannot be resized.
    h = sbx.commands.run("sleep 30", background=True)
    try:
        with pytest.raises(InvalidArgumentException):
            sbx.pty.resize(h.pid, PtySize(rows=1, cols=1))
    finally:
        h.kill()


def test_a_start_deadline_ends_the_process(sbx: Sandbox) -> None:
    # envd kills a process at its Start call's deadline (the command's
    # `timeout`), not when the stream merely goes away.
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=2)
    deadline = time.monotonic() + 10
    while any(p.args[-1] == "sleep 30" for p in sbx.commands.list()):
        assert time.monotonic() < deadline, "the process outlived its deadline"
        time.sleep(0.2)
    h = sbx.commands.run("sleep 2; echo done", background=True, timeout=0)
    h.disconnect()
    time.sleep(0.5)
    assert h.pid in [p.pid for p in sbx.commands.list()], "a closed stream leaves it running"
    assert sbx.commands.connect(h.pid).wait().stdout == "done\n"
