"""Minimal JSON-over-HTTP for the example's services (stdlib only, so the example shows
exactly what crosses the wire). Peers are addressed by their corral names, e.g.
``http://reward-0.grpo:8100``: corral makes those names resolve for every process."""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def call(url: str, payload: object | None = None, data: bytes | None = None, timeout: float = 30.0,
         headers: dict[str, str] | None = None) -> tuple[int, object]:
    body = data if data is not None else (json.dumps(payload).encode() if payload is not None else None)
    request = urllib.request.Request(url, data=body, headers=headers or {}, method="POST" if body else "GET")
    try:
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")
    except http.client.HTTPException as exc:
        # A peer killed between its reply's headers and its body (IncompleteRead) is gone,
        # like one that refused the connection: callers handle both as OSError.
        raise ConnectionError(f"{url}: the reply was cut short ({exc!r})") from exc


def serve(routes: dict[tuple[str, str], callable], port: int) -> None:
    """Serve ``{(method, path): handler(body_bytes, headers) -> (status, obj)}`` on this
    replica's own address (CORRAL_ADDR), so replicas may share a port."""

    class Handler(BaseHTTPRequestHandler):
        def _handle(self, method: str) -> None:
            path = self.path.split("?", 1)[0]
            handler = routes.get((method, path))
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, obj = handler(body, self.headers) if handler else (404, {"error": f"no route {path}"})
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def log_message(self, *args) -> None:  # keep replica logs for what matters
            pass

    ThreadingHTTPServer.allow_reuse_address = True
    with ThreadingHTTPServer((os.environ.get("CORRAL_ADDR", "127.0.0.1"), port), Handler) as server:
        print(f"{os.environ.get('CORRAL_HOSTNAME', 'service')} serving on "
              f"{server.server_address[0]}:{server.server_address[1]}", flush=True)
        server.serve_forever()
