"""The corral server process: store + control loop + HTTP API in one process.

``python -m corral.server [--host H] [--port P] [--tls-cert F --tls-key F]`` serves on loopback
by default (``CORRAL_HOST``/``CORRAL_PORT``; port default: a free one), writes
``CORRAL_HOME/server.json`` with its URL and pid and ``CORRAL_HOME/local.token`` (its owner's
credential), and holds a lock so only one server runs per ``CORRAL_HOME`` and a claim on its
database so only one runs per database. Every request but the health check needs a token,
wherever it listens. Stopping it leaves replicas running; the next start adopts them."""

from __future__ import annotations

import argparse
import gc
import getpass
import ipaddress
import json
import logging
import os
import pwd
import signal
import socket
import sys
import time
from pathlib import Path

import uvicorn

from corral import homelock
from corral.node.network import NetworkError
from corral.api.app import create_app
from corral.api.deps import ServerState
from corral.auth.accounts import open_for_jobs
from corral.control.loop import ControlLoop
from corral.credentials import remove_local_token, write_local_token
from corral.site import load_site
from corral.spec.loader import SpecError
from corral.settings import Settings
from corral.store.database import Claim, make_engine, migrate, redacted, session_factory

log = logging.getLogger("corral.server")


def owner() -> str:
    """The OS user this process runs as (by uid, not the spoofable LOGNAME/USER variables)."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (some containers)
        return getpass.getuser()


def build_state(settings: Settings, clock=time.time, claim: Claim | None = None) -> ServerState:
    """The server's objects, and a fresh local token for its owner in CORRAL_HOME. With the
    database's ``claim`` (the server process holds it), every write of the control loop is
    fenced by it, and losing it to another server stops this one."""
    settings.ensure_dirs()
    # a root server's jobs run as their submitters' accounts, which reach their own files by path
    open_for_jobs(settings.home, settings.logs_dir, settings.checkpoints_dir, settings.runs_dir,
                  private=(settings.server_log, settings.server_file, *settings.home.glob("corral.db*")))
    site = load_site(settings.config_path)
    engine = make_engine(settings.db_url)
    migrate(engine)
    if claim is not None:
        claim.begin(engine, f"{socket.gethostname()}:{os.getpid()}:{settings.home}", clock())
    sessions = session_factory(engine)
    loop = ControlLoop(settings, sessions, site, clock=clock, claim=claim, on_claim_lost=_stop_on_claim_lost)
    return ServerState(settings=settings, sessions=sessions, site=site, loop=loop, clock=clock,
                       owner=owner(), local_token=write_local_token(settings.home))


def _stop_on_claim_lost(why: str) -> None:
    """Another server took this database over: this one ends (as ``corral server stop``
    would), its control loop already stopped and its attempts killed."""
    log.error("stopping: %s", why)
    os.kill(os.getpid(), signal.SIGTERM)


def _tune_gc() -> None:
    """Python's cyclic GC, set for a server that keeps what it loaded at start-up and a
    record per queued job. Its default (a young pass every 700 new objects, so a full pass
    every 70,000) spent 15-20 % of a submission flood collecting, and each full pass, which
    walked every module, class and validator loaded at start-up, stalled every request
    60-150 ms. Those start-up objects live as long as the process: frozen, no pass walks
    them again; and a young pass every 10,000 new objects cuts the passes ~14x."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m corral.server", description="The corral server (foreground).")
    parser.add_argument("--host", default=os.environ.get("CORRAL_HOST", "127.0.0.1"),
                        help="address to listen on (default 127.0.0.1; any other requires tokens, as loopback does)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("CORRAL_PORT", "0")),
                        help="port (default: a free one)")
    parser.add_argument("--tls-cert", default=os.environ.get("CORRAL_TLS_CERT"), help="PEM certificate (chain)")
    parser.add_argument("--tls-key", default=os.environ.get("CORRAL_TLS_KEY"), help="PEM private key")
    return parser.parse_args(argv)


def _url(scheme: str, host: str, port: int) -> str:
    """The address a client on this machine uses (a wildcard address is reached on loopback)."""
    local = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"{scheme}://{f'[{local}]' if ':' in local else local}:{port}"


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(0)


