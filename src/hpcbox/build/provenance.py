"""Where an artifact came from: the commit that last changed its inputs."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from hpcbox.errors import HpcboxError
from hpcbox.tools import proc


def inputs_revision(root: Path, paths: Sequence[str]) -> str:
    """The last commit that changed ``paths`` (files or folders, relative to the project at ``root``),
    `-dirty` when a file under them differs from HEAD or is untracked; `unknown` outside git.

    An artifact built from those paths alone then names the same commit whatever else later commits
    changed (a README, benchmark results), so its labels, and a SIF's bytes, stay the same; a clean
    checkout of that commit holds the very inputs it was built from, which `hpcbox verify` rebuilds.
    The project may sit in a subfolder of the repository: git reads the paths relative to the folder
    given with -C, and literally (a `*` in a name is no pattern).

    Untracked files count, git-ignored ones do not: the build context takes every file under the paths,
    so a new file there changes the image, and no commit holds it. Inputs no commit has touched yet are
    uncommitted changes of HEAD; with no commit at all, or an input outside the repository, no commit
    holds them (`unknown`).
    """
    if not paths:
        raise ValueError("inputs_revision needs a path: git reads none as the whole tree")
    # rev-list, not log: plumbing, which no log.* setting (log.follow) changes. It fails where there is
    # no commit at all (or no repository).
    last = _git(root, "rev-list", "--max-count=1", "HEAD", "--", *paths)
    status = _git(root, "status", "--porcelain", "--untracked-files=normal", "--", *paths)
    if last is None or status is None:
        return "unknown"
    if not last:
        head = _git(root, "rev-parse", "--verify", "--quiet", "HEAD")
        return f"{head}-dirty" if head else "unknown"
    return last + ("-dirty" if status else "")


def _git(root: Path, *args: str) -> str | None:
    """What git prints, or None where it fails (no git, not a repository, a path outside it)."""
    if shutil.which("git") is None:
        return None
    done = proc.run(
        ["git", "-C", str(root), "--literal-pathspecs", "--no-optional-locks", *args],
        what=f"run git {args[0]}",
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else None


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
