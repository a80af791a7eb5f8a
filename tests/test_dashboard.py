"""The web dashboard in a real headless browser (Debian's Chromium driven by Playwright)
against a real corral server that asks every request for a token: the browser signs in with
a real token handed over in the address (/ui/#token=…) or typed in the sign-in form, and
the page shows who the server says it is. A job launched while the queue is open appears and
goes RUNNING without a reload; its page streams a line it printed and cancels it; the GPU
map and the usage page show what runs. A user may not act on someone else's job and a viewer
on none: their buttons are disabled, and an attempt anyway gets the server's 403 sentence on
the page. Also `corral dashboard`, which prints (and opens) the address signed in.

Set CORRAL_DASHBOARD_SHOTS=DIR to also save the pages' screenshots (docs/img) there."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import stat
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from conftest import POOL, cli_for, wait_for

from corral.client import Client, Forbidden
from corral.credentials import read_local_token

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = next((p for p in (os.environ.get("CORRAL_CHROMIUM"), shutil.which("chromium"), "/usr/bin/chromium")
                 if p and os.path.exists(p)), None)
ME = getpass.getuser()  # the server's owner: an admin, through its local token
USER, VIEWER = "alice", "vic"  # the browser's user (role user) and a viewer; bob is a user by config.yaml
SITE = POOL + """
accounts:
  - {name: rl-team, shares: 3, users: [bob]}
  - {name: platform, shares: 1, users: [alice]}
operators: [olga]
"""
RUNS = "trap 'exit 0' TERM; while true; do sleep 0.2; done"
CLI = [sys.executable, "-m", "corral.cli.main"]


@dataclass
class Served:
    """The server under test, the CLI's environment for its owner, and a token and client per
    person (made with `corral token create`, as an admin would)."""

    url: str
    home: Path
    env: dict[str, str]
    tokens: dict[str, str] = field(default_factory=dict)
    clients: dict[str, Client] = field(default_factory=dict)

    @property
    def alice(self) -> Client:
        return self.clients[USER]

    @property
    def bob(self) -> Client:
        return self.clients["bob"]


@pytest.fixture(scope="module")
def corral(tmp_path_factory):
    yield from _serve(tmp_path_factory.mktemp("dash"))


@pytest.fixture
def own_corral(tmp_path_factory):
    """A server of the test's own, for a queue the module's other tests should not share."""
    yield from _serve(tmp_path_factory.mktemp("dash-own"))


def _serve(base: Path):
    home = base / "home"
    home.mkdir()
    # alice and bob have no Unix accounts here: their jobs run as the server's declared shared account
    from corral.auth.accounts import server_account

    (home / "config.yaml").write_text(SITE + f"identity: {{service_account: {server_account()}}}\n")
    run = cli_for(home, {"XDG_CONFIG_HOME": str(base / "xdg")})  # no saved login of the real user
    run("server", "start", check=True, timeout=120)
    served = Served(json.loads((home / "server.json").read_text())["url"], home, run.env)
    try:
        for user, role in ((USER, ["--role", "user"]), ("bob", []), (VIEWER, ["--role", "viewer"])):
            served.tokens[user] = run("token", "create", user, *role, check=True).stdout.strip()
            served.clients[user] = Client(served.url, served.tokens[user])
        yield served
    finally:
        for client in served.clients.values():
            client.close()
        run.stop()


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


def ui(corral: Served, path: str = "") -> str:
    return f"{corral.url}/ui/{path}"


def sign_in(page, corral: Served, user: str = USER, path: str = "") -> None:
    """Open ``path`` with ``user``'s token in the fragment, as a link from `corral dashboard`."""
    page.goto(ui(corral, path) + f"#token={corral.tokens[user]}")
    expect(page.locator("#who")).to_have_text(f"{user} · {'viewer' if user == VIEWER else 'user'}")


