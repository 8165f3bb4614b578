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


def families(text: str) -> dict[str, object]:
    """The exposition read by Prometheus' own Python parser (which refuses
    malformed text), by family name."""
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(text)}


def histogram_count(family: object, **labels: str) -> float:
    """The ``_count`` of a histogram family's series matching ``labels``
    (summed), after checking that each series' buckets are cumulative and
    end at ``+Inf`` equal to its count."""
    series: dict[tuple, dict[str, object]] = {}
    for s in family.samples:  # type: ignore[attr-defined]
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        entry = series.setdefault(key, {"buckets": [], "count": None})
        if s.name.endswith("_bucket"):
            entry["buckets"].append((float(s.labels["le"]), s.value))  # type: ignore[union-attr]
        elif s.name.endswith("_count"):
            entry["count"] = s.value
    total_count = 0.0
    for key, entry in series.items():
        buckets = entry["buckets"]
        assert buckets and buckets[-1][0] == float("inf"), (family.name, key)  # type: ignore[attr-defined,index]
        assert all(a[1] <= b[1] and a[0] < b[0] for a, b in zip(buckets, buckets[1:])), (key, buckets)  # type: ignore[arg-type]
        assert buckets[-1][1] == entry["count"], (key, buckets, entry["count"])  # type: ignore[index]
        if all(dict(key).get(k) == v for k, v in labels.items()):
            total_count += float(entry["count"])  # type: ignore[arg-type]
    return total_count


async def test_histograms_move_with_creations_commands_calls_and_requests(server: Server, tenant: Tenant) -> None:
    _, _, text = scrape(server, server.admin_token)
    before = families(text)
    for name in ("dsec_sandbox_create_seconds", "dsec_exec_seconds", "dsec_fncall_call_seconds",
                 "dsec_http_request_duration_seconds", "dsec_placement_seconds"):
        assert before[name].type == "histogram", name  # type: ignore[attr-defined]

    async with DSecClient(server.url, tenant.token) as c:
        sb = await c.run_container(run_args("busybox", memory_limit_mb=64, cpu_cores_limit=0.2), timeout=120)
        try:
            for _ in range(3):
                await sb.run_shell("true")
        finally:
            await sb.delete()
        result = await c.fncall("bash", "echo hi")
        assert result.status == "ok", result

    _, _, text = scrape(server, server.admin_token)
    after = families(text)
    node_grew = lambda name, n, **labels: (histogram_count(after[name], **labels)
                                           >= histogram_count(before[name], **labels) + n)
    assert node_grew("dsec_sandbox_create_seconds", 1, backend="container"), text
    assert node_grew("dsec_exec_seconds", 3), text
    assert node_grew("dsec_fncall_call_seconds", 1, language="bash"), text
    # Three commands through the exec route, timed under its template.
    assert node_grew("dsec_http_request_duration_seconds", 3,
                     route="/v1/sandboxes/{id}/exec", method="POST", code="2xx"), text
    assert node_grew("dsec_placement_seconds", 1), text
    # Counters the issue lists beside the histograms.
    for name in ("dsec_node_swap_in_pages", "dsec_node_swap_out_pages", "dsec_fncall_compile_cache_hits"):
        assert after[name].type == "counter", name  # type: ignore[attr-defined]
    assert after["dsec_node_creations_queued"].type == "gauge"  # type: ignore[attr-defined]
