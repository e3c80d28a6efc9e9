"""A Debian base image made without any registry, the same on every machine that builds it.

Air-gapped build hosts (and CI here) cannot pull from a registry but can reach a Debian mirror;
this is the base every offline image (trainer, Apptainer helper, mini cluster nodes) builds on.

mmdebstrap writes the root filesystem as one tarball, every file stamped with SOURCE_DATE_EPOCH and
no per-run files (logs, caches, machine-id): with the same packages it is the same bytes. hpcbox
then loads it as an image whose config carries that same time instead of the moment of the
import, so the image id, a hash of the config, is the same too. A project pins the base in
`docker/lock/base.toml` (suite, time, and the exact package versions it must contain).

Debian's mirror serves only current versions; snapshot.debian.org serves the archive as it was at any
time. A lock made where the snapshot archive answers is resolved from it and records that time
(`snapshot`): once the mirror has moved on, the base (and the image's apt pins) come from the snapshot
at that time instead, so an old commit still rebuilds. A lock that records none (made where the archive
could not be reached) is given one once a pin moved: when the archive's files of the moved versions had all
arrived (`snapshot_time_of`). Where neither serves them, the base is what the mirror serves, labelled
off-lock with the packages that moved (`hpcbox.offlock`), or refused under `--strict-lock` before anything
is tagged.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import platform
import re
import shlex
import shutil
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from hpcbox.build import offlock
from hpcbox.errors import HpcboxError
from hpcbox.files import file_sha256, one_at_a_time
from hpcbox.project.init import docker_template
from hpcbox.tools import docker, proc

# apt's words for a pinned version its mirror no longer serves (a point release replaced it, or sid
# moved on).
_APT_VERSION_GONE = re.compile(r"E: Version '([^']+)' for '([^']+)' was not found")
DEFAULT_SUITE = "trixie"
SUITES = ("bookworm", "trixie", "sid")
LOCK_NAME = "base.toml"
# The suite alone, named explicitly: left to itself mmdebstrap adds -updates and -security, which move
# every few days; the suite itself changes only at point releases.
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# snapshot.debian.org's name for a moment: what the archive served then (its latest import before it).
SNAPSHOT_TIME_FORMAT = "%Y%m%dT%H%M%SZ"
_SNAPSHOT_TIME = re.compile(r"^\d{8}T\d{6}Z$")
# How long the snapshot archive may take to answer whether it is there at all.
_SNAPSHOT_PROBE_SECONDS = 15
_APT_NO_CACHE = """\
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Dpkg::Options { "--force-confdef"; "--force-confold"; };
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
"""
_LOCK_HEADER = """\
# The Debian base of offline builds: mmdebstrap --variant=minbase of `suite` from Debian's mirror,
# every file stamped at `source_date_epoch`, and exactly these packages (where neither the mirror nor
# the snapshot archive serves them, the base is labelled off-lock). The same lock gives the same base
# image, byte for byte, on any machine. Regenerate with `hpcbox lock`.
"""


@dataclass(frozen=True)
class BaseImage:
    ref: str
    id: str
    suite: str
    created: bool
    moved: tuple[offlock.MovedPin, ...] = ()  # the lock's packages it has at other versions (off-lock)


@dataclass(frozen=True)
class BaseLock:
    suite: str
    source_date_epoch: int
    packages: Mapping[str, str] = field(default_factory=dict)
    # When snapshot.debian.org served exactly these versions (the lock was resolved from it); None
    # where it could not be reached. Not part of the digest: where the packages come from does not
    # change the base.
    snapshot: str | None = None

    @property
    def digest(self) -> str:
        """Names the base made from this lock: a changed lock, or a change in what hpcbox makes of
        mmdebstrap's tarball, never reuses an older base."""
        canonical = json.dumps(
            [self.suite, self.source_date_epoch, sorted(self.packages.items()), TARBALL_EDITS]
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]

    def to_toml(self) -> str:
        packages = "".join(f'"{name}" = "{version}"\n' for name, version in sorted(self.packages.items()))
        snapshot = f'snapshot = "{self.snapshot}"\n' if self.snapshot else ""
        return (
            f'{_LOCK_HEADER}suite = "{self.suite}"\nsource_date_epoch = {self.source_date_epoch}\n'
            f"{snapshot}\n[packages]\n{packages}"
        )


