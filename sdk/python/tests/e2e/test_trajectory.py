"""The trajectory log against a real ``dsec up``: a reconnecting client
fast-forwards through steps it already ran (a non-idempotent command is not
run twice), a step id reused for another operation is refused, the log
lists every operation with its result and the files it changed, ``dsec
replay`` re-runs it in a fresh sandbox and reports divergences, creations
with an idempotency key are made once, and the log survives a restart of
the platform."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from dsec import (
    DSecClient,
    DSecConnectionError,
    FileNotFound,
    IdempotencyConflict,
    SandboxNotFound,
    StepConflict,
    StepInterrupted,
    TrajectoryNotFound,
)

from .conftest import REPO, Server, Tenant, run_args, serve_dsec

#: Appends a line and prints how many there are: running it twice shows.
APPEND = "echo {n} >> /tmp/counter && wc -l < /tmp/counter"


def busybox(**kw: object):  # noqa: ANN201 - run args
    return run_args("busybox", memory_limit_mb=64, cpu_cores_limit=0.2, **kw)


def dsec_cli(server: Server, tenant: Tenant, *args: str) -> subprocess.CompletedProcess[str]:
    binary = os.environ.get("DSEC_BIN") or str(REPO / "target" / "release" / "dsec")
    env = {**os.environ, "DSEC_ENDPOINT": server.url, "DSEC_TOKEN": tenant.token}
    return subprocess.run([binary, *args], env=env, capture_output=True, text=True, timeout=300)


async def test_a_reconnecting_client_fast_forwards_without_running_steps_twice(
        server: Server, tenant: Tenant) -> None:
    job = f"traj-{uuid.uuid4().hex[:8]}"
    async with DSecClient(server.url, tenant.token) as first:
        sb = await first.run_container(busybox(job=job), timeout=120)
    try:
        # The trainer's first life: three appends, an upload, a session.
        async with DSecClient(server.url, tenant.token) as c:
            s = c.sandbox(sb.id)
            outs = [(await s.run_shell(APPEND.format(n=i), step_id=f"s{i}")).stdout for i in range(3)]
            assert outs == ["1\n", "2\n", "3\n"]
            await s.write_file("/tmp/notes.txt", "first\n", step_id="w1")
            sess = await s.create_session(step_id="open")
            await sess.run("cd /tmp && export X=42", step_id="sess-1")

        # Preempted, back again: find the sandbox by its job, re-issue.
        async with DSecClient(server.url, tenant.token) as again:
            found = await again.list(job=job)
            assert [i.id for i in found] == [sb.id]
            s = await again.connect(sb.id)
            replayed = [(await s.run_shell(APPEND.format(n=i), step_id=f"s{i}")).stdout
                        for i in range(3)]
            assert replayed == outs
            w = await s.write_file("/tmp/notes.txt", "first\n", step_id="w1")
            assert w.bytes == 6
            again_sess = await s.create_session(step_id="open")
            assert again_sess.id == sess.id
            # Nothing ran twice: the file still has three lines.
            assert (await s.read_text("/tmp/counter")) == "0\n1\n2\n"
            # The first new step runs, in the session the log gave back.
            r = await again_sess.run("echo $X $PWD; " + APPEND.format(n=3), step_id="s3")
            assert r.stdout == "42 /tmp\n4\n"

            # A paused sandbox answers a logged step without being resumed.
            await s.pause()
            again_r = await s.run_shell(APPEND.format(n=0), step_id="s0")
            assert again_r.stdout == "1\n"
            assert (await again.get(sb.id)).state == "paused"
            # The node counts it as paused.
            async with DSecClient(server.url, server.admin_token) as admin:
                (node,) = (await admin.health()).nodes
                assert node.paused >= 1, node
            # A new step resumes it transparently.
            assert (await s.run_shell("cat /tmp/notes.txt", step_id="s4")).stdout == "first\n"
    finally:
        async with DSecClient(server.url, tenant.token) as c:
            await c.sandbox(sb.id).delete()


async def test_a_step_id_reused_for_another_operation_is_refused(client: DSecClient) -> None:
    sb = await client.run_container(busybox(), timeout=120)
    try:
        await sb.run_shell(APPEND.format(n=0), step_id="a")
        with pytest.raises(StepConflict) as e:
            await sb.run_shell("rm -rf /tmp", step_id="a")
        assert e.value.status == 409 and e.value.code == "step_conflict"
        assert "command" in e.value.message, e.value.message
        # An upload with other content under a logged step id, too.
        await sb.write_file("/tmp/x", "one", step_id="up")
        with pytest.raises(StepConflict):
            await sb.write_file("/tmp/x", "two", step_id="up")
        # Or another kind of operation.
        with pytest.raises(StepConflict):
            await sb.mkdir("/tmp/d", step_id="a")
        # Nothing of the refused operations ran.
        assert (await sb.run_shell("cat /tmp/counter /tmp/x; ls -d /tmp/d")).stdout.startswith("0\none")
        assert not await sb.exists("/tmp/d")
    finally:
        await sb.delete()


async def test_provenance_lists_each_operation_result_and_changed_files(
        client: DSecClient, server: Server, other_tenant: Tenant) -> None:
    sb = await client.run_container(busybox(), timeout=120)
    try:
        await sb.run_shell("mkdir -p /work && echo hi > /work/a.txt && echo out && echo err >&2",
                           step_id="make")
        await sb.write_file("/work/b.bin", b"\x00\x01", step_id="upload")
        await sb.run_shell("rm /bin/true; exit 3", step_id="rm")
        await sb.run_shell("cat /missing")  # no step id: logged all the same
        with pytest.raises(FileNotFound):
            await sb.remove("/nope", step_id="bad-rm")

        steps = await sb.trajectory()
        assert [s.seq for s in steps] == [1, 2, 3, 4, 5]
        assert [s.step_id for s in steps] == ["make", "upload", "rm", None, "bad-rm"]
        assert [s.kind for s in steps] == ["exec", "write_file", "exec", "exec", "remove"]
        assert all(s.status == "done" for s in steps)
        make, upload, rm, _, bad = steps
        assert make.command is not None and make.command.startswith("mkdir -p /work")
        assert (make.result.exit_code, make.result.stdout, make.result.stderr) == (0, "out\n", "err\n")
        assert {f.path for f in make.changed_files} == {"/work/a.txt"}
        assert upload.result == {"path": "/work/b.bin", "bytes": 2}
        assert [(f.path, f.change) for f in upload.changed_files] == [("/work/b.bin", "changed")]
        assert rm.result.exit_code == 3
        assert [(f.path, f.change) for f in rm.changed_files] == [("/bin/true", "deleted")]
        assert bad.error is not None and bad.error["code"] == "file_not_found"

        # The CLI shows the same log.
        out = dsec_cli(server, Tenant("t", client._transport.token or ""), "trajectory", sb.id)
        assert out.returncode == 0, out.stderr
        assert "mkdir -p /work" in out.stdout and "~ /work/a.txt" in out.stdout
        assert "- /bin/true" in out.stdout

        # Only the owner reads it; nothing inside the sandbox can.
        async with DSecClient(server.url, other_tenant.token) as other:
            with pytest.raises(SandboxNotFound):
                await other.sandbox(sb.id).trajectory()
        inside = await sb.run_shell("find / -xdev -name 'journal.db*' 2>/dev/null | head -1")
        assert inside.stdout == ""
    finally:
        await sb.delete()


async def test_streamed_commands_and_terminals_are_logged_and_fast_forwarded(
        client: DSecClient) -> None:
    sb = await client.run_container(busybox(), timeout=120)
    try:
        async with sb.stream_shell(APPEND.format(n=1) + " && echo oops >&2", step_id="st") as stream:
            first = await asyncio.wait_for(stream.wait(), 30)
        assert (first.exit_code, first.stdout, first.stderr) == (0, "1\n", "oops\n")
        # Re-issued (a client that came back): the recorded output streams
        # again as frames, and the command does not run a second time.
        chunks = []
        async with sb.stream_shell(APPEND.format(n=1) + " && echo oops >&2", step_id="st") as stream:
            async for item in stream:
                chunks.append(item)
        again = chunks[-1]
        assert (again.exit_code, again.stdout, again.stderr) == (0, "1\n", "oops\n")
        assert [c for c in chunks[:-1] if c.stream == "stdout"][0].data == b"1\n"
        assert (await sb.read_text("/tmp/counter")) == "1\n"
        # The same step id for another command is a conflict, as for run_shell.
        with pytest.raises(StepConflict):
            async with sb.stream_shell("echo other", step_id="st") as stream:
                await asyncio.wait_for(stream.wait(), 30)

        # A terminal is logged with its exit status and the files it changed.
        async with sb.pty(cmd="/bin/sh") as term:
            await term.send("echo typed > /tmp/from-pty; exit 4\n")
            ended = await asyncio.wait_for(term.wait(), 30)
        assert ended is not None and ended.exit_code == 4

        steps = await sb.trajectory()
        kinds = [(s.kind, s.step_id, s.status) for s in steps]
        assert kinds == [("exec", "st", "done"), ("pty", None, "done")], kinds
        streamed, pty = steps
        assert (streamed.result.exit_code, streamed.result.stdout) == (0, "1\n")
        assert {f.path for f in streamed.changed_files} == {"/tmp/counter"}
        assert pty.result.exit_code == 4
        assert {f.path for f in pty.changed_files} == {"/tmp/from-pty"}
    finally:
        await sb.delete()


async def test_dsec_replay_reports_where_a_fresh_sandbox_diverges(
        client: DSecClient, server: Server, tenant: Tenant) -> None:
    sb = await client.run_container(busybox(env={"GREETING": "hello"}), timeout=120)
    try:
        await sb.run_shell("echo $GREETING", step_id="greet")
        await sb.write_file("/tmp/data", "42\n", step_id="put")
        await sb.run_shell("cat /tmp/data; " + APPEND.format(n=0), step_id="read")
        sess = await sb.create_session(step_id="sess")
        await sess.run("cd /etc", step_id="cd")
        await sess.run("pwd", step_id="pwd")
        await sb.run_shell("head -c 8 /dev/urandom | od -An -tx1", step_id="random")

        done = dsec_cli(server, tenant, "replay", sb.id, "--json")
        assert done.returncode == 2, (done.stdout, done.stderr)
        report = json.loads(done.stdout)
        assert report["source_id"] == sb.id and report["replay_id"] != sb.id
        assert report["steps"] == report["replayed"] == 7
        assert not report["identical"]
        # Only the random step diverges: env, upload, sessions replay alike.
        assert [(d["step_id"], d["field"]) for d in report["divergences"]] == [("random", "stdout")]
        # The replay sandbox was removed.
        with pytest.raises(SandboxNotFound):
            await client.get(report["replay_id"])
        # Human output.
        text = dsec_cli(server, tenant, "replay", sb.id)
        assert text.returncode == 2 and "step 7 [random] exec: stdout differs" in text.stdout

        # Bad input: an unknown sandbox, a sandbox with no log.
        missing = dsec_cli(server, tenant, "replay", sb.id.split(".")[0] + ".aaaaaaaaaaaa")
        assert missing.returncode == 1 and "not found" in missing.stderr
        empty = await client.run_container(busybox(), timeout=120)
        try:
            with pytest.raises(TrajectoryNotFound):
                await empty.replay()
            no_log = dsec_cli(server, tenant, "replay", empty.id)
            assert no_log.returncode == 1 and "no trajectory log" in no_log.stderr
        finally:
            await empty.delete()
    finally:
        await sb.delete()


async def test_a_retried_create_with_an_idempotency_key_makes_one_sandbox(client: DSecClient) -> None:
    key = f"create-{uuid.uuid4().hex}"
    tag = uuid.uuid4().hex[:8]
    args = busybox(labels={"suite": "sdk-e2e", "idem": tag})
    made = await asyncio.gather(*(client.run_container(args, idempotency_key=key) for _ in range(3)))
    try:
        assert len({sb.id for sb in made}) == 1
        again = await client.run_container(args, idempotency_key=key)
        assert again.id == made[0].id
        listed = await client.list(labels={"idem": tag})
        assert [i.id for i in listed] == [made[0].id]
        with pytest.raises(IdempotencyConflict):
            await client.run_container(busybox(labels={"idem": "other"}), idempotency_key=key)
    finally:
        await made[0].delete()
    # Removing the sandbox frees its key.
    fresh = await client.run_container(args, idempotency_key=key)
    try:
        assert fresh.id != made[0].id
    finally:
        await fresh.delete()


async def test_the_log_survives_a_restart_and_an_interrupted_step_is_reported() -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="dsec-e2e-traj-"))
    node = f"e2e-traj-{uuid.uuid4().hex[:6]}"
    try:
        first = serve_dsec([], data_dir=data_dir, node=node, stop_sandboxes_on_exit=False)
        srv = next(first)
        tenant_token = _tenant(srv)
        async with DSecClient(srv.url, tenant_token) as c:
            sb = await c.run_container(busybox(), timeout=120)
            for i in range(3):
                await sb.run_shell(APPEND.format(n=i), step_id=f"s{i}")
            # A step still running when the platform crashes.
            inflight = asyncio.create_task(
                sb.run_shell("sleep 3; " + APPEND.format(n=9), step_id="inflight"))
            await asyncio.sleep(0.7)
            os.kill(srv.pid, signal.SIGKILL)
            first.close()
            with pytest.raises(DSecConnectionError):
                await inflight

        second = serve_dsec([], data_dir=data_dir, node=node)
        srv = next(second)
        try:
            async with DSecClient(srv.url, tenant_token) as c:
                s = await c.connect(sb.id)
                assert [(await s.run_shell(APPEND.format(n=i), step_id=f"s{i}")).stdout
                        for i in range(3)] == ["1\n", "2\n", "3\n"]
                with pytest.raises(StepInterrupted):
                    await s.run_shell("sleep 3; " + APPEND.format(n=9), step_id="inflight")
                steps = await s.trajectory()
                assert [(x.step_id, x.status) for x in steps] == [
                    ("s0", "done"), ("s1", "done"), ("s2", "done"), ("inflight", "interrupted")]
                # The first new step runs. (Whether the interrupted command
                # finished inside the sandbox is what the client must check.)
                await asyncio.sleep(3)
                lines = int((await s.run_shell("wc -l < /tmp/counter")).stdout)
                assert lines in (3, 4)
                r = await s.run_shell(APPEND.format(n=4), step_id="s4")
                assert r.stdout == f"{lines + 1}\n"
        finally:
            second.close()
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def _tenant(srv: Server) -> str:
    from .conftest import _create_tenant
    return _create_tenant(srv, "traj").token
