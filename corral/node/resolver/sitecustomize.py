"""Injected into replicas' Python (via PYTHONPATH) so corral names resolve through the
ordinary socket API: ``getaddrinfo("rollout-1.myjob", 8000)`` finds the replica's address in
the job's hosts file (``CORRAL_HOSTS_FILE``), re-read whenever it changes. Names it does not
know go to the system resolver untouched. Any other ``sitecustomize`` on the path still
runs afterwards."""

import importlib.machinery
import importlib.util
import os
import socket
import sys

_HOSTS = os.environ.get("CORRAL_HOSTS_FILE")
_cache = {"mtime": None, "names": {}}


def _names():
    try:
        mtime = os.stat(_HOSTS).st_mtime_ns
    except OSError:
        return _cache["names"]
    if mtime != _cache["mtime"]:
        names = {}
        try:
            with open(_HOSTS) as fh:
                for line in fh:
                    parts = line.split("#", 1)[0].split()
                    for name in parts[1:]:
                        names[name.lower()] = parts[0]
        except OSError:
            return _cache["names"]
        _cache["mtime"], _cache["names"] = mtime, names
    return _cache["names"]


def _lookup(host):
    if isinstance(host, bytes):
        host = host.decode("ascii", "ignore")
    if not isinstance(host, str):
        return None
    return _names().get(host.lower().rstrip("."))


if _HOSTS:
    _getaddrinfo, _gethostbyname, _gethostbyname_ex = socket.getaddrinfo, socket.gethostbyname, socket.gethostbyname_ex

    def getaddrinfo(host, *args, **kwargs):
        return _getaddrinfo(_lookup(host) or host, *args, **kwargs)

    def gethostbyname(host):
        return _lookup(host) or _gethostbyname(host)

    def gethostbyname_ex(host):
        addr = _lookup(host)
        return (host, [], [addr]) if addr else _gethostbyname_ex(host)

    socket.getaddrinfo, socket.gethostbyname, socket.gethostbyname_ex = getaddrinfo, gethostbyname, gethostbyname_ex


def _chain():
    """Run the sitecustomize this one shadows, if any."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.origin is None or os.path.dirname(os.path.abspath(spec.origin)) == here:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_chain()
