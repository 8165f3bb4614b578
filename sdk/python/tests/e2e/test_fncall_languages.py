"""FnCall's managed-runtime languages against the real server and the
`judge` image: Java, JavaScript (Node.js) and Go. Their runtimes reserve far
more address space than they use, so their memory limit is the runtime's
own heap limit plus a check of the run's peak (the agent's fncall/langs.rs,
MemoryCap::Runtime), not RLIMIT_AS as for C, C++ and Python."""

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
    yield from serve_dsec(["--fncall-pools", "java=0:1,javascript=0:1,go=0:1"])


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


def test_sandboxfusion_client_runs_java_nodejs_and_go(languages_server: Server) -> None:
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
