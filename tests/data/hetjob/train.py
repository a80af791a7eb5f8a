"""A stand-in trainer rank: waits for the critic, reports, and the last rank says it is done."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

out = sys.argv[1]
deadline = time.time() + 60
while not os.path.exists(os.path.join(out, "critic.ready")):
    if time.time() > deadline:
        sys.exit("trainer: the critic never became ready")
    time.sleep(0.1)
critic = os.environ["SLURM_JOB_NODELIST_HET_GROUP_1"]
report(out, "trainer")
print(f"trainer rank {os.environ['SLURM_PROCID']} talks to the critic on {critic}", flush=True)
if os.environ["SLURM_PROCID"] == "0":
    while len([f for f in os.listdir(out) if f.startswith("trainer-")]) < int(os.environ["SLURM_NTASKS"]):
        time.sleep(0.05)
    open(os.path.join(out, "trainer.done"), "w").close()
