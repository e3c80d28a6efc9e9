"""`hpcbox lock` against the real base image's mirror and the real package index."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hpcbox.build.lock import read_apt_lock, refresh_locks, refresh_pip_locks
from hpcbox.errors import HpcboxError
from hpcbox.project.config import load_project
from hpcbox.tools import docker
from tests.fixtures.debian import pinned_base

pytestmark = pytest.mark.integration


def test_refresh_pins_every_package_to_a_version_the_mirror_serves(docker_engine, project_copy: Path):
    cpu_lock = project_copy / "docker/lock/apt-cpu.txt"
    cpu_lock.write_text("# unpinned on purpose\npython3-numpy\npython3-sklearn=0.0-outdated\n")
    base = pinned_base()
    changed = refresh_locks(load_project(project_copy), base, say=lambda _: None)
    assert cpu_lock in changed
    pinned = [line for line in cpu_lock.read_text().splitlines() if not line.startswith("#")]
    assert [line.split("=", 1)[0] for line in pinned] == ["python3-numpy", "python3-sklearn"]
    assert all("=" in line and not line.endswith("outdated") for line in pinned)
    assert cpu_lock.read_text().startswith("# unpinned on purpose\n")
    # the pins resolve: apt would install exactly these versions from the base image's mirror
    docker.run_once(
        base,
        ["sh", "-c", "apt-get update -qq && apt-get install --dry-run -y " + " ".join(pinned)],
        what="resolve the refreshed pins",
    )
    cuda_lock = (project_copy / "docker/lock/cuda-requirements.txt").read_text()
    assert "torch==2.9.1 \\" in cuda_lock and "--hash=sha256:" in cuda_lock


def test_malformed_lock_line_names_file_and_line(tmp_path: Path):
    lock = tmp_path / "apt-cpu.txt"
    lock.write_text("# ok\npython3-torch==2.6\n")
    with pytest.raises(HpcboxError, match=r"^apt-cpu.txt:2: 'python3-torch==2.6' is not"):
        read_apt_lock(lock)


def test_the_helper_locks_pin_apptainer_mksquashfs_and_libdeflate_and_name_the_rest(
    docker_engine, tmp_path, monkeypatch
):
    from hpcbox.sif import helper as sif_helper

    monkeypatch.setattr(sif_helper, "HELPER_LOCK", tmp_path / "apt-helper.txt")
    monkeypatch.setattr(sif_helper, "HELPER_BUILD_LOCK", tmp_path / "apt-helper-build.txt")
    assert sif_helper.refresh_helper_lock(say=lambda _: None) == [
        tmp_path / "apt-helper.txt",
        tmp_path / "apt-helper-build.txt",
    ]

    def lines(name: str) -> list[str]:
        return [line for line in (tmp_path / name).read_text().splitlines() if not line.startswith("#")]

    helper, build = lines("apt-helper.txt"), lines("apt-helper-build.txt")
    # What writes a SIF's bytes is pinned; the rest follows the mirror.
    pinned = {line.split("=", 1)[0]: line.split("=", 1)[1] for line in helper + build if "=" in line}
    assert pinned.keys() == {"apptainer", "squashfs-tools", "libdeflate0", "libdeflate-dev"}
    assert {"squashfuse", "fuse2fs", "fuse-overlayfs", "uidmap"} <= set(helper)
    assert {"gcc", "libc6-dev", "zlib1g-dev"} <= set(build) and "gcc" not in helper
    # What the shim is compiled against is what runs it.
    assert pinned["libdeflate0"] == pinned["libdeflate-dev"]
    assert all(version and " " not in version for version in pinned.values())
    # The same mirror again: nothing changes, so the helper's tag (a hash of its locks) stays.
    assert sif_helper.refresh_helper_lock(say=lambda _: None) == []


def test_the_node_locks_pin_every_package_at_the_version_its_suite_serves(docker_engine, tmp_path):
    """`hpcbox lock`'s node half: the common lock and one per Slurm version, every line an exact version,
    each Slurm lock its own release (bookworm's 22.05 even though trixie's 24.11 is newer); asked again,
    nothing changes, so no node image's tag moves."""
    from hpcbox.build.offlock import apt_pins
    from hpcbox.minicluster import node_image, versions

    context = tmp_path / "node"
    (context / "lock").mkdir(parents=True)
    written = node_image.refresh_node_locks(context, say=lambda _: None)
    slurm_locks = [node_image.slurm_lock(version, context) for version in versions.SUITES]
    assert sorted(written) == sorted([context / "lock" / "apt-node.txt", *slurm_locks])
    common = apt_pins((context / "lock" / "apt-node.txt").read_text())
    assert set(common) == {package.partition("/")[0] for package in node_image.NODE_PACKAGES}
    for version, lock in zip(versions.SUITES, slurm_locks, strict=True):
        pins = apt_pins(lock.read_text())
        assert all(pins[name].startswith(f"{version}.") for name in node_image.SLURM_PACKAGES), (lock, pins)
        body = [line for line in lock.read_text().splitlines() if not line.startswith("#")]
        assert len(body) == len(pins), lock
    assert node_image.refresh_node_locks(context, say=lambda _: None) == []


