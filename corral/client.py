"""The Python client of the corral API: what the CLI uses, and the SDK for scripts.

    from corral.client import Client
    with Client() as corral:                        # CORRAL_SERVER, your `corral login`, or the embedded server
        job = corral.submit(Path("rl.yaml"))        # a file, a YAML string or a dict
        corral.wait(job["id"], ready=True, timeout=300)
        print(corral.endpoints(job["id"]))
        corral.scale(job["id"], "rollout", 4)
        for chunk in corral.logs(job["id"], follow=True):
            ...

Every call returns the API's JSON (the shapes are in ``/openapi.json``); every refusal raises
a ``CorralError`` subclass carrying the server's message (``InvalidRequest`` with the file's
issues, ``Unauthorized``, ``NotFound``, ``Conflict``, ``Forbidden``, ``Unavailable``). Requests
carry ``Authorization: Bearer TOKEN``: the token given, else ``CORRAL_TOKEN``, else the one
``corral login`` saved for the server, else (for this ``CORRAL_HOME``'s own server) the local
token its owner alone can read. ``https://`` servers are checked against ``ca_bundle`` (or
``CORRAL_CA_BUNDLE``, or the system's CAs). It speaks HTTP/1.1
over one keep-alive connection (``corral.http1``): every ``corral`` command starts a fresh
interpreter, and importing a full HTTP library (even the standard library's ``http.client``)
cost more than the whole request."""

from __future__ import annotations

import json
import os
import socket
import time
from _thread import allocate_lock  # (threading's import costs a read command ~1 ms; a lock is all it needs)
from pathlib import Path
from collections.abc import Iterator
from typing import Any, Mapping
from urllib.parse import quote, urlencode, urlsplit

from corral import http1
from corral.apierrors import (BY_STATUS, Conflict, CorralError, Forbidden, InvalidRequest, NotFound, Unauthorized,  # noqa: F401
                              Unavailable, check as _check)
from corral.states import TERMINAL_JOB_STATES


TERMINAL = tuple(s.value for s in TERMINAL_JOB_STATES)
LONG_POLL_S = 25.0  # the longest a request waits for a job to change (the server's bound is 60 s)


