"""Refreshing the image's dependency locks: exact Debian versions and the hashed pip lock.

Debian pins are resolved inside the base image itself, so they name versions its mirror serves;
the pip lock is resolved for the image's Python and platform, not the host's.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcbox import baseimage
from hpcbox.config import ProjectConfig
from hpcbox.errors import HpcboxError
from hpcbox.image import DEFAULT_FLAVOUR, FLAVOURS, REGISTRY_BASE_LOCK, RegistryBase, registry_base_lock
from hpcbox.tools import apptainer, docker, proc

PIP_TARGET = ("--python-version", "3.13", "--python-platform", "x86_64-manylinux_2_28")
_PIN = re.compile(r"^([a-z0-9][a-z0-9+.-]*)(?:=[^=\s]+)?$")
# `apt-get install --simulate`: "Inst NAME [OLD] (NEW Origin:suite [arch])".
_SIMULATED_INSTALL = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) ", re.MULTILINE)
_HELPER_LOCK_HEADER = """\
# What the SIF helper (helper.Dockerfile) adds to the pinned Debian base, every package at its exact
# version: a SIF's bytes depend on the mksquashfs and Apptainer that write it. Written by `hpcbox lock`
# from: {wanted}
"""


@dataclass(frozen=True)
class AptLock:
    path: Path
    packages: tuple[str, ...]


def read_apt_lock(path: Path) -> AptLock:
    names = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _PIN.match(line.strip())
        if match is None:
            raise HpcboxError(
                f"{path.name}:{number}: {line!r} is not `package` or `package=version`",
                "one Debian package per line, optionally pinned with =version",
            )
        names.append(match.group(1))
    return AptLock(path, tuple(names))


def candidate_versions(base_ref: str, packages: tuple[str, ...]) -> dict[str, str]:
    """The version apt would install for each package, asked of the base image's own mirror."""
    script = "apt-get update -qq >/dev/null && apt-cache policy " + shlex.join(packages)
    output = docker.run_once(base_ref, ["sh", "-c", script], what="ask apt for candidate versions")
    versions: dict[str, str] = {}
    current = ""
    for line in output.splitlines():
        if not line.startswith(" ") and line.endswith(":"):
            current = line[:-1]
        elif line.strip().startswith("Candidate:") and current:
            versions[current] = line.split(":", 1)[1].strip()
    missing = [name for name in packages if versions.get(name, "(none)") == "(none)"]
    if missing:
        raise HpcboxError(
            f"Debian has no package {', '.join(missing)} for {base_ref}",
            "check the names in the apt lock files",
        )
    return versions


def relock_apt(lock: AptLock, versions: dict[str, str]) -> str:
    lines = []
    for line in lock.path.read_text().splitlines():
        match = _PIN.match(line.strip()) if line.strip() and not line.startswith("#") else None
        lines.append(f"{match.group(1)}={versions[match.group(1)]}" if match else line)
    return "\n".join(lines) + "\n"


def refresh_base_lock(
    project: ProjectConfig, *, mirror: str | None = None, say: Callable[[str], None] = print
) -> tuple[Path | None, str]:
    """Pin the Debian base as the mirror serves it today: the lock file if it changed, and the base
    image (made or found) in which to resolve the apt pins."""
    path = baseimage.lock_path(project.root, project.docker_dir)
    current = baseimage.project_lock(project.root, project.docker_dir)
    pinned, made = baseimage.relock(current.suite if current else baseimage.DEFAULT_SUITE, mirror=mirror)
    relative = path.relative_to(project.root)
    if current is not None and (current.suite, dict(current.packages)) == (
        pinned.suite,
        dict(pinned.packages),
    ):
        # Same packages, only a newer time: keep the lock, and so every image built on it.
        docker.remove_image(made.ref)
        say(f"hpcbox: {relative}: the mirror still serves the {len(current.packages)} pinned packages")
        return None, baseimage.ensure_base(lock=current).ref
    path.write_text(pinned.to_toml())
    say(f"hpcbox: {relative}: Debian {pinned.suite} base, {len(pinned.packages)} packages pinned")
    return path, made.ref


