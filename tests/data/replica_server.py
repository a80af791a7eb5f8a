"""A tiny HTTP replica for service tests: GET /health is 200 unless the file named by
SICK_FLAG exists (then 503); any other GET answers the replica's rank."""

import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        sick = os.path.exists(os.environ.get("SICK_FLAG", "/nonexistent") + os.environ["CORRAL_REPLICA"])
        status, body = (503, b"sick") if self.path == "/health" and sick else (200, os.environ["CORRAL_REPLICA"].encode())
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


ThreadingHTTPServer((os.environ["CORRAL_ADDR"], int(os.environ["CORRAL_PORT_PORT0"])), Handler).serve_forever()
