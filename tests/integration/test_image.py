"""`invoke build` against a real Docker engine: the cpu image built offline, as CI builds it."""

from __future__ import annotations

import base64
import collections
import concurrent.futures
import hashlib
import http.server
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from hpcbox.build import baseimage, offlock
from hpcbox.build import image as image_stage
from hpcbox.build.lock import candidate_versions
from hpcbox.build.provenance import inputs_revision
from hpcbox.errors import HpcboxError
from hpcbox.project.config import load_project
from hpcbox.tools import docker
from tests.fixtures.debian import pinned_base, project_served_today
from tests.fixtures.served import Served, bridge_gateway

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def run_in(image_ref: str, *command: str) -> str:
    done = subprocess.run(["docker", "run", "--rm", image_ref, *command], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_cpu_image_imports_torch_as_non_root_user(trainer_image):
    assert run_in(trainer_image.ref, "python", "-c", "import torch, torchvision; print(torch.__version__)")
    assert run_in(trainer_image.ref, "id", "-u") != "0"
    assert run_in(trainer_image.ref, "python", "-c", "import hpctrain; print(hpctrain.__file__)").startswith(
        "/opt/hpcbox/code/hpctrain/"
    )


def test_labels_record_revision_lock_flavour_and_base(trainer_image):
    labels = docker.image(trainer_image.ref).labels
    project = load_project(REPO)
    # The last commit of what the runtime image is built from (docker/ and the code), not the tree's.
    inputs = (project.docker_dir, project.dockerfile, *project.code)
    assert labels[image_stage.LABEL_REVISION] == inputs_revision(REPO, inputs)
    assert labels[image_stage.LABEL_LOCK] == image_stage.lock_hash(project, image_stage.FLAVOURS["cpu"])
    assert labels[image_stage.LABEL_FLAVOUR] == "cpu"
    assert labels[image_stage.LABEL_BASE_NAME] == trainer_image.base
    assert labels[image_stage.LABEL_BASE_DIGEST] == docker.image(trainer_image.base).id
    assert trainer_image.ref.endswith(":" + labels[image_stage.LABEL_CONTENT][:12])


def test_nothing_changed_is_a_cache_hit_and_code_change_rebuilds_only_the_code_layer(
    trainer_image, project_copy: Path
):
    project = load_project(project_copy)
    first = image_stage.build_image(project, offline=True, say=lambda _: None, on_line=lambda _: None)
    messages: list[str] = []
    again = image_stage.build_image(project, offline=True, say=messages.append, on_line=lambda _: None)
    assert (again.built, again.id, again.ref) == (False, first.id, first.ref)
    # on a day Debian has moved past pins, a line for each that the image was built past comes first
    expected: list[str] = []
    offlock.announce(offlock.from_labels(docker.image(first.ref).labels), expected.append)
    assert messages == [*expected, f"hpcbox: {first.ref} is up to date"]

    # unique per run, so that BuildKit cannot have this code step cached from an earlier run
    init = project_copy / "src/hpctrain/__init__.py"
    init.write_text(init.read_text() + f"\n# a code-only change {os.urandom(8).hex()}\n")
    log: list[str] = []
    changed = image_stage.build_image(project, offline=True, say=lambda _: None, on_line=log.append)
    assert changed.built and changed.ref != first.ref
    # What BuildKit ran rather than took from its cache: the code step and what follows it, nothing
    # else. (Layer digests are no proof: after a --no-cache build the cache holds two equivalent
    # layers for a step, and either may serve it.)
    ran = executed_steps(log)
    assert ran and all(step.startswith("[runtime ") for step in ran), ran
    assert any("COPY code/" in step for step in ran), ran
    assert len(docker.image(first.ref).layers) == len(docker.image(changed.ref).layers)


def test_a_build_beside_another_on_the_same_base_takes_its_steps_from_the_cache(docker_engine, run_id: str):
    """BuildKit joins the FROM of builds running at once on one image name, and where the other build
    holds a base no build had used yet, the joining build gets no cache key for anything after FROM:
    in a full run the trainer image was built twice over (its PyTorch step a minute of CPU each time)
    beside the node images' builds on a just-loaded base. hpcbox's builds name the base their own way
    (`docker.build`'s ``base_arg``), so beside such a build they take every step from the cache."""
    token = os.urandom(4).hex()
    fresh = f"{run_id}/fresh-base:{token}"  # new content on the base: a FROM no build has used yet
    made: list[str] = []  # removed in reverse: the fresh base last

    def build(ref: str, dockerfile: str, base: str) -> list[str]:
        steps: list[str] = []
        context = docker.context_tar({"Dockerfile": dockerfile.encode(), "token": token.encode()})
        progress = docker.BuildProgress(steps.append)
        build_args = {"BASE": base}
        docker.build(context, dockerfile="Dockerfile", tag_ref=ref, build_args=build_args, labels={},
                     secrets={}, base_arg="BASE", on_line=progress)  # fmt: skip
        made.append(ref)
        return steps

    build(fresh, "ARG BASE\nFROM ${BASE}\nCOPY token /etc/fresh-base\n", pinned_base())
    beside = subprocess.Popen(
        [docker.build_cli(), "build", "--progress=plain", "--build-arg", f"BASE={fresh}", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "DOCKER_BUILDKIT": "1"},
    )
    ours = "ARG BASE\nFROM ${BASE}\nCOPY token /token\nRUN cp /token /first\nRUN cp /token /second\n"
    try:
        beside.stdin.write(f"ARG BASE\nFROM ${{BASE}}\nRUN echo beside-{token} && sleep 600\n")
        beside.stdin.close()
        seen: list[str] = []
        for line in beside.stdout:  # until the other build is inside its step, holding the base
            seen.append(line)
            if re.fullmatch(rf"#\d+ [\d.]+ beside-{token}", line.strip()):
                break
        else:
            pytest.fail("the build beside ended before its step began:\n" + "".join(seen[-20:]))
        first = build(f"{run_id}/beside-first:{token}", ours, fresh)
        second = build(f"{run_id}/beside-second:{token}", ours, fresh)
        assert beside.poll() is None  # it held the base through both
    finally:
        beside.kill()
        beside.wait()
        for ref in reversed(made):
            docker.remove_image(ref)
    assert [step.endswith("(cached)") for step in first] == [False] * 3, first
    assert [step.endswith("(cached)") for step in second] == [True] * 3, second


def executed_steps(build_log: list[str]) -> list[str]:
    """Titles of the Dockerfile steps a build executed (not cached), from its progress lines."""
    return [line.strip().rpartition(" (")[0] for line in build_log if re.search(r"\(\d+\.\d s\)$", line)]


def test_failed_build_names_the_step_and_shows_its_last_lines(docker_engine, project_copy: Path):
    dockerfile = project_copy / "docker/Dockerfile"
    dockerfile.write_text(
        dockerfile.read_text().replace(
            "USER trainer", "RUN echo 'about to fail: hpcbox-test' && exit 3\nUSER trainer"
        )
    )
    with pytest.raises(HpcboxError) as failed:
        image_stage.build_image(
            load_project(project_copy), offline=True, say=lambda _: None, on_line=lambda _: None
        )
    assert failed.value.message.startswith("image build failed at step [environment ")
    assert "about to fail: hpcbox-test" in failed.value.details


def invoke(*args: str, cwd: Path = REPO, env: dict | None = None, user: int | None = None):
    argv = [sys.executable, "-m", "invoke", "-r", str(REPO), *args]
    if user is not None:
        # The checkout (and the Python running the tests) may sit under a folder only root may enter,
        # such as a 0700 home: keep the one capability that lets the user read and traverse files
        # anyway. It does not grant write access, so the engine's socket stays as closed to the user
        # as it is to anyone outside the docker group.
        caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *caps, *argv]
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env={**os.environ, **(env or {})})


