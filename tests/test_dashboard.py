"""The web dashboard in a real headless browser (Debian's Chromium driven by Playwright)
against a real corral server: every page loads; a job launched while the queue is open
appears and goes RUNNING without a reload; its page streams a line it printed and cancels
it; the GPU map and the usage page show what runs; a viewer gets no usable buttons, a refused
action shows the server's sentence, and a token (from the URL fragment or the sign-in form)
goes with every request, the log stream's too. Also `corral dashboard`.

Set CORRAL_DASHBOARD_SHOTS=DIR to also save the pages' screenshots (docs/img) there."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from conftest import POOL, kill_leftovers, wait_for

from corral.client import Client

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = next((p for p in (os.environ.get("CORRAL_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium")
                 if p and os.path.exists(p)), None)
ME = getpass.getuser()  # the browser sends no user header: the server takes it for its own user
SITE = POOL + """
accounts:
  - {name: rl-team, shares: 3, users: [alice, bob]}
  - {name: platform, shares: 1, users: [%s]}
operators: [alice]   # not the browser's user: acting on bob's job is refused
""" % ME
RUNS = "trap 'exit 0' TERM; while true; do sleep 0.2; done"


@pytest.fixture(scope="module")
def corral(tmp_path_factory):
    home = tmp_path_factory.mktemp("dash") / "home"
    home.mkdir()
    (home / "config.yaml").write_text(SITE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(home)
    cli = [sys.executable, "-m", "corral.cli.main"]
    subprocess.run(cli + ["server", "start"], env=env, check=True, capture_output=True, timeout=120)
    url = json.loads((home / "server.json").read_text())["url"]
    with Client(url, user=ME) as me, Client(url, user="bob") as bob:
        me.env, me.home, me.bob = env, home, bob
        yield me
    subprocess.run(cli + ["server", "stop"], env=env, capture_output=True, timeout=120)
    kill_leftovers(home)


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("no Chromium binary (Debian: apt-get install chromium; or set CORRAL_CHROMIUM)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(20_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: m.type == "error" and "Content Security Policy" in m.text and errors.append(m.text))
    yield page
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def ui(corral: Client, path: str = "") -> str:
    return f"{corral.url}/ui/{path}"


def test_a_launched_job_appears_runs_streams_its_log_and_is_cancelled_from_its_page(corral, page) -> None:
    page.goto(ui(corral))
    expect(page.locator("h1")).to_have_text("Queue")
    expect(page.locator("#who")).to_have_text("local user")  # no /v1/whoami: the trusted local user
    job = corral.submit(f"name: dash-live\nrun: echo \"hello from $CORRAL_HOSTNAME\"; {RUNS}\n")["job"]
    row = page.locator(f"tr[data-job='{job['id']}']")
    expect(row).to_have_attribute("data-state", "RUNNING")  # appeared and moved on without a reload
    expect(row).to_contain_text("dash-live")
    row.get_by_role("link", name="dash-live").click()
    expect(page).to_have_url(ui(corral, f"jobs/{job['id']}"))
    expect(page.locator("tr[data-replica='dash-live-0']")).to_have_attribute("data-state", "RUNNING")
    page.locator("button[data-logs='dash-live-0']").click()
    expect(page.locator("pre.log")).to_contain_text("hello from dash-live-0.dash-live")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator("button[data-action='cancel']").click()
    expect(page.locator(".job-head .badge")).to_have_text("CANCELLED")
    expect(page.locator(".timeline")).to_contain_text("cancel requested by")
    assert corral.job(job["id"])["state"] == "CANCELLED"


def test_queue_filters_nodes_gpu_map_and_usage(corral, page) -> None:
    held = corral.submit(f"name: dash-gpus\nresources: {{accelerators: H100:2}}\nrun: {RUNS}\n")["job"]
    waiting = None
    try:
        running = corral.wait(held["id"], states=("RUNNING",), timeout=30)
        # Submitted once the first runs: it would otherwise hold a reservation the first waits behind.
        waiting = corral.bob.submit(f"name: dash-big\nnum_nodes: 2\nresources: {{accelerators: H100:4}}\nrun: {RUNS}\n")["job"]
        page.goto(ui(corral))
        pending = page.locator(f"tr[data-job='{waiting['id']}']")
        expect(pending).to_have_attribute("data-state", "PENDING")
        expect(pending).to_contain_text("Resources")  # the reason it waits, and its priority
        page.locator("input[name='user']").fill("bob")
        page.locator("input[name='user']").dispatch_event("change")
        expect(page).to_have_url(ui(corral, "?user=bob"))
        expect(page.locator(f"tr[data-job='{held['id']}']")).to_have_count(0)
        expect(pending).to_be_visible()

        page.goto(ui(corral, "nodes"))
        expect(page.locator("article.node")).to_have_count(2)
        replica = running["tasks"][0]["replicas"][0]
        cells = page.locator(f"article.node[data-node='{replica['node']}'] .gpu.held[data-job='{held['id']}']")
        expect(cells).to_have_count(2)
        assert sorted(int(g) for g in cells.evaluate_all("cells => cells.map(c => c.dataset.gpu)")) == replica["gpus"]
        expect(cells.first).to_contain_text("dash-gpus-0")
        expect(page.locator(".gpu.free")).to_have_count(6)

        page.goto(ui(corral, "usage"))
        expect(page.locator(f"tr[data-account='platform'][data-user='{ME}']")).to_be_visible()
        expect(page.locator(f"tr[data-key='{ME}']")).to_be_visible()  # this hour's GPU-hours, charted
        assert page.evaluate("() => !!window.Chart && Chart.getChart('usage-chart').data.datasets.length") >= 1
        page.locator("select[name='by']").select_option("account")
        expect(page.locator("tr[data-key='platform']")).to_be_visible()
    finally:
        corral.cancel(held["id"])
        if waiting:
            corral.bob.cancel(waiting["id"])


def test_hold_release_and_scale_from_the_job_page(corral, page) -> None:
    elastic = corral.submit(f"name: dash-elastic\nnum_nodes: {{min: 1, max: 3, initial: 1}}\nrun: {RUNS}\n")["job"]
    later = corral.submit(f"name: dash-later\ndependency: afterok:{elastic['id']}\nrun: {RUNS}\n")["job"]
    try:
        page.goto(ui(corral, f"jobs/{later['id']}"))
        expect(page.locator(".facts")).to_contain_text("Dependency")
        page.locator("button[data-action='hold']").click()
        expect(page.locator(".result.ok")).to_have_text(f"job {later['id']} held")
        expect(page.locator(".facts")).to_contain_text("by its owner (JobHeldUser)")
        assert corral.job(later["id"])["hold"] == "user"
        page.locator("button[data-action='release']").click()
        expect(page.locator("button[data-action='hold']")).to_be_visible()
        assert corral.job(later["id"])["hold"] == ""

        page.goto(ui(corral, f"jobs/{elastic['id']}"))
        expect(page.locator("tr[data-replica='dash-elastic-0']")).to_have_attribute("data-state", "RUNNING")
        page.locator("input[data-task='dash-elastic']").fill("3")
        page.locator("button[data-action='scale']").click()
        expect(page.locator("tr[data-replica='dash-elastic-2']")).to_have_attribute("data-state", "RUNNING")
        page.locator("input[data-task='dash-elastic']").fill("4")
        page.locator("button[data-action='scale']").click()  # beyond its bounds: the server says so
        expect(page.locator(".result.refused")).to_contain_text("scales between 1 and 3 replicas")
    finally:
        corral.cancel(later["id"])
        corral.cancel(elastic["id"])


def test_roles_refusals_and_tokens(corral, browser) -> None:
    mine = corral.submit(f"name: dash-mine\nrun: echo mine; {RUNS}\n")["job"]
    theirs = corral.bob.submit(f"name: dash-theirs\nrun: {RUNS}\n")["job"]
    try:
        corral.wait(mine["id"], states=("RUNNING",), timeout=30)
        corral.wait(theirs["id"], states=("RUNNING",), timeout=30)

        def visit(path: str, whoami: dict | None = None, status: int = 200):
            context = browser.new_context()
            context.set_default_timeout(20_000)
            if whoami is not None or status != 200:
                context.route("**/v1/whoami", lambda route: route.fulfill(status=status, json=whoami))
            page = context.new_page()
            page.goto(ui(corral, path))
            return context, page

        context, page = visit(f"jobs/{mine['id']}", {"user": "vic", "role": "viewer"})
        expect(page.locator("#who")).to_have_text("vic · viewer")
        expect(page.locator("button[data-action='cancel']")).to_be_disabled()
        expect(page.locator(".readonly")).to_contain_text("viewer")
        context.close()

        context, page = visit(f"jobs/{theirs['id']}", {"user": ME, "role": "user"})
        expect(page.locator("button[data-action='cancel']")).to_be_disabled()
        expect(page.locator(".readonly")).to_contain_text("Only bob")
        page.goto(ui(corral, f"jobs/{mine['id']}"))
        expect(page.locator("button[data-action='cancel']")).to_be_enabled()
        context.close()

        # Today's server: no whoami, the buttons are there, and the server refuses with its reason.
        context, page = visit(f"jobs/{theirs['id']}")
        expect(page.locator("tr[data-replica='dash-theirs-0']")).to_have_attribute("data-state", "RUNNING")
        page.once("dialog", lambda dialog: dialog.accept())
        page.locator("button[data-action='cancel']").click()
        expect(page.locator(".result.refused")).to_contain_text(f"job {theirs['id']} belongs to bob")
        assert corral.job(theirs["id"])["state"] == "RUNNING"
        context.close()

        # A token in the fragment is kept, leaves the address bar, and goes with every request.
        context = browser.new_context()
        context.set_default_timeout(20_000)
        page = context.new_page()
        sent: list[tuple[str, str | None]] = []
        page.on("request", lambda r: "/v1/" in r.url and sent.append((r.url, r.headers.get("authorization"))))
        page.goto(ui(corral, f"jobs/{mine['id']}#token=s3cret-token"))
        expect(page.locator("pre.log")).to_contain_text("mine")
        assert "token" not in page.url and page.evaluate("localStorage.getItem('corral.token')") == "s3cret-token"
        assert any("/logs?" in url for url, _ in sent)
        assert sum("/v1/whoami" in url for url, _ in sent) == 1  # one page instance, asking once
        assert sent and all(auth == "Bearer s3cret-token" for _, auth in sent), sent
        context.close()

        # A server that asks for a token: the sign-in form, then the typed token on every call.
        context = browser.new_context()
        context.set_default_timeout(20_000)

        def guard(route):
            if route.request.headers.get("authorization") == "Bearer typed-token":
                route.fulfill(json={"user": "tim", "role": "operator"})
            else:
                route.fulfill(status=401, json={"detail": "this server needs a token (Authorization: Bearer)"})

        context.route("**/v1/whoami", guard)
        page = context.new_page()
        page.goto(ui(corral))
        expect(page.locator("#login")).to_be_visible()
        expect(page.locator("#login-why")).to_contain_text("needs a token")
        page.locator("#login-token").fill("typed-token")
        page.locator("#login button[type='submit']").click()
        expect(page.locator("#who")).to_have_text("tim · operator")
        expect(page.locator("#signout")).to_be_visible()
        context.close()
    finally:
        corral.cancel(mine["id"])
        corral.bob.cancel(theirs["id"])


def test_screenshots_with_a_small_workload(corral, page, tmp_path: Path) -> None:
    """Each page with a job group from examples/, an RL-shaped group on the GPUs and a few
    queued jobs, as the user's guide shows them."""
    group = corral.submit(ROOT / "examples" / "hello-group.yaml")["job"]
    rl = corral.submit("""name: rl
execution: parallel
primary_tasks: [trainer]
---
name: trainer
num_nodes: 2
resources: {accelerators: H100:2}
run: |
  echo "trainer $CORRAL_REPLICA on $CORRAL_NODE, GPUs $CUDA_VISIBLE_DEVICES"
  i=0; while true; do i=$((i+1)); echo "step $i"; sleep 1; done
---
name: rollout
num_nodes: {min: 1, max: 3, initial: 2}
resources: {accelerators: H100:1}
run: echo "rollout $CORRAL_REPLICA serving on $CORRAL_ADDR"; %s
---
name: reward
run: echo "reward ready"; %s
""" % (RUNS, RUNS))["job"]
    queued = []
    try:
        corral.wait(group["id"], timeout=30)
        corral.wait(rl["id"], ready=True, timeout=30)
        queued += [corral.bob.submit(f"name: sweep-{i}\nresources: {{accelerators: H100:2}}\nrun: {RUNS}\n",
                                     scheduling={"nice": 10 * i})["job"] for i in range(3)]
        shots = {"queue": "", "job": f"jobs/{rl['id']}", "nodes": "nodes", "usage": "usage"}
        ready = {"queue": f"tr[data-job='{queued[-1]['id']}']", "job": "pre.log >> text=step 2",
                 "nodes": ".gpu.held", "usage": "p.hint >> text=/buckets of 1 min/"}  # the last hour, by minute
        target = Path(os.environ.get("CORRAL_DASHBOARD_SHOTS") or tmp_path)
        target.mkdir(parents=True, exist_ok=True)
        for name, path in shots.items():
            page.goto(ui(corral, path))
            if name == "usage":
                page.locator("select[name='range']").select_option("1h")
            page.locator(ready[name]).first.wait_for()
            page.screenshot(path=target / f"dashboard-{name}.png", full_page=True)
            assert (target / f"dashboard-{name}.png").stat().st_size > 20_000
    finally:
        for job in [rl, *queued]:
            (corral.bob if job in queued else corral).cancel(job["id"])


def test_corral_dashboard_prints_and_opens_the_address(corral, tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "corral.cli.main", "dashboard"]
    done = subprocess.run(cli, env=corral.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ui(corral)
    with urllib.request.urlopen(done.stdout.strip(), timeout=10) as response:
        assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")
        page = response.read()
        assert b'<base href="/ui/">' in page and b'<script type="module" src="static/main.js">' in page
    opened = tmp_path / "opened"
    fake = tmp_path / "browser"
    fake.write_text(f"#!/bin/sh\necho \"$1\" > {opened}\n")
    fake.chmod(0o755)
    done = subprocess.run(cli + ["--open"], env=dict(corral.env, BROWSER=str(fake)), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    wait_for(opened.exists, timeout=10)
    assert opened.read_text().strip() == ui(corral)
