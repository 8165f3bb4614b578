"""FnCall through the Python SDK: N calls of a short snippet from one
asyncio process at C concurrent calls (the SDK-level figure; the server's
capacity is measured with wrk). Usage: sdk_fncall.py OUT.json N C"""

import asyncio
import json
import statistics
import sys
import time

from dsec import DSecClient


async def main(out: str, n: int, conc: int) -> None:
    async with DSecClient() as c:
        for _ in range(50):
            await c.fncall("python", "print(1)")
        lat: list[float] = []
        sem = asyncio.Semaphore(conc)

        async def one() -> None:
            async with sem:
                t = time.perf_counter()
                r = await c.fncall("python", "print(sum(i * i for i in range(100)))")
                lat.append((time.perf_counter() - t) * 1000)
                assert r.ok and r.stdout == "328350\n", r

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        wall = time.perf_counter() - t0
        # Sequential round trip, one call at a time.
        seq: list[float] = []
        for _ in range(300):
            t = time.perf_counter()
            await c.fncall("python", "print(1)")
            seq.append((time.perf_counter() - t) * 1000)
    lat.sort()
    seq.sort()
    res = {
        "benchmark": "fncall_sdk", "calls": n, "concurrency": conc,
        "calls_per_s": n / wall,
        "p50_ms": statistics.median(lat), "p99_ms": lat[int(len(lat) * 0.99) - 1],
        "sequential_p50_ms": statistics.median(seq), "sequential_p99_ms": seq[int(len(seq) * 0.99) - 1],
    }
    json.dump(res, open(out, "w"), indent=1)
    print(json.dumps(res))


asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