def test_a_launched_job_appears_runs_streams_its_log_and_is_cancelled_from_its_page(corral, page) -> None:
    sign_in(page, corral)  # the name and role are the server's answer to /v1/whoami for this token
    assert page.url == ui(corral)  # the token left the address bar
    expect(page.locator("h1")).to_have_text("Queue")
    job = corral.alice.submit(f"name: dash-live\nrun: echo \"hello from $CORRAL_HOSTNAME\"; {RUNS}\n")["job"]
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
    expect(page.locator(".timeline")).to_contain_text(f"cancel requested by {USER}")
    assert corral.alice.job(job["id"])["state"] == "CANCELLED"


def test_queue_filters_nodes_gpu_map_and_usage(corral, page) -> None:
    held = corral.alice.submit(f"name: dash-gpus\nresources: {{accelerators: H100:2}}\nrun: {RUNS}\n")["job"]
    waiting = None
    try:
        running = corral.alice.wait(held["id"], states=("RUNNING",), timeout=30)
        # Submitted once the first runs: it would otherwise hold a reservation the first waits behind.
        waiting = corral.bob.submit(f"name: dash-big\nnum_nodes: 2\nresources: {{accelerators: H100:4}}\nrun: {RUNS}\n")["job"]
        sign_in(page, corral)
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
        expect(page.locator(f"tr[data-account='platform'][data-user='{USER}']")).to_be_visible()
        expect(page.locator(f"tr[data-key='{USER}']")).to_be_visible()  # this hour's GPU-hours, charted
        assert page.evaluate("() => !!window.Chart && Chart.getChart('usage-chart').data.datasets.length") >= 1
        page.locator("select[name='by']").select_option("account")
        expect(page.locator("tr[data-key='platform']")).to_be_visible()
    finally:
        corral.alice.cancel(held["id"])
        if waiting:
            corral.bob.cancel(waiting["id"])


def test_a_long_queue_shows_its_totals_and_every_running_job(own_corral, page) -> None:
    """1,100 held jobs ahead of a running one: the tiles are the server's counts and the
    running job is listed, not hidden behind the first page of the queue. (Its own server:
    the queue goes with it, and the module's other tests never see it.)"""
    corral = own_corral
    corral.bob.submit(f"name: dash-many\nrun: {RUNS}\n", scheduling={"hold": True}, array="0-1099")
    running = corral.alice.submit(f"name: dash-runs\nresources: {{accelerators: H100:2}}\nrun: {RUNS}\n")["job"]
    corral.alice.wait(running["id"], states=("RUNNING",), timeout=30)
    sign_in(page, corral)
    tiles = page.locator(".tile")
    expect(tiles.nth(0)).to_have_text("1,100pending (1,100 held)")
    expect(tiles.nth(1)).to_have_text("1running")
    expect(tiles.nth(2)).to_have_text("2GPUs held")
    expect(page.locator(f"tr[data-job='{running['id']}']")).to_have_attribute("data-state", "RUNNING")
    expect(page.locator("h2", has_text="Pending")).to_have_text(
        "Pending (1,100; the oldest 500 shown, in scheduling order)")
    expect(page.locator("tr[data-state='PENDING']")).to_have_count(500)
    # the filters are the server's too: bob's queue is his held array alone
    page.goto(ui(corral, "?user=bob"))
    expect(tiles.nth(1)).to_have_text("0running")
    expect(tiles.nth(0)).to_have_text("1,100pending (1,100 held)")
    expect(page.locator(f"tr[data-job='{running['id']}']")).to_have_count(0)


def test_learned_run_times_on_the_queue_and_the_job_page(own_corral, page) -> None:
    """A run of dash-est teaches the server (its own, so the history is this test's alone):
    the next dash-est waits behind a hog with its predicted run (a one-second run: the
    one-minute floor), and the hog runs with the prediction it started with."""
    corral = own_corral
    est = "name: dash-est\nresources: {accelerators: H100:4}\nrun: sleep 1\n"
    first = corral.alice.submit(est)["job"]
    assert corral.alice.wait(first["id"], timeout=30)["state"] == "SUCCEEDED"
    hog = corral.alice.submit(f"name: dash-hog\nnum_nodes: 2\nresources: {{accelerators: H100:4}}\nrun: {RUNS}\n")["job"]
    corral.alice.wait(hog["id"], states=("RUNNING",), timeout=30)
    waiting = corral.alice.submit(est)["job"]
    wait_for(lambda: corral.alice.job(waiting["id"])["predicted_run_s"])
    sign_in(page, corral)
    expect(page.locator("th", has_text="Est. run")).to_be_visible()
    expect(page.locator("th", has_text="Predicted run")).to_be_visible()
    expect(page.locator(f"tr[data-job='{waiting['id']}']")).to_contain_text("1m00s")
    expect(page.locator(f"tr[data-job='{hog['id']}']")).to_contain_text("1m00s")  # alice's any-job history
    page.goto(ui(corral, f"jobs/{waiting['id']}"))
    expect(page.locator(".facts div", has_text="Est. run")).to_contain_text("1m00s")
    page.goto(ui(corral, f"jobs/{first['id']}"))
    expect(page.locator(".facts div", has_text="Predicted run")).to_contain_text("no history")


