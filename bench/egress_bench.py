#!/usr/bin/env python3
"""Issue 7 (egress), Python side of bench/egress_cost.sh: creation and exec
with and without a network of the sandbox's own (alternated), then TCP
connection setup through the eBPF allowlist vs a namespace without policy.

Usage: DSEC_ENDPOINT=... DSEC_TOKEN=... python3 bench/egress_bench.py OUT.json N MIRROR_IP PLAIN_NETNS
"""

import asyncio
import glob
import json
import math
import statistics
import subprocess
import sys
import time

from dsec import DSecClient, DSecContainerRunArgs

# Runs where the connections start: N connects+closes, one latency (µs) a line.
CONNECT_LOOP = r'''
import socket, sys, time
host, n = sys.argv[1], int(sys.argv[2])
for i in range(n + 20):
    t0 = time.perf_counter_ns()
    s = socket.create_connection((host, 8080), timeout=3)
    dt = (time.perf_counter_ns() - t0) / 1e3
    s.close()
    if i >= 20:
        print(f"{dt:.1f}")
'''


def detach_programs(sandbox_id):
    cgs = glob.glob(f"/sys/fs/cgroup/unified/dsec/*/{sandbox_id}") + glob.glob(f"/sys/fs/cgroup/dsec/*/{sandbox_id}")
    assert cgs, f"no cgroup2 directory for {sandbox_id}"
    progs = json.loads(subprocess.run(["bpftool", "-j", "cgroup", "show", cgs[0]], check=True,
                                      capture_output=True, text=True).stdout)
    assert len(progs) == 5, progs
    for p in progs:
        subprocess.run(["bpftool", "cgroup", "detach", cgs[0], p["attach_type"], "id", str(p["id"])], check=True)


def summary(v):
    s = sorted(v)
    n = len(s)

    def pct(p):
        return s[min(n, max(1, math.ceil(p / 100 * n))) - 1]

    return {"n": n, "p50": pct(50), "p90": pct(90), "p99": pct(99), "mean": statistics.fmean(s)}


def args(rules):
    return DSecContainerRunArgs(container_image="python", memory_limit_mb=128, cpu_cores_limit=1,
                                disk_limit_mb=64, pids_limit=64, ttl_running_stop=300,
                                network_rules=rules, init_user="root", job="dsec-bench")


#: Quiet time after each sandbox (see the loop).
SETTLE_S = 0.1


async def main(out, n, mirror, plain_ns):
    variants = {"loopback only (no rules)": {}, "veth + eBPF allowlist": {"mirror": True}}
    res = {k: {"create_ms": [], "server_create_ms": [], "first_exec_ms": [], "exec_ms": []} for k in variants}
    async with DSecClient() as client:
        for i in range(n + 5):
            for name, rules in variants.items():
                t0 = time.perf_counter()
                sb = await client.run_container(args(rules), timeout=60)
                t1 = time.perf_counter()
                r = await sb.exec(["true"])
                t2 = time.perf_counter()
                assert r.exit_code == 0, r
                execs = []
                for _ in range(5):
                    t = time.perf_counter()
                    await sb.exec(["true"])
                    execs.append((time.perf_counter() - t) * 1e3)
                await sb.delete()
                # The node's background work of this iteration (the pool
                # refilling, the kernel tearing the namespace down) ends
                # before the next creation, which would otherwise pay for it.
                await asyncio.sleep(SETTLE_S)
                if i >= 5:  # warm-up
                    m = res[name]
                    m["create_ms"].append((t1 - t0) * 1e3)
                    m["server_create_ms"].append(sb.info.create_ms or 0.0)
                    m["first_exec_ms"].append((t2 - t1) * 1e3)
                    m["exec_ms"].append(statistics.median(execs))
        conns = max(200, n * 2)
        sb = await client.run_container(args({"mirror": True}), timeout=60)
        try:
            r = await sb.run_shell(f"python3 -c '{CONNECT_LOOP}' {mirror} {conns}", timeout=300)
            assert r.exit_code == 0, r
            through = [float(x) for x in r.stdout.split()]
            # The same sandbox and process kind without the programs: the
            # cost of the allowlist alone. (Only this benchmark's own
            # sandbox is ever opened like this, and it is deleted next.)
            detach_programs(sb.id)
            r = await sb.run_shell(f"python3 -c '{CONNECT_LOOP}' {mirror} {conns}", timeout=300)
            assert r.exit_code == 0, r
            detached = [float(x) for x in r.stdout.split()]
        finally:
            await sb.delete()
    p = subprocess.run(["ip", "netns", "exec", plain_ns, sys.executable, "-c", CONNECT_LOOP, mirror, str(conns)],
                       check=True, capture_output=True, text=True)
    plain = [float(x) for x in p.stdout.split()]

    report = {k: {m: summary(v) for m, v in d.items()} for k, d in res.items()}
    report["connect_us"] = {"through the allowlist (sandbox)": summary(through),
                            "same sandbox, programs detached": summary(detached),
                            "no policy (plain netns)": summary(plain)}
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    lo, net = report["loopback only (no rules)"], report["veth + eBPF allowlist"]
    print(f"{'':34} {'p50':>8} {'p90':>8} {'p99':>8}")
    for k in ("create_ms", "server_create_ms", "first_exec_ms", "exec_ms"):
        for name, d in (("loopback only", lo), ("veth + eBPF", net)):
            s = d[k]
            print(f"{k + ' ' + name:34} {s['p50']:8.2f} {s['p90']:8.2f} {s['p99']:8.2f}")
        print(f"{'  ratio p50 (veth+eBPF / loopback)':34} {net[k]['p50'] / lo[k]['p50']:8.2f}")
    for name, s in report["connect_us"].items():
        print(f"{'connect µs ' + name:34} {s['p50']:8.1f} {s['p90']:8.1f} {s['p99']:8.1f}")
    c = report["connect_us"]
    print(f"{'  ratio p50 (allowlist / detached)':34} {c['through the allowlist (sandbox)']['p50'] / c['same sandbox, programs detached']['p50']:8.2f}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]))
