"""A project's own dependency list, read as the pip requirements its image's lock is compiled from.

The list lives in a requirements.txt, in pyproject.toml's `[project] dependencies`, or in a conda
environment.yml. uv does the resolving; this module finds the list, refuses what cannot be locked from
a package index (the project's own code travels beside the image, not in it), and translates a conda
environment into pip requirements: the image has no conda and no conda channel to ask.

It also names what Debian provides to the cpu flavour (python3-* packages in apt-cpu.txt) as PyPI
packages at PEP 440 versions, so that the cpu lock holds only what pip must add to them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from hpcbox.errors import FieldError, HpcboxError
from hpcbox.tables import load_toml

# yaml and packaging are imported where used: every command loads the project and checks this setting,
# and a fifth of a second of imports is for `lock` and `init` alone.
if TYPE_CHECKING:
    from packaging.requirements import Requirement

Kind = Literal["requirements", "pyproject", "conda"]
SETTING = "tool.hpcbox.dependencies"
EXTRAS_SETTING = "tool.hpcbox.extras"
CONDA_FILES = ("environment.yml", "environment.yaml")
_KIND_WORDS: dict[Kind, str] = {
    "requirements": "pip requirements",
    "pyproject": "[project] dependencies",
    "conda": "conda environment, as PyPI packages",
}
# conda → PyPI where the names differ. What PyPI has under conda's name (scikit-learn, pyyaml,
# pytorch-lightning, tensorboard, torchvision...) needs no entry.
CONDA_RENAMES = {
    "pytorch": "torch",
    "opencv": "opencv-python-headless",  # headless: cluster nodes have no display, and no X11 libraries
    "py-opencv": "opencv-python-headless",
    "matplotlib-base": "matplotlib",
    "pytables": "tables",
}
# conda packages pip has nothing to install for: PyPI's torch wheels carry their CUDA runtime (cuda-*),
# cuDNN and NCCL; the image has its own Python and pip; cpuonly and pytorch-mutex only pick conda builds.
CONDA_DROPPED = frozenset(
    {"python", "pip", "pytorch-cuda", "cudatoolkit", "cudnn", "nccl", "cpuonly", "pytorch-mutex"}
)
_CONDA_DROPPED_PREFIX = "cuda-"
# `[channel::]name[ spec]`: conda-forge::numpy=1.26, numpy >=1.2,<2, numpy 1.26.4 py311_0
_CONDA_SPEC = re.compile(r"^(?:[\w./-]+::)?([A-Za-z0-9_][A-Za-z0-9_.-]*)\s*(.*)$")
_CONDA_OPERATOR = re.compile(r"^(==|!=|>=|<=|~=|>|<)?(.*)$")
# Debian's python3-X is PyPI's X except for these.
DEBIAN_RENAMES = {
    "python3-sklearn": "scikit-learn",
    "python3-skimage": "scikit-image",
    "python3-yaml": "pyyaml",
    "python3-pil": "pillow",
    "python3-dateutil": "python-dateutil",
    # omegaconf's (and so Hydra's) parser runtime: an sdist alone on PyPI, a package in Debian
    "python3-antlr4": "antlr4-python3-runtime",
}
_DEBIAN_PIN = re.compile(r"^(python3-[a-z0-9][a-z0-9+.-]*)(?:=(\S+))?$")
_EDITABLE = re.compile(r"^(?:-e|--editable)(?:\s|=|$)")
# A requirement on a local path: ./pkg, /abs, ~/x, file:..., name @ file:..., src/pkg, a wheel or sdist
# file. (`git+https://...` has its `:` before any `/`.)
_LOCAL = re.compile(r"^(?:\.|/|~|file:|[^\s;@:]*/|[^\s;@:]+\.(?:whl|tar\.gz|zip)\b)|@\s*file:")
_INCLUDE = re.compile(r"^(?:-r|--requirement)(?:\s+|=)(\S+)$")
_OPTIONS = re.compile(r"\s+-")  # where a requirement line's own options begin (` --hash=...`)
# The image's platform: which of a user's requirements apply in it (markers), for the cpu flavour's
# comparison with Debian's versions.
IMAGE_PYTHON = "3.13"
_IMAGE_MARKERS = {
    "python_version": IMAGE_PYTHON,
    "python_full_version": f"{IMAGE_PYTHON}.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


@dataclass(frozen=True)
class DependencySource:
    """Where a project lists its dependencies; `extras` names pyproject optional-dependency groups."""

    path: Path
    kind: Kind
    extras: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.path.name} ({_KIND_WORDS[self.kind]})"


@dataclass(frozen=True)
class DebianStandIn:
    """A Debian python3-* package of the cpu flavour, as the PyPI package it stands in for."""

    package: str  # python3-numpy
    debian_version: str  # 1:2.2.4+ds-1
    name: str  # numpy
    version: str  # 2.2.4


@dataclass(frozen=True)
class _Line:
    where: str  # "requirements.txt:3", for messages
    text: str


def detect(root: Path) -> DependencySource | None:
    """The project's dependency list: requirements.txt, else pyproject.toml's dependencies when it lists
    any, else a conda environment file. `describe()` says which it is."""
    if (root / "requirements.txt").is_file():
        return DependencySource(root / "requirements.txt", "requirements")
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and _project_table(pyproject).get("dependencies"):
        return DependencySource(pyproject, "pyproject")
    conda = [root / name for name in CONDA_FILES if (root / name).is_file()]
    return DependencySource(conda[0], "conda") if conda else None


def from_setting(root: Path, setting: str, extras: tuple[str, ...] = ()) -> DependencySource:
    """The source `[tool.hpcbox] dependencies` names (a path relative to the project root)."""
    path = root / setting
    if not path.is_file():
        raise FieldError(SETTING, f"{setting} does not exist in {root}", "name your requirements file")
    kind = _kind(path)
    if kind is None:
        raise FieldError(
            SETTING,
            f"{setting} is not a dependency list hpcbox reads",
            "name a requirements .txt, a pyproject.toml or a conda environment .yml",
        )
    if extras and kind != "pyproject":
        raise FieldError(EXTRAS_SETTING, f"only a pyproject.toml has extras, not {setting}")
    groups = _project_table(path).get("optional-dependencies", {}) if extras else {}
    unknown = [extra for extra in extras if extra not in groups]
    if unknown:
        raise FieldError(
            EXTRAS_SETTING,
            f"{setting} has no optional-dependencies group {unknown[0]!r}",
            "name groups of its [project.optional-dependencies]",
        )
    return DependencySource(path, kind, extras)


def requirements_text(source: DependencySource) -> str:
    """The source as a pip requirements file for uv (relative includes resolve from its folder)."""
    if source.kind == "requirements":
        _requirement_lines(source)  # refuses what cannot be locked; uv reads the file as it is
        return source.path.read_text()
    return "".join(line.text + "\n" for line in _requirement_lines(source))


def direct_requirements(source: DependencySource) -> list[Requirement]:
    """The packages the source asks for by name and that apply in the image (markers for its platform).

    Lines without a name (a bare VCS URL) are uv's to judge and are left out here."""
    from packaging.requirements import InvalidRequirement, Requirement

    requirements = []
    for line in _requirement_lines(source):
        try:
            requirement = Requirement(_OPTIONS.split(line.text, maxsplit=1)[0])
        except InvalidRequirement:
            continue
        if requirement.marker is None or requirement.marker.evaluate(_image_markers()):
            requirements.append(requirement)
    return requirements


