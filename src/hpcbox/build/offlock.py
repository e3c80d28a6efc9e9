"""Off-lock builds: what happens once Debian no longer serves a pinned version.

Debian's mirror serves only the current version of each package, so every exact pin (the base lock,
the image's apt locks, the SIF helper's) stops being installable at the next point release or sid
upload. Where the snapshot archive the lock was resolved from still answers, builds read it instead
(`baseimage.build_from_snapshot`). Where it does not, availability comes first: the build installs
what the mirror serves now, says so one line per moved pin, and labels the image (and the SIF made
from it) `io.hpcbox.off-lock` with those pins, so the artifact never passes for the locked one.
`--strict-lock` (or HPCBOX_STRICT_LOCK=1) refuses instead, before anything is tagged.

An off-lock build of some inputs is found again by the identity of the on-lock build it stands in for
(label `io.hpcbox.off-lock.of`), so the next command does not retry the locked build or ask the
mirror again.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from hpcbox.errors import HpcboxError
from hpcbox.tools import docker

LABEL = "io.hpcbox.off-lock"
# On an off-lock build: the content hash (or helper tag) the locked build would have had.
LABEL_OF = "io.hpcbox.off-lock.of"
STRICT_ENV = "HPCBOX_STRICT_LOCK"
NONE = "none"
_MOVED = re.compile(r"^(\S+) (\S+) -> (\S+) \((.+)\)$")
# A pin in an apt lock: `name=version`.
_APT_PIN = re.compile(r"^([a-z0-9][a-z0-9+.:-]*)=(\S+)$")
FIX = "run `hpcbox lock` to pin what Debian serves now"


@dataclass(frozen=True, order=True)
class MovedPin:
    """A pinned version Debian no longer serves: ``served`` is what it serves instead ("" for nothing)."""

    package: str
    locked: str
    served: str
    lock: str  # the lock file that pins it, as the user finds it (docker/lock/apt-system.txt)

    def describe(self) -> str:
        return f"{self.package} {self.locked or NONE} -> {self.served or NONE} ({self.lock})"


def to_label(moved: Iterable[MovedPin]) -> str:
    return "; ".join(pin.describe() for pin in sorted(set(moved)))


def from_labels(labels: Mapping[str, str]) -> tuple[MovedPin, ...]:
    """The moved pins an artifact's labels record (none on an on-lock one)."""
    return parse(labels.get(LABEL) or "")


def parse(value: str) -> tuple[MovedPin, ...]:
    """The moved pins an off-lock label's value (`to_label`'s text) names."""
    pins = []
    for part in filter(None, value.split("; ")):
        found = _MOVED.match(part)
        if found is None:
            raise HpcboxError(f"label {LABEL}: cannot read {part!r}", "rebuild it with this hpcbox")
        package, locked, served, lock = found.groups()
        pins.append(
            MovedPin(package, "" if locked == NONE else locked, "" if served == NONE else served, lock)
        )
    return tuple(pins)


def labels_for(moved: Iterable[MovedPin], of: str = "") -> dict[str, str]:
    """The labels of an artifact built with ``moved`` pins (nothing when none moved)."""
    value = to_label(moved)
    if not value:
        return {}
    return {LABEL: value, **({LABEL_OF: of} if of else {})}


def strict_lock(flag: bool = False) -> bool:
    """Whether an off-lock build is refused: ``--strict-lock``, or HPCBOX_STRICT_LOCK set to a true value."""
    return flag or os.environ.get(STRICT_ENV, "").strip().lower() not in ("", "0", "false", "no")


def refuse_if(moved: Iterable[MovedPin], strict: bool, what: str) -> None:
    """Under ``strict``, one line refusing ``what`` built with ``moved`` pins."""
    pins = sorted(set(moved))
    if strict and pins:
        more = f" and {len(pins) - 1} more" if len(pins) > 1 else ""
        raise HpcboxError(
            f"Debian moved on: {pins[0].describe()}{more}; --strict-lock refuses an off-lock {what}",
            f"{FIX}, or build without --strict-lock ({STRICT_ENV})",
        )


def announce(moved: Iterable[MovedPin], say: Callable[[str], None]) -> None:
    """One line per moved pin."""
    for pin in sorted(set(moved)):
        say(f"hpcbox: Debian moved on: {pin.describe()}; this build is off-lock: run hpcbox lock")


def stand_in(of: str, repository: str) -> tuple[str, docker.ImageInfo] | None:
    """An off-lock build in ``repository`` standing in for the locked build ``of`` (a content hash or
    tag), if one is here: its tag and what the engine knows of it."""
    for found in docker.images_labelled(LABEL_OF, of):
        for tag in found.tags:
            if tag.rpartition(":")[0] == repository:
                return tag, found
    return None


def found_image(ref: str, repository: str, strict: bool, what: str) -> tuple[str, docker.ImageInfo] | None:
    """The image tagged ``ref``, or the off-lock build in ``repository`` standing in for it, with its tag;
    None where neither is here. An off-lock one is refused under ``strict``, naming ``what`` it is."""
    existing = docker.image(ref)
    if existing is None and (standing := stand_in(ref, repository)) is not None:
        ref, existing = standing
    if existing is None:
        return None
    refuse_if(from_labels(existing.labels), strict, f"{what} ({ref} is off-lock)")
    return ref, existing


