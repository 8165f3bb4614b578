# The FnCall runner's warm Python interpreter ("zygote") and its workers.
#
# The monitor (`dsec-agent fncall-monitor`, crates/dsec-fncall-runner/,
# root, the process the edge starts in each runner) starts this file twice:
# as the compiler (compiler_main) and as the zygote,
# `python3 -s zygote.py --zygote CTL REP CMD`: a fresh interpreter, not a
# fork of anything warm, so that it holds only its own few modules and the
# preloaded ones (each fork copies the page-table entries of its whole
# heap, so a smaller zygote makes every call cheaper). Before the exec the
# monitor put it in a Landlock domain that lets it and every worker write
# only in the scratch directory, the temporary directories and /dev, and
# set no_new_privs, oom_score_adj 1000, no core dumps and PR_SET_PDEATHSIG.
#
# Process layout:
#   monitor (Rust). Reads each request, prepares the call (scratch
#   directory, files, stdio memfds), hands it to the worker, watches it,
#   answers the edge and cleans up (kills the call user's processes, sweeps
#   the writable directories, removes System V IPC objects and scratch).
#   It never forks after starting the zygote, so no call inherits its
#   memory.
#   |- compiler (uid 65533, writes nowhere; this file with --compiler): turns
#   |  a Python call's source into a marshalled code object, in a process
#   |  that never forks (compiling in the worker would copy ~50 pages).
#   `- zygote (root, warm: configured modules imported). Per call it forks
#      one worker ahead of time and reports the worker's end (wait status,
#      rusage) on REP, then forks the next at once. It does as little as
#      possible, because every page it writes after a fork is copied; it
#      never sees a call's code, input or output.
#      `- worker: receives what to run and the call's stdio memfds on CMD,
#         drops to uid nobody, no capabilities, rlimits, and becomes the
#         call (a Python call runs in this warm interpreter;
#         other programs, compilers included, are exec'd).
# Only what the zygote and its workers need is imported here: every page of
# the zygote's heap is a page each fork copies the page-table entry of, and
# each worker may copy.
import _socket  # not `socket`: its Python layer (enums, selectors) is heap to fork
import gc
import marshal
import os
import resource
import signal
import sys

CALL_UID = 65534  # nobody
CALL_GID = 65534  # nogroup
BASE = "/var/lib/dsec-fncall"
# Every call's working directory (one call at a time per runner).
SCRATCH = BASE + "/call"
# The environment of every call, before the request's own variables.
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": SCRATCH,
    "TMPDIR": SCRATCH,
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
# Largest message to a worker (worker.rs MAX_WORKER_MSG); a code object
# that would not fit is left to the worker to compile from its file.
MAX_WORKER_MSG = 128 << 10


def vm_size_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def become_call_process(limits, scratch, fds, in_process):
    """In the forked worker: take the call's stdio, set its limits
    (time_ms, memory_bytes, file_bytes) and drop to the call user. What
    every call shares (no_new_privs, oom_score_adj, no core dumps, default
    SIGPIPE/SIGXFSZ, the Landlock domain) the monitor and the zygote set
    once for all of them; each step here is a bare system call, since every
    page this process writes is a copied page."""
    os.setsid()
    os.dup2(fds[0], 0)
    os.dup2(fds[1], 1)
    os.dup2(fds[2], 2)
    os.closerange(3, 1 << 16)
    time_ms, mem, file_bytes = limits
    cpu_s = max(1, int(time_ms / 1000) + 1)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_bytes, file_bytes))
    if mem:
        base = ZYGOTE_VM_BYTES if in_process else 0
        resource.setrlimit(resource.RLIMIT_AS, (base + mem, base + mem))
    os.setgroups([])
    os.setresgid(CALL_GID, CALL_GID, CALL_GID)
    os.setresuid(CALL_UID, CALL_UID, CALL_UID)
    os.chdir(scratch)


