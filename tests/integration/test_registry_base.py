"""The registry base pinned by digest, against a real registry: Debian's docker-registry (the CNCF
distribution registry) in a container of its own on the pinned base, reached by the real engine."""

from __future__ import annotations

import io
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbox.build.image import REGISTRY_BASE_LOCK, plan_build, registry_base_lock
from hpcbox.build.lock import refresh_registry_base
from hpcbox.project.config import load_project
from hpcbox.tools import docker
from tests.fixtures.cluster import free_port
from tests.fixtures.debian import pinned_base
from tests.fixtures.images import build_dockerfile

REPO = Path(__file__).resolve().parents[2]
REGISTRY_DOCKERFILE = """\
ARG BASE
FROM ${BASE}
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends docker-registry \\
 && rm -rf /var/lib/apt/lists/*
# Debian's own config asks for htpasswd logins; a throwaway test registry needs none.
RUN printf '%s\\n' 'version: 0.1' 'storage:' '  filesystem:' '    rootdirectory: /var/lib/docker-registry' \\
    'http:' '  addr: :5000' > /etc/docker/registry/test.yml
CMD ["docker-registry", "serve", "/etc/docker/registry/test.yml"]
"""


@pytest.fixture(scope="module")
def registry(docker_engine, run_id, tmp_path_factory) -> Iterator[str]:
    """host:port of a running registry (HTTP on 127.0.0.1, which Docker allows without TLS)."""
    image = f"{run_id}/registry:1"
    build_dockerfile(REGISTRY_DOCKERFILE, image, tmp_path_factory.mktemp("registry"), pinned_base())
    port = free_port()
    container = docker_engine.containers.run(
        image, detach=True, name=f"{run_id}-registry", ports={"5000/tcp": ("127.0.0.1", port)}
    )
    try:
        _wait_for_registry(f"http://127.0.0.1:{port}/v2/")
        yield f"127.0.0.1:{port}"
    finally:
        container.remove(force=True, v=True)


def _wait_for_registry(url: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def _image_of_its_own(small_image, marker: str) -> str:
    """A new image (the small image plus one file), so that nothing else here holds its digest."""
    container = docker.client().containers.create(small_image.ref)
    try:
        container.put_archive("/", _one_file(marker))
        return container.commit().id
    finally:
        container.remove(force=True)


def test_builds_start_from_the_locked_digest_whatever_the_tag_points_to_later(
    registry, project_copy, small_image, run_id
):
    tag = f"{registry}/{run_id}/debian:trixie-slim"
    repository = tag.rpartition(":")[0]
    first = _image_of_its_own(small_image, "first")
    lock = project_copy / "docker" / REGISTRY_BASE_LOCK
    lock.write_text(f'tag = "{tag}"\ndigest = "sha256:{"0" * 64}"\n')
    pulled = None
    try:
        docker.tag(first, tag)
        docker.push(tag)
        assert refresh_registry_base(load_project(project_copy), say=lambda _: None) == lock
        pinned = registry_base_lock(load_project(project_copy))
        assert pinned is not None and pinned.tag == tag
        assert f"{repository}@{pinned.digest}" in docker.image(first).digests

        # The tag moves to another image, and the first is gone from this engine.
        docker.tag(small_image.ref, tag)
        docker.push(tag)
        docker.remove_image(first)
        assert docker.image(first) is None

        plan = plan_build(load_project(project_copy), flavour="cpu", say=lambda _: None)
        pulled = plan.base_id
        assert plan.base == f"{repository}@{pinned.digest}"
        assert plan.base_id == first  # pulled back by digest: the very image that was locked
        assert lock.read_text() == pinned.to_toml()

        # Re-locking follows the tag to where it is now.
        assert refresh_registry_base(load_project(project_copy), say=lambda _: None) == lock
        moved = registry_base_lock(load_project(project_copy))
        assert moved is not None and moved.digest != pinned.digest
        assert f"{repository}@{moved.digest}" in docker.image(small_image.ref).digests
    finally:
        docker.remove_image(tag)
        for leftover in (first, pulled):
            if leftover:
                docker.remove_image(leftover)


def test_no_registry_leaves_the_lock_as_it_is(docker_engine, project_copy):
    lock = project_copy / "docker" / REGISTRY_BASE_LOCK
    text = f'tag = "127.0.0.1:{free_port()}/debian:trixie-slim"\ndigest = "sha256:{"1" * 64}"\n'
    lock.write_text(text)
    said = []
    assert refresh_registry_base(load_project(project_copy), say=said.append) is None
    assert lock.read_text() == text
    assert said[0].startswith("hpcbox: no registry reachable to pull 127.0.0.1:")


def _one_file(text: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = text.encode()
        info = tarfile.TarInfo("marker.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
