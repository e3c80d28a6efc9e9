"""The packages a pip lock builds from source: those PyPI has no wheel of for the image, the build tools
pinned for them, and what a failed build of one in the image means.

The Dockerfile's builder stages install wheels only (`pip install --only-binary=:all:`). A lock names
each package it builds from source on a line of its own, `--no-binary NAME`: a requirements-file option,
which pip applies on top of the command line's, so exactly those build and nothing else does. pip
builds each in an isolated environment filled from the index; the build tools there are pinned by a
constraints file beside the lock (`cpu-requirements.txt` → `cpu-build-constraints.txt`), which the
builder stage hands to pip as PIP_CONSTRAINT (pip's isolated build environments honour it). The pins
carry no hashes: a hash there puts each build environment in hash-checking mode, where pip refuses the
build's own unpinned requirement (`setuptools>=40.8.0`). A lock with no such package has no
constraints file, and its image is built as it always was.
"""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from hpcbox.errors import HpcboxError
from hpcbox.project.depsource import DEBIAN_RENAMES, IMAGE_PYTHON
from hpcbox.tools import proc

# pip in the image takes a manylinux wheel up to the image's own glibc (trixie's 2.41; 2_40 is the newest
# uv names), so a wheel for a newer glibc than the lock's resolution target is still a wheel there.
WHEEL_PLATFORM = "x86_64-manylinux_2_40"
# What pip builds an sdist with when it names no [build-system] (a setup.py alone), and wheel, which
# setuptools before 70.1 asks for while building.
SETUPTOOLS_DEFAULT = ("setuptools>=40.8.0", "wheel")
_LOCK_SUFFIX = "-requirements.txt"
_CONSTRAINTS_SUFFIX = "-build-constraints.txt"
_NO_BINARY = re.compile(r"^--no-binary[ =](\S+)[ \t]*$", re.MULTILINE)
_PINNED = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", re.MULTILINE)
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_FETCH_SECONDS = 60
_IMAGE = f"Python {IMAGE_PYTHON} on x86_64 Linux"
_WITH_A_WHEEL = "that has a wheel for " + _IMAGE
# pip's words, in the image's build log, for a package whose build from source failed.
_FAILED_BUILD = re.compile(r"(?:Failed building wheel for|Failed to build) ([A-Za-z0-9][A-Za-z0-9._-]*)")
_COLLECTING = re.compile(r"\bCollecting ([A-Za-z0-9][A-Za-z0-9._-]*)")
_BUILD_ERROR = re.compile(r"error: (?:subprocess-exited-with-error|metadata-generation-failed)")
# ... and what the build lacked.
_COMPILERS = r"[\w.-]*\b(?:gcc|g\+\+|cc|c\+\+|clang|clang\+\+)(?:-[\d.]+)?"
_NO_C_COMPILER = re.compile(
    rf"command '{_COMPILERS}' failed|No such file or directory: '{_COMPILERS}'|"
    rf"\b{_COMPILERS}: (?:command )?not found|Unknown compiler|No CMAKE_C(?:XX)?_COMPILER could be found"
)
_NO_RUST = re.compile(r"can't find Rust compiler|\bcargo\b.*not found", re.IGNORECASE)
_NO_HEADER = re.compile(r"fatal error: ([\w./+-]+\.h(?:pp)?): No such file or directory")
_NO_PROGRAM = re.compile(
    r"command '([\w./+-]+)' failed: No such file or directory|"
    r"\[Errno 2\] No such file or directory: '([\w+-]+)'"
)


@dataclass(frozen=True)
class SourceOnly:
    """A locked package with no wheel for the image: its sdist, by URL and sha256."""

    name: str
    version: str
    url: str
    sha256: str

    def describe(self) -> str:
        return f"{self.name} {self.version}"


def constraints_for(lock: Path) -> Path:
    """The build-tool constraints beside a pip lock: cuda-requirements.txt → cuda-build-constraints.txt."""
    return lock.with_name(lock.name.removesuffix(_LOCK_SUFFIX).removesuffix(".txt") + _CONSTRAINTS_SUFFIX)


