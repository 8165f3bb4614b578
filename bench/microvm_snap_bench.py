"""Load generator of bench/microvm_snap.sh, over the Python SDK and QMP.

    microvm_snap_bench.py run --reps N --fork N --out F

One busybox microVM of 256 MiB (warmed by an exec), then in one run:
  1. suspend to disk and resume, N times each: the edge's fast path (guest
     RAM is a shared file, the migration saves device state only); the
     server-side durations, the bytes on disk, and the time from the resume
     request to an answered exec;
  2. the peer, on the same VM: QEMU's plain `migrate` of the whole VM to a
     file (QMP on the VM's socket, no x-ignore-shared), and its restore in a
     second QEMU with the same command line (anonymous RAM, `-incoming`),
     timed until the migration completed;
  3. cold boot to the first exec, for the resume-vs-boot ratio;
  4. a memory snapshot of the suspended VM and `fork(snapshot, N)` until every
     child answers an exec.
    microvm_snap_bench.py report FILE

The server is the one in DSEC_ENDPOINT / DSEC_TOKEN (bench/lib.sh starts it).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from dsec import DSecClient, DSecRunArgs

MIB = 1 << 20


def client() -> DSecClient:
    return DSecClient(os.environ["DSEC_ENDPOINT"], os.environ["DSEC_TOKEN"])


def vm_args() -> DSecRunArgs:
    return DSecRunArgs(backend="microvm", image="busybox", memory_limit_mb=256, cpu_cores_limit=1,
                       disk_limit_mb=256, init_user="root", labels={"suite": "bench-microvm-snap"})


class Qmp:
    """A tiny QMP client (one command at a time, fds with SCM_RIGHTS)."""

    def __init__(self, path: str) -> None:
        # QEMU binds the socket a moment before it listens: retry a refusal.
        for _ in range(5000):
            self.s = socket.socket(socket.AF_UNIX)
            try:
                self.s.connect(path)
                break
            except ConnectionRefusedError:
                self.s.close()
                time.sleep(0.001)
        else:
            raise RuntimeError(f"QMP at {path} refused every connection")
        self.f = self.s.makefile("rw")
        self.f.readline()
        self.cmd("qmp_capabilities")

    def cmd(self, name: str, args: dict | None = None, fd: int | None = None) -> dict:
        msg = {"execute": name, **({"arguments": args} if args else {})}
        data = (json.dumps(msg) + "\n").encode()
        if fd is None:
            self.s.sendall(data)
        else:
            self.s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))])
        while True:
            r = json.loads(self.f.readline())
            if "event" in r:
                continue
            if "error" in r:
                raise RuntimeError(f"QMP {name}: {r['error']}")
            return r.get("return", {})

    def wait_migration(self) -> None:
        while True:
            st = self.cmd("query-migrate").get("status")
            if st == "completed":
                return
            if st in ("failed", "cancelled"):
                raise RuntimeError(f"migration {st}")
            time.sleep(0.001)


def qemu_of(sid: str) -> tuple[int, list[str]]:
    """The sandbox's QEMU, found by its cgroup (a resumed VM may run in a
    standby QEMU whose command line names no sandbox)."""
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
                cgroup = Path(f"/proc/{pid}/cgroup").read_text()
            except OSError:
                continue
            if argv and argv[0].endswith("qemu-system-x86_64") and f"/{sid}\n" in cgroup:
                return int(pid), argv
    raise SystemExit(f"no QEMU for {sid}")


def qmp_socket(argv: list[str], sid: str) -> str:
    """The VM's QMP socket: in its run directory (a standby's directory
    was renamed to the sandbox's when it took the VM over)."""
    path = Path(flag(argv, "-qmp").split(",")[0].removeprefix("unix:"))
    return str(path.parent.parent / sid / path.name)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def peer_save(argv: list[str], sid: str, image: Path) -> dict:
    """QEMU's own migrate of the whole running VM to a file, then cont."""
    q = Qmp(qmp_socket(argv, sid))
    t0 = time.perf_counter()
    q.cmd("stop")
    q.cmd("migrate-set-capabilities", {"capabilities": [{"capability": "x-ignore-shared", "state": False}]})
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    q.cmd("getfd", {"fdname": "peer"}, fd=fd)
    q.cmd("migrate", {"uri": "fd:peer"})
    q.wait_migration()
    os.fsync(fd)
    os.close(fd)
    ms = (time.perf_counter() - t0) * 1000
    q.cmd("cont")
    return {"save_ms": ms, "bytes": image.stat().st_blocks * 512}