def not_found(source: DependencySource, package: str, details: str = "") -> HpcboxError:
    """The error for a package the index does not have (a conda name, or a misspelt one); `details`:
    the resolver's own output."""
    from packaging.utils import canonicalize_name

    conda_name = _conda_origins(source).get(canonicalize_name(package)) if source.kind == "conda" else None
    if conda_name is not None:
        return HpcboxError(
            f"{source.path.name}: conda package {conda_name} is not on PyPI under that name: "
            "list its PyPI name under pip:",
            "or leave it out if it is a library a PyPI wheel already carries",
            details,
        )
    return HpcboxError(
        f"{source.path.name}: {package} is not in the package index", "check its name on pypi.org", details
    )


def conda_requirement(spec: str, where: str) -> str | None:
    """A conda package spec as a pip requirement, or None for what pip has nothing to install for.

    `=1.26` (conda's fuzzy match) → `==1.26.*`; a bare `1.26.4` → `==1.26.4`; `1.8*` → `==1.8.*`;
    operators stay; build strings (`=py311_0`, ` py311_0`) and channels (`conda-forge::`) go."""
    from packaging.requirements import InvalidRequirement, Requirement

    name, version = _conda_parts(spec, where)
    if name in CONDA_DROPPED or name.startswith(_CONDA_DROPPED_PREFIX):
        return None
    if version.startswith("=") and not version.startswith("=="):
        specifier = f"=={_wildcard(version[1:].split('=')[0].split()[0])}"
    elif version:
        specifier = ",".join(_conda_constraint(part) for part in version.split()[0].split(","))
    else:
        specifier = ""
    requirement = CONDA_RENAMES.get(name, name) + specifier
    try:
        Requirement(requirement)
    except InvalidRequirement:
        raise _unreadable_conda_spec(spec, where) from None
    return requirement


