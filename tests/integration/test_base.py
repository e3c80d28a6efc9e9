"""The bootstrapped Debian base: the same lock gives the same image; a stale lock gives an off-lock one,
or nothing under --strict-lock."""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcbox.build import baseimage, offlock
from hpcbox.build.lock import candidate_versions
from hpcbox.errors import HpcboxError
from hpcbox.tools import docker
from tests.fixtures.debian import base_lock_served_today, project_served_today

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# A Debian mirror that is not there (nothing listens on the discard port): its bootstrap fails at once.
NO_MIRROR = "http://127.0.0.1:9/debian"
SNAPSHOT = "20261123T100000Z"


def test_the_base_bootstrapped_twice_from_one_lock_is_the_same_image_whichever_archive_served_it(
    docker_engine, run_id: str, snapshot_archive
):
    """Once from Debian's mirror; once where that mirror cannot serve the lock, which then falls back to
    the snapshot archive at the lock's snapshot time (the stand-in)."""
    lock = baseimage.read_lock(REPO / "docker" / "lock" / baseimage.LOCK_NAME)
    refs = [f"{run_id}/debian:first", f"{run_id}/debian:from-snapshot"]
    said: list[str] = []
    first_said: list[str] = []
    try:
        made = [
            baseimage.ensure_base(lock=lock, ref=refs[0], force=True, say=first_said.append),
            baseimage.ensure_base(
                lock=dataclasses.replace(lock, snapshot=SNAPSHOT),
                mirror=NO_MIRROR,
                ref=refs[1],
                force=True,
                on_line=lambda _: None,
                say=said.append,
            ),
        ]
        first, second = (docker_engine.api.inspect_image(ref) for ref in refs)
    finally:
        for ref in refs:
            docker.remove_image(ref)
    assert snapshot_archive.times_asked == {SNAPSHOT}
    # A cold bootstrap says what it does and, where nothing else listens, mmdebstrap's phases as they come.
    assert (
        first_said[0]
        == f"hpcbox: bootstrapping the Debian trixie base image {refs[0]} with mmdebstrap (once)"
    )
    assert any(line.startswith("  downloading packages with apt... (at ") for line in first_said[1:])
    assert len(said) == 2 and said[1].endswith(f"; bootstrapping from the snapshot archive at {SNAPSHOT}")
    # The same bytes wherever the packages came from (the base's sources name Debian's mirror).
    assert made[0].id == made[1].id == first["Id"] == second["Id"]
    assert first["RootFS"]["Layers"] == second["RootFS"]["Layers"] and len(first["RootFS"]["Layers"]) == 1
    assert first["Created"].startswith(lock_day(lock))  # the lock's time, not the time of the bootstrap
    assert first["Config"]["Labels"]["io.hpcbox.base.lock"] == lock.digest


def lock_day(lock: baseimage.BaseLock) -> str:
    return datetime.datetime.fromtimestamp(lock.source_date_epoch, datetime.UTC).strftime("%Y-%m-%d")


def test_a_lock_pinning_a_version_the_mirror_no_longer_serves_makes_an_off_lock_base_saying_so(
    docker_engine, project_copy: Path, run_id: str
):
    project_served_today(project_copy)  # so that bash is the only pin moved, on any day
    path = project_copy / "docker" / "lock" / baseimage.LOCK_NAME
    lock = baseimage.read_lock(path)
    stale = dataclasses.replace(lock, packages={**lock.packages, "bash": "5.0-1+hpcbox.gone"})
    path.write_text(stale.to_toml())
    repository = f"{run_id}/stalebase"
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "-r", str(REPO), "base"],
        cwd=project_copy,
        env={**os.environ, "HPCBOX_BASE_REPOSITORY": repository},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    moved = r"bash 5\.0-1\+hpcbox\.gone -> (\S+) \(docker/lock/base\.toml\)"
    said = [line for line in done.stdout.splitlines() if line.startswith("hpcbox: Debian moved on: ")]
    assert len(said) == 1, done.stdout
    served = re.fullmatch(
        f"hpcbox: Debian moved on: {moved}; this build is off-lock: run hpcbox lock", said[0]
    )
    assert served is not None and served[1] != "none", said
    made = docker_engine.images.get(
        baseimage.base_ref(lock=stale).replace(baseimage.BASE_REPOSITORY, repository)
    )
    assert re.fullmatch(moved, made.labels[offlock.LABEL])


