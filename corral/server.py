"""The corral server process: store + control loop + HTTP API in one process.

``python -m corral.server`` serves on loopback (``CORRAL_PORT``, default: a free port),
writes ``CORRAL_HOME/server.json`` with its URL and pid, and holds a lock so only one server
runs per ``CORRAL_HOME`` and a claim on its database so only one runs per database.
Stopping it leaves replicas running; the next start adopts them."""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
import sys
import time

import uvicorn

from corral.api.app import create_app
from corral.api.deps import ServerState
from corral.control.controller import Controller
from corral.site import load_site
from corral.settings import Settings
from corral.store.database import Claim, lock_file, make_engine, migrate, redacted, session_factory

log = logging.getLogger("corral.server")


def build_state(settings: Settings, clock=time.time) -> ServerState:
    settings.ensure_dirs()
    site = load_site(settings.config_path)
    engine = make_engine(settings.db_url)
    migrate(engine)
    sessions = session_factory(engine)
    controller = Controller(settings, sessions, site, clock=clock)
    return ServerState(settings=settings, sessions=sessions, site=site, controller=controller, clock=clock)


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


def main() -> int:
    # Everything the server writes (database, logs, server.json) is private to its owner;
    # replicas start with the umask the server was started with (see LocalExecutor).
    os.environ.setdefault("CORRAL_USER_UMASK", oct(os.umask(0o077)))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    settings.ensure_dirs()
    if settings.server_log.exists():  # opened by whoever started us, perhaps world-readable
        os.chmod(settings.server_log, 0o600)
    home_lock = lock_file(settings.home / "server.lock")  # held (open) until the process ends
    if home_lock is None:
        print(f"another corral server already serves {settings.home}", file=sys.stderr)
        return 3
    claim = Claim.take(settings.db_url)
    if claim is None:
        print(f"another corral server already runs jobs from the database {redacted(settings.db_url)}; "
              "one server per database (stop it, or give this one its own CORRAL_DB_URL)", file=sys.stderr)
        return 3
    host = os.environ.get("CORRAL_HOST", "127.0.0.1")
    if host not in ("127.0.0.1", "localhost", "::1"):
        # Serving beyond loopback needs authentication, which this server does not have yet.
        print(f"refusing to listen on {host}: corral serves on loopback only", file=sys.stderr)
        return 2
    # proto must be IPPROTO_TCP: asyncio only sets TCP_NODELAY on such sockets, and without
    # it every keep-alive request stalls ~40 ms on delayed ACKs.
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(os.environ.get("CORRAL_PORT", "0"))))
    port = sock.getsockname()[1]
    # API threads, the intake and the control loop share one GIL. Submissions are handled on
    # the event loop (no thread hop), so Python's default 5 ms switch interval serves best:
    # bench/submit.py 507 vs 372 accepted/s at 0.2 ms, bench/launch.py unchanged (~100 jobs/s).
    sys.setswitchinterval(0.005)
    state = build_state(settings)
    app = create_app(state)
    _tune_gc()
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    info = {"url": f"http://{host}:{port}", "pid": os.getpid(), "home": str(settings.home),
            "db": settings.db_url.split("://", 1)[0], "started_at": time.time()}
    tmp = settings.server_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(settings.server_file)
    log.info("corral server %s on %s (db %s, %d node(s))", os.getpid(), info["url"], info["db"], len(state.nodes))
    try:
        server.run(sockets=[sock])
    finally:
        try:
            if json.loads(settings.server_file.read_text()).get("pid") == os.getpid():
                settings.server_file.unlink()
        except (OSError, ValueError):
            pass
        claim.release()
        log.info("corral server %s stopped", os.getpid())
    return 0


if __name__ == "__main__":
    sys.exit(main())
