"""Full VMs end to end: QEMU ``q35`` booting the ``debian-vm`` image from a
qcow2 overlay under SeaBIOS (a whole Debian with systemd: tens of seconds
under TCG). One VM is booted for the whole file and shared by the tests in
order (exec and files through the guest agent, the screen, input, bad
input, its toolkit layer read through virtio-pmem DAX, pause, suspend and
restore, a snapshot and a fork of it, which boots a second VM, then
writes past its disk limit); the last test stops it and checks that
nothing of it is left on the host. One more VM boots under OVMF (UEFI) on
a server of its own. The image comes from ``dsec image setup`` (``DSEC_TEST_IMAGES_DIR``)
or ``DSEC_TEST_VM_IMAGES_DIR``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import json
import os
import signal
import struct
import time
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

import dsec
from dsec import DSecClient, DSecRunArgs

from .conftest import Server, Tenant, _create_tenant, _http, serve_dsec
from .test_microvm import _host_traces, _qemu_of

pytestmark = pytest.mark.e2e

MEMORY_MB = 512
# The shared VM's read-only layer (virtio-pmem + DAX, the edge's default).
TOOLKIT = "python"
#: What the VM may write on the host (its disk is the image's, 4,161 MiB).
DISK_MB = 512


def vm_args(image: str = "debian-vm", **kw: object) -> DSecRunArgs:
    base: dict[str, object] = dict(backend="vm", image=image, memory_limit_mb=MEMORY_MB,
                                   cpu_cores_limit=1, disk_limit_mb=DISK_MB, ttl_running_stop=900, init_user="root",
                                   labels={"suite": "sdk-e2e-vm"})
    base.update(kw)
    return DSecRunArgs(**base)  # type: ignore[arg-type]


def _image_disk_bytes() -> int:
    """The virtual size of debian-vm's disk (from its qcow2 header)."""
    with open(_vm_image(), "rb") as f:
        return struct.unpack(">Q", f.read(32)[24:32])[0]


def _vm_image() -> Path:
    given = os.environ.get("DSEC_TEST_VM_IMAGES_DIR")
    images = os.environ.get("DSEC_TEST_IMAGES_DIR")
    d = Path(given) if given else Path(images or "/var/lib/dsec/images") / "vm" / "images"
    return d / "debian-vm.qcow2"


@pytest.fixture(scope="module")
def vm_id(server: Server, tenant: Tenant) -> Iterator[str]:
    """One booted full VM for the whole file (over plain HTTP so it outlives
    each test's event loop)."""
    if not _vm_image().is_file():
        pytest.fail(f"no VM image at {_vm_image()}: run `dsec image setup` (it builds debian-vm) "
                    "or set DSEC_TEST_VM_IMAGES_DIR", pytrace=False)
    t0 = time.monotonic()
    status, raw = _http("POST", server.url + "/v1/sandboxes", tenant.token,
                        vm_args(toolkits=[TOOLKIT]).to_json(), timeout=400)
    assert status == 201, f"creating a VM answered {status}: {raw[:800]!r}\n{server.log_tail()}"
    print(f"full VM booted to its agent in {time.monotonic() - t0:.1f} s")
    sid = json.loads(raw)["id"]
    try:
        yield sid
    finally:
        _http("DELETE", f"{server.url}/v1/sandboxes/{sid}", tenant.token, timeout=60)


