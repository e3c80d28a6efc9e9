"""An image's root filesystem as a read-only folder in the helper container, and its squashfs.

mksquashfs reading a folder is what makes the fast path fast: the tar round trip it replaced (dockerd
writing `docker export`, Python filtering it, mksquashfs parsing it) cost 2.1x the export alone on the
cuda image on two cores. The folder is an overlay mount, read-only, of the image's layers with
/.singularity.d and Apptainer's root links on top, from one of two sources:

- engine: the layer folders of the Docker engine's overlay2 storage (Docker's default on Linux), bound
  read-only into the helper: nothing is copied;
- saved: where those cannot be reached (another storage driver, the containerd image store, an engine
  in a VM), `docker save` is unpacked into one folder per layer in the work folder, whiteouts written as
  overlayfs writes them, and the same overlay is mounted over those.

Both show mksquashfs the same tree, so both give the same squashfs, byte for byte (tested). The layers
keep the times their files were written at build time: pseudo definitions (`M`) clamp every time newer
than the image's source date down to it, as they are read.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import json
import os
import posixpath
import re
import tarfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from hpcbox.errors import HpcboxError
from hpcbox.tools import docker
from hpcbox.tools.apptainer import HELPER_WORKDIR, ZLIB_LIBDEFLATE, Apptainer

# In the work folder: what goes above the image's layers, the unpacked `docker save` layers, the
# listing of files newer than the source date, and its pseudo definitions.
TOP = "top"
SAVED_LAYERS = "layers"
NEWER = "newer.list"
CLAMP = "clamp.pseudo"
# What `apptainer build` adds at the root of an image (taken from a real build of the image's config).
APPTAINER_ENTRIES = (".singularity.d", ".exec", ".run", ".shell", ".test", "environment", "singularity")
_ENGINE_LAYERS = "/hpcbox-layers"  # where the helper sees the engine's overlay2 folder
# The kernel reads mount options from one page: the lowerdir list must fit in it.
_MOUNT_OPTIONS_LIMIT = 4000
_CHUNK = 1 << 20
# As root in the helper: owners by number, modes, devices and every extended attribute as recorded.
_UNTAR = (
    "-x",
    "-f",
    "-",
    "--numeric-owner",
    "--same-owner",
    "--same-permissions",
    "--xattrs",
    "--xattrs-include=*",
)

# The helper's scripts. Arguments: the source date, the number of layer folders, the folders (top
# first); what follows is left in "$@".
_LAYERS = rf"""
set -e
epoch=$1; count=$2; shift 2
lower={HELPER_WORKDIR}/{TOP}
while [ "$count" -gt 0 ]; do lower="$lower:$1"; shift; count=$((count - 1)); done
"""
# /.singularity.d and the root links from the config-only build, owned by root and stamped with the
# source date, go on top.
_PREPARE_TOP = rf"""
mkdir {TOP}
for name in {" ".join(APPTAINER_ENTRIES)}; do
    if [ -e "skeleton/$name" ] || [ -L "skeleton/$name" ]; then mv "skeleton/$name" {TOP}/; fi
done
chown -hR 0:0 {TOP}
find {TOP} -exec touch -h -d "@$epoch" {{}} +
"""
# mount(2), not the new mount API: that takes option values of at most 256 bytes, a few layers' paths.
_MOUNT = r"""
mkdir -p /rootfs
options="ro,lowerdir=$lower${HPCBOX_USERXATTR:+,userxattr}"
LIBMOUNT_FORCE_MOUNT2=always mount -t overlay hpcbox-rootfs -o "$options" /rootfs
"""
_LIST_NEWER = rf"""
cd /rootfs
find . -mindepth 1 -newermt "@$epoch" -printf '%m %U %G %P\0' > {HELPER_WORKDIR}/{NEWER}
"""
# gzip through libdeflate: the same format in half zlib's time (sif/helper-image/zlib-libdeflate.c; a helper
# named by HPCBOX_APPTAINER_HELPER may lack it, and then zlib serves, as the SIF's converter label says).
# The helper runs as root; hpcbox then fills in the SIF's header, so the file goes to the caller.
_SQUASH = rf"""
if [ -e {ZLIB_LIBDEFLATE} ]; then export LD_PRELOAD={ZLIB_LIBDEFLATE}; fi
mksquashfs /rootfs "$@"
chown "$HPCBOX_OWNER" "$1"
"""


@dataclass(frozen=True)
class Layers:
    """An image's layers as the helper sees them (top first), and the engine paths bound to show them."""

    dirs: tuple[str, ...]
    binds: tuple[tuple[str, str], ...]


