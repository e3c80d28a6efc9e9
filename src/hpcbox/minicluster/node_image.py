"""The node image every mini-cluster container runs, one per Slurm version, tagged by the content hash
of its inputs (the Slurm version among them)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcbox.build import baseimage
from hpcbox.errors import HpcboxError
from hpcbox.files import one_at_a_time
from hpcbox.minicluster import versions
from hpcbox.tools import docker

REPOSITORY = "hpcbox/minicluster"
# The node image's Dockerfile and scripts, beside this file.
CONTEXT = Path(__file__).resolve().parent / "node"
SLURM_LABEL = "io.hpcbox.minicluster.slurm"


@dataclass(frozen=True)
class NodeImage:
    ref: str
    id: str
    built: bool


def content_hash(context: Path, base_id: str, build_args: Mapping[str, str] | None = None) -> str:
    """12 hex digits over every file of ``context`` (path, exec bit, bytes), the base image id and the
    build arguments (the Slurm version: each version's image has its own tag)."""
    digest = hashlib.sha256(base_id.encode())
    for key, value in sorted((build_args or {}).items()):
        digest.update(f"\0{key}={value}".encode())
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(b"\0" + path.relative_to(context).as_posix().encode())
        digest.update(b"x" if path.stat().st_mode & 0o111 else b"-")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def context_files(context: Path = CONTEXT) -> dict[str, Path]:
    """The node image's build context: each file by its path in it."""
    return {path.relative_to(context).as_posix(): path for path in context.rglob("*") if path.is_file()}


def build_args(slurm: str) -> dict[str, str]:
    """What the Dockerfile is told of the Slurm version: it, the Debian suite that carries it, the
    libraries that suite must supply as well, and whether a newer release of that suite's does (the last
    two only where they apply, so that the other versions' arguments, and so their tags' inputs, are what
    they were)."""
    args = {"SLURM_VERSION": slurm, "SLURM_SUITE": versions.SUITES[versions.check(slurm)]}
    if libraries := versions.SUITE_LIBRARIES.get(slurm):
        args["SLURM_SUITE_LIBRARIES"] = " ".join(libraries)
    if versions.moves_on(slurm):
        args["SLURM_OR_NEWER"] = "1"
    return args


def ensure_image(
    context: Path = CONTEXT,
    *,
    slurm: str = versions.DEFAULT,
    no_cache: bool = False,
    on_line: Callable[[str], None] | None = None,
) -> NodeImage:
    """The node image running Slurm ``slurm`` for the current ``context``, built only when no image has
    its hash. The versions share every layer but Slurm's own and those after it.

    ``no_cache`` builds every layer anew (benchmarks of a cold build), ignoring BuildKit's cache.
    """
    if not (context / "Dockerfile").is_file():
        raise HpcboxError(
            f"no Dockerfile in {context}", "this hpcbox lacks its node image files: reinstall it"
        )
    say = on_line or (lambda _line: None)
    base = baseimage.ensure_base(lock=baseimage.own_lock(), say=say)
    args = build_args(slurm)
    ref = f"{REPOSITORY}:{content_hash(context, base.id, args)}"
    if (existing := docker.image(ref)) is not None:
        return NodeImage(ref, existing.id, built=False)
    waiting = functools.partial(say, f"hpcbox: another hpcbox is building {ref}; waiting for it")
    with one_at_a_time(f"node image {ref}", on_wait=waiting):
        if (existing := docker.image(ref)) is not None:
            return NodeImage(ref, existing.id, built=False)
        return _build(context, ref, base, args, slurm, no_cache, say)


def _build(
    context: Path,
    ref: str,
    base: baseimage.BaseImage,
    args: dict[str, str],
    slurm: str,
    no_cache: bool,
    say: Callable[[str], None],
) -> NodeImage:
    say(f"hpcbox: building the mini cluster's node image {ref}, Slurm {slurm} (once per change of its files)")
    docker.build(
        docker.context_tar(context_files(context)),
        dockerfile="Dockerfile",
        tag_ref=ref,
        build_args={"BASE": base.ref, **args},
        labels={"org.opencontainers.image.title": "hpcbox mini cluster node", SLURM_LABEL: slurm},
        secrets={},
        no_cache=no_cache,
        on_line=docker.BuildProgress(say),
    )
    built = docker.image(ref)
    if built is None:
        raise HpcboxError(f"the build of {ref} finished but the engine has no such image")
    return NodeImage(ref, built.id, built=True)
