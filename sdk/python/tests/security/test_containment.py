"""The red-team suite: what an RL policy paid to find shortcuts tried in
production (docs/security.md, "Threat model"), and more, run as root inside
a real sandbox. Each case asserts containment (the host, the platform and a
neighbouring sandbox are unaffected) and, where the design records one,
the audit event."""

from __future__ import annotations

import asyncio
import shlex
import uuid
from pathlib import Path

import pytest

import dsec
from dsec import DSecClient, ExecResult
from dsec.sandbox import Sandbox

from ..e2e.conftest import Server

pytestmark = pytest.mark.e2e

Neighbour = tuple[Sandbox, str]


async def sh(sb: Sandbox, cmd: str, timeout: float = 30, **kw: object) -> ExecResult:
    return await sb.run_shell(cmd, timeout=timeout, **kw)  # type: ignore[arg-type]


async def py(sb: Sandbox, code: str, timeout: float = 30) -> ExecResult:
    return await sh(sb, "python3 -c " + shlex.quote(code), timeout=timeout)


async def refused(sb: Sandbox) -> list[str]:
    """The details of the sandbox's audit events."""
    return [e.detail for e in (await sb.audit_events()).events]


def host_file(path: str) -> str:
    return Path(path).read_text()


# --- the incidents DSec saw ---------------------------------------------------


async def test_forged_control_messages_cannot_reach_the_agent(sandbox: Sandbox,
                                                              neighbour: Neighbour) -> None:
    """The channel to the agent is a socketpair held only by PID 1, which is
    not dumpable: no path, no inherited fd, no /proc/1/fd."""
    r = await sh(sandbox, "ls /proc/1/fd; ls -l /proc/self/fd; cat /proc/net/unix; "
                          "echo forged > /proc/1/fd/3; echo end")
    assert "Permission denied" in r.stderr and "/proc/1/fd" in r.stderr, r
    # Our own fds: stdio and the fd ls used to read the directory, nothing else.
    fds = [ln.split()[-3] for ln in r.stdout.splitlines() if " -> " in ln]
    assert sorted(fds) == ["0", "1", "2", "3"], r.stdout
    assert "end" in r.stdout
    # pidfd_getfd on PID 1 needs ptrace access too.
    r = await py(sandbox, "import ctypes,os\n"
                          "libc=ctypes.CDLL(None,use_errno=True)\n"
                          "pfd=libc.syscall(434,1,0)\n"  # pidfd_open
                          "fd=libc.syscall(438,pfd,3,0)\n"  # pidfd_getfd
                          "print(fd, ctypes.get_errno())")
    assert r.stdout.split()[0] == "-1" and r.stdout.split()[1] == "1", r  # EPERM
    assert (await sh(sandbox, "echo still-served")).stdout == "still-served\n"


async def test_platform_state_and_logs_are_not_visible(server: Server, sandbox: Sandbox) -> None:
    marker = f"platform-secret-{uuid.uuid4().hex}"
    secret = server.data_dir / marker
    secret.write_text("answer")
    try:
        r = await sh(sandbox, f"ls {shlex.quote(str(server.data_dir))}; "
                              f"find / -xdev \\( -name {marker} -o -name edge.db -o -name "
                              "'apiserver.db' -o -name server.log \\) 2>/dev/null; "
                              "cat /proc/1/environ /proc/1/cmdline 2>&1 | head -c 300; "
                              "ls /proc/1/root/ 2>&1; readlink /proc/1/exe 2>&1; echo end")
        assert marker not in r.stdout and "edge.db" not in r.stdout, r
        assert "No such file or directory" in r.stderr or "No such file" in r.stdout, r
        assert "Permission denied" in r.stdout, r
        # The file API resolves every path inside the sandbox's own root.
        for path in [str(secret), f"/../../..{secret}", f"/proc/1/root{secret}"]:
            with pytest.raises(dsec.DSecError):
                await sandbox.read_file(path)
    finally:
        secret.unlink()


