"""Rollout replica: serves generation from the newest policy weights it was sent.

POST /weights   raw state_dict bytes, header X-Weight-Version; older versions are refused
POST /generate  {version, targets, group_size} -> {completions, logps}; a request for a
                version other than the loaded one is refused (409), so no stale sample
                ever reaches the trainer
GET  /health    readiness (the server is up) and the loaded version"""

import json
import os
import threading

import torch

from policy import Policy, encode_prompt, from_bytes
from wire import serve

torch.set_num_threads(1)
policy, version, lock = Policy(), -1, threading.Lock()


def health(body, headers):
    return 200, {"version": version, "replica": os.environ.get("CORRAL_HOSTNAME")}


def weights(body, headers):
    global version
    incoming = int(headers.get("X-Weight-Version", "-1"))
    with lock:
        if incoming < version:
            return 409, {"error": "stale weights", "have": version}
        from_bytes(policy, body)
        version = incoming
    return 200, {"version": version}


def generate(body, headers):
    request = json.loads(body)
    with lock:
        if request["version"] != version:
            return 409, {"error": "version mismatch", "have": version}
        prompts = [encode_prompt(t) for t in request["targets"] for _ in range(request["group_size"])]
        digits, logps = policy.sample(prompts)
    return 200, {"version": version, "completions": digits, "logps": logps}


serve({("GET", "/health"): health, ("POST", "/weights"): weights, ("POST", "/generate"): generate},
      int(os.environ.get("CORRAL_PORT_HTTP", "8000")))
