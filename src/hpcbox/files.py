"""Small file helpers shared by every stage (below them all in the import order)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from hpcbox.errors import HpcboxError

_BLOCK = 4 << 20
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9._-]+")
# The folder of a cache where `known_sha256` keeps what it read.
SHA256_MEMO = ".sha256"


def project_root(start: Path | None = None) -> Path | None:
    """The nearest folder at or above ``start`` (default: here) with a pyproject.toml, if any."""
    here = (start or Path.cwd()).resolve()
    return next((folder for folder in (here, *here.parents) if (folder / "pyproject.toml").is_file()), None)


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in blocks (SIFs and root filesystems are hundreds of MB)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def known_sha256(path: Path, memo: Path) -> str:
    """``file_sha256`` of ``path``, read again only when the file changed since it was last read: the
    digest is kept in the folder ``memo`` with the file's size, inode and times (its ctime no tool can set
    back), as git's index keeps them. A submit checks a 500 MB SIF and the dataset every time; reading
    them costs a second or more, their unchanged stat nothing."""
    facts = path.stat()
    seen = f"{facts.st_dev}:{facts.st_ino}:{facts.st_size}:{facts.st_mtime_ns}:{facts.st_ctime_ns}"
    entry = memo / f"{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:32]}.sha256"
    with contextlib.suppress(OSError, ValueError):
        recorded_seen, digest = entry.read_text().split()
        if recorded_seen == seen and len(digest) == 64:
            return digest
    digest = file_sha256(path)
    with contextlib.suppress(OSError):
        write_atomically(entry, f"{seen} {digest}\n")
    return digest


def write_atomically(target: Path, data: bytes | str, *, mode: int | None = None) -> None:
    """Write ``data`` to ``target`` (its folder made if missing) whole or not at all: a reader never sees
    half a file, a failure leaves nothing behind, and of two processes writing it, one wins whole."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = partial_path(target)
    try:
        if isinstance(data, bytes):
            partial.write_bytes(data)
        else:
            partial.write_text(data)
        if mode is not None:
            partial.chmod(mode)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)


def partial_path(target: Path) -> Path:
    """Where to write ``target`` before renaming it into place: beside it (a rename within one
    filesystem is atomic), hidden, and this process's own."""
    return target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(3).hex()}.partial")


def private_folder() -> Path:
    """This user's own folder on this machine for hpcbox's locks and SSH sockets, $TMPDIR/hpcbox-UID
    (0700), made where missing."""
    folder = Path(tempfile.gettempdir()) / f"hpcbox-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    # Under a shared /tmp, another user's folder (or link) of that name would hold our locks and sockets.
    seen = folder.lstat()
    if not stat.S_ISDIR(seen.st_mode) or seen.st_uid != os.getuid() or seen.st_mode & 0o077:
        raise HpcboxError(
            f"{folder} is not a private folder of this user's",
            "remove it (hpcbox keeps only its locks and SSH sockets there) and run the command again",
        )
    return folder


@contextlib.contextmanager
def one_at_a_time(name: str, on_wait: Callable[[], None] = lambda: None) -> Iterator[None]:
    """Hold this user's machine-wide lock ``name`` (flock, freed when the process ends however it ends):
    two hpcbox commands started together on a bare engine make a shared image once, the second then
    finding it made. ``on_wait`` is called once when another holds it."""
    with open(private_folder() / f"{slug(name)}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def slug(name: str) -> str:
    """``name`` as part of a file name (a job's script, its default log): each run of characters other
    than letters, digits, dot, underscore and dash becomes one underscore; "job" where nothing is left."""
    return _NOT_IN_A_NAME.sub("_", name).strip("_") or "job"
