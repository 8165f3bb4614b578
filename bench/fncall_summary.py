#!/usr/bin/env python3
"""The FnCall benchmark's tables (issue 5) from bench/results/fncall*.json.

Usage: python3 bench/fncall_summary.py [RESULTS_DIR] [NAME]
(NAME: the results file's, default fncall; bench/fncall_langs.sh writes
fncall_langs). A row whose baseline did not run (a language the baseline
host has no toolchain for) shows dsec alone.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RES = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "results")
NAME = sys.argv[2] if len(sys.argv) > 2 else "fncall"
d = json.load(open(os.path.join(RES, NAME + ".json")))
runs = {(r["name"], r["target"], r["connections"]): r["wrk"] for r in d["runs"]}


def rate(w):
    return w["requests"] / (w["duration_us"] / 1e6)


def fmt_rate(r):
    """Calls/s: whole numbers, but a tenth for the slow rows (compiles)."""
    return f"{r:,.1f}" if r < 100 else f"{r:,.0f}"


def ratio(a, b):
    """dsec / baseline; a baseline that completed nothing in the run (a very
    loaded host) has no ratio."""
    return f"{rate(a) / rate(b):.1f}x" if rate(b) else "n/a (baseline: 0 in the run)"


print("| benchmark | clients | dsec calls/s | dsec p50 / p99 | baseline calls/s | baseline p50 / p99 | dsec / baseline | errors (dsec, baseline) |")
print("|---|---|---|---|---|---|---|---|")
names = []
for (name, _, conns) in runs:
    if (name, conns) not in names:
        names.append((name, conns))
for name, conns in names:
    a, b = runs.get((name, "dsec", conns)), runs.get((name, "baseline", conns))
    if not a:
        continue
    err = lambda w: w["errors_status"] + w["errors_socket"]
    if not b:
        print(f"| {name} | {conns} | {fmt_rate(rate(a))} | {a['p50_ms']:.1f} / {a['p99_ms']:.1f} ms | - | - | - | {err(a)}, - |")
        continue
    print(f"| {name} | {conns} | {fmt_rate(rate(a))} | {a['p50_ms']:.1f} / {a['p99_ms']:.1f} ms | {fmt_rate(rate(b))} | "
          f"{b['p50_ms']:.1f} / {b['p99_ms']:.1f} ms | {ratio(a, b)} | {err(a)}, {err(b)} |")
p = os.path.join(RES, "fncall_sdk.json")
if NAME == "fncall" and os.path.exists(p):
    s = json.load(open(p))
    print()
    print(f"Python SDK, one asyncio process: {s['calls_per_s']:,.0f} calls/s at {s['concurrency']} concurrent calls "
          f"(p50 {s['p50_ms']:.1f} ms, p99 {s['p99_ms']:.1f} ms); one call at a time: p50 "
          f"{s['sequential_p50_ms']:.2f} ms, p99 {s['sequential_p99_ms']:.2f} ms.")
