"""file_mounts on every infra: a file and a directory of the submit machine appear at their
remote paths (absolute and ``~/``) for the replica, and are gone once the job ends."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from conformance.driver import Corral, wait_for
from conformance.harnesses import describe


def test_file_mounts_appear_for_the_replica_and_go_with_the_job(corral: Corral, work: Path, monkeypatch) -> None:
    (work / "data").mkdir()
    (work / "data/shard").write_text("rows-of-data\n")
    (work / "cfg.yaml").write_text("lr: 0.25\n")
    remote = work / "remote"
    name = f"corral-conf-{uuid.uuid4().hex[:8]}"
    monkeypatch.chdir(work)  # relative sources resolve against the directory `corral launch` runs in
    job = corral.launch("mounted", f"""
file_mounts:
  {remote}/d: data
  ~/{name}: cfg.yaml
run: cat {remote}/d/shard ~/{name}; echo "home=$HOME"
""")
    done = corral.wait_job(job, timeout=120)
    log = corral.log(job)
    assert done["state"] == "SUCCEEDED", describe(done) + log
    assert "rows-of-data" in log and "lr: 0.25" in log, log
    home = next(line.split("home=", 1)[1].strip() for line in log.splitlines() if "home=" in line)
    wait_for(lambda: not os.path.lexists(remote / "d") and not os.path.lexists(Path(home) / name), timeout=60,
             what="the job's mounts removed")
    assert (work / "data/shard").read_text() == "rows-of-data\n"
