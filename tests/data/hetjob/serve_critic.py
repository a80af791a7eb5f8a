"""A stand-in critic server: reports, says it is ready, serves until the trainer is done."""
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import report  # noqa: E402

out = sys.argv[1]
report(out, "critic")
print(f"critic serving on {os.environ['SLURMD_NODENAME']}", flush=True)
open(os.path.join(out, "critic.ready"), "w").close()
deadline = time.time() + 60
while not os.path.exists(os.path.join(out, "trainer.done")):
    if time.time() > deadline:
        sys.exit("critic: the trainer never finished")
    time.sleep(0.1)
print("critic stopped", flush=True)