def test_hold_release_and_scale_from_the_job_page(corral, page) -> None:
    elastic = corral.alice.submit(f"name: dash-elastic\nnum_nodes: {{min: 1, max: 3, initial: 1}}\nrun: {RUNS}\n")["job"]
    later = corral.alice.submit(f"name: dash-later\ndependency: afterok:{elastic['id']}\nrun: {RUNS}\n")["job"]
    try:
        sign_in(page, corral, path=f"jobs/{later['id']}")
        expect(page.locator(".facts")).to_contain_text("Dependency")
        page.locator("button[data-action='hold']").click()
        expect(page.locator(".result.ok")).to_have_text(f"job {later['id']} held")
        expect(page.locator(".facts")).to_contain_text("by its owner (JobHeldUser)")
        assert corral.alice.job(later["id"])["hold"] == "user"
        page.locator("button[data-action='release']").click()
        expect(page.locator("button[data-action='hold']")).to_be_visible()
        assert corral.alice.job(later["id"])["hold"] == ""

        page.goto(ui(corral, f"jobs/{elastic['id']}"))
        expect(page.locator("tr[data-replica='dash-elastic-0']")).to_have_attribute("data-state", "RUNNING")
        page.locator("input[data-task='dash-elastic']").fill("3")
        page.locator("button[data-action='scale']").click()
        expect(page.locator("tr[data-replica='dash-elastic-2']")).to_have_attribute("data-state", "RUNNING")
        page.locator("input[data-task='dash-elastic']").fill("4")
        page.locator("button[data-action='scale']").click()  # beyond its bounds: the server says so
        expect(page.locator(".result.refused")).to_contain_text("scales between 1 and 3 replicas")
    finally:
        corral.alice.cancel(later["id"])
        corral.alice.cancel(elastic["id"])


def _enable(button) -> None:
    """What a visitor could do with the browser's developer tools: the disabled state is a
    courtesy of the page, the server is what refuses."""
    button.evaluate("b => { b.disabled = false; }")


