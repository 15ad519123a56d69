"""STREAM-style read bandwidth with the threads the engine computes with (same CPUs, same count)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

GiB = 1024**3

# Runs in a fresh process pinned to the engine's CPUs before torch (and OpenMP) start.
_PROBE = r"""
import json, os, sys, time
cpus, size, repeats = json.loads(sys.argv[1])
os.sched_setaffinity(0, cpus)
os.environ["OMP_NUM_THREADS"] = str(len(cpus))
import torch
torch.set_num_threads(len(cpus))
a = torch.ones(size // 4, dtype=torch.float32)  # touched: every page is resident before timing
ops = [("torch.sum", lambda: a.sum()), ("torch.max", lambda: a.max())]
if len(cpus) == 1:  # numpy reduces in one thread: a second opinion only where that is the engine's count
    import numpy
    n = a.numpy()
    ops.append(("numpy.sum", lambda: n.sum()))
results = {}
for name, op in ops:
    op()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        op()
        best = min(best, time.perf_counter() - t)
    results[name] = a.numel() * 4 / best / 1e9
print(json.dumps({"threads": torch.get_num_threads(), "gbs": results}))
"""


def read_bandwidth(cpus: Sequence[int], size_bytes: int = 2 * GiB, repeats: int = 10) -> dict[str, Any]:
    """Best-of-`repeats` GB/s (1e9 B/s) of a full read of a `size_bytes` fp32 array (far larger than the
    last-level cache), by torch reductions in `len(cpus)` OpenMP threads pinned to `cpus`."""
    env = {"OMP_NUM_THREADS": str(len(cpus)), "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps([list(cpus), size_bytes, repeats])],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "cpus": list(cpus),
        "threads": probe["threads"],
        "array_bytes": size_bytes,
        "by_op_gbs": probe["gbs"],
        "gbs": max(probe["gbs"].values()),
    }
