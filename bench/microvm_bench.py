"""Load generator of bench/microvm.sh, over the Python SDK.

    microvm_bench.py boot --reps N --kernel K --initramfs I --out F
        boot to first exec, one at a time: a busybox microVM, a busybox
        container, and the peer: a plain `qemu-system-x86_64 -M microvm` boot
        of the same kernel and initramfs to the guest's init (which prints a
        marker and ends the VM), with the same tuned command line
    microvm_bench.py idle --n N --label L --out F
        N idle busybox microVMs of 128 MiB: host PSS of each VM's QEMU
    microvm_bench.py start --reps R --n N --label L --out F
        node templates vs cold boots (run once per `dsec up`, with and without
        --vm-templates): the first busybox microVM of 128 MiB (which makes
        the template), R more one at a time (create -> first exec ->
        delete), then N idle ones: PSS, RSS and the private part of guest
        RAM of each QEMU, and the host's MemAvailable drop per VM
    microvm_bench.py report FILE...

The server is the one in DSEC_ENDPOINT / DSEC_TOKEN (bench/lib.sh starts it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsec import DSecClient, DSecRunArgs

MIB = 1 << 20


def client() -> DSecClient:
    return DSecClient(os.environ["DSEC_ENDPOINT"], os.environ["DSEC_TOKEN"])


def args(backend: str, memory_mb: int = 256) -> DSecRunArgs:
    return DSecRunArgs(backend=backend, image="busybox", memory_limit_mb=memory_mb,
                       cpu_cores_limit=1, disk_limit_mb=256, labels={"suite": "bench-microvm"})


async def first_exec_ms(c: DSecClient, backend: str) -> float:
    t0 = time.perf_counter()
    sb = await c.run(args(backend), timeout=180)
    r = await sb.run_shell("echo ready")
    dt = (time.perf_counter() - t0) * 1000
    assert r.stdout == "ready\n", r
    await sb.delete()
    return dt


def tsc_khz() -> int:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("cpu MHz"):
            return round(float(line.split(":")[1]) * 1000)
    raise SystemExit("no cpu MHz in /proc/cpuinfo")


def plain_qemu_ms(kernel: str, initramfs: str) -> float:
    """The peer: QEMU's microvm booting the same kernel and initramfs to
    the guest's init, with the command line the edge gives (TCG)."""
    khz = tsc_khz()
    append = ("console=ttyS0 quiet panic=-1 reboot=t rdinit=/init 8250.nr_uarts=1 cryptomgr.notests "
              "initcall_blacklist=crypto_kdf108_init,init_kprobe_trace,load_system_certificate_list "
              f"random.trust_cpu=on tsc_early_khz={khz} tsc=reliable lpj={khz * 4} dsec.probe")
    with tempfile.TemporaryDirectory() as d:
        console = Path(d) / "console.log"
        cmd = ["qemu-system-x86_64", "-M", "microvm,x-option-roms=off,isa-serial=on",
               "-accel", "tcg,tb-size=16",  # the edge's default (--vm-tb-size-mb)
               "-m", "256M", "-smp", "1", "-nodefaults",
               "-no-user-config", "-display", "none", "-no-reboot",
               "-kernel", kernel, "-initrd", initramfs, "-append", append,
               "-chardev", f"file,id=con,path={console}", "-serial", "chardev:con"]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, timeout=120, stdin=subprocess.DEVNULL)
        dt = (time.perf_counter() - t0) * 1000
        assert "DSEC-PROBE-OK" in console.read_text(), console.read_text()[-500:]
    return dt


async def boot(a: argparse.Namespace) -> None:
    out: dict[str, list[float]] = {"microvm": [], "container": [], "plain_qemu": []}
    async with client() as c:
        # One untimed round: templates, page cache, the accelerator probe.
        await first_exec_ms(c, "microvm")
        await first_exec_ms(c, "container")
        plain_qemu_ms(a.kernel, a.initramfs)
        for i in range(a.reps):
            out["microvm"].append(await first_exec_ms(c, "microvm"))
            out["container"].append(await first_exec_ms(c, "container"))
            out["plain_qemu"].append(plain_qemu_ms(a.kernel, a.initramfs))
            print(f"rep {i + 1}: " + ", ".join(f"{k} {v[-1]:.0f} ms" for k, v in out.items()), file=sys.stderr)
    Path(a.out).write_text(json.dumps({"kind": "boot", "ms": out}))


