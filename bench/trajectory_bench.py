"""Load generator of bench/trajectory.sh (issue 6, benchmark 2), over the
Python SDK.

    trajectory_bench.py steps --n 200 --reps R --out F   fast-forward vs re-execution
    trajectory_bench.py rtt --n N --label L --out F      exec round trip of `true`
    trajectory_bench.py report FILE...                   one table of the results

The server is the one in DSEC_ENDPOINT / DSEC_TOKEN (bench/lib.sh starts it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path

from dsec import DSecClient, DSecContainerRunArgs

#: A non-idempotent step: running it twice shows in its output.
STEP = "echo {i} >> /tmp/steps && wc -l < /tmp/steps"


def args(**kw: object) -> DSecContainerRunArgs:
    base: dict[str, object] = dict(container_image="busybox", memory_limit_mb=64,
                                   cpu_cores_limit=1, ttl_running_stop=600, network_rules={},
                                   init_user="root", labels={"bench": "trajectory"})
    base.update(kw)
    return DSecContainerRunArgs(**base)  # type: ignore[arg-type]


def med(xs: list[float]) -> float:
    return round(statistics.median(xs), 3) if xs else float("nan")


async def run_steps(sb, n: int, step_ids: bool) -> tuple[float, list[str]]:  # noqa: ANN001
    outs = []
    t = time.perf_counter()
    for i in range(n):
        r = await sb.run_shell(STEP.format(i=i), step_id=f"step-{i}" if step_ids else None)
        outs.append(r.stdout)
    return time.perf_counter() - t, outs


async def steps(a: argparse.Namespace) -> dict:
    first_s, ff_s, reexec_s = [], [], []
    for _ in range(a.reps):
        job = f"traj-{uuid.uuid4().hex[:8]}"
        async with DSecClient() as c:
            sb = await c.run_container(args(job=job))
            fresh = await c.run_container(args())
            try:
                # The trainer's first life: n steps, logged.
                t_first, outs = await run_steps(sb, a.n, step_ids=True)
                # Preempted and back: a new client finds the sandbox by its
                # job and re-issues every step with the same ids.
                async with DSecClient() as again:
                    t0 = time.perf_counter()
                    (info,) = await again.list(job=job)
                    s = await again.connect(info.id)
                    _, outs_ff = await run_steps(s, a.n, step_ids=True)
                    # Reconnecting (list + connect) counts as fast-forward.
                    t_ff = time.perf_counter() - t0
                    assert outs_ff == outs, "fast-forward returned other results"
                    count = (await s.run_shell("wc -l < /tmp/steps")).stdout.strip()
                    assert count == str(a.n), f"steps ran again: {count} lines"
                # Without a log, recovering means running the steps again
                # (in a fresh sandbox, as nothing says what already ran).
                t_re, outs_re = await run_steps(fresh, a.n, step_ids=False)
                assert outs_re == outs
            finally:
                await sb.delete()
                await fresh.delete()
        first_s.append(t_first)
        ff_s.append(t_ff)
        reexec_s.append(t_re)
    return {
        "bench": "trajectory", "steps": a.n, "reps": a.reps,
        "first_run_s": med(first_s), "fast_forward_s": med(ff_s), "reexecution_s": med(reexec_s),
        "fast_forward_ms_per_step": med([t / a.n * 1000 for t in ff_s]),
        "reexecution_ms_per_step": med([t / a.n * 1000 for t in reexec_s]),
        "ratio_reexecution_over_fast_forward": round(med(reexec_s) / med(ff_s), 2),
    }


async def rtt(a: argparse.Namespace) -> dict:
    async with DSecClient() as c:
        sb = await c.run_container(args(cpu_cores_limit=2))
        try:
            for _ in range(100):
                await sb.exec(["true"])
            plain, stepped = [], []
            for j in range(a.n):
                block, i = divmod(j, 100)
                t = time.perf_counter()
                await sb.exec(["true"])
                plain.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                await sb.exec(["true"], step_id=f"rtt-{block}-{i}")
                stepped.append((time.perf_counter() - t) * 1000)
        finally:
            await sb.delete()

    def q(xs: list[float], p: float) -> float:
        return round(sorted(xs)[int(p * (len(xs) - 1))], 3)

    return {"bench": "rtt", "label": a.label, "n": len(plain),
            "p50_ms": q(plain, 0.5), "p90_ms": q(plain, 0.9),
            "step_id_p50_ms": q(stepped, 0.5), "step_id_p90_ms": q(stepped, 0.9)}


def report(files: list[str]) -> None:
    for f in files:
        print(json.dumps(json.loads(Path(f).read_text())))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("steps"); s.add_argument("--n", type=int, default=200)
    s.add_argument("--reps", type=int, default=3); s.add_argument("--out", required=True)
    r = sub.add_parser("rtt"); r.add_argument("--n", type=int, default=2000)
    r.add_argument("--label", default=""); r.add_argument("--out", required=True)
    p = sub.add_parser("report"); p.add_argument("files", nargs="+")
    a = ap.parse_args()
    if a.cmd == "report":
        report(a.files)
        return
    result = asyncio.run({"steps": steps, "rtt": rtt}[a.cmd](a))
    Path(a.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
