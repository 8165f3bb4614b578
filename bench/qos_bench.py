"""CPU QoS: step latency of a latency-sensitive agent-like loop beside
best-effort CPU burners (issue 30's experiment).

One latency-sensitive sandbox runs short commands through the SDK, one at
a time, each step timed (a Python start plus a little work, like an agent's
`run the tests` step). Burner sandboxes, one per core, each hold a busy
loop capped by its CPU limit so that together they fill LOAD of the node.
For each load the same burners run under both classes, switched while they
run (`set_qos_class`): `latency_sensitive` (no QoS: every sandbox the same
weight) and `best_effort` (QoS). A baseline without burners is measured
before each pair, and the three phases alternate ROUNDS times, so a change
of the host's own load between them hits all three alike.

Inflation = median step latency of a phase / median of its baseline - 1.
Writes the samples and a summary to --out (JSON), prints a markdown table.
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

#: The agent's step: a Python start, a little CPU, some output.
STEP = "python3 -c 'print(sum(i * i for i in range(200000)))'"
#: A burner's busy loop (one process: at most one core); prints its pid.
BURN = "nohup python3 -c 'while True: pass' >/dev/null 2>&1 & echo $!"


def args_for(image: str, cores: float, qos: str) -> DSecContainerRunArgs:
    return DSecContainerRunArgs(container_image=image, memory_limit_mb=256, cpu_cores_limit=cores,
                                ttl_running_stop=1800, network_rules={}, init_user="root",
                                qos_class=qos, labels={"bench": "qos"})


async def steps(sb, n: int) -> list[float]:
    """Runs the step n times, one after the other; milliseconds each."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await sb.run_shell(STEP)
        out.append((time.perf_counter() - t0) * 1000)
        if r.exit_code != 0:
            raise RuntimeError(f"the step failed: {r}")
    return out


def q(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--loads", default="0.1,0.2,0.3,0.4,0.5")
    ap.add_argument("--steps", type=int, default=30, help="steps per phase")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--image", default="python")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    cpus = os.cpu_count() or 1
    load_before = os.getloadavg()
    loads = [float(x) for x in a.loads.split(",")]
    client = DSecClient(os.environ["DSEC_ENDPOINT"], token=os.environ["DSEC_TOKEN"], timeout=300)
    agent = await client.run_container(args_for(a.image, 1.0, "latency_sensitive"), timeout=300)
    samples: dict[str, dict[str, list[float]]] = {}
    try:
        await steps(agent, 5)  # warm: page cache, the agent's first fork
        for load in loads:
            # One burner per core, each capped at `load` of a core: `load`
            # of the node in all while they spin.
            burners = await asyncio.gather(*(client.run_container(args_for(a.image, load, "latency_sensitive"),
                                                                  timeout=300) for _ in range(cpus)))
            phases: dict[str, list[float]] = {"baseline": [], "no_qos": [], "qos": []}
            try:
                for rnd in range(a.rounds):
                    phases["baseline"] += await steps(agent, a.steps)
                    pids = [(await b.run_shell(BURN)).stdout.strip() for b in burners]
                    await asyncio.sleep(1)
                    # Alternate which class goes first, so neither always
                    # follows the burners' start.
                    order = ["no_qos", "qos"] if rnd % 2 == 0 else ["qos", "no_qos"]
                    for phase in order:
                        cls = "best_effort" if phase == "qos" else "latency_sensitive"
                        for b in burners:
                            await b.set_qos_class(cls)
                        phases[phase] += await steps(agent, a.steps)
                    for b, pid in zip(burners, pids):
                        await b.run_shell(f"kill {pid}")
            finally:
                await asyncio.gather(*(b.delete() for b in burners), return_exceptions=True)
            samples[f"{load:.1f}"] = phases
            base = statistics.median(phases["baseline"])
            print(f"load {load:.0%}: baseline {base:.1f} ms, no QoS "
                  f"{statistics.median(phases['no_qos']):.1f} ms, QoS {statistics.median(phases['qos']):.1f} ms",
                  flush=True)
    finally:
        await agent.delete()
        await client.close()
    summary = []
    for load, ph in samples.items():
        base = statistics.median(ph["baseline"])
        row = {"load": float(load), "baseline_ms": base}
        for k in ("no_qos", "qos"):
            med = statistics.median(ph[k])
            row[f"{k}_ms"] = med
            row[f"{k}_p90_ms"] = q(ph[k], 0.9)
            row[f"{k}_inflation"] = med / base - 1
        summary.append(row)
    a.out.write_text(json.dumps({"cpus": cpus, "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
                                 "step": STEP, "steps_per_phase": a.steps,
                                 "rounds": a.rounds, "summary": summary, "samples": samples}, indent=1))
    print("\n| burner load | baseline median | no QoS: median, p90, inflation | QoS: median, p90, inflation |")
    print("|---|---|---|---|")
    for r in summary:
        print(f"| {r['load']:.0%} | {r['baseline_ms']:.1f} ms | {r['no_qos_ms']:.1f}, {r['no_qos_p90_ms']:.1f} ms, "
              f"{r['no_qos_inflation']:+.1%} | {r['qos_ms']:.1f}, {r['qos_p90_ms']:.1f} ms, {r['qos_inflation']:+.1%} |")


if __name__ == "__main__":
    asyncio.run(main())
