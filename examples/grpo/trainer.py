"""GRPO trainer (the job group's primary task).

Each iteration: sample prompts; ask the ready rollout replicas (read from the peers file
corral keeps current, so restarted or newly scaled replicas join by themselves) for G
completions per prompt; score them with the reward service; store the scored groups in the
buffer and take back this version's groups; compute group-relative advantages
(r - mean) / std; take clipped policy-gradient steps with a KL penalty to a frozen
reference; ship the new weights, with a version number, to every rollout replica.
Checkpoints to CORRAL_CHECKPOINT_DIR and resumes from there after a restart."""

import copy
import json
import os
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from policy import TARGETS, Policy, encode_prompt, to_bytes
from wire import call

ITERATIONS = int(os.environ.get("GRPO_ITERATIONS", "120"))
PROMPTS, GROUP = 16, 8  # prompts per iteration, completions per prompt
CLIP, KL_BETA, LR, EPOCHS = 0.2, 0.02, 3e-3, 2
JOB = os.environ.get("CORRAL_JOB_NAME", "grpo")
METRICS = Path(os.environ.get("GRPO_METRICS", "grpo-metrics.jsonl"))
CHECKPOINT = Path(os.environ.get("CORRAL_CHECKPOINT_DIR", ".")) / "grpo.pt"

torch.set_num_threads(1)
torch.manual_seed(0)
random.seed(0)
policy = Policy()
reference = copy.deepcopy(policy).requires_grad_(False)
optimizer = torch.optim.Adam(policy.parameters(), lr=LR)
start, version = 0, 0
if CHECKPOINT.exists():  # resume after a restart or a requeue
    state = torch.load(CHECKPOINT, weights_only=True)
    policy.load_state_dict(state["policy"])
    reference.load_state_dict(state["reference"])
    optimizer.load_state_dict(state["optimizer"])
    start, version = state["iteration"], state["version"]
    print(f"resumed from {CHECKPOINT} at iteration {start}", flush=True)


def peer_url(task: str, port_name: str = "http") -> str:
    peers = json.loads(Path(os.environ["CORRAL_PEERS_FILE"]).read_text())
    replica = peers["tasks"][task]["replicas"][0]
    return f"http://{replica['hostname']}:{replica['ports'][port_name]}"  # ports are per replica


def rollout_urls() -> list[str]:
    """Every ready rollout replica, by name; re-read each iteration."""
    while True:
        peers = json.loads(Path(os.environ["CORRAL_PEERS_FILE"]).read_text())
        task = peers["tasks"]["rollout"]
        urls = [f"http://{r['hostname']}:{r['ports']['http']}" for r in task["replicas"]
                if r["state"] == "RUNNING" and r["ready"]]
        if urls:
            return urls
        time.sleep(0.2)  # all of them are restarting: wait for one to come back


def push_weights(url: str, blob: bytes) -> bool:
    try:
        status, _ = call(url + "/weights", data=blob, headers={"X-Weight-Version": str(version)}, timeout=10)
        return status == 200
    except OSError:
        return False  # that replica is down; corral restarts it and it is synced when back


def generate(url: str, targets: list[int], blob: bytes):
    """Completions from one replica; brings a replica that lags (e.g. just restarted) up to date."""
    for _ in range(3):
        status, body = call(url + "/generate", {"version": version, "targets": targets, "group_size": GROUP})
        if status == 200:
            return body
        push_weights(url, blob)
    raise RuntimeError(f"{url} could not serve version {version}")


def generate_elsewhere(targets: list[int], blob: bytes):
    """The prompts of a replica that died mid-request, from the first one that answers
    (the peers file may still list the dead one for a moment)."""
    while True:
        for url in rollout_urls():
            try:
                return generate(url, targets, blob)
            except (OSError, RuntimeError) as exc:
                print(f"rollout {url} failed too ({exc})", flush=True)
        time.sleep(0.2)


def generate_all(targets: list[int], blob: bytes) -> tuple[list, list, int]:
    urls = rollout_urls()
    shards = [targets[i::len(urls)] for i in range(len(urls))]
    completions, logps = {}, {}
    with ThreadPoolExecutor(len(urls)) as pool:
        futures = {pool.submit(generate, url, shard, blob): shard for url, shard in zip(urls, shards) if shard}
        for future, shard in futures.items():
            try:
                body = future.result()
            except (OSError, RuntimeError) as exc:  # a replica died mid-request: use another
                print(f"rollout failed ({exc}); retrying its prompts elsewhere", flush=True)
                body = generate_elsewhere(shard, blob)
            for i, target in enumerate(shard):
                completions[target] = body["completions"][i * GROUP:(i + 1) * GROUP]
                logps[target] = body["logps"][i * GROUP:(i + 1) * GROUP]
    return completions, logps, len(urls)


