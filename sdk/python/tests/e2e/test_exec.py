"""Commands: env, cwd, users, argv, stdin, exit codes, timeouts, output caps,
streaming, sessions and terminals, against the real server."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

import dsec
from dsec import DSecClient, ExecResult, OutputChunk
from dsec.sandbox import Sandbox

from .conftest import run_args

pytestmark = pytest.mark.e2e


async def test_env_cwd_user(sandbox: Sandbox) -> None:
    r = await sandbox.run_shell('echo "$FOO"; pwd; id -u', env={"FOO": "bar baz"}, cwd="/tmp")
    assert r.exit_code == 0, r
    assert r.stdout == "bar baz\n/tmp\n0\n"


async def test_init_user_and_root_override(client: DSecClient, image: str) -> None:
    async with await client.run_container(run_args(image, init_user="user")) as sb:
        assert sb.info.init_user == "user"
        r = await sb.run_shell("id -u")
        assert r.stdout == "1000\n", r
        r = await sb.run_shell("id -u", user="root")
        assert r.stdout == "0\n", r
        r = await sb.exec(["id", "-un"])
        assert r.stdout == "user\n", r


async def test_unknown_user(sandbox: Sandbox) -> None:
    with pytest.raises(dsec.UserNotFound):
        await sandbox.run_shell("true", user="no-such-user-here")


async def test_exec_argv_without_shell(sandbox: Sandbox) -> None:
    r = await sandbox.exec(["printf", "%s|%s", "a b", "$HOME"])
    assert r.exit_code == 0 and r.stdout == "a b|$HOME"


async def test_exec_missing_program(sandbox: Sandbox) -> None:
    with pytest.raises(dsec.SpawnFailed):
        await sandbox.exec(["/no/such/program"])
    r = await sandbox.run_shell("/no/such/program")
    assert r.exit_code == 127


async def test_stdin_text_and_bytes(sandbox: Sandbox) -> None:
    r = await sandbox.run_shell("cat", stdin="hello\nworld")
    assert r.stdout == "hello\nworld"
    r = await sandbox.exec(["od", "-An", "-tx1"], stdin=bytes([0, 255, 10]))
    assert r.stdout.split() == ["00", "ff", "0a"]
    r = await sandbox.run_shell("cat")  # no stdin: EOF at once, no hang
    assert r.exit_code == 0 and r.stdout == ""


async def test_exit_codes_and_stderr(sandbox: Sandbox) -> None:
    r = await sandbox.run_shell("echo out; echo err >&2; exit 7")
    assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
    assert not r.ok and r.signal is None and not r.timed_out
    assert (await sandbox.exec(["false"])).exit_code == 1
    assert (await sandbox.run_shell("true")).ok
    r = await sandbox.run_shell("kill -9 $$")
    assert r.signal == 9 and r.exit_code == 137


async def test_timeout(sandbox: Sandbox) -> None:
    t0 = time.monotonic()
    r = await sandbox.run_shell("sleep 30", timeout=1)
    elapsed = time.monotonic() - t0
    assert r.timed_out, r
    assert r.exit_code != 0
    assert elapsed < 15, elapsed
    # The sandbox is still usable afterwards.
    assert (await sandbox.run_shell("echo ok")).stdout == "ok\n"


async def test_output_cap(sandbox: Sandbox) -> None:
    r = await sandbox.run_shell("yes | head -c 5000000")
    assert r.exit_code == 0
    assert r.truncated
    assert 0 < len(r.stdout) <= 1 << 20
    assert set(r.stdout) <= {"y", "\n"}
    r = await sandbox.run_shell("yes | head -c 5000000", max_output_bytes=1000)
    assert r.truncated and len(r.stdout) == 1000
    r = await sandbox.run_shell("printf 12345", max_output_bytes=5)
    assert not r.truncated and r.stdout == "12345"


async def test_non_utf8_output_is_replaced(sandbox: Sandbox) -> None:
    r = await sandbox.run_shell(r"printf 'a\377b'")
    assert r.stdout == "a\ufffdb"


async def test_streaming_output_arrives_before_the_end(sandbox: Sandbox) -> None:
    t0 = time.monotonic()
    seen: list[tuple[float, OutputChunk]] = []
    result: ExecResult | None = None
    # The first line must come while the command still sleeps: ahead of the
    # second by most of the sleep, however slowly a busy host delivers it.
    async with sandbox.stream_shell("echo first; sleep 5; echo second >&2") as stream:
        async for item in stream:
            if isinstance(item, OutputChunk):
                seen.append((time.monotonic() - t0, item))
            else:
                result = item
    assert result is not None and result.exit_code == 0
    assert seen[0][1] == OutputChunk("stdout", b"first\n")
    assert seen[-1][1] == OutputChunk("stderr", b"second\n")
    assert seen[-1][0] - seen[0][0] >= 2.0, ("the first line came only at the end", seen)
    assert result.stdout == "first\n" and result.stderr == "second\n"


async def test_stream_stdin(sandbox: Sandbox) -> None:
    async with sandbox.stream_exec(["cat"]) as stream:
        await stream.write("ping\n")
        chunk = await asyncio.wait_for(stream.__anext__(), 10)
        assert chunk == OutputChunk("stdout", b"ping\n")
        await stream.write(b"pong\n")
        await stream.close_stdin()
        r = await asyncio.wait_for(stream.wait(), 10)
    assert r.exit_code == 0 and r.stdout == "ping\npong\n"


async def test_stream_signal(sandbox: Sandbox) -> None:
    async with sandbox.stream_shell("echo ready; exec sleep 60") as stream:
        first = await asyncio.wait_for(stream.__anext__(), 10)
        assert first == OutputChunk("stdout", b"ready\n")
        await stream.send_signal(signal.SIGTERM)
        r = await asyncio.wait_for(stream.wait(), 10)
    assert r.signal == signal.SIGTERM and r.exit_code == 128 + signal.SIGTERM


async def test_stream_timeout(sandbox: Sandbox) -> None:
    async with sandbox.stream_shell("sleep 30", timeout=1) as stream:
        r = await asyncio.wait_for(stream.wait(), 20)
    assert r.timed_out


async def test_sessions_keep_cwd_and_exports(sandbox: Sandbox) -> None:
    async with await sandbox.create_session(env={"START": "s"}) as session:
        r = await session.run("cd /tmp && export X=42 && mkdir -p here")
        assert r.exit_code == 0, r
        r = await session.run('pwd; echo "$X $START"')
        assert r.stdout == "/tmp\n42 s\n"
        r = await sandbox.run_shell('echo "[$X]"; pwd', session=session.id)
        assert r.stdout.startswith("[42]\n/tmp")
        # A plain exec does not see the session's state.
        r = await sandbox.run_shell('echo "[$X]"')
        assert r.stdout == "[]\n"
    with pytest.raises(dsec.SessionNotFound):
        await sandbox.run_shell("true", session=session.id)


async def test_session_with_cwd_and_user(client: DSecClient, image: str) -> None:
    async with await client.run_container(run_args(image, init_user="user")) as sb:
        session = await sb.create_session(cwd="/tmp", user="root")
        r = await session.run("pwd; id -u")
        assert r.stdout == "/tmp\n0\n"
        await session.close()


async def test_pty_echo_and_resize(sandbox: Sandbox) -> None:
    async with sandbox.pty(cmd="/bin/sh", rows=24, cols=80) as term:
        await term.send("echo marker-$((6*7))\n")
        out = await term.read_until("marker-42", timeout=15)
        assert b"marker-42" in out
        await term.resize(40, 120)
        await term.send("stty size\n")
        out = await term.read_until("40 120", timeout=15)
        assert b"40 120" in out
        await term.send("exit 3\n")
        result = await asyncio.wait_for(term.wait(), 15)
    assert result is not None and result.exit_code == 3


async def test_pty_is_a_tty(sandbox: Sandbox) -> None:
    async with sandbox.pty(cmd="tty; echo isatty=$?") as term:
        out = b""
        while True:
            chunk = await asyncio.wait_for(term.read(), 15)
            if not chunk:
                break
            out += chunk
    assert b"isatty=0" in out and b"/dev/pts" in out
