"""Reward service: scores completions against the task's verifiable rule."""

import json
import os

from policy import reward
from wire import serve


def score(body, headers):
    request = json.loads(body)
    return 200, {"rewards": [reward(t, digits) for t, digits in zip(request["targets"], request["completions"])]}


serve({("GET", "/health"): lambda b, h: (200, {"ok": True}), ("POST", "/score"): score},
      int(os.environ.get("CORRAL_PORT_HTTP", "8100")))
