"""The build stage's decisions that need no engine: context, hashes, flavours."""

from __future__ import annotations

import shutil
import tarfile
from io import BytesIO
from pathlib import Path

import pytest

from hpcbox.build import image as image_stage
from hpcbox.errors import HpcboxError
from hpcbox.project.config import load_project

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path: Path):
    for name in ("pyproject.toml", "docker", "src/hpctrain"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name)
        else:
            shutil.copy2(source, tmp_path / name)
    return load_project(tmp_path)


def members(context: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=BytesIO(context)) as tar:
        return tar.getmembers()


def test_context_is_reproducible_and_holds_only_image_inputs(project):
    first, second = image_stage.build_context(project), image_stage.build_context(project)
    assert first == second
    names = [member.name for member in members(first)]
    assert names == sorted(names)
    assert "docker/Dockerfile" in names
    # the code under the name the job and `python -m` know it by: src/hpctrain is code/hpctrain
    assert "code/hpctrain/__init__.py" in names
    assert not any(name.startswith(("tests/", "src/")) or "__pycache__" in name for name in names)
    assert {(member.mtime, member.uid, member.gid) for member in members(first)} == {(0, 0, 0)}


def test_context_ignores_bytecode_but_sees_code_changes(project):
    before = image_stage.build_context(project)
    package = project.root / "src/hpctrain"
    (package / "__pycache__").mkdir(exist_ok=True)
    (package / "__pycache__" / "x.cpython-313.pyc").write_bytes(b"\0")
    assert image_stage.build_context(project) == before
    (package / "__init__.py").write_text((package / "__init__.py").read_text() + "\n")
    assert image_stage.build_context(project) != before


def test_lock_hash_follows_the_flavours_locks(project):
    cpu, cuda = image_stage.FLAVOURS["cpu"], image_stage.FLAVOURS["cuda"]
    before = image_stage.lock_hash(project, cpu)
    assert before != image_stage.lock_hash(project, cuda)
    cuda_lock = project.root / "docker/lock/cuda-requirements.txt"
    cuda_lock.write_text(cuda_lock.read_text() + "\n")
    assert image_stage.lock_hash(project, cpu) == before
    (project.root / "docker/lock/apt-cpu.txt").write_text("python3-torch=0\n")
    assert image_stage.lock_hash(project, cpu) != before


def test_lock_hash_takes_in_the_build_tools_of_a_lock_that_builds_from_source(project):
    cpu, cuda = image_stage.FLAVOURS["cpu"], image_stage.FLAVOURS["cuda"]
    before = {flavour: image_stage.lock_hash(project, flavour) for flavour in (cpu, cuda)}
    constraints = project.root / "docker/lock/cpu-build-constraints.txt"
    constraints.write_text("setuptools==80.9.0\n")
    assert image_stage.lock_hash(project, cpu) != before[cpu]
    assert image_stage.lock_hash(project, cuda) == before[cuda]  # not the cuda lock's
    constraints.unlink()  # a lock with no such file hashes as it always did
    assert image_stage.lock_hash(project, cpu) == before[cpu]


def test_missing_lock_is_reported_with_its_path(project):
    (project.root / "docker/lock/apt-cpu.txt").unlink()
    with pytest.raises(HpcboxError, match=r"lock file docker/lock/apt-cpu.txt is missing"):
        image_stage.lock_hash(project, image_stage.FLAVOURS["cpu"])


def test_flavour_defaults_and_unknown_flavour():
    assert image_stage.resolve_flavour(None, offline=False).name == "cuda"
    assert image_stage.resolve_flavour(None, offline=True).name == "cpu"
    assert image_stage.resolve_flavour("cuda", offline=True).name == "cuda"
    with pytest.raises(HpcboxError, match=r"unknown flavour 'rocm'.*choose one of: cpu, cuda"):
        image_stage.resolve_flavour("rocm", offline=False)


@pytest.fixture
def answering_index():
    """A real HTTP server on this machine standing in for the package index: it answers."""
    import http.server
    import threading

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def closed_index() -> str:
    import socket

    with socket.socket() as probe:  # a port nothing listens on once this closes
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/"


def test_without_a_registry_the_default_flavour_stays_cuda_where_the_index_answers(answering_index):
    assert image_stage.flavour_without_registry(None, index=answering_index).name == "cuda"


def test_without_a_registry_or_an_index_the_default_falls_back_to_cpu():
    assert image_stage.index_reachable(closed_index()) is False
    assert image_stage.flavour_without_registry(None, index=closed_index()).name == "cpu"


def test_a_flavour_asked_for_is_kept_without_a_registry_whatever_the_index():
    # cuda asked for with no index fails in pip's own words at the build; cpu never needs the index.
    assert image_stage.flavour_without_registry("cuda", index=closed_index()).name == "cuda"
    assert image_stage.flavour_without_registry("cpu", index=closed_index()).name == "cpu"


def test_cuda_lock_is_fully_hashed():
    lock = (REPO / "docker/lock/cuda-requirements.txt").read_text()
    pins = [line for line in lock.splitlines() if line and not line.startswith((" ", "#"))]
    assert pins and all("==" in pin for pin in pins)
    assert lock.count("--hash=sha256:") >= len(pins)


def test_bad_project_name_names_the_field(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text('[tool.hpcbox]\nproject = "My Trainer"\n')
    with pytest.raises(HpcboxError, match=r"^tool.hpcbox.project: 'My Trainer'"):
        load_project(tmp_path)


def test_next_stage_before_any_build_says_to_build_first(project):
    with pytest.raises(HpcboxError, match=r"^the image is not built \(run `hpcbox build` first\)$"):
        image_stage.last_image(project)
    with pytest.raises(HpcboxError, match=r"^the image is not built for flavour cuda"):
        image_stage.last_image(project, "cuda")
    with pytest.raises(HpcboxError, match=r"unknown flavour 'rocm'"):
        image_stage.last_image(project, "rocm")


def test_a_builds_progress_is_one_line_per_step_with_its_time_and_what_steps_say_for_people():
    from hpcbox.tools.docker import BuildProgress

    run = (
        "RUN --mount=type=secret,id=host_ca --mount=type=secret,id=apt_mirror     sh "
        "/opt/hpcbox/lock/apt-install.sh /opt/hpcbox/lock/apt-system.txt     && useradd --create-home trainer"
    )
    plain = f"""\
#1 [internal] load remote build context
#1 DONE 0.0s
#4 [system 1/3] FROM docker.io/hpcbox/debian:trixie-aa04c4c80848
#4 DONE 0.0s
#5 [system 2/3] COPY docker/apt-install.sh docker/lock/apt-system.txt /opt/hpcbox/lock/
#6 [system 3/3] {run}
#5 CACHED
#6 0.312 hpcbox: host CA bundle mounted for this step (214 bytes)
#6 1.020 Get:1 http://deb.debian.org/debian trixie InRelease [140 kB]
#6 DONE 6.5s
#15 exporting to image
#15 DONE 5.0s
"""
    said: list[str] = []
    progress = BuildProgress(said.append)
    for line in plain.splitlines():
        progress(line)
    assert said == [
        "  [system 2/3] COPY docker/apt-install.sh docker/lock/apt-system.txt /opt/hpcbox/lock/ (cached)",
        "hpcbox: host CA bundle mounted for this step (214 bytes)",
        "  [system 3/3] RUN sh /opt/hpcbox/lock/apt-install.sh /opt/hpcbox/lock/apt-system.txt && useradd … "
        "(6.5 s)",
    ]