def test_a_user_and_a_viewer_get_the_servers_refusals(corral, browser) -> None:
    mine = corral.alice.submit(f"name: dash-mine\nnum_nodes: {{min: 1, max: 2, initial: 1}}\nrun: echo mine; {RUNS}\n")["job"]
    later = corral.alice.submit(f"name: dash-next\ndependency: afterok:{mine['id']}\nrun: {RUNS}\n")["job"]
    theirs = corral.bob.submit(f"name: dash-theirs\nresources: {{accelerators: H100:1}}\nrun: {RUNS}\n")["job"]
    contexts = []
    errors: list[str] = []

    def visit(path: str = "", user: str | None = None):
        context = browser.new_context()
        context.set_default_timeout(20_000)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        sent: list[tuple[str, str | None]] = []
        page.on("request", lambda r: "/v1/" in r.url and sent.append((r.url, r.headers.get("authorization"))))
        page.goto(ui(corral, path) + (f"#token={corral.tokens[user]}" if user else ""))
        return page, sent

    try:
        corral.alice.wait(mine["id"], states=("RUNNING",), timeout=30)
        corral.bob.wait(theirs["id"], states=("RUNNING",), timeout=30)

        # alice (a user) on bob's job: no usable button, his logs refused, and a cancel anyway refused.
        page, _ = visit(f"jobs/{theirs['id']}", USER)
        expect(page.locator("#who")).to_have_text(f"{USER} · user")
        cancel = page.locator("button[data-action='cancel']")
        expect(cancel).to_be_disabled()
        expect(page.locator(".readonly")).to_contain_text("Only bob (its owner) or an operator")
        expect(page.locator(".log-status")).to_have_text(
            f"log stream stopped: reading another user's logs needs the operator role (you are {USER}, a user)")
        _enable(cancel)
        page.once("dialog", lambda dialog: dialog.accept())
        cancel.click()
        expect(page.locator(".result.refused")).to_have_text(
            f"cancelling another user's job (job {theirs['id']}, bob's) needs the operator role (you are {USER}, a user)")
        assert corral.bob.job(theirs["id"])["state"] == "RUNNING"
        page.goto(ui(corral, f"jobs/{mine['id']}"))
        expect(page.locator("button[data-action='cancel']")).to_be_enabled()  # her own

        # vic (a viewer) signs in through the form the server's 401 brings up.
        page, _ = visit(f"jobs/{mine['id']}")
        expect(page.locator("#login")).to_be_visible()
        expect(page.locator("#login-why")).to_contain_text("this corral server needs a token")
        page.locator("#login-token").fill(corral.tokens[VIEWER])
        page.locator("#login button[type='submit']").click()
        expect(page.locator("#who")).to_have_text(f"{VIEWER} · viewer")
        expect(page.locator("tr[data-replica='dash-mine-0']")).to_have_attribute("data-state", "RUNNING")
        for control in ("button[data-action='cancel']", "button[data-action='scale']", "input[data-task='dash-mine']"):
            expect(page.locator(control)).to_be_disabled()
        expect(page.locator(".readonly")).to_have_text("Your role (viewer) may look but not change jobs.")
        scale = page.locator("button[data-action='scale']")
        _enable(scale)
        scale.click()
        expect(page.locator(".result.refused")).to_have_text(
            f"scaling another user's job (job {mine['id']}, {USER}'s) needs the operator role (you are {VIEWER}, a viewer)")
        page.goto(ui(corral, f"jobs/{later['id']}"))
        expect(page.locator("button[data-action='hold']")).to_be_disabled()
        with Client(corral.url, corral.tokens[VIEWER]) as vic, pytest.raises(Forbidden) as refused:
            vic.cancel(mine["id"])  # straight to the API: the same answer
        assert refused.value.message == (f"cancelling another user's job (job {mine['id']}, {USER}'s) needs the "
                                         f"operator role (you are {VIEWER}, a viewer)")
        assert corral.alice.job(mine["id"])["state"] == "RUNNING" and corral.alice.job(later["id"])["hold"] == ""
        # What a viewer may read: the GPU map and the usage, everyone's.
        page.goto(ui(corral, "nodes"))
        expect(page.locator(f".gpu.held[data-job='{theirs['id']}']")).to_have_count(1)
        page.goto(ui(corral, "usage"))
        expect(page.locator("tr[data-key='bob']")).to_be_visible()
        expect(page.locator("#banner")).to_be_hidden()

        # A token in the fragment is kept, leaves the address bar, and goes with every request.
        page, sent = visit(f"jobs/{mine['id']}", USER)
        expect(page.locator("pre.log")).to_contain_text("mine")
        assert page.url == ui(corral, f"jobs/{mine['id']}")
        assert page.evaluate("localStorage.getItem('corral.token')") == corral.tokens[USER]
        assert any("/logs?" in url for url, _ in sent)
        assert sum("/v1/whoami" in url for url, _ in sent) == 1  # one page instance, asking once
        assert sent and all(auth == f"Bearer {corral.tokens[USER]}" for _, auth in sent), sent
        page.locator("#signout").click()  # forgotten: the server asks again
        expect(page.locator("#login")).to_be_visible()
        assert page.evaluate("localStorage.getItem('corral.token')") is None

        # A token the server does not know: its 401 sentence, and the page drops it.
        context = browser.new_context()
        contexts.append(context)
        page = context.new_page()
        page.goto(ui(corral) + "#token=corral_not-a-real-one")
        expect(page.locator("#login-why")).to_contain_text("The server refused the saved token: the token is not valid")
        assert page.evaluate("localStorage.getItem('corral.token')") is None
        assert not errors, f"JavaScript errors on the pages: {errors}"
    finally:
        for context in contexts:
            context.close()
        corral.alice.cancel(later["id"])
        corral.alice.cancel(mine["id"])
        corral.bob.cancel(theirs["id"])