def engine_layers(raw: Mapping[str, Any]) -> Layers | None:
    """The image's overlay2 layer folders on the engine's host, from its inspect record; None where its
    storage is not overlay2 or the folders cannot be named in one overlay mount."""
    driver = raw.get("GraphDriver") or {}
    data = driver.get("Data") or {}
    if driver.get("Name") != "overlay2" or not data.get("UpperDir"):
        return None
    on_host = [data["UpperDir"], *(part for part in (data.get("LowerDir") or "").split(":") if part)]
    root = posixpath.commonpath(on_host)
    inside = tuple(
        posixpath.normpath(posixpath.join(_ENGINE_LAYERS, posixpath.relpath(d, root))) for d in on_host
    )
    if not _mountable(inside):
        return None
    return Layers(inside, ((root, _ENGINE_LAYERS),))


def _mountable(dirs: Sequence[str]) -> bool:
    # ":" and "," separate overlay options; the whole list must fit in one page.
    return all(":" not in d and "," not in d for d in dirs) and len(":".join(dirs)) < _MOUNT_OPTIONS_LIMIT


def reachable(tool: Apptainer, work: Path, layers: Layers) -> bool:
    """Whether the helper sees every layer folder (not where the engine runs in a VM, for one)."""
    try:
        tool.run(
            "sh",
            ["-c", 'for d; do [ -d "$d" ] || exit 3; done', "sh", *layers.dirs],
            work,
            what="look for the image's layers",
            binds=layers.binds,
        )
    except HpcboxError:
        return False
    return True


def make_squashfs(
    tool: Apptainer,
    work: Path,
    layers: Layers,
    output: str,
    offset: int,
    mksquashfs_args: Sequence[str],
    epoch: int,
    on_line: Callable[[str], None],
) -> None:
    """Write the squashfs of work/skeleton's Apptainer entries over ``layers`` to ``work``/``output``
    from byte ``offset`` on (mksquashfs zeroes the bytes before it).

    Every time is at most ``epoch`` (0: times as they are), and the root directory is root's, 0755.
    """
    mount_args = [str(epoch), str(len(layers.dirs)), *layers.dirs]
    tool.run(
        "sh",
        ["-c", _LAYERS + _PREPARE_TOP + _MOUNT + _LIST_NEWER, "sh", *mount_args],
        work,
        what="mount the image's layers and list its files",
        mounts=True,
        env=_overlay_environment(),
        binds=layers.binds,
    )
    clamp = clamp_definitions((work / NEWER).read_bytes(), epoch) if epoch else ""
    (work / CLAMP).write_bytes(clamp.encode("utf-8", "surrogateescape"))  # names as the image spells them
    args = [output, "-noappend", "-offset", str(offset), "-quiet", "-percentage", *mksquashfs_args]
    if epoch:
        args += ["-mkfs-time", str(epoch), "-root-time", str(epoch)]
    args += ["-root-mode", "0755", "-root-uid", "0", "-root-gid", "0"]
    if clamp:
        args += ["-pf", CLAMP]
    ignored: list[str] = []

    def watched(line: str) -> None:
        if _IGNORED_DEFINITION.search(line):
            ignored.append(line.strip())
        on_line(line)

    tool.stream(
        "sh",
        ["-c", _LAYERS + _MOUNT + _SQUASH, "sh", *mount_args, *args],
        work,
        what="make the squashfs with mksquashfs",
        mounts=True,
        env={"HPCBOX_OWNER": caller(), **_overlay_environment()},
        binds=layers.binds,
        on_line=_percentages(watched),
    )
    if ignored:
        raise HpcboxError(
            f"mksquashfs skipped clamping the time of {len(ignored)} files, so the SIF would record when "
            f"it was built ({ignored[0]})",
            "squashfs-tools before 4.7 cannot clamp a folder and what it holds: convert with a helper "
            "whose squashfs-tools is 4.7 or later (hpcbox's own pins sid's; HPCBOX_APPTAINER_HELPER names "
            "another)",
        )


