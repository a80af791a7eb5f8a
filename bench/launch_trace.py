#!/usr/bin/env python3
"""Where one launch's time goes, inside the server: submit jobs one at a time to a server whose
launch-path functions are timed (``bench/trace/sitecustomize.py``) and print, per sample, every
timed call between the submit and the replica's first instruction, then the medians of the
segments (api: request to intake; store: the intake's commit; cycle_to_spawn: loop cycle start
to the first spawn; spawns: all spawns of the job; wrapper: last spawn's return to the
replica's first instruction).

  python bench/launch_trace.py CHECKOUT SAMPLES one|group [SHOWN]

CHECKOUT is the corral tree to trace (its server imports it through PYTHONPATH)."""
from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

POOL = "nodes:\n  - name: node\n    gpus: 8\n    gpu_type: H100\n    cpus: 64\n    memory: 512\n"


def wait_file(path: Path) -> float:
    while True:
        try:
            text = path.read_text().strip()
            if text:
                return float(text)
        except (OSError, ValueError):
            pass
        time.sleep(0.001)


def job_text(files: list[Path]) -> str:
    runs = [f"run: date +%s.%N > {f}.tmp && mv {f}.tmp {f}\n" for f in files]
    if len(files) == 1:
        return "name: lat\n" + runs[0]
    return "---\n".join(["name: lat\nexecution: parallel\n"] + [f"name: t{t}\n{run}" for t, run in enumerate(runs)])


def segments(events: list, marks: list) -> dict[str, list[float]]:
    def first(name: str, lo: float, hi: float):  # noqa: ANN202 - an event row
        found = [e for e in events if e[3] == name and lo - 0.001 <= e[0] <= hi]
        return min(found) if found else None

    out: dict[str, list[float]] = {}
    for t0, t1, ran in marks:
        sub, store = first("Intake.submit", t0, ran), first("Intake._store", t0, ran)
        cycle = first("ControlLoop.cycle", t0, ran)
        # a gang's starts (``start_gang``): each begun, its fork taken back later (``Spawning.result``)
        spawns = [e for e in events if e[3] in ("NodeRunner.spawn", "NodeRunner.begin_spawn", "Spawning.result")
                  and t0 <= e[0] <= ran]
        if not (sub and store and cycle and spawns):
            continue
        last, first_spawn = max(spawns, key=lambda e: e[0] + e[1]), min(spawns)
        for key, value in (("api", sub[0] - t0), ("intake_wait", store[0] - sub[0]), ("store", store[1]),
                           ("to_cycle", cycle[0] - store[0] - store[1]), ("cycle_to_spawn", first_spawn[0] - cycle[0]),
                           ("spawns", last[0] + last[1] - first_spawn[0]), ("wrapper", ran - last[0] - last[1]),
                           ("submit_return", t1 - t0), ("total", ran - t0)):
            out.setdefault(key, []).append(value * 1000)
    return out


def main() -> None:
    if len(sys.argv) < 4 or sys.argv[3] not in ("one", "group"):
        sys.exit(__doc__)
    root = Path(sys.argv[1]).resolve()
    samples, group = int(sys.argv[2]), sys.argv[3] == "group"
    shown = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    sys.path.insert(0, str(root))
    try:
        from corral import embedded as daemon
    except ImportError:  # an older checkout
        from corral.cli import daemon
    from corral.client import Client
    from corral.settings import Settings
    try:
        from corral.credentials import read_local_token
    except ImportError:  # before tokens
        def read_local_token(home: Path) -> None:
            return None

    home = Path(tempfile.mkdtemp(prefix="corral-trace-"))
    (home / "config.yaml").write_text(POOL)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env["CORRAL_HOME"] = str(home)
    trace = home / "trace.json"
    os.environ["CORRAL_PERFTRACE"] = str(trace)  # the server inherits these
    os.environ["PYTHONPATH"] = str(Path(__file__).resolve().parent / "trace") + os.pathsep + str(root)
    settings = Settings.from_env(env)
    os.chdir(root)  # ``python -m corral.server`` imports from its working directory first
    info = daemon.start(settings)
    client = Client(info["url"], read_local_token(home))
    work = home / "work"
    work.mkdir()
    marks = []
    try:
        for i in range(samples):
            files = [work / f"l{i}-{t}" for t in range(4 if group else 1)]
            t0 = time.time()
            client.submit(job_text(files))
            t1 = time.time()
            marks.append((t0, t1, max(wait_file(f) for f in files)))
            while client.jobs(limit=1):
                time.sleep(0.01)
            time.sleep(0.05)
        os.kill(info["pid"], signal.SIGUSR2)  # the tracer writes its file
        time.sleep(0.5)
    finally:
        daemon.stop(settings)
    events = json.loads(trace.read_text()) if trace.exists() else []
    print(f"p50 {statistics.median(r - t0 for t0, _, r in marks) * 1000:.1f} ms, "
          f"submit returned p50 {statistics.median(t1 - t0 for t0, t1, _ in marks) * 1000:.1f} ms")
    for t0, t1, ran in marks[len(marks) - shown:] if shown > 0 else []:
        print(f"--- sample: submit returned +{(t1 - t0) * 1000:.1f}  ran +{(ran - t0) * 1000:.1f}")
        for start, took, thread, name in sorted(events):
            if t0 - 0.001 <= start <= ran + 0.002:
                print(f"  +{(start - t0) * 1000:6.1f} {took * 1000:6.1f}ms {thread[:18]:18s} {name}")
    print("segment medians (ms): " + "  ".join(f"{k} {statistics.median(v):.1f}"
                                               for k, v in segments(events, marks).items()))


if __name__ == "__main__":
    main()
