"""The job's log paths (sbatch --output / --error): Slurm's filename patterns, checked and expanded.

sbatch expands `%j` (job id), `%x` (job name), `%u` (user), `%A` (array job id), `%a` (array task id),
with an optional zero-padding width (`%4a`), and `%%` (a literal %). It writes no log at all into a
folder that does not exist, so the folder part must be known before the job runs: there hpcbox allows
only `%x`, `%u` (the login user, whom hpcbox asks when it makes the folder) and `%%`, and makes the
folder before sbatch. Once sbatch has answered with the job id, the
path is expanded for the ledger; an array task's id stays a `*` glob there, each task having its own.
"""

from __future__ import annotations

import re
import unicodedata

from hpcbox.errors import FieldError

PATTERNS = "%j %x %u %A %a %%"
IN_FOLDERS = "%x %u %%"
_TOKEN = re.compile(r"%(?:(%)|(\d*)([jxuAa])|(.?))", re.DOTALL)
_GLOB = "*?["


def check(field_name: str, pattern: str, *, array: bool) -> str:
    """`pattern` if sbatch will expand it as hpcbox does and hpcbox can make its folder ahead."""
    problems = (
        (not pattern or any(unicodedata.category(char) in ("Cc", "Zl", "Zp") for char in pattern),
         "is empty or contains control characters"),
        (pattern.endswith("/"), "is a folder; name the file too, e.g. logs/%x-%j.out"),
        ("\\" in pattern, "contains a backslash, which turns Slurm's patterns off"),
        (pattern.startswith("~"), "starts with ~, which Slurm does not expand (use a relative path)"),
        (any(char in _GLOB for char in pattern), "contains *, ? or [ (array tasks' logs are found by glob)"),
    )  # fmt: skip
    for wrong, problem in problems:
        if wrong:
            raise FieldError(field_name, f"{pattern!r} {problem}")
    folder, _, _ = pattern.rpartition("/")
    for match in _TOKEN.finditer(pattern):
        literal, _, letter, other = match.groups()
        if other is not None:
            raise FieldError(
                field_name,
                f"{pattern!r}: {match.group()!r} is not a pattern hpcbox knows (allowed: {PATTERNS})",
            )
        if letter == "a" and not array:
            raise FieldError(field_name, f"{pattern!r}: %a is an array task's id, and this job is no array")
        if match.start() < len(folder) and not (literal or letter in ("x", "u")):
            raise FieldError(
                field_name,
                f"{pattern!r}: {match.group()} in the folder is only known once the job runs, and Slurm "
                f"writes no log into a missing folder (allowed in folders: {IN_FOLDERS}; put "
                f"{match.group()} in the file name)",
            )
    return pattern


def folder(pattern: str, job_name: str, user: str) -> str | None:
    """The folder to make before sbatch for ``user`` (None: the submit directory itself)."""
    directory, _, _ = pattern.rpartition("/")
    return expand(directory, job_id="", job_name=job_name, user=user) if directory else None


def expand(pattern: str, *, job_id: str, job_name: str, user: str) -> str:
    """The path sbatch makes of `pattern` for job `job_id` (an array's job id is also its %A), with
    an array task's id left as `*`."""

    def one(match: re.Match[str]) -> str:
        literal, width, letter, _ = match.groups()
        if literal:
            return "%"
        if letter == "a":
            return "*"
        value = {"j": job_id, "A": job_id, "x": job_name, "u": user}[letter]
        return value.zfill(int(width)) if width and letter in "jA" else value

    return _TOKEN.sub(one, pattern)


def escape(path: str) -> str:
    """`path` as a pattern that sbatch reads back as exactly `path`."""
    return path.replace("%", "%%")
