#!/usr/bin/env bash
# File transfer into and out of a container sandbox, side by side in one run:
# `dsec cp` (compiled, streamed) and the Python SDK's upload/download
# (aiohttp, streamed), for one large file and for a directory of many small
# files. Each figure is the median of ROUNDS, alternating the two clients.
# Usage: bench/transfer.sh [ROUNDS] [MIB] [FILES] (default 5 256 3000; ~2 min)
source "$(dirname "$0")/lib.sh"
ROUNDS=${1:-5}
MIB=${2:-256}
FILES=${3:-3000}
bench_init transfer
bench_build
bench_start_dsec
# Memory for the file twice over: the writable layer is a tmpfs in the
# sandbox's memory, and a replaced file is written beside the old one.
ID=$("$DSEC" run --memory-mb $((MIB * 4 + 512)) --disk-mb $((MIB * 3)) busybox)
bench_log "sandbox $ID; $MIB MiB file, $FILES files of 2 KB, $ROUNDS rounds"
head -c "$((MIB << 20))" /dev/urandom >"$WORK/big.bin"
mkdir "$WORK/small"
"$PY" - "$WORK/small" "$FILES" <<'PYEOF'
import os, sys
for i in range(int(sys.argv[2])):
    with open(os.path.join(sys.argv[1], f"f{i}"), "wb") as f:
        f.write(os.urandom(2000))
PYEOF

"$PY" - "$DSEC" "$ID" "$WORK" "$ROUNDS" "$MIB" "$FILES" "$RESULTS/transfer.json" <<'PYEOF'
import asyncio, json, os, statistics, subprocess, sys, time
import dsec

binary, sid, work, rounds, mib, files, out = sys.argv[1:8]
rounds, mib, files = int(rounds), int(mib), int(files)
big, small = os.path.join(work, "big.bin"), os.path.join(work, "small")

def cli(src, dst):
    t = time.perf_counter()
    subprocess.run([binary, "cp", src, dst], check=True, capture_output=True)
    return time.perf_counter() - t

async def sdk(op, *args):
    t = time.perf_counter()
    await op(*args)
    return time.perf_counter() - t

async def main():
    times = {}
    def add(key, secs):
        times.setdefault(key, []).append(secs)
    async with dsec.DSecClient(os.environ["DSEC_ENDPOINT"], os.environ["DSEC_TOKEN"]) as c:
        sb = c.sandbox(sid)
        for r in range(rounds):
            for who in (["cli", "sdk"] if r % 2 == 0 else ["sdk", "cli"]):
                for what, src, remote in [("file", big, "/tmp/big.bin"), ("dir", small, "/tmp/small")]:
                    # A fresh local name every time, nothing removed until the
                    # end: ext4 makes a file created soon after thousands were
                    # deleted nearby slow (its inode allocator skips recently
                    # freed inodes one by one), which would time the host.
                    back = os.path.join(work, f"back-{r}-{who}-{what}")
                    await sb.run_shell(f"rm -rf {remote}")
                    if who == "cli":
                        add(f"{who} {what} up", cli(src, f"{sid}:{remote}"))
                        add(f"{who} {what} down", cli(f"{sid}:{remote}", back))
                    else:
                        add(f"{who} {what} up", await sdk(sb.upload, src, remote))
                        add(f"{who} {what} down", await sdk(sb.download, remote, back))
                    same = (subprocess.run(["cmp", src, back]).returncode == 0 if what == "file"
                            else subprocess.run(["diff", "-r", src, back]).returncode == 0)
                    assert same, f"{who} {what}: the copy differs"
    size = {"file": mib << 20, "dir": files * 2000}
    rows = []
    for key, ts in sorted(times.items()):
        who, what, way = key.split()
        med = statistics.median(ts)
        rows.append({"client": who, "what": what, "direction": way, "median_s": round(med, 4),
                     "mb_per_s": round(size[what] / med / 1e6, 1),
                     "files_per_s": round(files / med) if what == "dir" else None})
    for row in rows:
        extra = f"  {row['files_per_s']} files/s" if row["files_per_s"] else ""
        print(f"{row['client']:4} {row['what']:4} {row['direction']:4} median {row['median_s'] * 1000:8.1f} ms  "
              f"{row['mb_per_s']:7.1f} MB/s{extra}")
    for what in ("file", "dir"):
        for way in ("up", "down"):
            m = {r["client"]: r["median_s"] for r in rows if r["what"] == what and r["direction"] == way}
            print(f"{what} {way}: dsec cp is {m['sdk'] / m['cli']:.2f}x the SDK's speed")
    json.dump({"rounds": rounds, "file_mib": mib, "files": files, "rows": rows}, open(out, "w"), indent=1)

asyncio.run(main())
PYEOF
