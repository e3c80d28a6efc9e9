"""The SIF helper image: a real Apptainer and mksquashfs from Debian on hpcbox's pinned base, for hosts
without Apptainer. Its Dockerfile, scripts and locks are in helper-image/ beside this file; `hpcbox lock`
refreshes the locks (in hpcbox's own checkout), and an off-lock helper stands in when Debian moved on.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path

from hpcbox.build import baseimage, offlock
from hpcbox.build.lock import simulated_installs
from hpcbox.errors import HpcboxError
from hpcbox.files import one_at_a_time, write_atomically
from hpcbox.tools import docker
from hpcbox.tools.apptainer import ENGINE_HINT, ENGINES, Apptainer, host_program

HELPER_DIR = Path(__file__).resolve().parent / "helper-image"
HELPER_DOCKERFILE = HELPER_DIR / "helper.Dockerfile"
# What the helper adds to the base; `hpcbox lock` writes it (SIF_WRITERS at their exact versions).
HELPER_LOCK = HELPER_DIR / "lock" / "apt-helper.txt"
HELPER_SID_SCRIPT = HELPER_DIR / "add-sid.sh"
# The zlib stand-in mksquashfs compresses gzip with in the fast path, its source and what compiles it.
HELPER_ZLIB_SOURCE = HELPER_DIR / "zlib-libdeflate.c"
HELPER_BUILD_LOCK = HELPER_DIR / "lock" / "apt-helper-build.txt"
HELPER_BUILD_PACKAGES = ("gcc", "libc6-dev", "libdeflate-dev", "zlib1g-dev")
# HELPER_LOCK's line for the snapshot.debian.org time its pins were resolved from, where it answered.
HELPER_SNAPSHOT_LINE = re.compile(r"(?m)^# snapshot: (\d{8}T\d{6}Z)$")
# What the helper is for; `hpcbox lock` writes these into HELPER_LOCK.
HELPER_PACKAGES = (
    "apptainer/sid",
    "squashfs-tools/sid",
    "squashfuse",
    "fuse2fs",
    "fuse-overlayfs",
    "uidmap",
    "libdeflate0",
)
# The programs and the library whose versions decide a SIF's bytes (with the compressors' libraries in
# the pinned base): pinned. The rest of the helper follows the mirror, as a new version of them writes
# the same SIF.
SIF_WRITERS = ("apptainer", "squashfs-tools", "libdeflate0", "libdeflate-dev")
HELPER_REPOSITORY = "hpcbox/apptainer-helper"
_HELPER_LOCK_HEADER = """\
# What the SIF helper (helper.Dockerfile) adds to the pinned Debian base. A SIF's bytes depend on the
# Apptainer, mksquashfs and libdeflate that write it: those are pinned at their exact versions; the rest
# follows the mirror. Written by `hpcbox lock`.
"""
_HELPER_BUILD_LOCK_HEADER = """\
# What the SIF helper's build stage (helper.Dockerfile) compiles zlib-libdeflate.c with: libdeflate at
# the version the helper runs it with, the compiler as the mirror serves it. Written by `hpcbox lock`.
"""
_BUILD_STAGE_MARK = "hpcbox-build-stage-packages"


def engine(
    choice: str = "auto",
    *,
    strict: bool = False,
    build: bool = True,
    on_line: Callable[[str], None] | None = None,
    say: Callable[[str], None] = print,
) -> Apptainer:
    """Apptainer on the host when it has one (or ``choice`` says so), else the helper container (an
    off-lock one refused when ``strict``; built first where it is missing, refused instead without
    ``build``: minutes, which a bounded command such as the doctor does not have)."""
    if choice not in ENGINES:
        raise HpcboxError(f"--engine: unknown engine {choice!r}", f"choose one of: {', '.join(ENGINES)}")
    if choice in ("auto", "host"):
        program = host_program()
        if program is not None:
            return Apptainer("host", program)
        if choice == "host":
            raise HpcboxError("--engine host: neither `apptainer` nor `singularity` is on PATH", ENGINE_HINT)
    if build:
        return Apptainer("container", ensure_helper(strict=strict, on_line=on_line, say=say))
    made = _made_helper(strict)
    if made is None:
        raise HpcboxError(
            "the Apptainer helper image is not built here",
            "the first `hpcbox sif` builds it (minutes, once); or install Apptainer here",
        )
    return Apptainer("container", made)


def helper_snapshot() -> str | None:
    """The snapshot archive time the helper's pins were resolved from (`hpcbox lock` records it)."""
    found = HELPER_SNAPSHOT_LINE.search(HELPER_LOCK.read_text())
    return found[1] if found else None


