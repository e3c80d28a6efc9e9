"""Packages with no wheel for the image: `hpcbox lock` has pip build them from source, with their build
tools pinned, and a failed build names the package and the way out. uv and pip are real, against a
package index on disk (no network: the same from PyPI is tests/integration/test_lock.py's)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from hpcbox.build import sourcebuild
from hpcbox.build.lock import refresh_pip_locks
from hpcbox.project.config import load_project
from hpcbox.project.init import docker_template

SETUP_PY = "from setuptools import setup\nsetup()\n"
FLIT_PYPROJECT = """\
[build-system]
requires = ["flit_core>=3.2,<4"]
build-backend = "flit_core.buildapi"
[project]
name = "flitted"
version = "2.0"
"""
# An sdist with a build backend of its own (PEP 517's backend-path): pip builds it with nothing from the
# index, so a real pip builds it here, offline.
OWN_BACKEND_PYPROJECT = """\
[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]
[project]
name = "buildable"
version = "1.0"
"""
BACKEND = """\
import os
import zipfile


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = "buildable-1.0-py3-none-any.whl"
    info = "buildable-1.0.dist-info"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        wheel.writestr("buildable.py", "BUILT_FROM_SOURCE = True\\n")
        wheel.writestr(info + "/METADATA", "Metadata-Version: 2.1\\nName: buildable\\nVersion: 1.0\\n")
        wheel.writestr(info + "/WHEEL", "Wheel-Version: 1.0\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
        wheel.writestr(info + "/RECORD", "buildable.py,,\\n" + info + "/METADATA,,\\n" + info + "/WHEEL,,\\n")
    return name
"""
PYPROJECT = """\
[project]
name = "mine"
[tool.hpcbox]
project = "mine"
code = ["src/mine"]
"""


def sdist(folder: Path, name: str, version: str, files: dict[str, str]) -> None:
    """An sdist whose PKG-INFO (metadata 2.2, nothing dynamic) uv reads without building it."""
    top = f"{name}-{version}"
    files = {"PKG-INFO": f"Metadata-Version: 2.2\nName: {name}\nVersion: {version}\n", **files}
    with tarfile.open(folder / f"{top}.tar.gz", "w:gz") as tar:
        for relative, text in files.items():
            data = text.encode()
            member = tarfile.TarInfo(f"{top}/{relative}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))


def wheel(folder: Path, name: str, version: str, tag: str = "py3-none-any") -> None:
    stem = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{stem}-{tag}.whl", "w") as archive:
        archive.writestr(
            f"{stem}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        archive.writestr(
            f"{stem}.dist-info/WHEEL", f"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: {tag}\n"
        )
        archive.writestr(f"{stem}.dist-info/RECORD", "")


@pytest.fixture
def index(tmp_path: Path) -> Path:
    """A package index on disk, which the requirements name in place of PyPI (FROM_INDEX)."""
    folder = tmp_path / "index"
    folder.mkdir()
    wheel(folder, "haswheel", "1.0")
    sdist(folder, "haswheel", "1.0", {"setup.py": SETUP_PY})
    wheel(folder, "winonly", "1.0", "cp313-cp313-win_amd64")  # a wheel, but for another platform
    sdist(folder, "winonly", "1.0", {"setup.py": SETUP_PY})  # no pyproject.toml: pip's default tools
    sdist(folder, "flitted", "2.0", {"pyproject.toml": FLIT_PYPROJECT})
    sdist(folder, "buildable", "1.0", {"pyproject.toml": OWN_BACKEND_PYPROJECT, "backend.py": BACKEND})
    for name, version in (("setuptools", "80.0.0"), ("wheel", "0.45.0"), ("flit-core", "3.9.0")):
        wheel(folder, name, version)
    return folder


def from_index(index: Path) -> str:
    """The lines that have uv take packages from `index` alone; the build tools come from there too."""
    return f"--no-index\n--find-links {index}\n"


def project_with(root: Path, requirements: str, *, setting: bool = True):
    (root / "src" / "mine").mkdir(parents=True)
    (root / "docker" / "lock").mkdir(parents=True)
    (root / "docker" / "lock" / "apt-cpu.txt").write_text("python3-numpy=1:2.2.4+ds-1\n")
    (root / "requirements.txt").write_text(requirements)
    (root / "pyproject.toml").write_text(
        PYPROJECT + ('dependencies = "requirements.txt"\n' if setting else "")
    )
    return load_project(root)


def pins(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==(\S+)", path.read_text(), re.MULTILINE))


def options(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith("--")]


def test_packages_with_no_wheel_for_the_image_build_from_source_with_their_build_tools_pinned(
    index: Path, tmp_path: Path
):
    project = project_with(tmp_path / "mine", from_index(index) + "haswheel\nwinonly\nflitted\n")
    said: list[str] = []
    changed = refresh_pip_locks(project, say=said.append)
    lock_dir = project.root / "docker/lock"
    locks = [lock_dir / "cuda-requirements.txt", lock_dir / "cpu-requirements.txt"]
    constraints = [lock_dir / "cuda-build-constraints.txt", lock_dir / "cpu-build-constraints.txt"]
    assert changed == [*locks, *constraints]
    for lock in locks:
        # winonly's one wheel is for Windows: built from source, as flitted (an sdist alone)
        assert options(lock) == ["--no-binary flitted", "--no-binary winonly"]
        assert pins(lock) == {"haswheel": "1.0", "winonly": "1.0", "flitted": "2.0"}
        assert "#   flitted 2.0\n#   winonly 1.0\n--no-binary" in lock.read_text()
    for built in constraints:
        text = built.read_text()
        # flitted's [build-system] requires; for winonly's setup.py alone, pip's setuptools and wheel
        assert pins(built) == {"flit-core": "3.9.0", "setuptools": "80.0.0", "wheel": "0.45.0"}
        assert "#   winonly 1.0: setuptools>=40.8.0, wheel\n" in text
        assert "#   flitted 2.0: flit_core>=3.2,<4\n" in text
        assert "--hash" not in text  # hashes would make pip refuse each build's own unpinned requirements
    built = "hpcbox: cpu-requirements.txt: built from source, having no wheel for the image"
    assert f"{built}: flitted 2.0, winonly 1.0" in said
    # the same on any host: no scratch folder, no index path
    assert not any(str(tmp_path) in path.read_text() for path in locks + constraints)
    # Nothing changed upstream, nothing changes here.
    assert refresh_pip_locks(project, say=lambda _: None) == []

    # Without such packages, the lines and the build tools go: the image builds as it always did.
    (project.root / "requirements.txt").write_text(from_index(index) + "haswheel\n")
    assert refresh_pip_locks(project, say=lambda _: None) == [*locks, *constraints]
    assert not any(path.exists() for path in constraints)
    assert all(options(lock) == [] and "from source" not in lock.read_text() for lock in locks)


def test_the_docker_requirements_ins_lock_the_same_way(index: Path, tmp_path: Path):
    project = project_with(tmp_path / "mine", "", setting=False)
    (project.root / "docker/requirements").mkdir()
    (project.root / "docker/requirements/cuda.in").write_text(from_index(index) + "haswheel\nwinonly\n")
    lock_dir = project.root / "docker/lock"
    assert refresh_pip_locks(project, say=lambda _: None) == [
        lock_dir / "cuda-requirements.txt",
        lock_dir / "cuda-build-constraints.txt",
    ]
    assert options(lock_dir / "cuda-requirements.txt") == ["--no-binary winonly"]
    assert pins(lock_dir / "cuda-build-constraints.txt") == {"setuptools": "80.0.0", "wheel": "0.45.0"}


def test_pip_builds_exactly_the_packages_the_lock_names_from_source(index: Path, tmp_path: Path):
    """The Dockerfile's pip command, `--only-binary=:all:` on it, reading the lock `hpcbox lock` wrote."""
    project = project_with(tmp_path / "mine", from_index(index) + "haswheel\nbuildable\n")
    refresh_pip_locks(project, say=lambda _: None)
    lock = project.root / "docker/lock/cpu-requirements.txt"
    assert options(lock) == ["--no-binary buildable"]
    constraints = project.root / "docker/lock/cpu-build-constraints.txt"
    assert pins(constraints) == {}  # its own backend needs nothing from the index
    assert "#   buildable 1.0: nothing (its own backend)\n" in constraints.read_text()

    def pip_install(requirements: Path, target: Path) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-cache-dir"]
        argv += ["--no-index", "--find-links", str(index), "--only-binary=:all:", "--no-deps"]
        argv += ["--require-hashes", "--target", str(target), "-r", str(requirements)]
        env = {**os.environ, "PIP_CONSTRAINT": str(constraints), "PIP_USE_PEP517": "1"}
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)

    installed = pip_install(lock, tmp_path / "installed")
    assert installed.returncode == 0, installed.stderr
    assert "BUILT_FROM_SOURCE" in (tmp_path / "installed/buildable.py").read_text()
    assert (tmp_path / "installed/haswheel-1.0.dist-info").is_dir()
    # The same lock without the line: the command line's --only-binary=:all: holds for every package.
    without = tmp_path / "without.txt"
    without.write_text(lock.read_text().replace("--no-binary buildable\n", ""))
    refused = pip_install(without, tmp_path / "refused")
    assert refused.returncode != 0
    assert "No matching distribution found for buildable" in refused.stderr


