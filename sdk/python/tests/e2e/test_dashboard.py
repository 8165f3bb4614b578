"""The web dashboard at ``/ui/`` in a real browser: Debian's headless
Chromium driven by Playwright (the browser of the machine, so nothing is
downloaded), against a real ``dsec up``.

A tenant signs in with its token, finds the sandbox it created in the list,
opens its page, sees its usage, and kills it from there; a label holding
markup is shown as text and never runs. The admin signs in with a link
carrying the token in its fragment and sees the node's usage. Every wait is
for an element or a text, bounded by a generous timeout (a busy host);
screenshots of each page are saved in the test's temporary directory.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from dsec import DSecClient

from .conftest import Server, Tenant, run_args

#: What the page may take to show something on a busy host (ms).
WAIT_MS = 60_000
expect.set_options(timeout=WAIT_MS)

#: A label value that would run script if the page inserted it as HTML.
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>"\'&amp;'


def chromium_path() -> str:
    path = os.environ.get("DSEC_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
    if not os.access(path, os.X_OK):
        pytest.fail(f"no Chromium at {path}: install Debian's `chromium` (scripts/deps.sh)", pytrace=False)
    return path


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        # Root cannot use Chromium's own sandbox; the page is ours.
        b = await p.chromium.launch(executable_path=chromium_path(), headless=True,
                                    args=["--no-sandbox", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            await b.close()


async def new_page(browser: Browser) -> tuple[Page, list[str]]:
    """A fresh page (its own sessionStorage) and the script errors it raises."""
    context = await browser.new_context(viewport={"width": 1280, "height": 900})
    page = await context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # A policy violation (say, markup that got in and tried to run) shows
    # up as a console error.
    page.on("console", lambda m: errors.append(m.text) if "Content Security Policy" in m.text else None)
    return page, errors


async def test_a_tenant_signs_in_sees_its_sandbox_and_kills_it(
        server: Server, tenant: Tenant, browser: Browser, tmp_path: Path) -> None:
    job = f"ui-{uuid.uuid4().hex[:8]}"
    async with DSecClient(server.url, tenant.token) as c:
        sb = await c.run_container(run_args("busybox", memory_limit_mb=64, cpu_cores_limit=0.2, job=job,
                                            labels={"suite": "sdk-e2e", "note": XSS}), timeout=120)
        try:
            # A refused attempt for its audit events: a masked path opened.
            await sb.run_shell("cat /proc/kpagecgroup; true")
            page, errors = await new_page(browser)
            await page.goto(server.url + "/ui")
            await page.get_by_test_id("token").fill(tenant.token)
            await page.get_by_test_id("sign-in").click()

            row = page.get_by_test_id("sandbox-row").filter(has=page.get_by_text(sb.id, exact=True))
            await expect(row).to_have_count(1, timeout=WAIT_MS)
            await expect(row.get_by_test_id("state")).to_have_text("running")
            # The markup is shown as the characters it is made of.
            await expect(row.get_by_test_id("labels")).to_contain_text(f"note={XSS}")
            assert await row.locator("img, script").count() == 0
            await page.screenshot(path=str(tmp_path / "sandboxes.png"), full_page=True)
            # The token is never in the address.
            assert tenant.token not in page.url
            # A tenant has no nodes view.
            await expect(page.locator("#nav-nodes")).to_be_hidden()

            # The job's sandboxes, paused and resumed together.
            await page.get_by_test_id("filter-job").fill(job)
            await page.get_by_test_id("filter-job").press("Enter")
            await expect(page.get_by_test_id("sandbox-row")).to_have_count(1)
            await page.get_by_test_id("job-pause").click()
            await expect(page.get_by_test_id("job-status")).to_have_text("pause: 1 changed, 0 unchanged, 0 ended of 1")
            await expect(row.get_by_test_id("state")).to_have_text("paused", timeout=WAIT_MS)
            await page.get_by_test_id("job-resume").click()
            await expect(page.get_by_test_id("job-status")).to_have_text("resume: 1 changed, 0 unchanged, 0 ended of 1")
            await expect(row.get_by_test_id("state")).to_have_text("running", timeout=WAIT_MS)

            await row.get_by_test_id("sandbox-link").click()
            await expect(page.get_by_test_id("sandbox-id")).to_have_text(sb.id)
            # The sampler's figures: memory against the 64 MiB limit.
            await expect(page.get_by_test_id("memory-now")).to_have_text(
                re.compile(r"^\d+(\.\d)? (B|KiB|MiB) of 64\.0 MiB$"), timeout=WAIT_MS)
            await expect(page.get_by_test_id("cpu-now")).to_have_text(re.compile(r"cores$"))
            await expect(page.get_by_test_id("facts")).to_contain_text(f"note={XSS}")
            assert await page.get_by_test_id("facts").locator("img, script").count() == 0
            await expect(page.get_by_test_id("trajectory")).to_contain_text("exec")
            await expect(page.get_by_test_id("audit")).to_contain_text("masked_path")
            await page.screenshot(path=str(tmp_path / "sandbox.png"), full_page=True)

            # Pause and resume from its page.
            state = page.get_by_test_id("facts").get_by_test_id("state")
            await page.get_by_test_id("pause").click()
            await expect(state).to_have_text("paused", timeout=WAIT_MS)
            await expect(page.get_by_test_id("resume")).to_be_enabled()
            await page.get_by_test_id("resume").click()
            await expect(state).to_have_text("running", timeout=WAIT_MS)

            # Kill asks twice.
            kill = page.get_by_test_id("kill")
            await kill.click()
            await expect(kill).to_have_text("Really kill?")
            await kill.click()
            await expect(state).to_have_text("stopped", timeout=WAIT_MS)
            await expect(kill).to_be_disabled()
            await page.screenshot(path=str(tmp_path / "killed.png"), full_page=True)
            assert (await sb.refresh()).state == "stopped"

            assert await page.evaluate("window.__xss") is None, "the label's markup ran"
            assert errors == [], errors
            await page.context.close()
        finally:
            await sb.delete()


async def test_a_sign_in_link_logs_the_admin_in_and_shows_the_nodes(
        server: Server, browser: Browser, tmp_path: Path) -> None:
    page, errors = await new_page(browser)
    await page.goto(f"{server.url}/ui/#token={server.admin_token}")
    await expect(page.locator("#who")).to_have_text("signed in as the admin")
    # The fragment is taken out of the address at once.
    await expect(page).to_have_url(re.compile(r"/ui/#/sandboxes$"))
    assert server.admin_token not in page.url

    await page.locator("#nav-nodes").click()
    node_row = page.get_by_test_id("node-row")
    await expect(node_row).to_have_count(1, timeout=WAIT_MS)
    await expect(node_row.get_by_test_id("node-cpu")).to_have_text(re.compile(r"cores of \d+$"), timeout=WAIT_MS)
    await expect(node_row.get_by_test_id("node-memory")).to_have_text(re.compile(r"of \d+(\.\d)? GiB$"))
    await page.screenshot(path=str(tmp_path / "nodes.png"), full_page=True)

    # Signing out forgets the token; a bad one is refused with a message.
    await page.locator("#sign-out").click()
    await page.get_by_test_id("token").fill("not-a-token")
    await page.get_by_test_id("sign-in").click()
    await expect(page.get_by_test_id("error")).to_contain_text("does not know this token")
    assert await page.evaluate("sessionStorage.getItem('dsec.token')") is None
    assert errors == [], errors
    await page.context.close()


async def test_the_dashboard_files_come_with_a_strict_policy(server: Server, browser: Browser) -> None:
    page, _ = await new_page(browser)
    for path, ctype in [("/ui/", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")]:
        resp = await page.request.get(server.url + path)
        assert resp.status == 200, path
        assert resp.headers["content-type"].startswith(ctype), (path, resp.headers)
        assert "script-src 'self'" in resp.headers["content-security-policy"]
        assert resp.headers["x-content-type-options"] == "nosniff"
    missing = await page.request.get(server.url + "/ui/nope.js")
    assert missing.status == 404
    assert (await missing.json())["error"]["code"] == "not_found"
    await page.context.close()