def helper_ref() -> str:
    """The helper image's tag: a hash of its files, its package pins and its pinned base."""
    override = os.environ.get("HPCBOX_APPTAINER_HELPER")
    if override:
        return override
    return _tag(_helper_files())


def _tag(files: Mapping[str, Path | bytes], off_lock_of: str = "") -> str:
    """The helper's tag for its build context ``files``: a hash of them and of its pinned base (and of
    the locked helper an off-lock one stands in for, so that the two never share a tag)."""
    digest = hashlib.sha256(off_lock_of.encode())
    for source in files.values():
        digest.update((source if isinstance(source, bytes) else source.read_bytes()) + b"\0")
    # The base by its canonical name: a base bootstrapped under another local name (HPCBOX_BASE_REPOSITORY)
    # is the same image, so it gives the same helper, not a second tag of it.
    digest.update(baseimage.base_ref(lock=baseimage.own_lock(), canonical=True).encode())
    return f"{HELPER_REPOSITORY}:{digest.hexdigest()[:12]}"


def _helper_files() -> dict[str, Path]:
    """The helper's build context: name in it → file."""
    return {
        "Dockerfile": HELPER_DOCKERFILE,
        HELPER_SID_SCRIPT.name: HELPER_SID_SCRIPT,
        HELPER_LOCK.name: HELPER_LOCK,
        HELPER_BUILD_LOCK.name: HELPER_BUILD_LOCK,
        HELPER_ZLIB_SOURCE.name: HELPER_ZLIB_SOURCE,
    }


def ensure_helper(
    *, strict: bool = False, on_line: Callable[[str], None] | None = None, say: Callable[[str], None] = print
) -> str:
    """The helper image (Apptainer + squashfs-tools from Debian, the SIF writers pinned), built from
    Debian's mirror if missing: from the snapshot archive once a pin moved, else off-lock (refused when
    ``strict``)."""
    if (made := _made_helper(strict)) is not None:
        return made

    def waiting() -> None:
        say("hpcbox: another hpcbox is building the Apptainer helper image; waiting for it")

    with one_at_a_time("apptainer helper", on_wait=waiting):
        return _made_helper(strict) or _make_helper(strict, on_line, say)


def _made_helper(strict: bool) -> str | None:
    ref = helper_ref()
    existing = docker.image(ref)
    if existing is None and (stand_in := offlock.stand_in(ref, HELPER_REPOSITORY)) is not None:
        ref, existing = stand_in
    if existing is None:
        return None
    offlock.refuse_if(offlock.from_labels(existing.labels), strict, f"SIF helper ({ref} is off-lock)")
    return ref


def _make_helper(strict: bool, on_line: Callable[[str], None] | None, say: Callable[[str], None]) -> str:
    ref = helper_ref()
    base = baseimage.ensure_base(lock=baseimage.own_lock(), strict=strict, on_line=on_line, say=say)
    files: dict[str, Path | bytes] = dict(_helper_files())

    def build(tag: str, labels: Mapping[str, str], secrets: Mapping[str, Path]) -> None:
        say(f"hpcbox: building the Apptainer helper image {tag} (once: Apptainer and mksquashfs from Debian)")
        docker.build(
            docker.context_tar(files),
            dockerfile="Dockerfile",
            tag_ref=tag,
            build_args={"BASE": base.ref},
            labels=labels,
            secrets=secrets,
            on_line=docker.BuildProgress(on_line or say),
        )

    try:
        build(ref, offlock.labels_for(base.moved), {})
    except HpcboxError as failed:
        gone = baseimage.superseded_pin(failed.details)
        if gone is None:
            raise
        gone_line = f"Debian no longer serves {gone[0]} {gone[1]}, pinned in {_pinned_in(*gone)}"
        locked = functools.partial(build, ref, offlock.labels_for(base.moved))
        # The helper's locks are refreshed with the base's, so the base lock's time is theirs too.
        locked_at = baseimage.own_lock().source_date_epoch
        snapshot = helper_snapshot()
        if baseimage.build_from_snapshot(snapshot, "sid", locked, gone_line, say, dict([gone]), locked_at):
            return ref
        moved = moved_helper_pins(base.ref)
        offlock.refuse_if((*base.moved, *moved), strict, "SIF helper")
        for lock in (HELPER_LOCK, HELPER_BUILD_LOCK):
            files[lock.name] = offlock.follow(lock.read_text(), moved).encode()
        of, ref = ref, _tag(files, off_lock_of=ref)
        build(ref, offlock.labels_for((*base.moved, *moved), of=of), {})
    return ref


