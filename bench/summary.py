#!/usr/bin/env python3
"""One table of every benchmark result against its target (issue 2).

Usage: python3 bench/summary.py [RESULTS_DIR] [--markdown]

docs/benchmarks.md's table of container sandboxes against crun carries the
--markdown output's figures, with the method beside it. A result file that
is missing is left out.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
args = [a for a in sys.argv[1:] if not a.startswith("--")]
RES = args[0] if args else os.path.join(HERE, "results")
MD = "--markdown" in sys.argv


def load(name):
    p = os.path.join(RES, name)
    return json.load(open(p)) if os.path.exists(p) else None


def verdict(ok):
    return "met" if ok else "MISSED"


def ms(*xs):
    return " / ".join(f"{x:.2f}" for x in xs) + " ms"


def slash(xs, fmt):
    return " / ".join(fmt.format(x) for x in xs)


rows = []  # (benchmark, metric, dsec, crun, crun/dsec, target, verdict)
crun_version = None

d = load("create_latency.json")
if d:
    ds, cs = d["dsec"], d.get("crun")
    crun_version = (d.get("environment") or {}).get("crun")
    a, b = ds["create_to_first_exec_ms"], cs["create_to_first_exec_ms"] if cs else None
    r50 = b["p50_ms"] / a["p50_ms"] if cs else None
    rows.append(("1 create -> first exec answered", "p50", ms(a["p50_ms"]), ms(b["p50_ms"]) if cs else "-",
                 f"{r50:.1f}x" if cs else "-", ">= 3x faster", verdict(r50 is not None and r50 >= 3)))
    rows.append(("", "p99", ms(a["p99_ms"]), ms(b["p99_ms"]) if cs else "-",
                 f"{b['p99_ms'] / a['p99_ms']:.1f}x" if cs else "-", "", ""))
    s = ds["server_create_ms"]
    rows.append(("", "server `create_ms` / crun `run -d`, p50 / p99", ms(s["p50_ms"], s["p99_ms"]),
                 ms(cs["crun_run_d_ms"]["p50_ms"], cs["crun_run_d_ms"]["p99_ms"]) if cs else "-", "", "", ""))

t = load("throughput.json")
if t:
    lv = t["levels"]
    conc = slash([l["concurrency"] for l in lv], "{}")
    has_crun = all("crun" in l for l in lv)
    for phase, label in (("burst", f"create-only burst of {t['burst']:,}"), ("cycles", f"{t['cycles']:,} create+delete cycles")):
        dv = [l["dsec"][phase]["rate_per_s"] for l in lv]
        cv = [l["crun"][phase]["rate_per_s"] for l in lv] if has_crun else None
        rows.append(("2 creation rate" if phase == "burst" else "", f"{label}, {conc} creators",
                     slash(dv, "{:.0f}") + " /s", slash(cv, "{:.0f}") + " /s" if cv else "-",
                     slash([x / y for x, y in zip(dv, cv)], "{:.1f}") + "x" if cv else "-",
                     ">= 300/s" if phase == "burst" else "",
                     verdict(min(dv) >= 300) if phase == "burst" else ""))

e, p, w = load("exec_rtt.json"), load("exec_rtt_sdk.json"), load("exec_wrk.json")
cr = e["crun_exec"]["sequential_ms"] if e and "crun_exec" in e else None
if p:
    s = p["sequential_exec_ms"]
    rows.append(("3 exec `true`", "Python SDK `exec([\"true\"])`, p50 / p99", ms(s["p50_ms"], s["p99_ms"]),
                 "`crun exec` " + ms(cr["p50_ms"], cr["p99_ms"]) if cr else "-",
                 f"{cr['p50_ms'] / s['p50_ms']:.1f}x" if cr else "-", "p50 <= 2 ms", verdict(s["p50_ms"] <= 2)))
if e:
    s = e["compiled_client"]["sequential_ms"]
    rows.append(("" if p else "3 exec `true`", "compiled client, p50 / p99", ms(s["p50_ms"], s["p99_ms"]), "",
                 f"{cr['p50_ms'] / s['p50_ms']:.1f}x" if cr else "", "", ""))
if w:
    for r in w["runs"]:
        if r["path"] == "exec" and r["sandboxes"] > 1:
            x = r["wrk"]
            rows.append(("", f"exec capacity, wrk c={r['connections']} over {r['sandboxes']} sandboxes",
                         f"{x['requests'] / (x['duration_us'] / 1e6):,.0f} req/s", "", "", "", ""))

d = load("density.json")
if d:
    alive = d["created"] >= 5000 and d["errors"] == 0 and d["running_listed"] >= d["created"] \
        and d["probe_execs_ok"] == d["probe_execs"]
    rows.append(("4 density", "idle sandboxes running at once",
                 f"{d['created']:,} ({d['running_listed']:,} listed running, {d['probe_execs_ok']}/{d['probe_execs']} probe execs, "
                 f"{d['errors']} errors)", "", "", ">= 5,000", verdict(alive)))
    rows.append(("", "host memory per sandbox (`MemAvailable` drop / N)", f"{d['memory_per_sandbox_mib']:.3f} MiB", "", "",
                 "<= 1.5 MiB", verdict(d["memory_per_sandbox_mib"] <= 1.5)))
    c, s = d["create_ms_client"], d["create_ms_server"]
    rows.append(("", f"creation p50, last {d['first_k']} / first {d['first_k']}",
                 f"{c['last']:.1f} / {c['first']:.1f} ms = {c['ratio']:.2f}x (server side {s['ratio']:.2f}x)", "", "",
                 "<= 2x", verdict(c["ratio"] <= 2)))

l = load("leaks.json")
if l:
    b, a = l["before"], l["after"]
    # Counts only dsec can change (the host-wide process count moves with
    # whatever else runs on the host).
    keys = ["processes_under_dsec", "agent_processes", "mounts_host", "mounts_data_dir", "cgroups_node",
            "net_namespaces", "mnt_namespaces", "data_dir_files", "data_dir_dirs", "dsec_open_fds", "dsec_threads"]
    if "dsec_fds_netns" in a and "dsec_fds_netns" in b:
        # Namespaces made ahead (at most --prewarm, 16) refill in the
        # background: bounded, compared apart from the other descriptors.
        b, a = dict(b), dict(a)
        b["dsec_open_fds"] -= b["dsec_fds_netns"] + b.get("dsec_fds_db", 0)
        a["dsec_open_fds"] -= a["dsec_fds_netns"] + a.get("dsec_fds_db", 0)
    grew = [f"{k} +{a[k] - b[k]}" for k in keys if k in b and k in a and a[k] > b[k]]
    # Each of the three databases may open one more connection (its
    # checkpointer) once: three files each.
    if a.get("dsec_fds_db", 0) - b.get("dsec_fds_db", 0) > 9:
        grew.append(f"database fds {b['dsec_fds_db']} -> {a['dsec_fds_db']}")
    if a.get("dsec_fds_netns", 0) - b.get("dsec_fds_netns", 0) > 16:
        grew.append(f"namespace fds {b['dsec_fds_netns']} -> {a['dsec_fds_netns']} (more than the 16 made ahead)")
    ex = l.get("platform_exit")
    if ex:
        b0, a0 = ex["before_dsec_up"], ex["after_dsec_exit"]
        grew += [f"{k} +{a0[k] - b0[k]} after exit" for k in
                 ["agent_processes", "mounts_host", "mounts_data_dir", "cgroups_node", "net_namespaces", "mnt_namespaces"]
                 if k in b0 and k in a0 and a0[k] > b0[k]]
        grew += [f"cgroup parent {x} after exit" for x in ex.get("node_cgroup_parents_left", [])]
    if l.get("records_left", 0):
        grew.append(f"{l['records_left']} records")
    left = "nothing" if not grew else ", ".join(grew)
    rows.append(("5 leaks", f"{l['cycles']:,} create/exec/delete cycles: what is left",
                 f"{left} ({l['cycles_per_s']:.0f} cycles/s, {l['errors']} errors)", "", "",
                 "nothing", verdict(not grew and l["errors"] == 0)))

crun_head = "crun " + crun_version.split()[-1] if crun_version else "crun"
head = ("benchmark", "metric", "dsec", crun_head, "crun / dsec", "target", "verdict")
if MD:
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(f"**{c}**" if c == "MISSED" else c for c in r) + " |")
else:
    wd = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    for r in [head] + rows:
        print("  ".join(str(c).ljust(wd[i]) for i, c in enumerate(r)).rstrip())