async def test_overwritten_bash_affects_only_its_own_sandbox(sandbox: Sandbox,
                                                             neighbour: Neighbour) -> None:
    """The platform runs commands through the image's shell (that is the
    user's command) but never runs an image program for itself: file
    transfers, listings and sessions keep working with agent code."""
    r = await sh(sandbox, "printf '#!/bin/sh\\necho pwned\\n' > /tmp/b && chmod 755 /tmp/b && "
                          "mv /tmp/b /bin/bash && echo replaced")
    assert "replaced" in r.stdout, r
    # The sandbox's own commands now run its own (changed) shell...
    assert (await sh(sandbox, "echo hi")).stdout == "pwned\n"
    # ...while the platform's own operations do not run image programs.
    await sandbox.write_file("/root/f", "data")
    assert await sandbox.read_file("/root/f") == b"data"
    assert any(f.name == "f" for f in await sandbox.list_dir("/root"))
    r = await sandbox.exec(["/bin/cat", "/root/f"])
    assert r.stdout == "data", r
    events = (await sandbox.audit_events()).events
    assert any(e.kind == "tamper" and "bash" in e.detail for e in events), events


async def test_extent_swapping_ioctls_are_refused(sandbox: Sandbox, neighbour: Neighbour) -> None:
    r = await py(sandbox, "import fcntl,os\n"
                          "a=os.open('/tmp/a',os.O_RDWR|os.O_CREAT); b=os.open('/tmp/b',os.O_RDWR|os.O_CREAT)\n"
                          "for name,cmd,size in [('SWAPEXT',0xc0c0586d,192),('MOVE_EXT',0xc028660f,40),"
                          "('EXCHANGE_RANGE',0x40285881,40)]:\n"
                          "    try: fcntl.ioctl(a, cmd, bytearray(size)); print(name,'allowed')\n"
                          "    except OSError as e: print(name, e.errno)")
    assert r.stdout.split() == ["SWAPEXT", "1", "MOVE_EXT", "1", "EXCHANGE_RANGE", "1"], r
    details = await refused(sandbox)
    for name in ("XFS_IOC_SWAPEXT", "EXT4_IOC_MOVE_EXT", "XFS_IOC_EXCHANGE_RANGE"):
        assert any(d.startswith(name + " refused") for d in details), details


async def test_recursive_grep_over_proc_meets_masked_files(sandbox: Sandbox) -> None:
    r = await sh(sandbox, "wc -c /proc/kpagecgroup /proc/kpageflags /proc/kpagecount /proc/kcore "
                          "/proc/timer_list /proc/sched_debug /proc/keys /proc/slabinfo "
                          "/proc/kmsg 2>/dev/null | tail -1; "
                          "timeout 20 grep -rs --exclude-dir='[0-9]*' -c zzz-not-there /proc >/dev/null; "
                          "echo grep-status=$?")
    total = r.stdout.splitlines()[0].split()[0]
    assert total == "0", r
    # Ran to the end (1: no match; 2: some files unreadable), not into the
    # timeout, and found nothing.
    assert r.stdout.splitlines()[1] in ("grep-status=1", "grep-status=2"), r


async def test_opening_masked_paths_is_audited(sandbox: Sandbox) -> None:
    before = (await sandbox.audit_events()).total
    r = await sh(sandbox, "cat /proc/kpagecgroup; ls /proc/acpi; echo 1 > /proc/sysrq-trigger; "
                          "echo done; sleep 1")
    assert r.stdout.strip() == "done", r
    masked: list[dsec.AuditEvent] = []
    for _ in range(50):
        log = await sandbox.audit_events(after=before)
        masked = [e for e in log.events if e.kind == "masked_path"]
        if {"/proc/kpagecgroup", "/proc/acpi"} <= {e.detail.split()[1].rstrip(",") for e in masked}:
            break
        await asyncio.sleep(0.1)
    details = [e.detail for e in masked]
    assert any(d.startswith("opened /proc/kpagecgroup, a masked file (by cat)") for d in details), details
    assert any(d.startswith("opened /proc/acpi, a masked directory (by ls)") for d in details), details
    # The pid is the process's pid inside the sandbox (a small number).
    assert all(0 < e.pid < 4_000_000 for e in masked if "(by cat)" in e.detail), masked


async def test_output_flood_is_bounded(sandbox: Sandbox) -> None:
    r = await sh(sandbox, "timeout 2 yes", timeout=20)
    assert r.truncated, "the flood must be cut"
    assert len(r.stdout) <= 16 << 20
    # Into a file: the sandbox's own disk limit, not the host's disk.
    r = await sh(sandbox, "yes > /tmp/flood; echo rc=$?; du -sm /tmp/flood", timeout=60)
    # EDQUOT from the layer's quota group (the default disk layer) or
    # ENOSPC from a tmpfs layer.
    assert "Disk quota exceeded" in r.stderr or "No space left on device" in r.stderr, r
    assert int(r.stdout.split()[-2]) <= 65, r


