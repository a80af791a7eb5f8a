"""The client's HTTP/1.1 exchanges against a scripted server socket: every framing an answer
may use, kept-alive connections reused only when the last answer was read whole, a GET sent
again on a connection the server closed while idle (a POST never), and a garbled answer
reported as the server unreachable, never as data."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable

import pytest

from corral import http1
from corral.client import Client, InvalidRequest, NotFound, Unavailable


class Scripted:
    """A loopback server that answers each request with the next canned bytes; an answer
    of ``None`` closes the connection without answering. Records requests per connection."""

    def __init__(self, answers: list[bytes | None], close_after: Callable[[int], bool] = lambda n: False):
        self.answers, self.close_after = list(answers), close_after
        self.connections: list[list[bytes]] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.answers:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            seen: list[bytes] = []
            self.connections.append(seen)
            with conn, conn.makefile("rb") as reader:
                while self.answers:
                    head = b""
                    while not head.endswith(b"\r\n\r\n"):
                        line = reader.readline()
                        if not line:
                            break
                        head += line
                    if not head:
                        break
                    length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n")
                                   if x.lower().startswith(b"content-length:")), 0)
                    seen.append(head + reader.read(length))
                    answer = self.answers.pop(0)
                    if answer is None:
                        break
                    conn.sendall(answer)
                    if self.close_after(len(seen)):
                        break

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def scripted():
    servers: list[Scripted] = []

    def make(*answers: bytes | None, close_after: Callable[[int], bool] = lambda n: False) -> Scripted:
        servers.append(Scripted(list(answers), close_after))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


def _json(body: bytes, extra: str = "") -> bytes:
    return (f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
            ).encode() + body


def test_answers_framed_by_length_share_one_connection(scripted) -> None:
    server = scripted(_json(b'{"a": 1}'), _json(b'{"b": 2}'))
    with Client(f"http://127.0.0.1:{server.port}", token="t") as client:
        assert client._call("GET", "/one") == {"a": 1}
        assert client._call("GET", "/two", {"x": [1, 2]}) == {"b": 2}
    assert len(server.connections) == 1 and len(server.connections[0]) == 2
    first, second = server.connections[0]
    assert first.startswith(b"GET /one HTTP/1.1\r\n") and b"Authorization: Bearer t\r\n" in first
    assert second.startswith(b"GET /two?x=1&x=2 HTTP/1.1\r\n")


def test_a_chunked_answer_arrives_piece_by_piece_and_whole() -> None:
    body = b"5\r\nab\ncd\r\n3;ext=1\r\nefg\r\n0\r\nTrailer: x\r\n\r\n"
    server = Scripted([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + body, _json(b"{}")])
    try:
        conn = http1.Connection("127.0.0.1", server.port, 5)
        response = conn.request("GET", "/logs", None, {})
        assert response.read1(2) == b"ab" and response.read1(100) == b"\ncd" and response.read1(100) == b"efg"
        assert response.read1(100) == b"" and response.complete and conn.idle
        again = conn.request("GET", "/next", None, {})  # the trailer was consumed: the socket is in step
        assert again.status == 200 and again.read() == b"{}"
        assert len(server.connections) == 1
    finally:
        server.close()


def test_an_answer_ended_by_close_is_read_to_the_end_and_its_connection_not_reused(scripted) -> None:
    server = scripted(b"HTTP/1.1 200 OK\r\n\r\n{\"x\": 3}", _json(b"[]"), close_after=lambda n: True)
    with Client(f"http://127.0.0.1:{server.port}", token="t") as client:
        assert client._call("GET", "/a") == {"x": 3}
        assert client._call("GET", "/b") == []
    assert [len(c) for c in server.connections] == [1, 1]


def test_a_get_is_sent_again_on_a_connection_closed_while_idle_but_a_post_is_never_sent_twice(scripted) -> None:
    server = scripted(_json(b"1"), None, _json(b"2"), _json(b"3"), None)
    with Client(f"http://127.0.0.1:{server.port}", token="t") as client:
        assert client._call("GET", "/a") == 1
        assert client._call("GET", "/b") == 2  # the kept socket was closed unanswered: sent once more
        assert client._call("POST", "/c", json_body={"k": 1}) == 3
        with pytest.raises(Unavailable, match="no answer came .*may have been carried out"):
            client._call("POST", "/d", json_body={})
    posts = [r for c in server.connections for r in c if r.startswith(b"POST /d ")]
    assert len(posts) == 1
    assert any(r.startswith(b"POST /c ") and r.endswith(b'{"k": 1}') and b"Content-Length: 8" in r
               for c in server.connections for r in c)


@pytest.mark.parametrize("answer, words", [
    (b"SSH-2.0-OpenSSH_9.2\r\n", "not an HTTP/1.x answer"),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", "7 byte.s. before the end of its answer"),
    (b"HTTP/1.1 200 OK\r\ncontent-length: ten\r\n\r\n", "Content-Length"),
    (b"HTTP/1.1 200 OK\r\ncontent-type: x\r\n", "inside its headers"),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
])
def test_a_garbled_answer_is_the_server_unreachable_never_data(scripted, answer: bytes, words: str) -> None:
    server = scripted(answer, close_after=lambda n: True)
    with Client(f"http://127.0.0.1:{server.port}", token="t") as client:
        with pytest.raises(Unavailable, match=words):
            client._call("GET", "/x")


def test_errors_keep_the_servers_words(scripted) -> None:
    detail = b'{"detail": "no job 7"}'
    server = scripted(f"HTTP/1.1 404 Not Found\r\ncontent-length: {len(detail)}\r\n\r\n".encode() + detail)
    with Client(f"http://127.0.0.1:{server.port}", token="t") as client:
        with pytest.raises(Exception, match="no job 7") as caught:
            client._call("GET", "/v1/jobs/7")
    assert type(caught.value).__name__ == "NotFound"


class Echo:
    """A keep-alive server answering every request with its own request line, as JSON."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lines: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            while True:
                head = []
                while (line := reader.readline()) not in (b"\r\n", b""):
                    head.append(line)
                if not head:
                    return
                self.lines.append(head[0])
                body = json.dumps({"line": head[0].decode("latin-1").strip()}).encode()
                conn.sendall(f"HTTP/1.1 200 OK\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)


def test_a_client_shared_by_threads_never_reads_another_call_s_answer() -> None:
    server = Echo()
    try:
        with Client(f"http://127.0.0.1:{server.port}", token="t") as client:
            wrong: list[tuple[str, str]] = []

            def calls(me: int) -> None:
                for i in range(150):
                    path = f"/v1/jobs/{me}-{i}"
                    line = client._call("GET", path)["line"]
                    if line != f"GET {path} HTTP/1.1":
                        wrong.append((path, line))

            threads = [threading.Thread(target=calls, args=(n,)) for n in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert wrong == [] and len(server.lines) == 600
    finally:
        server.sock.close()


def test_ids_stay_one_path_segment_and_nothing_can_start_a_second_request() -> None:
    server = Echo()
    try:
        with Client(f"http://127.0.0.1:{server.port}", token="t") as client:
            sneaky = "1 HTTP\r\nX-Injected: 1\r\n\r\nGET tokens"
            assert client.job(sneaky)["line"] == ("GET /v1/jobs/1%20HTTP%0D%0AX-Injected%3A%201%0D%0A%0D%0AGET"
                                                  "%20tokens HTTP/1.1")
            assert client.job("%41")["line"] == "GET /v1/jobs/%2541 HTTP/1.1"  # a '%' stays itself
            assert client.job("日本")["line"] == "GET /v1/jobs/%E6%97%A5%E6%9C%AC HTTP/1.1"
            assert client.job("a?b#c")["line"] == "GET /v1/jobs/a%3Fb%23c HTTP/1.1"
        assert len(server.lines) == 4  # one request each, nothing injected
        for token in ("x\r\nX-Evil: 1", "x\r", "日本"):
            with Client(f"http://127.0.0.1:{server.port}", token=token) as client:
                with pytest.raises(InvalidRequest, match="the token holds a line break, a NUL or a non-ASCII"):
                    client.whoami()
        assert len(server.lines) == 4
    finally:
        server.sock.close()


def test_a_server_that_is_not_corral_is_said_to_be_so(scripted) -> None:
    page = b"<!DOCTYPE HTML><html><body>Error response 404</body></html>"
    server = scripted(f"HTTP/1.0 404 File not found\r\ncontent-type: text/html\r\ncontent-length: {len(page)}\r\n\r\n"
                      .encode() + page,
                      b"HTTP/1.0 200 OK\r\ncontent-type: text/html\r\ncontent-length: 5\r\n\r\n<p/>\n",
                      close_after=lambda n: True)
    with Client(f"http://127.0.0.1:{server.port}", token="t") as client:
        with pytest.raises(Unavailable, match="answered HTTP 404 without a corral error: is it a corral server"):
            client.whoami()
        with pytest.raises(Unavailable, match=r"did not answer as a corral server does \(HTTP 200, text/html"):
            client.whoami()


def test_a_redirect_a_slash_in_an_id_and_a_bad_port_are_errors_never_data(scripted) -> None:
    server = scripted(b"HTTP/1.1 307 Temporary Redirect\r\nlocation: /v1/jobs/1\r\ncontent-length: 0\r\n\r\n",
                      close_after=lambda n: True)
    with Client(f"http://127.0.0.1:{server.port}", token="t") as client:
        with pytest.raises(Unavailable, match=r"answered HTTP 307 \(a redirect\), which a corral server never does"):
            client.job(1)
        for ident in ("1/", "1/events", "../tokens"):  # never another path of the server's
            with pytest.raises(NotFound, match="never holds '/'"):
                client.job(ident)
    assert len(server.connections) == 1  # (one request: the redirect's)
    for address in ("http://127.0.0.1:99999", "http://127.0.0.1:abc"):
        with pytest.raises(InvalidRequest, match="is not a server address"):
            Client(address)


def test_a_stream_cut_by_the_server_says_so(scripted) -> None:
    server = scripted(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nab\n\r\n", close_after=lambda n: True)
    with Client(f"http://127.0.0.1:{server.port}", token="t") as client:
        chunks = client.logs(1, follow=True)
        assert next(chunks) == b"ab\n"
        with pytest.raises(Unavailable, match="closed the connection in the middle of its answer"):
            next(chunks)


def test_a_post_without_an_answer_may_have_been_carried_out_and_says_so() -> None:
    silent = socket.create_server(("127.0.0.1", 0))
    try:
        with Client(f"http://127.0.0.1:{silent.getsockname()[1]}", token="t", timeout=0.5) as client:
            with pytest.raises(Unavailable, match="but no answer came .*may have been carried out"):
                client._call("POST", "/v1/jobs", json_body={"yaml": "run: 'true'"})
            with pytest.raises(Unavailable, match="cannot reach .*timed out"):
                client._call("GET", "/v1/jobs")
    finally:
        silent.close()
