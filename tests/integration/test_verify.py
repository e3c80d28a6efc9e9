"""`invoke verify` against a real engine, Apptainer and git: a small project of its own (a git repository
made here, on the repository's pinned Debian base), built and converted, then rebuilt from its commit.

The full-size case (this repository's cpu environment rebuilt from nothing) is test_reproducible's.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hpcbox.build import offlock
from hpcbox.build.image import ENVIRONMENT, LABEL_REVISION, build_image
from hpcbox.project.config import load_project
from hpcbox.sif.compression import parse_compression
from hpcbox.sif.convert import build_sif
from hpcbox.sif.verify import DIGESTS_FILE, Digests
from hpcbox.tools import docker
from hpcbox.tools.apptainer import Apptainer
from tests.fixtures.git import git

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE} AS environment
ARG SOURCE_DATE_EPOCH
RUN echo hello > /hello.txt && mkdir -p /opt/tiny
FROM environment AS runtime
COPY code/src /opt/tiny/src
"""
# Fixed dates too (tests/fixtures/git.py): each test's `tiny` is then the same commit, which the image
# an earlier test built (and a later one reuses, its content being the same) names as its revision.


def _quiet(_line: str) -> None:
    pass


@pytest.fixture
def tiny(tmp_path: Path, run_id: str, monkeypatch, docker_engine) -> Path:
    """A committed project: a Dockerfile with the two targets hpcbox builds, this repository's locks."""
    root = tmp_path / "tiny"
    (root / "docker").mkdir(parents=True)
    shutil.copytree(REPO / "docker" / "lock", root / "docker" / "lock")
    (root / "docker" / "Dockerfile").write_text(DOCKERFILE)
    (root / "src").mkdir()
    (root / "src" / "train.py").write_text("print('tiny')\n")
    (root / "pyproject.toml").write_text('[project]\nname = "tiny"\n\n[tool.hpcbox]\ncode = ["src"]\n')
    git(root, "init", "--quiet")
    git(root, "add", ".")
    git(root, "commit", "--quiet", "-m", "tiny project")
    monkeypatch.setenv("HPCBOX_IMAGE_REPOSITORY", f"{run_id}/tiny")
    monkeypatch.chdir(root)
    return root


def _verify(root: Path, artifact: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "invoke", "--search-root", str(REPO), "verify", "--artifact", artifact],
        cwd=root,
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        timeout=600,
    )


def _verdict(done: subprocess.CompletedProcess, off_lock: str) -> list[str]:
    """verify's lines after the one an off-lock artifact gets first, which is there exactly when the
    artifact's label says Debian had moved past pins of its locks (on a day it has, or under
    .ci/moved-pins)."""
    lines = done.stdout.splitlines()
    if off_lock:
        assert lines[0].startswith("off-lock: ") and f"({off_lock})" in lines[0], done.stdout
        return lines[1:]
    assert not lines[0].startswith("off-lock: "), done.stdout
    return lines