def qemu_pid(sandbox_id: str) -> str:
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"qemu-system" in cmdline and f"/{sandbox_id}/".encode() in cmdline:
            return pid
    raise SystemExit(f"no QEMU found for {sandbox_id}")


def qemu_pss_kb(sandbox_id: str) -> int:
    for line in Path(f"/proc/{qemu_pid(sandbox_id)}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    raise SystemExit(f"no Pss in the smaps of {sandbox_id}'s QEMU")


def pss_breakdown_kb(sandbox_id: str, guest_mb: int) -> dict[str, int]:
    """PSS of one VM's QEMU by kind of mapping (from /proc/PID/smaps):
    guest RAM (the RAM file, or the anonymous mapping of at least the
    guest's size), the TCG translation cache (the anonymous rwx mapping),
    QEMU's own files (binary, libraries, kernel/initramfs mappings: shared
    between VMs, so PSS splits them) and the rest of its anonymous memory
    (heap, the kernel image it keeps for fw_cfg, device state)."""
    out = {"guest_ram": 0, "tcg_cache": 0, "qemu_files": 0, "qemu_anon": 0}
    kind = "qemu_anon"
    for line in Path(f"/proc/{qemu_pid(sandbox_id)}/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            path = head[5] if len(head) > 5 else ""
            if path.endswith(".ram") or "dsec-template-ram" in path or (not path and hi - lo >= guest_mb * MIB):
                kind = "guest_ram"
            elif not path and head[1] == "rwxp":
                kind = "tcg_cache"
            elif path.startswith("/"):
                kind = "qemu_files"
            else:
                kind = "qemu_anon"
        elif head[0] == "Pss:":
            out[kind] += int(head[1])
    return out


async def idle(a: argparse.Namespace) -> None:
    async with client() as c:
        sbs = [await c.run(args("microvm", memory_mb=128), timeout=180) for _ in range(a.n)]
        try:
            for sb in sbs:
                assert (await sb.run_shell("echo up")).stdout == "up\n"
            await asyncio.sleep(a.settle)
            pss = [qemu_pss_kb(sb.id) / 1024 for sb in sbs]
            parts = [pss_breakdown_kb(sb.id, 128) for sb in sbs]
        finally:
            for sb in sbs:
                await sb.delete()
    breakdown = {k: statistics.median(p[k] / 1024 for p in parts) for k in parts[0]}
    Path(a.out).write_text(json.dumps({"kind": "idle", "label": a.label, "guest_mb": 128, "pss_mb": pss,
                                       "breakdown_median_mb": breakdown}))


def smaps_kb(sandbox_id: str) -> dict[str, int]:
    """Totals of one QEMU's smaps_rollup (Rss, Pss, Anonymous...)."""
    out = {}
    for line in Path(f"/proc/{qemu_pid(sandbox_id)}/smaps_rollup").read_text().splitlines()[1:]:
        k, v = line.split(":", 1)
        out[k] = int(v.split()[0])
    return out


def guest_ram_private_kb(sandbox_id: str) -> int:
    """Pages of guest RAM this VM alone holds: of a private mapping of a
    template, its copy-on-write copies (Anonymous); of its own RAM file,
    every resident page."""
    total, in_ram, key = 0, False, "Anonymous:"
    for line in Path(f"/proc/{qemu_pid(sandbox_id)}/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and ":" not in head[0] and len(head) >= 5:
            path = head[5] if len(head) > 5 else ""
            in_ram = path.endswith(".ram") or "dsec-template-ram" in path
            key = "Rss:" if path.endswith(".ram") else "Anonymous:"
        elif in_ram and head[0] == key:
            total += int(head[1])
    return total


def mem_available_kb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    raise SystemExit("no MemAvailable")


async def start(a: argparse.Namespace) -> None:
    out: dict[str, object] = {"kind": "start", "label": a.label, "guest_mb": 128}
    async with client() as c:
        t0 = time.perf_counter()
        sb = await c.run(args("microvm", memory_mb=128), timeout=180)
        assert (await sb.run_shell("echo ready")).stdout == "ready\n"
        out["first_ms"] = (time.perf_counter() - t0) * 1000
        await sb.delete()
        ms = []
        for i in range(a.reps):
            t0 = time.perf_counter()
            sb = await c.run(args("microvm", memory_mb=128), timeout=180)
            assert (await sb.run_shell("echo ready")).stdout == "ready\n"
            ms.append((time.perf_counter() - t0) * 1000)
            await sb.delete()
            print(f"{a.label} rep {i + 1}: {ms[-1]:.0f} ms", file=sys.stderr)
        out["ms"] = ms
        await asyncio.sleep(2)
        avail0 = mem_available_kb()
        sbs = [await c.run(args("microvm", memory_mb=128), timeout=180) for _ in range(a.n)]
        try:
            for sb in sbs:
                assert (await sb.run_shell("echo up")).stdout == "up\n"
            await asyncio.sleep(a.settle)
            out["mem_available_drop_per_vm_mb"] = (avail0 - mem_available_kb()) / 1024 / a.n
            rollups = [smaps_kb(sb.id) for sb in sbs]
            out["pss_mb"] = [r["Pss"] / 1024 for r in rollups]
            out["rss_mb"] = [r["Rss"] / 1024 for r in rollups]
            out["guest_ram_private_mb"] = [guest_ram_private_kb(sb.id) / 1024 for sb in sbs]
            parts = [pss_breakdown_kb(sb.id, 128) for sb in sbs]
            out["breakdown_median_mb"] = {k: statistics.median(p[k] / 1024 for p in parts) for k in parts[0]}
        finally:
            for sb in sbs:
                await sb.delete()
    out["n"] = a.n
    Path(a.out).write_text(json.dumps(out))


def report(files: list[str]) -> None:
    for f in files:
        d = json.loads(Path(f).read_text())
        if d["kind"] == "boot":
            ms = d["ms"]
            med = {k: statistics.median(v) for k, v in ms.items()}
            print(f"boot to first exec, median of {len(ms['microvm'])} (TCG):")
            for k in ("container", "microvm", "plain_qemu"):
                print(f"  {k:12s} {med[k]:8.0f} ms   (min {min(ms[k]):.0f}, max {max(ms[k]):.0f})")
            print(f"  microvm / plain qemu boot: {med['microvm'] / med['plain_qemu']:.2f}x;"
                  f" microvm / container: {med['microvm'] / med['container']:.0f}x")
        elif d["kind"] == "start":
            med = statistics.median
            print(f"{d['label']}: first microVM of the shape {d['first_ms']:.0f} ms; create -> first exec, "
                  f"median of {len(d['ms'])}: {med(d['ms']):.0f} ms (min {min(d['ms']):.0f}, max {max(d['ms']):.0f})")
            print(f"  {d['n']} idle VMs of {d['guest_mb']} MiB, medians: PSS {med(d['pss_mb']):.1f} MB, "
                  f"RSS {med(d['rss_mb']):.1f} MB, guest RAM private to the VM {med(d['guest_ram_private_mb']):.1f} MB; "
                  f"host MemAvailable drop {d['mem_available_drop_per_vm_mb']:.1f} MB per VM")
            print("  PSS by kind (medians, MiB): " + ", ".join(f"{k} {v:.1f}" for k, v in d["breakdown_median_mb"].items()))
        else:
            p = d["pss_mb"]
            print(f"idle microVM host PSS at {d['guest_mb']} MiB guest RAM, {d['label']}, {len(p)} VMs: "
                  f"median {statistics.median(p):.0f} MB (min {min(p):.0f}, max {max(p):.0f})")
            if "breakdown_median_mb" in d:
                print("  of which (medians, MiB): " + ", ".join(f"{k} {v:.1f}" for k, v in d["breakdown_median_mb"].items()))


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("boot")
    b.add_argument("--reps", type=int, default=7)
    b.add_argument("--kernel", required=True)
    b.add_argument("--initramfs", required=True)
    b.add_argument("--out", required=True)
    i = sub.add_parser("idle")
    i.add_argument("--n", type=int, default=4)
    i.add_argument("--settle", type=float, default=10.0)
    i.add_argument("--label", default="")
    i.add_argument("--out", required=True)
    st = sub.add_parser("start")
    st.add_argument("--reps", type=int, default=5)
    st.add_argument("--n", type=int, default=4)
    st.add_argument("--settle", type=float, default=10.0)
    st.add_argument("--label", default="")
    st.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("files", nargs="+")
    a = p.parse_args()
    if a.cmd == "boot":
        asyncio.run(boot(a))
    elif a.cmd == "idle":
        asyncio.run(idle(a))
    elif a.cmd == "start":
        asyncio.run(start(a))
    else:
        report(a.files)


if __name__ == "__main__":
    main()