def peer_restore(argv: list[str], image: Path, scratch: Path) -> float:
    """The same command line in a second QEMU, anonymous RAM (the whole RAM
    comes from the stream), loading `image` until the migration completed.
    Run while the sandbox is suspended (its disk is free); the guest never
    runs (the stream says stopped), so its disk is not touched."""
    out = []
    it = iter(argv)
    for a in it:
        if a == "-object":
            spec = next(it)
            if spec.startswith("memory-backend-file"):
                size = [p for p in spec.split(",") if p.startswith("size=")][0]
                spec = f"memory-backend-ram,id=ram,{size}"
            out += [a, spec]
        elif a == "-chardev":
            spec = next(it)
            cid = spec.split("id=")[1].split(",")[0]
            out += [a, f"socket,id={cid},path={scratch}/{cid}.sock,server=on,wait=off" if spec.startswith("socket")
                    else f"file,id={cid},path={scratch}/{cid}.log"]
        elif a == "-qmp":
            next(it)
            out += [a, f"unix:{scratch}/qmp.sock,server=on,wait=off"]
        else:
            out.append(a)
    out += ["-incoming", "defer"]
    for stale in scratch.glob("*.sock"):
        stale.unlink()
    fd = os.open(image, os.O_RDONLY)
    t0 = time.perf_counter()
    # The image becomes the child's fd 3 (dup2 in the child only; fd 3 is
    # kept past the close of the others).
    p = subprocess.Popen(out, pass_fds=[fd, 3], preexec_fn=lambda: os.dup2(fd, 3), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=open(scratch / "qemu.log", "w"))
    os.close(fd)
    try:
        while not (scratch / "qmp.sock").exists():
            if p.poll() is not None:
                raise SystemExit(f"peer QEMU exited: {(scratch / 'qemu.log').read_text()[-500:]}")
            time.sleep(0.001)
        q = Qmp(str(scratch / "qmp.sock"))
        q.cmd("migrate-set-capabilities", {"capabilities": [{"capability": "x-ignore-shared", "state": False}]})
        q.cmd("migrate-incoming", {"uri": "fd:3"})
        try:
            q.wait_migration()
        except (OSError, RuntimeError) as e:
            raise SystemExit(f"peer restore failed ({e}): {(scratch / 'qemu.log').read_text()[-800:]}")
        ms = (time.perf_counter() - t0) * 1000
        q.cmd("quit")
    finally:
        # On any failure the peer QEMU may still wait for its stream: it
        # must not outlive the benchmark.
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return ms


async def run(a: argparse.Namespace) -> None:
    out: dict = {"kind": "snap", "guest_mb": 256, "suspend": [], "resume": [], "peer": [], "cold_boot_ms": []}
    async with client() as c:
        t0 = time.perf_counter()
        sb = await c.run(vm_args(), timeout=180)
        await sb.run_shell("echo warm > /root/warm.txt")
        out["cold_boot_ms"].append((time.perf_counter() - t0) * 1000)
        _, argv = qemu_of(sb.id)
        with tempfile.TemporaryDirectory() as d:
            scratch = Path(d)
            image = scratch / "peer.vmstate"
            for i in range(a.reps):
                # The peer on the same VM, running: save, then continue.
                peer = peer_save(qemu_of(sb.id)[1], sb.id, image)
                p = await sb.pause(mode="suspend")
                out["suspend"].append({"ms": p.duration_ms, "disk_bytes": p.disk_bytes,
                                       "freed_bytes": p.memory_freed_bytes})
                # Peer restore while the sandbox is suspended (disk free).
                peer["restore_ms"] = peer_restore(argv, image, scratch)
                out["peer"].append(peer)
                t1 = time.perf_counter()
                r = await sb.resume()
                ex = await sb.run_shell("cat /root/warm.txt")
                assert ex.stdout == "warm\n", ex
                to_exec = (time.perf_counter() - t1) * 1000
                # The same exec once more: what the first one cost beyond
                # it is the resumed guest's cold start (under TCG, code
                # translated anew after the restore).
                t2 = time.perf_counter()
                await sb.run_shell("cat /root/warm.txt")
                out["resume"].append({"ms": r.duration_ms, "to_exec_ms": to_exec,
                                      "second_exec_ms": (time.perf_counter() - t2) * 1000})
                print(f"rep {i + 1}: suspend {p.duration_ms:.0f} ms {p.disk_bytes / MIB:.0f} MiB, "
                      f"resume {r.duration_ms:.0f} ms; peer save {peer['save_ms']:.0f} ms "
                      f"{peer['bytes'] / MIB:.0f} MiB, restore {peer['restore_ms']:.0f} ms", flush=True)
        await sb.suspend()
        snap = await sb.snapshot(f"bench-{sb.id.split('.')[1]}", memory=True)
        await sb.delete()
        t2 = time.perf_counter()
        kids = await c.fork(snap, a.fork, vm_args())
        await asyncio.gather(*(k.run_shell("cat /root/warm.txt") for k in kids))
        out["fork"] = {"n": a.fork, "ms": (time.perf_counter() - t2) * 1000, "snapshot_bytes": snap.bytes}
        out["fork"]["child_create_ms"] = [k.info.create_ms or 0.0 for k in kids]
        for k in kids:
            await k.delete()
    Path(a.out).write_text(json.dumps(out))