# --- resource abuse --------------------------------------------------------------


async def test_fork_bomb_hits_the_pids_limit(sandbox: Sandbox, neighbour: Neighbour) -> None:
    r = await py(sandbox, "import os,time\n"
                          "n=0\n"
                          "try:\n"
                          "    while True:\n"
                          "        if os.fork()==0: time.sleep(2); os._exit(0)\n"
                          "        n+=1\n"
                          "except OSError as e: print('stopped', n, e.errno)", timeout=60)
    words = r.stdout.split()
    assert words[0] == "stopped" and int(words[1]) < 64 and words[2] == "11", r  # EAGAIN
    # Once the children are gone (2 s), the sandbox serves commands again.
    for _ in range(50):
        try:
            if (await sh(sandbox, "echo alive")).stdout == "alive\n":
                break
        except dsec.DSecError:
            pass
        await asyncio.sleep(0.2)
    else:
        pytest.fail("the sandbox did not recover from its fork bomb")


async def test_memory_bomb_is_killed_inside(sandbox: Sandbox, neighbour: Neighbour) -> None:
    r = await py(sandbox, "b=[]\nwhile True: b.append(bytearray(16<<20))", timeout=60)
    assert r.exit_code != 0 and (r.signal == 9 or r.exit_code == 137), r
    # The agent (PID 1) survives its sandbox's OOM.
    assert (await sh(sandbox, "echo alive")).stdout == "alive\n"


async def test_disk_fill_fails_inside(sandbox: Sandbox, neighbour: Neighbour) -> None:
    r = await sh(sandbox, "dd if=/dev/zero of=/root/fill bs=1M count=1000 2>&1; sync; du -sk /root/fill",
                 timeout=60)
    assert "Disk quota exceeded" in r.stdout or "No space left on device" in r.stdout, r
    # The sandbox's layer holds its own 64 MiB, whatever the host has.
    size_kb = int(r.stdout.splitlines()[-1].split()[0])
    assert size_kb <= 64 * 1024, r
    # A neighbour still writes (its own limit is untouched).
    nb, _ = neighbour
    r = await sh(nb, "dd if=/dev/zero of=/root/ok bs=1M count=8 2>&1 && rm /root/ok && echo wrote")
    assert r.stdout.endswith("wrote\n"), r


async def test_a_disk_larger_than_the_memory_is_no_oom(
        client: DSecClient, neighbour: Neighbour) -> None:
    """A container's writable layer lives on the node's disk: asked for
    more disk than memory, a sandbox writes more than its memory holds, by
    a command or by an upload the agent writes, and nothing is OOM-killed
    (the layer's pages are reclaimable page cache). The tmpfs layer's
    counterpart (held below the memory limit, ENOSPC) is
    tests/e2e/test_writable_layer.py's tmpfs node."""
    sb = await client.run_container(
        dsec.DSecContainerRunArgs(container_image="busybox", memory_limit_mb=64, disk_limit_mb=1024,
                                  cpu_cores_limit=1, ttl_running_stop=300, network_rules={},
                                  init_user="root", labels={"suite": "security"}), timeout=120)
    try:
        r = await sh(sb, "dd if=/dev/zero of=/root/fill bs=1M count=300 2>&1 && sync && wc -c < /root/fill",
                     timeout=120)
        assert r.exit_code == 0 and r.stdout.split()[-1] == str(300 << 20), r
        assert (await sh(sb, "rm /root/fill && echo alive")).stdout == "alive\n"
        await sb.write_file("/root/upload", b"\0" * (60 << 20))
        assert (await sh(sb, "wc -c < /root/upload")).stdout.strip() == str(60 << 20)
        assert (await sh(sb, "echo alive")).stdout == "alive\n"
        assert (await sb.refresh()).state == "running"
    finally:
        await sb.delete()
    nb, _ = neighbour
    assert (await sh(nb, "echo fine")).stdout == "fine\n"


# --- kernel surfaces ---------------------------------------------------------------


