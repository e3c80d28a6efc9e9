"""The sif stage: a Docker image → an Apptainer SIF, named by the image's content and kept in a cache.

Two conversions give the same SIF contents:

- reference: `docker save`, then Apptainer's own `apptainer build` from the archive;
- fast (default): mksquashfs reads the image's root filesystem as a folder (a read-only overlay of its
  layers, hpcbox.rootfs), then the SIF is assembled with `apptainer sif new/add`. What Apptainer's
  conversion adds to an image (`/.singularity.d`: environment from ENV, runscript from ENTRYPOINT/CMD,
  labels, the definition and inspect metadata) is taken from a real `apptainer build` of a config-only
  copy of the image (the same config, no files: well under a second), so both paths carry exactly what
  Apptainer would write.

Both build from the same definition file, whose %labels carry the image's id; the image's own labels
(source revision, lock hash) come through from its config.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import shutil
import struct
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any, Protocol

from hpcbox.build import offlock
from hpcbox.build.image import LABEL_CONTENT, LABEL_SOURCE_DATE_EPOCH, Image
from hpcbox.errors import HpcboxError
from hpcbox.files import SHA256_MEMO, known_sha256, write_atomically
from hpcbox.sif import rootfs
from hpcbox.sif.compression import DEFAULT as DEFAULT_COMPRESSION
from hpcbox.sif.compression import SifCompression
from hpcbox.sif.helper import engine, helper_moved
from hpcbox.tools import docker
from hpcbox.tools.apptainer import Apptainer, Command, parse_sif_list

CONVERSIONS = ("fast", "reference")
DEFAULT_CONVERSION = "fast"
LABEL_IMAGE_ID = "io.hpcbox.image.id"
# The Apptainer and mksquashfs (and libdeflate, for gzip on the fast path) that made the SIF: the same
# image gives the same SIF with the same ones.
LABEL_CONVERTER = "io.hpcbox.sif.converter"
# Every pin Debian had moved, the image's (its own io.hpcbox.off-lock label, which the SIF keeps) and
# the converter's.
LABEL_OFF_LOCK = "io.hpcbox.sif.off-lock"
LABEL_IMAGE_REF = "io.hpcbox.image.ref"
# The squashfs compression as `hpcbox sif --compression` writes it: `hpcbox verify` converts again with it.
LABEL_COMPRESSION = "io.hpcbox.sif.compression"
BUILD_DATE_LABEL = "org.label-schema.build-date"
DEFINITION = "hpcbox.def"
ARCHIVE = "image.tar"
# SIF partition architecture codes (`apptainer sif add --partarch`).
PARTITION_ARCHITECTURES = {
    "386": 1,
    "amd64": 2,
    "arm": 3,
    "arm64": 4,
    "ppc64": 5,
    "ppc64le": 6,
    "mips": 7,
    "mipsle": 8,
    "mips64": 9,
    "mips64le": 10,
    "s390x": 11,
    "riscv64": 12,
}
_CHUNK = 1 << 20
_IMAGE_CONFIG_KEYS = (
    "User",
    "ExposedPorts",
    "Env",
    "Entrypoint",
    "Cmd",
    "Volumes",
    "WorkingDir",
    "Labels",
    "StopSignal",
    "ArgsEscaped",
)


class ImageLike(Protocol):
    """What this stage needs of the build stage's Image."""

    @property
    def ref(self) -> str: ...


@dataclass(frozen=True)
class Sif:
    """A SIF in the cache: the sif stage's artifact."""

    path: Path
    sha256: str
    size: int
    compression: str
    image_id: str
    built: bool = False  # False: it came from the cache
    off_lock: str = ""  # the pins Debian had moved, the image's and its converter's (its off-lock label)

    def record(self) -> str:
        fields = {key: value for key, value in asdict(self).items() if key != "built"}
        return json.dumps({**fields, "path": self.path.name}, sort_keys=True, indent=1) + "\n"


def cache_dir() -> Path:
    """Where SIFs are kept: $HPCBOX_CACHE/sif, else .hpcbox/sif in the project."""
    from hpcbox.project.config import find_root

    root = os.environ.get("HPCBOX_CACHE")
    if root:
        return Path(root).resolve() / "sif"
    return find_root() / ".hpcbox" / "sif"


