"""The same inputs, built again from nothing elsewhere, give the same content tag, root filesystem and SIF.

The session's cpu environment image and its SIF (what a job ships: Debian's Python and PyTorch on the
pinned base), however this machine came by them (built now, or kept from an earlier run), against a
rebuild "from nothing" as on another machine: the base bootstrapped again under another name, the
image built without any build cache under another name and behind a TLS-inspecting proxy (a host CA
bundle, used by every step that downloads, must leave no byte in a layer and change nothing), the SIF
converted into an empty cache.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcbox.build import baseimage, offlock
from hpcbox.build.image import ENVIRONMENT, LABEL_BASE_DIGEST, LABEL_CONTENT, build_image
from hpcbox.build.provenance import inputs_revision
from hpcbox.project.config import load_project
from hpcbox.render.profiles import load_profile
from hpcbox.sif.convert import build_sif, rootfs_sha256
from hpcbox.sif.verify import environment_digests, read_digests
from hpcbox.tools import docker
from hpcbox.tools.apptainer import Apptainer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _quiet(_line: str) -> None:
    pass


def test_rebuilt_from_nothing_elsewhere_the_tag_rootfs_and_sif_are_identical(
    docker_engine,
    apptainer_helper,
    environment_image,
    trainer_sif,
    session_project: Path,
    run_id,
    tmp_path,
    monkeypatch,
):
    monkeypatch.setenv("HPCBOX_BASE_REPOSITORY", f"{run_id}/elsewhere-debian")
    monkeypatch.setenv("HPCBOX_IMAGE_REPOSITORY", f"{run_id}/elsewhere")
    project = load_project(session_project)
    lock = baseimage.project_lock(project.root)
    assert lock is not None
    marker = os.urandom(48).hex()
    ca_bundle = tmp_path / "proxy-ca.pem"
    ca_bundle.write_text(f"-----BEGIN CERTIFICATE-----\n{marker}\n-----END CERTIFICATE-----\n")
    log: list[str] = []
    base = baseimage.ensure_base(lock=lock, on_line=_quiet)
    try:
        assert base.created  # bootstrapped now, not found
        image = build_image(
            project,
            offline=True,
            target=ENVIRONMENT,
            no_cache=True,
            ca_bundle=ca_bundle,
            say=_quiet,
            on_line=log.append,
        )
        try:
            size = ca_bundle.stat().st_size
            assert any(f"host CA bundle mounted for this step ({size} bytes)" in line for line in log)
            assert _bytes_scanned_without(marker.encode(), docker.save(image.ref)) > 100_000_000
            sif = build_sif(
                image,
                compression=load_profile("local").apptainer.compression,
                cache=tmp_path / "sif",
                say=_quiet,
                on_line=_quiet,
            )
        finally:
            docker.remove_image(image.ref)
    finally:
        docker.remove_image(base.ref)
    helper = Apptainer("container", apptainer_helper)
    here = {
        "base id": environment_image.labels[LABEL_BASE_DIGEST],
        "content hash": environment_image.labels[LABEL_CONTENT],
        "rootfs sha256": rootfs_sha256(trainer_sif.path, helper),
        "sif sha256": trainer_sif.sha256,
    }
    elsewhere = {
        "base id": base.id,
        "content hash": image.labels[LABEL_CONTENT],
        "rootfs sha256": rootfs_sha256(sif.path, helper),
        "sif sha256": sif.sha256,
    }
    assert image.ref != environment_image.ref  # two builds, named apart
    assert elsewhere == here
    print(f"\nbuilt here and again from nothing: {here}")


def _bytes_scanned_without(needle: bytes, chunks) -> int:
    """Scans a stream for ``needle``, across chunk boundaries too; how many bytes it held."""
    tail = b""
    scanned = 0
    for chunk in chunks:
        assert needle not in tail + chunk
        tail = chunk[-len(needle) :]
        scanned += len(chunk)
    return scanned


def test_the_committed_environment_builds_to_the_recorded_digests(
    docker_engine, apptainer_helper, run_id, tmp_path, monkeypatch
):
    """digests.toml was recorded on another machine on another day: this clone builds the same bytes.
    Where Debian has moved on since (off-lock) it fails naming the moved pins, unless HPCBOX_ALLOW_DRIFT=1
    (which `invoke test` sets, so the README's command passes on any day; CI's weekly run does not): an
    off-lock build is held against no record, whichever commit last changed docker/ (.ci/moved-pins's own)."""
    recorded = read_digests(REPO)
    project = load_project(REPO)
    monkeypatch.setenv("HPCBOX_IMAGE_REPOSITORY", f"{run_id}/recorded")
    here = environment_digests(project, recorded.compression, tmp_path / "sif", say=_quiet, on_line=_quiet)
    if here.off_lock:
        moved = offlock.parse(here.off_lock)
        assert moved and all(pin.locked != pin.served for pin in moved)
        if os.environ.get("HPCBOX_ALLOW_DRIFT") != "1":
            pytest.fail(
                f"Debian has moved past pins of docker/'s locks ({here.off_lock}), so this build is not held "
                "against digests.toml: run `invoke lock` and `invoke lock --record` and commit, or set "
                "HPCBOX_ALLOW_DRIFT=1 to let this test pass off-lock"
            )
        print(f"\noff-lock, allowed by HPCBOX_ALLOW_DRIFT=1, not held against digests.toml: {here.off_lock}")
    else:
        inputs = inputs_revision(REPO, (project.docker_dir, project.dockerfile))
        assert inputs == recorded.revision, (
            f"docker/ was last changed in {inputs}, but digests.toml records {recorded.revision}: "
            "commit, then `invoke lock --record`"
        )
        assert recorded.differences(here) == []
        print(f"\nthe recorded digests, built here: {here}")
