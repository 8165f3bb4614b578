"""The E2B compatibility layer's cost (bench/e2b.sh drives it).

The unmodified ``e2b`` SDK against dsec's E2B routes, side by side with
dsec's own SDK on the same server, the two alternating in rounds:

- ``lifecycle N ROUNDS``: create, first command (``true``) answered, kill;
  each of the N per side timed whole and by part.
- ``exec N ROUNDS``: the ``commands.run("true")`` round trip on one live
  sandbox, against ``exec`` of the same login-shell argv it sends.
- ``burst N``: N creations at once from one asyncio process (then each
  killed), through each SDK in turn.

Prints one JSON object. The endpoint and token come from DSEC_ENDPOINT and
DSEC_TOKEN; the e2b SDK is pointed at the same listener only through its
own environment variables, as a user would.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from e2b import AsyncSandbox

from dsec import DSecClient, DSecContainerRunArgs

IMAGE = os.environ.get("DSEC_BENCH_E2B_IMAGE", "python")
ENDPOINT = os.environ["DSEC_ENDPOINT"]
TOKEN = os.environ["DSEC_TOKEN"]
os.environ.update({"E2B_API_URL": ENDPOINT, "E2B_SANDBOX_URL": ENDPOINT,
                   "E2B_API_KEY": TOKEN, "E2B_VALIDATE_API_KEY": "false"})
os.environ.pop("E2B_DOMAIN", None)


def summary(ms: list[float]) -> dict[str, float]:
    s = sorted(ms)
    return {"n": len(s), "p50_ms": statistics.median(s), "p99_ms": s[min(len(s) - 1, int(len(s) * 0.99))],
            "mean_ms": statistics.fmean(s)}


#: What the e2b SDK's ``commands.run(cmd)`` asks envd to run: a login
#: shell. The native side runs the same argv, so the ratio is the cost of
#: the SDK and the compatibility layer, not of bash's start-up files.
E2B_ARGV = ["/bin/bash", "-l", "-c", "true"]


def args() -> DSecContainerRunArgs:
    # The server's default limits, as an E2B creation gets them.
    return DSecContainerRunArgs(container_image=IMAGE, ttl_running_stop=0, max_lifetime_s=600,
                                labels={"bench": "e2b"})


async def e2b_lifecycle() -> tuple[float, float, float]:
    t0 = time.perf_counter()
    s = await AsyncSandbox.create(template=IMAGE, timeout=600)
    t1 = time.perf_counter()
    r = await s.commands.run("true")
    t2 = time.perf_counter()
    assert r.exit_code == 0
    await s.kill()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (time.perf_counter() - t0) * 1e3


async def native_lifecycle(c: DSecClient) -> tuple[float, float, float]:
    t0 = time.perf_counter()
    s = await c.run_container(args(), timeout=120)
    t1 = time.perf_counter()
    r = await s.exec(E2B_ARGV)
    t2 = time.perf_counter()
    assert r.exit_code == 0
    await s.delete()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3, (time.perf_counter() - t0) * 1e3


async def timed(n: int, one: Callable[[], Awaitable[Any]]) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await one()
        out.append((time.perf_counter() - t) * 1e3)
    return out


async def lifecycle(n: int, rounds: int) -> dict[str, Any]:
    parts: dict[str, dict[str, list[float]]] = {
        side: {"create": [], "first": [], "whole": []} for side in ("e2b", "native")}
    async with DSecClient(ENDPOINT, TOKEN) as c:
        for side in ("e2b", "native"):  # warm both paths
            await (e2b_lifecycle() if side == "e2b" else native_lifecycle(c))
        for _ in range(rounds):
            for side in ("e2b", "native"):
                for _ in range(n // rounds):
                    a, b, w = await (e2b_lifecycle() if side == "e2b" else native_lifecycle(c))
                    parts[side]["create"].append(a)
                    parts[side]["first"].append(b)
                    parts[side]["whole"].append(w)
    return {side: {k: summary(v) for k, v in p.items()} for side, p in parts.items()}


async def exec_rtt(n: int, rounds: int) -> dict[str, Any]:
    got: dict[str, list[float]] = {"e2b": [], "native": []}
    async with DSecClient(ENDPOINT, TOKEN) as c:
        e = await AsyncSandbox.create(template=IMAGE, timeout=600)
        s = await c.run_container(args(), timeout=120)
        try:
            await e.commands.run("true")
            await s.exec(E2B_ARGV)
            for _ in range(rounds):
                got["e2b"] += await timed(n // rounds, lambda: e.commands.run("true"))
                got["native"] += await timed(n // rounds, lambda: s.exec(E2B_ARGV))
        finally:
            await e.kill()
            await s.delete()
    return {side: summary(v) for side, v in got.items()}


async def burst(n: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with DSecClient(ENDPOINT, TOKEN) as c:
        for side in ("e2b", "native"):
            async def create_one() -> tuple[float, Any]:
                t = time.perf_counter()
                if side == "e2b":
                    s: Any = await AsyncSandbox.create(template=IMAGE, timeout=600)
                else:
                    s = await c.run_container(args(), timeout=600)
                return (time.perf_counter() - t) * 1e3, s

            t0 = time.perf_counter()
            made = await asyncio.gather(*(create_one() for _ in range(n)), return_exceptions=True)
            wall = time.perf_counter() - t0
            ok = [m for m in made if not isinstance(m, BaseException)]
            failed = [repr(m)[:200] for m in made if isinstance(m, BaseException)]
            sem = asyncio.Semaphore(64)

            async def drop(s: Any) -> None:
                async with sem:
                    await (s.kill() if side == "e2b" else s.delete())

            await asyncio.gather(*(drop(s) for _, s in ok))
            out[side] = {"wall_s": wall, "per_s": len(ok) / wall, "failed": len(failed),
                         "first_failures": failed[:3], **summary([ms for ms, _ in ok] or [0.0])}
    return out


def main() -> None:
    what = sys.argv[1]
    if what == "lifecycle":
        res = asyncio.run(lifecycle(int(sys.argv[2]), int(sys.argv[3])))
    elif what == "exec":
        res = asyncio.run(exec_rtt(int(sys.argv[2]), int(sys.argv[3])))
    elif what == "burst":
        res = asyncio.run(burst(int(sys.argv[2])))
    else:
        raise SystemExit(f"unknown phase {what!r}")
    print(json.dumps({"phase": what, **res}))


if __name__ == "__main__":
    main()