def sif_path_for(
    image_id: str, compression: SifCompression = DEFAULT_COMPRESSION, cache: Path | None = None
) -> Path:
    """The cache path of the SIF of image ``image_id`` (its content address) at ``compression``."""
    return (cache or cache_dir()) / f"{image_id.removeprefix('sha256:')}.{compression.slug}.sif"


def cached(
    image_id: str, compression: SifCompression = DEFAULT_COMPRESSION, cache: Path | None = None
) -> Sif | None:
    """The cached SIF if its bytes still match its recorded sha256; None if absent or corrupted."""
    path = sif_path_for(image_id, compression, cache)
    record = path.with_suffix(".json")
    if not path.is_file() or not record.is_file():
        return None
    try:
        fields = json.loads(record.read_text())
        sif = Sif(
            path=path,
            sha256=fields["sha256"],
            size=int(fields["size"]),
            compression=fields["compression"],
            image_id=fields["image_id"],
            off_lock=fields.get("off_lock", ""),
        )
    except (ValueError, KeyError, TypeError):
        return None
    if path.stat().st_size != sif.size or known_sha256(path, path.parent / SHA256_MEMO) != sif.sha256:
        return None
    return sif


def rootfs_sha256(sif: Path, tool: Apptainer) -> str:
    """sha256 of the SIF's root filesystem (the squashfs payload), found by `apptainer sif list`."""
    rows = parse_sif_list(
        tool.run("apptainer", ["sif", "list", sif.name], sif.parent, what=f"list {sif.name}")
    )
    filesystem = next((row for row in rows if row.type.startswith("FS")), None)
    if filesystem is None:
        raise HpcboxError(f"{sif} has no filesystem partition", "convert it again with `hpcbox sif --force`")
    digest = hashlib.sha256()
    with sif.open("rb") as handle:
        handle.seek(filesystem.start)
        remaining = filesystem.end - filesystem.start
        while remaining:
            block = handle.read(min(remaining, _CHUNK * 4))
            if not block:
                break
            digest.update(block)
            remaining -= len(block)
    return digest.hexdigest()


def definition(labels: Mapping[str, str], archive: str = ARCHIVE, comment: str = "") -> str:
    """An Apptainer definition building an image from its `docker save` archive, ``labels`` in %labels."""
    header = "".join(f"# {line}\n" if line else "#\n" for line in comment.splitlines())
    section = (
        "\n%labels\n" + "".join(f"    {key} {value}\n" for key, value in labels.items()) if labels else ""
    )
    return f"{header}Bootstrap: docker-archive\nFrom: {archive}\n{section}"


def local_names(image_id: str, ref: str) -> dict[str, str]:
    """What this engine calls the image: its id and tag, as provenance labels.

    A reproducible image's SIF carries neither: the engine gives the same content a new id on every
    build (its layers keep their build times), and the tag's repository is local configuration. Its
    content hash, lock hash and source revision come with the image's own labels.
    """
    return {LABEL_IMAGE_ID: image_id, LABEL_IMAGE_REF: ref}


def write_definition(image: ImageLike, directory: Path, name: str) -> Path:
    """Write ``directory/name.def`` for building the SIF on a cluster (`apptainer build --fakeroot`)."""
    info = _require_image(image.ref)
    archive = f"{name}.tar"
    text = definition(
        local_names(info.id, image.ref),
        archive,
        comment=(
            f"Generated by `hpcbox sif --def-only` for {image.ref}.\n"
            "For sites where SIFs must be built on the cluster:\n"
            f"  docker save {image.ref} -o {archive}    (here; copy both files to the cluster)\n"
            f"  apptainer build --fakeroot {name}.sif {name}.def    (there, next to {archive})"
        ),
    )
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}.def"
    write_atomically(target, text.encode())
    return target


