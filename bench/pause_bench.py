"""Load generator of bench/pause.sh (issue 6), over the Python SDK.

    pause_bench.py memory --reps N --label L --out F   a 256 MiB sandbox: pause/resume
    pause_bench.py job --n N --reps R --out F          pause/resume a job of N sandboxes
    pause_bench.py burst --n N --label L --out F       N concurrent creations from one client
    pause_bench.py report FILE...                      one table of the results

The server is the one in DSEC_ENDPOINT / DSEC_TOKEN (bench/lib.sh starts it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

from dsec import DSecClient, DSecContainerRunArgs, DSecError

MIB = 1 << 20

# Holds 256 MiB of random bytes; for each /tmp/go<k> it hashes them again
# and reports the hash and how long touching them took.
HOLDER = r"""
import hashlib, os, time
b = bytearray(os.urandom(1 << 20)) * 256
k = 0
while True:
    while not os.path.exists(f"/tmp/go{k}"):
        time.sleep(0.005)
    t = time.monotonic()
    h = hashlib.sha256(b).hexdigest()
    dt = time.monotonic() - t
    open(f"/tmp/done{k}.tmp", "w").write(f"{h} {dt}")
    os.rename(f"/tmp/done{k}.tmp", f"/tmp/done{k}")
    k += 1
"""


def med(xs: list[float]) -> float:
    return round(statistics.median(xs), 2) if xs else float("nan")


async def touch(sb, k: int) -> tuple[str, float]:  # noqa: ANN001
    await sb.write_file(f"/tmp/go{k}", "")
    while True:
        try:
            h, dt = (await sb.read_text(f"/tmp/done{k}")).split()
            return h, float(dt) * 1000
        except DSecError:
            await asyncio.sleep(0.01)


async def memory(a: argparse.Namespace) -> dict:
    rows = []
    async with DSecClient() as c:
        for _ in range(a.reps):
            sb = await c.run_container(DSecContainerRunArgs(
                container_image="python", memory_limit_mb=512, cpu_cores_limit=1, disk_limit_mb=64))
            try:
                await sb.write_file("/tmp/holder.py", HOLDER)
                await sb.run_shell("nohup python3 /tmp/holder.py >/dev/null 2>&1 &")
                h0, warm_ms = await touch(sb, 0)
                t = time.perf_counter()
                p = await sb.pause()
                pause_rt = (time.perf_counter() - t) * 1000
                t = time.perf_counter()
                r = await sb.resume()
                resume_rt = (time.perf_counter() - t) * 1000
                h1, after_ms = await touch(sb, 1)
                assert h0 == h1, "memory changed across pause/resume"
                rows.append({
                    "before_mb": p.memory_before_bytes / MIB, "after_mb": p.memory_after_bytes / MIB,
                    "freed_pct": 100 * p.memory_freed_bytes / max(1, p.memory_before_bytes),
                    "pause_server_ms": p.duration_ms, "pause_roundtrip_ms": pause_rt,
                    "resume_server_ms": r.duration_ms, "resume_roundtrip_ms": resume_rt,
                    "touch_256mb_warm_ms": warm_ms, "touch_256mb_after_resume_ms": after_ms,
                })
            finally:
                await sb.delete()
    keys = rows[0].keys()
    return {"bench": "pause_memory", "label": a.label, "reps": a.reps,
            "median": {k: med([r[k] for r in rows]) for k in keys}, "rows": rows}


async def job(a: argparse.Namespace) -> dict:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    args = DSecContainerRunArgs(container_image="busybox", memory_limit_mb=16, cpu_cores_limit=0.01,
                                disk_limit_mb=8, job=name)
    pauses, resumes, changed = [], [], []
    async with DSecClient(max_connections=2048) as c:
        t = time.perf_counter()
        sbs = await asyncio.gather(*(c.run_container(args, timeout=600) for _ in range(a.n)))
        create_s = time.perf_counter() - t
        try:
            for _ in range(a.reps):
                t = time.perf_counter()
                p = await c.pause_job(name)
                pauses.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                r = await c.resume_job(name)
                resumes.append((time.perf_counter() - t) * 1000)
                changed.append((p.changed, r.changed, len(p.failed) + len(r.failed)))
        finally:
            await asyncio.gather(*(sb.delete() for sb in sbs), return_exceptions=True)
    return {"bench": "pause_job", "n": a.n, "reps": a.reps, "create_s": round(create_s, 2),
            "pause_ms": pauses, "resume_ms": resumes, "changed_and_failed": changed,
            "median": {"pause_ms": med(pauses), "resume_ms": med(resumes)}}


async def burst(a: argparse.Namespace) -> dict:
    args = DSecContainerRunArgs(container_image="busybox", memory_limit_mb=16, cpu_cores_limit=0.01,
                                disk_limit_mb=8, job=f"burst-{uuid.uuid4().hex[:6]}")
    lat: list[float] = []
    errors: Counter[str] = Counter()
    samples: dict[str, str] = {}
    async with DSecClient(max_connections=a.n + 16, timeout=900) as c:
        async def one():  # noqa: ANN202
            t = time.perf_counter()
            try:
                sb = await c.run_container(args, timeout=900)
            except DSecError as e:
                errors[e.code or type(e).__name__] += 1
                samples.setdefault(e.code or type(e).__name__, str(e)[:300])
                return None
            lat.append((time.perf_counter() - t) * 1000)
            return sb
        t = time.perf_counter()
        sbs = await asyncio.gather(*(one() for _ in range(a.n)))
        total = time.perf_counter() - t
        await asyncio.gather(*(sb.delete() for sb in sbs if sb), return_exceptions=True)
    lat.sort()
    return {"bench": "burst", "label": a.label, "n": a.n, "completion_s": round(total, 2),
            "created": len(lat), "errors": dict(errors), "error_samples": samples,
            "latency_ms": {"p50": med(lat), "p99": round(lat[int(0.99 * (len(lat) - 1))], 1) if lat else None,
                           "max": round(lat[-1], 1) if lat else None}}


def report(files: list[str]) -> None:
    for f in files:
        d = json.loads(Path(f).read_text())
        print(f"{Path(f).name}: {json.dumps({k: v for k, v in d.items() if k not in ('rows',)})}")


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("memory"); m.add_argument("--reps", type=int, default=5)
    m.add_argument("--label", default=""); m.add_argument("--out", required=True)
    j = sub.add_parser("job"); j.add_argument("--n", type=int, default=1000)
    j.add_argument("--reps", type=int, default=3); j.add_argument("--out", required=True)
    b = sub.add_parser("burst"); b.add_argument("--n", type=int, default=2000)
    b.add_argument("--label", default=""); b.add_argument("--out", required=True)
    r = sub.add_parser("report"); r.add_argument("files", nargs="+")
    a = ap.parse_args()
    if a.cmd == "report":
        report(a.files)
        return
    result = asyncio.run({"memory": memory, "job": job, "burst": burst}[a.cmd](a))
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}), file=sys.stderr)


if __name__ == "__main__":
    main()
