"""HTTP/1.1 exchanges between the client and one corral server over one socket.

Every ``corral`` command is a fresh interpreter that sends one or two requests, so what it
imports is most of what a person waits for: the standard library's ``http.client`` pulls in
the ``email`` package and ``ssl`` (~13 ms, a third of a read command's whole run). A client
that speaks to corral's own server needs a small part of HTTP/1.1: a request with a length,
and an answer framed by ``Content-Length``, chunks or the connection's close. ``ssl`` is
imported only for an https server.

Errors are ``OSError``s (``socket.timeout`` included) so a caller catches one family;
``Closed`` says a kept-alive connection was closed by the server before it answered, the
one case where a request may be sent again.
"""

from __future__ import annotations

import socket
from typing import Any

_MAX_LINE = 65536
_MAX_HEADERS = 200


class ProtocolError(OSError):
    """The server's answer is not HTTP/1.x as this client reads it."""


class Closed(ConnectionError):
    """The server closed the connection before any byte of an answer."""


class BadRequest(ValueError):
    """A request line or header this client will not send: a byte that would end the line
    (CR, LF, NUL) or one outside ASCII (never sent raw, as it could start a second request)."""


def _checked(what: str, text: str) -> str:
    if any(c in text for c in "\r\n\0") or not text.isascii():
        raise BadRequest(f"{what} holds a line break, a NUL or a non-ASCII character")
    return text


class Response:
    """One answer: ``status``, ``headers`` (lower-case names), and its body read whole
    (``read``) or as it arrives (``read1``)."""

    def __init__(self, reader: Any, status: int, reason: str, headers: dict[str, str], bodiless: bool):
        self._reader = reader
        self.status, self.reason, self.headers = status, reason, headers
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._left: int | None = None  # bytes of the body (or of the current chunk) still to read
        self._done = bodiless
        if bodiless:
            self._left = 0
        elif not self._chunked and length is not None:
            try:
                self._left = int(length)
            except ValueError:
                raise ProtocolError(f"bad Content-Length {length!r}") from None
            self._done = self._left == 0
        # Without a length or chunks the body ends when the server closes: nothing can follow it.
        framed = bodiless or self._chunked or length is not None
        self.reusable = framed and headers.get("connection", "").lower() != "close"

    @property
    def complete(self) -> bool:
        return self._done

    def read(self) -> bytes:
        parts = []
        while True:
            part = self.read1(1 << 20)
            if not part:
                return b"".join(parts)
            parts.append(part)

    def read1(self, size: int = 65536) -> bytes:
        """At most ``size`` bytes of the body, as soon as some arrive; ``b""`` at its end."""
        if self._done:
            return b""
        if self._chunked:
            return self._chunk(size)
        if self._left is None:
            data = self._reader.read1(size)
            self._done = not data
            return data
        data = self._reader.read1(min(size, self._left))
        if not data:
            raise ProtocolError(f"the server closed the connection {self._left} byte(s) before the end of its answer")
        self._left -= len(data)
        self._done = self._left == 0
        return data

    def _chunk(self, size: int) -> bytes:
        if not self._left:
            line = self._reader.readline(_MAX_LINE)
            if not line:
                raise ProtocolError("the server closed the connection in the middle of its answer")
            try:
                self._left = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size line {line[:40]!r}") from None
            if self._left == 0:
                while self._reader.readline(_MAX_LINE) not in (b"\r\n", b"\n", b""):
                    pass  # trailers: nothing of corral's
                self._done = True
                return b""
        data = self._reader.read1(min(size, self._left))
        if not data:
            raise ProtocolError("the server closed the connection in the middle of its answer")
        self._left -= len(data)
        if self._left == 0:
            self._reader.readline(_MAX_LINE)  # the CRLF after the chunk
        return data


class Connection:
    """One connection to ``host:port`` (TLS with ``tls``, an ``ssl.SSLContext``), opened at
    the first request and kept while the server keeps it."""

    def __init__(self, host: str, port: int | None, timeout: float | None, tls: Any = None):
        self.host, self.timeout, self.tls = host, timeout, tls
        self.port = port or (443 if tls is not None else 80)
        self._sock: socket.socket | None = None
        self._reader: Any = None
        self._last: Response | None = None  # the previous answer on this socket
        self.sent = False  # the last request went out whole

    @property
    def idle(self) -> bool:
        """Whether the socket may carry another request (the last answer was read whole and
        the server keeps the connection)."""
        return self._sock is not None and (self._last is None or (self._last.complete and self._last.reusable))

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _open(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
        except BaseException:
            sock.close()
            raise
        self._sock, self._reader = sock, sock.makefile("rb")

    def request(self, method: str, target: str, body: bytes | None, headers: dict[str, str]) -> Response:
        """Send one request and read the answer's head; the body is the caller's to read
        before the next request on this connection."""
        lines = [f"{method} {_checked('the request target', target).replace(' ', '%20')} HTTP/1.1"]
        lines += [f"{_checked('a header name', name)}: {_checked(f'the {name} header', value)}"
                  for name, value in headers.items()]
        if self._sock is not None and not self.idle:
            self.close()
        fresh = self._sock is None
        if fresh:
            self._open()
            self._last = None
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.tls is not None else 80
        lines.insert(1, f"Host: {host}" + ("" if self.port == default else f":{self.port}"))
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        assert self._sock is not None
        self.sent = False
        self._sock.sendall(head + (body or b""))
        self.sent = True  # whatever happens next, the server may have carried it out
        status_line = self._reader.readline(_MAX_LINE)
        if not status_line:
            self.close()
            hint = "" if self.tls is not None or not fresh else " (if it serves https, give an https:// address)"
            raise Closed(f"the server closed the connection without answering{hint}")
        parts = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            self.close()
            raise ProtocolError(f"not an HTTP/1.x answer: {status_line[:60]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        for _ in range(_MAX_HEADERS):
            line = self._reader.readline(_MAX_LINE)
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                self.close()
                raise ProtocolError("the answer ended inside its headers")
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        else:
            self.close()
            raise ProtocolError("too many header lines in the answer")
        if 100 <= status < 200:  # corral's server sends no interim answers (no Expect: is ever sent)
            self.close()
            raise ProtocolError(f"an interim answer ({status}), which this client does not expect")
        bodiless = method == "HEAD" or status in (204, 304)
        self._last = Response(self._reader, status, parts[2] if len(parts) > 2 else "", headers, bodiless)
        return self._last