def assert_one_line_error(done, *fragments: str) -> None:
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, done.stderr
    for fragment in fragments:
        assert fragment in done.stderr
    assert "Traceback" not in done.stderr


def test_two_builds_at_once_past_a_gone_pin_each_build_off_lock(
    docker_engine, project_copy: Path, snapshot_archive
):
    """The image and its environment asked for at once (one waits for the other's build): the apt step
    fails on the gone pin in each, and each finds the pin and builds off-lock."""
    project_served_today(project_copy)  # so that the pin below is the only one moved, on any day
    lock = project_copy / "docker/lock/apt-system.txt"
    lock.write_text(
        re.sub(r"(?m)^ca-certificates=.*$", "ca-certificates=20250419+hpcbox.gone", lock.read_text())
    )
    project = load_project(project_copy)

    def build(target: str) -> image_stage.Image:
        quiet = lambda _line: None  # noqa: E731
        return image_stage.build_image(project, offline=True, target=target, say=quiet, on_line=quiet)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        built = list(pool.map(build, (image_stage.RUNTIME, image_stage.ENVIRONMENT)))
    for each in built:
        moved = docker_engine.images.get(each.ref).labels[offlock.LABEL]
        assert "ca-certificates 20250419+hpcbox.gone -> " in moved, (each.ref, moved)