# mksquashfs 4.6 skips the clamp of anything inside a folder whose own time it clamped, saying so
# ("opt already exists as a non directory..  Ignoring opt/tiny!").
_IGNORED_DEFINITION = re.compile(r"\.\.  Ignoring .*!$")


def _overlay_environment() -> dict[str, str]:
    """What the helper's overlay mount of the layers needs to read them as the engine wrote them: a
    rootless engine's overlayfs (in a user namespace) keeps its marks, opaque folders among them, as
    user.overlay.* attributes, which only a mount with userxattr reads as marks (without, they show
    through as the folders' own attributes and go into the SIF); a rootful one's, trusted.overlay.*."""
    return {"HPCBOX_USERXATTR": "1"} if docker.rootless() else {}


def opaque_attribute(rootless: bool) -> str:
    """The pax header of the attribute that marks a folder opaque in layers unpacked for the mount: the
    one the overlay mount reads on that engine (_overlay_environment)."""
    return f"SCHILY.xattr.{'user' if rootless else 'trusted'}.overlay.opaque"


def caller() -> str:
    """uid:gid of this process as the helper (root) knows it, to hand back the files hpcbox edits; on a
    rootless engine the helper's root is this process's user already (its own uid there is another)."""
    return "0:0" if docker.rootless() else f"{os.getuid()}:{os.getgid()}"


def remove_root_owned(tool: Apptainer, work: Path) -> None:
    """Remove what the helper wrote as root and must stay root's (the image's files and owners, unpacked
    layers, /.singularity.d): a caller who is not root cannot; best effort, as the cleanup of a failure."""
    present = [name for name in (TOP, SAVED_LAYERS) if (work / name).exists()]
    if not present or os.getuid() == 0:
        return
    with contextlib.suppress(HpcboxError):
        tool.run("rm", ["-rf", *present], work, what="remove the conversion's root-owned folders")


def clamp_definitions(listing: bytes, epoch: int) -> str:
    """mksquashfs pseudo definitions giving each listed file (`find -printf '%m %U %G %P\\0'`) the time
    ``epoch`` and keeping its mode and owner."""
    lines = []
    for record in listing.split(b"\0"):
        if not record:
            continue
        mode, uid, gid, name = record.decode("utf-8", "surrogateescape").split(" ", 3)
        if "\n" in name:
            raise HpcboxError(
                f"the image has a file whose name holds a line break ({name!r}); mksquashfs cannot name it",
                "rename it in the image, or convert with --path reference",
            )
        quoted = name.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'"{quoted}" M {epoch} {mode} {uid} {gid}\n')
    return "".join(lines)


def _percentages(on_line: Callable[[str], None]) -> Callable[[str], None]:
    """mksquashfs -percentage prints a number per update: show every tenth, pass anything else on."""
    shown = [-1]

    def report(line: str) -> None:
        text = line.strip()
        if not text:
            return
        if not text.isdigit():
            on_line(line)
        elif int(text) // 10 > shown[0]:
            shown[0] = int(text) // 10
            on_line(f"  mksquashfs {text}%")

    return report


