"""How fast this machine is at the two things a full run of the suite does most, measured in about a
second as the run starts, so that runs on different machines can be told apart from changes in the code:
a run's minutes are mostly its work on two cores, and the same tests take longer on some of these
machines' hosts than on others (docs/testing.md, "Runs").

- ``spawn_ms``: starting a program and waiting for it (`/bin/true`), in milliseconds: the kernel's share
  of a run (a run starts some 140,000 processes: ssh, docker's runc, apt, Slurm's steps).
- ``python_ms``: a fixed piece of pure Python (a loop adding 2,000,000 integers), in milliseconds: the
  user-space share.

Each is the fastest of three tries (the floor: noise only ever adds), with the kernel's release beside
them (``kernel``: a machine's host build shows in it, e.g. ``6.18.44-fc-v1300``).

    python bench/machine_speed.py

prints them.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time

SPAWNS = 100
ADDITIONS = 2_000_000
TRIES = 3


def spawn_ms() -> float:
    """Milliseconds to start `/bin/true` and wait for it, the fastest of ``TRIES`` batches' means."""
    best = float("inf")
    for _ in range(TRIES):
        start = time.perf_counter()
        for _ in range(SPAWNS):
            subprocess.run(["/bin/true"], check=True)
        best = min(best, (time.perf_counter() - start) / SPAWNS)
    return best * 1000


def python_ms() -> float:
    """Milliseconds for ``ADDITIONS`` additions in a pure-Python loop, the fastest of ``TRIES``."""
    best = float("inf")
    for _ in range(TRIES):
        start = time.perf_counter()
        total = 0
        for number in range(ADDITIONS):
            total += number
        best = min(best, time.perf_counter() - start)
    return best * 1000


def measure() -> dict:
    """This machine's kernel release and speeds, as a run's history entry keeps them."""
    return {
        "kernel": platform.release(),
        "spawn_ms": round(spawn_ms(), 2),
        "python_ms": round(python_ms(), 1),
    }


if __name__ == "__main__":
    json.dump(measure(), sys.stdout, indent=2)
    print()
