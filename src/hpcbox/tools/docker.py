"""The Docker engine: queries through the Docker SDK, BuildKit builds through the docker CLI.

The SDK speaks the engine API directly but only drives the legacy builder, which cannot mount
build secrets; builds therefore go through a docker CLI that has BuildKit (Debian's docker.io
20.10 has it built in, newer clients need the buildx plugin).
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import shutil
import tarfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from hpcbox.errors import HpcboxError
from hpcbox.tools import proc

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container


def _sdk():
    """The Docker SDK, imported at first use: a third of a second that a command which never reaches the
    engine (status, logs, --version) does not pay."""
    import docker
    import docker.errors

    return docker


START_ENGINE_HINT = "start one: `./bootstrap` installs and starts dockerd, or `systemctl start docker`"
PERMISSION_HINT = (
    "add your user to the docker group (`usermod -aG docker $USER`, then log in again) or run as root"
)


@dataclass(frozen=True)
class ImageInfo:
    id: str
    tags: tuple[str, ...]
    labels: Mapping[str, str]
    layers: tuple[str, ...]
    size: int
    user: str
    env: tuple[str, ...]
    digests: tuple[str, ...] = ()  # repository@sha256:... for each registry it was pulled from or pushed to


@functools.cache
def client() -> docker.DockerClient:
    """A client for the engine named by DOCKER_HOST (default: the local socket), checked to answer."""
    try:
        engine = _sdk().from_env(timeout=600)
        engine.ping()
    except _sdk().errors.DockerException as exc:
        raise _engine_error(exc) from exc
    return engine


def is_rootless(info: Mapping[str, Any]) -> bool:
    """Whether the engine ``docker info`` describes runs rootless: its containers' root is the user who
    runs it, their other users that user's subordinate ids."""
    return any("rootless" in option for option in info.get("SecurityOptions") or ())


@functools.cache
def rootless() -> bool:
    return is_rootless(client().info())


def _engine_error(exc: Exception) -> HpcboxError:
    refused = "Permission denied" in str(exc) or isinstance(exc.__context__, PermissionError)
    return _unreachable(not_permitted=refused)


def _unreachable(*, not_permitted: bool) -> HpcboxError:
    """The one line for an engine this user may not use, or that does not answer (SDK or CLI alike)."""
    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not_permitted:
        return HpcboxError(f"not permitted to use the Docker engine at {where}", PERMISSION_HINT)
    return HpcboxError(f"no Docker engine answers at {where}", START_ENGINE_HINT)


def container(name: str) -> Container | None:
    """The engine's container ``name``, or None where it has none."""
    try:
        return client().containers.get(name)
    except _sdk().errors.NotFound:
        return None


def put_archive(into: Container, directory: str, archive: bytes, *, what: str) -> None:
    """Unpack the tar ``archive`` into ``directory`` of container ``into``, running or not."""
    try:
        into.put_archive(directory, archive)
    except _sdk().errors.APIError as exc:
        raise HpcboxError(f"could not {what}: {exc}") from exc


def image(ref: str) -> ImageInfo | None:
    """What the engine knows of image ``ref``, or None if it has no such image."""
    found = _inspect([ref])
    return found[0] if found else None


def images_labelled(label: str, value: str) -> list[ImageInfo]:
    """The images whose label ``label`` is ``value``, newest first."""
    try:
        found = client().api.images(filters={"label": f"{label}={value}"})
    except _sdk().errors.APIError as exc:
        raise HpcboxError(f"cannot list images labelled {label}: {exc.explanation}") from exc
    newest = sorted(found, key=lambda attrs: attrs.get("Created") or 0, reverse=True)
    return _inspect([attrs["Id"] for attrs in newest])


# How the CLI says which engine it could not reach, and that an image is not there.
_NO_ENGINE = "Cannot connect to the Docker daemon"
_NOT_PERMITTED = "permission denied while trying to connect to the Docker daemon"
_NO_IMAGE = re.compile(r"no such image", re.IGNORECASE)


def _refuse_unreachable(done: proc.Completed) -> None:
    if _NOT_PERMITTED in done.stderr or _NO_ENGINE in done.stderr:
        raise _unreachable(not_permitted=_NOT_PERMITTED in done.stderr)


