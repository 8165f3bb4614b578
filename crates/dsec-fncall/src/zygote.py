# The FnCall runner's in-sandbox server ("zygote").
#
# The edge starts this once per runner, as root inside a container sandbox,
# with its stdin and stdout connected to the edge through the guest agent.
# Protocol: requests are `<length>\n<JSON>`; responses are one JSON object
# per line. The first line the zygote writes is {"ready": ...}; then every
# request gets exactly one response line.
#
# Process layout, and why:
#   zygote (root, warm: configured modules already imported; never reads a
#   request, so nothing of any call ever sits in its memory)
#     -> handler (forked before the request arrives; reads one request, runs
#        it, answers, exits: a call's data dies with its handler)
#          -> call process (uid nobody, no capabilities, no_new_privs,
#             rlimits; a Python call runs the code in this forked, already
#             warm interpreter; other languages exec their program)
# Cleanup after every call, in the handler: kill(-1, SIGKILL) with the
# real and effective uid of the call user ends every process the call started (the
# kernel walks the process list atomically, so a fork bomb cannot outrun
# it); every file the call user owns in a writable directory is removed; its
# System V IPC objects are removed; the call's scratch directory is removed.
import base64
import ctypes
import gc
import io
import json
import os
import resource
import select
import shutil
import signal
import stat
import sys
import time
import traceback

CALL_UID = 65534  # nobody
CALL_GID = 65534  # nogroup
BASE = "/var/lib/dsec-fncall"
PROG_DIR = BASE + "/prog"
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
IPC_RMID = 0
MAX_FETCH_BYTES = 8 << 20
# Directories the edge never lets a call's writes survive in: every
# directory the call user can write to, found once at start.
SKIP_TREES = ("/proc", "/sys", BASE)

libc = ctypes.CDLL(None, use_errno=True)
# Set by the handler when a call's process would not die.
UNCLEAN = []


def prctl(option, arg):
    if libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl")


def writable_dirs():
    """Every directory the call user could create files in."""
    found = []
    for top, dirs, _files in os.walk("/", followlinks=False):
        keep = []
        for d in dirs:
            p = os.path.join(top, d)
            if p.startswith(SKIP_TREES) or p == "/dev/pts":
                continue
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                continue
            keep.append(d)
            if (
                st.st_mode & stat.S_IWOTH
                or st.st_uid == CALL_UID
                or (st.st_gid == CALL_GID and st.st_mode & stat.S_IWGRP)
            ):
                found.append(p)
        dirs[:] = keep
    return found


LANGS = {
    "python": {"file": "main.py"},
    "bash": {"file": "main.sh", "argv": ["/bin/bash", "main.sh"]},
    "c": {"file": "main.c", "compile": ["gcc", "-O2", "-std=gnu17", "-o", "prog", "main.c", "-lm"]},
    "cpp": {"file": "main.cpp", "compile": ["g++", "-O2", "-std=gnu++17", "-o", "prog", "main.cpp"]},
}


def which(prog):
    for d in ("/usr/local/bin", "/usr/bin", "/bin"):
        p = os.path.join(d, prog)
        if os.access(p, os.X_OK):
            return p
    return None


def available_langs():
    out = ["python"]
    if which("bash"):
        out.append("bash")
    if which("gcc"):
        out.append("c")
    if which("g++"):
        out.append("cpp")
    return out


def read_exact(fd, n):
    buf = bytearray()
    while len(buf) < n:
        b = os.read(fd, n - len(buf))
        if not b:
            return None
        buf += b
    return bytes(buf)


def read_request(fd):
    """One request: a decimal length, a newline, then that many bytes of
    JSON. Read exactly, never past the end: the next request belongs to the
    next handler."""
    header = bytearray()
    while not header.endswith(b"\n"):
        b = os.read(fd, 1)
        if not b:
            return None
        header += b
        if len(header) > 20:
            raise ValueError("bad request header")
    data = read_exact(fd, int(header))
    if data is None:
        raise ValueError("truncated request")
    return data


