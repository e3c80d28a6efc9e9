"""`hpcbox verify`: rebuild an image or SIF from the commit its provenance names and compare.

The artifact's labels say where it came from (source revision, flavour, content hash, base, source
date, and for a SIF its compression). The commit is checked out into a clean temporary folder, the
image built there with no build cache under a name of its own, and for a SIF converted again. Then:

- before building anything, the checkout's sources must hash to the recorded content hash (else the
  artifact did not come from that commit's docker/ and code, whatever its files say);
- a SIF is identical when the whole file's sha256 is; otherwise the SIF objects that differ are named,
  and where the root filesystem differs, the first paths that do (type, mode, owner, size, time, link
  target, content);
- an image is identical when every file of its root filesystem is (image ids differ between builds:
  the engine stamps the build time into the config).

A local base image is reused only when its id is the one the artifact records: an id is a digest of
the content, so reusing it proves nothing less than bootstrapping it again.

The recorded digests (`digests.toml`, written by `hpcbox lock --record`) say what the cpu environment
builds to, so that any clone, on any machine and day, can check its own build against them (the test
suite does). They live outside docker/: inside, recording them would change what they record.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import tarfile
import tempfile
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from hpcbox.build import offlock, provenance
from hpcbox.build.image import (
    ENVIRONMENT,
    LABEL_BASE_DIGEST,
    LABEL_BASE_NAME,
    LABEL_CONTENT,
    LABEL_FLAVOUR,
    LABEL_REVISION,
    LABEL_SOURCE_DATE_EPOCH,
    RUNTIME,
    Image,
    build_image,
    plan_build,
)
from hpcbox.errors import HpcboxError
from hpcbox.files import file_sha256, write_atomically
from hpcbox.project.config import ProjectConfig, load_project
from hpcbox.sif import convert, rootfs
from hpcbox.sif.compression import parse_compression
from hpcbox.sif.helper import engine
from hpcbox.tools import docker
from hpcbox.tools.apptainer import Apptainer, parse_sif_list

# How many differing paths are printed; the count says how many there were.
SHOWN = 10
_SCRATCH_PREFIX = "hpcbox-verify-"
DIGESTS_FILE = "digests.toml"
# The environment whose digests are recorded: the one every machine can build (no registry, no GPU).
RECORDED_FLAVOUR = "cpu"
_DIGESTS_HEADER = """\
# What the {flavour} environment (docker/ as of `revision`) builds to, at {compression}: the base image's
# id, the image's content hash, the SIF's root filesystem and the whole SIF file. Any machine, on any
# day on which Debian serves the pinned versions, builds these same bytes; the test suite checks it.
# Written by `hpcbox lock --record` (after committing a change to docker/); never edited by hand.
"""


@dataclass(frozen=True)
class Digests:
    """What the environment built to: the recorded digests, or a build's own to hold against them."""

    revision: str
    flavour: str
    compression: str
    base_id: str
    content_hash: str
    rootfs_sha256: str
    sif_sha256: str
    sif_size: int
    converter: str
    off_lock: str = ""  # a build's own only: the pins Debian had moved (none are ever recorded)

    def to_toml(self, recorded: str) -> str:
        fields = dataclasses.asdict(self)
        del fields["off_lock"]
        lines = [
            f"{key} = {value}" if isinstance(value, int) else f'{key} = "{value}"'
            for key, value in fields.items()
        ]
        header = _DIGESTS_HEADER.format(flavour=self.flavour, compression=self.compression)
        return header + "\n".join([*lines, f'recorded = "{recorded}"']) + "\n"

    def differences(self, other: Digests) -> list[str]:
        """The fields in which ``other`` differs from these, as `field: this != other`."""
        mine, theirs = dataclasses.asdict(self), dataclasses.asdict(other)
        return [
            f"{key}: {mine[key]} != {theirs[key]}"
            for key in mine
            if key != "off_lock" and mine[key] != theirs[key]
        ]