def train_step(groups: list[dict]) -> None:
    prompts = [encode_prompt(g["target"]) for g in groups for _ in g["completions"]]
    digits = torch.tensor([c for g in groups for c in g["completions"]])
    old = torch.tensor([lp for g in groups for lp in g["logps"]])
    advantages = []
    for g in groups:  # group-relative advantage: how much better than its siblings
        mean, std = statistics.fmean(g["rewards"]), statistics.pstdev(g["rewards"])
        advantages += [(r - mean) / (std + 1e-4) for r in g["rewards"]]
    adv = torch.tensor(advantages)[:, None]
    for _ in range(EPOCHS):
        new = policy.logprobs(prompts, digits)
        ratio = torch.exp(new - old)
        surrogate = torch.min(ratio * adv, torch.clamp(ratio, 1 - CLIP, 1 + CLIP) * adv)
        with torch.no_grad():
            ref = reference.logprobs(prompts, digits)
        kl = torch.exp(ref - new) - (ref - new) - 1  # k3 estimator, always >= 0
        loss = -(surrogate - KL_BETA * kl).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


reward_url, buffer_url = peer_url("reward"), peer_url("buffer")
blob = to_bytes(policy)
versions = [call(url + "/health")[1]["version"] for url in rollout_urls()]
version = max([version] + versions) + 1  # newer than anything a rollout holds, even after a resume
for url in rollout_urls():
    push_weights(url, blob)
history = []
for iteration in range(start, ITERATIONS):
    t0 = time.perf_counter()
    targets = random.sample(list(TARGETS), PROMPTS)
    completions, logps, replicas = generate_all(targets, blob)
    t1 = time.perf_counter()
    flat = [(t, c) for t in targets for c in completions[t]]
    _, scored = call(reward_url + "/score", {"targets": [t for t, _ in flat], "completions": [c for _, c in flat]})
    rewards = scored["rewards"]
    t2 = time.perf_counter()
    groups = [{"target": t, "completions": completions[t], "logps": logps[t],
               "rewards": rewards[i * GROUP:(i + 1) * GROUP]} for i, t in enumerate(targets)]
    call(buffer_url + "/add", {"version": version, "groups": groups})
    _, taken = call(buffer_url + "/take", {"version": version})
    train_step(taken["groups"])
    t3 = time.perf_counter()
    version += 1
    blob = to_bytes(policy)
    urls = rollout_urls()
    with ThreadPoolExecutor(len(urls)) as pool:
        list(pool.map(lambda url: push_weights(url, blob), urls))
    t4 = time.perf_counter()
    mean_reward = statistics.fmean(rewards)
    history.append(mean_reward)
    record = {"iteration": iteration, "mean_reward": round(mean_reward, 4), "weight_version": version,
              "rollout_replicas": replicas, "generation_s": round(t1 - t0, 4), "reward_s": round(t2 - t1, 4),
              "training_s": round(t3 - t2, 4), "weight_sync_s": round(t4 - t3, 4)}
    with METRICS.open("a") as fh:
        fh.write(json.dumps(record) + "\n")
    print(f"iter {iteration:3d} reward {mean_reward:.3f} version {version} rollouts {replicas} "
          f"(gen {t1 - t0:.3f}s reward {t2 - t1:.3f}s train {t3 - t2:.3f}s sync {t4 - t3:.3f}s)", flush=True)
    if iteration % 10 == 9 or iteration == ITERATIONS - 1:
        tmp = CHECKPOINT.with_suffix(".tmp")
        torch.save({"policy": policy.state_dict(), "reference": reference.state_dict(),
                    "optimizer": optimizer.state_dict(), "iteration": iteration + 1, "version": version}, tmp)
        tmp.replace(CHECKPOINT)

if len(history) >= 20:
    print(f"mean reward: first 10 iterations {statistics.fmean(history[:10]):.3f}, "
          f"last 10 {statistics.fmean(history[-10:]):.3f}", flush=True)
if METRICS.exists():
    rows = [json.loads(line) for line in METRICS.read_text().splitlines()]
    spent = {k: sum(r[k] for r in rows) for k in ("generation_s", "reward_s", "training_s", "weight_sync_s")}
    total = sum(spent.values()) or 1.0
    print("time split: " + ", ".join(f"{k[:-2]} {v / total:.0%}" for k, v in spent.items()), flush=True)