def write_line(obj):
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    view = memoryview(data)
    while view:
        n = os.write(1, view)
        view = view[n:]


def safe_rel(path):
    """A path relative to the scratch directory, or None if it would leave it."""
    if not isinstance(path, str) or not path or "\0" in path:
        return None
    p = path
    if p.startswith("/"):
        return None
    parts = [x for x in p.split("/") if x not in ("", ".")]
    if not parts or any(x == ".." for x in parts):
        return None
    return "/".join(parts)


def memfd(name, data=b""):
    fd = os.memfd_create(name, 0)
    if data:
        os.write(fd, data)
        os.lseek(fd, 0, os.SEEK_SET)
    return fd


def read_memfd(fd, limit):
    size = os.fstat(fd).st_size
    os.lseek(fd, 0, os.SEEK_SET)
    data = os.read(fd, min(size, limit)) if size else b""
    return data, size > limit


def vm_size_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def become_call_process(req, scratch, fds):
    """In the forked call process: drop everything, then return (the caller
    runs the program). Any failure here exits 127 with the reason on stderr."""
    stdin_fd, out_fd, err_fd = fds
    os.setsid()
    os.dup2(stdin_fd, 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.closerange(3, 1 << 16)
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    limits = req["limits"]
    cpu_s = max(1, int(limits["time_ms"] / 1000) + 1)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    mem = limits["memory_bytes"]
    if mem:
        base = vm_size_bytes() if req.get("in_process") else 0
        resource.setrlimit(resource.RLIMIT_AS, (base + mem, base + mem))
    os.setgroups([])
    os.setresgid(CALL_GID, CALL_GID, CALL_GID)
    os.setresuid(CALL_UID, CALL_UID, CALL_UID)
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.chdir(scratch)
    for s in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
        signal.signal(s, signal.SIG_DFL)


def run_python_here(path, env):
    """Run a script in this (forked, warm) interpreter like `python3 path`."""
    os.environ.clear()
    os.environ.update(env)
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="surrogateescape")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="surrogateescape", write_through=False)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", write_through=True)
    sys.argv = [path]
    # As `python3 path` would: the script's directory first on the path.
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    import types

    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    code = 0
    try:
        with open(path, "rb") as f:
            src = f.read()
        exec(compile(src, path, "exec"), main.__dict__)
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