def read_digests(root: Path) -> Digests:
    """The digests recorded in ``root``'s digests.toml; one line naming the fix where it is missing or bad."""
    path = root / DIGESTS_FILE
    try:
        data = tomllib.loads(path.read_text())
        data.pop("recorded")
        return Digests(**data)
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError) as exc:
        raise HpcboxError(
            f"{path}: no recorded digests ({exc})", "record them: `hpcbox lock --record`"
        ) from exc


def environment_digests(
    project: ProjectConfig,
    compression: str,
    cache: Path,
    *,
    say: Callable[[str], None] = print,
    on_line: Callable[[str], None] | None = None,
) -> Digests:
    """Build the project's cpu environment (offline) and convert it at ``compression``: its digests."""
    image = build_image(
        project, flavour=RECORDED_FLAVOUR, offline=True, target=ENVIRONMENT, say=say, on_line=on_line
    )
    made = convert.build_sif(
        image,
        compression=parse_compression(compression, "compression"),
        cache=cache,
        say=say,
        on_line=on_line,
    )
    tool = engine("container", on_line=on_line, say=say)
    return Digests(
        revision=image.labels[LABEL_REVISION],
        flavour=RECORDED_FLAVOUR,
        compression=compression,
        base_id=image.labels[LABEL_BASE_DIGEST],
        content_hash=image.labels[LABEL_CONTENT],
        rootfs_sha256=convert.rootfs_sha256(made.path, tool),
        sif_sha256=made.sha256,
        sif_size=made.size,
        converter=_sif_labels(made.path, tool).get(convert.LABEL_CONVERTER, ""),
        off_lock=made.off_lock,
    )


def record_digests(project: ProjectConfig, compression: str, *, say: Callable[[str], None] = print) -> Path:
    """Write digests.toml from a build of the committed environment (on-lock: an off-lock or uncommitted
    build is no record)."""
    digests = environment_digests(project, compression, convert.cache_dir(), say=say, on_line=lambda _: None)
    if digests.revision.endswith("-dirty") or digests.revision == "unknown":
        raise HpcboxError(
            f"the environment's inputs are not committed ({digests.revision}): they name no commit",
            "commit docker/, then record",
        )
    if digests.off_lock:
        raise HpcboxError(
            f"this build is off-lock ({digests.off_lock}): it is not what the locks give",
            "run `hpcbox lock` to pin what Debian serves now, commit, then record",
        )
    path = project.root / DIGESTS_FILE
    write_atomically(path, digests.to_toml(datetime.now(UTC).strftime("%Y-%m-%d")).encode())
    return path


@dataclass(frozen=True)
class Provenance:
    """What an artifact's labels say about where it came from."""

    revision: str
    flavour: str
    content_hash: str
    base_name: str
    base_id: str
    pinned: bool  # built on the bootstrapped base its lock pins (else on a registry image)
    compression: str = ""  # SIFs only
    converter: str = ""  # SIFs only: the Apptainer, mksquashfs (and libdeflate) that wrote it
    off_lock: str = ""  # the pins Debian had moved when it was built (its off-lock label)

    @classmethod
    def from_labels(cls, labels: Mapping[str, str], what: str, *, is_sif: bool) -> Provenance:
        needed = [LABEL_REVISION, LABEL_FLAVOUR, LABEL_CONTENT, LABEL_BASE_NAME, LABEL_BASE_DIGEST]
        if is_sif:
            needed.append(convert.LABEL_COMPRESSION)
        missing = [label for label in needed if not labels.get(label)]
        if missing:
            raise HpcboxError(
                f"{what} does not record where it came from (no {missing[0]} label)",
                "only images built by `hpcbox build` and SIFs made by this `hpcbox sif` can be verified",
            )
        revision = labels[LABEL_REVISION]
        if revision == "unknown" or revision.endswith("-dirty"):
            raise HpcboxError(
                f"{what} was built from {'uncommitted changes' if revision != 'unknown' else 'outside git'} "
                f"({revision}): no commit holds its sources",
                "commit, then `hpcbox build` and `hpcbox sif` again",
            )
        return cls(
            revision=revision,
            flavour=labels[LABEL_FLAVOUR],
            content_hash=labels[LABEL_CONTENT],
            base_name=labels[LABEL_BASE_NAME],
            base_id=labels[LABEL_BASE_DIGEST],
            pinned=LABEL_SOURCE_DATE_EPOCH in labels,
            compression=labels.get(convert.LABEL_COMPRESSION, "") if is_sif else "",
            converter=labels.get(convert.LABEL_CONVERTER, "") if is_sif else "",
            off_lock=labels.get(convert.LABEL_OFF_LOCK if is_sif else offlock.LABEL, ""),
        )


