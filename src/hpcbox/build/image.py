"""The build stage: project (docker/ + code + locks) → a Docker image tagged by its content.

The build context is a tarball hpcbox assembles itself from exactly the files that go into the image,
with fixed ordering, owners and timestamps. Its sha256 (with the build arguments and the base image's
id) is the content hash: the image tag, and the answer to "has anything changed?" without asking
Docker to build.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import sys
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpcbox.build import baseimage, offlock, sourcebuild
from hpcbox.build.provenance import inputs_revision
from hpcbox.errors import HpcboxError
from hpcbox.files import one_at_a_time, write_atomically
from hpcbox.project.config import ProjectConfig
from hpcbox.tools import docker


@dataclass(frozen=True)
class Flavour:
    name: str
    registry_base: str
    locks: tuple[str, ...]  # relative to the project's docker dir

    @property
    def pip_lock(self) -> str:
        """The flavour's hashed pip lock, among its locks."""
        return next(lock for lock in self.locks if lock.endswith("-requirements.txt"))


FLAVOURS: Mapping[str, Flavour] = {
    "cuda": Flavour(
        "cuda",
        "debian:trixie-slim",
        ("lock/apt-system.txt", "lock/apt-venv.txt", "lock/cuda-requirements.txt"),
    ),
    "cpu": Flavour(
        "cpu",
        "debian:trixie-slim",
        ("lock/apt-system.txt", "lock/apt-cpu.txt", "lock/apt-venv.txt", "lock/cpu-requirements.txt"),
    ),
}
# The registry base pinned by digest (`hpcbox lock` writes it where a registry is reachable).
REGISTRY_BASE_LOCK = "lock/registry-base.toml"
# Dockerfile stages `hpcbox build` can stop at: the full image, the environment without the code, or
# that environment with JupyterLab (`hpcbox notebook`, and only for it).
RUNTIME = "runtime"
ENVIRONMENT = "environment"
NOTEBOOK = "notebook"
TARGETS = (RUNTIME, ENVIRONMENT, NOTEBOOK)
# The notebook's own lock: in the notebook's context alone, so that it changes no other image's tag.
NOTEBOOK_LOCK = "lock/apt-notebook.txt"
# The Dockerfile's apt steps run this script of docker/ on a lock.
APT_INSTALL = "apt-install.sh"
DEFAULT_FLAVOUR = "cuda"
# The flavours whose PyTorch uses GPUs: the only ones a job asking for GPUs may run in.
CUDA_FLAVOURS = ("cuda",)
OFFLINE_FLAVOUR = "cpu"
# Where the Dockerfile's pip takes its wheels: the cuda flavour needs it, with or without a registry.
PACKAGE_INDEX = "https://pypi.org/simple/"
CA_ENV_VARS = ("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE")
_SKIPPED = {"__pycache__", ".pytest_cache", ".mypy_cache", ".DS_Store"}

LABEL_REVISION = "org.opencontainers.image.revision"
LABEL_TITLE = "org.opencontainers.image.title"
LABEL_BASE_NAME = "org.opencontainers.image.base.name"
LABEL_BASE_DIGEST = "org.opencontainers.image.base.digest"
LABEL_FLAVOUR = "io.hpcbox.flavour"
LABEL_LOCK = "io.hpcbox.lock-sha256"
LABEL_CONTENT = "io.hpcbox.content-hash"
# The time every file of the SIF is stamped with: the pinned base's, so it depends on docker/ alone.
LABEL_SOURCE_DATE_EPOCH = "io.hpcbox.source-date-epoch"


@dataclass(frozen=True)
class Image:
    """A built trainer image: the build stage's artifact."""

    ref: str
    id: str
    content_hash: str
    flavour: str
    base: str
    labels: Mapping[str, str] = field(default_factory=dict)
    built: bool = False  # False: it was already there ("up to date")

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "labels": dict(self.labels)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Image:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class BuildPlan:
    """Everything that decides the image, computed before anything is built."""

    flavour: Flavour
    base: str
    base_id: str
    context: bytes
    content_hash: str
    lock_hash: str
    ref: str
    target: str = RUNTIME
    source_date_epoch: int | None = None  # from the base lock; None on an unpinned base
    base_name: str = ""  # the base as the image's label names it: the same on every machine when pinned
    base_lock: baseimage.BaseLock | None = None  # the lock of a pinned base (its snapshot time, if any)
    # Off-lock: the pins Debian moved (the base's, the apt locks'), and the locked build's content hash.
    moved: tuple[offlock.MovedPin, ...] = ()
    off_lock_of: str = ""

    @property
    def repository(self) -> str:
        return self.ref.rpartition(":")[0]

    @property
    def locks(self) -> tuple[str, ...]:
        return target_locks(self.flavour, self.target)

    @property
    def build_args(self) -> dict[str, str]:
        """What `docker build` is given: the base by its name here, since FROM needs one."""
        return {"FLAVOUR": self.flavour.name, "BASE_IMAGE": self.base, **_dated(self.source_date_epoch)}


