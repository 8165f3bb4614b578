"""FnCall (issue 5): where a Python worker's page faults come from, stage by
stage, without the platform. Each page a worker writes after its fork is a
copied page (a fault, a 4 KiB copy, and a page to free at its exit), and
they are most of a Python call's CPU (bench/probes/fncall_perf.sh).

This loads the runner's own zygote.py, sets up a zygote as zygote_main does
(the default preload, random's reseed hook, gc frozen, the allocator
settled) and forks N workers in a row. Each runs zygote.py's own worker
steps on a message like the monitor's (worker.rs) for the benchmark
snippet, with getrusage probes in between, and reports its minor faults
per stage; the parent sends each its message and stdio memfds, as the
monitor does. A probe costs a fault or two of its own.

The interpreter runs with the zygote's environment (spawn.rs ZYGOTE_ENV,
read from the source so the two cannot drift apart): the script re-executes
itself with it, unless --plain (Python's defaults, for comparison);
--without NAME leaves one of its variables out (e.g. LD_BIND_NOW).

Run as root (a worker drops to uid nobody), with the interpreter runners
use, e.g. Debian's:
    /usr/bin/python3 bench/probes/fncall_worker_faults.py [N] [--plain | --without NAME...]   (default 400)
"""

import array
import gc
import importlib.util
import marshal
import os
import re
import resource
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ZYGOTE_PY = os.path.join(HERE, "..", "..", "crates", "dsec-fncall", "src", "zygote.py")
SPAWN_RS = os.path.join(HERE, "..", "..", "crates", "dsec-agent", "src", "fncall", "spawn.rs")
PRELOAD = ("math collections itertools functools heapq bisect re json string random typing fractions "
           "decimal statistics traceback types").split()
SNIPPET = "print(sum(i * i for i in range(100)))\n"
STAGES = ["after fork, before the worker", "receive the message", "unmarshal the message",
          "become the call process", "argv, path, __main__", "unmarshal the code", "run the code",
          "flush stdout", "exit"]


def zygote_env():
    src = open(SPAWN_RS).read()
    block = src[src.index("pub const ZYGOTE_ENV"):]
    block = block[:block.index(";")]
    return dict(re.findall(r'\("([A-Z_]+)", "([^"]*)"\)', block))


def main():
    argv = sys.argv[1:]
    without = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--without"}
    args = [a for i, a in enumerate(argv) if not a.startswith("--") and (i == 0 or argv[i - 1] != "--without")]
    plain = "--plain" in argv
    n = int(args[0]) if args else 400
    env = {k: v for k, v in zygote_env().items() if k not in without}
    if not plain and any(os.environ.get(k) != v for k, v in env.items()):
        base = {k: v for k, v in os.environ.items() if k not in without}
        os.execve(sys.executable, [sys.executable, "-s", __file__] + argv, {**base, **env})
    spec = importlib.util.spec_from_file_location("zygote", ZYGOTE_PY)
    z = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(z)
    import _socket

    scratch = tempfile.mkdtemp(prefix="dsec-worker-faults-")
    try:
        run(z, _socket, scratch, n, plain, env)
    finally:
        for name in os.listdir(scratch):
            os.unlink(os.path.join(scratch, name))
        os.rmdir(scratch)


def run(z, _socket, scratch, n, plain, env):
    os.chmod(scratch, 0o777)
    main_py = os.path.join(scratch, "main.py")
    with open(main_py, "w") as f:
        f.write(SNIPPET)
    monitor_end, worker_end = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
    # As zygote_main: the preload with random's cheaper reseed, gc frozen.
    restore = z.cheaper_random_reseed()
    for m in PRELOAD:
        __import__(m)
    restore()
    sys.modules["random"]._inst.gauss_next = None
    cmd = _socket.socket(fileno=worker_end.detach())
    code = marshal.dumps(compile(SNIPPET, main_py, "exec", dont_inherit=True))
    msg = marshal.dumps((scratch, None, main_py, {}, (1000, 256 << 20, 1 << 20), code))
    probes = [0] * len(STAGES)
    getrusage, me = resource.getrusage, resource.RUSAGE_SELF

    def probe(i):
        probes[i] = getrusage(me).ru_minflt

    for i in range(len(STAGES)):
        probe(i)  # its own code and objects warm before the fork
    gc.collect()
    gc.freeze()
    z.zygote_setup()
    z.settle_allocator()

    def worker():
        # zygote.py's worker_main and run_python_here, step by step.
        probe(0)
        m, fds = z.recv_with_fds(cmd, z.MAX_WORKER_MSG, 3)
        probe(1)
        scratch_dir, _argv, python, _env, limits, marshalled = marshal.loads(m)
        probe(2)
        z.become_call_process(limits, scratch_dir, fds, True)
        probe(3)
        sys.argv = [python]
        sys.path.insert(0, scratch_dir)
        module = z.ModuleType("__main__")
        module.__file__ = python
        module.__builtins__ = __builtins__
        sys.modules["__main__"] = module
        probe(4)
        code_obj = marshal.loads(marshalled)
        probe(5)
        exec(code_obj, module.__dict__)
        probe(6)
        sys.stdout.flush()
        probe(7)
        # The probes go out on stderr (a memfd the parent reads back).
        os.write(2, array.array("q", probes).tobytes())
        os._exit(0)

    rows = []
    start = time.perf_counter()
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                worker()
            finally:
                os._exit(1)
        stdio = [os.memfd_create(name) for name in ("stdin", "stdout", "stderr")]
        monitor_end.sendmsg([msg], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", stdio).tobytes())])
        _, status, ru = os.wait4(pid, 0)
        out = os.pread(stdio[1], 64, 0)
        p = array.array("q")
        p.frombytes(os.pread(stdio[2], 8 * len(STAGES), 0))
        for fd in stdio:
            os.close(fd)
        if status != 0 or out != b"328350\n" or len(p) < 8:
            sys.exit("a worker failed: status %d, stdout %r" % (status, out))
        rows.append([p[0]] + [p[k] - p[k - 1] for k in range(1, 8)] + [ru.ru_minflt - p[7]])
    per_ms = (time.perf_counter() - start) / n * 1e3

    def median(xs):
        return sorted(xs)[len(xs) // 2]

    print("%d workers, %s, %s" % (n, sys.executable, "Python's defaults" if plain else "the zygote's environment: "
                                    + " ".join("%s=%s" % kv for kv in env.items())))
    print("%-32s %s" % ("stage", "page faults (median)"))
    for k, name in enumerate(STAGES):
        print("%-32s %5d" % (name, median([r[k] for r in rows])))
    print("%-32s %5d" % ("all", median([sum(r) for r in rows])))
    print("%.3f ms per fork, call and exit, the parent's side included" % per_ms)


if __name__ == "__main__":
    main()
