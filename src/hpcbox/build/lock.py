"""Refreshing the image's dependency locks: exact Debian versions and the hashed pip locks.

Debian pins are resolved inside the base image itself, so they name versions its mirror serves;
the pip locks are resolved for the image's Python and platform, not the host's, and name what has no
wheel there for pip to build from source, with its build tools pinned beside them (sourcebuild.py).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from hpcbox.build import baseimage, offlock, sourcebuild
from hpcbox.build.image import (
    DEFAULT_FLAVOUR,
    FLAVOURS,
    REGISTRY_BASE_LOCK,
    RegistryBase,
    host_ca_bundle,
    registry_base_lock,
)
from hpcbox.errors import HpcboxError
from hpcbox.files import write_atomically
from hpcbox.project import depsource
from hpcbox.project.config import ProjectConfig
from hpcbox.project.depsource import DebianStandIn, DependencySource
from hpcbox.tools import docker, proc

PIP_TARGET = ("--python-version", depsource.IMAGE_PYTHON, "--python-platform", "x86_64-manylinux_2_28")
# The locks a project's own dependency list gives, one per flavour, and what the cpu one builds on.
CUDA_LOCK = "cuda-requirements.txt"
CPU_LOCK = "cpu-requirements.txt"
CPU_APT_LOCK = "apt-cpu.txt"
# A stand-in's version on the stub wheel: a local version PyPI never has, so uv can only pick the stub.
_STAND_IN_LOCAL = "debian"
# uv's words for a name the index lacks.
_NOT_IN_INDEX = re.compile(r"Because (\S+) was not found in the package registry")
_CPU_LOCK_HEADER = """\
# The cpu flavour's pip packages: what pip adds to Debian's, installed with `pip install --no-deps
# --require-hashes` into a venv made with --system-site-packages. Written by `hpcbox lock` from
# {source}. Debian's packages ({apt_lock}) stand in for:
"""
# A requirements file's options that say where packages come from (pip's and uv's spelling alike).
_INDEX_OPTION = re.compile(r"^\s*(?:-i|-f|--index-url|--extra-index-url|--find-links|--no-index)(?:[\s=]|$)")
_PIN = re.compile(r"^([a-z0-9][a-z0-9+.-]*)(?:=[^=\s]+)?$")
# `apt-get install --simulate`: "Inst NAME [OLD] (NEW Origin:suite [arch])".
_SIMULATED_INSTALL = re.compile(r"^Inst (\S+) (?:\[[^\]]*\] )?\((\S+) ", re.MULTILINE)


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


def candidate_versions(
    base_ref: str, packages: tuple[str, ...], snapshot_mirror: str | None = None
) -> dict[str, str]:
    """The version apt would install for each package, asked of the base image's own mirror (or of
    the snapshot archive the base was locked from, so that the build can fall back to it)."""
    setup = ""
    if snapshot_mirror:
        sources = shlex.quote(f"s#[a-z]+://[^ ]+/debian( |$)#{snapshot_mirror}\\1#")
        setup = (
            f"sed -i -E {sources} /etc/apt/sources.list"
            " && apt-get -o Acquire::Check-Valid-Until=false update --error-on=any -qq >/dev/null"
        )
    serving = offlock.served(base_ref, packages, setup)
    missing = [name for name in packages if name not in serving]
    if missing:
        raise HpcboxError(
            f"Debian has no package {', '.join(missing)} for {base_ref}",
            "check the names in the apt lock files",
        )
    return {name: serving[name].candidate for name in packages}


def relock_apt(lock: AptLock, versions: dict[str, str]) -> str:
    lines = []
    for line in lock.path.read_text().splitlines():
        match = _PIN.match(line.strip()) if line.strip() and not line.startswith("#") else None
        lines.append(f"{match.group(1)}={versions[match.group(1)]}" if match else line)
    return "\n".join(lines) + "\n"


def refresh_base_lock(
    project: ProjectConfig, *, mirror: str | None = None, say: Callable[[str], None] = print
) -> tuple[Path | None, str]:
    """Pin the Debian base as Debian serves it today: the lock file if it changed, and the base image
    (made or found) in which to resolve the apt pins."""
    path = baseimage.lock_path(project.root, project.docker_dir)
    current = baseimage.project_lock(project.root, project.docker_dir)
    suite = current.suite if current else baseimage.DEFAULT_SUITE
    pinned, made = baseimage.relock(suite, mirror=mirror, say=say)
    relative = path.relative_to(project.root)
    if current is not None and (current.suite, dict(current.packages)) == (
        pinned.suite,
        dict(pinned.packages),
    ):
        # Same packages, only a newer time: keep the lock's time, and so every image built on it; a
        # snapshot time the lock lacked is recorded (it serves these same versions).
        docker.remove_image(made.ref)
        say(f"hpcbox: {relative}: Debian still serves the {len(current.packages)} pinned packages")
        written = None
        if current.snapshot is None and pinned.snapshot is not None:
            current = dataclasses.replace(current, snapshot=pinned.snapshot)
            write_atomically(path, current.to_toml())
            say(f"hpcbox: {relative}: recorded the snapshot time {current.snapshot}")
            written = path
        return written, baseimage.ensure_base(lock=current, say=say).ref
    write_atomically(path, pinned.to_toml())
    snapshot = f", from the snapshot archive at {pinned.snapshot}" if pinned.snapshot else ""
    say(f"hpcbox: {relative}: Debian {pinned.suite} base, {len(pinned.packages)} packages pinned{snapshot}")
    return path, made.ref


def refresh_locks(project: ProjectConfig, base_ref: str, *, say: Callable[[str], None] = print) -> list[Path]:
    """Rewrite every lock under docker/lock; returns the files whose content changed."""
    lock_dir = project.root / project.docker_dir / "lock"
    changed = []
    apt_locks = [read_apt_lock(path) for path in sorted(lock_dir.glob("apt-*.txt"))]
    base_lock = baseimage.project_lock(project.root, project.docker_dir)
    snapshot = (
        baseimage.snapshot_mirror(base_lock.snapshot)
        if base_lock and base_lock.snapshot and base_ref == baseimage.base_ref(lock=base_lock)
        else None
    )
    versions = candidate_versions(
        base_ref, tuple(sorted({name for lock in apt_locks for name in lock.packages})), snapshot
    )
    for lock in apt_locks:
        updated = relock_apt(lock, versions)
        if updated != lock.path.read_text():
            write_atomically(lock.path, updated)
            changed.append(lock.path)
        say(f"hpcbox: {lock.path.relative_to(project.root)}: {len(lock.packages)} Debian packages pinned")
    return changed + refresh_pip_locks(project, say=say)


def refresh_pip_locks(project: ProjectConfig, *, say: Callable[[str], None] = print) -> list[Path]:
    """Rewrite the pip locks; returns the files whose content changed.

    With `tool.hpcbox.dependencies` set, the project's own list gives both flavours' locks; without
    it, each docker/requirements/<stem>.in gives docker/lock/<stem>-requirements.txt."""
    if not project.dependencies:
        return _lock_requirement_ins(project, say)
    source = depsource.from_setting(project.root, project.dependencies, project.extras)
    say(f"hpcbox: dependencies from {source.describe()}")
    text = depsource.requirements_text(source)
    lock_dir = project.root / project.docker_dir / "lock"
    cuda, cpu = lock_dir / CUDA_LOCK, lock_dir / CPU_LOCK
    written = (cuda, cpu, sourcebuild.constraints_for(cuda), sourcebuild.constraints_for(cpu))
    before = {path: _text(path) for path in written}
    _compile(source, text, cuda)
    section = _source_builds(cuda, ["-"], source.path.parent, text, (), say)
    cuda.write_text(section + cuda.read_text())
    say(f"hpcbox: {cuda.relative_to(project.root)}: hashed for {' '.join(PIP_TARGET[1::2])}")
    stand_ins = _lock_cpu(source, text, cpu, lock_dir / CPU_APT_LOCK, say)
    say(f"hpcbox: {cpu.relative_to(project.root)}: hashed, around {len(stand_ins)} Debian Python packages")
    return [path for path in written if _text(path) != before[path]]


def _lock_cpu(
    source: DependencySource, text: str, target: Path, apt_lock: Path, say: Callable[[str], None]
) -> list[DebianStandIn]:
    """The cpu lock: the same requirements resolved around Debian's Python packages, which stay out of
    it; returns those packages.

    Each Debian package enters the resolution as a stub wheel at Debian's version with no
    dependencies (apt installs those), so what depends on it is resolved against Debian's version and
    nothing of its own tree is added (PyPI's torch would bring the CUDA wheels). A stand-in is a
    constraint, or an override where the project asks for another version: the cpu flavour keeps
    Debian's, and says so."""
    if not apt_lock.is_file():
        raise HpcboxError(f"{apt_lock.name} is missing next to {target.name}", "restore it, then lock again")
    stand_ins = depsource.debian_stand_ins(apt_lock)
    overridden = depsource.debian_conflicts(depsource.direct_requirements(source), stand_ins)
    for stand_in, wanted in overridden.items():
        say(f"hpcbox: cpu flavour: Debian's {stand_in.name} {stand_in.version} stands in for {wanted}")
    with tempfile.TemporaryDirectory(prefix="hpcbox-debian-") as scratch:
        options = _stand_in_options(stand_ins, set(overridden), Path(scratch))
        hint = f"the cpu flavour keeps Debian's versions ({apt_lock.name})"
        _compile(source, text, target, options, hint=hint)
        section = _source_builds(target, ["-"], source.path.parent, text, options, say)
    header = _CPU_LOCK_HEADER.format(source=source.path.name, apt_lock=apt_lock.name)
    for s in stand_ins:
        instead = f" (in place of {overridden[s]})" if s in overridden else ""
        header += f"#   {s.name} {s.version}: {s.package}={s.debian_version}{instead}\n"
    target.write_text(header + section + target.read_text())
    return stand_ins


def _stand_in_options(
    stand_ins: list[DebianStandIn], overridden: set[DebianStandIn], folder: Path
) -> list[str]:
    """uv's options that put Debian's packages (stub wheels in `folder`) in place, and out of the lock."""
    pins = {stand_in: f"{stand_in.name}=={_stub_wheel(stand_in, folder)}\n" for stand_in in stand_ins}
    (folder / "constraints.txt").write_text("".join(pins[s] for s in stand_ins if s not in overridden))
    (folder / "overrides.txt").write_text("".join(pins[s] for s in stand_ins if s in overridden))
    options = ["--find-links", str(folder), "--constraint", str(folder / "constraints.txt")]
    options += ["--override", str(folder / "overrides.txt")]
    return options + [option for s in stand_ins for option in ("--no-emit-package", s.name)]


def _stub_wheel(stand_in: DebianStandIn, folder: Path) -> str:
    """A wheel with nothing but metadata for a Debian package, in `folder`; its version."""
    version = f"{stand_in.version}+{_STAND_IN_LOCAL}"
    name = canonicalize_name(stand_in.name).replace("-", "_")
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(
            f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {stand_in.name}\nVersion: {version}\n"
        )
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return version


def _compile(
    source: DependencySource, text: str, target: Path, options: Sequence[str] = (), hint: str = ""
) -> None:
    """uv's hashed lock of `text` (includes resolve from the source's folder) into `target`."""
    argv = [_uv(), "pip", "compile", "--quiet", "--generate-hashes", *PIP_TARGET]
    argv += ["--custom-compile-command", "hpcbox lock", *options, "-", "-o", str(target)]
    try:
        proc.run(
            argv,
            what=f"lock {source.path.name} into {target.name}",
            cwd=source.path.parent,
            input_bytes=text.encode(),
            env=_uv_env(),
            hint=hint or f"check the requirement names and versions in {source.path.name}",
        )
    except HpcboxError as error:
        missing = _NOT_IN_INDEX.search(error.details)
        if missing is None:
            raise
        raise depsource.not_found(source, missing.group(1), error.details) from error


def _lock_requirement_ins(project: ProjectConfig, say: Callable[[str], None]) -> list[Path]:
    """docker/requirements/<stem>.in → docker/lock/<stem>-requirements.txt; the locks that changed."""
    lock_dir = project.root / project.docker_dir / "lock"
    requirements = project.root / project.docker_dir / "requirements"
    sources = sorted(requirements.glob("*.in"))
    found = None if sources else depsource.detect(project.root)
    if found is not None:
        relative = found.path.relative_to(project.root).as_posix()
        say(f'hpcbox: to lock {found.describe()}, set dependencies = "{relative}" under [tool.hpcbox]')
    changed = []
    for source in sources:
        target = lock_dir / f"{source.stem}-requirements.txt"
        constraints = sourcebuild.constraints_for(target)
        before = {path: _text(path) for path in (target, constraints)}
        uv, inputs = _uv(), source.relative_to(project.root).as_posix()
        relative_out = target.relative_to(project.root).as_posix()
        proc.run(
            [uv, "pip", "compile", "--quiet", "--generate-hashes", *PIP_TARGET, inputs, "-o", relative_out],
            what=f"lock {source.name}",
            cwd=project.root,
            env=_uv_env(),
            hint="check the requirement names and versions in " + source.name,
        )
        section = _source_builds(target, [inputs], project.root, source.read_text(), (), say)
        target.write_text(section + target.read_text())
        changed += [path for path in (target, constraints) if _text(path) != before[path]]
        say(f"hpcbox: {relative_out}: hashed for {' '.join(PIP_TARGET[1::2])}")
    return changed


def _source_builds(
    lock: Path,
    inputs: Sequence[str],
    cwd: Path,
    text: str,
    options: Sequence[str],
    say: Callable[[str], None],
) -> str:
    """The lines `lock` needs for its packages with no wheel for the image (none where it has none),
    their build tools pinned beside it (or that file removed where none are left).

    `inputs` (a file, or "-" for `text` on stdin), `cwd` and `options` are what uv compiled the lock
    from: resolved again with the lock's own pins as constraints, as a pylock.toml, they name the wheels
    each package has for the image. The build tools come from where `text` says packages come from
    (its index options), as wheels."""
    input_bytes = text.encode() if "-" in inputs else None
    constraints = sourcebuild.constraints_for(lock)
    with tempfile.TemporaryDirectory(prefix="hpcbox-pylock-") as scratch:
        pylock = Path(scratch) / "pylock.toml"
        argv = [_uv(), "pip", "compile", "--quiet", "--python-version", depsource.IMAGE_PYTHON]
        argv += [
            "--python-platform",
            sourcebuild.WHEEL_PLATFORM,
            *options,
            "--constraint",
            str(lock.resolve()),
        ]
        argv += [*inputs, "--format", "pylock.toml", "-o", str(pylock)]
        proc.run(
            argv,
            what=f"list the wheels {lock.name} installs",
            cwd=cwd,
            input_bytes=input_bytes,
            env=_uv_env(),
        )
        packages = sourcebuild.from_pylock(pylock.read_text())
    if not packages:
        constraints.unlink(missing_ok=True)
        return ""
    cafile = host_ca_bundle()
    requirements = {package: sourcebuild.build_requirements(package, cafile) for package in packages}
    names = ", ".join(package.describe() for package in packages)
    argv = [_uv(), "pip", "compile", "--quiet", "--no-header", "--no-annotate", *PIP_TARGET]
    argv += ["--only-binary", ":all:", "--constraint", str(lock.resolve()), "-", "-o", str(constraints)]
    wanted = sorted({requirement for needs in requirements.values() for requirement in needs})
    pins = ""
    if wanted:  # an sdist may build with nothing from the index (a backend of its own)
        proc.run(
            argv,
            what=f"pin the build tools of {names}",
            input_bytes="".join(f"{line}\n" for line in [*_index_options(text), *wanted]).encode(),
            env=_uv_env(),
            hint=f"their build tools ({', '.join(wanted)}) must have wheels for the image and agree with "
            f"{lock.name}; or pin versions of {names} that have wheels",
        )
        pins = constraints.read_text()
    constraints.write_text(sourcebuild.constraints_header(requirements, lock) + pins)
    say(f"hpcbox: {lock.name}: built from source, having no wheel for the image: {names}")
    say(f"hpcbox: {constraints.name}: their build tools pinned")
    return sourcebuild.lock_section(packages, constraints)


def _index_options(text: str) -> list[str]:
    """The lines of a requirements text that say where packages come from."""
    return [line.strip() for line in text.splitlines() if _INDEX_OPTION.match(line)]


def _text(path: Path) -> str:
    return path.read_text() if path.is_file() else ""


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
    write_atomically(path, pinned.to_toml())
    return path


def simulated_installs(apt_output: str) -> dict[str, str]:
    """Package → version from `apt-get install --simulate` output: what apt would install."""
    return dict(_SIMULATED_INSTALL.findall(apt_output))


def _uv_env() -> dict[str, str]:
    """uv resolves for PIP_TARGET's Python, which it need not have: without this it would try to
    download one first (seconds of retries where GitHub is out of reach)."""
    return {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}


def _uv() -> str:
    try:
        from uv import find_uv_bin
    except ImportError:
        return proc.require("uv", "install it: `pip install uv` (hpcbox depends on it)")
    return find_uv_bin()
