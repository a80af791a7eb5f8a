"""What a client presents to a corral server, and where it keeps it.

The embedded server writes a fresh *local token* to ``CORRAL_HOME/local.token`` (mode 0600,
in a 0700 directory) each time it starts: whoever can read it is the server's owner, which
the operating system decides, not a header anyone could set. ``corral login`` saves a server's
address and token in ``$XDG_CONFIG_HOME/corral/credentials.json`` (0600), so later commands
and ``corral.Client`` use them. Standard library only: every CLI command imports this."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

LOCAL_TOKEN_FILE = "local.token"


def local_token_path(home: Path) -> Path:
    return home / LOCAL_TOKEN_FILE


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable by its owner only, atomically: the file is created
    0600 (never briefly wider) and renamed over the old one."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_local_token(home: Path) -> str:
    """A new local token for a server of ``home``, written for its owner alone."""
    import secrets  # only the server makes tokens: every CLI command imports this module

    token = "corral_local_" + secrets.token_urlsafe(32)  # 256 random bits
    write_private(local_token_path(home), token + "\n")
    return token


def read_local_token(home: Path) -> str | None:
    try:
        return local_token_path(home).read_text().strip() or None
    except OSError:
        return None


def remove_local_token(home: Path, token: str) -> None:
    """Remove the local token file if it is still ``token`` (a newer server may have replaced it)."""
    import hmac

    current = read_local_token(home)
    if current is not None and hmac.compare_digest(current, token):
        try:
            local_token_path(home).unlink()
        except OSError:
            pass


class Presented:
    """What a client shows a server: a token (or none), and how it checks the server's
    certificate: a CA bundle, or (the embedded server's own certificate) that exact one."""

    __slots__ = ("token", "ca_bundle", "pinned_cert")

    def __init__(self, token: str | None, ca_bundle: str | None = None, pinned_cert: str | None = None):
        self.token, self.ca_bundle, self.pinned_cert = token, ca_bundle, pinned_cert


def local_server(home: Path) -> dict[str, Any] | None:
    """The server.json of ``home`` (it may be stale: the caller checks it answers)."""
    try:
        info = json.loads((home / "server.json").read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def for_server(url: str, home: Path) -> Presented:
    """How to reach ``url``: ``CORRAL_TOKEN``, else the token ``corral login`` saved for it, else,
    when it is ``home``'s own server, the local token. ``CORRAL_CA_BUNDLE`` names a CA bundle."""
    url = _normal(url)
    ca_bundle = os.environ.get("CORRAL_CA_BUNDLE") or None
    saved = SavedLogins().lookup(url)
    info = local_server(home)
    local = info is not None and _normal(str(info.get("url", ""))) == url
    pinned = info.get("tls_cert") if local and not ca_bundle else None
    token = os.environ.get("CORRAL_TOKEN") or None
    if token is None and saved:
        token = saved.get("token")
    if saved and not ca_bundle:
        ca_bundle = saved.get("ca_bundle")
        pinned = None if ca_bundle else pinned
    if token is None and local:
        token = read_local_token(home)
    return Presented(token, ca_bundle, pinned)


def credentials_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "corral" / "credentials.json"


def _normal(url: str) -> str:
    return url.rstrip("/")


class SavedLogins:
    """The servers ``corral login`` saved: ``{"default": URL, "servers": {URL: {"token", "ca_bundle"}}}``."""

    def __init__(self, path: Path | None = None):
        self.path = path or credentials_path()

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {"default": None, "servers": {}}
        if not isinstance(data, dict) or not isinstance(data.get("servers"), dict):
            return {"default": None, "servers": {}}
        return data

    def default(self) -> tuple[str, dict[str, Any]] | None:
        """The server of the last ``corral login`` and its entry, if any."""
        data = self._load()
        url = data.get("default")
        entry = data["servers"].get(url) if url else None
        return (url, entry) if isinstance(entry, dict) else None

    def lookup(self, url: str) -> dict[str, Any] | None:
        entry = self._load()["servers"].get(_normal(url))
        return entry if isinstance(entry, dict) else None

    def save(self, url: str, token: str, ca_bundle: str | None = None) -> None:
        data = self._load()
        data["servers"][_normal(url)] = {"token": token, **({"ca_bundle": ca_bundle} if ca_bundle else {})}
        data["default"] = _normal(url)
        write_private(self.path, json.dumps(data, indent=2) + "\n")

    def remove(self, url: str | None = None) -> str | None:
        """Forget ``url`` (default: the default server); the URL forgotten, or None."""
        data = self._load()
        url = _normal(url) if url else data.get("default")
        if not url or url not in data["servers"]:
            return None
        del data["servers"][url]
        if data.get("default") == url:
            data["default"] = next(iter(data["servers"]), None)
        write_private(self.path, json.dumps(data, indent=2) + "\n")
        return url
