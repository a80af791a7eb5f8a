"""``corral server start|stop|status``: the embedded local server of this CORRAL_HOME, as
the command line shows it (``corral.embedded`` does the work)."""

from __future__ import annotations

import sys
from typing import Any

from corral.client import CorralError
from corral.embedded import running, start, stop
from corral.settings import Settings


def cli_start(args: Any) -> None:
    from corral.cli.render import fail, out

    settings = Settings.from_env()
    options = [f"--port={args.port}"] if args.port else []
    options += [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in ("host", "tls_cert", "tls_key")
                if getattr(args, name)]
    already = running(settings)
    try:
        info = start(settings, options=options)
    except CorralError as exc:
        fail(exc)
    out.print(f"corral server {info['pid']} on {info['url']} (home {settings.home})")
    if already and options:
        out.print(f"it was already running as started before; `corral server stop` first to apply {' '.join(options)}")


def cli_stop(args: Any) -> None:
    from corral.cli.render import out

    out.print("corral server stopped" if stop(Settings.from_env()) else "no corral server was running")


def cli_status(args: Any) -> None:
    from corral.cli.render import out, print_json

    settings = Settings.from_env()
    info = running(settings)
    if args.json:
        print_json({"running": bool(info), "answering": False, **(info or {}), "home": str(settings.home)})
    elif info and info["answering"]:
        out.print(f"corral server {info['pid']} on {info['url']} (home {settings.home}, db {info['db']})")
        for infra, why in sorted(info.get("unreachable", {}).items()):
            out.print(f"infra {infra} does not answer, its partitions are DOWN: {why}", markup=False)
    elif info:  # it holds the home: the next command waits for it rather than starting another
        out.print(f"corral server {info['pid']} serves {settings.home} but does not answer yet (starting; log: "
                  f"{settings.server_log})")
    else:
        out.print(f"no corral server is running for {settings.home}")
    sys.exit(0 if info else 1)