def _inspect(refs: Sequence[str]) -> list[ImageInfo]:
    """What the engine knows of each of ``refs`` that it has, in their order: one `docker image
    inspect` through the CLI, some 20 ms, where the SDK's import alone takes 150 (a submit that
    finds its image up to date needs nothing else of the engine)."""
    if not refs:
        return []
    done = proc.run([cli(), "image", "inspect", *refs], what="inspect images", check=False)
    _refuse_unreachable(done)
    said = done.stderr.strip()
    unexplained = [line for line in said.splitlines() if not _NO_IMAGE.search(line)]
    if done.returncode != 0 and unexplained:
        raise HpcboxError(f"cannot inspect image {', '.join(refs)}: {unexplained[-1]}")
    return [_image_info(attrs) for attrs in json.loads(done.stdout or "[]")]


def _image_info(attrs: Mapping[str, Any]) -> ImageInfo:
    config = attrs.get("Config") or {}
    return ImageInfo(
        id=attrs["Id"],
        tags=tuple(attrs.get("RepoTags") or ()),
        labels=dict(config.get("Labels") or {}),
        layers=tuple((attrs.get("RootFS") or {}).get("Layers") or ()),
        size=int(attrs.get("Size") or 0),
        user=config.get("User") or "",
        env=tuple(config.get("Env") or ()),
        digests=tuple(attrs.get("RepoDigests") or ()),
    )


def pull(ref: str) -> bool:
    """Pull ``ref``; False when no registry can be reached (the caller decides what to do then)."""
    try:
        client().images.pull(ref)
    except _sdk().errors.APIError as exc:
        explanation = str(exc.explanation or exc)
        if _looks_unreachable(explanation):
            return False
        raise HpcboxError(
            f"cannot pull base image {ref}: {explanation}",
            "check the image name, or build offline with `hpcbox build --offline`",
        ) from exc
    return True


def _looks_unreachable(text: str) -> bool:
    markers = (
        "no such host",
        "dial tcp",
        "i/o timeout",
        "connection refused",
        "TLS handshake timeout",
        "network is unreachable",
        "Client.Timeout",
    )
    return any(marker in text for marker in markers)


def push(ref: str) -> None:
    """Push ``ref`` to its registry; the registry's error, if any, in one line."""
    repository, _, tag_name = ref.rpartition(":")
    for status in client().api.push(repository, tag=tag_name, stream=True, decode=True):
        if "error" in status:
            raise HpcboxError(f"cannot push {ref}: {status['error']}", "check the registry and your login")


def tag(source: str, target: str) -> None:
    repository, _, tag_name = target.rpartition(":")
    client().api.tag(source, repository, tag_name)


def remove_image(ref: str) -> None:
    """Remove ``ref``; one another process removes at the same time is gone all the same (the engine
    then answers 500 "unrecognized image ID", not 404)."""
    try:
        client().api.remove_image(ref, force=True)
    except _sdk().errors.APIError:
        if image(ref) is not None:
            raise


def save(ref: str) -> Iterator[bytes]:
    """The `docker save` archive of ``ref``, as a stream of chunks."""
    return client().images.get(ref).save(chunk_size=1 << 20)


def load(archive: IO[bytes]) -> None:
    """`docker load` an image archive (the `docker save` layout) read from ``archive``."""
    try:
        client().images.load(archive)
    except _sdk().errors.APIError as exc:
        raise HpcboxError(f"docker could not load the image archive: {exc.explanation}") from exc


def _clis() -> list[str]:
    """The docker CLIs there are, first choice first: HPCBOX_DOCKER_CLI, docker on PATH, Debian's."""
    candidates = [os.environ.get("HPCBOX_DOCKER_CLI"), shutil.which("docker"), "/usr/bin/docker"]
    return list(dict.fromkeys(cli for cli in candidates if cli and Path(cli).exists()))


@functools.cache
def cli() -> str:
    """A docker CLI, or an HpcboxError naming how to get one."""
    found = _clis()
    if not found:
        raise HpcboxError("no docker client found", "install Debian's docker.io (`./bootstrap` does)")
    return found[0]


