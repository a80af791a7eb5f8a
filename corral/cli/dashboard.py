"""``corral dashboard``: the web dashboard's address, signed in as whoever runs the command.

The address carries the command's token in its fragment (``/ui/#token=…``): a fragment is
never sent to a server nor put in a ``Referer``, and the page moves it into the browser's
storage and out of the address bar at once. ``--open`` does not hand that address to the
browser on its command line, which every user of the machine can read (``ps``, /proc); it
writes a small page that redirects to it, private to its owner like the token files
themselves, and opens that file instead."""

from __future__ import annotations

import html
import sys
from argparse import Namespace
from pathlib import Path
from urllib.parse import quote

from corral import embedded as daemon
from corral.cli.render import err, fail
from corral.client import Client, CorralError
from corral.credentials import write_private
from corral.settings import Settings

REDIRECT_FILE = "dashboard.html"


def address(url: str, token: str | None) -> str:
    """The dashboard of the server at ``url``, signed in with ``token`` when there is one."""
    return f"{url.rstrip('/')}/ui/" + (f"#token={quote(token, safe='')}" if token else "")


def redirect_page(target: str) -> str:
    """A page that sends the browser on to ``target`` (no script needed: a meta refresh keeps
    the fragment), with a link for a browser that does not follow it."""
    shown = html.escape(target, quote=True)
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta name="referrer" content="no-referrer">\n'
            f'<meta http-equiv="refresh" content="0; url={shown}">\n'
            f'<title>corral dashboard</title></head>\n'
            f'<body><p><a href="{shown}">Open the corral dashboard</a></p></body></html>\n')


def dashboard(args: Namespace) -> None:
    settings = Settings.from_env()
    try:
        url, presented = daemon.locate(settings)
    except CorralError as exc:
        fail(exc)
    with Client(url, presented.token or "", ca_bundle=presented.ca_bundle, pinned_cert=presented.pinned_cert) as client:
        try:
            client.health()
        except CorralError as exc:
            if exc.status != 503:  # a failing control loop is just what the dashboard should show
                fail(exc)
        if presented.token:
            try:
                who = client.whoami()  # a refused token would only lead to the sign-in form
            except CorralError as exc:
                fail(exc)
    target = address(url, presented.token)
    print(target)
    if presented.token:
        err.print(f"signed in as {who['user']} ({who['role']}); the address carries your token: keep it to yourself",
                  markup=False)
    else:
        err.print("no token for this server (`corral login SERVER` saves one): the page will ask for one", markup=False)
    if args.open:
        _open(settings.home / REDIRECT_FILE, target)


def _open(page: Path, target: str) -> None:
    import webbrowser

    write_private(page, redirect_page(target))
    if not webbrowser.open(page.as_uri()):
        err.print(f"corral dashboard: no web browser could be started here; open the address above yourself "
                  f"(or {page})", markup=False)
        sys.exit(1)