@dataclass(frozen=True)
class Verdict:
    """The comparison: ``differences`` empty means identical."""

    artifact: str
    revision: str
    differences: tuple[str, ...]
    digest: str  # the SIF's sha256, or the image's content hash
    off_lock: str = ""  # the artifact's off-lock label: what its commit's locks no longer gave
    recorded: str = ""  # where it is the environment digests.toml records: whether it is those bytes

    @property
    def identical(self) -> bool:
        return not self.differences

    def lines(self) -> list[str]:
        off_lock = []
        if self.off_lock:
            off_lock = [
                f"off-lock: {self.artifact} was built past pins Debian had moved ({self.off_lock}); the "
                "rebuild follows what Debian serves now"
            ]
        recorded = [self.recorded] if self.recorded else []
        if self.identical:
            return [
                *off_lock,
                f"identical: {self.artifact} is what commit {self.revision[:12]} builds ({self.digest})",
                *recorded,
            ]
        count = len(self.differences)
        head = f"differs: {self.artifact} is not what commit {self.revision[:12]} builds ({count} difference"
        head += "s)" if count != 1 else ")"
        shown = [f"  {line}" for line in self.differences[:SHOWN]]
        if count > SHOWN:
            shown.append(f"  ... and {count - SHOWN} more")
        return [*off_lock, head, *shown, *recorded]


def against_recorded(origin: Provenance, digest: str, root: Path) -> str:
    """A line saying whether the artifact (its provenance, and ``digest``: a SIF's sha256, or an image's
    content hash) is the bytes digests.toml records, where it is the environment recorded there: its
    revision, flavour and, for a SIF, compression. Empty for any other artifact, or with no digests.toml."""
    try:
        recorded = read_digests(root)
    except HpcboxError:
        return ""
    is_sif = bool(origin.compression)
    if (origin.revision, origin.flavour) != (recorded.revision, recorded.flavour) or (
        is_sif and origin.compression != recorded.compression
    ):
        return ""
    field, expected = (
        ("sif_sha256", recorded.sif_sha256) if is_sif else ("content_hash", recorded.content_hash)
    )
    if digest == expected:
        return f"recorded: it is the {recorded.flavour} environment {DIGESTS_FILE} records ({field} {digest})"
    return (
        f"recorded: it is not the {recorded.flavour} environment {DIGESTS_FILE} records: {field} {digest} != "
        f"{expected} (the same commit built other bytes elsewhere: `hpcbox lock --record` after checking why)"
    )


def verify(
    artifact: str,
    project: ProjectConfig,
    *,
    engine_choice: str = "auto",
    say: Callable[[str], None] = print,
    on_line: Callable[[str], None] | None = None,
) -> Verdict:
    """Rebuild ``artifact`` (a SIF path or a local image reference) from its commit and compare."""
    path = Path(artifact)
    if artifact.endswith(".sif") or path.is_file():
        if not path.is_file():
            raise HpcboxError(f"no SIF at {artifact}", "give the path of a .sif file, or an image reference")
        tool = engine(engine_choice, on_line=on_line)
        origin = Provenance.from_labels(_sif_labels(path, tool), artifact, is_sif=True)
        return _verify_sif(path.resolve(), origin, project, tool, say, on_line)
    info = docker.image(artifact)
    if info is None:
        raise HpcboxError(
            f"no image {artifact} in the Docker engine", "give a local image reference or a .sif path"
        )
    origin = Provenance.from_labels(info.labels, artifact, is_sif=False)
    return _verify_image(artifact, info.id, origin, project, say, on_line)


