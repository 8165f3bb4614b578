"""The blocking wrapper (``dsec.sync``) has the asyncio API's calls, with the
same parameters, and nothing else.

Each class of ``dsec.sync`` mirrors one asyncio class. For every pair, the
public members (methods, properties, instance attributes, and the context
manager and iterator protocols) must exist on both sides, and each method
must take the same parameters: the same names, kinds, defaults and
annotations. Annotations are compared after translating the asyncio side into
its blocking equivalent (an asyncio class into its twin, an awaitable
:class:`~dsec.streams.Opening` into what it opens, an async iterator into an
iterator). What differs by nature is listed in ``SYNC_ONLY`` and
``PROTOCOLS``, each with its reason.
"""

from __future__ import annotations

import ast
import collections.abc as cabc
import inspect
import textwrap
import types
import typing
from typing import Any

import pytest

import dsec.client
import dsec.sandbox
import dsec.streams
import dsec.sync

#: asyncio class -> its blocking twin.
TWINS: dict[type, type] = {
    dsec.client.DSecClient: dsec.sync.DSecClient,
    dsec.sandbox.Sandbox: dsec.sync.Sandbox,
    dsec.sandbox.Session: dsec.sync.Session,
    dsec.streams.ExecStream: dsec.sync.ExecStream,
    dsec.streams.Pty: dsec.sync.Pty,
}

#: The asyncio protocol method -> the blocking one that stands for it.
PROTOCOLS = {
    "__aenter__": "__enter__",  # `async with` / `with`
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",  # `async for` / `for`
    "__anext__": "__next__",
}

#: Members only the blocking classes have, and why.
SYNC_ONLY: dict[str, str] = {
    "aio": "the asyncio object doing the work, for code that mixes both APIs",
    "loop": "the client's private event loop, which the asyncio client does not need",
}


def public_members(cls: type) -> dict[str, str]:
    """Public name -> ``method``, ``property`` or ``attribute``, for the
    members the class defines itself or sets in ``__init__``."""
    out: dict[str, str] = {}
    for name, value in vars(cls).items():
        if name.startswith("_") and name not in PROTOCOLS and name not in PROTOCOLS.values():
            continue
        if isinstance(value, property):
            out[name] = "property"
        elif isinstance(value, staticmethod | classmethod) or inspect.isfunction(value):
            out[name] = "method"
    for name in init_attributes(cls):
        out.setdefault(name, "attribute")
    return out


def init_attributes(cls: type) -> dict[str, ast.expr | None]:
    """The public ``self.NAME = ...`` of ``__init__``, with their annotations."""
    init = vars(cls).get("__init__")
    if init is None:
        return {}
    tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
    attrs: dict[str, ast.expr | None] = {}
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        annotation = None
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets, annotation = [node.target], node.annotation
        for t in targets:
            if (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                    and t.value.id == "self" and not t.attr.startswith("_")):
                attrs[t.attr] = annotation or attrs.get(t.attr)
    return attrs


def hints(cls: type, func: Any) -> dict[str, Any]:
    """The evaluated annotations of ``func``, defined in ``cls``."""
    module = inspect.getmodule(cls)
    # `dsec.sandbox` imports the client only for type checking.
    local = {"DSecClient": dsec.client.DSecClient} if module is dsec.sandbox else {}
    return typing.get_type_hints(func, localns=local)


def attribute_type(cls: type, name: str) -> Any:
    member = vars(cls).get(name)
    if isinstance(member, property):
        return hints(cls, member.fget).get("return")
    annotation = init_attributes(cls).get(name)
    if annotation is None:
        return None
    module = vars(inspect.getmodule(cls))
    return eval(ast.unparse(annotation), dict(module))  # noqa: S307 (our own source)


