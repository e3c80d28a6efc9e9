"""Apptainer (or Singularity): the host's, through spython, or a real one inside hpcbox's helper container.

Every command runs in a work directory with paths relative to it: on the host that directory is the
working directory, in the helper container it is bind-mounted at /work. So callers write the same
relative paths whichever engine runs, and results land on the host without copying.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from hpcbox.errors import HpcboxError
from hpcbox.shipped import shipped
from hpcbox.tools import docker, proc

ENGINES = ("auto", "host", "container")
HELPER_DIR = shipped("apptainer")
HELPER_DOCKERFILE = HELPER_DIR / "helper.Dockerfile"
# What the helper adds to the base; `hpcbox lock` writes it (SIF_WRITERS at their exact versions).
HELPER_LOCK = HELPER_DIR / "lock" / "apt-helper.txt"
HELPER_SID_SCRIPT = HELPER_DIR / "add-sid.sh"
# The zlib stand-in mksquashfs compresses gzip with in the fast path, its source and what compiles it.
HELPER_ZLIB_SOURCE = HELPER_DIR / "zlib-libdeflate.c"
HELPER_BUILD_LOCK = HELPER_DIR / "lock" / "apt-helper-build.txt"
HELPER_BUILD_PACKAGES = ("gcc", "libc6-dev", "libdeflate-dev", "zlib1g-dev")
ZLIB_LIBDEFLATE = "/usr/local/lib/hpcbox/zlib-libdeflate.so"
# HELPER_LOCK's line for the snapshot.debian.org time its pins were resolved from, where it answered.
HELPER_SNAPSHOT_LINE = re.compile(r"(?m)^# snapshot: (\d{8}T\d{6}Z)$")
# What the helper is for; `hpcbox lock` writes these into HELPER_LOCK.
HELPER_PACKAGES = (
    "apptainer/sid",
    "squashfs-tools/sid",
    "squashfuse",
    "fuse2fs",
    "fuse-overlayfs",
    "uidmap",
    "libdeflate0",
)
# The programs and the library whose versions decide a SIF's bytes (with the compressors' libraries in
# the pinned base): pinned. The rest of the helper follows the mirror, as a new version of them writes
# the same SIF.
SIF_WRITERS = ("apptainer", "squashfs-tools", "libdeflate0", "libdeflate-dev")
HELPER_REPOSITORY = "hpcbox/apptainer-helper"
HELPER_WORKDIR = "/work"
# What `apptainer build` and a SIF mount need in a container; --privileged fails on many hosts.
HELPER_RUN_OPTIONS = (
    "--cap-add",
    "SYS_ADMIN",
    "--security-opt",
    "seccomp=unconfined",
    "--security-opt",
    "apparmor=unconfined",
    "--device",
    "/dev/fuse",
)
ENGINE_HINT = (
    "install Apptainer (https://apptainer.org/docs/admin/main/installation.html) or use --engine container"
)
_HELPER_START_FAILURES = (
    (
        "/dev/fuse",
        "this host has no /dev/fuse: load the module (`modprobe fuse`), or install Apptainer "
        "on the host and use --engine host",
    ),
    (
        "operation not permitted",
        "this Docker engine refuses SYS_ADMIN or unconfined seccomp (rootless or "
        "restricted): use a rootful engine, or install Apptainer and use --engine host",
    ),
    (
        "cap",
        "this Docker engine refuses SYS_ADMIN (rootless or restricted): use a rootful engine, "
        "or install Apptainer and use --engine host",
    ),
)
_HELPER_START_DEFAULT_HINT = "fix what the Docker engine names, or install Apptainer and use --engine host"
_SIF_LIST_ROW = re.compile(r"^(\d+)\s*\|(\d+)\s*\|\S+\s*\|(\d+)-(\d+)\s*\|(.+)$")


@dataclass(frozen=True)
class Command:
    """One step of a script: ``tool`` (apptainer, mksquashfs, unsquashfs) with ``args``, stdout to a file."""

    tool: str
    args: tuple[str, ...]
    stdout: str = ""


@dataclass(frozen=True)
class SifObject:
    """One data object listed by `apptainer sif list`."""

    id: int
    group: int
    start: int
    end: int
    type: str


@dataclass(frozen=True)
class Apptainer:
    """Where Apptainer runs: ``kind`` "host" (``program`` is its path) or "container" (the helper image)."""

    kind: str
    program: str

    def argv(
        self,
        tool: str,
        args: Sequence[str],
        workdir: Path,
        *,
        mounts: bool = False,
        stdin: bool = False,
        env: Mapping[str, str] | None = None,
        binds: Sequence[tuple[str, str]] = (),
    ) -> list[str]:
        """The command line running ``tool args`` (tool: apptainer, mksquashfs, unsquashfs) in ``workdir``.

        ``mounts``: the command mounts filesystems or builds (needs the helper's extra privileges).
        ``binds``: (engine host path, helper path) pairs bound read-only; a missing host path is an
        error, not an empty folder (as `-v` would make it).
        """
        if self.kind == "host":
            return [self.program if tool == "apptainer" else tool, *args]
        command = [
            docker.build_cli(),
            "run",
            "--rm",
            "--name",
            f"hpcbox-apptainer-{os.urandom(4).hex()}",
            "--network",
            "none",
            "-w",
            HELPER_WORKDIR,
            "-v",
            f"{workdir.resolve()}:{HELPER_WORKDIR}",
        ]
        if stdin:
            command.append("-i")
        if mounts:
            command += HELPER_RUN_OPTIONS
        for source, target in binds:
            command += ["--mount", f"type=bind,source={source},target={target},readonly"]
        for key, value in (env or {}).items():
            command += ["-e", f"{key}={value}"]
        return [*command, self.program, tool, *args]

    def run(
        self,
        tool: str,
        args: Sequence[str],
        workdir: Path,
        *,
        what: str,
        mounts: bool = False,
        env: Mapping[str, str] | None = None,
        binds: Sequence[tuple[str, str]] = (),
    ) -> str:
        """Run to completion; returns stdout. Failures carry the tool's own error lines."""
        with self._helper_start_errors():
            done = proc.run(
                self.argv(tool, args, workdir, mounts=mounts, env=env, binds=binds),
                what=what,
                hint=self._hint(),
                cwd=workdir,
                env=self._host_env(env),
            )
        return done.stdout

    def stream(
        self,
        tool: str,
        args: Sequence[str],
        workdir: Path,
        *,
        what: str,
        mounts: bool = False,
        env: Mapping[str, str] | None = None,
        stdin: IO[bytes] | None = None,
        on_line: Callable[[str], None] | None = None,
        binds: Sequence[tuple[str, str]] = (),
    ) -> list[str]:
        """Run with output shown line by line as it comes (progress), and its tail kept for errors."""
        argv = self.argv(tool, args, workdir, mounts=mounts, stdin=stdin is not None, env=env, binds=binds)
        with self._helper_start_errors():
            return proc.stream(
                argv,
                what=what,
                hint=self._hint(),
                cwd=workdir,
                env=self._host_env(env),
                stdin=stdin,
                on_line=on_line,
            )

    def script(
        self,
        commands: Sequence[Command],
        workdir: Path,
        *,
        what: str,
        mounts: bool = False,
        on_line: Callable[[str], None] | None = None,
    ) -> list[str]:
        """Run several commands as one shell script (one helper container, not one per command)."""
        lines = ["set -e"]
        for command in commands:
            program = self.program if command.tool == "apptainer" and self.kind == "host" else command.tool
            line = shlex.join([program, *command.args])
            if command.stdout:
                line += " > " + shlex.quote(command.stdout)
            lines.append(line)
        text = "\n".join(lines)
        if self.kind == "host":
            argv = ["sh", "-c", text]
        else:
            argv = self.argv("sh", ["-c", text], workdir, mounts=mounts)
        with self._helper_start_errors():
            return proc.stream(argv, what=what, hint=self._hint(), cwd=workdir, on_line=on_line or _discard)

    def versions(self, workdir: Path, *, libdeflate: bool = False) -> str:
        """Apptainer's and mksquashfs's versions on one line (and, with ``libdeflate``, libdeflate's where
        the helper has zlib-libdeflate.so for mksquashfs's gzip): a SIF's bytes depend on them."""
        apptainer = shlex.quote(self.program) if self.kind == "host" else "apptainer"
        script = f"{apptainer} --version && mksquashfs -version | head -n 1"
        if libdeflate:
            version = "$(dpkg-query -W -f '${Version}' libdeflate0)"
            script += f' && if [ -e {ZLIB_LIBDEFLATE} ]; then echo "gzip by libdeflate {version}"; fi'
        text = self.run("sh", ["-c", script], workdir, what="ask Apptainer and mksquashfs for their versions")
        return "; ".join(line.strip() for line in text.splitlines() if line.strip())

    def inspect(self, sif: Path) -> dict:
        """`apptainer inspect` of ``sif``: its labels, environment, runscript and definition, by name."""
        if self.kind == "host" and shutil.which("singularity"):  # spython drives `singularity`
            from spython.main import Client

            result = Client.inspect(str(sif), json=True, quiet=True)
            if not isinstance(result, dict):
                raise HpcboxError(f"cannot inspect {sif}: {result}", self._hint())
        else:
            text = self.run(
                "apptainer", ["inspect", "--all", "--json", sif.name], sif.parent, what=f"inspect {sif.name}"
            )
            result = json.loads(text)
        data = result.get("data", result)
        return data.get("attributes", data)

    @contextlib.contextmanager
    def _helper_start_errors(self) -> Iterator[None]:
        """Turn "the helper container could not start" into one line naming the fix."""
        try:
            yield
        except HpcboxError as exc:
            if self.kind != "container":
                raise
            line = _daemon_line(f"{exc.message}\n{exc.details}")
            if line is None:
                raise
            hint = next(
                (hint for marker, hint in _HELPER_START_FAILURES if marker in line.lower()),
                _HELPER_START_DEFAULT_HINT,
            )
            raise HpcboxError(
                f"the Apptainer helper container cannot start: {line}", hint, details=exc.details
            ) from exc

    def _hint(self) -> str:
        if self.kind == "host":
            return "see Apptainer's error above; `--engine container` uses hpcbox's own Apptainer instead"
        return "see Apptainer's error above"

    def _host_env(self, env: Mapping[str, str] | None) -> dict[str, str] | None:
        if self.kind == "host" and env:
            return {**os.environ, **env}
        return None


def parse_sif_list(text: str) -> list[SifObject]:
    """The rows of `apptainer sif list` output."""
    rows = []
    for line in text.splitlines():
        match = _SIF_LIST_ROW.match(line.strip())
        if match:
            rows.append(
                SifObject(int(match[1]), int(match[2]), int(match[3]), int(match[4]), match[5].strip())
            )
    return rows


def _discard(line: str) -> None:
    pass


def _daemon_line(text: str) -> str | None:
    """The Docker daemon's complaint when `docker run` itself failed, else None."""
    for line in text.splitlines():
        if "Error response from daemon:" in line:
            return line.split("Error response from daemon:", 1)[1].strip()
    return None


def engine(
    choice: str = "auto",
    *,
    strict: bool = False,
    on_line: Callable[[str], None] | None = None,
    say: Callable[[str], None] = print,
) -> Apptainer:
    """Apptainer on the host when it has one (or ``choice`` says so), else the helper container (an
    off-lock one refused when ``strict``)."""
    if choice not in ENGINES:
        raise HpcboxError(f"--engine: unknown engine {choice!r}", f"choose one of: {', '.join(ENGINES)}")
    if choice in ("auto", "host"):
        program = host_program()
        if program is not None:
            return Apptainer("host", program)
        if choice == "host":
            raise HpcboxError("--engine host: neither `apptainer` nor `singularity` is on PATH", ENGINE_HINT)
    return Apptainer("container", ensure_helper(strict=strict, on_line=on_line, say=say))


def host_program() -> str | None:
    """The host's apptainer (or singularity) as spython finds it, or None."""
    from spython.utils import check_install

    for program in ("apptainer", "singularity"):
        path = shutil.which(program)
        if path is not None and check_install(program, quiet=True):
            return path
    return None


def helper_base_lock():
    """The helper's base: the Debian base hpcbox's own docker/lock/base.toml pins."""
    from hpcbox import baseimage

    docker_dir = shipped("docker")
    lock = baseimage.project_lock(docker_dir.parent, docker_dir.name)
    if lock is None:
        raise HpcboxError(
            f"no Debian base lock for the Apptainer helper in {docker_dir}",
            "run `hpcbox lock` in hpcbox's own checkout",
        )
    return lock


def helper_snapshot() -> str | None:
    """The snapshot archive time the helper's pins were resolved from (`hpcbox lock` records it)."""
    found = HELPER_SNAPSHOT_LINE.search(HELPER_LOCK.read_text())
    return found[1] if found else None


def helper_ref() -> str:
    """The helper image's tag: a hash of its files, its package pins and its pinned base."""
    override = os.environ.get("HPCBOX_APPTAINER_HELPER")
    if override:
        return override
    return _tag(_helper_files())


def _tag(files: Mapping[str, Path | bytes], off_lock_of: str = "") -> str:
    """The helper's tag for its build context ``files``: a hash of them and of its pinned base (and of
    the locked helper an off-lock one stands in for, so that the two never share a tag)."""
    from hpcbox import baseimage

    digest = hashlib.sha256(off_lock_of.encode())
    for source in files.values():
        digest.update((source if isinstance(source, bytes) else source.read_bytes()) + b"\0")
    # The base by its canonical name: a base bootstrapped under another local name (HPCBOX_BASE_REPOSITORY)
    # is the same image, so it gives the same helper, not a second tag of it.
    digest.update(baseimage.base_ref(lock=helper_base_lock(), canonical=True).encode())
    return f"{HELPER_REPOSITORY}:{digest.hexdigest()[:12]}"


def _helper_files() -> dict[str, Path]:
    """The helper's build context: name in it → file."""
    return {
        "Dockerfile": HELPER_DOCKERFILE,
        HELPER_SID_SCRIPT.name: HELPER_SID_SCRIPT,
        HELPER_LOCK.name: HELPER_LOCK,
        HELPER_BUILD_LOCK.name: HELPER_BUILD_LOCK,
        HELPER_ZLIB_SOURCE.name: HELPER_ZLIB_SOURCE,
    }


def ensure_helper(
    *, strict: bool = False, on_line: Callable[[str], None] | None = None, say: Callable[[str], None] = print
) -> str:
    """The helper image (Apptainer + squashfs-tools from Debian, the SIF writers pinned), built from
    Debian's mirror if missing: from the snapshot archive once a pin moved, else off-lock (refused when
    ``strict``)."""
    from hpcbox import baseimage, offlock

    ref = helper_ref()
    existing = docker.image(ref)
    if existing is None and (stand_in := offlock.stand_in(ref, HELPER_REPOSITORY)) is not None:
        ref, existing = stand_in
    if existing is not None:
        offlock.refuse_if(offlock.from_labels(existing.labels), strict, f"SIF helper ({ref} is off-lock)")
        return ref
    base = baseimage.ensure_base(lock=helper_base_lock(), strict=strict, on_line=on_line)
    files: dict[str, Path | bytes] = dict(_helper_files())

    def build(tag: str, labels: Mapping[str, str], secrets: Mapping[str, Path]) -> None:
        docker.build(
            docker.context_tar(files),
            dockerfile="Dockerfile",
            tag_ref=tag,
            build_args={"BASE": base.ref},
            labels=labels,
            secrets=secrets,
            on_line=on_line,
        )

    try:
        build(ref, offlock.labels_for(base.moved), {})
    except HpcboxError as failed:
        gone = baseimage.superseded_pin(failed.details)
        if gone is None:
            raise
        gone_line = f"Debian no longer serves {gone[0]} {gone[1]}, pinned in {_pinned_in(*gone)}"
        locked = functools.partial(build, ref, offlock.labels_for(base.moved))
        # The helper's locks are refreshed with the base's, so the base lock's time is theirs too.
        locked_at = helper_base_lock().source_date_epoch
        snapshot = helper_snapshot()
        if baseimage.build_from_snapshot(snapshot, "sid", locked, gone_line, say, dict([gone]), locked_at):
            return ref
        moved = _moved_helper_pins(base.ref)
        offlock.refuse_if((*base.moved, *moved), strict, "SIF helper")
        for lock in (HELPER_LOCK, HELPER_BUILD_LOCK):
            files[lock.name] = offlock.follow(lock.read_text(), moved).encode()
        of, ref = ref, _tag(files, off_lock_of=ref)
        build(ref, offlock.labels_for((*base.moved, *moved), of=of), {})
    return ref


def helper_moved(ref: str) -> tuple:
    """The pins the helper image ``ref`` was built past (none where it is on-lock)."""
    from hpcbox import offlock

    found = docker.image(ref)
    return offlock.from_labels(found.labels) if found else ()


def _moved_helper_pins(base: str) -> list:
    """The helper's pins (both locks) that Debian no longer serves, asked of apt with sid added."""
    from hpcbox import offlock

    locks = {f"apptainer/lock/{lock.name}": lock.read_text() for lock in (HELPER_LOCK, HELPER_BUILD_LOCK)}
    moved = offlock.moved_in(base, locks, setup=HELPER_SID_SCRIPT.read_text() + "\n")
    return [pin for each in moved.values() for pin in each]


def _pinned_in(package: str, version: str) -> str:
    """Which of the helper's locks pins ``package`` at ``version``, as a path in hpcbox's checkout."""
    pin = f"{package}={version}"
    lock = HELPER_BUILD_LOCK if pin in HELPER_BUILD_LOCK.read_text().splitlines() else HELPER_LOCK
    return f"apptainer/lock/{lock.name}"
