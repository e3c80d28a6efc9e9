"""hpcbox's own images built from apt locks on its pinned base: the SIF helper and the mini cluster's node
image. Each has lock files (`name=version` lines, written by `hpcbox lock` in hpcbox's checkout, with the
snapshot archive's time they were resolved at where it answered) and a Dockerfile that installs from them,
with sid (and another suite where a pin comes from one) added by add-suites.sh beside this file.

The build is the same for both: on the locks; once Debian's mirror dropped a pinned version, from the
snapshot archive at the locks' time; where that cannot serve it either, off-lock, with what Debian serves
now, under another tag, labelled with the pins that moved and the locked build it stands in for
(`hpcbox.offlock`), or refused under `--strict-lock`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpcbox.build import baseimage, offlock
from hpcbox.errors import HpcboxError
from hpcbox.files import write_atomically

# Adds sid (and the suites named) to the image's sources, pinned low; honours the `apt_mirror` secret.
SUITES_SCRIPT = Path(__file__).resolve().parent / "add-suites.sh"
# A lock's line for the snapshot.debian.org time its pins were resolved from, where it answered.
SNAPSHOT_LINE = re.compile(r"(?m)^# snapshot: (\d{8}T\d{6}Z)$")

# A build of a tag: (tag, labels, secrets, lock files in place of the committed ones: name → text).
Build = Callable[[str, Mapping[str, str], Mapping[str, Path], Mapping[str, bytes]], None]


@dataclass(frozen=True)
class AptLocked:
    """An image of hpcbox's own and the apt locks it is built from.

    ``locks``: each lock file by its name in the build context; ``folder``: where they are in hpcbox's
    checkout, where `hpcbox lock` refreshes them; ``suites``: the suites add-suites.sh adds besides sid;
    ``releases``: package → the release its pin was resolved from, where that is not the base's own suite
    (apt's candidate), so that an off-lock build follows that release."""

    what: str
    locks: Mapping[str, Path]
    folder: str
    suites: tuple[str, ...] = ()
    releases: Mapping[str, str] = field(default_factory=dict)

    def snapshot(self) -> str | None:
        """The snapshot archive time the pins were resolved from (`hpcbox lock` records it)."""
        for path in self.locks.values():
            if found := SNAPSHOT_LINE.search(path.read_text()):
                return found[1]
        return None

    def pinned_in(self, package: str, version: str) -> str:
        """Which lock pins ``package`` at ``version``, as a path in hpcbox's checkout (the first lock where
        none does)."""
        pin = f"{package}={version}"
        paths = list(self.locks.values())
        return self.shown(next((path for path in paths if pin in path.read_text().splitlines()), paths[0]))

    def shown(self, lock: Path) -> str:
        """A lock as a path in hpcbox's checkout."""
        return f"{self.folder}/{lock.name}"

    def moved(self, base: str) -> list[offlock.MovedPin]:
        """The pins (of every lock) Debian no longer serves, asked of apt in a container of ``base``."""
        texts = {self.shown(path): path.read_text() for path in self.locks.values()}
        moved = offlock.moved_in(base, texts, setup=setup(self.suites), releases=self.releases)
        return [pin for each in moved.values() for pin in each]

    def build(
        self,
        ref: str,
        build: Build,
        off_lock_tag: Callable[[Mapping[str, bytes]], str],
        base: baseimage.BaseImage,
        *,
        strict: bool,
        say: Callable[[str], None],
    ) -> tuple[str, tuple[offlock.MovedPin, ...]]:
        """Build ``ref`` on ``base`` from the locks: from Debian's mirror; once a pin is gone, from the
        snapshot archive at the locks' time; else off-lock (refused when ``strict``), under the tag
        ``off_lock_tag`` gives the followed locks. The tag built and the pins it is past."""
        locked_labels = offlock.labels_for(base.moved)
        try:
            build(ref, locked_labels, {}, {})
            return ref, base.moved
        except HpcboxError as failed:
            gone = baseimage.superseded_pin(failed.details)
            if gone is None:
                raise
        gone_line = f"Debian no longer serves {gone[0]} {gone[1]}, pinned in {self.pinned_in(*gone)}"
        # The locks are refreshed with hpcbox's base lock, so the base lock's time is theirs too.
        locked_at = baseimage.own_lock().source_date_epoch

        def from_snapshot(secrets: Mapping[str, Path]) -> None:
            build(ref, locked_labels, secrets, {})

        snapshot = self.snapshot()
        pins = dict([gone])
        if baseimage.build_from_snapshot(snapshot, "sid", from_snapshot, gone_line, say, pins, locked_at):
            return ref, base.moved
        own = self.moved(base.ref)
        moved = (*base.moved, *own)
        offlock.refuse_if(moved, strict, self.what)
        followed = {name: offlock.follow(path.read_text(), own).encode() for name, path in self.locks.items()}
        off_lock = off_lock_tag(followed)
        build(off_lock, offlock.labels_for(moved, of=ref), {}, followed)
        return off_lock, moved


def setup(suites: tuple[str, ...] | list[str] = (), snapshot: str | None = None) -> str:
    """Shell that readies apt in a container of the base as the Dockerfiles do: sid and ``suites`` added
    (add-suites.sh), reading the snapshot archive at ``snapshot`` where given (handed in as the
    `apt_mirror` secret is in a build), for asking apt what it serves."""
    hand_in = ""
    if snapshot:
        secret = shlex.quote(baseimage.snapshot_mirror(snapshot))
        hand_in = f"mkdir -p /run/secrets && printf %s {secret} > /run/secrets/apt_mirror\n"
    return f"{hand_in}set -- {shlex.join(suites)}\n{SUITES_SCRIPT.read_text()}\n"


def lock_text(header: str, snapshot: str | None, lines: list[str]) -> str:
    """A lock's text: its header, the snapshot time (where there is one), a line per package."""
    return header + (f"# snapshot: {snapshot}\n" if snapshot else "") + "".join(f"{line}\n" for line in lines)


def write_locks(texts: Mapping[Path, str], snapshot: str | None) -> list[Path]:
    """Write locks resolved together, unless each pins what it pinned (and records a snapshot time where
    this resolution had one): the locks, and the time they were first seen at, then stay. The ones written."""
    before = {path: path.read_text() if path.is_file() else "" for path in texts}
    same = all(_pins(before[path]) == _pins(text) for path, text in texts.items())
    if same and (all(SNAPSHOT_LINE.search(text) for text in before.values()) or not snapshot):
        return []
    for path, text in texts.items():
        write_atomically(path, text)
    return list(texts)


def _pins(lock: str) -> list[str]:
    return [line for line in lock.splitlines() if line and not line.startswith("#")]