def build_sif(
    image: ImageLike,
    *,
    engine_choice: str = "auto",
    conversion: str = DEFAULT_CONVERSION,
    compression: SifCompression = DEFAULT_COMPRESSION,
    cache: Path | None = None,
    force: bool = False,
    strict_lock: bool = False,
    say: Callable[[str], None] = print,
    on_line: Callable[[str], None] | None = None,
) -> Sif:
    """The SIF of ``image``: from the cache when its content is unchanged, else converted now. An image
    or a converter built past pins Debian moved makes an off-lock SIF (refused when ``strict_lock``)."""
    if conversion not in CONVERSIONS:
        raise HpcboxError(
            f"--path: unknown conversion {conversion!r}", f"choose one of: {', '.join(CONVERSIONS)}"
        )
    # The build stage's Image was inspected a moment ago: its id finds a cached SIF without asking the
    # engine again (a submit's every stage is a no-op when nothing changed).
    info = None if isinstance(image, Image) else _require_image(image.ref)
    image_id = image.id if info is None else info.id
    strict = offlock.strict_lock(strict_lock)
    cache = cache or cache_dir()
    target = sif_path_for(image_id, compression, cache)
    if not force:
        hit = cached(image_id, compression, cache)
        if hit is not None:
            moved = offlock.parse(hit.off_lock)
            offlock.refuse_if(moved, strict, f"SIF ({target.name} is off-lock)")
            offlock.announce(moved, say)
            say(f"hpcbox: {target.name} is up to date")
            return hit
        if target.exists():
            say(f"hpcbox: cached {target.name} no longer matches its recorded sha256; rebuilding it")
    info = info or _require_image(image.ref)
    raw = docker.client().api.inspect_image(info.id)
    reproducible = _source_date_epoch(raw) is not None
    if conversion == "fast" and engine_choice == "host":
        raise HpcboxError(
            "--engine host: the fast path mounts the image's layers in hpcbox's helper container",
            "use --engine container (auto picks it for the fast path), or --path reference",
        )
    image_moved = offlock.from_labels(info.labels)
    offlock.refuse_if(image_moved, strict, f"SIF (image {image.ref} is off-lock)")
    tool = engine(
        "container" if conversion == "fast" else engine_choice, strict=strict, on_line=on_line, say=say
    )
    moved = (*image_moved, *(helper_moved(tool.program) if tool.kind == "container" else ()))
    offlock.announce(moved, say)
    cache.mkdir(parents=True, exist_ok=True)
    layers = rootfs.engine_layers(raw) if conversion == "fast" else None
    _check_disk(cache, info.size, _copies(conversion, layers))
    say(
        f"hpcbox: converting {image.ref} to a SIF ({conversion} path, {compression}, Apptainer on "
        f"{'the host' if tool.kind == 'host' else 'the helper container ' + tool.program})"
    )
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=".convert-", dir=cache))
    try:
        labels = {} if reproducible else local_names(info.id, image.ref)
        gzip_by_libdeflate = conversion == "fast" and compression.algorithm == "gzip"
        labels[LABEL_CONVERTER] = tool.versions(work, libdeflate=gzip_by_libdeflate)
        labels[LABEL_COMPRESSION] = str(compression)
        if moved:
            labels[LABEL_OFF_LOCK] = offlock.to_label(moved)
        (work / DEFINITION).write_text(definition(labels))
        if conversion == "fast":
            _convert_fast(tool, work, info, raw, layers, compression, say, on_line or print)
        else:
            _convert_reference(tool, work, info.id, compression, say, on_line)
        # read where it stays, so that the next cache hit finds its digest kept and need not read it again
        os.replace(work / "out.sif", target)
        sif = Sif(
            path=target,
            sha256=known_sha256(target, target.parent / SHA256_MEMO),
            size=target.stat().st_size,
            compression=str(compression),
            image_id=info.id,
            built=True,
            off_lock=offlock.to_label(moved),
        )
        write_atomically(target.with_suffix(".json"), sif.record().encode())
    finally:
        if conversion == "fast":
            rootfs.remove_root_owned(tool, work)
        shutil.rmtree(work, ignore_errors=True)
    say(f"hpcbox: wrote {target} ({sif.size / 1e6:.0f} MB) in {time.monotonic() - started:.1f} s")
    return sif


def _require_image(ref: str) -> docker.ImageInfo:
    info = docker.image(ref)
    if info is None:
        raise HpcboxError(f"image {ref} is not built", "run `hpcbox build` first (same --flavour)")
    return info


def _copies(conversion: str, layers: rootfs.Layers | None) -> int:
    """How many times the image's size a conversion writes: the SIF (its squashfs at most the image's
    size); the image unpacked too where its layers are out of reach; for reference, the archive, the
    SIF, and Apptainer's extracted copy of the image and its squashfs."""
    if conversion == "reference":
        return 4
    return 1 if layers is not None else 2


