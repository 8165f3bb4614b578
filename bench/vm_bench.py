"""Load generator of bench/vm.sh, over the Python SDK.

    vm_bench.py boot --reps N --image QCOW2 --out F
        boot to first exec, one at a time: a `debian-vm` full VM through
        dsec, and the peer: a plain `qemu-system-x86_64 -M q35` boot of the
        same base image (its own qcow2 overlay, the same devices) until the
        guest agent, started by the guest's systemd, greets on its
        virtio-serial socket
    vm_bench.py report FILE

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


def client() -> DSecClient:
    return DSecClient(os.environ["DSEC_ENDPOINT"], os.environ["DSEC_TOKEN"])


async def first_exec_ms(c: DSecClient) -> float:
    t0 = time.perf_counter()
    sb = await c.run(DSecRunArgs(backend="vm", image="debian-vm", memory_limit_mb=512, cpu_cores_limit=1,
                                 labels={"suite": "bench-vm"}), timeout=600)
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


def report(f: str) -> None:
    ms = json.loads(Path(f).read_text())["ms"]
    med = {k: statistics.median(v) for k, v in ms.items()}
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
    r = sub.add_parser("report")
    r.add_argument("file")
    a = p.parse_args()
    if a.cmd == "boot":
        asyncio.run(boot(a))
    else:
        report(a.file)


if __name__ == "__main__":
    main()