# A project's own dependency list, locked from PyPI for both flavours (no Docker needed).
OWN_PYPROJECT = """\
[project]
name = "mine"
dependencies = ["requests==2.32.3"]
[project.optional-dependencies]
viz = ["numpy"]
[tool.hpcbox]
project = "mine"
code = ["src/mine"]
dependencies = "{dependencies}"
"""


def own_project(root: Path, dependencies: str, text: str, apt_cpu: str = "python3-numpy=1:2.2.4+ds-1\n"):
    (root / "src" / "mine").mkdir(parents=True)
    (root / "docker" / "lock").mkdir(parents=True)
    (root / "docker" / "lock" / "apt-cpu.txt").write_text(apt_cpu)
    (root / "pyproject.toml").write_text(OWN_PYPROJECT.format(dependencies=dependencies))
    if dependencies != "pyproject.toml":
        (root / dependencies).write_text(text)
    else:
        (root / "pyproject.toml").write_text(OWN_PYPROJECT.format(dependencies=dependencies) + text)
    return load_project(root)


def pins(lock: Path) -> dict[str, str]:
    return dict(re.findall(r"^([a-z0-9][a-z0-9._-]*)==(\S+) \\$", lock.read_text(), re.MULTILINE))


def test_a_requirements_txt_gives_a_cuda_lock_and_a_cpu_lock_around_debians_numpy(tmp_path):
    project = own_project(tmp_path, "requirements.txt", "numpy\nrequests==2.32.3\n")
    said: list[str] = []
    changed = refresh_pip_locks(project, say=said.append)
    cuda, cpu = tmp_path / "docker/lock/cuda-requirements.txt", tmp_path / "docker/lock/cpu-requirements.txt"
    assert changed == [cuda, cpu]
    assert {"numpy", "requests", "urllib3", "certifi"} <= pins(cuda).keys()
    assert pins(cuda)["requests"] == "2.32.3"
    assert "numpy==" in cuda.read_text() and "--hash=sha256:" in cuda.read_text()
    assert {"requests", "urllib3", "certifi", "idna", "charset-normalizer"} == pins(cpu).keys()
    assert "--hash=sha256:" in cpu.read_text()
    header = [line for line in cpu.read_text().splitlines() if line.startswith("#")][:4]
    assert "#   numpy 2.2.4: python3-numpy=1:2.2.4+ds-1" in header
    assert "hpcbox-debian-" not in cpu.read_text()  # no scratch path: the same lock on any host
    assert said[0] == "hpcbox: dependencies from requirements.txt (pip requirements)"
    # Nothing changed upstream, nothing changes here.
    assert refresh_pip_locks(project, say=lambda _: None) == []


def test_a_conda_environment_locks_with_debians_torch_standing_in_for_the_cpu_flavour(tmp_path):
    environment = """\
        name: research
        channels: [pytorch, nvidia, conda-forge]
        dependencies:
          - python=3.11
          - pytorch=2.5
          - pytorch-cuda=12.1
          - conda-forge::numpy>=1.26
          - pip
          - pip:
            - requests==2.32.3
        """
    apt_cpu = "python3-torch=2.6.0+dfsg-7\npython3-numpy=1:2.2.4+ds-1\n"
    project = own_project(tmp_path, "environment.yml", textwrap.dedent(environment), apt_cpu)
    said: list[str] = []
    refresh_pip_locks(project, say=said.append)
    cuda = pins(tmp_path / "docker/lock/cuda-requirements.txt")
    cpu = pins(tmp_path / "docker/lock/cpu-requirements.txt")
    assert cuda["torch"].startswith("2.5.") and "requests" in cuda and "numpy" in cuda
    assert any(name.startswith("nvidia-") for name in cuda)  # PyPI's torch is the CUDA build
    # Debian's torch comes with its own dependencies: none of PyPI's torch tree is added
    assert {"requests", "urllib3", "certifi", "idna", "charset-normalizer"} == cpu.keys()
    assert "hpcbox: cpu flavour: Debian's torch 2.6.0 stands in for torch==2.5.*" in said


