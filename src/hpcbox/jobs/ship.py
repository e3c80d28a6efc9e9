"""The ship stage: put a job's inputs on the cluster, sending only what it does not have yet.

Layout under the remote root (default `~/hpcbox`), big things content-addressed and shared by every
project of the user there, small things per project:

    images/sha256/<sha256>.sif         the environment, once per distinct SIF
    data/sha256/<sha256><suffix>       the dataset archive, once per distinct archive (a dataset
                                       directory travels as its deterministic archive, see datasets.py)
    <project>/code/<hash>/             a snapshot of the code's files, once per distinct snapshot
    <project>/scripts/ logs/ runs/     the submit directory (see tools.slurm.submit)

A content-addressed file is uploaded under a hidden temporary name (rsync --partial: an interrupted
upload resumes), its sha256 checked on the cluster, and only then renamed into place: a half or
corrupted upload is never used. Files hpcbox creates there are written with umask 022.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcbox.build.image import code_files
from hpcbox.errors import HpcboxError
from hpcbox.files import file_sha256
from hpcbox.jobs import datasets
from hpcbox.project.config import ProjectConfig
from hpcbox.tools import docker, ssh

DEFAULT_REMOTE_ROOT = "hpcbox"
_DATA_SUFFIXES = (".tar.gz", ".tar.zst", ".tar.xz", ".tar.bz2", ".tgz", ".tar")


@dataclass(frozen=True)
class CodeSnapshot:
    """The project's code as one gzipped tar: each `tool.hpcbox.code` path under its own name."""

    digest: str
    archive: bytes
    files: int

    @property
    def name(self) -> str:
        return self.digest[:16]


@dataclass(frozen=True)
class Dataset:
    """The archive that is sent: the one given, or the cached archive of a dataset directory."""

    path: Path
    sha256: str

    @property
    def remote_name(self) -> str:
        name = self.path.name
        suffix = next((s for s in _DATA_SUFFIXES if name.endswith(s)), self.path.suffix)
        return f"{self.sha256}{suffix}"


@dataclass(frozen=True)
class Payload:
    """What one job needs on the cluster."""

    sif_path: Path
    sif_sha256: str
    sif_size: int
    code: CodeSnapshot
    dataset: Dataset


@dataclass(frozen=True)
class Remote:
    """Where the job's inputs are on the cluster (absolute paths), and what this submit sent."""

    host: str
    submit_dir: str
    sif: str
    code_dir: str
    dataset: str
    sent: tuple[str, ...]  # which of "sif", "dataset", "code" were uploaded now
    bytes_sent: int


def code_snapshot(project: ProjectConfig) -> CodeSnapshot:
    """A reproducible archive of the code (same files, same bytes, same digest)."""
    files = code_files(project)
    if not files:
        raise HpcboxError(
            "tool.hpcbox.code: no files to ship", 'list your code\'s folders, e.g. code = ["src/mypackage"]'
        )
    tar = docker.context_tar(files)
    return CodeSnapshot(hashlib.sha256(tar).hexdigest(), gzip.compress(tar, mtime=0), len(files))


def dataset(path: Path, cache: Path, say: Callable[[str], None] = print) -> Dataset:
    """The dataset at ``path``: one archive as it is, or a directory archived into ``cache``."""
    if path.is_dir():
        made = datasets.archive(path, cache, say)
        return Dataset(made.path, made.sha256)
    if path.is_file():
        return Dataset(path, file_sha256(path))
    problem = "does not exist" if not os.path.lexists(path) else "is neither a file nor a directory"
    raise HpcboxError(
        f"data: {path} {problem}",
        "give the dataset as one archive (e.g. from `python -m hpctrain make-data`) or as a directory",
    )


@dataclass(frozen=True)
class _Layout:
    root: str
    project: str
    payload: Payload

    @property
    def sif(self) -> str:
        return f"{self.root}/images/sha256/{self.payload.sif_sha256}.sif"

    @property
    def dataset(self) -> str:
        return f"{self.root}/data/sha256/{self.payload.dataset.remote_name}"

    @property
    def submit_dir(self) -> str:
        return f"{self.root}/{self.project}"

    @property
    def code_dir(self) -> str:
        return f"{self.submit_dir}/code/{self.payload.code.name}"


def _probe(connection: ssh.Connection, layout: _Layout, root: str) -> tuple[str, dict[str, bool]]:
    """The remote home, and which of the inputs are there already (one round trip)."""
    checks = {"sif": ("-f", layout.sif), "dataset": ("-f", layout.dataset), "code": ("-d", layout.code_dir)}
    lines = ['printf "%s\\n" "$HOME"']
    lines += [
        f"if test {flag} {shlex.quote(path)}; then echo yes; else echo no; fi"
        for flag, path in checks.values()
    ]
    done = connection.run("; ".join(lines), what=f"look at {root} on {connection.target.address}")
    answers = done.stdout.splitlines()
    if len(answers) != 1 + len(checks):
        raise HpcboxError(f"unexpected answer from {connection.target.address}: {done.stdout.strip()!r}")
    return answers[0], {name: answer == "yes" for name, answer in zip(checks, answers[1:], strict=True)}


def remote_root(home: str, root: str) -> str:
    return root if root.startswith("/") else f"{home.rstrip('/')}/{root}"


