#!/usr/bin/env python3
"""Where one launch's time goes, inside the server: submit jobs one at a time to a server whose
launch-path functions are timed (``bench/trace/sitecustomize.py``) and print, per sample, every
timed call between the submit and the replica's first instruction, then the medians of the
segments (api: request to intake; store: the intake's commit; cycle_to_spawn: loop cycle start
to the first spawn; spawns: all spawns of the job; wrapper: last spawn's return to the
replica's first instruction).

  python bench/launch_trace.py CHECKOUT SAMPLES one|group [SHOWN]

CHECKOUT is the corral tree to trace (its server imports it through PYTHONPATH)."""
import json, os, signal, sys, tempfile, time, statistics
from pathlib import Path
root = Path(sys.argv[1]).resolve(); sys.path.insert(0, str(root))
samples = int(sys.argv[2]); group = sys.argv[3] == "group"
try:
    from corral import embedded as daemon
except ImportError:
    from corral.cli import daemon
from corral.client import Client
from corral.settings import Settings
try:
    from corral.credentials import read_local_token
except ImportError:
    read_local_token = lambda h: None
home = Path(tempfile.mkdtemp(prefix="corral-perf-"))
(home / "config.yaml").write_text("nodes:\n  - name: node\n    gpus: 8\n    gpu_type: H100\n    cpus: 64\n    memory: 512\n")
env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
env["CORRAL_HOME"] = str(home)
trace = home / "trace.json"
os.environ["CORRAL_PERFTRACE"] = str(trace)
os.environ["PYTHONPATH"] = str(Path(__file__).resolve().parent / "trace") + os.pathsep + str(root)
settings = Settings.from_env(env)
info = daemon.start(settings)
client = Client(info["url"], read_local_token(home))
work = home / "work"; work.mkdir()
def wait_file(p):
    while True:
        try:
            t = p.read_text().strip()
            if t: return float(t)
        except (OSError, ValueError): pass
        time.sleep(0.001)
def idle():
    while client.jobs(limit=1): time.sleep(0.01)
marks = []
for i in range(samples):
    files = [work / f"l{i}-{t}" for t in range(4 if group else 1)]
    if group:
        text = "---\n".join(["name: lat\nexecution: parallel\n"] + [f"name: t{t}\nrun: date +%s.%N > {files[t]}.tmp && mv {files[t]}.tmp {files[t]}\n" for t in range(4)])
    else:
        text = f"name: lat\nrun: date +%s.%N > {files[0]}.tmp && mv {files[0]}.tmp {files[0]}\n"
    t0 = time.time(); client.submit(text); t1 = time.time()
    ran = max(wait_file(f) for f in files)
    marks.append((t0, t1, ran))
    idle(); time.sleep(0.05)
os.kill(info["pid"], signal.SIGUSR2); time.sleep(0.5)
daemon.stop(settings)
ev = json.loads(trace.read_text()) if trace.exists() else []
lat = [r - t0 for t0, _, r in marks]
print("p50 %.1f ms" % (statistics.median(lat) * 1000), " submit-return p50 %.1f ms" % (statistics.median([t1 - t0 for t0, t1, _ in marks]) * 1000))
for (t0, t1, ran) in (marks[-int(sys.argv[4]):] if len(sys.argv) > 4 and int(sys.argv[4]) > 0 else []) if len(sys.argv) > 4 else marks[-3:]:
    print(f"--- sample: submit returned +{(t1-t0)*1000:.1f}  ran +{(ran-t0)*1000:.1f}")
    for s, d, th, name in sorted(ev):
        if t0 - 0.001 <= s <= ran + 0.002:
            print(f"  +{(s-t0)*1000:6.1f} {d*1000:6.1f}ms {th[:18]:18s} {name}")
# segment medians
seg = {}
def first(name, lo, hi):
    c = [e for e in ev if e[3] == name and lo - 0.001 <= e[0] <= hi]
    return min(c) if c else None
for (t0, t1, ran) in marks:
    sub = first("Intake.submit", t0, ran); st = first("Intake._store", t0, ran); cy = first("ControlLoop.cycle", t0, ran)
    sp = [e for e in ev if e[3] == "NodeRunner.spawn" and t0 <= e[0] <= ran]
    if not (sub and st and cy and sp): continue
    last = max(sp, key=lambda e: e[0] + e[1]); fs = min(sp)
    for k, v in (("api", sub[0] - t0), ("intake_wait", st[0] - sub[0]), ("store", st[1]), ("to_cycle", cy[0] - st[0] - st[1]),
                 ("cycle_to_spawn", fs[0] - cy[0]), ("spawns", last[0] + last[1] - fs[0]), ("wrapper", ran - last[0] - last[1]),
                 ("submit_return", t1 - t0), ("total", ran - t0)):
        seg.setdefault(k, []).append(v * 1000)
print("  ".join(f"{k} {statistics.median(v):.1f}" for k, v in seg.items()))
