"""Load generator of bench/vm.sh, over the Python SDK.

    vm_bench.py boot --reps N --image QCOW2 --out F
        boot to first exec, one at a time: a `debian-vm` full VM through
        dsec, and the peer: a plain `qemu-system-x86_64 -M q35` boot of the
        same base image (its own qcow2 overlay, the same devices) until the
        guest agent, started by the guest's systemd, greets on its
        virtio-serial socket
    vm_bench.py layers --n N --label L --toolkit IMAGE --out F
        N full VMs (768 MiB, 1 vCPU each) created one after the other with
        IMAGE's layers as a toolkit (the edge's --vm-layers decides
        pmem+DAX or virtio-blk); the host's page cache is dropped once they
        all run; then each reads every file of the layer (tar of it to
        wc), and a few seconds later the host memory they hold is summed:
        their memory cgroups' usage (guest RAM QEMU has touched, QEMU's own
        memory, and the host page cache their reads brought in, e.g. the
        one shared copy of a pmem layer file, charged to the VM that read
        it first) and their QEMUs' PSS. Also recorded, per VM, before and
        after the reads: QEMU's PSS by kind of mapping (guest RAM, TCG
        cache, QEMU's files, the rest) and the guest's own view
        (MemTotal - MemFree, page cache, anonymous memory)
    vm_bench.py suspend --reps N --out F
        one `debian-vm` full VM: its cold boot to first exec, then N rounds
        of suspend to disk (memory and devices, QEMU ends) and restore to
        first exec (a request to the suspended VM), one after the other
    vm_bench.py netboot --reps N --out F
        boot to first exec of a `debian-vm` full VM with network rules (a
        NIC on QEMU's user-mode network, configured by the guest agent
        during setup, and the node's resolver in resolv.conf) and of one
        without, alternated, one at a time (the server needs
        --network-config)
    vm_bench.py report FILE...

The server is the one in DSEC_ENDPOINT / DSEC_TOKEN (bench/lib.sh starts it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsec import DSecClient, DSecRunArgs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from microvm_bench import pss_breakdown_kb, qemu_pss_kb  # noqa: E402  (a sibling script)


def client() -> DSecClient:
    return DSecClient(os.environ["DSEC_ENDPOINT"], os.environ["DSEC_TOKEN"])


async def first_exec_ms(c: DSecClient, network_rules: dict[str, bool] | None = None) -> float:
    t0 = time.perf_counter()
    sb = await c.run(DSecRunArgs(backend="vm", image="debian-vm", memory_limit_mb=512, cpu_cores_limit=1,
                                 network_rules=network_rules or {}, labels={"suite": "bench-vm"}), timeout=600)
    r = await sb.run_shell("echo ready")
    dt = (time.perf_counter() - t0) * 1000
    assert r.stdout == "ready\n", r
    await sb.delete()
    return dt


def plain_qemu_ms(image: str) -> float:
    """The peer: the same image booted by hand, timed to the agent's Hello."""
    with tempfile.TemporaryDirectory() as d:
        overlay, sock = Path(d) / "overlay.qcow2", Path(d) / "agent.sock"
        t0 = time.perf_counter()
        subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", image, str(overlay)],
                       check=True)
        cmd = ["qemu-system-x86_64", "-M", "q35", "-accel", "tcg,tb-size=64", "-m", "512M", "-smp", "1",
               "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-device", "VGA",
               "-drive", f"id=disk,file={overlay},format=qcow2,if=none",
               "-device", "virtio-blk-pci,drive=disk,bootindex=0",
               "-device", "virtio-serial-pci", "-chardev", f"socket,id=agent,path={sock},server=on,wait=off",
               "-device", "virtserialport,chardev=agent,name=dsec.agent", "-serial", "none"]
        qemu = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        try:
            while not sock.exists():
                time.sleep(0.005)
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(sock))
            s.settimeout(600)
            assert s.recv(64), "the agent closed its port"
            dt = (time.perf_counter() - t0) * 1000
            s.close()
        finally:
            qemu.kill()
            qemu.wait()
    return dt


async def boot(a: argparse.Namespace) -> None:
    out: dict[str, list[float]] = {"dsec_vm": [], "plain_qemu": []}
    async with client() as c:
        for i in range(a.reps):
            out["dsec_vm"].append(await first_exec_ms(c))
            out["plain_qemu"].append(plain_qemu_ms(a.image))
            print(f"rep {i + 1}: " + ", ".join(f"{k} {v[-1]:.0f} ms" for k, v in out.items()), file=sys.stderr)
    Path(a.out).write_text(json.dumps({"kind": "boot", "ms": out}))


async def netboot(a: argparse.Namespace) -> None:
    out: dict[str, list[float]] = {"networked": [], "no_network": []}
    async with client() as c:
        for i in range(a.reps):
            # Alternated, the networked one first in odd rounds: the host's
            # speed drifts.
            order = [("networked", {"bench": True}), ("no_network", None)]
            for name, rules in order if i % 2 == 0 else order[::-1]:
                out[name].append(await first_exec_ms(c, rules))
            print(f"rep {i + 1}: " + ", ".join(f"{k} {v[-1]:.0f} ms" for k, v in out.items()), file=sys.stderr)
    Path(a.out).write_text(json.dumps({"kind": "netboot", "ms": out}))


