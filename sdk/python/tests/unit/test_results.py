"""Parsing of API records."""

from __future__ import annotations

from dsec import ExecResult, FileInfo, Health, OutputChunk, SandboxInfo


def test_exec_result() -> None:
    r = ExecResult.from_json({
        "exit_code": 0, "signal": None, "stdout": "hello world\n", "stderr": "",
        "encoding": "utf8", "duration_ms": 1.25, "truncated": False, "timed_out": False,
    })
    assert r == ExecResult(0, "hello world\n", "", 1.25, False, False, None)
    assert r.ok


def test_exec_result_killed() -> None:
    r = ExecResult.from_json({"exit_code": 137, "signal": 9, "stdout": "", "stderr": "",
                              "encoding": "utf8", "duration_ms": 5000.0, "truncated": True,
                              "timed_out": True})
    assert (r.exit_code, r.signal, r.truncated, r.timed_out) == (137, 9, True, True)
    assert not r.ok


def test_exec_result_base64_and_extra_fields() -> None:
    r = ExecResult.from_json({"exit_code": 1, "stdout": "aGk=", "stderr": "",
                              "encoding": "base64", "duration_ms": 1, "truncated": False,
                              "timed_out": False, "new_field": 1, "type": "exit"})
    assert r.stdout == "hi"
    assert r.exit_code == 1
    assert r.signal is None


def test_exec_result_missing_fields() -> None:
    r = ExecResult.from_json({"exit_code": 2})
    assert (r.stdout, r.stderr, r.truncated, r.timed_out) == ("", "", False, False)


def test_sandbox_info_tolerant() -> None:
    info = SandboxInfo.from_json({"id": "sb-1", "state": "running", "future": {"x": 1},
                                  "limits": {"memory_limit_mb": 1024, "cpu_cores_limit": 1.0,
                                             "disk_limit_mb": 10, "pids_limit": 5}})
    assert info.id == "sb-1"
    assert info.is_running and not info.is_terminal
    assert info.limits.memory_limit_mb == 1024
    assert info.raw["future"] == {"x": 1}
    assert info.labels == {} and info.toolkits == []


def test_file_info() -> None:
    fi = FileInfo.from_json({"name": "a", "path": "/a", "type": "dir", "size": 0, "mode": 493,
                             "uid": 0, "gid": 0, "mtime": 5, "link_target": None})
    assert fi.is_dir and not fi.is_file and not fi.is_symlink
    assert fi.mode == 0o755


def test_output_chunk_text() -> None:
    assert OutputChunk("stdout", "é".encode()).text == "é"
    assert OutputChunk("stdout", b"\xff").text == "\ufffd"


def test_health() -> None:
    h = Health.from_json({"status": "ok", "version": "1",
                          "nodes": [{"name": "n", "healthy": True}]})
    assert h.nodes[0].healthy