def target_locks(flavour: Flavour, target: str) -> tuple[str, ...]:
    """The lock files (relative to the docker dir) an image of ``flavour`` built to ``target`` installs."""
    return (*flavour.locks, NOTEBOOK_LOCK) if target == NOTEBOOK else flavour.locks


def _dated(source_date_epoch: int | None) -> dict[str, str]:
    return {} if source_date_epoch is None else {"SOURCE_DATE_EPOCH": str(source_date_epoch)}


@dataclass(frozen=True)
class RegistryBase:
    """The registry image builds start FROM: the tag it follows and the digest it was locked at."""

    tag: str
    digest: str

    @property
    def repository(self) -> str:
        name, colon, tag = self.tag.rpartition(":")
        return name if colon and "/" not in tag else self.tag

    @property
    def ref(self) -> str:
        """By digest: the same image whatever the tag points to later."""
        return f"{self.repository}@{self.digest}"

    def to_toml(self) -> str:
        return (
            "# The registry image builds start FROM where a registry is reachable, pinned by digest: builds\n"
            "# use this image whatever the tag points to later. `hpcbox lock` re-pins it to the tag.\n"
            f'tag = "{self.tag}"\ndigest = "{self.digest}"\n'
        )


def registry_base_lock(project: ProjectConfig) -> RegistryBase | None:
    path = project.root / project.docker_dir / REGISTRY_BASE_LOCK
    if not path.is_file():
        return None
    relative = path.relative_to(project.root)
    try:
        data = tomllib.loads(path.read_text())
        pinned = RegistryBase(str(data["tag"]), str(data["digest"]))
    except (tomllib.TOMLDecodeError, KeyError) as exc:
        raise HpcboxError(
            f"{relative} is not a registry base lock: {exc}", "run `hpcbox lock` to write it again"
        ) from exc
    if not re.fullmatch(r"sha256:[0-9a-f]{64}", pinned.digest):
        raise HpcboxError(f"{relative}: digest {pinned.digest!r} is not sha256:<64 hex>", "run `hpcbox lock`")
    return pinned


def resolve_flavour(name: str | None, offline: bool) -> Flavour:
    chosen = name or (OFFLINE_FLAVOUR if offline else DEFAULT_FLAVOUR)
    if chosen not in FLAVOURS:
        raise HpcboxError(f"unknown flavour {chosen!r}", f"choose one of: {', '.join(sorted(FLAVOURS))}")
    return FLAVOURS[chosen]


def flavour_without_registry(name: str | None, index: str = PACKAGE_INDEX) -> Flavour:
    """The flavour to build on the bootstrapped Debian base where no registry answers: the one asked
    for (the default, cuda, takes PyTorch's CUDA wheels from ``index``), else cpu (Debian's own
    PyTorch) where ``index`` does not answer either."""
    chosen = resolve_flavour(name, offline=False)
    if name is None and chosen.name in CUDA_FLAVOURS and not index_reachable(index):
        return FLAVOURS[OFFLINE_FLAVOUR]
    return chosen


def index_reachable(url: str, timeout_s: float = 5) -> bool:
    """Whether the package index at ``url`` answers over HTTP(S) within ``timeout_s``."""
    import urllib.request  # here: every submit imports this module, and only a build asks

    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s):
            return True
    except (OSError, ValueError):  # URLError and HTTPError are OSErrors
        return False