def kill_all_of_call_user():
    """kill(-1, SIGKILL) as the call user: the kernel signals every process
    whose real or saved uid is the call user's, and nothing else. Both our
    real and effective uid must change (the kernel also matches on the
    sender's real uid); the saved uid stays 0 so we can come back."""
    os.setresuid(CALL_UID, CALL_UID, 0)
    try:
        os.kill(-1, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.setresuid(0, 0, 0)


def kill_call_processes():
    """SIGKILL every process of the call user. Returns once none is left
    among our children (orphans are reparented to us: we are a subreaper)."""
    kill_all_of_call_user()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == 0:
            # Something still runs (or is dying): send again, wait a little.
            kill_all_of_call_user()
            time.sleep(0.001)
    return False


def remove_owned(dirs):
    for d in dirs:
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid != CALL_UID:
                continue
            if stat.S_ISDIR(st.st_mode):
                shutil.rmtree(e.path, ignore_errors=True)
            else:
                try:
                    os.unlink(e.path)
                except OSError:
                    pass


def remove_ipc():
    for kind, fn in (("shm", libc.shmctl), ("msg", libc.msgctl), ("sem", None)):
        try:
            with open("/proc/sysvipc/" + kind) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            # key id perms ... uid is column 7 (shm), 7 (msg), 4 (sem).
            uid_col = 4 if kind == "sem" else 7
            try:
                ident, uid = int(cols[1]), int(cols[uid_col])
            except (IndexError, ValueError):
                continue
            if uid != CALL_UID:
                continue
            if kind == "sem":
                libc.semctl(ident, 0, IPC_RMID)
            else:
                fn(ident, IPC_RMID, None)


def wait_with_deadline(pid, timeout_s):
    """Wait for pid; returns (status, rusage, timed_out)."""
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        timed_out = not poller.poll(max(0, int(timeout_s * 1000)))
    finally:
        os.close(pidfd)
    if timed_out:
        kill_all_of_call_user()
    _, status, ru = os.wait4(pid, 0)
    return status, ru, timed_out


def run_step(req, scratch, argv, in_process_path=None):
    """Fork the call process and run argv (or the Python script) in scratch.
    Returns the step's result dict."""
    limits = req["limits"]
    out_limit = limits["output_bytes"]
    stdin = base64.b64decode(req.get("stdin") or "")
    fds = (memfd("stdin", stdin), memfd("stdout"), memfd("stderr"))
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": scratch,
        "TMPDIR": scratch,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "0",
    }
    env.update(req.get("env") or {})
    # Output past the limit: one byte beyond it proves the overflow.
    step = dict(req, limits=dict(limits, file_bytes=max(limits.get("file_bytes", 0), out_limit + 1)))
    step["in_process"] = in_process_path is not None
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            become_call_process(step, scratch, fds)
            if in_process_path is not None:
                run_python_here(in_process_path, env)
            os.execve(argv[0], argv, env)
        except BaseException as e:  # noqa: BLE001 - the child must exit
            try:
                os.write(2, ("dsec: cannot start the program: %s\n" % e).encode())
            except OSError:
                pass
        os._exit(127)
    try:
        status, ru, timed_out = wait_with_deadline(pid, limits["time_ms"] / 1000.0)
    finally:
        os.close(fds[0])
    wall_ms = (time.monotonic() - t0) * 1000
    stdout, out_over = read_memfd(fds[1], out_limit)
    stderr, err_over = read_memfd(fds[2], out_limit)
    os.close(fds[1])
    os.close(fds[2])
    exit_code = os.waitstatus_to_exitcode(status)
    sig = -exit_code if exit_code < 0 else None
    cpu_ms = (ru.ru_utime + ru.ru_stime) * 1000
    if sig == signal.SIGXCPU:
        timed_out = True
    return {
        "exit_code": exit_code if exit_code >= 0 else None,
        "signal": sig,
        "timed_out": timed_out,
        "wall_ms": wall_ms,
        "cpu_ms": cpu_ms,
        "peak_memory_kb": ru.ru_maxrss,
        "stdout": base64.b64encode(stdout).decode(),
        "stderr": base64.b64encode(stderr).decode(),
        "output_exceeded": out_over or err_over or sig == signal.SIGXFSZ,
    }


def write_files(scratch, files):
    for name, content in (files or {}).items():
        rel = safe_rel(name)
        if rel is None:
            raise ValueError("file path %r must be relative and stay inside the working directory" % name)
        path = os.path.join(scratch, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(content or ""))
    for top, dirs, names in os.walk(scratch):
        for n in dirs + names:
            os.lchown(os.path.join(top, n), CALL_UID, CALL_GID)


def fetch_files(scratch, names):
    out = {}
    budget = MAX_FETCH_BYTES
    for name in names or []:
        rel = safe_rel(name)
        if rel is None:
            continue
        path = os.path.join(scratch, rel)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size > budget:
                continue
            data = os.read(fd, st.st_size)
            budget -= len(data)
            out[name] = base64.b64encode(data).decode()
        finally:
            os.close(fd)
    return out


def prepare_scratch(serial):
    scratch = "%s/call-%d" % (BASE, serial)
    shutil.rmtree(scratch, ignore_errors=True)
    os.mkdir(scratch, 0o700)
    os.chown(scratch, CALL_UID, CALL_GID)
    return scratch


def install_program(data):
    shutil.rmtree(PROG_DIR, ignore_errors=True)
    os.mkdir(PROG_DIR, 0o711)
    path = PROG_DIR + "/prog"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o711)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.chmod(path, 0o711)
    return path