def test_a_version_neither_the_mirror_nor_the_snapshot_serves_is_refused_under_strict_lock_leaving_nothing(
    docker_engine, run_id: str, snapshot_archive
):
    # served today, so that bash is the only pin moved, on any day
    lock = base_lock_served_today(baseimage.read_lock(REPO / "docker" / "lock" / baseimage.LOCK_NAME))
    stale = dataclasses.replace(
        lock, packages={**lock.packages, "bash": "5.0-1+hpcbox.gone"}, snapshot=SNAPSHOT
    )
    ref = f"{run_id}/debian:stale-snapshot"
    pid = os.getpid()
    with pytest.raises(HpcboxError) as refused:
        baseimage.ensure_base(
            lock=stale, mirror=NO_MIRROR, ref=ref, force=True, strict=True, on_line=lambda _: None, say=print
        )
    assert re.fullmatch(
        r"Debian moved on: bash 5\.0-1\+hpcbox\.gone -> \S+ \(docker/lock/base\.toml\); "
        r"--strict-lock refuses an off-lock base image",
        refused.value.message,
    ), refused.value.message
    assert snapshot_archive.times_asked == {SNAPSHOT}  # the snapshot was tried first
    assert docker.image(ref) is None
    assert list(baseimage.scratch_dir().glob(f"{baseimage.WORKDIR_PREFIX}{pid}-*")) == []


def test_an_unreachable_snapshot_archive_is_named_in_the_one_line(docker_engine, run_id: str, monkeypatch):
    monkeypatch.setenv("HPCBOX_SNAPSHOT_URL", "http://127.0.0.1:9")
    lock = baseimage.read_lock(REPO / "docker" / "lock" / baseimage.LOCK_NAME)
    ref = f"{run_id}/debian:no-snapshot"
    with pytest.raises(HpcboxError) as refused:
        baseimage.ensure_base(
            lock=dataclasses.replace(lock, snapshot=SNAPSHOT), mirror=NO_MIRROR, ref=ref, force=True
        )
    message = refused.value.message
    assert message.startswith("failed to bootstrap Debian trixie with mmdebstrap: "), message
    assert (
        f", and the snapshot archive it was locked from cannot be reached "
        f"(http://127.0.0.1:9/archive/debian/{SNAPSHOT}/dists/trixie/Release: " in message
    )
    assert "\n" not in message and "snapshot.debian.org" in refused.value.hint
    assert docker.image(ref) is None


def test_a_lock_made_where_the_snapshot_archive_answers_is_resolved_from_it_and_records_its_time(
    docker_engine, run_id: str, snapshot_archive, monkeypatch
):
    monkeypatch.setenv("HPCBOX_BASE_REPOSITORY", f"{run_id}/relocked")
    said: list[str] = []
    lock, made = baseimage.relock("trixie", on_line=lambda _: None, say=said.append)
    installed = docker.run_once(
        made.ref, ["dpkg-query", "-W", "-f", "${Package}=${Version}\n"], what="list the relocked base"
    )
    docker.remove_image(made.ref)
    assert lock.snapshot is not None and snapshot_archive.times_asked == {lock.snapshot}
    stamp = datetime.datetime.strptime(lock.snapshot, baseimage.SNAPSHOT_TIME_FORMAT).replace(
        tzinfo=datetime.UTC
    )
    assert stamp.timestamp() == lock.source_date_epoch  # the moment of locking
    assert said == []  # nothing to warn about
    # Exactly what the bootstrap installed, from the image itself: the committed lock is no measure, since
    # Debian moves its package versions (and now and then its minbase's list) on.
    assert lock.packages == dict(line.split("=", 1) for line in installed.splitlines())


def test_apt_pins_resolve_from_the_locks_snapshot(docker_engine, snapshot_archive):
    lock = baseimage.read_lock(REPO / "docker" / "lock" / baseimage.LOCK_NAME)
    base = baseimage.ensure_base(lock=lock)
    from_mirror = candidate_versions(base.ref, ("hello", "zstd"))
    from_snapshot = candidate_versions(base.ref, ("hello", "zstd"), baseimage.snapshot_mirror(SNAPSHOT))
    assert snapshot_archive.times_asked == {SNAPSHOT}
    assert from_snapshot == from_mirror  # the stand-in serves today's archive at every time


def test_a_bootstrap_clears_what_a_killed_bootstrap_left_and_a_failed_one_leaves_nothing(
    docker_engine, run_id: str
):
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
        # The clearing comes first, so a bootstrap that then fails at once (no mirror there) shows it.
        with pytest.raises(HpcboxError, match=r"^failed to bootstrap Debian trixie with mmdebstrap"):
            baseimage.ensure_base(lock=lock, mirror=NO_MIRROR, ref=ref, force=True, on_line=lambda _: None)
        assert not left.exists()  # its process is gone: removed
        assert alive.exists()  # this process is alive: someone's bootstrap in progress, kept
        mine = set(baseimage.scratch_dir().glob(f"{baseimage.WORKDIR_PREFIX}{os.getpid()}-*"))
        assert mine == {alive}  # the failed bootstrap's own folder is gone
        assert docker.image(ref) is None
    finally:
        shutil.rmtree(left, ignore_errors=True)
        shutil.rmtree(alive, ignore_errors=True)
        docker.remove_image(ref)
