#!/usr/bin/env python3
"""Benchmark 3, Python side: the exec round trip of `true` through the dsec
Python SDK (asyncio DSecClient), sequential, then a closed loop of
concurrent callers (to show where a Python client tops out).

Usage: DSEC_ENDPOINT=... DSEC_TOKEN=... python3 bench/sdk_exec.py OUT.json [N]
"""

import asyncio
import json
import os
import statistics
import sys
import time

from dsec import DSecClient, DSecContainerRunArgs


def summary(v):
    s = sorted(v)
    n = len(s)

    def pct(p):
        import math
        return s[min(n, max(1, math.ceil(p / 100 * n))) - 1]

    return {"n": n, "min_ms": s[0], "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99),
            "max_ms": s[-1], "mean_ms": statistics.fmean(s)}


async def main(out, n):
    args = DSecContainerRunArgs(container_image="busybox", memory_limit_mb=64,
                                cpu_cores_limit=float(os.environ.get("DSEC_BENCH_CPU", "2")),
                                disk_limit_mb=64, pids_limit=64, ttl_running_stop=900,
                                network_rules={}, init_user="root", job="dsec-bench")
    async with DSecClient() as client:
        sandboxes = [await client.run_container(args, timeout=60)]
        try:
            sb = sandboxes[0]
            for _ in range(100):
                r = await sb.exec(["true"])
                assert r.exit_code == 0, r
            lat = []
            for _ in range(n):
                t0 = time.perf_counter_ns()
                r = await sb.exec(["true"])
                lat.append((time.perf_counter_ns() - t0) / 1e6)
                assert r.exit_code == 0
            # run_shell("true") too: the paper's listing uses run_shell.
            shell = []
            for _ in range(min(n, 500)):
                t0 = time.perf_counter_ns()
                r = await sb.run_shell("true")
                shell.append((time.perf_counter_ns() - t0) / 1e6)
                assert r.exit_code == 0
            loops = []
            for conc in (8, 32):
                while len(sandboxes) < conc:
                    sandboxes.append(await client.run_container(args, timeout=60))
                stop = time.perf_counter() + 5.0
                counts = [0] * conc
                lats = []

                async def worker(i):
                    s = sandboxes[i]
                    while time.perf_counter() < stop:
                        t0 = time.perf_counter_ns()
                        await s.exec(["true"])
                        lats.append((time.perf_counter_ns() - t0) / 1e6)
                        counts[i] += 1

                t0 = time.perf_counter()
                await asyncio.gather(*(worker(i) for i in range(conc)))
                wall = time.perf_counter() - t0
                loops.append({"concurrency": conc, "requests": sum(counts),
                              "req_per_s": sum(counts) / wall, "latency_ms": summary(lats)})
        finally:
            for s in sandboxes:
                await s.delete()
    res = {"benchmark": "exec_rtt_python_sdk", "python": sys.version.split()[0],
           "sequential_exec_ms": summary(lat), "sequential_run_shell_ms": summary(shell),
           "closed_loop": loops, "samples": [round(x, 3) for x in lat]}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    s = res["sequential_exec_ms"]
    print(f"\nexec round trip of `true`, Python SDK, sequential (ms)")
    print(f"  exec(['true'])    p50 {s['p50_ms']:.3f}  p90 {s['p90_ms']:.3f}  p99 {s['p99_ms']:.3f}  n {s['n']}")
    s = res["sequential_run_shell_ms"]
    print(f"  run_shell('true') p50 {s['p50_ms']:.3f}  p90 {s['p90_ms']:.3f}  p99 {s['p99_ms']:.3f}  n {s['n']}")
    for l in loops:
        print(f"  closed loop C={l['concurrency']:<3} {l['req_per_s']:.0f} req/s  p50 {l['latency_ms']['p50_ms']:.2f} ms")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2000))