# --- saved: `docker save`, unpacked one folder per layer ------------------------------------------------


def unpack_saved(image_id: str, tool: Apptainer, work: Path, on_line: Callable[[str], None]) -> Layers:
    """Unpack the image's `docker save` archive into work/layers/N, one folder per layer, with whiteouts
    as overlayfs writes them (a 0/0 character device; an opaque folder's overlay.opaque=y, trusted.* or
    on a rootless engine user.*).

    The helper's tar reads through a FIFO in the bind-mounted work folder: `docker run -i`'s attach
    stream, the other road in, is the slower one."""
    (work / SAVED_LAYERS).mkdir()
    fifo = work / "layers.fifo"
    os.mkfifo(fifo, 0o600)
    done = threading.Event()
    errors: list[BaseException] = []
    order: list[str] = []

    def feed() -> None:
        try:
            sink = _open_fifo(fifo, done)
            if sink is None:
                return  # tar ended before it read anything; its own error says why
            with sink:
                order.extend(write_layers(docker.save(image_id), sink, opaque_attribute(docker.rootless())))
        except BrokenPipeError:
            pass  # tar stopped reading; its own error says why
        except BaseException as exc:
            errors.append(exc)

    writer = threading.Thread(target=feed, name="hpcbox-save", daemon=True)
    writer.start()
    try:
        tool.stream(
            "sh",
            ["-c", f'exec tar "$@" < {fifo.name}', "sh", *_UNTAR, "-C", SAVED_LAYERS],
            work,
            what="unpack the image's layers",
            mounts=True,  # trusted.* attributes need CAP_SYS_ADMIN
            on_line=on_line,
        )
    except HpcboxError:
        if errors:
            raise _save_error(errors[0]) from errors[0]
        raise
    finally:
        done.set()
        writer.join()
    if errors:
        raise _save_error(errors[0]) from errors[0]
    return Layers(tuple(f"{HELPER_WORKDIR}/{folder}" for folder in reversed(order)), ())


def _open_fifo(fifo: Path, done: threading.Event) -> IO[bytes] | None:
    """The FIFO's writing end once the helper has opened it for reading; None if it ended first."""
    while not done.is_set():
        try:
            descriptor = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
            time.sleep(0.05)
            continue
        os.set_blocking(descriptor, True)
        return os.fdopen(descriptor, "wb", buffering=_CHUNK)
    return None


def _save_error(exc: BaseException) -> HpcboxError:
    if isinstance(exc, HpcboxError):
        return exc
    return HpcboxError(f"docker save failed: {exc}", "check the Docker engine, then run `hpcbox sif` again")


def write_layers(chunks: Iterable[bytes], out: IO[bytes], opaque: str) -> list[str]:
    """Write the layers of a `docker save` stream to ``out`` as one tar, layer N under layers/N, opaque
    folders marked with the attribute ``opaque`` (opaque_attribute); returns the layer folders bottom
    first, as the archive's manifest orders them."""
    folders: dict[str, str] = {}
    manifest = None
    with (
        tarfile.open(fileobj=ChunkReader(chunks), mode="r|") as saved,
        tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as unpacked,
    ):
        for member in saved:
            data = saved.extractfile(member) if member.isfile() else None
            if data is None:
                continue
            if member.name == "manifest.json":
                manifest = json.load(data)
            elif member.name.endswith("/layer.tar") or member.name.startswith("blobs/"):
                folder = f"{SAVED_LAYERS}/{len(folders)}"
                if _copy_layer(data, folder.split("/", 1)[1], unpacked, opaque):
                    folders[member.name] = folder
    if not manifest or "Layers" not in manifest[0]:
        raise HpcboxError("docker save wrote no manifest of the image's layers", "run `hpcbox sif` again")
    missing = [name for name in manifest[0]["Layers"] if name not in folders]
    if missing:
        raise HpcboxError(
            f"docker save's layer {missing[0]} is not a tar hpcbox can read (compressed with zstd?)",
            "convert with --path reference",
        )
    return [folders[name] for name in manifest[0]["Layers"]]