async def test_mount_unshare_setns_are_refused_and_audited(sandbox: Sandbox,
                                                           neighbour: Neighbour) -> None:
    r = await sh(sandbox, "unshare -U true; unshare -m true; unshare -n true; "
                          "mount -t tmpfs x /mnt; mount -t cgroup -o memory cgroup /mnt; "
                          "umount /proc/kpagecgroup; echo end")
    assert r.stdout == "end\n", r
    # Joining a namespace (its own: the fd of another one is not even
    # reachable, /proc/1/ns needs ptrace access).
    r = await py(sandbox, "import ctypes,os\nlibc=ctypes.CDLL(None,use_errno=True)\n"
                          "fd=os.open('/proc/self/ns/mnt',os.O_RDONLY)\n"
                          "print(libc.setns(fd,0), ctypes.get_errno())")
    assert r.stdout == "-1 1\n", r
    details = await refused(sandbox)
    assert sum(d.startswith("unshare refused") for d in details) >= 3, details
    assert sum(d.startswith("mount refused") for d in details) >= 2, details
    assert any(d.startswith("umount2 refused") for d in details), details
    assert any(d.startswith("setns refused") for d in details), details
    # Masks still in place.
    assert (await sh(sandbox, "wc -c < /proc/kpagecgroup")).stdout.strip() == "0"


async def test_kernel_interfaces_are_refused_and_audited(sandbox: Sandbox) -> None:
    calls = {"bpf": 321, "perf_event_open": 298, "keyctl": 250, "add_key": 248,
             "swapoff": 168, "reboot": 169, "init_module": 175, "kexec_load": 246,
             "userfaultfd": 323, "open_by_handle_at": 304, "acct": 163, "syslog": 103,
             "clock_settime": 227, "iopl": 172, "io_uring_setup": 425}
    code = ("import ctypes\nlibc=ctypes.CDLL(None,use_errno=True)\n"
            f"for name,nr in {calls!r}.items():\n"
            "    r=libc.syscall(nr,0,0,0,0,0); print(name, r, ctypes.get_errno())")
    r = await py(sandbox, code)
    lines = r.stdout.splitlines()
    assert len(lines) == len(calls), r
    for ln in lines:
        name, ret, err = ln.split()
        assert (ret, err) == ("-1", "1"), ln
    details = await refused(sandbox)
    for name in calls:
        assert any(d.startswith(name + " refused") for d in details), (name, details)


async def test_audit_volume_is_bounded(sandbox: Sandbox) -> None:
    r = await py(sandbox, "import ctypes\nlibc=ctypes.CDLL(None,use_errno=True)\n"
                          "for _ in range(2000): libc.syscall(165,0,0,0,0,0)\nprint('done')")
    assert r.stdout == "done\n", r
    log = await sandbox.audit_events()
    assert log.total == 2000 and len(log.events) == 256 and log.dropped == 2000 - 256, log
    assert log.events[-1].seq == 2000
    page = await sandbox.audit_events(after=1990)
    assert [e.seq for e in page.events] == list(range(1991, 2001))


async def test_ptrace_and_proc_tricks_stay_inside(sandbox: Sandbox, neighbour: Neighbour) -> None:
    r = await py(sandbox, "import ctypes,os\nlibc=ctypes.CDLL(None,use_errno=True)\n"
                          "print(libc.ptrace(16,1,0,0), ctypes.get_errno())\n"  # PTRACE_ATTACH PID 1
                          "print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit())[:3])")
    first, pids = r.stdout.splitlines()
    assert first == "-1 1", r
    # Only the sandbox's own processes exist for it; PID 1 is its agent.
    assert pids.startswith("[1, "), r
    r = await sh(sandbox, "ls /proc/1/root /proc/1/cwd 2>&1; cat /proc/1/maps 2>&1 | head -1")
    assert r.stdout.count("Permission denied") >= 3, r


async def test_symlinks_and_dotdot_against_the_file_api(server: Server, sandbox: Sandbox) -> None:
    host_marker = server.data_dir / f"host-{uuid.uuid4().hex}"
    host_marker.write_text("host")
    try:
        await sh(sandbox, "ln -s / /root/up; ln -s ../../../../../.. /root/dots; "
                          f"ln -s {shlex.quote(str(host_marker))} /root/direct")
        for path in [f"/root/up{host_marker}", f"/root/dots{host_marker}", "/root/direct",
                     f"/root/../../../..{host_marker}"]:
            with pytest.raises(dsec.DSecError):
                await sandbox.read_file(path)
        # Writes through the same tricks land inside the sandbox, if anywhere.
        await sandbox.write_file("/root/up/tmp/x", "in")
        assert (await sh(sandbox, "cat /tmp/x")).stdout == "in"
        assert host_marker.read_text() == "host"
    finally:
        host_marker.unlink()


