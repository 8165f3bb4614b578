"""The API's OpenAPI document as a checker of the fake server's traffic.

``dsec/openapi.json`` is generated from the Rust server (dsec-apiserver's
handlers and wire types; a Rust test keeps the copy current). The unit
tests' fake server hands every request it gets and every answer it gives to
a :class:`Contract`, which notes what the document does not allow: a route or
method it lacks, a query parameter it does not declare, a status it does not
list for the route, a content type other than the declared one, and a JSON
body (request, answer, or WebSocket message) that its schema rejects. The
schemas are checked with ``jsonschema`` (JSON Schema 2020-12, the dialect of
OpenAPI 3.1), their ``$ref`` s resolved inside the document.

A test that makes the fake go beyond the document on purpose (a newer
server's error code, a request below the SDK) says so with
:meth:`Contract.beyond`, and why.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import jsonschema
from referencing import Registry
from referencing.jsonschema import DRAFT202012

_URI = "urn:dsec:openapi"

#: Routes of the fake that are not routes of the API, and why.
NOT_API_ROUTES: dict[str, str] = {
    "/v1/proxy-page": "stands for an HTML error page of a proxy in front of the API",
}


def load_document() -> dict[str, Any]:
    text = resources.files("dsec").joinpath("openapi.json").read_text("utf-8")
    return json.loads(text)  # type: ignore[no-any-return]


def _escape(segment: str) -> str:
    """One JSON-pointer segment (RFC 6901)."""
    return segment.replace("~", "~0").replace("/", "~1")


def _pointer(*segments: str) -> str:
    return "#/" + "/".join(_escape(s) for s in segments)


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


@dataclass
class Contract:
    """Checks exchanges against the document; collects what it finds."""

    document: dict[str, Any] = field(default_factory=load_document)
    #: What the document does not allow, one line each.
    problems: list[str] = field(default_factory=list)
    #: (method, route) of every request checked, and (method, route,
    #: status) of every answer.
    requested: set[tuple[str, str]] = field(default_factory=set)
    seen: set[tuple[str, str, int]] = field(default_factory=set)
    #: What broke the document inside a :meth:`beyond` block.
    expected: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        resource = DRAFT202012.create_resource(self.document)
        self._registry: Registry[Any] = Registry().with_resource(_URI, resource)
        self._validators: dict[str, jsonschema.Draft202012Validator] = {}
        self._lock = threading.Lock()
        self._beyond: str | None = None
        # A template's parameters match one path segment each.
        self._templates = [(re.compile("^" + re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(t))
                                       + "$"), t) for t in self.document["paths"]]

    # --- the document ----------------------------------------------------------------

    def operation(self, method: str, route: str) -> dict[str, Any] | None:
        return self.document["paths"].get(route, {}).get(method.lower())  # type: ignore[no-any-return]

    def route_of(self, path: str) -> str | None:
        """The document's route template that matches a concrete path."""
        for pattern, template in self._templates:
            if pattern.match(path):
                return template
        return None

    def schema_errors(self, pointer: str, instance: Any) -> list[str]:
        """Why ``instance`` does not validate against the schema at
        ``pointer`` (a JSON pointer into the document)."""
        validator = self._validators.get(pointer)
        if validator is None:
            validator = jsonschema.Draft202012Validator({"$ref": _URI + pointer},
                                                        registry=self._registry)
            self._validators[pointer] = validator
        return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(instance)]

    def component(self, name: str) -> str:
        """The pointer to a schema of ``components.schemas``."""
        if name not in self.document["components"]["schemas"]:
            raise KeyError(f"the document has no schema {name}")
        return _pointer("components", "schemas", name)

    # --- checks ------------------------------------------------------------------------

    def _note(self, where: str, problems: list[str]) -> None:
        with self._lock:
            into = self.problems if self._beyond is None else self.expected
            into.extend(f"{where}: {p}" for p in problems)

    @contextmanager
    def beyond(self, reason: str) -> Iterator[None]:
        """Within the block the traffic breaks the document on purpose
        (``reason`` says why): what it breaks goes to :attr:`expected`, and
        something must."""
        before = len(self.expected)
        self._beyond = reason
        try:
            yield
        finally:
            self._beyond = None
            assert len(self.expected) > before, f"nothing went beyond the document: {reason}"

    def check_request(self, method: str, path: str, route: str | None, query: list[str],
                      content_type: str | None, body: bytes | None) -> None:
        """A request: its route and method, query parameter names, and body.
        ``route`` is the fake's template for the path (``None``: the fake
        serves no such route)."""
        where = f"{method} {path}"
        route = route if route is not None else self.route_of(path)
        if route in NOT_API_ROUTES:
            return
        op = None if route is None else self.operation(method, route)
        if route is None or op is None:
            self._note(where, ["the document has no such route and method"])
            return
        with self._lock:
            self.requested.add((method, route))
        problems = []
        declared = {p["name"] for p in op.get("parameters", ()) if p["in"] == "query"}
        problems += [f"query parameter {k!r} is not declared" for k in query if k not in declared]
        media = _media_type(content_type)
        if body:
            content = op.get("requestBody", {}).get("content", {})
            if media not in content:
                problems.append(f"a {media or 'typeless'} body; the document takes "
                                f"{sorted(content) or 'none'}")
            elif media == "application/json":
                pointer = _pointer("paths", route, method.lower(), "requestBody", "content",
                                   media, "schema")
                problems += self.schema_errors(pointer, json.loads(body))
        elif op.get("requestBody", {}).get("required"):
            problems.append("no body; the document requires one")
        self._note(where, problems)

    def check_response(self, method: str, route: str, status: int, content_type: str | None,
                       body: bytes | None) -> None:
        """An answer: its status is listed for the route, and its body has the
        declared type and validates against the declared schema."""
        if route in NOT_API_ROUTES:
            return
        where = f"{method} {route} -> {status}"
        op = self.operation(method, route)
        if op is None:
            return  # noted by check_request
        with self._lock:
            self.seen.add((method, route, status))
        responses = op.get("responses", {})
        key = next((k for k in (str(status), f"{status // 100}XX", "default") if k in responses),
                   None)
        if key is None:
            self._note(where, [f"status not declared (declared: {sorted(responses)})"])
            return
        content = responses[key].get("content", {})
        media = _media_type(content_type)
        if not content:
            if body:
                self._note(where, [f"a {media} body where the document declares none"])
            return
        if media not in content:
            self._note(where, [f"content type {media!r}; the document declares {sorted(content)}"])
            return
        if media == "application/json":
            pointer = _pointer("paths", route, method.lower(), "responses", key, "content", media,
                               "schema")
            self._note(where, self.schema_errors(pointer, json.loads(body or b"null")))

    def check_message(self, where: str, schema: str, message: Any) -> None:
        """A JSON message of a WebSocket against ``components.schemas[schema]``."""
        self._note(where, self.schema_errors(self.component(schema), message))