def png_info(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and the decompressed scanlines of a PNG (checks the
    signature and every chunk's CRC on the way)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    pos, width, height, idat = 8, 0, 0, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert zlib.crc32(kind + body) == crc, f"bad CRC in {kind!r}"
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
        pos += 12 + length
    return width, height, zlib.decompress(idat)


async def test_commands_and_files_run_in_the_guest_os(client: DSecClient, vm_id: str) -> None:
    sb = client.sandbox(vm_id)
    info = await sb.refresh()
    assert info.state == "running" and info.backend == "vm"
    r = await sb.run_shell("uname -r; hostname; nproc; awk '/MemTotal/ {print $2}' /proc/meminfo; "
                           "cat /proc/1/comm; cat /etc/debian_version; echo err >&2; exit 3")
    release, hostname, cpus, mem_kb, init, debian = r.stdout.split()
    assert release.endswith("-cloud-amd64") and release != os.uname().release
    assert vm_id.endswith(hostname)
    assert int(cpus) == 1
    assert 350 * 1024 < int(mem_kb) <= MEMORY_MB * 1024
    # A whole OS: its own init, booted from the image's disk.
    assert init == "systemd" and debian.startswith("12")
    assert r.stderr == "err\n" and r.exit_code == 3
    # disk_limit_mb caps the VM's writes; its disk is the image's.
    assert info.limits.disk_limit_mb == DISK_MB
    assert (await sb.run_shell("cat /sys/block/vda/size")).stdout == f"{_image_disk_bytes() // 512}\n"
    blob = os.urandom(2 << 20)
    await sb.write_file("/root/blob.bin", blob)
    assert await sb.read_file("/root/blob.bin") == blob
    r = await sb.run_shell("sha256sum /root/blob.bin | cut -c1-16")
    assert r.stdout.strip() == hashlib.sha256(blob).hexdigest()[:16]
    async with await sb.create_session() as session:
        await session.run("cd /tmp && export X=42")
        assert (await session.run('pwd; echo "$X"')).stdout == "/tmp\n42\n"


#: A one-answer-per-connection HTTP server in Perl (the image has perl-base,
#: not Python): the guest's port, reached from outside.
PERL_SERVER = r"""
use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalAddr => "127.0.0.1:8000", Listen => 8, ReuseAddr => 1) or die "listen: $!";
while (my $c = $s->accept) {
    while (my $line = <$c>) { last if $line =~ /^\r?$/ }
    print $c "HTTP/1.1 200 OK\r\nContent-Length: 13\r\nConnection: close\r\n\r\nfrom the vm\r\n";
    close $c;
}
"""


async def test_a_port_of_the_guest_is_reached_through_the_proxy(client: DSecClient, vm_id: str,
                                                                 server: Server, tenant: Tenant) -> None:
    sb = client.sandbox(vm_id)
    await sb.write_file("/root/srv.pl", PERL_SERVER)
    r = await sb.run_shell("(setsid perl /root/srv.pl >/root/srv.log 2>&1 &)")
    assert r.exit_code == 0, r
    url = f"{server.url}/v1/sandboxes/{vm_id}/ports/8000/hello"
    deadline = time.monotonic() + 60
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(url, headers={"Authorization": f"Bearer {tenant.token}"}) as resp:
                body = await resp.read()
                if resp.status == 200:
                    assert body == b"from the vm\r\n"
                    break
                assert resp.status == 502, body
            assert time.monotonic() < deadline, (await sb.run_shell("cat /root/srv.log")).stdout
            await asyncio.sleep(0.3)


async def test_the_screen_shows_the_console_and_changes_after_typing(client: DSecClient, vm_id: str) -> None:
    sb = client.sandbox(vm_id)
    before = await sb.screenshot()
    width, height, pixels = png_info(before)
    # VGA text mode: 80x25 cells of 9x16 pixels.
    assert (width, height) == (720, 400)
    assert len(set(pixels)) > 2, "the console shows something (a login prompt), not a blank screen"
    await sb.type_text("dsec-was-here")
    deadline = time.monotonic() + 30
    while True:
        after = await sb.screenshot()
        if png_info(after)[2] != pixels:
            break
        assert time.monotonic() < deadline, "the screen did not change after typing"
        await _sleep(0.5)
    # Keys, the pointer and clicks are accepted (the tablet and the PS/2
    # keyboard take them).
    await sb.send_keys(["ctrl-u", "ret"])
    await sb.move(100, 200)
    await sb.click(10, 10, button="right")
    await sb.click(double=True)


async def _sleep(s: float) -> None:
    import asyncio
    await asyncio.sleep(s)


async def test_bad_screen_input_is_refused(client: DSecClient, vm_id: str, image: str) -> None:
    sb = client.sandbox(vm_id)
    for call, needle in [
        (sb.send_keys(["ctrl-hyper"]), "unknown key"),
        (sb.send_keys([]), "1 to"),
        (sb.type_text("héllo"), "cannot be typed"),
        (sb.move(5000, 5), "outside"),
        (sb.click(button="wheel"), "mouse button"),
    ]:
        with pytest.raises(dsec.InvalidRequest) as e:
            await call
        assert e.value.status == 400 and needle in e.value.message, e.value.message
    with pytest.raises(dsec.InvalidRequest):
        await sb._t.request("POST", sb._t.url(sb._base + "/screen/click"), json_body={"x": 3})
    # A container has no screen.
    async with await client.run(DSecRunArgs(backend="container", image=image, memory_limit_mb=64)) as box:
        with pytest.raises(dsec.NoScreen) as e:
            await box.screenshot()
        assert e.value.status == 409 and "no screen" in e.value.message
        with pytest.raises(dsec.NoScreen):
            await box.type_text("x")


async def test_a_missing_vm_image_or_too_little_memory_is_refused(client: DSecClient) -> None:
    with pytest.raises(dsec.ImageNotFound) as e:
        await client.run(vm_args("no-such-os"))
    assert "dsec image setup" in e.value.message
    with pytest.raises(dsec.DSecError) as e2:
        await client.run(vm_args(memory_limit_mb=128))
    assert e2.value.status == 400 and "at least" in e2.value.message
    # Too small a write limit for the guest's own boot.
    with pytest.raises(dsec.InvalidLimits) as e3:
        await client.run(vm_args(disk_limit_mb=32))
    assert e3.value.status == 400 and "disk_limit_mb must be at least 64" in e3.value.message


async def test_pause_suspend_snapshot_and_fork_of_a_full_vm(server: Server, client: DSecClient,
                                                           vm_id: str) -> None:
    sb = client.sandbox(vm_id)
    await sb.run_shell("echo kept > /root/kept.txt; sleep 100000 >/dev/null 2>&1 & echo $! > /root/sleeper")
    # Freeze: QEMU stays, its vCPUs stopped; a request resumes it.
    p = await sb.pause(mode="freeze")
    assert p.changed and not p.suspended and len(_qemu_of(vm_id)) == 1
    assert (await sb.run_shell("cat /root/kept.txt")).stdout == "kept\n"
    # Suspend (the default for a VM): memory and devices to disk, QEMU gone.
    before = _qemu_of(vm_id)
    t0 = time.monotonic()
    p = await sb.pause()
    suspend_s = time.monotonic() - t0
    assert p.changed and p.suspended and p.sandbox.suspended and p.disk_bytes > 0
    assert _qemu_of(vm_id) == []
    assert list(server.data_dir.glob(f"edge/*/vm/suspend/{vm_id}.vmstate"))
    # A snapshot of the suspended VM's whole disk, without resuming it.
    snap = await sb.snapshot(f"vm-{vm_id.split('.')[1]}")
    assert snap.backend == "vm" and snap.image == "debian-vm" and snap.parent is None and snap.bytes > 0
    assert (await sb.refresh()).suspended
    # A request restores it transparently: the same processes, files, screen.
    t0 = time.monotonic()
    r = await sb.run_shell("cat /root/kept.txt; kill -0 $(cat /root/sleeper) && echo alive")
    restore_s = time.monotonic() - t0
    assert r.stdout == "kept\nalive\n", r
    after = _qemu_of(vm_id)
    assert len(after) == 1 and after != before, "a restore starts a new QEMU"
    assert not list(server.data_dir.glob(f"edge/*/vm/suspend/{vm_id}.vmstate")), "the image is spent"
    assert png_info(await sb.screenshot())[:2] == (720, 400)
    print(f"full VM: suspend {suspend_s:.2f} s ({p.disk_bytes >> 20} MiB), restore to a command {restore_s:.2f} s")
    # A fork boots a new VM from a disk chained onto the snapshot.
    kids = await client.fork(snap, 1, vm_args(), timeout=400)
    try:
        kid = kids[0]
        assert (await kid.refresh()).backend == "vm"
        r = await kid.run_shell("cat /root/kept.txt; hostname")
        kept, hostname = r.stdout.split()
        assert kept == "kept" and kid.id.endswith(hostname), r
        with pytest.raises(dsec.SnapshotInUse):
            await client.delete_snapshot(snap.name)
    finally:
        for kid in kids:
            await kid.delete()
    await client.delete_snapshot(snap.name)
    assert not [p for p in server.data_dir.glob("edge/*/vm/snapshots/*") if snap.id in p.name]


async def test_a_toolkit_layer_is_read_through_dax(server: Server, client: DSecClient, vm_id: str) -> None:
    """The toolkit's layer is a virtio-pmem region mounted with DAX: reading
    tens of MiB of its files barely grows the guest's page cache (through a
    block device, or on a layer whose files are not all flat-plain, it
    grows by what was read). The node's DAX copy records the layer it was
    made from, so that the reaper can remove it once the layer is gone."""
    copies = list(server.data_dir.glob("edge/*/vm/pmem/*.dax"))
    assert copies, "no DAX copy on the node"
    for copy in copies:
        source = Path(Path(f"{copy}.src").read_text())
        assert source.is_file() and copy.name == f"{source.name}.dax", (copy, source)
    sb = client.sandbox(vm_id)
    r = await sb.run_shell(
        "grep ' /opt/dsec/layers/0 ' /proc/mounts; "
        "c0=$(awk '/^Cached:/ {print $2}' /proc/meminfo); "
        "n=$(find /opt/dsec/layers -type f -size +16k -exec cat {} + 2>/dev/null | head -c 50331648 | wc -c); "
        "c1=$(awk '/^Cached:/ {print $2}' /proc/meminfo); echo $n $(( (c1 - c0) * 1024 ))", timeout=300)
    mount, sizes = r.stdout.strip().splitlines()
    assert mount.startswith("/dev/pmem") and " erofs " in mount and "dax=always" in mount, mount
    read, cache_growth = (int(x) for x in sizes.split())
    assert read >= 32 << 20, r.stdout
    assert cache_growth < read // 4, f"the guest cached {cache_growth} bytes for {read} read through DAX"


async def test_writes_past_the_disk_limit_fail_in_the_guest_not_on_the_host(
        server: Server, client: DSecClient, vm_id: str, image: str) -> None:
    """disk_limit_mb caps what the host holds of the VM's writes: the guest
    gets I/O errors past it, the sandbox says why, its neighbours write on."""
    sb = client.sandbox(vm_id)
    (overlay,) = server.data_dir.glob(f"edge/*/vm/overlays/{vm_id}.qcow2")
    r = await sb.run_shell(f"dd if=/dev/zero of=/root/fill bs=1M count={DISK_MB + 64} conv=fsync 2>&1; "
                           "echo dd=$?; sync; touch /root/after 2>&1; echo touch=$?", timeout=600)
    assert "dd=0" not in r.stdout or "touch=0" not in r.stdout, r.stdout
    held = overlay.stat().st_blocks * 512
    assert held <= DISK_MB << 20 and overlay.stat().st_size == DISK_MB << 20, (held, overlay.stat().st_size)
    deadline = time.monotonic() + 20
    while "disk limit reached" not in ((await sb.refresh()).state_reason or ""):
        assert time.monotonic() < deadline, "the sandbox does not say its disk is full"
        await _sleep(0.5)
    info = await sb.refresh()
    assert info.state == "running" and f"of {DISK_MB} MiB" in (info.state_reason or ""), info.state_reason
    # The guest still answers (its disk reads), and a neighbour still writes.
    assert (await sb.run_shell("cat /etc/debian_version")).exit_code == 0
    async with await client.run(DSecRunArgs(backend="container", image=image, memory_limit_mb=64)) as box:
        assert (await box.run_shell("head -c 1048576 /dev/zero > /tmp/x && echo ok")).stdout == "ok\n"


async def test_stop_leaves_nothing_behind(server: Server, client: DSecClient, vm_id: str) -> None:
    sb = client.sandbox(vm_id)
    assert _host_traces(vm_id), "a running VM must be visible (its QEMU names it)"
    overlays = list(server.data_dir.glob(f"edge/*/vm/overlays/{vm_id}.qcow2"))
    assert len(overlays) == 1
    info = await sb.stop()
    assert info.state == "stopped"
    assert _host_traces(vm_id) == []
    assert not overlays[0].exists()
    with pytest.raises(dsec.SandboxNotRunning):
        await sb.screenshot()


def _create_in_background(url: str, token: str, args: DSecRunArgs) -> concurrent.futures.Future[tuple[int, bytes]]:
    """POST /v1/sandboxes on a thread of its own: the answer comes when the
    VM has booted, or its creation ended."""
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    future = pool.submit(_http, "POST", url + "/v1/sandboxes", token, args.to_json(), 600)
    pool.shutdown(wait=False)
    return future


def _wait_for_a_booting_vm(url: str, token: str, label: str) -> str:
    """The id of the sandbox labelled `label` once it is `creating` and its
    QEMU runs (booting: tens of seconds under TCG)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status, raw = _http("GET", url + "/v1/sandboxes?label=boot%3D" + label, token)
        assert status == 200, raw
        found = [s for s in json.loads(raw)["sandboxes"] if s.get("labels", {}).get("boot") == label]
        if found and found[0]["state"] == "creating" and _qemu_of(found[0]["id"]):
            return found[0]["id"]
        assert not found or found[0]["state"] in ("queued", "creating"), found
        time.sleep(0.1)
    raise AssertionError(f"no QEMU of a creating VM labelled {label} within 60 s")


def test_a_vm_stopped_while_it_boots_is_cut_short(server: Server, tenant: Tenant) -> None:
    """A stop that finds a full VM still booting does not wait for the boot
    (the sandbox's operation lock): it kills the QEMU, the creation answers
    409 sandbox_ended, the record is `stopped` with the stop's reason, and
    nothing of the VM is left on the host."""
    label = uuid.uuid4().hex[:8]
    creation = _create_in_background(server.url, tenant.token, vm_args(labels={"suite": "sdk-e2e-vm", "boot": label}))
    sid = _wait_for_a_booting_vm(server.url, tenant.token, label)
    t0 = time.monotonic()
    status, raw = _http("POST", f"{server.url}/v1/sandboxes/{sid}/stop", tenant.token, timeout=120)
    took = time.monotonic() - t0
    assert status == 200, raw
    rec = json.loads(raw)
    assert rec["state"] == "stopped", rec
    code, body = creation.result(timeout=120)
    assert code == 409, body
    err = json.loads(body)["error"]
    assert err["code"] == "sandbox_ended" and "stopped before it started" in err["message"], err
    # The boot itself takes tens of seconds here; the stop, a kill and a cleanup.
    assert took < 10, f"the stop of a booting VM took {took:.1f} s"
    assert _host_traces(sid) == []
    assert _http("DELETE", f"{server.url}/v1/sandboxes/{sid}", tenant.token)[0] == 204


def test_a_node_shut_down_while_a_vm_boots_exits_at_once() -> None:
    """SIGTERM to `dsec up` while a full VM boots: the creation is cut
    short (answered 409 sandbox_ended) instead of holding the server's
    shutdown for the boot, and no QEMU or cgroup of it is left."""
    gen = serve_dsec(["--no-fncall"])
    srv = next(gen)
    try:
        tenant = _create_tenant(srv, "e2e-vm-shutdown")
        label = uuid.uuid4().hex[:8]
        creation = _create_in_background(srv.url, tenant.token, vm_args(labels={"suite": "sdk-e2e-vm", "boot": label}))
        sid = _wait_for_a_booting_vm(srv.url, tenant.token, label)
        t0 = time.monotonic()
        os.kill(srv.pid, signal.SIGTERM)
        while time.monotonic() - t0 < 120 and Path(f"/proc/{srv.pid}").exists() and \
                Path(f"/proc/{srv.pid}/stat").read_text().split(") ")[-1][0] != "Z":
            time.sleep(0.05)
        took = time.monotonic() - t0
        code, body = creation.result(timeout=120)
        assert code == 409 and json.loads(body)["error"]["code"] == "sandbox_ended", body
        assert took < 15, f"dsec up took {took:.1f} s to exit while a VM booted\n{srv.log_tail()}"
        assert _host_traces(sid) == []
    finally:
        gen.close()


@pytest.fixture(scope="module")
def ovmf_server() -> Iterator[Server]:
    """A node whose full VMs boot under OVMF (UEFI) instead of SeaBIOS."""
    yield from serve_dsec(["--no-fncall", "--vm-firmware", "ovmf"])


async def test_a_full_vm_boots_under_ovmf(ovmf_server: Server) -> None:
    """The same debian-vm image boots by UEFI (its EFI system partition's
    EFI/BOOT/BOOTX64.EFI) and its agent answers."""
    tenant = _create_tenant(ovmf_server, "e2e-ovmf")
    async with DSecClient(ovmf_server.url, tenant.token) as c:
        t0 = time.monotonic()
        sb = await c.run(vm_args(ttl_running_stop=600), timeout=600)
        try:
            print(f"full VM under OVMF booted to its agent in {time.monotonic() - t0:.1f} s")
            r = await sb.run_shell("test -d /sys/firmware/efi && echo uefi; cat /proc/1/comm")
            assert r.stdout == "uefi\nsystemd\n", r
            assert [p for p in _qemu_of(sb.id) if b"OVMF_CODE" in Path(f"/proc/{p}/cmdline").read_bytes()]
        finally:
            await sb.delete()
        assert _host_traces(sb.id) == []