def report_netboot(f: str) -> None:
    ms, med = _medians(f)
    print(f"full VM (q35, SeaBIOS, debian-vm, TCG), boot to first exec, alternated, median of {len(ms['networked'])}:")
    for k in ("networked", "no_network"):
        print(f"  {k:<12} {med[k]:8.0f} ms   (min {min(ms[k]):.0f}, max {max(ms[k]):.0f})")
    print(f"  the network's cost: {med['networked'] - med['no_network']:+.0f} ms ({med['networked'] / med['no_network']:.2f}x)")


async def suspend(a: argparse.Namespace) -> None:
    out: dict[str, list[float]] = {"cold_boot": [], "suspend": [], "restore": [], "image_mib": []}
    async with client() as c:
        t0 = time.perf_counter()
        sb = await c.run(DSecRunArgs(backend="vm", image="debian-vm", memory_limit_mb=512, cpu_cores_limit=1,
                                     labels={"suite": "bench-vm"}), timeout=600)
        assert (await sb.run_shell("echo ready")).stdout == "ready\n"
        out["cold_boot"].append((time.perf_counter() - t0) * 1000)
        try:
            for i in range(a.reps):
                t0 = time.perf_counter()
                p = await sb.suspend()
                out["suspend"].append((time.perf_counter() - t0) * 1000)
                out["image_mib"].append(p.disk_bytes / (1 << 20))
                assert p.suspended
                t0 = time.perf_counter()
                r = await sb.run_shell("echo ready")
                out["restore"].append((time.perf_counter() - t0) * 1000)
                assert r.stdout == "ready\n", r
                print(f"rep {i + 1}: suspend {out['suspend'][-1]:.0f} ms, restore {out['restore'][-1]:.0f} ms",
                      file=sys.stderr)
        finally:
            await sb.delete()
    Path(a.out).write_text(json.dumps({"kind": "suspend", "ms": out}))


def _medians(f: str) -> tuple[dict[str, list[float]], dict[str, float]]:
    ms = json.loads(Path(f).read_text())["ms"]
    return ms, {k: statistics.median(v) for k, v in ms.items()}


def report_suspend(f: str) -> None:
    ms, med = _medians(f)
    print(f"full VM (q35, SeaBIOS, debian-vm, 512 MiB, TCG), {len(ms['restore'])} suspend/restore rounds, medians:")
    print(f"  cold boot to first exec   {med['cold_boot']:8.0f} ms (one boot)")
    print(f"  suspend to disk           {med['suspend']:8.0f} ms   image {med['image_mib']:.0f} MiB")
    print(f"  restore to first exec     {med['restore']:8.0f} ms   (min {min(ms['restore']):.0f}, max {max(ms['restore']):.0f})")
    print(f"  cold boot / restore: {med['cold_boot'] / med['restore']:.1f}x")


def cgroup_bytes(sandbox_id: str) -> int:
    node = sandbox_id.split(".")[0]
    for f in (f"/sys/fs/cgroup/memory/dsec/{node}/{sandbox_id}/memory.usage_in_bytes",
              f"/sys/fs/cgroup/dsec/{node}/{sandbox_id}/memory.current"):
        if Path(f).exists():
            return int(Path(f).read_text())
    raise SystemExit(f"no memory cgroup for {sandbox_id}")


async def guest_meminfo_kb(sb) -> dict[str, int]:  # noqa: ANN001
    """The guest's own view: memory in use (MemTotal - MemFree) and its
    page cache, KiB."""
    r = await sb.run_shell("cat /proc/meminfo")
    m = {line.split(":")[0]: int(line.split()[1]) for line in r.stdout.splitlines() if line.endswith(" kB")}
    return {"used": m["MemTotal"] - m["MemFree"], "cached": m["Cached"], "anon": m["AnonPages"]}