class Client:
    """A connection to one corral server, as the holder of a token. Without ``url``, the server
    the ``corral`` command would use (``CORRAL_SERVER``, else the last ``corral login``, else
    this ``CORRAL_HOME``'s embedded server, started if it is not running). ``pinned_cert``
    trusts exactly that certificate whatever host name it names (how the CLI reaches its own
    TLS server on loopback). Use it as a context manager, or ``close()`` it."""

    @classmethod
    def local(cls) -> Client:
        """The server the ``corral`` command would use (the same as ``Client()``)."""
        from corral import embedded as daemon

        return daemon.client()

    def __init__(self, url: str | None = None, token: str | None = None, *, ca_bundle: str | None = None,
                 timeout: float = 30.0, pinned_cert: str | None = None):
        if url is None:
            from corral import embedded as daemon

            url, presented = daemon.locate()
            token, ca_bundle, pinned_cert = (token or presented.token, ca_bundle or presented.ca_bundle,
                                             pinned_cert or presented.pinned_cert)
        elif token is None:
            from corral.credentials import for_server
            from corral.settings import Settings

            presented = for_server(url, Settings.from_env().home)
            token = presented.token
            if ca_bundle is None and pinned_cert is None:
                ca_bundle, pinned_cert = presented.ca_bundle, presented.pinned_cert
        if ca_bundle is None and pinned_cert is None:
            ca_bundle = os.environ.get("CORRAL_CA_BUNDLE") or None
        self.url = url.rstrip("/")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidRequest(f"{url!r} is not an http(s):// server address")
        self._https = parts.scheme == "https"
        try:
            self._host, self._port = parts.hostname, parts.port
        except ValueError as exc:  # a port out of range, or not a number
            raise InvalidRequest(f"{url!r} is not a server address: {exc}") from None
        self._prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.ca_bundle, self.pinned_cert = ca_bundle, pinned_cert
        self.headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
        self._conn: http1.Connection | None = None
        self._tls = None
        # one exchange at a time on the kept connection: a Client shared by threads never
        # reads another call's answer (each stream has a connection of its own)
        self._exchange = allocate_lock()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self, timeout: float | None) -> http1.Connection:
        return http1.Connection(self._host, self._port, timeout, self._context() if self._https else None)

    def _context(self):  # noqa: ANN202 - ssl is imported only for https servers
        if self._tls is None:
            import ssl

            if self.ca_bundle:
                try:
                    self._tls = ssl.create_default_context(cafile=self.ca_bundle)
                except (OSError, ssl.SSLError) as exc:
                    raise InvalidRequest(f"cannot use the CA bundle {self.ca_bundle}: {exc}") from None
            elif self.pinned_cert:
                # Trust exactly the server's own certificate: pinned, so its host name need not match.
                context = ssl.create_default_context(cafile=self.pinned_cert)
                context.check_hostname = False
                context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
                self._tls = context
            else:
                self._tls = ssl.create_default_context()
        return self._tls

    def _request(self, method: str, path: str, params: dict[str, Any] | None = None, body: Any = None,
                 stream: bool = False, headers: dict[str, str] | None = None) -> tuple[http1.Connection, http1.Response]:
        query = urlencode([(k, _wire(v)) for k, value in (params or {}).items()
                           for v in (value if isinstance(value, list) else [value])])
        # an id with a space, a '?' or non-ASCII letters stays one path segment (and cannot end the line)
        target = quote(self._prefix + path, safe="/:@!$&'()*+,;=%") + (f"?{query}" if query else "")
        payload = json.dumps(body).encode() if body is not None else None
        headers = dict(self.headers, **(headers or {}),
                       **({"Content-Type": "application/json"} if payload is not None else {}))
        # A kept-alive connection the server has meanwhile closed fails at once; a GET is then sent
        # again on a fresh one. A POST always gets a fresh connection: never sent twice.
        reuse = not stream and method == "GET" and self._conn is not None
        if not stream and not reuse:
            self.close()
        for attempt in (1, 2):
            conn = self._connection(None) if stream else (self._conn or self._connection(self.timeout))
            try:
                response = conn.request(method, target, payload, headers)
            except http1.BadRequest as exc:
                what = str(exc).replace("the Authorization header", "the token")
                raise InvalidRequest(f"not sent to {self.url}: {what}") from None
            except OSError as exc:
                conn.close()
                if not stream:
                    self._conn = None
                stale = isinstance(exc, (http1.Closed, BrokenPipeError, ConnectionResetError))
                if reuse and stale and attempt == 1:
                    continue
                reason = "timed out" if isinstance(exc, socket.timeout) else exc
                if method != "GET" and conn.sent:  # it went out: the server may have carried it out
                    raise Unavailable(f"sent to the corral server at {self.url}, but no answer came ({reason}): it "
                                      "may have been carried out; look (corral queue, corral status) before sending "
                                      "it again") from None
                raise Unavailable(f"cannot reach the corral server at {self.url}: {reason}") from None
            if not stream:
                self._conn = conn
            return conn, response
        raise AssertionError("unreachable")

    def _call(self, method: str, path: str, params: dict[str, Any] | None = None, json_body: Any = None) -> Any:
        return self._tagged(method, path, params, json_body)[0]

    def _tagged(self, method: str, path: str, params: dict[str, Any] | None = None, json_body: Any = None,
                headers: dict[str, str] | None = None) -> tuple[Any, str | None]:
        """The answer's JSON and its ``ETag`` (None where the server sends none)."""
        with self._exchange:
            _, response = self._request(method, path, params, json_body, headers=headers)
            try:
                data = response.read()
            except OSError as exc:
                self.close()
                raise Unavailable(f"the corral server at {self.url} broke off its answer: {exc}") from None
        _check(response.status, data, self.url)
        try:
            return (json.loads(data) if data else None), response.headers.get("etag")
        except ValueError:
            raise Unavailable(f"{self.url} did not answer as a corral server does (HTTP {response.status}, "
                              f"{response.headers.get('content-type') or 'no content type'}, not JSON): is it "
                              "one? (CORRAL_SERVER, corral login)") from None

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health")

    def whoami(self) -> dict[str, Any]:
        """``{"user", "role", "source", "token"}``: who this client's token speaks for."""
        return self._call("GET", "/v1/whoami")

    def create_token(self, user: str, role: str | None = None, expires: str | float | None = None,
                     note: str | None = None) -> dict[str, Any]:
        """A new token for ``user`` (admin only): ``{"token": …, "info": {…}}``; the token is shown
        only in this answer. ``expires``: seconds or ``30d``, ``12h``."""
        return self._call("POST", "/v1/tokens", json_body={"user": user, "role": role, "expires": expires,
                                                           "note": note})

    def tokens(self, revoked: bool = False) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/tokens", {"revoked": revoked} if revoked else None)

    def revoke_token(self, token_id: int) -> dict[str, Any]:
        return self._call("POST", f"/v1/tokens/{token_id}/revoke")

    def audit(self, *, since: str | None = None, user: str | None = None, action: str | None = None,
              limit: int | None = None, after: int | None = None) -> list[dict[str, Any]]:
        """The audit trail (admin only), filtered; ``after`` is a cursor as for ``jobs``."""
        params = {k: v for k, v in (("since", since), ("user", user), ("action", action), ("limit", limit),
                                    ("after", after)) if v is not None}
        return self._call("GET", "/v1/audit", params)

    def submit(self, spec: str | os.PathLike | dict[str, Any] | list[dict[str, Any]], *, source: str | None = None,
               base_dir: str | None = None, name: str | None = None, env: dict[str, str] | None = None,
               scheduling: dict[str, Any] | None = None, array: str | None = None, cwd: str | None = None,
               workdir: str | None = None, export: str | None = None,
               environment: Mapping[str, str] | None = None,
               secrets: dict[str, str] | None = None, task: dict[str, Any] | None = None) -> dict[str, Any]:
        """Submit a job (or with ``array``, e.g. ``0-15%4``, a job array): ``spec`` is YAML text,
        a path to a YAML file, or the parsed document (a dict; a list of dicts for a job group's
        documents). ``scheduling`` takes ``partition``, ``account``, ``qos``, ``time_limit``,
        ``nice``, ``dependency``, ``hold``; ``secrets`` become secrets of every task; ``task``
        overrides a single-task file's ``num_nodes``, ``accelerators``, ``cpus``, ``memory``,
        ``image_id`` (``sky launch --num-nodes …``). Returns
        ``{"job": …, "warnings": […]}``.

        The submitter's world travels with the job, as with ``corral launch``: ``cwd`` (default:
        this process's directory; ``base_dir`` is its older name) is where a task without
        ``workdir`` runs and what a relative one resolves against; ``workdir`` overrides every
        task's; ``environment`` (default: this process's, its session-only variables left out)
        is what ``export`` (Slurm's ``--export``: ALL, NONE or a list; default: the site's)
        chooses from."""
        if isinstance(spec, os.PathLike):
            path = Path(spec)
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise InvalidRequest(f"cannot read {path}: {exc}") from None
            source = source or str(path)
        elif isinstance(spec, (dict, list)):
            import yaml

            docs = spec if isinstance(spec, list) else [spec]
            text = yaml.safe_dump_all(docs, sort_keys=False)
        else:
            text = spec
        from corral.spec.world import submitter_environment

        try:
            sent = submitter_environment(os.environ if environment is None else environment, export)
        except ValueError as exc:
            raise InvalidRequest(f"export: {exc}", 400) from None
        directory = cwd or base_dir or os.getcwd()
        return self._call("POST", "/v1/jobs", json_body={"yaml": text, "source": source, "cwd": directory,
                                                         "workdir": workdir, "environment": sent, "export": export,
                                                         "name": name, "env": env or {},
                                                         **({"secrets": secrets} if secrets else {}),
                                                         "scheduling": scheduling or {},
                                                         **({"array": array} if array is not None else {}),
                                                         **({"task": task} if task else {})})

    def wait(self, ident: str | int, *, states: tuple[str, ...] = TERMINAL, ready: bool = False,
             timeout: float | None = None, interval: float = 0.5) -> dict[str, Any]:
        """Wait until the job is in one of ``states`` (default: ended), or with ``ready`` until
        it runs with every replica READY (a job that ends first is returned as it ended), by
        long polls (``job_change``; a server without them is polled every ``interval`` s).
        Raises ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        tag = None
        while True:
            left = LONG_POLL_S if deadline is None else deadline - time.monotonic()
            asked = time.monotonic()
            job, new = self.job_change(ident, tag, left)
            unchanged, tag = new == tag, new
            replicas = [r for t in job["tasks"] for r in t["replicas"]]
            if job["state"] in TERMINAL or (not ready and job["state"] in states) or (
                    ready and job["state"] == "RUNNING" and all(r["ready"] and r["state"] == "RUNNING"
                                                                 for r in replicas)):
                return job
            if deadline is not None and time.monotonic() >= deadline:
                what = "every replica ready" if ready else " or ".join(states)
                raise TimeoutError(f"job {job['id']} is {job['state']} after {timeout:g}s, not {what}")
            if tag is None or (unchanged and time.monotonic() - asked < 0.05):
                # a server that cannot wait for a change, or no time left to wait in: polled
                time.sleep(interval if deadline is None else max(0.0, min(interval, deadline - time.monotonic())))

    def status(self, ident: str | int) -> dict[str, Any]:
        """The job with its tasks and replicas (same as ``job``)."""
        return self.job(ident)

    def endpoints(self, ident: str | int) -> dict[str, Any]:
        """Every replica's rank, name, address, ports, state and readiness, and each service
        task's balanced endpoint (``endpoints``): the job's ``CORRAL_PEERS_FILE`` document."""
        return self._call("GET", f"/v1/jobs/{_segment(ident)}/endpoints")

    def share(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/share")

    def priority(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/priority")

    def jobs(self, *, all: bool = False, states: list[str] | None = None, user: str | None = None,
             name: str | None = None, limit: int | None = None, account: str | None = None,
             partition: str | None = None, since: str | None = None, until: str | None = None,
             after: int | None = None, array: int | None = None) -> list[dict[str, Any]]:
        """Jobs in id order; ``since``/``until`` are ISO 8601 times (``sacct -S/-E``); ``after``
        a cursor (the page of ids above it; ``iter_jobs`` follows the pages)."""
        params: dict[str, Any] = {"all": all}
        if after is not None:
            params["after"] = after
        if array is not None:
            params["array"] = array
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

    def queue(self, *, user: str | None = None, account: str | None = None,
              partition: str | None = None) -> dict[str, Any]:
        """The live jobs matching the filters counted by state (``pending``, ``held`` among them,
        ``starting``, ``running``, ``preempted``) and the ``gpus`` they hold."""
        return self._call("GET", "/v1/queue", {k: v for k, v in (("user", user), ("account", account),
                                                                  ("partition", partition)) if v})

    def iter_jobs(self, *, page: int = 1000, **filters: Any) -> Iterator[dict[str, Any]]:
        """Every job matching ``filters`` (as ``jobs`` takes them), oldest first, a page at a time."""
        after = 0
        while True:
            batch = self.jobs(limit=page, after=after, **filters)
            yield from batch
            if len(batch) < page:
                return
            after = batch[-1]["id"]

    def job(self, ident: str | int) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{_segment(ident)}")

    def job_change(self, ident: str | int, seen: str | None, wait: float) -> tuple[dict[str, Any], str | None]:
        """The job and its tag once it differs from the one tagged ``seen``, or as it is after
        ``wait`` seconds (a long poll). A server that cannot wait answers at once, with no tag."""
        wait = max(0.0, min(wait, LONG_POLL_S, self.timeout - 5.0))
        params, headers = ({"wait": round(wait, 3)}, {"If-None-Match": seen}) if seen and wait > 0 else (None, None)
        return self._tagged("GET", f"/v1/jobs/{_segment(ident)}", params, headers=headers)

    def cancel(self, ident: str | int, force: bool = False) -> dict[str, Any]:
        """Stop the job (its replicas' stop signal, SIGKILL after their grace period); ``force``:
        SIGKILL now, also for a job already in its grace period."""
        return self._call("POST", f"/v1/jobs/{_segment(ident)}/cancel", {"force": True} if force else None)

    def hold(self, ident: str | int) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{_segment(ident)}/hold")

    def release(self, ident: str | int) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{_segment(ident)}/release")

    def requeue(self, ident: str | int, hold: bool = False) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{_segment(ident)}/requeue", {"hold": True} if hold else None)

    def set_priority(self, ident: str | int, **changes: float | int | None) -> dict[str, Any]:
        """Change a pending job's ``priority`` (None: back to the formula's) and/or ``nice``."""
        return self._call("POST", f"/v1/jobs/{_segment(ident)}/priority", json_body=changes)

    def scale(self, ident: str | int, task: str, replicas: int | None = None, min_nodes: int | None = None,
              max_nodes: int | None = None) -> dict[str, Any]:
        """A task's replica count and/or its elastic bounds (a count alone on an autoscaled
        task pins both bounds to it)."""
        body = {"task": task, "replicas": replicas, "min_nodes": min_nodes, "max_nodes": max_nodes}
        return self._call("POST", f"/v1/jobs/{_segment(ident)}/scale", json_body={k: v for k, v in body.items() if v is not None})

    def events(self, ident: str | int) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/jobs/{_segment(ident)}/events")

    def partitions(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/partitions")

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
        conn, response = self._request("GET", f"/v1/jobs/{_segment(ident)}/logs", params, stream=True)
        try:
            if not 200 <= response.status < 300:
                _check(response.status, response.read(), self.url)
            while True:
                try:
                    chunk = response.read1(65536)
                except OSError as exc:
                    raise Unavailable(f"log stream from {self.url} broke: {exc}") from None
                if not chunk:
                    return
                yield chunk
        finally:
            conn.close()

    def shell(self, ident: str | int, command: list[str] | tuple[str, ...] = (), replica: str | None = None,
              tty: bool = False, rows: int = 24, cols: int = 80, term: str = "xterm") -> ShellSession:
        """A process started in a running replica's world (its namespaces or container,
        working directory, environment, Unix account): ``command``, or with none the
        account's shell. ``replica`` is ``task-rank`` (rank 0 of the first task by default);
        ``tty`` gives it a terminal of ``rows`` x ``cols``. Returned once it runs; refusals
        raise as for every call (``Forbidden`` for another user's job, ``Conflict`` when
        the job or replica is not running, ``NotFound`` for no such replica)."""

        from websockets.exceptions import InvalidHandshake, InvalidStatus, WebSocketException
        from websockets.sync.client import connect

        query = f"?{urlencode({'replica': replica})}" if replica else ""
        scheme = "wss" if self._https else "ws"
        port = f":{self._port}" if self._port else ""
        url = f"{scheme}://{self._host}{port}{self._prefix}/v1/jobs/{_segment(ident)}/shell{query}"
        try:
            ws = connect(url, additional_headers={k: v for k, v in self.headers.items() if k != "Accept"},
                         ssl=self._context() if self._https else None, open_timeout=self.timeout, max_size=None,
                         compression=None, user_agent_header=None).__enter__()  # (closed by the session)
        except InvalidStatus as exc:
            _check(exc.response.status_code, exc.response.body or b"")
            raise CorralError(f"the server at {self.url} refused the connection ({exc})") from None
        except (OSError, InvalidHandshake, WebSocketException, TimeoutError) as exc:
            raise Unavailable(f"cannot reach the corral server at {self.url}: {exc}") from None
        session = ShellSession(ws, self.url)
        try:
            ws.send(json.dumps({"command": list(command), "tty": tty, "rows": rows, "cols": cols, "term": term}))
            first = session.receive()
        except BaseException:
            session.close()
            raise
        if first[0] != "started":
            session.close()
            raise Unavailable(f"the corral server at {self.url} did not start it: {first!r}")
        session.replica = first[1]
        return session

    def exec(self, ident: str | int, command: list[str] | tuple[str, ...], replica: str | None = None,
             stdin: bytes = b"") -> tuple[int, bytes, bytes]:
        """``command`` run in a running replica's world (as ``shell``, without a terminal) with
        ``stdin``: (exit code, stdout, stderr)."""
        session = self.shell(ident, command, replica)
        out, err = bytearray(), bytearray()
        try:
            if stdin:
                session.send(stdin)
            session.eof()
            while True:
                kind, data = session.receive()
                if kind == "exit":
                    return int(data), bytes(out), bytes(err)
                (out if kind == 1 else err).extend(data)
        finally:
            session.close()


class ShellSession:
    """A process started by ``Client.shell``: send it input, resize its terminal, signal it;
    ``receive`` gives (1, bytes) for its stdout or terminal, (2, bytes) for its stderr, and
    ("exit", code) at its end. ``send`` may be called from another thread than ``receive``."""

    def __init__(self, ws, url: str):  # noqa: ANN001 - a websockets ClientConnection
        self._ws, self.url = ws, url
        self.replica: dict[str, Any] = {}
        self.code: int | None = None

    def send(self, data: bytes) -> None:
        self._send(bytes(data))

    def resize(self, rows: int, cols: int) -> None:
        self._send(json.dumps({"resize": [rows, cols]}))

    def signal(self, name: str) -> None:
        """Send signal ``name`` (INT, TERM, HUP, QUIT, KILL, USR1, USR2, TSTP, CONT) to it."""
        self._send(json.dumps({"signal": name}))

    def eof(self) -> None:
        """End of its standard input."""
        self._send(json.dumps({"eof": True}))

    def _send(self, message: bytes | str) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            self._ws.send(message)
        except ConnectionClosed:
            pass  # it ended: ``receive`` says how

    def receive(self) -> tuple[Any, Any]:
        from websockets.exceptions import ConnectionClosed

        try:
            message = self._ws.recv()
        except ConnectionClosed:
            raise Unavailable(f"the corral server at {self.url} ended the connection before the process "
                              "ended") from None
        if isinstance(message, bytes):
            return message[0], message[1:]
        said = json.loads(message)
        if "error" in said:
            raise BY_STATUS.get(said.get("status"), CorralError)(said["error"], said.get("status"))
        if "exit" in said:
            self.code = int(said["exit"])
            return "exit", self.code
        return "started", said.get("started")

    def close(self) -> None:
        self._ws.close()

    def __enter__(self) -> ShellSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _segment(value: object) -> str:
    """A job id or name as one path segment (a '%' or '?' in it stays inside it); no job's id
    or name holds a '/', so one that does names none (NotFound), never another path."""
    text = str(value)
    if "/" in text:
        raise NotFound(f"no job {text!r}: a job's id or name never holds '/'", 404)
    return quote(text, safe="")


def _wire(value: Any) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else str(value)
