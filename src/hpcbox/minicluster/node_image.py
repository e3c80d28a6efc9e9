"""The node image every mini-cluster container runs, one per Slurm version, tagged by the content hash
of its inputs: its files, hpcbox's pinned base, the Slurm version and that version's lock.

Everything it installs is pinned: node/lock/apt-node.txt (what every version's image has, Apptainer and
MariaDB among it) and node/lock/apt-slurm-VERSION.txt (Slurm's packages from the suite that carries that
version), exact versions that `hpcbox lock` resolves in hpcbox's checkout (`refresh_node_locks`). Built as
the SIF helper is (`hpcbox.build.aptlocked`): from Debian's mirror, from the snapshot archive once a pin
moved, else off-lock with what Debian serves now, labelled, under a tag of its own that the next `up`
finds again (and refused under `--strict-lock`).
"""

from __future__ import annotations

import functools
import hashlib
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcbox.build import aptlocked, baseimage, offlock
from hpcbox.errors import HpcboxError
from hpcbox.files import one_at_a_time
from hpcbox.minicluster import versions
from hpcbox.tools import docker

REPOSITORY = "hpcbox/minicluster"
# The node image's Dockerfile and scripts, beside this file.
CONTEXT = Path(__file__).resolve().parent / "node"
SLURM_LABEL = "io.hpcbox.minicluster.slurm"
# What every node installs (`hpcbox lock` pins each at its exact version): name, or name/suite where it
# comes from another suite than the base's.
NODE_PACKAGES = (
    "apptainer/sid",
    "busybox-static",
    "fuse-overlayfs",
    "fuse2fs",
    "iproute2",
    "less",
    "mariadb-server",
    "munge",
    "openssh-server",
    "procps",
    "python3",
    "rsync",
    "squashfs-tools",
    "squashfuse",
    "uidmap",
)
# Slurm's packages a node installs (from its version's suite), and the readline a bookworm Slurm takes
# from trixie (its t64 package provides the old name); versions.SUITE_LIBRARIES adds to them.
SLURM_PACKAGES = ("slurm-wlm", "slurmdbd", "slurm-wlm-mysql-plugin")
TRIXIE_LIBRARIES = ("libreadline8t64",)
LOCK_FOLDER = "src/hpcbox/minicluster/node/lock"  # where `hpcbox lock` refreshes the locks
_NODE_LOCK_HEADER = """\
# What every mini cluster node image (node/Dockerfile) installs on hpcbox's pinned Debian base, each at
# its exact version: trixie's, and Apptainer sid's. Written by `hpcbox lock`.
"""


@dataclass(frozen=True)
class NodeImage:
    ref: str
    id: str
    built: bool
    moved: tuple[offlock.MovedPin, ...] = ()  # the pins it was built past (off-lock), none on the locks


def content_hash(
    files: Mapping[str, Path | bytes],
    base_id: str,
    build_args: Mapping[str, str] | None = None,
    off_lock_of: str = "",
) -> str:
    """12 hex digits over every file of the build context ``files`` (path, exec bit, bytes), the base image
    id and the build arguments (the Slurm version: each version's image has its own tag), and for an
    off-lock build the locked one's tag it stands in for."""
    digest = hashlib.sha256(base_id.encode())
    if off_lock_of:
        digest.update(f"\0off-lock of {off_lock_of}".encode())
    for key, value in sorted((build_args or {}).items()):
        digest.update(f"\0{key}={value}".encode())
    for name, source in sorted(files.items()):
        executable = isinstance(source, Path) and source.stat().st_mode & 0o111
        digest.update(b"\0" + name.encode())
        digest.update(b"x" if executable else b"-")
        digest.update(source if isinstance(source, bytes) else source.read_bytes())
    return digest.hexdigest()[:12]


def slurm_lock(slurm: str, context: Path = CONTEXT) -> Path:
    """The lock of Slurm ``slurm``'s packages."""
    return context / "lock" / f"apt-slurm-{slurm}.txt"


def context_files(context: Path = CONTEXT, slurm: str = versions.DEFAULT) -> dict[str, Path]:
    """The node image's build context for Slurm ``slurm``: each file by its path in it. Of the Slurm locks
    only that version's, as lock/apt-slurm.txt, so that refreshing another version's pins leaves this
    version's tag as it was."""
    files = {
        path.relative_to(context).as_posix(): path
        for path in context.rglob("*")
        if path.is_file() and not path.name.startswith("apt-slurm-")
    }
    return {
        **files,
        aptlocked.SUITES_SCRIPT.name: aptlocked.SUITES_SCRIPT,
        "lock/apt-slurm.txt": slurm_lock(versions.check(slurm), context),
    }


