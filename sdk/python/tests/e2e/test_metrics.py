"""``GET /metrics`` against a real ``dsec up``: the Prometheus text format,
with the sandboxes held by state and backend and counters that move with
the operations a tenant runs; only the admin may read it."""

from __future__ import annotations

import asyncio
import re
import urllib.error
import urllib.request

from dsec import DSecClient

from .conftest import Server, Tenant, run_args


def scrape(server: Server, token: str) -> tuple[int, str, str]:
    req = urllib.request.Request(server.url + "/metrics", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers.get("content-type", ""), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, "", e.read().decode()


def samples(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of one metric's samples."""
    out = {}
    for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


def total(text: str, name: str, kind: str | None = None) -> float:
    """The sum of a metric's samples (those of one ``kind`` label if given)."""
    return sum(v for k, v in samples(text, name).items() if kind is None or f'kind="{kind}"' in k)


async def test_metrics_count_sandboxes_and_operations(server: Server, tenant: Tenant) -> None:
    status, ctype, before = scrape(server, server.admin_token)
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4"), (status, ctype)
    # Every sample belongs to a declared family.
    for line in before.splitlines():
        if line and not line.startswith("#"):
            family = re.sub(r"_(bucket|sum|count)$", "", line.split("{")[0].split(" ")[0])
            assert f"# TYPE {family} " in before, line

    async with DSecClient(server.url, tenant.token) as c:
        sb = await c.run_container(run_args("busybox", memory_limit_mb=64, cpu_cores_limit=0.2), timeout=120)
        try:
            await sb.run_shell("true")
            await sb.run_shell("true")
            # Two refused attempts of different kinds: a masked path opened
            # and a refused system call (busybox's unshare).
            await sb.run_shell("cat /proc/kpagecgroup; unshare -m true; true")
            # Agents report their tallies a moment after a burst of events.
            for _ in range(50):
                _, _, during = scrape(server, server.admin_token)
                if all(total(during, "dsec_audit_events_total", k) > total(before, "dsec_audit_events_total", k)
                       for k in ("masked_path", "syscall")):
                    break
                await asyncio.sleep(0.1)
            running = [v for k, v in samples(during, "dsec_sandboxes").items()
                       if 'state="running"' in k and 'backend="container"' in k]
            assert running and running[0] >= 1, during
        finally:
            await sb.delete()
    _, _, after = scrape(server, server.admin_token)
    for name, grew in [("dsec_sandbox_creations_total", 1), ("dsec_execs_total", 2),
                       ("dsec_trajectory_steps_total", 2), ("dsec_sandbox_create_seconds_count", 1)]:
        assert total(after, name) >= total(before, name) + grew, name
    audit = {kind: total(after, "dsec_audit_events_total", kind) - total(before, "dsec_audit_events_total", kind)
             for kind in ("masked_path", "syscall")}
    assert audit["masked_path"] >= 1 and audit["syscall"] >= 1, (audit, after)
    assert total(after, "dsec_node_healthy") >= 1
    assert 'le="+Inf"' in after

    # The node-wide view is the admin's alone.
    status, _, body = scrape(server, tenant.token)
    assert status == 403, (status, body)
    status, _, _ = scrape(server, "not-a-token")
    assert status == 401


def test_metrics_is_in_the_openapi_document(server: Server) -> None:
    with urllib.request.urlopen(server.url + "/openapi.json", timeout=30) as resp:
        assert '"/metrics"' in resp.read().decode()
