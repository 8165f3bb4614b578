"""Load generator of bench/lazy_burst.sh (issue 3, benchmark 1): a burst of
sandboxes over many distinct images from a shared store, on a node whose
own store starts empty (on-demand or eager) or already holds them (local).

    lazy_burst_bench.py run --mode M --images K --per P --pid PID --store DIR --out F
    lazy_burst_bench.py report [--link RATE] FILE...

The server is the one in DSEC_ENDPOINT / DSEC_TOKEN (bench/lib.sh starts it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from dsec import DSecClient, DSecContainerRunArgs

#: What each task does: reads its small files, a few MiB of its image's
#: large data (about 6% of it) and starts the base image's Python.
TASK = ("cat /task/hello.txt >/dev/null && head -c 8388608 /task/data.bin | sha256sum "
        "| cut -c1-8 && python3 -c 'import json, textwrap'")


def proc_write_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def allocated(root: Path) -> int:
    """Bytes the node's store really holds on disk (sparse files count
    only the chunks written)."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


async def one(client: DSecClient, image: int, t0: float) -> dict[str, float]:
    args = DSecContainerRunArgs(container_image="python", workspace=f"burst{image}:v1",
                                memory_limit_mb=256, cpu_cores_limit=0.1, ttl_running_stop=600)
    sb = await client.run_container(args, timeout=600)
    running = time.monotonic() - t0
    try:
        r = await sb.run_shell(TASK, timeout=300)
        if r.exit_code != 0:
            raise RuntimeError(f"task failed: {r.stdout!r} {r.stderr!r}")
        return {"running_s": running, "done_s": time.monotonic() - t0}
    finally:
        await sb.stop()


async def run(a: argparse.Namespace) -> None:
    store = Path(a.store)
    before_w, before_alloc = proc_write_bytes(a.pid), allocated(store)
    async with DSecClient() as client:
        t0 = time.monotonic()
        # Tasks of an image arrive together, images interleaved, all at once.
        jobs = [one(client, i, t0) for _ in range(a.per) for i in range(a.images)]
        results = await asyncio.gather(*jobs)
        wall = time.monotonic() - t0
    out = {
        "mode": a.mode, "images": a.images, "per": a.per, "sandboxes": len(results),
        "all_running_s": max(r["running_s"] for r in results),
        "all_done_s": wall,
        "median_running_s": statistics.median(r["running_s"] for r in results),
        "edge_write_bytes": proc_write_bytes(a.pid) - before_w,
        "store_bytes_added": allocated(store) - before_alloc,
    }
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(json.dumps(out))


def report(files: list[str], link: str) -> None:
    runs: dict[str, list[dict[str, float]]] = {}
    for f in files:
        r = json.loads(Path(f).read_text())
        runs.setdefault(r["mode"], []).append(r)
    med = {m: {k: statistics.median(r[k] for r in rs) for k in
               ("all_running_s", "all_done_s", "median_running_s", "edge_write_bytes",
                "store_bytes_added")} for m, rs in runs.items()}
    any_run = next(iter(runs.values()))[0]
    print(f"{any_run['sandboxes']} sandboxes over {any_run['images']} images "
          f"({any_run['per']} each); medians of {len(next(iter(runs.values())))} runs; "
          f"store link: {'none (same disk)' if link == 'none' else link}")
    print(f"{'mode':<10}{'all running s':>15}{'all done s':>12}{'median start s':>16}"
          f"{'edge wrote MB':>15}{'store grew MB':>15}")
    for m in ("lazy", "eager", "local"):
        if m in med:
            v = med[m]
            print(f"{m:<10}{v['all_running_s']:>15.1f}{v['all_done_s']:>12.1f}"
                  f"{v['median_running_s']:>16.2f}{v['edge_write_bytes'] / 1e6:>15.0f}"
                  f"{v['store_bytes_added'] / 1e6:>15.0f}")
    if "lazy" in med and "eager" in med:
        lz, eg = med["lazy"], med["eager"]
        print(f"on-demand vs eager: {eg['all_done_s'] / lz['all_done_s']:.2f}x faster burst, "
              f"{100 * (1 - lz['store_bytes_added'] / max(eg['store_bytes_added'], 1)):.0f}% fewer "
              f"bytes written to the node's store")


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--mode", required=True)
    r.add_argument("--images", type=int, required=True)
    r.add_argument("--per", type=int, required=True)
    r.add_argument("--pid", type=int, required=True)
    r.add_argument("--store", required=True)
    r.add_argument("--out", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("--link", default="none")
    rep.add_argument("files", nargs="+")
    a = p.parse_args()
    if a.cmd == "run":
        asyncio.run(run(a))
    else:
        report(a.files, a.link)


if __name__ == "__main__":
    main()