# The failing step of a real `hpcbox build` (as docker.failed_step gives it), a source-only package
# that needs a C compiler: netifaces 0.11.0 has no wheel for Python 3.13.
NO_COMPILER = """\
7.220 Collecting netifaces==0.11.0 (from -r /opt/hpcbox/lock/cpu-requirements.txt (line 12))
7.300   Downloading netifaces-0.11.0.tar.gz (30 kB)
7.400   Installing build dependencies: started
7.737       building 'netifaces' extension
7.737       x86_64-linux-gnu-gcc -fno-strict-overflow -DNDEBUG -g -O2 -Wall -fPIC -c netifaces.c
7.737       error: [Errno 2] No such file or directory: 'x86_64-linux-gnu-gcc'
7.737       [end of output]
7.737   note: This error originates from a subprocess, and is likely not a problem with pip.
7.738   ERROR: Failed building wheel for netifaces
7.739 Failed to build netifaces
7.740 ERROR: Failed to build installable wheels for some pyproject.toml based projects (netifaces)
""".splitlines()
# One that fails before its wheel, while pip prepares its metadata: pip names no package there.
NO_HEADER = """\
3.100 Collecting tabulate==0.9.0 (from -r /opt/hpcbox/lock/cpu-requirements.txt (line 20))
3.200 Collecting antlr4-python3-runtime==4.9.3 (from -r /opt/hpcbox/lock/cpu-requirements.txt (line 9))
3.300   Preparing metadata (pyproject.toml): started
3.900       src/parser.c:1:10: fatal error: zlib.h: No such file or directory
3.901   error: subprocess-exited-with-error
3.902 error: metadata-generation-failed
""".splitlines()
LOCK = """\
--no-binary antlr4-python3-runtime
--no-binary netifaces
antlr4-python3-runtime==4.9.3 \\
    --hash=sha256:f224469b4168294902bb1efa80a8bf7855f24c99aef99cbefc1bcd3cce77881b
netifaces==0.11.0 \\
    --hash=sha256:043a79146eb2907edf439899f262b3dfe41717d34124298ed281139a8b93ca32
"""