def read_lock(path: Path) -> BaseLock:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise HpcboxError(
            f"{path}: cannot read the base lock: {exc}", "regenerate it: `hpcbox lock`"
        ) from exc
    suite, epoch, packages = data.get("suite"), data.get("source_date_epoch"), data.get("packages")
    if suite not in SUITES:
        raise HpcboxError(f"{path}: suite: {suite!r} is not one of {', '.join(SUITES)}", "run `hpcbox lock`")
    if not isinstance(epoch, int) or epoch < 0:
        raise HpcboxError(f"{path}: source_date_epoch: {epoch!r} is not seconds", "run `hpcbox lock`")
    if (
        not isinstance(packages, dict)
        or not packages
        or any(not isinstance(v, str) for v in packages.values())
    ):
        raise HpcboxError(f"{path}: packages: must map each package to its version", "run `hpcbox lock`")
    snapshot = data.get("snapshot")
    if snapshot is not None and not (isinstance(snapshot, str) and _SNAPSHOT_TIME.match(snapshot)):
        raise HpcboxError(
            f"{path}: snapshot: {snapshot!r} is not a snapshot.debian.org time such as 20261123T091500Z",
            "run `hpcbox lock`",
        )
    return BaseLock(suite, epoch, dict(packages), snapshot)


def lock_path(root: Path, docker_dir: str = "docker") -> Path:
    return root / docker_dir / "lock" / LOCK_NAME


def lock_file(docker_dir: str = "docker") -> str:
    """The base lock as a project names it, in what an off-lock base says moved."""
    return f"{docker_dir}/lock/{LOCK_NAME}"


def project_lock(root: Path, docker_dir: str = "docker") -> BaseLock | None:
    """The project's base lock, if it pins one."""
    path = lock_path(root, docker_dir)
    return read_lock(path) if path.is_file() else None


def own_lock() -> BaseLock:
    """hpcbox's own pinned base: the docker/lock/base.toml of the template it ships (`hpcbox init`'s).
    Its SIF helper and the mini cluster's node image stand on it, as do the images of a project whose
    lock is the template's, so that a machine bootstraps Debian once."""
    docker_dir = docker_template()
    lock = project_lock(docker_dir.parent, docker_dir.name)
    if lock is None:
        raise HpcboxError(
            f"no Debian base lock in {docker_dir}", "run `hpcbox lock` in hpcbox's own checkout"
        )
    return lock


BASE_REPOSITORY = "hpcbox/debian"
# What the bootstrap changes in mmdebstrap's tarball (_engine_neutral), named in every base's digest.
TARBALL_EDITS = "no device nodes; /run/secrets in name order"


def base_ref(suite: str = DEFAULT_SUITE, lock: BaseLock | None = None, *, canonical: bool = False) -> str:
    """The base's tag here (HPCBOX_BASE_REPOSITORY renames it), or with ``canonical`` everywhere."""
    repository = BASE_REPOSITORY if canonical else os.environ.get("HPCBOX_BASE_REPOSITORY", BASE_REPOSITORY)
    return f"{repository}:{lock.suite}-{lock.digest}" if lock else f"{repository}:{suite}"


def ensure_base(
    suite: str = DEFAULT_SUITE,
    *,
    lock: BaseLock | None = None,
    mirror: str | None = None,
    ref: str | None = None,
    force: bool = False,
    strict: bool = False,
    lock_name: str = lock_file(),
    on_line: Callable[[str], None] | None = None,
    say: Callable[[str], None] = print,
) -> BaseImage:
    """The bootstrapped base image, made only if missing (or when ``force``).

    With ``lock`` (the file ``lock_name``), its suite, time and packages: from its snapshot once the
    mirror has moved on, else off-lock as the mirror serves them (refused when ``strict``); without,
    ``suite`` as the mirror serves it today. ``mirror`` defaults to Debian's own (deb.debian.org), the
    suite without -updates and -security.
    """
    suite = _known_suite(lock.suite if lock else suite)
    target = ref or base_ref(suite, lock)
    if not force and (made := _made(target, suite, strict)) is not None:
        return made
    waiting = functools.partial(say, f"hpcbox: another hpcbox is bootstrapping {target}; waiting for it")
    with one_at_a_time(f"base {target}", on_wait=waiting):
        if not force and (made := _made(target, suite, strict)) is not None:
            return made
        return _make_base(suite, target, lock, mirror, strict, lock_name, on_line, say)


