"""Where a full run's CPU went: `invoke test --cpu` turns the kernel's process accounting on for the
run (acct(2): a record for every process on the machine that exits, a container's included, with its
parent and its CPU time; root only) and reads it at the end into bench/results/suite.json: the CPU of
every process that ended during the run (the run's own where nothing else ran), by where it ran (in a
Slurm job, in another container, on this machine) and by program, beside the engine's own daemons
(which do not exit: read from /proc). On two cores the suite's length is mostly its work; these rows
say which work.

    python bench/suite_cpu.py PACCT

prints the same rows for a file of records made some other way (`accton FILE` ... `accton off`).

Records are the kernel's `struct acct_v3` (linux/acct.h); a process's parent is the next record of its
parent's pid (a parent exits after its children), so a reused pid costs at most one misplaced record.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import struct
import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

# flag, version, tty, exitcode, uid, gid, pid, ppid, btime, etime, then utime, stime, mem, io, rw, minflt,
# majflt, swaps as comp_t, then comm.
_ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")
_VERSION_3 = 3
_TICKS_PER_S = 100  # AHZ
# The ancestors that say where a process ran, nearest first: a job's step, then any container.
_IN_JOB, _IN_CONTAINER, _HERE = "in Slurm jobs", "in other containers", "on this machine"
_PLACES = {"slurmstepd": _IN_JOB, "containerd-shim": _IN_CONTAINER, "runc": _IN_CONTAINER,
           "docker-init": _IN_CONTAINER}  # fmt: skip
_DAEMONS = ("dockerd", "containerd")
TOP_PROGRAMS = 12


class Process(NamedTuple):
    pid: int
    ppid: int
    comm: str
    cpu_s: float


def _seconds(comp: int) -> float:
    """A comp_t (13-bit mantissa, 3-bit base-8 exponent) of clock ticks, in seconds."""
    return ((comp & 0x1FFF) << (3 * (comp >> 13))) / _TICKS_PER_S


def read(path: Path) -> list[Process]:
    data = path.read_bytes()
    processes = []
    for offset in range(0, len(data) - _ACCT_V3.size + 1, _ACCT_V3.size):
        fields = _ACCT_V3.unpack_from(data, offset)
        if fields[1] & 0x0F != _VERSION_3:
            raise ValueError(f"{path}: not acct v3 records (version {fields[1]})")
        pid, ppid, utime, stime, comm = fields[6], fields[7], fields[10], fields[11], fields[18]
        name = comm.split(b"\0", 1)[0].decode(errors="replace")
        processes.append(Process(pid, ppid, name, _seconds(utime) + _seconds(stime)))
    return processes


def places(processes: list[Process]) -> Iterator[tuple[Process, str]]:
    """Each process with where it ran: its nearest ancestor among _PLACES, else here."""
    later: dict[int, list[int]] = defaultdict(list)
    for index, process in enumerate(processes):
        later[process.pid].append(index)

    def parent(index: int) -> int | None:
        candidates = later.get(processes[index].ppid, [])
        at = bisect.bisect_right(candidates, index)
        return candidates[at] if at < len(candidates) else None

    for index, process in enumerate(processes):
        place, up = _HERE, parent(index)
        for _ in range(32):  # deeper than any chain here; a cycle of reused pids ends
            if up is None:
                break
            if processes[up].comm in _PLACES:
                place = _PLACES[processes[up].comm]
                break
            up = parent(up)
        yield process, place


def daemons_cpu_s() -> dict[str, float]:
    """The engine's daemons' CPU so far (they outlive a run: no record of theirs)."""
    found: dict[str, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if name in _DAEMONS:
            utime, stime = stat[stat.rindex(")") + 2 :].split()[11:13]
            found[name] = found.get(name, 0.0) + (int(utime) + int(stime)) / os.sysconf("SC_CLK_TCK")
    return found


class Accounting:
    """The kernel's process accounting into ``path`` from `start` to `stop` (acct(2); root only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.daemons_at_start: dict[str, float] = {}

    def start(self) -> str | None:
        """None once on, else why not."""
        self.path.touch()
        if self._libc.acct(os.fsencode(self.path)) != 0:
            return f"process accounting could not start: {os.strerror(ctypes.get_errno())}"
        self.daemons_at_start = daemons_cpu_s()
        return None

    def stop(self) -> None:
        self._libc.acct(None)


def rows(processes: list[Process], daemons_s: dict[str, float], wall_s: float, cores: int) -> list[dict]:
    """The CPU by where it ran and by program (each program's runs, and its minutes by where they ran)."""
    by_place: Counter[str] = Counter()
    in_place: Counter[str] = Counter()
    by_program: Counter[str] = Counter()
    runs: Counter[str] = Counter()
    program_places: dict[str, Counter[str]] = defaultdict(Counter)
    for process, place in places(processes):
        by_place[place] += process.cpu_s
        in_place[place] += 1
        by_program[process.comm] += process.cpu_s
        runs[process.comm] += 1
        program_places[process.comm][place] += process.cpu_s
    exited = sum(by_place.values())
    daemons = sum(daemons_s.values())
    total = exited + daemons
    share = f"{100 * total / (wall_s * cores):.0f} % of {cores} cores over the run"
    made = [_row("CPU, every process that ended during the run and the engine's daemons", total / 60, share)]
    for place in (_IN_JOB, _IN_CONTAINER, _HERE):
        made.append(_row(f"CPU {place}", by_place[place] / 60, f"{in_place[place]:,} processes"))
    made.append(_row("CPU of the engine's daemons", daemons / 60, ", ".join(sorted(daemons_s))))
    for program, seconds in by_program.most_common(TOP_PROGRAMS):
        split = ", ".join(
            f"{there / 60:.1f} {place}"
            for rank, (place, there) in enumerate(program_places[program].most_common())
            if there >= 3 or not rank
        )
        count = f"{runs[program]:,} run{'' if runs[program] == 1 else 's'}"
        made.append(_row(f"CPU: {program}", seconds / 60, f"{count}: {split}"))
    return made


def _row(metric: str, minutes: float, note: str) -> dict:
    return {"metric": metric, "value": round(minutes, 1), "unit": "core-min", "target": "", "note": note}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    records = read(Path(sys.argv[1]))
    for row in rows(records, {}, wall_s=1.0, cores=os.cpu_count() or 1)[1:]:
        print(f"{row['value']:8.1f} {row['unit']}  {row['metric']}  ({row['note']})")