def helper_moved(ref: str) -> tuple:
    """The pins the helper image ``ref`` was built past (none where it is on-lock)."""
    found = docker.image(ref)
    return offlock.from_labels(found.labels) if found else ()


def moved_helper_pins(base: str) -> list:
    """The helper's pins (both locks) that Debian no longer serves, asked of apt with sid added."""
    locks = {_shown(lock): lock.read_text() for lock in (HELPER_LOCK, HELPER_BUILD_LOCK)}
    # a SIF writer asked of sid follows sid: trixie's older mksquashfs does not clamp every time
    releases = dict(package.split("/") for package in HELPER_PACKAGES if "/" in package)
    moved = offlock.moved_in(base, locks, setup=HELPER_SID_SCRIPT.read_text() + "\n", releases=releases)
    return [pin for each in moved.values() for pin in each]


def _pinned_in(package: str, version: str) -> str:
    """Which of the helper's locks pins ``package`` at ``version``, as a path in hpcbox's checkout."""
    pin = f"{package}={version}"
    lock = HELPER_BUILD_LOCK if pin in HELPER_BUILD_LOCK.read_text().splitlines() else HELPER_LOCK
    return _shown(lock)


def _shown(lock: Path) -> str:
    """A helper lock as a path in hpcbox's checkout, where `hpcbox lock` refreshes it."""
    return f"src/hpcbox/sif/helper-image/lock/{lock.name}"


def refresh_helper_lock(*, say: Callable[[str], None] = print) -> list[Path]:
    """Write what the Apptainer helper installs, and what its build stage compiles with, pinning the SIF
    writers (`SIF_WRITERS`) as Debian (trixie, and sid for Apptainer) serves them today,
    resolved on the helper's own pinned base, from the snapshot archive at this moment where it answers
    (the locks record the time: sid replaces versions within days); the lock files it changed. The two
    are written together: the build reads both from one time."""
    base = baseimage.ensure_base(lock=baseimage.own_lock()).ref
    snapshot = baseimage.snapshot_now(
        "sid", "the helper is pinned from Debian's mirror with no snapshot time", say
    )
    hand_in = ""
    if snapshot:
        # what the helper's build is handed as its apt_mirror secret when the mirror has moved on
        secret = shlex.quote(baseimage.snapshot_mirror(snapshot))
        hand_in = f"mkdir -p /run/secrets && printf %s {secret} > /run/secrets/apt_mirror\n"
    simulate = "apt-get install --simulate --no-install-recommends -y "
    script = (
        hand_in
        + HELPER_SID_SCRIPT.read_text()
        + f"\n{simulate}{shlex.join(HELPER_PACKAGES)}"
        + f"\necho {_BUILD_STAGE_MARK}\n{simulate}{shlex.join(HELPER_BUILD_PACKAGES)}"
    )
    output = docker.run_once(base, ["sh", "-c", script], what="resolve the Apptainer helper's packages")
    helper_output, _, build_output = output.partition(f"\n{_BUILD_STAGE_MARK}\n")
    texts = {}
    for path, header, wanted, resolved in (
        (HELPER_LOCK, _HELPER_LOCK_HEADER, HELPER_PACKAGES, helper_output),
        (
            HELPER_BUILD_LOCK,
            _HELPER_BUILD_LOCK_HEADER,
            HELPER_BUILD_PACKAGES,
            build_output,
        ),
    ):
        pins = simulated_installs(resolved)
        names = sorted(package.partition("/")[0] for package in wanted)
        unresolved = [name for name in names if name in SIF_WRITERS and name not in pins]
        if unresolved:
            raise HpcboxError(f"apt resolved no {unresolved[0]} for {path.name}", "see apt's output above")
        text = header + (f"# snapshot: {snapshot}\n" if snapshot else "")
        texts[path] = text + "".join(
            f"{name}={pins[name]}\n" if name in SIF_WRITERS else f"{name}\n" for name in names
        )
        pinned = sum(name in SIF_WRITERS for name in names)
        say(f"hpcbox: {_shown(path)}: {pinned} of {len(names)} packages pinned")
    before = {path: path.read_text() if path.is_file() else "" for path in texts}
    same = all(_pins(before[path]) == _pins(text) for path, text in texts.items())
    if same and (all(HELPER_SNAPSHOT_LINE.search(text) for text in before.values()) or not snapshot):
        return []  # the same pins: the locks, and the time they were first seen at, stay
    for path, text in texts.items():
        write_atomically(path, text)
    return list(texts)


def _pins(helper_lock: str) -> list[str]:
    return [line for line in helper_lock.splitlines() if line and not line.startswith("#")]
