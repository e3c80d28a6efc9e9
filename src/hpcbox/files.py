"""Small file helpers shared by every stage (below them all in the import order)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

_BLOCK = 4 << 20


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


def write_atomically(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` whole or not at all: a reader never sees half a file."""
    partial = target.with_name(f".{target.name}.partial")
    partial.write_bytes(data)
    os.replace(partial, target)