def test_a_failed_build_from_source_names_the_package_what_it_lacks_and_the_way_out(tmp_path: Path):
    lock = tmp_path / "cpu-requirements.txt"
    lock.write_text(LOCK)
    error = sourcebuild.build_failure(NO_COMPILER, lock)
    assert error is not None
    assert error.message == (
        "netifaces 0.11.0 has no wheel for Python 3.13 on x86_64 Linux, and its build from source in the "
        "image failed: it needs a C compiler, which the image lacks"
    )
    assert error.hint.startswith("pin a version of netifaces that has a wheel")
    assert "Debian's python3-netifaces stand in: add it to docker/lock/apt-cpu.txt" in error.hint
    assert "Failed to build netifaces" in error.details
    # Named by where pip began collecting it; Debian's name for it is not python3-<its PyPI name>.
    error = sourcebuild.build_failure(NO_HEADER, lock)
    assert error is not None
    assert error.message.startswith("antlr4-python3-runtime 4.9.3 has no wheel")
    assert error.message.endswith("failed: it needs the C header zlib.h, which the image lacks")
    assert "let Debian's python3-antlr4 stand in" in error.hint


def test_other_failures_are_left_as_they_are(tmp_path: Path):
    lock = tmp_path / "cpu-requirements.txt"
    lock.write_text(LOCK.replace("--no-binary netifaces\n", ""))
    assert sourcebuild.build_failure(NO_COMPILER, lock) is None  # netifaces is not one it builds
    apt = ["2.000 E: Version '9.9' for 'python3-numpy' was not found"]
    assert sourcebuild.build_failure(apt, lock) is None
    lock.write_text("haswheel==1.0 \\\n    --hash=sha256:00\n")
    assert sourcebuild.build_failure(NO_COMPILER, lock) is None


def test_a_dockerfile_that_does_not_pin_the_build_tools_is_warned_of(tmp_path: Path):
    lock = tmp_path / "cpu-requirements.txt"
    lock.write_text(LOCK)
    hpcboxs = (docker_template() / "Dockerfile").read_text()
    assert sourcebuild.unpinned_build_tools(lock, hpcboxs) is None
    older = "\n".join(line for line in hpcboxs.splitlines() if "build-constraints" not in line)
    warning = sourcebuild.unpinned_build_tools(lock, older)
    assert warning is not None
    assert warning.startswith(
        "hpcbox: warning: the Dockerfile does not use cpu-build-constraints.txt, so pip builds "
        "antlr4-python3-runtime, netifaces with the newest build tools"
    )
    lock.write_text("haswheel==1.0\n")
    assert sourcebuild.unpinned_build_tools(lock, older) is None
