"""Error bodies map to the exception class of their code."""

from __future__ import annotations

import json
import pickle
from importlib import resources

import pytest

import dsec
from dsec import errors
from dsec.errors import (
    DSecConnectionError,
    DSecError,
    DSecTimeoutError,
    EdgeUnavailable,
    ImageNotFound,
    InvalidRequest,
    NoCapacity,
    SandboxNotFound,
    Timeout,
    error_class,
    error_from_body,
    error_from_detail,
)


def table() -> list[dict[str, object]]:
    text = resources.files("dsec").joinpath("error_codes.json").read_text("utf-8")
    return json.loads(text)  # type: ignore[no-any-return]


def body(code: str, message: str = "msg") -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode()


def test_every_code_has_its_class() -> None:
    for row in table():
        code = str(row["code"])
        cls = error_class(code)
        assert cls is not DSecError, code
        assert cls.code == code
        assert cls.http_status == row["http_status"]
        assert cls.__name__ == "".join(p.capitalize() for p in code.split("_"))
        assert getattr(dsec, cls.__name__) is cls
        assert getattr(errors, cls.__name__) is cls


def test_every_code_is_declared_explicitly() -> None:
    # A new code in the table still works (its class is generated), but should
    # be declared in errors.py so IDEs and type checkers see it.
    explicit = {c.code for c in DSecError.__subclasses__() if c.__module__ == "dsec.errors"}
    assert {row["code"] for row in table()} <= explicit


@pytest.mark.parametrize("row", table(), ids=lambda r: str(r["code"]))
def test_body_maps_to_class(row: dict[str, object]) -> None:
    code, status = str(row["code"]), int(row["http_status"])  # type: ignore[call-overload]
    e = error_from_body(status, body(code, "why"))
    assert type(e) is error_class(code)
    assert (e.code, e.message, e.status) == (code, "why", status)
    assert isinstance(e, DSecError)


def test_examples() -> None:
    assert isinstance(error_from_body(404, body("sandbox_not_found")), SandboxNotFound)
    assert isinstance(error_from_body(404, body("image_not_found")), ImageNotFound)
    assert isinstance(error_from_body(400, body("invalid_request")), InvalidRequest)


def test_unknown_code_maps_to_base_class() -> None:
    e = error_from_body(418, body("teapot_overflow", "new"))
    assert type(e) is DSecError
    assert e.code == "teapot_overflow"
    assert e.status == 418


def test_non_json_body_maps_by_status() -> None:
    e = error_from_body(401, b"<html>nope</html>")
    assert type(e) is dsec.Unauthorized
    assert "nope" in e.message
    e = error_from_body(502, b"")
    assert type(e) is DSecError
    assert e.code == "http_502"
    assert type(error_from_body(504, b"gateway timeout")) is Timeout


def test_malformed_error_object() -> None:
    e = error_from_body(400, b'{"error": {"message": 5}}')
    assert type(e) is InvalidRequest
    assert e.message == "5"
    e = error_from_body(500, b'{"unexpected": true}')
    assert type(e) is dsec.Internal


def test_retry_after() -> None:
    e = error_from_body(503, body("no_capacity"), {"Retry-After": "2.5"})
    assert isinstance(e, NoCapacity)
    assert e.retry_after == 2.5
    e = error_from_body(503, body("no_capacity"), {"Retry-After": "Wed, 21 Oct 2015"})
    assert e.retry_after is None


def test_error_from_detail() -> None:
    e = error_from_detail({"code": "spawn_failed", "message": "no such file"})
    assert isinstance(e, dsec.SpawnFailed)
    assert e.status is None


def test_str_and_repr() -> None:
    e = SandboxNotFound("sandbox_not_found", "no sandbox sb-1", 404)
    assert str(e) == "sandbox_not_found: no sandbox sb-1 (HTTP 404)"
    assert "SandboxNotFound" in repr(e)


@pytest.mark.parametrize("e", [
    SandboxNotFound("sandbox_not_found", "gone", 404, 1.0),
    DSecError("from_the_future", "x", 499),
    DSecConnectionError("edge_unavailable", "refused"),
    DSecTimeoutError("timeout", "slow"),
])
def test_pickle_round_trip(e: DSecError) -> None:
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is type(e)
    assert (back.code, back.message, back.status, back.retry_after) == (
        e.code, e.message, e.status, e.retry_after)


def test_client_side_errors() -> None:
    c = DSecConnectionError("edge_unavailable", "refused")
    assert isinstance(c, EdgeUnavailable)
    assert isinstance(c, ConnectionError)
    assert dsec.ConnectionError is DSecConnectionError
    t = DSecTimeoutError("timeout", "slow")
    assert isinstance(t, Timeout)
    assert isinstance(t, TimeoutError)


def test_star_import_does_not_shadow_builtins() -> None:
    ns: dict[str, object] = {}
    exec("from dsec import *", ns)
    assert "ConnectionError" not in ns
    assert "TimeoutError" not in ns
    assert "SandboxNotFound" in ns
