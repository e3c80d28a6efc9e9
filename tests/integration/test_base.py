"""The bootstrapped Debian base: the same lock gives the same image, a stale lock stops before tagging."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcbox import baseimage
from hpcbox.tools import docker

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_the_base_bootstrapped_twice_from_one_lock_is_the_same_image(docker_engine, run_id: str):
    lock = baseimage.read_lock(REPO / "docker" / "lock" / baseimage.LOCK_NAME)
    refs = [f"{run_id}/debian:first", f"{run_id}/debian:second"]
    try:
        made = [baseimage.ensure_base(lock=lock, ref=ref, force=True, on_line=lambda _: None) for ref in refs]
        first, second = (docker_engine.api.inspect_image(ref) for ref in refs)
    finally:
        for ref in refs:
            docker.remove_image(ref)
    assert made[0].id == made[1].id == first["Id"] == second["Id"]
    assert first["RootFS"]["Layers"] == second["RootFS"]["Layers"] and len(first["RootFS"]["Layers"]) == 1
    assert first["Created"].startswith(lock_day(lock))  # the lock's time, not the time of the bootstrap
    assert first["Config"]["Labels"]["io.hpcbox.base.lock"] == lock.digest


def lock_day(lock: baseimage.BaseLock) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(lock.source_date_epoch, datetime.UTC).strftime("%Y-%m-%d")


def test_a_lock_pinning_a_version_the_mirror_no_longer_serves_stops_in_one_line(
    docker_engine, project_copy: Path, run_id: str
):
    path = project_copy / "docker" / "lock" / baseimage.LOCK_NAME
    lock = baseimage.read_lock(path)
    stale = dataclasses.replace(lock, packages={**lock.packages, "bash": "5.0-1+hpcbox.gone"})
    path.write_text(stale.to_toml())
    repository = f"{run_id}/stalebase"
    with subprocess.Popen(
        [sys.executable, "-m", "invoke", "-r", str(REPO), "base"],
        cwd=project_copy,
        env={**os.environ, "HPCBOX_BASE_REPOSITORY": repository},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as bootstrap:
        stdout, stderr = bootstrap.communicate(timeout=600)
    done = subprocess.CompletedProcess(bootstrap.args, bootstrap.returncode, stdout, stderr)
    assert done.returncode == 1, done.stdout + done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        f"error: the base lock pins bash 5.0-1+hpcbox.gone, but Debian's {lock.suite} mirror has moved on "
        f"(it now serves {lock.packages['bash']})"
    ], done.stderr
    assert "hpcbox lock" in done.stderr and "Traceback" not in done.stderr
    assert docker_engine.images.list(name=repository) == []  # nothing tagged
    # and no bootstrap left on disk (its folder is named after its process)
    assert list(baseimage.scratch_dir().glob(f"{baseimage.WORKDIR_PREFIX}{bootstrap.pid}-*")) == []


def test_a_bootstrap_clears_what_a_killed_bootstrap_left(docker_engine, run_id: str):
    lock = baseimage.read_lock(REPO / "docker" / "lock" / baseimage.LOCK_NAME)
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = baseimage.scratch_dir() / f"{baseimage.WORKDIR_PREFIX}{dead.pid}-{run_id}"
    (left / "rootfs.tar").parent.mkdir()
    (left / "rootfs.tar").write_bytes(bytes(1024))
    alive = baseimage.scratch_dir() / f"{baseimage.WORKDIR_PREFIX}{os.getpid()}-{run_id}"
    alive.mkdir()
    ref = f"{run_id}/debian:cleared"
    try:
        baseimage.ensure_base(lock=lock, ref=ref, force=True, on_line=lambda _: None)
        assert not left.exists()  # its process is gone: removed
        assert alive.exists()  # this process is alive: someone's bootstrap in progress, kept
    finally:
        shutil.rmtree(left, ignore_errors=True)
        shutil.rmtree(alive, ignore_errors=True)
        docker.remove_image(ref)