def test_a_pinned_debian_version_that_is_gone_builds_off_lock_and_strict_lock_refuses_leaving_nothing(
    docker_engine, project_copy: Path, snapshot_archive
):
    """Debian moving on (a point release replacing a version) is simulated by a pin it never served."""
    project_served_today(project_copy)  # so that the pin below is the only one moved, on any day
    lock = project_copy / "docker/lock/apt-system.txt"
    lock.write_text(
        re.sub(r"(?m)^ca-certificates=.*$", "ca-certificates=20250419+hpcbox.gone", lock.read_text())
    )
    repository = os.environ["HPCBOX_IMAGE_REPOSITORY"]  # project_copy's own
    moved = r"ca-certificates 20250419\+hpcbox\.gone -> [^ ;]+ \(docker/lock/apt-system\.txt\)"
    done = invoke("build", "--offline", "--strict-lock", cwd=project_copy)
    assert_one_line_error(done, "hpcbox lock")
    assert re.search(
        f"(?m)^error: Debian moved on: {moved}; --strict-lock refuses an off-lock image$", done.stderr
    )
    assert "and its lock records no snapshot time" in done.stdout
    assert docker_engine.images.list(name=repository) == []  # nothing built or tagged
    # A lock made where the snapshot archive answered records its time: the build turns to the snapshot
    # first, and says why not where it cannot be reached.
    base_lock = project_copy / "docker/lock/base.toml"
    snapshot = "20261123T100000Z"
    base_lock.write_text(
        base_lock.read_text().replace("\n\n[packages]", f'\nsnapshot = "{snapshot}"\n\n[packages]')
    )
    unreachable = {"HPCBOX_SNAPSHOT_URL": "http://127.0.0.1:9", "HPCBOX_STRICT_LOCK": "1"}
    done = invoke("build", "--offline", cwd=project_copy, env=unreachable)
    assert_one_line_error(done, "--strict-lock refuses an off-lock image")
    assert (
        "docker/lock/apt-system.txt, and the snapshot archive cannot be reached "
        f"(http://127.0.0.1:9/archive/debian/{snapshot}/dists/trixie/Release: " in done.stdout
    )
    assert docker_engine.images.list(name=repository) == []
    # Where it can be reached but lacks the version too, the image is built off-lock: with what Debian
    # serves, one line per moved pin, and the pins in its label.
    done = invoke("build", "--offline", cwd=project_copy)  # HPCBOX_SNAPSHOT_URL: the stand-in
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        f"hpcbox: packages from {snapshot_archive.url}/archive/debian/{snapshot}" in done.stdout + done.stderr
    )
    assert f"hpcbox: the snapshot archive at {snapshot} does not serve ca-certificates" in done.stdout
    line = f"hpcbox: Debian moved on: {moved}; this build is off-lock: run hpcbox lock"
    assert len([each for each in done.stdout.splitlines() if re.fullmatch(line, each)]) == 1, done.stdout
    ref = done.stdout.strip().splitlines()[-1]
    labels = docker_engine.images.get(ref).labels
    assert re.fullmatch(moved, labels[offlock.LABEL]) and labels[offlock.LABEL_OF]
    # The next build finds it (no build, no question to the mirror); --strict-lock refuses it.
    again = invoke("build", "--offline", cwd=project_copy)
    assert again.returncode == 0 and again.stdout.strip().splitlines()[-1] == ref
    assert f"hpcbox: {ref} is up to date" in again.stdout and re.search(line, again.stdout)
    assert_one_line_error(invoke("build", "--offline", "--strict-lock", cwd=project_copy), "is off-lock")