def _made(target: str, suite: str, strict: bool) -> BaseImage | None:
    existing = docker.image(target)
    if existing is None:
        return None
    moved = offlock.from_labels(existing.labels)
    offlock.refuse_if(moved, strict, f"base image ({target} is off-lock)")
    return BaseImage(target, existing.id, suite, created=False, moved=moved)


def _make_base(
    suite: str,
    target: str,
    lock: BaseLock | None,
    mirror: str | None,
    strict: bool,
    lock_name: str,
    on_line: Callable[[str], None] | None,
    say: Callable[[str], None],
) -> BaseImage:
    epoch = lock.source_date_epoch if lock else int(time.time())
    moved: tuple[offlock.MovedPin, ...] = ()
    say(f"hpcbox: bootstrapping the Debian {suite} base image {target} with mmdebstrap (once)")
    lines = on_line or BootstrapPhases(say)
    with _workdir() as work:
        if lock is None:
            layer = _bootstrap(suite, epoch, work, mirror, lines)
        else:
            layer, moved = _bootstrap_locked(lock, lock_name, work, mirror, lines, say)
            offlock.refuse_if(moved, strict, "base image")
        image_id = _load(layer, target, suite, epoch, lock, work, moved)
    return BaseImage(target, image_id, suite, created=True, moved=moved)


def _bootstrap_locked(
    lock: BaseLock, lock_name: str, work: Path, mirror: str | None, on_line, say: Callable[[str], None]
) -> tuple[Path, tuple[offlock.MovedPin, ...]]:
    """The lock's packages from the mirror, or from the lock's snapshot when the mirror cannot serve them;
    where neither can, what serves closest (the snapshot's, else the mirror's) and the pins that moved."""
    layer: Path | None = None
    try:
        layer = _bootstrap(lock.suite, lock.source_date_epoch, work, mirror, on_line)
        moved = moved_packages(lock, installed_packages(layer), lock_name)
        if not moved:
            return layer, ()
        failed = f"Debian's {lock.suite} mirror has moved on ({moved[0].describe()})"
    except HpcboxError as unreachable:
        if lock.snapshot is None:
            raise
        failed = unreachable.message
    at = lock.snapshot
    if at is None:  # the mirror's bootstrap worked, and pins moved: when did the archive have them?
        pins = {pin.package: pin.locked for pin in moved if pin.locked}
        at, line = snapshot_time_of(pins, lock.source_date_epoch)
        say(f"hpcbox: {line}" if at else f"hpcbox: {failed}, and its lock records no snapshot time ({line})")
    if at is not None:
        fix = "run `hpcbox lock` to pin today's base (and rebuild)"
        if layer is None:
            snapshot = reachable_snapshot(at, lock.suite, failed, fix)
        else:
            snapshot = None if snapshot_unreachable(at, lock.suite) else snapshot_mirror(at)
        if snapshot is not None:
            say(f"hpcbox: {failed}; bootstrapping from the snapshot archive at {at}")
            (work / "snapshot").mkdir()
            layer = _bootstrap(lock.suite, lock.source_date_epoch, work / "snapshot", snapshot, on_line)
            moved = moved_packages(lock, installed_packages(layer), lock_name)
    assert layer is not None
    return layer, tuple(moved)


def relock(
    suite: str = DEFAULT_SUITE,
    *,
    mirror: str | None = None,
    on_line: Callable[[str], None] | None = None,
    say: Callable[[str], None] = print,
) -> tuple[BaseLock, BaseImage]:
    """Bootstrap ``suite`` as Debian serves it now and pin that: the new lock and its base image.

    Resolved from the snapshot archive at this moment where it answers (the lock records the time,
    so the same versions stay obtainable), else from the mirror."""
    suite = _known_suite(suite)
    epoch = int(time.time())
    snapshot = None
    if mirror is None:
        snapshot = snapshot_now(
            suite,
            "the base is pinned from Debian's mirror with no snapshot time, so it rebuilds only while "
            "the mirror serves these versions",
            say,
            epoch,
        )
    with _workdir() as work:
        layer = _bootstrap(suite, epoch, work, snapshot_mirror(snapshot) if snapshot else mirror, on_line)
        lock = BaseLock(suite, epoch, installed_packages(layer), snapshot)
        target = base_ref(suite, lock)
        image_id = _load(layer, target, suite, epoch, lock, work)
    return lock, BaseImage(target, image_id, suite, created=True)