def shape(tp: Any, blocking: bool) -> Any:
    """A comparable form of a type; with ``blocking``, of its blocking
    equivalent."""
    if isinstance(tp, list):  # the parameter list of a Callable
        return tuple(shape(a, blocking) for a in tp)
    if blocking and tp in TWINS:
        tp = TWINS[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return ("union", frozenset(shape(a, blocking) for a in args))
    if origin is None:
        return tp
    if blocking and origin is dsec.streams.Opening:
        return shape(args[0], blocking)
    if blocking and origin in (cabc.AsyncIterator, cabc.AsyncGenerator):
        return (cabc.Iterator, (shape(args[0], blocking),))
    return (origin, tuple(shape(a, blocking) for a in args))


def signature_shape(cls: type, func: Any, blocking: bool) -> list[tuple[Any, ...]]:
    """Each parameter's name, kind, default and annotation, then the return
    annotation; of the blocking equivalent with ``blocking``."""
    sig = inspect.signature(func)
    h = hints(cls, func)
    params = [(p.name, p.kind, p.default, shape(h.get(p.name, p.annotation), blocking))
              for p in sig.parameters.values()]
    return [*params, ("->", shape(h.get("return"), blocking))]


def mirrored_name(name: str) -> str:
    return PROTOCOLS.get(name, name)


def member_pairs() -> list[Any]:
    return [pytest.param(acls, scls, name, mirrored_name(name), id=f"{acls.__name__}.{name}")
            for acls, scls in TWINS.items() for name in public_members(acls)]


def test_every_blocking_class_has_its_asyncio_twin() -> None:
    defined = {obj for obj in vars(dsec.sync).values()
               if isinstance(obj, type) and obj.__module__ == dsec.sync.__name__
               and not obj.__name__.startswith("_")}
    assert defined == set(TWINS.values())
    assert {cls.__name__ for cls in defined} <= set(dsec.sync.__all__)


def test_the_exemptions_are_used() -> None:
    for name in SYNC_ONLY:
        assert any(name in public_members(scls) for scls in TWINS.values()), name
        assert not any(name in public_members(acls) for acls in TWINS), name
    for aname, sname in PROTOCOLS.items():
        assert any(aname in public_members(acls) for acls in TWINS), aname
        assert any(sname in public_members(scls) for scls in TWINS.values()), sname


@pytest.mark.parametrize("acls,scls", TWINS.items(), ids=lambda c: c.__name__)
def test_same_members(acls: type, scls: type) -> None:
    want = {mirrored_name(n): kind for n, kind in public_members(acls).items()}
    have = {n: kind for n, kind in public_members(scls).items() if n not in SYNC_ONLY}
    assert sorted(set(want) - set(have)) == [], f"missing from dsec.sync.{scls.__name__}"
    assert sorted(set(have) - set(want)) == [], f"only in dsec.sync.{scls.__name__}"
    # A method stays a method; data may be an attribute on one side and a
    # read-only property on the other.
    methods = {n for n, kind in want.items() if kind == "method"}
    assert methods == {n for n, kind in have.items() if kind == "method"}


@pytest.mark.parametrize("acls,scls,aname,sname", member_pairs())
def test_same_signature(acls: type, scls: type, aname: str, sname: str) -> None:
    skind = public_members(scls).get(sname)
    if skind is None:
        pytest.fail(f"dsec.sync.{scls.__name__}.{sname} is missing")
    if public_members(acls)[aname] == "method":
        want = signature_shape(acls, vars(acls)[aname], True)
        have = signature_shape(scls, vars(scls)[sname], False)
        assert have == want, f"dsec.sync.{scls.__name__}.{sname}: {explain(have, want)}"
    else:
        atype, stype = attribute_type(acls, aname), attribute_type(scls, sname)
        if atype is not None and stype is not None:
            assert shape(stype, False) == shape(atype, True), f"{scls.__name__}.{sname}"


def explain(have: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> str:
    """The first differing parameter, readably."""
    for i in range(max(len(have), len(want))):
        h = have[i] if i < len(have) else None
        w = want[i] if i < len(want) else None
        if h != w:
            return f"parameter {i}: has {h}, the asyncio method has {w}"
    return "same"


@pytest.mark.parametrize("scls", TWINS.values(), ids=lambda c: c.__name__)
def test_blocking_methods_do_not_return_awaitables(scls: type) -> None:
    for name, member in vars(scls).items():
        if inspect.isfunction(member):
            assert not inspect.iscoroutinefunction(member), name
            assert not inspect.isasyncgenfunction(member), name


def test_the_comparison_sees_a_difference() -> None:
    # The checks above must notice what they are meant to: a missing keyword,
    # another default, another annotation, an async iterator kept as is.
    class Async:
        async def f(self, a: int, *, step_id: str | None = None) -> dsec.sandbox.Sandbox: ...

        async def g(self) -> cabc.AsyncIterator[int]:
            yield 1

    class Sync:
        def f(self, a: int) -> dsec.sync.Sandbox: ...

        def g(self) -> cabc.Iterator[int]: ...

    class SyncDefault:
        def f(self, a: int, *, step_id: str | None = "x") -> dsec.sync.Sandbox: ...

    class SyncAnnotation:
        def f(self, a: int, *, step_id: str | None = None) -> dsec.sandbox.Sandbox: ...

    def same(acls: type, scls: type, name: str) -> bool:
        return (signature_shape(scls, vars(scls)[name], False)
                == signature_shape(acls, vars(Async)[name], True))

    assert same(Async, Sync, "g")
    assert not same(Async, Sync, "f")
    assert not same(Async, SyncDefault, "f")
    assert not same(Async, SyncAnnotation, "f")