def zygote_setup():
    """What the zygote sets for itself once: SIGPIPE and SIGXFSZ at their
    defaults (Python ignores them, and exec would keep them ignored), its
    address-space size, the calls' base environment."""
    global ZYGOTE_VM_BYTES
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    ZYGOTE_VM_BYTES = vm_size_bytes()
    os.environ.clear()
    os.environ.update(BASE_ENV)


# The zygote's address space: a Python call may grow this much beyond it.
ZYGOTE_VM_BYTES = 0
# A module object's type (what types.ModuleType is), without importing types.
ModuleType = type(sys)


def run_python_here(path, scratch, extra_env, marshalled):
    """Run a script in this (forked, warm) interpreter like `python3 path`.
    The zygote's environment is already the calls' base environment, and
    its sys.stdin/stdout/stderr already wrap fds 0-2 (now the call's
    memfds, and never used by the zygote), so both are kept as they are.
    `marshalled` is the compiler's marshalled code object (compiling in a
    process that never forks saves this one the copied pages), or None:
    then the script is compiled here from `path`, within the call's limits,
    as `python3 path` would. Every object this touches is a page copied, so
    no helper runs here that the zygote could have run once (os.path, the
    import system)."""
    if extra_env:
        os.environ.update(extra_env)
    sys.argv = [path]
    # As `python3 path` would: the script's directory first on the path
    # (the script is always scratch/<name>).
    sys.path.insert(0, scratch)
    main = ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    code = 0
    try:
        if marshalled is not None:
            code_obj = marshal.loads(marshalled)
        else:
            with open(path, "rb") as f:
                code_obj = compile(f.read(), path, "exec", dont_inherit=True)
        exec(code_obj, main.__dict__)
    except SystemExit as e:
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code & 0xFF
        else:
            try:
                print(e.code, file=sys.stderr)
            except Exception:
                pass
            code = 1
    except MemoryError:
        code = 137
        try:
            sys.stderr.write("MemoryError\n")
        except Exception:
            pass
    except BaseException:
        # Leave out this function's own frame: the traceback starts in the
        # user's code, as under `python3 path`.
        import traceback  # preloaded by default (the zygote's list)

        etype, value, tb = sys.exc_info()
        traceback.print_exception(etype, value, tb.tb_next)
        code = 1
    try:
        sys.stdout.flush()
    except BaseException:
        code = code or 120
    try:
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(code)