def _sif_labels(path: Path, tool: Apptainer) -> Mapping[str, str]:
    return tool.inspect(path).get("labels") or {}


def _verify_sif(
    path: Path,
    origin: Provenance,
    project: ProjectConfig,
    tool: Apptainer,
    say: Callable[[str], None],
    on_line: Callable[[str], None] | None,
) -> Verdict:
    compression = parse_compression(origin.compression, convert.LABEL_COMPRESSION)
    with _scratch() as scratch, _rebuilt_image(origin, project, scratch, say, on_line) as image:
        say(f"hpcbox: converting the rebuild to a SIF ({compression}) ...")
        again = convert.build_sif(
            image, compression=compression, cache=scratch / "sif", say=lambda _: None, on_line=on_line or say
        )
        digest = file_sha256(path)
        recorded = against_recorded(origin, digest, project.root)
        if digest == again.sha256:
            return Verdict(str(path), origin.revision, (), f"sha256 {digest}", origin.off_lock, recorded)
        say("hpcbox: the SIFs differ; comparing them object by object and file by file ...")
        differences = _sif_differences(path, again.path, tool, scratch)
        converter_now = _sif_labels(again.path, tool).get(convert.LABEL_CONVERTER, "")
        if origin.converter != converter_now:
            # Another Apptainer, mksquashfs or libdeflate writes other bytes from the same files, and
            # its name in the labels differs: say so first, or the label looks like the cause.
            differences = (
                f"converted by {origin.converter or 'a converter it does not name'}; "
                f"this hpcbox converts with {converter_now}",
                *differences,
            )
    return Verdict(str(path), origin.revision, differences, f"sha256 {digest}", origin.off_lock, recorded)


def _verify_image(
    ref: str,
    image_id: str,
    origin: Provenance,
    project: ProjectConfig,
    say: Callable[[str], None],
    on_line: Callable[[str], None] | None,
) -> Verdict:
    with _scratch() as scratch, _rebuilt_image(origin, project, scratch, say, on_line) as image:
        say("hpcbox: comparing the two root filesystems file by file ...")
        differences = tuple(_differences(image_files(image_id), image_files(image.id)))
    return Verdict(
        ref,
        origin.revision,
        differences,
        f"content hash {origin.content_hash[:12]}",
        origin.off_lock,
        against_recorded(origin, origin.content_hash, project.root),
    )


@contextlib.contextmanager
def _scratch() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def _rebuilt_image(
    origin: Provenance,
    project: ProjectConfig,
    scratch: Path,
    say: Callable[[str], None],
    on_line: Callable[[str], None] | None,
) -> Iterator[Image]:
    """The image built from a clean checkout of ``origin.revision``, with no build cache; removed after."""
    checkout = scratch / "checkout"
    say(f"hpcbox: checking out {origin.revision[:12]} into a clean folder ...")
    provenance.checkout(project.root, origin.revision, checkout)
    # Named after the caller's images, so that whatever cleans those up finds these too.
    rebuilt = dataclasses.replace(
        load_project(checkout), image_repository=f"{project.repository}-verify-{os.getpid()}"
    )
    base = None if origin.pinned else _registry_base(origin)
    target = _target_with_hash(rebuilt, origin, base)
    say(f"hpcbox: building commit {origin.revision[:12]} ({origin.flavour} flavour) with no build cache ...")
    image = build_image(
        rebuilt,
        flavour=origin.flavour,
        offline=origin.pinned,
        base=base,
        no_cache=True,
        target=target,
        say=lambda _: None,
        on_line=on_line or (lambda _: None),
    )
    try:
        yield image
    finally:
        docker.remove_image(image.ref)