def _check_disk(cache: Path, image_size: int, copies: int) -> None:
    needed = image_size * copies + (256 << 20)
    free = shutil.disk_usage(cache).free
    if free < needed:
        raise HpcboxError(
            f"not enough disk space in {cache} to convert: about {needed / 1e9:.1f} GB needed, "
            f"{free / 1e9:.1f} GB free",
            "free some space, or point HPCBOX_CACHE at a larger disk",
        )


# --- reference: docker save + apptainer build -------------------------------------------------------


def _convert_reference(
    tool: Apptainer,
    work: Path,
    image_id: str,
    compression: SifCompression,
    say: Callable[[str], None],
    on_line: Callable[[str], None] | None,
) -> None:
    say("hpcbox: docker save ...")
    with (work / ARCHIVE).open("wb") as archive:
        for chunk in docker.save(image_id):
            archive.write(chunk)
    args = ["build", "--mksquashfs-args", shlex.join(compression.mksquashfs_args())]
    tmp = work / "tmp"
    tmp.mkdir()
    tmpdir = str(tmp) if tool.kind == "host" else "/work/tmp"
    tool.stream(
        "apptainer",
        [*args, "out.sif", DEFINITION],
        work,
        what="build the SIF with apptainer",
        mounts=True,
        env={"APPTAINER_TMPDIR": tmpdir},
        on_line=on_line,
    )


# --- fast: mksquashfs reading the image's layers as a folder, into the SIF apptainer sif laid out -------


def _convert_fast(
    tool: Apptainer,
    work: Path,
    info: docker.ImageInfo,
    raw: Mapping[str, Any],
    layers: rootfs.Layers | None,
    compression: SifCompression,
    say: Callable[[str], None],
    on_line: Callable[[str], None],
) -> None:
    epoch = created_epoch(raw)
    arch = PARTITION_ARCHITECTURES.get(str(raw.get("Architecture") or "amd64"))
    if arch is None:
        raise HpcboxError(
            f"image architecture {raw.get('Architecture')!r} has no SIF code", "use --path reference"
        )
    say("hpcbox: generating /.singularity.d with apptainer from the image's config ...")
    objects = _apptainer_metadata(tool, work, raw, epoch)
    if layers is not None and not rootfs.reachable(tool, work, layers):
        say("hpcbox: the helper cannot see the engine's image layers; unpacking `docker save` instead")
        _check_disk(work, info.size, _copies("fast", None))
        layers = None
    if layers is None:
        say(f"hpcbox: unpacking the layers of {info.id[:19]} (docker save) ...")
        layers = rootfs.unpack_saved(info.id, tool, work, on_line)
    sif = work / "out.sif"
    offset = _lay_out_sif(tool, work, sif, objects, arch)
    prefix = sif.read_bytes()[:offset]
    say(f"hpcbox: mksquashfs ({compression}) reading the image's {len(layers.dirs)} layers ...")
    rootfs.make_squashfs(tool, work, layers, sif.name, offset, compression.mksquashfs_args(), epoch, on_line)
    _fill_partition(sif, prefix)
    identity = _labels(raw).get(LABEL_CONTENT) or info.id
    normalise_header(sif, epoch, f"{identity} {compression}")


def _lay_out_sif(
    tool: Apptainer, work: Path, sif: Path, objects: list[tuple[int, str, str]], arch: int
) -> int:
    """Write ``sif`` with Apptainer's objects and a one-byte root filesystem partition, as `apptainer sif`
    lays them out; returns the partition's offset, where mksquashfs then writes the real one (copying a
    4 GB squashfs into the SIF took 9 s of a 36 s conversion)."""
    (work / _PLACEHOLDER).write_bytes(b"\0")
    add = ("sif", "add", "--groupid", "1")
    steps = [Command("apptainer", ("sif", "new", sif.name))]
    for datatype, filename, path in objects:
        steps.append(
            Command("apptainer", (*add, "--datatype", str(datatype), "--filename", filename, sif.name, path))
        )
    partition = ("--datatype", "4", "--partfs", "1", "--parttype", "2", "--partarch", str(arch))
    steps.append(Command("apptainer", (*add, *partition, sif.name, _PLACEHOLDER)))
    tool.script(steps, work, what="lay out the SIF with apptainer sif")
    offset, size, _ = _partition(sif)
    if size != 1 or sif.stat().st_size != offset + 1:
        raise HpcboxError(f"unexpected SIF layout from this Apptainer in {sif}", "use --path reference")
    return offset