def locked(slurm: str, context: Path = CONTEXT) -> aptlocked.AptLocked:
    """The node image's locks for Slurm ``slurm``, each by its name in the build context: every package
    follows its own suite where Debian moved on (Slurm's, sid's for Apptainer and a newer Slurm's
    libraries, and trixie's for the rest)."""
    suite = versions.SUITES[slurm]
    slurm_packages = (*SLURM_PACKAGES, *versions.SUITE_LIBRARIES.get(slurm, ()))
    releases = {
        **dict(package.split("/") for package in NODE_PACKAGES if "/" in package),
        **{package: suite for package in slurm_packages},
    }
    locks = {
        "lock/apt-node.txt": context / "lock" / "apt-node.txt",
        "lock/apt-slurm.txt": slurm_lock(slurm, context),
    }
    return aptlocked.AptLocked(f"node image (Slurm {slurm})", locks, LOCK_FOLDER, (suite,), releases)


def build_args(slurm: str) -> dict[str, str]:
    """What the Dockerfile is told of the Slurm version: it, the Debian suite that carries it, and whether
    that suite's Slurm moves on (then an off-lock build takes the newer release it serves: checked as that
    release or newer; only where it applies, so that the other versions' arguments are what they were)."""
    args = {"SLURM_VERSION": slurm, "SLURM_SUITE": versions.SUITES[versions.check(slurm)]}
    if versions.moves_on(slurm):
        args["SLURM_OR_NEWER"] = "1"
    return args


def ensure_image(
    context: Path = CONTEXT,
    *,
    slurm: str = versions.DEFAULT,
    no_cache: bool = False,
    strict: bool = False,
    on_line: Callable[[str], None] | None = None,
) -> NodeImage:
    """The node image running Slurm ``slurm`` for the current ``context``, built only when no image has
    its hash (nor an off-lock one stands in for it). The versions share every layer but Slurm's own and
    those after it. ``strict`` (or HPCBOX_STRICT_LOCK) refuses an off-lock one.

    ``no_cache`` builds every layer anew (benchmarks of a cold build), ignoring BuildKit's cache.
    """
    if not (context / "Dockerfile").is_file():
        raise HpcboxError(
            f"no Dockerfile in {context}", "this hpcbox lacks its node image files: reinstall it"
        )
    say = on_line or (lambda _line: None)
    strict = offlock.strict_lock(strict)
    base = baseimage.ensure_base(lock=baseimage.own_lock(), strict=strict, say=say)
    args = build_args(slurm)
    files = context_files(context, slurm)
    ref = f"{REPOSITORY}:{content_hash(files, base.id, args)}"
    if (made := _made(ref, strict)) is not None:
        return made
    waiting = functools.partial(say, "hpcbox: another hpcbox is building a node image; waiting for it")
    # One node image at a time, whatever its Slurm: two versions' builds share their first layers, and
    # BuildKit runs a layer both want once, for both; where it fails (a pin Debian dropped), only the
    # build that ran it sees apt's words, and the other could not tell it from any failure and go off-lock.
    with one_at_a_time("node image", on_wait=waiting):
        if (made := _made(ref, strict)) is not None:
            return made
        return _build(context, slurm, ref, files, base, strict, no_cache, say)


def _made(ref: str, strict: bool) -> NodeImage | None:
    """The node image tagged ``ref``, or the off-lock one standing in for it; None where neither is here."""
    found = offlock.found_image(ref, REPOSITORY, strict, "node image")
    if found is None:
        return None
    tag, existing = found
    return NodeImage(tag, existing.id, built=False, moved=offlock.from_labels(existing.labels))