def snapshot_url() -> str:
    """snapshot.debian.org, or what HPCBOX_SNAPSHOT_URL names instead (a mirror of it, or a proxy)."""
    return os.environ.get("HPCBOX_SNAPSHOT_URL", "https://snapshot.debian.org").rstrip("/")


def snapshot_mirror(snapshot: str) -> str:
    """The Debian archive as it was at ``snapshot``, as a mirror URL."""
    return f"{snapshot_url()}/archive/debian/{snapshot}"


def snapshot_now(
    suite: str, without: str, say: Callable[[str], None], epoch: int | None = None
) -> str | None:
    """This moment (or ``epoch``) as a snapshot time to lock ``suite`` from; None, after saying so and
    ``without`` (what that means), where the snapshot archive cannot be reached."""
    snapshot = time.strftime(SNAPSHOT_TIME_FORMAT, time.gmtime(epoch))
    unreachable = snapshot_unreachable(snapshot, suite)
    if unreachable:
        say(f"hpcbox: the snapshot archive cannot be reached ({unreachable}): {without}")
        return None
    return snapshot


def reachable_snapshot(snapshot: str, suite: str, failed: str, fix: str) -> str:
    """The mirror URL of the snapshot archive at ``snapshot`` to build from again, once ``failed`` (what
    the mirror could not do) stopped a build; one line with both where the archive cannot be reached."""
    unreachable = snapshot_unreachable(snapshot, suite)
    if unreachable:
        raise HpcboxError(
            f"{failed}, and the snapshot archive it was locked from cannot be reached ({unreachable})",
            "let this machine reach snapshot.debian.org (or set HPCBOX_SNAPSHOT_URL to a mirror of it), "
            f"or {fix}",
        )
    return snapshot_mirror(snapshot)


def build_from_snapshot(
    snapshot: str | None,
    suite: str,
    build: Callable[[Mapping[str, Path]], None],
    gone_line: str,
    say: Callable[[str], None],
    pins: Mapping[str, str] | None = None,
    locked_at: int | None = None,
) -> bool:
    """``build`` again with its apt steps reading the snapshot archive at ``snapshot`` (handed in as the
    `apt_mirror` build secret), once ``gone_line`` (a pinned version the mirror dropped) stopped it.
    Where the lock records no snapshot time, the one the archive's API gives for ``pins`` (the versions
    that moved, package → version; not before ``locked_at``, when the lock was made). False, after
    saying why, where there is no time, the archive cannot be reached or it lacks a pinned version too:
    then only an off-lock build is left."""
    if snapshot is None:
        snapshot, line = snapshot_time_of(pins or {}, locked_at)
        if snapshot is None:
            say(f"hpcbox: {gone_line}, and its lock records no snapshot time ({line})")
            return False
        say(f"hpcbox: {line}")
    unreachable = snapshot_unreachable(snapshot, suite)
    if unreachable:
        say(f"hpcbox: {gone_line}, and the snapshot archive cannot be reached ({unreachable})")
        return False
    say(f"hpcbox: {gone_line}; building from the snapshot archive at {snapshot}")
    with tempfile.TemporaryDirectory(prefix="hpcbox-mirror-") as folder:
        secret = Path(folder) / "apt_mirror"
        secret.write_text(snapshot_mirror(snapshot))
        try:
            build({"apt_mirror": secret})
        except HpcboxError as failed:
            still = superseded_pin(failed.details)
            if still is None:
                raise
            say(f"hpcbox: the snapshot archive at {snapshot} does not serve {still[0]} {still[1]} either")
            return False
    return True