def reap_strays():
    """In the zygote: reap the children a call made siblings of its worker
    (the monitor has killed them)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def recv_with_fds(sock, size, max_fds):
    """One message and the descriptors passed with it (SCM_RIGHTS), as
    socket.recv_fds does, on a bare _socket.socket."""
    msg, ancillary, _, _ = sock.recvmsg(size, _socket.CMSG_LEN(max_fds * 4))
    fds = []
    for level, kind, data in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            # C ints, native order; a truncated one is dropped (as socket.recv_fds).
            fds += memoryview(data)[:len(data) & ~3].cast("i").tolist()
    return msg, fds


def worker_main(cmd):
    """Forked ahead of its call. Receives what to run and the call's stdio
    (on `cmd`, the zygote's socket object), drops every privilege and
    becomes the call: a Python call runs in this already warm interpreter,
    other programs are exec'd."""
    msg, fds = recv_with_fds(cmd, MAX_WORKER_MSG, 3)
    if not msg:
        os._exit(3)
    try:
        # marshal, not JSON: fewer objects made here (and so fewer copied
        # pages). The layout is the monitor's (worker.rs, message()).
        scratch, argv, python, env, limits, marshalled = marshal.loads(msg)
        become_call_process(limits, scratch, fds, python is not None)
        if python is not None:
            run_python_here(python, scratch, env, marshalled)
        os.execve(argv[0], argv, dict(BASE_ENV, **env))
    except BaseException as e:  # noqa: BLE001 - the call must exit
        try:
            os.write(2, ("dsec: cannot start the program: %s\n" % e).encode())
        except OSError:
            pass
    os._exit(127)


def cheaper_random_reseed():
    """Has `random` (imported by the preload) reseed each worker with its C
    method instead of its Python one. `random` registers the bound method
    `_inst.seed` to run in every forked child; that Python function (type
    checks, a super() call) touches objects on about 20 pages the worker
    would otherwise not write, each a copied page. The C method it ends in
    draws the same fresh seed from the kernel, so every call still gets its
    own random sequence, as a fresh interpreter would. Returns the function
    that puts os.register_at_fork back."""
    register = os.register_at_fork

    def register_cheaper(*, before=None, after_in_child=None, after_in_parent=None):
        owner = getattr(after_in_child, "__self__", None)
        if getattr(after_in_child, "__name__", None) == "seed" and type(owner).__module__ == "random":
            import _random

            # A builtin method bound to the instance: no Python frame. The
            # Python seed() also resets gauss_next; the zygote resets it
            # once (zygote_main), so every worker inherits None.
            after_in_child = _random.Random.seed.__get__(owner)
        hooks = {"before": before, "after_in_child": after_in_child, "after_in_parent": after_in_parent}
        register(**{k: v for k, v in hooks.items() if v is not None})

    os.register_at_fork = register_cheaper

    def restore():
        os.register_at_fork = register

    return restore


def settle_allocator():
    """Has glibc's malloc (the zygote's allocator: spawn.rs ZYGOTE_ENV) sort
    the free chunks the start-up left in its unsorted bin, once, here. A
    request that no cached chunk fits makes malloc walk that bin and write
    a header into each chunk it files away; done in a worker, each of those
    writes is a copied page (a 4 KiB read in a worker copied ~55 pages
    before this, ~12 after). Requests of the large-bin sizes do the walk
    (and merge the fast bins) without keeping anything."""
    for size in (1500, 3000, 6000, 12000, 50000):
        bytearray(size)


def other_children_left(children_file):
    """In the zygote, once its worker is reaped: whether it still has a
    child, which can only be one a call made a sibling of its worker
    (clone with CLONE_PARENT). Read from /proc (`children_file`, opened
    once) rather than asked of waitpid, whose usual answer (no child at
    all) is an exception: objects on pages this process would copy after
    each fork."""
    return os.pread(children_file, 1, 0) != b""


# How long the zygote waits for a fork to become possible again.
FORK_RETRY_S = 30.0


def fork_once_pids_free(fork, error):
    """fork() again after it failed with `error`. EAGAIN (the runner's pids
    limit) and ENOMEM are transient here: the zygote forks the next worker
    as soon as the last one ends, while that call's other processes (a fork
    bomb's) may still fill the pids limit until the monitor has killed and
    reaped them, moments later. Giving up at once would end the zygote,
    and with it the runner, under the next call. Only this error path imports
    what it needs, so that no page of the zygote's heap changes for it."""
    import errno
    import time

    deadline = time.monotonic() + FORK_RETRY_S
    delay = 0.001
    while error.errno in (errno.EAGAIN, errno.ENOMEM) and time.monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
        try:
            return fork()
        except OSError as e:
            error = e
    raise error


def zygote_main(ctl, rep, cmd_fd):
    """The warm interpreter. It forks one worker ahead of each call and
    reports the worker's end, then forks the next one at once: no word from
    the monitor is needed (one wake-up and two pipe operations per call
    fewer), unless the call left the zygote other children. Those the
    monitor kills, then says so on `ctl`, and the zygote reaps them before
    it forks, so that the next call cannot see them. It does as little as
    possible in between, because every page it writes after a fork is
    copied (the worker shares them all). It never sees a call's code,
    input or output. It ends with the monitor (PR_SET_PDEATHSIG, or `ctl`
    closed)."""
    preload = [m for m in os.environ.get("DSEC_FNCALL_PRELOAD", "").split(",") if m]
    loaded = []
    restore_register = cheaper_random_reseed()
    for m in preload:
        try:
            __import__(m)
            loaded.append(m)
        except Exception:  # noqa: BLE001 - a missing library is reported, not fatal
            pass
    restore_register()
    if "random" in sys.modules:
        sys.modules["random"]._inst.gauss_next = None
    # The workers' socket object, made once here rather than in each worker.
    cmd = _socket.socket(fileno=cmd_fd)
    # Everything allocated so far is shared by every fork: keep the
    # collector from walking (and so copying) those pages in each call.
    gc.collect()
    gc.freeze()
    zygote_setup()
    os.write(rep, (",".join(loaded) + "\n").encode())
    settle_allocator()
    # Our children (a single-threaded process: the main thread's list).
    children = os.open("/proc/self/task/%d/children" % os.getpid(), os.O_RDONLY | os.O_CLOEXEC)
    fork, wait4, write, strays = os.fork, os.wait4, os.write, other_children_left
    while True:
        try:
            pid = fork()
        except OSError as e:
            pid = fork_once_pids_free(fork, e)
        if pid == 0:
            os.close(ctl)
            os.close(rep)
            os.close(children)
            worker_main(cmd)
        _, status, ru = wait4(pid, 0)
        left = strays(children)
        write(rep, b"%d %d %.6f %.6f %d %d\n" % (pid, status, ru.ru_utime, ru.ru_stime, ru.ru_maxrss, left))
        if left:
            if not os.read(ctl, 1):
                os._exit(0)
            reap_strays()


def read_message(fd, buf):
    """The compiler's next message (8-byte length, then the bytes) and what
    was read past it; (None, b"") at the end of the input."""
    while len(buf) < 8:
        b = os.read(fd, 1 << 16)
        if not b:
            return None, b""
        buf += b
    end = 8 + int.from_bytes(buf[:8], "little")
    while len(buf) < end:
        b = os.read(fd, max(1 << 16, end - len(buf)))
        if not b:
            return None, b""
        buf += b
    return buf[8:end], buf[end:]


def write_answer(fd, kind, data):
    view = memoryview(kind + len(data).to_bytes(8, "little") + data)
    while view:
        view = view[os.write(fd, view):]


def compiler_main(src, out):
    """The compiler (see the monitor's compiler.rs): a warm interpreter that
    never forks, so compiling here copies no page; it never runs a call's
    code. Its first message is the file name code objects carry; then each
    message is a source, answered with its marshalled code (c), the text
    `python3 main.py` prints for its SyntaxError (e), or "compile it in the
    worker" (f)."""
    import traceback

    path, buf = read_message(src, b"")
    if path is None:
        os._exit(0)
    path = path.decode()
    write_answer(out, b"r", b"")
    while True:
        source, buf = read_message(src, buf)
        if source is None:
            os._exit(0)  # the monitor is gone
        try:
            try:
                code = marshal.dumps(compile(source, path, "exec", dont_inherit=True))
            except ValueError as e:
                # NUL bytes: a SyntaxError under `python3 path` (any version).
                raise SyntaxError(str(e)) from None
            kind = b"c" if len(code) < MAX_WORKER_MSG - 4096 else b"f"
            data = code if kind == b"c" else b""
        except SyntaxError as e:
            kind, data = b"e", "".join(traceback.format_exception_only(type(e), e)).encode()
        except Exception:  # noqa: BLE001 - RecursionError, MemoryError...: the worker meets it within the call's limits
            kind, data = b"f", b""
        del source
        write_answer(out, kind, data)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--zygote"] and len(sys.argv) == 5:
        zygote_main(*(int(fd) for fd in sys.argv[2:5]))
    if sys.argv[1:2] == ["--compiler"] and len(sys.argv) == 4:
        compiler_main(*(int(fd) for fd in sys.argv[2:4]))
    sys.exit("usage: zygote.py --zygote CTL REP CMD | --compiler SRC OUT (started by dsec-agent fncall-monitor)")