def _registry_base(origin: Provenance) -> str:
    """The recorded registry base, pulled if missing (by digest where it was pinned so)."""
    found = docker.image(origin.base_name)
    if found is None and docker.pull(origin.base_name):
        found = docker.image(origin.base_name)
    if found is None or found.id != origin.base_id:
        raise HpcboxError(
            f"the base image {origin.base_name} ({origin.base_id[:19]}) is not here and cannot be pulled",
            "pull it (docker pull), then verify again",
        )
    return origin.base_name


def _target_with_hash(project: ProjectConfig, origin: Provenance, base: str | None) -> str:
    """The Dockerfile target whose content hash, from this checkout, is the recorded one."""
    hashes = {}
    for target in (RUNTIME, ENVIRONMENT):
        plan = plan_build(
            project,
            flavour=origin.flavour,
            offline=origin.pinned,
            base=base,
            target=target,
            say=lambda _: None,
        )
        if plan.base_id != origin.base_id:
            raise HpcboxError(
                f"the base here ({plan.base}, {plan.base_id[:19]}) is not the recorded one "
                f"({origin.base_name}, {origin.base_id[:19]})",
                "`hpcbox base --force` bootstraps it again from the lock of that commit",
            )
        if plan.content_hash == origin.content_hash:
            return target
        hashes[target] = plan.content_hash[:12]
    raise HpcboxError(
        f"commit {origin.revision[:12]}'s sources do not hash to the recorded content hash "
        f"{origin.content_hash[:12]} (they give {', '.join(f'{t} {h}' for t, h in hashes.items())})",
        "the artifact was not built from this commit's docker/ and code",
    )


# --- comparing ----------------------------------------------------------------------------------------

# path → (type, mode, owner, size, mtime, link target, sha256 of the content)
Manifest = dict[str, tuple[str, ...]]
_FIELDS = ("type", "mode", "owner", "size", "time", "link target", "content")


def _differences(artifact: Manifest, rebuilt: Manifest) -> list[str]:
    lines = []
    for name in sorted(artifact.keys() | rebuilt.keys()):
        mine, theirs = artifact.get(name), rebuilt.get(name)
        if mine == theirs:
            continue
        if theirs is None:
            lines.append(f"/{name}: only in the artifact")
        elif mine is None:
            lines.append(f"/{name}: missing from the artifact")
        else:
            fields = [field for field, a, b in zip(_FIELDS, mine, theirs, strict=True) if a != b]
            lines.append(f"/{name}: {', '.join(fields)}")
    return lines


# What `docker export` adds that is no part of the image and differs from one export to the next.
_NOT_IMAGE = frozenset({".dockerenv", "dev/console"})


def image_files(image_id: str) -> Manifest:
    """Every file of the image's root filesystem, read from `docker export`, times clamped to its source
    date as in its SIF."""
    raw = docker.client().api.inspect_image(image_id)
    epoch = convert.created_epoch(raw)
    manifest: Manifest = {}
    with (
        rootfs.exported(image_id) as chunks,
        tarfile.open(fileobj=rootfs.ChunkReader(chunks), mode="r|") as tar,
    ):
        for member in tar:
            name = member.name.removeprefix("./").rstrip("/")
            if name in _NOT_IMAGE:
                continue
            content = ""
            if member.isfile():
                digest = hashlib.sha256()
                handle = tar.extractfile(member)
                assert handle is not None
                while block := handle.read(1 << 20):
                    digest.update(block)
                content = digest.hexdigest()
            manifest[name] = (
                _TAR_TYPES.get(member.type, "other"),
                f"{member.mode & 0o7777:o}",
                f"{member.uid}:{member.gid}",
                str(member.size if member.isfile() else 0),
                str(min(int(member.mtime), epoch) if epoch else int(member.mtime)),
                member.linkname,
                content,
            )
    return manifest


_TAR_TYPES = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.LNKTYPE: "hardlink",
    tarfile.SYMTYPE: "symlink",
    tarfile.DIRTYPE: "directory",
    tarfile.CHRTYPE: "device",
    tarfile.BLKTYPE: "device",
    tarfile.FIFOTYPE: "fifo",
}