def ship(
    connection: ssh.Connection,
    payload: Payload,
    project: str,
    *,
    root: str = DEFAULT_REMOTE_ROOT,
    dry_run: bool = False,
    say: Callable[[str], None] = print,
) -> Remote:
    """Send what the cluster lacks of ``payload``; with ``dry_run``, only say what would be sent."""
    relative = _Layout(root, project, payload)
    home, present = _probe(connection, relative, root)
    layout = _Layout(remote_root(home, root), project, payload)
    sent: list[str] = []
    total = 0
    uploads = {
        "sif": (payload.sif_path, layout.sif, payload.sif_sha256, payload.sif_size),
        "dataset": (
            payload.dataset.path,
            layout.dataset,
            payload.dataset.sha256,
            payload.dataset.path.stat().st_size,
        ),
    }
    for name, (local, remote, sha256, size) in uploads.items():
        if present[name]:
            say(f"hpcbox: the cluster has the {name} already ({sha256[:12]})")
            continue
        if dry_run:
            say(f"hpcbox: would upload the {name} {local} ({size:,} bytes) to {remote}")
            continue
        say(f"hpcbox: uploading the {name} ({size / 1e6:,.1f} MB) to {remote}")
        total += _upload_checked(connection, local, remote, sha256, size)
        sent.append(name)
    if present["code"]:
        say(f"hpcbox: the cluster has this code snapshot already ({payload.code.name})")
    elif dry_run:
        say(f"hpcbox: would upload the code snapshot ({payload.code.files} files) to {layout.code_dir}")
    else:
        total += _upload_code(connection, payload.code, layout.code_dir)
        sent.append("code")
    return Remote(
        host=connection.target.address,
        submit_dir=layout.submit_dir,
        sif=layout.sif,
        code_dir=layout.code_dir,
        dataset=layout.dataset,
        sent=tuple(sent),
        bytes_sent=total,
    )


# What rsync's receiver reports when the disk or the user's quota is full (errno 28 and 122).
_NO_ROOM = ("No space left on device", "Disk quota exceeded")


def _upload_checked(connection: ssh.Connection, local: Path, remote: str, sha256: str, size: int) -> int:
    folder, name = remote.rsplit("/", 1)
    partial = f"{folder}/.{name}.partial"
    connection.run(
        f"umask 022 && mkdir -p {shlex.quote(folder)}", what=f"create {folder} on {connection.target.address}"
    )
    progress = ssh.progress_printer(size) if size > 50_000_000 else None
    try:
        transfer = connection.upload(local, partial, on_progress=progress)
    except HpcboxError as failed:
        full = next((sign for sign in _NO_ROOM if sign in failed.details), None)
        if full is None:
            raise
        # Kept for a resumed upload, the part that arrived would only hold on to the space that ran out.
        connection.run(["rm", "-f", "--", partial], what=f"remove {partial}", check=False)
        raise HpcboxError(
            f"the cluster has no room for {local.name} ({size / 1e6:,.0f} MB) in {folder}: {full}",
            "free space there (SIFs of environments no job uses any more can go) or ask for more quota; "
            "nothing was submitted",
        ) from failed
    settle(connection, folder, name, sha256, local.name)
    return transfer.sent


def settle(connection: ssh.Connection, folder: str, name: str, sha256: str, what: str) -> None:
    """Move the upload of ``name`` into place in ``folder`` once its sha256 is right; never a wrong file.

    Two submits of one new SIF upload it to the same partial name (so that an interrupted upload
    resumes): the first to check it moves it into place, and the second then finds the right file in
    place, which is its success too, not a "different sha256".
    """
    temporary, final = shlex.quote(f".{name}.partial"), shlex.quote(name)
    right = f"printf '%s  %s\\n' {sha256} {{}} | sha256sum --check --status"
    # A concurrent upload of the same bytes may move the partial into place between the lines below:
    # what decides is the file in place at the end.
    check = (
        f"cd {shlex.quote(folder)} && "
        f"if {right.format(temporary)}; then chmod 0644 {temporary} 2>/dev/null; "
        f"mv -f {temporary} {final} 2>/dev/null; fi; "
        f"if {right.format(final)}; then :; else rm -f {temporary}; exit 3; fi"
    )
    done = connection.run(check, what=f"check the upload of {what}", check=False)
    if done.returncode == 3:
        raise HpcboxError(
            f"the upload of {what} arrived with a different sha256; it was removed, nothing uses it",
            "run the command again; if it repeats, the remote disk may be failing or full",
        )
    if done.returncode != 0:
        raise HpcboxError(
            f"failed to check the upload of {what}: {(done.stderr or done.stdout).strip()}",
            "the cluster needs `sha256sum` (GNU coreutils)",
        )


def _upload_code(connection: ssh.Connection, code: CodeSnapshot, code_dir: str) -> int:
    parent = code_dir.rsplit("/", 1)[0]
    # Unpacked beside its final place and renamed whole; a concurrent submit of the same snapshot wins
    # the rename and this one's copy is dropped.
    command = (
        f"umask 022 && mkdir -p {shlex.quote(parent)} && "
        f"incoming=$(mktemp -d {shlex.quote(parent)}/.incoming-XXXXXX) && "
        'tar -xzf - -C "$incoming" && chmod 0755 "$incoming" && '
        f'{{ mv -T "$incoming" {shlex.quote(code_dir)} 2>/dev/null || rm -rf "$incoming"; }}'
    )
    connection.run(command, what="upload the code snapshot", input_bytes=code.archive)
    return len(code.archive)
