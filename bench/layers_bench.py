"""Load generator of bench/layers.sh (issue 3, benchmark 2): the same
workspace and toolkit given to N sandboxes as EROFS layers vs as a tar.gz
extracted in each sandbox, then the same recorded command sequence.

    layers_bench.py run --mode layers|tar --n N --bundle F --out F
    layers_bench.py report FILE...

The server is the one in DSEC_ENDPOINT / DSEC_TOKEN (bench/lib.sh starts it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from dsec import DSecClient, DSecContainerRunArgs

# What a task does with its workspace and toolkit: reads a few files of
# each (a small part, as in the paper's traces), runs a tool, writes a
# result. The same sequence in both modes.
SEQUENCE = [
    "grep -l 'def ' /workspace/json/*.py | wc -l",
    "python3 -c \"import sys; sys.path.insert(0, '/workspace'); import textwrap, string; "
    "print(textwrap.fill(string.ascii_letters, 20))\"",
    "wc -l /opt/toolkit/stdio.h /opt/toolkit/stdlib.h /opt/toolkit/string.h",
    "ls /opt/toolkit/linux | wc -l",
    "grep -c include /opt/toolkit/linux/fs.h",
    "echo result > /workspace/out.txt && cat /workspace/out.txt",
]


def args(mode: str) -> DSecContainerRunArgs:
    a = DSecContainerRunArgs(container_image="python", memory_limit_mb=1024,
                             cpu_cores_limit=0.1, disk_limit_mb=768, ttl_running_stop=600)
    if mode == "layers":
        a.workspace = "bench-ws"
        a.toolkits = ["bench-tk"]
    return a


async def one(client: DSecClient, mode: str, bundle: Path) -> dict:
    t0 = time.monotonic()
    sb = await client.run_container(args(mode), timeout=600)
    try:
        t_created = time.monotonic()
        if mode == "tar":
            await sb.upload(bundle, "/tmp/bundle.tar.gz")
            r = await sb.run_shell("tar xzf /tmp/bundle.tar.gz -C / && rm /tmp/bundle.tar.gz",
                                   timeout=600)
            assert r.exit_code == 0, r
        t_ready = time.monotonic()
        for cmd in SEQUENCE:
            r = await sb.run_shell(cmd, timeout=600)
            assert r.exit_code == 0, (cmd, r)
        t_done = time.monotonic()
        # overlayfs reports its upper's usage: what this sandbox wrote.
        r = await sb.run_shell("df -B1 --output=used / | tail -1")
        written = int(r.stdout.strip())
        return {"create_ms": (t_created - t0) * 1e3, "ready_ms": (t_ready - t0) * 1e3,
                "total_ms": (t_done - t0) * 1e3, "written_bytes": written}
    finally:
        await sb.stop()


async def run(a: argparse.Namespace) -> None:
    async with DSecClient() as client:
        t0 = time.monotonic()
        rows = await asyncio.gather(*(one(client, a.mode, Path(a.bundle)) for _ in range(a.n)))
        wall = time.monotonic() - t0
    out = {"mode": a.mode, "n": a.n, "wall_s": round(wall, 2),
           "total_ms_p50": round(statistics.median(r["total_ms"] for r in rows), 1),
           "ready_ms_p50": round(statistics.median(r["ready_ms"] for r in rows), 1),
           "written_bytes_sum": sum(r["written_bytes"] for r in rows), "rows": rows}
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"{a.mode}: {a.n} sandboxes in {wall:.2f} s, p50 {out['total_ms_p50']} ms, "
          f"written {out['written_bytes_sum'] / 1e6:.1f} MB")


def report(files: list[str]) -> None:
    runs: dict[str, list[dict]] = {}
    for f in files:
        d = json.loads(Path(f).read_text())
        runs.setdefault(d["mode"], []).append(d)
    med = {m: {k: statistics.median(r[k] for r in rs)
               for k in ("wall_s", "total_ms_p50", "ready_ms_p50", "written_bytes_sum")}
           for m, rs in runs.items()}
    print("| | EROFS layers | tar.gz extraction | ratio |")
    print("|---|---|---|---|")
    lay, tar = med.get("layers"), med.get("tar")
    if not (lay and tar):
        print("(need both modes)")
        return
    for key, label, scale, unit in [("wall_s", "burst completion (all sandboxes)", 1, "s"),
                                    ("total_ms_p50", "per sandbox, create to last command (p50)", 1, "ms"),
                                    ("ready_ms_p50", "per sandbox, create to files in place (p50)", 1, "ms"),
                                    ("written_bytes_sum", "bytes written to writable layers", 1e-3, "kB")]:
        print(f"| {label} | {lay[key] * scale:,.1f} {unit} | {tar[key] * scale:,.1f} {unit} | "
              f"{tar[key] / lay[key]:,.1f}x |")
    print(f"\n(medians of {len(runs['layers'])} and {len(runs['tar'])} runs of "
          f"{runs['layers'][0]['n']} sandboxes each)")


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--mode", choices=["layers", "tar"], required=True)
    r.add_argument("--n", type=int, default=16)
    r.add_argument("--bundle", required=True)
    r.add_argument("--out", required=True)
    rep = sub.add_parser("report")
    rep.add_argument("files", nargs="+")
    a = p.parse_args()
    if a.cmd == "run":
        asyncio.run(run(a))
    else:
        report(a.files)


if __name__ == "__main__":
    main()
