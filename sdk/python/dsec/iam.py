"""Projects, their quotas and scoped tokens: ``client.projects`` and
``client.tokens``.

Projects nest by path (``team-rl/exp-42``). A token belongs to one project
and holds one role there (``admin``, ``builder`` or ``solver``); it reaches
its project and every project below it, grants only what it holds and
never outlives its issuer. Answers are the API's JSON objects (dicts).
"""

from __future__ import annotations

from typing import Any

from ._http import Transport

#: The limits a quota may set (cpu in cores, memory and disk in MiB).
QUOTA_LIMITS = ("sandboxes", "cpu", "memory_mb", "disk_mb", "creations_per_s", "fncall_per_s")


def quota_body(quota: dict[str, Any] | None, overcommit: bool) -> dict[str, Any] | None:
    """A quota as the API takes it; unknown limits are refused here."""
    if quota is None:
        return None
    unknown = set(quota) - set(QUOTA_LIMITS)
    if unknown:
        raise ValueError(f"unknown quota limits {sorted(unknown)}: expected {QUOTA_LIMITS}")
    body = dict(quota)
    if overcommit:
        body["overcommit"] = True
    return body


def _path(project: str) -> str:
    return "/".join(Transport.quote(s) for s in project.split("/"))


class Projects:
    """``/v1/projects``: create, list, show, set quotas, delete."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    async def create(self, name: str, quota: dict[str, Any] | None = None, *,
                     overcommit: bool = False) -> dict[str, Any]:
        """Create project ``name`` (a path; its parent must exist) with an
        optional quota, e.g. ``{"sandboxes": 2000, "cpu": 500}``; at most
        the parent's free share unless ``overcommit``."""
        body = {"name": name, "quota": quota_body(quota, overcommit)}
        return await self._t.request("POST", self._t.url("/v1/projects"), json_body=body)

    async def list(self) -> list[dict[str, Any]]:
        """The projects this token reaches."""
        d = await self._t.request("GET", self._t.url("/v1/projects"))
        return list(d.get("projects", ()))

    async def show(self, name: str) -> dict[str, Any]:
        """A project with its use of each limit (``usage``)."""
        return await self._t.request("GET", self._t.url(f"/v1/projects/{_path(name)}"))

    async def set_quota(self, name: str, quota: dict[str, Any] | None, *,
                        overcommit: bool = False) -> dict[str, Any]:
        """Replace a project's quota (``None`` removes it)."""
        body = {"quota": quota_body(quota, overcommit)}
        return await self._t.request("PATCH", self._t.url(f"/v1/projects/{_path(name)}"),
                                     json_body=body)

    async def delete(self, name: str) -> None:
        """Delete a project without sub-projects or live sandboxes."""
        await self._t.request("DELETE", self._t.url(f"/v1/projects/{_path(name)}"))


class Tokens:
    """``/v1/tokens``: issue, list, revoke."""

    def __init__(self, transport: Transport) -> None:
        self._t = transport

    async def create(self, project: str, *, role: str | None = None,
                     ttl_s: int | None = None) -> dict[str, Any]:
        """Issue a token for ``project``; the answer's ``token`` is the
        secret, shown only this once."""
        body: dict[str, Any] = {"project": project}
        if role is not None:
            body["role"] = role
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        return await self._t.request("POST", self._t.url("/v1/tokens"), json_body=body)

    async def list(self) -> list[dict[str, Any]]:
        """The tokens this token may see (never their secrets)."""
        d = await self._t.request("GET", self._t.url("/v1/tokens"))
        return list(d.get("tokens", ()))

    async def revoke(self, token_id: str) -> None:
        """Revoke a token, and every token it issued."""
        await self._t.request("DELETE", self._t.url(f"/v1/tokens/{Transport.quote(token_id)}"))
