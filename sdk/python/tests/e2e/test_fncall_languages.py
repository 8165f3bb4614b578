"""FnCall's languages beyond Python, bash, C and C++, against the real
server and the `judge` image.

Java, JavaScript (Node.js) and Go: their runtimes reserve far more address
space than they use, so their memory limit is the runtime's own heap limit
plus a check of the run's peak (dsec-fncall-runner's langs.rs,
MemoryCap::Runtime), not RLIMIT_AS as for C, C++ and Python. Rust, PHP,
Ruby, Perl and Lua: RLIMIT_AS, as for C, and each one's own out-of-memory
report is MLE."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import dsec
from dsec import DSecClient, TestCase

from .conftest import Server, serve_dsec

pytestmark = pytest.mark.e2e

ADD_CASES = [TestCase("1 2", "3"), TestCase("10 20\n", "30\n")]


@pytest.fixture(scope="module")
def languages_server() -> Iterator[Server]:
    """Pools of these languages only, stopped with this module (a JVM
    runner holds its memory and core reservation while it idles)."""
    yield from serve_dsec(["--fncall-pools", "c=0:1,java=0:1,javascript=0:1,go=0:1,rust=0:1,php=0:1,ruby=0:1,perl=0:1,lua=0:1"])


async def fncall(srv: Server, language: str, code: str, **kw: object) -> dsec.FnCallResult:
    async with DSecClient(srv.url, srv.admin_token) as c:
        return await c.fncall(language, code, **kw)


JAVA_ADD = """import java.util.*;
// The file is named after the public class, whatever it is called.
public class Solution {
    static long depth(int n) { return n == 0 ? 0 : 1 + depth(n - 1); }
    public static void main(String[] args) {
        Scanner in = new Scanner(System.in);
        long a = in.nextLong(), b = in.nextLong();
        // Deep recursion, as judge solutions do: the main thread's stack is 64 MiB.
        System.out.println(a + b + depth(200_000) - 200_000);
    }
}
"""


async def test_java_verdicts_compile_cache_and_memory(languages_server: Server) -> None:
    srv = languages_server
    r = await fncall(srv, "java", JAVA_ADD, test_cases=ADD_CASES + [TestCase("2 2", "5")])
    assert [c.verdict for c in r.cases] == ["AC", "AC", "WA"], r
    assert r.compile is not None and r.compile.status == "ok", r
    again = await fncall(srv, "java", JAVA_ADD, test_cases=ADD_CASES)
    assert again.verdict == "AC" and again.compile_cached and again.compile is None, again
    # A class named Main without `public` is the entry point too.
    plain = await fncall(srv, "java", "class Main { public static void main(String[] a) { System.out.print(\"hi\"); } }")
    assert plain.ok and plain.stdout == "hi", plain
    # ... and one in a package, by its binary name.
    pkg = await fncall(srv, "java", "package judge.sol;\npublic class Solution { public static void main(String[] a) {"
                       " System.out.print(Solution.class.getName()); } }")
    assert pkg.ok and pkg.stdout == "judge.sol.Solution", pkg
    ce = await fncall(srv, "java", JAVA_ADD.replace("in.nextLong(),", "in.nextLong()"), test_cases=ADD_CASES)
    assert ce.verdict == "CE" and "error" in ce.compile.stderr, ce
    re_ = await fncall(srv, "java", "public class Main { public static void main(String[] a) { throw new IllegalStateException(\"boom\"); } }",
                       test_cases=[TestCase("", "")])
    assert re_.verdict == "RE" and "IllegalStateException: boom" in re_.cases[0].run.stderr, re_
    # The heap is capped at the call's limit (-Xmx): Java's own OutOfMemoryError.
    mle = await fncall(srv, "java", "public class Main { public static void main(String[] a) { long[] x = new long[100_000_000]; System.out.println(x.length); } }",
                       memory_limit_mb=64, test_cases=[TestCase("", "")])
    assert mle.verdict == "MLE" and "OutOfMemoryError" in mle.cases[0].run.stderr, mle
    spam = await fncall(srv, "java", 'public class Main { public static void main(String[] a) { while (true) System.out.println("spam"); } }',
                        time_limit=10, output_limit_bytes=4096, test_cases=[TestCase("", "")])
    assert spam.verdict == "OLE" and spam.cases[0].run.duration_ms < 5000, spam
    # No JVM of a call leaves a file behind (its perf data file is off), and
    # nothing of an earlier call is in /tmp.
    tmp = await fncall(srv, "java", "class Main { public static void main(String[] a) { System.out.print(String.join(\",\", new java.io.File(\"/tmp\").list())); } }")
    assert tmp.ok and tmp.stdout == "", tmp
    # The JVM starts within a 64 MiB limit: RLIMIT_AS would have stopped it.
    small = await fncall(srv, "java", JAVA_ADD, memory_limit_mb=64, stdin="4 5")
    assert small.ok and small.stdout == "9\n", small


async def test_javascript_stdin_errors_and_memory(languages_server: Server) -> None:
    srv = languages_server
    src = "const [a, b] = require('fs').readFileSync(0, 'utf8').trim().split(/\\s+/).map(Number);\nconsole.log(a + b);\n"
    r = await fncall(srv, "javascript", src, test_cases=ADD_CASES)
    assert r.verdict == "AC" and r.compile is None, r
    re_ = await fncall(srv, "javascript", "throw new Error('boom');", test_cases=[TestCase("", "")])
    assert re_.verdict == "RE" and "Error: boom" in re_.cases[0].run.stderr, re_
    # V8's heap is capped at the call's limit (--max-old-space-size).
    hog = "const a = []; for (;;) a.push(new Array(1e6).fill(1.5));"
    mle = await fncall(srv, "javascript", hog, memory_limit_mb=64, test_cases=[TestCase("", "")])
    assert mle.verdict == "MLE", mle
    # Node.js ignores SIGXFSZ, so its writes past the output limit fail and
    # it goes on: the monitor sees the output's size and ends it, long
    # before the time limit.
    spam = await fncall(srv, "javascript", "for (;;) console.log('spam');", time_limit=10, output_limit_bytes=4096,
                        test_cases=[TestCase("", "")])
    assert spam.verdict == "OLE" and spam.cases[0].run.duration_ms < 5000, spam
    after = await fncall(srv, "javascript", "console.log(process.version.startsWith('v'))")
    assert after.ok and after.stdout == "true\n", after


GO_ADD = """package main

