"""The Slurm versions a mini cluster runs, and which one rehearses a site that runs another.

Every version comes from Debian's mirror, on the one trixie base (Apptainer, from sid, needs trixie's
glibc): trixie's own Slurm, or another suite's Slurm packages pinned by version over it. Debian
keeps a suite's shared libraries at the same sonames or provides their old names (the t64 renames),
so bookworm's Slurm 22.05 links against trixie's libraries, MariaDB client and munge included. sid's
26.05 needs trixie's glibc (2.38 or newer) and one library newer than trixie's: it comes from sid
with it (SUITE_LIBRARIES; a library trixie lacks altogether, llhttp, comes from sid unasked). A version
whose packages need more than that would need a base of its own (docs/minicluster.md).

Each version's Slurm packages are pinned (node/lock/apt-slurm-VERSION.txt, which `hpcbox lock` writes).
sid moves on: it takes each new Slurm release within weeks and no longer serves the last. Its version
here is the release it served when this was written; its node image is built from the lock's exact
versions, from the snapshot archive once sid dropped them, and where that cannot serve them either,
off-lock with the release sid serves then, checked to be that one or newer (MOVING_SUITES), so that a
cluster asked for it still comes up the day sid moves on; `up` then says which release it runs
(`moved_note`). A release that needs more of sid than SUITE_LIBRARIES names fails its build with apt's
own words.
"""

from __future__ import annotations

import re

from hpcbox.errors import FieldError

# Slurm release (major.minor, as sites name it) -> the Debian suite whose packages carry it.
SUITES: dict[str, str] = {"22.05": "bookworm", "24.11": "trixie", "26.05": "sid"}
# Release -> libraries its suite supplies too, where trixie has them at a version too old for its Slurm
# (sid's slurmd 26.05 depends on libhwloc15 >= 2.15.0, trixie has 2.12).
SUITE_LIBRARIES: dict[str, tuple[str, ...]] = {"26.05": ("libhwloc15",)}
# Suites whose Slurm moves on: their version's off-lock node image takes the release the suite serves then,
# that one or newer.
MOVING_SUITES = ("sid",)
DEFAULT = "24.11"  # the node image's own suite's Slurm
# A site's version as profiles and `sinfo --version` give it: 23.02, 23.02.7, 24.11.5.
_VERSION = re.compile(r"^(\d{2})\.(\d{2})(?:\.\d+)?$")


def allowed() -> str:
    return ", ".join(sorted(SUITES, key=_months))


def check(version: str, field_name: str = "slurm") -> str:
    """``version`` if the mini cluster runs it, else one line naming the ones it runs."""
    if version not in SUITES:
        raise FieldError(
            field_name, f"{version!r} is not a Slurm version the mini cluster runs (allowed: {allowed()})"
        )
    return version


def nearest(site_version: str) -> str:
    """The version the mini cluster runs closest in release time to ``site_version`` (Slurm numbers
    releases year.month); on a tie the older one, whose missing features a script meets first."""
    wanted = _months(site_version)
    return min(SUITES, key=lambda ours: (abs(_months(ours) - wanted), _months(ours)))


def _months(version: str) -> int:
    match = _VERSION.match(version)
    if not match:
        raise ValueError(f"{version!r} is not a Slurm version")
    return int(match.group(1)) * 12 + int(match.group(2))


def release(version: str) -> str:
    """The release a version belongs to: 23.02.7 -> 23.02."""
    match = _VERSION.match(version)
    if not match:
        raise ValueError(f"{version!r} is not a Slurm version")
    return f"{match.group(1)}.{match.group(2)}"


def for_site(site: str | None, asked: str | None) -> str:
    """The version a rehearsal runs: ``asked`` (`--slurm`), else the nearest to the ``site``'s (its
    profile's `[slurm] version`), else the default."""
    if asked is not None:
        return check(asked)
    return nearest(site) if site is not None else DEFAULT


def note(profile: str, site: str | None, running: str) -> str:
    """One line saying that a rehearsal of ``profile`` runs another Slurm than the site's, and why;
    empty where they are one release (or the profile does not say)."""
    if site is None or release(site) == running:
        return ""
    closest = nearest(site)
    why = (
        f"the nearest the mini cluster has ({allowed()})"
        if running == closest
        else f"as asked (the nearest the mini cluster has is {closest})"
    )
    return f"hpcbox: {profile} runs Slurm {site}; its rehearsal runs Slurm {running}, {why}"


def moves_on(version: str) -> bool:
    """Whether ``version``'s node image takes whatever release its suite serves (that one or newer)."""
    return SUITES[version] in MOVING_SUITES


def moved_note(version: str, running: str) -> str:
    """One line where a cluster asked for ``version`` runs a newer release (``running``, as `sinfo
    --version` gives it) because its suite moved on; empty where it runs the release asked for."""
    if release(running) == version:
        return ""
    return (
        f"hpcbox: Debian {SUITES[version]} serves Slurm {running} now, no longer {version}: this cluster "
        f"runs {running} (`--slurm {version}` is the newest Slurm Debian carries)"
    )
