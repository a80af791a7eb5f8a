#!/usr/bin/env python3
"""What putting a new process in its own cgroup costs a start, three ways, alternating:

  sudo python bench/cgroup_start.py [--samples 40] [--gap-ms 100]

* ``move``: fork, then write its pid to the cgroup's ``cgroup.procs`` (what a wrapper that
  moves itself does): the write takes ``cgroup_threadgroup_rwsem`` for writing, and after
  ``--gap-ms`` without another move it first waits for an RCU grace period;
* ``move, warmed 5 ms before``: the same with a no-op move of this process 5 ms earlier
  (what ``ProcessTrees.warm`` does at placement);
* ``clone3 into cgroup``: the process created inside the cgroup (``CLONE_INTO_CGROUP``, Linux
  5.7): the lock is taken for reading only, so there is no grace period to wait for.

Prints the median and p90 of each, in ms, from the call until the process is in its cgroup.
Needs root and a writable cgroup v2 mount; creates and removes ``corral-bench-cgroup`` there."""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from corral.node.proctree import _cgroup2  # noqa: E402

CLONE_INTO_CGROUP = 0x200000000
SYS_CLONE3 = 435  # x86_64 and aarch64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--gap-ms", type=float, default=100.0, help="idle time before each start")
    args = parser.parse_args()
    mount, own = _cgroup2()
    if mount is None:
        sys.exit("cgroup_start: needs a writable cgroup v2 mount (root)")
    base = mount / "corral-bench-cgroup"
    base.mkdir(exist_ok=True)
    libc = ctypes.PyDLL(None, use_errno=True)  # this script has one thread: a raw clone is safe
    libc.syscall.restype = ctypes.c_long
    own_procs = (own or mount) / "cgroup.procs"
    times: dict[str, list[float]] = {}
    try:
        for i in range(args.samples):
            for way in ("move", "move, warmed 5 ms before", "clone3 into cgroup"):
                group = base / f"{i}-{len(times.get(way, []))}-{way[:5].strip(',')}"
                group.mkdir()
                time.sleep(args.gap_ms / 1000)
                if way.startswith("move, warmed"):
                    own_procs.write_text(str(os.getpid()))
                    time.sleep(0.005)
                t0 = time.perf_counter()
                if way == "clone3 into cgroup":
                    fd = os.open(group, os.O_RDONLY | os.O_DIRECTORY)
                    clone_args = struct.pack("=11Q", CLONE_INTO_CGROUP, 0, 0, 0, 17, 0, 0, 0, 0, 0, fd)
                    buf = ctypes.create_string_buffer(clone_args, len(clone_args))
                    pid = libc.syscall(SYS_CLONE3, buf, ctypes.c_size_t(len(clone_args)))
                    if pid == 0:
                        os.execv("/bin/sleep", ["sleep", "0.05"])
                    os.close(fd)
                    if pid < 0:
                        sys.exit(f"cgroup_start: clone3: {os.strerror(ctypes.get_errno())}")
                else:
                    pid = os.fork()
                    if pid == 0:
                        os.execv("/bin/sleep", ["sleep", "0.05"])
                    (group / "cgroup.procs").write_text(str(pid))
                elapsed = time.perf_counter() - t0
                assert str(pid) in (group / "cgroup.procs").read_text().split()
                os.waitpid(pid, 0)
                times.setdefault(way, []).append(elapsed * 1000)
                group.rmdir()
    finally:
        for leftover in base.iterdir() if base.is_dir() else []:
            if leftover.is_dir():
                leftover.rmdir()
        base.rmdir()
    print(f"a new process into its own cgroup, after {args.gap_ms:g} ms without a move ({os.cpu_count()} cores)")
    for way, values in times.items():
        print(f"  {way:26s} p50 {statistics.median(values):6.2f} ms   p90 {sorted(values)[int(0.9 * len(values))]:6.2f} ms")


if __name__ == "__main__":
    main()