def debian_stand_ins(apt_lock: Path) -> list[DebianStandIn]:
    """The python3-* packages an apt lock pins, as the PyPI packages they provide."""
    stand_ins = []
    for number, line in enumerate(apt_lock.read_text().splitlines(), start=1):
        match = _DEBIAN_PIN.match(line.strip())
        if match is None:
            continue  # comments, and Debian packages that are not Python's
        package, debian_version = match.groups()
        if debian_version is None:
            raise HpcboxError(
                f"{apt_lock.name}:{number}: {package} has no version", "pin it: run `hpcbox lock`"
            )
        name = DEBIAN_RENAMES.get(package, package.removeprefix("python3-"))
        stand_ins.append(
            DebianStandIn(package, debian_version, name, pep440_version(debian_version, package))
        )
    return stand_ins


def pep440_version(debian_version: str, package: str = "") -> str:
    """Upstream's version in a Debian one: `1:2.2.4+ds-1` → `2.2.4`, `2.0.0~rc1-1` → `2.0.0rc1`.

    The epoch, the Debian revision and a repack suffix (`+dfsg`, `+ds`) are Debian's own; `~` sorts
    a pre-release first in Debian, as PEP 440's pre-release does."""
    from packaging.version import InvalidVersion, Version

    upstream = debian_version.split(":", 1)[-1].rsplit("-", 1)[0].split("+", 1)[0].replace("~", "")
    try:
        return str(Version(upstream))
    except InvalidVersion:
        raise HpcboxError(
            f"{package or 'Debian'} {debian_version}: {upstream!r} is not a Python package version",
            "leave the package out of the apt lock, or pin a version whose upstream part is PEP 440",
        ) from None


def debian_conflicts(
    requirements: Iterable[Requirement], stand_ins: Iterable[DebianStandIn]
) -> dict[DebianStandIn, Requirement]:
    """Each stand-in whose version a direct requirement does not allow → that requirement."""
    from packaging.utils import canonicalize_name

    by_name = {canonicalize_name(stand_in.name): stand_in for stand_in in stand_ins}
    conflicts = {}
    for requirement in requirements:
        stand_in = by_name.get(canonicalize_name(requirement.name))
        if stand_in is not None and not requirement.specifier.contains(stand_in.version, prereleases=True):
            conflicts[stand_in] = requirement
    return conflicts


def _kind(path: Path) -> Kind | None:
    if path.name == "pyproject.toml":
        return "pyproject"
    if path.suffix in (".yml", ".yaml"):
        return "conda"
    if path.suffix in (".txt", ".in"):
        return "requirements"
    return None


def _requirement_lines(source: DependencySource) -> list[_Line]:
    """Every requirement line (includes followed), each checked; refuses an empty list."""
    if source.kind == "requirements":
        top = source.path.resolve()
        lines = _expanded(_file_lines(top, source.path.name), top.parent, {top})
    elif source.kind == "pyproject":
        lines = _expanded(_pyproject_lines(source), source.path.parent, set())
    else:
        conda, pip = _conda_lines(source.path)
        translated = [(line, conda_requirement(line.text, line.where)) for line in conda]
        lines = [_Line(line.where, text) for line, text in translated if text is not None]
        lines += _expanded(pip, source.path.parent, set())
    if not lines:
        raise HpcboxError(
            f"{source.path.name}: lists no packages for pip to install",
            "list your project's dependencies there, or name another file in " + SETTING,
        )
    return lines


def _expanded(lines: list[_Line], directory: Path, seen: set[Path]) -> list[_Line]:
    """Requirement lines with `-r` includes read in their place; other options are uv's."""
    requirements = []
    for line in lines:
        option = line.text.startswith("-")
        if _EDITABLE.match(line.text) or (not option and _LOCAL.search(line.text)):
            raise HpcboxError(
                f"{line.where}: {line.text!r} installs from a local path or in editable mode",
                "list packages from an index only: the project's code travels beside the image "
                "(tool.hpcbox.code)",
            )
        include = _INCLUDE.match(line.text)
        if include:
            path = (directory / include.group(1)).resolve()
            if not path.is_file():
                raise HpcboxError(f"{line.where}: {include.group(1)} does not exist", "fix the -r path")
            if path not in seen:  # a file included twice (or in a cycle) is read once
                seen.add(path)
                requirements += _expanded(_file_lines(path, include.group(1)), path.parent, seen)
        elif not option:
            requirements.append(line)
    return requirements