def from_pylock(text: str) -> list[SourceOnly]:
    """The packages of a pylock.toml (uv's, for the image's Python and platform) with no wheel for it.

    uv lists a package's wheels for the target alone, so one with wheels for other platforms only has
    none listed. A package from a VCS or a direct URL has no sdist entry and is not counted."""
    packages = []
    for package in tomllib.loads(text).get("packages", []):
        sdist = package.get("sdist")
        if package.get("wheels") or not sdist:
            continue
        if "url" in sdist:  # not a local file: hpcbox refuses those before uv sees them
            hashes = sdist.get("hashes", {})
            packages.append(
                SourceOnly(package["name"], package["version"], sdist["url"], hashes.get("sha256", ""))
            )
    return packages


def build_requirements(package: SourceOnly, cafile: Path | None = None) -> list[str]:
    """What the package's sdist builds with: its pyproject.toml's [build-system] requires, or pip's
    default (setuptools) where it names none; wheel too wherever setuptools builds it."""
    pyproject = _pyproject(_fetch(package, cafile), package)
    try:
        build_system = tomllib.loads(pyproject).get("build-system") if pyproject is not None else None
    except tomllib.TOMLDecodeError as exc:
        raise HpcboxError(
            f"{package.describe()}: its sdist's pyproject.toml is not valid TOML ({exc})",
            f"pin a version of {package.name} {_WITH_A_WHEEL}",
        ) from exc
    if build_system is None:
        return list(SETUPTOOLS_DEFAULT)
    requires = build_system.get("requires")
    if not isinstance(requires, list) or not all(isinstance(item, str) for item in requires):
        raise HpcboxError(
            f"{package.describe()}: its sdist's [build-system] has no `requires` list: pip cannot build it",
            f"pin a version of {package.name} {_WITH_A_WHEEL}",
        )
    names = {_name(requirement) for requirement in requires}
    return requires + (["wheel"] if "setuptools" in names and "wheel" not in names else [])


def lock_section(packages: Sequence[SourceOnly], constraints: Path) -> str:
    """The lines a lock carries for its packages built from source: a comment, and pip's option for each."""
    lines = [
        f"# Built from source in the image, as PyPI has no wheel of theirs for {_IMAGE},",
        f"# with the build tools pinned in {constraints.name}; every other package installs from its wheel:",
        *(f"#   {package.describe()}" for package in packages),
        *(f"--no-binary {package.name}" for package in packages),
    ]
    return "\n".join(lines) + "\n"


def constraints_header(requirements: Mapping[SourceOnly, Sequence[str]], lock: Path) -> str:
    """The comment heading a build-constraints file: what it is for, and each package's build tools."""
    lines = [
        f"# The build tools of the packages {lock.name} builds from source, at exact versions: the",
        "# Dockerfile's builder stage hands this file to pip as PIP_CONSTRAINT, which pip's isolated build",
        "# environments honour (no hashes: they would make pip refuse each build's unpinned requirements).",
        "# Written by `hpcbox lock` from each sdist's [build-system] requires (setuptools>=40.8.0 and wheel",
        "# for a setup.py alone), resolved as wheels for the image:",
        *(
            f"#   {package.describe()}: {', '.join(needs) or 'nothing (its own backend)'}"
            for package, needs in requirements.items()
        ),
    ]
    return "\n".join(lines) + "\n"


def built_from_source(lock_text: str) -> list[str]:
    """The packages a pip lock builds from source (its `--no-binary NAME` lines)."""
    return [name for names in _NO_BINARY.findall(lock_text) for name in names.split(",")]


def unpinned_build_tools(lock: Path, dockerfile_text: str) -> str | None:
    """A warning where the lock builds packages from source and the Dockerfile does not hand their build
    tools' pins to pip (one written before hpcbox built from source); None where all is well."""
    names = built_from_source(lock.read_text()) if lock.is_file() else []
    constraints = constraints_for(lock)
    if not names or constraints.name in dockerfile_text:
        return None
    return (
        f"hpcbox: warning: the Dockerfile does not use {constraints.name}, so pip builds "
        f"{', '.join(names)} with the newest build tools PyPI has today: take the builder stages "
        "(venv-cpu, venv-cuda) of hpcbox's own Dockerfile"
    )


