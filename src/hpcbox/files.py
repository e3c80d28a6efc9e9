"""Small file helpers shared by every stage (below them all in the import order)."""

from __future__ import annotations

import hashlib
from pathlib import Path

_BLOCK = 4 << 20


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in blocks (SIFs and root filesystems are hundreds of MB)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()