def snapshot_time_of(pins: Mapping[str, str], locked_at: int | None = None) -> tuple[str | None, str]:
    """For a lock that records no snapshot time: the earliest one at which the snapshot archive could serve
    all of ``pins`` (package → version) together, the latest `first_seen` of their files (this machine's
    architecture, or `all`) as its machine-readable API (/mr/binary) tells, and one line saying it was
    found; (None, why) where the archive does not know a version or cannot be reached.

    The archive keeps every file, but a suite's index lists a version only while the suite holds it: a
    version that entered the pool before its suite took it (a stable point release) is not served at
    that time yet, and the build from it then says so and goes off-lock."""
    seen: dict[str, str] = {}
    for package, version in sorted(pins.items()):
        first, why = _first_seen(package, version)
        if first is None:
            return None, why
        seen[f"{package} {version}"] = first
    if not seen:
        return None, "no pinned version to look one up by"
    latest = max(seen, key=lambda pin: seen[pin])
    more = f" and {len(seen) - 1} more" if len(seen) > 1 else ""
    at = seen[latest]
    locked = time.strftime(SNAPSHOT_TIME_FORMAT, time.gmtime(locked_at)) if locked_at is not None else ""
    # The lock was resolved from what the mirror's index listed then: at that time every pin was served.
    if locked > at:
        return locked, f"found the snapshot archive's time for {latest}{more}: {locked}, when it was locked"
    return at, f"found the snapshot archive's time for {latest}{more}: {at} (the lock records none)"


def _first_seen(package: str, version: str) -> tuple[str | None, str]:
    """When the snapshot archive first had ``package`` (NAME, or NAME:ARCH) at ``version``; else None, why."""
    import urllib.parse  # the snapshot archive's modules at first use: every submit imports this module
    from http import HTTPStatus

    name, _, arch = package.partition(":")
    arch = arch or _debian_arch()
    quoted = f"{urllib.parse.quote(name, safe='')}/{urllib.parse.quote(version, safe='')}"
    answer, status, why = _ask_mr(f"binary/{quoted}/binfiles?fileinfo=1")
    if answer is None:
        fails = (
            f"does not know {package} {version}" if status == HTTPStatus.NOT_FOUND else "cannot be reached"
        )
        return None, f"the snapshot archive {fails} ({why})"
    files = files_first_seen(answer, arch)
    for digest in [digest for digest, first in files.items() if not first]:  # not in the answer's fileinfo
        info, _, _ = _ask_mr(f"file/{digest}/info")
        files[digest] = _earliest_in_debian(info.get("result") if info else None) or ""
    first = min(filter(None, files.values()), default=None)
    return first, "" if first else f"the snapshot archive has no {arch} or all file of {package} {version}"


def files_first_seen(binfiles: Mapping, arch: str) -> dict[str, str]:
    """From snapshot.debian.org's answer to /mr/binary/NAME/VERSION/binfiles?fileinfo=1 (as parsed JSON):
    each file of ``arch`` or `all` by its hash → when it first appeared in the `debian` archive ("" where
    the answer's fileinfo does not say)."""
    fileinfo = binfiles.get("fileinfo") if isinstance(binfiles.get("fileinfo"), dict) else {}
    files = {}
    for entry in binfiles.get("result") or ():
        if not isinstance(entry, dict) or not isinstance(entry.get("hash"), str):
            continue
        info = fileinfo.get(entry["hash"])
        # the architecture, or where an answer leaves it out, the one its .deb's name ends with
        names = [each.get("name", "") for each in info or () if isinstance(each, dict)]
        archs = {entry["architecture"]} if "architecture" in entry else {_deb_arch(name) for name in names}
        if archs & {arch, "all"}:
            files[entry["hash"]] = _earliest_in_debian(info) or ""
    return files


def _earliest_in_debian(entries: object) -> str | None:
    """The earliest `first_seen` of a file's entries (its names in the archives) in the `debian` archive."""
    times = [
        each["first_seen"]
        for each in (entries if isinstance(entries, list) else ())
        if isinstance(each, dict)
        and each.get("archive_name") == "debian"
        and _SNAPSHOT_TIME.match(str(each.get("first_seen", "")))
    ]
    return min(times, default=None)


def _deb_arch(name: str) -> str:
    return name.removesuffix(".deb").rpartition("_")[2] if name.endswith(".deb") else ""


def _ask_mr(path: str) -> tuple[dict | None, int | None, str]:
    """The snapshot archive's JSON answer at /mr/``path``; else None, the HTTP status if any, and why."""
    import urllib.error
    import urllib.request

    url = f"{snapshot_url()}/mr/{path}"
    try:
        with urllib.request.urlopen(url, timeout=_SNAPSHOT_PROBE_SECONDS) as answer:
            data = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return None, exc.code, f"{url} answers {exc.code} {exc.reason}"
    except (urllib.error.URLError, OSError) as exc:
        return None, None, f"{url}: {getattr(exc, 'reason', exc)}"
    except ValueError as exc:
        return None, None, f"{url}: not JSON ({exc})"
    return (data, None, "") if isinstance(data, dict) else (None, None, f"{url}: not an answer of its API")