def test_pyproject_dependencies_and_an_extra_lock(tmp_path):
    project = own_project(tmp_path, "pyproject.toml", 'extras = ["viz"]\n')
    refresh_pip_locks(project, say=lambda _: None)
    assert {"requests", "numpy"} <= pins(tmp_path / "docker/lock/cuda-requirements.txt").keys()
    assert "numpy" not in pins(tmp_path / "docker/lock/cpu-requirements.txt")


def test_a_conda_package_pypi_lacks_is_one_line_naming_it_and_the_file(tmp_path):
    environment = "dependencies:\n  - numpy\n  - libjpeg-turbo=3\n"
    project = own_project(tmp_path, "environment.yml", environment)
    with pytest.raises(HpcboxError) as raised:
        refresh_pip_locks(project, say=lambda _: None)
    assert raised.value.message == (
        "environment.yml: conda package libjpeg-turbo is not on PyPI under that name: "
        "list its PyPI name under pip:"
    )


# A dependency PyPI has as an sdist alone (hydra-core needs antlr4-python3-runtime 4.9.3), from a fresh
# project to its cpu image, offline, through the `hpcbox` command.
def hpcbox(project: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hpcbox", *args],
        cwd=project,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


def fresh_project(root: Path, requirements: str, repository: str) -> dict[str, str]:
    root.mkdir()
    (root / "train.py").write_text("import hydra\n")
    (root / "requirements.txt").write_text(requirements)
    env = {"HPCBOX_IMAGE_REPOSITORY": repository}
    for args in (("init",), ("lock", "--pip-only")):
        done = hpcbox(root, *args, env=env)
        assert done.returncode == 0, f"hpcbox {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return env


def test_a_package_pypi_has_no_wheel_of_is_built_into_the_cpu_image_with_pinned_tools(
    docker_engine, run_id: str, tmp_path: Path
):
    root = tmp_path / "hydra-project"
    env = fresh_project(root, "hydra-core==1.3.2\n", f"{run_id}/hydra-project")
    lock = (root / "docker/lock/cpu-requirements.txt").read_text()
    assert "\n--no-binary antlr4-python3-runtime\n" in lock and lock.count("--no-binary") == 1
    constraints = (root / "docker/lock/cpu-build-constraints.txt").read_text()
    setuptools = re.search(r"^setuptools==(\S+)$", constraints, re.MULTILINE)
    assert setuptools, constraints
    try:
        built = hpcbox(root, "build", "--offline", env=env)
        assert built.returncode == 0, built.stderr
        ref = built.stdout.strip().splitlines()[-1]
        site = "/opt/venv/lib/python3.13/site-packages"
        found = docker.run_once(
            ref,
            ["sh", "-c", f"python -c 'import hydra, omegaconf, antlr4; print(hydra.__version__)' && ls {site}"
             f" && cat {site}/antlr4_python3_runtime-4.9.3.dist-info/WHEEL"],
            what="import hydra in the image",
        )  # fmt: skip
        lines = found.splitlines()
        assert lines[0] == "1.3.2"
        # built from its sdist by the pinned setuptools, which stayed in the builder, as the sdist did
        assert f"Generator: setuptools ({setuptools.group(1)})" in lines
        assert "antlr4" in lines and not any(line.startswith(("setuptools", "wheel-")) for line in lines)
        assert not any(line.endswith((".tar.gz", ".whl")) for line in lines)
    finally:
        for image in docker_engine.images.list(name=f"{run_id}/hydra-project"):
            for tag in image.tags:
                docker.remove_image(tag)


def test_a_package_whose_build_needs_a_compiler_fails_the_build_naming_it_and_the_way_out(
    docker_engine, run_id: str, tmp_path: Path
):
    root = tmp_path / "netifaces-project"
    env = fresh_project(root, "netifaces==0.11.0\n", f"{run_id}/netifaces-project")
    try:
        failed = hpcbox(root, "build", "--offline", env=env)
        assert failed.returncode == 1
        assert (
            "error: netifaces 0.11.0 has no wheel for Python 3.13 on x86_64 Linux, and its build from source "
            "in the image failed: it needs a C compiler, which the image lacks\n"
            "  hint: pin a version of netifaces that has a wheel"
        ) in failed.stderr, failed.stderr
    finally:
        for image in docker_engine.images.list(name=f"{run_id}/netifaces-project"):
            for tag in image.tags:
                docker.remove_image(tag)