# SIF (format 01) global header and descriptors, little-endian and packed, as sylabs/sif lays them out.
_SIF_ID = 48  # 16-byte UUID, then created and modified times (int64)
_SIF_DESCRIPTORS = struct.Struct("<qqqq")  # free, total, offset, size of the descriptor table
_SIF_DESCRIPTOR_SIZE = 585
_DESCRIPTOR_USED = 4
_DESCRIPTOR_OFFSET = 17  # the object's offset, size, and size with the padding before it: three int64
_SIF_DATA_SIZE = 120
_PARTITION = 0x4004
_PLACEHOLDER = "rootfs.placeholder"
_DESCRIPTOR_TIMES = 41  # created, modified, uid, gid: four int64


def normalise_header(path: Path, epoch: int, identity: str) -> None:
    """Replace what `apptainer sif` stamps per run (a random UUID, the wall-clock time, the builder's
    uid/gid) with values from the content: the same image gives the same SIF, byte for byte."""
    image_uuid = uuid.UUID(bytes=hashlib.sha256(identity.encode()).digest()[:16], version=4)
    with path.open("r+b") as sif:
        header = sif.read(128)
        if header[32:41] != b"SIF_MAGIC":
            raise HpcboxError(f"{path} is not a SIF file", "run `hpcbox sif --force`")
        sif.seek(_SIF_ID)
        sif.write(image_uuid.bytes + struct.pack("<qq", epoch, epoch))
        for start, _descriptor in _used_descriptors(sif, header):
            sif.seek(start + _DESCRIPTOR_TIMES)
            sif.write(struct.pack("<qqqq", epoch, epoch, 0, 0))


def _used_descriptors(sif: IO[bytes], header: bytes) -> list[tuple[int, bytes]]:
    """(position, bytes) of each data object descriptor in use, from the SIF's global ``header``."""
    _free, total, table, _size = _SIF_DESCRIPTORS.unpack_from(header, 80)
    used = []
    for index in range(total):
        start = table + index * _SIF_DESCRIPTOR_SIZE
        sif.seek(start)
        descriptor = sif.read(_SIF_DESCRIPTOR_SIZE)
        if descriptor[_DESCRIPTOR_USED] == 1:
            used.append((start, descriptor))
    return used


def _partition(path: Path) -> tuple[int, int, int]:
    """(offset, size, descriptor position) of the SIF's root filesystem partition."""
    with path.open("rb") as sif:
        for start, descriptor in _used_descriptors(sif, sif.read(128)):
            if struct.unpack_from("<i", descriptor)[0] == _PARTITION:
                offset, size = struct.unpack_from("<qq", descriptor, _DESCRIPTOR_OFFSET)
                return offset, size, start
    raise HpcboxError(f"{path} has no filesystem partition", "convert it again with `hpcbox sif --force`")


def _fill_partition(path: Path, prefix: bytes) -> None:
    """After mksquashfs wrote the squashfs at the placeholder's offset (zeroing what came before): put
    back the SIF's header, descriptors and objects, and record the partition's real size."""
    with path.open("r+b") as sif:
        sif.write(prefix)
    offset, placeholder, position = _partition(path)
    size = path.stat().st_size - offset
    grown = size - placeholder
    with path.open("r+b") as sif:
        sif.seek(position + _DESCRIPTOR_OFFSET + 16)
        (stored,) = struct.unpack("<q", sif.read(8))
        sif.seek(position + _DESCRIPTOR_OFFSET + 8)
        sif.write(struct.pack("<qq", size, stored + grown))
        sif.seek(_SIF_DATA_SIZE)
        (data_size,) = struct.unpack("<q", sif.read(8))
        sif.seek(_SIF_DATA_SIZE)
        sif.write(struct.pack("<q", data_size + grown))


def _labels(raw: Mapping[str, Any]) -> Mapping[str, str]:
    """The labels of an image, from the engine's inspect record."""
    return (raw.get("Config") or {}).get("Labels") or {}


def _source_date_epoch(raw: Mapping[str, Any]) -> int | None:
    """The time `hpcbox build` stamped a reproducible image with (from its pinned base), if any."""
    value = _labels(raw).get(LABEL_SOURCE_DATE_EPOCH, "")
    return int(value) if str(value).isdigit() else None


