"""Parsing shared by profiles and resources: Slurm times and memory sizes, and the error naming a field.

It sits below both (profiles are data, resources are checked against them), so neither imports the
other to read a time.
"""

from __future__ import annotations

import re

from hpcbox.errors import HpcboxError

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_MEM = re.compile(r"^(\d+)([KMGT]?)B?$", re.IGNORECASE)


class FieldError(HpcboxError):
    """Invalid input; `field` names the setting (a flag, a config key or a profile key) at fault."""

    def __init__(self, field_name: str, problem: str, hint: str = "") -> None:
        super().__init__(f"{field_name}: {problem}", hint)
        self.field = field_name


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
    """A Slurm memory size normalised to `<n><unit>` (unit M when none is given)."""
    match = _MEM.match(text.strip())
    if not match:
        raise FieldError(
            "mem",
            f"{text!r} is not a Slurm memory size "
            "(allowed: a whole number with a K, M, G or T suffix, e.g. 16G)",
        )
    return f"{int(match.group(1))}{(match.group(2) or 'M').upper()}"
