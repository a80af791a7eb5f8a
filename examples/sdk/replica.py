"""A replica of the example's web task: answers every GET with its replica number, and
/health with 200 once it has started."""

import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        body = f"hello from web-{os.environ['CORRAL_REPLICA']}\n".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


ThreadingHTTPServer((os.environ["CORRAL_ADDR"], int(os.environ["CORRAL_PORT_HTTP"])), Handler).serve_forever()
