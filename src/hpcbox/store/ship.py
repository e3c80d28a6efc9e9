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
corrupted upload is never used. What hpcbox makes there is the user's alone, or shared read-only with
the profile's `[store] group` (store.Access): every command that writes runs under the store's umask,
rsync gives an upload its mode, and the folders, and the files a job uses, are given their access at
every submit, so a store made with looser modes is tightened where it is used.

A new SIF or dataset goes up as a delta: the stored file it most likely shares blocks with (store.py
picks it: this project's last job's, else the index's newest of the same flavour and compression) is
linked (or copied) to the temporary name, and rsync sends only the blocks the cluster lacks. A SIF's
squashfs is laid out deterministically, so one added package changes a fraction of a percent of it.
One upload of a file at a time holds a lock beside it: a second submit that needs the same new file
waits and then finds it in place, so it goes up once.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpcbox import store
from hpcbox.build.image import code_files
from hpcbox.errors import FieldError, HpcboxError
from hpcbox.files import SHA256_MEMO, known_sha256
from hpcbox.ledger import JobRecord
from hpcbox.project.config import ProjectConfig
from hpcbox.store import datasets
from hpcbox.tools import docker, proc, ssh

DEFAULT_REMOTE_ROOT = "hpcbox"
# A file missing on the cluster this small goes up in ship's last round trip, whole (a delta would save
# little and cost rsync's start and four more round trips): a call's pickles, a small dataset.
INLINE_MAX_BYTES = 1 << 20
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
    flavour: str = ""
    compression: str = ""


@dataclass(frozen=True)
class Remote:
    """Where the job's inputs are on the cluster (absolute paths), and what this submit sent."""

    host: str
    user: str  # the login user, as the cluster names them
    submit_dir: str
    sif: str
    code_dir: str
    dataset: str
    sent: tuple[str, ...]  # which of "sif", "dataset", "code" were uploaded now
    bytes_sent: int
    # ship's last command, where a `Then` ended it (its status one of the Then's, or 0)
    then_done: proc.Completed | None = None


@dataclass(frozen=True)
class Then:
    """Shell that ends ship's last command, once what the job needs is in place: ``script``, reading
    ``stdin`` after the files the command sends (`sbatch`, so that a submit after a code-only change is
    one round trip after the probe). A failure with one of ``statuses`` is the caller's to read."""

    script: str
    what: str = ""  # what it does, in the words of a failure's line: "submit the job with sbatch"
    stdin: bytes = b""
    statuses: tuple[int, ...] = ()


def code_snapshot(project: ProjectConfig) -> CodeSnapshot:
    """A reproducible archive of the code (same files, same bytes, same digest)."""
    files = code_files(project)
    if not files:
        raise HpcboxError(
            "tool.hpcbox.code: no files to ship", 'list your code\'s folders, e.g. code = ["src/mypackage"]'
        )
    tar = docker.context_tar(files)
    return CodeSnapshot(hashlib.sha256(tar).hexdigest(), gzip.compress(tar, mtime=0), len(files))


def dataset(path: Path | None, cache: Path, say: Callable[[str], None] = print) -> Dataset:
    """The dataset at ``path``: one archive as it is, or a directory archived into ``cache``; None: no
    dataset, an empty archive (made in ``cache``)."""
    check_dataset(path)
    if path is None:
        made = datasets.empty(cache)
        return Dataset(made.path, made.sha256)
    if path.is_dir():
        made = datasets.archive(path, cache, say)
        return Dataset(made.path, made.sha256)
    return Dataset(path, known_sha256(path, cache / SHA256_MEMO))


def check_dataset(path: Path | None) -> None:
    """A dataset that is not there, nor a file or a folder, refused in one line (before any work)."""
    if path is None or path.is_dir() or path.is_file():
        return
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
        return f"{store.folder(self.root, 'sif')}/{self.payload.sif_sha256}.sif"

    @property
    def dataset(self) -> str:
        return f"{store.folder(self.root, 'dataset')}/{self.payload.dataset.remote_name}"

    @property
    def submit_dir(self) -> str:
        return f"{self.root}/{self.project}"

    @property
    def code_dir(self) -> str:
        return f"{self.submit_dir}/code/{self.payload.code.name}"


@dataclass(frozen=True)
class _Probe:
    home: str
    user: str
    present: dict[str, bool]
    free_bytes: dict[str, int]  # kind -> bytes free where its store is (or would be), for those missing
    store: store.Store


def _probe(connection: ssh.Connection, layout: _Layout, root: str) -> _Probe:
    """The remote home, which of the inputs are there already, the free space where the store's files
    that are not go, and the store's listing (one round trip)."""
    checks = {"sif": ("-f", layout.sif), "dataset": ("-f", layout.dataset), "code": ("-d", layout.code_dir)}
    lines = ['printf "home\\t%s\\n" "$HOME"', 'printf "user\\t%s\\n" "$(id -un)"', 'missing=""']
    for name, (flag, path) in checks.items():
        present = f"echo 'present\t{name}'"
        if name not in store.FOLDERS:
            lines.append(f"if test {flag} {shlex.quote(path)}; then {present}; fi")
            continue
        # Where it is missing, the free space in the nearest folder that exists: the store's own once
        # there is one (asked only then: a submit that finds both spares the cluster two df).
        lines.append(
            f"if test {flag} {shlex.quote(path)}; then {present}; else missing=1; "
            f"d={shlex.quote(store.folder(root, name))}; "
            'while test ! -d "$d"; do d=$(dirname "$d"); done; '
            f"printf 'free\\t{name}\\t%s\\n' \"$(df -Pk \"$d\" | awk 'NR==2 {{print $4}}')\"; fi"
        )
    # The store's listing chooses a basis for an upload: asked only where the SIF or dataset is missing.
    lines.append(f'if test -n "$missing"; then {store.listing_script(root)}; fi')
    done = connection.run("; ".join(lines), what=f"look at {root} on {connection.target.address}")
    answers = done.stdout.splitlines()
    home = [line.split("\t", 1)[1] for line in answers if line.startswith("home\t")]
    user = [line.split("\t", 1)[1] for line in answers if line.startswith("user\t")]
    free = dict(line.split("\t")[1:3] for line in answers if line.startswith("free\t"))
    present = {name: f"present\t{name}" in answers for name in checks}
    if (
        len(home) != 1
        or len(user) != 1
        or set(free) != {kind for kind in store.FOLDERS if not present[kind]}
        or not all(v.isdigit() for v in free.values())
    ):
        raise HpcboxError(
            f"unexpected answer from {connection.target.address}: {done.stdout.strip()[:200]!r}"
        )
    free_bytes = {kind: int(kilobytes) * 1024 for kind, kilobytes in free.items()}
    return _Probe(home[0], user[0], present, free_bytes, store.parse_listing(answers))


def remote_root(home: str, root: str) -> str:
    return root if root.startswith("/") else f"{home.rstrip('/')}/{root}"


def ship(
    connection: ssh.Connection,
    payload: Payload,
    project: str,
    *,
    root: str = DEFAULT_REMOTE_ROOT,
    previous: JobRecord | None = None,
    access: store.Access = store.PRIVATE,
    dry_run: bool = False,
    then: Callable[[Remote], Then] | None = None,
    before_upload: Callable[[], None] | None = None,
    say: Callable[[str], None] = print,
) -> Remote:
    """Send what the cluster lacks of ``payload``; with ``dry_run``, only say what would be sent.

    ``previous``: this project's last job on the cluster, whose SIF and dataset are the first choice of
    basis for a delta upload. ``access``: who may read what is there (the user alone by default).
    ``then``: given where everything is, what ends the last command (not with ``dry_run``); how that
    command ended is the returned Remote's ``then_done``. ``before_upload``: called once before a file
    too big to go with that command is uploaded (a race holds it there while other sites send)."""
    relative = _Layout(root, project, payload)
    probe = _probe(connection, relative, root)
    layout = _Layout(remote_root(probe.home, root), project, payload)
    sent: list[str] = []
    total = 0
    now = time.time()
    uploads = {
        "sif": _Upload(
            payload.sif_path,
            layout.sif,
            payload.sif_sha256,
            payload.sif_size,
            store.StoredUse(
                "sif", layout.sif.rsplit("/", 1)[1], project, payload.flavour, payload.compression, now
            ),
        ),
        "dataset": _Upload(
            payload.dataset.path,
            layout.dataset,
            payload.dataset.sha256,
            payload.dataset.path.stat().st_size,
            store.StoredUse("dataset", payload.dataset.remote_name, project, used_at=now),
        ),
    }
    missing = [name for name in uploads if not probe.present[name]]
    inline = [] if dry_run else [name for name in missing if uploads[name].size <= INLINE_MAX_BYTES]
    rsynced = [name for name in missing if name not in inline]
    if not dry_run:
        # No room for a file that must go up: said before anything is made there.
        for name in missing:
            _check_room(uploads[name], probe.free_bytes[name])
        if rsynced:
            if before_upload is not None:
                before_upload()
            _make_folders(connection, layout, access)
    # What this project's last job here used: the first choice of basis.
    last_used = (
        store.used_by(previous.sif, previous.dataset_sha256, probe.store, layout.root) if previous else {}
    )
    for name, upload in uploads.items():
        if probe.present[name]:
            say(f"hpcbox: the cluster has the {name} already ({upload.sha256[:12]})")
            continue
        if name in inline:
            say(f"hpcbox: uploading the {name} ({upload.size:,} bytes) to {upload.remote}")
            continue
        basis = store.choose_basis(probe.store, upload.use, last_used.get(name))
        if dry_run:
            how = f", only what {basis[:12]} lacks," if basis else ""
            size = f"{upload.size:,} bytes"
            say(f"hpcbox: would upload the {name} {upload.local} ({size}){how} to {upload.remote}")
            continue
        total += _upload_stored(connection, upload, basis, probe.free_bytes[name], say, access=access)
        sent.append(name)
    if probe.present["code"]:
        say(f"hpcbox: the cluster has this code snapshot already ({payload.code.name})")
    elif dry_run:
        say(f"hpcbox: would upload the code snapshot ({payload.code.files} files) to {layout.code_dir}")
    if not dry_run:
        # One round trip for the rest, the folders too where no upload made them first (a submit after
        # a code-only change sends nothing else). Every use is recorded, not only uploads: the index
        # says which project still needs a file, and which of this project's files is the newest, the
        # next delta's basis. The files the job uses get their access, those an earlier hpcbox left
        # readable to others included.
        steps = [] if rsynced else [store.folders_script(layout.root, layout.project, access)]
        # The small files first, then the code archive, each read to its size from stdin (a Then's
        # stdin follows).
        stream = b""
        for name in inline:
            steps.append(_inline_script(uploads[name], access))
            stream += uploads[name].local.read_bytes()
            sent.append(name)
        total += len(stream)
        if not probe.present["code"]:
            steps.append(_code_script(layout.code_dir, len(payload.code.archive), access))
            stream += payload.code.archive
            total += len(payload.code.archive)
            sent.append("code")
        steps.append(store.record_script(layout.root, [upload.use for upload in uploads.values()], access))
        steps.append(access.settle([layout.sif, layout.dataset]))
        steps.append(access.settle([layout.code_dir], recursive=True))
    remote = Remote(
        host=connection.target.address,
        user=probe.user,
        submit_dir=layout.submit_dir,
        sif=layout.sif,
        code_dir=layout.code_dir,
        dataset=layout.dataset,
        sent=tuple(sent),
        bytes_sent=total,
    )
    if dry_run:
        return remote
    ending = then(remote) if then is not None else Then("")
    sending = [*(f"the {name}" for name in inline), *(["the code snapshot"] if "code" in sent else [])]
    done = _in_store(
        connection,
        " && ".join([*steps, *([ending.script] if ending.script else [])]),
        access,
        what=f"{'send ' + ', '.join(sending) + ' and ' if sending else ''}record the files this job "
        f"uses in the index on {connection.target.address}{', then ' + ending.what if ending.what else ''}",
        input_bytes=(stream + ending.stdin) or None,
        passing=ending.statuses,
    )
    return dataclasses.replace(remote, then_done=done if then is not None else None)


def _make_folders(connection: ssh.Connection, layout: _Layout, access: store.Access) -> None:
    """The store's folders and the project's, with their access (store.folders_script); a store group
    the login user is not in is one line naming the setting, before anything is sent."""
    script = store.folders_script(layout.root, layout.project, access)
    _in_store(connection, script, access, what=f"make hpcbox's folders in {layout.root}")


def _in_store(
    connection: ssh.Connection,
    script: str,
    access: store.Access,
    *,
    what: str,
    input_bytes: bytes | None = None,
    passing: tuple[int, ...] = (),
) -> proc.Completed:
    """Run ``script``, which may begin with store.folders_script: a store group the login user is not in
    is one line naming the setting (its exit 3, before anything is made), any other failure one line
    with the cluster's own words, but for ``passing`` statuses: how it ended, for the caller."""
    done = _run_settling(connection, script, what=what, refuse=(3, *passing), input_bytes=input_bytes)
    if done.returncode == 3:
        groups = next(
            (line.split("\t", 1)[1] for line in done.stdout.splitlines() if line.startswith("notmember\t")),
            "",
        )
        raise FieldError(
            "store.group",
            f"you are not in group {access.group!r} on {connection.target.address}, so "
            "hpcbox cannot share the store with it",
            f"name one of your groups there ({groups or 'see `id -Gn` on the login node'}), or leave out "
            "[store] group for a store that is yours alone; nothing was sent",
        )
    return done


def _run_settling(
    connection: ssh.Connection,
    script: str,
    *,
    what: str,
    refuse: tuple[int, ...] = (),
    input_bytes: bytes | None = None,
) -> proc.Completed:
    """Run ``script``, which gives files their access (store.Access.settle: exit 4 where chgrp or
    chmod refuses); a failure is one line with the cluster's own words."""
    done = connection.run(script, what=what, check=False, input_bytes=input_bytes)
    if done.returncode == 0 or done.returncode in refuse:
        return done
    said = (done.stderr or done.stdout).strip().splitlines()
    raise HpcboxError(
        f"failed to {what}: {said[-1] if said else f'exit status {done.returncode}'}",
        "the store's files must be yours to change; check the folder's owner and modes on the login node",
    )


@dataclass(frozen=True)
class _Upload:
    local: Path
    remote: str
    sha256: str
    size: int
    use: store.StoredUse  # its index entry, which says its kind

    @property
    def kind(self) -> str:
        return self.use.kind


# What rsync's receiver reports when the disk or the user's quota is full (errno 28 and 122).
_NO_ROOM = ("No space left on device", "Disk quota exceeded")


def _upload_stored(
    connection: ssh.Connection,
    upload: _Upload,
    basis: str | None,
    free_bytes: int,
    say: Callable[[str], None],
    *,
    access: store.Access = store.PRIVATE,
) -> int:
    """Upload one content-addressed file, as a delta against ``basis`` (a name in the same folder)
    where there is one, with ``access``; the bytes that went over the wire."""
    folder, name = upload.remote.rsplit("/", 1)
    _check_room(upload, free_bytes)

    def waiting() -> None:
        say(f"hpcbox: another submit is uploading this {upload.kind}; waiting for it")

    with connection.lock(f"{folder}/.{name}.lock", on_wait=waiting, umask=access.umask):
        start = _start_upload(connection, folder, name, basis)
        if start == "present":
            say(f"hpcbox: the cluster has the {upload.kind} now (another submit uploaded it)")
            return 0
        if start == "nobasis":
            say(f"hpcbox: {basis} cannot be read on the cluster; sending the whole {upload.kind}")
        if start == "resume":
            say(
                f"hpcbox: an earlier upload of this {upload.kind} was cut off; sending only what did not "
                "arrive"
            )
        if start in ("linked", "copied"):
            say(
                f"hpcbox: uploading the {upload.kind} ({upload.size / 1e6:,.1f} MB) to {upload.remote}, "
                f"only what {basis[:12] if basis else ''} lacks"
            )
        else:
            say(f"hpcbox: uploading the {upload.kind} ({upload.size / 1e6:,.1f} MB) to {upload.remote}")
        against_basis = start in ("linked", "copied", "resume")
        transfer = _send(connection, upload, folder, name, against_basis=against_basis, access=access)
        right = _settle(connection, folder, name, upload.sha256, upload.local.name, access)
        if not right and against_basis:
            say(f"hpcbox: the {upload.kind} built on the cluster's copy did not check out; sending it whole")
            retry = _send(connection, upload, folder, name, against_basis=False, access=access)
            right = _settle(connection, folder, name, upload.sha256, upload.local.name, access)
            transfer = ssh.Transfer(transfer.sent + retry.sent, transfer.received + retry.received)
        if not right:
            raise HpcboxError(
                f"the upload of {upload.local.name} arrived with a different sha256; it was removed, nothing "
                "uses it",
                "run the command again; if it repeats, the local file changed while it was sent, or the "
                "remote disk is failing",
            )
    if against_basis:
        share = transfer.sent / upload.size if upload.size else 0.0
        say(f"hpcbox: sent {transfer.sent / 1e6:,.1f} MB of {upload.size / 1e6:,.1f} MB ({share:.2%})")
    return transfer.sent


def _start_upload(connection: ssh.Connection, folder: str, name: str, basis: str | None) -> str:
    """Under the upload's lock: "present" (another upload finished it), "resume" (an interrupted
    upload's part is the basis), "linked"/"copied" (``basis`` is at the temporary name), "nobasis"
    (it could not be), or "fresh" (no basis)."""
    temporary, final = shlex.quote(f".{name}.partial"), shlex.quote(name)
    lines = [
        f"cd {shlex.quote(folder)} || exit 1",
        f"if test -f {final}; then echo present; exit 0; fi",
        f"if test -e {temporary}; then echo resume; exit 0; fi",
    ]
    if basis is None:
        lines.append("echo fresh")
    else:
        # A hard link costs no space, and rsync never writes into its basis (it renames a new file
        # over the temporary name); a copy where the store's file is not ours to link.
        copy = shlex.quote(f".{name}.copy") + ".$$"
        lines += [
            f"if ln {shlex.quote(basis)} {temporary} 2>/dev/null; then echo linked; exit 0; fi",
            f"if cp --reflink=auto {shlex.quote(basis)} {copy} 2>/dev/null && mv -f {copy} {temporary}; "
            "then echo copied; exit 0; fi",
            f"rm -f {copy}; echo nobasis",
        ]
    done = connection.run("\n".join(lines), what=f"prepare the upload of {name}")
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else "fresh"


def _send(
    connection: ssh.Connection,
    upload: _Upload,
    folder: str,
    name: str,
    *,
    against_basis: bool,
    access: store.Access,
) -> ssh.Transfer:
    partial = f"{folder}/.{name}.partial"
    big = upload.size > 50_000_000
    progress = ssh.progress_printer(upload.size, against_basis=against_basis) if big else None
    try:
        return connection.upload(
            upload.local,
            partial,
            on_progress=progress,
            against_basis=against_basis,
            chmod=access.rsync_chmod,
        )
    except HpcboxError as failed:
        full = next((sign for sign in _NO_ROOM if sign in failed.details), None)
        if full is None:
            raise
        # Kept for a resumed upload, the part that arrived would only hold on to the space that ran out.
        connection.run(["rm", "-f", "--", partial], what=f"remove {partial}", check=False)
        raise _no_room(upload, folder, full) from failed


def _check_room(upload: _Upload, free_bytes: int) -> None:
    if free_bytes < upload.size:
        raise _no_room(upload, upload.remote.rsplit("/", 1)[0], f"{free_bytes / 1e6:,.0f} MB free")


def _no_room(upload: _Upload, folder: str, why: str) -> HpcboxError:
    return HpcboxError(
        f"the cluster has no room for {upload.local.name} ({upload.size / 1e6:,.0f} MB) in {folder}: {why}",
        "free space there (`hpcbox prune --cluster=NAME` lists the files no recent job uses, and what "
        "unfinished uploads left) or ask for more quota; nothing was submitted",
    )


def _settle(
    connection: ssh.Connection, folder: str, name: str, sha256: str, what: str, access: store.Access
) -> bool:
    """Move the upload of ``name`` into place in ``folder`` if its sha256 is right: whether the right
    file is in place now. A wrong upload is removed; a wrong file is never moved into place.

    What decides is the file in place at the end: on a cluster without flock(1), two submits of one
    new SIF upload it to the same partial name at once, and the one that checks second finds the
    first's right file in place, which is its success too.
    """
    temporary, final = shlex.quote(f".{name}.partial"), shlex.quote(name)
    check = (
        f"cd {shlex.quote(folder)} && "
        f"if {_sha256_is(sha256, temporary)}; then {_given_access(temporary, access)} 2>/dev/null; "
        f"mv -f {temporary} {final} 2>/dev/null; fi; "
        f"if {_sha256_is(sha256, final)}; then :; else rm -f {temporary}; exit 3; fi"
    )
    done = connection.run(check, what=f"check the upload of {what}", check=False)
    if done.returncode not in (0, 3):
        raise HpcboxError(
            f"failed to check the upload of {what}: {(done.stderr or done.stdout).strip()}",
            "the cluster needs `sha256sum` (GNU coreutils)",
        )
    return done.returncode == 0


def _inline_script(upload: _Upload, access: store.Access) -> str:
    """Shell that writes the next ``upload.size`` bytes of its stdin (GNU head reads no further) to a
    temporary of its own beside the upload's place, named as rsync's are (so that prune knows what an
    interrupted one left), and moves it there if its sha256 is right; a concurrent submit of the same
    file moves the same bytes. A wrong one is removed and said (exit 5). No lock: the file is written
    within the command, and a prune that took the temporary meanwhile fails the submit, nothing worse."""
    folder, name = upload.remote.rsplit("/", 1)
    wrong = shlex.quote(f"hpcbox: the upload of {upload.local.name} arrived with a different sha256; removed")
    incoming = '"$incoming"'
    return (
        f"incoming=$(mktemp {shlex.quote(f'{folder}/.{name}.partial.')}XXXXXX) && "
        f'head -c {upload.size} > "$incoming" && '
        f"if {_sha256_is(upload.sha256, incoming)}; then {_given_access(incoming, access)} && "
        f'mv -f "$incoming" {shlex.quote(upload.remote)}; '
        f'else rm -f "$incoming"; echo {wrong} >&2; exit 5; fi'
    )


def _sha256_is(sha256: str, path: str) -> str:
    """Shell that succeeds where the file ``path`` (a shell word) has ``sha256``."""
    return f"printf '%s  %s\\n' {sha256} {path} | sha256sum --check --status"


def _given_access(path: str, access: store.Access) -> str:
    """Shell that gives the file ``path`` (a shell word) the store's group (where it has one) and mode;
    its status is chmod's."""
    group = f"chgrp {shlex.quote(access.group)} {path} 2>/dev/null; " if access.group else ""
    return f"{group}chmod {access.file_mode} {path}"


def _code_script(code_dir: str, size: int, access: store.Access) -> str:
    """Shell that unpacks the code snapshot's archive (the next ``size`` bytes of its stdin) into
    ``code_dir``: beside its final place, then renamed whole; a concurrent submit of the same snapshot
    wins the rename and this one's copy is dropped. tar applies the umask to the archive's modes: each
    file keeps its owner's bits, execute included, and gets the store's group bits."""
    parent = code_dir.rsplit("/", 1)[0]
    return (
        f"umask {access.umask} && mkdir -p {shlex.quote(parent)} && "
        f"incoming=$(mktemp -d {shlex.quote(parent)}/.incoming-XXXXXX) && "
        f'head -c {size} | tar --no-same-permissions -xzf - -C "$incoming" && '
        f'chmod {access.folder_mode} "$incoming" && '
        f'{{ mv -T "$incoming" {shlex.quote(code_dir)} 2>/dev/null || rm -rf "$incoming"; }}'
    )