def refresh_locks(project: ProjectConfig, base_ref: str, *, say: Callable[[str], None] = print) -> list[Path]:
    """Rewrite every lock under docker/lock; returns the files whose content changed."""
    lock_dir = project.root / project.docker_dir / "lock"
    changed = []
    apt_locks = [read_apt_lock(path) for path in sorted(lock_dir.glob("apt-*.txt"))]
    versions = candidate_versions(
        base_ref, tuple(sorted({name for lock in apt_locks for name in lock.packages}))
    )
    for lock in apt_locks:
        updated = relock_apt(lock, versions)
        if updated != lock.path.read_text():
            lock.path.write_text(updated)
            changed.append(lock.path)
        say(f"hpcbox: {lock.path.relative_to(project.root)}: {len(lock.packages)} Debian packages pinned")
    requirements = project.root / project.docker_dir / "requirements"
    for source in sorted(requirements.glob("*.in")):
        target = lock_dir / f"{source.stem}-requirements.txt"
        before = target.read_text() if target.exists() else ""
        uv = _uv()
        relative_out = target.relative_to(project.root).as_posix()
        proc.run(
            [
                uv,
                "pip",
                "compile",
                "--quiet",
                "--generate-hashes",
                *PIP_TARGET,
                source.relative_to(project.root).as_posix(),
                "-o",
                relative_out,
            ],
            what=f"lock {source.name}",
            cwd=project.root,
            hint="check the requirement names and versions in " + source.name,
        )
        if target.read_text() != before:
            changed.append(target)
        say(f"hpcbox: {relative_out}: hashed for {' '.join(PIP_TARGET[1::2])}")
    return changed


def refresh_registry_base(project: ProjectConfig, *, say: Callable[[str], None] = print) -> Path | None:
    """Pin the registry base to the digest its tag points to today; the lock file if it changed.

    Where no registry answers, the lock stays as it is (builds then bootstrap the Debian base)."""
    current = registry_base_lock(project)
    tag = current.tag if current else FLAVOURS[DEFAULT_FLAVOUR].registry_base
    path = project.root / project.docker_dir / REGISTRY_BASE_LOCK
    relative = path.relative_to(project.root)
    if not docker.pull(tag):
        say(f"hpcbox: no registry reachable to pull {tag}: {relative} left as it is")
        return None
    info = docker.image(tag)
    repository = RegistryBase(tag, "").repository
    digests = [found for found in (info.digests if info else ()) if found.rpartition("@")[0] == repository]
    if not digests:
        raise HpcboxError(
            f"the registry gave no digest for {tag}", "pull it by hand to see why, then lock again"
        )
    pinned = RegistryBase(tag, digests[0].rpartition("@")[2])
    say(f"hpcbox: {relative}: {tag} pinned at {pinned.digest[:19]}")
    if current == pinned:
        return None
    path.write_text(pinned.to_toml())
    return path


def simulated_installs(apt_output: str) -> dict[str, str]:
    """Package → version from `apt-get install --simulate` output: what apt would install."""
    return dict(_SIMULATED_INSTALL.findall(apt_output))


def refresh_helper_lock(*, say: Callable[[str], None] = print) -> Path | None:
    """Pin what the Apptainer helper installs as the mirror (trixie, and sid for Apptainer) serves it
    today, resolved on the helper's own pinned base; the lock file if it changed."""
    base = baseimage.ensure_base(lock=apptainer.helper_base_lock()).ref
    script = (
        apptainer.HELPER_SID_SCRIPT.read_text()
        + "\napt-get install --simulate --no-install-recommends -y "
        + shlex.join(apptainer.HELPER_PACKAGES)
    )
    output = docker.run_once(base, ["sh", "-c", script], what="resolve the Apptainer helper's packages")
    pins = simulated_installs(output)
    if not pins:
        raise HpcboxError("apt resolved no packages for the Apptainer helper", "see apt's output above")
    text = _HELPER_LOCK_HEADER.format(wanted=" ".join(apptainer.HELPER_PACKAGES))
    text += "".join(f"{name}={version}\n" for name, version in sorted(pins.items()))
    path = apptainer.HELPER_LOCK
    say(f"hpcbox: {path.parent.parent.name}/{path.parent.name}/{path.name}: {len(pins)} packages pinned")
    if path.is_file() and path.read_text() == text:
        return None
    path.write_text(text)
    return path


def _uv() -> str:
    try:
        from uv import find_uv_bin
    except ImportError:
        return proc.require("uv", "install it: `pip install uv` (it is in hpcbox's dev extras)")
    return find_uv_bin()