async def layers(a: argparse.Namespace) -> None:
    async with client() as c:
        # No idle TTL: on a loaded machine booting 8 VMs one at a time takes
        # longer than the default 300 s, and the first ones would be stopped.
        run = DSecRunArgs(backend="vm", image="debian-vm", memory_limit_mb=a.memory_mb, cpu_cores_limit=1,
                          toolkits=[a.toolkit], ttl_running_stop=0, labels={"suite": "bench-vm"})
        # One at a time: N guests booting at once under TCG starve each
        # other's udev past the agent's wait for its pmem devices.
        sbs = [await c.run(run, timeout=900) for _ in range(a.n)]
        try:
            # A cold page cache for the layer files, dropped once the VMs
            # exist: the edge writes the pmem copy of a layer while creating
            # the first VM, and that page cache would be charged to the
            # edge, not to the VM whose reads bring it in.
            subprocess.run(["sync"], check=True)
            Path("/proc/sys/vm/drop_caches").write_text("1")
            base = [cgroup_bytes(sb.id) for sb in sbs]
            base_parts = [pss_breakdown_kb(sb.id, a.memory_mb) for sb in sbs]
            guest_before = await asyncio.gather(*[guest_meminfo_kb(sb) for sb in sbs])
            reads = await asyncio.gather(*[sb.run_shell(
                "mount | grep -c /opt/dsec/layers/0; tar cf - /opt/dsec/layers/0 2>/dev/null | wc -c", timeout=900)
                for sb in sbs])
            for r in reads:
                mounts, size = r.stdout.split()
                assert mounts == "1" and int(size) > 1 << 20, r
            await asyncio.sleep(a.settle)
            used = [cgroup_bytes(sb.id) for sb in sbs]
            pss = [qemu_pss_kb(sb.id) * 1024 for sb in sbs]
            parts = [pss_breakdown_kb(sb.id, a.memory_mb) for sb in sbs]
            guest_after = await asyncio.gather(*[guest_meminfo_kb(sb) for sb in sbs])
        finally:
            await asyncio.gather(*[sb.delete() for sb in sbs])
    Path(a.out).write_text(json.dumps({"kind": "layers", "label": a.label, "n": a.n, "read_bytes": int(size),
                                       "before_read": base, "cgroup": used, "pss": pss,
                                       "pss_parts_before": base_parts, "pss_parts": parts,
                                       "guest_before": guest_before, "guest_after": guest_after}))


def report_layers(files: list[str]) -> None:
    mib = 1 << 20
    rows = []
    for f in files:
        d = json.loads(Path(f).read_text())
        rows.append(d)
        print(f"{d['n']} full VMs reading a {d['read_bytes'] / mib:.0f} MiB layer, {d['label']}: "
              f"cgroups {sum(d['cgroup']) / mib:.0f} MiB (grew {(sum(d['cgroup']) - sum(d['before_read'])) / mib:.0f} MiB "
              f"while reading), QEMU PSS {sum(d['pss']) / mib:.0f} MiB")
        if "pss_parts" in d:
            n, kib = d["n"], 1024
            for when, parts, guest in (("before reading", d["pss_parts_before"], d["guest_before"]),
                                       ("after reading", d["pss_parts"], d["guest_after"])):
                avg = {k: sum(p[k] for p in parts) / n / kib for k in parts[0]}
                g = {k: sum(x[k] for x in guest) / n / kib for k in guest[0]}
                print(f"    per VM {when}: QEMU PSS " + ", ".join(f"{k} {v:.0f}" for k, v in avg.items())
                      + f" MiB; guest used {g['used']:.0f} (page cache {g['cached']:.0f}, anon {g['anon']:.0f}) MiB")
    if len(rows) == 2:
        a, b = rows
        print(f"  {a['label']} / {b['label']}: cgroups {sum(a['cgroup']) / sum(b['cgroup']):.2f}x, "
              f"PSS {sum(a['pss']) / sum(b['pss']):.2f}x")


def report(f: str) -> None:
    ms, med = _medians(f)
    print(f"full VM (q35, SeaBIOS, debian-vm, TCG), boot to first exec, median of {len(ms['dsec_vm'])}:")
    print(f"  dsec backend=vm        {med['dsec_vm']:8.0f} ms   (min {min(ms['dsec_vm']):.0f}, max {max(ms['dsec_vm']):.0f})")
    print(f"  plain qemu to agent    {med['plain_qemu']:8.0f} ms   (min {min(ms['plain_qemu']):.0f}, max {max(ms['plain_qemu']):.0f})")
    print(f"  dsec / plain qemu: {med['dsec_vm'] / med['plain_qemu']:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("boot")
    b.add_argument("--reps", type=int, default=3)
    b.add_argument("--image", required=True)
    b.add_argument("--out", required=True)
    ly = sub.add_parser("layers")
    ly.add_argument("--n", type=int, default=4)
    ly.add_argument("--label", required=True)
    ly.add_argument("--toolkit", default="python")
    ly.add_argument("--memory-mb", type=int, default=768)
    ly.add_argument("--settle", type=float, default=5.0)
    ly.add_argument("--out", required=True)
    su = sub.add_parser("suspend")
    su.add_argument("--reps", type=int, default=5)
    su.add_argument("--out", required=True)
    nb = sub.add_parser("netboot")
    nb.add_argument("--reps", type=int, default=3)
    nb.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("files", nargs="+")
    a = p.parse_args()
    if a.cmd == "boot":
        asyncio.run(boot(a))
    elif a.cmd == "layers":
        asyncio.run(layers(a))
    elif a.cmd == "suspend":
        asyncio.run(suspend(a))
    elif a.cmd == "netboot":
        asyncio.run(netboot(a))
    elif json.loads(Path(a.files[0]).read_text())["kind"] == "netboot":
        report_netboot(a.files[0])
    elif json.loads(Path(a.files[0]).read_text())["kind"] == "layers":
        report_layers(a.files)
    elif json.loads(Path(a.files[0]).read_text())["kind"] == "suspend":
        report_suspend(a.files[0])
    else:
        report(a.files[0])


if __name__ == "__main__":
    main()