import (
	"bufio"
	"fmt"
	"os"
)

func main() {
	in := bufio.NewReader(os.Stdin)
	var a, b int64
	fmt.Fscan(in, &a, &b)
	fmt.Println(a + b, os.Getenv("GOMEMLIMIT"))
}
"""


async def test_go_verdicts_and_a_peak_past_the_limit(languages_server: Server) -> None:
    srv = languages_server
    r = await fncall(srv, "go", GO_ADD, memory_limit_mb=128, stdin="2 40")
    # GOMEMLIMIT has the collector work harder as the heap nears the limit.
    assert r.ok and r.stdout == "42 128MiB\n" and r.compile is not None, r
    ce = await fncall(srv, "go", GO_ADD.replace("var a, b int64", "var a, b, unused int64"), test_cases=ADD_CASES)
    assert ce.verdict == "CE" and "unused" in ce.compile.stderr, ce
    # GOMEMLIMIT is soft: a program that keeps 200 MiB live goes past 64 MiB,
    # and its peak makes the verdict MLE though it exits 0.
    hog = "package main\nfunc main() {\n\tb := make([]byte, 200<<20)\n\tfor i := range b { b[i] = 1 }\n\tprintln(len(b))\n}\n"
    mle = await fncall(srv, "go", hog, memory_limit_mb=64, test_cases=[TestCase("", "")])
    assert mle.verdict == "MLE" and mle.cases[0].run.peak_memory_kb > 64 * 1024, mle
    spam = await fncall(srv, "go", 'package main\nimport "fmt"\nfunc main() { for { fmt.Println("spam") } }\n',
                        time_limit=10, output_limit_bytes=4096, test_cases=[TestCase("", "")])
    assert spam.verdict == "OLE" and spam.cases[0].run.duration_ms < 5000, spam
    ok = await fncall(srv, "go", GO_ADD, test_cases=[TestCase("1 2", "3 256MiB")])
    assert ok.verdict == "AC" and ok.compile_cached, ok


def test_sandboxfusion_client_runs_every_language_served(languages_server: Server) -> None:
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code, set_endpoint

    srv = languages_server
    set_endpoint(f"{srv.url}/sandboxfusion/{srv.admin_token}")
    java = run_code(RunCodeRequest(code=JAVA_ADD, stdin="2 3", language="java"))
    assert java.status == RunStatus.Success and java.run_result.stdout == "5\n", java
    assert java.compile_result is not None and java.compile_result.return_code == 0
    js = run_code(RunCodeRequest(code="console.log(require('fs').readFileSync(0, 'utf8').length)", stdin="abc",
                                 language="nodejs"))
    assert js.status == RunStatus.Success and js.run_result.stdout == "3\n", js
    go = run_code(RunCodeRequest(code=GO_ADD, stdin="7 8", language="go"))
    assert go.status == RunStatus.Success and go.run_result.stdout.startswith("15 "), go
    for language, src in ADD.items():
        # This checks the translation, not speed: rustc's first compile reads
        # its toolchain from a cold layer, which a busy host's disk can keep
        # past SandboxFusion's default 10 s.
        r = run_code(RunCodeRequest(code=src, stdin="20 22", language=language, compile_timeout=120))
        assert r.status == RunStatus.Success and r.run_result.stdout == "42\n", (language, r.compile_result, r)
        assert (r.compile_result is not None) == (language == "rust"), (language, r)


# a + b from stdin, in each language whose limit RLIMIT_AS holds.
ADD = {
    "rust": "use std::io::Read;\nfn main() {\n    let mut s = String::new();\n    std::io::stdin().read_to_string(&mut s).unwrap();\n"
            "    let v: Vec<i64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();\n    println!(\"{}\", v[0] + v[1]);\n}\n",
    "php": "<?php\n$v = array_map('intval', preg_split('/\\s+/', trim(stream_get_contents(STDIN))));\necho $v[0] + $v[1], \"\\n\";\n",
    "ruby": "a, b = STDIN.read.split.map(&:to_i)\nputs a + b\n",
    "perl": "my ($a, $b) = split ' ', do { local $/; <STDIN> };\nprint $a + $b, \"\\n\";\n",
    "lua": "local a, b = io.read('n', 'n')\nprint(a + b)\n",
}
# Each fails with "boom" on its stderr.
BOOM = {
    "rust": "fn main() { panic!(\"boom\"); }\n",
    "php": "<?php\nthrow new Exception('boom');\n",
    "ruby": "raise 'boom'\n",
    "perl": "die \"boom\\n\";\n",
    "lua": "error('boom')\n",
}
# Each asks for 400 MiB at once, past a 128 MiB limit.
HOG = {
    "rust": "fn main() { let v = vec![1u8; 400 << 20]; println!(\"{}\", v.len()); }\n",
    "php": "<?php\n$s = str_repeat('x', 400 << 20);\necho strlen($s), \"\\n\";\n",
    "ruby": "s = 'x' * (400 << 20)\nputs s.size\n",
    "perl": "my $s = 'x' x (400 << 20);\nprint length($s), \"\\n\";\n",
    "lua": "local s = string.rep('x', 400 << 20)\nprint(#s)\n",
}


@pytest.mark.parametrize("language", list(ADD))
async def test_rust_and_interpreters_verdicts_and_memory(languages_server: Server, language: str) -> None:
    srv = languages_server
    r = await fncall(srv, language, ADD[language], test_cases=ADD_CASES + [TestCase("2 2", "5")])
    assert [c.verdict for c in r.cases] == ["AC", "AC", "WA"], r
    # (The SandboxFusion test may have compiled the same source first.)
    assert (r.compile is not None or r.compile_cached) == (language == "rust"), r
    re_ = await fncall(srv, language, BOOM[language], test_cases=[TestCase("", "")])
    assert re_.verdict == "RE" and "boom" in re_.cases[0].run.stderr, re_
    # Rust, Perl and Lua: the allocation fails at RLIMIT_AS and each says
    # so. PHP and Ruby: no RLIMIT_AS (each maps 50-60 MiB before a
    # program's first line), the run's peak is past the limit.
    mle = await fncall(srv, language, HOG[language], memory_limit_mb=128, test_cases=[TestCase("", "")])
    assert mle.verdict == "MLE", mle
    if language in ("php", "ruby"):
        assert mle.cases[0].run.peak_memory_kb > 128 * 1024, mle
    # The runner is fine after it, and the program starts within a small
    # limit.
    after = await fncall(srv, language, ADD[language], memory_limit_mb=32, stdin="1 1")
    assert after.ok and after.stdout == "2\n", after
    if language == "rust":
        assert after.compile_cached, after
        ce = await fncall(srv, "rust", "fn main() { let x: i32 = \"s\"; }\n", test_cases=ADD_CASES)
        assert ce.verdict == "CE" and "mismatched types" in ce.compile.stderr, ce


# A call of a runner whose zygote is the agent's exec zygote (every language
# but Python) leaves a process made the zygote's child with
# clone(CLONE_PARENT), one in a session of its own, a System V shared
# memory segment and a file in /tmp; the next call of that runner finds
# none of them.
LEAVE_TRACES = r"""
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    int shm = shmget(IPC_PRIVATE, 4096, 01600);
    long sibling = syscall(SYS_clone, CLONE_PARENT | SIGCHLD, 0, 0, 0, 0);
    if (sibling == 0) { sleep(1000); _exit(0); }
    if (fork() == 0) { setsid(); sleep(1000); _exit(0); }
    FILE *f = fopen("/tmp/left", "w");
    printf("%d %d %d\n", shm >= 0, sibling > 0, f != NULL);
    return 0;
}
"""
FIND_TRACES = r"""
#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
int main(void) {
    int others = 0, shm = -1;
    char path[64], line[512];
    struct stat st;
    DIR *d = opendir("/proc");
    for (struct dirent *e; (e = readdir(d));) {
        if (!isdigit((unsigned char)e->d_name[0]) || atoi(e->d_name) == getpid()) continue;
        snprintf(path, sizeof path, "/proc/%s", e->d_name);
        if (stat(path, &st) == 0 && st.st_uid == getuid()) others++;
    }
    FILE *f = fopen("/proc/sysvipc/shm", "r");
    while (fgets(line, sizeof line, f)) shm++;
    printf("%d %d %d\n", others, shm, access("/tmp/left", F_OK) == 0);
    return 0;
}
"""


async def test_an_exec_zygote_runner_cleans_up_after_a_call(languages_server: Server) -> None:
    srv = languages_server
    first = await fncall(srv, "c", LEAVE_TRACES)
    assert first.ok and first.stdout == "1 1 1\n", first
    second = await fncall(srv, "c", FIND_TRACES)
    assert second.runner == first.runner, "one runner serves the pool"
    assert second.ok and second.stdout == "0 0 0\n", second