def test_apt_install_reads_the_mirror_it_is_handed_for_its_step_only(
    docker_engine, snapshot_archive, tmp_path
):
    """What the build does once Debian's mirror has dropped a pin: the Dockerfile's apt step, handed the
    snapshot archive as the apt_mirror secret, installs from it and leaves the sources as they were."""

    base = pinned_base()
    mirror_url = baseimage.snapshot_mirror("20261123T100000Z")
    (tmp_path / "apt_mirror").write_text(mirror_url)
    (tmp_path / "apt-test.txt").write_text("# one small package\nhello\n")
    shutil.copy(REPO / "docker/apt-install.sh", tmp_path)
    script = (
        "cp -p /etc/apt/sources.list /tmp/before && sh /in/apt-install.sh /in/apt-test.txt >/tmp/log 2>&1"
        " || { cat /tmp/log; exit 1; }; grep -F 'packages from' /tmp/log; hello --version | head -n1;"
        " cmp /tmp/before /etc/apt/sources.list && ls /tmp"
    )
    output = docker_engine.containers.run(
        base,
        ["sh", "-c", script],
        volumes={
            str(tmp_path): {"bind": "/in", "mode": "ro"},
            str(tmp_path / "apt_mirror"): {"bind": "/run/secrets/apt_mirror", "mode": "ro"},
        },
        remove=True,
    ).decode()
    said, version, left = output.splitlines()[0], output.splitlines()[1], output.splitlines()[2:]
    assert said == f"hpcbox: packages from {mirror_url} for this step"
    assert version.startswith("hello (GNU Hello)")
    assert snapshot_archive.times_asked == {"20261123T100000Z"}
    assert left == ["before", "log"]  # the sources are back and their copy is gone


def test_apt_install_downloads_only_what_the_cache_of_downloads_lacks_and_says_so_first(
    docker_engine, run_id: str, tmp_path: Path
):
    """docker/apt-install.sh with a cache of downloads at /mnt, as each apt step of the Dockerfile mounts
    BuildKit's (`sharing=shared`: builds at once take turns in it): a lock with one package more
    downloads that one alone, a cached package whose bytes are not those Debian's signed index names is
    downloaded again, and no package stays in the step's own /var/cache/apt. Each run is a fresh
    container of the pinned base (a step run again)."""
    base = pinned_base()
    served = candidate_versions(base, ("hello", "figlet"))
    (tmp_path / "one.txt").write_text(f"hello={served['hello']}\n")
    (tmp_path / "two.txt").write_text(f"hello={served['hello']}\nfiglet={served['figlet']}\n")
    shutil.copy(REPO / "docker/apt-install.sh", tmp_path)
    cache = docker_engine.volumes.create(f"{run_id}-debs-{os.urandom(3).hex()}")

    def step(lock: str, before: str = "true") -> list[str]:
        script = (
            f"{before} && sh /in/apt-install.sh /in/{lock} >/tmp/log 2>&1 || {{ cat /tmp/log; exit 1; }};"
            " grep '^hpcbox: ' /tmp/log; hello --version | head -n1; ls -A /var/cache/apt/archives"
        )
        volumes = {str(tmp_path): {"bind": "/in", "mode": "ro"}, cache.name: {"bind": "/mnt", "mode": "rw"}}
        return (
            docker_engine.containers.run(base, ["sh", "-c", script], volumes=volumes, remove=True)
            .decode()
            .splitlines()
        )

    size = r"\(\d+ kB\)"
    try:
        # Two steps at once (two builds), the cache empty: one downloads, the other waits for it and
        # takes its download from the cache
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            both = list(pool.map(step, ["one.txt", "one.txt"]))
        said = sorted(lines[0] for lines in both)
        assert re.fullmatch(rf"hpcbox: this step installs 1 package, 1 to download {size}", said[0]), both
        assert said[1] == "hpcbox: this step installs 1 package, all in the build's cache of downloads", both
        for lines in both:
            assert lines[1].startswith("hello (GNU Hello)") and lines[2:] == ["lock", "partial"], lines
        second = step("two.txt")
        assert re.fullmatch(
            rf"hpcbox: this step installs 2 packages, 1 to download {size}, the others in the build's cache "
            "of downloads",
            second[0],
        ), second
        assert (
            step("two.txt")[0]
            == "hpcbox: this step installs 2 packages, all in the build's cache of downloads"
        )
        # A cached package of the right size but other bytes (a disk's corruption, a tampered cache), which
        # apt alone would install: checked against the index, removed and downloaded again
        corrupt = "printf XXXX | dd of=$(ls /mnt/hello_*.deb) bs=1 seek=1000 conv=notrunc 2>/dev/null"
        again = step("one.txt", before=corrupt)
        assert again[0] == (
            f"hpcbox: hello_{served['hello']}_amd64.deb in the build's cache of downloads is not the package "
            "Debian's index names; downloading it again"
        ), again
        assert re.fullmatch(rf"hpcbox: this step installs 1 package, 1 to download {size}", again[1]), again
        assert again[2].startswith("hello (GNU Hello)"), again
    finally:
        cache.remove(force=True)