async def test_setuid_binaries_do_not_escalate(sandbox: Sandbox) -> None:
    r = await sh(sandbox, "cp /usr/bin/id /tmp/suid-id && chmod 4755 /tmp/suid-id && "
                          "cp /usr/bin/id /usr/local/bin/suid-id && chmod 4755 /usr/local/bin/suid-id && "
                          "ls -l /usr/local/bin/suid-id | cut -c1-10")
    assert r.stdout.startswith("-rwsr-xr-x"), r
    r = await sh(sandbox, "/tmp/suid-id -u; /usr/local/bin/suid-id -u; "
                          "grep NoNewPrivs /proc/self/status", user="user")
    assert r.stdout.split() == ["1000", "1000", "NoNewPrivs:", "1"], r


async def test_device_nodes_and_sysrq(sandbox: Sandbox) -> None:
    # (Kernels without CONFIG_MAGIC_SYSRQ have no sysrq-trigger at all;
    # where it exists, it is the empty read-only mask file: writes fail.)
    r = await sh(sandbox, "mknod /tmp/sda b 8 0; mknod /tmp/mem c 1 1; ls /dev; "
                          "if [ -e /proc/sysrq-trigger ]; then echo c > /proc/sysrq-trigger; "
                          "[ -f /proc/sysrq-trigger ] && [ ! -s /proc/sysrq-trigger ] && echo sysrq=empty-file; fi")
    assert r.stderr.count("Operation not permitted") == 2, r
    sysrq = [w for w in r.stdout.split() if w.startswith("sysrq=")]
    assert sysrq in ([], ["sysrq=empty-file"]), r
    devs = set(r.stdout.split()) - set(sysrq)
    assert devs == {"fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin",
                    "stdout", "tty", "urandom", "zero"}, devs


async def test_proc_sys_core_pattern_and_release_agent(sandbox: Sandbox) -> None:
    core = host_file("/proc/sys/kernel/core_pattern")
    r = await sh(sandbox, "echo '|/tmp/x' > /proc/sys/kernel/core_pattern; "
                          "echo 1 > /proc/sys/vm/drop_caches; ls -A /sys/fs/cgroup; "
                          "touch /sys/kernel/x; echo end")
    assert r.stderr.count("Read-only file system") >= 3, r
    assert r.stdout == "end\n", r
    assert host_file("/proc/sys/kernel/core_pattern") == core


async def test_network_is_loopback_only(server: Server, sandbox: Sandbox) -> None:
    """Raw sockets exist (ping needs them) but only on the sandbox's own
    loopback: the platform's API port on the host's 127.0.0.1 is not this
    127.0.0.1."""
    port = server.url.rsplit(":", 1)[1]
    r = await py(sandbox, "import socket\n"
                          "print([n for _, n in socket.if_nameindex()])\n"
                          "s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP); print('raw ok')\n"
                          "c=socket.socket()\n"
                          "try: c.connect(('127.0.0.1'," + port + ")); print('reached')\n"
                          "except OSError as e: print('refused', e.errno)")
    assert r.stdout.splitlines() == ["['lo']", "raw ok", "refused 111"], r


async def test_fncall_runners_carry_the_filter(client: DSecClient) -> None:
    res = await client.fncall("python", "import ctypes\nlibc=ctypes.CDLL(None,use_errno=True)\n"
                                        "print(libc.syscall(272,0x10000000), ctypes.get_errno())\n"
                                        "print(open('/proc/self/status').read().count('NoNewPrivs:\\t1'))")
    assert res.run is not None and res.run.stdout.split() == ["-1", "1", "1"], res


async def test_fncall_writes_only_where_its_cleanup_looks(client: DSecClient) -> None:
    """Landlock confines a call's writes to its scratch directory, the
    temporary directories and /dev, whatever else the image lets nobody
    write to (world-writable directories such as /run/lock)."""
    res = await client.fncall("python", (
        "import os, stat\n"
        "for d in ['/run/lock', '/var/lock', '/var/crash', '/var/mail', '/var/local']:\n"
        "    if os.path.isdir(d) and os.stat(d).st_mode & stat.S_IWOTH:\n"
        "        try:\n"
        "            open(d + '/x', 'w'); print(d, 'written')\n"
        "        except PermissionError:\n"
        "            print(d, 'refused')\n"
        "open('/tmp/ok', 'w').write('1'); open('ok', 'w').write('1')\n"
        "print('allowed ok')\n"))
    assert res.run is not None, res
    lines = res.run.stdout.splitlines()
    assert lines[-1] == "allowed ok", res
    assert "written" not in res.run.stdout and any(ln.endswith("refused") for ln in lines), res
