"""FnCall (issue 5): what compiling a Python call costs in a forked worker.
A warm interpreter with FnCall's default preload (gc frozen, as in the
zygote) forks N children; each turns the benchmark snippet into a code
object, either by compile() or by marshal.loads() of code compiled before,
and reports its page faults (copied or new pages) and time for that step.
Usage: python3 bench/probes/fork_compile_cost.py [N]   (default 300)"""

import gc
import marshal
import os
import resource
import sys
import time

PRELOAD = ("math collections itertools functools heapq bisect re json string random typing fractions "
           "decimal statistics traceback types").split()
SRC = b"print(sum(i * i for i in range(100)))"


def child(mode: str, code: bytes, out: int) -> None:
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.perf_counter()
    if mode == "compile":
        compile(SRC, "/x/main.py", "exec", dont_inherit=True)
    elif mode == "marshal.loads":
        marshal.loads(code)
    t1 = time.perf_counter()
    f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    os.write(out, b"%d %f\n" % (f1 - f0, (t1 - t0) * 1e6))
    os._exit(0)


def main(n: int) -> None:
    for m in PRELOAD:
        __import__(m)
    gc.collect()
    gc.freeze()
    code = marshal.dumps(compile(SRC, "/x/main.py", "exec", dont_inherit=True))
    r, w = os.pipe()
    for mode in ("nothing", "marshal.loads", "compile"):
        faults, micros = [], []
        for _ in range(n):
            pid = os.fork()
            if pid == 0:
                child(mode, code, w)
            os.waitpid(pid, 0)
            f, us = os.read(r, 100).split()
            faults.append(int(f))
            micros.append(float(us))
        faults.sort()
        micros.sort()
        print("%-14s median %d page faults, %.0f us" % (mode, faults[n // 2], micros[n // 2]))


main(int(sys.argv[1]) if len(sys.argv) > 1 else 300)
