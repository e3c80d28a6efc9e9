"""Slurm's times and sizes, as users type them and as Slurm prints them.

One place for every stage: profiles and resources read a user's times and sizes, the LSF header turns
a size into LSF's, the efficiency report reads sacct's and suggests requests in Slurm's own form.
"""

from __future__ import annotations

import re

from hpcbox.errors import FieldError

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_MEM = re.compile(r"^(\d+)([KMGT]?)B?$", re.IGNORECASE)
# Slurm's sizes are binary: 1K is 1024 bytes.
SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)$")
_CPU_TIME = re.compile(r"^(?:(?:(\d+)-)?(\d+):)?(\d+):(\d+(?:\.\d+)?)$")


def parse_time(text: str, field_name: str = "time") -> int:
    """Seconds in a Slurm time: M, M:S, H:M:S, D-H, D-H:M or D-H:M:S."""
    match = _TIME.match(text.strip())
    if not match:
        raise FieldError(
            field_name,
            f"{text!r} is not a Slurm time "
            "(allowed: minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S, e.g. 1:30:00)",
        )
    days, first, second, third = (int(part) if part else None for part in match.groups())
    if days is not None:
        hours, minutes, seconds = first, second or 0, third or 0
    elif third is not None:
        hours, minutes, seconds = first, second, third
    else:
        hours, minutes, seconds = 0, first, second or 0
    total = (((days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
    if total == 0:
        # sbatch takes --time=0 as "no limit", the opposite of what anyone typing zero means.
        raise FieldError(
            field_name,
            f"{text!r} is zero, which Slurm reads as no limit (allowed: a positive time, e.g. 1:30:00)",
        )
    return total


def format_time(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock


def parse_mem(text: str) -> str:
    """A Slurm memory size normalised to `<n><unit>`; a number without a unit only for 0 (the whole
    node): Slurm reads `16` as 16 megabytes, where who wrote it most often meant gigabytes."""
    match = _MEM.match(text.strip())
    if not match:
        raise FieldError(
            "mem",
            f"{text!r} is not a Slurm memory size "
            "(allowed: a whole number with a K, M, G or T suffix, e.g. 16G)",
        )
    number, unit = int(match.group(1)), match.group(2).upper()
    if not unit and number:
        raise FieldError(
            "mem",
            f"{text!r} has no unit, which Slurm reads as megabytes ({number}M)",
            f"write {number}M if that is what you mean, or {number}G",
        )
    return f"{number}{unit or 'M'}"


def parse_size(text: str, default_unit: str = "") -> int:
    """Bytes in a Slurm size such as 316008K, 1000M, 3.1G or 2T (binary units, as Slurm uses)."""
    match = _SIZE.match(text.strip().upper())
    if not match:
        raise ValueError(f"{text!r} is not a Slurm size (a number with K, M, G, T or P)")
    number, unit = match.groups()
    return round(float(number) * SIZE_UNITS[unit or default_unit])


def format_size(size: float) -> str:
    """Bytes in Slurm's style: the largest binary unit that keeps the number at 1 or more (3.1G, 1000M)."""
    for unit in ("P", "T", "G", "M", "K"):
        scaled = size / SIZE_UNITS[unit]
        if scaled >= 1:
            return f"{scaled:.1f}".removesuffix(".0") + unit
    return f"{size:.0f}"


def format_request(size: int) -> str:
    """A request exactly, as Slurm prints one: the largest unit that divides it (1G, 1000M, 640M)."""
    for unit in ("T", "G", "M", "K"):
        if size >= SIZE_UNITS[unit] and size % SIZE_UNITS[unit] == 0:
            return f"{size // SIZE_UNITS[unit]}{unit}"
    return str(size)


def parse_cpu_time(text: str) -> float:
    """Seconds in sacct's TotalCPU or Elapsed: [D-][HH:]MM:SS[.mmm]."""
    match = _CPU_TIME.match(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a sacct CPU time")
    days, hours, minutes, seconds = match.groups()
    return ((int(days or 0) * 24 + int(hours or 0)) * 60 + int(minutes)) * 60 + float(seconds)