def build_context(
    project: ProjectConfig,
    *,
    with_code: bool = True,
    with_notebook: bool = False,
    locks: Mapping[str, bytes] | None = None,
) -> bytes:
    """The build context as a reproducible tarball: docker/ (the notebook's lock ``with_notebook``
    only) and (``with_code``) the project's code; ``locks`` (path in the project → content) in place
    of the committed lock files."""
    dockerfile = project.root / project.dockerfile
    if not dockerfile.is_file():
        raise HpcboxError(
            f"no Dockerfile at {project.dockerfile} in {project.root}",
            "run `hpcbox init` to add hpcbox's, or set tool.hpcbox.dockerfile to yours",
        )
    paths = {
        *project_files(project.root, project.docker_dir),
        *project_files(project.root, project.dockerfile),
    }
    if not with_notebook:
        paths.discard(f"{project.docker_dir}/{NOTEBOOK_LOCK}")
    files: dict[str, Path | bytes] = {relative: project.root / relative for relative in paths}
    files.update(locks or {})
    if with_code:
        files.update({f"code/{name}": path for name, path in code_files(project).items()})
    return docker.context_tar(files)


def code_files(project: ProjectConfig) -> dict[str, Path]:
    """The project's code by its name in the image and in the job's snapshot: each `tool.hpcbox.code`
    path under its last part (src/mypackage/x.py is mypackage/x.py), as `python -m` finds it."""
    files = {}
    for code in project.code:
        top = Path(code).name
        for relative in project_files(project.root, code):
            inside = Path(relative).relative_to(code).as_posix() if relative != code else ""
            files[f"{top}/{inside}".rstrip("/")] = project.root / relative
    return files


def project_files(root: Path, relative: str) -> Iterator[str]:
    """The files under ``root/relative`` that belong in an image or a code snapshot (no caches)."""
    top = root / relative
    if top.is_file():
        yield relative
        return
    for path in top.rglob("*"):
        if (
            path.is_file()
            and not _SKIPPED.intersection(path.relative_to(root).parts)
            and path.suffix != ".pyc"
        ):
            yield path.relative_to(root).as_posix()


def lock_hash(project: ProjectConfig, flavour: Flavour, target: str = RUNTIME) -> str:
    digest = hashlib.sha256()
    for lock in target_locks(flavour, target):
        path = project.root / project.docker_dir / lock
        if not path.is_file():
            raise HpcboxError(
                f"lock file {path.relative_to(project.root)} is missing",
                "regenerate the locks with `hpcbox lock`",
            )
        digest.update(lock.encode() + b"\0" + path.read_bytes() + b"\0")
    # The build tools of what the pip lock builds from source, where it builds any: a lock without
    # such packages hashes as it always did.
    constraints = sourcebuild.constraints_for(project.root / project.docker_dir / flavour.pip_lock)
    if constraints.is_file():
        relative = constraints.relative_to(project.root / project.docker_dir).as_posix()
        digest.update(relative.encode() + b"\0" + constraints.read_bytes() + b"\0")
    return digest.hexdigest()


