#!/usr/bin/env python3
"""The Python SDK's own cost, one phase per call (bench/sdk_cost.sh runs
the phases for the previous SDK and this one, alternating, in one run).

The SDK is whichever `dsec` package PYTHONPATH gives; the phase reports
what it measured as one JSON object on stdout. CPU is the process's own
(`time.process_time`: every thread, user + system), so it is the client's
cost alone; the server runs in another process.

Phases:
  create N        create -> first `run_shell("true")` answered, N times
                  (deleted untimed); with an SDK that has `first_command`,
                  the same in one request, alternating with the two-call way
  exec N          `exec(["true"])` N times in a row on one sandbox, then the
                  same through the blocking wrapper (dsec.sync), in
                  alternating blocks
  make N FILE     create N sandboxes (16 MiB, 0.05 CPU), write their ids
  fanout FILE SECONDS C
                  C workers run `exec(["true"])` for SECONDS, worker i on
                  sandboxes i, i + C, ... of FILE in turn
  remove FILE     delete the sandboxes of FILE
  profile N       `exec(["true"])` N times under cProfile; the time spent in
                  each layer (waiting in epoll left out), and the top functions

Usage: DSEC_ENDPOINT=... DSEC_TOKEN=... python3 bench/sdk_cost_bench.py PHASE ARGS...
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import os
import statistics
import sys
import time

import dsec
from dsec import DSecClient, DSecContainerRunArgs


def summary(v: list[float]) -> dict[str, float]:
    s = sorted(v)
    n = len(s)

    def pct(p: float) -> float:
        return s[min(n, max(1, math.ceil(p / 100 * n))) - 1]

    return {"n": n, "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99),
            "mean_ms": statistics.fmean(s), "samples": [round(x, 4) for x in v]}


def bench_args(memory_mb: int = 64, cpu: float = 0.5) -> DSecContainerRunArgs:
    return DSecContainerRunArgs(container_image="busybox", memory_limit_mb=memory_mb,
                                cpu_cores_limit=cpu, disk_limit_mb=64 if memory_mb >= 64 else 16,
                                pids_limit=64, ttl_running_stop=900, network_rules={},
                                init_user="root", job="dsec-bench")


def has_first_command() -> bool:
    return "first_command" in inspect.signature(DSecClient.run_container).parameters


async def phase_create(n: int) -> dict:
    one_trip = has_first_command()
    two, one, cpu_two, cpu_one = [], [], [], []
    async with DSecClient() as client:
        for i in range(n + 10):
            way = "one" if one_trip and i % 2 else "two"
            c0, t0 = time.process_time(), time.perf_counter()
            if way == "two":
                sb = await client.run_container(bench_args(), timeout=60)
                r = await sb.run_shell("true")
            else:
                sb = await client.run_container(bench_args(), timeout=60, first_command="true")
                r = sb.first_result
            t1, c1 = time.perf_counter(), time.process_time()
            assert r is not None and r.exit_code == 0, r
            await sb.delete()
            if i < 10:
                continue  # warm-up
            (two if way == "two" else one).append((t1 - t0) * 1e3)
            (cpu_two if way == "two" else cpu_one).append((c1 - c0) * 1e6)
    out = {"create_then_run_shell_ms": summary(two),
           "create_then_run_shell_cpu_us": statistics.median(cpu_two)}
    if one:
        out["create_with_first_command_ms"] = summary(one)
        out["create_with_first_command_cpu_us"] = statistics.median(cpu_one)
    return out


async def _exec_block(sb, n: int) -> tuple[list[float], float]:
    lat = []
    c0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter_ns()
        r = await sb.exec(["true"])
        lat.append((time.perf_counter_ns() - t0) / 1e6)
        assert r.exit_code == 0
    return lat, (time.process_time() - c0) / n * 1e6


def _sync_block(sb, n: int) -> tuple[list[float], float]:
    lat = []
    c0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter_ns()
        r = sb.exec(["true"])
        lat.append((time.perf_counter_ns() - t0) / 1e6)
        assert r.exit_code == 0
    return lat, (time.process_time() - c0) / n * 1e6


async def phase_exec(n: int) -> dict:
    from dsec import sync

    blocks = 4
    per = max(1, n // blocks)
    alat, slat, acpu, scpu = [], [], [], []
    sclient = sync.DSecClient()
    async with DSecClient() as client:
        sb = await client.run_container(bench_args(cpu=2.0), timeout=60)
        ssb = sclient.sandbox(sb.id)
        try:
            await _exec_block(sb, 200)
            # The blocking calls wait on another thread's loop: run them off
            # this loop so it is idle meanwhile, as in a plain script.
            await asyncio.to_thread(_sync_block, ssb, 200)
            for _ in range(blocks):
                lat, cpu = await _exec_block(sb, per)
                alat += lat
                acpu.append(cpu)
                lat, cpu = await asyncio.to_thread(_sync_block, ssb, per)
                slat += lat
                scpu.append(cpu)
        finally:
            await sb.delete()
            sclient.close()
    return {"exec_true_ms": summary(alat), "exec_true_cpu_us": statistics.median(acpu),
            "sync_exec_true_ms": summary(slat), "sync_exec_true_cpu_us": statistics.median(scpu)}


async def phase_make(n: int, path: str) -> dict:
    ids: list[str] = []
    sem = asyncio.Semaphore(16)
    async with DSecClient() as client:
        async def one() -> None:
            async with sem:
                sb = await client.run_container(bench_args(memory_mb=16, cpu=0.05), timeout=120)
                ids.append(sb.id)
        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        wall = time.perf_counter() - t0
    with open(path, "w") as f:
        f.write("\n".join(ids) + "\n")
    return {"created": len(ids), "seconds": wall}


async def phase_fanout(path: str, seconds: float, conc: int) -> dict:
    ids = open(path).read().split()
    # Each client takes its own sandboxes: no more clients than sandboxes.
    conc = min(conc, len(ids))
    async with DSecClient(max_connections=max(1024, conc)) as client:
        sandboxes = [client.sandbox(i) for i in ids]
        for sb in sandboxes[:conc]:  # open the connections before the clock
            await sb.exec(["true"])
        counts = [0] * conc
        errors = [0]
        stop = 0.0

        async def worker(i: int) -> None:
            mine = sandboxes[i::conc]
            k = 0
            while time.perf_counter() < stop:
                r = await mine[k % len(mine)].exec(["true"])
                if r.exit_code != 0:
                    errors[0] += 1
                counts[i] += 1
                k += 1

        c0 = time.process_time()
        t0 = time.perf_counter()
        stop = t0 + seconds
        await asyncio.gather(*(worker(i) for i in range(conc)))
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0
    total = sum(counts)
    return {"sandboxes": len(ids), "concurrency": conc, "execs": total, "errors": errors[0],
            "exec_per_s": total / wall, "client_cpu_us_per_exec": cpu / total * 1e6,
            "client_cpu_share": cpu / wall,
            "client_bound_exec_per_s": total / cpu}


async def phase_remove(path: str) -> dict:
    ids = open(path).read().split()
    sem = asyncio.Semaphore(32)
    async with DSecClient() as client:
        async def one(i: str) -> None:
            async with sem:
                await client.sandbox(i).delete()
        await asyncio.gather(*(one(i) for i in ids))
    return {"removed": len(ids)}


#: Which layer a profiled function belongs to, by the file it is in.
LAYERS = (("HTTP (aiohttp, yarl, multidict)", ("aiohttp", "yarl", "multidict")),
          ("HTTP (dsec._pool)", ("dsec/_pool.py",)),
          ("JSON", ("json/", "orjson", "dsec/_json.py")),
          ("event loop (asyncio, selectors)", ("asyncio", "selectors", "_contextvars", "Future",
                                               "Task", "call_soon", "create_task")),
          ("socket syscalls (send, recv)", ("'send'", "'recv'", "'sendall'")),
          ("SDK (request building, results)", ("dsec/",)))


def layer_of(func: tuple) -> str:
    where = f"{func[0]}:{func[2]}"
    for name, marks in LAYERS:
        if any(m in where for m in marks):
            return name
    return "other"


async def phase_profile(n: int) -> dict:
    import cProfile
    import pstats

    async with DSecClient() as client:
        sb = await client.run_container(bench_args(cpu=2.0), timeout=60)
        try:
            await _exec_block(sb, 200)
            prof = cProfile.Profile()
            prof.enable()
            await _exec_block(sb, n)
            prof.disable()
        finally:
            await sb.delete()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    layers: dict[str, float] = {}
    funcs = []
    for func, (_cc, _nc, tottime, _ct, _callers) in stats.items():
        if func[2] == "<method 'poll' of 'select.epoll' objects>":
            continue  # waiting for the server, not work
        layer = layer_of(func)
        layers[layer] = layers.get(layer, 0.0) + tottime
        funcs.append((tottime, f"{os.path.basename(func[0])}:{func[1]}({func[2]})", layer))
    total = sum(layers.values())
    funcs.sort(reverse=True)
    return {"execs": n, "profiled_us_per_exec": total / n * 1e6,
            "layers_us_per_exec": {k: v / n * 1e6 for k, v in
                                   sorted(layers.items(), key=lambda kv: -kv[1])},
            "top": [{"us_per_exec": t / n * 1e6, "function": f, "layer": la}
                    for t, f, la in funcs[:15]]}


def main() -> None:
    phase, rest = sys.argv[1], sys.argv[2:]
    if phase == "create":
        out = asyncio.run(phase_create(int(rest[0])))
    elif phase == "exec":
        out = asyncio.run(phase_exec(int(rest[0])))
    elif phase == "make":
        out = asyncio.run(phase_make(int(rest[0]), rest[1]))
    elif phase == "fanout":
        out = asyncio.run(phase_fanout(rest[0], float(rest[1]), int(rest[2])))
    elif phase == "profile":
        out = asyncio.run(phase_profile(int(rest[0])))
    elif phase == "remove":
        out = asyncio.run(phase_remove(rest[0]))
    else:
        raise SystemExit(f"unknown phase {phase!r}")
    out["phase"] = phase
    out["loadavg_end"] = os.getloadavg()
    out["sdk"] = os.path.dirname(os.path.dirname(os.path.abspath(dsec.__file__)))
    out["json_codec"] = "orjson" if getattr(getattr(dsec, "_json", None), "FAST", False) \
        else "json"
    json.dump(out, sys.stdout)
    print()


if __name__ == "__main__":
    main()
