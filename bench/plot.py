#!/usr/bin/env python3
"""Plots of the benchmark results (bench/results/*.json) into docs/img/.

Usage: python3 bench/plot.py [RESULTS_DIR] [IMG_DIR]     (needs matplotlib)
Each plot is made only if its results file exists.
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RES = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "results")
IMG = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(HERE), "docs", "img")
DSEC, CRUN, OTHER = "#1f77b4", "#d62728", "#2ca02c"


def load(name):
    p = os.path.join(RES, name)
    return json.load(open(p)) if os.path.exists(p) else None


def cdf(ax, samples, label, color, style="-"):
    s = sorted(samples)
    n = len(s)
    ax.plot(s, [(i + 1) / n for i in range(n)], style, color=color, label=label, lw=1.8)


def log_axis(ax):
    """Log x axis with plain-number ticks (0.5, 1, 2, 5, 10 ...)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    ax.set_xscale("log")
    lo, hi = ax.get_xlim()
    cands = [0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 1000]
    ax.xaxis.set_major_locator(FixedLocator([c for c in cands if lo <= c <= hi]))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:g}"))
    ax.xaxis.set_minor_locator(NullLocator())


def legend_below(ax, ncol=2):
    """The legend under the axes: inside, it hides the foot of a CDF."""
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=ncol, frameon=False)


def median_of(v):
    s = sorted(v)
    return s[(len(s) - 1) // 2]


def finish(fig, name):
    os.makedirs(IMG, exist_ok=True)
    path = os.path.join(IMG, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print("wrote", path)


def create_latency():
    d = load("create_latency.json")
    if not d:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    ds = d["dsec"]["samples"]
    cdf(ax, ds["create_to_first_exec_ms"], "dsec: create -> first exec answered (HTTP API)", DSEC)
    cdf(ax, ds["server_create_ms"], "dsec: create_ms (server side)", DSEC, "--")
    if "crun" in d:
        cs = d["crun"]["samples"]
        cdf(ax, cs["create_to_first_exec_ms"], "crun: overlay + run -d + exec", CRUN)
        cdf(ax, cs["create_ms"], "crun: overlay + run -d", CRUN, "--")
    log_axis(ax)
    ax.set_xlabel("milliseconds (log scale)")
    ax.set_ylabel("fraction of sandboxes")
    ax.grid(True, which="both", alpha=0.3)
    title = f"Create to first exec, busybox on EROFS, {d['iterations']} each, interleaved"
    if "ratio_p50" in d:
        title += f"\ncrun / dsec: {d['ratio_p50']:.1f}x at p50, {d['ratio_p99']:.1f}x at p99"
    ax.set_title(title, fontsize=10)
    legend_below(ax)
    finish(fig, "create_latency_cdf.png")


def exec_rtt():
    c, p = load("exec_rtt.json"), load("exec_rtt_sdk.json")
    if not c and not p:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    if p:
        cdf(ax, p["samples"], f"dsec, Python SDK (p50 {p['sequential_exec_ms']['p50_ms']:.2f} ms)", DSEC)
    if c:
        s = c["compiled_client"]
        cdf(ax, s["samples"], f"dsec, compiled Rust client (p50 {s['sequential_ms']['p50_ms']:.2f} ms)", OTHER)
        if "crun_exec" in c:
            s = c["crun_exec"]
            cdf(ax, s["samples"], f"crun exec (p50 {s['sequential_ms']['p50_ms']:.2f} ms)", CRUN)
    log_axis(ax)
    ax.set_xlabel("milliseconds (log scale)")
    ax.set_ylabel("fraction of calls")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title("Exec round trip of `true`, sequential, one sandbox / container", fontsize=10)
    legend_below(ax, ncol=3)
    finish(fig, "exec_rtt_cdf.png")


def throughput():
    d = load("throughput.json")
    if not d:
        return
    levels = d["levels"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8), sharey=False)
    for ax, phase, title in ((axes[0], "burst", f"create-only burst of {d['burst']}"),
                             (axes[1], "cycles", f"{d['cycles']} create+delete cycles")):
        xs = range(len(levels))
        w = 0.38
        dv = [l["dsec"][phase]["rate_per_s"] for l in levels]
        ax.bar([x - w / 2 for x in xs], dv, w, color=DSEC, label="dsec")
        for x, v in zip(xs, dv):
            ax.text(x - w / 2, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        if all("crun" in l for l in levels):
            cv = [l["crun"][phase]["rate_per_s"] for l in levels]
            ax.bar([x + w / 2 for x in xs], cv, w, color=CRUN, label="crun")
            for x, v in zip(xs, cv):
                ax.text(x + w / 2, v, f"{v:.0f}", ha="center", va="bottom", fontsize=8)
        ax.axhline(300, color="gray", ls=":", lw=1.2,
                   label="target: 300/s" if phase == "burst" else "300/s (the burst target)")
        ax.set_xticks(list(xs))
        ax.set_xticklabels([f"{l['concurrency']} creators" for l in levels])
        ax.set_ylabel("sandboxes per second")
        ax.set_title(title, fontsize=10)
        top = max(dv + ([v for l in levels for v in [l.get("crun", {}).get(phase, {}).get("rate_per_s", 0)]]))
        ax.set_ylim(0, max(top, 300) * 1.25)
        ax.legend(fontsize=8, loc="upper center", ncol=3)
    cpus = d.get("environment", {}).get("cpus")
    fig.suptitle("Creation throughput" + (f" on {cpus} vCPUs" if cpus else ""), fontsize=10)
    finish(fig, "throughput.png")


def density():
    d = load("density.json")
    if not d:
        return
    cl = d["samples"]["create_ms_client"]
    sv = d["samples"]["create_ms_server"]
    n = len(cl)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    xs = range(1, n + 1)
    ax.scatter(xs, cl, s=2, color=DSEC, alpha=0.25, label="create latency seen by the client")
    w = 100
    # Centred, so that a change shows where it happens, not w/2 later.
    med = [median_of(sv[max(0, i - w // 2):i + w // 2]) for i in range(n)]
    ax.plot(xs, med, color="black", lw=1.5, label=f"server create_ms, median of the {w} around each index")
    ax.set_xlabel("sandboxes created so far (in order of completion; all stay running)")
    ax.set_ylabel("milliseconds")
    ax.set_yscale("log")
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator
    lo, hi = ax.get_ylim()
    ax.yaxis.set_major_locator(FixedLocator([t for t in [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000] if lo <= t <= hi]))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.grid(True, which="major", alpha=0.3)
    c, s = d["create_ms_client"], d["create_ms_server"]
    ax.set_title(f"Density: {d['created']} idle sandboxes, {d['concurrency']} concurrent creators\n"
                 f"median of last {d['first_k']} / first {d['first_k']}: {c['ratio']:.2f}x client, "
                 f"{s['ratio']:.2f}x server; {d['memory_per_sandbox_mib']:.2f} MiB per sandbox", fontsize=10)
    ax.legend(fontsize=8, loc="upper left", markerscale=4)
    finish(fig, "density_create_vs_index.png")


if __name__ == "__main__":
    create_latency()
    exec_rtt()
    throughput()
    density()