@functools.cache
def build_cli() -> str:
    """A docker CLI able to run BuildKit builds, or an HpcboxError naming how to get one."""
    seen = _clis()
    for candidate in seen:
        buildx = proc.run([candidate, "buildx", "version"], what="ask docker for buildx", check=False)
        if buildx.returncode == 0:
            return candidate
        version = [candidate, "version", "--format", "{{.Client.Version}}"]
        major = re.match(r"(\d+)\.", proc.run(version, what="ask docker its version", check=False).stdout)
        if major and int(major.group(1)) < 23:
            return candidate  # BuildKit was built into the classic client before 23.0
    raise HpcboxError(
        "no docker client with BuildKit found" + (f" (tried {', '.join(seen)})" if seen else ""),
        "install the buildx plugin (`apt-get install docker-buildx`) or Debian's docker.io",
    )


def context_tar(files: Mapping[str, Path | bytes]) -> bytes:
    """A reproducible build context: ``files`` (name in the archive → file, or its bytes) in name
    order, with fixed timestamps and owners, and modes reduced to 0755/0644 by the executable bit.

    GNU format, never PAX: an archive that starts with a PAX header is taken by the docker CLI
    for a plain Dockerfile.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(files):
            source = files[name]
            data = source if isinstance(source, bytes) else source.read_bytes()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if isinstance(source, Path) and os.access(source, os.X_OK) else 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def build(
    context_tar: bytes,
    *,
    dockerfile: str,
    tag_ref: str,
    build_args: Mapping[str, str],
    labels: Mapping[str, str],
    secrets: Mapping[str, Path],
    no_cache: bool = False,
    target: str | None = None,
    base_arg: str | None = None,
    on_line: Callable[[str], None] | None = None,
) -> None:
    """BuildKit build of the tar context on ``context_tar``; progress lines go to ``on_line``.
    ``base_arg`` names the build argument that holds the local image the Dockerfile starts FROM."""
    with _base_named_for_this_build(build_args, base_arg) as args:
        argv = [build_cli(), "build", "--progress=plain", "-f", dockerfile, "-t", tag_ref]
        if target is not None:
            argv += ["--target", target]
        for key, value in args.items():
            argv += ["--build-arg", f"{key}={value}"]
        for key, value in labels.items():
            argv += ["--label", f"{key}={value}"]
        for secret_id, path in secrets.items():
            argv += ["--secret", f"id={secret_id},src={path}"]
        if no_cache:
            argv.append("--no-cache")
        argv.append("-")
        _stream_build(argv, tag_ref, context_tar, on_line)


@contextlib.contextmanager
def _base_named_for_this_build(
    build_args: Mapping[str, str], base_arg: str | None
) -> Iterator[Mapping[str, str]]:
    """``build_args`` with the local image that ``base_arg`` names under a name of this build's own,
    untagged when the build ends (``build_args`` as they are without ``base_arg``).

    BuildKit joins the FROM of builds running at once on one image name, and where the other build
    holds a base no build had used yet, the joining build gets it without a cache key: every step
    after it runs again, cached or not (moby/buildkit#4674; in the test suite's first minutes, the
    trainer's PyTorch step, a minute of CPU, twice over beside the node images' builds). Under a name
    of its own the FROM is this build's, and its cache key is still the image's content."""
    if base_arg is None:
        yield build_args
        return
    ref = build_args[base_arg]
    name = ref.split("@", 1)[0]
    repository = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    alias = f"{repository}:build-{os.getpid()}-{os.urandom(4).hex()}"
    tag(ref, alias)
    try:
        yield {**build_args, base_arg: alias}
    finally:
        remove_image(alias)  # the alias alone: the base keeps its own name


def _stream_build(
    argv: list[str], tag_ref: str, context_tar: bytes, on_line: Callable[[str], None] | None
) -> None:
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    lines: list[str] = []

    def collect(line: str) -> None:
        lines.append(line)
        if on_line is not None:
            on_line(line)

    try:
        proc.stream(argv, what=f"build {tag_ref}", env=env, input_bytes=context_tar, on_line=collect)
    except HpcboxError as exc:
        step, step_lines = failed_step(lines)
        if step:
            raise HpcboxError(
                f"image build failed at step {step}",
                "fix the step (its last lines are above) and run `hpcbox build` again",
                details="\n".join(step_lines[-proc.TAIL_LINES :]),
            ) from exc
        raise


_STEP_HEADER = re.compile(r"^#(\d+) (\[[^\]]+\] .+)$")
_ERROR_LINE = re.compile(r"^#(\d+) ERROR[: ]")
_STEP_END = re.compile(r"^#(\d+) (?:DONE (\d+(?:\.\d+)?)s|(CACHED))$")
# A line a step's own commands print for the person waiting (docker/apt-install.sh's "hpcbox: ...").
_STEP_SAYS = re.compile(r"^#\d+ \d+(?:\.\d+)? (hpcbox: .+)$")
_TITLE_WIDTH = 96


class BuildProgress:
    """BuildKit's plain progress as a person wants it: one line per Dockerfile step when it ends, with
    how long it took (or that it was cached), and what a step says for people (`hpcbox: ...`); the
    rest (apt's and pip's own output) only where a step fails, in the error."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.titles: dict[str, str] = {}

    def __call__(self, line: str) -> None:
        header = _STEP_HEADER.match(line)
        if header:
            # the secrets a RUN mounts say nothing about what it does
            title = " ".join(word for word in header[2].split() if not word.startswith("--mount="))
            if not title.startswith("[internal]") and "] FROM " not in title:
                self.titles.setdefault(header[1], title)
            return
        said = _STEP_SAYS.match(line)
        if said:
            self.say(said[1])
            return
        end = _STEP_END.match(line)
        if end and end[1] in self.titles:
            title = self.titles.pop(end[1])
            short = title if len(title) <= _TITLE_WIDTH else title[: _TITLE_WIDTH - 1] + "…"
            self.say(f"  {short} ({'cached' if end[3] else f'{float(end[2]):.1f} s'})")