def apt_pins(text: str) -> dict[str, str]:
    """Package → version of the `name=version` lines of an apt lock (bare names follow the mirror)."""
    pins = {}
    for line in text.splitlines():
        found = _APT_PIN.match(line.strip())
        if found:
            pins[found[1]] = found[2]
    return pins


@dataclass(frozen=True)
class Served:
    """What apt can install of one package: its ``candidate``, every version it ``offers``, and the newest
    each release (``sid``, ``trixie``) offers."""

    candidate: str
    offers: frozenset[str]
    newest_in: Mapping[str, str] = field(default_factory=dict, hash=False)

    def follows(self, release: str = "") -> str:
        """The version a pin asked of ``release`` (``name/sid``) moves to; else the candidate."""
        return self.newest_in.get(release, self.candidate)


def served(ref: str, packages: Iterable[str], setup: str = "") -> dict[str, Served]:
    """What the mirror serves of ``packages``, asked of apt in a container of ``ref`` after ``setup``
    (shell run first, e.g. adding sid); a package apt does not know is left out."""
    names = sorted(set(packages))
    # --error-on=any: a source that cannot be fetched fails here, not as "no package" further on
    update = setup or "apt-get update --error-on=any -qq >/dev/null"
    # apt-cache policy reads no package descriptions: without each suite's Translation-en, an update of
    # trixie and sid takes some 3.5 s of CPU, not 5.5 (measured in the base). The container goes after.
    no_descriptions = "echo 'Acquire::Languages \"none\";' > /etc/apt/apt.conf.d/99hpcbox-no-descriptions"
    script = f"set -e\n{no_descriptions}\n{update}\napt-cache policy {shlex.join(names)}\n"
    output = docker.run_once(ref, ["sh", "-c", script], what="ask apt what it serves")
    return parse_policy(output)


def parse_policy(output: str) -> dict[str, Served]:
    """`apt-cache policy NAME...` → what it serves of each package it knows."""
    found: dict[str, Served] = {}
    name, candidate, offers, newest_in, version = "", "", set(), {}, ""

    def close() -> None:
        if name and candidate and candidate != "(none)":
            found[name] = Served(candidate, frozenset(offers), newest_in)

    for line in output.splitlines():
        words = line.split()
        if not line.startswith(" ") and line.endswith(":"):
            close()
            name, candidate, offers, newest_in, version = line[:-1], "", set(), {}, ""
        elif words[:1] == ["Candidate:"]:
            candidate = words[1]
        elif words[:1] == ["***"] and len(words) == 3:
            version = words[1]
            offers.add(version)
        elif len(words) == 2 and words[1].lstrip("-").isdigit() and words[0] != "Version":
            version = words[0]
            offers.add(version)
        elif version and len(words) >= 3 and words[0].isdigit() and "://" in words[1]:
            # `500 http://deb.debian.org/debian trixie/main amd64 Packages`: the table runs newest first
            newest_in.setdefault(words[2].partition("/")[0], version)
    close()
    return found


def moved_pins(
    pins: Mapping[str, str], serving: Mapping[str, Served], lock: str, releases: Mapping[str, str] = {}
) -> list[MovedPin]:
    """The ``pins`` of ``lock`` that ``serving`` no longer offers, each with the version it serves now:
    the candidate, or for a package the lock was resolved from another release (``releases``: package →
    ``sid``, where apt's candidate is the suite's own, older one), the newest that release offers."""
    return [
        MovedPin(
            package,
            version,
            serving[package].follows(releases.get(package, "")) if package in serving else "",
            lock,
        )
        for package, version in sorted(pins.items())
        if package not in serving or version not in serving[package].offers
    ]


def moved_in(
    ref: str, locks: Mapping[str, str], setup: str = "", releases: Mapping[str, str] = {}
) -> dict[str, list[MovedPin]]:
    """For each apt lock (its name as the user finds it → its text), the pins Debian no longer serves,
    asked of apt in a container of ``ref`` (after ``setup``) in one go; ``releases`` as `moved_pins`."""
    pins = {name: apt_pins(text) for name, text in locks.items()}
    serving = served(ref, {package for each in pins.values() for package in each}, setup)
    return {name: moved_pins(pins[name], serving, name, releases) for name in locks}


def follow(text: str, moved: Iterable[MovedPin]) -> str:
    """An apt lock's text with each moved pin set to the version served now."""
    now = {pin.package: pin.served for pin in moved}
    gone = sorted(package for package, served in now.items() if not served)
    if gone:
        raise HpcboxError(
            f"Debian no longer has the package {gone[0]} at all", f"{FIX} (or drop it from the lock)"
        )
    lines = []
    for line in text.splitlines():
        found = _APT_PIN.match(line.strip())
        lines.append(f"{found[1]}={now[found[1]]}" if found and found[1] in now else line)
    return "\n".join(lines) + "\n"