def _sif_differences(artifact: Path, rebuilt: Path, tool: Apptainer, scratch: Path) -> tuple[str, ...]:
    """Which SIF objects differ, and within the root filesystem which files."""
    work = scratch / "compare"
    work.mkdir()
    mine = _objects(artifact, tool, work)
    theirs = _objects(rebuilt, tool, work)
    lines = []
    for kind in sorted(mine.keys() | theirs.keys()):
        if mine.get(kind) != theirs.get(kind) and not kind.startswith("FS"):
            lines.append(f"SIF object {kind!r} differs")
    filesystem = next((kind for kind in mine if kind.startswith("FS")), "")
    if mine.get(filesystem) != theirs.get(filesystem):
        files = _differences(squashfs_files(artifact, tool, work), squashfs_files(rebuilt, tool, work))
        lines += files or ["the root filesystem's squashfs differs, but no file in it does"]
    if not lines:
        lines.append("the SIF header differs")
    return tuple(lines)


def _objects(path: Path, tool: Apptainer, work: Path) -> dict[str, str]:
    """sha256 of each SIF data object, by its type as `apptainer sif list` names it."""
    linked = _into(path, work)
    rows = parse_sif_list(tool.run("apptainer", ["sif", "list", linked.name], work, what=f"list {path.name}"))
    digests = {}
    with path.open("rb") as handle:
        for row in rows:
            handle.seek(row.start)
            digest, remaining = hashlib.sha256(), row.end - row.start
            while remaining and (block := handle.read(min(remaining, 4 << 20))):
                digest.update(block)
                remaining -= len(block)
            digests[row.type.strip()] = digest.hexdigest()
    return digests


def squashfs_files(path: Path, tool: Apptainer, work: Path) -> Manifest:
    """Every file of the SIF's root filesystem: unsquashfs'd (in the helper, or on the host) and listed."""
    linked = _into(path, work)
    rows = parse_sif_list(tool.run("apptainer", ["sif", "list", linked.name], work, what=f"list {path.name}"))
    filesystem = next((row for row in rows if row.type.startswith("FS")), None)
    if filesystem is None:
        raise HpcboxError(f"{path} has no filesystem partition", "it is not a SIF of an image")
    tree = f"tree-{linked.stem}"
    script = (
        f"set -e; unsquashfs -no-progress -o {filesystem.start} -d {tree} {linked.name} >/dev/null; "
        f"cd {tree}; "
        r"find . -mindepth 1 -printf 'L\t%y\t%m\t%U:%G\t%s\t%T@\t%l\t%P\n'; "
        r"find . -type f -print0 | xargs -0r sha256sum | sed 's/^/S\t/'; "
        f"cd ..; rm -rf {tree}"
    )
    output = tool.run("sh", ["-c", script], work, what=f"list the files of {path.name}")
    listed: dict[str, list[str]] = {}
    sums: dict[str, str] = {}
    for line in output.splitlines():
        if line.startswith("L\t"):
            _, kind, mode, owner, size, mtime, link, name = line.split("\t", 7)
            listed[name] = [_FIND_TYPES.get(kind, "other"), mode, owner, size if kind == "f" else "0",
                            mtime.split(".")[0], link]  # fmt: skip
        elif line.startswith("S\t"):
            digest, _, name = line[2:].partition("  ")
            sums[name.removeprefix("./")] = digest
    return {name: (*fields, sums.get(name, "")) for name, fields in listed.items()}


_FIND_TYPES = {"f": "file", "l": "symlink", "d": "directory", "c": "device", "b": "device", "p": "fifo"}


def _into(path: Path, work: Path) -> Path:
    """``path`` inside ``work`` (which the helper container sees), hard-linked when possible."""
    inside = work / f"{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]}.sif"
    if not inside.exists():
        try:
            os.link(path, inside)
        except OSError:
            shutil.copyfile(path, inside)
    return inside