def test_a_sif_and_an_image_built_from_a_commit_verify_identical_and_a_changed_file_is_named(tiny, tmp_path):
    project = load_project(tiny)
    image = build_image(project, flavour="cpu", offline=True, say=_quiet, on_line=_quiet)
    compression = parse_compression("zstd:3", "--compression")
    sif = build_sif(image, compression=compression, cache=tmp_path / "sif", say=_quiet, on_line=_quiet)
    head = subprocess.run(["git", "-C", str(tiny), "rev-parse", "HEAD"], capture_output=True, text=True)

    done = _verify(tiny, str(sif.path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert _verdict(done, sif.off_lock)[0].startswith(
        f"identical: {sif.path} is what commit {head.stdout[:12]} builds"
    )
    assert sif.sha256 in done.stdout

    done = _verify(tiny, image.ref)
    assert done.returncode == 0, done.stdout + done.stderr
    image_off_lock = docker.image(image.ref).labels.get(offlock.LABEL, "")
    assert _verdict(done, image_off_lock)[0].startswith(f"identical: {image.ref} is what commit")

    # The same image with one file's content changed (same size) and one file added; its config (labels,
    # command) unchanged: a container created with another command would commit that command too.
    container = docker.client().containers.create(image.id)
    try:
        container.put_archive("/", _tar({"hello.txt": b"HELLO\n", "added.txt": b"new\n"}))
        tampered = container.commit(repository=f"{image.ref.split(':')[0]}-tampered", tag="1")
    finally:
        container.remove(force=True)
    try:
        changed = build_sif(
            SimpleNamespace(ref=tampered.tags[0]),
            compression=compression,
            cache=tmp_path / "tampered",
            say=_quiet,
            on_line=_quiet,
        )
        done = _verify(tiny, str(changed.path))
    finally:
        docker.remove_image(tampered.tags[0])
    assert done.returncode == 1, done.stdout + done.stderr
    lines = _verdict(done, changed.off_lock)
    assert lines[0].startswith(f"differs: {changed.path} is not what commit {head.stdout[:12]} builds")
    assert "  /added.txt: only in the artifact" in lines
    assert "  /hello.txt: content" in lines
    assert len(lines) == 3, done.stdout  # nothing else differs


def test_a_commit_to_the_readme_alone_leaves_the_environment_sif_byte_identical(
    tiny, tmp_path, apptainer_helper, request
):
    """The cluster's SIF records the last commit of docker/, not the tree's: after a commit that touches
    only the README, the environment image rebuilt from nothing (removed, no build cache: a teammate's
    fresh machine) and converted again is the very same file, and verify rebuilds it from that commit."""
    compression = parse_compression("zstd:3", "--compression")
    helper = Apptainer("container", apptainer_helper)
    first = git(tiny, "rev-parse", "HEAD")
    image = build_image(
        load_project(tiny), flavour="cpu", offline=True, target=ENVIRONMENT, say=_quiet, on_line=_quiet
    )
    try:
        before = build_sif(
            image, compression=compression, cache=tmp_path / "before", say=_quiet, on_line=_quiet
        )
    finally:
        docker.remove_image(image.ref)
    assert helper.inspect(before.path)["labels"][LABEL_REVISION] == first

    (tiny / "README.md").write_text("# tiny\n\nHow to train it.\n")
    git(tiny, "add", "README.md")
    git(tiny, "commit", "--quiet", "-m", "README only")
    assert (
        git(tiny, "rev-parse", "HEAD") != first
    )  # where the whole tree's revision would have moved the label
    assert docker.image(image.ref) is None
    again = build_image(
        load_project(tiny),
        flavour="cpu",
        offline=True,
        target=ENVIRONMENT,
        no_cache=True,
        say=_quiet,
        on_line=_quiet,
    )
    try:
        assert again.built and again.ref == image.ref
        after = build_sif(
            again, compression=compression, cache=tmp_path / "after", say=_quiet, on_line=_quiet
        )
    finally:
        docker.remove_image(again.ref)
    assert helper.inspect(after.path)["labels"][LABEL_REVISION] == first
    assert after.sha256 == before.sha256

    done = _verify(tiny, str(after.path))
    assert done.returncode == 0, done.stdout + done.stderr
    identical = f"identical: {after.path} is what commit {first[:12]} builds"
    assert _verdict(done, after.off_lock)[0].startswith(identical), done.stdout
    assert "recorded:" not in done.stdout  # tiny records no digests

    # Recorded (as `lock --record` writes them, from this build), verify says the SIF is those bytes; a
    # digests.toml naming other bytes for the same commit is said too, and the rebuild still decides.
    recorded = Digests(first, "cpu", "zstd:3", image.id, image.content_hash, "0" * 64, after.sha256,
                       after.size, "converter")  # fmt: skip
    (tiny / DIGESTS_FILE).write_text(recorded.to_toml("2026-11-27"))
    request.addfinalizer(lambda: (tiny / DIGESTS_FILE).unlink(missing_ok=True))
    done = _verify(tiny, str(after.path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == (
        f"recorded: it is the cpu environment digests.toml records (sif_sha256 {after.sha256})"
    ), done.stdout
    other = dataclasses.replace(recorded, sif_sha256="f" * 64)
    (tiny / DIGESTS_FILE).write_text(other.to_toml("2026-11-27"))
    done = _verify(tiny, str(after.path))
    assert done.returncode == 0, done.stdout + done.stderr
    differs = "recorded: it is not the cpu environment digests.toml records: sif_sha256"
    assert done.stdout.splitlines()[-1].startswith(f"{differs} {after.sha256} != {'f' * 64}"), done.stdout


def test_a_sif_from_another_converter_says_so_before_the_files(
    tiny, tmp_path, helper_without_libdeflate, monkeypatch
):
    """A gzip SIF made by a helper without zlib-libdeflate.so (an older hpcbox's, or one of one's own):
    the rebuild's bytes differ for that reason, and its label with them; verify names the converters
    first, so the label is not taken for the cause."""
    image = build_image(load_project(tiny), flavour="cpu", offline=True, say=_quiet, on_line=_quiet)
    with monkeypatch.context() as patch:
        patch.setenv("HPCBOX_APPTAINER_HELPER", helper_without_libdeflate)
        gzip = parse_compression("gzip:1", "--compression")
        by_zlib = build_sif(image, compression=gzip, cache=tmp_path / "sif", say=_quiet, on_line=_quiet)
    done = _verify(tiny, str(by_zlib.path))
    assert done.returncode == 1, done.stdout + done.stderr
    lines = _verdict(done, by_zlib.off_lock)
    converter = r"apptainer version \S+; mksquashfs version \S+ \(\S+\)"
    assert re.fullmatch(
        rf"  converted by {converter}; this hpcbox converts with {converter}; gzip by libdeflate \S+",
        lines[1],
    ), done.stdout
    # Beyond the converter, only where its name is written: the definition and the labels.
    assert lines[2:] == [
        "  SIF object 'Def.FILE' differs",
        "  /.singularity.d/Singularity: size, content",
        "  /.singularity.d/labels.json: size, content",
    ], done.stdout


def test_sources_that_do_not_hash_to_the_recorded_content_are_refused_before_building(tiny, tmp_path):
    project = load_project(tiny)
    image = build_image(project, flavour="cpu", offline=True, say=_quiet, on_line=_quiet)
    # The image now claims a commit whose Dockerfile says something else.
    (tiny / "docker" / "Dockerfile").write_text(DOCKERFILE.replace("hello", "hi"))
    git(tiny, "commit", "--quiet", "-am", "another Dockerfile")
    container = docker.client().containers.create(image.id, command=["true"])
    head = subprocess.run(["git", "-C", str(tiny), "rev-parse", "HEAD"], capture_output=True, text=True)
    try:
        relabelled = container.commit(
            repository=f"{image.ref.split(':')[0]}-relabelled",
            tag="1",
            conf={"Labels": {**image.labels, "org.opencontainers.image.revision": head.stdout.strip()}},
        )
    finally:
        container.remove(force=True)
    try:
        done = _verify(tiny, relabelled.tags[0])
    finally:
        docker.remove_image(relabelled.tags[0])
    assert done.returncode == 1
    assert done.stderr.splitlines()[-2].startswith(
        f"error: commit {head.stdout[:12]}'s sources do not hash to the recorded content hash"
    ), done.stderr
    # The engine's own listing: images.list inspects each image, and another test may remove one between.
    tags = [tag for found in docker.client().api.images() for tag in found["RepoTags"] or ()]
    assert not [tag for tag in tags if "-verify-" in tag]


@pytest.mark.parametrize(
    ("artifact", "message"),
    [
        ("missing.sif", "error: no SIF at missing.sif"),
        ("hpcbox-nothing/here:1", "error: no image hpcbox-nothing/here:1 in the Docker engine"),
    ],
)
def test_bad_artifacts_are_one_line(tiny, artifact, message):
    done = _verify(tiny, artifact)
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == message


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            # A time after the build's: the SIF clamps it to the source date as it does the original's.
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()
