"""`Project`: this project's environment, resolved once: its `[tool.hpcbox]` table, its docker/ inputs and
its local state. The image, its SIF, the locks and their checks hang off it, as the jobs hang off a
`Site`; `hpcbox build`, `base`, `lock`, `sif` and `verify` are calls of it."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from hpcbox.api.site import Say, project_of, to_stderr

if TYPE_CHECKING:
    from hpcbox.build.baseimage import BaseImage
    from hpcbox.build.image import Image
    from hpcbox.project.config import ProjectConfig
    from hpcbox.sif.compression import SifCompression
    from hpcbox.sif.convert import Sif
    from hpcbox.sif.verify import Verdict


class Project:
    """The project in folder ``root`` (default: around the current directory); ``say``: where progress
    lines go (stderr by default)."""

    def __init__(self, root: ProjectConfig | str | Path | None = None, *, say: Say = to_stderr) -> None:
        self.config: ProjectConfig = project_of(root)
        self.say = say

    def __repr__(self) -> str:
        return f"Project({str(self.config.root)!r})"

    @property
    def root(self) -> Path:
        return self.config.root

    def build(
        self,
        flavour: str | None = None,
        *,
        offline: bool = False,
        base: str | None = None,
        no_cache: bool = False,
        strict_lock: bool = False,
    ) -> Image:
        """The environment's image of ``flavour`` (cuda, or cpu: the default ``offline``), tagged by
        content, built where its inputs changed and recorded as the one `sif` and `submit` take."""
        from hpcbox.build.image import build_image, record_image

        image = build_image(
            self.config, flavour=flavour, offline=offline, base=base, no_cache=no_cache,
            strict_lock=strict_lock, say=self.say,
        )  # fmt: skip
        record_image(self.config, image)
        return image

    def base(
        self,
        suite: str = "trixie",
        *,
        mirror: str | None = None,
        force: bool = False,
        strict_lock: bool = False,
    ) -> BaseImage:
        """The Debian base image, bootstrapped here as docker/lock/base.toml pins it (for hosts with no
        registry); ``suite`` where the project pins none."""
        from hpcbox.build import baseimage, offlock

        made = baseimage.ensure_base(
            suite,
            lock=baseimage.project_lock(self.root, self.config.docker_dir),
            mirror=mirror,
            force=force,
            strict=offlock.strict_lock(strict_lock),
            lock_name=baseimage.lock_file(self.config.docker_dir),
            say=self.say,
        )
        offlock.announce(made.moved, self.say)
        return made

    def lock(
        self, *, base: str | None = None, mirror: str | None = None, pip_only: bool = False
    ) -> list[Path]:
        """Refresh the locks (the Debian base, Debian's versions, the hashed pip locks, the registry
        base's digest, and in hpcbox's own checkout the SIF helper's and the mini cluster node image's);
        ``pip_only``: the pip locks alone. The files whose content changed."""
        from hpcbox.build.lock import (
            refresh_base_lock,
            refresh_locks,
            refresh_pip_locks,
            refresh_registry_base,
        )
        from hpcbox.minicluster.node_image import refresh_node_locks
        from hpcbox.sif.helper import HELPER_DIR, refresh_helper_lock

        if pip_only:
            return refresh_pip_locks(self.config, say=self.say)
        changed = []
        if base is None:
            base_lock, base = refresh_base_lock(self.config, mirror=mirror, say=self.say)
            changed += [base_lock] if base_lock else []
        changed += refresh_locks(self.config, base, say=self.say)
        changed += [path for path in [refresh_registry_base(self.config, say=self.say)] if path]
        # The SIF helper and the mini cluster's node image are hpcbox's own: their locks are refreshed in
        # hpcbox's checkout, not in a project's.
        if HELPER_DIR.is_relative_to(self.root):
            changed += refresh_helper_lock(say=self.say)
            changed += refresh_node_locks(say=self.say)
        return changed

    def record_digests(self) -> Path:
        """Build the committed cpu environment and write what it builds to (base id, content hash, root
        filesystem, SIF) in digests.toml, at the local profile's compression."""
        from hpcbox.render.profiles import load_profile
        from hpcbox.sif.verify import record_digests

        return record_digests(self.config, str(load_profile("local").apptainer.compression), say=self.say)

    def sif(
        self,
        *,
        flavour: str | None = None,
        image: str | None = None,
        compression: str | SifCompression | None = None,
        cluster: str | None = None,
        engine: str = "auto",
        path: str = "fast",
        force: bool = False,
        strict_lock: bool = False,
    ) -> Sif:
        """The SIF of the image `build` last made (of ``flavour``), or of local image ``image``, cached
        by content and compression: ``compression`` (ALGORITHM[:LEVEL]), else what ``cluster``'s
        profile says its Apptainer reads, else gzip:1, which every Singularity and Apptainer reads."""
        from hpcbox.sif.convert import build_sif

        squashfs = _compression(compression, cluster)  # a bad one refused before the image is looked at
        return build_sif(
            self._image(flavour, image)[0], engine_choice=engine, conversion=path, compression=squashfs,
            force=force, strict_lock=strict_lock, say=self.say,
        )  # fmt: skip

    def definition(
        self, folder: str | Path | None = None, *, flavour: str | None = None, image: str | None = None
    ) -> Path:
        """A definition file (and how to use it) for sites where SIFs are built on the cluster, in
        ``folder`` (default .hpcbox/definitions)."""
        from hpcbox.sif.convert import write_definition

        source, name = self._image(flavour, image)
        return write_definition(
            source, Path(folder) if folder else self.config.state_dir / "definitions", name
        )

    def verify(self, artifact: str, *, engine: str = "auto") -> Verdict:
        """Rebuild a SIF or a local image from the commit it records, in a clean checkout, and compare."""
        from hpcbox.sif.verify import verify

        return verify(artifact, self.config, engine_choice=engine, say=self.say)

    def _image(self, flavour: str | None, image: str | None):
        """The image to convert, and the name its definition takes."""
        from types import SimpleNamespace

        from hpcbox.build.image import last_image

        if image is not None:
            return SimpleNamespace(ref=image), self.config.name
        source = last_image(self.config, flavour)
        return source, f"{self.config.name}-{source.flavour}"


def _compression(compression: str | SifCompression | None, cluster: str | None) -> SifCompression:
    from hpcbox.render.profiles import load_profile
    from hpcbox.sif.compression import DEFAULT, parse_compression

    if isinstance(compression, str):
        return parse_compression(compression, "compression")
    if compression is not None:
        return compression
    return load_profile(cluster).apptainer.compression if cluster else DEFAULT
