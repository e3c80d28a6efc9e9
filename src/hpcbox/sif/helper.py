"""The SIF helper image: a real Apptainer and mksquashfs from Debian on hpcbox's pinned base, for hosts
without Apptainer. Its Dockerfile, scripts and locks are in helper-image/ beside this file; `hpcbox lock`
refreshes the locks (in hpcbox's own checkout), and an off-lock helper stands in when Debian moved on.
"""

from __future__ import annotations

import hashlib
import os
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path

from hpcbox.build import aptlocked, baseimage, offlock
from hpcbox.build.lock import simulated_installs
from hpcbox.errors import HpcboxError
from hpcbox.files import one_at_a_time
from hpcbox.tools import docker
from hpcbox.tools.apptainer import ENGINE_HINT, ENGINES, Apptainer, host_program

HELPER_DIR = Path(__file__).resolve().parent / "helper-image"
HELPER_DOCKERFILE = HELPER_DIR / "helper.Dockerfile"
# What the helper adds to the base; `hpcbox lock` writes it (SIF_WRITERS at their exact versions).
HELPER_LOCK = HELPER_DIR / "lock" / "apt-helper.txt"
# The zlib stand-in mksquashfs compresses gzip with in the fast path, its source and what compiles it.
HELPER_ZLIB_SOURCE = HELPER_DIR / "zlib-libdeflate.c"
HELPER_BUILD_LOCK = HELPER_DIR / "lock" / "apt-helper-build.txt"
HELPER_BUILD_PACKAGES = ("gcc", "libc6-dev", "libdeflate-dev", "zlib1g-dev")
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
    return _locked().snapshot()


def _locked() -> aptlocked.AptLocked:
    """The helper's locks; a SIF writer asked of sid follows sid (trixie's older mksquashfs does not clamp
    every time)."""
    return aptlocked.AptLocked(
        "SIF helper",
        {lock.name: lock for lock in (HELPER_LOCK, HELPER_BUILD_LOCK)},
        "src/hpcbox/sif/helper-image/lock",
        releases=dict(package.split("/") for package in HELPER_PACKAGES if "/" in package),
    )


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
        aptlocked.SUITES_SCRIPT.name: aptlocked.SUITES_SCRIPT,
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
    found = offlock.found_image(helper_ref(), HELPER_REPOSITORY, strict, "SIF helper")
    return found[0] if found else None


def _make_helper(strict: bool, on_line: Callable[[str], None] | None, say: Callable[[str], None]) -> str:
    base = baseimage.ensure_base(lock=baseimage.own_lock(), strict=strict, on_line=on_line, say=say)
    files = _helper_files()

    def build(
        tag: str, labels: Mapping[str, str], secrets: Mapping[str, Path], locks: Mapping[str, bytes]
    ) -> None:
        say(f"hpcbox: building the Apptainer helper image {tag} (once: Apptainer and mksquashfs from Debian)")
        docker.build(
            docker.context_tar({**files, **locks}),
            dockerfile="Dockerfile",
            tag_ref=tag,
            build_args={"BASE": base.ref},
            base_arg="BASE",
            labels=labels,
            secrets=secrets,
            on_line=docker.BuildProgress(on_line or say),
        )

    ref = helper_ref()
    made, _moved = _locked().build(
        ref, build, lambda locks: _tag({**files, **locks}, off_lock_of=ref), base, strict=strict, say=say
    )
    return made


def helper_moved(ref: str) -> tuple:
    """The pins the helper image ``ref`` was built past (none where it is on-lock)."""
    found = docker.image(ref)
    return offlock.from_labels(found.labels) if found else ()


def moved_helper_pins(base: str) -> list:
    """The helper's pins (both locks) that Debian no longer serves, asked of apt with sid added."""
    return _locked().moved(base)


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
    simulate = "apt-get install --simulate --no-install-recommends -y "
    script = (
        aptlocked.setup(snapshot=snapshot)
        + f"{simulate}{shlex.join(HELPER_PACKAGES)}"
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
        lines = [f"{name}={pins[name]}" if name in SIF_WRITERS else name for name in names]
        texts[path] = aptlocked.lock_text(header, snapshot, lines)
        pinned = sum(name in SIF_WRITERS for name in names)
        say(f"hpcbox: {_locked().shown(path)}: {pinned} of {len(names)} packages pinned")
    return aptlocked.write_locks(texts, snapshot)
