"""The Python client of the corral API (what the CLI uses, and an SDK for scripts)."""

from __future__ import annotations

import getpass
from collections.abc import Iterator
from typing import Any

import httpx


class CorralError(RuntimeError):
    def __init__(self, message: str, status: int | None = None, errors: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.errors = errors or []


class Client:
    def __init__(self, url: str, user: str | None = None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, timeout=timeout,
                                 headers={"X-Corral-User": user or getpass.getuser()})

    def close(self) -> None:
        self.http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise CorralError(f"cannot reach the corral server at {self.url}: {exc}") from None
        return self._check(response).json()

    @staticmethod
    def _check(response: httpx.Response) -> httpx.Response:
        if response.status_code < 400:
            return response
        try:
            detail = response.json().get("detail")
        except ValueError:
            detail = response.text
        if isinstance(detail, dict):
            raise CorralError(detail.get("message", "request failed"), response.status_code, detail.get("errors"))
        if isinstance(detail, list):  # FastAPI request validation
            msgs = [f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}" for d in detail]
            raise CorralError("; ".join(msgs), response.status_code)
        raise CorralError(str(detail), response.status_code)

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health")

    def submit(self, yaml_text: str, *, source: str | None = None, base_dir: str | None = None,
               name: str | None = None, env: dict[str, str] | None = None,
               scheduling: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._call("POST", "/v1/jobs", json={"yaml": yaml_text, "source": source, "base_dir": base_dir,
                                                    "name": name, "env": env or {}, "scheduling": scheduling or {}})

    def share(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/share")

    def priority(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/priority")

    def jobs(self, *, all: bool = False, states: list[str] | None = None, user: str | None = None,
             name: str | None = None, limit: int | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"all": all}
        if limit:
            params["limit"] = limit
        if states:
            params["state"] = states
        if user:
            params["user"] = user
        if name:
            params["name"] = name
        return self._call("GET", "/v1/jobs", params=params)

    def job(self, ident: str | int) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{ident}")

    def cancel(self, ident: str | int) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{ident}/cancel")

    def scale(self, ident: str | int, task: str, replicas: int) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{ident}/scale", json={"task": task, "replicas": replicas})

    def events(self, ident: str | int) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/jobs/{ident}/events")

    def nodes(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/nodes")

    def logs(self, ident: str | int, replica: str | None = None, follow: bool = False,
             prefix: bool | None = None) -> Iterator[bytes]:
        params: dict[str, Any] = {"follow": follow}
        if replica:
            params["replica"] = replica
        if prefix is not None:
            params["prefix"] = prefix
        try:
            with self.http.stream("GET", f"/v1/jobs/{ident}/logs", params=params, timeout=None) as response:
                if response.status_code >= 400:
                    response.read()
                    self._check(response)
                yield from response.iter_raw()
        except httpx.HTTPError as exc:
            raise CorralError(f"log stream from {self.url} broke: {exc}") from None