def created_epoch(raw: Mapping[str, Any]) -> int:
    """Every time in the SIF: the image's source date when it has one, else its creation time.

    Later times are clamped down to it, so a reproducible image's SIF does not depend on when it was built.
    """
    pinned = _source_date_epoch(raw)
    if pinned is not None:
        return pinned
    created = str(raw.get("Created") or "")
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", created)
    if not match:
        return 0
    return int(datetime.fromisoformat(match[1]).replace(tzinfo=UTC).timestamp())


def _apptainer_metadata(
    tool: Apptainer, work: Path, raw: Mapping[str, Any], epoch: int
) -> list[tuple[int, str, str]]:
    """Build the config-only copy of the image with apptainer; keep its /.singularity.d and SIF objects.

    Returns (datatype, filename, path) of the SIF's non-filesystem objects, in Apptainer's order.
    """
    (work / ARCHIVE).write_bytes(_config_only_archive(raw))
    steps = [
        Command("apptainer", ("build", "skeleton.sif", DEFINITION)),
        Command("apptainer", ("sif", "list", "skeleton.sif"), stdout="skeleton.list"),
    ]
    # Apptainer writes the definition, two JSON objects and the filesystem, in that order.
    for object_id in (1, 2, 3):
        steps += [
            Command(
                "apptainer",
                ("sif", "info", str(object_id), "skeleton.sif"),
                stdout=f"object-{object_id}.info",
            ),
            Command(
                "apptainer", ("sif", "dump", str(object_id), "skeleton.sif"), stdout=f"object-{object_id}"
            ),
        ]
    steps += [
        Command("apptainer", ("sif", "dump", "4", "skeleton.sif"), stdout="skeleton.sqfs"),
        Command("unsquashfs", ("-no-xattrs", "-quiet", "-no-progress", "-d", "skeleton", "skeleton.sqfs")),
        # The helper runs as root: what hpcbox edits below must be the caller's.
        Command("chown", ("-R", rootfs.caller(), ".")),
    ]
    tool.script(steps, work, what="build the /.singularity.d metadata with apptainer", mounts=True)
    listed = [row.type for row in parse_sif_list((work / "skeleton.list").read_text())]
    if len(listed) != 4 or not listed[0].startswith("Def.FILE") or not listed[3].startswith("FS"):
        raise HpcboxError(f"unexpected SIF layout from this Apptainer: {listed}", "use --path reference")
    created = datetime.fromtimestamp(epoch, UTC)
    build_date = created.strftime("%A_%d_%B_%Y_%H:%M:") + f"{created.second}_UTC"  # Apptainer's format
    labels = work / "skeleton" / ".singularity.d" / "labels.json"
    for path in (labels, work / "object-2"):
        path.write_text(_set_build_date(path.read_text(), build_date))
    objects = []
    for object_id, datatype in ((1, 1), (2, 6), (3, 6)):
        name = re.search(r"Name:\s*(\S+)", (work / f"object-{object_id}.info").read_text())
        objects.append((datatype, name[1] if name else f"object-{object_id}", f"object-{object_id}"))
    return objects


def _set_build_date(text: str, value: str) -> str:
    # Apptainer stamps the build time; the image's creation time makes two conversions identical.
    return re.sub(r'("' + re.escape(BUILD_DATE_LABEL) + r'"\s*:\s*")[^"]*(")', rf"\g<1>{value}\g<2>", text)


def _config_only_archive(raw: Mapping[str, Any]) -> bytes:
    """A `docker save`-style archive with the image's config and one empty layer."""
    layer = io.BytesIO()
    tarfile.open(fileobj=layer, mode="w").close()
    config_source = raw.get("Config") or {}
    config = {
        "architecture": raw.get("Architecture") or "amd64",
        "os": raw.get("Os") or "linux",
        "config": {key: config_source[key] for key in _IMAGE_CONFIG_KEYS if config_source.get(key)},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer.getvalue()).hexdigest()]},
    }
    if raw.get("Variant"):
        config["variant"] = raw["Variant"]
    members = {
        "config.json": json.dumps(config, sort_keys=True).encode(),
        "layer.tar": layer.getvalue(),
        "manifest.json": json.dumps(
            [{"Config": "config.json", "RepoTags": None, "Layers": ["layer.tar"]}]
        ).encode(),
    }
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data in members.items():
            entry = tarfile.TarInfo(name)
            entry.size = len(data)
            tar.addfile(entry, io.BytesIO(data))
    return archive.getvalue()
