"""Where an artifact came from: the source revision of the project."""

from __future__ import annotations

import shutil
from pathlib import Path

from hpcbox.errors import HpcboxError
from hpcbox.tools import proc


def source_revision(root: Path) -> str:
    """The git commit of ``root`` with `-dirty` when the work tree differs from it; `unknown` outside git."""
    if shutil.which("git") is None:
        return "unknown"
    head = proc.run(["git", "-C", str(root), "rev-parse", "HEAD"], what="read the git revision", check=False)
    if head.returncode != 0:
        return "unknown"
    status = proc.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
        what="read the git status",
        check=False,
    )
    return head.stdout.strip() + ("-dirty" if status.stdout.strip() else "")


def checkout(root: Path, revision: str, into: Path) -> None:
    """A clean checkout of ``revision`` of the git repository at ``root``, in the new folder ``into``."""
    known = proc.run(
        ["git", "-C", str(root), "cat-file", "-e", f"{revision}^{{commit}}"],
        what="find the commit",
        check=False,
    )
    if known.returncode != 0:
        raise HpcboxError(
            f"commit {revision} is not in the repository at {root}",
            "fetch it (git fetch), then verify again",
        )
    proc.run(["git", "clone", "--quiet", "--no-checkout", str(root), str(into)], what="clone the repository")
    proc.run(
        ["git", "-C", str(into), "checkout", "--quiet", "--detach", revision], what=f"check out {revision}"
    )