def snapshot_unreachable(snapshot: str, suite: str) -> str | None:
    """Why the snapshot archive cannot serve ``suite`` as it was at ``snapshot``; None when it can."""
    import urllib.error
    import urllib.request

    url = f"{snapshot_mirror(snapshot)}/dists/{suite}/Release"
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, method="HEAD"), timeout=_SNAPSHOT_PROBE_SECONDS
        ):
            return None
    except urllib.error.HTTPError as exc:
        return f"{url} answers {exc.code} {exc.reason}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {getattr(exc, 'reason', exc)}"


def _known_suite(suite: str) -> str:
    if suite not in SUITES:
        raise HpcboxError(f"unknown Debian suite {suite!r}", f"choose one of: {', '.join(SUITES)}")
    return suite


WORKDIR_PREFIX = "hpcbox-base-"


def scratch_dir() -> Path:
    """Where bootstraps work: on disk (/tmp is often a small tmpfs; a root filesystem is ~120 MB)."""
    return Path("/var/tmp" if os.access("/var/tmp", os.W_OK) else tempfile.gettempdir())


class _workdir:
    """A scratch folder named after this process; those of processes that died mid-bootstrap go first."""

    def __enter__(self) -> Path:
        if os.geteuid() != 0:
            raise HpcboxError(
                "bootstrapping a base image needs root (mmdebstrap creates device nodes)",
                "run `hpcbox base` as root, or pull a registry base instead",
            )
        scratch = scratch_dir()
        for left in scratch.glob(f"{WORKDIR_PREFIX}*-*"):
            pid = left.name[len(WORKDIR_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                shutil.rmtree(left, ignore_errors=True)
        self.path = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-", dir=scratch))
        return self.path

    def __exit__(self, *_exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class BootstrapPhases:
    """mmdebstrap's progress for a person: the phases it announces ("I: downloading packages with
    apt..."), each with the time since the bootstrap began; apt's own lines only in a failure's error."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.started = time.monotonic()

    def __call__(self, line: str) -> None:
        if line.startswith("I: ") and line.endswith("..."):
            self.say(f"  {line[3:]} (at {time.monotonic() - self.started:.0f} s)")


def _bootstrap(suite: str, epoch: int, work: Path, mirror: str | None, on_line) -> Path:
    mmdebstrap = proc.require("mmdebstrap", "install it: `apt-get install mmdebstrap` (`./bootstrap` does)")
    layer = work / "rootfs.tar"
    apt_config = work / "90hpcbox"
    apt_config.write_text(_APT_NO_CACHE)
    hooks = [f"--customize-hook=copy-in {apt_config} /etc/apt/apt.conf.d"]
    source = mirror or DEFAULT_MIRROR
    if source != DEFAULT_MIRROR:
        # A snapshot's Release files are past their Valid-Until, and the base is the same wherever its
        # packages came from: its sources name Debian's mirror, as they would from deb.debian.org.
        source = f"deb [check-valid-until=no] {source} {suite} main"
        canonical = shlex.quote(f"deb {DEFAULT_MIRROR} {suite} main")
        hooks.append(f'--customize-hook=echo {canonical} > "$1/etc/apt/sources.list"')
    proc.stream(
        [mmdebstrap, "--variant=minbase", "--mode=root", "--format=tar", *hooks, suite, str(layer), source],
        what=f"bootstrap Debian {suite} with mmdebstrap",
        hint="check that the Debian mirror is reachable from this machine (or pass another mirror)",
        on_line=on_line,
        env={**os.environ, "SOURCE_DATE_EPOCH": str(epoch)},
    )
    _engine_neutral(layer, epoch)
    return layer


def _engine_neutral(layer: Path, epoch: int) -> None:
    """Make the root filesystem tarball ``layer`` what every Docker engine keeps of it, so that an image
    built on it, and its SIF, are the same bytes on a rootless engine as on a rootful one: without
    mmdebstrap's device nodes in /dev (a rootless engine cannot make them and drops them as it loads the
    base; a container gets /dev from its runtime, a SIF from Apptainer), and with /run/secrets, BuildKit's
    mount point for build secrets (a rootful engine leaves the folder it makes in the step's layer, a
    rootless one does not). Every other byte stays mmdebstrap's."""
    data = layer.read_bytes()
    with tarfile.open(layer) as archive:
        members = archive.getmembers()
    # (from, to, what goes there instead) in the file's order
    edits = [(member.offset, member.offset_data, b"") for member in members if member.isdev()]
    if not any(_path(member) == "run/secrets" for member in members):
        secrets = tarfile.TarInfo("./run/secrets/")
        secrets.type, secrets.mode, secrets.mtime = tarfile.DIRTYPE, 0o755, epoch
        at = _sorted_place(members, "run", "secrets")
        edits.append((at, at, secrets.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")))
    pieces, at = [], 0
    for start, stop, instead in sorted(edits):
        pieces += [data[at:start], instead]
        at = stop
    layer.write_bytes(b"".join([*pieces, data[at:]]))


def _path(member: tarfile.TarInfo) -> str:
    return member.name.removeprefix("./").rstrip("/")


def _sorted_place(members: list[tarfile.TarInfo], folder: str, name: str) -> int:
    """Where in a tarball sorted by name (`tar --sort=name`, as mmdebstrap writes it) an entry ``name``
    of ``folder`` goes: after the folder and every sibling before it with what it holds, before the next.
    There, tar restores the folder's time after making the new entry, as it does for every other."""
    inside = [member for member in members if _path(member).startswith(f"{folder}/")]
    after = [member for member in inside if _path(member).split("/")[1] > name]
    if after:
        return after[0].offset
    last = inside[-1] if inside else next(member for member in members if _path(member) == folder)
    return last.offset_data + -(-last.size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def installed_packages(layer: Path) -> dict[str, str]:
    """Package → version of what dpkg has installed in a root filesystem tarball."""
    with tarfile.open(layer) as archive:
        member = next(m for m in archive if m.name.lstrip("./") == "var/lib/dpkg/status")
        status = archive.extractfile(member)
        assert status is not None
        text = status.read().decode()
    packages = {}
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " ")
        if fields.get("Status", "").endswith(" installed"):
            arch = fields.get("Architecture", "all")
            name = fields["Package"] if arch in ("all", _debian_arch()) else f"{fields['Package']}:{arch}"
            packages[name] = fields["Version"]
    return packages


def moved_packages(lock: BaseLock, installed: Mapping[str, str], lock_name: str) -> list[offlock.MovedPin]:
    """How ``installed`` differs from the lock's packages: each one at another version, gone, or added."""
    return [
        offlock.MovedPin(name, lock.packages.get(name, ""), installed.get(name, ""), lock_name)
        for name in sorted({*lock.packages, *installed})
        if lock.packages.get(name) != installed.get(name)
    ]


def _load(
    layer: Path,
    ref: str,
    suite: str,
    epoch: int,
    lock: BaseLock | None,
    work: Path,
    moved: tuple[offlock.MovedPin, ...] = (),
) -> str:
    """Load the root filesystem as a one-layer image whose config holds only fixed values."""
    digest = file_sha256(layer)
    stamp = datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = {"io.hpcbox.base.suite": suite, **({"io.hpcbox.base.lock": lock.digest} if lock else {})}
    labels.update(offlock.labels_for(moved))
    config = {
        "architecture": _debian_arch(),
        "os": "linux",
        "created": stamp,
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
            "Cmd": ["bash"],
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{digest}"]},
        "history": [{"created": stamp, "created_by": f"mmdebstrap --variant=minbase {suite}"}],
    }
    config_bytes = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    image_id = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    manifest = [{"Config": "config.json", "RepoTags": [ref], "Layers": [f"{digest}/layer.tar"]}]
    archive_path = work / "image.tar"
    with tarfile.open(archive_path, "w") as archive:
        for name, data in (("config.json", config_bytes), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, fileobj=io.BytesIO(data))
        archive.add(layer, arcname=f"{digest}/layer.tar")
    with archive_path.open("rb") as stream:
        docker.load(stream)
    loaded = docker.image(ref)
    if loaded is None or loaded.id != image_id:
        got = loaded.id if loaded else "no image"
        raise HpcboxError(f"loading the base image {ref} gave {got}, not {image_id}")
    return image_id


def _debian_arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def superseded_pin(apt_output: str) -> tuple[str, str] | None:
    """(package, version) of the pin apt could not find, when that is why it failed."""
    gone = _APT_VERSION_GONE.search(apt_output)
    return None if gone is None else (gone[2], gone[1])