def test_a_package_added_to_a_lock_is_the_only_one_the_rebuilt_step_downloads(
    docker_engine, project_copy: Path
):
    """The Dockerfile's apt steps through BuildKit: its cache of downloads (in no layer) serves a step run
    again for a package added to its lock, and the image keeps no trace of it. The lock made unique so
    that BuildKit runs the step; what an earlier run left in the cache of downloads is served as well."""
    served = candidate_versions(pinned_base(), ("hello", "figlet"))
    lock = project_copy / "docker/lock/apt-cpu.txt"
    project = load_project(project_copy)

    def build(packages: str) -> tuple[str, list[str]]:
        lock.write_text(f"# {os.urandom(8).hex()}\n{packages}")
        said: list[str] = []
        built = image_stage.build_image(project, offline=True, say=lambda _: None, on_line=said.append)
        step = said.index(next(line for line in said if line.startswith("  [debian-cpu 2/2] RUN ")))
        return built.ref, said[:step]

    _, first = build(f"hello={served['hello']}\n")
    assert first[-1].startswith("hpcbox: this step installs 1 package, "), first
    ref, second = build(f"hello={served['hello']}\nfiglet={served['figlet']}\n")
    # hello from the cache of downloads, figlet too where an earlier run left it there
    assert re.fullmatch(
        r"hpcbox: this step installs 2 packages, (all in|1 to download \(\d+ kB\), the others in) the "
        "build's cache of downloads",
        second[-1],
    ), second
    assert run_in(ref, "sh", "-c", "ls -A /mnt /var/cache/apt/archives") == (
        "/mnt:\n\n/var/cache/apt/archives:\nlock\npartial"
    )


