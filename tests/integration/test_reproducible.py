"""The same inputs, built twice from nothing, give the same content tag, root filesystem and SIF.

"From nothing" as on another machine: the base is bootstrapped again under the same name, the cpu
environment (what a job's SIF holds: pinned Debian Python and PyTorch) built again without any build
cache, the SIF converted again into an empty cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcbox import baseimage
from hpcbox.config import load_project
from hpcbox.image import ENVIRONMENT, LABEL_SOURCE_DATE_EPOCH, build_image
from hpcbox.sif import build_sif, rootfs_sha256
from hpcbox.tools import docker
from hpcbox.tools.apptainer import Apptainer
from tests.fixtures.images import copy_project

pytestmark = pytest.mark.integration


def _build_from_nothing(project_dir: Path, cache: Path, helper: str) -> dict:
    project = load_project(project_dir)
    lock = baseimage.project_lock(project.root)
    assert lock is not None
    base = baseimage.ensure_base(lock=lock, on_line=lambda _: None)
    assert base.created  # bootstrapped now, not found
    image = build_image(
        project, offline=True, target=ENVIRONMENT, no_cache=True, say=lambda _: None, on_line=lambda _: None
    )
    try:
        sif = build_sif(image, cache=cache, say=lambda _: None, on_line=lambda _: None)
        return {
            "base id": base.id,
            "content tag": image.ref,
            "source date": image.labels[LABEL_SOURCE_DATE_EPOCH],
            "rootfs sha256": rootfs_sha256(sif.path, Apptainer("container", helper)),
            "sif sha256": sif.sha256,
        }
    finally:
        docker.remove_image(image.ref)
        docker.remove_image(base.ref)


def test_built_twice_from_nothing_the_tag_rootfs_and_sif_are_identical(
    docker_engine, apptainer_helper, run_id: str, tmp_path: Path, monkeypatch
):
    project_dir = tmp_path / "project"
    copy_project(project_dir)
    monkeypatch.setenv("HPCBOX_BASE_REPOSITORY", f"{run_id}/repro-base")
    monkeypatch.setenv("HPCBOX_IMAGE_REPOSITORY", f"{run_id}/repro")
    first = _build_from_nothing(project_dir, tmp_path / "cache-1", apptainer_helper)
    second = _build_from_nothing(project_dir, tmp_path / "cache-2", apptainer_helper)
    assert first == second
    print(f"\nbuilt twice from nothing: {first}")
