"""Replay buffer: keeps scored groups by weight version; the trainer takes the groups of
the version it is training on (on-policy GRPO), the rest age out."""

import collections
import json
import os
import threading

from wire import serve

groups, lock = collections.deque(maxlen=4096), threading.Lock()


def add(body, headers):
    request = json.loads(body)
    with lock:
        groups.extend({"version": request["version"], **g} for g in request["groups"])
    return 200, {"size": len(groups)}


def take(body, headers):
    version = json.loads(body)["version"]
    with lock:
        batch = [g for g in groups if g["version"] == version]
        rest = [g for g in groups if g["version"] != version]
        groups.clear()
        groups.extend(rest)
    return 200, {"groups": batch}


serve({("GET", "/health"): lambda b, h: (200, {"size": len(groups)}), ("POST", "/add"): add, ("POST", "/take"): take},
      int(os.environ.get("CORRAL_PORT_HTTP", "8200")))