def wheel(name: str, version: str) -> bytes:
    """A pure-Python wheel of one empty module, its RECORD hashed as pip checks it."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: hpcbox-test\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = "".join(
        f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
        f"{len(data)}\n"
        for path, data in files.items()
    )
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for path, data in {**files, f"{dist}/RECORD": f"{record}{dist}/RECORD,,\n".encode()}.items():
            archive.writestr(path, data)
    return buffer.getvalue()


class PackageIndex(Served):
    """PyPI's simple API for a few wheels, at an address builds reach (the default bridge's gateway),
    sending PyPI's caching headers with each file (which pip's HTTP cache goes by); counts the times
    each file is downloaded. Its files' paths hold a token of its own, so no earlier run's cache has them."""

    def __init__(self, host: str, wheels: dict[str, bytes]) -> None:
        self.wheels = wheels
        self.downloads: collections.Counter[str] = collections.Counter()
        token = os.urandom(8).hex()
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                project = re.fullmatch(r"/simple/([a-z0-9-]+)/", self.path)
                name = self.path.removeprefix(f"/files/{token}/")
                if project:
                    body = "".join(
                        f'<a href="/files/{token}/{file}#sha256={hashlib.sha256(data).hexdigest()}">'
                        f"{file}</a>\n"
                        for file, data in index.wheels.items()
                        if file.startswith(f"{project[1]}-")
                    ).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                elif name in index.wheels:
                    index.downloads[name] += 1
                    body = index.wheels[name]
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Cache-Control", "max-age=365000000, immutable, public")
                else:
                    self.send_error(404)
                    return
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
        self.host = host
        self.url = f"http://{host}:{self.server.server_address[1]}/simple/"

    def lock(self, *names: str) -> str:
        """A cpu pip lock of ``names`` (each at 1.0) from this index, hashed as `hpcbox lock` hashes."""
        lines = [f"--index-url {self.url}", f"--trusted-host {self.host}"]
        for name in names:
            file = f"{name}-1.0-py3-none-any.whl"
            lines.append(f"{name}==1.0 \\\n    --hash=sha256:{hashlib.sha256(self.wheels[file]).hexdigest()}")
        return "\n".join(lines) + "\n"


def test_a_pip_package_added_to_a_lock_is_the_only_file_the_rebuilt_step_downloads(
    docker_engine, project_copy: Path
):
    """The Dockerfile's pip steps keep pip's HTTP cache in BuildKit's cache of downloads: the cpu venv's
    step run again for one package added to its lock downloads that package's file alone, from an index
    that sends PyPI's caching headers (this project's machines reach PyPI through a proxy that strips
    them, so a stand-in index serves here). The image imports both packages."""
    wheels = {f"{name}-1.0-py3-none-any.whl": wheel(name, "1.0") for name in ("alpha", "beta")}
    lock = project_copy / "docker/lock/cpu-requirements.txt"
    project = load_project(project_copy)
    with PackageIndex(bridge_gateway(docker_engine), wheels) as index:
        lock.write_text(index.lock("alpha"))
        image_stage.build_image(project, offline=True, say=lambda _: None, on_line=lambda _: None)
        assert index.downloads == {"alpha-1.0-py3-none-any.whl": 1}
        lock.write_text(index.lock("alpha", "beta"))
        built = image_stage.build_image(project, offline=True, say=lambda _: None, on_line=lambda _: None)
        assert index.downloads == {"alpha-1.0-py3-none-any.whl": 1, "beta-1.0-py3-none-any.whl": 1}
    assert run_in(built.ref, "python", "-c", "import alpha, beta; print('both')") == "both"


def test_unknown_flavour_is_one_line_error():
    assert_one_line_error(invoke("build", "--flavour", "rocm"), "unknown flavour 'rocm'", "cpu, cuda")


def test_missing_dockerfile_is_one_line_error(docker_engine, project_copy: Path):
    (project_copy / "docker/Dockerfile").unlink()
    assert_one_line_error(
        invoke("build", "--offline", cwd=project_copy), "no Dockerfile at docker/Dockerfile"
    )


def test_no_docker_engine_is_one_line_error(tmp_path: Path):
    done = invoke("build", env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    assert_one_line_error(done, "no Docker engine answers", "dockerd")


def test_engine_not_permitted_is_one_line_error(docker_engine):
    if os.geteuid() != 0:
        pytest.fail("this test drops to an unprivileged user and must run as root (as CI does)")
    home = Path(tempfile.mkdtemp(prefix="hpcbox-nobody-"))
    try:
        home.chmod(0o755)
        # a project the build accepts, so that the engine is the first thing it is refused
        shutil.copytree(REPO / "docker", home / "docker")
        (home / "pyproject.toml").write_text('[tool.hpcbox]\nproject = "nobody"\ncode = []\n')
        for path in [home, *home.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        done = invoke(
            "build",
            "--offline",
            cwd=home,
            user=65534,
            env={"HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"},
        )
    finally:
        shutil.rmtree(home)
    assert_one_line_error(done, "not permitted to use the Docker engine", "docker group")


def test_invoke_build_prints_the_tag_and_records_the_image_for_the_next_stage(
    trainer_image, project_copy: Path
):
    done = invoke("build", "--offline", cwd=project_copy)
    assert done.returncode == 0, done.stderr
    ref = done.stdout.strip().splitlines()[-1]
    assert docker.image(ref) is not None
    recorded = image_stage.last_image(load_project(project_copy))
    assert (recorded.ref, recorded.flavour) == (ref, "cpu")
    assert image_stage.last_image(load_project(project_copy), "cpu").id == docker.image(ref).id


def test_a_gone_pin_of_a_lock_with_no_snapshot_time_turns_to_the_time_the_archives_api_gives_it(
    docker_engine, project_copy: Path, snapshot_archive
):
    """A lock made where the snapshot archive could not be reached records no time; where it answers now,
    its API says when the gone version arrived, and the build turns to the archive at that time. (The
    stand-in serves today's mirror at every time, so the version is not there either: off-lock.)"""

    # after the lock was made (2026-11-23): a version that arrived earlier is looked for at the lock's time
    version, first_seen = "20250419+hpcbox.gone", "20261124T084516Z"
    project_served_today(project_copy)  # so that the pin below is the only one moved, on any day
    lock = project_copy / "docker/lock/apt-system.txt"
    lock.write_text(re.sub(r"(?m)^ca-certificates=.*$", f"ca-certificates={version}", lock.read_text()))
    assert baseimage.read_lock(project_copy / "docker/lock/base.toml").snapshot is None
    snapshot_archive.mr = {
        ("ca-certificates", version): ("2ab5bb1c5bcdb1e4ba8db2a9b3ec5b6a97b46e1c", first_seen)
    }
    said: list[str] = []
    built = image_stage.build_image(
        load_project(project_copy), offline=True, say=said.append, on_line=lambda _: None
    )
    try:
        gone = f"Debian no longer serves ca-certificates {version}, pinned in docker/lock/apt-system.txt"
        found = (
            f"hpcbox: found the snapshot archive's time for ca-certificates {version}: {first_seen} "
            "(the lock records none)"
        )
        assert found in said, said
        at = said.index(found)
        assert said[at : at + 3] == [
            found,
            f"hpcbox: {gone}; building from the snapshot archive at {first_seen}",
            f"hpcbox: the snapshot archive at {first_seen} does not serve ca-certificates {version} either",
        ], said
        assert snapshot_archive.mr_asked == [
            "/mr/binary/ca-certificates/20250419%2Bhpcbox.gone/binfiles?fileinfo=1"
        ]
        assert snapshot_archive.times_asked == {first_seen}
        moved = rf"ca-certificates {re.escape(version)} -> [^ ;]+ \(docker/lock/apt-system\.txt\)"
        line = f"hpcbox: Debian moved on: {moved}; this build is off-lock: run hpcbox lock"
        assert [each for each in said if re.fullmatch(line, each)] == [said[at + 3]], said
        assert re.fullmatch(moved, built.labels[offlock.LABEL])
    finally:
        docker.remove_image(built.ref)


def test_the_engine_is_asked_about_images_through_its_cli(trainer_image, run_id: str):
    """Every up-to-date check asks `docker image inspect` (the CLI: a submit with nothing to build loads
    no Docker SDK): an image the engine has comes back with its id, tags and labels, one it lacks is
    None, and a label's images are found."""
    found = docker.image(trainer_image.ref)
    assert found is not None and found.id == trainer_image.id and trainer_image.ref in found.tags
    assert found.labels[image_stage.LABEL_CONTENT] == trainer_image.content_hash
    assert docker.image(f"{run_id}/never-built:latest") is None
    labelled = docker.images_labelled(image_stage.LABEL_CONTENT, trainer_image.content_hash)
    assert trainer_image.id in [info.id for info in labelled]
    asked = "import sys; from hpcbox.tools import docker; docker.image(sys.argv[1]); print(*sys.modules)"
    done = subprocess.run([sys.executable, "-c", asked, trainer_image.ref], capture_output=True, text=True)
    assert done.returncode == 0 and "docker" not in done.stdout.split(), done.stderr
