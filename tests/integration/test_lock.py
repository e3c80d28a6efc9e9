"""`invoke lock` against the real base image's mirror and the real package index."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcbox import baseimage
from hpcbox.config import load_project
from hpcbox.errors import HpcboxError
from hpcbox.lock import read_apt_lock, refresh_locks
from hpcbox.tools import docker

pytestmark = pytest.mark.integration


def test_refresh_pins_every_package_to_a_version_the_mirror_serves(docker_engine, project_copy: Path):
    cpu_lock = project_copy / "docker/lock/apt-cpu.txt"
    cpu_lock.write_text("# unpinned on purpose\npython3-numpy\npython3-sklearn=0.0-outdated\n")
    base = baseimage.ensure_base().ref
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


def test_the_helper_lock_pins_apptainer_and_mksquashfs_and_what_they_need(
    docker_engine, tmp_path, monkeypatch
):
    from hpcbox.lock import refresh_helper_lock
    from hpcbox.tools import apptainer

    monkeypatch.setattr(apptainer, "HELPER_LOCK", tmp_path / "apt-helper.txt")
    assert refresh_helper_lock(say=lambda _: None) == tmp_path / "apt-helper.txt"
    pins = dict(
        line.split("=", 1)
        for line in (tmp_path / "apt-helper.txt").read_text().splitlines()
        if not line.startswith("#")
    )
    assert {"apptainer", "squashfs-tools", "squashfuse", "fuse2fs", "fuse-overlayfs", "uidmap"} <= pins.keys()
    assert all(version and " " not in version for version in pins.values())
    # The same mirror again: nothing changes, so the helper's tag (a hash of its lock) stays.
    assert refresh_helper_lock(say=lambda _: None) is None