def _build(
    context: Path,
    slurm: str,
    ref: str,
    files: Mapping[str, Path],
    base: baseimage.BaseImage,
    strict: bool,
    no_cache: bool,
    say: Callable[[str], None],
) -> NodeImage:
    args = build_args(slurm)

    def build(
        tag: str, labels: Mapping[str, str], secrets: Mapping[str, Path], locks: Mapping[str, bytes]
    ) -> None:
        once = "once per change of its files"
        say(f"hpcbox: building the mini cluster's node image {tag}, Slurm {slurm} ({once})")
        docker.build(
            docker.context_tar({**files, **locks}),
            dockerfile="Dockerfile",
            tag_ref=tag,
            build_args={"BASE": base.ref, **args},
            base_arg="BASE",
            labels={
                "org.opencontainers.image.title": "hpcbox mini cluster node",
                SLURM_LABEL: slurm,
                **labels,
            },
            secrets=secrets,
            no_cache=no_cache,
            on_line=docker.BuildProgress(say),
        )

    def off_lock_tag(locks: Mapping[str, bytes]) -> str:
        return f"{REPOSITORY}:{content_hash({**files, **locks}, base.id, args, off_lock_of=ref)}"

    tag, moved = locked(slurm, context).build(ref, build, off_lock_tag, base, strict=strict, say=say)
    built = docker.image(tag)
    if built is None:
        raise HpcboxError(f"the build of {tag} finished but the engine has no such image")
    if tag != ref:
        offlock.announce(moved, say)
    return NodeImage(tag, built.id, built=True, moved=offlock.from_labels(built.labels))


def refresh_node_locks(context: Path = CONTEXT, *, say: Callable[[str], None] = print) -> list[Path]:
    """Write what the node image installs, every package at the exact version Debian serves today
    (`NODE_PACKAGES`; each Slurm version's `SLURM_PACKAGES` from its suite), resolved on the node's own
    pinned base with sid and the Slurm suites added, from the snapshot archive at this moment where it
    answers (the locks record the time); the lock files it changed. Written together: the builds read
    them from one time."""
    base = baseimage.ensure_base(lock=baseimage.own_lock()).ref
    snapshot = baseimage.snapshot_now(
        "sid", "the node image is pinned from Debian's mirror with no snapshot time", say
    )
    wanted = {context / "lock" / "apt-node.txt": dict(_named(NODE_PACKAGES))}
    for slurm, suite in versions.SUITES.items():
        libraries = versions.SUITE_LIBRARIES.get(slurm, ())
        named = [f"{package}/{suite}" for package in (*SLURM_PACKAGES, *libraries)] + list(TRIXIE_LIBRARIES)
        wanted[slurm_lock(slurm, context)] = dict(_named(named))
    setup = aptlocked.setup(sorted(set(versions.SUITES.values())), snapshot)
    serving = offlock.served(base, {name for each in wanted.values() for name in each}, setup)
    texts = {}
    for path, packages in wanted.items():
        lines = []
        for name, release in sorted(packages.items()):
            served = serving.get(name)
            version = served and (served.newest_in.get(release) if release else served.candidate)
            if not version:
                where = f" in Debian {release}" if release else ""
                raise HpcboxError(
                    f"apt serves no {name}{where} for {path.name}",
                    "check node_image.NODE_PACKAGES and versions.SUITES against what Debian serves",
                )
            lines.append(f"{name}={version}")
        header = _NODE_LOCK_HEADER if path.name == "apt-node.txt" else _slurm_header(path)
        texts[path] = aptlocked.lock_text(header, snapshot, lines)
        say(f"hpcbox: {LOCK_FOLDER}/{path.name}: {len(lines)} packages pinned")
    return aptlocked.write_locks(texts, snapshot)


def _slurm_header(lock: Path) -> str:
    slurm = lock.stem.removeprefix("apt-slurm-")
    suite, libraries = versions.SUITES[slurm], versions.SUITE_LIBRARIES.get(slurm, ())
    readline = "" if suite == "trixie" else ", readline from trixie (its t64 package provides the older name)"
    text = (
        f"Slurm {slurm} of the mini cluster's node image (node/Dockerfile's last apt step), each package at "
        f"its exact version: Slurm's packages{''.join(f' and {name}' for name in libraries)} from Debian "
        f"{suite}{readline}. Written by `hpcbox lock`."
    )
    return textwrap.fill(text, 106, initial_indent="# ", subsequent_indent="# ") + "\n"


def _named(packages: tuple[str, ...] | list[str]) -> list[tuple[str, str]]:
    """`name` or `name/release` → (name, release), release "" for the base's own suite."""
    return [(name, release) for name, _, release in (package.partition("/") for package in packages)]
