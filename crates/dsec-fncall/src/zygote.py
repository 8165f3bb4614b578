# The FnCall runner's in-sandbox server ("zygote").
#
# The edge starts this once per runner, as root inside a container sandbox,
# with its stdin and stdout connected to the edge through the guest agent.
# Protocol: requests are `<length>\n<JSON>`; responses are one JSON object
# per line. The first line the zygote writes is {"ready": ...}; then every
# request gets exactly one response line.
#
# Process layout, and why:
#   monitor (root; the process the edge starts). Reads each request,
#   prepares the call (scratch directory, files, stdin), watches it, answers
#   the edge and cleans up. It holds calls' data but never forks after
#   starting the zygote, so no call ever inherits its memory, and its own
#   work copies no shared pages.
#   `- zygote (root, warm: configured modules imported). A fresh
#      interpreter running this file with --zygote, so that it holds none of
#      the monitor's modules or heap: each fork copies the page-table entries
#      of its whole heap, so a smaller zygote makes every call cheaper. It
#      starts with no_new_privs and inside a Landlock domain that lets it
#      and every worker write only in the scratch directory, the temporary
#      directories and /dev (LANDLOCK_WRITABLE), both set before its exec.
#      Per call it forks one worker ahead of time and reports the worker's
#      end (wait status, rusage), then forks the next at once. It does as
#      little as possible, because every page it writes after a fork is
#      copied; it never sees a call's code, input or output.
#      `- worker: receives what to run and the call's stdio memfds, drops to
#         uid nobody, no capabilities, rlimits, and becomes the call (a
#         Python call runs in this warm interpreter; other programs,
#         compilers included, are exec'd).
# Answers are a JSON line announcing raw parts, then stdout, stderr and
# fetched files copied by sendfile from the call's memfds and files.
# Cleanup after every call: kill(-1, SIGKILL) with the real and effective
# uid of the call user ends every process the call started (the kernel walks
# the process list atomically, so a fork bomb cannot outrun it); every file
# the call user owns in a writable directory is removed, and its System V
# IPC objects, and the call's scratch directory. A call that left no
# process, created nothing in those directories and holds no IPC object
# (most calls) skips the searches: see only_zygote_left, SweepWatch and
# ipc_objects_exist.
# Only what the zygote and its workers need is imported here: the zygote is
# a fresh interpreter running this file (`--zygote`), and every page of its
# heap is a page each fork copies the page-table entry of, and each worker
# may copy. The monitor's own modules are imported in its entry point below.
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
PROG_DIR = BASE + "/prog"
PR_SET_NO_NEW_PRIVS = 38
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
IPC_RMID = 0
MAX_FETCH_BYTES = 8 << 20
# Directories the edge never lets a call's writes survive in: every
# directory the call user can write to, found once at start.
SKIP_TREES = ("/proc", "/sys", BASE)

def prctl(option, arg):
    if libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl")


# Landlock (same numbers on every architecture): where a call may write.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
# Every right that creates, changes or removes something (reading and
# executing stay free): write, remove dir/file, make char/dir/reg/sock/
# fifo/block/sym, then refer (ABI 2) and truncate (ABI 3).
LANDLOCK_WRITE_ABI1 = 0x2 | 0x10 | 0x20 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800 | 0x1000
LANDLOCK_REFER = 0x2000
LANDLOCK_TRUNCATE = 0x4000
# The only places a call may write: its scratch directory (under BASE,
# whose own DAC keeps the call to BASE/call), the temporary directories
# programs use whatever TMPDIR says (glibc's tmpfile(), POSIX semaphores),
# and device files such as /dev/null. So the directories the cleanup after
# a call must look at are known whatever the image's permissions are.
LANDLOCK_WRITABLE = (BASE, "/tmp", "/var/tmp", "/dev/shm", "/dev")


