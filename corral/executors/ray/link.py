"""The driver's end of the link between the corral server and its Ray driver process
(``python -m corral.executors.ray.link FD``): it builds the ``RayDriver`` from what the
server sends first, carries out the server's calls on a few threads, and sends back their
answers, the driver's events (in the order it observed them), its nodes whenever they
change, and how long ago Ray last answered. It ends when the server's end closes.

Messages are pickled tuples over a socket pair:

* server → driver: ``("init", options)``, ``("call", id, method, args)``, ``("close",)``
* driver → server: ``("ready", nodes)``, ``("down", reason)``, ``("reply", id, ok, value)``,
  ``("events", [Observed])``, ``("nodes", [NodeSpec])``, ``("answered", seconds_ago)``"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path

HEARTBEAT_S = 1.0
CALLS = frozenset({"bind", "rendezvous_port", "reserve", "start", "adopt", "signal", "forget", "publish",
                   "release", "cleanup_job", "exec_probe", "shell"})


def _reason(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:300]


def serve(conn: Connection) -> None:
    from corral.executors.contract import LaunchError
    from corral.executors.ray.driver import RayDriver
    from corral.executors.ray.plugin import RayConfig
    from corral.settings import Settings

    lock = threading.Lock()

    def send(message: tuple) -> None:
        with lock:
            conn.send(message)

    kind, options = conn.recv()
    assert kind == "init", kind
    driver: RayDriver | None = None
    seen = [-1]

    def flush() -> None:
        """Send what the driver observed, and its nodes when they changed (one lock: in order)."""
        if driver is None:
            return
        with lock:
            events = driver.drain()
            if events:
                conn.send(("events", events))
            if driver.inventory_version != seen[0]:
                seen[0] = driver.inventory_version
                conn.send(("nodes", driver.nodes()))

    settings = Settings(Path(options["home"]), options["db_url"])
    try:
        driver = RayDriver(RayConfig(**options["config"]), settings, options["scope"], options["namespace"], flush)
    except Exception as exc:
        send(("down", _reason(exc)))
        return
    seen[0] = driver.inventory_version
    send(("ready", driver.nodes()))
    flush()
    # (a shell's read waits up to relay.READ_WAIT_S for output: room for those beside the rest)
    pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="corral-ray-call")

    def call(ident: int, method: str, args: tuple) -> None:
        try:
            value = getattr(driver, method)(*args)
            ok = True
        except LaunchError as exc:
            value, ok = LaunchError(str(exc)), False
        except Exception as exc:  # an exception of Ray's may not cross back: its words do
            value, ok = LaunchError(_reason(exc)), False
        flush()  # what the call emitted goes before its answer
        send(("reply", ident, ok, value))

    def heartbeat() -> None:
        while True:
            time.sleep(HEARTBEAT_S)
            try:
                send(("answered", time.monotonic() - driver.answered))
            except OSError:
                return  # the server is gone; the main loop ends the process

    threading.Thread(target=heartbeat, name="corral-ray-heartbeat", daemon=True).start()
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the server is gone: its next one adopts what runs
        if message[0] == "close":
            driver.close()
            return
        _, ident, method, args = message
        if method not in CALLS:
            send(("reply", ident, False, LaunchError(f"no such call: {method}")))
            continue
        pool.submit(call, ident, method, args)


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    conn = Connection(int(argv[0]))
    try:
        serve(conn)
    finally:
        sys.stderr.flush()
        os._exit(0)  # Ray's threads must not hold the exit (the server already moved on)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
