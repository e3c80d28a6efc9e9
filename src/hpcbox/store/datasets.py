"""A dataset that is a directory, as one deterministic archive: the same files give the same bytes.

The archive is a plain tar of the directory's contents (its entries at the top, as `tar -C DIR .`
would put them), in name order, with mtime 0, owner 0:0 and no owner names, and modes reduced to
0755/0644 by the executable bit. Its sha256 is the dataset's content address on the cluster, so an
unchanged directory is sent once, and a changed file gives a new address. Symbolic links that stay
inside the directory are kept as relative links; anything the archive could not carry faithfully (a
link out of the directory or to nothing, a device, FIFO or socket) is refused.

Archiving a big directory takes a while, so archives are kept in a local cache, found by a key made
of a cheap manifest: the directory's own path and, for every entry, its path, kind, size, mtime,
ctime and inode (a file rewritten in place moves its ctime, one replaced by a rename its inode). A
directory whose manifest is unchanged is not archived again; the address is still that of the
archive's bytes, hashed once when it was made.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcbox.errors import HpcboxError
from hpcbox.files import file_sha256, partial_path, write_atomically

_FIX = "a dataset directory holds files, folders and links that stay inside it"


@dataclass(frozen=True)
class _Entry:
    name: str  # relative to the directory, '/'-separated
    kind: str  # "dir", "file" or "link"
    size: int = 0
    executable: bool = False
    link: str = ""  # a link's target, relative to the link's folder
    stamp: tuple[int, int, int] = (0, 0, 0)  # mtime_ns, ctime_ns, inode: in the cache key only


@dataclass(frozen=True)
class Archive:
    path: Path
    sha256: str
    files: int
    made: bool  # False: the cache had it


def cache_dir(project_root: Path) -> Path:
    """Where dataset archives are kept: $HPCBOX_CACHE/data, else .hpcbox/data in the project."""
    root = os.environ.get("HPCBOX_CACHE")
    return Path(root).resolve() / "data" if root else project_root / ".hpcbox" / "data"


def archive(directory: Path, cache: Path, say: Callable[[str], None] = print) -> Archive:
    """The directory's archive, from the cache when its manifest is unchanged, else made now."""
    directory = directory.resolve()
    entries = manifest(directory)
    files = sum(entry.kind == "file" for entry in entries)
    record_path = cache / "manifests" / f"{_key(directory, entries)}.json"
    found = _cached(record_path, cache)
    if found is not None:
        say(f"hpcbox: the dataset directory {directory} is unchanged since it was archived ({found[1][:12]})")
        return Archive(found[0], found[1], files, made=False)
    size = sum(entry.size for entry in entries)
    say(f"hpcbox: archiving the dataset directory {directory} ({files:,} files, {size / 1e6:,.1f} MB)")
    store = cache / "sha256"
    store.mkdir(parents=True, exist_ok=True)
    partial = partial_path(store / f"{record_path.stem}.tar")
    try:
        try:
            _write_tar(directory, entries, partial)
        except OSError as exc:
            raise HpcboxError(
                f"data: archiving {directory} into {store} failed: {exc.strerror or exc}",
                "free space there (or point HPCBOX_CACHE at a larger disk), or run again once nothing "
                "writes into the directory",
            ) from exc
        if manifest(directory) != entries:
            raise HpcboxError(
                f"data: {directory} changed while it was being archived",
                "run the command again once whatever writes there has finished",
            )
        sha256 = file_sha256(partial)
        path = store / f"{sha256}.tar"
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    held = path.stat()
    _write_record(record_path, {"sha256": sha256, "size": held.st_size, "mtime_ns": held.st_mtime_ns})
    return Archive(path, sha256, files, made=True)


