"""The Python client of the corral API (what the CLI uses, and an SDK for scripts).

It speaks HTTP/1.1 with the standard library's ``http.client`` over one keep-alive
connection: every ``corral`` command starts a fresh interpreter, and importing a full HTTP
library (httpx and its certificate bundle) cost more than the whole request."""

from __future__ import annotations

import getpass
import http.client
import json
import socket
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode, urlsplit


class CorralError(RuntimeError):
    def __init__(self, message: str, status: int | None = None, errors: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.errors = errors or []


class Client:
    def __init__(self, url: str, user: str | None = None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise CorralError(f"{url!r} is not an http(s):// server address")
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname, parts.port
        self._prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.headers = {"X-Corral-User": user or getpass.getuser(), "Accept": "application/json"}
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self, timeout: float | None) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return kind(self._host, self._port, timeout=timeout)

    def _request(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None,
                 stream: bool = False) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        query = urlencode([(k, _wire(v)) for k, value in (params or {}).items()
                           for v in (value if isinstance(value, list) else [value])])
        target = self._prefix + path + (f"?{query}" if query else "")
        payload = json.dumps(body).encode() if body is not None else None
        headers = dict(self.headers, **({"Content-Type": "application/json"} if payload is not None else {}))
        # A kept-alive connection the server has meanwhile closed fails at once; a GET is then sent
        # again on a fresh one. A POST always gets a fresh connection: never sent twice.
        reuse = not stream and method == "GET" and self._conn is not None
        if not stream and not reuse:
            self.close()
        for attempt in (1, 2):
            conn = self._connection(None) if stream else (self._conn or self._connection(self.timeout))
            try:
                conn.request(method, target, body=payload, headers=headers)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if not stream:
                    self._conn = None
                stale = isinstance(exc, (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError))
                if reuse and stale and attempt == 1:
                    continue
                reason = "timed out" if isinstance(exc, socket.timeout) else exc
                raise CorralError(f"cannot reach the corral server at {self.url}: {reason}") from None
            if not stream:
                self._conn = conn
            return conn, response
        raise AssertionError("unreachable")

    def _call(self, method: str, path: str, params: dict[str, Any] | None = None, json_body: Any = None) -> Any:
        _, response = self._request(method, path, params, json_body)
        try:
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            raise CorralError(f"the corral server at {self.url} broke off its answer: {exc}") from None
        _check(response.status, data)
        return json.loads(data) if data else None

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health")

    def submit(self, yaml_text: str, *, source: str | None = None, base_dir: str | None = None,
               name: str | None = None, env: dict[str, str] | None = None,
               scheduling: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._call("POST", "/v1/jobs", json_body={"yaml": yaml_text, "source": source, "base_dir": base_dir,
                                                         "name": name, "env": env or {},
                                                         "scheduling": scheduling or {}})

    def share(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/share")

    def priority(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/priority")

    def jobs(self, *, all: bool = False, states: list[str] | None = None, user: str | None = None,
             name: str | None = None, limit: int | None = None, account: str | None = None,
             partition: str | None = None, since: str | None = None, until: str | None = None) -> list[dict[str, Any]]:
        """Jobs in id order; ``since``/``until`` are ISO 8601 times (``sacct -S/-E``)."""
        params: dict[str, Any] = {"all": all}
        for key, value in (("account", account), ("partition", partition), ("since", since), ("until", until)):
            if value:
                params[key] = value
        if limit:
            params["limit"] = limit
        if states:
            params["state"] = states
        if user:
            params["user"] = user
        if name:
            params["name"] = name
        return self._call("GET", "/v1/jobs", params)

    def job(self, ident: str | int) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{ident}")

    def cancel(self, ident: str | int) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{ident}/cancel")

    def hold(self, ident: str | int) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{ident}/hold")

    def release(self, ident: str | int) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{ident}/release")

    def requeue(self, ident: str | int, hold: bool = False) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{ident}/requeue", {"hold": True} if hold else None)

    def scale(self, ident: str | int, task: str, replicas: int) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{ident}/scale", json_body={"task": task, "replicas": replicas})

    def events(self, ident: str | int) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/jobs/{ident}/events")

    def nodes(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/nodes")

    def logs(self, ident: str | int, replica: str | None = None, follow: bool = False,
             prefix: bool | None = None, tail: int | None = None) -> Iterator[bytes]:
        params: dict[str, Any] = {"follow": follow}
        if tail is not None:
            params["tail"] = tail
        if replica:
            params["replica"] = replica
        if prefix is not None:
            params["prefix"] = prefix
        conn, response = self._request("GET", f"/v1/jobs/{ident}/logs", params, stream=True)
        try:
            if response.status >= 400:
                _check(response.status, response.read())
            while True:
                try:
                    chunk = response.read1(65536)
                except (OSError, http.client.HTTPException) as exc:
                    raise CorralError(f"log stream from {self.url} broke: {exc}") from None
                if not chunk:
                    return
                yield chunk
        finally:
            conn.close()


def _wire(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _check(status: int, data: bytes) -> None:
    if status < 400:
        return
    try:
        detail = json.loads(data).get("detail")
    except (ValueError, AttributeError):
        detail = data.decode(errors="replace")
    if isinstance(detail, dict):
        raise CorralError(detail.get("message", "request failed"), status, detail.get("errors"))
    if isinstance(detail, list):  # FastAPI request validation
        msgs = [f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}" for d in detail]
        raise CorralError("; ".join(msgs), status)
    raise CorralError(str(detail), status)
