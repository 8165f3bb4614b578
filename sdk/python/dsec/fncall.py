"""FnCall: stateless calls on warm, reusable runners (snippets, online judge).

Use :meth:`DSecClient.fncall` for one call and :meth:`DSecClient.fncall_batch`
for many in one request::

    r = await client.fncall("python", "print(input()[::-1])", stdin="abc")
    assert r.ok and r.stdout == "cba\\n"

    j = await client.fncall("cpp", SOURCE, test_cases=[TestCase("1 2", "3")])
    assert j.verdict == "AC"
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["TestCase", "StepResult", "CaseResult", "FnCallResult", "fncall_body"]


@dataclass(slots=True)
class TestCase:
    """One judge case: ``stdin`` and, optionally, the expected output.
    Without ``expected_output`` a case is accepted when the program exits 0."""

    __test__ = False  # not a pytest class

    stdin: str = ""
    expected_output: str | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"stdin": self.stdin}
        if self.expected_output is not None:
            d["expected_output"] = self.expected_output
        return d


@dataclass(slots=True)
class StepResult:
    """A compile or a run. ``status``: ``ok``, ``runtime_error``, ``timeout``,
    ``memory_limit`` or ``output_limit``."""

    status: str
    exit_code: int | None = None
    signal: int | None = None
    stdout: str = ""
    stderr: str = ""
    duration_ms: float = 0.0
    cpu_ms: float = 0.0
    peak_memory_kb: int = 0
    truncated: bool = False

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> StepResult | None:
        if d is None:
            return None
        return cls(status=d.get("status", ""), exit_code=d.get("exit_code"), signal=d.get("signal"),
                   stdout=d.get("stdout", ""), stderr=d.get("stderr", ""),
                   duration_ms=d.get("duration_ms", 0.0), cpu_ms=d.get("cpu_ms", 0.0),
                   peak_memory_kb=d.get("peak_memory_kb", 0), truncated=d.get("truncated", False))


@dataclass(slots=True)
class CaseResult:
    """A judge case: ``verdict`` is one of AC, WA, TLE, MLE, RE, CE, OLE, SKIPPED."""

    verdict: str
    run: StepResult | None = None
    checker_message: str | None = None


@dataclass(slots=True)
class FnCallResult:
    """What a call returns.

    Attributes:
        status: ``ok`` when every step exited 0 (and every case was accepted);
            else the first failure: ``compile_error``, ``runtime_error``,
            ``timeout``, ``memory_limit``, ``output_limit``, ``wrong_answer``.
        compile: the compile step (compiled languages; ``None`` on a cache hit).
        run: the run (plain calls).
        verdict: judge mode: AC, WA, TLE, MLE, RE, CE or OLE.
        cases: judge mode: one :class:`CaseResult` per test case.
        files: fetched files, path -> bytes.
    """

    status: str
    compile: StepResult | None = None
    run: StepResult | None = None
    verdict: str | None = None
    cases: list[CaseResult] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    compile_cached: bool = False
    runner: str = ""
    queued_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def stdout(self) -> str:
        """The run's standard output ("" in judge mode)."""
        return self.run.stdout if self.run else ""

    @property
    def stderr(self) -> str:
        return self.run.stderr if self.run else ""

    @property
    def exit_code(self) -> int | None:
        return self.run.exit_code if self.run else None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> FnCallResult:
        return cls(
            status=d.get("status", ""),
            compile=StepResult.from_json(d.get("compile")),
            run=StepResult.from_json(d.get("run")),
            verdict=d.get("verdict"),
            cases=[CaseResult(verdict=c.get("verdict", ""), run=StepResult.from_json(c.get("run")),
                              checker_message=c.get("checker_message"))
                   for c in d.get("cases", ())],
            files={k: base64.b64decode(v) for k, v in (d.get("files") or {}).items()},
            compile_cached=d.get("compile_cached", False),
            runner=d.get("runner", ""),
            queued_ms=d.get("queued_ms", 0.0),
        )


def fncall_body(language: str, code: str, *, stdin: str | None = None,
                files: Mapping[str, bytes | str] | None = None,
                fetch_files: Sequence[str] = (), env: Mapping[str, str] | None = None,
                time_limit: float | None = None, memory_limit_mb: int | None = None,
                output_limit_bytes: int | None = None, compile_time_limit: float | None = None,
                test_cases: Sequence[TestCase | Mapping[str, Any]] = (),
                compare: str | None = None, float_tolerance: float | None = None,
                checker: tuple[str, str] | None = None,
                stop_on_first_failure: bool | None = None) -> dict[str, Any]:
    """The JSON body of ``POST /v1/fncall`` (see :meth:`DSecClient.fncall`)."""
    body: dict[str, Any] = {"language": language, "code": code}
    if stdin is not None:
        body["stdin"] = stdin
    if files:
        body["files"] = {k: base64.b64encode(v.encode() if isinstance(v, str) else v).decode()
                         for k, v in files.items()}
    if fetch_files:
        body["fetch_files"] = list(fetch_files)
    if env:
        body["env"] = dict(env)
    limits = {k: v for k, v in (("time", time_limit), ("memory_mb", memory_limit_mb),
                                ("output_bytes", output_limit_bytes),
                                ("compile_time", compile_time_limit)) if v is not None}
    if limits:
        body["limits"] = limits
    if test_cases:
        body["test_cases"] = [c.to_json() if isinstance(c, TestCase) else dict(c) for c in test_cases]
    if compare is not None:
        body["compare"] = compare
    if float_tolerance is not None:
        body["float_tolerance"] = float_tolerance
    if checker is not None:
        body["checker"] = {"language": checker[0], "code": checker[1]}
    if stop_on_first_failure is not None:
        body["stop_on_first_failure"] = stop_on_first_failure
    return body
