#!/usr/bin/env python3
"""Merges the phases of bench/sdk_cost.sh into one JSON document (stdout)
and prints the table of docs/benchmarks.md's SDK section (stderr).

Samples of a phase's rounds are pooled per side before percentiles; CPU
figures are the median over rounds.

Usage: sdk_cost_report.py PHASES.jsonl WRK.json FANOUT_C LATENCY.json...
"""

import json
import math
import statistics
import sys


def pct(v, p):
    s = sorted(v)
    return s[min(len(s), max(1, math.ceil(p / 100 * len(s)))) - 1]


def pooled(rows, key):
    v = [x for r in rows for x in r[key]["samples"]]
    return {"n": len(v), "p50_ms": pct(v, 50), "p90_ms": pct(v, 90), "p99_ms": pct(v, 99)}


def med(rows, key):
    return statistics.median(r[key] for r in rows)


def main():
    phases = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    wrk = json.load(open(sys.argv[2]))
    fanout_c = int(sys.argv[3])
    blocks = [json.load(open(p)) for p in sys.argv[4:]]

    def latency(side, key):
        v = [x for b in blocks for x in b[side]["samples"][key]]
        return {"n": len(v), "p50_ms": pct(v, 50), "p90_ms": pct(v, 90), "p99_ms": pct(v, 99)}

    out = {"benchmark": "sdk_cost", "environment": blocks[0].get("environment"),
           "crun_create_to_first_exec_ms": latency("crun", "create_to_first_exec_ms"),
           "compiled_create_to_first_exec_ms": latency("dsec", "create_to_first_exec_ms"),
           "server_create_ms": latency("dsec", "server_create_ms"),
           "compiled_first_exec_ms": latency("dsec", "first_exec_ms"),
           "wrk_exec": {"connections": fanout_c, "requests": wrk["requests"],
                        "req_per_s": wrk["requests"] / (wrk["duration_us"] / 1e6),
                        "p50_ms": wrk["p50_ms"],
                        "errors": wrk["errors_status"] + wrk["errors_socket"]},
           "loadavg_per_phase": [(p["side"], p["phase"], p["loadavg_end"]) for p in phases],
           "crun_blocks_loadavg": [(b.get("environment") or {}).get("loadavg_at_start")
                                   for b in blocks],
           "sides": {}}
    for side in ("old", "new"):
        mine = [p for p in phases if p["side"] == side]
        create = [p for p in mine if p["phase"] == "create"]
        execs = [p for p in mine if p["phase"] == "exec"]
        fan = [p for p in mine if p["phase"] == "fanout"]
        prof = [p for p in mine if p["phase"] == "profile"]
        d = {"sdk": mine[0]["sdk"], "json_codec": mine[0]["json_codec"],
             "create_then_run_shell_ms": pooled(create, "create_then_run_shell_ms"),
             "exec_true_ms": pooled(execs, "exec_true_ms"),
             "exec_true_cpu_us": med(execs, "exec_true_cpu_us"),
             "sync_exec_true_ms": pooled(execs, "sync_exec_true_ms"),
             "sync_exec_true_cpu_us": med(execs, "sync_exec_true_cpu_us"),
             "fanout": [{k: v for k, v in f.items() if k not in ("sdk", "side")} for f in fan],
             "profile": prof[0] if prof else None}
        if all("create_with_first_command_ms" in c for c in create):
            d["create_with_first_command_ms"] = pooled(create, "create_with_first_command_ms")
        d["fanout_exec_per_s"] = statistics.median(f["exec_per_s"] for f in fan)
        d["fanout_cpu_us_per_exec"] = statistics.median(f["client_cpu_us_per_exec"] for f in fan)
        d["fanout_client_bound_exec_per_s"] = statistics.median(
            f["client_bound_exec_per_s"] for f in fan)
        out["sides"][side] = d
    json.dump(out, sys.stdout, indent=1)
    print()

    crun = out["crun_create_to_first_exec_ms"]["p50_ms"]
    o, n = out["sides"]["old"], out["sides"]["new"]
    w = sys.stderr.write
    w("\nPython SDK cost (p50; ratio = previous / this, crun / SDK for creation)\n")
    w(f"  {'':38} {'previous':>10} {'this':>10} {'ratio':>7}\n")

    def row(label, a, b, unit, ratio=None):
        r = ratio if ratio is not None else (a / b if b else float("nan"))
        w(f"  {label:38} {a:10.3f} {b:10.3f} {r:6.2f}x  {unit}\n")

    row("create + run_shell, ms", o["create_then_run_shell_ms"]["p50_ms"],
        n["create_then_run_shell_ms"]["p50_ms"], "")
    w(f"    vs crun run -d + exec ({crun:.2f} ms): previous "
      f"{crun / o['create_then_run_shell_ms']['p50_ms']:.2f}x, this "
      f"{crun / n['create_then_run_shell_ms']['p50_ms']:.2f}x\n")
    if "create_with_first_command_ms" in n:
        one = n["create_with_first_command_ms"]["p50_ms"]
        w(f"  create with first_command, ms          {one:10.3f}   vs crun {crun / one:.2f}x\n")
    row("exec true, ms", o["exec_true_ms"]["p50_ms"], n["exec_true_ms"]["p50_ms"], "")
    row("client CPU per exec, us", o["exec_true_cpu_us"], n["exec_true_cpu_us"], "")
    row("sync exec true, ms", o["sync_exec_true_ms"]["p50_ms"],
        n["sync_exec_true_ms"]["p50_ms"], "")
    w(f"    sync / async: previous {o['sync_exec_true_ms']['p50_ms'] / o['exec_true_ms']['p50_ms']:.2f}x,"
      f" this {n['sync_exec_true_ms']['p50_ms'] / n['exec_true_ms']['p50_ms']:.2f}x\n")
    row(f"exec/s, {fanout_c} workers", o["fanout_exec_per_s"], n["fanout_exec_per_s"], "",
        n["fanout_exec_per_s"] / o["fanout_exec_per_s"])
    row("  client CPU per exec there, us", o["fanout_cpu_us_per_exec"],
        n["fanout_cpu_us_per_exec"], "")
    row("  exec/s per client CPU second", o["fanout_client_bound_exec_per_s"],
        n["fanout_client_bound_exec_per_s"], "",
        n["fanout_client_bound_exec_per_s"] / o["fanout_client_bound_exec_per_s"])
    w(f"  wrk, same sandboxes, c={fanout_c}: {out['wrk_exec']['req_per_s']:.0f} req/s\n")


if __name__ == "__main__":
    main()
