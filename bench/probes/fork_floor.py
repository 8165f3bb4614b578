"""The floor of a fork per call: what a bare fork + _exit of a warm
interpreter costs on this host, in the parent and in the child, before the
child does anything (docs/benchmarks.md, FnCall: "The Python targets
against the floor of a fork per call").

Run it with the interpreter FnCall runners use, e.g. Debian's:
    /usr/bin/python3 -I bench/probes/fork_floor.py              # nothing imported
    /usr/bin/python3 -I bench/probes/fork_floor.py PRELOAD      # modules, comma-separated
PRELOAD defaults to nothing; FnCall's default list is in docs/fncall.md.
"""
import gc
import os
import resource
import sys
import time

FORKS = 2000


def main() -> None:
    preload = [m for m in (sys.argv[1] if len(sys.argv) > 1 else "").split(",") if m]
    for m in preload:
        __import__(m)
    # As the zygote does: nothing the collector walks in the children.
    gc.collect()
    gc.freeze()
    before, kids_before = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    for _ in range(FORKS):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    t = time.perf_counter() - t
    after, kids_after = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)

    def cpu_ms(a, b):
        return (b.ru_utime - a.ru_utime + b.ru_stime - a.ru_stime) / FORKS * 1e3

    with open("/proc/self/maps") as maps:
        vmas = len(maps.readlines())
    print(f"{FORKS} forks, preload {','.join(preload) or '(none)'}: wall {t / FORKS * 1e3:.3f} ms per fork, "
          f"CPU {cpu_ms(before, after):.3f} ms in the parent and {cpu_ms(kids_before, kids_after):.3f} ms in the child; "
          f"parent max RSS {after.ru_maxrss} KiB, {vmas} mappings")


if __name__ == "__main__":
    main()