def plan_build(
    project: ProjectConfig,
    *,
    flavour: str | None = None,
    offline: bool = False,
    base: str | None = None,
    target: str = RUNTIME,
    strict: bool = False,
    say: Callable[[str], None] = print,
) -> BuildPlan:
    """Decide base, context and tag; pulls or bootstraps the base image if it is missing.

    ``target`` ENVIRONMENT is the image without the project's code (the cluster's SIF): its context,
    and so its tag, leave the code out.
    """
    if target not in TARGETS:
        raise HpcboxError(f"unknown build target {target!r}", f"choose one of: {', '.join(TARGETS)}")
    chosen = resolve_flavour(flavour, offline)
    context = build_context(project, with_code=target == RUNTIME, with_notebook=target == NOTEBOOK)
    base_lock = baseimage.project_lock(project.root, project.docker_dir)
    if base is not None:
        base_ref = base
    elif offline:
        base_ref = baseimage.base_ref(lock=base_lock)
    else:
        registry_base = registry_base_lock(project)
        base_ref = registry_base.ref if registry_base else chosen.registry_base
        if docker.image(base_ref) is None and not docker.pull(base_ref):
            chosen = flavour_without_registry(flavour)
            bootstrapped = (
                f"a Debian base bootstrapped from Debian's mirror ({baseimage.base_ref(lock=base_lock)})"
            )
            if chosen.name in CUDA_FLAVOURS:
                say(
                    f"hpcbox: no registry reachable to pull {base_ref}; building the {chosen.name} flavour "
                    f"on {bootstrapped}, with PyTorch's CUDA wheels from {PACKAGE_INDEX}"
                )
            else:
                also = "" if flavour else f" and {PACKAGE_INDEX} does not answer"
                say(
                    f"hpcbox: no registry reachable to pull {base_ref}{also}; building the {chosen.name} "
                    f"flavour (Debian's own PyTorch) offline on {bootstrapped}"
                )
            base_ref = baseimage.base_ref(lock=base_lock)
            offline = True
        elif registry_base is None:
            say(f"hpcbox: {base_ref} is followed by its tag: `hpcbox lock` pins it by digest")
    base_image = docker.image(base_ref)
    if base_image is None and offline and base is None:
        made = baseimage.ensure_base(
            lock=base_lock,
            ref=base_ref,
            strict=strict,
            lock_name=baseimage.lock_file(project.docker_dir),
            say=say,
        )
        base_image = docker.image(made.ref)
    if base_image is None:
        raise HpcboxError(
            f"base image {base_ref} is not available",
            "pull it, or build offline with `hpcbox build --offline`",
        )
    pinned = base_lock if base_lock is not None and base_ref == baseimage.base_ref(lock=base_lock) else None
    moved = offlock.from_labels(base_image.labels) if pinned else ()
    offlock.refuse_if(moved, strict, f"base image ({base_ref} is off-lock)")
    repository = project.repository if target == RUNTIME else f"{project.repository}-{target}"
    plan = BuildPlan(
        flavour=chosen,
        base=base_ref,
        base_id=base_image.id,
        context=context,
        content_hash="",
        lock_hash=lock_hash(project, chosen, target),
        ref=f"{repository}:",
        target=target,
        source_date_epoch=pinned.source_date_epoch if pinned else None,
        base_name=baseimage.base_ref(lock=pinned, canonical=True) if pinned else base_ref,
        base_lock=pinned,
        moved=moved,
    )
    return _hashed(plan, context)


def _hashed(plan: BuildPlan, context: bytes) -> BuildPlan:
    """``plan`` building ``context``, with the content hash and tag that follow from them."""
    # The base by its id, not its name: the name is local (HPCBOX_BASE_REPOSITORY), the id is content.
    hashed = {"FLAVOUR": plan.flavour.name, "BASE_IMAGE_ID": plan.base_id, **_dated(plan.source_date_epoch)}
    if plan.target != RUNTIME:
        hashed["TARGET"] = plan.target
    if plan.off_lock_of:
        # never the tag of a locked build whose locks happen to read as these do
        hashed["OFF_LOCK_OF"] = plan.off_lock_of
    digest = hashlib.sha256(context)
    digest.update(json.dumps(hashed, sort_keys=True).encode())
    content_hash = digest.hexdigest()
    return dataclasses.replace(
        plan, context=context, content_hash=content_hash, ref=f"{plan.repository}:{content_hash[:12]}"
    )


def _apt_locks(project: ProjectConfig, plan: BuildPlan) -> dict[str, str]:
    """The plan's apt locks: each as the user names it (docker/lock/apt-system.txt) → its text."""
    docker_dir = project.root / project.docker_dir
    return {
        f"{project.docker_dir}/{lock}": (docker_dir / lock).read_text()
        for lock in plan.locks
        if Path(lock).name.startswith("apt-")
    }


def _gone_pin_if_apt_failed(
    project: ProjectConfig, plan: BuildPlan, failed: HpcboxError
) -> tuple[str, str] | None:
    """Where the build failed in its apt step without apt's own words in the output, a pin Debian no
    longer serves, asked of apt in the base: two builds of one step at once share BuildKit's run of it,
    and only one of them is shown what apt said."""
    if APT_INSTALL not in failed.message:
        return None
    texts = _apt_locks(project, plan)
    moved = [pin for pins in offlock.moved_in(plan.base, texts).values() for pin in pins]
    return (moved[0].package, moved[0].locked) if moved else None


def off_lock_plan(project: ProjectConfig, plan: BuildPlan, strict: bool) -> BuildPlan:
    """``plan`` with each apt pin Debian no longer serves set to the version it serves now (asked of
    apt in the base); refused in one line when ``strict``."""
    texts = _apt_locks(project, plan)
    moved = offlock.moved_in(plan.base, texts)
    every = (*plan.moved, *(pin for each in moved.values() for pin in each))
    offlock.refuse_if(every, strict, "image")
    locks = {path: offlock.follow(texts[path], moved[path]).encode() for path in texts if moved[path]}
    context = build_context(
        project, with_code=plan.target == RUNTIME, with_notebook=plan.target == NOTEBOOK, locks=locks
    )
    return _hashed(dataclasses.replace(plan, moved=every, off_lock_of=plan.content_hash), context)


