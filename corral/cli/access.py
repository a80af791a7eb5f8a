"""The commands about who may do what: ``token create|list|revoke`` (an admin's), ``login``
and ``logout`` (which server and token later commands and ``corral.Client()`` use), ``whoami``
and ``audit``."""

from __future__ import annotations

import getpass
import os
import sys
from argparse import Namespace
from datetime import datetime
from pathlib import Path

from corral import embedded as daemon
from corral.cli.render import Column, Usage, err, fail, out, print_json, table
from corral.client import Client, CorralError
from corral.credentials import SavedLogins
from corral.settings import Settings


def _client() -> Client:
    try:
        return daemon.client()
    except CorralError as exc:
        fail(exc)
        raise  # fail exits


def _when(iso: str | None) -> str:
    if not iso:
        return "-"
    return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M")


def token_create(args: Namespace) -> None:
    try:
        made = _client().create_token(args.user, args.role, args.expires, args.note)
    except CorralError as exc:
        fail(exc)
    info = made["info"]
    if args.json:
        print_json(made)
        return
    expires = f"expires {_when(info['expires_at'])}" if info["expires_at"] else "never expires"
    err.print(f"Token {info['id']} for {info['user']} (role {info['role']}, {expires}). It is shown this once; "
              f"give it to {info['user']}, who runs: corral login SERVER", markup=False)
    print(made["token"])


def token_list(args: Namespace) -> None:
    try:
        data = _client().tokens(revoked=args.revoked)
    except CorralError as exc:
        fail(exc)
    if args.json:
        print_json(data)
        return
    table([Column("ID", key=True, right=True), Column("USER"), Column("ROLE"), Column("CREATED"), Column("EXPIRES"),
           Column("LAST USED"), Column("BY", optional=2), Column("REVOKED", optional=1),
           Column("NOTE", fold=True, optional=3)],
          [[t["id"], t["user"], t["role"] + (" (config)" if t["role_from_config"] else ""), _when(t["created_at"]),
            _when(t["expires_at"]) if t["expires_at"] else "never", _when(t["last_used_at"]), t["created_by"],
            _when(t["revoked_at"]), t["note"] or "-"] for t in data])


def token_revoke(args: Namespace) -> None:
    client = _client()
    failed = 0
    for ident in args.ids:
        try:
            info = client.revoke_token(ident)
        except CorralError as exc:
            err.print(f"[red]error:[/red] {exc.message}")
            failed = 2 if exc.status in (404, 422) else 1
            continue
        out.print(f"Token {info['id']} of {info['user']} revoked")
    sys.exit(failed)


def login(args: Namespace) -> None:
    url = args.server.rstrip("/")
    if "://" not in url:
        url = "https://" + url
    token = args.token
    if token is None:
        if not sys.stdin.isatty():
            token = sys.stdin.readline().strip()
        else:
            token = getpass.getpass(f"Token for {url}: ").strip()
    if not token:
        raise Usage("--token", "no token given")
    ca_bundle = str(Path(args.ca_bundle).expanduser().resolve()) if args.ca_bundle else None
    if ca_bundle and not os.access(ca_bundle, os.R_OK):
        raise Usage("--ca-bundle", f"cannot read {ca_bundle}")
    try:
        with Client(url, token, ca_bundle=ca_bundle) as client:
            me = client.whoami()
    except CorralError as exc:
        fail(exc)
    SavedLogins().save(url, token, ca_bundle)
    out.print(f"Logged in to {url} as {me['user']} ({me['role']}); corral commands and corral.Client() use it "
              f"until `corral logout`")


def logout(args: Namespace) -> None:
    forgotten = SavedLogins().remove(args.server)
    if forgotten is None:
        out.print("no saved login " + (f"for {args.server}" if args.server else "to forget"))
        sys.exit(1)
    out.print(f"Forgot the token for {forgotten}")


def whoami(args: Namespace) -> None:
    try:  # a question about this client: answered by a server that runs, never by starting one
        client = daemon.connect(Settings.from_env(), autostart=False)
    except CorralError as exc:
        fail(exc)
        raise  # fail exits
    try:
        me = client.whoami()
    except CorralError as exc:
        fail(exc)
    if args.json:
        print_json({**me, "server": client.url})
        return
    out.print(f"{me['user']} ({me['role']}) on {client.url}" + (" through the local token" if me["source"] == "local"
                                                                 else f", token {me['token']}"))


def audit(args: Namespace) -> None:
    try:
        data = _client().audit(since=args.since, user=args.user, action=args.action, limit=args.limit)
    except CorralError as exc:
        fail(exc)
    if args.json:
        print_json(data)
        return
    table([Column("TIME", key=True), Column("USER"), Column("ROLE", optional=2), Column("SOURCE", optional=3),
           Column("ACTION"), Column("TARGET"), Column("OUTCOME"), Column("DETAIL", fold=True, optional=1)],
          [[datetime.fromisoformat(e["ts"]).astimezone().strftime("%Y-%m-%d %H:%M:%S"), e["user"], e["role"],
            e["source"], e["action"], e["target"], e["outcome"], e["detail"]] for e in data])
