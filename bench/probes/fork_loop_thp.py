"""Would a zygote that forks from C keep its heap's huge pages, and would
that make a Python call cheaper? (docs/benchmarks.md, "Findings of the
probes": it keeps them, and saves ~2%.)

A zygote forked from Python (os.fork, then wait4) writes its heap between
the fork and the wait while the worker is alive, and each such write to a
huge page the worker shares splits the zygote's mapping of it into 4 KiB
entries: after its first calls every fork copies the heap entry by entry.
A loop in C (fork, wait4, nothing else) writes no heap. This compiles such
a loop with the host's cc into a temporary directory, loads it with ctypes
(the worker returns from the call and runs PyOS_AfterFork_Child, as
os.fork would), and runs N workers each way, alternated, in the zygote's
allocator environment: a worker runs a small snippet and exits. It prints
the zygote's huge pages and the CPU per worker, the zygote's and the
workers' apart.

    /usr/bin/python3 bench/probes/fork_loop_thp.py [N] [ROUNDS]   (default 2000 3)
"""
import ctypes
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile

ENV = {"PYTHONMALLOC": "malloc", "LD_BIND_NOW": "1",
       "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:glibc.malloc.top_pad=8388608"}
PRELOAD = ("math collections itertools functools heapq bisect re json string random typing fractions "
           "decimal statistics traceback types").split()
LOOP_C = r"""
#include <errno.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
/* n workers one after another: 0 in each worker, n in the parent. */
int serve(int n) {
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid == 0) return 0;
        if (pid < 0) return -1;
        int status;
        struct rusage ru;
        while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {}
    }
    return n;
}
"""


def huge_kb():
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))


def worker():
    json.dumps({"a": [sum(i * i for i in range(100))]})
    os._exit(0)


def one_run(mode, n, lib_path):
    """In a fresh interpreter (this script re-run): n workers by `mode`."""
    for m in PRELOAD:
        __import__(m)
    serve = ctypes.PyDLL(lib_path).serve
    after_fork_child = ctypes.pythonapi.PyOS_AfterFork_Child
    gc.collect()
    gc.freeze()
    start_huge = huge_kb()
    if mode == "c":
        if serve(n) == 0:
            after_fork_child()
            worker()
    else:
        for _ in range(n):
            pid = os.fork()
            if pid == 0:
                worker()
            os.waitpid(pid, 0)
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"mode": mode, "huge_kb_start": start_huge, "huge_kb_end": huge_kb(),
                      "zygote_ms": (me.ru_utime + me.ru_stime) / n * 1e3,
                      "workers_ms": (kids.ru_utime + kids.ru_stime) / n * 1e3}))


def main():
    if sys.argv[1:2] == ["--run"]:
        one_run(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with tempfile.TemporaryDirectory(prefix="fork-loop-") as tmp:
        src, lib = os.path.join(tmp, "loop.c"), os.path.join(tmp, "loop.so")
        with open(src, "w") as f:
            f.write(LOOP_C)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, src], check=True)
        env = dict(os.environ, **ENV)
        results = {"python": [], "c": []}
        for _ in range(rounds):
            for mode in ("python", "c"):
                out = subprocess.run([sys.executable, __file__, "--run", mode, str(n), lib], env=env,
                                     check=True, capture_output=True, text=True).stdout
                results[mode].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{n} workers per run, {rounds} alternated runs each")
    print("fork loop  huge pages (start -> end, KiB)  zygote CPU/worker  workers' CPU/worker  total")
    for mode, runs in results.items():
        for r in runs:
            total = r["zygote_ms"] + r["workers_ms"]
            print(f"{mode:<9}  {r['huge_kb_start']:>6} -> {r['huge_kb_end']:<6}                "
                  f"{r['zygote_ms']:.3f} ms           {r['workers_ms']:.3f} ms            {total:.3f} ms")


if __name__ == "__main__":
    main()