def empty(cache: Path) -> Archive:
    """The archive of no files, for a job with no dataset: its node scratch's data folder stays empty,
    and every job script stages its dataset the same way. 10 KiB, the same bytes everywhere."""
    store = cache / "sha256"
    store.mkdir(parents=True, exist_ok=True)
    partial = partial_path(store / "empty.tar")
    try:
        with tarfile.open(partial, mode="w", format=tarfile.GNU_FORMAT):
            pass
        sha256 = file_sha256(partial)
        path = store / f"{sha256}.tar"
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return Archive(path, sha256, 0, made=True)


def manifest(directory: Path) -> tuple[_Entry, ...]:
    """Every entry under ``directory`` in name order; refuses what the archive cannot carry."""
    entries = []
    for parent, folders, names in os.walk(directory, onerror=_unreadable):
        folders.sort()
        for name in sorted([*folders, *names]):
            entries.append(_entry(directory, Path(parent) / name))
    if not any(entry.kind == "file" for entry in entries):
        raise HpcboxError(
            f"data: {directory} is an empty directory (no files in it)",
            "point --data at the folder that holds the dataset's files",
        )
    return tuple(sorted(entries, key=lambda entry: entry.name))


def _entry(directory: Path, path: Path) -> _Entry:
    name = path.relative_to(directory).as_posix()
    info = path.lstat()
    stamp = (info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
    if stat.S_ISLNK(info.st_mode):
        return _Entry(name, "link", link=_link_inside(directory, path), stamp=stamp)
    if stat.S_ISDIR(info.st_mode):
        return _Entry(name, "dir", stamp=stamp)
    if stat.S_ISREG(info.st_mode):
        executable = bool(info.st_mode & 0o111)
        return _Entry(name, "file", info.st_size, executable, stamp=stamp)
    raise HpcboxError(f"data: {path} is a special file (a device, FIFO or socket)", f"remove it: {_FIX}")


def _link_inside(directory: Path, link: Path) -> str:
    """The link's target relative to its folder, once it is sure to resolve inside ``directory``."""
    target = Path(os.path.realpath(link))
    if not target.is_relative_to(directory):
        raise HpcboxError(
            f"data: {link} is a symbolic link to {os.readlink(link)}, outside {directory}",
            f"copy what it points to into the directory, or remove the link: {_FIX}",
        )
    if not target.exists():
        raise HpcboxError(
            f"data: {link} is a symbolic link to {os.readlink(link)}, which does not exist",
            f"remove the link: {_FIX}",
        )
    return os.path.relpath(target, Path(os.path.realpath(link.parent)))


def _unreadable(error: OSError) -> None:
    raise HpcboxError(f"data: cannot read {error.filename}: {error.strerror}", "fix its permissions")


def _key(directory: Path, entries: tuple[_Entry, ...]) -> str:
    rows = [[e.name, e.kind, e.size, e.executable, e.link, *e.stamp] for e in entries]
    return hashlib.sha256(json.dumps([str(directory), rows]).encode()).hexdigest()


def _cached(record_path: Path, cache: Path) -> tuple[Path, str] | None:
    """The cached archive and its sha256, if the record and the archive it names are still as written."""
    try:
        record = json.loads(record_path.read_text())
        path = cache / "sha256" / f"{record['sha256']}.tar"
        held = path.stat()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (held.st_size, held.st_mtime_ns) != (record["size"], record["mtime_ns"]):
        return None
    return path, record["sha256"]


def _write_tar(directory: Path, entries: tuple[_Entry, ...], target: Path) -> None:
    # GNU format: long names without PAX headers, which would carry per-run times.
    with tarfile.open(target, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for entry in entries:
            info = tarfile.TarInfo(entry.name)
            info.mtime = 0
            info.mode = 0o755 if entry.kind == "dir" or entry.executable else 0o644
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "link":
                info.type = tarfile.SYMTYPE
                info.linkname = entry.link
                info.mode = 0o777
                tar.addfile(info)
            else:
                info.size = entry.size
                with (directory / entry.name).open("rb") as data:
                    tar.addfile(info, data)


def _write_record(path: Path, record: dict[str, object]) -> None:
    write_atomically(path, json.dumps(record, sort_keys=True) + "\n")
