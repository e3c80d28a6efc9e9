"""The node image every mini-cluster container runs, tagged by the content hash of its inputs."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcbox.build import baseimage
from hpcbox.errors import HpcboxError
from hpcbox.tools import docker

REPOSITORY = "hpcbox/minicluster"
SUITE = "trixie"
# The node image's Dockerfile and scripts, beside this file.
CONTEXT = Path(__file__).resolve().parent / "node"


@dataclass(frozen=True)
class NodeImage:
    ref: str
    id: str
    built: bool


def content_hash(context: Path, base_id: str) -> str:
    """12 hex digits over every file of ``context`` (path, exec bit, bytes) and the base image id."""
    digest = hashlib.sha256(base_id.encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(b"\0" + path.relative_to(context).as_posix().encode())
        digest.update(b"x" if path.stat().st_mode & 0o111 else b"-")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def ensure_image(
    context: Path = CONTEXT, *, no_cache: bool = False, on_line: Callable[[str], None] | None = None
) -> NodeImage:
    """The node image for the current ``context``, built only when no image has its hash.

    ``no_cache`` builds every layer anew (benchmarks of a cold build), ignoring BuildKit's cache.
    """
    if not (context / "Dockerfile").is_file():
        raise HpcboxError(
            f"no Dockerfile in {context}", "this hpcbox lacks its node image files: reinstall it"
        )
    say = on_line or (lambda _line: None)
    base = baseimage.ensure_base(SUITE, say=say)
    ref = f"{REPOSITORY}:{content_hash(context, base.id)}"
    existing = docker.image(ref)
    if existing is not None:
        return NodeImage(ref, existing.id, built=False)
    say(f"hpcbox: building the mini cluster's node image {ref} (once per change of its files)")
    docker.build(
        docker.context_tar({p.relative_to(context).as_posix(): p for p in context.rglob("*") if p.is_file()}),
        dockerfile="Dockerfile",
        tag_ref=ref,
        build_args={"BASE": base.ref},
        labels={"org.opencontainers.image.title": "hpcbox mini cluster node"},
        secrets={},
        no_cache=no_cache,
        on_line=docker.BuildProgress(say),
    )
    built = docker.image(ref)
    if built is None:
        raise HpcboxError(f"the build of {ref} finished but the engine has no such image")
    return NodeImage(ref, built.id, built=True)