def handle(req, serial, sweep):
    op = req.get("op")
    if op == "ping":
        return {"ok": True}
    if op == "install":
        install_program(base64.b64decode(req["binary"]))
        return {"ok": True}
    lang = req.get("language")
    spec = LANGS.get(lang)
    if spec is None:
        return {"error": "unsupported language %r" % lang}
    scratch = prepare_scratch(serial)
    try:
        write_files(scratch, req.get("files"))
        if op == "compile":
            with open(os.path.join(scratch, spec["file"]), "wb") as f:
                f.write(req.get("code", "").encode())
            os.lchown(os.path.join(scratch, spec["file"]), CALL_UID, CALL_GID)
            argv = list(spec["compile"])
            argv[0] = which(argv[0]) or argv[0]
            result = run_step(req, scratch, argv)
            binary = None
            prog = os.path.join(scratch, "prog")
            if result["exit_code"] == 0 and os.path.isfile(prog) and not os.path.islink(prog):
                with open(prog, "rb") as f:
                    data = f.read()
                install_program(data)
                if len(data) <= req.get("max_binary_bytes", 0):
                    binary = base64.b64encode(data).decode()
            result["binary"] = binary
            return result
        if op != "run":
            return {"error": "unknown op %r" % op}
        if "compile" in spec:
            argv = [PROG_DIR + "/prog"]
            if not os.path.exists(argv[0]):
                return {"error": "no compiled program installed"}
            result = run_step(req, scratch, argv)
        else:
            path = os.path.join(scratch, spec["file"])
            with open(path, "wb") as f:
                f.write(req.get("code", "").encode())
            os.lchown(path, CALL_UID, CALL_GID)
            if lang == "python":
                result = run_step(req, scratch, None, in_process_path=path)
            else:
                argv = list(spec["argv"])
                argv[0] = which("bash") or argv[0]
                result = run_step(req, scratch, argv)
        result["files"] = fetch_files(scratch, req.get("fetch_files"))
        return result
    finally:
        clean = kill_call_processes()
        remove_owned(sweep)
        remove_ipc()
        shutil.rmtree(scratch, ignore_errors=True)
        if not clean:
            # A process of the call survived SIGKILL for 5 s (stuck in the
            # kernel): say so, the edge retires this runner.
            UNCLEAN.append(True)


def handler_main(serial, sweep):
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    req = None
    try:
        line = read_request(0)
        if line is None:
            os._exit(3)
        req = json.loads(line)
        resp = handle(req, serial, sweep)
    except Exception as e:  # noqa: BLE001 - answer, never die silently
        resp = {"error": "%s: %s" % (type(e).__name__, e)}
    resp["id"] = req.get("id") if isinstance(req, dict) else None
    if UNCLEAN:
        resp["unclean"] = True
    write_line(resp)
    os._exit(0)


def main():
    os.makedirs(BASE, mode=0o711, exist_ok=True)
    os.chmod(BASE, 0o711)
    preload = [m for m in os.environ.get("DSEC_FNCALL_PRELOAD", "").split(",") if m]
    loaded = []
    for m in preload:
        try:
            __import__(m)
            loaded.append(m)
        except Exception:  # noqa: BLE001 - a missing library is reported, not fatal
            pass
    sweep = writable_dirs()
    # Everything allocated so far is shared by every fork: keep the
    # collector from walking (and so copying) those pages in each call.
    gc.collect()
    gc.freeze()
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    write_line({"ready": True, "languages": available_langs(), "preloaded": loaded, "sweep": sweep})
    serial = 0
    while True:
        serial += 1
        # Fork the next handler now, while the edge is still reading the
        # previous answer: the fork is off the next call's critical path.
        pid = os.fork()
        if pid == 0:
            handler_main(serial, sweep)
        while True:
            try:
                wpid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            if wpid == pid:
                break
        if os.waitstatus_to_exitcode(status) == 3:
            return  # stdin closed: the edge is done with this runner
        if os.waitstatus_to_exitcode(status) != 0:
            write_line({"error": "handler died with status %d" % status, "fatal": True})


if __name__ == "__main__":
    main()