def test_screenshots_with_a_small_workload(corral, page, tmp_path: Path) -> None:
    """Each page with a job group from examples/, an RL-shaped group on the GPUs and a few
    queued jobs, as the user's guide shows them."""
    group = corral.alice.submit(ROOT / "examples" / "hello-group.yaml")["job"]
    rl = corral.alice.submit("""name: rl
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
        corral.alice.wait(group["id"], timeout=30)
        corral.alice.wait(rl["id"], ready=True, timeout=30)
        queued += [corral.bob.submit(f"name: sweep-{i}\nresources: {{accelerators: H100:2}}\nrun: {RUNS}\n",
                                     scheduling={"nice": 10 * i})["job"] for i in range(3)]
        shots = {"queue": "", "job": f"jobs/{rl['id']}", "nodes": "nodes", "usage": "usage"}
        ready = {"queue": f"tr[data-job='{queued[-1]['id']}']", "job": "pre.log >> text=step 2",
                 "nodes": ".gpu.held", "usage": "p.hint >> text=/buckets of 1 min/"}  # the last hour, by minute
        target = Path(os.environ.get("CORRAL_DASHBOARD_SHOTS") or tmp_path)
        target.mkdir(parents=True, exist_ok=True)
        sign_in(page, corral)
        for name, path in shots.items():
            page.goto(ui(corral, path))
            if name == "usage":
                page.locator("select[name='range']").select_option("1h")
            page.locator(ready[name]).first.wait_for()
            page.screenshot(path=target / f"dashboard-{name}.png", full_page=True)
            assert (target / f"dashboard-{name}.png").stat().st_size > 20_000
    finally:
        for job in [rl, *queued]:
            (corral.bob if job in queued else corral.alice).cancel(job["id"])


def test_corral_dashboard_prints_the_address_signed_in_and_opens_it_off_the_command_line(corral, browser,
                                                                                          tmp_path: Path) -> None:
    dashboard = CLI + ["dashboard"]
    done = subprocess.run(dashboard, env=corral.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    local = read_local_token(corral.home)
    assert done.stdout.strip() == ui(corral) + f"#token={local}"  # the owner's own token: one click signs in
    assert f"signed in as {ME} (admin)" in done.stderr
    with urllib.request.urlopen(done.stdout.strip(), timeout=10) as response:  # the fragment stays here
        assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")
        page = response.read()
        assert b'<base href="/ui/">' in page and b'<script type="module" src="static/main.js">' in page

    # --open hands the browser a private file that redirects: the token is on no command line.
    opened = tmp_path / "opened"
    fake = tmp_path / "browser"
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {opened}\n")
    fake.chmod(0o755)
    done = subprocess.run(dashboard + ["--open"], env=dict(corral.env, BROWSER=str(fake)), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    wait_for(lambda: opened.exists() and opened.read_text().strip(), timeout=10)
    argv = opened.read_text().strip()
    redirect = corral.home / "dashboard.html"
    assert argv == redirect.as_uri() and local not in argv
    assert stat.S_IMODE(redirect.stat().st_mode) == 0o600
    context = browser.new_context()
    context.set_default_timeout(20_000)
    try:
        page = context.new_page()
        page.goto(argv)
        expect(page).to_have_url(ui(corral))
        expect(page.locator("#who")).to_have_text(f"{ME} · admin")
    finally:
        context.close()

    # A server this command has no token for: the plain address, and the page will ask.
    elsewhere = dict(corral.env, CORRAL_SERVER=corral.url, CORRAL_HOME=str(tmp_path / "other"))
    done = subprocess.run(dashboard, env=elsewhere, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ui(corral) and "the page will ask for one" in done.stderr