def host_ca_bundle() -> Path | None:
    """The CA bundle the host uses to reach package indexes, if it names one."""
    for var in CA_ENV_VARS:
        value = os.environ.get(var)
        if value and Path(value).is_file():
            return Path(value)
    return None


def build_image(
    project: ProjectConfig,
    *,
    flavour: str | None = None,
    offline: bool = False,
    base: str | None = None,
    ca_bundle: Path | None = None,
    no_cache: bool = False,
    target: str = RUNTIME,
    strict_lock: bool = False,
    say: Callable[[str], None] = print,
    on_line: Callable[[str], None] | None = None,
) -> Image:
    """Build the trainer image unless an image with the same content hash already exists (or, where
    Debian moved on, its off-lock stand-in); off-lock where Debian no longer serves a pin, which
    ``strict_lock`` (or HPCBOX_STRICT_LOCK) refuses instead."""
    strict = offlock.strict_lock(strict_lock)
    plan = plan_build(
        project, flavour=flavour, offline=offline, base=base, target=target, strict=strict, say=say
    )
    if no_cache:
        return _build(project, plan, strict, ca_bundle, no_cache, say, on_line)
    if (found := _up_to_date(plan, strict, say)) is not None:
        return found
    # Two builds of one environment at once (two commands, two projects with the same locks) would
    # both install every package: the second waits, then finds this image, or the layers in the cache.
    waiting = f"hpcbox: another build of this environment ({plan.flavour.name}) is under way; waiting for it"
    with one_at_a_time(f"build {plan.base_id} {plan.flavour.name} {plan.lock_hash}", lambda: say(waiting)):
        if (found := _up_to_date(plan, strict, say)) is not None:
            return found
        return _build(project, plan, strict, ca_bundle, no_cache, say, on_line)


def _up_to_date(plan: BuildPlan, strict: bool, say: Callable[[str], None]) -> Image | None:
    """The image ``plan`` makes where the engine has it (or, where Debian moved on, the off-lock build
    that stands in for it)."""
    existing = docker.image(plan.ref)
    if existing is None:
        found = offlock.stand_in(plan.content_hash, plan.repository)
        if found is None:
            return None
        ref, existing = found
        plan = dataclasses.replace(plan, content_hash=existing.labels[LABEL_CONTENT], ref=ref)
    moved = offlock.from_labels(existing.labels)
    offlock.refuse_if(moved, strict, f"image ({plan.ref} is off-lock)")
    offlock.announce(moved, say)
    say(f"hpcbox: {plan.ref} is up to date")
    return _image(plan, existing, built=False)


