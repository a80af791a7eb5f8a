"""What one task of a step sees: its Slurm variables and GPUs, as JSON in DIR/NAME-RANK.json."""
import json
import os
import sys


def report(directory: str, name: str) -> dict:
    seen = {k: v for k, v in os.environ.items() if k.startswith("SLURM") or k == "CUDA_VISIBLE_DEVICES"}
    seen["argv"] = sys.argv[1:]
    path = os.path.join(directory, f"{name}-{os.environ['SLURM_PROCID']}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(seen, handle)
    os.replace(path + ".tmp", path)
    return seen


if __name__ == "__main__":
    report(sys.argv[1], sys.argv[2])
