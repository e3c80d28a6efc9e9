"""Apptainer (or Singularity): the host's, through spython, or a real one inside hpcbox's helper container.

Every command runs in a work directory with paths relative to it: on the host that directory is the
working directory, in the helper container it is bind-mounted at /work. So callers write the same
relative paths whichever engine runs, and results land on the host without copying.
"""

from __future__ import annotations

import contextlib
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
from hpcbox.tools import docker, proc

ENGINES = ("auto", "host", "container")
# Where the helper image has the zlib stand-in that mksquashfs compresses gzip with (sif.helper builds it).
ZLIB_LIBDEFLATE = "/usr/local/lib/hpcbox/zlib-libdeflate.so"
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
        timeout_s: float | None = None,
    ) -> list[str]:
        """Run several commands as one shell script (one helper container, not one per command), killed
        past ``timeout_s`` (proc.TimedOut)."""
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
            return proc.stream(
                argv,
                what=what,
                hint=self._hint(),
                cwd=workdir,
                on_line=on_line or _discard,
                timeout_s=timeout_s,
            )

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
            if self.kind != "container" or isinstance(exc, proc.TimedOut):
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


def host_program() -> str | None:
    """The host's apptainer (or singularity) as spython finds it, or None."""
    from spython.utils import check_install

    for program in ("apptainer", "singularity"):
        path = shutil.which(program)
        if path is not None and check_install(program, quiet=True):
            return path
    return None