def _build(
    project: ProjectConfig,
    plan: BuildPlan,
    strict: bool,
    ca_bundle: Path | None,
    no_cache: bool,
    say: Callable[[str], None],
    on_line: Callable[[str], None] | None,
) -> Image:
    ca = ca_bundle if ca_bundle is not None else host_ca_bundle()
    if ca is not None and not ca.is_file():
        raise HpcboxError(
            f"CA bundle {ca} does not exist", "point PIP_CERT / SSL_CERT_FILE at a readable file"
        )
    say(f"hpcbox: building {plan.ref} ({plan.flavour.name} flavour on {plan.base})")
    # Asked of git only for a build (three git commands): an image found up to date needs no label.
    revision = inputs_revision(
        project.root,
        (project.docker_dir, project.dockerfile, *(project.code if plan.target == RUNTIME else ())),
    )
    pip_lock = project.root / project.docker_dir / plan.flavour.pip_lock
    unpinned = sourcebuild.unpinned_build_tools(pip_lock, (project.root / project.dockerfile).read_text())
    if unpinned:
        say(unpinned)
    secrets = {"host_ca": ca} if ca is not None else {}
    shown = docker.BuildProgress(on_line or _echo)
    log: list[str] = []  # the whole build's, for what a failed step's last lines would leave out

    def progress(line: str) -> None:
        log.append(line)
        shown(line)

    def build(plan: BuildPlan, mirror: Mapping[str, Path]) -> None:
        # The commit that last changed what this target is built from, not the whole tree's: a commit
        # elsewhere (a README) leaves the label, and so the SIF, as they were.
        labels = {
            LABEL_TITLE: project.name,
            LABEL_REVISION: revision,
            LABEL_BASE_NAME: plan.base_name,
            LABEL_BASE_DIGEST: plan.base_id,
            LABEL_FLAVOUR: plan.flavour.name,
            LABEL_LOCK: plan.lock_hash,
            LABEL_CONTENT: plan.content_hash,
            **_dated_label(plan.source_date_epoch),
            **offlock.labels_for(plan.moved, of=plan.off_lock_of),
        }
        docker.build(
            plan.context,
            dockerfile=project.dockerfile,
            tag_ref=plan.ref,
            build_args=plan.build_args,
            base_arg="BASE_IMAGE",
            labels=labels,
            secrets={**secrets, **mirror},
            no_cache=no_cache,
            target=plan.target,
            on_line=progress,
        )

    try:
        build(plan, {})
    except HpcboxError as failed:
        gone = baseimage.superseded_pin(failed.details) or _gone_pin_if_apt_failed(project, plan, failed)
        if gone is None:
            source_build = sourcebuild.build_failure(docker.failed_step(log)[1], pip_lock)
            if source_build is not None:
                raise source_build from failed
            raise
        gone_line = f"Debian no longer serves {gone[0]} {gone[1]}, pinned in {_pinned_in(project, *gone)}"
        lock = plan.base_lock
        if lock is None or not baseimage.build_from_snapshot(
            lock.snapshot,
            lock.suite,
            functools.partial(build, plan),
            gone_line,
            say,
            pins=dict([gone]),
            locked_at=lock.source_date_epoch,
        ):
            plan = off_lock_plan(project, plan, strict)
            offlock.announce(plan.moved, say)
            say(f"hpcbox: building {plan.ref} off-lock, with what Debian serves now")
            build(plan, {})
    built = docker.image(plan.ref)
    if built is None:
        raise HpcboxError(f"the build reported success but {plan.ref} is not in the engine")
    say(f"hpcbox: built {plan.ref}")
    return _image(plan, built, built=True)


def _dated_label(source_date_epoch: int | None) -> dict[str, str]:
    return {} if source_date_epoch is None else {LABEL_SOURCE_DATE_EPOCH: str(source_date_epoch)}


def _pinned_in(project: ProjectConfig, package: str, version: str) -> str:
    """The apt lock file that pins ``package`` at ``version``."""
    lock_dir = project.root / project.docker_dir / "lock"
    return next(
        (
            path.relative_to(project.root).as_posix()
            for path in sorted(lock_dir.glob("apt-*.txt"))
            if f"{package}={version}" in path.read_text().split()
        ),
        "the Debian locks",
    )


def record_path(project: ProjectConfig, flavour: str) -> Path:
    return project.state_dir / "images" / f"{flavour}.json"


def record_image(project: ProjectConfig, image: Image) -> None:
    """Remember the image just built (or found up to date) as the project's image of its flavour."""
    path = record_path(project, image.flavour)
    write_atomically(path, image.to_json() + "\n")
    write_atomically(path.with_name("latest"), image.flavour + "\n")


def last_image(project: ProjectConfig, flavour: str | None = None) -> Image:
    """The image `hpcbox build` last made for ``flavour`` (default: the last one built), still present."""
    if flavour is not None:
        resolve_flavour(flavour, offline=False)
    else:
        latest = project.state_dir / "images" / "latest"
        flavour = latest.read_text().strip() if latest.is_file() else None
    path = record_path(project, flavour) if flavour else None
    if path is None or not path.is_file():
        raise HpcboxError(
            "the image is not built" + (f" for flavour {flavour}" if flavour else ""),
            "run `hpcbox build` first" + (f" (with --flavour {flavour})" if flavour else ""),
        )
    image = Image.from_json(path.read_text())
    if docker.image(image.ref) is None:
        raise HpcboxError(f"image {image.ref} is no longer in the Docker engine", "run `hpcbox build` again")
    return image


def _image(plan: BuildPlan, info: docker.ImageInfo, *, built: bool) -> Image:
    return Image(
        ref=plan.ref,
        id=info.id,
        content_hash=plan.content_hash,
        flavour=plan.flavour.name,
        base=plan.base,
        labels=dict(info.labels),
        built=built,
    )


def _echo(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
