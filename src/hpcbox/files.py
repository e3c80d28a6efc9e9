"""Small file helpers shared by every stage (below them all in the import order)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

_BLOCK = 4 << 20
_NOT_IN_A_NAME = re.compile(r"[^A-Za-z0-9._-]+")


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


def slug(name: str) -> str:
    """``name`` as part of a file name (a job's script, its default log): each run of characters other
    than letters, digits, dot, underscore and dash becomes one underscore; "job" where nothing is left."""
    return _NOT_IN_A_NAME.sub("_", name).strip("_") or "job"