def restore_breakdown(log: str) -> dict[str, list[float]]:
    """The edge's per-resume timings (`key=ms` fields of its log lines)."""
    fields: dict[str, list[float]] = {}
    for line in Path(log).read_text().splitlines():
        for word in line.split():
            k, _, v = word.partition("=")
            if k.endswith("_ms"):
                try:
                    fields.setdefault(k, []).append(float(v))
                except ValueError:
                    pass
    return fields


def report(path: str, log: str | None = None) -> None:
    d = json.loads(Path(path).read_text())
    med = statistics.median
    s_ms = med(x["ms"] for x in d["suspend"])
    s_mb = med(x["disk_bytes"] for x in d["suspend"]) / MIB
    r_ms = med(x["ms"] for x in d["resume"])
    r_ex = med(x["to_exec_ms"] for x in d["resume"])
    p_save = med(x["save_ms"] for x in d["peer"])
    p_mb = med(x["bytes"] for x in d["peer"]) / MIB
    p_rest = med(x["restore_ms"] for x in d["peer"])
    boot = med(d["cold_boot_ms"])  # the one solo boot (forks boot side by side)
    n = len(d["suspend"])
    print(f"microVM suspend/resume, {d['guest_mb']} MiB guest, median of {n}:")
    print(f"  suspend (edge, file-backed RAM)  {s_ms:7.0f} ms   {s_mb:6.1f} MiB on disk")
    print(f"  peer: plain QEMU migrate to file {p_save:7.0f} ms   {p_mb:6.1f} MiB   ({p_save / s_ms:.2f}x the suspend time)")
    print(f"  resume (edge, server side)       {r_ms:7.0f} ms;  to an answered exec {r_ex:.0f} ms")
    print(f"  peer: plain QEMU restore         {p_rest:7.0f} ms   ({p_rest / r_ms:.2f}x the resume)")
    print(f"  cold boot to first exec          {boot:7.0f} ms   (resume to exec is {boot / r_ex:.1f}x faster)")
    gib = d["guest_mb"] / 1024
    print(f"  per GiB of guest RAM: suspend {s_ms / 1000 / gib:.2f} s/GiB (E2B publishes ~4 s/GiB), "
          f"resume {r_ex / 1000:.2f} s (E2B ~1 s)")
    after = [x["to_exec_ms"] - x["ms"] for x in d["resume"]]
    print(f"  the exec after a resume (to_exec - server side) {med(after):.0f} ms")
    second = [x["second_exec_ms"] for x in d["resume"] if "second_exec_ms" in x]
    if second:
        print(f"  the same exec once more, right after               {med(second):.0f} ms")
    if log and Path(log).exists():
        parts = restore_breakdown(log)
        # The first resume loads the stream into a RAM file of its own
        # (a template's VM): the others show the fast path.
        print("  edge's resume steps, median of rounds 2..N (ms): " + ", ".join(
            f"{k.removesuffix('_ms')} {med(v[1:] or v):.0f}" for k, v in parts.items()))
    f = d["fork"]
    print(f"  snapshot of the suspended VM {f['snapshot_bytes'] / MIB:.1f} MiB; fork(snapshot, {f['n']}) to every "
          f"child's first exec {f['ms']:.0f} ms")


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--reps", type=int, default=5)
    r.add_argument("--fork", type=int, default=2)
    r.add_argument("--out", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("file")
    rep.add_argument("restores", nargs="?", help="the edge's restore log lines (microvm_snap.sh writes them)")
    a = p.parse_args()
    if a.cmd == "run":
        asyncio.run(run(a))
    else:
        report(a.file, a.restores)


if __name__ == "__main__":
    main()