def build_failure(step_lines: Sequence[str], lock: Path) -> HpcboxError | None:
    """The error for an image build whose failing step (its output lines) is pip building one of the
    lock's source-only packages; None where the failure is another."""
    lock_text = lock.read_text() if lock.is_file() else ""
    source_only = {canonicalize_name(name): name for name in built_from_source(lock_text)}
    if not source_only:
        return None
    failed = _failed_package(step_lines, source_only)
    if failed is None:
        return None
    versions = {canonicalize_name(name): version for name, version in _PINNED.findall(lock_text)}
    pinned = " ".join(filter(None, (failed, versions.get(canonicalize_name(failed)))))
    return HpcboxError(
        f"{pinned} has no wheel for {_IMAGE}, and its build from source in the image "
        f"failed: {_lacking(step_lines)}",
        f"pin a version of {failed} that has a wheel (pypi.org/project/{failed}/#files), or, for the cpu "
        f"flavour, let Debian's {_debian_name(failed)} stand in: add it to docker/lock/apt-cpu.txt and run "
        "`hpcbox lock`",
        details="\n".join(step_lines[-proc.TAIL_LINES :]),
    )


def _failed_package(step_lines: Sequence[str], source_only: Mapping[str, str]) -> str | None:
    for line in step_lines:
        named = _FAILED_BUILD.search(line)
        if named and canonicalize_name(named.group(1)) in source_only:
            return source_only[canonicalize_name(named.group(1))]
    # A build that fails before its wheel (its metadata, its build requirements) names the package only
    # where pip began collecting it.
    collecting = None
    for line in step_lines:
        started = _COLLECTING.search(line)
        if started:
            collecting = canonicalize_name(started.group(1))
        elif _BUILD_ERROR.search(line):
            return source_only.get(collecting or "")
    return None


def _lacking(step_lines: Sequence[str]) -> str:
    output = "\n".join(step_lines)
    header = _NO_HEADER.search(output)
    if header:
        return f"it needs the C header {header.group(1)}, which the image lacks"
    if _NO_C_COMPILER.search(output):
        return "it needs a C compiler, which the image lacks"
    if _NO_RUST.search(output):
        return "it needs a Rust compiler, which the image lacks"
    program = _NO_PROGRAM.search(output)
    if program:
        return f"it needs {program.group(1) or program.group(2)}, which the image lacks"
    return "see its last lines below"


def _debian_name(name: str) -> str:
    debian = {canonicalize_name(pypi): package for package, pypi in DEBIAN_RENAMES.items()}
    return debian.get(canonicalize_name(name), f"python3-{canonicalize_name(name)}")


def _fetch(package: SourceOnly, cafile: Path | None) -> bytes:
    """The package's sdist, checked against the lock's sha256."""
    import ssl  # here, not at the top: every submit imports this module, and only a lock fetches
    import urllib.request

    context = ssl.create_default_context(cafile=str(cafile) if cafile else None)
    try:
        with urllib.request.urlopen(package.url, timeout=_FETCH_SECONDS, context=context) as answer:
            data = answer.read()
    except (OSError, ValueError) as exc:
        raise HpcboxError(
            f"cannot fetch the sdist of {package.describe()} to read its build requirements: {exc}",
            "check the connection to the package index, then lock again",
        ) from exc
    if package.sha256 and hashlib.sha256(data).hexdigest() != package.sha256:
        raise HpcboxError(
            f"the sdist of {package.describe()} does not match the sha256 the index gave for it",
            "lock again; if it persists, the index or a proxy serves altered files",
        )
    return data


def _pyproject(sdist: bytes, package: SourceOnly) -> str | None:
    """The text of the sdist's top-level pyproject.toml (`NAME-VERSION/pyproject.toml`), or None."""
    import zipfile

    try:
        if zipfile.is_zipfile(io.BytesIO(sdist)):
            with zipfile.ZipFile(io.BytesIO(sdist)) as archive:
                found = [name for name in archive.namelist() if _top_level_pyproject(name)]
                return archive.read(found[0]).decode() if found else None
        with tarfile.open(fileobj=io.BytesIO(sdist)) as archive:
            member = next(
                (m for m in archive.getmembers() if _top_level_pyproject(m.name) and m.isfile()), None
            )
            extracted = archive.extractfile(member) if member is not None else None
            return extracted.read().decode() if extracted is not None else None
    except (tarfile.TarError, zipfile.BadZipFile, UnicodeDecodeError) as exc:
        raise HpcboxError(
            f"the sdist of {package.describe()} is not a readable archive ({exc})",
            f"pin a version of {package.name} {_WITH_A_WHEEL}",
        ) from exc


def _top_level_pyproject(name: str) -> bool:
    parts = name.strip("/").split("/")
    return len(parts) == 2 and parts[1] == "pyproject.toml"


def _name(requirement: str) -> str:
    match = _NAME.match(requirement)
    return canonicalize_name(match.group(1)) if match else ""