def failed_step(lines: Sequence[str]) -> tuple[str, list[str]]:
    """From BuildKit plain progress: the failing step's title and its output lines."""
    titles: dict[str, str] = {}
    failed = ""
    for line in lines:
        header = _STEP_HEADER.match(line)
        if header:
            titles[header.group(1)] = header.group(2)
        error = _ERROR_LINE.match(line)
        if error:
            failed = error.group(1)
    if not failed:
        return "", []
    prefix = f"#{failed} "
    output = [line[len(prefix) :] for line in lines if line.startswith(prefix)]
    return titles.get(failed, f"#{failed}"), output


def run_once(ref: str, command: Sequence[str], *, what: str, user: str = "root") -> str:
    """Run ``command`` in a throwaway container of ``ref``; its stdout, or an HpcboxError with its stderr."""
    try:
        output = client().containers.run(
            ref, list(command), user=user, remove=True, stdout=True, stderr=False
        )
    except _sdk().errors.ContainerError as exc:
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr)
        raise proc.failure(what, exc.exit_status, stderr, "", list(command)) from exc
    except _sdk().errors.ImageNotFound as exc:
        raise HpcboxError(f"cannot {what}: image {ref} is not there") from exc
    return output.decode(errors="replace")


def run_for_file(ref: str, command: Sequence[str], path: str, *, what: str) -> bytes:
    """Run ``command`` in a throwaway container of ``ref`` and return the file it wrote at ``path``.

    Copied out of the stopped container, not read from its output: the engine's log driver keeps
    output as text, and bytes that are not UTF-8 would not survive it.
    """
    engine = client()
    try:
        container = engine.containers.create(ref, list(command))
    except _sdk().errors.ImageNotFound as exc:
        raise HpcboxError(f"cannot {what}: image {ref} is not there") from exc
    try:
        container.start()
        status = container.wait()["StatusCode"]
        if status != 0:
            stderr = container.logs(stdout=False, stderr=True).decode(errors="replace")
            raise proc.failure(what, status, stderr, "", list(command))
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
            member = archive.extractfile(archive.getmembers()[0])
            if member is None:
                raise HpcboxError(f"cannot {what}: {path} in the container is not a file")
            return member.read()
    finally:
        container.remove(force=True)
