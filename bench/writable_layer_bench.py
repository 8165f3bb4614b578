"""The parts of bench/writable_layer.sh that drive a running platform
(DSEC_ENDPOINT, DSEC_TOKEN) through the SDK, and its report."""

from __future__ import annotations

import argparse
import asyncio
import glob
import io
import json
import os
import statistics
import time
import zipfile
from typing import Any

from dsec import DSecClient, DSecContainerRunArgs


def _client() -> DSecClient:
    return DSecClient(os.environ["DSEC_ENDPOINT"], os.environ["DSEC_TOKEN"])


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


async def create(n: int, label: str, out: str) -> None:
    """Sequential creations, each answered with its first command."""
    args = DSecContainerRunArgs(container_image="python", memory_limit_mb=512, cpu_cores_limit=1,
                                disk_limit_mb=1024, labels={"bench": "writable_layer"})
    times: list[float] = []
    async with _client() as c:
        for _ in range(n + 5):
            t0 = time.perf_counter()
            sb = await c.run_container(args, timeout=120)
            r = await sb.run_shell("true")
            times.append((time.perf_counter() - t0) * 1000)
            assert r.exit_code == 0, r
            await sb.delete()
    times = times[5:]
    json.dump({"label": label, "n": n, "ms": times}, open(out, "w"))
    print(f"{label}: create+first exec p50 {statistics.median(times):.1f} ms p90 {_pct(times, 0.9):.1f} ms")


def _wheel(modules: int) -> bytes:
    """A pure-Python wheel of `modules` small modules, built in memory (no
    network, no build backend)."""
    name, version = "benchpkg", "1.0"
    files: dict[str, bytes] = {f"{name}/__init__.py": b""}
    for i in range(modules):
        files[f"{name}/m{i:04d}.py"] = (f"def f{i}(x):\n    return x * {i}\n" * 20).encode()
    info = f"{name}-{version}.dist-info"
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: bench\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files[f"{info}/RECORD"] = "".join(f"{p},,\n" for p in [*files, f"{info}/RECORD"]).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p, data in files.items():
            z.writestr(p, data)
    return buf.getvalue()


async def files(reps: int, label: str, out: str) -> None:
    args = DSecContainerRunArgs(container_image="python", memory_limit_mb=2048, cpu_cores_limit=1,
                                disk_limit_mb=4096, labels={"bench": "writable_layer"})
    res: dict[str, list[float]] = {"untar_ms": [], "pip_install_ms": []}
    async with _client() as c:
        sb = await c.run_container(args, timeout=120)
        try:
            r = await sb.run_shell("tar -C / -cf /root/src.tar usr/lib/python3* && tar -tf /root/src.tar | wc -l")
            assert r.exit_code == 0, r
            entries = int(r.stdout.split()[-1])
            await sb.write_file("/root/benchpkg-1.0-py3-none-any.whl", _wheel(2000))
            for i in range(reps):
                # What each rep wrote is removed and synced first, so no
                # rep pays for the last one's writeback.
                await sb.run_shell("rm -rf /root/x && sync", timeout=300)
                t0 = time.perf_counter()
                r = await sb.run_shell(f"mkdir /root/x && tar -C /root/x -xf /root/src.tar", timeout=300)
                res["untar_ms"].append((time.perf_counter() - t0) * 1000)
                assert r.exit_code == 0, r
                await sb.run_shell("pip uninstall -qy benchpkg >/dev/null 2>&1; sync", timeout=300)
                t0 = time.perf_counter()
                r = await sb.run_shell("pip install -q --no-index --no-deps --no-compile "
                                       "/root/benchpkg-1.0-py3-none-any.whl", timeout=300)
                res["pip_install_ms"].append((time.perf_counter() - t0) * 1000)
                assert r.exit_code == 0, r
        finally:
            await sb.delete()
    json.dump({"label": label, "tar_entries": entries, **res}, open(out, "w"))
    print(f"{label}: untar {entries} entries p50 {statistics.median(res['untar_ms']):.0f} ms, "
          f"pip install p50 {statistics.median(res['pip_install_ms']):.0f} ms")


def report(work: str, out: str) -> None:
    load = os.getloadavg()
    d: dict[str, Any] = {"benchmark": "writable_layer", "host_load_1m_at_end": load[0], "modes": {}}
    for mode in ("tmpfs", "disk"):
        ms: list[float] = []
        for f in sorted(glob.glob(f"{work}/create-{mode}-*.json")):
            ms += json.load(open(f))["ms"]
        fl = json.load(open(f"{work}/files-{mode}.json"))
        dn = json.load(open(f"{work}/density-{mode}.json"))
        d["modes"][mode] = {
            "create_first_exec_ms": {"n": len(ms), "p50": statistics.median(ms), "p90": _pct(ms, 0.9)},
            "untar_ms_p50": statistics.median(fl["untar_ms"]), "tar_entries": fl["tar_entries"],
            "pip_install_ms_p50": statistics.median(fl["pip_install_ms"]),
            "density": {"n": dn["created"], "memory_per_sandbox_mib": dn["memory_per_sandbox_mib"],
                        "create_ms_server_p50": dn["create_ms_server"]["all"].get("p50_ms")},
        }
    t, k = d["modes"]["tmpfs"], d["modes"]["disk"]
    d["ratios_disk_over_tmpfs"] = {
        "create_p50": k["create_first_exec_ms"]["p50"] / t["create_first_exec_ms"]["p50"],
        "untar_p50": k["untar_ms_p50"] / t["untar_ms_p50"],
        "pip_install_p50": k["pip_install_ms_p50"] / t["pip_install_ms_p50"],
        "memory_per_sandbox": k["density"]["memory_per_sandbox_mib"] / t["density"]["memory_per_sandbox_mib"],
    }
    json.dump(d, open(out, "w"), indent=1)
    print(json.dumps(d, indent=1))


def main() -> None:
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("create")
    c.add_argument("--n", type=int, default=100)
    c.add_argument("--label", required=True)
    c.add_argument("--out", required=True)
    f = sub.add_parser("files")
    f.add_argument("--reps", type=int, default=5)
    f.add_argument("--label", required=True)
    f.add_argument("--out", required=True)
    r = sub.add_parser("report")
    r.add_argument("--work", required=True)
    r.add_argument("--out", required=True)
    a = p.parse_args()
    if a.cmd == "create":
        asyncio.run(create(a.n, a.label, a.out))
    elif a.cmd == "files":
        asyncio.run(files(a.reps, a.label, a.out))
    else:
        report(a.work, a.out)


if __name__ == "__main__":
    main()