def _copy_layer(data: IO[bytes], folder: str, out: tarfile.TarFile, opaque: str) -> bool:
    """Copy one layer tar under ``folder``; False if ``data`` is not a tar (a config or index blob)."""
    try:
        layer = tarfile.open(fileobj=data, mode="r|*")  # noqa: SIM115
    except tarfile.ReadError:
        return False
    top = tarfile.TarInfo(folder)
    top.type, top.mode = tarfile.DIRTYPE, 0o755
    out.addfile(top)
    directories: dict[str, tarfile.TarInfo] = {}
    with layer:
        for entry in layer:
            name = posixpath.normpath(entry.name.lstrip("/")).removeprefix("./")
            if name in (".", ""):
                continue
            parent, _, base = name.rpartition("/")
            if base == ".wh..wh..opq":
                marked = _opaque(directories.get(parent), posixpath.join(folder, parent), entry.mtime, opaque)
                out.addfile(marked)
            elif base.startswith(".wh."):
                out.addfile(_whiteout(posixpath.join(folder, parent, base[4:]), entry))
            else:
                moved = _moved(entry, name, folder)
                if entry.isdir():
                    directories[name] = entry
                out.addfile(moved, layer.extractfile(entry) if entry.isreg() else None)
    return True


def _moved(entry: tarfile.TarInfo, name: str, folder: str) -> tarfile.TarInfo:
    moved = copy.copy(entry)
    moved.name = posixpath.join(folder, name)
    if entry.islnk():  # a hard link names a path in the same layer
        moved.linkname = posixpath.join(folder, posixpath.normpath(entry.linkname.lstrip("/")))
    # Only the extended attributes: tarfile writes the path, size and times again from the fields.
    moved.pax_headers = {k: v for k, v in entry.pax_headers.items() if k.startswith("SCHILY.xattr.")}
    return moved


def _opaque(directory: tarfile.TarInfo | None, name: str, mtime: float, attribute: str) -> tarfile.TarInfo:
    """The folder again, marked opaque: overlayfs then hides what lower layers have in it."""
    marked = copy.copy(directory) if directory is not None else tarfile.TarInfo()
    if directory is None:
        marked.type, marked.mode, marked.mtime = tarfile.DIRTYPE, 0o755, mtime
    marked.name = name
    marked.pax_headers = {**marked.pax_headers, attribute: "y"}
    return marked


def _whiteout(name: str, entry: tarfile.TarInfo) -> tarfile.TarInfo:
    """What overlayfs reads as "deleted here": a character device 0/0."""
    device = tarfile.TarInfo(name)
    device.type, device.mode, device.devmajor, device.devminor = tarfile.CHRTYPE, 0, 0, 0
    device.uid, device.gid, device.mtime = entry.uid, entry.gid, entry.mtime
    return device


# --- reading the engine's streams ---------------------------------------------------------------------


@contextlib.contextmanager
def exported(image_id: str) -> Iterator[Iterator[bytes]]:
    """`docker export` of a created (never started) container of the image; the container is removed."""
    container = docker.client().containers.create(
        image_id, command=["true"], name=f"hpcbox-export-{os.urandom(4).hex()}"
    )
    try:
        yield container.export(chunk_size=_CHUNK)
    finally:
        container.remove(force=True)


class ChunkReader:
    """A read-only file over a stream of chunks (what tarfile's stream mode reads from)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""
        self._offset = 0

    def read(self, limit: int = -1) -> bytes:
        if limit < 0:
            return b"".join([self._buffer[self._offset :], *self._chunks])
        if self._offset >= len(self._buffer):
            self._buffer = next(self._chunks, b"")
            self._offset = 0
            if not self._buffer:
                return b""
        piece = self._buffer[self._offset : self._offset + limit]
        self._offset += len(piece)
        return piece