def landlock_ruleset():
    """A Landlock ruleset fd confining writes to LANDLOCK_WRITABLE, or None
    on a kernel without Landlock (the call then runs without this layer;
    every other one still holds)."""
    abi = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                       ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    if abi < 1:
        return None
    rights = LANDLOCK_WRITE_ABI1
    if abi >= 2:
        rights |= LANDLOCK_REFER
    if abi >= 3:
        rights |= LANDLOCK_TRUNCATE
    attr = ctypes.c_uint64(rights)  # struct landlock_ruleset_attr, first field
    fd = libc.syscall(SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(8), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    for path in LANDLOCK_WRITABLE:
        try:
            dfd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            continue  # not in this image
        try:
            rule = PathBeneath(rights, dfd)
            if libc.syscall(SYS_LANDLOCK_ADD_RULE, fd, LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
                raise OSError(ctypes.get_errno(), "landlock_add_rule " + path)
        finally:
            os.close(dfd)
    return fd


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


class RequestReader:
    """Requests: a decimal length, a newline, then that many bytes of JSON.
    The monitor is the only reader of its stdin (calls get memfds), so it
    reads in large chunks and keeps what belongs to the next request: one
    read per request instead of one per header byte."""

    def __init__(self, fd):
        self.fd = fd
        self.buf = b""

    def _more(self):
        b = os.read(self.fd, 1 << 16)
        if b:
            self.buf += b
        return bool(b)

    def next(self):
        """The next request's bytes, None at a clean end of stdin."""
        while True:
            nl = self.buf.find(b"\n", 0, 21)
            if nl >= 0:
                break
            if len(self.buf) > 20:
                raise ValueError("bad request header")
            if not self._more():
                if self.buf:
                    raise ValueError("truncated request")
                return None
        n = int(self.buf[:nl])
        if n < 0:
            raise ValueError("bad request header")
        end = nl + 1 + n
        while len(self.buf) < end:
            if not self._more():
                raise ValueError("truncated request")
        data, self.buf = self.buf[nl + 1:end], self.buf[end:]
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


def vm_size_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def become_call_process(req, scratch, fds, in_process):
    """In the forked worker: take the call's stdio, set its limits and drop
    to the call user. What every call shares (no_new_privs, oom_score_adj,
    no core dumps, default SIGPIPE/SIGXFSZ) the zygote set once for all of
    them, and the Landlock domain is the zygote's own (see confine_zygote);
    each step here is a bare system call, since every page this process
    writes is a copied page."""
    os.setsid()
    os.dup2(fds[0], 0)
    os.dup2(fds[1], 1)
    os.dup2(fds[2], 2)
    os.closerange(3, 1 << 16)
    limits = req["limits"]
    cpu_s = max(1, int(limits["time_ms"] / 1000) + 1)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    mem = limits["memory_bytes"]
    if mem:
        base = ZYGOTE_VM_BYTES if in_process else 0
        resource.setrlimit(resource.RLIMIT_AS, (base + mem, base + mem))
    os.setgroups([])
    os.setresgid(CALL_GID, CALL_GID, CALL_GID)
    os.setresuid(CALL_UID, CALL_UID, CALL_UID)
    os.chdir(scratch)


def confine_zygote(ruleset):
    """In the monitor's child, before it execs the zygote: what the zygote
    and so every call inherits, set once and kept across exec. The OOM
    killer's first choice, no core dumps, no_new_privs (a setuid program in
    the image cannot give the call user privileges), and the Landlock domain
    `ruleset` (LANDLOCK_WRITABLE): the zygote itself writes nothing after
    it starts, so its domain is the calls' domain, entered once here instead
    of by every worker, and the zygote needs no ctypes."""
    with open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    prctl(PR_SET_NO_NEW_PRIVS, 1)
    if ruleset is not None and libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")


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


def run_python_here(path, scratch, extra_env, compiled):
    """Run a script in this (forked, warm) interpreter like `python3 path`.
    The zygote's environment is already the calls' base environment, and
    its sys.stdin/stdout/stderr already wrap fds 0-2 (now the call's
    memfds, and never used by the zygote), so both are kept as they are.
    `compiled` is the monitor's marshalled code object (compiling there,
    in a process that never forks, saves this one the copied pages). Every
    object this touches is a page copied, so no helper runs here that the
    zygote could have run once (os.path, the import system)."""
    if extra_env:
        os.environ.update(extra_env)
    sys.argv = [path]
    # As `python3 path` would: the script's directory first on the path
    # (the script is always scratch/<name>, see Monitor.handle).
    sys.path.insert(0, scratch)
    main = ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    code = 0
    try:
        if compiled:
            code_obj = marshal.loads(compiled)
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


def kill_call_processes(keep):
    """SIGKILL every process of the call user. Returns once none is left
    (orphans are reparented to us, a subreaper, and reaped here); `keep` is
    our child that is not the call's (the zygote)."""
    kill_all_of_call_user()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not call_processes_left():
            reap_orphans(keep)
            return True
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return True
        if pid == keep:
            raise SystemExit("the zygote died")
        if pid == 0:
            # Something still runs (or is dying): send again, wait a little.
            kill_all_of_call_user()
            time.sleep(0.001)
    return False


def children_of(pid):
    """The pids of a (single-threaded) process's children, zombies included
    (/proc/PID/task/PID/children)."""
    return read_small("/proc/%d/task/%d/children" % (pid, pid)).split()


def only_zygote_left(monitor, zygote, zygote_strays):
    """Whether the call left no process at all, known from one small file
    and the zygote's report instead of a scan of /proc. Every process a
    call starts descends from its worker; when a process dies its children
    go to the nearest subreaper above it, which is us (the zygote is not
    one), so a process that outlived the worker is our child or a
    descendant of one. The only way to get another parent is
    clone(CLONE_PARENT), which makes a sibling of the caller: from the
    worker, a child of the zygote, so the zygote must have had no other
    child when it reaped the worker (`zygote_strays`, from its report; only
    such a stray could make another one later). Strays are killed on the
    full path and reaped by the zygote before its next fork. Anything
    unexpected, or a file we cannot read, takes the full path (kill, scan,
    reap)."""
    if zygote_strays:
        return False
    try:
        return children_of(monitor) == [str(zygote).encode()]
    except OSError:
        return False


def call_processes_left():
    """Whether a live process of the call user still exists (in our
    namespace). Zombies are dead: ours are reaped by our caller, the
    zygote's (see only_zygote_left) by the zygote before its next fork.
    The worker the zygote forks for the next call runs as root until it
    receives that call, so it is never among them."""
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if os.stat("/proc/" + p).st_uid == CALL_UID and not is_zombie(p):
                    return True
            except OSError:
                pass
    return False


def is_zombie(pid):
    """Whether /proc/PID/stat says the process has exited (Z or X)."""
    st = read_small("/proc/%s/stat" % pid)
    return st[st.rindex(b")") + 2:][:1] in (b"Z", b"X")


def reap_orphans(keep):
    """Reap the calls' orphans that have ended (never `keep`, the zygote)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == keep:
            raise SystemExit("the zygote died")


def remove_owned(dirs):
    """Removes every entry the call user owns in `dirs`; returns whether
    all of them went."""
    complete = True

    def failed(*_):
        nonlocal complete
        complete = False

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
                shutil.rmtree(e.path, onerror=failed)
            else:
                try:
                    os.unlink(e.path)
                except FileNotFoundError:
                    pass
                except OSError:
                    complete = False
    return complete


# inotify(7): what a call can do to a watched directory's entries (create,
# mkdir, link, mknod, bind a socket: IN_CREATE; rename into it:
# IN_MOVED_TO), and what ends a watch (the directory deleted or moved:
# IN_DELETE_SELF, IN_MOVE_SELF, then IN_IGNORED) or loses events
# (IN_Q_OVERFLOW).
IN_CREATE = 0x100
IN_MOVED_TO = 0x80
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
IN_Q_OVERFLOW = 0x4000
IN_IGNORED = 0x8000
IN_ONLYDIR = 0x1000000
IN_DONT_FOLLOW = 0x2000000
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
WATCH_LOST = IN_DELETE_SELF | IN_MOVE_SELF | IN_Q_OVERFLOW | IN_IGNORED


class SweepWatch:
    """Tells whether a call created anything in the directories the
    cleanup sweeps, so that a call that did not (most calls) costs no
    directory listing. An inotify event is queued by the system call that
    creates the entry, before it returns, and every process of the call is
    dead before we look, so an empty queue means nothing was created. Any
    doubt (no inotify, a watch lost, events dropped, a sweep that could not
    remove everything) means sweeping after every call from then on, as
    without the watch."""

    def __init__(self, dirs):
        self.fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if self.fd < 0:
            return
        for d in dirs:
            wd = libc.inotify_add_watch(self.fd, d.encode(), IN_CREATE | IN_MOVED_TO | IN_DELETE_SELF
                                        | IN_MOVE_SELF | IN_ONLYDIR | IN_DONT_FOLLOW)
            if wd < 0:
                self.give_up()
                return

    def give_up(self):
        if self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def changed(self):
        """Whether anything was created since the last call (drains the
        queue); always True once the watch is given up."""
        if self.fd < 0:
            return True
        seen = False
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return seen
            if not data:
                self.give_up()
                return True
            seen = True
            # struct inotify_event: wd, mask, cookie, len, then len bytes of name.
            off = 0
            while off + 16 <= len(data):
                mask = int.from_bytes(data[off + 4:off + 8], sys.byteorder)
                if mask & WATCH_LOST:
                    self.give_up()
                    return True
                off += 16 + int.from_bytes(data[off + 12:off + 16], sys.byteorder)


def read_small(path):
    """A small file's bytes, in three system calls (no file object)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = b""
        while True:
            b = os.read(fd, 1 << 16)
            if not b:
                return data
            data += b
    finally:
        os.close(fd)


# IPC_INFO-style commands that count a namespace's objects: shmctl
# SHM_INFO (struct shm_info: used_ids first), msgctl MSG_INFO (struct
# msginfo: msgpool, the number of queues, first), semctl SEM_INFO (struct
# seminfo: semusz, the number of sets, eighth int).
SHM_INFO = 14
MSG_INFO = 12
SEM_INFO = 19


def ipc_objects_exist():
    """Whether the runner's IPC namespace holds any System V object (we make
    none): three system calls instead of reading three /proc files."""
    buf = ctypes.create_string_buffer(128)
    if libc.shmctl(0, SHM_INFO, buf) < 0 or int.from_bytes(buf.raw[0:4], sys.byteorder):
        return True
    if libc.msgctl(0, MSG_INFO, buf) < 0 or int.from_bytes(buf.raw[0:4], sys.byteorder):
        return True
    return libc.semctl(0, 0, SEM_INFO, buf) < 0 or int.from_bytes(buf.raw[28:32], sys.byteorder) != 0


def remove_ipc():
    """Removes every System V IPC object of the runner's IPC namespace: we
    make none, so all are the call's. Removal needs CAP_SYS_ADMIN, which
    the runner does not have, or the object's owner or creator as effective
    uid, so it runs as the call user (whose objects record it as creator
    even after an IPC_SET handed them to another uid). Returns whether none
    is left."""
    if not ipc_objects_exist():
        return True
    os.setresuid(CALL_UID, CALL_UID, 0)
    try:
        for kind in ("shm", "msg", "sem"):
            try:
                lines = read_small("/proc/sysvipc/" + kind).split(b"\n")[1:]
            except OSError:
                continue
            for line in lines:
                cols = line.split()  # key, id, ...
                if len(cols) < 2 or not cols[1].isdigit():
                    continue
                ident = int(cols[1])
                if kind == "shm":
                    libc.shmctl(ident, IPC_RMID, None)
                elif kind == "msg":
                    libc.msgctl(ident, IPC_RMID, None)
                else:
                    libc.semctl(ident, 0, IPC_RMID)
    finally:
        os.setresuid(0, 0, 0)
    return not ipc_objects_exist()


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


def outcome(status, utime, stime, maxrss, timed_out, t0):
    exit_code = os.waitstatus_to_exitcode(status)
    sig = -exit_code if exit_code < 0 else None
    return {
        "exit_code": exit_code if exit_code >= 0 else None,
        "signal": sig,
        "timed_out": timed_out or sig == signal.SIGXCPU,
        "wall_ms": (time.monotonic() - t0) * 1000,
        "cpu_ms": (utime + stime) * 1000,
        "peak_memory_kb": maxrss,
        "output_exceeded": sig == signal.SIGXFSZ,
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
    if files:
        for top, dirs, names in os.walk(scratch):
            for n in dirs + names:
                os.lchown(os.path.join(top, n), CALL_UID, CALL_GID)


def open_beneath(scratch, rel):
    """Open scratch/rel for reading without following any symlink on the
    way (the call user controls everything under scratch)."""
    parts = rel.split("/")
    fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for p in parts[:-1]:
            nfd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nfd
        return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)


def prepare_scratch():
    scratch = SCRATCH
    try:
        os.mkdir(scratch, 0o700)
    except FileExistsError:
        # A previous cleanup left it (it should not): start afresh.
        shutil.rmtree(scratch, ignore_errors=True)
        os.mkdir(scratch, 0o700)
    os.chown(scratch, CALL_UID, CALL_GID)
    return scratch


def remove_scratch(scratch, written):
    """Removes the call's directory. BASE is root's, so the call cannot
    have moved or replaced the directory itself. Most calls leave in it
    only what the monitor wrote (`written`, plain names): unlinking those
    (unlink never follows a symlink) and removing the then empty directory
    takes a system call each, and a failure of either (something else is
    there, or a name became a directory) takes the general path. There,
    its plain entries go with one unlink each; anything else (directories,
    or a scratch we cannot list) takes shutil.rmtree, which never follows
    symlinks."""
    for name in written:
        try:
            os.unlink(scratch + "/" + name)
        except OSError:
            break
    else:
        try:
            os.rmdir(scratch)
            return
        except OSError:
            pass
    try:
        fd = os.open(scratch, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)
        return
    try:
        for name in os.listdir(fd):
            try:
                os.unlink(name, dir_fd=fd)
            except IsADirectoryError:
                shutil.rmtree(scratch + "/" + name, ignore_errors=True)
            except OSError:
                pass
    finally:
        os.close(fd)
    try:
        os.rmdir(scratch)
    except OSError:
        shutil.rmtree(scratch, ignore_errors=True)


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


def send_part(fd, count):
    """Copies count bytes of fd (from offset 0) to our stdout in the kernel."""
    offset = 0
    while offset < count:
        n = os.sendfile(1, fd, offset, count - offset)
        if n == 0:
            break
        offset += n
    if offset < count:
        # The file shrank under us (only fetched files can): pad, keeping
        # the frame's announced length.
        os.write(1, b"\0" * (count - offset))


# Largest message to a worker; code whose marshalled form is bigger is
# compiled by the worker itself from the file.
MAX_WORKER_MSG = 128 << 10


def compile_here(path, src):
    """The call's code object (source `src`, file name `path`), marshalled
    for the worker ("" if too big). Raises SyntaxError (and ValueError for
    NUL bytes, as SyntaxError)."""
    try:
        code_obj = compile(src, path, "exec", dont_inherit=True)
    except ValueError as e:
        raise SyntaxError(str(e)) from None
    except (RecursionError, MemoryError, OverflowError):
        return b""  # let the worker fail the same way, within its limits
    data = marshal.dumps(code_obj)
    return data if len(data) < MAX_WORKER_MSG - 4096 else b""


def read_line(fd, gone):
    """One line from a pipe whose writer sends the next line only after we
    act on this one (so nothing is read past it); SystemExit(gone) at EOF."""
    line = bytearray()
    while not line.endswith(b"\n"):
        b = os.read(fd, 4096)
        if not b:
            raise SystemExit(gone)
        line += b
    return bytes(line)


def read_report(rep):
    """The zygote's line about one worker: pid, wait status, user and
    system seconds, peak RSS (KiB), and whether the zygote has other
    children left (other_children_left)."""
    f = read_line(rep, "the zygote is gone").split()
    return int(f[0]), int(f[1]), float(f[2]), float(f[3]), int(f[4]), f[5] != b"0"


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
        w, compiled = marshal.loads(msg)
        become_call_process(w, w["scratch"], fds, w.get("python") is not None)
        if w.get("python") is not None:
            run_python_here(w["python"], w["scratch"], w["env"], compiled)
        os.execve(w["argv"][0], w["argv"], dict(BASE_ENV, **w["env"]))
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


def other_children_left(children_file):
    """In the zygote, once its worker is reaped: whether it still has a
    child, which can only be one a call made a sibling of its worker
    (clone with CLONE_PARENT). Read from /proc (`children_file`, opened
    once) rather than asked of waitpid, whose usual answer (no child at
    all) is an exception: objects on pages this process would copy after
    each fork."""
    return os.pread(children_file, 1, 0) != b""


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
    # Our children (a single-threaded process: the main thread's list).
    children = os.open("/proc/self/task/%d/children" % os.getpid(), os.O_RDONLY | os.O_CLOEXEC)
    fork, wait4, write, strays = os.fork, os.wait4, os.write, other_children_left
    while True:
        pid = fork()
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
            reap_orphans(None)


class Monitor:
    """The process the edge started. It reads the requests, prepares each
    call, has the zygote's pre-forked worker run it, watches it, answers
    and cleans up. It holds calls' data, but never forks after starting the
    zygote, so no call ever inherits its memory (and its own work copies no
    shared pages)."""

    def __init__(self):
        os.makedirs(BASE, mode=0o711, exist_ok=True)
        os.chmod(BASE, 0o711)
        self.sweep = writable_dirs()
        cmd_r, cmd_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        ctl_r, ctl_w = os.pipe()
        rep_r, rep_w = os.pipe()
        # Orphans of calls are reparented to us, and reaped here.
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        # The zygote is a fresh interpreter (this file with --zygote), not a
        # fork of this one: it then holds only its own few modules and the
        # preloaded ones, not the monitor's heap (the walk of the whole file
        # system above, json, shutil ...), so each of its forks is cheaper.
        zfds = [ctl_r, rep_w, cmd_r.fileno()]
        argv = [sys.executable, "-I", os.path.abspath(__file__), "--zygote"] + [str(fd) for fd in zfds]
        ruleset = landlock_ruleset()
        monitor = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                cmd_w.close()
                os.close(ctl_w)
                os.close(rep_r)
                for fd in zfds:
                    os.set_inheritable(fd, True)
                # The zygote must not outlive the monitor (kept across exec).
                prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
                if os.getppid() != monitor:
                    os._exit(1)  # the monitor died before the line above
                confine_zygote(ruleset)
                os.execv(argv[0], argv)
            finally:
                os._exit(127)
        if ruleset is not None:
            os.close(ruleset)
        cmd_r.close()
        os.close(ctl_r)
        os.close(rep_w)
        self.pid, self.zygote, self.cmd, self.ctl, self.rep = monitor, pid, cmd_w, ctl_w, rep_r
        self.watch = SweepWatch(self.sweep)
        self.loaded = [m for m in read_line(rep_r, "the zygote did not start").decode().strip().split(",") if m]

    def run_in_worker(self, req, scratch, argv, python, stdin, limits, source=None):
        """Runs one step in the pre-forked worker; returns (result, stdout fd,
        stderr fd) with the outputs left in their memfds."""
        compiled = b""
        if python is not None:
            try:
                compiled = compile_here(python, source)
            except SyntaxError as e:
                # What `python3 main.py` prints and returns; no worker needed.
                err = "".join(traceback.format_exception_only(type(e), e)).encode()
                result = outcome(256, 0.0, 0.0, 0, False, time.monotonic())
                return result, memfd("stdout"), memfd("stderr", err)
        fds = (memfd("stdin", stdin), memfd("stdout"), memfd("stderr"))
        # Output past the limit: one byte beyond it proves the overflow.
        limits = dict(limits, file_bytes=max(limits.get("file_bytes", 0), limits["output_bytes"] + 1))
        w = {"scratch": scratch, "argv": argv, "python": python, "env": req.get("env") or {}, "limits": limits}
        t0 = time.monotonic()
        # marshal, not JSON: the worker decodes it with fewer objects (and so
        # fewer copied pages). The zygote forked the worker that receives
        # it after the previous call (or is about to: the message waits in
        # the socket).
        socket.send_fds(self.cmd, [marshal.dumps((w, compiled))], list(fds))
        os.close(fds[0])
        timed_out = not select.select([self.rep], [], [], limits["time_ms"] / 1000.0)[0]
        if timed_out:
            kill_all_of_call_user()
        _, status, utime, stime, maxrss, strays = read_report(self.rep)
        result = outcome(status, utime, stime, maxrss, timed_out, t0)
        clean = only_zygote_left(self.pid, self.zygote, strays) or kill_call_processes(self.zygote)
        if strays:
            # Killed now: the zygote may reap them and fork the next worker.
            os.write(self.ctl, b"r")
        if not clean:
            result["unclean"] = True
        return result, fds[1], fds[2]

    def handle(self, req):
        """Serves one request; returns the answer and its raw parts."""
        op = req.get("op")
        if op == "ping":
            return {"ok": True}, []
        if op == "install":
            install_program(base64.b64decode(req["binary"]))
            return {"ok": True}, []
        lang = req.get("language")
        spec = LANGS.get(lang)
        if spec is None:
            return {"error": "unsupported language %r" % lang}, []
        if op not in ("run", "compile"):
            return {"error": "unknown op %r" % op}, []
        scratch = prepare_scratch()
        # Plain names the monitor created in scratch (remove_scratch).
        written = []
        try:
            write_files(scratch, req.get("files"))
            python, argv, source = None, None, None
            if op == "compile" or "compile" not in spec:
                src = os.path.join(scratch, spec["file"])
                source = req.get("code", "").encode()
                fd = os.open(src, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
                try:
                    os.fchown(fd, CALL_UID, CALL_GID)
                    view = memoryview(source)
                    while view:
                        view = view[os.write(fd, view):]
                finally:
                    os.close(fd)
                written.append(spec["file"])
            if op == "compile":
                argv = list(spec["compile"])
                argv[0] = which(argv[0]) or argv[0]
            elif "compile" in spec:
                argv = [PROG_DIR + "/prog"]
                if not os.path.exists(argv[0]):
                    return {"error": "no compiled program installed"}, []
            elif lang == "python":
                python = src
            else:
                argv = [which("bash") or "/bin/bash", spec["file"]]
            stdin = base64.b64decode(req.get("stdin") or "")
            result, out_fd, err_fd = self.run_in_worker(req, scratch, argv, python, stdin, req["limits"], source)
            parts, raw = [], []
            limit = req["limits"]["output_bytes"]
            for name, fd in (("stdout", out_fd), ("stderr", err_fd)):
                size = os.fstat(fd).st_size
                if size > limit:
                    result["output_exceeded"] = True
                parts.append((fd, min(size, limit)))
                raw.append([name, min(size, limit)])
            if op == "compile":
                prog = os.path.join(scratch, "prog")
                result["binary"] = None
                if result["exit_code"] == 0 and os.path.isfile(prog) and not os.path.islink(prog):
                    with open(prog, "rb") as f:
                        data = f.read()
                    install_program(data)
                    if len(data) <= req.get("max_binary_bytes", 0):
                        result["binary"] = base64.b64encode(data).decode()
            else:
                budget = MAX_FETCH_BYTES
                for name in req.get("fetch_files") or []:
                    rel = safe_rel(name)
                    if rel is None:
                        continue
                    try:
                        fd = open_beneath(scratch, rel)
                    except OSError:
                        continue
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode) or st.st_size > budget:
                        os.close(fd)
                        continue
                    budget -= st.st_size
                    parts.append((fd, st.st_size))
                    raw.append(["file:" + name, st.st_size])
            result["raw"] = raw
            return result, parts
        finally:
            if self.watch.changed() and not remove_owned(self.sweep):
                self.watch.give_up()
            if not remove_ipc():
                raise SystemExit("System V IPC objects of a call could not be removed")
            remove_scratch(scratch, written)

    def serve(self):
        write_line({"ready": True, "languages": available_langs(), "preloaded": self.loaded, "sweep": self.sweep})
        requests = RequestReader(0)
        while True:
            try:
                line = requests.next()
            except ValueError as e:
                write_line({"error": str(e), "fatal": True})
                return
            if line is None:
                return  # stdin closed: the edge is done with this runner
            req = None
            parts = []
            try:
                req = json.loads(line)
                resp, parts = self.handle(req)
            except SystemExit:
                raise
            except Exception as e:  # noqa: BLE001 - answer, never die silently
                resp = {"error": "%s: %s" % (type(e).__name__, e)}
                for fd, _ in parts:
                    os.close(fd)
                parts = []
            resp["id"] = req.get("id") if isinstance(req, dict) else None
            write_line(resp)
            for fd, n in parts:
                send_part(fd, n)
                os.close(fd)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--zygote"]:
        zygote_main(*(int(fd) for fd in sys.argv[2:5]))
    # The monitor's own modules (module globals, as if imported above).
    import base64
    import ctypes
    import json
    import select
    import shutil
    import socket
    import stat
    import time
    import traceback

    libc = ctypes.CDLL(None, use_errno=True)
    Monitor().serve()
