"""FnCall (issue 5): what the zygote's allocator does to a fork per call.
A warm interpreter with FnCall's default preload (gc frozen, as in the
zygote) forks N children in a row; each runs the benchmark snippet from a
marshalled code object with its output to /dev/null and exits, and the
parent waits for it. Reported per fork, call and exit: wall time (parent
and child together, one at a time), and the child's page faults.

Variants, alternated round by round (each a fresh interpreter):
  pymalloc   Python's default allocator (1 MiB arenas of 4 KiB pages)
  malloc     PYTHONMALLOC=malloc: glibc's malloc for every object
  malloc+thp ... with glibc.malloc.hugetlb=1 (the heap madvised for THP)
  zygote     ... and glibc.malloc.top_pad=8 MiB (FnCall's zygote: spawn.rs
             ZYGOTE_ENV), so the first heap mapping holds aligned blocks

Run it with the interpreter FnCall runners use, e.g. Debian's:
    /usr/bin/python3 bench/probes/fork_heap.py [N] [ROUNDS]   (defaults 2000, 3)
"""

import gc
import marshal
import os
import resource
import subprocess
import sys
import time

PRELOAD = ("math collections itertools functools heapq bisect re json string random typing fractions "
           "decimal statistics traceback types").split()
SRC = "print(sum(i * i for i in range(100)))"
VARIANTS = {
    "pymalloc": {},
    "malloc": {"PYTHONMALLOC": "malloc"},
    "malloc+thp": {"PYTHONMALLOC": "malloc", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    "zygote": {"PYTHONMALLOC": "malloc", "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1:glibc.malloc.top_pad=8388608"},
}


def measure(n: int) -> None:
    """In the variant's interpreter: the fork loop; prints one line."""
    for m in PRELOAD:
        __import__(m)
    code = marshal.dumps(compile(SRC, "main.py", "exec"))
    gc.collect()
    gc.freeze()
    null = os.open("/dev/null", os.O_WRONLY)

    def child() -> None:
        os.dup2(null, 1)
        exec(marshal.loads(code), {"__name__": "__main__", "__builtins__": __builtins__})
        sys.stdout.flush()
        os._exit(0)

    faults0 = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
    t = time.perf_counter()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            child()
        os.waitpid(pid, 0)
    t = time.perf_counter() - t
    faults = (resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - faults0) / n
    with open("/proc/self/status") as f:
        anon = next(line.split()[1] for line in f if line.startswith("RssAnon:"))
    print(f"{t / n * 1e3:.4f} {faults:.1f} {anon}")


def main() -> None:
    if sys.argv[1:2] == ["--measure"]:
        measure(int(sys.argv[2]))
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k != "GLIBC_TUNABLES"}
    results: dict[str, list[tuple[float, float, int]]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        for name, env in VARIANTS.items():
            # -s and a clean environment: isolated like -I, which would
            # ignore PYTHONMALLOC.
            out = subprocess.run([sys.executable, "-s", __file__, "--measure", str(n)],
                                 env={**base, **env}, check=True, capture_output=True, text=True).stdout.split()
            results[name].append((float(out[0]), float(out[1]), int(out[2])))
    print(f"{n} forks per run, {rounds} rounds alternated, {sys.executable}")
    print("variant       ms per fork+call+exit (median; runs)         child faults   zygote RssAnon")
    for name, runs in results.items():
        ms = sorted(r[0] for r in runs)
        print(f"{name:12}  {ms[len(ms) // 2]:.3f} ({', '.join('%.3f' % r[0] for r in runs)})"
              f"   {sorted(r[1] for r in runs)[len(runs) // 2]:6.0f}         {runs[-1][2]} kB")


if __name__ == "__main__":
    main()
