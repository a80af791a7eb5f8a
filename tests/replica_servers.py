"""Small programs that test replicas run: written to a file in the test's directory and
started by the replica's ``run``.

``NAMED_SERVER`` answers every GET with the replica's name (``CORRAL_REPLICA``) on its own
address and the task's ``service`` port, keep-alive (each request of a connection is one the
endpoint forwards and counts), so a test tells which replica an endpoint chose."""

NAMED_SERVER = r"""
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # the body not held back behind the headers' ACK (40 ms a request)
    def do_GET(self):
        body = os.environ["CORRAL_REPLICA"].encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
ThreadingHTTPServer((os.environ["CORRAL_ADDR"], int(os.environ["CORRAL_PORT_SERVICE"])), H).serve_forever()
"""
