"""The error classes follow the shipped JSON table, also when it changes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import dsec

PACKAGE = Path(dsec.__file__).resolve().parent


def run_with_table(tmp_path: Path, edit: object, code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` against a copy of the package whose table was changed by `edit`."""
    copy = tmp_path / "dsec"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    table_path = copy / "error_codes.json"
    rows = json.loads(table_path.read_text())
    rows = edit(rows)  # type: ignore[operator]
    table_path.write_text(json.dumps(rows))
    return subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": str(tmp_path)})


def test_new_code_gets_a_generated_class(tmp_path: Path) -> None:
    def add(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        return rows + [{"code": "budget_spent", "http_status": 429,
                        "description": "The budget is spent."}]

    code = """
import dsec
from dsec import BudgetSpent
from dsec.errors import error_from_body
assert dsec.__file__.startswith(ROOT), dsec.__file__
e = error_from_body(429, b'{"error": {"code": "budget_spent", "message": "m"}}')
assert type(e) is BudgetSpent and e.http_status == 429, type(e)
assert BudgetSpent.__doc__ == "The budget is spent."
assert "BudgetSpent" in dsec.__all__ and "BudgetSpent" in dsec.errors.__all__
print("ok")
""".replace("ROOT", repr(str(tmp_path)))
    r = run_with_table(tmp_path, add, code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_explicit_class_missing_from_table_fails_import(tmp_path: Path) -> None:
    def drop(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        return [r for r in rows if r["code"] != "no_space"]

    r = run_with_table(tmp_path, drop, "import dsec")
    assert r.returncode != 0
    assert "NoSpace" in r.stderr and "error_codes.json" in r.stderr


def test_status_comes_from_the_table(tmp_path: Path) -> None:
    def restatus(rows: list[dict[str, object]]) -> list[dict[str, object]]:
        for r in rows:
            if r["code"] == "timeout":
                r["http_status"] = 408
        return rows

    r = run_with_table(tmp_path, restatus, "import dsec; print(dsec.Timeout.http_status)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "408"