class _Server(uvicorn.Server):
    """uvicorn's server, telling the API's long polls that it stops: they answer at once
    instead of being cut off (500) when its graceful shutdown ends."""

    def __init__(self, config: uvicorn.Config, state: ServerState):
        super().__init__(config)
        self._state = state

    async def shutdown(self, sockets=None) -> None:  # noqa: ANN001 - uvicorn's
        self._state.waits.stop()
        await super().shutdown(sockets)


def main(argv: list[str] | None = None) -> int:
    # Everything the server writes (database, logs, server.json) is private to its owner;
    # replicas start with the umask the server was started with (see LocalExecutor).
    os.environ.setdefault("CORRAL_USER_UMASK", oct(os.umask(0o077)))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: one line per readiness probe, thousands an hour
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = _arguments(argv)
    settings = Settings.from_env()
    settings.ensure_dirs()
    if bool(args.tls_cert) != bool(args.tls_key):
        print("--tls-cert and --tls-key go together: give both (or neither)", file=sys.stderr)
        return 2
    try:
        load_site(settings.config_path)  # refused here, every problem with its line, before anything is taken
    except SpecError as exc:
        print(f"{settings.config_path} is not valid, so the corral server cannot start:\n{exc}", file=sys.stderr)
        return 2
    tls = [str(Path(p).expanduser().resolve()) for p in (args.tls_cert, args.tls_key)] if args.tls_cert else []
    for path in tls:
        if not os.access(path, os.R_OK):
            print(f"cannot read {path} (--tls-cert/--tls-key)", file=sys.stderr)
            return 2
    if settings.server_log.exists():  # opened by whoever started us, perhaps world-readable
        os.chmod(settings.server_log, 0o600)
    home_lock = homelock.take(settings.home)  # held (open) until the process ends; what `server status` asks
    if home_lock is None:
        print(f"another corral server already serves {settings.home}", file=sys.stderr)
        return 3
    claim = Claim.take(settings.db_url)
    if claim is None:
        print(f"another corral server already runs jobs from the database {redacted(settings.db_url)}; "
              "one server per database (stop it, or give this one its own CORRAL_DB_URL)", file=sys.stderr)
        return 3
    host = args.host
    if not is_loopback(host):
        log.warning("listening on %s: every request needs a token (corral token create)%s", host,
                    "" if tls else "; tokens travel in clear without TLS (--tls-cert/--tls-key, or a TLS proxy)")
    # proto must be IPPROTO_TCP: asyncio only sets TCP_NODELAY on such sockets, and without
    # it every keep-alive request stalls ~40 ms on delayed ACKs.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, args.port))
    except OSError as exc:
        print(f"cannot listen on {host}:{args.port}: {exc.strerror}", file=sys.stderr)
        return 2
    port = sock.getsockname()[1]
    # API threads, the intake and the control loop share one GIL. Submissions are handled on
    # the event loop (no thread hop), so Python's default 5 ms switch interval serves best:
    # bench/submit.py 507 vs 372 accepted/s at 0.2 ms, bench/launch.py unchanged (~100 jobs/s).
    sys.setswitchinterval(0.005)
    try:
        state = build_state(settings, claim=claim)
    except NetworkError as exc:  # a setting this machine cannot honour: refused, with what to change
        print(f"the corral server cannot start: {exc}", file=sys.stderr)
        return 2
    app = create_app(state)
    _tune_gc()
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                            ssl_certfile=tls[0] if tls else None, ssl_keyfile=tls[1] if tls else None)
    server = _Server(config, state)
    info = {"url": _url("https" if tls else "http", host, port), "pid": os.getpid(), "home": str(settings.home),
            "db": settings.db_url.split("://", 1)[0], "started_at": time.time(), "host": host,
            "tls_cert": tls[0] if tls else None}
    tmp = settings.server_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(settings.server_file)
    log.info("corral server %s on %s (db %s, %d node(s))", os.getpid(), info["url"], info["db"], len(state.nodes))
    # uvicorn shuts down gracefully on SIGTERM, then raises the signal again: with the default
    # handler that would end the process before the cleanup below (server.json, the local token).
    signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        server.run(sockets=[sock])
    finally:
        try:
            if json.loads(settings.server_file.read_text()).get("pid") == os.getpid():
                settings.server_file.unlink()
        except (OSError, ValueError):
            pass
        claim.release()
        if state.local_token:
            remove_local_token(settings.home, state.local_token)
        log.info("corral server %s stopped", os.getpid())
    return 0


if __name__ == "__main__":
    sys.exit(main())