def _file_lines(path: Path, label: str) -> list[_Line]:
    """A requirements file's logical lines: continuations joined, comments and blanks left out."""
    lines: list[_Line] = []
    pending = ""
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        text = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        if pending + text:
            lines.append(_Line(f"{label}:{number}", (pending + text).strip()))
        pending = ""
    return lines


def _pyproject_lines(source: DependencySource) -> list[_Line]:
    from packaging.utils import canonicalize_name

    project = _project_table(source.path)
    if "dependencies" in project.get("dynamic", []):
        raise HpcboxError(
            f"{source.path.name}: [project] dependencies are dynamic, so only a build backend knows them",
            "list them in [project] dependencies, or name a requirements file in " + SETTING,
        )
    name = canonicalize_name(str(project.get("name", "")))
    groups = project.get("optional-dependencies", {})
    where = f"{source.path.name}: [project] dependencies"
    lines = [_Line(where, text) for text in project.get("dependencies", [])]
    wanted, done = list(source.extras), set()
    while wanted:  # groups named by tool.hpcbox.extras, and those they name as `<this project>[group]`
        extra = wanted.pop(0)
        if extra in done:
            continue
        done.add(extra)
        for text in groups.get(extra, []):
            own = _own_extras(text, name)
            if own is None:
                lines.append(_Line(f"{source.path.name}: [project.optional-dependencies] {extra}", text))
            else:
                wanted += own
    return lines


def _own_extras(text: str, project_name: str) -> list[str] | None:
    """The groups a requirement on the project itself names (`mypkg[viz]`), or None for another's."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    try:
        requirement = Requirement(text)
    except InvalidRequirement:
        return None
    return sorted(requirement.extras) if canonicalize_name(requirement.name) == project_name else None


def _project_table(pyproject: Path) -> dict[str, Any]:
    return load_toml(pyproject).get("project", {})


def _conda_lines(path: Path) -> tuple[list[_Line], list[_Line]]:
    """The conda packages and the pip: sub-list of an environment file."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise HpcboxError(f"{path.name} is not valid YAML: {exc}".splitlines()[0], "fix its syntax") from exc
    entries = data.get("dependencies") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise HpcboxError(f"{path.name}: has no dependencies: list", "list your packages under dependencies:")
    conda, pip = [], []
    for entry in entries:
        if isinstance(entry, str):
            conda.append(_Line(f"{path.name}: dependencies", entry))
        elif isinstance(entry, dict) and list(entry) == ["pip"] and isinstance(entry["pip"], list):
            pip += [_Line(f"{path.name}: pip", str(item)) for item in entry["pip"]]
        else:
            raise HpcboxError(
                f"{path.name}: {entry!r} is neither a conda package nor a pip: list",
                "list conda packages as strings, and pip packages under `- pip:`",
            )
    return conda, pip


def _conda_origins(source: DependencySource) -> dict[str, str]:
    """PyPI name → the conda package it was translated from."""
    from packaging.utils import canonicalize_name

    origins = {}
    for line in _conda_lines(source.path)[0]:
        if conda_requirement(line.text, line.where) is not None:
            name = _conda_parts(line.text, line.where)[0]
            origins[canonicalize_name(CONDA_RENAMES.get(name, name))] = name
    return origins


def _conda_parts(spec: str, where: str) -> tuple[str, str]:
    """A conda spec's package name (lower case) and version part (spaces around commas gone)."""
    match = _CONDA_SPEC.match(spec.strip())
    if match is None:
        raise _unreadable_conda_spec(spec, where)
    return match.group(1).lower(), re.sub(r"\s*,\s*", ",", match.group(2).strip())


def _conda_constraint(part: str) -> str:
    operator, version = _CONDA_OPERATOR.match(part).groups()  # type: ignore[union-attr]
    if version.endswith("*"):
        return f"{operator or '=='}{_wildcard(version)}"
    return f"{operator or '=='}{version}"


def _wildcard(version: str) -> str:
    """`1.26`, `1.26.*` or `1.26*` → `1.26.*`: conda's prefix match, as PEP 440 writes it."""
    return version.rstrip("*").rstrip(".") + ".*"


def _unreadable_conda_spec(spec: str, where: str) -> HpcboxError:
    return HpcboxError(
        f"{where}: cannot read the conda spec {spec!r} as a pip requirement",
        "write it as name, name=version or name>=version, or list it under pip:",
    )


def _image_markers() -> dict[str, str]:
    from packaging.markers import default_environment

    return {**default_environment(), **_IMAGE_MARKERS}
